//! `outpost watch`: follow job events and run the hooks until stopped.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use outpost::config::Target;
use outpost::fleet::Fleet;
use outpost::ops::{events, jobs};

pub(super) async fn watch(fleet: Arc<Fleet>, names: Vec<String>) -> Result<ExitCode> {
    let names = if names.is_empty() {
        let remote: Vec<String> = fleet
            .sessions()
            .iter()
            .filter(|s| !matches!(s.config.target, Target::Local))
            .map(|s| s.name().to_string())
            .collect();
        if remote.is_empty() {
            fleet.names()
        } else {
            remote
        }
    } else {
        for n in &names {
            fleet.get(Some(n)).map_err(anyhow::Error::msg)?;
        }
        names
    };
    let sink: events::Sink = Arc::new(|e: &events::HookEvent| {
        eprintln!("{} {}", jobs::utc_time(e.at_unix), e.summary());
    });
    let watcher = events::Watcher::new(fleet.clone(), sink);
    for n in &names {
        watcher.follow(n);
    }
    let hooks = &fleet.config.hooks;
    let mut configured = Vec::new();
    if let Some(url) = &hooks.webhook_url {
        configured.push(format!("webhook {url}"));
    }
    if hooks.event_command.is_some() {
        configured.push("event_command".to_string());
    }
    eprintln!(
        "outpost watch: following job events of {}; hooks: {}",
        names.join(", "),
        if configured.is_empty() {
            "none ([hooks] in the config file)".to_string()
        } else {
            configured.join(", ")
        }
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    for session in fleet.sessions() {
        session.disconnect().await;
    }
    Ok(ExitCode::SUCCESS)
}
