//! `outpost-agent keeper <dir>`: one per sandbox, started by the job daemon.
//!
//! It sets the sandbox up (GPU lease, limits, the bwrap holder), says so on
//! stdout, and then owns it: it ends it at its TTL or when asked, stops
//! what breaks a watched limit, and on the way out kills every process of
//! the sandbox and removes its files. The holder is bwrap with
//! `--die-with-parent` under this process, so a keeper that dies, however,
//! takes the sandbox's namespace with it; the daemon then starts a new
//! keeper (`--adopt`), which ends what is left and sets the sandbox up
//! again, or ends it if its TTL passed meanwhile.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use outpost_protocol::{GpuLeaseRequest, Isolation, SandboxState};

use super::egress;
use super::gpu_nodes;
use super::isolation::{self, AGENT_INSIDE};
use super::limits;
use super::ruleset;
use super::staging::Staging;
use super::store::{self, Dirs, End, NUDGE, Setup};
use crate::statefile::{ProcId, now_unix, write_atomic, write_json};
use crate::{account, flock, leases, paths};

const TICK: Duration = Duration::from_millis(50);

/// Sleeps for `tick`, or until nudged (or a stop signal is handled).
fn sleep_or_nudge(tick: Duration) {
    // SAFETY: sigtimedwait on a set built here, with no siginfo wanted.
    unsafe {
        let mut nudge: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut nudge);
        libc::sigaddset(&mut nudge, NUDGE);
        let timeout = libc::timespec {
            tv_sec: tick.as_secs() as libc::time_t,
            tv_nsec: tick.subsec_nanos() as libc::c_long,
        };
        libc::sigtimedwait(&nudge, std::ptr::null_mut(), &timeout);
    }
}
const MEMORY_EVERY: Duration = Duration::from_millis(250);
const DISK_EVERY: Duration = Duration::from_secs(2);
/// How long the holder gets to come up.
const HOLDER_WAIT: Duration = Duration::from_secs(10);
/// How long teardown keeps killing processes that keep appearing.
const KILL_WINDOW: Duration = Duration::from_secs(5);

/// The signal that asked this keeper to stop (0: none).
static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop(sig: libc::c_int) {
    STOP.store(sig, Ordering::SeqCst);
}

pub fn main(dir: &Path, adopt: bool) -> i32 {
    // SAFETY: plain syscalls; the handler only stores an atomic.
    unsafe {
        // Blocked before any thread starts, so every thread inherits it and
        // the main loop alone takes it (see `sleep_or_nudge`); children get
        // an empty mask from `Command`.
        let mut nudge: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut nudge);
        libc::sigaddset(&mut nudge, NUDGE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &nudge, std::ptr::null_mut());
        libc::setsid();
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_stop as *const () as libc::sighandler_t);
    }
    let _ = std::env::set_current_dir("/");
    let Some(id) = dir.file_name().and_then(|n| n.to_str()) else {
        return 2;
    };
    let dirs = Dirs {
        id: id.to_string(),
        dir: dir.to_path_buf(),
    };
    // One keeper per sandbox.
    let Ok(lock) = flock::open_private(&dirs.meta().join(store::KEEPER_LOCK)) else {
        return 1;
    };
    if !flock::lock_within(&lock, Duration::from_secs(2)).unwrap_or(false) {
        return 0;
    }
    if dirs.end().is_some() {
        return 0;
    }
    let Some(me) = ProcId::of(std::process::id() as i32) else {
        return 1;
    };
    if let Err(e) = write_json(&dirs.meta().join(store::KEEPER), &me, false) {
        eprintln!("outpost-agent keeper {id}: {e}");
        return 1;
    }
    let mut keeper = match Keeper::new(dirs.clone()) {
        Ok(k) => k,
        Err(e) => return fail_setup(&dirs, &e, adopt),
    };
    if adopt {
        // What the previous keeper left: its holder died with it.
        let old = dirs.setup().unwrap_or_default();
        kill_members(&dirs.id, &old);
        limits::remove(&old.cgroups);
        // Due, or its keeper died ending it: end it, as what it was.
        let was_ending = dirs.meta().join(store::ENDING).exists();
        if let Some(state) = keeper.due() {
            keeper.teardown(state, None);
            return 0;
        }
        if was_ending {
            keeper.teardown(
                SandboxState::Failed,
                Some("its keeper ended while ending it".into()),
            );
            return 0;
        }
    }
    if let Err(e) = keeper.set_up(adopt) {
        return fail_setup(&dirs, &e, adopt);
    }
    if !adopt {
        // The daemon waits for this byte before it answers the create.
        let _ = std::io::stdout().write_all(b"1");
        let _ = std::io::stdout().flush();
    }
    keeper.run();
    0
}

