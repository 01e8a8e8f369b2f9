//! The host's NVIDIA GPUs, for metrics and leases: NVML first, `nvidia-smi` as
//! the fallback.
//!
//! NVML is loaded at run time (nvml-wrapper uses `dlopen`, so hosts without
//! the driver run the same binary) and initialised once per process: init
//! costs 10–20 ms, a read of every GPU after that about a millisecond.
//! `nvidia-smi` costs a fork and a driver round trip of up to hundreds of
//! milliseconds and can hang on a wedged driver, so it runs under a hard
//! timeout, at most every [`SMI_INTERVAL`], and its last result is reused in
//! between.
//!
//! Why a source does not work goes into [`GpuReport::problems`].
//! [`GpuReport::failed`] marks a host whose driver is evidently there but
//! unreadable: its GPUs' state is unknown, which must never pass for idle.

use std::collections::HashMap;
use std::ffi::{CStr, OsStr};
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use outpost_protocol::{GpuInfo, GpuProcess, GpuReport, GpuSource};

use crate::paths;

/// Overrides where NVML is loaded from (odd installs, tests).
pub const NVML_LIB_VAR: &str = "OUTPOST_NVML_LIB";
/// What the driver installs; found through the dynamic linker's search path.
pub const NVML_DEFAULT_LIB: &str = "libnvidia-ml.so.1";
/// Longest one `nvidia-smi` sample (both queries together) may take.
pub const SMI_TIMEOUT: Duration = Duration::from_secs(5);
/// Shortest time between two `nvidia-smi` samples.
const SMI_INTERVAL: Duration = Duration::from_secs(5);
/// After a hang, wait longer: a wedged driver hangs every run, and a process
/// stuck in the kernel may not even die of SIGKILL.
const SMI_HANG_BACKOFF: Duration = Duration::from_secs(60);
const SMI_QUERY_GPUS: &str = "--query-gpu=index,name,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw";
const SMI_QUERY_APPS: &str = "--query-compute-apps=gpu_uuid,pid,used_memory";
const SMI_FORMAT: &str = "--format=csv,noheader,nounits";
/// More than any real `nvidia-smi` prints; bounds what garbage can cost.
const SMI_OUTPUT_CAP: usize = 1 << 20;
/// Length of a GPU process's command line in reports.
const COMMAND_CHARS: usize = 200;
const MIB: u64 = 1024 * 1024;

/// The process-wide GPU reader, created on first use (that is when NVML
/// initialises).
pub fn gpus() -> &'static Gpus {
    static GPUS: OnceLock<Gpus> = OnceLock::new();
    GPUS.get_or_init(Gpus::new)
}

/// Kills `nvidia-smi` and `sinfo` runs still in flight; for the end of
/// `serve`, which exits without waiting for them.
pub fn shutdown() {
    for pgid in lock(&SMI_RUNNING).drain(..) {
        // SAFETY: plain syscall on a process group we started and still hold
        // unreaped, so its id cannot have been reused.
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
    }
}

/// Both GPU sources, ready to read.
pub struct Gpus {
    nvml: Result<Nvml, NvmlFailure>,
    smi: Smi,
}

/// Why NVML could not be initialised.
struct NvmlFailure {
    problem: String,
    /// The library loaded, so a driver is installed.
    loaded: bool,
}

/// GPUs read from one source, with notes on what could not be read.
pub type Reading = (Vec<GpuInfo>, Vec<String>);

impl Gpus {
    fn new() -> Gpus {
        Gpus {
            nvml: init_nvml(),
            smi: Smi::new(paths::which("nvidia-smi")),
        }
    }

    /// The GPUs as the best working source sees them now (`nvidia-smi` data
    /// may be up to [`SMI_INTERVAL`] old; the first call waits for a run).
    pub fn report(&'static self) -> GpuReport {
        let mut problems = Vec::new();
        match self.read_nvml() {
            Ok((gpus, notes)) => {
                return GpuReport {
                    source: Some(GpuSource::Nvml),
                    gpus,
                    failed: false,
                    problems: notes,
                };
            }
            Err(problem) => problems.push(problem),
        }
        match self.smi.cached() {
            Ok((gpus, notes)) => {
                problems.extend(notes);
                GpuReport {
                    source: Some(GpuSource::NvidiaSmi),
                    gpus,
                    failed: false,
                    problems,
                }
            }
            Err(problem) => {
                problems.push(problem);
                GpuReport {
                    source: None,
                    gpus: Vec::new(),
                    failed: self.driver_present(),
                    problems,
                }
            }
        }
    }

