//! `outpost audit`: the MCP tool calls recorded in the audit log.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};
use outpost::fleet::Fleet;

/// `outpost audit`: the last `tail` lines of the audit log.
pub(super) fn audit(fleet: &Fleet, tail: usize, json: bool) -> Result<ExitCode> {
    let log = outpost::ops::audit::AuditLog::new(&fleet.config.home);
    let lines = log
        .tail(tail)
        .with_context(|| format!("cannot read {}", log.path().display()))?;
    if lines.is_empty() {
        eprintln!("no tool calls recorded in {}", log.path().display());
        return Ok(ExitCode::SUCCESS);
    }
    let out = if json {
        lines
    } else {
        outpost::ops::audit::format_human(&lines)
    };
    let mut stdout = std::io::stdout().lock();
    for line in out {
        if writeln!(stdout, "{line}").is_err() {
            break; // e.g. piped into head
        }
    }
    Ok(ExitCode::SUCCESS)
}
