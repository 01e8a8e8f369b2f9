//! `outpost-agent diagnose`: a plain-text health report for people.
//!
//! Run by hand on a host (or by the controller's doctor command) to see what the
//! agent sees and what would stop it from working. Every probe is best effort:
//! a failed probe is shown as unknown; the exit status is 1 when the report
//! lists a problem, so scripts (and `outpost diagnose HOST`) can tell.

use std::fmt::Write as _;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::metrics::Sampler;
use crate::{gpu, identity, leases, paths};

/// Between the two CPU reads that give the usage figure.
const CPU_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// Writes the report to stdout; 1 when it lists a problem, else 0.
pub fn run() -> i32 {
    let (report, problems) = report();
    print!("{report}");
    i32::from(problems)
}

fn report() -> (String, bool) {
    let mut problems: Vec<String> = Vec::new();
    let mut r = String::new();
    let unknown = || "unknown".to_string();

    let _ = writeln!(r, "outpost-agent diagnose");
    let _ = writeln!(r);
    let _ = writeln!(r, "Agent");
    field(&mut r, "version", identity::VERSION);
    field(&mut r, "build hash", identity::build_hash());
    let exe = identity::exe_path();
    field(
        &mut r,
        "executable",
        &exe.as_ref()
            .map_or_else(unknown, |p| p.display().to_string()),
    );

    let _ = writeln!(r);
    let _ = writeln!(r, "System");
    field(&mut r, "os", &os_pretty_name().unwrap_or_else(unknown));
    field(&mut r, "kernel", &kernel().unwrap_or_else(unknown));
    field(&mut r, "arch", std::env::consts::ARCH);
    field(&mut r, "libc", &identity::libc_description());
    match Sampler::new() {
        Ok(mut sampler) => {
            // CPU usage needs two reads of the CPU times.
            std::thread::sleep(CPU_INTERVAL);
            let m = sampler.sample_host();
            field(&mut r, "cpu", &sampler.cpu_brand().unwrap_or_else(unknown));
            field(&mut r, "cpu count", &m.cpu_count.to_string());
            field(
                &mut r,
                "cpu usage",
                &m.cpu_usage_pct.map_or_else(unknown, |u| {
                    let per: Vec<String> =
                        m.per_cpu_pct.iter().map(|p| format!("{p:.0}")).collect();
                    format!(
                        "{u:.1}% over {} ms (per core: {})",
                        CPU_INTERVAL.as_millis(),
                        per.join(" ")
                    )
                }),
            );
            field(
                &mut r,
                "load",
                &format!("{:.2} {:.2} {:.2}", m.load_1m, m.load_5m, m.load_15m),
            );
            field(
                &mut r,
                "memory",
                &format!(
                    "{} total, {} used, {} available",
                    bytes(m.mem_total_bytes),
                    bytes(m.mem_used_bytes),
                    bytes(m.mem_available_bytes)
                ),
            );
            field(
                &mut r,
                "swap",
                &format!(
                    "{} total, {} used",
                    bytes(m.swap_total_bytes),
                    bytes(m.swap_used_bytes)
                ),
            );
            if m.disks.is_empty() {
                field(&mut r, "disks", "unknown");
            }
            for d in &m.disks {
                field(
                    &mut r,
                    &format!("disk ({})", d.role),
                    &format!(
                        "{} available of {} on {} ({})",
                        bytes(d.available_bytes),
                        bytes(d.total_bytes),
                        d.mount_point,
                        d.path
                    ),
                );
            }
            field(&mut r, "processes", &m.process_count.to_string());
            field(&mut r, "uptime", &duration(m.uptime_s));
        }
        Err(e) => {
            field(&mut r, "resources", &e);
            problems.push(format!("cannot read host resources: {e}"));
        }
    }
    match paths::find_bash() {
        Some(bash) => field(&mut r, "bash", &bash.display().to_string()),
        None => {
            field(&mut r, "bash", "not found");
            problems.push("bash not found: commands will run with /bin/sh".into());
        }
    }
    if std::fs::read("/proc/self/environ").is_err() {
        problems.push("/proc is not readable: timed-out process trees cannot be found".into());
    }

    let _ = writeln!(r);
    let _ = writeln!(r, "State");
    let home = paths::home_dir();
    field(
        &mut r,
        "home",
        &home
            .as_ref()
            .map_or_else(|| "unset".into(), |h| h.display().to_string()),
    );
    if home.is_none() {
        problems.push("no home directory ($HOME unset and no passwd entry)".into());
    }
    if let Some(state) = paths::state_dir() {
        state_dir(&mut r, &mut problems, &state);
        installed_agents(&mut r, &state, exe.as_deref());
    }

    let _ = writeln!(r);
    let _ = writeln!(r, "Jobs");
    jobs(&mut r);

    let _ = writeln!(r);
    let _ = writeln!(r, "Sandboxes");
    sandboxes(&mut r);

    let _ = writeln!(r);
    let _ = writeln!(r, "GPUs");
    gpus(&mut r, &mut problems);
    leases(&mut r);

    let _ = writeln!(r);
    let _ = writeln!(r, "Problems");
    if problems.is_empty() {
        let _ = writeln!(r, "  none found");
    }
    for p in &problems {
        let _ = writeln!(r, "  - {p}");
    }
    (r, !problems.is_empty())
}