fn fail_setup(dirs: &Dirs, message: &str, adopt: bool) -> i32 {
    eprintln!("outpost-agent keeper {}: {message}", dirs.id);
    let _ = write_atomic(
        &dirs.meta().join(store::SETUP_ERROR),
        message.as_bytes(),
        false,
    );
    if adopt {
        let mut keeper = Keeper {
            dirs: dirs.clone(),
            record: dirs.record(),
            setup: dirs.setup().unwrap_or_default(),
            holder: None,
            ports: Default::default(),
        };
        keeper.teardown(
            SandboxState::Failed,
            Some(format!("cannot set it up again: {message}")),
        );
    }
    1
}

struct Keeper {
    dirs: Dirs,
    record: Option<store::Record>,
    setup: Setup,
    holder: Option<Child>,
    /// Its exposed ports' listeners (see [`super::ports`]).
    ports: super::ports::Listeners,
}

impl Keeper {
    fn new(dirs: Dirs) -> Result<Keeper, String> {
        let record = dirs.record().ok_or("cannot read the sandbox record")?;
        Ok(Keeper {
            dirs,
            record: Some(record),
            setup: Setup::default(),
            holder: None,
            ports: Default::default(),
        })
    }

    fn spec(&self) -> Option<&outpost_protocol::SandboxSpec> {
        self.record.as_ref().map(|r| &r.spec)
    }

    fn account(&self) -> Option<account::Account> {
        self.record.as_ref().and_then(|r| r.account)
    }

    /// Why the sandbox should end now, if it should.
    fn due(&self) -> Option<SandboxState> {
        if self.dirs.meta().join(store::DELETE).exists() {
            return Some(SandboxState::Deleted);
        }
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        // Paused with its clock stopped: the TTL waits.
        if self.dirs.paused().is_some_and(|p| p.remaining_ms.is_some()) {
            return None;
        }
        // No expiry readable: treat as expired rather than live forever.
        match self.dirs.expires_ms() {
            Some(at) if at > now_ms => None,
            _ => Some(SandboxState::Expired),
        }
    }

