//! The `outpost` command line as people use it: exec's streaming and exit
//! status, hosts, diagnose.

use std::process::{Command, Output};

use outpost_e2e::{Sshd, TempDir, target_bin};

/// `outpost ARGS` with only the given environment and an empty home.
fn outpost(home: &TempDir, env: &[(&str, String)], args: &[&str]) -> Output {
    let mut cmd = Command::new(target_bin("outpost"));
    cmd.args(args)
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var("PATH").unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn exec_streams_output_and_exits_with_the_command_status() {
    let home = TempDir::new("cli-home");
    let out = outpost(
        &home,
        &[],
        &["exec", "--", "echo out; echo err >&2; exit 7"],
    );
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(text(&out.stdout), "out\n");
    assert!(text(&out.stderr).contains("err\n"));

    let out = outpost(
        &home,
        &[],
        &["exec", "local", "--timeout", "1", "--", "sleep 10"],
    );
    assert_eq!(out.status.code(), Some(124));
    assert!(text(&out.stderr).contains("timed out"));

    let out = outpost(&home, &[], &["exec", "nowhere", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("available: local"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn hosts_and_diagnose_over_ssh() {
    let sshd = Sshd::start();
    let home = TempDir::new("cli-home");
    let env = [
        (
            "REMOTE_SANDBOX_LIST",
            format!(
                r#"[{{"name":"box","host":"{}","port":{},"user":"{}","key_file":"{}"}}]"#,
                sshd.host(),
                sshd.port(),
                sshd.user(),
                sshd.client_key().display()
            ),
        ),
        (
            "OUTPOST_AGENT_BIN",
            target_bin("outpost-agent").display().to_string(),
        ),
    ];
    let out = outpost(&home, &env, &["hosts", "--resources", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["name"], "box");
    assert_eq!(rows[0]["connection_alive"], true);
    assert!(rows[0]["resources"]["memory"]["total_mb"].as_u64().unwrap() > 0);
    assert_eq!(rows[1]["name"], "local");

    let out = outpost(&home, &env, &["hosts"]);
    let table = text(&out.stdout);
    assert!(table.contains("box") && table.contains(" ok"), "{table}");

    let out = outpost(&home, &env, &["diagnose", "box"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    for want in ["configuration:", "box", "agent path:", "Problems"] {
        assert!(report.contains(want), "missing {want:?} in:\n{report}");
    }
}

#[test]
fn sync_both_ways_from_the_command_line() {
    let sshd = Sshd::start();
    let home = TempDir::new("cli-home");
    let config = home.path().join("config.toml");
    std::fs::write(&config, sshd.sandbox_toml("box")).unwrap();
    let env = [
        ("OUTPOST_CONFIG", config.display().to_string()),
        (
            "OUTPOST_AGENT_BIN",
            target_bin("outpost-agent").display().to_string(),
        ),
    ];
    let src = TempDir::new("cli-sync-src");
    std::fs::write(src.path().join("a.txt"), "a\n").unwrap();
    std::fs::create_dir_all(src.path().join("sub")).unwrap();
    std::fs::write(src.path().join("sub/b.txt"), "b\n").unwrap();
    std::fs::write(src.path().join("skip.log"), "x\n").unwrap();
    let remote = format!("box:{}/t", sshd.remote_dir().display());
    let src_arg = src.path().display().to_string();

    let out = outpost(&home, &env, &["sync", "--dry-run", &src_arg, &remote]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("dry run"),
        "{}",
        text(&out.stdout)
    );
    assert!(!sshd.remote_dir().join("t").exists());

    let out = outpost(
        &home,
        &env,
        &["sync", "--exclude", "*.log", &src_arg, &remote],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("2 files sent"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        std::fs::read_to_string(sshd.remote_dir().join("t/sub/b.txt")).unwrap(),
        "b\n"
    );
    assert!(!sshd.remote_dir().join("t/skip.log").exists());

    let back = TempDir::new("cli-sync-back");
    let out = outpost(
        &home,
        &env,
        &["sync", &remote, &back.path().display().to_string()],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(back.path().join("a.txt")).unwrap(),
        "a\n"
    );

    let out = outpost(&home, &env, &["sync", &src_arg, "/tmp/elsewhere"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("NAME:PATH"),
        "{}",
        text(&out.stderr)
    );
}
