//! Code contexts end to end: `serve` on pipes, the daemon that holds the
//! contexts, the embedded workers under the host's real `python3` and
//! `bash`, and real faults (a segfault, an interrupt ignored, `serve`
//! killed between two runs). Each test gets its own home, so its own daemon.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Agent, BIN, TempDir, kill, procs_with_env, skip, test_account};
use outpost_protocol::{
    CodeAction, CodeContextInfo, CodeExecution, CodeLanguage, CodeRun, ErrorKind, Isolation,
    Request, Response, SandboxSpec,
};

struct Host {
    home: TempDir,
    agent: Agent,
    next_id: u64,
}

impl Host {
    fn new(label: &str) -> Host {
        let home = TempDir::new(label);
        let agent = start(&home, None);
        Host {
            home,
            agent,
            next_id: 0,
        }
    }

    /// An agent run as the unprivileged test account when this runs as
    /// root, as bwrap needs, with a secret in its home the sandbox must not
    /// see. None (the test is skipped) without the account.
    fn unprivileged(label: &str) -> Option<Host> {
        let home = TempDir::new(label);
        std::fs::create_dir_all(home.path().join(".ssh")).unwrap();
        std::fs::write(home.path().join(".ssh/id_ed25519"), "SECRET KEY\n").unwrap();
        // SAFETY: getuid cannot fail.
        let user = if unsafe { libc::getuid() } == 0 {
            let Some((uid, gid)) = test_account() else {
                skip("needs the outpost-test account (scripts/setup-test-env)");
                return None;
            };
            for path in [
                home.path().to_path_buf(),
                home.path().join(".ssh"),
                home.path().join(".ssh/id_ed25519"),
            ] {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
            }
            Some((uid, gid))
        } else {
            None
        };
        let agent = start(&home, user);
        Some(Host {
            home,
            agent,
            next_id: 0,
        })
    }

    fn call(&mut self, body: Request) -> Response {
        self.next_id += 1;
        let id = self.next_id;
        self.agent.request(id, body);
        self.agent.last(id, Duration::from_secs(90))
    }

    fn run_in(
        &mut self,
        context: &str,
        language: CodeLanguage,
        code: &str,
        timeout_ms: u64,
    ) -> CodeExecution {
        let run = CodeRun {
            context: context.into(),
            language,
            code: code.into(),
            timeout_ms,
            output_limit: 64 * 1024,
            ..CodeRun::default()
        };
        match self.call(Request::CodeRun(run)) {
            Response::CodeRan(e) => e,
            other => panic!("expected CodeRan, got {other:?}"),
        }
    }

    fn py(&mut self, code: &str) -> CodeExecution {
        self.run_in("default", CodeLanguage::Python, code, 30_000)
    }

    fn contexts(&mut self) -> Vec<CodeContextInfo> {
        match self.call(Request::CodeContexts) {
            Response::CodeContexts(rows) => rows,
            other => panic!("expected CodeContexts, got {other:?}"),
        }
    }

    fn home_procs(&self) -> Vec<i32> {
        procs_with_env(&format!("HOME={}", self.home.path().display()))
    }
}

/// `outpost-agent serve` with `home` as HOME, as `user` (uid, gid) if given.
fn start(home: &TempDir, user: Option<(u32, u32)>) -> Agent {
    let mut cmd = Command::new(BIN);
    cmd.env("HOME", home.path()).env_remove("XDG_RUNTIME_DIR");
    if let Some((uid, gid)) = user {
        std::os::unix::process::CommandExt::uid(&mut cmd, uid);
        std::os::unix::process::CommandExt::gid(&mut cmd, gid);
    }
    Agent::start_with(&mut cmd)
}

