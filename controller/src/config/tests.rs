use super::*;

fn ssh(c: &HostConfig) -> &SshTarget {
    match &c.target {
        Target::Ssh(t) => t,
        other => panic!("expected ssh, got {other:?}"),
    }
}

#[test]
fn no_configuration_gives_the_local_sandbox() {
    let dir = std::env::temp_dir().join("outpost-config-test-empty");
    let home = dir.to_string_lossy().to_string();
    let cfg = Config::load_from(&[("HOME", home.as_str())]).unwrap();
    assert_eq!(cfg.hosts, vec![HostConfig::local()]);
}

#[test]
fn sandbox_list_env_with_defaults_and_tilde() {
    let env = [
        ("HOME", "/home/u"),
        ("USER", "u"),
        (
            "REMOTE_SANDBOX_LIST",
            r#"[{"name":"gpu1","host":"10.0.0.1","user":"ubuntu","password":"s"},
                    {"host":"h2","port":2200,"key_file":"~/.ssh/id","key_passphrase":"p"}]"#,
        ),
    ];
    let cfg = Config::load_from(&env).unwrap();
    assert_eq!(cfg.hosts.len(), 3);
    let a = ssh(&cfg.hosts[0]);
    assert_eq!((a.port, a.user.as_str()), (22, "ubuntu"));
    assert_eq!(a.password.as_deref(), Some("s"));
    assert_eq!(cfg.hosts[1].name, "h2");
    let b = ssh(&cfg.hosts[1]);
    assert_eq!((b.port, b.user.as_str()), (2200, "u"));
    assert_eq!(b.key_file.as_deref(), Some(Path::new("/home/u/.ssh/id")));
    assert_eq!(cfg.hosts[2].name, LOCAL_HOST);
}

#[test]
fn single_host_env_and_bad_port() {
    let env = [
        ("HOME", "/h"),
        ("REMOTE_HOST", "box"),
        ("REMOTE_USER", "me"),
    ];
    let cfg = Config::load_from(&env).unwrap();
    assert_eq!(cfg.hosts[0].name, "box");
    let env = [("HOME", "/h"), ("REMOTE_HOST", "box"), ("REMOTE_PORT", "x")];
    let err = Config::load_from(&env).unwrap_err().to_string();
    assert!(err.contains("REMOTE_PORT"), "{err}");
}

#[test]
fn malformed_sandbox_list_is_explained() {
    let env = [("HOME", "/h"), ("REMOTE_SANDBOX_LIST", "{not json")];
    let err = format!("{:#}", Config::load_from(&env).unwrap_err());
    assert!(err.contains("JSON array"), "{err}");
}

