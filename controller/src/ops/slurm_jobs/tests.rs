use std::process::Command;

use super::*;

fn request(command: &str) -> SubmitRequest {
    SubmitRequest {
        command: command.into(),
        ..SubmitRequest::default()
    }
}

#[test]
fn task_names_are_slurm_job_ids() {
    assert_eq!(job_id("slurm-42"), Some(42));
    assert_eq!(job_id(" slurm-7 "), Some(7));
    for bad in [
        "slurm-",
        "slurm-0",
        "slurm-4x",
        "slurm--1",
        "job-3",
        "slurm-1;id",
        "42",
    ] {
        assert_eq!(job_id(bad), None, "{bad}");
    }
    assert_eq!(task_name(42), "slurm-42");
}

/// The batch script of `r` as Slurm would run it (bash, with
/// SLURM_JOB_ID set to `job`) in a fresh scratch dir, and that dir.
fn batch_command(r: &SubmitRequest, job: &str) -> (Command, std::path::PathBuf) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("outpost-batch-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "#!/bin/bash\nd={}\n{}",
        shell_quote(&dir.display().to_string()),
        batch_body(r).unwrap()
    );
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(&script)
        .current_dir(&dir)
        .env("SLURM_JOB_ID", job);
    (cmd, dir)
}

/// Runs the batch script to its end: its stdout and stderr, and the
/// exit file.
fn run_batch(r: &SubmitRequest) -> (String, String, Option<String>, i32) {
    let (mut cmd, dir) = batch_command(r, "77");
    let out = cmd.output().unwrap();
    let exit = std::fs::read_to_string(dir.join("77.exit")).ok();
    assert!(!dir.join("77.exit.tmp").exists());
    let _ = std::fs::remove_dir_all(&dir);
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        exit,
        out.status.code().unwrap_or(-1),
    )
}

#[test]
fn the_batch_script_runs_awkward_commands_exactly_and_records_their_status() {
    let command = "echo \"it's $((6*7))\" '$HOME' `echo tick`; echo err >&2\n#SBATCH --wrap=id\ncat <<'E'\nOUTPOST_BATCH_0\nE\nexit 7";
    let (stdout, stderr, exit, code) = run_batch(&request(command));
    assert_eq!(stdout, "it's 42 $HOME tick\nOUTPOST_BATCH_0\n");
    assert_eq!(stderr, "err\n");
    assert_eq!(exit.as_deref(), Some("7\n"));
    assert_eq!(code, 7);

    // A command killed by a signal: 128+N, as a shell reports it, and
    // nothing in the log but what the command printed.
    let (_, stderr, exit, code) = run_batch(&request("echo before >&2; kill -9 $$"));
    assert_eq!((exit.as_deref(), code), (Some("137\n"), 137));
    assert_eq!(stderr, "before\n");
}

/// The batch script as Slurm runs it, in the background: its process
/// and scratch dir.
fn spawn_batch(command: &str) -> (std::process::Child, std::path::PathBuf) {
    let (mut cmd, dir) = batch_command(&request(command), "5");
    let child = cmd.stderr(std::process::Stdio::piped()).spawn().unwrap();
    (child, dir)
}

