//! Commands that may outlive their call: each one started under a
//! supervisor forked from `serve`, which can later become the job's shim.
//!
//! An `exec_bash` with a call budget runs inline like any exec (its pipes
//! read by `serve`), so a command that ends in milliseconds costs what an
//! inline exec costs. Its parent, though, is not `serve` but a supervisor:
//! a fork of `serve` that forks the command, reports its pid and its exact
//! wait status over a socket pair, and otherwise only waits. When the call's
//! budget runs out, `serve` records the job, stops reading the pipes and
//! tells the supervisor to adopt it: the supervisor `exec`s `outpost-agent
//! shim --adopt`, which keeps the pid and so stays the command's parent, and
//! takes the pipes over from where `serve` stopped (see [`crate::jobs::shim`]).
//!
//! A command in a bwrap sandbox starts under a supervisor too, with no
//! `outpost-agent enter` in between (see [`crate::sandbox::entry`]): a
//! third process, the entrant, takes the steps that apply to a command's
//! parent (the pid namespace), forks the command as the supervisor's child
//! (`CLONE_PARENT`), says its pid and ends; the command takes the rest of
//! the steps before its exec.
//!
//! Everything the forked processes do is prepared before the first fork:
//! a fork of a threaded process may only make async-signal-safe calls, so
//! the children touch no allocator, no lock and no Rust runtime, only
//! syscalls on memory that already exists.
//!
//! The socket carries 5-byte messages, a tag and an i32: `P` + pid (the
//! command runs) or `E` + errno (it could not start) from the supervisor; then `X` + wait status
//! when the command has exited (still unreaped, so its pid cannot be reused
//! while `serve` may be killing its tree); from `serve`, `R` (reap and
//! exit) or `A` + length + `dir\0pid\0elapsed_ms\0` (become the shim, which
//! answers `r` once it has recorded itself, or `F` + errno). End of
//! file before either means `serve` is gone: the supervisor kills the
//! command (the guard kills the rest of its tree) and exits.

use std::ffi::{CString, OsStr, OsString};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream as StdStream;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::sandbox::entry::{self, Entry};
use entrant::{fork_command, slot, start_entrant};
use tokio::net::UnixStream;

mod entrant;
use tokio::net::unix::pipe;

/// Fixed descriptor numbers in the supervisor, so that the shim it becomes
/// finds its control socket and the two pipes where it expects them.
pub const CONTROL_FD: RawFd = 3;
pub const STDOUT_FD: RawFd = 4;
pub const STDERR_FD: RawFd = 5;
const CMD_STDIN: RawFd = 6;
const CMD_STDOUT: RawFd = 7;
const CMD_STDERR: RawFd = 8;
const EXEC_ERR_READ: RawFd = 9;
const EXEC_ERR_WRITE: RawFd = 10;
/// Where the process that forks a command into a sandbox says its pid.
const ENTRANT_READ: RawFd = 11;
const ENTRANT_WRITE: RawFd = 12;
/// A sandbox's descriptors ([`Entry::fds`], then its cgroup), from here.
const ENTRY_FIRST: RawFd = 13;
const ENTRY_FDS: usize = 10;
/// The first descriptor the supervisor closes from.
const FIRST_FREE: RawFd = ENTRY_FIRST + ENTRY_FDS as RawFd;
/// The most descriptors placed in slots.
const SLOTS: usize = 10 + ENTRY_FDS;

/// What the command is: program, arguments, environment, working directory.
pub struct Program {
    pub path: OsString,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    pub cwd: OsString,
}

impl Program {
    /// From a prepared `Command`; `inherit`: whether it starts from this
    /// process's environment (false when the command cleared it).
    pub fn of(cmd: &std::process::Command, inherit: bool) -> Program {
        let mut env: Vec<(OsString, OsString)> = if inherit {
            std::env::vars_os().collect()
        } else {
            Vec::new()
        };
        for (k, v) in cmd.get_envs() {
            env.retain(|(name, _)| name != k);
            if let Some(v) = v {
                env.push((k.to_os_string(), v.to_os_string()));
            }
        }
        Program {
            path: cmd.get_program().to_os_string(),
            args: cmd.get_args().map(OsStr::to_os_string).collect(),
            env,
            cwd: cmd
                .get_current_dir()
                .map_or_else(|| ".".into(), |d| d.as_os_str().to_os_string()),
        }
    }
}

