//! `outpost`: the command-line entry point (MCP server and tools for people).

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use outpost::config::{Config, Target};
use outpost::fleet::Fleet;
use outpost::session::Session;
use outpost::{jobs, mcp, watch};
use outpost_protocol::{
    ExecRequest, JobInfo, JobRead, JobState, JobWait, OutputStream, WaitReason,
};

/// Outpost turns your own Linux machines into sandboxes for AI agents, over plain
/// SSH. With no configuration, the `local` sandbox runs commands on this machine.
///
/// Configuration: remote-sandbox-mcp's environment variables (REMOTE_SANDBOX_LIST,
/// or REMOTE_HOST/REMOTE_PORT/REMOTE_USER/REMOTE_PASSWORD/REMOTE_KEY_FILE/
/// REMOTE_KEY_PASSPHRASE), or a TOML file ($OUTPOST_CONFIG, else
/// ~/.config/outpost/config.toml); host aliases resolve through ~/.ssh/config.
/// Logs go to stderr; set OUTPOST_LOG (e.g. debug) for more.
#[derive(Parser)]
#[command(name = "outpost", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the MCP tools on stdin/stdout (for Claude Code, Codex, Cursor…).
    Mcp,
    /// List the sandboxes and check each one, all in parallel.
    Hosts {
        /// Also show CPU, memory, GPUs and the idle score.
        #[arg(long)]
        resources: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run a command in a sandbox, stream its output, exit with its status
    /// (124 on timeout, 255 when the host cannot be reached, 126 when the
    /// config file's [policy] refuses it; a confirm rule asks on the terminal).
    Exec {
        /// Sandbox name (default: the active one: the first configured, else `local`).
        host: Option<String>,
        /// Working directory on the host.
        #[arg(long)]
        cwd: Option<String>,
        /// Kill the command's whole process tree after this many seconds.
        #[arg(long)]
        timeout: Option<f64>,
        /// The command, after `--`; joined with spaces and run by bash.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Sync a tree to or from a sandbox: `outpost sync LOCAL NAME:REMOTE` or
    /// `outpost sync NAME:REMOTE LOCAL`. Delta and compressed; files land
    /// atomically; modes, mtimes, symlinks and empty directories are kept.
    /// Exits 23 when some paths had problems (the rest was synced).
    Sync {
        source: String,
        target: String,
        /// Remove target paths the source lacks (never excluded ones).
        #[arg(long)]
        delete: bool,
        /// Show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Exclude paths matching this gitignore-syntax pattern (repeatable).
        #[arg(long = "exclude", value_name = "PATTERN")]
        excludes: Vec<String>,
        /// Read exclude patterns from this file.
        #[arg(long, value_name = "FILE")]
        exclude_from: Option<std::path::PathBuf>,
        /// Also honour the source tree's .gitignore files.
        #[arg(long)]
        gitignore: bool,
        /// Do not add the default excludes (.git/, node_modules/, __pycache__/, …).
        #[arg(long)]
        no_default_excludes: bool,
        /// Allow --delete to remove most of a non-trivial target.
        #[arg(long)]
        force: bool,
    },
    /// Report on this controller, the sandboxes, and (with HOST) the agent's own
    /// report on that host.
    Diagnose { host: Option<String> },
    /// Background jobs on a sandbox (started by exec_bash_background): list
    /// them (the default), show or follow a log, wait for one, cancel one.
    /// Jobs survive disconnects and controller restarts.
    #[command(args_conflicts_with_subcommands = true)]
    Jobs {
        /// Sandbox (default: the active one).
        host: Option<String>,
        /// Only jobs in this state: running, exited, cancelled, lost.
        #[arg(long)]
        state: Option<String>,
        /// Newest jobs to show (0: as many as one answer holds).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[command(subcommand)]
        action: Option<JobsAction>,
    },
    /// Follow the job events of sandboxes until SIGTERM or SIGINT: log each to
    /// stderr and run the config file's [hooks] (webhook_url, event_command);
    /// raise host_unreachable after [hooks] alert_after_failures failed checks
    /// in a row. Runs well under systemd --user or launchd.
    Watch {
        /// Sandboxes to follow (default: every SSH sandbox, or `local` when
        /// there is none).
        sandboxes: Vec<String>,
    },
    /// Show the audit log of MCP tool calls ($OUTPOST_HOME/audit.jsonl): time,
    /// client, tool, sandbox, outcome, duration, command or arguments, error.
    Audit {
        /// The last N calls (including rotated files when needed).
        #[arg(long, value_name = "N", default_value_t = 20)]
        tail: usize,
        /// Print the raw JSON lines.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum JobsAction {
    /// NAME STATE EXIT STARTED COMMAND of the newest jobs, oldest first.
    List {
        /// Sandbox (default: the active one).
        host: Option<String>,
        /// Only jobs in this state: running, exited, cancelled, lost.
        #[arg(long)]
        state: Option<String>,
        /// Newest jobs to show (0: as many as one answer holds).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Print a job's log (all of it, or the last --tail lines); --follow
    /// keeps printing until the job ends, then exits like `wait`.
    Logs {
        /// Job name.
        name: String,
        /// Sandbox (default: the active one).
        #[arg(long)]
        host: Option<String>,
        /// Keep printing new output until the job ends.
        #[arg(long, short)]
        follow: bool,
        /// Start with the last N lines.
        #[arg(long, value_name = "N")]
        tail: Option<u32>,
    },
    /// Wait for a job to end; exit with its exit code, 128+N when signal N
    /// killed it, 124 on timeout.
    Wait {
        /// Job name.
        name: String,
        /// Sandbox (default: the active one).
        #[arg(long)]
        host: Option<String>,
        /// Give up after this many seconds (default: wait as long as it runs).
        #[arg(long, value_name = "S")]
        timeout: Option<f64>,
    },
    /// Stop a job: TERM to its whole process tree, KILL after --grace.
    Cancel {
        /// Job name.
        name: String,
        /// Sandbox (default: the active one).
        #[arg(long)]
        host: Option<String>,
        /// Seconds between TERM and KILL.
        #[arg(long, value_name = "S", default_value_t = 3.0)]
        grace: f64,
    },
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("OUTPOST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("outpost: cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("outpost: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let config = Config::load()?;
    let fleet = Arc::new(Fleet::try_new(config)?);
    match cli.command {
        Command::Mcp => {
            if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
                eprintln!(
                    "outpost mcp: serving MCP on stdin/stdout; sandboxes: {} (active: {}). Register this command in an MCP client (see README); Ctrl-C stops.",
                    fleet.names().join(", "),
                    fleet.active_name()
                );
            }
            mcp::serve_stdio(fleet).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Hosts { resources, json } => hosts(&fleet, resources, json).await,
        Command::Exec {
            host,
            cwd,
            timeout,
            command,
        } => exec(&fleet, host, cwd, timeout, command).await,
        Command::Diagnose { host } => diagnose(&fleet, host).await,
        Command::Jobs {
            host,
            state,
            limit,
            action,
        } => {
            let action = action.unwrap_or(JobsAction::List { host, state, limit });
            jobs_cli(&fleet, action).await
        }
        Command::Watch { sandboxes } => watch(fleet, sandboxes).await,
        Command::Audit { tail, json } => audit(&fleet, tail, json),
        Command::Sync {
            source,
            target,
            delete,
            dry_run,
            excludes,
            exclude_from,
            gitignore,
            no_default_excludes,
            force,
        } => {
            let options = outpost::sync::SyncOptions {
                delete_extras: delete,
                force,
                dry_run,
                excludes,
                exclude_file: exclude_from,
                default_excludes: !no_default_excludes,
                use_gitignore: gitignore,
            };
            sync(&fleet, &source, &target, options).await
        }
    }
}

async fn hosts(fleet: &Fleet, resources: bool, json: bool) -> Result<ExitCode> {
    let deadline = fleet.config.connect_timeout + Duration::from_secs(5);
    let mut rows = fleet.list(true, deadline).await;
    if !resources {
        for r in &mut rows {
            r.resources = None;
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    if resources {
        println!(
            "  {:<16} {:<7} {:>4} {:>6} {:>5} {:>6} {:>9} {:>5}  GPUS",
            "NAME", "STATE", "CPUS", "LOAD1", "CPU%", "MEM%", "MEM FREE", "IDLE"
        );
    } else {
        println!("  {:<16} {:<30} STATE", "NAME", "ADDRESS");
    }
    for r in &rows {
        let mark = if r.is_active { "*" } else { " " };
        let state = if r.connection_alive { "ok" } else { "error" };
        let problem = r.connection_error.as_deref().unwrap_or("");
        if !resources {
            let addr = if r.port == 0 {
                format!("{}@{}", r.user, r.host)
            } else {
                format!("{}@{}:{}", r.user, r.host, r.port)
            };
            println!("{mark} {:<16} {:<30} {state} {problem}", r.name, addr);
            continue;
        }
        let Some(res) = &r.resources else {
            println!("{mark} {:<16} {:<7} {problem}", r.name, state);
            continue;
        };
        let gpus = match (&res.gpu_error, res.gpu.len()) {
            (Some(e), _) => format!("unknown ({e})"),
            (None, 0) => "-".to_string(),
            (None, n) => format!("{n} via {}", res.gpu_source),
        };
        println!(
            "{mark} {:<16} {:<7} {:>4} {:>6.2} {:>5} {:>5.0}% {:>7}Mi {:>5.2}  {gpus}",
            r.name,
            state,
            res.cpu.count,
            res.cpu.load_1m,
            res.cpu
                .usage_pct
                .map_or("-".to_string(), |u| format!("{u:.0}")),
            res.memory.used_pct,
            res.memory.free_mb,
            res.idle_score,
        );
        for g in &res.gpu {
            println!(
                "      gpu{} {:<24} {:>3.0}% util  {:>6}/{:<6} MiB  {}{}",
                g.index,
                g.name,
                g.util_pct,
                g.mem_used_mb,
                g.mem_total_mb,
                g.temperature_c.map_or(String::new(), |t| format!("{t}°C ")),
                g.lease
                    .as_ref()
                    .map_or(String::new(), |l| format!("leased by {l}"))
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn exec(
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
    let timeout_ms = match timeout {
        Some(t) if t > 0.0 && t.is_finite() => Some((t * 1000.0) as u64),
        Some(t) => anyhow::bail!("--timeout must be a positive number of seconds, got {t}"),
        None => None,
    };
    let req = ExecRequest {
        command,
        cwd,
        env: Vec::new(),
        stdin: None,
        timeout_ms,
        output_limit: 0,
        stream: true,
    };
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
        Ok(r) => Ok(ExitCode::from(
            r.exit_code
                .or(r.signal.map(|s| 128 + s))
                .unwrap_or(255)
                .clamp(0, 255) as u8,
        )),
        Err(e) => {
            eprintln!("outpost: {}: {e}", session.name());
            Ok(ExitCode::from(255))
        }
    }
}

/// The config file's policy for `outpost exec`: a deny rule or a missing
/// allow rule refuses; a confirm rule asks on the terminal, and refuses when
/// stdin is not one.
async fn permit(fleet: &Fleet, sandbox: &str, command: &str) -> Result<(), String> {
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

/// `outpost audit`: the last `tail` lines of the audit log.
fn audit(fleet: &Fleet, tail: usize, json: bool) -> Result<ExitCode> {
    let log = outpost::audit::AuditLog::new(&fleet.config.home);
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
        outpost::audit::format_human(&lines)
    };
    let mut stdout = std::io::stdout().lock();
    for line in out {
        if writeln!(stdout, "{line}").is_err() {
            break; // e.g. piped into head
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `NAME:PATH` when NAME is a configured sandbox.
fn remote_spec<'a>(fleet: &Fleet, arg: &'a str) -> Option<(String, &'a str)> {
    let (name, path) = arg.split_once(':')?;
    fleet.get(Some(name)).ok().map(|_| (name.to_string(), path))
}

async fn sync(
    fleet: &Fleet,
    source: &str,
    target: &str,
    options: outpost::sync::SyncOptions,
) -> Result<ExitCode> {
    use outpost::sync::Progress;
    use std::sync::atomic::Ordering;
    let (push, name, remote, local) = match (remote_spec(fleet, source), remote_spec(fleet, target))
    {
        (None, Some((name, remote))) => (true, name, remote, source),
        (Some((name, remote)), None) => (false, name, remote, target),
        (Some(_), Some(_)) => anyhow::bail!("both sides are sandboxes; one must be a local path"),
        (None, None) => anyhow::bail!(
            "neither side names a sandbox; write one as NAME:PATH (sandboxes: {})",
            fleet.names().join(", ")
        ),
    };
    let session = fleet.get(Some(&name)).map_err(anyhow::Error::msg)?;
    let remote = if remote.is_empty() { "~" } else { remote };
    // A person typed the path: only a configured `local_roots` limits it.
    let roots = outpost::localpath::configured_or(
        fleet.config.local_roots.as_deref(),
        outpost::localpath::Roots::unrestricted,
    );
    let intent = if push {
        outpost::localpath::Intent::Read
    } else {
        outpost::localpath::Intent::Dest {
            create: !options.dry_run,
        }
    };
    let local = roots.resolve(local, intent).map_err(anyhow::Error::msg)?;
    let mut options = options;
    options.excludes.extend(local.secret_excludes);
    if let Some(file) = &options.exclude_file {
        let file = roots.resolve(&file.to_string_lossy(), outpost::localpath::Intent::Read);
        options.exclude_file = Some(file.map_err(anyhow::Error::msg)?.path);
    }
    let local = local.path;
    let progress = Arc::new(Progress::default());
    let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        indicatif::ProgressBar::new(0)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {bytes}/{total_bytes} {bytes_per_sec} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let ticker = {
        let (bar, progress) = (bar.clone(), progress.clone());
        tokio::spawn(async move {
            loop {
                bar.set_length(progress.bytes_total.load(Ordering::Relaxed));
                bar.set_position(progress.bytes_done.load(Ordering::Relaxed));
                bar.set_message(format!(
                    "{}/{} files",
                    progress.files_done.load(Ordering::Relaxed),
                    progress.files_total.load(Ordering::Relaxed)
                ));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let result = if push {
        outpost::sync::push(&session, &local, remote, &options, progress).await
    } else {
        outpost::sync::pull(&session, remote, &local, &options, progress).await
    };
    ticker.abort();
    bar.finish_and_clear();
    let report = result.map_err(|e| anyhow::anyhow!("{e}"))?;
    println!(
        "{}{} files sent ({} of content, {} on the wire{}), {} unchanged, {} dirs created, {} symlinks, {} attribute updates, {} deleted, {:.2} s",
        if report.dry_run {
            "dry run: would have "
        } else {
            ""
        },
        report.files_sent,
        human_bytes(report.bytes_total),
        human_bytes(report.bytes_sent),
        if report.bytes_resumed > 0 {
            format!(", {} resumed", human_bytes(report.bytes_resumed))
        } else {
            String::new()
        },
        report.files_unchanged,
        report.dirs_created,
        report.symlinks,
        report.attrs_updated,
        report.deleted,
        report.duration_s
    );
    for problem in &report.problems {
        eprintln!("outpost: {problem}");
    }
    Ok(if report.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(23)
    })
}

fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

async fn diagnose(fleet: &Fleet, host: Option<String>) -> Result<ExitCode> {
    let cfg = &fleet.config;
    println!("outpost {}", env!("CARGO_PKG_VERSION"));
    println!("configuration:   {}", cfg.source);
    println!(
        "known_hosts:     {} (Outpost's own)",
        cfg.known_hosts.display()
    );
    if let Some(p) = &cfg.user_known_hosts {
        println!("                 {} (read only)", p.display());
    }
    println!(
        "connect timeout: {:.1} s",
        cfg.connect_timeout.as_secs_f64()
    );
    let artifacts =
        outpost::host::bootstrap::Artifacts::discover(cfg.agent_bin.as_deref(), &cfg.agent_dirs);
    match &artifacts.native {
        Some(a) => println!("agent (native):  {}", a.path.display()),
        None => println!("agent (native):  MISSING — build it with `cargo build --workspace`"),
    }
    for a in &artifacts.portable {
        println!("agent build:     {}", a.label);
    }
    println!();
    let deadline = cfg.connect_timeout + Duration::from_secs(5);
    let started = Instant::now();
    let rows = fleet.list(true, deadline).await;
    println!(
        "sandboxes (checked in parallel in {} ms):",
        started.elapsed().as_millis()
    );
    for r in &rows {
        let state = match (&r.resources, &r.connection_error) {
            (Some(_), _) => "reachable".to_string(),
            (None, Some(e)) => format!("PROBLEM: {e}"),
            (None, None) => "unknown".to_string(),
        };
        println!(
            "  {}{:<16} {}",
            if r.is_active { "*" } else { " " },
            r.name,
            state
        );
    }
    let Some(host) = host else {
        return Ok(ExitCode::SUCCESS);
    };
    let session = fleet.get(Some(&host)).map_err(anyhow::Error::msg)?;
    let conn = session
        .connection()
        .await
        .with_context(|| format!("cannot reach {host}"))?;
    let h = &conn.hello;
    println!();
    println!(
        "{host}: agent {} ({}), protocol {}, {} {} {}, pid {}",
        h.agent_version,
        &h.build_hash[..12.min(h.build_hash.len())],
        h.protocol_version,
        h.os,
        h.arch,
        h.libc,
        h.pid
    );
    println!("agent path: {}", conn.agent_path);
    println!();
    let req = ExecRequest {
        command: format!(
            "{} diagnose",
            outpost::host::bootstrap::shell_quote(&conn.agent_path)
        ),
        cwd: None,
        env: Vec::new(),
        stdin: None,
        timeout_ms: Some(30_000),
        output_limit: outpost_protocol::limits::MAX_EXEC_OUTPUT_LIMIT,
        stream: false,
    };
    let result = session.exec(req, |_, _| {}).await?;
    print!("{}", result.stdout.to_text());
    eprint!("{}", result.stderr.to_text());
    Ok(ExitCode::SUCCESS)
}

async fn jobs_cli(fleet: &Fleet, action: JobsAction) -> Result<ExitCode> {
    let session = |host: &Option<String>| fleet.get(host.as_deref()).map_err(anyhow::Error::msg);
    match action {
        JobsAction::List { host, state, limit } => {
            let session = session(&host)?;
            let state = state
                .as_deref()
                .map(jobs::parse_state)
                .transpose()
                .map_err(anyhow::Error::msg)?;
            let (list, omitted) = jobs::list(&session, state, limit).await?;
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
            Ok(ExitCode::SUCCESS)
        }
        JobsAction::Logs {
            name,
            host,
            follow,
            tail,
        } => job_logs(&*session(&host)?, &name, follow, tail).await,
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
            job_wait(&*session(&host)?, &name, deadline).await
        }
        JobsAction::Cancel { name, host, grace } => {
            if !(0.0..=600.0).contains(&grace) {
                anyhow::bail!("--grace must be between 0 and 600 seconds, got {grace}");
            }
            let job =
                jobs::cancel(&*session(&host)?, &name, Duration::from_secs_f64(grace)).await?;
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

async fn watch(fleet: Arc<Fleet>, names: Vec<String>) -> Result<ExitCode> {
    let names = if names.is_empty() {
        let ssh: Vec<String> = fleet
            .sessions()
            .iter()
            .filter(|s| matches!(s.config.target, Target::Ssh(_)))
            .map(|s| s.name().to_string())
            .collect();
        if ssh.is_empty() { fleet.names() } else { ssh }
    } else {
        for n in &names {
            fleet.get(Some(n)).map_err(anyhow::Error::msg)?;
        }
        names
    };
    let sink: watch::Sink = Arc::new(|e: &watch::HookEvent| {
        eprintln!("{} {}", jobs::utc_time(e.at_unix), e.summary());
    });
    let watcher = watch::Watcher::new(fleet.clone(), sink);
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