    fn set_up(&mut self, again: bool) -> Result<(), String> {
        let spec = self.spec().ok_or("no record")?.clone();
        // Set up again, it gets the rung it had, or ends: never a weaker one.
        let asked = match self.dirs.setup() {
            Some(before) if again => before.isolation,
            _ => spec.isolation,
        };
        let isolation = isolation::choose(asked)?;
        let made = limits::make(&self.dirs.id, &spec.limits, isolation);
        let mut setup = Setup {
            isolation,
            enforcement: made.enforcement,
            cgroups: made.cgroups,
            watch_memory_mb: made.watch_memory_mb,
            watch_disk_mb: made.watch_disk_mb,
            nproc: made.nproc,
            hidden: isolation::hidden_paths(),
            ..Setup::default()
        };
        // Whatever its uid could not pass on the way to its dirs is empty
        // inside, so the paths exist there.
        if let Some(a) = self.account()
            && let Some(barrier) = account::barrier_above(&self.dirs.work(), Some(a))
        {
            isolation::hide(&mut setup.hidden, barrier);
        }
        let mut devices = Vec::new();
        if spec.gpus > 0 {
            let lease = leases::lease(&GpuLeaseRequest {
                count: spec.gpus,
                min_free_mem_bytes: 0,
            })
            .map_err(|e| {
                limits::remove(&setup.cgroups);
                e.message
            })?;
            setup.gpus = lease.indices.clone();
            setup.cuda_visible_devices = Some(if lease.uuids.iter().all(|u| !u.is_empty()) {
                lease.uuids.join(",")
            } else {
                let idx: Vec<String> = lease.indices.iter().map(u32::to_string).collect();
                idx.join(",")
            });
            setup.lease_id = Some(lease.lease_id);
            setup.gpu_uuids = lease.uuids.clone();
            devices = gpu_devices(&setup).inspect_err(|_| self.release(&setup))?;
        }
        let mut notes = Vec::new();
        if again {
            notes.push("its keeper was restarted; processes running then were stopped".to_string());
        }
        match isolation {
            Isolation::Bwrap => {
                if !spec.allow_hosts.is_empty() {
                    let meta = self.dirs.meta();
                    egress::serve(
                        &meta.join(egress::SOCKET),
                        spec.allow_hosts.clone(),
                        &meta.join(egress::DENIED),
                    )
                    .and_then(|()| match self.account() {
                        Some(a) => account::give(&meta.join(egress::SOCKET), a),
                        None => Ok(()),
                    })
                    .map_err(|e| format!("cannot start its egress proxy: {e}"))
                    .inspect_err(|_| self.release(&setup))?;
                }
                let (child, holder, hold) = self
                    .start_holder(spec.network, &devices, &setup.hidden)
                    .inspect_err(|_| self.release(&setup))?;
                setup.pid_ns = limits::pid_namespace(holder.pid);
                setup.holder = Some(holder);
                setup.hold_pid = Some(hold);
                self.holder = Some(child);
            }
            Isolation::Landlock => {
                notes.push("landlock: the host's processes and mounts stay visible".into());
                let abi = isolation::landlock_abi().unwrap_or(0);
                if abi < isolation::LANDLOCK_UNIX_ABI {
                    notes.push(
                        "no unix sockets but socketpair (this kernel's Landlock cannot fence named ones)"
                            .into(),
                    );
                }

                if spec.gpus > 0 {
                    notes.push("GPUs are assigned, not fenced".into());
                }
                // Built once here rather than by every command.
                let rules = isolation::landlock_ruleset(&self.dirs, spec.network, &setup.hidden)
                    .inspect_err(|_| self.release(&setup))?;
                ruleset::serve(&self.dirs.meta().join(ruleset::SOCKET), rules)
                    .map_err(|e| format!("cannot serve its Landlock rules: {e}"))
                    .inspect_err(|_| self.release(&setup))?;
            }
            _ => {
                notes.push("not isolated: its own directories only".into());
            }
        }
        if isolation != Isolation::Bwrap && setup.cgroups.is_empty() {
            notes.push(
                "no cgroup for this user: a process that clears its environment and detaches can outlive it"
                    .into(),
            );
        }
        setup.note = (!notes.is_empty()).then(|| notes.join("; "));
        write_json(&self.dirs.meta().join(store::SETUP), &setup, true).map_err(|e| {
            self.release(&setup);
            format!("cannot write the sandbox setup: {e}")
        })?;
        self.setup = setup;
        Ok(())
    }

