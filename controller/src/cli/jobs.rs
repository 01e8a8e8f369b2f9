//! `outpost jobs`: list, logs, wait, cancel.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::JobsAction;
use anyhow::Result;
use outpost::fleet::Fleet;
use outpost::ops::jobs;
use outpost::ops::slurm_jobs::{self, BatchStatus};
use outpost::session::Session;
use outpost_protocol::{JobInfo, JobRead, JobState, JobWait, WaitReason};

pub(super) async fn jobs_cli(fleet: &Fleet, action: JobsAction) -> Result<ExitCode> {
    let session = |host: &Option<String>| fleet.get(host.as_deref()).map_err(anyhow::Error::msg);
    match action {
        JobsAction::Start {
            host,
            name,
            cwd,
            log_file,
            scheduler,
            gpus,
            time,
            partition,
            command,
        } => {
            let session = session(&host)?;
            if scheduler.is_some() {
                let request = slurm_jobs::SubmitRequest {
                    command: command.join(" "),
                    cwd,
                    env: Vec::new(),
                    gpus,
                    time,
                    partition,
                };
                slurm_jobs::batch_body(&request).map_err(anyhow::Error::msg)?;
                if let Err(refusal) =
                    super::exec::permit(fleet, session.name(), &request.command).await
                {
                    eprintln!("outpost: {refusal}");
                    return Ok(ExitCode::from(126));
                }
                let job = slurm_jobs::submit(&session, &request)
                    .await
                    .map_err(anyhow::Error::msg)?;
                println!("{}", job.name);
                eprintln!("log: {}", job.log_file);
                return Ok(ExitCode::SUCCESS);
            }
            let request = jobs::StartRequest {
                command: command.join(" "),
                name,
                cwd,
                log_file,
                ..Default::default()
            };
            let spec = jobs::job_spec(&request).map_err(anyhow::Error::msg)?;
            for (_, command) in outpost::policy::job_commands(&spec) {
                if let Err(refusal) = super::exec::permit(fleet, session.name(), &command).await {
                    eprintln!("outpost: {refusal}");
                    return Ok(ExitCode::from(126));
                }
            }
            let job = jobs::start(&session, spec).await?;
            println!("{}", job.name);
            eprintln!("log: {}", job.log_file);
            Ok(ExitCode::SUCCESS)
        }
        JobsAction::List { host, state, limit } => {
            let session = session(&host)?;
            let state = state
                .as_deref()
                .map(jobs::parse_state)
                .transpose()
                .map_err(anyhow::Error::msg)?;
            let (list, omitted) = jobs::list(&session, state, limit).await?;
            let batch = match slurm_jobs::list(&session, limit).await {
                Ok((batch, _)) => batch,
                Err(e) => {
                    eprintln!("outpost: {e}");
                    Vec::new()
                }
            };
            if omitted > 0 {
                println!("({omitted} older jobs not shown; --limit 0 shows as many as fit)");
            }
            println!(
                "{:<24} {:<9} {:<9} {:<20} COMMAND",
                "NAME", "STATE", "EXIT", "STARTED"
            );
            for j in &list {
                let exit = jobs::exit_summary(j);
                println!(
                    "{:<24} {:<9} {:<9} {:<20} {}",
                    j.name,
                    jobs::state_name(j.state),
                    if exit.is_empty() { "-" } else { exit.as_str() },
                    jobs::utc_time(j.started_unix),
                    jobs::short_command(&j.command, 60)
                );
            }
            let wanted = state.map(jobs::state_name);
            for b in batch
                .iter()
                .filter(|b| wanted.is_none_or(|w| w == b.state.name()))
            {
                let exit = b.summary();
                println!(
                    "{:<24} {:<9} {:<9} {:<20} {}",
                    b.name(),
                    b.state.name(),
                    if exit.is_empty() { "-" } else { exit.as_str() },
                    b.submitted_unix.map(jobs::utc_time).unwrap_or_default(),
                    b.command.as_deref().unwrap_or_default()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        JobsAction::Logs {
            name,
            host,
            follow,
            tail,
        } => match slurm_jobs::job_id(&name) {
            Some(id) => batch_logs(&*session(&host)?, id, follow, tail).await,
            None => job_logs(&*session(&host)?, &name, follow, tail).await,
        },
        JobsAction::Wait {
            name,
            host,
            timeout,
        } => {
            let deadline = match timeout {
                Some(t) if t >= 0.0 && t.is_finite() => {
                    Some(Instant::now() + Duration::from_secs_f64(t))
                }
                Some(t) => anyhow::bail!("--timeout must be 0 or more seconds, got {t}"),
                None => None,
            };
            match slurm_jobs::job_id(&name) {
                Some(id) => batch_wait(&*session(&host)?, id, deadline).await,
                None => job_wait(&*session(&host)?, &name, deadline).await,
            }
        }
        JobsAction::Cancel { name, host, grace } => {
            if !(0.0..=600.0).contains(&grace) {
                anyhow::bail!("--grace must be between 0 and 600 seconds, got {grace}");
            }
            let grace = Duration::from_secs_f64(grace);
            if let Some(id) = slurm_jobs::job_id(&name) {
                let job = slurm_jobs::cancel(&*session(&host)?, id, grace)
                    .await
                    .map_err(anyhow::Error::msg)?;
                println!("{} {} {}", job.name(), job.state.name(), job.summary());
                return Ok(ExitCode::SUCCESS);
            }
            let job = jobs::cancel(&*session(&host)?, &name, grace).await?;
            let exit = jobs::exit_summary(&job);
            println!("{} {} {exit}", job.name, jobs::state_name(job.state));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Bytes per log request from the CLI.
const CLI_PAGE: u64 = 1 << 20;
/// One `JobWait` of the CLI; a long wait is a series of these.
const CLI_WAIT_SLICE: Duration = Duration::from_secs(30);

/// Prints the log from `offset` up to its current end; returns where it stopped.
async fn print_log(
    session: &Session,
    name: &str,
    mut offset: u64,
    until: Option<u64>,
) -> Result<u64> {
    loop {
        let log = jobs::read(
            session,
            JobRead {
                name: name.to_string(),
                offset: Some(offset),
                tail_lines: None,
                grep: None,
                max_bytes: CLI_PAGE,
            },
        )
        .await?;
        std::io::stdout().write_all(&log.data)?;
        let done = log.data.is_empty()
            || log.next_offset <= offset
            || log.next_offset >= until.unwrap_or(log.log_size);
        offset = log.next_offset.max(offset);
        if done {
            std::io::stdout().flush()?;
            return Ok(offset);
        }
    }
}

async fn job_logs(
    session: &Session,
    name: &str,
    follow: bool,
    tail: Option<u32>,
) -> Result<ExitCode> {
    let mut cursor = match tail {
        Some(n) => {
            let log = jobs::read(
                session,
                JobRead {
                    name: name.to_string(),
                    offset: None,
                    tail_lines: Some(n),
                    grep: None,
                    max_bytes: CLI_PAGE,
                },
            )
            .await?;
            std::io::stdout().write_all(&log.data)?;
            log.next_offset
        }
        None => print_log(session, name, 0, None).await?,
    };
    if !follow {
        std::io::stdout().flush()?;
        return Ok(ExitCode::SUCCESS);
    }
    loop {
        let waited = jobs::wait(
            session,
            JobWait {
                name: name.to_string(),
                cursor,
                timeout_ms: CLI_WAIT_SLICE.as_millis() as u64,
                pattern: None,
                // Return as soon as output pauses briefly, so lines appear
                // as they come rather than when the slice ends.
                silence_ms: Some(200),
                max_bytes: CLI_PAGE,
            },
        )
        .await?;
        if waited.omitted == 0 {
            let mut out = std::io::stdout().lock();
            out.write_all(&waited.output)?;
            out.flush()?;
            cursor = waited.cursor_after;
        } else {
            // More than a page arrived at once: page through it instead.
            cursor = print_log(session, name, cursor, Some(waited.cursor_after)).await?;
        }
        if waited.reason == WaitReason::Ended {
            print_log(session, name, cursor, None).await?;
            return Ok(job_exit(&waited.job));
        }
    }
}

async fn job_wait(session: &Session, name: &str, deadline: Option<Instant>) -> Result<ExitCode> {
    let mut job = jobs::status(session, name).await?;
    loop {
        if job.state != JobState::Running {
            return Ok(job_exit(&job));
        }
        let slice = match deadline {
            Some(d) => CLI_WAIT_SLICE.min(d.saturating_duration_since(Instant::now())),
            None => CLI_WAIT_SLICE,
        };
        if slice.is_zero() {
            eprintln!("outpost: job {name} is still running");
            return Ok(ExitCode::from(124));
        }
        let request = JobWait {
            name: name.to_string(),
            cursor: job.log_size,
            timeout_ms: slice.as_millis() as u64,
            pattern: None,
            silence_ms: None,
            max_bytes: 1,
        };
        match jobs::wait(session, request).await {
            Ok(waited) => job = waited.job,
            // The job runs on regardless: wait on through a new connection.
            Err(e) if e.is_connection() => {
                eprintln!("outpost: {}: {e}; retrying", session.name());
                tokio::time::sleep(Duration::from_secs(2)).await;
                if let Ok(j) = jobs::status(session, name).await {
                    job = j;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The exit status for an ended job: its code, 128+N for signal N, 255 when
/// unknown (lost).
fn job_exit(job: &JobInfo) -> ExitCode {
    if let Some(sig) = job.signal
        && job.exit_code.is_none()
    {
        eprintln!("outpost: job {} killed by signal {sig}", job.name);
    }
    if job.state == JobState::Lost {
        eprintln!(
            "outpost: job {} was lost (its host rebooted or its supervisor died)",
            job.name
        );
    }
    ExitCode::from(jobs::shell_status(job).unwrap_or(255).clamp(0, 255) as u8)
}

/// How often the CLI looks at a Slurm batch job it follows or waits for.
const BATCH_POLL: Duration = Duration::from_secs(1);

/// `outpost jobs logs` for a Slurm batch job: the log (or its last `tail`
/// lines); with `follow`, new output as it comes until the job ends.
async fn batch_logs(
    session: &Session,
    id: u64,
    follow: bool,
    tail: Option<u32>,
) -> Result<ExitCode> {
    let page = slurm_jobs::read_log(
        session,
        id,
        tail.is_none().then_some(0),
        tail,
        None,
        slurm_jobs::MAX_READ,
    )
    .await
    .map_err(anyhow::Error::msg)?;
    std::io::stdout().write_all(&page.data)?;
    let mut cursor = page.next_offset;
    // Prints the page at `cursor`; whether it held anything.
    let print_next = |cursor: u64| async move {
        let page =
            slurm_jobs::read_log(session, id, Some(cursor), None, None, slurm_jobs::MAX_READ)
                .await
                .map_err(anyhow::Error::msg)?;
        std::io::stdout().write_all(&page.data)?;
        std::io::stdout().flush()?;
        Ok::<_, anyhow::Error>((!page.data.is_empty()).then_some(page.next_offset))
    };
    loop {
        // Whole pages up to the end as it is now.
        while let Some(next) = print_next(cursor).await? {
            cursor = next;
        }
        if !follow {
            return Ok(ExitCode::SUCCESS);
        }
        let job = slurm_jobs::status(session, id)
            .await
            .map_err(anyhow::Error::msg)?;
        if job.state.ended() {
            print_next(cursor).await?;
            return Ok(batch_exit(&job));
        }
        tokio::time::sleep(BATCH_POLL).await;
    }
}

async fn batch_wait(session: &Session, id: u64, deadline: Option<Instant>) -> Result<ExitCode> {
    loop {
        let job = slurm_jobs::status(session, id)
            .await
            .map_err(anyhow::Error::msg)?;
        if job.state.ended() {
            return Ok(batch_exit(&job));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            eprintln!("outpost: job {} is still {}", job.name(), job.state.name());
            return Ok(ExitCode::from(124));
        }
        tokio::time::sleep(BATCH_POLL).await;
    }
}

/// The exit status for an ended batch job: its command's, 124 for Slurm's
/// time limit, 255 when unknown (cancelled, failed, lost).
fn batch_exit(job: &BatchStatus) -> ExitCode {
    if job.exit_code.is_none() {
        let how = job.summary();
        eprintln!(
            "outpost: job {} {}{}",
            job.name(),
            job.state.name(),
            if how.is_empty() {
                String::new()
            } else {
                format!(" ({how})")
            }
        );
    }
    ExitCode::from(job.shell_status().unwrap_or(255).clamp(0, 255) as u8)
}
