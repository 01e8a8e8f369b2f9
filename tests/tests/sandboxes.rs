//! Isolated sandboxes through MCP over stdio, on the `local` sandbox: made,
//! used by the other tools under their `HOST/ID` name (exec, files, syncs,
//! jobs), listed, renewed and deleted. Isolation "none", so it runs on any
//! machine; what bubblewrap and Landlock confine is the agent's tests'
//! business.

mod common;

use common::mcp_client::{call, start};
use outpost_e2e::pids_with_env as procs_with_env;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_isolated_sandbox_lifecycle() {
    let (client, _home) = start(&[]).await;

    // The alias is callable, never listed; status and renew are callable
    // and listed with the advanced tools (both called below).
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for want in ["create_sandbox", "delete_sandbox"] {
        assert!(names.contains(&want), "missing {want} in {names:?}");
    }
    for unlisted in ["close_sandbox", "get_sandbox_status", "renew_sandbox"] {
        assert!(!names.contains(&unlisted), "{names:?}");
    }

    // Bad requests say what is wrong, before anything is made.
    for (args, wanted) in [
        (json!({"host": "local", "ttl_s": 0}), "ttl_s"),
        (json!({"host": "local", "ttl_s": 30 * 86400}), "7 days"),
        (json!({"host": "local", "isolation": "docker"}), "isolation"),
        (
            json!({"host": "local", "env": {"LD_PRELOAD": "x"}}),
            "LD_PRELOAD",
        ),
        (json!({"host": "local", "limits": {"cpus": 0}}), "cpus"),
        (json!({"host": "nope"}), "unknown sandbox"),
        // The workspace rung cannot cut the network: refused, not echoed.
        (
            json!({"host": "local", "isolation": "none", "network": false}),
            "network: false needs bwrap or Landlock",
        ),
    ] {
        let (err, r) = call(&client, "create_sandbox", args.clone()).await;
        assert!(err, "{args}: {r}");
        assert!(r.to_string().contains(wanted), "{args}: {r}");
    }
    // A root login reaches bwrap: `network: false` holds, and its commands
    // run as a uid of their own.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let (err, made) = call(
            &client,
            "create_sandbox",
            json!({"host": "local", "network": false}),
        )
        .await;
        assert!(!err, "{made}");
        assert_eq!(made["isolation"], "bwrap", "{made}");
        let name = made["sandbox_name"].as_str().unwrap().to_string();
        let (err, r) = call(
            &client,
            "exec_bash",
            json!({"sandbox_name": name, "command": "id -u"}),
        )
        .await;
        assert!(!err, "{r}");
        let uid: u64 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
        assert!(uid >= 1_900_000_000, "{r}");
        let (err, r) = call(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
        assert!(!err, "{r}");
    }
    for (name, wanted) in [
        ("local/Bad_Id", "bad sandbox id"),
        ("nope/sbx-1", "unknown sandbox"),
        ("local", "HOST/ID"),
    ] {
        let (err, r) = call(&client, "get_sandbox_status", json!({"sandbox_name": name})).await;
        assert!(err, "{name}: {r}");
        assert!(r.to_string().contains(wanted), "{name}: {r}");
    }

    let (err, made) = call(
        &client,
        "create_sandbox",
        json!({"host": "local", "ttl_s": 600, "isolation": "none",
               "env": {"GREETING": "hi"}}),
    )
    .await;
    assert!(!err, "{made}");
    let name = made["sandbox_name"].as_str().unwrap().to_string();
    let id = name.strip_prefix("local/").expect("named HOST/ID");
    assert!(!id.is_empty() && !id.contains('/'), "{name}");
    assert_eq!(made["state"], "running");
    assert_eq!(made["isolation"], "none");
    assert_eq!(made["network"], true);
    assert!(
        made["expires_at"].as_str().unwrap().ends_with('Z'),
        "{made}"
    );
    let work_dir = made["work_dir"].as_str().unwrap().to_string();
    assert!(work_dir.starts_with('/'), "{made}");

    // Commands start in the work dir, with the sandbox's environment.
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": "pwd; echo $GREETING", "sandbox_name": name}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], format!("{work_dir}\nhi\n"));

    // Relative remote paths are the work dir's.
    let (err, r) = call(
        &client,
        "write_remote_file",
        json!({"remote_path": "notes/hello.txt", "content": "inside\n", "sandbox_name": name}),
    )
    .await;
    assert!(!err, "{r}");
    let (err, r) = call(
        &client,
        "read_remote_file",
        json!({"remote_path": format!("{work_dir}/notes/hello.txt"), "sandbox_name": name}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["content"], "inside\n");
    let (err, r) = call(
        &client,
        "write_remote_file",
        json!({"remote_path": "top.txt", "content": "top\n", "sandbox_name": name}),
    )
    .await;
    assert!(!err, "{r}");
    let (_, r) = call(
        &client,
        "exec_bash",
        json!({"command": "cat notes/hello.txt top.txt", "sandbox_name": name}),
    )
    .await;
    assert_eq!(r["stdout"], "inside\ntop\n", "{r}");
    let (err, r) = call(&client, "list_remote_files", json!({"sandbox_name": name})).await;
    assert!(!err, "{r}");
    let listed: Vec<&str> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["path"].as_str())
        .collect();
    assert!(
        listed.contains(&"notes") && listed.contains(&"top.txt"),
        "{r}"
    );

    // Binary content travels as base64 both ways.
    let bytes: Vec<u8> = (0u8..=255).chain([0, 0, 0xff]).collect();
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
    let (err, r) = call(
        &client,
        "write_remote_file",
        json!({"remote_path": "blob.bin", "content": b64, "base64": true, "sandbox_name": name}),
    )
    .await;
    assert!(!err && r["size"] == bytes.len(), "{r}");
    assert_eq!(
        std::fs::read(format!("{work_dir}/blob.bin")).unwrap(),
        bytes
    );
    let (_, r) = call(
        &client,
        "read_remote_file",
        json!({"remote_path": "blob.bin", "sandbox_name": name}),
    )
    .await;
    assert_eq!(r["binary"], true, "{r}");
    assert!(r.get("content").is_none() && r.get("content_base64").is_none());
    let (_, r) = call(
        &client,
        "read_remote_file",
        json!({"remote_path": "blob.bin", "base64": true, "sandbox_name": name}),
    )
    .await;
    assert_eq!(r["content_base64"], b64.as_str(), "{r}");
    let (err, r) = call(
        &client,
        "write_remote_file",
        json!({"remote_path": "bad.bin", "content": "not base64!", "base64": true, "sandbox_name": name}),
    )
    .await;
    assert!(err && r.to_string().contains("base64"), "{r}");
    assert!(!std::path::Path::new(&format!("{work_dir}/bad.bin")).exists());

    // A tree pushed in lands under the work dir.
    let src = outpost_e2e::TempDir::new("sandbox-push");
    std::fs::write(src.path().join("a.txt"), "pushed\n").unwrap();
    let (err, r) = call(
        &client,
        "sync_local_to_remote",
        json!({"local_path": src.path(), "remote_path": "proj", "sandbox_name": name}),
    )
    .await;
    assert!(!err, "{r}");
    let (_, r) = call(
        &client,
        "exec_bash",
        json!({"command": format!("cat {work_dir}/proj/a.txt"), "sandbox_name": name}),
    )
    .await;
    assert_eq!(r["stdout"], "pushed\n", "{r}");

    // A background job runs inside it too.
    let (err, r) = call(
        &client,
        "exec_bash_background",
        json!({"command": "pwd", "sandbox_name": name}),
    )
    .await;
    assert!(!err, "{r}");
    let job = r["tmux_session"].as_str().unwrap().to_string();
    let (err, r) = call(
        &client,
        "wait_background_task",
        json!({"name": job, "timeout_s": 30, "sandbox_name": name}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["reason"], "ended", "{r}");
    assert!(r.to_string().contains(&work_dir), "{r}");

    // Listed under its host, which is connected.
    let (err, r) = call(&client, "list_sandboxes", json!({})).await;
    assert!(!err, "{r}");
    let local = r["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["name"] == "local")
        .unwrap()
        .clone();
    let live = local["sandboxes"]
        .as_array()
        .expect("an answering host lists its sandboxes");
    assert!(
        live.iter().any(|s| s["sandbox_name"] == name.as_str()),
        "{r}"
    );

    let (err, r) = call(&client, "get_sandbox_status", json!({"sandbox_name": name})).await;
    assert!(!err, "{r}");
    assert_eq!(r["state"], "running");
    assert_eq!(r["work_dir"], work_dir.as_str());

    // Renewing moves the expiry.
    let (err, r) = call(
        &client,
        "renew_sandbox",
        json!({"sandbox_name": name, "ttl_s": 3600}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["state"], "running");
    let renewed = r["expires_at"].as_str().unwrap();
    assert!(
        renewed > made["expires_at"].as_str().unwrap(),
        "{r} vs {made}"
    );
    let (err, r) = call(
        &client,
        "renew_sandbox",
        json!({"sandbox_name": name, "ttl_s": 8 * 86400}),
    )
    .await;
    assert!(err && r.to_string().contains("7 days"), "{r}");

    // The active sandbox can be one.
    let (err, r) = call(&client, "select_sandbox", json!({"sandbox_name": name})).await;
    assert!(!err, "{r}");
    let (_, r) = call(&client, "exec_bash", json!({"command": "pwd"})).await;
    assert_eq!(r["stdout"], format!("{work_dir}\n"));
    let (err, _) = call(&client, "select_sandbox", json!({"sandbox_name": "local"})).await;
    assert!(!err);

    // Deleted: its files are gone, and its name fails clearly.
    let (err, r) = call(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
    assert!(!err, "{r}");
    assert_eq!(r["state"], "deleted", "{r}");
    assert!(
        !std::path::Path::new(&work_dir).exists(),
        "{work_dir} is left"
    );
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": "echo still-here", "sandbox_name": name}),
    )
    .await;
    assert!(err, "a deleted sandbox still runs commands: {r}");
    let text = r.to_string();
    assert!(!text.contains("still-here"), "{text}");
    assert!(text.contains(id), "the error names the sandbox: {text}");
    let (err, r) = call(&client, "get_sandbox_status", json!({"sandbox_name": name})).await;
    if !err {
        assert_eq!(r["state"], "deleted", "{r}");
    }
    let (_, r) = call(&client, "list_sandboxes", json!({})).await;
    assert!(!r.to_string().contains(&name), "{r}");

    // close_sandbox is delete_sandbox.
    let (err, other) = call(
        &client,
        "create_sandbox",
        json!({"host": "local", "isolation": "none", "ttl_s": 60}),
    )
    .await;
    assert!(!err, "{other}");
    let other = other["sandbox_name"].as_str().unwrap().to_string();
    assert_ne!(other, name);
    // Unlisted, so it has no advertised schema to check against.
    let closed = client
        .call_tool(
            rmcp::model::CallToolRequestParams::new("close_sandbox")
                .with_arguments(json!({"sandbox_name": other}).as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    assert_ne!(closed.is_error, Some(true), "{closed:?}");
    let r = closed.structured_content.expect("a structured result");
    assert_eq!(r["state"], "deleted", "{r}");
    client.cancel().await.unwrap();
}

/// A sandbox made through MCP belongs to that session: when the client
/// closes stdio, its processes end and it is deleted; one made with `keep`
/// outlives the session and ends at its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_end_with_their_session_unless_kept() {
    let (client, _home) = start(&[]).await;
    let mut markers = Vec::new();
    for keep in [false, true] {
        let (err, made) = call(
            &client,
            "create_sandbox",
            json!({"host": "local", "isolation": "none", "ttl_s": 12, "keep": keep}),
        )
        .await;
        assert!(!err, "{made}");
        let name = made["sandbox_name"].as_str().unwrap().to_string();
        let (err, r) = call(
            &client,
            "exec_bash",
            json!({"sandbox_name": name, "command": "nohup setsid sleep 1000 >/dev/null 2>&1 &"}),
        )
        .await;
        assert!(!err, "{r}");
        let marker = format!("OUTPOST_SANDBOX={}", name.rsplit('/').next().unwrap());
        assert!(!procs_with_env(&marker).is_empty(), "{name} runs nothing");
        markers.push(marker);
    }
    let ended = std::time::Instant::now();
    client.cancel().await.unwrap();
    let [scoped, kept] = [&markers[0], &markers[1]];
    assert!(
        outpost_e2e::wait_until(std::time::Duration::from_secs(8), || procs_with_env(scoped)
            .is_empty()),
        "the session's sandbox outlived it"
    );
    assert!(
        ended.elapsed() < std::time::Duration::from_secs(8),
        "deleted, not expired"
    );
    assert!(
        !procs_with_env(kept).is_empty(),
        "the kept sandbox ended with the session"
    );
    assert!(
        outpost_e2e::wait_until(std::time::Duration::from_secs(20), || procs_with_env(kept)
            .is_empty()),
        "the kept sandbox outlived its TTL"
    );
}

fn bwrap_usable() -> bool {
    std::process::Command::new("bwrap")
        .args([
            "--ro-bind",
            "/",
            "/",
            "--unshare-user",
            "--unshare-pid",
            "true",
        ])
        .status()
        .is_ok_and(|s| s.success())
}

/// Over a real sshd, as the unprivileged test account: each rung contains
/// what it promises (the login's keys, the network, writes outside) while
/// exec, a background job, a sync and the file tools work inside; and a
/// sandbox's TTL ends every process of it after the controller is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_sandboxes_over_ssh_contain_and_expire() {
    if !bwrap_usable() {
        outpost_e2e::skip("bwrap cannot run here (scripts/setup-test-env installs it)");
        return;
    }
    let sshd = outpost_e2e::Sshd::start();
    let (env, _config) = common::mcp_client::isolated_env(&sshd);
    contain_and_expire(&env, false).await;
}

/// The same over SSH as root, as GPU rentals hand out: bwrap is reached and
/// its commands run as a uid of their own, so root's keys and
/// `/etc/shadow` stay unread; Landlock is refused, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_sandboxes_over_ssh_as_root_contain_and_expire() {
    if !bwrap_usable() {
        outpost_e2e::skip("bwrap cannot run here (scripts/setup-test-env installs it)");
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        outpost_e2e::skip("a root login needs the tests to run as root");
        return;
    }
    let sshd = outpost_e2e::Sshd::start();
    let state = outpost_e2e::TempDir::new("root-login-state");
    let config = outpost_e2e::TempDir::new("root-login-config");
    let path = config.path().join("config.toml");
    std::fs::write(&path, sshd.root_sandbox_toml("box", state.path())).unwrap();
    let env = vec![("OUTPOST_CONFIG", path.display().to_string())];
    contain_and_expire(&env, true).await;
}

async fn contain_and_expire(env: &[(&'static str, String)], as_root: bool) {
    let (client, _home) = start(env).await;

    // A secret in the login's home, and a listener outside every sandbox.
    let secret = format!(".ssh/outpost-secret-{}", std::process::id());
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": format!("mkdir -p -m 700 ~/.ssh && echo SECRET > ~/{secret} && echo $HOME"),
               "sandbox_name": "box"}),
    )
    .await;
    assert!(!err, "{r}");
    let home = r["stdout"].as_str().unwrap().trim().to_string();
    // Gone however the test ends (as root, it is in root's own ~/.ssh).
    struct Planted(String);
    impl Drop for Planted {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _planted = Planted(format!("{home}/{secret}"));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || for _c in listener.incoming() {});
    let connect = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED");
    let (_, r) = call(
        &client,
        "exec_bash",
        json!({"command": connect, "sandbox_name": "box"}),
    )
    .await;
    assert_eq!(r["stdout"], "CONNECTED\n", "the host itself connects: {r}");
    // The login's shared memory, and a terminal of its open (a real pty,
    // made by script and held by a job).
    let shm = format!("/dev/shm/outpost-shm-{}", std::process::id());
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": format!("echo SHM > {shm}"), "sandbox_name": "box"}),
    )
    .await;
    assert!(!err, "{r}");
    let (err, r) = call(
        &client,
        "exec_bash_background",
        json!({"command": "script -qfc 'sleep 300' /dev/null", "sandbox_name": "box",
               "session_name": "outpost-pty-holder"}),
    )
    .await;
    assert!(!err, "{r}");
    let find_pty = "for p in $(pgrep -u $(id -u) -x sleep); do \
                    t=$(readlink /proc/$p/fd/0); case $t in /dev/pts/*) echo $t; break;; esac; done";
    let mut pty = String::new();
    for _ in 0..50 {
        let (_, r) = call(
            &client,
            "exec_bash",
            json!({"command": find_pty, "sandbox_name": "box"}),
        )
        .await;
        pty = r["stdout"].as_str().unwrap_or_default().trim().to_string();
        if !pty.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(pty.starts_with("/dev/pts/"), "no terminal: {pty:?}");

    for isolation in ["bwrap", "landlock", "none"] {
        let (err, made) = call(
            &client,
            "create_sandbox",
            // The workspace rung cannot cut the network: it is not asked to.
            json!({"host": "box", "isolation": isolation, "network": isolation == "none",
                   "ttl_s": 600}),
        )
        .await;
        // As root, Landlock holds only where the agent's state dir is one
        // other uids may pass; refused elsewhere, saying why.
        if as_root && isolation == "landlock" && err {
            assert!(made.to_string().contains("as root"), "{made}");
            continue;
        }
        if err && isolation == "landlock" && made.to_string().contains("Landlock") {
            outpost_e2e::skip(&format!("Landlock: {made}"));
            continue;
        }
        assert!(!err, "{isolation}: {made}");
        assert_eq!(made["isolation"], isolation, "{made}");
        let name = made["sandbox_name"].as_str().unwrap().to_string();
        let work_dir = made["work_dir"].as_str().unwrap().to_string();
        let sh = |command: String| {
            let client = &client;
            let name = name.clone();
            async move {
                let (err, r) = call(
                    client,
                    "exec_bash",
                    json!({"command": command, "sandbox_name": name}),
                )
                .await;
                assert!(!err, "{r}");
                r
            }
        };
        let r = sh(format!("cat {home}/{secret}")).await;
        if isolation == "none" {
            // Reported as not isolated, and it is not.
            assert!(
                made["note"].as_str().unwrap().contains("not isolated"),
                "{made}"
            );
            assert_eq!(r["stdout"], "SECRET\n");
        } else {
            assert_ne!(r["exit_code"], 0, "{isolation}: {r}");
            assert!(!r["stdout"].as_str().unwrap().contains("SECRET"));
            if as_root {
                let r = sh("id -u; cat /etc/shadow".into()).await;
                let uid: u64 = r["stdout"].as_str().unwrap().trim().parse().unwrap_or(0);
                assert!(uid >= 1_900_000_000, "{isolation}: {r}");
                assert_ne!(r["exit_code"], 0, "read /etc/shadow: {r}");
                // Born in the sandbox's cgroup, which holds its limits.
                let r = sh("cat /proc/self/cgroup".into()).await;
                let id = name.rsplit('/').next().unwrap();
                assert!(
                    r["stdout"]
                        .as_str()
                        .unwrap()
                        .contains(&format!("/outpost-{id}\n")),
                    "{isolation}: not in its cgroup: {r}"
                );
            }
            if isolation != "none" {
                command_is_born_inside(&sh, isolation, as_root).await;
            }
            if isolation == "bwrap" {
                // A cwd that only the sandbox could have: named as such.
                let (err, r) = call(
                    &client,
                    "exec_bash",
                    json!({"command": "true", "cwd": "/no/such/dir", "sandbox_name": name}),
                )
                .await;
                assert!(
                    err && r
                        .to_string()
                        .contains("cannot enter /no/such/dir inside the sandbox"),
                    "{r}"
                );
            }
            let r = sh(connect.clone()).await;
            assert_ne!(r["exit_code"], 0, "{isolation} reached the network: {r}");
            let r = sh(format!(
                "echo x > {home}/planted-{isolation}; echo x > /usr/planted"
            ))
            .await;
            assert_ne!(r["exit_code"], 0, "{r}");
            let r = call(
                &client,
                "exec_bash",
                json!({"command": format!("ls {home}/planted-{isolation}"), "sandbox_name": "box"}),
            )
            .await
            .1;
            assert_ne!(r["exit_code"], 0, "{isolation} wrote into the home: {r}");
            // Neither the login's shared memory nor its terminals (bwrap
            // has a /dev/shm of its own, where an append makes a new file).
            let r = sh(format!("cat {shm}; echo x >> {shm}")).await;
            assert!(
                !r["stdout"].as_str().unwrap().contains("SHM"),
                "{isolation}: {r}"
            );
            assert_eq!(
                std::fs::read_to_string(&shm).unwrap(),
                "SHM\n",
                "{isolation}"
            );
            for command in [format!("echo x > {pty}"), format!("cat < {pty}")] {
                let r = sh(command.clone()).await;
                assert_ne!(r["exit_code"], 0, "{isolation}: {command}: {r}");
            }
        }
        // Everything works inside.
        let r = sh("pwd; echo made > here.txt".into()).await;
        assert_eq!(r["stdout"], format!("{work_dir}\n"), "{r}");
        let (err, r) = call(
            &client,
            "read_remote_file",
            json!({"remote_path": "here.txt", "sandbox_name": name}),
        )
        .await;
        assert!(!err && r["content"] == "made\n", "{r}");
        let (err, r) = call(
            &client,
            "read_remote_file",
            json!({"remote_path": format!("{home}/{secret}"), "sandbox_name": name}),
        )
        .await;
        assert!(err, "a file tool read outside the sandbox: {r}");
        let src = outpost_e2e::TempDir::new("sandbox-ssh-push");
        std::fs::write(src.path().join("in.txt"), "pushed\n").unwrap();
        let (err, r) = call(
            &client,
            "sync_local_to_remote",
            json!({"local_path": src.path(), "remote_path": "tree", "sandbox_name": name}),
        )
        .await;
        assert!(!err, "{r}");
        let (err, r) = call(
            &client,
            "exec_bash_background",
            json!({"command": "cat tree/in.txt", "sandbox_name": name}),
        )
        .await;
        assert!(!err, "{r}");
        let job = r["tmux_session"].as_str().unwrap().to_string();
        let (_, r) = call(
            &client,
            "wait_background_task",
            json!({"name": job, "timeout_s": 30, "sandbox_name": name}),
        )
        .await;
        assert!(r.to_string().contains("pushed"), "{r}");
        let (err, r) = call(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
        assert!(!err && r["state"] == "deleted", "{r}");
    }

    let (err, r) = call(
        &client,
        "cancel_background_task",
        json!({"name": "outpost-pty-holder", "sandbox_name": "box"}),
    )
    .await;
    assert!(!err, "{r}");

    // TTL: the controller goes away; the host ends the sandbox on time.
    let (err, made) = call(
        &client,
        "create_sandbox",
        json!({"host": "box", "isolation": "bwrap", "ttl_s": 3, "keep": true}),
    )
    .await;
    assert!(!err, "{made}");
    let created = std::time::Instant::now();
    let name = made["sandbox_name"].as_str().unwrap().to_string();
    let id = name.rsplit('/').next().unwrap().to_string();
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": "nohup setsid sleep 1000 >/dev/null 2>&1 & nohup sleep 1000 >/dev/null 2>&1 &",
               "sandbox_name": name}),
    )
    .await;
    assert!(!err, "{r}");
    let marker = format!("OUTPOST_SANDBOX={id}");
    assert!(procs_with_env(&marker).len() >= 2);
    client.cancel().await.unwrap();
    let gone = outpost_e2e::wait_until(std::time::Duration::from_secs(8), || {
        procs_with_env(&marker).is_empty()
    });
    assert!(gone, "processes outlived the sandbox");
    assert!(
        created.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        created.elapsed()
    );
    let _ = std::fs::remove_file(&shm);
}

