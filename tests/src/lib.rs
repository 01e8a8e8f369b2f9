//! Test harness for Outpost's end-to-end tests.
//!
//! The centre piece is [`Sshd`]: a private OpenSSH server on 127.0.0.1 with an
//! ephemeral port, its own host key, its own config and its own client keys,
//! so that tests exercise the controller against a real sshd exactly as it
//! would meet one in the field, without touching the system's sshd or
//! `~/.ssh`. Each instance also owns a fresh remote state directory that the
//! controller can be told to install its agent into.
//!
//! Requirements: run as root (sshd must switch to the test user) after
//! `scripts/setup-test-env`, which installs sshd and creates `outpost-test`
//! with no usable password (`*`). A test that logs in by password gets one
//! made for this process ([`Sshd::password`]), taken back when it exits.
//!
//! The free helpers locate workspace binaries ([`target_bin`]), find
//! processes ([`pids_with_cmdline`]), signal them ([`continue_pids`]) and poll
//! for conditions ([`wait_until`]). [`Slurm`] is a private single-node Slurm
//! cluster (root and Slurm needed; skipped otherwise) for tests that run
//! Outpost inside an allocation.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The account the tests log in as; created by `scripts/setup-test-env`.
pub const TEST_USER: &str = "outpost-test";
/// Passphrase of [`Sshd::client_key_with_passphrase`].
pub const KEY_PASSPHRASE: &str = "secret-pass";

/// sshd insists on being started by absolute path (it re-executes itself).
const SSHD_BIN: &str = "/usr/sbin/sshd";
const SETUP_HINT: &str = "run scripts/setup-test-env (as root) first";

/// A test whose component (bwrap, Slurm, the test account, Landlock) is
/// missing says so and returns; under `CI=true` it fails instead, so that
/// a failed set-up step can never turn into passing tests.
pub fn skip(what: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{what}: CI=true, so a missing component fails the test");
    }
    eprintln!("skipped: {what}");
}
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
    /// [`test_user_dir`]) as their HOME: relative remote paths land there, so
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

/// `outpost mcp --http 127.0.0.1:0` with an empty home; killed when
/// dropped. The address and the token come from the client configuration
/// line it prints (the token was made just now).
pub struct McpHttp {
    child: Child,
    /// Bytes the server wrote to stderr after its configuration line.
    pub logged: Arc<AtomicU64>,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    pub token: String,
    pub home: TempDir,
}

impl McpHttp {
    pub fn start() -> McpHttp {
        McpHttp::start_with_callers(&[])
    }

    /// The same with further callers, each a name and its token
    /// (`$OUTPOST_HOME/http-tokens/NAME`).
    pub fn start_with_callers(callers: &[(&str, &str)]) -> McpHttp {
        McpHttp::start_with(callers, None)
    }

    /// The same, the server limited to `nofile` open files (`prlimit`).
    pub fn start_with(callers: &[(&str, &str)], nofile: Option<u32>) -> McpHttp {
        use std::io::BufRead;
        use std::os::unix::fs::PermissionsExt;
        let home = TempDir::new("http-home");
        if !callers.is_empty() {
            let dir = home.path().join(".outpost/http-tokens");
            fs::create_dir_all(&dir).unwrap();
            for (name, token) in callers {
                let path = dir.join(name);
                fs::write(&path, token).unwrap();
                fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
            }
        }
        let mut command = match nofile {
            // prlimit execs the command: the child's pid is the server's.
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}"))
                    .arg("--")
                    .arg(target_bin("outpost"));
                c
            }
            None => Command::new(target_bin("outpost")),
        };
        let mut child = command
            .args(["mcp", "--http", "127.0.0.1:0"])
            .current_dir(std::env::temp_dir())
            .env_clear()
            .env("HOME", home.path())
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn outpost mcp --http");
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let config: serde_json::Value = loop {
            let line = lines.next().expect("outpost mcp --http exited").unwrap();
            if line.starts_with('{') {
                break serde_json::from_str(&line).unwrap();
            }
        };
        // Keep draining stderr so that the server never blocks on it; count
        // what it writes.
        let logged = Arc::new(AtomicU64::new(0));
        let count = logged.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                count.fetch_add(line.len() as u64 + 1, Ordering::Relaxed);
            }
        });
        let url = config["url"].as_str().unwrap();
        let addr = url
            .strip_prefix("http://")
            .and_then(|u| u.strip_suffix("/mcp"))
            .unwrap()
            .to_string();
        let token = config["headers"]["Authorization"]
            .as_str()
            .and_then(|h| h.strip_prefix("Bearer "))
            .unwrap()
            .to_string();
        McpHttp {
            child,
            addr,
            token,
            home,
            logged,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An MCP client over Streamable HTTP with the token.
    pub async fn client<H: rmcp::ClientHandler>(
        &self,
        handler: H,
    ) -> rmcp::service::RunningService<rmcp::RoleClient, H> {
        use rmcp::ServiceExt;
        use rmcp::transport::StreamableHttpClientTransport;
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        let config =
            StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", self.addr))
                .auth_header(self.token.clone());
        handler
            .serve(StreamableHttpClientTransport::from_config(config))
            .await
            .expect("MCP handshake over HTTP")
    }
}

