//! [`Sshd`], the private OpenSSH server, and what starting one takes: the
//! prerequisites, the test account's password, keys, a free port, the banner check.

use std::collections::HashSet;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::netns::Netns;
use crate::procs::{
    continue_pids, descendants, pids_with_cmdline, pids_with_exe_under, process_table, signal_all,
};
use crate::{KEY_PASSPHRASE, SETUP_HINT, TEST_USER, make_unique_dir, set_mode, wait_until};

/// sshd insists on being started by absolute path (it re-executes itself).
const SSHD_BIN: &str = "/usr/sbin/sshd";

/// How long sshd gets to start answering with its banner.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts at finding a free port before giving up.
const PORT_ATTEMPTS: usize = 5;
/// Process names of OpenSSH's per-connection processes: `sshd` up to 9.7,
/// `sshd-session` from 9.8, `sshd-auth` from 10.0.
const CONNECTION_COMMS: &[&str] = &["sshd", "sshd-session", "sshd-auth"];

/// A private OpenSSH server listening on 127.0.0.1.
///
/// Dropping it kills the listener, every process below it and every process
/// started from its remote state directory, then removes its directories.
pub struct Sshd {
    dir: PathBuf,
    remote_root: PathBuf,
    remote_dir: PathBuf,
    port: u16,
    child: Option<Child>,
    host_key: PathBuf,
    client_key: PathBuf,
    client_key_with_passphrase: PathBuf,
    other_key: PathBuf,
    /// Set when sshd runs inside a network namespace of its own.
    netns: Option<Netns>,
    /// Set in every session (`SetEnv`), as a login node's profile would.
    env: Vec<(String, String)>,
}

/// Why one launch attempt failed.
enum LaunchError {
    /// The port was taken between picking it and sshd binding it.
    PortTaken,
    Other(String),
}

impl Sshd {
    /// Starts a fresh sshd; panics with a diagnostic on any failure.
    pub fn start() -> Sshd {
        Sshd::start_with(None, &[])
    }

    /// Starts a fresh sshd whose sessions have `home` (see
    /// [`test_user_dir`](crate::test_user_dir)) as their HOME: relative remote paths land there, so
    /// several sshds on this machine are several hosts with trees of their own.
    pub fn start_with_home(home: &Path) -> Sshd {
        Sshd::start_with_env(&[("HOME", home.display().to_string())])
    }

    /// Starts a fresh sshd whose sessions all get `env` (a private Slurm's
    /// `SLURM_CONF`, as a cluster's login profile sets its own).
    pub fn start_with_env(env: &[(&str, String)]) -> Sshd {
        Sshd::start_with(None, env)
    }

    /// Starts sshd inside a network namespace of its own, reached from here
    /// through a veth pair, so a test can cut the link ([`Netns::cut`]).
    pub fn start_in_netns() -> Sshd {
        Sshd::start_with(Some(Netns::new()), &[])
    }

    fn start_with(netns: Option<Netns>, env: &[(&str, String)]) -> Sshd {
        check_prerequisites();
        let dir = make_unique_dir("outpost-sshd");
        // sshd reads authorized_keys as the logged-in user, so the directory
        // and that file must be readable by `outpost-test`.
        set_mode(&dir, 0o755);

        let host_key = dir.join("ssh_host_ed25519_key");
        let client_key = dir.join("client_ed25519");
        let client_key_with_passphrase = dir.join("client_ed25519_pass");
        let other_key = dir.join("other_ed25519");
        keygen(&host_key, "", "outpost-e2e-host");
        keygen(&client_key, "", "outpost-e2e-client");
        keygen(
            &client_key_with_passphrase,
            KEY_PASSPHRASE,
            "outpost-e2e-client-pass",
        );
        keygen(&other_key, "", "outpost-e2e-other");

        let authorized = dir.join("authorized_keys");
        let mut lines = read_to_string(&pub_path(&client_key));
        lines.push_str(&read_to_string(&pub_path(&client_key_with_passphrase)));
        fs::write(&authorized, lines).expect("write authorized_keys");
        set_mode(&authorized, 0o644);

        let (remote_root, remote_dir) = make_remote_dir();

        let mut sshd = Sshd {
            dir,
            remote_root,
            remote_dir,
            port: 0,
            child: None,
            host_key,
            client_key,
            client_key_with_passphrase,
            other_key,
            netns,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        };

        // Picking a port and sshd binding it is racy against other tests, so
        // retry with a new port when sshd reports the address in use.
        let mut last_error = String::new();
        for _ in 0..PORT_ATTEMPTS {
            sshd.port = free_port();
            match sshd.launch() {
                Ok(()) => return sshd,
                Err(LaunchError::PortTaken) => {
                    last_error = format!("port {} was taken", sshd.port);
                }
                Err(LaunchError::Other(msg)) => panic!("{msg}"),
            }
        }
        panic!(
            "sshd could not bind a port after {PORT_ATTEMPTS} attempts ({last_error}):\n{}",
            sshd.log()
        );
    }