fn field(r: &mut String, name: &str, value: &str) {
    let _ = writeln!(r, "  {:<18} {value}", format!("{name}:"));
}

/// Each GPU source on its own, then the GPUs from the one `serve` would use.
fn gpus(r: &mut String, problems: &mut Vec<String>) {
    let gpus = gpu::gpus();
    let custom = std::env::var_os(gpu::NVML_LIB_VAR).filter(|v| !v.is_empty());
    let lib = match &custom {
        Some(path) => format!("{} (from {})", Path::new(path).display(), gpu::NVML_LIB_VAR),
        None => find_nvml().map_or_else(
            || format!("{} not found", gpu::NVML_DEFAULT_LIB),
            |p| p.display().to_string(),
        ),
    };
    field(r, "NVML library", &lib);
    let nvml = gpus.read_nvml();
    field(r, "NVML", &source_status(&nvml));
    let smi = gpus.read_smi_now();
    let smi_status = match gpus.smi_path() {
        Some(path) => format!("{} ({})", source_status(&smi), path.display()),
        None => source_status(&smi),
    };
    field(r, "nvidia-smi", &smi_status);

    // The same preference as `serve`.
    let (source, reading) = match (nvml, smi) {
        (Ok(reading), _) => ("NVML", reading),
        (Err(_), Ok(reading)) => ("nvidia-smi", reading),
        (Err(nvml_problem), Err(smi_problem)) => {
            field(r, "source", "none");
            if gpus.driver_present() {
                problems.push(format!(
                    "an NVIDIA driver is installed but no GPU source works \
                     ({nvml_problem}; {smi_problem}): GPU state is unknown"
                ));
            }
            return;
        }
    };
    field(r, "source", source);
    problems.extend(reading.1.iter().cloned());
    let leases = leases::live();
    let mut list = reading.0;
    leases::annotate(&mut list, &leases);
    for g in &list {
        let opt = |v: Option<String>| v.unwrap_or_else(|| "not supported".into());
        field(
            r,
            &format!("GPU {}", g.index),
            &format!("{} ({})", g.name, g.uuid),
        );
        sub(r, "utilization", &opt(g.util_pct.map(|u| format!("{u}%"))));
        sub(
            r,
            "memory",
            &format!(
                "{} used of {}",
                bytes(g.mem_used_bytes),
                bytes(g.mem_total_bytes)
            ),
        );
        sub(
            r,
            "temperature",
            &opt(g.temperature_c.map(|t| format!("{t} °C"))),
        );
        sub(r, "power", &opt(g.power_w.map(|w| format!("{w:.1} W"))));
        sub(r, "lease", g.lease.as_deref().unwrap_or("none"));
        sub(r, "processes", &g.processes.len().to_string());
        for p in &g.processes {
            let mem = p.mem_bytes.map_or_else(|| "?".into(), bytes);
            let user = if p.user.is_empty() { "?" } else { &p.user };
            let _ = writeln!(r, "        {} {user} {mem} {}", p.pid, p.command);
        }
    }
}

/// `works, N GPUs` or the problem.
fn source_status(result: &Result<gpu::Reading, String>) -> String {
    match result {
        Ok((gpus, _)) => format!(
            "works, {} GPU{}",
            gpus.len(),
            if gpus.len() == 1 { "" } else { "s" }
        ),
        Err(problem) => problem
            .split_once(": ")
            .map_or(problem.as_str(), |(_, why)| why)
            .to_string(),
    }
}