    /// A fresh read through NVML alone.
    pub fn read_nvml(&self) -> Result<Reading, String> {
        match &self.nvml {
            Ok(nvml) => read_nvml(nvml),
            Err(f) => Err(f.problem.clone()),
        }
    }

    /// A fresh run of `nvidia-smi` alone, bypassing the cache (for
    /// `diagnose`).
    pub fn read_smi_now(&self) -> Result<Reading, String> {
        match &self.smi.path {
            Some(path) => run_smi(path).outcome,
            None => Err(SMI_NOT_ON_PATH.into()),
        }
    }

    /// Whether an NVIDIA driver is evidently installed.
    pub fn driver_present(&self) -> bool {
        let nvml_loaded = match &self.nvml {
            Ok(_) => true,
            Err(f) => f.loaded,
        };
        nvml_loaded
            || self.smi.path.is_some()
            || Path::new("/dev/nvidiactl").exists()
            || Path::new("/proc/driver/nvidia").exists()
    }

    /// Where `nvidia-smi` is, if on `$PATH`.
    pub fn smi_path(&self) -> Option<&Path> {
        self.smi.path.as_deref()
    }
}

fn init_nvml() -> Result<Nvml, NvmlFailure> {
    let custom = std::env::var_os(NVML_LIB_VAR).filter(|v| !v.is_empty());
    let lib = custom
        .as_deref()
        .unwrap_or_else(|| OsStr::new(NVML_DEFAULT_LIB));
    Nvml::builder()
        .lib_path(lib)
        .init()
        .map_err(|e| nvml_failure(e, &lib.to_string_lossy()))
}

fn nvml_failure(e: NvmlError, lib: &str) -> NvmlFailure {
    let (problem, loaded) = match e {
        NvmlError::LibloadingError(e) => {
            let text = e.to_string();
            if text.contains("No such file") {
                (format!("NVML: {lib} not found"), false)
            } else {
                (format!("NVML: cannot load {lib}: {text}"), false)
            }
        }
        NvmlError::FailedToLoadSymbol(s) => (format!("NVML: {lib} is unusable: {s}"), true),
        NvmlError::DriverNotLoaded => ("NVML: the NVIDIA driver is not loaded".into(), true),
        NvmlError::NoPermission => ("NVML: no permission to use the driver".into(), true),
        e => (format!("NVML: init failed: {e}"), true),
    };
    NvmlFailure { problem, loaded }
}

fn read_nvml(nvml: &Nvml) -> Result<Reading, String> {
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML: cannot count GPUs: {e}"))?;
    let mut gpus = Vec::new();
    let mut notes = Vec::new();
    for index in 0..count {
        match read_device(nvml, index) {
            Ok(gpu) => gpus.push(gpu),
            // A lost GPU must not hide the others.
            Err(e) => notes.push(format!("NVML: GPU {index}: {e}")),
        }
    }
    Ok((gpus, notes))
}

/// One GPU; only a missing handle fails it. Every other field that the GPU
/// does not support (or that fails) is left empty.
fn read_device(nvml: &Nvml, index: u32) -> Result<GpuInfo, NvmlError> {
    let device = nvml.device_by_index(index)?;
    let memory = device.memory_info().ok();
    let mut found: Vec<(u32, Option<u64>)> = Vec::new();
    let compute = device.running_compute_processes().unwrap_or_default();
    let graphics = device.running_graphics_processes().unwrap_or_default();
    for ProcessInfo {
        pid,
        used_gpu_memory,
        ..
    } in compute.into_iter().chain(graphics)
    {
        let mem = match used_gpu_memory {
            UsedGpuMemory::Used(bytes) => Some(bytes),
            UsedGpuMemory::Unavailable => None,
        };
        // A process with both contexts is listed twice.
        match found.iter_mut().find(|(p, _)| *p == pid) {
            Some((_, seen)) => *seen = (*seen).max(mem),
            None => found.push((pid, mem)),
        }
    }
    Ok(GpuInfo {
        index,
        name: device.name().unwrap_or_default(),
        uuid: device.uuid().unwrap_or_default(),
        util_pct: device.utilization_rates().ok().map(|u| u.gpu),
        mem_used_bytes: memory.as_ref().map_or(0, |m| m.used),
        mem_total_bytes: memory.as_ref().map_or(0, |m| m.total),
        temperature_c: device.temperature(TemperatureSensor::Gpu).ok(),
        power_w: device.power_usage().ok().map(|mw| mw as f32 / 1000.0),
        processes: processes(found),
        lease: None,
    })
}