    /// Same as [`Sshd::start`].
    pub fn new() -> Sshd {
        Sshd::start()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address sshd listens on: 127.0.0.1, or its namespace's address.
    pub fn host(&self) -> &str {
        match &self.netns {
            Some(ns) => &ns.ns_addr,
            None => "127.0.0.1",
        }
    }

    /// A `[[sandbox]]` entry of Outpost's config file for this server, keyed
    /// by [`Sshd::client_key`], with the agent's state in [`Sshd::remote_dir`].
    pub fn sandbox_toml(&self, name: &str) -> String {
        format!(
            "[[sandbox]]\nname = \"{name}\"\nhost = \"{}\"\nport = {}\nuser = \"{}\"\nkey_file = \"{}\"\nremote_dir = \"{}\"\n",
            self.host(),
            self.port,
            TEST_USER,
            self.client_key.display(),
            self.remote_dir.display()
        )
    }

    /// The same entry logging in as root (the tests run as root), with the
    /// agent's state in `remote_dir`.
    pub fn root_sandbox_toml(&self, name: &str, remote_dir: &Path) -> String {
        format!(
            "[[sandbox]]\nname = \"{name}\"\nhost = \"{}\"\nport = {}\nuser = \"root\"\nkey_file = \"{}\"\nremote_dir = \"{}\"\n",
            self.host(),
            self.port,
            self.client_key.display(),
            remote_dir.display()
        )
    }

    /// The namespace sshd runs in, when started with [`Sshd::start_in_netns`].
    pub fn netns(&self) -> Option<&Netns> {
        self.netns.as_ref()
    }

    fn ip(&self) -> Ipv4Addr {
        self.host().parse().expect("sshd address is IPv4")
    }

    pub fn user(&self) -> &'static str {
        TEST_USER
    }