/// A sandbox's command is the agent's own child, started without an
/// `outpost-agent enter` in between, with no capability left and no way to
/// gain one; under bwrap, inside every namespace of the sandbox (pid 1
/// there is its holder).
async fn command_is_born_inside<F, R>(sh: &F, isolation: &str, as_root: bool)
where
    F: Fn(String) -> R,
    R: std::future::Future<Output = serde_json::Value>,
{
    let r = sh("grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status; \
                for n in ipc mnt net pid user uts; do \
                  [ \"$(readlink /proc/self/ns/$n)\" = \"$(readlink /proc/1/ns/$n)\" ] || echo not in $n; \
                done; tr '\\0' ' ' < /proc/1/cmdline"
        .into())
    .await;
    let out = r["stdout"].as_str().unwrap();
    let mut expected = vec!["CapEff:\t0000000000000000", "NoNewPrivs:\t1"];
    if isolation == "bwrap" {
        expected.push("CapBnd:\t0000000000000000");
        assert!(!out.contains("not in") && out.contains("bwrap"), "{r}");
    }
    for line in expected {
        assert!(
            out.contains(line),
            "{isolation}, as_root {as_root}: {line} missing: {r}"
        );
    }
    let mark = format!("sleep 3.{}", 100 + std::process::id() % 900);
    let needle = mark.clone();
    let parent = tokio::task::spawn_blocking(move || {
        let mut parent = String::new();
        outpost_e2e::wait_until(std::time::Duration::from_secs(3), || {
            let Some(pid) = outpost_e2e::pids_with_cmdline(&needle).pop() else {
                return false;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .nth(1);
            parent = std::fs::read(format!("/proc/{}/cmdline", ppid.unwrap_or("0")))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .unwrap_or_default();
            !parent.is_empty()
        });
        parent
    });
    let (r, parent) = tokio::join!(sh(format!("exec {mark}")), parent);
    let parent = parent.unwrap();
    assert_eq!(r["exit_code"], 0, "{r}");
    assert!(
        parent.contains("outpost-agent serve") && !parent.contains(" enter "),
        "{isolation}, as_root {as_root}: the command's parent is {parent:?}"
    );
}

/// OpenSandbox's several-files tools (advanced): all checked before the
/// first is written; binary files come back as base64, a missing one as
/// an error in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_and_download_several_files() {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let (client, _home) = start(&[("REMOTE_SANDBOX_EXPOSE_ADVANCED_TOOLS", "1".into())]).await;
    let (err, made) = call(
        &client,
        "create_sandbox",
        json!({"host": "local", "isolation": "none", "ttl_s": 120}),
    )
    .await;
    assert!(!err, "{made}");
    let name = made["sandbox_name"].as_str().unwrap().to_string();
    let work_dir = made["work_dir"].as_str().unwrap().to_string();

    let (err, r) = call(
        &client,
        "upload_files",
        json!({"sandbox_name": name, "files": [
            {"remote_path": "a.txt", "content": "alpha\n"},
            {"remote_path": "bad.bin", "content": "%%%", "base64": true},
        ]}),
    )
    .await;
    assert!(err && r.to_string().contains("files[1]"), "{r}");
    assert!(!std::path::Path::new(&format!("{work_dir}/a.txt")).exists());

    let png = [0x89u8, b'P', b'N', b'G', 0, 1, 2, 0xff];
    let (err, r) = call(
        &client,
        "upload_files",
        json!({"sandbox_name": name, "files": [
            {"remote_path": "a.txt", "content": "alpha\n"},
            {"remote_path": "img/p.png", "content": b64(&png), "base64": true},
            {"remote_path": "run.sh", "content": "echo hi\n", "mode": "755"},
        ]}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["files"], 3);
    assert_eq!(r["bytes"], 6 + png.len() + 8);

    let (err, r) = call(
        &client,
        "download_files",
        json!({"sandbox_name": name, "remote_paths": ["a.txt", "img/p.png", "nope", "run.sh"]}),
    )
    .await;
    assert!(!err, "{r}");
    let files = r["files"].as_array().unwrap();
    assert_eq!(files[0]["content"], "alpha\n");
    assert_eq!(files[1]["content_base64"], b64(&png).as_str());
    assert!(files[2]["error"].is_string(), "{r}");
    assert_eq!(files[3]["content"], "echo hi\n");
    let (_, r) = call(
        &client,
        "exec_bash",
        json!({"command": "./run.sh", "sandbox_name": name}),
    )
    .await;
    assert_eq!(r["stdout"], "hi\n", "{r}");
    call(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
    client.cancel().await.unwrap();
}

/// A memory limit counts what a sandbox holds in a memfd, pages written and
/// never mapped, which no process's RSS shows: as the unprivileged test
/// account (no cgroup of its own), under bwrap and Landlock, 300 MB written
/// into a memfd in a sandbox limited to 64 MB is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_limit_counts_memfd_pages() {
    assert!(
        bwrap_usable(),
        "bwrap cannot run here (scripts/setup-test-env installs it)"
    );
    let sshd = outpost_e2e::Sshd::start();
    let (env, _config) = common::mcp_client::isolated_env(&sshd);
    let (client, _home) = start(&env).await;
    let hold = "import os, time\n\
                fd = os.memfd_create('held')\n\
                block = b'x' * (1 << 20)\n\
                for _ in range(300):\n    os.write(fd, block)\n\
                print('held', flush=True)\n\
                time.sleep(30)\n";
    for isolation in ["bwrap", "landlock"] {
        let (err, made) = call(
            &client,
            "create_sandbox",
            json!({"host": "box", "isolation": isolation, "ttl_s": 600,
                   "limits": {"memory_mb": 64}}),
        )
        .await;
        assert!(!err, "{isolation}: {made}");
        let name = made["sandbox_name"].as_str().unwrap().to_string();
        let started = std::time::Instant::now();
        let (err, r) = call(
            &client,
            "exec_bash",
            json!({"command": format!("python3 -c \"{}\"", hold.replace('"', "\\\"")),
                   "sandbox_name": name, "timeout_s": 25}),
        )
        .await;
        assert!(!err, "{r}");
        assert_ne!(
            r["exit_code"], 0,
            "{isolation}: the memfd was not counted: {r}"
        );
        assert!(
            r.get("timed_out").is_none(),
            "{isolation}: ran to its timeout: {r}"
        );
        assert!(started.elapsed().as_secs() < 20, "{isolation}: {r}");
        let (_, status) = call(&client, "get_sandbox_status", json!({"sandbox_name": name})).await;
        assert!(
            status.to_string().contains("memory limit"),
            "{isolation}: {status}"
        );
        let (err, r) = call(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
        assert!(!err, "{r}");
    }
    client.cancel().await.unwrap();
}

/// A sandbox's background job writes its log inside the sandbox's disk
/// limit (not uncounted under the login's ~/.outpost), and the log goes
/// with the sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_jobs_log_counts_against_its_disk_limit_and_goes_with_it() {
    assert!(
        bwrap_usable(),
        "bwrap cannot run here (scripts/setup-test-env installs it)"
    );
    let sshd = outpost_e2e::Sshd::start();
    let (env, _config) = common::mcp_client::isolated_env(&sshd);
    let (client, _home) = start(&env).await;
    let (err, made) = call(
        &client,
        "create_sandbox",
        json!({"host": "box", "isolation": "bwrap", "ttl_s": 600, "limits": {"disk_mb": 20}}),
    )
    .await;
    assert!(!err, "{made}");
    let name = made["sandbox_name"].as_str().unwrap().to_string();
    // 300 MB of output over about 15 s.
    let (err, job) = call(
        &client,
        "exec_bash_background",
        json!({"command": "for i in $(seq 300); do head -c 1000000 /dev/zero; sleep 0.05; done",
               "sandbox_name": name}),
    )
    .await;
    assert!(!err, "{job}");
    let log = std::path::PathBuf::from(job["log_file"].as_str().unwrap());
    let (err, ended) = call(
        &client,
        "wait_background_task",
        json!({"name": job["tmux_session"], "sandbox_name": name, "timeout_s": 40}),
    )
    .await;
    assert!(!err, "{ended}");
    let size = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    assert!(
        size < 100_000_000,
        "the log grew to {size} bytes: {}",
        ended["state"]
    );
    let (_, status) = call(&client, "get_sandbox_status", json!({"sandbox_name": name})).await;
    assert!(status.to_string().contains("disk limit"), "{status}");
    let (err, r) = call(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
    assert!(!err, "{r}");
    assert!(!log.exists(), "{} outlived its sandbox", log.display());
    client.cancel().await.unwrap();
}

/// A sandbox the daemon finishes making after its caller is gone (the
/// controller exited while the daemon was stopped) is deleted, not left
/// running under a name nobody was told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_made_for_a_caller_that_left_is_deleted() {
    assert!(
        bwrap_usable(),
        "bwrap cannot run here (scripts/setup-test-env installs it)"
    );
    let sshd = outpost_e2e::Sshd::start();
    let (env, _config) = common::mcp_client::isolated_env(&sshd);
    let (client, _home) = start(&env).await;
    let create = json!({"host": "box", "isolation": "bwrap", "ttl_s": 600, "keep": true});
    let (err, made) = call(&client, "create_sandbox", create.clone()).await;
    assert!(!err, "{made}");
    let agents = format!("{}/agents/", sshd.remote_dir().display());
    let daemon: Vec<i32> = outpost_e2e::pids_with_cmdline(&agents)
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split('\0').any(|arg| arg == "daemon"))
        })
        .collect();
    assert_eq!(daemon.len(), 1, "one jobs daemon");
    // SAFETY: plain syscalls on a pid of this test's own sshd.
    unsafe { libc::kill(daemon[0], libc::SIGSTOP) };
    let args = create.as_object().unwrap().clone();
    let pending = client
        .call_tool(rmcp::model::CallToolRequestParams::new("create_sandbox").with_arguments(args));
    assert!(
        tokio::time::timeout(std::time::Duration::from_secs(2), pending)
            .await
            .is_err(),
        "created with its daemon stopped"
    );
    client.cancel().await.unwrap();
    // The controller is gone, and with it the agent that asked.
    std::thread::sleep(std::time::Duration::from_secs(1));
    outpost_e2e::continue_pids(&daemon);
    let sandboxes = sshd.remote_dir().join("sandboxes");
    let states = || -> Vec<bool> {
        std::fs::read_dir(&sandboxes)
            .map(|dirs| {
                dirs.flatten()
                    .map(|d| d.path().join("meta/end.json").exists())
                    .collect()
            })
            .unwrap_or_default()
    };
    // Made once the daemon runs again, then deleted; the first one lives.
    let first = made["sandbox_name"].as_str().unwrap();
    let orphan_ended = || {
        let dirs: Vec<_> = std::fs::read_dir(&sandboxes).unwrap().flatten().collect();
        dirs.len() == 2
            && dirs.iter().all(|d| {
                first.ends_with(&*d.file_name().to_string_lossy())
                    || d.path().join("meta/end.json").exists()
            })
    };
    assert!(
        outpost_e2e::wait_until(std::time::Duration::from_secs(30), orphan_ended),
        "the sandbox made for a caller that left: {:?} (ended or not)",
        states()
    );
}

