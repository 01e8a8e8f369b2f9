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
use outpost_e2e::{Slurm, Sshd, TempDir, kill_processes_under, pids_with_cmdline, wait_until};
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

/// A config whose sandbox `hpc` is `sshd` as a Slurm cluster's login node.
fn cluster_config(sshd: &Sshd) -> (Vec<(&'static str, String)>, TempDir) {
    let dir = TempDir::new("slurm-cluster-config");
    let path = dir.path().join("config.toml");
    let text = format!(
        "{}[sandbox.slurm]\ntime = \"10\"\n",
        sshd.sandbox_toml("hpc")
    );
    fs::write(&path, text).unwrap();
    (vec![("OUTPOST_CONFIG", path.display().to_string())], dir)
}

/// Processes whose command line names `needle`, with those command lines.
fn processes_naming(needle: &str) -> Vec<String> {
    pids_with_cmdline(needle)
        .iter()
        .map(|p| {
            fs::read_to_string(format!("/proc/{p}/cmdline"))
                .unwrap_or_default()
                .replace('\0', " ")
        })
        .filter(|cmdline| !cmdline.is_empty())
        .collect()
}

/// A command no other test runs (`sleep <unusual number>`), killed when
/// the test ends, passed or not: a failed test must leave nothing behind.
struct Marker(String);

impl Marker {
    fn new(base: u32) -> Marker {
        Marker(format!("sleep {}", base + std::process::id() % 1000))
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        for pid in pids_with_cmdline(&self.0) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// `exec_bash` on `sandbox`, once more after a connection error (the call
/// that meets a connection killed under it may fail; the next reconnects).
async fn exec_reconnecting(client: &Client, sandbox: &str, command: &str) -> Value {
    let args = json!({"command": command, "sandbox_name": sandbox});
    let (err, r) = timed_call(client, "exec_bash", args.clone()).await;
    if !err && r["exit_code"] == 0 {
        return r;
    }
    eprintln!("first call after the cut: {r}");
    let (err, r) = timed_call(client, "exec_bash", args).await;
    assert!(!err && r["exit_code"] == 0, "{r}");
    r
}

/// A sandbox on a cluster is a Slurm allocation, end to end over SSH to the
/// login node: create → exec on the allocated node → sync → a background
/// job → the SSH connection killed (the next call reconnects; the job and
/// the allocation live on) → renew → delete, after which the allocation is
/// gone from squeue and nothing it ran is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_sandbox_is_an_allocation_over_ssh() {
    let Some(slurm) = Slurm::start() else {
        return;
    };
    let sshd = Sshd::start_with_env(&slurm.env());
    let (env, _config) = cluster_config(&sshd);
    let (client, _home) = start(&env).await;
    let sleeper = Marker::new(31_000);

    let (err, r) = timed_call(
        &client,
        "create_sandbox",
        json!({"host": "hpc", "ttl_s": 600, "limits": {"cpus": 2, "memory_mb": 500}}),
    )
    .await;
    assert!(!err, "{r}\n{}", slurm.logs());
    let name = r["sandbox_name"].as_str().unwrap().to_string();
    let job: u32 = name
        .strip_prefix("hpc/job-")
        .and_then(|j| j.parse().ok())
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(r["state"], "running", "{r}");
    assert_eq!(r["isolation"], "slurm", "{r}");
    assert_eq!(r["limits"]["cpus"], 2.0, "{r}");
    assert_eq!(r["limits"]["memory_mb"], 500, "{r}");
    assert_eq!(slurm.state(job).as_deref(), Some("RUNNING"));
    let state_dir = sshd.remote_dir().join(format!("slurm/{job}"));
    assert!(
        state_dir.join("owner.pid").is_file(),
        "{}",
        state_dir.display()
    );

    // Commands run in the allocation, as the login user.
    let (err, r) = timed_call(
        &client,
        "exec_bash",
        json!({"command": "echo $SLURM_JOB_ID; id -un", "sandbox_name": name}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["stdout"], format!("{job}\n{}\n", sshd.user()), "{r}");

    // A code context on the node.
    let (err, r) = timed_call(
        &client,
        "execute_code",
        json!({"code": "import os; os.environ['SLURM_JOB_ID']", "sandbox_name": name}),
    )
    .await;
    assert!(!err, "{r}");
    let r: Value = serde_json::from_str(r.as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("execute_code's answer is not JSON ({e}): {r}"));
    assert_eq!(r["results"][0]["text/plain"], format!("'{job}'"), "{r}");

    // A tree synced to the node's filesystem.
    let local = TempDir::new("slurm-sync-src");
    fs::create_dir_all(local.path().join("src")).unwrap();
    fs::write(local.path().join("src/main.py"), "print('hi')\n").unwrap();
    fs::write(local.path().join("data.bin"), vec![7u8; 300_000]).unwrap();
    let remote = sshd.remote_dir().join("synced");
    let (err, r) = timed_call(
        &client,
        "sync_local_to_remote",
        json!({"local_path": local.path(), "remote_path": remote, "sandbox_name": name}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(
        fs::read(remote.join("data.bin")).unwrap(),
        vec![7u8; 300_000]
    );
    assert_eq!(
        fs::read_to_string(remote.join("src/main.py")).unwrap(),
        "print('hi')\n"
    );

    // A background job in the allocation survives the login connection.
    let (err, r) = timed_call(
        &client,
        "exec_bash_background",
        json!({"command": format!("echo started; exec {}", sleeper.0), "sandbox_name": name}),
    )
    .await;
    assert!(!err, "{r}");
    let task = r["tmux_session"].as_str().unwrap().to_string();
    assert!(
        wait_until(Duration::from_secs(10), || !processes_naming(&sleeper.0)
            .is_empty()),
        "the job did not start"
    );
    // Its daemon is the holder's (in the batch step, which lasts as long as
    // the allocation), not one of a serve's step.
    let daemon = fs::read_to_string(state_dir.join("run/daemon.json")).unwrap();
    assert!(daemon.contains("slurm-holder"), "{daemon}");
    sshd.kill_connections();
    let r = exec_reconnecting(&client, &name, "echo $SLURM_JOB_ID").await;
    assert_eq!(r["stdout"], format!("{job}\n"), "{r}");
    let (err, r) = timed_call(
        &client,
        "check_background_task",
        json!({"tmux_session": task, "sandbox_name": name}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["state"], "running", "{r}");
    assert_eq!(slurm.state(job).as_deref(), Some("RUNNING"));

    // Listed under its cluster, renewable.
    let (err, r) = timed_call(&client, "list_sandboxes", json!({})).await;
    assert!(!err, "{r}");
    let hpc = r["sandboxes"]
        .as_array()
        .and_then(|rows| rows.iter().find(|row| row["name"] == "hpc"))
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(hpc["sandboxes"][0]["sandbox_name"], name.as_str(), "{r}");
    let (err, r) = timed_call(
        &client,
        "renew_sandbox",
        json!({"sandbox_name": name, "ttl_s": 900}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["state"], "running", "{r}");
    // Slurm's 10-minute limit comes before a 15-minute TTL.
    let deadline: u64 = fs::read_to_string(state_dir.join("deadline"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        (now + 890..=now + 910).contains(&deadline),
        "{deadline} vs {now}"
    );

    // Deleted: the allocation leaves squeue; its job, agent and dir go too.
    let (err, r) = timed_call(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
    assert!(!err, "{r}");
    assert_eq!(r["state"], "deleted", "{r}");
    assert!(
        wait_until(Duration::from_secs(15), || slurm
            .state(job)
            .is_none_or(|s| s != "RUNNING" && s != "COMPLETING")),
        "job {job} still {:?}",
        slurm.state(job)
    );
    assert!(
        wait_until(Duration::from_secs(15), || processes_naming(&sleeper.0)
            .is_empty()),
        "the job outlived its allocation: {:?}\ndaemon log: {}",
        processes_naming(&sleeper.0),
        fs::read_to_string(state_dir.join("run/daemon.log")).unwrap_or_default()
    );
    let needle = state_dir.display().to_string();
    assert!(
        wait_until(Duration::from_secs(15), || processes_naming(&needle)
            .is_empty()
            && !state_dir.exists()),
        "left: {:?}, dir there: {}",
        processes_naming(&needle),
        state_dir.exists()
    );
    let (err, r) = timed_call(
        &client,
        "exec_bash",
        json!({"command": "true", "sandbox_name": name}),
    )
    .await;
    assert!(err || r["exit_code"] != 0, "{r}");
    client.cancel().await.ok();
}

/// An allocation ends at its TTL with no controller connected, and takes
/// what it ran along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_sandbox_ends_at_its_ttl_without_a_controller() {
    let Some(slurm) = Slurm::start() else {
        return;
    };
    let sshd = Sshd::start_with_env(&slurm.env());
    let (env, _config) = cluster_config(&sshd);
    let (client, _home) = start(&env).await;
    let sleeper = Marker::new(32_000);
    let (err, r) = timed_call(
        &client,
        "create_sandbox",
        json!({"host": "hpc", "ttl_s": 8, "keep": true}),
    )
    .await;
    assert!(!err, "{r}\n{}", slurm.logs());
    let name = r["sandbox_name"].as_str().unwrap().to_string();
    let job: u32 = name.strip_prefix("hpc/job-").unwrap().parse().unwrap();
    let (err, r) = timed_call(
        &client,
        "exec_bash_background",
        json!({"command": format!("exec {}", sleeper.0), "sandbox_name": name}),
    )
    .await;
    assert!(!err, "{r}");
    client.cancel().await.ok();

    assert!(
        wait_until(Duration::from_secs(40), || slurm
            .state(job)
            .is_none_or(|s| s != "RUNNING" && s != "COMPLETING")),
        "job {job} still {:?} past its TTL",
        slurm.state(job)
    );
    let state_dir = sshd.remote_dir().join(format!("slurm/{job}"));
    assert!(
        wait_until(Duration::from_secs(15), || processes_naming(&sleeper.0)
            .is_empty()
            && !state_dir.exists()),
        "left: {:?}, dir there: {}",
        processes_naming(&sleeper.0),
        state_dir.exists()
    );
}

/// An allocation that cannot start yet is listed as pending with Slurm's
/// reason while `create_sandbox` waits, and starts once resources free up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_sandbox_waits_in_the_queue_and_says_why() {
    let Some(slurm) = Slurm::start() else {
        return;
    };
    let sshd = Sshd::start_with_env(&slurm.env());
    let (env, _config) = cluster_config(&sshd);
    let (client, _home) = start(&env).await;
    // The node has 16 CPUs: the first takes them all.
    let whole_node = json!({"host": "hpc", "limits": {"cpus": 16}});
    let (err, first) = timed_call(&client, "create_sandbox", whole_node.clone()).await;
    assert!(!err, "{first}\n{}", slurm.logs());
    let first = first["sandbox_name"].as_str().unwrap().to_string();

    let second = timed_call(&client, "create_sandbox", whole_node);
    let watch = async {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let pending = loop {
            let (err, r) = timed_call(&client, "list_sandboxes", json!({})).await;
            assert!(!err, "{r}");
            let listed = r["sandboxes"]
                .as_array()
                .and_then(|rows| rows.iter().find(|row| row["name"] == "hpc"))
                .and_then(|row| row["sandboxes"].as_array().cloned())
                .unwrap_or_default();
            // Right after the submit Slurm gives no reason yet.
            if let Some(p) = listed.iter().find(|s| {
                s["state"] == "pending" && s["note"].as_str().is_some_and(|n| n.contains(": "))
            }) {
                break p.clone();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no pending sandbox listed: {r}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let note = pending["note"].as_str().unwrap_or_default();
        assert!(
            note.contains("Resources") || note.contains("Priority"),
            "{pending}"
        );
        let (err, r) = timed_call(&client, "delete_sandbox", json!({"sandbox_name": first})).await;
        assert!(!err, "{r}");
        pending["sandbox_name"].as_str().unwrap().to_string()
    };
    let ((err, r), listed_name) = tokio::join!(second, watch);
    assert!(!err, "{r}");
    assert_eq!(r["state"], "running", "{r}");
    assert_eq!(r["sandbox_name"], listed_name.as_str(), "{r}");
    let (err, r) = timed_call(
        &client,
        "exec_bash",
        json!({"command": "echo $SLURM_JOB_ID", "sandbox_name": listed_name}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(
        r["stdout"],
        format!("{}\n", listed_name.strip_prefix("hpc/job-").unwrap()),
        "{r}"
    );
    let (err, r) = timed_call(
        &client,
        "delete_sandbox",
        json!({"sandbox_name": listed_name}),
    )
    .await;
    assert!(!err, "{r}");
    client.cancel().await.ok();
}
