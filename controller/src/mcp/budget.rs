//! How long each MCP client waits for a tool call before it gives up on it,
//! so that `exec_bash` can answer in time and leave a longer command running
//! as a background job ([`crate::ops::exec::run_within`]).
//!
//! Clients say who they are in `clientInfo.name` and nothing about their
//! patience, so this is a table of what they are known to do, which the
//! config file's `[client_budget_s]` overrides and extends.

use std::time::Duration;

tokio::task_local! {
    /// The `clientInfo.name` of the request being served: in the 2026-07-28
    /// era each request says it in its metadata, and no session holds it.
    pub(super) static CLIENT_NAME: Option<String>;
}

/// Part of a lowercased `clientInfo.name` and the seconds its calls get
/// (0: as long as they take). The first match wins. The figures stay a few
/// seconds under each client's own limit so the answer arrives in time.
const KNOWN: &[(&str, f64)] = &[
    // Keeps a call alive while progress arrives and moves long ones to the
    // background itself.
    ("claude-code", 0.0),
    // Cuts every call at 60 s, progress or not.
    ("codex", 50.0),
    // Claude Desktop: about 60 s.
    ("claude-ai", 45.0),
    // About 5 min, progress or not.
    ("visual studio code", 240.0),
];

/// Clients not in the table.
const UNKNOWN_S: f64 = 45.0;

/// The budget of a call from `client`: the config's entry for it (the
/// longest matching name), else the built-in table, else the config's
/// `default`, else [`UNKNOWN_S`]. None: no limit.
pub(super) fn of_client(configured: &[(String, f64)], client: Option<&str>) -> Option<Duration> {
    let name = client.unwrap_or_default().to_lowercase();
    let matches = |key: &str| !key.is_empty() && name.contains(key);
    let seconds = configured
        .iter()
        .find(|(key, _)| key != "default" && matches(key))
        .map(|(_, s)| *s)
        .or_else(|| KNOWN.iter().find(|(key, _)| matches(key)).map(|(_, s)| *s))
        .or_else(|| {
            configured
                .iter()
                .find(|(key, _)| key == "default")
                .map(|(_, s)| *s)
        })
        .unwrap_or(UNKNOWN_S);
    (seconds > 0.0).then(|| Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_clients_then_the_config() {
        let secs = |configured: &[(String, f64)], client| {
            of_client(configured, client).map(|d| d.as_secs_f64())
        };
        assert_eq!(secs(&[], Some("codex-mcp-client")), Some(50.0));
        assert_eq!(secs(&[], Some("claude-code")), None);
        assert_eq!(secs(&[], Some("claude-ai")), Some(45.0));
        assert_eq!(secs(&[], Some("Visual Studio Code")), Some(240.0));
        assert_eq!(secs(&[], Some("cursor-vscode")), Some(UNKNOWN_S));
        assert_eq!(secs(&[], None), Some(UNKNOWN_S));
        let configured = vec![
            ("codex-mcp".to_string(), 20.0),
            ("codex".to_string(), 0.0),
            ("default".to_string(), 10.0),
        ];
        assert_eq!(secs(&configured, Some("codex-mcp-client")), Some(20.0));
        assert_eq!(secs(&configured, Some("codex-cli")), None);
        assert_eq!(secs(&configured, Some("claude-code")), None);
        assert_eq!(secs(&configured, Some("my-agent")), Some(10.0));
    }
}