#[test]
fn ssh_config_alias_fills_the_gaps() {
    let dir = std::env::temp_dir().join(format!("outpost-cfg-{}", std::process::id()));
    std::fs::create_dir_all(dir.join(".ssh")).unwrap();
    std::fs::write(
        dir.join(".ssh/config"),
        "Host gpu\n  HostName 192.0.2.7\n  Port 2222\n  User alice\n  IdentityFile ~/.ssh/gpu_key\n",
    )
    .unwrap();
    let home = dir.to_string_lossy().to_string();
    let env = [
        ("HOME", home.as_str()),
        ("REMOTE_SANDBOX_LIST", r#"[{"host":"gpu"}]"#),
    ];
    let cfg = Config::load_from(&env).unwrap();
    let t = ssh(&cfg.hosts[0]);
    assert_eq!(t.hostname, "192.0.2.7");
    assert_eq!(t.port, 2222);
    assert_eq!(t.user, "alice");
    assert_eq!(t.identity_files, vec![dir.join(".ssh/gpu_key")]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ssh_config_proxy_jump_and_options_outpost_does_not_follow() {
    let dir = std::env::temp_dir().join(format!("outpost-jump-{}", std::process::id()));
    std::fs::create_dir_all(dir.join(".ssh")).unwrap();
    std::fs::write(
        dir.join(".ssh/bastions"),
        "Host bastion\n  HostName 192.0.2.1\n  User hop\n  Port 2200\n",
    )
    .unwrap();
    std::fs::write(
        dir.join(".ssh/config"),
        "Include ~/.ssh/bastions\nHost gpu\n  HostName 10.0.0.7\n  ProxyJump bastion,carol@relay:2022\n  StrictHostKeyChecking yes\n  IdentityFile ~/.ssh/k\n  UserKnownHostsFile ~/.ssh/lab_hosts\nHost odd\n  ProxyCommand nc %h %p\n",
    )
    .unwrap();
    let home = dir.to_string_lossy().to_string();
    let load =
        |list: &str| Config::load_from(&[("HOME", home.as_str()), ("REMOTE_SANDBOX_LIST", list)]);
    let cfg = load(r#"[{"host":"gpu","user":"me"}]"#).unwrap();
    let t = ssh(&cfg.hosts[0]);
    assert!(t.strict_host_keys);
    assert_eq!(t.user_known_hosts, Some(vec![dir.join(".ssh/lab_hosts")]));
    let hops: Vec<(&str, u16, &str)> = t
        .jump
        .iter()
        .map(|j| (j.hostname.as_str(), j.port, j.user.as_str()))
        .collect();
    assert_eq!(hops, [("192.0.2.1", 2200, "hop"), ("relay", 2022, "carol")]);
    // Hops without keys of their own use the sandbox's.
    assert_eq!(t.jump[1].identity_files, vec![dir.join(".ssh/k")]);
    // Only that sandbox is unusable, with the reason; the rest load.
    let cfg = load(r#"[{"host":"odd"},{"host":"gpu"}]"#).unwrap();
    let err = ssh(&cfg.hosts[0]).unusable.clone().unwrap();
    assert!(
        err.contains("ProxyCommand (use ProxyJump)") && err.contains("odd"),
        "{err}"
    );
    assert!(ssh(&cfg.hosts[1]).unusable.is_none());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ssh_config_match_blocks_identities_only_and_connect_timeout() {
    let dir = std::env::temp_dir().join(format!("outpost-match-{}", std::process::id()));
    std::fs::create_dir_all(dir.join(".ssh")).unwrap();
    std::fs::write(
        dir.join(".ssh/config"),
        "Host gpu
  HostName n1.lab.example
Host plain
  HostName 192.0.2.9
             Match host *.lab.example
  IdentitiesOnly yes
  ConnectTimeout 3
  User lab
             Match exec true
  User never
",
    )
    .unwrap();
    let home = dir.to_string_lossy().to_string();
    let env = [
        ("HOME", home.as_str()),
        (
            "REMOTE_SANDBOX_LIST",
            r#"[{"host":"gpu"},{"host":"plain"}]"#,
        ),
    ];
    let cfg = Config::load_from(&env).unwrap();
    let gpu = ssh(&cfg.hosts[0]);
    assert_eq!(
        (gpu.user.as_str(), gpu.identities_only, gpu.connect_timeout),
        ("lab", true, Some(Duration::from_secs(3)))
    );
    // Evaluating `plain` reaches `Match exec`, which Outpost cannot
    // judge: that sandbox says so; `gpu` matched before it got there.
    let plain = ssh(&cfg.hosts[1]);
    assert!(!plain.identities_only);
    let why = plain.unusable.clone().unwrap();
    assert!(why.contains("Match exec"), "{why}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn toml_file_and_duplicate_names() {
    let dir = std::env::temp_dir().join(format!("outpost-toml-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.toml");
    std::fs::write(
        &path,
        "local = false\nstrict_host_keys = true\n[[sandbox]]\nname = \"a\"\nhost = \"h\"\nuser = \"x\"\nremote_dir = \"/scratch/x\"\nallow_hosts = [\"pypi.org\"]\n",
    )
    .unwrap();
    let p = path.to_string_lossy().to_string();
    let cfg = Config::load_from(&[("HOME", "/h"), ("OUTPOST_CONFIG", p.as_str())]).unwrap();
    assert_eq!(cfg.hosts.len(), 1);
    let t = ssh(&cfg.hosts[0]);
    assert!(t.strict_host_keys);
    assert_eq!(t.remote_dir, "/scratch/x");
    assert_eq!(cfg.hosts[0].allow_hosts, ["pypi.org"]);
    assert_eq!(
        parse_uid_range("2000000000-2000000999").unwrap(),
        (2_000_000_000, 2_000_000_999)
    );
    for bad in ["0-10", "5000-4000", "x-1", "1000"] {
        assert!(
            parse_uid_range(bad)
                .unwrap_err()
                .to_string()
                .contains("FIRST-LAST"),
            "{bad}"
        );
    }
    let env = [
        ("HOME", "/h"),
        ("OUTPOST_CONFIG", p.as_str()),
        ("REMOTE_SANDBOX_LIST", r#"[{"name":"a","host":"z"}]"#),
    ];
    // The file wins over the environment; within one source a name is
    // one sandbox.
    let cfg = Config::load_from(&env).unwrap();
    assert_eq!(cfg.hosts.len(), 1);
    assert_eq!(ssh(&cfg.hosts[0]).remote_dir, "/scratch/x");
    let env = [
        ("HOME", "/h"),
        (
            "REMOTE_SANDBOX_LIST",
            r#"[{"name":"a","host":"z"},{"name":"a","host":"y"}]"#,
        ),
    ];
    let err = Config::load_from(&env).unwrap_err().to_string();
    assert!(err.contains("two sandboxes"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn command_sandboxes_and_their_mistakes() {
    let dir = std::env::temp_dir().join(format!("outpost-cmdcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.toml");
    let p = path.to_string_lossy().to_string();
    let load = |text: &str| {
        std::fs::write(&path, text).unwrap();
        Config::load_from(&[("HOME", "/h"), ("OUTPOST_CONFIG", p.as_str())])
            .map_err(|e| format!("{e:#}"))
    };
    let cfg = load(
        "[[sandbox]]\nname = \"pod\"\ncommand = [\"kubectl\", \"exec\", \"-i\", \"p\", \"--\", \"sh\", \"-c\", \"{command}\"]\n\
         [[sandbox]]\nname = \"job\"\ncommand = [\"srun\", \"--jobid=7\", \"sh\", \"-c\", \"{command}\"]\nremote_dir = \"/scratch/o\"\n",
    )
    .unwrap();
    let Target::Command(pod) = &cfg.hosts[0].target else {
        panic!("{:?}", cfg.hosts[0]);
    };
    assert_eq!(pod.program(), "kubectl");
    assert_eq!(pod.argv.len(), 8);
    assert_eq!(pod.remote_dir, DEFAULT_REMOTE_DIR);
    assert_eq!(
        cfg.hosts[0].address(),
        ("kubectl".to_string(), 0, String::new())
    );
    let Target::Command(job) = &cfg.hosts[1].target else {
        panic!("{:?}", cfg.hosts[1]);
    };
    assert_eq!(job.remote_dir, "/scratch/o");

    let entry = |rest: &str| load(&format!("[[sandbox]]\nname = \"x\"\n{rest}\n"));
    for (rest, says) in [
        (
            "command = [\"docker\", \"exec\", \"-i\", \"c\", \"sh\"]",
            "no \"{command}\" element",
        ),
        (
            "command = [\"sh\", \"{command}\", \"{command}\"]",
            "2 times",
        ),
        (
            "command = [\"sh\", \"-c\", \"cd /w && {command}\"]",
            "an element of its own",
        ),
        ("command = []", "\"command\" is empty"),
        ("command = [\"\", \"{command}\"]", "empty program"),
        ("command = [\"{command}\"]", "must start with a program"),
        (
            "command = [\"sh\", \"-c\", \"{command}\"]\nhost = \"h\"\nport = 22",
            "SSH settings (host, port)",
        ),
        ("user = \"u\"", "neither \"host\""),
    ] {
        let err = entry(rest).unwrap_err();
        assert!(err.contains(says), "{rest}: {err}");
        assert!(err.contains("\"x\""), "names the sandbox: {err}");
    }
    let err = load("[[sandbox]]\ncommand = [\"sh\", \"-c\", \"{command}\"]\n").unwrap_err();
    assert!(err.contains("needs a \"name\""), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn hooks_come_from_the_file_only() {
    let dir = std::env::temp_dir().join(format!("outpost-hooks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.toml");
    let p = path.to_string_lossy().to_string();
    let load = |text: &str| {
        std::fs::write(&path, text).unwrap();
        Config::load_from(&[("HOME", "/h"), ("OUTPOST_CONFIG", p.as_str())])
    };
    let cfg = load("").unwrap();
    assert_eq!(cfg.hooks, Hooks::default());
    assert_eq!(cfg.hooks.alert_after_failures, 2);
    let cfg = load(
        "[hooks]\nwebhook_url = \"http://relay:8080/e\"\nevent_command = \"notify-send x\"\nalert_after_failures = 3\n",
    )
    .unwrap();
    let url = cfg.hooks.webhook_url.unwrap();
    assert_eq!((url.host.as_str(), url.port), ("relay", 8080));
    assert_eq!(cfg.hooks.event_command.as_deref(), Some("notify-send x"));
    assert_eq!(cfg.hooks.alert_after_failures, 3);
    let err = format!(
        "{:#}",
        load("[hooks]\nwebhook_url = \"https://x/\"\n").unwrap_err()
    );
    assert!(
        err.contains("webhook_url") && err.contains("https"),
        "{err}"
    );
    let err = format!(
        "{:#}",
        load("[hooks]\nalert_after_failures = 0\n").unwrap_err()
    );
    assert!(err.contains("alert_after_failures"), "{err}");
    let err = format!("{:#}", load("[hooks]\nurl = \"http://x/\"\n").unwrap_err());
    assert!(err.contains("url"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn outpost_home_and_advanced_tools_flag() {
    let env = [
        ("HOME", "/h"),
        ("OUTPOST_HOME", "/state"),
        ("REMOTE_SANDBOX_EXPOSE_ADVANCED_TOOLS", "1"),
    ];
    let cfg = Config::load_from(&env).unwrap();
    assert!(cfg.expose_advanced_tools);
    assert_eq!(
        cfg.events_path("gpu/1", "seq"),
        Path::new("/state/events-gpu_1.seq")
    );
    let cfg = Config::load_from(&[("HOME", "/h")]).unwrap();
    assert!(!cfg.expose_advanced_tools);
    assert_eq!(cfg.home, Path::new("/h/.outpost"));
}

#[test]
fn sandbox_names_are_hosts_or_host_slash_id() {
    let configured = |n: &str| ["local", "gpu1", "lab/a"].contains(&n);
    let split = |n| split_sandbox_name(n, configured);
    assert_eq!(split("gpu1"), Some(("gpu1", None)));
    assert_eq!(split("gpu1/sbx-3f2a"), Some(("gpu1", Some("sbx-3f2a"))));
    // A configured name with a slash is that sandbox, not an id.
    assert_eq!(split("lab/a"), Some(("lab/a", None)));
    assert_eq!(split("lab/a/x"), Some(("lab/a", Some("x"))));
    assert_eq!(split("gpu1/"), Some(("gpu1", Some(""))));
    assert_eq!(split("nope/sbx-1"), None);
    assert_eq!(split("nope"), None);
    for good in ["a", "0", "sbx-3f2a", "a-", &"x".repeat(32)] {
        assert_eq!(check_sandbox_id(good), Ok(()), "{good}");
    }
    for bad in ["", "-a", "A", "sbx_1", "a/b", "a.b", "é", &"x".repeat(33)] {
        let err = check_sandbox_id(bad).unwrap_err();
        assert!(err.contains("bad sandbox id"), "{bad}: {err}");
    }
}

#[test]
fn max_sandboxes_per_host_from_the_file() {
    let dir = std::env::temp_dir().join(format!("outpost-maxsbx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.toml");
    let p = path.to_string_lossy().to_string();
    let load = |text: &str| {
        std::fs::write(&path, text).unwrap();
        Config::load_from(&[("HOME", "/h"), ("OUTPOST_CONFIG", p.as_str())])
    };
    assert_eq!(
        load("").unwrap().max_sandboxes_per_host,
        DEFAULT_MAX_SANDBOXES_PER_HOST
    );
    assert_eq!(
        load("max_sandboxes_per_host = 0\n")
            .unwrap()
            .max_sandboxes_per_host,
        0
    );
    assert!(load("max_sandboxes_per_host = -1\n").is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}