/// When the login's `$HOME` is not its passwd home (an sshd `SetEnv HOME`,
/// `sudo -u` keeping HOME), a sandbox hides both: neither home's `.ssh`
/// can be read by a command or by `execute_code`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_homes_stay_hidden_when_home_is_not_the_passwd_home() {
    assert!(
        bwrap_usable(),
        "bwrap cannot run here (scripts/setup-test-env installs it)"
    );
    let elsewhere = outpost_e2e::test_user_dir("home-elsewhere");
    let sshd = outpost_e2e::Sshd::start_with_home(elsewhere.path());
    let (env, _config) = common::mcp_client::isolated_env(&sshd);
    let (client, _home) = start(&env).await;
    let name = format!("outpost-secret-{}", std::process::id());
    let write = format!(
        "set -e; home=$(getent passwd $(id -un) | cut -d: -f6); \
         test \"$home\" != \"$HOME\"; for h in \"$home\" \"$HOME\"; do \
         mkdir -p \"$h/.ssh\" && echo SECRET > \"$h/.ssh/{name}\"; done; \
         echo \"$home/.ssh/{name}\"; echo \"$HOME/.ssh/{name}\""
    );
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": write, "sandbox_name": "box"}),
    )
    .await;
    assert!(!err && r["exit_code"] == 0, "{r}");
    let secrets: Vec<String> = r["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(secrets.len(), 2, "{r}");
    assert!(
        secrets[1].starts_with(&*elsewhere.path().to_string_lossy()),
        "{r}"
    );
    let read = format!("cat {} {}", secrets[0], secrets[1]);
    let (_, r) = call(
        &client,
        "exec_bash",
        json!({"command": read, "sandbox_name": "box"}),
    )
    .await;
    assert_eq!(
        r["stdout"], "SECRET\nSECRET\n",
        "the host itself reads both: {r}"
    );
    for isolation in ["bwrap", "landlock"] {
        let (err, made) = call(
            &client,
            "create_sandbox",
            json!({"host": "box", "isolation": isolation, "ttl_s": 600}),
        )
        .await;
        assert!(!err, "{isolation}: {made}");
        let sandbox = made["sandbox_name"].as_str().unwrap().to_string();
        let (_, r) = call(
            &client,
            "exec_bash",
            json!({"command": read, "sandbox_name": sandbox}),
        )
        .await;
        assert!(!r.to_string().contains("SECRET"), "{isolation}: {r}");
        let code = format!(
            "for p in {:?}:\n    try:\n        print(open(p).read())\n    except OSError as e:\n        print('refused', e.errno)\n",
            secrets
        );
        let (err, r) = call(
            &client,
            "execute_code",
            json!({"code": code, "sandbox_name": sandbox}),
        )
        .await;
        assert!(!err, "{isolation}: {r}");
        assert!(
            !r.to_string().contains("SECRET") && r.to_string().contains("refused"),
            "{isolation}: {r}"
        );
        let (err, r) = call(&client, "delete_sandbox", json!({"sandbox_name": sandbox})).await;
        assert!(!err, "{r}");
    }
    client.cancel().await.unwrap();
}

