//! The `outpost` command line as people use it: exec's streaming, input and
//! exit status, hosts, diagnose.

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

    // Standard input reaches the command, unless -n.
    let mut cat = Command::new(target_bin("outpost"));
    cat.args(["exec", "--", "cat; echo end"])
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var("PATH").unwrap())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = cat.spawn().unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"piped in\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(text(&out.stdout), "piped in\nend\n");
    let out = outpost(&home, &[], &["exec", "-n", "--", "cat; echo end"]);
    assert_eq!(text(&out.stdout), "end\n");

    // A command that cannot start there is not "host unreachable" (255).
    let out = outpost(&home, &[], &["exec", "--cwd", "/no/such/dir", "--", "true"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("/no/such/dir"),
        "{}",
        text(&out.stderr)
    );

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

    // A host that cannot be reached fails both, as a script would check it.
    let down = [(
        "REMOTE_SANDBOX_LIST",
        format!(
            r#"[{{"name":"down","host":"127.0.0.1","port":1,"user":"{}","key_file":"{}"}}]"#,
            sshd.user(),
            sshd.client_key().display()
        ),
    )];
    for args in [&["hosts"][..], &["hosts", "--json"], &["diagnose"]] {
        let out = outpost(&home, &down, args);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?}: {}",
            text(&out.stdout)
        );
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

    // A dry run with --delete names what it would delete.
    std::fs::remove_file(src.path().join("a.txt")).unwrap();
    let out = outpost(
        &home,
        &env,
        &[
            "sync",
            "--dry-run",
            "--delete",
            "--exclude",
            "*.log",
            &src_arg,
            &remote,
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("would delete  a.txt"),
        "{}",
        text(&out.stdout)
    );
    assert!(sshd.remote_dir().join("t/a.txt").exists());

    // One remote file, into a local directory, the rest of it left alone.
    let one = TempDir::new("cli-sync-one");
    std::fs::write(one.path().join("keep"), "kept").unwrap();
    let out = outpost(
        &home,
        &env,
        &[
            "sync",
            &format!("{remote}/sub/b.txt"),
            &one.path().display().to_string(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(one.path().join("b.txt")).unwrap(),
        "b\n"
    );
    assert!(one.path().join("keep").exists());

    let out = outpost(&home, &env, &["sync", &src_arg, "/tmp/elsewhere"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("NAME:PATH"),
        "{}",
        text(&out.stderr)
    );
    let out = outpost(&home, &env, &["sync", &src_arg, "nope:/tmp/x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no sandbox named nope (sandboxes: box"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn jobs_start_from_the_command_line() {
    let home = TempDir::new("cli-home");
    let out = outpost(
        &home,
        &[],
        &[
            "jobs",
            "start",
            "local",
            "--name",
            "cli-job",
            "--",
            "echo started; exit 3",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "cli-job\n");
    let out = outpost(&home, &[], &["jobs", "wait", "cli-job", "--host", "local"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
}

/// A sandbox that only `~/.ssh/config`'s `Match` blocks make reachable:
/// `Match host` sees the `HostName`, its options stay in its block, and a
/// `Match` that Outpost cannot evaluate but that would decide an option is
/// an error naming it.
#[test]
fn a_host_reached_through_ssh_config_match_blocks() {
    let sshd = Sshd::start();
    let home = TempDir::new("cli-home");
    std::fs::create_dir_all(home.path().join(".ssh")).unwrap();
    std::fs::write(
        home.path().join(".ssh/config"),
        format!(
            "Host box\n  HostName {host}\nHost elsewhere\n  Port 1\n\
             Match host {host} originalhost box\n  Port {port}\n  User {user}\n  \
             IdentityFile {key}\n  IdentitiesOnly yes\n  ConnectTimeout 5\n\
             Match exec true\n  HostName 192.0.2.1\n",
            host = sshd.host(),
            port = sshd.port(),
            user = sshd.user(),
            key = sshd.client_key().display(),
        ),
    )
    .unwrap();
    let config = home.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[[sandbox]]\nname = \"box\"\nhost = \"box\"\nremote_dir = \"{}\"\n\
             [[sandbox]]\nname = \"odd\"\nhost = \"odd\"\n",
            sshd.remote_dir().display()
        ),
    )
    .unwrap();
    let env = [
        ("OUTPOST_CONFIG", config.display().to_string()),
        (
            "OUTPOST_AGENT_BIN",
            target_bin("outpost-agent").display().to_string(),
        ),
    ];
    let out = outpost(&home, &env, &["exec", "box", "--", "echo via match"]);
    assert_eq!(text(&out.stdout), "via match\n", "{}", text(&out.stderr));
    assert!(out.status.success());

    let out = outpost(&home, &env, &["exec", "odd", "--", "true"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("Match exec") && err.contains("hostname"),
        "{err}"
    );
}

/// `outpost sync SRC H1,H2:PATH` pushes to both at once, one report line
/// each; a pull names one sandbox. Each sshd gives its sessions a HOME of
/// its own, so the relative PATH is a different tree on each.
#[test]
fn sync_to_several_hosts_from_the_command_line() {
    let homes: Vec<TempDir> = (0..2)
        .map(|i| outpost_e2e::test_user_dir(&format!("cli-fanout-home-{i}")))
        .collect();
    let hosts: Vec<Sshd> = homes
        .iter()
        .map(|h| Sshd::start_with_home(h.path()))
        .collect();
    let home = TempDir::new("cli-home");
    let config = home.path().join("config.toml");
    let text_of: String = (0..2)
        .map(|i| hosts[i].sandbox_toml(&format!("box{i}")))
        .collect();
    std::fs::write(&config, text_of).unwrap();
    let env = [
        ("OUTPOST_CONFIG", config.display().to_string()),
        (
            "OUTPOST_AGENT_BIN",
            target_bin("outpost-agent").display().to_string(),
        ),
    ];
    let src = TempDir::new("cli-fanout-src");
    std::fs::write(src.path().join("a.txt"), "a\n").unwrap();
    std::fs::write(src.path().join("b.txt"), "b\n").unwrap();
    let src_arg = src.path().display().to_string();

    let out = outpost(&home, &env, &["sync", &src_arg, "box0,box1:fan"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for (i, host_home) in homes.iter().enumerate() {
        assert!(
            stdout.contains(&format!("box{i}: 2 files sent")),
            "{stdout}"
        );
        assert_eq!(
            std::fs::read_to_string(host_home.path().join("fan/b.txt")).unwrap(),
            "b\n"
        );
    }

    let back = TempDir::new("cli-fanout-back");
    let out = outpost(
        &home,
        &env,
        &["sync", "box0,box1:fan", &back.path().display().to_string()],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("one sandbox"),
        "{}",
        text(&out.stderr)
    );
    let out = outpost(&home, &env, &["sync", &src_arg, "box0,box0:fan"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("named twice"),
        "{}",
        text(&out.stderr)
    );
    let out = outpost(&home, &env, &["sync", &src_arg, "box0,nope:fan"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no sandbox named nope"),
        "{}",
        text(&out.stderr)
    );
    // A bad sandbox id under a configured host is named as such.
    let out = outpost(&home, &env, &["sync", &src_arg, "box0,box1/Bad_Id:fan"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("bad sandbox id \"Bad_Id\""),
        "{}",
        text(&out.stderr)
    );
}

/// No agent build at all (none beside `outpost`, none named, none in
/// `dist/agents`, which a fresh clone lacks) is an incomplete install: said
/// at once with where the agent belongs, exit 1, not an unreachable host
/// (255) after a connect.
#[test]
fn a_missing_agent_is_an_install_problem_not_an_unreachable_host() {
    let home = TempDir::new("cli-no-agent");
    let env = [(
        "OUTPOST_AGENT_BIN",
        "/nonexistent/outpost-agent".to_string(),
    )];
    let out = outpost(&home, &env, &["exec", "--", "true"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("outpost-agent is missing: it belongs at")
            && stderr.contains("cargo install"),
        "{stderr}"
    );
}

/// Undo and branch from the command line, on the local host: a checkpoint,
/// a change, the diff, a restore, a fork; each an exit status scripts can
/// trust.
#[test]
fn checkpoints_and_forks_from_the_command_line() {
    let home = TempDir::new("cli-home");
    let run = |args: &[&str]| {
        let out = outpost(&home, &[], args);
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    };
    let made = run(&["sandbox", "create", "local", "--isolation", "none"]);
    let name = made.lines().next().unwrap().to_string();
    run(&["exec", &name, "--", "echo one > a"]);
    let saved = run(&["sandbox", "checkpoint", &name, "--label", "first"]);
    let checkpoint = saved.lines().next().unwrap().to_string();
    assert_eq!(checkpoint, format!("{name}@1"));
    assert!(run(&["sandbox", "checkpoints", &name]).contains("first"));
    run(&["exec", &name, "--", "echo two > a; echo new > b"]);
    let diff = run(&["sandbox", "diff", &checkpoint]);
    assert!(
        diff.contains("changed  a") && diff.contains("added    b"),
        "{diff}"
    );
    assert!(diff.contains("-one") && diff.contains("+two"), "{diff}");
    run(&["sandbox", "restore", &checkpoint]);
    assert_eq!(run(&["exec", &name, "--", "cat a; ls"]), "one\na\n");
    let fork = run(&["sandbox", "fork", &name]);
    let forked = fork.lines().next().unwrap().to_string();
    assert_ne!(forked, name);
    assert_eq!(run(&["exec", &forked, "--", "cat a"]), "one\n");
    let bad = outpost(&home, &[], &["sandbox", "restore", &format!("{name}@7")]);
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad.stderr));
    assert!(
        text(&bad.stderr).contains("no checkpoint 7"),
        "{}",
        text(&bad.stderr)
    );
    for sandbox in [&name, &forked] {
        run(&["sandbox", "delete", sandbox]);
    }
}

/// `outpost attach` on a new terminal: keys from stdin reach the command,
/// its screen comes out, and the command's exit code is the CLI's.
#[test]
fn attach_types_into_a_terminal_and_exits_with_its_command() {
    use std::io::Write;
    let home = TempDir::new("cli-home");
    let mut child = Command::new(target_bin("outpost"))
        .args([
            "attach",
            "--command",
            "read -p 'name? ' x; echo got:$x; exit 4",
        ])
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var("PATH").unwrap())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"outpost\r").unwrap();
    let out = child.wait_with_output().unwrap();
    drop(stdin);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("got:outpost"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stderr).contains("attached to local#t-"),
        "{}",
        text(&out.stderr)
    );
}