    /// Starts bwrap and waits until its command runs: then every mount is
    /// in place and commands may enter.
    /// The bwrap process, its first process inside (pid 1 there) and the
    /// `hold` process under that.
    fn start_holder(
        &self,
        network: bool,
        devices: &[gpu_nodes::Node],
        hidden: &[PathBuf],
    ) -> Result<(Child, ProcId, i32), String> {
        let bwrap = isolation::rungs().bwrap.clone()?;
        let agent = paths::running_exe()
            .filter(|p| p.is_file())
            .ok_or("cannot find the agent binary")?;
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == -1 {
            return Err(format!("pipe: {}", std::io::Error::last_os_error()));
        }
        let (info_read, info_write) = (fds[0], fds[1]);
        let account = self.account();
        let egress = self.spec().is_some_and(|s| !s.allow_hosts.is_empty());
        let socket = self.dirs.meta().join(egress::SOCKET);
        // As root, bwrap runs as the sandbox's uid, which may not reach the
        // sources by path: its parent stages them first.
        let staging = match account {
            Some(a) => {
                let mut sources = vec![
                    self.dirs.tmp(),
                    self.dirs.work(),
                    self.dirs.home(),
                    agent.clone(),
                ];
                sources.extend(egress.then(|| socket.clone()));
                Staging::for_sources(&sources, a)?
            }
            None => None,
        };
        let mut cmd = Command::new(&bwrap);
        cmd.args(isolation::bwrap_args(
            &self.dirs, network, &agent, devices, hidden,
        ));
        if egress {
            cmd.arg("--bind").arg(&socket).arg(egress::SOCKET_INSIDE);
        }
        cmd.args(["--info-fd", "3", "--", AGENT_INSIDE, "hold"])
            .args(egress.then_some("--egress"))
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: dup2, mount and the credential calls are async-signal-safe
        // (the staging was prepared before the fork); fd 3 loses
        // close-on-exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(info_write, 3) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(staging) = &staging {
                    staging.apply()?;
                }
                match account {
                    Some(a) => account::become_account(a),
                    None => Ok(()),
                }
            });
        }
        let spawned = cmd.spawn();
        // SAFETY: our copy of the write end; the child has its own.
        unsafe { libc::close(info_write) };
        let mut child = spawned.map_err(|e| {
            // SAFETY: closing our read end on failure.
            unsafe { libc::close(info_read) };
            format!("cannot start {}: {e}", bwrap.display())
        })?;
        // SAFETY: we own `info_read` from here on.
        let info = unsafe { <fs::File as std::os::fd::FromRawFd>::from_raw_fd(info_read) };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = (&info).take(64 * 1024).read_to_string(&mut text);
            let _ = tx.send(text);
        });
        let text = rx.recv_timeout(HOLDER_WAIT).unwrap_or_default();
        let pid = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("child-pid")?.as_i64())
            .map(|p| p as i32);
        let Some(pid) = pid else {
            let _ = child.kill();
            let _ = child.wait();
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return Err(format!("bwrap did not start: {}", err.trim()));
        };
        // Its command (`hold`, a child of bwrap's pid 1) runs once the
        // sandbox is complete.
        let deadline = Instant::now() + HOLDER_WAIT;
        let hold = loop {
            let started = crate::proctree::all_pids()
                .into_iter()
                .filter_map(crate::proctree::read_stat)
                .find(|s| s.ppid == pid);
            if let Some(hold) = started {
                break hold.pid;
            }
            if let Ok(Some(status)) = child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                return Err(format!("bwrap ended at once ({status}): {}", err.trim()));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err("bwrap did not start its command in 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        // Nobody reads bwrap's stderr from here on.
        drop(child.stderr.take());
        let holder = ProcId::of(pid).ok_or("bwrap's first process vanished")?;
        Ok((child, holder, hold))
    }

    fn release(&self, setup: &Setup) {
        limits::remove(&setup.cgroups);
        if let Some(id) = &setup.lease_id {
            let _ = leases::release(id);
        }
    }

    fn run(&mut self) {
        let mut last_memory = Instant::now();
        // Measured on a thread of its own: a huge tree must not hold up
        // the expiry.
        let disk_used = self.setup.watch_disk_mb.map(|_| {
            let used = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
            let dirs = [
                self.dirs.work(),
                self.dirs.home(),
                self.dirs.tmp(),
                self.dirs.logs(),
            ];
            let writer = used.clone();
            std::thread::spawn(move || {
                loop {
                    writer.store(limits::disk_usage(&dirs), Ordering::Relaxed);
                    std::thread::sleep(DISK_EVERY);
                }
            });
            used
        });
        loop {
            sleep_or_nudge(TICK);
            let stop = STOP.load(Ordering::SeqCst);
            if stop != 0 {
                self.teardown(
                    SandboxState::Failed,
                    Some(format!("its keeper was stopped by signal {stop}")),
                );
                return;
            }
            self.thaw_if_abandoned();
            self.ports.serve_new(&self.dirs, &self.setup);
            if self.due().is_some() {
                // Decided under the lock a renew takes: a renew that landed
                // first counts, one that comes later finds it ending.
                let lock = super::lifecycle_lock(&self.dirs).ok();
                if let Some(state) = self.due() {
                    self.mark_ending();
                    drop(lock);
                    self.teardown(state, None);
                    return;
                }
            }
            if let Some(child) = &mut self.holder
                && let Ok(Some(status)) = child.try_wait()
            {
                eprintln!(
                    "outpost-agent keeper {}: bwrap ended ({status}); starting it again",
                    self.dirs.id
                );
                self.holder = None;
                kill_members(&self.dirs.id, &self.setup);
                let network = self.spec().is_some_and(|s| s.network);
                let devices = gpu_devices(&self.setup).unwrap_or_else(|e| {
                    eprintln!("outpost-agent keeper {}: {e}", self.dirs.id);
                    Vec::new()
                });
                let hidden = self.setup.hidden.clone();
                match self.start_holder(network, &devices, &hidden) {
                    Ok((child, holder, hold)) => {
                        self.setup.pid_ns = limits::pid_namespace(holder.pid);
                        self.setup.holder = Some(holder);
                        self.setup.hold_pid = Some(hold);
                        self.setup.note = Some("its bwrap ended and was started again; processes running then were stopped".into());
                        let _ = write_json(&self.dirs.meta().join(store::SETUP), &self.setup, true);
                        self.holder = Some(child);
                    }
                    Err(e) => {
                        self.teardown(SandboxState::Failed, Some(format!("its bwrap ended: {e}")));
                        return;
                    }
                }
            }
            if let Some(mb) = self.setup.watch_memory_mb
                && last_memory.elapsed() >= MEMORY_EVERY
            {
                last_memory = Instant::now();
                self.watch_memory(mb);
            }
            if let (Some(mb), Some(used)) = (self.setup.watch_disk_mb, &disk_used) {
                let used = used.swap(0, Ordering::Relaxed);
                if used > mb << 20 {
                    self.note(format!(
                        "disk limit: its processes were stopped at {} MB > {mb} MB",
                        used >> 20
                    ));
                    kill_commands(&self.dirs.id, &self.setup);
                }
            }
        }
    }

    /// Out of memory, like the kernel's OOM killer in a cgroup: the
    /// largest process goes.
    /// A checkpoint's freeze whose maker died (a `serve` killed mid-copy)
    /// would hold the sandbox frozen for good: thawed here.
    fn thaw_if_abandoned(&self) {
        let marker = self.dirs.meta().join(store::FROZEN);
        let Some(maker) = crate::statefile::read_json::<ProcId>(&marker) else {
            return;
        };
        if !maker.alive() && self.dirs.paused().is_none() {
            limits::thaw(&self.dirs.id, &self.setup);
            let _ = std::fs::remove_file(&marker);
        }
    }

    fn watch_memory(&mut self, mb: u64) {
        let members = limits::members(&self.dirs.id, self.setup.pid_ns, &self.setup.cgroups);
        let sizes: Vec<(i32, u64)> = members
            .iter()
            .map(|s| (s.pid, limits::memory_bytes(&[s.pid])))
            .collect();
        // Files in its own tmpfs mounts are memory too.
        let tmpfs = match &self.setup.holder {
            Some(holder) => {
                let mut mounts = vec![PathBuf::from("/run"), PathBuf::from("/dev")];
                mounts.extend(self.setup.hidden.iter().cloned());
                limits::tmpfs_bytes(holder.pid, &mounts)
            }
            None => 0,
        };
        // Shared memory once, and what a memfd holds that no RSS shows.
        let pids: Vec<i32> = members.iter().map(|s| s.pid).collect();
        let total = limits::memory_bytes(&pids) + tmpfs;
        if total <= mb << 20 {
            return;
        }
        if let Some((pid, bytes)) = sizes.iter().max_by_key(|(_, b)| *b) {
            // SAFETY: plain syscall.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
            self.note(format!(
                "memory limit: stopped pid {pid} ({} MB; the sandbox used {} MB > {mb} MB)",
                bytes >> 20,
                total >> 20
            ));
        }
    }

    fn note(&mut self, note: String) {
        eprintln!("outpost-agent keeper {}: {note}", self.dirs.id);
        self.setup.note = Some(note);
        let _ = write_json(&self.dirs.meta().join(store::SETUP), &self.setup, false);
    }

    /// From now on nothing new starts in it (`enter` and scoped requests
    /// check) and a renew is refused.
    fn mark_ending(&self) {
        let _ = write_atomic(&self.dirs.meta().join(store::ENDING), b"", true);
    }

    /// Ends the sandbox: every process, its cgroups, its lease, its files
    /// (unless kept); then the record of how it ended.
    fn teardown(&mut self, state: SandboxState, note: Option<String>) {
        super::ports::remove_all(&self.dirs);
        self.mark_ending();
        kill_members(&self.dirs.id, &self.setup);
        if let Some(mut child) = self.holder.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        kill_members(&self.dirs.id, &self.setup);
        self.release(&self.setup);
        let keep = self.spec().is_some_and(|s| s.keep_files);
        if !keep {
            let dirs = [
                self.dirs.work(),
                self.dirs.home(),
                self.dirs.tmp(),
                self.dirs.logs(),
            ];
            for dir in dirs {
                let _ = fs::remove_dir_all(dir);
            }
        }
        // Whatever started while the files went.
        kill_members(&self.dirs.id, &self.setup);
        let end = End {
            state,
            ended_unix: now_unix(),
            note,
            kept_files: keep,
        };
        if let Err(e) = write_json(&self.dirs.meta().join(store::END), &end, true) {
            eprintln!(
                "outpost-agent keeper {}: cannot record its end: {e}",
                self.dirs.id
            );
        }
    }
}

