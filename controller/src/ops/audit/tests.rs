use super::*;

fn args(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

#[test]
fn contents_and_secrets_never_reach_the_digest() {
    let content = "TOP-SECRET-FILE-BODY ".repeat(100);
    let d = digest(Some(&args(json!({
        "remote_path": "/etc/app.conf",
        "content": content,
        "password": "hunter2",
        "key_passphrase": "open-sesame",
        "api_token": "tok-123",
        "key": "-----BEGIN OPENSSH PRIVATE KEY-----",
        "key_file": "~/.ssh/id",
        "mode": "600",
        "nested": {"secret": "s3", "list": [{"token": "t4"}]},
    }))));
    let text = d.to_string();
    for secret in [
        "TOP-SECRET-FILE-BODY",
        "hunter2",
        "open-sesame",
        "tok-123",
        "BEGIN OPENSSH",
        "s3\"",
        "t4",
    ] {
        assert!(!text.contains(secret), "{secret} leaked: {text}");
    }
    assert_eq!(d["content"]["len"], content.len());
    assert_eq!(
        d["content"]["blake3"],
        blake3::hash(content.as_bytes()).to_hex()[..16]
    );
    assert_eq!(d["password"], "[redacted]");
    assert_eq!(d["key_file"], "~/.ssh/id", "a path, not a secret");
    assert_eq!(d["remote_path"], "/etc/app.conf");
    assert_eq!(d["mode"], "600");
    // An empty secret says nothing and stays as it is.
    assert_eq!(digest(Some(&args(json!({"password": ""}))))["password"], "");
}

#[test]
fn commands_are_kept_but_cut_and_scrubbed() {
    let long = format!("echo {}", "x".repeat(5000));
    let d = digest(Some(&args(
        json!({"command": long, "cwd": "y".repeat(500)}),
    )));
    let command = d["command"].as_str().unwrap();
    assert!(
        command.starts_with("echo xxx") && command.len() < 1100,
        "{command}"
    );
    assert!(command.contains("bytes]"), "{command}");
    assert!(d["cwd"].as_str().unwrap().len() < 250);

    let d = digest(Some(&args(json!({
        "command": "HF_TOKEN=hf_abc123 AWS_SECRET_ACCESS_KEY='k/ey' python x.py --password pw1 --api-key=ak2 && curl -H 'Authorization: Bearer bt3' https://me:pw4@host/x",
        "resume_command": "export GITHUB_TOKEN=gh5; ./resume",
    }))));
    let text = d.to_string();
    for secret in ["hf_abc123", "k/ey", "pw1", "ak2", "bt3", "pw4", "gh5"] {
        assert!(!text.contains(secret), "{secret} leaked: {text}");
    }
    assert!(
        text.contains("python x.py") && text.contains("./resume"),
        "{text}"
    );
    // Code for an interpreter is kept as a command is.
    let code = format!("API_KEY = 'ak6'\n{}", "x = 1\n".repeat(100));
    let d = digest(Some(&args(json!({"code": code}))));
    let kept = d["code"].as_str().unwrap();
    assert!(kept.len() > 500 && !kept.contains("ak6"), "{kept}");
}

#[test]
fn python_spellings_of_secrets_are_scrubbed() {
    let cases = [
        // A subscripted name, quoted.
        (r#"os.environ["HF_TOKEN"] = "hf_s1""#, "hf_s1"),
        ("os.environ['MY_SECRET']='s2'", "s2"),
        // A dict's key, or YAML's.
        (r#"client = Client({"api_key": "s3"})"#, "s3"),
        ("password: s4", "s4"),
        // A header in quotes.
        (
            r#"requests.get(u, headers={"Authorization": "Bearer s5"})"#,
            "s5",
        ),
        (r#"curl -H "Authorization: token s6" https://x"#, "s6"),
        ("headers = dict(Authorization='Bearer s7')", "s7"),
        ("AUTHORIZATION=Bearer s8 ./call", "s8"),
        // Tokens by their shape, wherever they stand.
        (
            r#"login("hf_abcdefghijklmnopqrst")"#,
            "hf_abcdefghijklmnopqrst",
        ),
        (
            r#"OpenAI(key="sk-proj-abcdefghijklmnop1234")"#,
            "sk-proj-abcdefghijklmnop1234",
        ),
        (
            "git clone https://ghp_abcdefghijklmnopqrstuv@github.com/a/b",
            "ghp_abcdefghijklmnopqrstuv",
        ),
        ("print('AKIAABCDEFGHIJKLMNOP')", "AKIAABCDEFGHIJKLMNOP"),
        ("send('xoxb-1234567890-abcdef')", "xoxb-1234567890-abcdef"),
        // Short names and the command lines of tools that take
        // passwords.
        ("DB_PASS=s9 ./migrate", "s9"),
        ("MYSQL_PWD='s10' mysql db", "s10"),
        ("export GITHUB_PAT=s11", "s11"),
        ("pw='s12'; login $pw", "s12"),
        ("mysql -u root -ps13 db < dump.sql", "s13"),
        ("sshpass -p 's14' ssh host", "s14"),
        ("curl -u admin:s15 https://x", "s15"),
        ("curl --user=admin:s16 https://x", "s16"),
    ];
    for (text, secret) in cases {
        let scrubbed = scrub(text);
        assert!(
            !scrubbed.contains(secret) && scrubbed.contains("[redacted]"),
            "{text} -> {scrubbed}"
        );
    }
    // Code around them stays readable: a loop over tokens is no
    // secret, nor is a task's name, nor the next line.
    let code = "for token in tokens:\n    print(token)\nrun('task-abcdefghijklmnopqrst')";
    assert_eq!(scrub(code), code);
    // The working directory, a bypass flag, a pattern: no secrets.
    for kept in [
        "cd $PWD && BYPASS=1 make",
        "PWD=/srv/app ./run",
        "grep -p x | PAT=*.rs",
    ] {
        assert_eq!(scrub(kept), kept);
    }
}

#[test]
fn long_lists_and_deep_values_are_bounded() {
    let many: Vec<String> = (0..100).map(|i| format!("p{i}")).collect();
    let d = digest(Some(&args(
        json!({"excludes": many, "a": {"b": {"c": {"d": {"e": [1]}}}}}),
    )));
    assert_eq!(d["excludes"].as_array().unwrap().len(), MAX_ITEMS + 1);
    assert!(d.to_string().len() < 1000, "{d}");
}

#[test]
fn sandbox_of_a_call() {
    let active = || "gpu1".to_string();
    assert_eq!(sandbox_of(None, active), json!("gpu1"));
    assert_eq!(
        sandbox_of(Some(&args(json!({"sandbox_name": "box"}))), active),
        json!("box")
    );
    assert_eq!(
        sandbox_of(Some(&args(json!({"sandbox_name": ""}))), active),
        json!("gpu1")
    );
    assert_eq!(
        sandbox_of(Some(&args(json!({"sandboxes": ["a", "b"]}))), active),
        json!(["a", "b"])
    );
}

fn record(tool: &str, n: usize) -> Record {
    Record {
        time: now_rfc3339(),
        client: "test-client".into(),
        subject: None,
        oauth_client: None,
        tool: tool.into(),
        sandbox: json!("local"),
        args: json!({"command": format!("echo {n}")}),
        outcome: "ok".into(),
        error: None,
        duration_ms: n as u64,
        notes: Map::new(),
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("outpost-audit-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn lines_are_appended_with_mode_0600_and_rotated() {
    let dir = scratch("rotate");
    let log = AuditLog::with_limits(dir.join("state/audit.jsonl"), 1000, 2);
    for n in 0..40 {
        log.append(&record("exec_bash", n)).unwrap();
    }
    let mode = std::fs::metadata(log.path()).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let dir_mode = std::fs::metadata(dir.join("state")).unwrap().mode() & 0o777;
    assert_eq!(dir_mode, 0o700);
    for path in [log.path().to_path_buf(), log.rotated(1), log.rotated(2)] {
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(len > 0 && len <= 1000, "{} is {len} bytes", path.display());
        let text = std::fs::read_to_string(&path).unwrap();
        for line in text.lines() {
            serde_json::from_str::<Record>(line).unwrap();
        }
    }
    assert!(!log.rotated(3).exists(), "only two rotated files are kept");
    // The tail reaches into the rotated files, oldest first.
    let tail = log.tail(12).unwrap();
    assert_eq!(tail.len(), 12);
    let last: Record = serde_json::from_str(&tail[11]).unwrap();
    assert_eq!(last.duration_ms, 39);
    let first: Record = serde_json::from_str(&tail[0]).unwrap();
    assert_eq!(first.duration_ms, 28);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn concurrent_writers_interleave_whole_lines() {
    let dir = scratch("concurrent");
    let log = AuditLog::with_limits(dir.join("audit.jsonl"), 20_000, 3);
    std::thread::scope(|s| {
        for t in 0..4 {
            let log = log.clone();
            s.spawn(move || {
                for n in 0..100 {
                    log.append(&record(&format!("t{t}"), n)).unwrap();
                }
            });
        }
    });
    let lines = log.tail(1000).unwrap();
    assert_eq!(lines.len(), 400);
    for line in &lines {
        serde_json::from_str::<Record>(line).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_dropped_call_is_recorded_as_cancelled() {
    let dir = scratch("cancel");
    let log = AuditLog::new(&dir);
    drop(Call::begin(
        &log,
        "c".into(),
        "exec_bash".into(),
        json!("local"),
        json!({}),
    ));
    let tail = log.tail(1).unwrap();
    let r: Record = serde_json::from_str(&tail[0]).unwrap();
    assert_eq!(r.outcome, "cancelled");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_log_that_cannot_be_written_fails_quietly() {
    let dir = scratch("unwritable");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("file"), "").unwrap();
    // The home is a regular file: nothing can be created below it.
    let log = AuditLog::new(&dir.join("file"));
    assert!(log.append(&record("exec_bash", 1)).is_err());
    log.record(&record("exec_bash", 1));
    drop(Call::begin(
        &log,
        "c".into(),
        "t".into(),
        Value::Null,
        json!({}),
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn human_lines_are_aligned() {
    let mut a = record("exec_bash", 1);
    a.error = Some("refused by policy: x".into());
    a.outcome = "refused".into();
    let b = record("list_sandboxes", 22);
    let lines: Vec<String> = [a, b]
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .chain(["not json".to_string()])
        .collect();
    let out = format_human(&lines);
    assert_eq!(out.len(), 3);
    assert!(
        out[0].contains("echo 1 — refused by policy: x"),
        "{}",
        out[0]
    );
    let col = |s: &str| s.find("local").unwrap();
    assert_eq!(col(&out[0]), col(&out[1]), "{out:?}");
    assert_eq!(out[2], "not json");
    assert!(now_rfc3339().ends_with('Z') && now_rfc3339().len() == 24);
}