/// `allow_hosts` travels from the tool to the host's agent, which holds it
/// or refuses it: never a sandbox that seems limited and is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_hosts_reach_the_host_and_contradictions_are_refused() {
    assert!(
        bwrap_usable(),
        "bwrap cannot run here (scripts/setup-test-env installs it)"
    );
    let sshd = outpost_e2e::Sshd::start();
    let (env, _config) = common::mcp_client::isolated_env(&sshd);
    let (client, _home) = start(&env).await;
    let (err, r) = call(
        &client,
        "create_sandbox",
        json!({"host": "box", "allow_hosts": ["pypi.org"], "network": true}),
    )
    .await;
    assert!(err && r.to_string().contains("network: false"), "{r}");
    let (err, made) = call(
        &client,
        "create_sandbox",
        json!({"host": "box", "isolation": "bwrap", "network": false,
               "allow_hosts": ["localhost:9"]}),
    )
    .await;
    assert!(!err, "{made}");
    let name = made["sandbox_name"].as_str().unwrap().to_string();
    let (_, r) = call(
        &client,
        "exec_bash",
        json!({"command": "echo $HTTPS_PROXY; curl -s -m 5 http://localhost:8/", "sandbox_name": name}),
    )
    .await;
    let out = r["stdout"].as_str().unwrap_or_default();
    assert!(
        out.starts_with("http://127.0.0.1:3128\n")
            && out.contains("not in this sandbox's allow_hosts"),
        "{r}"
    );
    assert_eq!(r["egress_denied"], json!(["localhost:8"]), "{r}");
    let (err, r) = call(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
    assert!(!err, "{r}");
    client.cancel().await.unwrap();
}
