//! `execute_code`, `install_package` and `create_run_close` through MCP
//! over stdio: on the `local` sandbox (values, plots as image blocks, errors,
//! a package installed from the index and imported in the same context,
//! one-call sandboxes that are always deleted) and over a real sshd (a
//! context that outlives its killed SSH connection; a bwrap sandbox).

mod common;

use base64::Engine as _;
use common::mcp_client::{call, start};
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

/// A tool call's JSON (first text block) and its images' bytes.
async fn run<H: rmcp::ClientHandler>(
    client: &rmcp::service::RunningService<rmcp::RoleClient, H>,
    tool: &'static str,
    args: Value,
) -> (bool, Value, Vec<Vec<u8>>) {
    let result = client
        .call_tool(
            CallToolRequestParams::new(tool).with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    let mut text = None;
    let mut images = Vec::new();
    for block in &result.content {
        if let Some(t) = block.as_text() {
            text.get_or_insert_with(|| t.text.clone());
        } else if let Some(image) = block.as_image() {
            assert_eq!(image.mime_type, "image/png");
            images.push(
                base64::engine::general_purpose::STANDARD
                    .decode(&image.data)
                    .expect("base64 image"),
            );
        }
    }
    let text = text.unwrap_or_default();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (result.is_error.unwrap_or(false), value, images)
}

/// SIGKILLs every process whose environment has this `HOME=…` when dropped
/// (the daemon; its interpreters die with it).
struct KillWithHome(String);

impl Drop for KillWithHome {
    fn drop(&mut self) {
        for pid in outpost_e2e::pids_with_env(&self.0) {
            // SAFETY: plain kill of a test's own leftover.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

fn png_size(png: &[u8]) -> (u32, u32) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    (
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        u32::from_be_bytes(png[20..24].try_into().unwrap()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execute_code_on_local_keeps_state_and_shows_plots() {
    let (client, home) = start(&[]).await;
    // The local agent's daemon holds the contexts for an hour; this test's
    // end, pass or fail, is theirs.
    let _daemon = KillWithHome(format!("HOME={}", home.path().display()));

    let (err, r, _) = run(&client, "execute_code", json!({"code": "x = 2"})).await;
    assert!(!err, "{r}");
    assert_eq!(r["execution_count"], 1, "{r}");
    let (err, r, _) = run(&client, "execute_code", json!({"code": "x * 21"})).await;
    assert!(!err, "{r}");
    assert_eq!(r["results"][0]["text/plain"], "42", "{r}");
    assert_eq!(r["execution_count"], 2, "{r}");
    // No echo of the code, no empty fields.
    assert!(r.get("code").is_none() && r.get("error").is_none(), "{r}");

    let (err, r, images) = run(
        &client,
        "execute_code",
        json!({"code": "import matplotlib.pyplot as plt\nplt.figure(figsize=(4, 3), dpi=100)\nplt.plot([1, 2, 3], [1, 4, 9])\nprint('plotted')"}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["stdout"], "plotted\n", "{r}");
    assert_eq!(images.len(), 1, "{r}");
    let (w, h) = png_size(&images[0]);
    assert!(
        (250..=420).contains(&w) && (200..=320).contains(&h),
        "{w}x{h}"
    );
    assert!(r.to_string().contains("[image 1]"), "{r}");

    let (err, r, _) = run(&client, "execute_code", json!({"code": "1/0"})).await;
    assert!(!err, "an exception is a result: {r}");
    assert_eq!(r["error"]["name"], "ZeroDivisionError", "{r}");
    assert!(
        r["error"]["traceback"].as_str().unwrap().contains("1/0"),
        "{r}"
    );

    let (err, r, _) = run(
        &client,
        "execute_code",
        json!({"code": "while True: pass", "timeout_s": 2}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(r["error"]["name"], "KeyboardInterrupt", "{r}");
    let (_, r, _) = run(&client, "execute_code", json!({"code": "x"})).await;
    assert_eq!(r["results"][0]["text/plain"], "2", "state kept: {r}");

    // bash keeps its directory.
    run(
        &client,
        "execute_code",
        json!({"code": "cd /tmp", "language": "bash"}),
    )
    .await;
    let (_, r, _) = run(
        &client,
        "execute_code",
        json!({"code": "pwd", "language": "bash"}),
    )
    .await;
    assert_eq!(r["stdout"], "/tmp\n", "{r}");

    // A package from the index, importable in the same context at once.
    let (err, r, _) = run(
        &client,
        "install_package",
        json!({"packages": ["tabulate"]}),
    )
    .await;
    assert!(!err, "{r}");
    let (err, r, _) = run(
        &client,
        "execute_code",
        json!({"code": "import tabulate\ntabulate.tabulate([[1, 2]])"}),
    )
    .await;
    assert!(!err && r.get("error").is_none(), "{r}");
    assert!(
        r["results"][0]["text/plain"]
            .as_str()
            .unwrap()
            .contains('1'),
        "{r}"
    );
    assert!(
        home.path().join(".outpost/venv").is_dir(),
        "the host's venv lives in the agent's state dir"
    );
    let (err, r, _) = run(
        &client,
        "install_package",
        json!({"packages": ["outpost-no-such-package-7f3a"]}),
    )
    .await;
    assert!(err, "{r}");
    let said = r.to_string();
    assert!(said.contains("outpost-no-such-package-7f3a"), "{said}");
    let (err, r, _) = run(
        &client,
        "install_package",
        json!({"packages": ["--index-url=http://evil"]}),
    )
    .await;
    assert!(err && r.to_string().contains("no options"), "{r}");

    // One call: a sandbox made, used and deleted, also when the code fails.
    for code in ["import os\nos.getcwd()", "raise ValueError('boom')"] {
        let (err, r, _) = run(
            &client,
            "create_run_close",
            json!({"code": code, "host": "local", "isolation": "none"}),
        )
        .await;
        assert!(!err, "{r}");
        if code.starts_with("raise") {
            assert_eq!(r["error"]["name"], "ValueError", "{r}");
        } else {
            assert!(
                r["results"][0]["text/plain"]
                    .as_str()
                    .unwrap()
                    .contains("/work"),
                "{r}"
            );
        }
    }
    let (_, listed) = call(&client, "list_sandboxes", json!({})).await;
    assert!(
        !listed.to_string().contains("local/"),
        "left a sandbox: {listed}"
    );

    // A root login reaches bwrap: the one-shot runs isolated, on a uid of
    // its own, never as root.
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } == 0 {
        let (err, r, _) = run(
            &client,
            "create_run_close",
            json!({"code": "import os\nos.getuid()", "host": "local"}),
        )
        .await;
        assert!(!err, "{r}");
        let uid: u64 = r["results"][0]["text/plain"]
            .as_str()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{r}"));
        assert!(uid >= 1_900_000_000, "ran as {uid}: {r}");
    }

    // A cancelled one-shot leaves neither its code nor its sandbox.
    let needle = format!("time.sleep(300.{})", std::process::id());
    let args =
        json!({"code": format!("import time\n{needle}"), "host": "local", "isolation": "none"});
    let mut running = Box::pin(
        client.call_tool(
            CallToolRequestParams::new("create_run_close")
                .with_arguments(args.as_object().unwrap().clone()),
        ),
    );
    let sleeping = || {
        outpost_e2e::pids_with_cmdline("python3")
            .into_iter()
            .any(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/environ"))
                    .is_ok_and(|e| e.contains("OUTPOST_SANDBOX="))
            })
    };
    tokio::select! {
        r = &mut running => panic!("the run ended: {r:?}"),
        () = async {
            while !sleeping() {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        } => {}
    }
    drop(running);
    assert!(
        outpost_e2e::wait_until(std::time::Duration::from_secs(15), || !sleeping()),
        "the one-shot's interpreter outlived its cancelled call"
    );
    let mut left = String::new();
    for _ in 0..50 {
        left = call(&client, "list_sandboxes", json!({}))
            .await
            .1
            .to_string();
        if !left.contains("local/") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(!left.contains("local/"), "left a sandbox: {left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_outlives_its_ssh_connection_and_its_controller() {
    let sshd = outpost_e2e::Sshd::start();
    let (env, _config) = common::mcp_client::isolated_env(&sshd);
    let (client, _home) = start(&env).await;
    let (err, r, _) = run(
        &client,
        "execute_code",
        json!({"code": "x = 41", "sandbox_name": "box"}),
    )
    .await;
    assert!(!err, "{r}");
    sshd.kill_connections();
    // The call that meets the dead connection may fail (and says how to
    // collect its run); a later one reconnects to the same context.
    let mut answer = None;
    for _ in 0..3 {
        let (err, r, _) = run(
            &client,
            "execute_code",
            json!({"code": "x + 1", "sandbox_name": "box"}),
        )
        .await;
        if !err {
            answer = Some(r);
            break;
        }
        assert!(r.to_string().contains("collects it"), "{r}");
    }
    let r = answer.expect("no reconnect after the SSH connection was killed");
    assert_eq!(
        r["results"][0]["text/plain"], "42",
        "the context lost x: {r}"
    );

    // A restarted controller finds the context as it was.
    client.cancel().await.ok();
    let (client, _home2) = start(&env).await;
    let (err, r, _) = run(
        &client,
        "execute_code",
        json!({"code": "x", "sandbox_name": "box"}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["results"][0]["text/plain"], "41", "{r}");

    // A bwrap sandbox over SSH, deleted by create_run_close.
    let (err, r, images) = run(
        &client,
        "create_run_close",
        json!({"code": "import matplotlib.pyplot as plt\nplt.plot([0, 1])\nimport os\nos.path.exists(os.path.expanduser('~/.ssh'))",
               "host": "box", "isolation": "bwrap", "network": false}),
    )
    .await;
    if err && r.to_string().contains("bwrap") {
        outpost_e2e::skip(&format!("bwrap: {r}"));
        return;
    }
    assert!(!err, "{r}");
    assert_eq!(
        r["results"].as_array().unwrap().last().unwrap()["text/plain"],
        "False",
        "{r}"
    );
    assert_eq!(images.len(), 1, "{r}");
    let (_, listed) = call(&client, "list_sandboxes", json!({})).await;
    assert!(
        !listed.to_string().contains("box/"),
        "left a sandbox: {listed}"
    );
}
