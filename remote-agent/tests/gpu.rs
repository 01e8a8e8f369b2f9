//! GPU metrics and leases end to end: the agent against a fake NVML library
//! (built here from `tests/fake_nvml/fake_nvml.c`) and fake `nvidia-smi`
//! scripts that describe the same two GPUs.
//!
//! Every test gets its own HOME, its own GPU lease table (the host-wide one
//! would be shared by every test and every user) and a PATH holding only
//! what it needs, so a real NVIDIA stack on the test host cannot leak in.

mod common;

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{Agent, BIN, TempDir, procs_with, skip};
use outpost_protocol::{
    ErrorKind, GpuInfo, GpuLease, GpuLeaseRequest, GpuSource, HostMetrics, Request, Response,
};

const MIB: u64 = 1024 * 1024;
const UUID0: &str = "GPU-00000000-1111-2222-3333-444444444444";
const UUID1: &str = "GPU-55555555-6666-7777-8888-999999999999";

/// The fake NVML library, compiled once per test run.
fn fake_nvml() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fake-nvml");
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("libnvidia-ml.so.1");
        // Built aside and renamed, so that a concurrent run never loads half
        // a library.
        let built = dir.join(format!("build-{}.so", std::process::id()));
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_nvml/fake_nvml.c");
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&built)
            .arg(&source)
            .output()
            .unwrap_or_else(|e| {
                panic!("these tests need a C compiler: cannot run `cc` ({e}); install gcc or clang")
            });
        assert!(
            out.status.success(),
            "cc failed to build the fake NVML:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&built, &lib).unwrap();
        lib
    })
}

fn find_tool(name: &str) -> PathBuf {
    ["/bin", "/usr/bin", "/usr/local/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} not found"))
}

/// A host for one test: a home, a bin dir for PATH, and a process that the
/// fake GPU 0 reports as its user.
struct Host {
    root: TempDir,
    gpu_user: Child,
}

impl Host {
    fn new(label: &str) -> Host {
        let root = TempDir::new(label);
        std::fs::create_dir_all(root.path().join("home")).unwrap();
        let bin = root.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        symlink(find_tool("sleep"), bin.join("sleep")).unwrap();
        let gpu_user = Command::new("sleep").arg("30.4711").spawn().unwrap();
        Host { root, gpu_user }
    }

    fn home(&self) -> PathBuf {
        self.root.path().join("home")
    }

    fn gpu_user_pid(&self) -> u32 {
        self.gpu_user.id()
    }