fn wait_for(path: &std::path::Path) -> String {
    for _ in 0..500 {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{} never appeared", path.display());
}

fn alive(pid: &str) -> bool {
    std::path::Path::new(&format!("/proc/{}", pid.trim())).exists()
        && !std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
            .unwrap_or_default()
            .contains(") Z ")
}

#[test]
fn term_reaches_the_command_and_usr1_kills_what_ignores_it() {
    // TERM to the script is passed to the command, which ends by it.
    let (mut child, dir) = spawn_batch("echo $$ > pid; sleep 300");
    let pid = wait_for(&dir.join("pid"));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(143));
    assert_eq!(wait_for(&dir.join("5.exit")), "143\n");
    assert!(!alive(&pid));
    let _ = std::fs::remove_dir_all(&dir);

    // A command that ignores TERM keeps running; USR1 ends all of it.
    let (mut child, dir) = spawn_batch("trap '' TERM; sleep 300 & echo $! > pid; wait");
    let pid = wait_for(&dir.join("pid"));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    std::thread::sleep(Duration::from_millis(300));
    assert!(alive(&pid), "TERM was ignored");
    assert!(child.try_wait().unwrap().is_none());
    unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(137));
    assert!(!alive(&pid), "sleep {pid} outlived the KILL");
    // The log gets what the command printed, not the script's notes.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("Killed"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);

    // What the command leaves behind ends with it.
    let (mut child, dir) = spawn_batch("sleep 300 & echo $! > pid; exit 4");
    let pid = wait_for(&dir.join("pid"));
    assert_eq!(child.wait().unwrap().code(), Some(4));
    assert!(!alive(&pid), "a leftover sleep {pid} outlived its job");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn env_values_stay_data() {
    let mut r = request("printf '%s|%s|%s' \"$A\" \"$B\" \"$C\"");
    r.env = vec![
        ("A".into(), "it's $(id) `id`".into()),
        ("B".into(), "line1\nline2".into()),
        ("C".into(), String::new()),
    ];
    let (stdout, _, exit, code) = run_batch(&r);
    assert_eq!(stdout, "it's $(id) `id`|line1\nline2|");
    assert_eq!((exit.as_deref(), code), (Some("0\n"), 0));

    for bad in ["A B", "1X", "X;id", "BASH_ENV", "LD_PRELOAD"] {
        let mut r = request("true");
        r.env = vec![(bad.into(), "v".into())];
        assert!(batch_body(&r).unwrap_err().contains("env"), "{bad}");
    }
    assert!(batch_body(&request(" ")).unwrap_err().contains("empty"));
    assert!(batch_body(&request("a\0b")).unwrap_err().contains("NUL"));
}

#[test]
fn values_are_checked_and_quoted_into_sbatch_options() {
    let mut r = request("true");
    r.cwd = Some("~/my proj/it's".into());
    r.time = Some("1:00:00".into());
    r.partition = Some("gpu".into());
    r.gpus = Some(2);
    let args = sbatch_args(None, &r).unwrap();
    assert_eq!(
        args,
        [
            "'--parsable'",
            "--output=\"$HOME/.outpost/batch\"/%j.log",
            "'--job-name=outpost-batch'",
            "'--open-mode=append'",
            "'-N1'",
            "'-n1'",
            "'--time=1:00:00'",
            "'--partition=gpu'",
            "'--gres=gpu:2'",
            "--chdir=\"$HOME\"/'my proj/it'\\''s'",
        ]
    );
    // The cluster's defaults fill in; the call's values win.
    let defaults = SlurmDefaults {
        partition: Some("batch".into()),
        account: Some("lab".into()),
        qos: None,
        time: "30".into(),
        gpu_gres: "gpu:a100".into(),
    };
    let args = sbatch_args(Some(&defaults), &request("true"))
        .unwrap()
        .join(" ");
    assert!(
        args.contains("'--time=30' '--partition=batch' '--account=lab'"),
        "{args}"
    );
    let args = sbatch_args(Some(&defaults), &r).unwrap().join(" ");
    assert!(
        args.contains("'--partition=gpu'") && args.contains("'--gres=gpu:a100:2'"),
        "{args}"
    );
    // With no defaults, nothing is asked that the call did not give.
    let args = sbatch_args(None, &request("true")).unwrap().join(" ");
    assert!(
        !args.contains("--time") && !args.contains("--partition"),
        "{args}"
    );

    for (field, bad) in [
        ("time", "1;id"),
        ("time", "--wrap=id"),
        ("partition", "--wrap=id"),
        ("partition", "a b"),
    ] {
        let mut r = request("true");
        match field {
            "time" => r.time = Some(bad.into()),
            _ => r.partition = Some(bad.into()),
        }
        assert!(sbatch_args(None, &r).is_err(), "{field} {bad}");
    }
    let mut r = request("true");
    r.gpus = Some(5000);
    assert!(sbatch_args(None, &r).is_err());

    assert_eq!(cwd_word("/w/a b"), "'/w/a b'");
    assert_eq!(cwd_word("~"), "\"$HOME\"");
    assert_eq!(cwd_word("rel"), "\"$HOME\"/'rel'");
}