    /// The test account's password for this test process: random, set on
    /// first use and put back to `*` (no password) when the process exits.
    /// The system's own sshd, if any, is not the concern here: the account
    /// has a password only while tests run, and nobody can know it.
    pub fn password(&self) -> &'static str {
        test_password()
    }

    /// Unencrypted ed25519 key, authorized for every user.
    pub fn client_key(&self) -> &Path {
        &self.client_key
    }

    /// ed25519 key encrypted with [`KEY_PASSPHRASE`], authorized too.
    pub fn client_key_with_passphrase(&self) -> &Path {
        &self.client_key_with_passphrase
    }

    /// ed25519 key that the server does NOT accept.
    pub fn other_key(&self) -> &Path {
        &self.other_key
    }

    /// The instance's private directory (config, keys, log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A fresh, empty directory owned by `outpost-test` (mode 0700) where the
    /// controller can be told to install the agent and keep its state.
    pub fn remote_dir(&self) -> &Path {
        &self.remote_dir
    }

    /// Path of sshd's log (its stderr at LogLevel VERBOSE).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("sshd.log")
    }

    /// The log so far; handy in assertion messages.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The current host public key, as in the `.pub` file:
    /// `ssh-ed25519 AAAA… comment`.
    pub fn host_public_key_line(&self) -> String {
        read_to_string(&pub_path(&self.host_key))
            .trim_end()
            .to_string()
    }

    /// A known_hosts line for the current host key:
    /// `[127.0.0.1]:PORT ssh-ed25519 AAAA…`.
    pub fn known_hosts_line(&self) -> String {
        let line = self.host_public_key_line();
        let mut fields = line.split_whitespace();
        let (kind, key) = (fields.next().unwrap_or(""), fields.next().unwrap_or(""));
        format!("[{}]:{} {kind} {key}", self.host(), self.port)
    }

    /// Pid of the listening sshd.
    pub fn listener_pid(&self) -> i32 {
        self.child
            .as_ref()
            .map(|c| c.id() as i32)
            .expect("sshd is not running")
    }

    /// An `ssh` command that logs in as `outpost-test` with [`Self::client_key`],
    /// non-interactively and without host key checks; append the remote command.
    pub fn ssh_command(&self) -> Command {
        let mut cmd = Command::new("ssh");
        cmd.arg("-i")
            .arg(&self.client_key)
            .arg("-p")
            .arg(self.port.to_string())
            .args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "LogLevel=ERROR",
                "-F",
                "/dev/null",
            ])
            .arg(format!("{}@{}", TEST_USER, self.host()))
            .stdin(Stdio::null());
        cmd
    }

    /// Pids of the per-connection sshd processes (pre-auth, privileged and
    /// user-side), i.e. descendants of the listener named like sshd. Session
    /// processes such as shells or the agent are not included.
    pub fn connection_pids(&self) -> Vec<i32> {
        let Some(listener) = self.child.as_ref().map(|c| c.id() as i32) else {
            return Vec::new();
        };
        let table = process_table();
        descendants(&table, listener)
            .into_iter()
            .filter(|pid| {
                // Zombies are connections that already ended, awaiting reaping.
                table.get(pid).is_some_and(|p| {
                    CONNECTION_COMMS.contains(&p.comm.as_str()) && !matches!(p.state, 'Z' | 'X')
                })
            })
            .collect()
    }

    /// SIGKILLs every connection process: clients see the connection drop
    /// abruptly, while session processes (the agent) are left running.
    pub fn kill_connections(&self) {
        signal_all(&self.connection_pids(), libc::SIGKILL);
    }

    /// SIGSTOPs every connection process (a hung server/network) and returns
    /// their pids for [`continue_pids`] / [`Sshd::continue_pids`].
    pub fn stop_connections(&self) -> Vec<i32> {
        let pids = self.connection_pids();
        signal_all(&pids, libc::SIGSTOP);
        pids
    }

    /// SIGCONTs the given pids; see [`continue_pids`].
    pub fn continue_pids(&self, pids: &[i32]) {
        continue_pids(pids);
    }

    /// Replaces the host key with a new one and restarts sshd on the same
    /// port. The old listener and all its connections are killed, so clients
    /// must reconnect and then meet the changed key.
    pub fn regenerate_host_key(&mut self) {
        self.kill_tree();
        // ssh-keygen would ask before overwriting, so remove the old pair.
        let _ = fs::remove_file(&self.host_key);
        let _ = fs::remove_file(pub_path(&self.host_key));
        keygen(&self.host_key, "", "outpost-e2e-host");
        // The port was just released by our own listener, so a bind failure
        // is transient (a dying process still holding it); retry briefly.
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.launch() {
                Ok(()) => return,
                Err(LaunchError::PortTaken) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(LaunchError::PortTaken) => {
                    panic!("sshd could not rebind port {}:\n{}", self.port, self.log())
                }
                Err(LaunchError::Other(msg)) => panic!("{msg}"),
            }
        }
    }

    /// Writes the config for the current port and starts sshd, waiting until
    /// it answers with its SSH banner.
    fn launch(&mut self) -> Result<(), LaunchError> {
        let config = self.dir.join("sshd_config");
        fs::write(&config, self.config_text()).expect("write sshd_config");

        let log_path = self.log_path();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("open sshd.log");
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);

        let mut command = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns.name, SSHD_BIN]);
                c
            }
            None => Command::new(SSHD_BIN),
        };
        let child = command
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log fd"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {SSHD_BIN}: {e}; {SETUP_HINT}"));
        self.child = Some(child);

        // Only what this launch wrote matters for diagnosing it.
        let new_log = || {
            let mut text = String::new();
            if let Ok(mut f) = fs::File::open(&log_path) {
                let _ = f.seek(SeekFrom::Start(log_start));
                let _ = f.read_to_string(&mut text);
            }
            text
        };

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                let text = new_log();
                if text.contains("Address already in use")
                    || text.contains("Cannot bind any address")
                {
                    return Err(LaunchError::PortTaken);
                }
                return Err(LaunchError::Other(format!(
                    "sshd exited during startup ({status}):\n{}",
                    text
                )));
            }
            if banner_ok(self.ip(), self.port) {
                break;
            }
            if Instant::now() >= deadline {
                let text = new_log();
                self.kill_tree();
                return Err(LaunchError::Other(format!(
                    "sshd on port {} did not send an SSH-2.0 banner within {:?}:\n{}",
                    self.port, READY_TIMEOUT, text
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The banner probe left a pre-auth connection process behind; let it
        // go so tests start from zero connections.
        wait_until(Duration::from_secs(3), || self.connection_pids().is_empty());
        Ok(())
    }

    fn config_text(&self) -> String {
        let dir = self.dir.display();
        let set_env: String = self
            .env
            .iter()
            .map(|(k, v)| format!("SetEnv {k}={v}\n"))
            .collect();
        set_env
            + &format!(
                "# Private sshd for Outpost's end-to-end tests.\n\
             ListenAddress {addr}\n\
             Port {port}\n\
             HostKey {host_key}\n\
             PidFile {dir}/sshd.pid\n\
             AuthorizedKeysFile {dir}/authorized_keys\n\
             StrictModes no\n\
             PasswordAuthentication yes\n\
             KbdInteractiveAuthentication no\n\
             PubkeyAuthentication yes\n\
             UsePAM no\n\
             PermitRootLogin prohibit-password\n\
             AllowUsers {user} root\n\
             Subsystem sftp internal-sftp\n\
             LogLevel VERBOSE\n\
             MaxStartups 100:30:200\n\
             MaxSessions 200\n\
             UseDNS no\n\
             PrintMotd no\n\
             PrintLastLog no\n",
                addr = self.host(),
                port = self.port,
                host_key = self.host_key.display(),
                user = TEST_USER,
            )
    }

    /// SIGKILLs the listener and everything below it, then reaps it.
    fn kill_tree(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let listener = child.id() as i32;
        // Freeze the tree first so nothing forks between listing and killing;
        // repeat until the listing stops growing.
        let mut frozen: HashSet<i32> = HashSet::new();
        for _ in 0..10 {
            let table = process_table();
            let mut tree = descendants(&table, listener);
            tree.push(listener);
            let new: Vec<i32> = tree.into_iter().filter(|p| !frozen.contains(p)).collect();
            if new.is_empty() {
                break;
            }
            signal_all(&new, libc::SIGSTOP);
            frozen.extend(new);
        }
        let all: Vec<i32> = frozen.into_iter().collect();
        signal_all(&all, libc::SIGKILL);
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Default for Sshd {
    fn default() -> Self {
        Sshd::start()
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.kill_tree();
        // An agent that daemonized has left the sshd tree; find it by the
        // unique path it was installed under.
        let root = self.remote_root.to_string_lossy().into_owned();
        let strays: Vec<i32> = pids_with_cmdline(&root)
            .into_iter()
            .chain(pids_with_exe_under(&self.remote_root))
            .collect();
        signal_all(&strays, libc::SIGKILL);
        let _ = fs::remove_dir_all(&self.remote_root);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn check_prerequisites() {
    if !Path::new(SSHD_BIN).exists() {
        panic!("{SSHD_BIN} not found: {SETUP_HINT}");
    }
    if passwd_entry(TEST_USER).is_none() {
        panic!("user {TEST_USER} does not exist: {SETUP_HINT}");
    }
    // Only root's sshd can switch to another user after authentication.
    if unsafe { libc::geteuid() } != 0 {
        panic!("the end-to-end tests must run as root: sshd has to log in as {TEST_USER}");
    }
    // sshd without PAM refuses every login, keys included, to an account
    // whose password field starts with `!` (locked).
    if shadow_password_field(TEST_USER).is_some_and(|f| f.starts_with('!')) {
        panic!("user {TEST_USER} is locked (`!` in /etc/shadow): {SETUP_HINT}");
    }
    // sshd's privilege-separation directory lives on a tmpfs; recreate it
    // if the machine rebooted since setup.
    let _ = fs::create_dir_all("/run/sshd");
}

/// Where a test process holding the test account's password keeps its
/// lock, so that concurrent test processes take turns (the second waits for
/// the first to exit) instead of changing each other's password.
const PASSWORD_LOCK: &str = "/run/outpost-e2e-password.lock";

/// The test account's password while this process runs; see
/// [`Sshd::password`]. Never written anywhere but `/etc/shadow` (hashed, by
/// `chpasswd`, which reads it on stdin), never logged, never on a command
/// line.
fn test_password() -> &'static str {
    static PASSWORD: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PASSWORD.get_or_init(|| {
        check_prerequisites();
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(PASSWORD_LOCK)
            .unwrap_or_else(|e| panic!("cannot open {PASSWORD_LOCK}: {e}"));
        // SAFETY: flock(2) on a descriptor we own.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
            panic!(
                "cannot lock {PASSWORD_LOCK}: {}",
                std::io::Error::last_os_error()
            );
        }
        // Held until the process exits, after the reset below has run.
        std::mem::forget(lock);
        let mut raw = [0u8; 24];
        fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut raw))
            .expect("read /dev/urandom");
        let password: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        // SAFETY: registers a plain function with no preconditions.
        unsafe {
            libc::atexit(reset_password);
        }
        if let Err(message) = chpasswd(&format!("{TEST_USER}:{password}\n"), false) {
            panic!("cannot set a password for {TEST_USER}: {message}; {SETUP_HINT}");
        }
        password
    })
}

/// Takes the test account's password away again (`*`: no password login,
/// keys still work) as the test process exits.
extern "C" fn reset_password() {
    let _ = chpasswd(&format!("{TEST_USER}:*\n"), true);
}

/// Runs `chpasswd` (`-e`: the field as given) with `line` on its stdin.
fn chpasswd(line: &str, verbatim: bool) -> Result<(), String> {
    use std::io::Write;
    let mut command = Command::new("chpasswd");
    if verbatim {
        command.arg("-e");
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run chpasswd: {e}"))?;
    let written = child
        .stdin
        .take()
        .map(|mut stdin| stdin.write_all(line.as_bytes()));
    let out = child
        .wait_with_output()
        .map_err(|e| format!("chpasswd: {e}"))?;
    match written {
        Some(Ok(())) if out.status.success() => Ok(()),
        _ => Err(format!(
            "chpasswd failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// The password field of a user in /etc/shadow.
fn shadow_password_field(user: &str) -> Option<String> {
    let text = fs::read_to_string("/etc/shadow").ok()?;
    text.lines().find_map(|line| {
        let mut f = line.split(':');
        (f.next() == Some(user)).then(|| f.next().unwrap_or("").to_string())
    })
}

/// (uid, gid) of a user from /etc/passwd (avoids non-reentrant getpwnam).
fn passwd_entry(user: &str) -> Option<(u32, u32)> {
    let text = fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() >= 4 && f[0] == user {
            Some((f[2].parse().ok()?, f[3].parse().ok()?))
        } else {
            None
        }
    })
}

/// Creates `<scratch>/outpost-e2e-<random>/state`, both owned by the test user.
fn make_remote_dir() -> (PathBuf, PathBuf) {
    let (uid, gid) =
        passwd_entry(TEST_USER).unwrap_or_else(|| panic!("user {TEST_USER} missing: {SETUP_HINT}"));
    let root = make_unique_dir("outpost-e2e");
    set_mode(&root, 0o755);
    let state = root.join("state");
    fs::create_dir(&state).expect("create remote state dir");
    set_mode(&state, 0o700);
    for p in [&root, &state] {
        std::os::unix::fs::chown(p, Some(uid), Some(gid))
            .unwrap_or_else(|e| panic!("chown {}: {e}", p.display()));
    }
    (root, state)
}

fn read_to_string(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn pub_path(key: &Path) -> PathBuf {
    let mut s = key.as_os_str().to_owned();
    s.push(".pub");
    PathBuf::from(s)
}

/// Generates an ed25519 key pair at `path` / `path.pub`.
fn keygen(path: &Path, passphrase: &str, comment: &str) {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", passphrase, "-C", comment, "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run ssh-keygen: {e}; {SETUP_HINT}"));
    if !out.status.success() {
        panic!(
            "ssh-keygen for {} failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Asks the kernel for a free loopback port. sshd binds it a moment later;
/// the small race is covered by retrying in [`Sshd::start`].
pub(crate) fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port on 127.0.0.1")
}

/// Whether the port accepts a connection and greets with `SSH-2.0`.
fn banner_ok(ip: Ipv4Addr, port: u16) -> bool {
    let addr = SocketAddr::from((ip, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    // The banner is the first line; stop at newline or a sane length.
    while buf.len() < 256 {
        match stream.read(&mut byte) {
            Ok(1) if byte[0] == b'\n' => break,
            Ok(1) => buf.push(byte[0]),
            _ => break,
        }
    }
    buf.starts_with(b"SSH-2.0")
}