    /// Installs a fake `nvidia-smi` whose body is `script`.
    fn nvidia_smi(&self, script: &str) -> PathBuf {
        let path = self.root.path().join("bin/nvidia-smi");
        std::fs::write(&path, format!("#!/bin/sh\n{script}")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// The agent (or `exe`) with this host's environment; NVML from `nvml`.
    fn command(&self, exe: &Path, nvml: &Path) -> Command {
        let mut cmd = Command::new(exe);
        cmd.env_clear()
            .env("HOME", self.home())
            .env("PATH", self.root.path().join("bin"))
            .env("OUTPOST_NVML_LIB", nvml)
            .env("OUTPOST_GPU_LEASE_DIR", self.lease_dir())
            .env("OUTPOST_DEV_DIR", self.root.path().join("dev"))
            .env("OUTPOST_NVIDIA_DRIVER_DIR", self.root.path().join("driver"))
            .env("FAKE_NVML_PID", self.gpu_user_pid().to_string());
        cmd
    }

    fn agent(&self, nvml: &Path) -> Agent {
        Agent::start_with(&mut self.command(Path::new(BIN), nvml))
    }

    /// An agent whose NVML cannot load, so it needs nvidia-smi.
    fn agent_without_nvml(&self) -> Agent {
        self.agent(&self.root.path().join("missing/libnvidia-ml.so.1"))
    }

    /// Stand-in device nodes for both fake GPUs (made with mknod: root
    /// only), numbered the other way round from their indices, as the
    /// driver may; false (after [`skip`]) without root.
    fn device_nodes(&self) -> bool {
        // SAFETY: getuid cannot fail.
        if unsafe { libc::getuid() } != 0 {
            skip("stand-in GPU device nodes need root (mknod)");
            return false;
        }
        let dev = self.root.path().join("dev");
        std::fs::create_dir_all(&dev).unwrap();
        for (name, minor) in [("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)] {
            let path = std::ffi::CString::new(dev.join(name).to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path; plain syscall.
            let rc = unsafe {
                libc::mknod(
                    path.as_ptr(),
                    libc::S_IFCHR | 0o666,
                    libc::makedev(195, minor),
                )
            };
            assert_eq!(rc, 0, "mknod: {}", std::io::Error::last_os_error());
        }
        for (uuid, minor) in [(UUID0, 1), (UUID1, 0)] {
            let gpu = self.root.path().join(format!("driver/gpus/{uuid}"));
            std::fs::create_dir_all(&gpu).unwrap();
            let info = format!("GPU UUID: \t {uuid}\nDevice Minor: \t {minor}\n");
            std::fs::write(gpu.join("information"), info).unwrap();
        }
        true
    }

    /// This host's lease table; the first agent to lease creates it.
    fn lease_dir(&self) -> PathBuf {
        self.root.path().join("leases")
    }

    /// Ids of the lease files in the table.
    fn lease_files(&self) -> Vec<String> {
        let mut ids: Vec<String> = std::fs::read_dir(self.lease_dir())
            .map(|d| {
                d.flatten()
                    .filter_map(|e| {
                        let name = e.file_name().into_string().ok()?;
                        name.strip_suffix(".lease").map(str::to_string)
                    })
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.gpu_user.kill();
        let _ = self.gpu_user.wait();
        // A daemon or keeper a test started inherited this home.
        let home = format!("HOME={}", self.home().display());
        for pid in common::procs_with_env(&home) {
            common::kill(pid, libc::SIGKILL);
        }
    }
}

/// Prints what the fake NVML reports, as nvidia-smi would.
fn smi_script(gpu_user: u32) -> String {
    format!(
        r#"case "$1" in
--query-gpu=index,name,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw)
    echo "0, Fake GPU A100, {UUID0}, 87, 70000, 81920, 61, 412.50"
    echo "1, Fake GPU A100, {UUID1}, 3, 1024, 81920, 40, [N/A]" ;;
--query-compute-apps=gpu_uuid,pid,used_memory)
    echo "{UUID0}, {gpu_user}, 512"
    echo "{UUID0}, 1, [N/A]" ;;
*) echo "unexpected arguments: $*" >&2; exit 2 ;;
esac
"#
    )
}

fn user_name() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// What both sources must report for the fake GPUs.
fn check_fake_gpus(gpus: &[GpuInfo], gpu_user: u32) {
    assert_eq!(gpus.len(), 2, "{gpus:?}");
    let g = &gpus[0];
    assert_eq!(
        (g.index, g.name.as_str(), g.uuid.as_str()),
        (0, "Fake GPU A100", UUID0)
    );
    assert_eq!(g.util_pct, Some(87));
    assert_eq!(
        (g.mem_used_bytes, g.mem_total_bytes),
        (70000 * MIB, 81920 * MIB)
    );
    assert_eq!((g.temperature_c, g.power_w), (Some(61), Some(412.5)));
    assert_eq!(g.processes.len(), 2, "{:?}", g.processes);
    // Ordered by pid; the one with both contexts is listed once.
    let init = &g.processes[0];
    assert_eq!((init.pid, init.mem_bytes), (1, None));
    let user = &g.processes[1];
    assert_eq!(user.pid, gpu_user);
    assert_eq!(user.mem_bytes, Some(512 * MIB));
    assert_eq!(user.user, user_name());
    assert_eq!(user.command, "sleep 30.4711");

    let g = &gpus[1];
    assert_eq!((g.index, g.uuid.as_str()), (1, UUID1));
    assert_eq!(
        (g.util_pct, g.temperature_c, g.power_w),
        (Some(3), Some(40), None)
    );
    assert_eq!(
        (g.mem_used_bytes, g.mem_total_bytes),
        (1024 * MIB, 81920 * MIB)
    );
    assert!(g.processes.is_empty());
}

#[test]
fn nvml_and_nvidia_smi_report_the_same_gpus() {
    let host = Host::new("gpu-sources");
    let mut agent = host.agent(fake_nvml());
    let nvml = agent.metrics(1).gpu;
    assert_eq!(nvml.source, Some(GpuSource::Nvml), "{nvml:?}");
    assert!(!nvml.failed && nvml.problems.is_empty(), "{nvml:?}");
    check_fake_gpus(&nvml.gpus, host.gpu_user_pid());

    host.nvidia_smi(&smi_script(host.gpu_user_pid()));
    let mut agent = host.agent_without_nvml();
    let smi = agent.metrics(1).gpu;
    assert_eq!(smi.source, Some(GpuSource::NvidiaSmi), "{smi:?}");
    assert!(!smi.failed, "{smi:?}");
    assert_eq!(smi.problems.len(), 1, "{smi:?}");
    assert!(
        smi.problems[0].starts_with("NVML: ") && smi.problems[0].ends_with("not found"),
        "{smi:?}"
    );
    check_fake_gpus(&smi.gpus, host.gpu_user_pid());
    assert_eq!(smi.gpus, nvml.gpus);
}

/// Metrics with a broken nvidia-smi: still answered, marked failed, and the
/// first request alone pays for the failure.
fn broken_nvidia_smi(label: &str, script: &str, problem: &str) -> Duration {
    let host = Host::new(label);
    let smi = host.nvidia_smi(script);
    let mut agent = host.agent_without_nvml();
    let started = Instant::now();
    let m = agent.metrics(1);
    let first = started.elapsed();
    assert_eq!(m.gpu.source, None);
    assert!(m.gpu.gpus.is_empty() && m.gpu.failed, "{:?}", m.gpu);
    assert!(
        m.gpu.problems.iter().any(|p| p.contains(problem)),
        "no {problem:?} in {:?}",
        m.gpu.problems
    );
    for id in 2..5 {
        let asked = Instant::now();
        let m = agent.metrics(id);
        assert!(
            asked.elapsed() < Duration::from_millis(500),
            "request {id} took {:?}",
            asked.elapsed()
        );
        assert!(m.gpu.failed);
        std::thread::sleep(Duration::from_millis(300));
    }
    let smi = smi.to_str().unwrap();
    assert_eq!(
        procs_with(smi),
        Vec::<i32>::new(),
        "nvidia-smi left running"
    );
    first
}

#[test]
fn crashing_nvidia_smi() {
    let first = broken_nvidia_smi(
        "smi-crash",
        "kill -SEGV $$\n",
        "nvidia-smi: killed by signal 11",
    );
    assert!(first < Duration::from_secs(3), "{first:?}");
}

#[test]
fn garbage_from_nvidia_smi() {
    let script = "echo 'Failed to initialize NVML: Driver/library version mismatch'\n";
    broken_nvidia_smi(
        "smi-garbage",
        script,
        "nvidia-smi: unexpected output: Failed to initialize",
    );
}

#[test]
fn hanging_nvidia_smi_costs_one_timeout() {
    let first = broken_nvidia_smi(
        "smi-hang",
        "sleep 60.4712\n",
        "nvidia-smi: timed out after 5 s",
    );
    assert!(
        first >= Duration::from_millis(4500) && first < Duration::from_secs(8),
        "{first:?}"
    );
    // The whole process group went, not just the script.
    assert_eq!(procs_with("60.4712"), Vec::<i32>::new());
}

#[test]
fn no_nvidia_stack() {
    let host = Host::new("no-gpu");
    let mut agent = host.agent_without_nvml();
    let gpu = agent.metrics(1).gpu;
    assert_eq!(gpu.source, None);
    assert!(gpu.gpus.is_empty());
    // Only a real driver on the test host may make this a failure.
    let driver = Path::new("/dev/nvidiactl").exists() || Path::new("/proc/driver/nvidia").exists();
    assert_eq!(gpu.failed, driver, "{gpu:?}");
    assert!(
        gpu.problems.iter().any(|p| p == "nvidia-smi: not on PATH"),
        "{gpu:?}"
    );
    assert!(
        gpu.problems.iter().any(|p| p.starts_with("NVML: ")),
        "{gpu:?}"
    );

    let e = lease_error(&mut agent, 2, 1, 0);
    assert_eq!(e.0, ErrorKind::Unavailable);
    if !driver {
        assert_eq!(e.1, "no NVIDIA GPU on this host");
    }
}

fn lease(agent: &mut Agent, id: u64, count: u32, min_free_mib: u64) -> Response {
    agent.call(
        id,
        Request::GpuLease(GpuLeaseRequest {
            count,
            min_free_mem_bytes: min_free_mib * MIB,
        }),
    )
}

fn lease_ok(agent: &mut Agent, id: u64, count: u32, min_free_mib: u64) -> GpuLease {
    match lease(agent, id, count, min_free_mib) {
        Response::GpuLease(l) => l,
        other => panic!("expected a lease, got {other:?}"),
    }
}

fn lease_error(agent: &mut Agent, id: u64, count: u32, min_free_mib: u64) -> (ErrorKind, String) {
    match lease(agent, id, count, min_free_mib) {
        Response::Error(e) => (e.kind, e.message),
        other => panic!("expected an error, got {other:?}"),
    }
}

fn release(agent: &mut Agent, id: u64, lease_id: &str) -> Response {
    agent.call(
        id,
        Request::GpuRelease {
            lease_id: lease_id.into(),
        },
    )
}

fn leases_of(m: &HostMetrics) -> Vec<Option<String>> {
    m.gpu.gpus.iter().map(|g| g.lease.clone()).collect()
}

#[test]
fn leases_are_shared_by_agents_and_end_with_their_holder() {
    let host = Host::new("leases");
    let mut a = host.agent(fake_nvml());
    let mut b = host.agent(fake_nvml());

    // GPU 1 is the less used one.
    let la = lease_ok(&mut a, 1, 1, 0);
    assert_eq!(
        (la.indices.as_slice(), la.uuids.as_slice()),
        (&[1][..], &[UUID1.to_string()][..])
    );
    assert!(
        la.lease_id.starts_with(&format!("gl-{}-", a.child.id())),
        "{la:?}"
    );
    assert_eq!(leases_of(&b.metrics(2)), [None, Some(la.lease_id.clone())]);

    let (kind, message) = lease_error(&mut b, 3, 2, 0);
    assert_eq!(kind, ErrorKind::Unavailable);
    assert!(message.contains("1 qualifies"), "{message}");
    assert!(
        message.contains(&format!("GPU 1 is leased by {}", la.lease_id)),
        "{message}"
    );

    // GPU 0 has 11920 MiB free.
    let (kind, message) = lease_error(&mut b, 4, 1, 20 * 1024);
    assert_eq!(kind, ErrorKind::Unavailable);
    assert!(
        message.contains("GPU 0 has only 11920 MiB free (need 20480 MiB)"),
        "{message}"
    );
    let lb = lease_ok(&mut b, 5, 1, 10 * 1024);
    assert_eq!(lb.indices, [0]);
    assert_eq!(
        leases_of(&a.metrics(6)),
        [Some(lb.lease_id.clone()), Some(la.lease_id.clone())]
    );

    assert_eq!(release(&mut b, 7, &lb.lease_id), Response::Released);
    match release(&mut b, 8, &lb.lease_id) {
        Response::Error(e) => {
            assert_eq!(e.kind, ErrorKind::BadRequest);
            assert!(e.message.starts_with("no such lease"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(lease_error(&mut b, 9, 0, 0).0, ErrorKind::BadRequest);

    // A holder killed outright loses its lease all the same.
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let both = lease_ok(&mut b, 10, 2, 0);
    assert_eq!(both.indices, [0, 1]);
    assert_eq!(both.uuids, [UUID0, UUID1]);

    // A holder that ends normally removes its lease files.
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let dir = host.lease_dir();
    assert!(host.lease_files().contains(&both.lease_id));
    assert_eq!(mode(&dir), 0o1777);
    assert_eq!(mode(&dir.join(format!("{}.lease", both.lease_id))), 0o644);
    b.close_stdin();
    assert_eq!(b.wait_exit(Duration::from_secs(5)), Some(0));
    assert!(host.lease_files().is_empty(), "{:?}", host.lease_files());
}

#[test]
fn leases_are_host_wide_across_installs() {
    // A custom remote dir has its own state dir, but not its own GPUs.
    let host = Host::new("lease-installs");
    let install = host.root.path().join("custom/agents/v1");
    std::fs::create_dir_all(&install).unwrap();
    let exe = install.join("outpost-agent");
    std::fs::copy(BIN, &exe).unwrap();
    let mut custom = Agent::start_with(&mut host.command(&exe, fake_nvml()));
    let mut usual = host.agent(fake_nvml());
    let l = lease_ok(&mut custom, 1, 1, 0);
    assert_eq!(host.lease_files(), std::slice::from_ref(&l.lease_id));
    let (kind, message) = lease_error(&mut usual, 2, 2, 0);
    assert_eq!(kind, ErrorKind::Unavailable);
    assert!(
        message.contains(&format!("GPU 1 is leased by {}", l.lease_id)),
        "{message}"
    );
    assert_eq!(
        leases_of(&usual.metrics(3)),
        [None, Some(l.lease_id.clone())]
    );
    // Another agent of the same user may end it, as before.
    assert_eq!(release(&mut usual, 4, &l.lease_id), Response::Released);
    assert!(host.lease_files().is_empty());
}

/// CPU time and memory of a sampling agent, for people tuning the sampler:
/// `cargo test -p outpost-agent --test gpu -- --ignored --nocapture`.
#[test]
#[ignore = "measurement, takes 30 s"]
fn sampler_cost() {
    let host = Host::new("cost");
    let mut agent = host.agent(fake_nvml());
    agent.metrics(1);
    std::thread::sleep(Duration::from_secs(2));
    let pid = agent.child.id();
    let cpu_ticks = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<u64> = rest
            .split_whitespace()
            .skip(11)
            .take(2)
            .map(|v| v.parse().unwrap())
            .collect();
        fields[0] + fields[1]
    };
    let (ticks, started) = (cpu_ticks(), Instant::now());
    std::thread::sleep(Duration::from_secs(30));
    let used = (cpu_ticks() - ticks) as f64 / 100.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "sampler: {:.3}% of one core ({used:.2} s CPU in {secs:.0} s), {rss}",
        used / secs * 100.0
    );
}

/// The account the multi-user tests run a second agent as.
const OTHER_USER: &str = "outpost-test";

/// (uid, gid) of `user` from /etc/passwd, when this test runs as root and
/// can act as it; else None, and the caller says why it skips.
fn other_user(user: &str) -> Option<(u32, u32)> {
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() >= 4 && f[0] == user).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    })
}

fn chown(path: &Path, (uid, gid): (u32, u32)) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
}

#[test]
fn two_users_share_one_table() {
    use std::os::unix::process::CommandExt;
    let Some(other) = other_user(OTHER_USER) else {
        skip(&format!("needs root and the user {OTHER_USER}"));
        return;
    };
    let host = Host::new("lease-users");
    let other_home = host.root.path().join("other-home");
    std::fs::create_dir_all(&other_home).unwrap();
    chown(&other_home, other);
    let other_agent = || {
        let mut cmd = host.command(Path::new(BIN), fake_nvml());
        cmd.env("HOME", &other_home).uid(other.0).gid(other.1);
        Agent::start_with(&mut cmd)
    };

    // Root leases first and so creates the table, owned by root.
    let mut root = host.agent(fake_nvml());
    let mut user = other_agent();
    let lr = lease_ok(&mut root, 1, 1, 0);
    assert_eq!(lr.indices, [1]);
    let (kind, message) = lease_error(&mut user, 2, 2, 0);
    assert_eq!(kind, ErrorKind::Unavailable);
    assert!(
        message.contains(&format!("GPU 1 is leased by {}", lr.lease_id)),
        "{message}"
    );
    let lu = lease_ok(&mut user, 3, 1, 0);
    assert_eq!(lu.indices, [0]);
    assert_eq!(
        leases_of(&root.metrics(4)),
        [Some(lu.lease_id.clone()), Some(lr.lease_id.clone())]
    );
    // Nobody ends another user's lease.
    match release(&mut user, 5, &lr.lease_id) {
        Response::Error(e) => assert!(e.message.contains("another user"), "{}", e.message),
        other => panic!("{other:?}"),
    }

    // Root's agent is killed outright: its file stays (the other user
    // cannot remove it from the sticky table), but it holds nothing.
    root.child.kill().unwrap();
    root.child.wait().unwrap();
    let again = lease_ok(&mut user, 6, 1, 0);
    assert_eq!(again.indices, [1]);
    assert!(host.lease_files().contains(&lr.lease_id));

    // A forged lease: a file of the other user naming init as its holder
    // holds nothing, since init does not run as that user.
    assert_eq!(release(&mut user, 7, &again.lease_id), Response::Released);
    let init_start = std::fs::read_to_string("/proc/1/stat").unwrap();
    let init_start: u64 = init_start[init_start.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let forged = host.lease_dir().join("gl-1-1-1.lease");
    std::fs::write(
        &forged,
        format!(
            r#"{{"id":"gl-1-1-1","indices":[1],"uuids":["{UUID1}"],"holder_pid":1,"holder_start_time":{init_start},"holder_boot_id":"{}","created_unix":0}}"#,
            boot.trim()
        ),
    )
    .unwrap();
    chown(&forged, other);
    let mut root = host.agent(fake_nvml());
    assert_eq!(
        leases_of(&root.metrics(8)),
        [Some(lu.lease_id.clone()), None]
    );
    assert_eq!(lease_ok(&mut root, 9, 1, 0).indices, [1]);
}

#[test]
fn a_table_others_could_tamper_with_is_refused() {
    let host = Host::new("lease-refused");
    let dir = host.lease_dir();
    let refused_to = |uid_gid: Option<(u32, u32)>, why: &str| {
        let mut cmd = host.command(Path::new(BIN), fake_nvml());
        if let Some((uid, gid)) = uid_gid {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(gid);
        }
        let mut agent = Agent::start_with(&mut cmd);
        let (kind, message) = lease_error(&mut agent, 1, 1, 0);
        assert_eq!(kind, ErrorKind::Unavailable, "{message}");
        assert!(
            message.contains("is not used") && message.contains(why),
            "{message}"
        );
        assert_eq!(leases_of(&agent.metrics(2)), [None, None]);
    };
    let refused = |why: &str| refused_to(None, why);

    // A symlink to a perfectly good table.
    let real = host.root.path().join("real-table");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o1777)).unwrap();
    symlink(&real, &dir).unwrap();
    refused("symbolic link");
    std::fs::remove_file(&dir).unwrap();