/// A started command under its supervisor.
pub struct Supervised {
    pub pid: i32,
    /// The supervisor, a child of `serve` that `serve` reaps.
    supervisor: i32,
    control: UnixStream,
    received: Vec<u8>,
    status: Option<ExitStatus>,
}

/// A started command's descriptors before the runtime owns them.
pub struct Started {
    pub pid: i32,
    supervisor: i32,
    stdin: Option<OwnedFd>,
    stdout: OwnedFd,
    stderr: OwnedFd,
    control: StdStream,
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::other("a NUL byte in an argument"))
}

fn pipe_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Starts `program` under a new supervisor and waits until it runs (or
/// says why it could not); `entry`: into a sandbox, without `enter`.
/// Blocking: call it off the runtime's threads.
pub fn start(program: &Program, with_stdin: bool, entry: Option<&Entry>) -> io::Result<Started> {
    let path = cstring(&program.path)?;
    let mut argv_owned = vec![path.clone()];
    for a in &program.args {
        argv_owned.push(cstring(a)?);
    }
    let env_owned: Vec<CString> = program
        .env
        .iter()
        .map(|(k, v)| {
            let mut entry = k.clone();
            entry.push("=");
            entry.push(v);
            cstring(&entry)
        })
        .collect::<io::Result<_>>()?;
    let cwd = cstring(&program.cwd)?;
    let self_exe = c"/proc/self/exe";
    let mut argv: Vec<*const libc::c_char> = argv_owned.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env_owned.iter().map(|a| a.as_ptr()).collect();
    envp.push(std::ptr::null());

    let stdin = if with_stdin { Some(pipe_pair()?) } else { None };
    let (out_r, out_w) = pipe_pair()?;
    let (err_r, err_w) = pipe_pair()?;
    let (exec_r, exec_w) = pipe_pair()?;
    let (control, theirs) = StdStream::pair()?;
    // SAFETY: opening /dev/null; the descriptor is ours.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if null < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just opened, ours.
    let null = unsafe { OwnedFd::from_raw_fd(null) };
    // Only a command into a sandbox has an entrant to say its pid.
    let entrant = entry.map(|_| pipe_pair()).transpose()?;
    let mut sources: Vec<(RawFd, RawFd)> = vec![
        (theirs.as_raw_fd(), CONTROL_FD),
        (out_r.as_raw_fd(), STDOUT_FD),
        (err_r.as_raw_fd(), STDERR_FD),
        (
            stdin
                .as_ref()
                .map_or(null.as_raw_fd(), |(r, _)| r.as_raw_fd()),
            CMD_STDIN,
        ),
        (out_w.as_raw_fd(), CMD_STDOUT),
        (err_w.as_raw_fd(), CMD_STDERR),
        (exec_r.as_raw_fd(), EXEC_ERR_READ),
        (exec_w.as_raw_fd(), EXEC_ERR_WRITE),
    ];
    if let Some((r, w)) = &entrant {
        sources.extend([
            (r.as_raw_fd(), ENTRANT_READ),
            (w.as_raw_fd(), ENTRANT_WRITE),
        ]);
    }
    let mut cgroup = -1;
    if let Some(entry) = entry {
        let fds: Vec<RawFd> = entry
            .fds()
            .chain(entry.cgroup.as_ref().map(AsRawFd::as_raw_fd))
            .collect();
        if fds.len() > ENTRY_FDS {
            return Err(io::Error::other(
                "too many descriptors to enter the sandbox",
            ));
        }
        for (i, fd) in fds.into_iter().enumerate() {
            sources.push((fd, ENTRY_FIRST + i as RawFd));
        }
        if entry.cgroup.is_some() {
            cgroup = sources.last().map_or(-1, |s| s.1);
        }
    }
    let mut slots = [(-1, -1); SLOTS];
    slots[..sources.len()].copy_from_slice(&sources);
    let mut stack = vec![0u128; STACK_LEN / 16];
    let prepared = Prepared {
        path: path.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: cwd.as_ptr(),
        self_exe: self_exe.as_ptr(),
        sources: slots,
        source_count: sources.len(),
        entry: entry.map_or(std::ptr::null(), |e| e as *const Entry),
        cgroup,
        null: null.as_raw_fd(),
        stack: stack.as_mut_ptr().cast(),
    };

    // SAFETY: all signals blocked around the fork, so the child runs no
    // handler of this process before it sets its own; the child only makes
    // async-signal-safe calls on `prepared`, which outlives the fork here.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::fork();
        if pid == 0 {
            supervise(&prepared);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        pid
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    drop((theirs, out_w, err_w, exec_r, exec_w, null, entrant));
    let stdin = stdin.map(|(r, w)| {
        drop(r);
        w
    });
    let mut control = control;
    let mut tag = [0u8; 5];
    if let Err(e) = control.read_exact(&mut tag) {
        return Err(io::Error::other(format!(
            "the command's supervisor ended before it started: {e}"
        )));
    }
    let value = i32::from_le_bytes([tag[1], tag[2], tag[3], tag[4]]);
    match tag[0] {
        b'P' => Ok(Started {
            pid: value,
            supervisor: pid,
            stdin,
            stdout: out_r,
            stderr: err_r,
            control,
        }),
        _ => {
            // It ends right after saying so.
            // SAFETY: waitpid on our own child.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
            Err(entry::describe(value, &program.cwd.to_string_lossy()))
        }
    }
}

/// Supervisors that ended or will end soon (or became a job's shim), each a
/// child of `serve`: reaped without waiting, at every later look, so none
/// stays a zombie for long.
static ENDING: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

fn reap_ending(more: i32) {
    let mut ending = ENDING.lock().unwrap_or_else(|p| p.into_inner());
    ending.push(more);
    // SAFETY: waitpid without blocking, on children of this process.
    ending.retain(|&pid| unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) } == 0);
}