impl Drop for Host {
    fn drop(&mut self) {
        for _ in 0..3 {
            for pid in self.home_procs() {
                kill(pid, libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn plain(e: &CodeExecution) -> Option<&str> {
    e.results
        .iter()
        .find(|r| r.is_main_result)
        .and_then(|r| r.data.iter().find(|(m, _)| m == "text/plain"))
        .map(|(_, v)| v.as_str())
}

fn text(out: &outpost_protocol::CapturedOutput) -> String {
    out.to_text()
}

#[test]
fn a_python_context_keeps_state_and_returns_values() {
    let mut host = Host::new("code-state");
    let first = host.py("x = 2\nprint('hi')");
    assert_eq!(first.execution_count, 1);
    assert!(first.error.is_none(), "{first:?}");
    assert!(first.results.is_empty());
    assert_eq!(text(&first.stdout), "hi\n");
    let second = host.py("x * 21");
    assert_eq!(plain(&second), Some("42"), "{second:?}");
    assert_eq!(second.execution_count, 2);
    // A trailing `;` hides the value; display() shows one; top-level await works.
    assert!(host.py("x;").results.is_empty());
    let shown = host.py("display({'a': 1})\nimport asyncio\nawait asyncio.sleep(0.01)\n'done'");
    assert_eq!(shown.results.len(), 2, "{shown:?}");
    assert!(!shown.results[0].is_main_result);
    assert_eq!(plain(&shown), Some("'done'"));
    // Rich values come as their MIME bundle.
    let html = host.py("class T:\n    def _repr_html_(self): return '<b>t</b>'\nT()");
    let main = html.results.iter().find(|r| r.is_main_result).unwrap();
    assert!(
        main.data.contains(&("text/html".into(), "<b>t</b>".into())),
        "{main:?}"
    );
    // Per-run env is set for the run only.
    let mut run = CodeRun {
        context: "default".into(),
        code: "import os; os.environ.get('OUTPOST_T_VAR')".into(),
        env: vec![("OUTPOST_T_VAR".into(), "v1".into())],
        ..CodeRun::default()
    };
    let Response::CodeRan(with) = host.call(Request::CodeRun(run.clone())) else {
        panic!()
    };
    assert_eq!(plain(&with), Some("'v1'"));
    run.env.clear();
    let Response::CodeRan(without) = host.call(Request::CodeRun(run)) else {
        panic!()
    };
    assert!(plain(&without).is_none(), "{without:?}");
    let rows = host.contexts();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].state, "idle");
    assert!(rows[0].rss_bytes > 1 << 20, "{rows:?}");
}

#[test]
fn errors_interrupts_and_crashes_are_reported_and_survived() {
    let mut host = Host::new("code-errors");
    host.py("x = 5");
    let zero = host.py("def f():\n    return 1/0\nf()");
    let err = zero.error.as_ref().expect("an error");
    assert_eq!(err.name, "ZeroDivisionError");
    assert!(
        err.traceback.contains("<cell 2>") && err.traceback.contains("return 1/0"),
        "{}",
        err.traceback
    );
    assert!(
        !err.traceback.contains("outpost-worker"),
        "{}",
        err.traceback
    );
    let syntax = host.py("def (:");
    assert_eq!(syntax.error.unwrap().name, "SyntaxError");

    // A busy loop is interrupted at its timeout; the context keeps x.
    let spin = host.run_in("default", CodeLanguage::Python, "while True: pass", 1500);
    assert!(spin.timed_out, "{spin:?}");
    assert_eq!(spin.error.as_ref().unwrap().name, "KeyboardInterrupt");
    assert!(spin.restarted.is_none());
    assert_eq!(plain(&host.py("x")), Some("5"));

    // Code that ignores the interrupt: restarted after the grace.
    let stubborn = host.run_in(
        "default",
        CodeLanguage::Python,
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)",
        1000,
    );
    assert!(
        stubborn.timed_out && stubborn.restarted.is_some(),
        "{stubborn:?}"
    );
    let fresh = host.py("'x' in dir()");
    assert_eq!(plain(&fresh), Some("False"));
    assert_eq!(fresh.execution_count, 1);

    // A segfault in a C call: the context restarts and says so.
    host.py("y = 1");
    let crash = host.py("import ctypes\nctypes.string_at(0)");
    assert!(
        crash
            .restarted
            .as_deref()
            .unwrap_or("")
            .contains("signal 11"),
        "{crash:?}"
    );
    assert_eq!(crash.error.as_ref().unwrap().name, "InterpreterDied");
    assert_eq!(plain(&host.py("1 + 1")), Some("2"));
    assert_eq!(host.py("y").error.unwrap().name, "NameError");
}

#[test]
fn output_on_the_programs_own_fds_never_corrupts_the_worker() {
    let mut host = Host::new("code-streams");
    let big = host.py("print('x' * (10 * 1024 * 1024))");
    assert!(big.error.is_none());
    assert_eq!(big.stdout.total_len(), 10 * 1024 * 1024 + 1);
    assert!(big.stdout.omitted > 0);
    let raw = host.py(
        "import os, sys\nos.write(1, b'raw-out\\n')\nos.write(2, b'raw-err\\n')\nos.system('echo from-child')\nprint('{\"results\": []}', file=sys.stderr)",
    );
    assert!(
        text(&raw.stdout).contains("raw-out\n") && text(&raw.stdout).contains("from-child\n"),
        "{raw:?}"
    );
    assert!(
        text(&raw.stderr).contains("raw-err\n") && text(&raw.stderr).contains("{\"results\": []}")
    );
    let input = host.py("input('name? ')");
    assert_eq!(input.error.unwrap().name, "EOFError");
    // A fork that returns into the worker does not answer for it.
    let forked = host.py("import os\nchild = os.fork()\nchild > 0 or None");
    assert!(forked.error.is_none(), "{forked:?}");
    assert_eq!(plain(&host.py("'in step'")), Some("'in step'"));
    // Many displayed values: the first ones, and a count of the rest.
    let many = host.py("for i in range(1000): display(i)");
    assert_eq!(many.results.len(), 101, "{:?}", many.results.last());
    let Response::Error(nul) = host.call(Request::CodeRun(CodeRun {
        context: "default".into(),
        code: "1".into(),
        env: vec![("A".into(), "x\0y".into())],
        ..CodeRun::default()
    })) else {
        panic!()
    };
    assert!(nul.message.contains("NUL"), "{}", nul.message);
    // Nothing bled into the next run; the worker still answers in step.
    let next = host.py("6 * 7");
    assert_eq!(plain(&next), Some("42"));
    assert!(
        next.stdout.head.is_empty() && next.stderr.head.is_empty(),
        "{next:?}"
    );
}

#[test]
fn a_matplotlib_figure_comes_back_as_a_png() {
    let mut host = Host::new("code-plot");
    let plot = host.py(
        "import matplotlib.pyplot as plt\nfig = plt.figure(figsize=(4, 3), dpi=100)\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')",
    );
    assert!(
        plot.error.is_none(),
        "matplotlib is needed (scripts/setup-test-env installs it): {plot:?}"
    );
    let png = plot
        .results
        .iter()
        .find_map(|r| r.data.iter().find(|(m, _)| m == "image/png"))
        .map(|(_, v)| v)
        .expect("a PNG result");
    let bytes = base64_decode(png);
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    // bbox_inches="tight" trims the margins of a 400x300 figure.
    assert!(
        (250..=420).contains(&width) && (200..=320).contains(&height),
        "{width}x{height}"
    );
    // Figures are closed after each run.
    assert!(
        host.py("len(plt.get_fignums())")
            .results
            .iter()
            .any(|r| r.data.contains(&("text/plain".into(), "0".into())))
    );
}

fn base64_decode(text: &str) -> Vec<u8> {
    let out = Command::new("base64")
        .arg("-d")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(text.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success());
    out.stdout
}

#[test]
fn a_bash_context_keeps_its_directory_and_variables() {
    let mut host = Host::new("code-bash");
    let bash = |host: &mut Host, code: &str, timeout: u64| {
        host.run_in("sh", CodeLanguage::Bash, code, timeout)
    };
    let first = bash(&mut host, "cd /tmp && X=5 && echo set", 10_000);
    assert_eq!(text(&first.stdout), "set\n");
    assert!(first.error.is_none());
    let second = bash(&mut host, "pwd; echo $X", 10_000);
    assert_eq!(text(&second.stdout), "/tmp\n5\n");
    assert_eq!(second.execution_count, 2);
    let failed = bash(&mut host, "echo oops >&2; false", 10_000);
    assert_eq!(failed.error.unwrap().name, "ExitStatus");
    assert_eq!(text(&failed.stderr), "oops\n");
    let slow = bash(&mut host, "sleep 100", 1000);
    assert!(slow.timed_out && slow.restarted.is_none(), "{slow:?}");
    assert_eq!(text(&bash(&mut host, "echo $X", 10_000).stdout), "5\n");
    // One context, one language.
    let Response::Error(e) = host.call(Request::CodeRun(CodeRun {
        context: "sh".into(),
        code: "1".into(),
        ..CodeRun::default()
    })) else {
        panic!()
    };
    assert!(e.message.contains("runs bash"), "{}", e.message);
    // A run's env lasts for that run: a new variable goes, an old one is
    // put back.
    let with_env = CodeRun {
        context: "sh".into(),
        language: CodeLanguage::Bash,
        code: "echo $X $SECRET_T".into(),
        env: vec![("X".into(), "7".into()), ("SECRET_T".into(), "s3".into())],
        timeout_ms: 10_000,
        output_limit: 4096,
        ..CodeRun::default()
    };
    let Response::CodeRan(r) = host.call(Request::CodeRun(with_env)) else {
        panic!()
    };
    assert_eq!(text(&r.stdout), "7 s3\n");
    let after = bash(&mut host, "echo $X ${SECRET_T-unset}", 10_000);
    assert_eq!(text(&after.stdout), "5 unset\n");
    let gone = bash(&mut host, "echo bye; exit 3", 10_000);
    assert!(
        gone.restarted
            .as_deref()
            .unwrap_or("")
            .contains("exited (status 3)"),
        "{gone:?}"
    );
    assert_eq!(text(&gone.stdout), "bye\n");
    // `set -e` ends the shell at the next failure: answered, and said.
    bash(&mut host, "set -e", 10_000);
    let failed = bash(&mut host, "echo before; false; echo after", 10_000);
    assert_eq!(text(&failed.stdout), "before\n");
    assert!(failed.restarted.is_some(), "{failed:?}");
    // A function named like the worker's commands takes nothing over.
    bash(&mut host, "printf() { :; }; read() { :; }", 10_000);
    assert_eq!(
        text(&bash(&mut host, "echo still", 10_000).stdout),
        "still\n"
    );
}

#[test]
fn a_context_outlives_its_connection_and_a_long_run_is_collected_later() {
    let mut host = Host::new("code-survive");
    host.py("kept = 'still here'");
    // The connection's agent dies outright; the daemon holds the context.
    let pid = host.agent.child.id() as i32;
    kill(pid, libc::SIGKILL);
    let _ = host.agent.child.wait();
    host.agent = start(&host.home, None);
    assert_eq!(plain(&host.py("kept")), Some("'still here'"));

    // A run that outlasts its call's wait is collected by an empty run.
    let run = CodeRun {
        context: "default".into(),
        code: "import time\ntime.sleep(1.5)\n'slept'".into(),
        wait_ms: 200,
        ..CodeRun::default()
    };
    let Response::CodeRan(first) = host.call(Request::CodeRun(run.clone())) else {
        panic!()
    };
    assert!(first.running, "{first:?}");
    let Response::Error(busy) = host.call(Request::CodeRun(run)) else {
        panic!()
    };
    assert!(busy.message.contains("still running"), "{}", busy.message);
    let collect = CodeRun {
        context: "default".into(),
        ..CodeRun::default()
    };
    let Response::CodeRan(done) = host.call(Request::CodeRun(collect.clone())) else {
        panic!()
    };
    assert_eq!(plain(&done), Some("'slept'"));
    // Collecting again gives the same result (its first answer may never
    // have reached its caller).
    let Response::CodeRan(again) = host.call(Request::CodeRun(collect)) else {
        panic!()
    };
    assert_eq!(again, done);
    // A context with no run has nothing to collect.
    let Response::Error(nothing) = host.call(Request::CodeRun(CodeRun {
        context: "fresh".into(),
        ..CodeRun::default()
    })) else {
        panic!()
    };
    assert_eq!(nothing.kind, ErrorKind::BadRequest);
}

#[test]
fn contexts_are_listed_interrupted_and_removed() {
    let mut host = Host::new("code-control");
    host.py("a = 1");
    host.run_in("other", CodeLanguage::Python, "b = 2", 10_000);
    let rows = host.contexts();
    assert_eq!(
        rows.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        ["default", "other"]
    );
    let worker = rows[1].pid.unwrap();
    let Response::CodeContexts(left) = host.call(Request::CodeControl {
        context: "other".into(),
        action: CodeAction::Remove,
    }) else {
        panic!()
    };
    assert_eq!(left.len(), 1);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !std::path::Path::new(&format!("/proc/{worker}")).exists(),
        "worker {worker} left running"
    );
    let Response::CodeContexts(after) = host.call(Request::CodeControl {
        context: "default".into(),
        action: CodeAction::Restart,
    }) else {
        panic!()
    };
    assert_eq!(after[0].state, "stopped");
    assert_eq!(host.py("'a' in dir()").results[0].data[0].1, "False");
    for bad in ["../x", ""] {
        let Response::Error(e) = host.call(Request::CodeRun(CodeRun {
            context: bad.into(),
            code: "1".into(),
            ..CodeRun::default()
        })) else {
            panic!()
        };
        assert_eq!(e.kind, ErrorKind::BadRequest);
    }
}

#[test]
fn a_sandbox_context_runs_inside_it_and_ends_with_it() {
    let Some(mut host) = Host::unprivileged("code-sandbox") else {
        return;
    };
    let spec = SandboxSpec {
        id: None,
        ttl_ms: 120_000,
        isolation: Isolation::Bwrap,
        network: false,
        ..SandboxSpec::default()
    };
    let Response::Sandbox(info) = host.call(Request::SandboxCreate(spec)) else {
        panic!()
    };
    let inside = |host: &mut Host, code: &str| {
        let run = CodeRun {
            context: "default".into(),
            code: code.into(),
            timeout_ms: 30_000,
            output_limit: 4096,
            ..CodeRun::default()
        };
        match host.call(Request::InSandbox {
            id: info.id.clone(),
            request: Box::new(Request::CodeRun(run)),
        }) {
            Response::CodeRan(e) => e,
            other => panic!("{other:?}"),
        }
    };
    let secret = format!("{}/.ssh/id_ed25519", host.home.path().display());
    let read = inside(&mut host, &format!("open({secret:?}).read()"));
    assert!(
        read.error.is_some(),
        "the host's secret was readable: {read:?}"
    );
    let pid = inside(&mut host, "import os; os.getpid()");
    assert!(pid.error.is_none(), "{pid:?}");
    // Its own pid namespace: the worker is a low pid there.
    let n: i32 = plain(&pid).unwrap().parse().unwrap();
    assert!(n < 100, "pid {n} is not the sandbox's");
    let Response::Sandbox(_) = host.call(Request::SandboxDelete {
        id: info.id.clone(),
    }) else {
        panic!()
    };
    std::thread::sleep(Duration::from_millis(1500));
    assert!(procs_with_env(&format!("OUTPOST_SANDBOX={}", info.id)).is_empty());
    let Response::CodeContexts(rows) = host.call(Request::CodeContexts) else {
        panic!()
    };
    assert!(rows.is_empty());
}