/// Describes `(pid, memory)` pairs, ordered by pid.
fn processes(mut found: Vec<(u32, Option<u64>)>) -> Vec<GpuProcess> {
    found.sort_unstable_by_key(|&(pid, _)| pid);
    found
        .into_iter()
        .map(|(pid, mem_bytes)| GpuProcess {
            pid,
            user: process_user(pid),
            command: process_command(pid),
            mem_bytes,
        })
        .collect()
}

/// The process's real user: a name when the passwd database knows it, else
/// the uid; empty when the process cannot be inspected.
fn process_user(pid: u32) -> String {
    let uid = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
            line.split_whitespace().next()?.parse::<u32>().ok()
        });
    match uid {
        Some(uid) => user_name(uid),
        None => String::new(),
    }
}

/// Looked up once per uid: NSS may go over the network (LDAP, SSSD).
fn user_name(uid: u32) -> String {
    static NAMES: Mutex<Option<HashMap<u32, String>>> = Mutex::new(None);
    let mut names = lock(&NAMES);
    names
        .get_or_insert_with(HashMap::new)
        .entry(uid)
        .or_insert_with(|| passwd_name(uid).unwrap_or_else(|| uid.to_string()))
        .clone()
}

fn passwd_name(uid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: passwd is plain old data; getpwuid_r fills it and points its
    // strings into `buf`, which outlives every use below.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut result);
        if rc != 0 || result.is_null() || pw.pw_name.is_null() {
            return None;
        }
        let name = CStr::from_ptr(pw.pw_name).to_string_lossy().into_owned();
        (!name.is_empty()).then_some(name)
    }
}

/// The command line with NULs as spaces, cut to [`COMMAND_CHARS`]; empty when
/// unreadable.
fn process_command(pid: u32) -> String {
    let Ok(file) = std::fs::File::open(format!("/proc/{pid}/cmdline")) else {
        return String::new();
    };
    // Enough for COMMAND_CHARS characters of any UTF-8; argv can be huge.
    let mut raw = Vec::new();
    if file
        .take(COMMAND_CHARS as u64 * 4)
        .read_to_end(&mut raw)
        .is_err()
    {
        return String::new();
    }
    while raw.last() == Some(&0) {
        raw.pop();
    }
    for b in &mut raw {
        if *b == 0 {
            *b = b' ';
        }
    }
    String::from_utf8_lossy(&raw)
        .chars()
        .take(COMMAND_CHARS)
        .collect()
}

const SMI_NOT_ON_PATH: &str = "nvidia-smi: not on PATH";

/// `nvidia-smi` with its last result.
struct Smi {
    path: Option<PathBuf>,
    state: Mutex<SmiState>,
    /// Signalled when a run finishes.
    finished: Condvar,
}

#[derive(Default)]
struct SmiState {
    last: Option<SmiRun>,
    running: bool,
}

struct SmiRun {
    at: Instant,
    outcome: Result<Reading, String>,
    hung: bool,
}

/// Process groups of [`run_bounded`] runs in flight.
static SMI_RUNNING: Mutex<Vec<i32>> = Mutex::new(Vec::new());
/// Runs that survived SIGKILL (stuck in the kernel); no new run starts while
/// one is, or they would pile up.
static SMI_STUCK: AtomicUsize = AtomicUsize::new(0);

impl Smi {
    fn new(path: Option<PathBuf>) -> Smi {
        Smi {
            path,
            state: Mutex::new(SmiState::default()),
            finished: Condvar::new(),
        }
    }

