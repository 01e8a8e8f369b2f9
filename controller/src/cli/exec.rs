//! `outpost exec`, under the config file's command policy.

use std::io::{IsTerminal, Write};
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
    no_stdin: bool,
    command: Vec<String>,
) -> Result<ExitCode> {
    let session = fleet.get(host.as_deref()).map_err(anyhow::Error::msg)?;
    let command = command.join(" ");
    if let Err(refusal) = permit(fleet, session.name(), &command).await {
        eprintln!("outpost: {refusal}");
        return Ok(ExitCode::from(126));
    }
    let stdin = if no_stdin || std::io::stdin().is_terminal() {
        None
    } else if stdin_speaks_within(STDIN_WAIT) {
        Some(read_stdin()?)
    } else {
        // An inherited pipe nobody writes to (a harness, a CI step) must
        // not hang the command: it runs without input.
        eprintln!(
            "outpost: nothing on standard input within {} s; running without it (-n says so up front)",
            STDIN_WAIT.as_secs()
        );
        None
    };
    let mut req = exec::request(&exec::Command {
        command: &command,
        cwd: cwd.as_deref(),
        timeout_s: timeout,
        max_output: 0,
        stream: true,
    })
    .map_err(|e| anyhow::anyhow!("{}", e.replace("timeout_s", "--timeout")))?;
    req.stdin = stdin;
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
        // 255 is ssh's "could not reach the host"; a command that could not
        // start there (a missing --cwd) is an ordinary failure.
        Err(e) => {
            eprintln!("outpost: {}: {e}", session.name());
            Ok(ExitCode::from(if e.is_connection() { 255 } else { 1 }))
        }
    }
}

/// How long standard input may stay silent before the command runs without it.
const STDIN_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether standard input has data or its end within `wait` (a file or a
/// closed pipe at once).
fn stdin_speaks_within(wait: std::time::Duration) -> bool {
    let mut fd = libc::pollfd {
        fd: libc::STDIN_FILENO,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut fd, 1, wait.as_millis() as libc::c_int) > 0 }
}

/// All of standard input, refused past the protocol's stdin limit.
fn read_stdin() -> Result<Vec<u8>> {
    use std::io::Read;
    let max = outpost_protocol::limits::MAX_STDIN_LEN;
    let mut data = Vec::new();
    std::io::stdin()
        .take(max as u64 + 1)
        .read_to_end(&mut data)?;
    if data.len() > max {
        anyhow::bail!(
            "standard input is over {} MiB; copy the data with `outpost sync` and redirect from the file, or pass -n",
            max >> 20
        );
    }
    Ok(data)
}

/// The config file's policy for `outpost exec`: a deny rule or a missing
/// allow rule refuses; a confirm rule asks on the terminal, and refuses when
/// stdin is not one; a checkpoint rule checkpoints the sandbox first.
pub(super) async fn permit(fleet: &Fleet, sandbox: &str, command: &str) -> Result<(), String> {
    permit_field(fleet, sandbox, "command", command).await?;
    let planned = outpost::policy::Planned::command(sandbox, "command", command);
    if let Some(checkpoint) = outpost::ops::checkpoints::before_command(fleet, &planned).await? {
        eprintln!(
            "outpost: checkpoint {checkpoint} made first (policy); `outpost sandbox restore {checkpoint}` undoes the command"
        );
    }
    Ok(())
}

/// [`permit`] for what a command's parameter `field` would run (`code`).
pub(super) async fn permit_field(
    fleet: &Fleet,
    sandbox: &str,
    field: &str,
    command: &str,
) -> Result<(), String> {
    use outpost::policy::{self, Planned};
    let policy = &fleet.policy;
    let pending = policy
        .review(&[Planned::command(sandbox, field, command)])
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
