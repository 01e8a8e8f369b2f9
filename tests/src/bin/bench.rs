//! `outpost-bench`: Outpost against OpenSSH on the same private sshd, in one run.
//!
//! Prints medians and ratios; asserts nothing (timings are never test verdicts).
//! Run it from a release build: `scripts/bench`.
//!
//! * exec_bash('true') through `outpost mcp` (a real MCP client over stdio) vs
//!   `ssh -o ControlMaster` `true` on a warm master connection;
//! * 5 MiB of output through exec_bash (20 000 chars come back) vs the same
//!   command over the ControlMaster connection to /dev/null;
//! * first connect including the agent upload, and a second controller reusing it;
//! * the agent's binary size and idle RSS;
//! * check_resources on one and sixteen hosts;
//! * a fleet of 64 hosts (`outpost-bench fleet`): cold connect of all, with
//!   the agent uploaded and with it installed; warm check_resources on 64
//!   vs one host; controller RSS per connected host; CPU per host answer
//!   (controller, agents, sshd); the cost of one frozen host, warm and cold.
//! * tree sync (`outpost sync`, cold: connect included) vs rsync over the same
//!   sshd: remote-sandbox-mcp's scenario of 2,000 files of 1–8 KB plus 5 × 20 MB:
//!   fresh push, re-push after 10 changed and 100 touched files, no-op push,
//!   fresh pull, and the bytes sent for a 4 KiB edit in a 20 MB file; fresh
//!   transfers also against the local floor (`cp -a` + `sync -f` of the tree
//!   within the same filesystem).
//!
//! * background jobs: start latency, a job's end to wait_background_task
//!   returning, the daemon's idle cost.
//!
//! * long calls, on the local sandbox: exec_bash('true') with a progress
//!   token vs without one (the cost of progress notifications), run as a job
//!   (its timeout outlasts the client's budget) vs inline, and over
//!   Streamable HTTP vs stdio.
//!
//! * isolated sandboxes over the private sshd (unprivileged bubblewrap):
//!   create_sandbox to the first exec_bash result, and exec_bash('true')
//!   inside a bwrap sandbox (and a Landlock one) vs on the host itself, and
//!   vs a new bwrap per command.
//!
//! * code contexts over the private sshd: execute_code('1+1') warm vs
//!   exec_bash('python3 -c …'), the first run of a context (worker start
//!   included), a bash context, and the worker's RSS.
//!
//! * a Slurm cluster (a private single-node Slurm, its login node over the
//!   private sshd): create_sandbox to the first exec_bash result on the
//!   idle cluster, and exec_bash('true') in the allocation (the agent an
//!   `srun --overlap` step) vs on the login node over plain SSH, vs a new
//!   `srun --overlap` per command.
//!
//! * Slurm batch jobs as background tasks (the `local` sandbox a login node
//!   of a private single-node Slurm): 100 trivial `scheduler="slurm"` jobs
//!   submitted, then ONE `list_background_tasks` call reporting all 100
//!   (one command on the login node), vs one job's `check_background_task`.
//!
//! * warm sync (`outpost-bench sync-warm`): the MCP
//!   server connected and rsync over a ControlMaster, the same tree:
//!   re-push, no-op push, no-op pull, and a re-push while another program's
//!   256 MiB wait to be written back.
//!
//! * fan-out (`outpost-bench fanout`): the same tree pushed fresh to 8
//!   hosts at once (`outpost sync SRC h0,…,h7:PATH`) vs to one, and rsync
//!   to one and to 8 in a loop: wall time, controller CPU, machine CPU.
//!
//! * one 1 GiB file (`outpost-bench big-file`): `outpost sync` vs the raw
//!   SSH channel (`cat > file` over a ControlMaster connection).
//!
//! `outpost-bench fleet`, `outpost-bench sync`, `outpost-bench jobs`,
//! `outpost-bench calls`, `outpost-bench sandboxes`, `outpost-bench code`,
//! `outpost-bench slurm` or
//! `outpost-bench slurm-batch` runs only that part.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use outpost_e2e::{
    McpHttp, Slurm, Sshd, TempDir, noise, pids_with_cmdline, pids_with_env, target_bin,
};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use serde_json::json;

type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