fn leases(r: &mut String) {
    let (dir, status) = leases::table_status();
    match status {
        Ok(()) => field(r, "lease table", &dir.display().to_string()),
        Err(problem) => field(r, "lease table", &problem),
    }
    let leases = leases::live();
    if leases.is_empty() {
        field(r, "leases", "none");
        return;
    }
    field(r, "leases", &leases.len().to_string());
    for l in &leases {
        let gpus: Vec<String> = l.indices.iter().map(u32::to_string).collect();
        let age = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            .saturating_sub(l.created_unix);
        let _ = writeln!(
            r,
            "    {}: GPU {} held by pid {} for {}",
            l.id,
            gpus.join(", "),
            l.holder_pid,
            duration(age)
        );
    }
}

/// The job daemon: running or not, how it was (or would be) started, and
/// whether jobs survive this user's logout.
fn jobs(r: &mut String) {
    use crate::daemon::{self, client};
    use crate::jobs::store;
    use crate::statefile;
    let Some(state) = paths::state_dir() else {
        field(r, "daemon", "unknown (no state directory)");
        return;
    };
    let info: Option<daemon::DaemonInfo> = statefile::read_json(&daemon::info_path(&state));
    match info.filter(|i| i.process.alive()) {
        Some(i) => field(
            r,
            "daemon",
            &format!(
                "running, pid {}, started by {}, socket {}",
                i.process.pid,
                i.started_by,
                i.socket.display()
            ),
        ),
        None => field(
            r,
            "daemon",
            &format!(
                "not running; would be started by {}, socket {}",
                client::start_method(),
                daemon::socket_path(&state).display()
            ),
        ),
    }
    let linger = client::lingering();
    field(
        r,
        "lingering",
        match linger {
            Some(true) => "on",
            Some(false) => "off",
            None => "unknown (no loginctl or no logind)",
        },
    );
    if linger == Some(false) {
        let _ = writeln!(
            r,
            "    note: with lingering off, systemd may stop this user's processes, \
             jobs included, after the last login ends; `loginctl enable-linger` keeps them"
        );
    }
    let all = store::all(&state.join("jobs"));
    let count = |st: outpost_protocol::JobState| all.iter().filter(|j| j.state == st).count();
    field(
        r,
        "jobs",
        &format!(
            "{} running, {} exited, {} cancelled, {} lost",
            count(outpost_protocol::JobState::Running),
            count(outpost_protocol::JobState::Exited),
            count(outpost_protocol::JobState::Cancelled),
            count(outpost_protocol::JobState::Lost)
        ),
    );
}

/// Which isolation rung this host reaches, the fix for a better one, and
/// how limits would be enforced.
fn sandboxes(r: &mut String) {
    use crate::sandbox::{isolation, store};
    let rungs = isolation::rungs();
    let best = isolation::choose(outpost_protocol::Isolation::Auto)
        .unwrap_or(outpost_protocol::Isolation::None);
    field(
        r,
        "isolation",
        match best {
            outpost_protocol::Isolation::Bwrap => "bwrap (namespaces, the home hidden)",
            outpost_protocol::Isolation::Landlock => "landlock + seccomp (no bwrap)",
            _ => "none: a plain workspace, not isolated",
        },
    );
    match &rungs.bwrap {
        Ok(path) => sub(r, "bwrap", &format!("works ({})", path.display())),
        Err(why) => {
            sub(r, "bwrap", why);
            sub(r, "fix", isolation::bwrap_fix(why));
        }
    }
    match &rungs.landlock {
        Ok(abi) => sub(r, "landlock", &format!("ABI {abi}")),
        Err(why) => sub(r, "landlock", why),
    }
    sub(r, "runs as", &crate::account::scheme());
    let probe = crate::sandbox::limits_probe();
    sub(r, "limits", &probe);
    if let Some(root) = store::root_path() {
        let all = store::all(&root);
        let live = all.iter().filter(|d| d.end().is_none()).count();
        field(
            r,
            "sandboxes",
            &format!("{live} live, {} ended (kept a day)", all.len() - live),
        );
    }
}