/// Ends a sandbox whose keeper is gone (or does not answer) from here.
pub fn end_here(dirs: &Dirs, state: SandboxState) {
    if let Some(keeper) = dirs.keeper().filter(ProcId::alive) {
        // SAFETY: plain syscall; the keeper would fight over the teardown.
        unsafe { libc::kill(keeper.pid, libc::SIGKILL) };
    }
    let mut keeper = Keeper {
        dirs: dirs.clone(),
        record: dirs.record(),
        setup: dirs.setup().unwrap_or_default(),
        holder: None,
        ports: Default::default(),
    };
    if dirs.end().is_none() {
        keeper.teardown(state, None);
    }
}

/// The device nodes of its leased GPUs (none: none at all) and the
/// driver's shared ones.
fn gpu_devices(setup: &Setup) -> Result<Vec<gpu_nodes::Node>, String> {
    if setup.gpus.is_empty() {
        return Ok(Vec::new());
    }
    let leased: Vec<gpu_nodes::Leased> = setup
        .gpus
        .iter()
        .enumerate()
        .map(|(i, &index)| gpu_nodes::Leased {
            index,
            uuid: setup.gpu_uuids.get(i).map_or("", String::as_str),
        })
        .collect();
    gpu_nodes::nodes(&leased)
}

/// Kills every process of the sandbox until none is left (or
/// [`KILL_WINDOW`] passed).
pub fn kill_members(id: &str, setup: &Setup) {
    kill_until_gone(id, setup, |_| true);
}

