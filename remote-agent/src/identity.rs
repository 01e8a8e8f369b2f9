//! Who this agent is: version, build hash, platform and libc.
//!
//! The controller compares the build hash with the artifact it uploaded, so the
//! hash is taken from the executable actually running, not from build metadata.

use std::path::PathBuf;
use std::sync::OnceLock;

use outpost_protocol::{Hello, PROTOCOL_VERSION};

/// The crate version baked in at build time.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Capabilities advertised in [`Hello`].
pub const CAPABILITIES: &[&str] = &["exec", "metrics", "cancel", "gpu-lease"];

/// Path of the running executable, if the kernel tells us.
pub fn exe_path() -> Option<PathBuf> {
    std::env::current_exe().ok()
}

/// Hex BLAKE3 of the running executable, computed once per process.
///
/// Reads `/proc/self/exe` rather than the path, so a binary replaced on disk
/// after start still reports the hash of what is running.
pub fn build_hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| {
        let hash = || -> std::io::Result<String> {
            let file = std::fs::File::open("/proc/self/exe")
                .or_else(|_| std::fs::File::open(std::env::current_exe()?))?;
            let mut hasher = blake3::Hasher::new();
            hasher.update_reader(file)?;
            Ok(hasher.finalize().to_hex().to_string())
        };
        hash().unwrap_or_else(|_| "unknown".to_string())
    })
}

/// `glibc X.Y`, `musl` or `unknown`.
pub fn libc_description() -> String {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: returns a pointer to a static NUL-terminated string.
        let ptr = unsafe { libc::gnu_get_libc_version() };
        if ptr.is_null() {
            return "glibc".to_string();
        }
        // SAFETY: non-null and NUL-terminated, see above.
        let version = unsafe { std::ffi::CStr::from_ptr(ptr) };
        format!("glibc {}", version.to_string_lossy())
    }
    #[cfg(target_env = "musl")]
    {
        "musl".to_string()
    }
    #[cfg(not(any(all(target_os = "linux", target_env = "gnu"), target_env = "musl")))]
    {
        "unknown".to_string()
    }
}

/// The first frame the agent sends.
pub fn hello() -> Hello {
    hello_with(build_hash())
}

/// The hello with `build_hash` in place of the executable's hash.
pub fn hello_with(build_hash: &str) -> Hello {
    Hello {
        protocol_version: PROTOCOL_VERSION,
        agent_version: VERSION.to_string(),
        build_hash: build_hash.to_string(),
        os: std::env::consts::OS.to_string(),
        arch: std::env::consts::ARCH.to_string(),
        libc: libc_description(),
        capabilities: CAPABILITIES.iter().map(|c| c.to_string()).collect(),
        pid: std::process::id(),
    }
}

/// `outpost-agent <version> (<first 12 hex digits of the build hash>)`.
pub fn version_line() -> String {
    let hash = build_hash();
    let short = hash.get(..12).unwrap_or(hash);
    format!("outpost-agent {VERSION} ({short})")
}
