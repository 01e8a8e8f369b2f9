//! The device nodes a bwrap sandbox with leased GPUs gets: each leased
//! GPU's own node, found by the minor number the driver gave it (which need
//! not be its NVML index: that follows PCI order, minors follow probe
//! order), and the driver's shared nodes. bwrap's `--dev` makes a fresh
//! `/dev`, so each is `--dev-bind`-ed in by name; a plain bind would leave
//! CUDA unable to open them.
//!
//! The driver tells each GPU's minor in `/proc/driver/nvidia/gpus/*/information`
//! (`GPU UUID:` and `Device Minor:` lines); a node is any character device
//! in `/dev` with the NVIDIA major and that minor. Both places can be
//! pointed elsewhere ([`DEV_DIR_VAR`], [`DRIVER_DIR_VAR`]) so that tests
//! without a GPU use stand-in nodes.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The character major of `/dev/nvidia*` (and `nvidiactl`, minor 255).
pub const NVIDIA_MAJOR: u64 = 195;
/// Where device nodes are looked for, instead of `/dev`.
pub const DEV_DIR_VAR: &str = "OUTPOST_DEV_DIR";
/// Where the driver's GPU information is read, instead of `/proc/driver/nvidia`.
pub const DRIVER_DIR_VAR: &str = "OUTPOST_NVIDIA_DRIVER_DIR";

/// Nodes every CUDA process opens beside its GPUs', bound when present
/// (`nvidia-caps` is a directory of MIG capability nodes).
const SHARED: [&str; 5] = [
    "nvidiactl",
    "nvidia-uvm",
    "nvidia-uvm-tools",
    "nvidia-modeset",
    "nvidia-caps",
];

/// A node to bind: its path on the host, and inside (`/dev/NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub host: PathBuf,
    pub inside: PathBuf,
}

/// A leased GPU: its NVML index and UUID (empty when unknown).
pub struct Leased<'a> {
    pub index: u32,
    pub uuid: &'a str,
}

/// The nodes for `leased`, or why one of them cannot be given.
pub fn nodes(leased: &[Leased<'_>]) -> Result<Vec<Node>, String> {
    let dev = dir_from(DEV_DIR_VAR, "/dev");
    let driver = dir_from(DRIVER_DIR_VAR, "/proc/driver/nvidia");
    nodes_in(leased, &dev, &driver)
}

fn dir_from(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| PathBuf::from(default))
}

pub fn nodes_in(leased: &[Leased<'_>], dev: &Path, driver: &Path) -> Result<Vec<Node>, String> {
    let inside = |name: &std::ffi::OsStr| Path::new("/dev").join(name);
    let mut nodes: Vec<Node> = SHARED
        .iter()
        .map(|name| dev.join(name))
        .filter(|p| p.exists())
        .map(|host| Node {
            inside: inside(host.file_name().unwrap_or_default()),
            host,
        })
        .collect();
    if leased.is_empty() {
        return Ok(nodes);
    }
    let minors = driver_minors(driver);
    let by_minor = gpu_nodes(dev);
    for gpu in leased {
        // Without the driver's word (no procfs entry, no UUID), the minor
        // the driver gives by default: the probe order NVML's index follows
        // on most hosts.
        let minor = minors.get(gpu.uuid).copied().unwrap_or(gpu.index.into());
        let Some(host) = by_minor.get(&minor) else {
            return Err(format!(
                "GPU {} ({}): no device node with major {NVIDIA_MAJOR} and minor {minor} in {}",
                gpu.index,
                if gpu.uuid.is_empty() {
                    "no UUID"
                } else {
                    gpu.uuid
                },
                dev.display()
            ));
        };
        nodes.push(Node {
            inside: inside(host.file_name().unwrap_or_default()),
            host: host.clone(),
        });
    }
    Ok(nodes)
}

/// UUID → minor, from the driver's `gpus/*/information` files.
fn driver_minors(driver: &Path) -> HashMap<String, u64> {
    let mut minors = HashMap::new();
    let Ok(gpus) = fs::read_dir(driver.join("gpus")) else {
        return minors;
    };
    for gpu in gpus.flatten() {
        let Ok(text) = fs::read_to_string(gpu.path().join("information")) else {
            continue;
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim_start().strip_prefix(':'))
                .map(str::trim)
        };
        if let (Some(uuid), Some(minor)) = (field("GPU UUID"), field("Device Minor"))
            && let Ok(minor) = minor.parse()
        {
            minors.insert(uuid.to_string(), minor);
        }
    }
    minors
}

/// The per-GPU nodes in `dev` (`nvidia` and digits, character devices of
/// the NVIDIA major), by minor.
fn gpu_nodes(dev: &Path) -> HashMap<u64, PathBuf> {
    let mut found = HashMap::new();
    let Ok(entries) = fs::read_dir(dev) else {
        return found;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let digits = name.to_str().and_then(|n| n.strip_prefix("nvidia"));
        if !digits.is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        let Ok(meta) = fs::metadata(entry.path()) else {
            continue;
        };
        let rdev = meta.rdev();
        if meta.file_type().is_char_device() && libc::major(rdev) as u64 == NVIDIA_MAJOR {
            found.insert(libc::minor(rdev) as u64, entry.path());
        }
    }
    found
}

#[cfg(test)]
mod tests;