fn sub(r: &mut String, name: &str, value: &str) {
    let _ = writeln!(r, "    {:<16} {value}", format!("{name}:"));
}

fn state_dir(r: &mut String, problems: &mut Vec<String>, state: &Path) {
    let shown = state.display().to_string();
    match std::fs::metadata(state) {
        Ok(meta) => {
            let mode = meta.permissions().mode() & 0o7777;
            field(r, "state dir", &format!("{shown} (mode {mode:04o})"));
            if mode & 0o077 != 0 {
                problems.push(format!(
                    "{shown} has mode {mode:04o}; it should be 0700 (chmod 700 {shown})"
                ));
            }
            // SAFETY: getuid cannot fail.
            let uid = unsafe { libc::getuid() };
            if meta.uid() != uid {
                problems.push(format!(
                    "{shown} is owned by uid {}, not by this user (uid {uid})",
                    meta.uid()
                ));
            }
        }
        Err(_) => field(r, "state dir", &format!("{shown} (does not exist yet)")),
    }
}

fn installed_agents(r: &mut String, state: &Path, exe: Option<&Path>) {
    let agents = state.join("agents");
    let Ok(entries) = std::fs::read_dir(&agents) else {
        field(r, "installed agents", "none");
        return;
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    if names.is_empty() {
        field(r, "installed agents", "none");
        return;
    }
    field(r, "installed agents", &names.len().to_string());
    for name in names {
        let dir = agents.join(&name);
        let mut notes = Vec::new();
        if exe.is_some_and(|e| e.starts_with(&dir)) {
            notes.push("this agent");
        }
        if name.starts_with('.') {
            notes.push("upload in progress or abandoned");
        } else if !dir.join("outpost-agent").is_file() {
            notes.push("no executable");
        }
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join(", "))
        };
        let _ = writeln!(r, "    {name}{notes}");
    }
}

/// `NAME="value"` from os-release, unquoted.
fn os_pretty_name() -> Option<String> {
    let text = std::fs::read_to_string("/etc/os-release")
        .or_else(|_| std::fs::read_to_string("/usr/lib/os-release"))
        .ok()?;
    text.lines().find_map(|line| {
        let value = line.strip_prefix("PRETTY_NAME=")?.trim();
        Some(value.trim_matches(|c| c == '"' || c == '\'').to_string())
    })
}

fn kernel() -> Option<String> {
    // SAFETY: utsname is plain old data and uname fills it.
    let uts = unsafe {
        let mut uts: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut uts) != 0 {
            return None;
        }
        uts
    };
    let text = |field: &[libc::c_char]| {
        let bytes: Vec<u8> = field
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    Some(format!(
        "{} {} {}",
        text(&uts.sysname),
        text(&uts.release),
        text(&uts.version)
    ))
}

/// Where the NVIDIA management library is, if anywhere: common paths first,
/// then the dynamic linker's cache.
fn find_nvml() -> Option<PathBuf> {
    const NAME: &str = "libnvidia-ml.so.1";
    let dirs = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/lib64",
        "/lib/x86_64-linux-gnu",
        "/usr/local/cuda/lib64",
        "/usr/local/nvidia/lib64",
        "/usr/lib/wsl/lib",
    ];
    if let Some(p) = dirs
        .iter()
        .map(|d| Path::new(d).join(NAME))
        .find(|p| p.exists())
    {
        return Some(p);
    }
    let ldconfig = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "/usr/bin/ldconfig"]
        .into_iter()
        .find(|p| Path::new(p).exists())?;
    let out = std::process::Command::new(ldconfig)
        .arg("-p")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| {
            let line = line.trim();
            if !line.starts_with(NAME) {
                return None;
            }
            line.rsplit_once("=> ")
                .map(|(_, p)| PathBuf::from(p.trim()))
        })
}

fn bytes(n: u64) -> String {
    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
    const MIB: f64 = 1024.0 * 1024.0;
    let n = n as f64;
    if n >= GIB {
        format!("{:.1} GiB", n / GIB)
    } else {
        format!("{:.0} MiB", n / MIB)
    }
}

fn duration(secs: u64) -> String {
    let (d, h, m) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60);
    if d > 0 {
        format!("{d}d {h}h {m}m")
    } else {
        format!("{h}h {m}m")
    }
}
