//! Calls that outlast the client's patience: an `exec_bash` still running
//! when the client's budget is spent answers with a job name and the output
//! so far, goes on running, and `wait_background_task` returns its end and
//! every byte, on the local sandbox and over a real sshd.

// Tests run on a multi-threaded runtime: the harness blocks while the
// controller's background tasks must keep running.

mod common;

use std::time::{Duration, Instant};

use common::mcp_client::{Client, call, start_as};
use outpost_e2e::{Sshd, TempDir, pids_with_cmdline, wait_until};
use rmcp::ClientHandler;
use rmcp::model::{ClientCapabilities, Implementation, InitializeRequestParams};
use serde_json::{Value, json};

/// A client that introduces itself by `name` and nothing else.
#[derive(Clone)]
struct Named(&'static str);

impl ClientHandler for Named {
    fn get_info(&self) -> InitializeRequestParams {
        InitializeRequestParams::new(
            ClientCapabilities::default(),
            Implementation::new(self.0, "1.0"),
        )
    }
}

/// `outpost mcp` with the local sandbox and `sshd` as "box", and `extra`
/// at the top of its config file.
async fn server(
    client: &'static str,
    sshd: &Sshd,
    extra: &str,
) -> (Client<Named>, TempDir, TempDir) {
    let dir = common::scratch("deadline-config");
    let path = dir.path().join("config.toml");
    std::fs::write(&path, format!("{extra}\n{}", sshd.sandbox_toml("box"))).unwrap();
    let env = [("OUTPOST_CONFIG", path.display().to_string())];
    let (client, home) = start_as(Named(client), &env).await;
    (client, home, dir)
}

async fn exec(client: &Client<Named>, sandbox: &str, args: Value) -> (Value, Duration) {
    let mut args = args.as_object().unwrap().clone();
    args.insert("sandbox_name".into(), json!(sandbox));
    let t = Instant::now();
    let (err, r) = call(client, "exec_bash", Value::Object(args)).await;
    assert!(!err, "{r}");
    (r, t.elapsed())
}

async fn wait_end(client: &Client<Named>, sandbox: &str, name: &str) -> Value {
    let args = json!({"name": name, "sandbox_name": sandbox, "timeout_s": 120});
    let (err, r) = call(client, "wait_background_task", args).await;
    assert!(!err, "{r}");
    assert_eq!(r["reason"], "ended", "{r}");
    r
}

/// The job a `running` result names, checked for the fields it must carry.
fn job_of(r: &Value) -> String {
    assert_eq!(r["running"], true, "{r}");
    assert!(r.get("exit_code").is_none(), "{r}");
    let job = r["job"].as_str().unwrap().to_string();
    assert_eq!(r["next"], format!("wait_background_task(name=\"{job}\")"));
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_the_budget_leaves_its_command_running_as_a_job() {
    let sshd = Sshd::new();
    let (client, _home, _config) =
        server("some-agent", &sshd, "[client_budget_s]\ndefault = 3").await;
    // And in bwrap sandboxes, whose commands start inside without
    // `outpost-agent enter`: as root here, as the test user over SSH.
    let mut sandboxes = vec!["local".to_string(), "box".to_string()];
    for host in ["local", "box"] {
        let (err, made) = call(
            &client,
            "create_sandbox",
            json!({"host": host, "isolation": "bwrap"}),
        )
        .await;
        assert!(!err && made["isolation"] == "bwrap", "{made}");
        sandboxes.push(made["sandbox_name"].as_str().unwrap().to_string());
    }
    let mut host_jobs = std::collections::HashMap::new();
    for sandbox in sandboxes.iter().map(String::as_str) {
        // Ends within the budget: an ordinary result, streams apart, no job left.
        let (r, _) = exec(
            &client,
            sandbox,
            json!({"command": "printf a; printf b >&2; exit 3"}),
        )
        .await;
        assert_eq!(
            (&r["exit_code"], &r["stdout"], &r["stderr"]),
            (&json!(3), &json!("a"), &json!("b")),
            "{r}"
        );
        assert!(
            r.get("job").is_none() && r["duration_s"].as_f64().unwrap() < 3.0,
            "{r}"
        );

        // Outlasts it: the output so far, then the rest and the exact code.
        let command = "echo out1; echo err1 >&2; sleep 5; echo out2; echo err2 >&2; exit 7";
        let (r, took) = exec(
            &client,
            sandbox,
            json!({"command": command, "timeout_s": 60}),
        )
        .await;
        assert!(took < Duration::from_secs(5), "{took:?}");
        let job = job_of(&r);
        assert_eq!(
            (&r["stdout"], &r["stderr"]),
            (&json!("out1\n"), &json!("err1\n")),
            "{r}"
        );
        let (_, listed) = call(
            &client,
            "list_background_tasks",
            json!({"sandbox_name": sandbox}),
        )
        .await;
        assert_eq!(listed["tasks"][0]["name"], job.as_str(), "{listed}");
        // A sandbox sees only its own jobs: the host's are unknown there.
        if sandbox.contains('/') {
            assert_eq!(listed["tasks"].as_array().unwrap().len(), 1, "{listed}");
            let host_job = &host_jobs[sandbox.split('/').next().unwrap()];
            let args = json!({"name": host_job, "sandbox_name": sandbox, "timeout_s": 1});
            let (err, r) = call(&client, "wait_background_task", args).await;
            assert!(err && r.to_string().contains("no job named"), "{r}");
        } else {
            host_jobs.insert(sandbox.to_string(), job.clone());
        }
        let w = wait_end(&client, sandbox, &job).await;
        assert_eq!(
            (&w["state"], &w["exit_code"]),
            (&json!("exited"), &json!(7)),
            "{w}"
        );
        let mut lines: Vec<&str> = w["output"].as_str().unwrap().lines().collect();
        lines.sort();
        assert_eq!(lines, ["err1", "err2", "out1", "out2"], "{w}");

        // Its timeout_s still kills the whole tree at the deadline.
        let needle = format!("sleep 100.{}", std::process::id());
        let command = format!("{needle} & {needle}; wait");
        let (r, _) = exec(
            &client,
            sandbox,
            json!({"command": command, "timeout_s": 6}),
        )
        .await;
        let job = job_of(&r);
        let w = wait_end(&client, sandbox, &job).await;
        assert_eq!(w["exit_code"], 124, "{w}");
        assert!(wait_until(Duration::from_secs(5), || pids_with_cmdline(
            &needle
        )
        .is_empty()));

        // env and stdin reach the command either way.
        for timeout_s in [2, 60] {
            let args = json!({"command": "echo $GREETING; cat", "env": {"GREETING": "hi"},
                "stdin": "in\n", "timeout_s": timeout_s});
            let (r, _) = exec(&client, sandbox, args).await;
            assert_eq!(r["stdout"], "hi\nin\n", "{timeout_s}: {r}");
        }

        // A command that fits the budget runs inline however long it is.
        let (r, _) = exec(
            &client,
            sandbox,
            json!({"command": "echo quick", "timeout_s": 2}),
        )
        .await;
        assert_eq!(r["stdout"], "quick\n");
    }
    client.cancel().await.unwrap();
}

/// The issue's own case: Codex cuts every call at 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_gets_an_answer_within_a_minute_and_the_whole_output_after() {
    let sshd = Sshd::new();
    let (client, _home, _config) = server("codex-mcp-client", &sshd, "").await;
    let command = json!({"command": "echo begun; sleep 75; echo done"});
    let ((local, local_took), (remote, remote_took)) = tokio::join!(
        exec(&client, "local", command.clone()),
        exec(&client, "box", command.clone())
    );
    for (sandbox, r, took) in [("local", local, local_took), ("box", remote, remote_took)] {
        assert!(took < Duration::from_secs(55), "{sandbox}: {took:?}");
        assert!(took > Duration::from_secs(45), "{sandbox}: {took:?}");
        let job = job_of(&r);
        assert_eq!(r["stdout"], "begun\n");
        let w = wait_end(&client, sandbox, &job).await;
        assert_eq!(
            (&w["exit_code"], &w["output"]),
            (&json!(0), &json!("begun\ndone\n")),
            "{sandbox}: {w}"
        );
    }
    client.cancel().await.unwrap();
}

/// On a host whose disk is full no job can be recorded, yet an exec with a
/// budget still runs: inline, as every exec starts, so the `rm` that would
/// free the disk is never refused; one still running at the budget is
/// stopped then, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_still_runs_an_exec_and_stops_it_at_the_budget() {
    let sshd = Sshd::start();
    let (client, _home, _config) = server("claude-code", &sshd, "").await;
    // Connected, a job recorded (so its jobs dir exists), then that dir
    // made full.
    let (r, _) = exec(
        &client,
        "box",
        json!({"command": "sleep 1", "background_after_s": 0.2}),
    )
    .await;
    let job = job_of(&r);
    assert_eq!(wait_end(&client, "box", &job).await["exit_code"], 0);
    let jobs = sshd.remote_dir().join("jobs");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k,mode=0777", "tmpfs"])
        .arg(&jobs)
        .status()
        .unwrap();
    assert!(mounted.success(), "cannot mount a tmpfs (needs root)");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let _unmount = Unmount(jobs.clone());
    let fill = jobs.join("fill");
    let _ = std::fs::write(&fill, vec![0u8; 1 << 20]);
    let (r, took) = exec(
        &client,
        "box",
        json!({"command": "echo begun; sleep 30", "background_after_s": 1}),
    )
    .await;
    assert!(took < Duration::from_secs(10), "{took:?}");
    let note = r["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("background job") && note.contains("no room"),
        "{r}"
    );
    assert_eq!(r["stdout"], "begun\n", "{r}");
    assert!(r.get("job").is_none(), "{r}");
    let (r, _) = exec(
        &client,
        "box",
        json!({"command": format!("rm {} && echo freed", fill.display()), "background_after_s": 30}),
    )
    .await;
    assert_eq!(
        (&r["exit_code"], &r["stdout"]),
        (&json!(0), &json!("freed\n")),
        "{r}"
    );
    assert!(r.get("note").is_none(), "{r}");
    client.cancel().await.unwrap();
}
