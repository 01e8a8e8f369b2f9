//! Outpost inside a Slurm allocation, end to end on a private single-node
//! cluster ([`outpost_e2e::Slurm`]): a command sandbox whose template is an
//! `srun --overlap -u` step in a held allocation gets the agent copied in
//! through the step's own stream, and exec, the file tools and a code
//! context all run inside the allocation. Once the allocation is cancelled
//! the next call fails with an error instead of hanging, and no agent
//! process is left behind.
//!
//! Skipped (with a line on stderr) without root or Slurm; see
//! `scripts/setup-test-env`.

mod common;

use std::fs;
use std::path::Path;
use std::time::Duration;

use common::mcp_client::{Client, call, start};
use outpost_e2e::{Slurm, TempDir, kill_processes_under, pids_with_cmdline, wait_until};
use serde_json::{Value, json};

/// Bounds each MCP call, so a hang fails the test instead of stalling it.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// A config file whose one `[[sandbox]]`, `name`, runs through `argv` with the
/// agent's state in `remote_dir`; the file's path and its guard.
fn command_config(name: &str, argv: &[String], remote_dir: &Path) -> (String, TempDir) {
    let dir = TempDir::new("slurm-config");
    let path = dir.path().join("config.toml");
    // A JSON string or array of strings is a TOML one too.
    let text = format!(
        "[[sandbox]]\nname = {}\ncommand = {}\nremote_dir = {}\n",
        json!(name),
        json!(argv),
        json!(remote_dir.display().to_string()),
    );
    fs::write(&path, text).unwrap();
    (path.display().to_string(), dir)
}

/// Kills whatever was started from under its directory when the test ends,
/// passed or not (the cluster's own teardown cannot see a process that left
/// its job's process tree).
struct Strays(TempDir);

impl Drop for Strays {
    fn drop(&mut self) {
        kill_processes_under(self.0.path());
    }
}