impl Drop for Supervised {
    fn drop(&mut self) {
        reap_ending(self.supervisor);
    }
}

impl Started {
    /// Hands the descriptors to the runtime (on one of its threads).
    pub fn into_parts(
        self,
    ) -> io::Result<(
        Supervised,
        Option<pipe::Sender>,
        pipe::Receiver,
        pipe::Receiver,
    )> {
        self.control.set_nonblocking(true)?;
        Ok((
            Supervised {
                pid: self.pid,
                supervisor: self.supervisor,
                control: UnixStream::from_std(self.control)?,
                received: Vec::new(),
                status: None,
            },
            self.stdin.map(pipe::Sender::from_owned_fd).transpose()?,
            pipe::Receiver::from_owned_fd(self.stdout)?,
            pipe::Receiver::from_owned_fd(self.stderr)?,
        ))
    }
}

impl Supervised {
    /// The next 5-byte message from the supervisor (or the shim it became);
    /// cancel-safe: a message read in part is kept for the next call.
    async fn next_message(&mut self) -> Option<(u8, i32)> {
        while self.received.len() < 5 {
            let mut buf = [0u8; 64];
            match self.control.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.received.extend_from_slice(&buf[..n]),
            }
        }
        let m: Vec<u8> = self.received.drain(..5).collect();
        Some((m[0], i32::from_le_bytes([m[1], m[2], m[3], m[4]])))
    }

    /// The command's exit status once it exited (it stays unreaped until
    /// [`Supervised::release`]); None if the supervisor is gone. Cancel-safe.
    pub async fn wait(&mut self) -> Option<ExitStatus> {
        while self.status.is_none() {
            match self.next_message().await? {
                (b'X', raw) => self.status = Some(ExitStatus::from_raw(raw)),
                _ => return None,
            }
        }
        self.status
    }

    /// The exit status if the supervisor has already reported it.
    pub async fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            let _ = tokio::time::timeout(std::time::Duration::ZERO, self.wait()).await;
        }
        self.status
    }

    /// Lets the supervisor reap the command and end.
    pub async fn release(mut self) {
        let _ = self.control.write_all(b"R").await;
    }

    /// Makes the supervisor the shim of the job in `dir`: it takes over the
    /// pipes (already given up here) and the wait. Ok once the shim has
    /// recorded itself; the command may have ended meanwhile, which the job
    /// then records. Err: the supervisor still supervises.
    pub async fn hand_over(&mut self, dir: &Path, elapsed_ms: u64) -> Result<(), String> {
        let mut words = Vec::new();
        for word in [
            dir.as_os_str().as_bytes(),
            self.pid.to_string().as_bytes(),
            elapsed_ms.to_string().as_bytes(),
        ] {
            words.extend_from_slice(word);
            words.push(0);
        }
        if words.len() > ADOPT_MAX {
            return Err(format!("the job dir {} is too long", dir.display()));
        }
        let mut message = vec![b'A'];
        message.extend_from_slice(&(words.len() as u16).to_le_bytes());
        message.extend_from_slice(&words);
        self.control
            .write_all(&message)
            .await
            .map_err(|e| format!("the command's supervisor is gone: {e}"))?;
        // An exit reported just before the request went out comes first. A
        // shim that cannot record itself in time (a hung filesystem) is given
        // up on: the call is answered, and the command stopped.
        let deadline = tokio::time::Instant::now() + ADOPT_WAIT;
        loop {
            let next = tokio::time::timeout_at(deadline, self.next_message());
            let Ok(next) = next.await else {
                return Err(format!(
                    "the job's shim did not take over within {} s",
                    ADOPT_WAIT.as_secs()
                ));
            };
            match next {
                Some((b'r', _)) => return Ok(()),
                Some((b'X', raw)) => self.status = Some(ExitStatus::from_raw(raw)),
                Some((b'F', e)) => {
                    return Err(format!(
                        "cannot start the job's shim: {}",
                        io::Error::from_raw_os_error(e)
                    ));
                }
                Some((other, _)) => return Err(format!("the supervisor said {other:?}")),
                None => return Err("the job's shim did not start".into()),
            }
        }
    }
}

