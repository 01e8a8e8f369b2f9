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
//! * the status page (`outpost-bench status`): its first snapshot, and the
//!   server's CPU with one page open and with none.
//!
//! * checkpoints (`outpost-bench checkpoints`): checkpoint, restore, diff and
//!   fork of a 10,000-file, 1 GiB work dir vs `cp -a`, `expose_port`'s
//!   first byte and a terminal's keystroke-to-screen time.
//!
//! `outpost-bench fleet`, `outpost-bench sync`, `outpost-bench jobs`,
//! `outpost-bench calls`, `outpost-bench sandboxes`, `outpost-bench code`,
//! `outpost-bench checkpoints`, `outpost-bench status`,
//! `outpost-bench slurm` or
//! `outpost-bench slurm-batch` runs only that part.

mod calls;
mod checkpoints;
mod code;
mod fanout;
mod fleet;
mod jobs;
mod sandboxes;
mod slurm;
mod status;
mod sync;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use outpost_e2e::{Sshd, target_bin};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use serde_json::json;

use calls::{exec_and_metrics, long_calls};
use checkpoints::checkpoints;
use code::code;
use fanout::{big_file, fanout};
use fleet::fleet;
use jobs::jobs;
use sandboxes::sandboxes;
use slurm::{slurm, slurm_batch};
use sync::{sync_vs_rsync, sync_warm};

type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

const EXEC_ROUNDS: usize = 200;
const FRESH_ROUNDS: usize = 3;

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
    if only.is_none() || only.as_deref() == Some("checkpoints") {
        checkpoints().await;
    }
    if only.is_none() || only.as_deref() == Some("status") {
        status::status_page();
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
