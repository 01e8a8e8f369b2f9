//! The `outpost` command line: clap's definitions and the dispatch, one
//! module per command. Each command calls the same operations (`outpost::ops`)
//! and fleet the MCP server does; only this folder and `main.rs` know clap.

mod attach;
mod audit;
mod auth;
mod code;
mod exec;
mod hosts;
mod jobs;
mod sandbox;
mod sync;
mod watch;

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use clap::{Parser, Subcommand};
use outpost::config::Config;
use outpost::fleet::Fleet;
use outpost::mcp;
use outpost::ops::code as code_defaults;

/// Outpost turns your own Linux machines into sandboxes for AI agents, over plain
/// SSH. With no configuration, the `local` sandbox runs commands on this machine.
///
/// Configuration: remote-sandbox-mcp's environment variables (REMOTE_SANDBOX_LIST,
/// or REMOTE_HOST/REMOTE_PORT/REMOTE_USER/REMOTE_PASSWORD/REMOTE_KEY_FILE/
/// REMOTE_KEY_PASSPHRASE), or a TOML file ($OUTPOST_CONFIG, else
/// ~/.config/outpost/config.toml); host aliases resolve through ~/.ssh/config.
/// A sandbox in the file may instead be reached through a command that gives
/// a shell in it (kubectl exec -i, docker exec -i, srun): see docs/hosts.md.
/// Logs go to stderr; set OUTPOST_LOG (e.g. debug) for more.
#[derive(Parser)]
#[command(name = "outpost", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the MCP tools on stdin/stdout (for Claude Code, Codex, Cursor…),
    /// or with --http over Streamable HTTP.
    Mcp {
        /// Serve over Streamable HTTP at http://ADDR:PORT/mcp instead
        /// (default 127.0.0.1:8742; also localhost:PORT or PORT). Clients
        /// must send `Authorization: Bearer <token>`: $OUTPOST_HTTP_TOKEN,
        /// else $OUTPOST_HOME/http-token (made on first use), or a named
        /// caller's in $OUTPOST_HOME/http-tokens/NAME; or they sign in by
        /// OAuth 2.1. A live status page is at /. Prints the client
        /// configuration when it starts.
        #[arg(long, value_name = "ADDR:PORT", num_args = 0..=1,
              default_missing_value = mcp::endpoint::DEFAULT_ADDR,
              value_parser = mcp::endpoint::parse_listen_addr)]
        http: Option<std::net::SocketAddr>,
        /// The https URL clients reach this server at through a TLS proxy
        /// (e.g. https://outpost.example.org): its host is served too, and
        /// OAuth names it as the resource and issuer.
        #[arg(long, value_name = "URL", requires = "http",
              value_parser = mcp::endpoint::parse_public_url)]
        public_url: Option<mcp::endpoint::PublicUrl>,
    },
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
    /// config file's [policy] refuses it, 1 when it cannot start there, e.g.
    /// a missing --cwd; a confirm rule asks on the terminal). Standard input,
    /// when it is not a terminal and speaks within 1 s, is passed to the
    /// command (at most 1 MiB).
    Exec {
        /// Sandbox name, or HOST/ID (default: the active one: the first
        /// configured, else `local`).
        host: Option<String>,
        /// Working directory on the host.
        #[arg(long)]
        cwd: Option<String>,
        /// Kill the command's whole process tree after this many seconds.
        #[arg(long)]
        timeout: Option<f64>,
        /// Give the command no input, as `ssh -n` (standard input is not read).
        #[arg(short = 'n', long)]
        no_stdin: bool,
        /// The command, after `--`; joined with spaces and run by bash.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Run Python or bash in a code context: an interpreter on the sandbox
    /// that keeps its state (variables, imports, the shell's cd) between runs.
    ///
    /// A context is made on first use and outlives this command. Prints
    /// stdout, each displayed value (images as [image/png WxH SIZE]) and
    /// stderr, then an error's traceback; exits 0, 1 on an error, 124 on
    /// timeout, 126 when the config file's [policy] refuses it (always where
    /// the sandbox has allow rules: code cannot be checked against them), 255
    /// when the host cannot be reached. Ctrl-C interrupts the run (state
    /// kept); a second one leaves without waiting, and prints the command
    /// that stops the run. Empty code ('') collects a run an MCP call left
    /// running. --control interrupts, restarts or removes a context (the one
    /// --context names), then lists them.
    #[command(
        override_usage = "outpost code [OPTIONS] [SANDBOX] <CODE|->\n       outpost code --list [SANDBOX]\n       outpost code --control <interrupt|restart|remove> [--context NAME] [SANDBOX]"
    )]
    Code {
        /// [SANDBOX] CODE: SANDBOX (default: the active one) may be HOST/ID;
        /// CODE - reads the code from standard input.
        #[arg(value_name = "ARGS", num_args = 0..=2)]
        args: Vec<String>,
        /// The context to run in, or for --control to act on (made on first
        /// use; default: "default", for bash "bash").
        #[arg(long)]
        context: Option<String>,
        /// python or bash (one per context).
        #[arg(long, default_value = "python")]
        language: String,
        /// Interrupt the run after this many seconds (state kept; default:
        /// no limit).
        #[arg(long, value_name = "S")]
        timeout: Option<f64>,
        /// Start from a fresh interpreter (the context's state is lost).
        #[arg(long)]
        restart: bool,
        /// List the sandbox's contexts instead: NAME LANGUAGE STATE RUNS RSS
        /// LAST_USED.
        #[arg(long, conflicts_with = "control")]
        list: bool,
        /// Instead of running code: interrupt the context's run (state
        /// kept), restart it (a fresh interpreter; the state is lost, a run
        /// stopped), or remove it; then list the contexts.
        #[arg(
            long,
            value_name = "ACTION",
            value_parser = ["interrupt", "restart", "remove"],
            conflicts_with_all = ["restart", "timeout", "save_images"]
        )]
        control: Option<String>,
        /// Write each image to DIR as image-N.png (.jpg, .gif, .webp).
        #[arg(long, value_name = "DIR")]
        save_images: Option<std::path::PathBuf>,
    },
    /// Install Python packages where `outpost code` finds them.
    ///
    /// They go into the sandbox's own virtual environment, made on first use
    /// (uv when the host has it, else pip). Exits with the installer's status
    /// (its output printed when it fails), 124 on timeout, 126 when the
    /// config file's [policy] refuses it (checked as `pip install PKG…`;
    /// always refused where the sandbox has allow rules).
    #[command(override_usage = "outpost install-package [OPTIONS] [SANDBOX] <PKG>...")]
    InstallPackage {
        /// [SANDBOX] PKG…: the first is the sandbox when one has that name
        /// (default: the active one); each PKG a requirement (numpy,
        /// pandas==2.2, torch>=2).
        #[arg(value_name = "ARGS", required = true, num_args = 1..)]
        args: Vec<String>,
        /// Stop the install after this many seconds.
        #[arg(long, value_name = "S", default_value_t = code_defaults::DEFAULT_INSTALL_TIMEOUT_S)]
        timeout: f64,
    },
    /// Sync a tree (or one file) to or from a sandbox: `outpost sync LOCAL
    /// NAME:REMOTE` or `outpost sync NAME:REMOTE LOCAL` (NAME may be
    /// HOST/ID; a relative REMOTE starts in its work dir). Delta and
    /// compressed; files land atomically; modes, mtimes, symlinks and empty
    /// directories are kept. One file goes into the target when that is a
    /// directory (or ends in /), else to the target path, under its own name.
    /// `outpost sync LOCAL H1,H2,…:REMOTE` pushes to several at once (the
    /// tree read and compressed once). Exits 23 when some paths had
    /// problems (the rest was synced), 1 when a host failed.
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
    /// Background jobs on a sandbox: start one, list them (the default),
    /// show or follow a log, wait for one, cancel one. Jobs survive
    /// disconnects and controller restarts.
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
        /// Sandboxes to follow (default: every sandbox but `local`, or
        /// `local` when there is no other).
        sandboxes: Vec<String>,
    },
    /// Isolated, expiring sandboxes made on a host, named HOST/ID (e.g.
    /// gpu1/sbx-3f2a): `exec`, `sync` and `jobs` take that name as a
    /// sandbox. The host's agent keeps each apart (bubblewrap, Landlock, or
    /// only its own directories: `create` says which) and ends it at expiry.
    Sandbox {
        #[command(subcommand)]
        action: SandboxAction,
    },
    /// Show a terminal and type into it: TERMINAL (SANDBOX#ID, as
    /// open_terminal answers), or a new one on --command. C-] detaches.
    Attach {
        terminal: Option<String>,
        /// Open a new terminal in this sandbox (default: the active one).
        #[arg(long, value_name = "NAME")]
        sandbox: Option<String>,
        /// The new terminal's command (default: bash).
        #[arg(long, value_name = "CMD")]
        command: Option<String>,
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
    /// The OAuth grants the HTTP server gave clients ($OUTPOST_HOME/oauth.json).
    Auth {
        #[command(subcommand)]
        action: AuthAction,
    },
}

