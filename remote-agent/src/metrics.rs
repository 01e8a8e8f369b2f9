//! Host resource snapshots for `Request::Metrics`.
//!
//! The first request samples synchronously and starts a sampler thread that
//! refreshes a shared snapshot about once a second; later requests answer
//! from the snapshot at once, with its age. A sampler nobody has asked for in
//! [`IDLE_AFTER`] stops, and the next request samples afresh as the first
//! did: an idle session costs nothing. One sysinfo `System` is kept for CPU
//! usage, which is a delta between two reads of `/proc/stat`; everything else
//! comes straight from `/proc`, `statvfs` and [`crate::gpu`]; with NVML the
//! sampler costs about 0.1% of one core while it runs.
//!
//! On a Slurm login node (`sinfo` on PATH) the snapshot also carries the
//! cluster's partitions. `sinfo` asks slurmctld, so it runs at most every
//! [`SINFO_INTERVAL`] under a hard [`SINFO_TIMEOUT`], on the sampler thread,
//! and its last result is reused in between.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use outpost_protocol::{DiskUsage, HostMetrics, SlurmPartition, SlurmSummary};
use sysinfo::{CpuRefreshKind, MINIMUM_CPU_UPDATE_INTERVAL, MemoryRefreshKind, System};

use crate::{gpu, paths};

/// How often the background sampler refreshes the snapshot.
const TICK: Duration = Duration::from_secs(1);
/// A sampler whose snapshot nobody has read for this long stops: a session
/// left open overnight would otherwise tick, query its GPUs and ask
/// slurmctld for nothing, on every host of a fleet.
const IDLE_AFTER: Duration = Duration::from_secs(300);
/// Longest one `sinfo` run may take before it is killed.
const SINFO_TIMEOUT: Duration = Duration::from_secs(2);
/// Shortest time between two `sinfo` runs: every tick would load slurmctld,
/// which every login node of a cluster shares.
const SINFO_INTERVAL: Duration = Duration::from_secs(10);
/// One line per partition and node state; `%C` is CPUs
/// allocated/idle/other/total.
const SINFO_FORMAT: &str = "%P|%a|%D|%T|%C|%G";