    if let Some(other) = other_user(OTHER_USER) {
        // Another user made it first, 1777 or not.
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        chown(&dir, other);
        refused(&format!("belongs to uid {}", other.0));
        // Root's, but not sticky: anyone could remove anyone's lease (root
        // itself would just fix its own directory).
        chown(&dir, (0, 0));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        refused_to(Some(other), "not 1777");
        // An administrator fixes it; nothing else needed.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let mut agent = host.agent(fake_nvml());
        lease_ok(&mut agent, 1, 1, 0);
    } else {
        skip(&format!(
            "the other-user cases need root and the user {OTHER_USER}"
        ));
    }
}

/// A sandbox's `gpus` are leased for its life (by its keeper, so they
/// stay leased with no connection), given to its commands, and released
/// when it ends; more than the host has is refused and makes nothing.
#[test]
fn a_sandbox_holds_its_gpus_for_its_life() {
    use outpost_protocol::{ExecRequest, Isolation, SandboxSpec};
    let host = Host::new("gpu-sandbox");
    let mut agent = host.agent(fake_nvml());
    let spec = |gpus| SandboxSpec {
        ttl_ms: 120_000,
        isolation: Isolation::None,
        network: true,
        gpus,
        ..SandboxSpec::default()
    };
    match agent.call(1, Request::SandboxCreate(spec(3))) {
        Response::Error(e) => assert!(e.message.contains("GPU"), "{}", e.message),
        other => panic!("3 of 2 GPUs: {other:?}"),
    }
    assert!(host.lease_files().is_empty());
    // A leased GPU whose device node is missing is refused, and its lease
    // given back.
    match agent.call(5, Request::SandboxCreate(spec(1))) {
        Response::Error(e) => assert!(e.message.contains("no device node"), "{}", e.message),
        other => panic!("a GPU without a node: {other:?}"),
    }
    assert!(host.lease_files().is_empty());
    if !host.device_nodes() {
        return;
    }
    let info = match agent.call(2, Request::SandboxCreate(spec(1))) {
        Response::Sandbox(info) => info,
        other => panic!("{other:?}"),
    };
    assert_eq!(info.gpus.len(), 1, "{info:?}");
    assert_eq!(host.lease_files().len(), 1);
    let exec = ExecRequest {
        command: "echo $CUDA_VISIBLE_DEVICES".into(),
        cwd: None,
        env: vec![],
        stdin: None,
        timeout_ms: Some(10_000),
        output_limit: 1000,
        stream: false,
        progress_ms: None,
        hand_over: None,
    };
    let inside = Request::InSandbox {
        id: info.id.clone(),
        request: Box::new(Request::Exec(exec)),
    };
    let Response::ExecDone(r) = agent.call(3, inside) else {
        panic!("exec failed");
    };
    let visible = String::from_utf8_lossy(&r.stdout.head).trim().to_string();
    assert!(visible == UUID0 || visible == UUID1, "{visible:?}");
    // The lease outlives this connection: the keeper holds it.
    agent.close_stdin();
    agent.wait_exit(Duration::from_secs(5));
    let mut agent = host.agent(fake_nvml());
    assert_eq!(host.lease_files().len(), 1);
    let Response::Sandbox(gone) = agent.call(4, Request::SandboxDelete { id: info.id }) else {
        panic!("delete failed");
    };
    assert_eq!(gone.state, outpost_protocol::SandboxState::Deleted);
    assert!(host.lease_files().is_empty(), "{:?}", host.lease_files());
}