#[test]
fn the_submit_script_is_valid_shell_whatever_the_command() {
    let mut r = request("cat <<'OUTPOST_BATCH_0'\nhi\nOUTPOST_BATCH_0\necho '}' ) \"");
    r.cwd = Some("/tmp/x'y".into());
    r.env = vec![("TOKEN".into(), "s3cret-value".into())];
    let (script, body) = submit_script(None, &r).unwrap();
    // The env's values go on stdin, never in the login node's argv.
    assert!(!script.contains("s3cret"), "{script}");
    assert!(body.contains("s3cret-value"), "{body}");
    let check = Command::new("bash")
        .args(["-n", "-c", &script])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}\n{script}",
        String::from_utf8_lossy(&check.stderr)
    );
    for select in [Select::Ids(&[1, 2, 3]), Select::Newest(50)] {
        let script = status_script(select);
        let check = Command::new("bash")
            .args(["-n", "-c", &script])
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "{}\n{script}",
            String::from_utf8_lossy(&check.stderr)
        );
    }
}

fn parse(out: &str) -> Vec<BatchStatus> {
    let (_, reports) = parse_reports(out);
    reports
        .iter()
        .filter_map(|(id, r)| map_report(*id, r))
        .collect()
}

#[test]
fn squeue_and_files_map_to_states() {
    let out = "N|9\n\
        Q|11|PENDING|Resources|0:00|1:00:00\n\
        Q|12|RUNNING|None|0:05|UNLIMITED\n\
        Q|13|COMPLETED|None|0:01|1:00\n\
        Q|14|TIMEOUT|TimeLimit|1:01|1:00\n\
        Q|16|COMPLETING|None|0:01|1:00\n\
        X|11|1||||||\n\
        X|12|1||1700000000||||train.py --lr 0.1|x\n\
        X|13|1|7|||||\n\
        X|14|1|||TIMEOUT||TimeLimit|\n\
        X|15|1|0|||||\n\
        X|16|1|3|||||\n\
        X|17|1|||CANCELLED||cancelled|\n\
        X|18|1|||NODE_FAIL|0:0|NodeDown|\n\
        X|19|1|||FAILED|0:15|JobLaunchFailure|\n\
        X|20|1|||OUT_OF_MEMORY|0:125|OutOfMemory|\n\
        X|21|1||||||\n\
        X|22|0||||||\n";
    let (count, _) = parse_reports(out);
    assert_eq!(count, Some(9));
    let s = parse(out);
    let by = |id: u64| {
        s.iter()
            .find(|j| j.job == id)
            .unwrap_or_else(|| panic!("{id}: {s:?}"))
    };
    assert_eq!(by(11).state, BatchState::Pending);
    assert_eq!(by(11).detail.as_deref(), Some("Resources"));
    assert_eq!(by(12).state, BatchState::Running);
    assert_eq!(by(12).elapsed.as_deref(), Some("0:05"));
    assert_eq!(by(12).command.as_deref(), Some("train.py --lr 0.1|x"));
    assert_eq!(by(12).submitted_unix, Some(1_700_000_000));
    assert_eq!(
        (by(13).state, by(13).exit_code),
        (BatchState::Exited, Some(7))
    );
    assert_eq!(by(14).state, BatchState::Timeout);
    assert_eq!(by(14).shell_status(), Some(124));
    // Forgotten by Slurm: the exit file says it all.
    assert_eq!(
        (by(15).state, by(15).exit_code),
        (BatchState::Exited, Some(0))
    );
    assert_eq!(
        (by(16).state, by(16).exit_code),
        (BatchState::Exited, Some(3))
    );
    assert_eq!(by(17).state, BatchState::Cancelled);
    assert_eq!(
        (by(18).state, by(18).detail.as_deref()),
        (BatchState::Failed, Some("NODE_FAIL"))
    );
    assert_eq!(
        (by(19).state, by(19).exit_code, by(19).signal),
        (BatchState::Exited, None, Some(15))
    );
    assert_eq!(by(20).state, BatchState::OutOfMemory);
    assert_eq!(by(21).state, BatchState::Lost);
    // Neither Slurm's nor ours: unknown.
    assert!(s.iter().all(|j| j.job != 22));
}