/// How long the shim may take to record itself and answer.
const ADOPT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The most bytes of an adoption request.
const ADOPT_MAX: usize = 4000;

/// What the forked processes use, prepared before the fork.
struct Prepared {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    self_exe: *const libc::c_char,
    /// (descriptor now, descriptor in the supervisor), the first
    /// `source_count` of them.
    sources: [(RawFd, RawFd); SLOTS],
    source_count: usize,
    /// The way into a sandbox (null: none), its descriptors in slots.
    entry: *const Entry,
    /// The slot of the cgroup to be born in, or -1.
    cgroup: RawFd,
    null: RawFd,
    /// [`STACK_LEN`] bytes, 16-aligned at both ends.
    stack: *mut u8,
}

extern "C" fn on_child(_: libc::c_int) {}

/// Writes all of `bytes`; only async-signal-safe calls.
unsafe fn send(fd: RawFd, bytes: &[u8]) -> bool {
    let mut done = 0;
    while done < bytes.len() {
        // SAFETY: writing from a live slice.
        let n = unsafe { libc::write(fd, bytes[done..].as_ptr().cast(), bytes.len() - done) };
        if n > 0 {
            done += n as usize;
        } else if n < 0 && unsafe { *libc::__errno_location() } == libc::EINTR {
            continue;
        } else {
            return false;
        }
    }
    true
}

unsafe fn tagged(fd: RawFd, tag: u8, value: i32) -> bool {
    let v = value.to_le_bytes();
    // SAFETY: see `send`.
    unsafe { send(fd, &[tag, v[0], v[1], v[2], v[3]]) }
}