impl Drop for McpHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh directory `<scratch>/outpost-<label>-<random>` (mode 0755; see
/// [`scratch_base`]), removed
/// with its contents on drop; for controller state, homes and the like.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        let path = make_unique_dir(&format!("outpost-{label}"));
        set_mode(&path, 0o755);
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Path of a workspace binary (`outpost`, `outpost-agent`, …) in the target
/// directory of the running test executable.
pub fn target_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("exe has a parent").to_path_buf();
    // Test executables live in target/<profile>/deps; binaries one level up.
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    let path = dir.join(name);
    if !path.is_file() {
        panic!(
            "{} not found: build the workspace first: cargo build --workspace",
            path.display()
        );
    }
    path
}

/// A fresh directory the test user owns (a host's HOME for
/// [`Sshd::start_with_home`]).
pub fn test_user_dir(label: &str) -> TempDir {
    let dir = TempDir::new(label);
    let status = Command::new("chown")
        .arg(format!("{TEST_USER}:{TEST_USER}"))
        .arg(dir.path())
        .status()
        .expect("run chown");
    assert!(status.success(), "chown {}", dir.path().display());
    dir
}

/// Pids of processes whose command line (arguments joined by spaces)
/// contains `needle`. The calling process is never included.
pub fn pids_with_cmdline(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    proc_pids()
        .into_iter()
        .filter(|&pid| pid != me)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|raw| {
                let text: String = String::from_utf8_lossy(&raw).replace('\0', " ");
                text.contains(needle)
            })
        })
        .collect()
}

/// Processes whose environment holds exactly `entry` (`NAME=value`).
pub fn pids_with_env(entry: &str) -> Vec<i32> {
    proc_pids()
        .into_iter()
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|e| e == entry.as_bytes()))
        })
        .collect()
}

/// SIGKILLs every process started from under `dir` (by command line or
/// executable), e.g. an agent daemon that left the process tree it was
/// started in, with everything below it; returns how many there were.
pub fn kill_processes_under(dir: &Path) -> usize {
    let needle = dir.to_string_lossy().into_owned();
    let roots: HashSet<i32> = pids_with_cmdline(&needle)
        .into_iter()
        .chain(pids_with_exe_under(dir))
        .collect();
    let table = process_table();
    let mut all: Vec<i32> = roots.iter().copied().collect();
    for &root in &roots {
        all.extend(descendants(&table, root));
    }
    // Stopped first, so none of them starts another in between.
    signal_all(&all, libc::SIGSTOP);
    signal_all(&all, libc::SIGKILL);
    roots.len()
}

/// Sends SIGCONT to each pid (undoes [`Sshd::stop_connections`]).
pub fn continue_pids(pids: &[i32]) {
    signal_all(pids, libc::SIGCONT);
}

