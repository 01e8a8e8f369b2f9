//! Host resource snapshots for `Request::Metrics`.
//!
//! The first request samples synchronously and starts a sampler thread that
//! refreshes a shared snapshot about once a second for the rest of the
//! session; later requests answer from the snapshot at once, with its age. One
//! sysinfo `System` is kept for CPU usage, which is a delta between two reads
//! of `/proc/stat`; everything else comes straight from `/proc`, `statvfs` and
//! [`crate::gpu`]; with NVML the sampler costs about 0.1% of one core.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use outpost_protocol::{DiskUsage, HostMetrics};
use sysinfo::{CpuRefreshKind, MINIMUM_CPU_UPDATE_INTERVAL, MemoryRefreshKind, System};

use crate::{gpu, paths};

/// How often the background sampler refreshes the snapshot.
const TICK: Duration = Duration::from_secs(1);

/// Reads the host's resources; CPU usage needs two reads at least
/// [`MINIMUM_CPU_UPDATE_INTERVAL`] apart.
pub struct Sampler {
    system: System,
    cpu_count: u32,
    /// When the CPU times were last read.
    cpu_read_at: Instant,
    /// Total and per-core use over the last interval, once there is one.
    cpu_usage: Option<(f32, Vec<f32>)>,
}

impl Sampler {
    pub fn new() -> Result<Sampler, String> {
        let mut system = System::new().map_err(|e| format!("cannot read host info: {e}"))?;
        // Also reads the CPU times: the baseline for the first usage figure.
        system.refresh_cpu_list(CpuRefreshKind::nothing());
        let mut cpu_count = system.cpus().len() as u32;
        if cpu_count == 0 {
            cpu_count = std::thread::available_parallelism().map_or(0, |n| n.get() as u32);
        }
        Ok(Sampler {
            system,
            cpu_count,
            cpu_read_at: Instant::now(),
            cpu_usage: None,
        })
    }

    /// Everything but the GPUs, which [`Monitor`] adds.
    pub fn sample_host(&mut self) -> HostMetrics {
        if self.cpu_usage.is_none() {
            // The first figure needs a second read of the CPU times: a first
            // answer with a blank CPU column would be the common case (a
            // one-shot `outpost hosts --resources`), so it waits for it.
            std::thread::sleep(
                MINIMUM_CPU_UPDATE_INTERVAL.saturating_sub(self.cpu_read_at.elapsed()),
            );
        }
        if self.cpu_read_at.elapsed() >= MINIMUM_CPU_UPDATE_INTERVAL {
            self.system.refresh_cpu_usage();
            self.cpu_read_at = Instant::now();
            let per_cpu = self.system.cpus().iter().map(|c| c.usage()).collect();
            self.cpu_usage = Some((self.system.global_cpu_usage(), per_cpu));
        }
        self.system
            .refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram().with_swap());
        let load = System::load_average().ok();
        let total = self.system.total_memory();
        let available = self.system.available_memory();
        HostMetrics {
            cpu_count: self.cpu_count,
            cpu_usage_pct: self.cpu_usage.as_ref().map(|(total, _)| *total),
            per_cpu_pct: self
                .cpu_usage
                .as_ref()
                .map_or_else(Vec::new, |(_, per)| per.clone()),
            load_1m: load.as_ref().map_or(0.0, |l| l.one),
            load_5m: load.as_ref().map_or(0.0, |l| l.five),
            load_15m: load.as_ref().map_or(0.0, |l| l.fifteen),
            mem_total_bytes: total,
            mem_used_bytes: total.saturating_sub(available),
            mem_available_bytes: available,
            swap_total_bytes: self.system.total_swap(),
            swap_used_bytes: self.system.used_swap(),
            disks: disks(),
            uptime_s: System::uptime().unwrap_or(0),
            process_count: process_count(),
            gpu: Default::default(),
            age_ms: 0,
        }
    }

    /// CPU model name, for `diagnose`.
    pub fn cpu_brand(&self) -> Option<String> {
        self.system
            .cpus()
            .first()
            .map(|c| c.brand().trim().to_string())
            .filter(|b| !b.is_empty())
    }
}

/// The latest snapshot, shared by every request of one agent.
#[derive(Default)]
pub struct Monitor {
    latest: Mutex<Option<Snapshot>>,
}

struct Snapshot {
    metrics: HostMetrics,
    taken: Instant,
}

impl Monitor {
    /// The latest snapshot with its age. The first call samples (blocking for
    /// as long as that takes) and starts the sampler thread.
    pub fn current(self: &Arc<Self>) -> Result<HostMetrics, String> {
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(snapshot) = &*latest {
            let mut metrics = snapshot.metrics.clone();
            let age = snapshot.taken.elapsed().as_millis();
            metrics.age_ms = u32::try_from(age).unwrap_or(u32::MAX);
            return Ok(metrics);
        }
        let mut sampler = Sampler::new()?;
        let metrics = sample(&mut sampler);
        *latest = Some(Snapshot {
            metrics: metrics.clone(),
            taken: Instant::now(),
        });
        let monitor = Arc::downgrade(self);
        let started = std::thread::Builder::new()
            .name("outpost-metrics".into())
            .spawn(move || Monitor::run(&monitor, sampler));
        if let Err(e) = started {
            // Sample again on the next request rather than serve this one
            // forever.
            eprintln!("outpost-agent: cannot start the metrics sampler: {e}");
            *latest = None;
        }
        Ok(metrics)
    }