/// Reads exactly `buf.len()` bytes; false on end of file or error.
unsafe fn receive(fd: RawFd, buf: &mut [u8]) -> bool {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: reading into a live slice.
        let n = unsafe { libc::read(fd, buf[done..].as_mut_ptr().cast(), buf.len() - done) };
        if n > 0 {
            done += n as usize;
        } else if n < 0 && unsafe { *libc::__errno_location() } == libc::EINTR {
            continue;
        } else {
            return false;
        }
    }
    true
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// The supervisor: runs in the fork, never returns.
unsafe fn supervise(p: &Prepared) -> ! {
    // SAFETY (whole body): only async-signal-safe syscalls, on descriptors
    // and memory prepared before the fork.
    unsafe {
        // Its own session: a hang-up of serve's session or process group
        // must not end a job it may become.
        libc::setsid();
        for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_child as *const () as usize;
        action.sa_flags = libc::SA_NOCLDSTOP;
        libc::sigaction(libc::SIGCHLD, &action, std::ptr::null_mut());

        // Every needed descriptor to its slot: first above the slots (so no
        // source is overwritten before it is copied), then into place; then
        // nothing else of serve's stays open here.
        let sources = &p.sources[..p.source_count];
        let mut high = [0; SLOTS];
        for (i, (fd, _)) in sources.iter().enumerate() {
            high[i] = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, FIRST_FREE);
            if high[i] < 0 {
                libc::_exit(120);
            }
        }
        for (i, (_, slot)) in sources.iter().enumerate() {
            if libc::dup3(high[i], *slot, libc::O_CLOEXEC) < 0 {
                libc::_exit(121);
            }
        }
        for fd in 0..3 {
            libc::dup2(p.null, fd);
        }
        // The slots are contiguous from 3; whatever of serve's lies above
        // the last one goes, though below FIRST_FREE.
        let last = sources.iter().map(|(_, slot)| *slot).max().unwrap_or(2);
        close_from(last + 1);

        let child = if p.entry.is_null() {
            // Like posix_spawn: the command shares this process's memory, on
            // a stack of its own, until its exec, so nothing is copied for it.
            let child = libc::clone(
                command_entry,
                p.stack.add(STACK_LEN).cast(),
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                (p as *const Prepared).cast_mut().cast(),
            );
            if child < 0 { Err(errno()) } else { Ok(child) }
        } else if (*p.entry).before.is_empty() {
            let child = fork_command(p, 0);
            if child < 0 { Err(errno()) } else { Ok(child) }
        } else {
            start_entrant(p)
        };
        let child = match child {
            Ok(child) => child,
            Err(code) => {
                tagged(CONTROL_FD, b'E', code);
                libc::_exit(0);
            }
        };
        for fd in [CMD_STDIN, CMD_STDOUT, CMD_STDERR, EXEC_ERR_WRITE] {
            libc::close(fd);
        }

        // Started? The exec error pipe closes on exec, or carries an errno.
        let mut failed = [0u8; 4];
        let mut got = 0;
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: EXEC_ERR_READ,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: CONTROL_FD,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            if libc::poll(fds.as_mut_ptr(), 2, -1) < 0 {
                continue;
            }
            if fds[1].revents != 0 {
                // serve is gone before the command even ran.
                libc::kill(child, libc::SIGKILL);
                libc::waitpid(child, std::ptr::null_mut(), 0);
                libc::_exit(0);
            }
            if fds[0].revents != 0 {
                let n = libc::read(EXEC_ERR_READ, failed[got..].as_mut_ptr().cast(), 4 - got);
                if n > 0 {
                    got += n as usize;
                    if got < 4 {
                        continue;
                    }
                }
                break;
            }
        }
        libc::close(EXEC_ERR_READ);
        if got == 4 {
            libc::waitpid(child, std::ptr::null_mut(), 0);
            tagged(CONTROL_FD, b'E', i32::from_le_bytes(failed));
            libc::_exit(0);
        }
        tagged(CONTROL_FD, b'P', child);

        // SIGCHLD is blocked (since before the fork) except inside ppoll, so
        // an exit between the check and the wait interrupts the wait.
        let mut unblocked: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut unblocked);
        let mut exited = false;
        let mut words = [0u8; ADOPT_MAX + 1];
        loop {
            if !exited {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                let rc = libc::waitid(
                    libc::P_PID,
                    child as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                );
                if rc == 0 && info.si_pid() == child {
                    exited = true;
                    let status = info.si_status();
                    let raw = match info.si_code {
                        libc::CLD_EXITED => (status & 0xff) << 8,
                        libc::CLD_DUMPED => (status & 0x7f) | 0x80,
                        _ => status & 0x7f,
                    };
                    tagged(CONTROL_FD, b'X', raw);
                }
            }
            let mut fds = [libc::pollfd {
                fd: CONTROL_FD,
                events: libc::POLLIN,
                revents: 0,
            }];
            let n = libc::ppoll(fds.as_mut_ptr(), 1, std::ptr::null(), &unblocked);
            if n <= 0 {
                continue;
            }
            let mut tag = [0u8; 1];
            if !receive(CONTROL_FD, &mut tag) {
                // serve is gone: the command goes with it.
                if !exited {
                    libc::kill(child, libc::SIGKILL);
                }
                libc::waitpid(child, std::ptr::null_mut(), 0);
                libc::_exit(0);
            }
            match tag[0] {
                b'A' => {
                    let mut len = [0u8; 2];
                    if !receive(CONTROL_FD, &mut len) {
                        continue;
                    }
                    let len = (u16::from_le_bytes(len) as usize).min(ADOPT_MAX);
                    if !receive(CONTROL_FD, &mut words[..len]) {
                        continue;
                    }
                    words[len] = 0;
                    become_shim(p, &words[..=len]);
                }
                _ => {
                    libc::waitpid(child, std::ptr::null_mut(), 0);
                    libc::_exit(0);
                }
            }
        }
    }
}

