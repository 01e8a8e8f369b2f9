//! `outpost auth`: the OAuth grants the HTTP server's authorization server
//! gave, shown and revoked (see [`outpost::ops::grants`]).

use std::process::ExitCode;

use anyhow::{Result, bail};
use outpost::fleet::Fleet;
use outpost::ops::grants::Grants;

use super::AuthAction;

pub(super) fn auth(fleet: &Fleet, action: AuthAction) -> Result<ExitCode> {
    let grants = Grants::new(&fleet.config.home);
    match action {
        AuthAction::List { json } => {
            let records = grants.read()?;
            if json {
                let shown: Vec<_> = records
                    .grants
                    .iter()
                    .map(|g| {
                        serde_json::json!({
                            "id": g.id, "client_id": g.client_id, "subject": g.subject,
                            "scope": g.scope, "resource": g.resource, "created": g.created,
                            "refreshed": g.refreshed, "refresh_expires": g.refresh_expires,
                        })
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({"clients": records.clients, "grants": shown})
                );
                return Ok(ExitCode::SUCCESS);
            }
            if records.grants.is_empty() {
                eprintln!(
                    "no OAuth grants in {} ({} registered client(s))",
                    grants.path().display(),
                    records.clients.len()
                );
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "GRANT       CLIENT                          SCOPE  MADE              REFRESHED"
            );
            for g in &records.grants {
                let name = records
                    .clients
                    .iter()
                    .find(|c| c.id == g.client_id)
                    .map_or("?", |c| c.name.as_str());
                println!(
                    "{:<11} {:<31} {:<6} {:<17} {}",
                    g.id,
                    format!("{name} ({})", g.client_id),
                    g.scope,
                    when(g.created),
                    when(g.refreshed)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        AuthAction::Revoke { id } => {
            let ended = grants.revoke(&id).map_err(anyhow::Error::msg)?;
            if ended == 0 {
                bail!("no grant or client with id {id}; `outpost auth list` shows them");
            }
            eprintln!("revoked {ended} grant(s); their tokens stop working on the next request");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Unix seconds as `YYYY-MM-DD HH:MM` UTC.
fn when(unix: u64) -> String {
    let text = outpost::ops::jobs::utc_time(unix);
    text.get(..16).unwrap_or(&text).replace('T', " ")
}