    /// Refreshes the snapshot until the monitor is dropped (its session
    /// ended).
    fn run(monitor: &Weak<Monitor>, mut sampler: Sampler) {
        let mut next = Instant::now() + TICK;
        loop {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            if monitor.strong_count() == 0 {
                return;
            }
            let metrics = sample(&mut sampler);
            let Some(monitor) = monitor.upgrade() else {
                return;
            };
            *monitor.latest.lock().unwrap_or_else(|p| p.into_inner()) = Some(Snapshot {
                metrics,
                taken: Instant::now(),
            });
            // A slow tick (first nvidia-smi run) must not cause a burst after.
            next = (next + TICK).max(Instant::now() + MINIMUM_CPU_UPDATE_INTERVAL);
        }
    }
}

fn sample(sampler: &mut Sampler) -> HostMetrics {
    let mut metrics = sampler.sample_host();
    metrics.gpu = gpu::gpus().report();
    metrics
}

/// Processes on the host: the numeric entries of `/proc` (threads are not
/// listed there).
fn process_count() -> u32 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.as_bytes();
            !name.is_empty() && name.iter().all(u8::is_ascii_digit)
        })
        .count() as u32
}

/// The filesystems of the home and of the agent's working directory; the
/// latter only when it is another filesystem.
fn disks() -> Vec<DiskUsage> {
    let mounts = std::fs::read("/proc/self/mounts").unwrap_or_default();
    let mount_points = parse_mount_points(&mounts);
    let mut disks = Vec::new();
    let home = paths::home_dir();
    let home_dev = home
        .as_ref()
        .and_then(|h| std::fs::metadata(h).ok())
        .map(|m| m.dev());
    if let Some(home) = &home
        && let Some(disk) = disk_usage("home", home, &mount_points)
    {
        disks.push(disk);
    }
    if let Ok(cwd) = std::env::current_dir() {
        let cwd_dev = std::fs::metadata(&cwd).ok().map(|m| m.dev());
        if (home_dev.is_none() || cwd_dev != home_dev)
            && let Some(disk) = disk_usage("cwd", &cwd, &mount_points)
        {
            disks.push(disk);
        }
    }
    disks
}

fn disk_usage(role: &str, path: &Path, mount_points: &[PathBuf]) -> Option<DiskUsage> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data, filled by the call; `c` is a valid
    // NUL-terminated path.
    let st = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        st
    };
    let frsize = st.f_frsize as u64;
    let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    Some(DiskUsage {
        role: role.to_string(),
        path: path.display().to_string(),
        mount_point: mount_point_of(&resolved, mount_points)
            .map_or_else(String::new, |m| m.display().to_string()),
        total_bytes: (st.f_blocks as u64).saturating_mul(frsize),
        available_bytes: (st.f_bavail as u64).saturating_mul(frsize),
    })
}

/// Mount points listed in `/proc/self/mounts` (octal escapes decoded).
fn parse_mount_points(mounts: &[u8]) -> Vec<PathBuf> {
    mounts
        .split(|&b| b == b'\n')
        .filter_map(|line| line.split(|&b| b == b' ').nth(1))
        .map(|field| PathBuf::from(std::ffi::OsStr::from_bytes(&unescape(field))))
        .collect()
}

/// Decodes `\040`-style escapes (space, tab, newline, backslash).
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let digits = field.get(i + 1..i + 4);
        if field[i] == b'\\'
            && let Some(d) = digits
            && d.iter().all(|b| (b'0'..=b'7').contains(b))
        {
            let value = d.iter().fold(0u32, |v, b| v * 8 + u32::from(b - b'0'));
            out.push(value as u8);
            i += 4;
        } else {
            out.push(field[i]);
            i += 1;
        }
    }
    out
}

/// The longest mount point containing `path`.
fn mount_point_of<'a>(path: &Path, mount_points: &'a [PathBuf]) -> Option<&'a Path> {
    mount_points
        .iter()
        .filter(|m| path.starts_with(m))
        .max_by_key(|m| m.as_os_str().len())
        .map(PathBuf::as_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_longest_prefix() {
        let mounts = b"/dev/sda1 / ext4 rw 0 0\n\
            tmpfs /home/u/my\\040disk tmpfs rw 0 0\n\
            /dev/sdb1 /home ext4 rw 0 0\n";
        let points = parse_mount_points(mounts);
        assert_eq!(points.len(), 3);
        let of = |p: &str| mount_point_of(Path::new(p), &points).map(Path::to_path_buf);
        assert_eq!(
            of("/home/u/my disk/x"),
            Some(PathBuf::from("/home/u/my disk"))
        );
        assert_eq!(of("/home/u"), Some(PathBuf::from("/home")));
        assert_eq!(of("/homer"), Some(PathBuf::from("/")));
        assert_eq!(of("/"), Some(PathBuf::from("/")));
    }

    #[test]
    fn sampler_reads_the_host() {
        let mut sampler = Sampler::new().unwrap();
        let first = sampler.sample_host();
        assert!(
            first.cpu_usage_pct.is_some(),
            "the first sample has CPU use"
        );
        assert_eq!(first.per_cpu_pct.len(), first.cpu_count as usize);
        assert!(first.process_count > 1);
        assert!(
            first
                .disks
                .iter()
                .any(|d| d.role == "home" && d.total_bytes > 0)
        );
        std::thread::sleep(MINIMUM_CPU_UPDATE_INTERVAL);
        let second = sampler.sample_host();
        assert!(second.cpu_usage_pct.is_some());
        assert_eq!(second.per_cpu_pct.len(), second.cpu_count as usize);
    }
}
