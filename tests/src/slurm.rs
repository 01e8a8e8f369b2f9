//! [`Slurm`]: a private single-node Slurm cluster for tests that run Outpost
//! inside an allocation.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::procs::signal_all;
use crate::sshd::free_port;
use crate::{SETUP_HINT, TempDir, set_mode, skip, wait_until};

/// A private single-node Slurm cluster (Debian's Slurm 22.05 and munge),
/// everything under a fresh base directory: munge key, munged and its
/// socket, `slurm.conf`, state, spool, logs, and controller and node ports
/// picked free from the OS, so concurrent test processes each get a cluster
/// of their own. The node (`localhost`) advertises 16 CPUs whatever the
/// machine has, so several allocation holders fit at once.
///
/// Needs root (the daemons run as root) and the packages
/// `scripts/setup-test-env` installs; [`Slurm::start`] gives `None`
/// otherwise. Dropping it cancels the cluster's jobs (all of them were made
/// through it), then stops slurmd, slurmctld and munged.
pub struct Slurm {
    conf: PathBuf,
    munged: Option<Child>,
    slurmctld: Option<Child>,
    slurmd: Option<Child>,
    // Last: removed after the daemons have stopped.
    base: TempDir,
}

/// How long the cluster gets to bring its node up, and a held job to start.
const SLURM_READY_TIMEOUT: Duration = Duration::from_secs(30);
const SLURM_DAEMONS: &[&str] = &[
    "/usr/sbin/munged",
    "/usr/sbin/slurmctld",
    "/usr/sbin/slurmd",
];
const SLURM_CLIENTS: &[&str] = &["mungekey", "sinfo", "squeue", "sbatch", "srun", "scancel"];