#[derive(Subcommand)]
pub(super) enum AuthAction {
    /// Each grant: its id, client, scope, when made and last refreshed.
    List {
        /// Print the records as JSON (token digests left out).
        #[arg(long)]
        json: bool,
    },
    /// End a grant (by grant id) or every grant of a client (by client id):
    /// its tokens stop working on the next request.
    Revoke {
        /// A grant or client id (random base64url: it may start with `-`).
        #[arg(allow_hyphen_values = true)]
        id: String,
    },
}

#[derive(Subcommand)]
pub(super) enum JobsAction {
    /// Start a background job (it survives disconnects); prints its name.
    /// Under the config file's command policy, as `exec`.
    Start {
        /// Sandbox (default: the active one).
        host: Option<String>,
        /// Job name (default: generated).
        #[arg(long, conflicts_with = "scheduler")]
        name: Option<String>,
        /// Working directory on the host.
        #[arg(long)]
        cwd: Option<String>,
        /// Where the output goes (default: the job's own directory).
        #[arg(long, conflicts_with = "scheduler")]
        log_file: Option<String>,
        /// `slurm`: submit it from this login node with sbatch instead; the
        /// job is named slurm-JOBID (its log: ~/.outpost/batch/JOBID.log).
        #[arg(long, value_parser = ["slurm"])]
        scheduler: Option<String>,
        /// Slurm: GPUs to ask for (--gres=GRES:N).
        #[arg(long, requires = "scheduler")]
        gpus: Option<u32>,
        /// Slurm: the time limit (90, 2:00:00, 1-00:00:00).
        #[arg(long, requires = "scheduler")]
        time: Option<String>,
        /// Slurm: the partition.
        #[arg(long, requires = "scheduler")]
        partition: Option<String>,
        /// The command, after `--`; joined with spaces and run by bash.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
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

#[derive(Subcommand)]
// Parsed once per run: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum SandboxAction {
    /// Make one on HOST (a configured host, or `auto`: the idlest with
    /// --gpus free); prints its name, then what applies.
    Create {
        host: String,
        /// Its id (default: the host picks sbx-XXXX).
        #[arg(long)]
        id: Option<String>,
        /// Life: seconds, or 90s, 30m, 1h, 2d; at most 7 days.
        #[arg(long, default_value = "1h")]
        ttl: String,
        /// auto (the strongest the host has), bwrap, landlock or none.
        #[arg(long, default_value = "auto")]
        isolation: String,
        /// No network inside.
        #[arg(long)]
        no_network: bool,
        /// Memory cap, MiB.
        #[arg(long, value_name = "N")]
        memory_mb: Option<u64>,
        /// CPUs, fractions allowed.
        #[arg(long, value_name = "F")]
        cpus: Option<f64>,
        /// Most processes.
        #[arg(long, value_name = "N")]
        pids: Option<u32>,
        /// Disk cap of its files, MiB.
        #[arg(long, value_name = "N")]
        disk_mb: Option<u64>,
        /// GPUs leased for its whole life.
        #[arg(long, value_name = "N", default_value_t = 0)]
        gpus: u32,
        /// Set for every command in it (repeatable).
        #[arg(long, value_name = "K=V")]
        env: Vec<String>,
        /// Leave its files on the host when it ends.
        #[arg(long)]
        keep_files: bool,
        /// With --no-network: a name its commands may reach through a
        /// proxy (*.suffix, :port; repeatable).
        #[arg(long, value_name = "HOST")]
        allow_host: Vec<String>,
        /// Slurm cluster: the allocation's time limit (2:00:00, 1-00:00:00).
        #[arg(long, value_name = "TIME")]
        time: Option<String>,
        /// Slurm cluster: the partition (default: the cluster's).
        #[arg(long, value_name = "NAME")]
        partition: Option<String>,
    },
    /// NAME STATE EXPIRES ISOLATION WORK_DIR of each sandbox, live or
    /// recently ended, on every host (asked in parallel).
    List {
        /// Only on this host.
        host: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Make NAME expire TTL from now (seconds, or 90s, 30m, 1h, 2d).
    Renew {
        /// HOST/ID.
        name: String,
        ttl: String,
    },
    /// End NAME: kill its processes, remove its files (unless kept).
    Delete {
        /// HOST/ID.
        name: String,
    },
    /// Save NAME's work dir; prints the checkpoint, HOST/ID@N.
    Checkpoint {
        name: String,
        #[arg(long)]
        label: Option<String>,
    },
    /// NAME's checkpoints.
    Checkpoints { name: String },
    /// Put the work dir back as at CHECKPOINT (HOST/ID@N), or only PATHS.
    Restore {
        checkpoint: String,
        paths: Vec<String>,
    },
    /// What changed since CHECKPOINT (HOST/ID@N).
    Diff { checkpoint: String },
    /// A new sandbox with NAME's settings and a copy of its work dir.
    Fork { name: String },
    /// Freeze every process of NAME.
    Pause {
        name: String,
        /// Its TTL waits too.
        #[arg(long)]
        stop_clock: bool,
    },
    /// Thaw a paused NAME.
    Resume { name: String },
    /// Serve PORT of NAME's loopback here until interrupted; prints the URL.
    Expose { name: String, port: u16 },
}

pub async fn run(cli: Cli) -> Result<ExitCode> {
    let fleet = match Config::load().and_then(Fleet::try_new) {
        Ok(fleet) => Arc::new(fleet),
        // An MCP server serves anyway and answers every call with the
        // problem, which the client then shows; the CLI stops here.
        Err(e) if matches!(cli.command, Command::Mcp { http: None, .. }) => {
            let problem = format!("{e:#}");
            eprintln!("outpost: {problem}; serving MCP only to say so");
            Arc::new(Fleet::unusable(problem)?)
        }
        Err(e) => return Err(e),
    };
    // No agent, no host: said at once (exit 1), not as an unreachable host
    // (255) after a connect; `outpost mcp` serves and says it where it can.
    if let Some(missing) = &fleet.agent_missing {
        match cli.command {
            Command::Mcp { .. } => eprintln!("outpost: {missing}"),
            Command::Audit { .. } | Command::Auth { .. } => {}
            _ => anyhow::bail!("{missing}"),
        }
    }
    match cli.command {
        Command::Mcp {
            http: Some(addr),
            public_url,
        } => {
            mcp::http::serve_http(fleet, addr, public_url).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Mcp { http: None, .. } => {
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
        Command::Hosts { resources, json } => hosts::hosts(&fleet, resources, json).await,
        Command::Exec {
            host,
            cwd,
            timeout,
            no_stdin,
            command,
        } => exec::exec(&fleet, host, cwd, timeout, no_stdin, command).await,
        Command::Code {
            args,
            context,
            language,
            timeout,
            restart,
            list,
            control,
            save_images,
        } => {
            let args = code::CodeArgs {
                args,
                context,
                language,
                timeout,
                restart,
                list,
                control,
                save_images,
            };
            code::code(&fleet, args).await
        }
        Command::InstallPackage { args, timeout } => code::install(&fleet, args, timeout).await,
        Command::Diagnose { host } => hosts::diagnose(&fleet, host).await,
        Command::Jobs {
            host,
            state,
            limit,
            action,
        } => {
            let action = action.unwrap_or(JobsAction::List { host, state, limit });
            jobs::jobs_cli(&fleet, action).await
        }
        Command::Watch { sandboxes } => watch::watch(fleet, sandboxes).await,
        Command::Audit { tail, json } => audit::audit(&fleet, tail, json),
        Command::Auth { action } => auth::auth(&fleet, action),
        Command::Attach {
            terminal,
            sandbox,
            command,
        } => attach::attach(&fleet, terminal, sandbox, command).await,
        Command::Sandbox { action } => sandbox::sandbox_cli(&fleet, action).await,
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
                only: None,
            };
            sync::sync(&fleet, &source, &target, options).await
        }
    }
}