#[test]
fn slurm_end_states_map_as_documented() {
    for (state, want, detail) in [
        ("CANCELLED", BatchState::Cancelled, None),
        ("CANCELLED by 1000", BatchState::Cancelled, None),
        ("TIMEOUT", BatchState::Timeout, None),
        ("OUT_OF_MEMORY", BatchState::OutOfMemory, None),
        ("NODE_FAIL", BatchState::Failed, Some("NODE_FAIL")),
        ("BOOT_FAIL", BatchState::Failed, Some("BOOT_FAIL")),
        ("PREEMPTED", BatchState::Failed, Some("PREEMPTED")),
        ("DEADLINE", BatchState::Failed, Some("DEADLINE")),
    ] {
        let (got, code, _, d) = ended(state, "", "None", None);
        assert_eq!((got, code, d.as_deref()), (want, None, detail), "{state}");
    }
    // The exit file is exact; Slurm's ExitCode is the fallback.
    assert_eq!(
        ended("FAILED", "1:0", "NonZeroExitCode", Some(3)).1,
        Some(3)
    );
    assert_eq!(ended("FAILED", "2:0", "NonZeroExitCode", None).1, Some(2));
    assert_eq!(ended("COMPLETED", "0:0", "None", None).1, Some(0));
    for s in LIVE_STATES {
        assert!(!["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"].contains(s));
    }
    let names: Vec<&str> = [
        BatchState::Pending,
        BatchState::Running,
        BatchState::Exited,
        BatchState::Cancelled,
        BatchState::Timeout,
        BatchState::OutOfMemory,
        BatchState::Failed,
        BatchState::Lost,
    ]
    .iter()
    .map(|s| s.name())
    .collect();
    assert_eq!(
        names,
        [
            "pending",
            "running",
            "exited",
            "cancelled",
            "timeout",
            "out_of_memory",
            "failed",
            "lost"
        ]
    );
}

#[test]
fn log_windows_cut_at_lines() {
    assert_eq!(last_lines(b"a\nb\nc\n", true, 2), (2, b"b\nc\n".to_vec()));
    assert_eq!(last_lines(b"a\nb\nc", true, 2), (2, b"b\nc".to_vec()));
    assert_eq!(last_lines(b"a\nb\n", true, 5), (0, b"a\nb\n".to_vec()));
    // A window that starts mid-line drops that partial line.
    assert_eq!(last_lines(b"xx\nb\n", false, 5), (3, b"b\n".to_vec()));
    assert_eq!(last_lines(b"x", false, 1), (0, b"x".to_vec()));
    assert_eq!(last_lines(b"a\n", true, 0), (2, Vec::new()));

    let mut m = LineMatcher {
        re: Regex::new("^ep(och)? 3").unwrap(),
        pos: 10,
        partial: Vec::new(),
    };
    assert_eq!(m.feed(b"epoch 1\nepo"), None);
    assert!(!m.partial_matches());
    assert_eq!(m.feed(b"ch 3\nmore\n"), Some(10 + 16));
    let mut m = LineMatcher {
        re: Regex::new("ready").unwrap(),
        pos: 0,
        partial: Vec::new(),
    };
    assert_eq!(m.feed(b"not yet\nready"), None);
    assert!(m.partial_matches());
}
