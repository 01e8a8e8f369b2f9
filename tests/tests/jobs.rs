//! Background jobs through `outpost mcp` against a real sshd, with real faults:
//! the connection's sshd killed, the controller killed and restarted.

// Tests run on a multi-threaded runtime: the harness blocks while the
// controller's background tasks must keep running.

mod common;

use std::time::{Duration, Instant};

use common::mcp_client::{Client, call, isolated_env, start};
use outpost_e2e::Sshd;
use serde_json::{Value, json};

async fn start_job(client: &Client, args: Value) -> String {
    let (err, r) = call(client, "exec_bash_background", args).await;
    assert!(!err, "{r}");
    assert_eq!(r["status"], "started");
    r["tmux_session"].as_str().unwrap().to_string()
}

async fn wait(client: &Client, name: &str, args: Value) -> Value {
    let mut args = args.as_object().unwrap().clone();
    args.insert("name".into(), json!(name));
    let (err, r) = call(client, "wait_background_task", Value::Object(args)).await;
    assert!(!err, "{r}");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_are_exact_and_names_never_collide() {
    let sshd = Sshd::start();
    let (env, _config) = isolated_env(&sshd);
    let (client, _home) = start(&env).await;

    let seven = start_job(&client, json!({"command": "exit 7"})).await;
    let killed = start_job(&client, json!({"command": "kill -9 $$"})).await;
    let liar = start_job(&client, json!({"command": "echo EXIT_CODE=0; exit 3"})).await;
    // Started within the same second with default names: all distinct.
    assert!(seven != killed && killed != liar && seven != liar);

    let r = wait(&client, &seven, json!({"timeout_s": 30})).await;
    assert_eq!(r["reason"], "ended");
    assert_eq!(r["exit_code"], 7);
    let r = wait(&client, &killed, json!({"timeout_s": 30})).await;
    assert_eq!(r["signal"], 9, "{r}");
    assert!(r["exit_code"].is_null(), "{r}");
    let r = wait(&client, &liar, json!({"timeout_s": 30})).await;
    assert_eq!(r["exit_code"], 3, "{r}");

    let (_, r) = call(
        &client,
        "check_background_task",
        json!({"tmux_session": liar}),
    )
    .await;
    assert_eq!(r["running"], false);
    assert_eq!(r["exit_code"], 3);
    assert!(r["log_tail"].as_str().unwrap().contains("EXIT_CODE=0"));

    let (err, r) = call(
        &client,
        "exec_bash_background",
        json!({"command": "true", "session_name": "dup"}),
    )
    .await;
    assert!(!err, "{r}");
    let (err, r) = call(
        &client,
        "exec_bash_background",
        json!({"command": "true", "session_name": "dup"}),
    )
    .await;
    assert!(err && r.to_string().contains("dup"), "{r}");

    let (_, r) = call(&client, "list_background_tasks", json!({})).await;
    let all = r["tasks"].as_array().unwrap().len();
    assert!(all >= 4, "{r}");
    assert!(r.get("older_omitted").is_none(), "{r}");
    // A limit keeps the newest and counts the rest.
    let (_, r) = call(&client, "list_background_tasks", json!({"limit": 2})).await;
    assert_eq!(r["tasks"].as_array().unwrap().len(), 2, "{r}");
    assert_eq!(r["older_omitted"], json!(all - 2), "{r}");
    assert_eq!(r["tasks"][1]["name"], json!("dup"), "{r}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_outlives_its_connection_and_its_controller() {
    let sshd = Sshd::start();
    let (env, _config) = isolated_env(&sshd);
    let (client, _home) = start(&env).await;
    let script = "for i in $(seq 1 40); do echo line $i; sleep 0.1; done; exit 5";
    let name = start_job(&client, json!({"command": script})).await;

    // The connection's sshd dies mid-job.
    tokio::time::sleep(Duration::from_millis(500)).await;
    sshd.kill_connections();
    // The controller dies too.
    client.cancel().await.ok();

    let (client, _home2) = start(&env).await;
    let r = wait(
        &client,
        &name,
        json!({"timeout_s": 30, "cursor": 0, "max_bytes": 100000}),
    )
    .await;
    assert_eq!(r["reason"], "ended", "{r}");
    assert_eq!(r["exit_code"], 5, "{r}");
    let expected: String = (1..=40).map(|i| format!("line {i}\n")).collect();
    assert_eq!(r["output"], expected, "the log must be byte-complete");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_the_whole_tree() {
    let sshd = Sshd::start();
    let (env, _config) = isolated_env(&sshd);
    let (client, _home) = start(&env).await;
    let name = start_job(
        &client,
        json!({"command": "setsid sleep 301.4242 & trap '' TERM; sleep 302.4242"}),
    )
    .await;
    assert!(outpost_e2e::wait_until(Duration::from_secs(5), || {
        outpost_e2e::pids_with_cmdline("sleep 30").len() >= 2
    }));
    let (err, r) = call(
        &client,
        "cancel_background_task",
        json!({"name": name, "grace_s": 1}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["state"], "cancelled", "{r}");
    assert!(
        outpost_e2e::wait_until(Duration::from_secs(5), || {
            outpost_e2e::pids_with_cmdline("4242").is_empty()
        }),
        "processes of the cancelled job survived"
    );
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_returns_on_end_match_and_silence() {
    let sshd = Sshd::start();
    let (mut env, _config) = isolated_env(&sshd);
    // read_background_log is listed with the advanced tools.
    env.push(("REMOTE_SANDBOX_EXPOSE_ADVANCED_TOOLS", "1".into()));
    let (client, _home) = start(&env).await;

    let name = start_job(&client, json!({"command": "sleep 1; exit 0"})).await;
    let started = Instant::now();
    let r = wait(&client, &name, json!({"timeout_s": 30})).await;
    assert_eq!(r["reason"], "ended");
    // Ends after ~1 s; noticed at once rather than by slow polling.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    let name = start_job(
        &client,
        json!({"command": "echo warming up; sleep 0.5; echo 'epoch 3 loss=0.25'; sleep 30"}),
    )
    .await;
    let r = wait(
        &client,
        &name,
        json!({"timeout_s": 20, "pattern": "loss=[0-9.]+", "cursor": 0}),
    )
    .await;
    assert_eq!(r["reason"], "matched", "{r}");
    assert!(r["output"].as_str().unwrap().contains("epoch 3"), "{r}");
    let cursor = r["cursor"].as_u64().unwrap();
    let r = wait(
        &client,
        &name,
        json!({"timeout_s": 20, "silence_s": 1, "cursor": cursor}),
    )
    .await;
    assert_eq!(r["reason"], "silent", "{r}");
    call(&client, "cancel_background_task", json!({"name": name})).await;

    // Bad input: clear errors.
    let (err, r) = call(
        &client,
        "wait_background_task",
        json!({"name": "no-such-job"}),
    )
    .await;
    assert!(err && r.to_string().contains("no-such-job"), "{r}");
    let (err, r) = call(
        &client,
        "wait_background_task",
        json!({"name": name, "pattern": "("}),
    )
    .await;
    assert!(err, "{r}");
    let (err, r) = call(
        &client,
        "wait_background_task",
        json!({"name": name, "timeout_s": -1}),
    )
    .await;
    assert!(err && r.to_string().contains("timeout"), "{r}");
    let (err, r) = call(
        &client,
        "read_background_log",
        json!({"name": name, "grep": "["}),
    )
    .await;
    assert!(err, "{r}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_are_refused_from_tool_calls_and_logs_page() {
    let sshd = Sshd::start();
    let (mut env, _config) = isolated_env(&sshd);
    // read_background_log is listed with the advanced tools.
    env.push(("REMOTE_SANDBOX_EXPOSE_ADVANCED_TOOLS", "1".into()));
    let (client, _home) = start(&env).await;
    for (key, value) in [
        ("webhook_url", "http://127.0.0.1:9/x"),
        ("event_command", "touch /tmp/pwned"),
    ] {
        let mut args = json!({"command": "true"});
        args[key] = json!(value);
        let (err, r) = call(&client, "exec_bash_background", args).await;
        assert!(err, "{key} accepted: {r}");
        assert!(r.to_string().contains("config"), "{r}");
    }

    let name = start_job(
        &client,
        json!({"command": "for i in $(seq 1 1000); do echo row $i; done"}),
    )
    .await;
    wait(&client, &name, json!({"timeout_s": 30})).await;
    let (_, r) = call(
        &client,
        "read_background_log",
        json!({"name": name, "tail_lines": 2}),
    )
    .await;
    assert_eq!(r["content"], "row 999\nrow 1000\n", "{r}");
    let (_, r) = call(
        &client,
        "read_background_log",
        json!({"name": name, "grep": "^row 50[0-9]$"}),
    )
    .await;
    assert_eq!(r["content"].as_str().unwrap().lines().count(), 10, "{r}");
    let (_, r) = call(
        &client,
        "read_background_log",
        json!({"name": name, "offset": 0, "max_bytes": 12}),
    )
    .await;
    assert_eq!(r["content"], "row 1\nrow 2\n", "{r}");
    assert_eq!(r["next_offset"], 12);
    client.cancel().await.unwrap();
}

/// The config file's `event_command` runs for a job's events with the
/// event, its file, the job's log and a suggested prompt in its
/// environment (Outpost's names and remote-sandbox-mcp's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_hooks_get_the_event_its_file_the_log_and_a_prompt() {
    let sshd = Sshd::start();
    let out = common::scratch("hook-out");
    let config_dir = common::scratch("hook-config");
    let config = config_dir.path().join("config.toml");
    let hook = format!(
        "[ \"$RSMCP_EVENT_TYPE\" = completed ] && {{ cp \"$RSMCP_EVENT_FILE\" {dir}/event.json; printf '%s\\n%s\\n' \"$RSMCP_LOG_FILE\" \"$RSMCP_SUGGESTED_PROMPT\" > {dir}/env.tmp && mv {dir}/env.tmp {dir}/env; }}; true",
        dir = out.path().display()
    );
    std::fs::write(
        &config,
        format!(
            "[hooks]\nevent_command = '''{hook}'''\n\n{}",
            sshd.sandbox_toml("box")
        ),
    )
    .unwrap();
    let (client, _home) = start(&[("OUTPOST_CONFIG", config.display().to_string())]).await;
    let name = start_job(
        &client,
        json!({"command": "sleep 2; echo hooked", "session_name": "hooked-1"}),
    )
    .await;
    wait(&client, &name, json!({"timeout_s": 30})).await;
    let env_file = out.path().join("env");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !env_file.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let env = std::fs::read_to_string(&env_file).expect("the hook ran");
    let (log, prompt) = env.split_once('\n').unwrap();
    assert!(log.ends_with("/jobs/hooked-1/log"), "{env}");
    assert!(
        prompt.starts_with("Background job hooked-1 on sandbox box: completed (exit code 0)."),
        "{prompt}"
    );
    let event: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("event.json")).unwrap())
            .unwrap();
    assert_eq!(
        (&event["type"], &event["job"]),
        (&json!("completed"), &json!("hooked-1"))
    );
    client.cancel().await.unwrap();

    // A controller with a fresh OUTPOST_HOME hooks what happens from now
    // on, never the host's history (hooked-1's events).
    let hooked = out.path().join("hooked.log");
    let fresh_config = config_dir.path().join("fresh.toml");
    std::fs::write(
        &fresh_config,
        format!(
            "[hooks]\nevent_command = '''echo \"$OUTPOST_EVENT_TYPE $OUTPOST_JOB\" >> {}'''\n\n{}",
            hooked.display(),
            sshd.sandbox_toml("box")
        ),
    )
    .unwrap();
    let (client, _home) = start(&[("OUTPOST_CONFIG", fresh_config.display().to_string())]).await;
    // A job tool starts the follower before the next job does anything.
    let (err, r) = call(&client, "list_background_tasks", json!({})).await;
    assert!(!err, "{r}");
    let name = start_job(
        &client,
        json!({"command": "sleep 2", "session_name": "hooked-2"}),
    )
    .await;
    wait(&client, &name, json!({"timeout_s": 30})).await;
    let log = || std::fs::read_to_string(&hooked).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !log().contains("completed hooked-2") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = log();
    assert!(log.contains("completed hooked-2"), "{log}");
    assert!(!log.contains("hooked-1"), "history was replayed: {log}");
    client.cancel().await.unwrap();
}