    /// The last result, refreshed in the background once it is stale; only
    /// the very first call waits for a run.
    fn cached(&'static self) -> Result<Reading, String> {
        let Some(path) = &self.path else {
            return Err(SMI_NOT_ON_PATH.into());
        };
        let mut state = lock(&self.state);
        loop {
            if let Some(last) = &state.last {
                let interval = if last.hung {
                    SMI_HANG_BACKOFF
                } else {
                    SMI_INTERVAL
                };
                let answer = last.outcome.clone();
                if state.running || last.at.elapsed() < interval {
                    return answer;
                }
                state.running = true;
                drop(state);
                let refresh = std::thread::Builder::new()
                    .name("nvidia-smi".into())
                    .spawn(move || self.refresh(path));
                if refresh.is_err() {
                    lock(&self.state).running = false;
                }
                return answer;
            }
            if !state.running {
                state.running = true;
                drop(state);
                self.refresh(path);
                state = lock(&self.state);
                continue;
            }
            // Another caller is taking the first sample; it ends within the
            // timeout.
            state = self.finished.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn refresh(&self, path: &Path) {
        let run = run_smi(path);
        let mut state = lock(&self.state);
        state.last = Some(run);
        state.running = false;
        self.finished.notify_all();
    }
}

/// Both queries under one deadline.
fn run_smi(path: &Path) -> SmiRun {
    let started = Instant::now();
    let done = |outcome, hung| SmiRun {
        at: Instant::now(),
        outcome,
        hung,
    };
    if SMI_STUCK.load(Ordering::Relaxed) > 0 {
        let problem = "nvidia-smi: an earlier run is stuck and could not be killed";
        return done(Err(problem.into()), true);
    }
    let deadline = started + SMI_TIMEOUT;
    let text = match run_bounded(
        "nvidia-smi",
        path,
        &[SMI_QUERY_GPUS, SMI_FORMAT],
        deadline,
        SMI_TIMEOUT,
        &SMI_STUCK,
    ) {
        Ok(text) => text,
        Err(Failure { problem, hung }) => return done(Err(problem), hung),
    };
    let mut gpus = match parse_gpus(&text) {
        Ok(gpus) => gpus,
        Err(line) => {
            let problem = format!("nvidia-smi: unexpected output: {line}");
            return done(Err(problem), false);
        }
    };
    let mut notes = Vec::new();
    if !gpus.is_empty() {
        match run_bounded(
            "nvidia-smi",
            path,
            &[SMI_QUERY_APPS, SMI_FORMAT],
            deadline,
            SMI_TIMEOUT,
            &SMI_STUCK,
        ) {
            Ok(text) => {
                if let Err(line) = attach_apps(&mut gpus, &text) {
                    notes.push(format!("nvidia-smi: unexpected process list: {line}"));
                }
            }
            Err(Failure { problem, hung }) => return done(Err(problem), hung),
        }
    }
    done(Ok((gpus, notes)), false)
}

pub(crate) struct Failure {
    pub problem: String,
    /// Killed at the deadline.
    pub hung: bool,
}

fn failure(problem: impl Into<String>) -> Failure {
    Failure {
        problem: problem.into(),
        hung: false,
    }
}

/// Runs `path args` in its own process group and returns its stdout, or why
/// not (messages start with `name`). Past `deadline` the whole group is
/// killed; `timeout` is what the message says it was. A run that survives
/// SIGKILL is counted in `stuck` until it is reaped.
pub(crate) fn run_bounded(
    name: &str,
    path: &Path,
    args: &[&str],
    deadline: Instant,
    timeout: Duration,
    stuck: &'static AtomicUsize,
) -> Result<String, Failure> {
    let mut child = Command::new(path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| failure(format!("{name}: cannot start: {e}")))?;
    let pid = child.id() as i32;
    lock(&SMI_RUNNING).push(pid);
    let stdout = read_all(child.stdout.take());
    let stderr = read_all(child.stderr.take());
    let exited = wait_exit(pid, deadline);
    // The leader is a zombie (or alive) until reaped below, so its group id
    // still names our group: kill leftovers of a finished run, too.
    // SAFETY: plain syscall; ESRCH when nothing is left is fine.
    unsafe { libc::killpg(pid, libc::SIGKILL) };
    lock(&SMI_RUNNING).retain(|&p| p != pid);
    if !exited {
        reap_killed(child, name, stuck);
        let secs = timeout.as_secs();
        return Err(Failure {
            problem: format!("{name}: timed out after {secs} s"),
            hung: true,
        });
    }
    let status = child
        .wait()
        .map_err(|e| failure(format!("{name}: cannot wait: {e}")))?;
    // The group is dead, so the pipes close at once.
    let grace = Duration::from_secs(1);
    let out = stdout.recv_timeout(grace).unwrap_or_default();
    let err = stderr.recv_timeout(grace).unwrap_or_default();
    if !status.success() {
        return Err(failure(format!(
            "{name}: {}{}",
            describe_status(status),
            first_line(&err, &out)
        )));
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Waits until `pid` exits, without reaping it; false at the deadline.
fn wait_exit(pid: i32, deadline: Instant) -> bool {
    loop {
        // SAFETY: siginfo_t is plain old data; waitid only writes into it.
        let exited = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let rc = libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            );
            // ECHILD cannot happen before we reap; treat errors as exited so
            // that the caller's wait reports them.
            rc != 0 || info.si_pid() != 0
        };
        if exited {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Reaps a child that was sent SIGKILL. One stuck in the kernel is left to a
/// thread that waits for it, and blocks new runs meanwhile.
fn reap_killed(mut child: Child, name: &str, stuck: &'static AtomicUsize) {
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    stuck.fetch_add(1, Ordering::Relaxed);
    let waiter = std::thread::Builder::new()
        .name("bounded-reaper".into())
        .spawn(move || {
            let _ = child.wait();
            stuck.fetch_sub(1, Ordering::Relaxed);
        });
    if waiter.is_err() {
        eprintln!("outpost-agent: {name} is stuck and cannot be reaped");
    }
}

/// Reads a pipe to its end on a thread, keeping at most [`SMI_OUTPUT_CAP`]
/// bytes.
fn read_all(pipe: Option<impl Read + Send + 'static>) -> Receiver<Vec<u8>> {
    let (tx, rx) = channel();
    if let Some(mut pipe) = pipe {
        let _ = std::thread::Builder::new()
            .name("nvidia-smi-output".into())
            .spawn(move || {
                let mut kept = Vec::new();
                let mut buf = [0u8; 8192];
                loop {
                    match pipe.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            let room = SMI_OUTPUT_CAP.saturating_sub(kept.len());
                            kept.extend_from_slice(&buf[..n.min(room)]);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
                let _ = tx.send(kept);
            });
    }
    rx
}

fn describe_status(status: ExitStatus) -> String {
    if let Some(sig) = status.signal() {
        let name = match sig {
            libc::SIGSEGV => " (SIGSEGV)",
            libc::SIGABRT => " (SIGABRT)",
            libc::SIGBUS => " (SIGBUS)",
            libc::SIGILL => " (SIGILL)",
            libc::SIGFPE => " (SIGFPE)",
            libc::SIGKILL => " (SIGKILL)",
            libc::SIGTERM => " (SIGTERM)",
            _ => "",
        };
        return format!("killed by signal {sig}{name}");
    }
    match status.code() {
        Some(code) => format!("exit status {code}"),
        None => "ended abnormally".into(),
    }
}

/// `: <first line>` of stderr, else of stdout, shortened; empty when both are.
fn first_line(err: &[u8], out: &[u8]) -> String {
    let text = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(excerpt)
    };
    text(err)
        .or_else(|| text(out))
        .map_or_else(String::new, |l| format!(": {l}"))
}

/// A line of output, cut to a length fit for an error message.
fn excerpt(line: &str) -> String {
    const MAX: usize = 120;
    let mut cut: String = line.chars().take(MAX).collect();
    if line.chars().nth(MAX).is_some() {
        cut.push('…');
    }
    cut
}

/// Parses `--query-gpu` CSV; the offending line on garbage.
fn parse_gpus(text: &str) -> Result<Vec<GpuInfo>, String> {
    let mut gpus = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let n = fields.len();
        if n < 8 {
            return Err(excerpt(line));
        }
        let index = fields[0].parse().map_err(|_| excerpt(line))?;
        // A name with a comma in it spans several fields.
        let name = fields[1..n - 6].join(", ");
        let f = &fields[n - 6..];
        if f[0].is_empty() || f[0].starts_with('[') {
            return Err(excerpt(line));
        }
        gpus.push(GpuInfo {
            index,
            name,
            uuid: f[0].to_string(),
            util_pct: number(f[1]).map(|v| v.round() as u32),
            mem_used_bytes: number(f[2]).map_or(0, mib_to_bytes),
            mem_total_bytes: number(f[3]).map_or(0, mib_to_bytes),
            temperature_c: number(f[4]).map(|v| v.round() as u32),
            power_w: number(f[5]).map(|v| v as f32),
            processes: Vec::new(),
            lease: None,
        });
    }
    Ok(gpus)
}

/// Parses `--query-compute-apps` CSV into the GPUs' process lists; the first
/// unparsable line on garbage (the good lines are kept).
fn attach_apps(gpus: &mut [GpuInfo], text: &str) -> Result<(), String> {
    let mut found: HashMap<&str, Vec<(u32, Option<u64>)>> = HashMap::new();
    let mut bad = None;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let pid = fields.get(1).and_then(|p| p.parse::<u32>().ok());
        let (Some(&uuid), Some(pid), 3) = (fields.first(), pid, fields.len()) else {
            bad.get_or_insert_with(|| excerpt(line));
            continue;
        };
        let mem = number(fields[2]).map(mib_to_bytes);
        let list = found.entry(uuid).or_default();
        if !list.iter().any(|&(p, _)| p == pid) {
            list.push((pid, mem));
        }
    }
    for gpu in gpus.iter_mut() {
        if let Some(list) = found.get(gpu.uuid.as_str()) {
            gpu.processes = processes(list.clone());
        }
    }
    bad.map_or(Ok(()), Err)
}

/// A number, or None for `[N/A]`, `[Not Supported]`, `N/A` and the like.
fn number(field: &str) -> Option<f64> {
    field
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
}

fn mib_to_bytes(mib: f64) -> u64 {
    (mib * MIB as f64).round() as u64
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves usable data; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_csv() {
        let text = "0, NVIDIA H100 80GB HBM3, GPU-a, 87, 70000, 81559, 61, 412.50\n\
                    1, Weird, Name, GPU-b, [N/A], 0, 81559, [Not Supported], N/A\n";
        let gpus = parse_gpus(text).unwrap();
        assert_eq!(gpus.len(), 2);
        let g = &gpus[0];
        assert_eq!(
            (g.index, g.name.as_str(), g.uuid.as_str()),
            (0, "NVIDIA H100 80GB HBM3", "GPU-a")
        );
        assert_eq!(g.util_pct, Some(87));
        assert_eq!(g.mem_used_bytes, 70000 * MIB);
        assert_eq!(g.mem_total_bytes, 81559 * MIB);
        assert_eq!((g.temperature_c, g.power_w), (Some(61), Some(412.5)));
        let g = &gpus[1];
        assert_eq!((g.name.as_str(), g.uuid.as_str()), ("Weird, Name", "GPU-b"));
        assert_eq!((g.util_pct, g.temperature_c, g.power_w), (None, None, None));
        assert_eq!(parse_gpus("").unwrap(), vec![]);
    }

    #[test]
    fn gpu_csv_garbage() {
        assert!(parse_gpus("Failed to initialize NVML: Driver/library version mismatch").is_err());
        assert!(parse_gpus("x, a, b, c, d, e, f, g").is_err());
        assert!(parse_gpus("0, a, [N/A], c, d, e, f, g").is_err());
    }

    #[test]
    fn apps_csv() {
        let mut gpus =
            parse_gpus("0, A, GPU-a, 1, 2, 3, 4, 5\n1, B, GPU-b, 1, 2, 3, 4, 5").unwrap();
        let me = std::process::id();
        let text = format!("GPU-b, {me}, 512\nGPU-b, 1, [N/A]\nGPU-x, 7, 1\nnonsense\n");
        assert_eq!(attach_apps(&mut gpus, &text), Err("nonsense".into()));
        assert!(gpus[0].processes.is_empty());
        let p = &gpus[1].processes;
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].pid, p[0].mem_bytes), (1, None));
        assert_eq!((p[1].pid, p[1].mem_bytes), (me, Some(512 * MIB)));
        assert!(p[1].command.contains("outpost"), "{:?}", p[1].command);
        assert!(!p[1].user.is_empty());
    }

    #[test]
    fn command_lines_are_cut() {
        assert_eq!(process_command(u32::MAX), "");
        assert_eq!(process_user(u32::MAX), "");
        let own = process_command(std::process::id());
        assert!(own.chars().count() <= COMMAND_CHARS && !own.ends_with(' '));
    }
}
