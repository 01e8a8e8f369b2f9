//! Slurm batch jobs as background tasks, end to end on a private
//! single-node cluster ([`outpost_e2e::Slurm`]): the `local` sandbox
//! inherits `SLURM_CONF`, so it is a login node of that cluster, and
//! `exec_bash_background(scheduler="slurm")` submits through it. The task
//! tools then report the job's exact exit code and log, wait for it,
//! cancel it (nothing of it left running), see Slurm's time limit end it,
//! and list many jobs in one call.
//!
//! Skipped (with a line on stderr) without root or Slurm; see
//! `scripts/setup-test-env`.

mod common;

use std::fs;
use std::time::Duration;

use common::mcp_client::{Client, call, start};
use outpost_e2e::{Slurm, TempDir, pids_with_cmdline, pids_with_env, wait_until};
use serde_json::{Value, json};

/// Bounds each MCP call, so a hang fails the test instead of stalling it.
const CALL_TIMEOUT: Duration = Duration::from_secs(240);

async fn timed_call(client: &Client, tool: &'static str, args: Value) -> (bool, Value) {
    tokio::time::timeout(CALL_TIMEOUT, call(client, tool, args.clone()))
        .await
        .unwrap_or_else(|_| panic!("{tool} {args} did not answer in {CALL_TIMEOUT:?}"))
}

/// A command-line marker no other test's processes carry.
fn marker(tag: &str) -> String {
    format!("{tag}{}x{}", std::process::id(), rand_suffix())
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
}

/// `sleep` for 1000 s, told apart by `tag` (GNU sleep takes a fraction).
fn long_sleep(tag: u32) -> String {
    format!("sleep 1000.{}{tag}", std::process::id())
}

/// SIGKILLs every process whose command line holds one of its needles,
/// and every process of its server's home (the agent's job daemon, which
/// outlives a server), when the test ends, passed or not: a job's
/// processes may also leave its process tree, where the cluster's
/// linuxproc tracker no longer finds them.
struct Strays {
    needles: Vec<String>,
    home: String,
}