const EXEC_ROUNDS: usize = 200;
const BIG_ROUNDS: usize = 10;
const FRESH_ROUNDS: usize = 3;
const BIG_COMMAND: &str = "head -c 5242880 /dev/zero | tr '\\0' a";

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn pct(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// A config file with one sandbox per sshd (and no `local`).
fn write_config(dir: &Path, name: &str, hosts: &[&Sshd]) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.toml"));
    let mut text = String::from("local = false\n");
    for (i, sshd) in hosts.iter().enumerate() {
        text.push_str(&sshd.sandbox_toml(&format!("{name}{i}")));
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// One list_sandboxes(check_resources=true): how long it took and its rows.
async fn list_resources(client: &Client) -> (Duration, Vec<serde_json::Value>) {
    let args = json!({ "check_resources": true });
    let t = Instant::now();
    let result = client
        .call_tool(
            CallToolRequestParams::new("list_sandboxes")
                .with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .expect("list_sandboxes");
    let took = t.elapsed();
    let mut value = result.structured_content.expect("structured result");
    let rows = value["sandboxes"].take();
    let rows = rows.as_array().cloned().unwrap_or_default();
    (took, rows)
}

/// Median time of `rounds` list_sandboxes(check_resources=true) on a warm client.
async fn check_resources(client: &Client, hosts: usize, rounds: usize) -> Duration {
    let mut times = Vec::with_capacity(rounds);
    for round in 0..=rounds {
        let (took, rows) = list_resources(client).await;
        assert_eq!(rows.len(), hosts);
        assert!(
            rows.iter().all(|r| r["connection_alive"] == true),
            "{rows:?}"
        );
        // Round 0 connects and installs; only warm rounds count.
        if round > 0 {
            times.push(took);
        }
    }
    median(times)
}

/// CPU time (user + system) of a process, from /proc/<pid>/stat.
fn cpu_time(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_comm = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let ticks: u64 = fields
        .get(11..13)
        .map_or(0, |f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// `outpost mcp` on stdio with `config`, or with none (the local sandbox).
async fn mcp_client(home: &Path, config: Option<&Path>) -> Client {
    let transport = TokioChildProcess::new(
        tokio::process::Command::new(target_bin("outpost")).configure(|cmd| {
            cmd.arg("mcp")
                .env_clear()
                .env("HOME", home)
                .env("PATH", std::env::var("PATH").unwrap_or_default());
            if let Some(config) = config {
                cmd.env("OUTPOST_CONFIG", config);
            }
        }),
    )
    .expect("spawn outpost mcp");
    ().serve(transport).await.expect("MCP handshake")
}

/// exec_bash with a timeout that fits every client's budget, so it runs
/// inline (the long-calls part measures the other way).
async fn exec_bash(client: &Client, command: &str) -> serde_json::Value {
    let args = json!({ "command": command, "timeout_s": 30 });
    let result = client
        .call_tool(
            CallToolRequestParams::new("exec_bash")
                .with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .expect("exec_bash");
    result.structured_content.expect("structured result")
}

fn ssh_base(sshd: &Sshd, control: &Path) -> Command {
    let mut cmd = Command::new("ssh");
    cmd.args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no"])
        .args(["-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"])
        .arg("-o")
        .arg(format!("ControlPath={}", control.display()))
        .arg("-i")
        .arg(sshd.client_key())
        .arg("-p")
        .arg(sshd.port().to_string())
        .arg(format!("{}@{}", sshd.user(), sshd.host()))
        .stdin(Stdio::null());
    cmd
}

fn rss_kb(pid: i32) -> u64 {
    status_kb(pid, "VmRSS:")
}

/// A KiB figure of /proc/<pid>/status (`VmRSS:`, `VmHWM:`).
fn status_kb(pid: i32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).map(|n| n.parse().unwrap_or(0)))
        })
        .unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let only = std::env::args().nth(1);
    if only.is_none() || only.as_deref() == Some("exec") {
        exec_and_metrics().await;
    }
    if only.is_none() || only.as_deref() == Some("fleet") {
        fleet().await;
    }
    if only.is_none() || only.as_deref() == Some("jobs") {
        jobs().await;
    }
    if only.is_none() || only.as_deref() == Some("calls") {
        long_calls().await;
    }
    if only.is_none() || only.as_deref() == Some("sandboxes") {
        sandboxes().await;
    }
    if only.is_none() || only.as_deref() == Some("code") {
        code().await;
    }
    if only.is_none() || only.as_deref() == Some("slurm") {
        slurm().await;
    }
    if only.is_none() || only.as_deref() == Some("slurm-batch") {
        slurm_batch().await;
    }
    if only.is_none() || only.as_deref() == Some("sync") {
        sync_vs_rsync();
    }
    if only.is_none() || only.as_deref() == Some("sync-warm") {
        sync_warm().await;
    }
    if only.is_none() || only.as_deref() == Some("fanout") {
        fanout();
    }
    if only.is_none() || only.as_deref() == Some("big-file") {
        big_file();
    }
}

async fn slurm() {
    const CREATE_ROUNDS: usize = 5;
    const EXEC_ROUNDS: usize = 50;
    let Some(cluster) = Slurm::start() else {
        println!("slurm: skipped (no Slurm here; scripts/setup-test-env installs it)");
        return;
    };
    let sshd = Sshd::start_with_env(&cluster.env());
    let scratch = TempDir::new("bench-slurm");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let config = scratch.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "{}[sandbox.slurm]\ntime = \"30\"\n",
            sshd.sandbox_toml("hpc")
        ),
    )
    .unwrap();
    let client = mcp_client(&home, Some(&config)).await;
    // Warm: the login node's connection and agent.
    exec_true_in(&client, "hpc", "true", 5).await;

    let mut first_exec = Vec::new();
    for _ in 0..CREATE_ROUNDS {
        let t = Instant::now();
        let made = tool(&client, "create_sandbox", json!({"host": "hpc"})).await;
        let name = made["sandbox_name"].as_str().unwrap().to_string();
        exec_true_in(&client, &name, "true", 1).await;
        first_exec.push(t.elapsed());
        tool(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
    }

    let made = tool(&client, "create_sandbox", json!({"host": "hpc"})).await;
    let name = made["sandbox_name"].as_str().unwrap().to_string();
    let job = name.trim_start_matches("hpc/job-").to_string();
    let by_hand = format!("srun --jobid={job} --overlap -N1 -n1 true");
    exec_true_in(&client, &name, "true", 5).await;
    // Interleaved, so drift hits all alike.
    let (mut step, mut login, mut per_command) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..EXEC_ROUNDS {
        step.push(exec_true_in(&client, &name, "true", 1).await);
        login.push(exec_true_in(&client, "hpc", "true", 1).await);
        per_command.push(exec_true_in(&client, "hpc", &by_hand, 1).await);
    }
    tool(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
    let (step, login, per_command) = (median(step), median(login), median(per_command));
    println!("slurm (single-node cluster, login node over the private sshd):");
    println!(
        "  create_sandbox → first exec_bash result, idle cluster: {} median of {CREATE_ROUNDS}",
        ms(median(first_exec))
    );
    println!(
        "  exec_bash('true') in the allocation (srun --overlap step): {} vs the login node over SSH {} ({:.2}x); a new srun --overlap per command {} ({:.1}x the step)",
        ms(step),
        ms(login),
        step.as_secs_f64() / login.as_secs_f64(),
        ms(per_command),
        per_command.as_secs_f64() / step.as_secs_f64()
    );
}

/// 100 Slurm batch jobs submitted through `exec_bash_background`, then the
/// status of all of them in one `list_background_tasks` call.
async fn slurm_batch() {
    const JOBS: usize = 100;
    const ROUNDS: usize = 10;
    let Some(cluster) = Slurm::start() else {
        println!("slurm-batch: skipped (no Slurm here; scripts/setup-test-env installs it)");
        return;
    };
    let home = TempDir::new("bench-slurm-batch");
    // The local sandbox inherits SLURM_CONF: a login node of the cluster.
    let transport = TokioChildProcess::new(
        tokio::process::Command::new(target_bin("outpost")).configure(|cmd| {
            cmd.arg("mcp")
                .env_clear()
                .env("HOME", home.path())
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .envs(cluster.env());
        }),
    )
    .expect("spawn outpost mcp");
    let client: Client = ().serve(transport).await.expect("MCP handshake");
    let mut submit = Vec::new();
    let mut names = Vec::new();
    for i in 0..JOBS {
        let t = Instant::now();
        let r = tool(
            &client,
            "exec_bash_background",
            json!({"command": format!("exit {}", i % 3), "scheduler": "slurm", "time": "5"}),
        )
        .await;
        submit.push(t.elapsed());
        names.push(r["tmux_session"].as_str().unwrap().to_string());
    }
    let list = || tool(&client, "list_background_tasks", json!({"limit": JOBS}));
    let began = Instant::now();
    loop {
        let r = list().await;
        let ended = r["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["state"] == "exited")
            .count();
        if ended == JOBS {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(300),
            "{ended} of {JOBS} batch jobs ended after 300 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (mut all, mut one) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let r = list().await;
        all.push(t.elapsed());
        assert_eq!(r["tasks"].as_array().unwrap().len(), JOBS, "{r}");
        let t = Instant::now();
        tool(
            &client,
            "check_background_task",
            json!({"tmux_session": names[0], "last_n_lines": 0}),
        )
        .await;
        one.push(t.elapsed());
    }
    let (all, one) = (median(all), median(one));
    println!("slurm batch jobs (single-node cluster, the local sandbox its login node):");
    println!(
        "  exec_bash_background(scheduler=\"slurm\") submit: {} median of {JOBS}",
        ms(median(submit))
    );
    println!(
        "  status of {JOBS} ended jobs in ONE list_background_tasks call: {} median of {ROUNDS} ({:.1}x one job's check_background_task, {})",
        ms(all),
        all.as_secs_f64() / one.as_secs_f64(),
        ms(one)
    );
    client.cancel().await.ok();
}

/// A tool's structured result (panics on a tool error: a benchmark of a
/// failing call measures nothing).
async fn tool(client: &Client, name: &'static str, args: serde_json::Value) -> serde_json::Value {
    let result = client
        .call_tool(
            CallToolRequestParams::new(name).with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .expect(name);
    assert_ne!(result.is_error, Some(true), "{name}: {result:?}");
    result.structured_content.expect("structured result")
}

/// execute_code's JSON (its first text block); panics on a tool error or
/// an exception.
async fn run_code(client: &Client, args: serde_json::Value) -> serde_json::Value {
    let result = client
        .call_tool(
            CallToolRequestParams::new("execute_code")
                .with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .expect("execute_code");
    assert_ne!(result.is_error, Some(true), "{result:?}");
    let text = result.content[0]
        .as_text()
        .expect("a text block")
        .text
        .clone();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(value.get("error").is_none(), "{value}");
    value
}

async fn code() {
    const ROUNDS: usize = 200;
    const COLD_ROUNDS: usize = 8;
    let sshd = Sshd::start();
    let scratch = TempDir::new("bench-code");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let config = write_config(scratch.path(), "bench", &[&sshd]);
    let client = mcp_client(&home, Some(&config)).await;
    // Warm: connection, agent, daemon, a context.
    exec_true_in(&client, "bench0", "true", 5).await;
    run_code(&client, json!({"code": "1+1", "sandbox_name": "bench0"})).await;

    let mut cold = Vec::new();
    for i in 0..COLD_ROUNDS {
        let t = Instant::now();
        run_code(
            &client,
            json!({"code": "1+1", "context": format!("cold{i}"), "sandbox_name": "bench0"}),
        )
        .await;
        cold.push(t.elapsed());
    }
    let (mut warm, mut python_c, mut bash, mut exec_true) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    run_code(
        &client,
        json!({"code": "true", "language": "bash", "context": "sh", "sandbox_name": "bench0"}),
    )
    .await;
    // Interleaved, so drift hits all alike.
    for _ in 0..ROUNDS / 10 {
        for _ in 0..10 {
            let t = Instant::now();
            let r = run_code(&client, json!({"code": "1+1", "sandbox_name": "bench0"})).await;
            warm.push(t.elapsed());
            assert_eq!(r["results"][0]["text/plain"], "2", "{r}");
        }
        for _ in 0..10 {
            let t = Instant::now();
            run_code(
                &client,
                json!({"code": "true", "language": "bash", "context": "sh", "sandbox_name": "bench0"}),
            )
            .await;
            bash.push(t.elapsed());
        }
        python_c.push(exec_true_in(&client, "bench0", "python3 -c 'print(1+1)'", 10).await);
        exec_true.push(exec_true_in(&client, "bench0", "true", 10).await);
    }
    let rss = |r: serde_json::Value| -> String {
        // The last result is the final expression's (a figure comes first).
        r["results"]
            .as_array()
            .and_then(|all| all.last())
            .and_then(|last| last["text/plain"].as_str())
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or_else(|| "?".into(), |kb| format!("{:.1} MiB", kb / 1024.0))
    };
    let peak = "import resource; resource.getrusage(resource.RUSAGE_SELF).ru_maxrss";
    let bare = rss(run_code(
        &client,
        json!({"code": peak, "context": "cold0", "sandbox_name": "bench0"}),
    )
    .await);
    let plotted = rss(run_code(
        &client,
        json!({"code": format!("import numpy, matplotlib.pyplot as plt\nplt.plot([1, 2])\n{peak}"),
                   "context": "cold1", "sandbox_name": "bench0"}),
    )
    .await);
    // In a bwrap sandbox: the worker was started through `enter` once; a
    // warm run pays nothing for the isolation.
    let made = tool(
        &client,
        "create_sandbox",
        json!({"host": "bench0", "isolation": "bwrap", "network": false}),
    )
    .await;
    let sandbox = made["sandbox_name"].as_str().unwrap().to_string();
    let t = Instant::now();
    run_code(&client, json!({"code": "1+1", "sandbox_name": sandbox})).await;
    let sandbox_cold = t.elapsed();
    let mut in_sandbox = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        run_code(&client, json!({"code": "1+1", "sandbox_name": sandbox})).await;
        in_sandbox.push(t.elapsed());
    }
    tool(&client, "delete_sandbox", json!({"sandbox_name": sandbox})).await;
    client.cancel().await.ok();
    let (warm_med, python_med) = (median(warm.clone()), median(python_c));

    println!();
    println!("code contexts over SSH, warm client");
    println!(
        "  execute_code('1+1'), warm context        median {}  p90 {}  (target ≤ 5 ms)",
        ms(warm_med),
        ms(pct(warm, 0.9))
    );
    println!(
        "  exec_bash(\"python3 -c 'print(1+1)'\")    median {}  ({:.2}× execute_code)",
        ms(python_med),
        python_med.as_secs_f64() / warm_med.as_secs_f64()
    );
    println!(
        "  exec_bash('true')                        median {}",
        ms(median(exec_true))
    );
    println!(
        "  execute_code(bash 'true'), warm context  median {}",
        ms(median(bash))
    );
    println!(
        "  first run of a new context (worker start) median {}  p90 {}",
        ms(median(cold.clone())),
        ms(pct(cold, 0.9))
    );
    println!(
        "  execute_code('1+1') in a bwrap sandbox   median {}  (first run there {})",
        ms(median(in_sandbox)),
        ms(sandbox_cold)
    );
    println!(
        "  worker peak RSS: bare {bare}, after importing numpy + matplotlib and a plot {plotted}"
    );
}

/// exec_bash('true') `rounds` times in `sandbox`, median.
async fn exec_true_in(client: &Client, sandbox: &str, command: &str, rounds: usize) -> Duration {
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        let r = tool(
            client,
            "exec_bash",
            json!({"command": command, "sandbox_name": sandbox, "timeout_s": 30}),
        )
        .await;
        times.push(t.elapsed());
        assert_eq!(r["exit_code"], 0, "{r}");
    }
    median(times)
}

async fn sandboxes() {
    const CREATE_ROUNDS: usize = 10;
    let sshd = Sshd::start();
    let scratch = TempDir::new("bench-sandboxes");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let config = write_config(scratch.path(), "bench", &[&sshd]);
    // The same host logged into as root: its sandboxes run on uids of
    // their own.
    let root_state = scratch.path().join("root-state");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&sshd.root_sandbox_toml("root0", &root_state));
    std::fs::write(&config, text).unwrap();
    let client = mcp_client(&home, Some(&config)).await;
    // Warm: connection, agent, daemon, the isolation probe.
    for host in ["bench0", "root0"] {
        exec_true_in(&client, host, "true", 5).await;
        let made = tool(
            &client,
            "create_sandbox",
            json!({"host": host, "isolation": "bwrap"}),
        )
        .await;
        tool(
            &client,
            "delete_sandbox",
            json!({"sandbox_name": made["sandbox_name"]}),
        )
        .await;
    }

    let (mut create, mut create_root) = (Vec::new(), Vec::new());
    let (mut first_exec, mut delete) = (Vec::new(), Vec::new());
    for _ in 0..CREATE_ROUNDS {
        for (host, times) in [("bench0", &mut create), ("root0", &mut create_root)] {
            let t = Instant::now();
            let made = tool(
                &client,
                "create_sandbox",
                json!({"host": host, "isolation": "bwrap", "network": false}),
            )
            .await;
            times.push(t.elapsed());
            let name = made["sandbox_name"].as_str().unwrap().to_string();
            exec_true_in(&client, &name, "true", 1).await;
            if host == "bench0" {
                first_exec.push(t.elapsed());
            }
            let t = Instant::now();
            tool(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
            if host == "bench0" {
                delete.push(t.elapsed());
            }
        }
    }

    let bwrap = tool(
        &client,
        "create_sandbox",
        json!({"host": "bench0", "isolation": "bwrap"}),
    )
    .await;
    let landlock = tool(
        &client,
        "create_sandbox",
        json!({"host": "bench0", "isolation": "landlock"}),
    )
    .await;
    let root_bwrap = tool(
        &client,
        "create_sandbox",
        json!({"host": "root0", "isolation": "bwrap"}),
    )
    .await;
    let (bwrap, landlock, root_bwrap) = (
        bwrap["sandbox_name"].as_str().unwrap().to_string(),
        landlock["sandbox_name"].as_str().unwrap().to_string(),
        root_bwrap["sandbox_name"].as_str().unwrap().to_string(),
    );
    let per_command = "bwrap --unshare-user --unshare-pid --unshare-ipc --unshare-uts --die-with-parent \
        --new-session --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp -- true";
    // Interleaved, so drift hits all alike.
    let (mut host, mut inside, mut ll, mut fresh) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut root_host, mut root_inside) = (Vec::new(), Vec::new());
    for _ in 0..EXEC_ROUNDS / 10 {
        host.push(exec_true_in(&client, "bench0", "true", 10).await);
        inside.push(exec_true_in(&client, &bwrap, "true", 10).await);
        ll.push(exec_true_in(&client, &landlock, "true", 10).await);
        fresh.push(exec_true_in(&client, "bench0", per_command, 10).await);
        root_host.push(exec_true_in(&client, "root0", "true", 10).await);
        root_inside.push(exec_true_in(&client, &root_bwrap, "true", 10).await);
    }
    let (host, inside, ll, fresh) = (median(host), median(inside), median(ll), median(fresh));
    let (root_host, root_inside) = (median(root_host), median(root_inside));
    for name in [&bwrap, &landlock, &root_bwrap] {
        tool(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
    }
    let egress = egress_cost(&client).await;
    client.cancel().await.ok();

    println!();
    println!(
        "isolated sandboxes over SSH (unprivileged bwrap; root's on uids of their own), warm client"
    );
    println!(
        "  create_sandbox (bwrap, no network)       median {}  p90 {}",
        ms(median(create.clone())),
        ms(pct(create, 0.9))
    );
    println!(
        "  create → first exec_bash result          median {}  (E2B advertises ~150 ms for a cloud sandbox)",
        ms(median(first_exec))
    );
    println!(
        "  delete_sandbox (bwrap)                   median {}  p90 {}",
        ms(median(delete.clone())),
        ms(pct(delete, 0.9))
    );
    println!(
        "  exec_bash('true') on the host            median {}",
        ms(host)
    );
    println!(
        "  exec_bash('true') in a bwrap sandbox     median {}  (+{})",
        ms(inside),
        ms(inside.saturating_sub(host))
    );
    println!(
        "  exec_bash('true') in a landlock sandbox  median {}  (+{})",
        ms(ll),
        ms(ll.saturating_sub(host))
    );
    println!(
        "  as root: create_sandbox (bwrap, own uid) median {}  p90 {}",
        ms(median(create_root.clone())),
        ms(pct(create_root, 0.9))
    );
    // Against the unprivileged login's host exec: a root login's own runs
    // root's ~/.bashrc (bash does for `bash -c` under sshd), which a
    // sandbox's clean environment skips.
    println!(
        "  as root: exec_bash('true') in bwrap      median {}  (+{} over the login above; root's host exec {})",
        ms(root_inside),
        ms(root_inside.saturating_sub(host)),
        ms(root_host)
    );
    println!(
        "  exec_bash(a new bwrap per command)       median {}  (+{})",
        ms(fresh),
        ms(fresh.saturating_sub(host))
    );
    let [(direct_get, proxied_get), (direct_tcp, proxied_tcp)] = egress;
    println!(
        "  allow_hosts proxy: an HTTP GET            {proxied_get:.2} ms vs {direct_get:.2} ms on the host (+{:.2} ms)",
        proxied_get - direct_get
    );
    println!(
        "  allow_hosts proxy: a CONNECT tunnel       {proxied_tcp:.2} ms vs a TCP connect {direct_tcp:.2} ms (+{:.2} ms)",
        proxied_tcp - direct_tcp
    );
}

/// Times, inside Python, 200 plain GETs and 200 tunnel set-ups: through
/// the proxy where `HTTPS_PROXY` is set, else straight to the server.
const EGRESS_SCRIPT: &str = r#"import os, socket, time, urllib.request
n, port = 200, PORT
t = time.perf_counter()
for _ in range(n):
    urllib.request.urlopen(f"http://localhost:{port}/").read()
get = (time.perf_counter() - t) / n * 1000
t = time.perf_counter()
for _ in range(n):
    if os.environ.get("HTTPS_PROXY"):
        s = socket.create_connection(("127.0.0.1", 3128))
        s.sendall(f"CONNECT localhost:{port} HTTP/1.1\r\n\r\n".encode())
        s.recv(100)
    else:
        s = socket.create_connection(("localhost", port))
    s.close()
print(get, (time.perf_counter() - t) / n * 1000)
"#;

/// Milliseconds per plain HTTP GET and per tunnel set-up (CONNECT through
/// the proxy, or a TCP connect on the host), each timed inside Python over
/// 200 rounds against a server on this machine's loopback: on the host,
/// then in a `network: false` sandbox that allows only that server.
async fn egress_cost(client: &Client) -> [(f64, f64); 2] {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                use std::io::{BufRead, Write};
                let mut reader = std::io::BufReader::new(&conn);
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let _ = (&conn).write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                );
            });
        }
    });
    let command = format!(
        "python3 - <<'EOF'\n{}EOF",
        EGRESS_SCRIPT.replace("PORT", &port.to_string())
    );
    let measure = |r: serde_json::Value| -> (f64, f64) {
        let out = r["stdout"].as_str().unwrap_or_default().to_string();
        let mut f = out
            .split_whitespace()
            .map(|v| v.parse::<f64>().unwrap_or(f64::NAN));
        (f.next().unwrap_or(f64::NAN), f.next().unwrap_or(f64::NAN))
    };
    let on_host = tool(
        client,
        "exec_bash",
        json!({"command": command, "sandbox_name": "bench0", "timeout_s": 120}),
    )
    .await;
    let made = tool(
        client,
        "create_sandbox",
        json!({"host": "bench0", "isolation": "bwrap", "network": false,
               "allow_hosts": [format!("localhost:{port}")]}),
    )
    .await;
    let name = made["sandbox_name"].as_str().unwrap().to_string();
    let inside = tool(
        client,
        "exec_bash",
        json!({"command": command, "sandbox_name": name, "timeout_s": 120}),
    )
    .await;
    tool(client, "delete_sandbox", json!({"sandbox_name": name})).await;
    let ((direct_get, direct_tcp), (proxied_get, proxied_tcp)) =
        (measure(on_host), measure(inside));
    [(direct_get, proxied_get), (direct_tcp, proxied_tcp)]
}

