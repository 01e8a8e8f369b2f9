//! A fleet of 64 hosts: cold connect, warm check_resources, controller memory
//! and CPU per host, and the cost of a frozen host.

use std::path::Path;
use std::time::{Duration, Instant};

use outpost_e2e::{Sshd, TempDir, pids_with_cmdline, pids_with_env};

use crate::{
    check_resources, cpu_time, list_resources, mcp_client, ms, rss_kb, status_kb, write_config,
};

/// Pid of the `outpost mcp` started with `config` (its `OUTPOST_CONFIG` is
/// unique to it).
fn controller_pid(config: &Path) -> i32 {
    let entry = format!("OUTPOST_CONFIG={}", config.display());
    pids_with_env(&entry)
        .into_iter()
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "outpost")
        })
        .expect("outpost mcp pid")
}

/// CPU time of a process's live threads, in nanoseconds (/proc/<pid>/stat
/// counts 10 ms ticks, too coarse for a process busy for a millisecond).
fn cpu_time_ns(pid: i32) -> Duration {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Duration::ZERO;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map(Duration::from_nanos)
        .sum()
}

/// Total CPU time of `pids`.
fn cpu_sum(pids: &[i32]) -> Duration {
    pids.iter().map(|&p| cpu_time_ns(p)).sum()
}

/// Agents and per-connection sshd processes of `hosts`, as they stand now.
fn remote_pids(hosts: &[Sshd]) -> (Vec<i32>, Vec<i32>) {
    let mut agents = Vec::new();
    let mut sshd = Vec::new();
    for host in hosts {
        agents.extend(pids_with_cmdline(&format!(
            "{}/agents/",
            host.remote_dir().display()
        )));
        sshd.extend(host.connection_pids());
    }
    (agents, sshd)
}

fn signal(pids: &[i32], sig: libc::c_int) {
    for &pid in pids.iter().filter(|&&p| p > 1) {
        // SAFETY: kill has no memory preconditions; pids are our own sshd's.
        unsafe { libc::kill(pid, sig) };
    }
}