/// Kills the sandbox's commands, sparing its holder.
fn kill_commands(id: &str, setup: &Setup) {
    let spared = [setup.holder.as_ref().map(|h| h.pid), setup.hold_pid];
    kill_until_gone(id, setup, |s| !spared.contains(&Some(s.pid)));
}

fn kill_until_gone(id: &str, setup: &Setup, which: impl Fn(&crate::proctree::Stat) -> bool) {
    let deadline = Instant::now() + KILL_WINDOW;
    loop {
        let left: Vec<i32> = limits::members(id, setup.pid_ns, &setup.cgroups)
            .into_iter()
            .filter(&which)
            .map(|s| s.pid)
            .collect();
        if left.is_empty() {
            return;
        }
        for pid in &left {
            // SAFETY: plain syscall; ESRCH for the already gone is fine.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        if Instant::now() >= deadline {
            eprintln!("outpost-agent keeper {id}: processes survived SIGKILL: {left:?}");
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// `outpost-agent hold`: the holder's command inside bwrap, asleep until
/// the sandbox ends; with `egress`, carrying the proxy port to its socket.
pub fn hold(egress: bool) -> i32 {
    if egress && let Err(e) = egress::forward(std::path::Path::new(egress::SOCKET_INSIDE)) {
        eprintln!("outpost-agent hold: cannot listen for the egress proxy: {e}");
        return 1;
    }
    loop {
        // SAFETY: pause only returns on a signal.
        unsafe { libc::pause() };
    }
}
