//! Background jobs: start latency, a job's end to wait_background_task
//! returning, and the daemon's idle cost.

use std::time::{Duration, Instant};

use outpost_e2e::{Sshd, TempDir, pids_with_cmdline};
use rmcp::model::CallToolRequestParams;
use serde_json::json;

use crate::{cpu_time, mcp_client, median, ms, rss_kb, write_config};

/// Job start latency, time from a job's end to wait_background_task
/// returning, and the daemon's idle cost.
pub(crate) async fn jobs() {
    let sshd = Sshd::start();
    let scratch = TempDir::new("bench-jobs");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let config = write_config(scratch.path(), "jobs", &[&sshd]);
    let client = mcp_client(&home, Some(&config)).await;
    let call = |tool: &'static str, args: serde_json::Value| {
        let client = &client;
        async move {
            let result = client
                .call_tool(
                    CallToolRequestParams::new(tool)
                        .with_arguments(args.as_object().unwrap().clone()),
                )
                .await
                .expect(tool);
            result.structured_content.expect("structured result")
        }
    };
    // Warm up: connection, agent, daemon.
    call("exec_bash_background", json!({"command": "true"})).await;
    let mut starts = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        call("exec_bash_background", json!({"command": "true"})).await;
        starts.push(t.elapsed());
    }
    let mut noticed = Vec::new();
    for _ in 0..10 {
        let r = call(
            "exec_bash_background",
            json!({"command": "sleep 0.3; date +%s%N"}),
        )
        .await;
        let name = r["tmux_session"].as_str().unwrap().to_string();
        let r = call(
            "wait_background_task",
            json!({"name": name, "timeout_s": 30, "cursor": 0}),
        )
        .await;
        let returned = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i128;
        let ended: i128 = r["output"].as_str().unwrap().trim().parse().unwrap();
        noticed.push(Duration::from_nanos((returned - ended).max(0) as u64));
    }
    let daemon = pids_with_cmdline("outpost-agent daemon")
        .into_iter()
        .find(|&pid| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .is_ok_and(|exe| exe.starts_with(sshd.remote_dir()))
        })
        .unwrap_or(0);
    let before = cpu_time(daemon);
    let window = Duration::from_secs(10);
    tokio::time::sleep(window).await;
    let daemon_cpu = cpu_time(daemon).saturating_sub(before);
    client.cancel().await.ok();

    println!();
    println!("background jobs (through outpost mcp, warm)");
    println!(
        "  start latency (exec_bash_background)   median {}",
        ms(median(starts))
    );
    println!(
        "  job end → wait_background_task returns median {} (remote-sandbox-mcp: 5.7 s by polling)",
        ms(median(noticed))
    );
    println!(
        "  daemon idle: {:.2}% of one CPU over {} s, RSS {} KiB",
        daemon_cpu.as_secs_f64() * 100.0 / window.as_secs_f64(),
        window.as_secs(),
        rss_kb(daemon)
    );
}