/// A fleet of 64 hosts, each a private sshd on 127.0.0.1: cold connect of
/// all (agent upload, then agent installed), warm check_resources against
/// one host, controller memory per host, CPU per host answer, and a frozen
/// host's cost.
pub(crate) async fn fleet() {
    const HOSTS: usize = 64;
    const WARM_ROUNDS: usize = 20;
    const IDLE_WINDOW: Duration = Duration::from_secs(5);

    let t = Instant::now();
    let hosts: Vec<Sshd> = (0..HOSTS).map(|_| Sshd::start()).collect();
    let sshd_start = t.elapsed();
    let refs: Vec<&Sshd> = hosts.iter().collect();
    let scratch = TempDir::new("bench-fleet");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let alive = |rows: &[serde_json::Value]| {
        rows.iter()
            .filter(|r| r["connection_alive"] == true)
            .count()
    };

    // Cold, fresh HOME: every host gets the agent uploaded.
    let upload_config = write_config(scratch.path(), "upload", &refs);
    let client = mcp_client(&home, Some(&upload_config)).await;
    let upload_pid = controller_pid(&upload_config);
    let upload_cpu = cpu_time(upload_pid);
    let (cold_upload, rows) = list_resources(&client).await;
    assert_eq!((rows.len(), alive(&rows)), (HOSTS, HOSTS), "{rows:?}");
    let upload_cpu = cpu_time(upload_pid).saturating_sub(upload_cpu);
    let upload_peak = status_kb(upload_pid, "VmHWM:");
    client.cancel().await.ok();

    // A second controller, same HOME: the agents are installed.
    let config = write_config(scratch.path(), "fleet", &refs);
    let client = mcp_client(&home, Some(&config)).await;
    let pid = controller_pid(&config);
    let rss_before = rss_kb(pid);
    let installed_cpu = cpu_time(pid);
    let (cold_installed, rows) = list_resources(&client).await;
    assert_eq!((rows.len(), alive(&rows)), (HOSTS, HOSTS), "{rows:?}");
    let installed_cpu = cpu_time(pid).saturating_sub(installed_cpu);

    // Warm: 64 hosts, then one host on a controller of its own.
    let fleet_warm = check_resources(&client, HOSTS, WARM_ROUNDS).await;
    let one_config = write_config(scratch.path(), "one", &refs[..1]);
    let one_client = mcp_client(&home, Some(&one_config)).await;
    let one_warm = check_resources(&one_client, 1, WARM_ROUNDS).await;
    let one_rss = rss_kb(controller_pid(&one_config));
    one_client.cancel().await.ok();
    let rss_after = rss_kb(pid);

    // CPU: the controller, the agents and sshd's connection processes, over
    // warm rounds, then idle with all hosts connected.
    let (agents, conns) = remote_pids(&hosts);
    let cpu = || (cpu_time_ns(pid), cpu_sum(&agents), cpu_sum(&conns));
    let before = cpu();
    let t = Instant::now();
    for _ in 0..WARM_ROUNDS {
        let (_, rows) = list_resources(&client).await;
        assert_eq!(alive(&rows), HOSTS, "{rows:?}");
    }
    let rounds_took = t.elapsed();
    let after = cpu();
    tokio::time::sleep(IDLE_WINDOW).await;
    let idle = cpu();
    let answers = (WARM_ROUNDS * HOSTS) as f64;
    let per_answer = |a: Duration, b: Duration| a.saturating_sub(b).as_secs_f64() * 1e3 / answers;
    let idle_pct = |a: Duration, b: Duration| {
        a.saturating_sub(b).as_secs_f64() * 100.0 / IDLE_WINDOW.as_secs_f64()
    };

    // A frozen host (listener and connections stopped): on the warm
    // controller, then on a cold one.
    let frozen = &hosts[HOSTS - 1];
    let mut stopped = vec![frozen.listener_pid()];
    signal(&stopped, libc::SIGSTOP);
    stopped.extend(frozen.stop_connections());
    let (dead_warm, rows) = list_resources(&client).await;
    assert_eq!((rows.len(), alive(&rows)), (HOSTS, HOSTS - 1), "{rows:?}");
    let dead_warm_error = rows
        .iter()
        .find_map(|r| r["connection_error"].as_str().map(str::to_string))
        .unwrap_or_default();
    let cold_config = write_config(scratch.path(), "frozen", &refs);
    let cold_client = mcp_client(&home, Some(&cold_config)).await;
    let (dead_cold, rows) = list_resources(&cold_client).await;
    assert_eq!((rows.len(), alive(&rows)), (HOSTS, HOSTS - 1), "{rows:?}");
    cold_client.cancel().await.ok();
    frozen.continue_pids(&stopped);
    // Thawed, the host answers again.
    check_resources(&client, HOSTS, 1).await;
    client.cancel().await.ok();

    let per_host_kib = rss_after.saturating_sub(rss_before) as f64 / HOSTS as f64;
    println!(
        "fleet: {HOSTS} private sshd on 127.0.0.1 (started in {:.1} s)",
        sshd_start.as_secs_f64()
    );
    println!(
        "  cold connect, agent uploaded     {}  (controller CPU {}, peak RSS {upload_peak} KiB)",
        ms(cold_upload),
        ms(upload_cpu)
    );
    println!(
        "  cold connect, agent installed    {}  (controller CPU {})",
        ms(cold_installed),
        ms(installed_cpu)
    );
    println!("list_sandboxes(check_resources=true), warm ({WARM_ROUNDS} calls)");
    println!("  1 host     median {}", ms(one_warm));
    println!("  {HOSTS} hosts   median {}", ms(fleet_warm));
    println!(
        "  ratio {HOSTS}/1 {:.2}x",
        fleet_warm.as_secs_f64() / one_warm.as_secs_f64()
    );
    println!("controller RSS");
    println!(
        "  before connecting {rss_before} KiB, {HOSTS} connected {rss_after} KiB: {per_host_kib:.0} KiB per host (1-host controller {one_rss} KiB)"
    );
    println!(
        "CPU per host answer ({WARM_ROUNDS} rounds x {HOSTS}, {} per round)",
        ms(rounds_took / WARM_ROUNDS as u32)
    );
    println!(
        "  controller           {:.3} ms",
        per_answer(after.0, before.0)
    );
    println!(
        "  agents ({:>3} procs)   {:.3} ms",
        agents.len(),
        per_answer(after.1, before.1)
    );
    println!(
        "  sshd ({:>3} procs)     {:.3} ms",
        conns.len(),
        per_answer(after.2, before.2)
    );
    println!("idle, {HOSTS} connected ({} s)", IDLE_WINDOW.as_secs());
    println!(
        "  controller {:.1}% of a CPU, agents {:.1}%, sshd {:.1}%",
        idle_pct(idle.0, after.0),
        idle_pct(idle.1, after.1),
        idle_pct(idle.2, after.2)
    );
    println!("one host frozen (listener and connections stopped)");
    println!("  warm controller  {}  ({dead_warm_error})", ms(dead_warm));
    println!("  cold controller  {}", ms(dead_cold));
    println!();
}
