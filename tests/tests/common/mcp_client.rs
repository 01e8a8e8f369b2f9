//! A real MCP client (rmcp's) driving `outpost mcp` over stdio.

use outpost_e2e::{Sshd, TempDir, target_bin};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use serde_json::{Value, json};

pub type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

/// `outpost mcp` with only `env` and an empty home; the home lives as long as
/// the returned guard.
pub async fn start(env: &[(&str, String)]) -> (Client, TempDir) {
    let home = super::scratch("mcp-home");
    let transport = TokioChildProcess::new(
        tokio::process::Command::new(target_bin("outpost")).configure(|cmd| {
            // The start directory is the server's local root when the
            // client declares none; the tests' scratch trees live here.
            cmd.arg("mcp")
                .current_dir(std::env::temp_dir())
                .env_clear()
                .env("HOME", home.path())
                .env("PATH", std::env::var("PATH").unwrap());
            for (k, v) in env {
                cmd.env(k, v);
            }
        }),
    )
    .unwrap();
    (().serve(transport).await.unwrap(), home)
}

/// remote-sandbox-mcp's single-host variables for `sshd`.
pub fn ssh_env(sshd: &Sshd) -> Vec<(&'static str, String)> {
    vec![
        ("REMOTE_HOST", sshd.host().to_string()),
        ("REMOTE_PORT", sshd.port().to_string()),
        ("REMOTE_USER", sshd.user().to_string()),
        ("REMOTE_KEY_FILE", sshd.client_key().display().to_string()),
    ]
}

/// A config file naming `sshd` as sandbox "box", with the agent's state in the
/// sshd's private remote dir (so jobs and daemons of one test never meet
/// another's); returns the environment that selects it, and the file's guard.
pub fn isolated_env(sshd: &Sshd) -> (Vec<(&'static str, String)>, TempDir) {
    let dir = super::scratch("mcp-config");
    let path = dir.path().join("config.toml");
    std::fs::write(&path, sshd.sandbox_toml("box")).unwrap();
    (vec![("OUTPOST_CONFIG", path.display().to_string())], dir)
}

/// Calls a tool; returns whether it was an error and its structured result
/// (or its text, for errors).
pub async fn call(client: &Client, tool: &'static str, args: Value) -> (bool, Value) {
    let result = client
        .call_tool(
            CallToolRequestParams::new(tool).with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    let is_error = result.is_error.unwrap_or(false);
    let value = result.structured_content.clone().unwrap_or_else(|| {
        json!(
            result
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                .collect::<Vec<_>>()
                .join("\n")
        )
    });
    (is_error, value)
}