/// `exec`s `outpost-agent shim --adopt DIR PID ELAPSED_MS`; on failure says
/// so and goes back to supervising.
unsafe fn become_shim(p: &Prepared, words: &[u8]) {
    // SAFETY: async-signal-safe calls only; `words` is NUL-terminated.
    unsafe {
        let mut args: [*const libc::c_char; 8] = [std::ptr::null(); 8];
        args[0] = c"outpost-agent".as_ptr();
        args[1] = c"shim".as_ptr();
        args[2] = c"--adopt".as_ptr();
        let mut n = 3;
        let mut start = 0;
        for (i, &b) in words.iter().enumerate() {
            if b == 0 && n < 6 {
                args[n] = words[start..].as_ptr().cast();
                n += 1;
                start = i + 1;
            }
        }
        if n < 6 {
            tagged(CONTROL_FD, b'F', libc::EINVAL);
            return;
        }
        for fd in [CONTROL_FD, STDOUT_FD, STDERR_FD] {
            libc::fcntl(fd, libc::F_SETFD, 0);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        unsafe extern "C" {
            static environ: *const *const libc::c_char;
        }
        libc::execve(p.self_exe, args.as_ptr(), environ);
        let e = errno();
        libc::sigfillset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        for fd in [CONTROL_FD, STDOUT_FD, STDERR_FD] {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
        tagged(CONTROL_FD, b'F', e);
    }
}

extern "C" fn command_entry(prepared: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `clone` passes the supervisor's `Prepared`, which lives while
    // the supervisor waits for this process to exec or exit.
    unsafe { run_command(&*prepared.cast::<Prepared>()) }
}

/// The command's stack until its exec.
const STACK_LEN: usize = 64 * 1024;

/// The command: runs in the supervisor's clone, never returns.
unsafe fn run_command(p: &Prepared) -> ! {
    // SAFETY: async-signal-safe calls only, as in `supervise`.
    unsafe {
        libc::dup2(CMD_STDIN, 0);
        libc::dup2(CMD_STDOUT, 1);
        libc::dup2(CMD_STDERR, 2);
        for fd in [
            CONTROL_FD,
            STDOUT_FD,
            STDERR_FD,
            CMD_STDIN,
            CMD_STDOUT,
            CMD_STDERR,
            EXEC_ERR_READ,
        ] {
            libc::close(fd);
        }
        let fail = |e: i32| -> ! {
            send(EXEC_ERR_WRITE, &e.to_le_bytes());
            libc::_exit(127)
        };
        if child_setup().is_err() {
            fail(errno());
        }
        let entering = !p.entry.is_null();
        if entering && let Err(code) = (*p.entry).take(&(*p.entry).inside, slot) {
            fail(code);
        }
        if libc::chdir(p.cwd) != 0 {
            fail(if entering {
                entry::failure(entry::STAGE_CWD, errno())
            } else {
                errno()
            });
        }
        libc::execve(p.path, p.argv, p.envp);
        fail(errno());
    }
}

/// Closes every descriptor from `first` on.
unsafe fn close_from(first: RawFd) {
    // SAFETY: plain syscalls.
    unsafe {
        if libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            0,
        ) == 0
        {
            return;
        }
        let mut limit: libc::rlimit = std::mem::zeroed();
        let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur.min(65536) as RawFd
        } else {
            4096
        };
        for fd in first..max {
            libc::close(fd);
        }
    }
}

/// Runs in the child between fork and exec: only async-signal-safe calls.
pub fn child_setup() -> io::Result<()> {
    // SAFETY: setsid, signal and sigprocmask are async-signal-safe.
    unsafe {
        // Own session: pgid == sid == pid, so the whole group can be signalled
        // and the command is detached from the agent's terminal, if any.
        if libc::setsid() == -1 {
            return Err(io::Error::last_os_error());
        }
        // Ignored signals survive exec; the agent ignores SIGPIPE (Rust does),
        // and a command must see the defaults a login shell would.
        for sig in 1..65 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
    Ok(())
}