/// Polls `f` until it returns true or `timeout` passes; returns whether it
/// succeeded. `f` is always tried at least once and once more at the end.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

// ---------------------------------------------------------------------------
// Internals

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

/// A random-enough hex token: std's `RandomState` is seeded per process, and
/// mixing in time and a counter keeps tokens distinct within the process.
fn random_token() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!("{:016x}", h.finish())
}

/// Where the harness makes its directories: `$OUTPOST_TEST_SCRATCH`, else
/// /tmp. Not $TMPDIR, because the test user must be able to traverse it; the
/// benchmark points it at a filesystem of its own (scripts/bench).
pub fn scratch_base() -> PathBuf {
    std::env::var_os("OUTPOST_TEST_SCRATCH")
        .filter(|dir| !dir.is_empty())
        .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from)
}

/// Creates a new directory `<scratch>/<prefix>-<random>`.
fn make_unique_dir(prefix: &str) -> PathBuf {
    let base = scratch_base();
    for _ in 0..100 {
        let path = base.join(format!("{prefix}-{}", random_token()));
        match fs::create_dir(&path) {
            Ok(()) => return path,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("cannot create {}: {e}", path.display()),
        }
    }
    panic!("cannot find a free name for {}/{prefix}-*", base.display());
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

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
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
fn free_port() -> u16 {
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

struct ProcInfo {
    ppid: i32,
    comm: String,
    /// Single-letter state from /proc/<pid>/stat (`Z` = zombie).
    state: char,
}

fn proc_pids() -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Snapshot of pid -> (ppid, comm) from /proc/*/stat.
fn process_table() -> HashMap<i32, ProcInfo> {
    let mut table = HashMap::new();
    for pid in proc_pids() {
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Format: "pid (comm) state ppid …"; comm may itself contain spaces
        // and parentheses, so split at the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_string();
        let mut rest = stat[close + 1..].split_whitespace();
        let state = rest.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let Some(ppid) = rest.next().and_then(|p| p.parse().ok()) else {
            continue;
        };
        table.insert(pid, ProcInfo { ppid, comm, state });
    }
    table
}

/// All transitive children of `root` in the snapshot (not `root` itself).
fn descendants(table: &HashMap<i32, ProcInfo>, root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (&pid, info) in table {
        children.entry(info.ppid).or_default().push(pid);
    }
    let mut out = Vec::new();
    let mut queue = vec![root];
    while let Some(p) = queue.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            out.push(c);
            queue.push(c);
        }
    }
    out
}

/// Pids whose executable lies under `dir` (agents started from the state dir).
fn pids_with_exe_under(dir: &Path) -> Vec<i32> {
    proc_pids()
        .into_iter()
        .filter(|pid| {
            fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe.starts_with(dir))
        })
        .collect()
}

fn signal_all(pids: &[i32], signal: libc::c_int) {
    for &pid in pids {
        // Never signal "all processes" or a process group by accident.
        if pid > 1 {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }
}

/// A network namespace joined to this one by a veth pair: a test host with an
/// address of its own whose link a test can cut. Only link-local addresses
/// (169.254.0.0/16) on the pair are used; traffic never leaves the machine.
pub struct Netns {
    name: String,
    host_veth: String,
    ns_veth: String,
    ns_addr: String,
}

static NETNS_SEQ: AtomicU64 = AtomicU64::new(0);

impl Netns {
    /// Creates the namespace, the veth pair and their addresses; panics with
    /// the failing command's output (creating namespaces needs root).
    pub fn new() -> Netns {
        // Interface names are limited to 15 bytes; pid and sequence keep
        // concurrent test processes apart.
        let seq = NETNS_SEQ.fetch_add(1, Ordering::Relaxed);
        let id = (std::process::id() as u64 % 4096) * 16 + seq % 16;
        let name = format!("outpost-t{id}");
        let host_veth = format!("opv{id}a");
        let ns_veth = format!("opv{id}b");
        // A /30 per namespace inside 169.254.0.0/16, from the id.
        let block = (id % 16_000) * 4;
        let (b3, b4) = ((block / 256) % 256, block % 256);
        let host_addr = format!("169.254.{b3}.{}", b4 + 1);
        let ns_addr = format!("169.254.{b3}.{}", b4 + 2);
        let netns = Netns {
            name: name.clone(),
            host_veth: host_veth.clone(),
            ns_veth: ns_veth.clone(),
            ns_addr: ns_addr.clone(),
        };
        // Leftovers from a crashed run with the same id would make `add` fail.
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let _ = Command::new("ip")
            .args(["link", "del", &host_veth])
            .output();
        run_ip(&["netns", "add", &name]);
        run_ip(&[
            "link", "add", &host_veth, "type", "veth", "peer", "name", &ns_veth,
        ]);
        run_ip(&["link", "set", &ns_veth, "netns", &name]);
        run_ip(&["addr", "add", &format!("{host_addr}/30"), "dev", &host_veth]);
        run_ip(&["link", "set", &host_veth, "up"]);
        let in_ns = |args: &[&str]| {
            let mut full = vec!["netns", "exec", &name, "ip"];
            full.extend_from_slice(args);
            run_ip(&full);
        };
        in_ns(&["addr", "add", &format!("{ns_addr}/30"), "dev", &ns_veth]);
        in_ns(&["link", "set", &ns_veth, "up"]);
        in_ns(&["link", "set", "lo", "up"]);
        netns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Slows traffic into the namespace (the controller's uplink to a host
    /// inside it) to `kbit` kilobits per second, as a slow VPN or a home
    /// uplink would.
    pub fn limit_uplink(&self, kbit: u32) {
        let rate = format!("{kbit}kbit");
        self.qdisc(&["add", "dev", &self.host_veth, "root", "tbf", "rate", &rate])
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Lifts [`Netns::limit_uplink`]'s limit.
    pub fn unlimit_uplink(&self) {
        self.qdisc(&["del", "dev", &self.host_veth, "root"])
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// `tc qdisc ARGS…` (a token bucket's burst and latency added to an
    /// `add`), or why it failed.
    fn qdisc(&self, args: &[&str]) -> Result<(), String> {
        let mut cmd = Command::new("tc");
        cmd.arg("qdisc").args(args);
        if args.first() == Some(&"add") {
            cmd.args(["burst", "16kb", "latency", "2s"]);
        }
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run tc: {e}; {SETUP_HINT}"))?;
        match out.status.success() {
            true => Ok(()),
            false => Err(format!(
                "tc failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )),
        }
    }

    /// Cuts the link: packets to and from the namespace are dropped silently,
    /// as when a cable is pulled or a switch dies.
    pub fn cut(&self) {
        run_ip(&[
            "netns", "exec", &self.name, "ip", "link", "set", "lo", "down",
        ]);
        run_ip(&[
            "netns",
            "exec",
            &self.name,
            "ip",
            "link",
            "set",
            &self.ns_veth,
            "down",
        ]);
    }
}

impl Default for Netns {
    fn default() -> Self {
        Netns::new()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_veth])
            .output();
    }
}

fn run_ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip: {e}; {SETUP_HINT}"));
    assert!(
        out.status.success(),
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds the test-double NVML library (`remote-agent/tests/fake_nvml`) once per
/// test process and returns its path; point `OUTPOST_NVML_LIB` at it. It reports
/// two GPUs: 0 busy (11 920 MiB free), 1 nearly idle.
pub fn fake_nvml_lib() -> PathBuf {
    static LIB: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LIB.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../remote-agent/tests/fake_nvml/fake_nvml.c");
        let dir = make_unique_dir("outpost-fake-nvml");
        set_mode(&dir, 0o755);
        let lib = dir.join("libnvidia-ml.so.1");
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(&source)
            .output()
            .unwrap_or_else(|e| panic!("these tests need a C compiler (cc): {e}"));
        assert!(
            out.status.success(),
            "building the fake NVML failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        lib
    })
    .clone()
}

/// Deterministic pseudo-random bytes (xorshift): incompressible content that
/// gives content-defined chunking real work.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

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