impl Drop for Strays {
    fn drop(&mut self) {
        let mut pids = pids_with_env(&format!("HOME={}", self.home));
        for needle in &self.needles {
            pids.extend(pids_with_cmdline(needle));
        }
        for pid in pids {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// The server with the advanced tools (read_background_log among them),
/// its `local` sandbox a login node of `slurm`; the guard kills what is
/// left of it and of the processes `needles` name.
async fn login_client(slurm: &Slurm, needles: &[&str]) -> (Client, TempDir, Strays) {
    let mut env = slurm.env();
    env.push(("REMOTE_SANDBOX_EXPOSE_ADVANCED_TOOLS", "1".into()));
    let (client, home) = start(&env).await;
    let strays = Strays {
        needles: needles.iter().map(|n| n.to_string()).collect(),
        home: home.path().display().to_string(),
    };
    (client, home, strays)
}

/// Submits `args` (plus scheduler="slurm") and returns the task's name.
async fn submit(client: &Client, mut args: Value) -> String {
    args["scheduler"] = json!("slurm");
    let (err, r) = timed_call(client, "exec_bash_background", args).await;
    assert!(!err, "{r}");
    assert_eq!(r["status"], "submitted", "{r}");
    let name = r["tmux_session"].as_str().unwrap().to_string();
    assert!(name.starts_with("slurm-"), "{r}");
    assert!(r.get("watch_id").is_none(), "{r}");
    name
}

async fn wait_task(client: &Client, name: &str, timeout_s: u64) -> Value {
    let (err, r) = timed_call(
        client,
        "wait_background_task",
        json!({"name": name, "timeout_s": timeout_s, "cursor": 0}),
    )
    .await;
    assert!(!err, "{r}");
    r
}

/// Polls check_background_task until `done` says so (at most `limit`).
async fn check_until(
    client: &Client,
    name: &str,
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let (err, r) = timed_call(
            client,
            "check_background_task",
            json!({"tmux_session": name}),
        )
        .await;
        assert!(!err, "{r}");
        if done(&r) || std::time::Instant::now() >= deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_jobs_report_exact_exit_codes_logs_env_and_cwd() {
    let Some(slurm) = Slurm::start() else {
        return;
    };
    let (client, home, _strays) = login_client(&slurm, &[]).await;

    let name = submit(
        &client,
        json!({"command": "echo hi; echo err >&2; exit 7", "time": "5"}),
    )
    .await;
    let r = wait_task(&client, &name, 120).await;
    assert_eq!(r["reason"], "ended", "{r}\n{}", slurm.logs());
    assert_eq!(r["state"], "exited", "{r}");
    assert_eq!(r["exit_code"], 7, "{r}");
    assert_eq!(r["output"], "hi\nerr\n", "{r}");
    assert!(r["cursor"].as_u64() == Some(7), "{r}");

    let (err, r) = timed_call(
        &client,
        "check_background_task",
        json!({"tmux_session": name}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(
        (&r["state"], &r["exit_code"], &r["running"]),
        (&json!("exited"), &json!(7), &json!(false)),
        "{r}"
    );
    assert_eq!(r["log_tail"], "hi\nerr\n", "{r}");
    assert!(
        r.get("signal").is_none() && r.get("detail").is_none(),
        "{r}"
    );

    // The log, paged, tailed and grepped, exactly as written.
    for (args, content) in [
        (json!({"offset": 0}), "hi\nerr\n"),
        (json!({"offset": 3}), "err\n"),
        (json!({"tail_lines": 1}), "err\n"),
        (json!({"grep": "^h"}), "hi\n"),
        (json!({"offset": 0, "max_bytes": 2}), "hi"),
    ] {
        let mut args = args.clone();
        args["name"] = json!(name);
        let (err, r) = timed_call(&client, "read_background_log", args.clone()).await;
        assert!(!err, "{args}: {r}");
        assert_eq!(r["content"], content, "{args}: {r}");
        assert_eq!(r["size"], 7, "{args}: {r}");
    }
    // The log lies in the private batch dir of the login node's home.
    let batch_dir = home.path().join(".outpost/batch");
    let job = name.trim_start_matches("slurm-");
    assert_eq!(
        fs::read_to_string(batch_dir.join(format!("{job}.log"))).unwrap(),
        "hi\nerr\n"
    );
    assert_eq!(
        fs::read_to_string(batch_dir.join(format!("{job}.exit"))).unwrap(),
        "7\n"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(&batch_dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}", batch_dir.display());

    // env and cwd reach the command as data, never as options or code.
    let work = TempDir::new("slurm batch 'cwd'");
    let name = submit(
        &client,
        json!({
            "command": "pwd; printf '%s|%s|%s\\n' \"$A\" \"$B\" \"$SLURM_JOB_ID\"",
            "cwd": work.path().display().to_string(),
            "env": {"A": "it's $(id) `id` --wrap=x", "B": "two\nlines"},
        }),
    )
    .await;
    let r = wait_task(&client, &name, 120).await;
    assert_eq!(
        (&r["state"], &r["exit_code"]),
        (&json!("exited"), &json!(0)),
        "{r}"
    );
    let job = name.trim_start_matches("slurm-");
    assert_eq!(
        r["output"],
        format!(
            "{}\nit's $(id) `id` --wrap=x|two\nlines|{job}\n",
            work.path().display()
        ),
        "{r}"
    );

    // A command killed by a signal: 128+N as a shell reports it.
    let name = submit(&client, json!({"command": "kill -9 $$"})).await;
    let r = wait_task(&client, &name, 120).await;
    assert_eq!(
        (&r["state"], &r["exit_code"]),
        (&json!("exited"), &json!(137)),
        "{r}"
    );

    // What is checked before anything is submitted.
    for (args, word) in [
        (
            json!({"command": "true", "scheduler": "slurm", "time": "1;id"}),
            "bad time",
        ),
        (
            json!({"command": "true", "scheduler": "slurm", "partition": "--wrap=id"}),
            "partition",
        ),
        (
            json!({"command": "true", "scheduler": "slurm", "cwd": "/nonexistent/x"}),
            "cwd",
        ),
        (
            json!({"command": "true", "scheduler": "slurm", "env": {"BASH_ENV": "x"}}),
            "BASH_ENV",
        ),
        (
            json!({"command": "true", "scheduler": "slurm", "session_name": "x"}),
            "session_name",
        ),
        (json!({"command": "true", "gpus": 1}), "scheduler"),
        (json!({"command": "true", "scheduler": "pbs"}), "scheduler"),
        (
            json!({"command": "true", "session_name": "slurm-5"}),
            "slurm-",
        ),
    ] {
        let (err, r) = timed_call(&client, "exec_bash_background", args.clone()).await;
        assert!(err && r.to_string().contains(word), "{args}: {r}");
    }
    // The host's own jobs take env too.
    let (err, r) = timed_call(
        &client,
        "exec_bash_background",
        json!({"command": "printf '%s' \"$A\"", "env": {"A": "it's $(id)"}, "session_name": "host-env"}),
    )
    .await;
    assert!(!err, "{r}");
    let r = wait_task(&client, "host-env", 60).await;
    assert_eq!(
        (&r["state"], &r["output"]),
        (&json!("exited"), &json!("it's $(id)")),
        "{r}"
    );

    let (err, r) = timed_call(
        &client,
        "check_background_task",
        json!({"tmux_session": "slurm-999999"}),
    )
    .await;
    assert!(err && r.to_string().contains("no Slurm batch task"), "{r}");
    client.cancel().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_leaves_nothing_of_a_batch_job_running() {
    let Some(slurm) = Slurm::start() else {
        return;
    };
    let (plain, stubborn) = (long_sleep(1), long_sleep(2));
    let (client, _home, _strays) = login_client(&slurm, &[&plain, &stubborn]).await;

    for (command, needle, grace) in [
        (plain.clone(), &plain, 3),
        // TERM is ignored: the cancel's KILL ends it after the grace.
        (
            format!("trap '' TERM; {stubborn}; echo not reached"),
            &stubborn,
            1,
        ),
    ] {
        let name = submit(&client, json!({"command": command, "time": "10"})).await;
        let r = check_until(&client, &name, Duration::from_secs(60), |r| {
            r["state"] == "running"
        })
        .await;
        assert_eq!(r["state"], "running", "{r}\n{}", slurm.logs());
        assert!(
            wait_until(Duration::from_secs(30), || !pids_with_cmdline(needle)
                .is_empty()),
            "{needle} never started"
        );
        let (err, r) = timed_call(
            &client,
            "cancel_background_task",
            json!({"name": name, "grace_s": grace}),
        )
        .await;
        assert!(!err, "{r}");
        assert_eq!(
            (&r["name"], &r["state"]),
            (&json!(name), &json!("cancelled")),
            "{r}"
        );
        assert!(r.get("exit_code").is_none(), "{r}");
        let left = pids_with_cmdline(needle);
        assert!(
            left.is_empty(),
            "{needle} still runs after the cancel: {left:?}"
        );
        // The end stays known.
        let (err, r) = timed_call(
            &client,
            "check_background_task",
            json!({"tmux_session": name}),
        )
        .await;
        assert!(!err, "{r}");
        assert_eq!(
            (&r["state"], &r["running"]),
            (&json!("cancelled"), &json!(false)),
            "{r}"
        );
        assert!(!r["log_tail"].to_string().contains("not reached"), "{r}");
    }
    client.cancel().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_job_past_its_time_limit_reports_timeout() {
    let Some(slurm) = Slurm::start() else {
        return;
    };
    let sleeper = format!("sleep 600.{}", std::process::id());
    let (client, _home, _strays) = login_client(&slurm, &[&sleeper]).await;
    // Slurm's smallest limit is a minute; it ends the job then, give or
    // take its KillWait and the controller's check interval.
    let name = submit(
        &client,
        json!({"command": format!("echo started; {sleeper}"), "time": "1"}),
    )
    .await;
    let began = std::time::Instant::now();
    let r = wait_task(&client, &name, 200).await;
    eprintln!(
        "time limit reported after {:.0} s: {r}",
        began.elapsed().as_secs_f64()
    );
    assert_eq!(r["reason"], "ended", "{r}\n{}", slurm.logs());
    assert_eq!(r["state"], "timeout", "{r}");
    assert!(
        r["output"].as_str().unwrap().starts_with("started\n"),
        "{r}"
    );
    assert!(
        wait_until(Duration::from_secs(10), || pids_with_cmdline(&sleeper)
            .is_empty()),
        "{sleeper} outlived its job"
    );
    client.cancel().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_list_call_reports_many_batch_jobs_beside_host_jobs() {
    let Some(slurm) = Slurm::start() else {
        return;
    };
    let tag = marker("outpost-list-");
    let (client, _home, _strays) = login_client(&slurm, &[&tag]).await;
    const JOBS: usize = 24;
    let mut names = Vec::new();
    for i in 0..JOBS {
        let name = submit(&client, json!({"command": format!("echo {tag}; exit {i}")})).await;
        names.push(name);
    }
    // A job of the host's daemon, listed beside them.
    let (err, r) = timed_call(
        &client,
        "exec_bash_background",
        json!({"command": "echo host job", "session_name": "beside"}),
    )
    .await;
    assert!(!err, "{r}");

    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let tasks = loop {
        let (err, r) = timed_call(&client, "list_background_tasks", json!({"limit": 100})).await;
        assert!(!err, "{r}");
        assert!(r.get("slurm_error").is_none(), "{r}");
        let tasks = r["tasks"].as_array().unwrap().clone();
        let ended = tasks
            .iter()
            .filter(|t| t["name"].as_str().is_some_and(|n| n.starts_with("slurm-")))
            .filter(|t| t["state"] == "exited")
            .count();
        if ended == JOBS || std::time::Instant::now() >= deadline {
            break tasks;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for (i, name) in names.iter().enumerate() {
        let row = tasks
            .iter()
            .find(|t| t["name"] == json!(name))
            .unwrap_or_else(|| panic!("{name} not listed: {tasks:?}"));
        assert_eq!(
            (&row["state"], &row["exit_code"]),
            (&json!("exited"), &json!(i)),
            "{row}"
        );
        assert_eq!(row["command"], format!("echo {tag}; exit {i}"), "{row}");
        assert!(row["started"].as_str().unwrap().ends_with('Z'), "{row}");
    }
    assert!(tasks.iter().any(|t| t["name"] == "beside"), "{tasks:?}");
    // Oldest first: the batch jobs in submission order.
    let order: Vec<&str> = tasks
        .iter()
        .filter_map(|t| t["name"].as_str())
        .filter(|n| names.iter().any(|m| m == n))
        .collect();
    assert_eq!(order, names.iter().map(String::as_str).collect::<Vec<_>>());
    client.cancel().await.ok();
}
