//! `outpost exec`, under the config file's command policy.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use outpost::fleet::Fleet;
use outpost::ops::exec;
use outpost_protocol::OutputStream;

pub(super) async fn exec(
    fleet: &Fleet,
    host: Option<String>,
    cwd: Option<String>,
    timeout: Option<f64>,
    command: Vec<String>,
) -> Result<ExitCode> {
    let session = fleet.get(host.as_deref()).map_err(anyhow::Error::msg)?;
    let command = command.join(" ");
    if let Err(refusal) = permit(fleet, session.name(), &command).await {
        eprintln!("outpost: {refusal}");
        return Ok(ExitCode::from(126));
    }
    let req = exec::request(&exec::Command {
        command: &command,
        cwd: cwd.as_deref(),
        timeout_s: timeout,
        max_output: 0,
        stream: true,
    })
    .map_err(|e| anyhow::anyhow!("{}", e.replace("timeout_s", "--timeout")))?;
    let result = session
        .exec(req, |stream, data| {
            let _ = match stream {
                OutputStream::Stdout => std::io::stdout().write_all(data),
                OutputStream::Stderr => std::io::stderr().write_all(data),
            };
        })
        .await;
    let _ = std::io::stdout().flush();
    match result {
        Ok(r) if r.timed_out => {
            eprintln!("outpost: command timed out; its process tree was killed");
            Ok(ExitCode::from(124))
        }
        // No status at all reads as 255, as ssh reports a lost command.
        Ok(r) => Ok(ExitCode::from(match exec::shell_status(&r) {
            -1 => 255,
            status => status.clamp(0, 255) as u8,
        })),
        Err(e) => {
            eprintln!("outpost: {}: {e}", session.name());
            Ok(ExitCode::from(255))
        }
    }
}

/// The config file's policy for `outpost exec`: a deny rule or a missing
/// allow rule refuses; a confirm rule asks on the terminal, and refuses when
/// stdin is not one.
pub(super) async fn permit(fleet: &Fleet, sandbox: &str, command: &str) -> Result<(), String> {
    use outpost::policy::{self, Planned};
    let policy = &fleet.policy;
    let pending = policy
        .review(&[Planned {
            sandbox,
            field: "command",
            command,
        }])
        .map_err(|refusal| refusal.to_string())?;
    if pending.is_empty() {
        return Ok(());
    }
    if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        return Err(policy::not_confirmed(
            &pending,
            "stdin is not a terminal to ask on",
        ));
    }
    let question = policy::confirm_question(&pending, policy, "You");
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let answer = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await
    .map_err(|e| e.to_string())?
    .unwrap_or_default();
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(policy::not_confirmed(&pending, "the answer was not yes")),
    }
}