async fn timed_call(client: &Client, tool: &'static str, args: Value) -> (bool, Value) {
    tokio::time::timeout(CALL_TIMEOUT, call(client, tool, args.clone()))
        .await
        .unwrap_or_else(|_| panic!("{tool} {args} did not answer in {CALL_TIMEOUT:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srun_steps_carry_the_agent_through_the_command_transport() {
    let Some(slurm) = Slurm::start() else {
        return;
    };
    let job = slurm.hold(10);

    // Not there yet: the first call copies the agent in through srun.
    let scratch = Strays(TempDir::new("slurm-remote"));
    let state = scratch.0.path().join("state");
    let argv: Vec<String> = [
        "srun",
        &format!("--jobid={job}"),
        "--overlap",
        // Unbuffered: without it srun holds output back until a newline.
        "-u",
        "-N1",
        "-n1",
        "sh",
        "-c",
        "{command}",
    ]
    .map(String::from)
    .to_vec();
    let (config, _config_guard) = command_config("alloc", &argv, &state);
    let mut env = slurm.env();
    env.push(("OUTPOST_CONFIG", config));
    let (client, _home) = start(&env).await;

    // The step runs inside the allocation.
    let (err, r) = timed_call(
        &client,
        "exec_bash",
        json!({"command": "echo $SLURM_JOB_ID", "sandbox_name": "alloc"}),
    )
    .await;
    assert!(!err, "{r}\n{}", slurm.logs());
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], format!("{job}\n"), "{r}");
    assert!(
        state.join("agents").is_dir(),
        "agent installed under {}",
        state.display()
    );

    let file = scratch.0.path().join("files/hello.txt");
    let remote_path = file.display().to_string();
    let (err, r) = timed_call(
        &client,
        "write_remote_file",
        json!({"remote_path": remote_path, "content": "héllo\nslurm\n", "sandbox_name": "alloc"}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["status"], "written", "{r}");
    let (err, r) = timed_call(
        &client,
        "read_remote_file",
        json!({"remote_path": remote_path, "sandbox_name": "alloc"}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["content"], "héllo\nslurm\n", "{r}");
    assert_eq!(fs::read_to_string(&file).unwrap(), "héllo\nslurm\n");

    let (err, r) = timed_call(
        &client,
        "execute_code",
        json!({"code": "x = 6*7", "sandbox_name": "alloc"}),
    )
    .await;
    assert!(!err, "{r}");
    let (err, r) = timed_call(
        &client,
        "execute_code",
        json!({"code": "x", "sandbox_name": "alloc"}),
    )
    .await;
    assert!(!err, "{r}");
    // execute_code answers in a text block (it may carry images beside it).
    let r: Value = serde_json::from_str(r.as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("execute_code's answer is not JSON ({e}): {r}"));
    assert_eq!(r["results"][0]["text/plain"], "42", "{r}");

    // The allocation goes away: the next call says so rather than hanging.
    slurm.cancel(job);
    assert!(
        wait_until(Duration::from_secs(30), || slurm
            .state(job)
            .is_none_or(|s| s != "RUNNING" && s != "COMPLETING")),
        "job {job} still {:?}",
        slurm.state(job)
    );
    let (err, r) = timed_call(
        &client,
        "exec_bash",
        json!({"command": "echo still here", "sandbox_name": "alloc"}),
    )
    .await;
    // An answer, not an MCP error: the run never reached the host, and the
    // reason is srun's own.
    eprintln!("after scancel: {r}");
    assert!(err || r["connection_error"] == true, "{r}");
    let message = r.to_string();
    assert!(
        message.contains("srun: error") && message.contains("expired"),
        "{message}"
    );
    assert!(!message.contains("still here"), "{message}");

    // The step's processes (srun's side and the agent it started) end with
    // the allocation. proctrack/linuxproc follows the process tree only, so
    // the agent's double-forked daemon has left the step and outlives the
    // allocation here; a cluster with proctrack/cgroup takes it down with
    // the job's cgroup. The guard above removes it.
    let needle = state.display().to_string();
    let step_left = || -> Vec<String> {
        pids_with_cmdline(&needle)
            .iter()
            .map(|p| {
                fs::read_to_string(format!("/proc/{p}/cmdline"))
                    .unwrap_or_default()
                    .replace('\0', " ")
            })
            .filter(|cmdline| !cmdline.contains("outpost-agent daemon "))
            .filter(|cmdline| !cmdline.is_empty())
            .collect()
    };
    assert!(
        wait_until(Duration::from_secs(30), || step_left().is_empty()),
        "left running: {:?}",
        step_left()
    );
    client.cancel().await.ok();
}

/// The `local` sandbox's partitions as `list_sandboxes(check_resources=true)`
/// reports them.
async fn local_partitions(client: &Client) -> Vec<Value> {
    let (err, r) = timed_call(client, "list_sandboxes", json!({"check_resources": true})).await;
    assert!(!err, "{r}");
    let local = r["sandboxes"]
        .as_array()
        .and_then(|rows| rows.iter().find(|row| row["name"] == "local"))
        .unwrap_or_else(|| panic!("no local row: {r}"));
    let slurm = &local["resources"]["slurm"];
    assert!(slurm.get("error").is_none(), "{r}");
    slurm["partitions"]
        .as_array()
        .unwrap_or_else(|| panic!("no partitions: {r}"))
        .clone()
}

/// A login node's `list_sandboxes(check_resources=true)` carries its
/// cluster's partitions, and an allocation shows there within the agent's
/// `sinfo` interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_resources_reports_slurm_partitions() {
    let Some(slurm) = Slurm::start() else {
        return;
    };
    let (client, _home) = start(&slurm.env()).await;

    let partitions = local_partitions(&client).await;
    assert_eq!(partitions.len(), 1, "{partitions:?}");
    let test = &partitions[0];
    assert_eq!(test["name"], "test", "{test}");
    assert_eq!(test["default"], true, "{test}");
    assert_eq!(test["up"], true, "{test}");
    assert_eq!(test["nodes"]["idle"], 1, "{test}");
    assert_eq!(test["cpus"]["idle"], 16, "{test}");
    assert_eq!(test["cpus"]["total"], 16, "{test}");
    assert!(test.get("gres").is_none(), "{test}");

    let job = slurm.hold(5);
    // The agent runs sinfo at most every 10 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let last = loop {
        let partitions = local_partitions(&client).await;
        let test = partitions[0].clone();
        if test["nodes"]["allocated"] == 1 && test["cpus"]["idle"].as_u64() < Some(16) {
            break test;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "job {job} not seen after 30 s: {test}\n{}",
            slurm.logs()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert_eq!(last["nodes"]["idle"], 0, "{last}");
    assert_eq!(last["cpus"]["total"], 16, "{last}");
    slurm.cancel(job);
    client.cancel().await.ok();
}
