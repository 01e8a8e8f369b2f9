//! The basic costs: exec_bash('true') and 5 MiB of output vs a ControlMaster ssh,
//! first connect and agent upload, the agent's size and RSS, check_resources;
//! and long calls: progress tokens, jobs vs inline, Streamable HTTP vs stdio.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use outpost_e2e::{McpHttp, Sshd, TempDir, pids_with_cmdline, target_bin};
use serde_json::json;

use crate::{
    EXEC_ROUNDS, check_resources, cpu_time, exec_bash, mcp_client, median, ms, pct, rss_kb,
    ssh_base, write_config,
};

const BIG_ROUNDS: usize = 10;
const BIG_COMMAND: &str = "head -c 5242880 /dev/zero | tr '\\0' a";

pub(crate) async fn exec_and_metrics() {
    let sshd = Sshd::start();
    let scratch = TempDir::new("bench");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let config = write_config(scratch.path(), "bench", &[&sshd]);

    // First connect: MCP handshake, SSH, probe, upload, agent start, one exec.
    let started = Instant::now();
    let client = mcp_client(&home, Some(&config)).await;
    let handshake = started.elapsed();
    exec_bash(&client, "true").await;
    let first_connect = started.elapsed();
    client.cancel().await.ok();

    // A second controller reuses the installed agent.
    let started = Instant::now();
    let client = mcp_client(&home, Some(&config)).await;
    exec_bash(&client, "true").await;
    let second_connect = started.elapsed();

    let mut outpost_true = Vec::with_capacity(EXEC_ROUNDS);
    for _ in 0..EXEC_ROUNDS {
        let t = Instant::now();
        let r = exec_bash(&client, "true").await;
        outpost_true.push(t.elapsed());
        assert_eq!(r["exit_code"], 0);
    }
    let mut outpost_big = Vec::with_capacity(BIG_ROUNDS);
    for _ in 0..BIG_ROUNDS {
        let t = Instant::now();
        let r = exec_bash(&client, BIG_COMMAND).await;
        outpost_big.push(t.elapsed());
        assert!(r["stdout"].as_str().unwrap().contains("bytes omitted"));
    }
    let agent_pids = pids_with_cmdline(&format!("{}/agents/", sshd.remote_dir().display()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let agent_rss: Vec<u64> = agent_pids.iter().map(|&p| rss_kb(p)).collect();

    // Metrics: one host, then sixteen, each on a warm client; then the agent's
    // cost while its sampler runs.
    let one_host = check_resources(&client, 1, 50).await;
    let sampled_pid = agent_pids.first().copied().unwrap_or(0);
    let cpu_before = cpu_time(sampled_pid);
    let window = Duration::from_secs(10);
    tokio::time::sleep(window).await;
    let sampler_cpu = cpu_time(sampled_pid).saturating_sub(cpu_before);
    let sampler_rss = rss_kb(sampled_pid);
    let many: Vec<Sshd> = (0..16).map(|_| Sshd::start()).collect();
    let many_refs: Vec<&Sshd> = many.iter().collect();
    let many_config = write_config(scratch.path(), "many", &many_refs);
    let many_client = mcp_client(&home, Some(&many_config)).await;
    let sixteen_hosts = check_resources(&many_client, 16, 20).await;
    many_client.cancel().await.ok();

    // OpenSSH with a warm ControlMaster connection.
    let control = scratch.path().join("cm.sock");
    let master = ssh_base(&sshd, &control)
        .args(["-o", "ControlMaster=yes", "-N"])
        .spawn()
        .expect("ssh master");
    let ready = outpost_e2e::wait_until(Duration::from_secs(10), || control.exists());
    assert!(ready, "ControlMaster socket never appeared");
    let mut ssh_true = Vec::with_capacity(EXEC_ROUNDS);
    for _ in 0..EXEC_ROUNDS {
        let t = Instant::now();
        let status = ssh_base(&sshd, &control).arg("true").status().unwrap();
        ssh_true.push(t.elapsed());
        assert!(status.success());
    }
    let mut ssh_big = Vec::with_capacity(BIG_ROUNDS);
    for _ in 0..BIG_ROUNDS {
        let t = Instant::now();
        let status = ssh_base(&sshd, &control)
            .arg(BIG_COMMAND)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        ssh_big.push(t.elapsed());
        assert!(status.success());
    }
    let mut master = master;
    let _ = master.kill();
    let _ = master.wait();
    client.cancel().await.ok();

    let agent_bin = target_bin("outpost-agent");
    let agent_size = std::fs::metadata(&agent_bin).map(|m| m.len()).unwrap_or(0);
    let outpost_bin = target_bin("outpost");
    let release = outpost_bin.to_string_lossy().contains("/release/");

    let (ot, st) = (median(outpost_true.clone()), median(ssh_true.clone()));
    let (ob, sb) = (median(outpost_big), median(ssh_big));
    println!(
        "outpost-bench: {} build, private sshd on 127.0.0.1",
        if release {
            "release"
        } else {
            "DEBUG (use scripts/bench for real figures)"
        }
    );
    println!();
    println!("exec 'true' ({EXEC_ROUNDS} calls)");
    println!(
        "  outpost mcp exec_bash      median {}  p90 {}",
        ms(ot),
        ms(pct(outpost_true, 0.9))
    );
    println!(
        "  ssh ControlMaster          median {}  p90 {}",
        ms(st),
        ms(pct(ssh_true, 0.9))
    );
    println!(
        "  ratio outpost/ssh          {:.2}x",
        ot.as_secs_f64() / st.as_secs_f64()
    );
    println!();
    println!("5 MiB of output ({BIG_ROUNDS} calls)");
    println!("  outpost exec_bash (capped) median {}", ms(ob));
    println!("  ssh ControlMaster >/dev/null median {}", ms(sb));
    println!(
        "  ratio outpost/ssh          {:.2}x",
        ob.as_secs_f64() / sb.as_secs_f64()
    );
    println!();
    println!("connect");
    println!(
        "  first (MCP start + SSH + probe + upload + exec)  {}",
        ms(first_connect)
    );
    println!(
        "    of which the MCP handshake                   {}",
        ms(handshake)
    );
    println!(
        "  second controller (agent reused)                {}",
        ms(second_connect)
    );
    println!();
    println!("list_sandboxes(check_resources=true), warm");
    println!("  1 host     median {}", ms(one_host));
    println!("  16 hosts   median {}", ms(sixteen_hosts));
    println!(
        "  ratio 16/1 {:.2}x (one host after another would be 16x: {})",
        sixteen_hosts.as_secs_f64() / one_host.as_secs_f64(),
        ms(one_host * 16)
    );
    println!();
    println!("agent");
    println!(
        "  while sampling: {:.2}% of one CPU over {} s, RSS {} KiB",
        sampler_cpu.as_secs_f64() * 100.0 / window.as_secs_f64(),
        window.as_secs(),
        sampler_rss
    );
    println!(
        "  binary size  {:.1} MiB ({})",
        agent_size as f64 / 1048576.0,
        agent_bin.display()
    );
    println!(
        "  idle RSS     {} KiB (pids {:?})",
        agent_rss.iter().max().copied().unwrap_or(0),
        agent_pids
    );
}

/// exec_bash('true') on the local sandbox: with and without a progress token,
/// and run as a job (the default 120 s timeout outlasts an unknown client's
/// 45 s budget) — in turn, on one raw stdio connection, since rmcp's client
/// always sends a token — then rmcp's clients over Streamable HTTP and stdio.
pub(crate) async fn long_calls() {
    use std::io::{BufRead, BufReader, Write};
    const ROUNDS: usize = 400;
    let sshd = Sshd::start();
    let home = TempDir::new("bench-calls");
    let config = home.path().join("config.toml");
    std::fs::write(&config, sshd.sandbox_toml("box")).unwrap();
    // A client named claude-code has no call budget: every exec runs inline.
    // Any other name has one, so its execs are armed to be handed over as
    // jobs at the budget, and `timeout_s: 30` (under every budget) is not.
    let mut medians = std::collections::HashMap::new();
    for client in ["claude-code", "codex-mcp-client"] {
        let mut server = Command::new(target_bin("outpost"))
            .arg("mcp")
            .env_clear()
            .env("HOME", home.path())
            .env("OUTPOST_CONFIG", &config)
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn outpost mcp");
        let mut to = server.stdin.take().unwrap();
        let mut from = BufReader::new(server.stdout.take().unwrap());
        let mut ask = |id: usize, msg: serde_json::Value| {
            writeln!(to, "{msg}").unwrap();
            to.flush().unwrap();
            let mut line = String::new();
            loop {
                line.clear();
                from.read_line(&mut line).unwrap();
                let answer: serde_json::Value = serde_json::from_str(&line).unwrap();
                if answer["id"] == id {
                    return answer;
                }
            }
        };
        ask(
            0,
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": client, "version": "1"}}}),
        );
        let mut id = 0;
        for sandbox in ["local", "box"] {
            let (mut with, mut without, mut fits) = (Vec::new(), Vec::new(), Vec::new());
            for round in 0..3 * ROUNDS {
                id += 1;
                let mut arguments = json!({"command": "true", "sandbox_name": sandbox});
                let mut params = json!({"name": "exec_bash"});
                match round % 3 {
                    0 => params["_meta"] = json!({"progressToken": id}),
                    1 => arguments["timeout_s"] = json!(30),
                    _ => {}
                }
                params["arguments"] = arguments;
                let t = Instant::now();
                let answer = ask(
                    id,
                    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}),
                );
                let took = t.elapsed();
                assert_eq!(
                    answer["result"]["structuredContent"]["exit_code"], 0,
                    "{answer}"
                );
                if round >= 60 {
                    match round % 3 {
                        0 => &mut with,
                        1 => &mut fits,
                        _ => &mut without,
                    }
                    .push(took);
                }
            }
            medians.insert((client, sandbox, "plain"), median(without));
            medians.insert((client, sandbox, "progress"), median(with));
            medians.insert((client, sandbox, "fits"), median(fits));
        }
        drop(to);
        let _ = server.wait();
    }
    println!();
    println!("long calls: exec_bash('true') by client name ({ROUNDS} calls each, medians)");
    for (sandbox, label) in [("local", "local"), ("box", "over SSH")] {
        let m = |client, kind| medians[&(client, sandbox, kind)];
        let (claude, codex) = (m("claude-code", "plain"), m("codex-mcp-client", "plain"));
        println!(
            "  {label:9} claude-code {}   codex (hand-over armed) {}   ratio {:.2}x",
            ms(claude),
            ms(codex),
            codex.as_secs_f64() / claude.as_secs_f64()
        );
        println!(
            "  {label:9} codex with timeout_s 30 (not armed) {}   ratio armed/not {:.2}x",
            ms(m("codex-mcp-client", "fits")),
            codex.as_secs_f64() / m("codex-mcp-client", "fits").as_secs_f64()
        );
        println!(
            "  {label:9} claude-code with a progressToken {}   ratio with/without {:.2}x",
            ms(m("claude-code", "progress")),
            m("claude-code", "progress").as_secs_f64() / claude.as_secs_f64()
        );
    }

    let stdio = mcp_client(home.path(), None).await;
    let http_server = McpHttp::start();
    let http = http_server.client(()).await;
    // An OAuth access token as the built-in server issues it.
    let (_, access) = http_server.oauth_grant(&format!("http://{}/mcp", http_server.addr));
    let oauth = http_server.client_with_token((), &access).await;
    let (mut over_stdio, mut over_http, mut over_oauth) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        for (client, times) in [
            (&stdio, &mut over_stdio),
            (&http, &mut over_http),
            (&oauth, &mut over_oauth),
        ] {
            let t = Instant::now();
            let r = exec_bash(client, "true").await;
            if round >= 20 {
                times.push(t.elapsed());
            }
            assert_eq!(r["exit_code"], 0);
        }
    }
    stdio.cancel().await.ok();
    http.cancel().await.ok();
    oauth.cancel().await.ok();

    let (h, o, s) = (median(over_http), median(over_oauth), median(over_stdio));
    println!("  Streamable HTTP, token     median {}", ms(h));
    println!("  Streamable HTTP, OAuth     median {}", ms(o));
    println!("  stdio (rmcp)               median {}", ms(s));
    println!(
        "  ratio HTTP/stdio           {:.2}x   OAuth/stdio {:.2}x   OAuth/token {:.2}x",
        h.as_secs_f64() / s.as_secs_f64(),
        o.as_secs_f64() / s.as_secs_f64(),
        o.as_secs_f64() / h.as_secs_f64()
    );
}