/// Reads the host's resources; CPU usage needs two reads at least
/// [`MINIMUM_CPU_UPDATE_INTERVAL`] apart.
pub struct Sampler {
    system: System,
    cpu_count: u32,
    /// When the CPU times were last read.
    cpu_read_at: Instant,
    /// Total and per-core use over the last interval, once there is one.
    cpu_usage: Option<(f32, Vec<f32>)>,
    slurm: SlurmProbe,
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
            slurm: SlurmProbe {
                sinfo: paths::which("sinfo"),
                last: None,
            },
        })
    }

    /// Everything but the GPUs and Slurm, which [`Monitor`] adds.
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
            slurm: None,
        }
    }

    /// Starts a new CPU window: after a pause, the first figure is the use
    /// from now on, not an average over the pause.
    fn restart_cpu_window(&mut self) {
        self.system.refresh_cpu_usage();
        self.cpu_read_at = Instant::now();
        self.cpu_usage = None;
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
pub struct Monitor {
    /// Some while the sampler thread runs. Lock order: `latest`, then
    /// `parked`.
    latest: Mutex<Option<Snapshot>>,
    /// The sampler while its thread is stopped for idleness.
    parked: Mutex<Option<Sampler>>,
    /// When a request last read the snapshot, in ms since `epoch`; written
    /// under the `latest` lock, so the sampler's decision to stop cannot
    /// miss a reader.
    asked_ms: AtomicU64,
    epoch: Instant,
    idle_after: Duration,
}

impl Default for Monitor {
    fn default() -> Monitor {
        Monitor::stopping_after(IDLE_AFTER)
    }
}

struct Snapshot {
    metrics: HostMetrics,
    taken: Instant,
}

impl Snapshot {
    fn aged(&self) -> HostMetrics {
        let mut metrics = self.metrics.clone();
        metrics.age_ms = u32::try_from(self.taken.elapsed().as_millis()).unwrap_or(u32::MAX);
        metrics
    }
}

impl Monitor {
    fn stopping_after(idle_after: Duration) -> Monitor {
        Monitor {
            latest: Mutex::default(),
            parked: Mutex::default(),
            asked_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            idle_after,
        }
    }

    fn mark_asked(&self) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.asked_ms.store(now, Ordering::Relaxed);
    }

    fn idle(&self) -> bool {
        let asked = Duration::from_millis(self.asked_ms.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(asked) >= self.idle_after
    }

    /// The latest snapshot with its age, if the sampler is running and
    /// the lock is free. Never waits: the first sample holds the lock for as
    /// long as it takes (a GPU query, `sinfo`), and the session's thread
    /// calls this; a caller that gets None asks [`Monitor::current`] on a
    /// thread that may wait.
    pub fn latest(&self) -> Option<HostMetrics> {
        let latest = match self.latest.try_lock() {
            Ok(latest) => latest,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        let snapshot = latest.as_ref()?;
        self.mark_asked();
        Some(snapshot.aged())
    }

    /// The latest snapshot with its age. Where the sampler is not running
    /// (the first call, or after [`IDLE_AFTER`]), samples (blocking for as
    /// long as that takes) and starts it.
    pub fn current(self: &Arc<Self>) -> Result<HostMetrics, String> {
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        self.mark_asked();
        if let Some(snapshot) = &*latest {
            return Ok(snapshot.aged());
        }
        let parked = self.parked.lock().unwrap_or_else(|p| p.into_inner()).take();
        let mut sampler = match parked {
            Some(mut sampler) => {
                sampler.restart_cpu_window();
                sampler
            }
            None => Sampler::new()?,
        };
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
    /// ended) or nobody has read it for its idle time.
    fn run(monitor: &Weak<Monitor>, mut sampler: Sampler) {
        let mut next = Instant::now() + TICK;
        loop {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            match monitor.upgrade() {
                None => return,
                Some(monitor) if monitor.idle() => {
                    let mut latest = monitor.latest.lock().unwrap_or_else(|p| p.into_inner());
                    // Checked again under the lock readers mark under.
                    if monitor.idle() {
                        *latest = None;
                        *monitor.parked.lock().unwrap_or_else(|p| p.into_inner()) = Some(sampler);
                        return;
                    }
                }
                Some(_) => {}
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
    metrics.slurm = sampler.slurm.summary();
    metrics
}

/// `sinfo` and its last answer.
struct SlurmProbe {
    sinfo: Option<PathBuf>,
    last: Option<(Instant, SlurmSummary)>,
}

/// `sinfo` runs that survived SIGKILL; none starts while one is.
static SINFO_STUCK: AtomicUsize = AtomicUsize::new(0);

impl SlurmProbe {
    /// The partitions, at most [`SINFO_INTERVAL`] old; None without `sinfo`.
    /// Blocks for up to [`SINFO_TIMEOUT`] when a run is due.
    fn summary(&mut self) -> Option<SlurmSummary> {
        let sinfo = self.sinfo.as_ref()?;
        if let Some((at, last)) = &self.last
            && at.elapsed() < SINFO_INTERVAL
        {
            return Some(last.clone());
        }
        let summary = if SINFO_STUCK.load(std::sync::atomic::Ordering::Relaxed) > 0 {
            slurm_error("sinfo: an earlier run is stuck and could not be killed".into())
        } else {
            let deadline = Instant::now() + SINFO_TIMEOUT;
            let args = ["-h", "-o", SINFO_FORMAT];
            match gpu::run_bounded("sinfo", sinfo, &args, deadline, SINFO_TIMEOUT, &SINFO_STUCK) {
                Ok(text) => parse_sinfo(&text).unwrap_or_else(|line| {
                    slurm_error(format!("sinfo: unexpected output: {line}"))
                }),
                Err(failure) => slurm_error(failure.problem),
            }
        };
        self.last = Some((Instant::now(), summary.clone()));
        Some(summary)
    }
}

fn slurm_error(problem: String) -> SlurmSummary {
    SlurmSummary {
        partitions: Vec::new(),
        error: Some(problem),
    }
}

/// Sums `sinfo -h -o SINFO_FORMAT` per partition, in the order partitions
/// first appear; the offending line on garbage.
fn parse_sinfo(text: &str) -> Result<SlurmSummary, String> {
    let mut partitions: Vec<SlurmPartition> = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let bad = || line.chars().take(120).collect::<String>();
        let fields: Vec<&str> = line.split('|').collect();
        let [name, avail, nodes, state, cpus, gres] = fields[..] else {
            return Err(bad());
        };
        let nodes: u32 = nodes.parse().map_err(|_| bad())?;
        let cpus: Vec<u32> = cpus
            .split('/')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?;
        let [_, cpus_idle, _, cpus_total] = cpus[..] else {
            return Err(bad());
        };
        let (name, default) = match name.strip_suffix('*') {
            Some(name) => (name, true),
            None => (name, false),
        };
        let i = match partitions.iter().position(|p| p.name == name) {
            Some(i) => i,
            None => {
                partitions.push(SlurmPartition {
                    name: name.to_string(),
                    default,
                    up: avail == "up",
                    ..Default::default()
                });
                partitions.len() - 1
            }
        };
        let p = &mut partitions[i];
        // Flags trail the state: `*` not responding, `~` powered off, `#`
        // powering up, `!`/`%` powering down, `$` maintenance, `@` reboot.
        let base = state.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
        let responding = !state.ends_with('*');
        match base {
            "idle" if responding => p.nodes_idle += nodes,
            "allocated" | "mixed" | "completing" => p.nodes_allocated += nodes,
            _ => p.nodes_other += nodes,
        }
        p.cpus_idle += cpus_idle;
        p.cpus_total += cpus_total;
        // Nodes of one partition may differ; keep each kind once.
        if gres != "(null)" && !gres.is_empty() && !p.gres.split(',').any(|g| g == gres) {
            if !p.gres.is_empty() {
                p.gres.push(',');
            }
            p.gres.push_str(gres);
        }
    }
    Ok(SlurmSummary {
        partitions,
        error: None,
    })
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
    fn latest_never_waits_for_a_sample_in_progress() {
        let monitor = Arc::new(Monitor::default());
        let first = monitor.current().unwrap();
        assert!(monitor.latest().is_some());
        // What the first sample does for as long as it takes.
        let held = monitor.latest.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let asker = Arc::clone(&monitor);
        std::thread::spawn(move || tx.send(asker.latest().is_none()).unwrap());
        let answered = rx.recv_timeout(Duration::from_secs(10));
        drop(held);
        assert_eq!(answered, Ok(true), "latest() waited for the lock");
        assert_eq!(monitor.latest().unwrap().cpu_count, first.cpu_count);
    }

    #[test]
    fn an_unread_sampler_stops_and_the_next_request_starts_it_afresh() {
        let monitor = Arc::new(Monitor::stopping_after(Duration::from_millis(1500)));
        monitor.current().unwrap();
        // Read often enough, it keeps sampling. (A tick may take up to
        // `sinfo`'s 2 s limit where Slurm's client is installed.)
        let until = Instant::now() + Duration::from_millis(3500);
        while Instant::now() < until {
            let m = monitor.latest().expect("the sampler stopped while read");
            assert!(m.age_ms < 5000, "{}", m.age_ms);
            std::thread::sleep(Duration::from_millis(200));
        }
        // Unread, it stops at a tick past its idle time and gives up its
        // snapshot, which would only grow old.
        std::thread::sleep(Duration::from_millis(6000));
        assert!(monitor.latest().is_none(), "an unread sampler kept running");
        assert!(monitor.parked.lock().unwrap().is_some());
        // The next request samples now and starts it again.
        let again = monitor.current().unwrap();
        assert_eq!(again.age_ms, 0);
        assert!(again.cpu_usage_pct.is_some());
        assert!(monitor.parked.lock().unwrap().is_none());
        std::thread::sleep(Duration::from_millis(1200));
        assert!(monitor.latest().unwrap().age_ms < 5000);
    }

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
    fn sinfo_sums_node_states_per_partition() {
        let text = "\
batch*|up|3|idle|0/96/0/96|(null)
batch*|up|2|mixed|40/24/0/64|(null)
batch*|up|1|allocated|32/0/0/32|(null)
batch*|up|1|drained|0/0/32/32|(null)
batch*|up|1|idle*|0/0/32/32|(null)
gpu|up|1|mixed|8/56/0/64|gpu:4
gpu|up|1|down*|0/0/64/64|gpu:4
gpu|up|1|idle|0/64/0/64|gpu:a100:8
old|down|2|down|0/0/16/16|(null)
";
        let s = parse_sinfo(text).unwrap();
        assert_eq!(s.error, None);
        let names: Vec<&str> = s.partitions.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["batch", "gpu", "old"]);
        assert_eq!(
            s.partitions[0],
            SlurmPartition {
                name: "batch".into(),
                default: true,
                up: true,
                nodes_idle: 3,
                nodes_allocated: 3,
                nodes_other: 2,
                cpus_idle: 120,
                cpus_total: 256,
                gres: String::new(),
            }
        );
        let gpu = &s.partitions[1];
        assert!(!gpu.default && gpu.up);
        assert_eq!(
            (gpu.nodes_idle, gpu.nodes_allocated, gpu.nodes_other),
            (1, 1, 1)
        );
        assert_eq!((gpu.cpus_idle, gpu.cpus_total), (120, 192));
        assert_eq!(gpu.gres, "gpu:4,gpu:a100:8");
        let old = &s.partitions[2];
        assert!(!old.up);
        assert_eq!((old.nodes_idle, old.nodes_other), (0, 2));
        assert_eq!(parse_sinfo("").unwrap().partitions, vec![]);
    }

    #[test]
    fn sinfo_garbage_is_an_error() {
        assert_eq!(
            parse_sinfo("batch*|up|1|idle|0/4/0/4|(null)\nPARTITION AVAIL\n"),
            Err("PARTITION AVAIL".into())
        );
        assert!(parse_sinfo("batch|up|x|idle|0/4/0/4|(null)").is_err());
        assert!(parse_sinfo("batch|up|1|idle|0/4/0|(null)").is_err());
    }

    #[test]
    fn sinfo_failure_is_reported_and_cached() {
        let dir = std::env::temp_dir().join(format!("outpost-sinfo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("sinfo");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho 'slurm_load_partitions: Unable to contact slurm controller' >&2\nexit 1\n",
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let mut probe = SlurmProbe {
            sinfo: Some(fake.clone()),
            last: None,
        };
        let s = probe.summary().unwrap();
        assert!(s.partitions.is_empty());
        let error = s.error.unwrap();
        assert!(
            error.starts_with("sinfo: exit status 1: slurm_load_partitions: Unable"),
            "{error}"
        );
        // Within the interval the cached answer comes back without a run.
        std::fs::remove_file(&fake).unwrap();
        assert_eq!(probe.summary().unwrap().error.unwrap(), error);
        std::fs::remove_dir_all(&dir).ok();

        let mut none = SlurmProbe {
            sinfo: None,
            last: None,
        };
        assert_eq!(none.summary(), None);
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