impl Slurm {
    /// Starts munged, slurmctld and `slurmd -N localhost`, and waits until
    /// the node is idle; `None` (with a "skipped" line) without root or the
    /// binaries. Panics with the daemons' log tails when the node does not
    /// come up.
    pub fn start() -> Option<Slurm> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            skip("a private Slurm cluster needs root");
            return None;
        }
        let missing: Vec<&str> = SLURM_DAEMONS
            .iter()
            .copied()
            .filter(|p| !Path::new(p).is_file())
            .chain(SLURM_CLIENTS.iter().copied().filter(|p| !on_path(p)))
            .collect();
        if !missing.is_empty() {
            skip(&format!(
                "Slurm or munge missing ({}); {SETUP_HINT}",
                missing.join(", ")
            ));
            return None;
        }

        let base = TempDir::new("slurm");
        let b = base.path();
        // munged refuses a key directory others can read and a socket
        // directory others cannot traverse.
        for (dir, mode) in [
            ("munge/etc", 0o700),
            ("munge/run", 0o755),
            ("munge/lib", 0o700),
            ("munge/log", 0o700),
            ("etc", 0o755),
            ("state", 0o700),
            ("spool", 0o755),
            ("log", 0o755),
            ("run", 0o755),
            ("jobs", 0o755),
        ] {
            fs::create_dir_all(b.join(dir)).unwrap_or_else(|e| panic!("mkdir {dir}: {e}"));
            set_mode(&b.join(dir), mode);
        }
        set_mode(&b.join("munge"), 0o755);
        let key = b.join("munge/etc/munge.key");
        let socket = b.join("munge/run/munge.socket.2");
        let out = Command::new("mungekey")
            .arg("--create")
            .arg(format!("--keyfile={}", key.display()))
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run mungekey: {e}"));
        assert!(
            out.status.success(),
            "mungekey failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );

        let conf = b.join("etc/slurm.conf");
        let mut slurm = Slurm {
            conf: conf.clone(),
            munged: None,
            slurmctld: None,
            slurmd: None,
            base,
        };
        let b = slurm.base.path().to_path_buf();
        slurm.munged = Some(spawn_logged(
            Command::new("/usr/sbin/munged")
                .arg("-F")
                .arg(format!("--socket={}", socket.display()))
                .arg(format!("--key-file={}", key.display()))
                .arg(format!(
                    "--log-file={}",
                    b.join("munge/log/munged.log").display()
                ))
                .arg(format!(
                    "--pid-file={}",
                    b.join("munge/run/munged.pid").display()
                ))
                .arg(format!(
                    "--seed-file={}",
                    b.join("munge/lib/munged.seed").display()
                )),
            &b.join("log/munged.out"),
        ));
        if !wait_until(SLURM_READY_TIMEOUT, || socket.exists()) {
            panic!("munged did not create its socket:\n{}", slurm.logs());
        }

        // Two distinct free ports, which the daemons bind a moment later:
        // another process (a test beside this one starting its own cluster)
        // may take one in between, so a daemon that exits on "Address
        // already in use" is started again on fresh ports.
        const PORT_TRIES: usize = 3;
        for attempt in 1..=PORT_TRIES {
            let ctld_port = free_port();
            let slurmd_port = loop {
                let p = free_port();
                if p != ctld_port {
                    break p;
                }
            };
            let name = b.file_name().unwrap().to_string_lossy().replace('-', "_");
            let text = format!(
                "# A private single-node cluster for one test process.
ClusterName={cluster}
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool
SlurmctldPidFile={b}/run/slurmctld.pid
SlurmdPidFile={b}/run/slurmd.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
# More CPUs than the machine has, so that several holder jobs fit.
SlurmdParameters=config_overrides
NodeName=localhost NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=16 CoresPerSocket=16 ThreadsPerCore=1 RealMemory=4000 State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP
",
                // ClusterName: lower case, at most 40 characters.
                cluster = &name.to_lowercase()[..name.len().min(40)],
                socket = socket.display(),
                b = b.display(),
            );
            fs::write(&conf, text).expect("write slurm.conf");

            let mut ctld = slurm.command("/usr/sbin/slurmctld");
            ctld.arg("-D").arg("-f").arg(&conf);
            slurm.slurmctld = Some(spawn_logged(&mut ctld, &b.join("log/slurmctld.out")));
            // -N: the machine's hostname is not the node's name.
            let mut slurmd = slurm.command("/usr/sbin/slurmd");
            slurmd.args(["-D", "-N", "localhost", "-f"]).arg(&conf);
            slurm.slurmd = Some(spawn_logged(&mut slurmd, &b.join("log/slurmd.out")));

            let mut last = String::new();
            let ready = wait_until(SLURM_READY_TIMEOUT, || {
                if slurm.daemon_exited() {
                    return true;
                }
                last = slurm.output(&["sinfo", "-h", "-n", "localhost", "-o", "%T"]);
                last.trim() == "idle"
            });
            if ready && !slurm.daemon_exited() {
                return Some(slurm);
            }
            let clash = slurm.logs().contains("Address already in use");
            for child in [&mut slurm.slurmd, &mut slurm.slurmctld] {
                if let Some(mut child) = child.take() {
                    stop_child(&mut child);
                }
            }
            if !(clash && attempt < PORT_TRIES) {
                panic!(
                    "the Slurm node did not become idle (sinfo said {:?}):\n{}",
                    last.trim(),
                    slurm.logs()
                );
            }
        }
        unreachable!("the last try panics")
    }

    /// The environment every Slurm command (and whatever runs them) needs;
    /// the munge socket is in the config file's `AuthInfo`.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![("SLURM_CONF", self.conf.display().to_string())]
    }

    /// `prog` with [`Slurm::env`] set.
    pub fn command(&self, prog: &str) -> Command {
        let mut cmd = Command::new(prog);
        cmd.envs(self.env()).stdin(Stdio::null());
        cmd
    }

    /// The cluster's base directory (config, state, logs).
    pub fn dir(&self) -> &Path {
        self.base.path()
    }

    /// Submits an allocation holder (`sleep infinity` for `minutes`) and
    /// returns its job id once it runs.
    pub fn hold(&self, minutes: u32) -> u32 {
        let out = self
            .command("sbatch")
            .args(["--parsable", "-N1", "-n1", "-t", &minutes.to_string()])
            .arg(format!("--output={}/jobs/%j.out", self.dir().display()))
            .args(["--wrap", "sleep infinity"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run sbatch: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        // --parsable: `ID` or `ID;CLUSTER`.
        let job: u32 = stdout
            .trim()
            .split(';')
            .next()
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "sbatch failed ({}): {stdout}{}\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr),
                    self.logs()
                )
            });
        let mut state = None;
        if !wait_until(SLURM_READY_TIMEOUT, || {
            state = self.state(job);
            state.as_deref() == Some("RUNNING")
        }) {
            panic!(
                "job {job} did not start (state {state:?}):\n{}",
                self.logs()
            );
        }
        job
    }

    /// The job's state as squeue shows it (`RUNNING`, `CANCELLED`, …), or
    /// `None` once the controller has forgotten it.
    pub fn state(&self, job: u32) -> Option<String> {
        let out = self
            .command("squeue")
            .args(["-h", "-j", &job.to_string(), "-o", "%T"])
            .output()
            .ok()?;
        let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !state.is_empty()).then_some(state)
    }

    /// `scancel JOB`; panics when scancel fails.
    pub fn cancel(&self, job: u32) {
        let out = self
            .command("scancel")
            .arg(job.to_string())
            .output()
            .unwrap_or_else(|e| panic!("cannot run scancel: {e}"));
        assert!(
            out.status.success(),
            "scancel {job} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The last lines of every daemon's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for log in [
            "log/slurmctld.log",
            "log/slurmctld.out",
            "log/slurmd.log",
            "log/slurmd.out",
            "munge/log/munged.log",
            "log/munged.out",
        ] {
            let body = fs::read_to_string(self.dir().join(log)).unwrap_or_default();
            let lines: Vec<&str> = body.lines().collect();
            let tail = &lines[lines.len().saturating_sub(20)..];
            text.push_str(&format!("--- {log}\n{}\n", tail.join("\n")));
        }
        text
    }

    /// stdout of a Slurm client command, empty when it cannot run.
    fn output(&self, argv: &[&str]) -> String {
        self.command(argv[0])
            .args(&argv[1..])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    fn daemon_exited(&mut self) -> bool {
        [&mut self.munged, &mut self.slurmctld, &mut self.slurmd]
            .into_iter()
            .flatten()
            .any(|c| c.try_wait().ok().flatten().is_some())
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // Every job here was made through this cluster: none may outlive it
        // (slurmstepd and the job's processes do not stop with slurmd).
        if self.slurmctld.is_some() {
            let _ = self.command("scancel").arg("--user=root").output();
            wait_until(Duration::from_secs(10), || {
                self.output(&["squeue", "-h", "-o", "%i"]).trim().is_empty()
            });
        }
        for child in [&mut self.slurmd, &mut self.slurmctld, &mut self.munged] {
            if let Some(mut child) = child.take() {
                stop_child(&mut child);
            }
        }
    }
}

/// Starts `cmd` with stdout and stderr appended to `log`.
fn spawn_logged(cmd: &mut Command, log: &Path) -> Child {
    let file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone().expect("dup log fd"))
        .stderr(file)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", cmd.get_program()))
}

/// SIGTERM, a few seconds' grace, then SIGKILL; reaps the child.
fn stop_child(child: &mut Child) {
    signal_all(&[child.id() as i32], libc::SIGTERM);
    let exited = wait_until(Duration::from_secs(5), || {
        child.try_wait().ok().flatten().is_some()
    });
    if !exited {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// Whether `prog` is an executable file in a directory of PATH.
fn on_path(prog: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            fs::metadata(dir.join(prog)).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
        })
    })
}