/// Under bwrap, as an unprivileged account: `gpus: 1` of 2 sees exactly its
/// GPU's device node (the one with the minor the driver gave it) beside the
/// shared ones; a sandbox without GPUs sees none.
#[test]
fn a_bwrap_sandbox_sees_exactly_its_leased_gpu() {
    use outpost_protocol::{ExecRequest, Isolation, SandboxSpec};
    use std::os::unix::process::CommandExt;
    let Some(user) = other_user(OTHER_USER) else {
        skip(&format!("needs root and the user {OTHER_USER}"));
        return;
    };
    let host = Host::new("gpu-bwrap");
    if !host.device_nodes() {
        return;
    }
    let leases = host.lease_dir();
    std::fs::create_dir_all(&leases).unwrap();
    std::fs::set_permissions(&leases, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let home = host.root.path().join("user-home");
    std::fs::create_dir_all(&home).unwrap();
    chown(&home, user);
    let mut cmd = host.command(Path::new(BIN), fake_nvml());
    cmd.env("HOME", &home).uid(user.0).gid(user.1);
    let mut agent = Agent::start_with(&mut cmd);
    let mut id = 0;
    for gpus in [1, 0] {
        id += 1;
        let spec = SandboxSpec {
            ttl_ms: 120_000,
            isolation: Isolation::Bwrap,
            network: false,
            gpus,
            ..SandboxSpec::default()
        };
        let info = match agent.call(id, Request::SandboxCreate(spec)) {
            Response::Sandbox(info) => info,
            other => panic!("gpus {gpus}: {other:?}"),
        };
        let exec = ExecRequest {
            command: "shopt -s nullglob; set -- /dev/nvidia*; echo \"${@#/dev/}\"; \
                      echo $CUDA_VISIBLE_DEVICES"
                .into(),
            cwd: None,
            env: vec![],
            stdin: None,
            timeout_ms: Some(10_000),
            output_limit: 1000,
            stream: false,
            progress_ms: None,
            hand_over: None,
        };
        id += 1;
        let inside = Request::InSandbox {
            id: info.id.clone(),
            request: Box::new(Request::Exec(exec)),
        };
        let Response::ExecDone(r) = agent.call(id, inside) else {
            panic!("exec failed");
        };
        let out = String::from_utf8_lossy(&r.stdout.head).to_string();
        let (nodes, visible) = out.split_once('\n').unwrap_or_default();
        let expected = match visible.trim() {
            // The driver numbered them the other way round.
            UUID0 => "nvidia1 nvidiactl",
            UUID1 => "nvidia0 nvidiactl",
            _ => "",
        };
        assert_eq!(nodes, expected, "gpus {gpus}: {out:?} {r:?}");
        id += 1;
        let Response::Sandbox(_) = agent.call(id, Request::SandboxDelete { id: info.id }) else {
            panic!("delete failed");
        };
    }
}
