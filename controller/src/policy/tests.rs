use super::*;

#[test]
fn policy_comes_from_the_file() {
    use crate::config::Config;
    let dir = std::env::temp_dir().join(format!("outpost-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.toml");
    let p = path.to_string_lossy().to_string();
    // What startup does: load the file, then compile its policy.
    let load = |text: &str| {
        std::fs::write(&path, text).unwrap();
        let cfg = Config::load_from(&[("HOME", "/h"), ("OUTPOST_CONFIG", p.as_str())])?;
        let names: Vec<String> = cfg.hosts.iter().map(|s| s.name.clone()).collect();
        Policy::compile(&cfg.policy, &names)
    };
    let policy = load(
        "[policy]\ndeny = ['rm\\s+-rf\\s+/']\nconfirm = ['sudo']\nconfirm_timeout_s = 30\n\
         [policy.sandbox.local]\nallow = ['echo .*']\n\
         [[sandbox]]\nname = \"gpu1\"\nhost = \"h\"\npolicy = { deny = ['reboot'] }\n",
    )
    .unwrap();
    assert_eq!(policy.confirm_timeout, Duration::from_secs(30));
    let err = policy.check("gpu1", "rm -rf /").unwrap_err().to_string();
    assert!(err.contains(&p), "the message names the file: {err}");
    assert!(policy.check("gpu1", "reboot").is_err());
    assert_eq!(policy.check("gpu1", "ls"), Ok(Verdict::Allow));
    assert!(policy.check("local", "ls").is_err());
    assert_eq!(policy.check("local", "echo hi"), Ok(Verdict::Allow));
    assert!(matches!(
        policy.check("local", "echo sudo"),
        Ok(Verdict::Confirm { .. })
    ));
    // An isolated sandbox on a host is under that host's rules.
    assert!(policy.check("gpu1/sbx-1", "reboot").is_err());
    assert!(policy.check("local/sbx-1", "ls").is_err());
    assert_eq!(policy.check("local/sbx-1", "echo hi"), Ok(Verdict::Allow));
    let err = policy
        .check("gpu1/sbx-1", "reboot")
        .unwrap_err()
        .to_string();
    assert!(err.contains("for sandbox gpu1/sbx-1"), "{err}");

    let err = format!("{:#}", load("[policy]\ndeny = ['(']\n").unwrap_err());
    assert!(err.contains("\"(\"") && err.contains("[policy]"), "{err}");
    let err = format!(
        "{:#}",
        load("[policy.sandbox.nope]\ndeny = ['x']\n").unwrap_err()
    );
    assert!(err.contains("nope"), "{err}");
    let err = format!("{:#}", load("[policy]\nblock = ['x']\n").unwrap_err());
    assert!(err.contains("block"), "{err}");

    let env = [
        ("HOME", "/h"),
        (
            "REMOTE_SANDBOX_LIST",
            r#"[{"host":"h","policy":{"allow":[".*"]}}]"#,
        ),
    ];
    let err = Config::load_from(&env).unwrap_err().to_string();
    assert!(err.contains("config file"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn rules(deny: &[&str], allow: &[&str], confirm: &[&str]) -> RawRules {
    let v = |s: &[&str]| s.iter().map(|p| p.to_string()).collect();
    RawRules {
        deny: v(deny),
        allow: v(allow),
        confirm: v(confirm),
        checkpoint: Vec::new(),
    }
}

#[test]
fn checkpoint_rules_match_anywhere_and_add_up_per_host() {
    let global = RawRules {
        checkpoint: vec![r"\brm\b".into()],
        ..RawRules::default()
    };
    let own = RawRules {
        checkpoint: vec!["git reset".into()],
        ..RawRules::default()
    };
    let policy =
        Policy::compile_rules(&global, &[("gpu1".into(), own)], &names(), None, "").unwrap();
    assert!(!policy.is_empty());
    assert_eq!(
        policy.checkpoint_rule("local", "cd x && rm -rf y"),
        Some(r"\brm\b")
    );
    assert_eq!(policy.checkpoint_rule("local", "git reset --hard"), None);
    assert_eq!(
        policy.checkpoint_rule("gpu1/sbx-1", "git reset --hard"),
        Some("git reset")
    );
    assert_eq!(policy.checkpoint_rule("gpu1/sbx-1", "make"), None);
    // A checkpoint rule refuses nothing.
    assert_eq!(policy.check("gpu1", "rm -rf build"), Ok(Verdict::Allow));
}

fn names() -> Vec<String> {
    vec!["gpu1".into(), "local".into()]
}

#[test]
fn no_rules_allow_everything() {
    let p = Policy::default();
    assert!(p.is_empty());
    assert_eq!(p.check("gpu1", "rm -rf /"), Ok(Verdict::Allow));
}

#[test]
fn deny_wins_over_allow_and_confirm() {
    let p = Policy::compile_rules(
        &rules(&[r"rm\s+-rf\s+/"], &[".*"], &["rm"]),
        &[],
        &names(),
        None,
        "/c.toml",
    )
    .unwrap();
    let refusal = p.check("gpu1", "cd x && rm  -rf /").unwrap_err();
    assert_eq!(
        refusal.to_string(),
        r#"refused by policy: deny rule "rm\\s+-rf\\s+/" ([policy]) for sandbox gpu1 (config: /c.toml)"#
    );
    assert_eq!(
        p.check("gpu1", "rm x"),
        Ok(Verdict::Confirm {
            rule: "rm".into(),
            scope: Scope::Global
        })
    );
    assert_eq!(p.check("gpu1", "ls"), Ok(Verdict::Allow));
}

#[test]
fn allow_patterns_match_whole_commands() {
    let p = Policy::compile_rules(
        &rules(&[], &[r"ls( -l)?", r"python train\.py.*"], &[]),
        &[],
        &names(),
        None,
        "/c.toml",
    )
    .unwrap();
    assert_eq!(p.check("local", "ls -l"), Ok(Verdict::Allow));
    assert_eq!(
        p.check("local", "python train.py --lr 1"),
        Ok(Verdict::Allow)
    );
    for bad in [
        "ls -la",
        "echo; ls",
        "python train.py\ncurl x | sh",
        "cat f",
    ] {
        let err = p.check("local", bad).unwrap_err();
        assert!(
            matches!(err.reason, RefusalReason::NotAllowed { .. }),
            "{bad}: {err}"
        );
        let text = err.to_string();
        assert!(
            text.contains("no allow rule") && text.contains(r#""ls( -l)?""#),
            "{text}"
        );
    }
}

#[test]
fn the_documented_argument_pattern_keeps_other_commands_out() {
    let p = Policy::compile_rules(
        &rules(&[], &["nvidia-smi", r"python train\.py[^;&|$`\n]*"], &[]),
        &[],
        &names(),
        None,
        "",
    )
    .unwrap();
    for ok in [
        "nvidia-smi",
        "python train.py",
        "python train.py --lr 0.1 > log",
    ] {
        assert_eq!(p.check("gpu1", ok), Ok(Verdict::Allow), "{ok}");
    }
    for bad in [
        "nvidia-smi; id",
        "python train.py; rm -rf ~",
        "python train.py && id",
        "python train.py | sh",
        "python train.py $(id)",
        "python train.py `id`",
        "python train.py\nid",
    ] {
        assert!(p.check("gpu1", bad).is_err(), "{bad}");
    }
}

#[test]
fn per_sandbox_rules_add_to_the_global_ones() {
    let p = Policy::compile_rules(
        &rules(&["shutdown"], &[], &["sudo"]),
        &[
            (
                "gpu1".into(),
                rules(&["nvidia-smi -r"], &["nvidia-smi.*", "sudo .*"], &[]),
            ),
            ("gpu1".into(), rules(&[], &[], &["nvidia-smi -pm"])),
        ],
        &names(),
        None,
        "/c.toml",
    )
    .unwrap();
    // Global deny applies on gpu1 too; its own deny only there.
    assert!(p.check("gpu1", "shutdown now").is_err());
    let err = p.check("gpu1", "nvidia-smi -r").unwrap_err();
    assert_eq!(
        err.reason,
        RefusalReason::Deny {
            rule: "nvidia-smi -r".into(),
            scope: Scope::Sandbox("gpu1".into())
        }
    );
    assert!(err.to_string().contains("policy of sandbox gpu1"), "{err}");
    // gpu1's allow-list does not reach local.
    assert_eq!(p.check("local", "echo hi"), Ok(Verdict::Allow));
    assert!(p.check("gpu1", "echo hi").is_err());
    assert!(matches!(
        p.check("gpu1", "nvidia-smi -pm 1"),
        Ok(Verdict::Confirm { .. })
    ));
    assert!(matches!(
        p.check("gpu1", "sudo reboot"),
        Ok(Verdict::Confirm {
            scope: Scope::Global,
            ..
        })
    ));
    assert!(matches!(
        p.check("local", "sudo ls"),
        Ok(Verdict::Confirm { .. })
    ));
}

#[test]
fn bad_patterns_and_unknown_sandboxes_are_load_errors() {
    let err = Policy::compile_rules(&rules(&["(unclosed"], &[], &[]), &[], &names(), None, "")
        .unwrap_err()
        .to_string();
    assert!(err.contains("(unclosed") && err.contains("deny"), "{err}");
    let err = Policy::compile_rules(
        &RawRules::default(),
        &[("gpu1".into(), rules(&[], &["[z-a]"], &[]))],
        &names(),
        None,
        "",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("[z-a]") && err.contains("gpu1"), "{err}");
    let err = Policy::compile_rules(
        &RawRules::default(),
        &[("gpu9".into(), rules(&["x"], &[], &[]))],
        &names(),
        None,
        "",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("gpu9"), "{err}");
    assert!(Policy::compile_rules(&RawRules::default(), &[], &names(), Some(0.0), "").is_err());
}

#[test]
fn review_checks_every_command_and_sandbox() {
    let p = Policy::compile_rules(
        &rules(&["curl"], &[], &["sudo"]),
        &[("gpu1".into(), rules(&["reboot"], &[], &[]))],
        &names(),
        None,
        "/c.toml",
    )
    .unwrap();
    let plan = |sandbox, field, command| Planned::command(sandbox, field, command);
    // Fan-out: refused as a whole when one sandbox refuses.
    let err = p
        .review(&[
            plan("local", "command", "reboot"),
            plan("gpu1", "command", "reboot"),
        ])
        .unwrap_err();
    assert_eq!(err.sandbox, "gpu1");
    // A job's resume command is checked too, and named.
    let err = p
        .review(&[
            plan("local", "command", "python x.py"),
            plan("local", "resume_command", "curl x | sh"),
        ])
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("refused by policy: resume_command: deny rule \"curl\""),
        "{err}"
    );
    let pending = p
        .review(&[
            plan("local", "command", "sudo ls"),
            plan("gpu1", "command", "ls"),
        ])
        .unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].sandbox, "local");
    let q = confirm_question(&pending, &p, "An agent");
    assert!(q.contains("sudo ls") && q.contains("\"sudo\""), "{q}");
    let e = not_confirmed(&pending, "the user declined");
    assert!(
        e.starts_with("refused: confirm rule \"sudo\" for sandbox local"),
        "{e}"
    );
}

#[test]
fn code_is_refused_where_allow_rules_exist() {
    let p = Policy::compile_rules(
        &rules(&["rm -rf"], &[], &["sudo"]),
        &[("gpu1".into(), rules(&[], &["nvidia-smi"], &[]))],
        &names(),
        None,
        "/c.toml",
    )
    .unwrap();
    // gpu1 and its isolated sandboxes list what may run: code cannot be
    // matched against that list.
    for sandbox in ["gpu1", "gpu1/sbx-1"] {
        let err = p.check_unmatchable(sandbox, "code", "code").unwrap_err();
        assert!(matches!(err.reason, RefusalReason::Unmatchable { .. }));
        let text = err.to_string();
        assert!(
            text.starts_with("refused by policy: code: sandbox ")
                && text.contains("\"nvidia-smi\"")
                && text.contains("code cannot be checked")
                && text.contains("/c.toml"),
            "{text}"
        );
    }
    // Elsewhere only deny and confirm rules apply, to the code's text.
    assert_eq!(p.check_unmatchable("local", "code", "code"), Ok(()));
    let plan = |command| Planned::command("local", "code", command);
    assert!(
        p.review(&[plan("import os\nos.system('rm -rf /')")])
            .is_err()
    );
    assert_eq!(p.review(&[plan("print(1)")]).unwrap(), vec![]);
    assert_eq!(p.review(&[plan("!sudo ls")]).unwrap().len(), 1);
}

#[test]
fn job_commands_include_resume_and_checkpoint() {
    let spec = outpost_protocol::JobSpec {
        command: "train".into(),
        watch: outpost_protocol::WatchSpec {
            resume_command: Some("resume".into()),
            checkpoint_command: Some("cat ckpt".into()),
            resume_plan_json: Some(r#"{"resume_command": "plan"}"#.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let fields = job_commands(&spec);
    let fields: Vec<(&str, &str)> = fields.iter().map(|(f, c)| (*f, c.as_str())).collect();
    assert_eq!(
        fields,
        vec![
            ("command", "train"),
            ("resume_command", "resume"),
            ("resume_plan_json", "plan"),
            ("checkpoint_command", "cat ckpt")
        ]
    );
}

#[test]
fn stdin_is_data_for_deny_and_confirm_rules() {
    let deny = Policy::compile_rules(
        &rules(&["curl"], &[], &["sudo"]),
        &[],
        &names(),
        None,
        "/c.toml",
    )
    .unwrap();
    let planned = |stdin| {
        [
            Planned::command("gpu1", "command", "bash"),
            Planned::data("gpu1", "stdin", stdin),
        ]
    };
    let refusal = deny.review(&planned("curl x | sh")).unwrap_err();
    assert!(
        refusal
            .to_string()
            .starts_with("refused by policy: stdin: deny rule"),
        "{refusal}"
    );
    let pending = deny.review(&planned("sudo reboot")).unwrap();
    assert_eq!(pending[0].field, "stdin");
    // Allow rules say which commands run, not what they read.
    let allow = Policy::compile_rules(
        &rules(&[], &["python3 train\\.py"], &[]),
        &[],
        &names(),
        None,
        "/c.toml",
    )
    .unwrap();
    let fed = [
        Planned::command("gpu1", "command", "python3 train.py"),
        Planned::data("gpu1", "stdin", "epochs: 3"),
    ];
    assert_eq!(allow.review(&fed), Ok(vec![]));
}

#[test]
fn where_allow_rules_vouch_for_text_nothing_may_change_what_it_runs() {
    let p = Policy::compile_rules(
        &rules(&["LD_PRELOAD"], &[], &[]),
        &[(
            "gpu1".into(),
            rules(&[], &["python3 train\\.py", "ls"], &[]),
        )],
        &names(),
        None,
        "/c.toml",
    )
    .unwrap();
    let err = p
        .check_writes("gpu1/sbx-1", "writing its files")
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("writing its files could change what they run"),
        "{err}"
    );
    assert_eq!(p.check_writes("local", "writing its files"), Ok(()));
    // A fake `ls` first on PATH: any env on such a host.
    let err = p
        .check_env("gpu1", [("PATH", "/tmp/fake:/usr/bin")])
        .unwrap_err();
    assert!(err.to_string().contains("a sandbox env"), "{err}");
    assert_eq!(p.check_env("gpu1", []), Ok(()));
    // Elsewhere deny rules see every assignment.
    let err = p.check_env("local", [("LD_PRELOAD", "/x.so")]).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("refused by policy: env: deny rule \"LD_PRELOAD\""),
        "{err}"
    );
    assert_eq!(p.check_env("local", [("HF_HOME", "/data")]), Ok(()));
}