/// exec_bash('true') on the local sandbox: with and without a progress token,
/// and run as a job (the default 120 s timeout outlasts an unknown client's
/// 45 s budget) — in turn, on one raw stdio connection, since rmcp's client
/// always sends a token — then rmcp's clients over Streamable HTTP and stdio.
async fn long_calls() {
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
    let (mut over_stdio, mut over_http) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        for (client, times) in [(&stdio, &mut over_stdio), (&http, &mut over_http)] {
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

    let (h, s) = (median(over_http), median(over_stdio));
    println!("  Streamable HTTP (rmcp)     median {}", ms(h));
    println!("  stdio (rmcp)               median {}", ms(s));
    println!(
        "  ratio HTTP/stdio           {:.2}x",
        h.as_secs_f64() / s.as_secs_f64()
    );
}

/// Job start latency, time from a job's end to wait_background_task
/// returning, and the daemon's idle cost.
async fn jobs() {
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

async fn exec_and_metrics() {
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
async fn fleet() {
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

fn timed(mut cmd: Command) -> (Duration, String) {
    let t = Instant::now();
    let out = cmd.output().expect("run");
    let took = t.elapsed();
    assert!(
        out.status.success(),
        "{:?} failed: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    (took, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// remote-sandbox-mcp's sync scenario: 2,000 files of 1–8 KB in 40
/// directories plus 5 × 20 MB, under `src`.
fn seed_tree(src: &Path) {
    for i in 0..2000u64 {
        let dir = src.join(format!("pkg{:02}", i % 40));
        std::fs::create_dir_all(&dir).unwrap();
        let len = 1024 + (i as usize * 7919) % 7168;
        std::fs::write(dir.join(format!("f{i:04}.txt")), noise(len, i + 1)).unwrap();
    }
    for i in 0..5u64 {
        std::fs::write(
            src.join(format!("weights{i}.bin")),
            noise(20 << 20, 1000 + i),
        )
        .unwrap();
    }
}

/// 10 files of `src` changed (new content, seeded by `round`) and 100
/// touched (mtime only).
fn change_tree(src: &Path, round: u64) {
    for i in 0..10u64 {
        let path = src.join(format!("pkg{:02}/f{i:04}.txt", i % 40));
        std::fs::write(&path, noise(2048, 50_000 + i + 100 * round)).unwrap();
    }
    for i in 100..200u64 {
        let path = src.join(format!("pkg{:02}/f{i:04}.txt", i % 40));
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(std::time::SystemTime::now()).unwrap();
    }
}

/// The case agents live in: the MCP server already connected, rsync over a
/// warm ControlMaster connection. Re-push after 10 changed + 100 touched
/// files, no-op push and no-op pull, each a median of rounds, dirty pages
/// flushed before each timed run.
async fn sync_warm() {
    const ROUNDS: usize = 5;
    let sshd = Sshd::start();
    let scratch = TempDir::new("bench-sync-warm");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let src = scratch.path().join("src");
    seed_tree(&src);
    let config = scratch.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "local_roots = [{:?}]\n{}",
            scratch.path().display().to_string(),
            sshd.sandbox_toml("box")
        ),
    )
    .unwrap();
    let client = mcp_client(&home, Some(&config)).await;
    let control = scratch.path().join("cm.sock");
    let mut master = ssh_base(&sshd, &control)
        .args(["-o", "ControlMaster=yes", "-N"])
        .spawn()
        .expect("ssh master");
    let ready = outpost_e2e::wait_until(Duration::from_secs(10), || control.exists());
    assert!(ready, "ControlMaster socket never appeared");
    let rsync = |from: String, to: String| {
        let mut cmd = Command::new("rsync");
        cmd.args(["-a", "--delete", "-e"])
            .arg(format!(
                "ssh -o ControlPath={} -p {} -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
                control.display(),
                sshd.port()
            ))
            .arg(from)
            .arg(to);
        cmd
    };
    let flush = || {
        let _ = Command::new("sync").status();
    };
    let user_host = format!("{}@{}", sshd.user(), sshd.host());
    let src_arg = format!("{}/", src.display());
    let (o_remote, r_remote) = (sshd.remote_dir().join("o"), sshd.remote_dir().join("r"));
    let r_remote_arg = format!("{user_host}:{}/", r_remote.display());
    let (o_back, r_back) = (scratch.path().join("o-back"), scratch.path().join("r-back"));
    let push = json!({"local_path": src, "remote_path": o_remote, "sandbox_name": "box"});
    let pull = json!({"remote_path": o_remote, "local_path": o_back, "sandbox_name": "box"});
    let timed_tool = |name: &'static str, args: serde_json::Value| {
        let client = &client;
        async move {
            flush();
            let t = Instant::now();
            let r = tool(client, name, args).await;
            (t.elapsed(), r)
        }
    };
    let timed_rsync = |from: String, to: String| {
        flush();
        timed(rsync(from, to)).0
    };
    // Fresh copies both ways first (not timed here: see the cold part).
    timed_tool("sync_local_to_remote", push.clone()).await;
    timed_rsync(src_arg.clone(), r_remote_arg.clone());
    timed_tool("sync_remote_to_local", pull.clone()).await;
    timed_rsync(r_remote_arg.clone(), format!("{}/", r_back.display()));

    let (mut re_o, mut re_r, mut noop_o, mut noop_r) = (vec![], vec![], vec![], vec![]);
    let (mut pull_o, mut pull_r, mut engine, mut pull_engine) = (vec![], vec![], vec![], vec![]);
    for round in 0..ROUNDS {
        change_tree(&src, round as u64 + 1);
        let (took, r) = timed_tool("sync_local_to_remote", push.clone()).await;
        re_o.push(took);
        engine.push(Duration::from_secs_f64(
            r["duration_s"].as_f64().unwrap_or(0.0),
        ));
        re_r.push(timed_rsync(src_arg.clone(), r_remote_arg.clone()));
        noop_o.push(timed_tool("sync_local_to_remote", push.clone()).await.0);
        noop_r.push(timed_rsync(src_arg.clone(), r_remote_arg.clone()));
        // Pulls of what the pushes just made: the first brings the
        // changes, the second is the no-op timed here.
        timed_tool("sync_remote_to_local", pull.clone()).await;
        timed_rsync(r_remote_arg.clone(), format!("{}/", r_back.display()));
        let (took, r) = timed_tool("sync_remote_to_local", pull.clone()).await;
        pull_o.push(took);
        pull_engine.push(Duration::from_secs_f64(
            r["duration_s"].as_f64().unwrap_or(0.0),
        ));
        pull_r.push(timed_rsync(
            r_remote_arg.clone(),
            format!("{}/", r_back.display()),
        ));
    }
    // The same re-push while another program has 256 MiB not yet written
    // back on the same filesystem (a flush of the whole filesystem would
    // wait for it).
    let dirty = scratch.path().join("someone-elses.bin");
    let other_data = noise(256 << 20, 4242);
    let (mut dirty_o, mut dirty_r) = (vec![], vec![]);
    for round in 0..3u64 {
        change_tree(&src, 100 + round);
        flush();
        std::fs::write(&dirty, &other_data).unwrap();
        let t = Instant::now();
        tool(&client, "sync_local_to_remote", push.clone()).await;
        dirty_o.push(t.elapsed());
        flush();
        std::fs::write(&dirty, &other_data).unwrap();
        dirty_r.push(timed(rsync(src_arg.clone(), r_remote_arg.clone())).0);
    }
    let _ = std::fs::remove_file(&dirty);
    let _ = master.kill();
    let _ = master.wait();
    client.cancel().await.ok();
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!();
    println!(
        "sync, warm (MCP server connected; rsync over a ControlMaster), same tree; median of {ROUNDS}"
    );
    println!(
        "  {:<34} {:>10} {:>10} {:>7}",
        "", "outpost", "rsync", "ratio"
    );
    for (label, o, r) in [
        (
            "re-push (10 changed, 100 touched)",
            median(re_o),
            median(re_r),
        ),
        ("no-op push", median(noop_o), median(noop_r)),
        ("no-op pull", median(pull_o), median(pull_r)),
        (
            "re-push, 256 MiB of others dirty",
            median(dirty_o),
            median(dirty_r),
        ),
    ] {
        println!(
            "  {label:<34} {:>10} {:>10} {:>6.2}x",
            ms(o),
            ms(r),
            ratio(o, r)
        );
    }
    println!(
        "  the engine's own duration_s: re-push {}, no-op pull {}",
        ms(median(engine)),
        ms(median(pull_engine))
    );
}

fn sync_vs_rsync() {
    let sshd = Sshd::start();
    let scratch = TempDir::new("bench-sync");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let config = write_config(scratch.path(), "box", &[&sshd]);
    let src = scratch.path().join("src");
    seed_tree(&src);
    let remote = |name: &str| sshd.remote_dir().join(name);
    let outpost = |from: &str, to: &str| {
        let mut cmd = Command::new(target_bin("outpost"));
        cmd.args(["sync", "--no-default-excludes", from, to])
            .env_clear()
            .env("HOME", &home)
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("OUTPOST_CONFIG", &config);
        cmd
    };
    let rsync = |from: String, to: String| {
        let mut cmd = Command::new("rsync");
        cmd.args(["-a", "--delete", "-e"])
            .arg(format!(
                "ssh -i {} -p {} -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
                sshd.client_key().display(),
                sshd.port()
            ))
            .arg(from)
            .arg(to);
        cmd
    };
    let user_host = format!("{}@{}", sshd.user(), sshd.host());
    let src_arg = format!("{}/", src.display());

    // Fresh transfers are repeated into new directories, alternating tools, and
    // the medians compared; dirty pages are flushed before each run (fresh or
    // not) so neither tool pays for the other's writeback: Outpost flushes
    // what it wrote before renaming it, which on a journaled filesystem also
    // waits for whatever rsync left unwritten just before.
    let flush = || {
        let _ = Command::new("sync").status();
    };
    let mut fresh_o = Vec::new();
    let mut fresh_r = Vec::new();
    for round in 0..FRESH_ROUNDS {
        flush();
        let dst = format!("box0:{}", remote(&format!("o{round}")).display());
        fresh_o.push(timed(outpost(&src_arg, &dst)).0);
        flush();
        let dst = format!("{user_host}:{}/", remote(&format!("r{round}")).display());
        fresh_r.push(timed(rsync(src_arg.clone(), dst)).0);
    }
    let (o_fresh, r_fresh) = (median(fresh_o), median(fresh_r));
    let o_remote = format!("box0:{}", remote("o0").display());
    let r_remote = format!("{user_host}:{}/", remote("r0").display());

    change_tree(&src, 0);
    flush();
    let (o_re, _) = timed(outpost(&src_arg, &o_remote));
    flush();
    let (r_re, _) = timed(rsync(src_arg.clone(), r_remote.clone()));
    flush();
    let (o_noop, _) = timed(outpost(&src_arg, &o_remote));
    flush();
    let (r_noop, _) = timed(rsync(src_arg.clone(), r_remote.clone()));

    let mut pull_o = Vec::new();
    let mut pull_r = Vec::new();
    for round in 0..FRESH_ROUNDS {
        flush();
        let back = scratch.path().join(format!("o-back{round}"));
        pull_o.push(timed(outpost(&o_remote, &back.display().to_string())).0);
        flush();
        let back = scratch.path().join(format!("r-back{round}"));
        pull_r.push(timed(rsync(r_remote.clone(), format!("{}/", back.display()))).0);
    }
    let (o_pull, r_pull) = (median(pull_o), median(pull_r));

    // The floor a fresh transfer can approach on this machine: the tree
    // copied within the same filesystem and flushed, with no network,
    // encryption or second process.
    let mut floor = Vec::new();
    for round in 0..FRESH_ROUNDS {
        flush();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", r#"cp -a "$1" "$2" && sync -f "$2""#, "sh"])
            .arg(&src)
            .arg(scratch.path().join(format!("floor{round}")));
        floor.push(timed(cmd).0);
    }
    let floor = median(floor);

    // A 4 KiB edit in a 20 MB file, at several places (what an edit costs
    // depends on the chunk it falls in): bytes each tool sends, and the
    // time of the middle one.
    let weights = src.join("weights0.bin");
    let mut content = std::fs::read(&weights).unwrap();
    let (mut o_bytes, mut r_bytes) = (Vec::new(), Vec::new());
    let (mut o_edit, mut r_edit) = (Duration::ZERO, Duration::ZERO);
    const EDITS: usize = 7;
    for k in 0..EDITS {
        let at = content.len() * (k + 1) / (EDITS + 1);
        content[at..at + 4096].copy_from_slice(&noise(4096, 77 + k as u64));
        std::fs::write(&weights, &content).unwrap();
        flush();
        let (o_took, o_out) = timed(outpost(&src_arg, &o_remote));
        let mut r_cmd = rsync(src_arg.clone(), r_remote.clone());
        r_cmd.arg("--stats");
        flush();
        let (r_took, r_out) = timed(r_cmd);
        if k == EDITS / 2 {
            (o_edit, r_edit) = (o_took, r_took);
        }
        o_bytes.push(wire_bytes(&o_out));
        let sent = r_out
            .lines()
            .find_map(|l| l.strip_prefix("Total bytes sent: "))
            .map(|n| n.replace(',', "").trim().parse::<f64>().unwrap_or(0.0));
        r_bytes.push(sent.unwrap_or(0.0));
    }
    let kib = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        format!(
            "median {:.1} KiB (range {:.1}–{:.1})",
            v[v.len() / 2] / 1024.0,
            v[0] / 1024.0,
            v[v.len() - 1] / 1024.0
        )
    };

    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!();
    println!(
        "sync: 2,000 files of 1–8 KB + 5 × 20 MB, cold runs (connect included); fresh runs: median of {FRESH_ROUNDS}"
    );
    println!(
        "  {:<34} {:>10} {:>10} {:>7}",
        "", "outpost", "rsync", "ratio"
    );
    for (label, o, r) in [
        ("fresh push", o_fresh, r_fresh),
        ("re-push (10 changed, 100 touched)", o_re, r_re),
        ("no-op push", o_noop, r_noop),
        ("fresh pull", o_pull, r_pull),
        ("4 KiB edit in a 20 MB file", o_edit, r_edit),
    ] {
        println!(
            "  {label:<34} {:>10} {:>10} {:>6.2}x",
            ms(o),
            ms(r),
            ratio(o, r)
        );
    }
    println!(
        "  floor (cp -a + sync -f, same filesystem): {}; fresh push {:.2}x it (rsync {:.2}x), fresh pull {:.2}x (rsync {:.2}x)",
        ms(floor),
        ratio(o_fresh, floor),
        ratio(r_fresh, floor),
        ratio(o_pull, floor),
        ratio(r_pull, floor)
    );
    println!(
        "  bytes sent for a 4 KiB edit at {EDITS} places: outpost: {} (content; its requests add ~1%)",
        kib(&mut o_bytes)
    );
    println!(
        "                                             rsync:   {} (its Total bytes sent)",
        kib(&mut r_bytes)
    );
}

/// "… (X KiB of content, Y KiB on the wire …" of `outpost sync`'s line, Y
/// in bytes.
fn wire_bytes(out: &str) -> f64 {
    let Some(before) = out.split(" on the wire").next() else {
        return 0.0;
    };
    let Some(amount) = before.rsplit(", ").next() else {
        return 0.0;
    };
    let mut parts = amount.split_whitespace();
    let number: f64 = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0.0);
    let unit = match parts.next() {
        Some("KiB") => 1024.0,
        Some("MiB") => 1024.0 * 1024.0,
        Some("GiB") => 1024.0 * 1024.0 * 1024.0,
        _ => 1.0,
    };
    number * unit
}

/// CPU time (user + system) of this process's waited-for children so far.
fn children_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// CPU time of the whole machine (all processes, all cores) so far.
fn machine_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: u64 = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .take(3) // user, nice, system
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// One tree pushed to 8 hosts at once vs to one (`outpost sync SRC
/// h0,…,h7:PATH`, cold CLI runs with the agents installed), and rsync to
/// one host and to 8 in a loop; wall time, the controller's CPU (rsync's
/// own processes and ssh clients for rsync) and the whole machine's CPU
/// (every sshd and agent here too: on a real fleet that half runs on the
/// hosts). Each sshd gives its sessions a HOME of their own, so the one
/// relative path is a tree of its own on each host.
fn fanout() {
    const HOSTS: usize = 8;
    let scratch = TempDir::new("bench-fanout");
    let home_dirs: Vec<TempDir> = (0..HOSTS)
        .map(|i| outpost_e2e::test_user_dir(&format!("bench-fanout-host{i}")))
        .collect();
    let homes: Vec<&Path> = home_dirs.iter().map(TempDir::path).collect();
    let hosts: Vec<Sshd> = homes.iter().map(|h| Sshd::start_with_home(h)).collect();
    let host_refs: Vec<&Sshd> = hosts.iter().collect();
    let config = write_config(scratch.path(), "fan", &host_refs);
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let src = scratch.path().join("src");
    seed_tree(&src);
    let src_arg = format!("{}/", src.display());
    let outpost = |to: String| {
        let mut cmd = Command::new(target_bin("outpost"));
        cmd.args(["sync", "--no-default-excludes", &src_arg, &to])
            .env_clear()
            .env("HOME", &home)
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("OUTPOST_CONFIG", &config);
        cmd
    };
    let rsync = |i: usize, dir: &str| {
        let sshd = &hosts[i];
        let mut cmd = Command::new("rsync");
        cmd.args(["-a", "-e"])
            .arg(format!(
                "ssh -i {} -p {} -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
                sshd.client_key().display(),
                sshd.port()
            ))
            .arg(&src_arg)
            .arg(format!(
                "{}@{}:{}/{dir}/",
                sshd.user(),
                sshd.host(),
                homes[i].display()
            ));
        cmd
    };
    let names = |n: usize| {
        (0..n)
            .map(|i| format!("fan{i}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let clean = || {
        for home in &homes {
            for entry in std::fs::read_dir(home).unwrap().flatten() {
                if entry.file_name() != ".outpost" {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let _ = Command::new("sync").status();
    };
    // Agents installed and host keys known before anything is timed.
    let empty = scratch.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let mut warm = Command::new(target_bin("outpost"));
    warm.args([
        "sync",
        &empty.display().to_string(),
        &format!("{}:warm", names(HOSTS)),
    ])
    .env_clear()
    .env("HOME", &home)
    .env("PATH", std::env::var("PATH").unwrap_or_default())
    .env("OUTPOST_CONFIG", &config);
    timed(warm);

    // (wall, controller CPU, machine CPU) of one run.
    let measure = |run: &mut dyn FnMut()| {
        clean();
        let (child, machine, t) = (children_cpu(), machine_cpu(), Instant::now());
        run();
        (
            t.elapsed(),
            children_cpu() - child,
            machine_cpu().saturating_sub(machine),
        )
    };
    // (wall, controller CPU, machine CPU) of each run, per row.
    type Runs = Vec<(Duration, Duration, Duration)>;
    let mut rows: Vec<(&str, Runs)> = vec![
        ("outpost, 1 host", Vec::new()),
        ("outpost, 8 hosts at once", Vec::new()),
        ("rsync, 1 host", Vec::new()),
        ("rsync, 8 hosts in a loop", Vec::new()),
    ];
    for _ in 0..FRESH_ROUNDS {
        rows[0].1.push(measure(&mut || {
            let (_, out) = timed(outpost(format!("{}:fan", names(1))));
            assert!(out.contains("2005 files sent"), "{out}");
        }));
        rows[1].1.push(measure(&mut || {
            let (_, out) = timed(outpost(format!("{}:fan", names(HOSTS))));
            assert_eq!(out.matches("2005 files sent").count(), HOSTS, "{out}");
        }));
        rows[2].1.push(measure(&mut || {
            timed(rsync(0, "fan"));
        }));
        rows[3].1.push(measure(&mut || {
            for i in 0..HOSTS {
                timed(rsync(i, "fan"));
            }
        }));
    }
    clean();
    let medians: Runs = rows
        .iter()
        .map(|(_, runs)| {
            (
                median(runs.iter().map(|r| r.0).collect()),
                median(runs.iter().map(|r| r.1).collect()),
                median(runs.iter().map(|r| r.2).collect()),
            )
        })
        .collect();
    println!();
    println!(
        "fan-out: the sync tree (2,000 files of 1–8 KB + 5 × 20 MB) pushed fresh, median of {FRESH_ROUNDS}; \
         every sshd and agent on this one machine"
    );
    println!(
        "  {:<26} {:>10} {:>8} {:>16} {:>14}",
        "", "wall", "× 1 host", "controller CPU", "machine CPU"
    );
    for (i, (label, _)) in rows.iter().enumerate() {
        let one = if i < 2 { medians[0].0 } else { medians[2].0 };
        let (wall, ctl, machine) = medians[i];
        println!(
            "  {label:<26} {:>10} {:>7.2}x {:>16} {:>14}",
            ms(wall),
            wall.as_secs_f64() / one.as_secs_f64(),
            ms(ctl),
            ms(machine)
        );
    }
    println!(
        "  8 hosts: outpost / rsync loop {:.2}x",
        medians[1].0.as_secs_f64() / medians[3].0.as_secs_f64()
    );
}

/// One 1 GiB file of incompressible data pushed with `outpost sync` (a
/// cold CLI run, the agent installed) vs the raw SSH channel: `cat >
/// file` over a warm ControlMaster connection, to the same sshd; median of
/// rounds, alternating, dirty pages flushed before each.
fn big_file() {
    const SIZE: usize = 1 << 30;
    let sshd = Sshd::start();
    let scratch = TempDir::new("bench-big-file");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let config = write_config(scratch.path(), "box", &[&sshd]);
    let file = scratch.path().join("big.bin");
    {
        use std::io::Write as _;
        let mut out = std::fs::File::create(&file).unwrap();
        for i in 0..(SIZE >> 26) as u64 {
            out.write_all(&noise(1 << 26, 9_000 + i)).unwrap();
        }
    }
    let outpost_of = |from: &Path, to: String| {
        let mut cmd = Command::new(target_bin("outpost"));
        cmd.args(["sync", &from.display().to_string(), &to])
            .env_clear()
            .env("HOME", &home)
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("OUTPOST_CONFIG", &config);
        cmd
    };
    let control = scratch.path().join("cm.sock");
    let mut master = ssh_base(&sshd, &control)
        .args(["-o", "ControlMaster=yes", "-N"])
        .spawn()
        .expect("ssh master");
    let ready = outpost_e2e::wait_until(Duration::from_secs(10), || control.exists());
    assert!(ready, "ControlMaster socket never appeared");
    let remote = |name: &str| sshd.remote_dir().join(name);
    let flush_and_clean = || {
        for name in ["o", "raw"] {
            let _ = std::fs::remove_dir_all(remote(name));
            let _ = std::fs::remove_file(remote(name));
        }
        let _ = Command::new("sync").status();
    };
    // The agent installed (and its connection warm) before anything is
    // timed: a tiny file, not the big one.
    let tiny = scratch.path().join("tiny");
    std::fs::write(&tiny, "x").unwrap();
    timed(outpost_of(
        &tiny,
        format!("box0:{}/", remote("warm").display()),
    ));
    let outpost = |to: String| outpost_of(&file, to);
    let (mut o_runs, mut raw_runs) = (Vec::new(), Vec::new());
    for _ in 0..FRESH_ROUNDS {
        flush_and_clean();
        o_runs.push(timed(outpost(format!("box0:{}/", remote("o").display()))).0);
        assert_eq!(
            std::fs::metadata(remote("o").join("big.bin"))
                .map(|m| m.len())
                .unwrap_or(0),
            SIZE as u64
        );
        flush_and_clean();
        let mut raw = ssh_base(&sshd, &control);
        raw.arg(format!("cat > {}", remote("raw").display()))
            .stdin(std::fs::File::open(&file).unwrap());
        raw_runs.push(timed(raw).0);
    }
    flush_and_clean();
    let _ = std::fs::remove_dir_all(remote("warm"));
    master.kill().ok();
    master.wait().ok();
    let (o, raw) = (median(o_runs), median(raw_runs));
    let rate = |d: Duration| SIZE as f64 / d.as_secs_f64() / 1e6;
    println!();
    println!("one 1 GiB file (incompressible), median of {FRESH_ROUNDS}");
    println!(
        "  outpost sync (hash-checked, flushed)  {:>10}  {:>7.1} MB/s",
        ms(o),
        rate(o)
    );
    println!(
        "  cat > file over ControlMaster          {:>10}  {:>7.1} MB/s",
        ms(raw),
        rate(raw)
    );
    println!(
        "  outpost at {:.0}% of the raw channel's throughput",
        100.0 * raw.as_secs_f64() / o.as_secs_f64()
    );
}
