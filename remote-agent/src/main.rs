//! `outpost-agent`: Outpost's helper on each host.
//!
//! The controller uploads this binary and runs `outpost-agent serve` over one
//! SSH exec channel (or as a local child); the two then speak the framed
//! protocol of `outpost-protocol` on stdin/stdout. The agent exists so that
//! commands get real timeouts (whole process trees killed), bounded output
//! capture, concurrency on one connection, host metrics, GPU leases, the
//! host side of file sync, and background jobs that outlive the connection
//! (`daemon` and `shim` are the processes behind those; see [`jobs`]).
//!
//! Arguments are parsed by hand to keep the binary small. Logs and diagnostics
//! go to stderr only: in `serve` mode stdout carries protocol bytes and nothing
//! else.

mod capture;
mod cleanup;
mod diagnose;
mod exec;
mod files;
mod gpu;
mod guard;
mod identity;
mod jobs;
mod leases;
mod metrics;
mod outbox;
mod paths;
mod proctree;
mod serve;

use std::process::ExitCode;

const USAGE: &str = "\
Usage: outpost-agent <command>

Outpost's host helper. It is started by the Outpost controller; people mostly
need `diagnose`.

Commands:
  serve       Speak the Outpost protocol on stdin/stdout
  diagnose    Print a report about this host and the agent's state
  daemon      Start the per-user job daemon (serve does this on demand)
  shim <dir>  Supervise one background job (the daemon starts these)
  --version   Print the version and build hash
  --help      Print this help
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let code = match args.as_slice() {
        ["serve"] => {
            let code = serve::run();
            // Exit right away: the blocking stdin reader must not be joined.
            std::process::exit(code);
        }
        ["diagnose"] => diagnose::run(),
        ["daemon"] => jobs::daemon::main(jobs::client::STARTED_BY_FORK),
        ["daemon", "--started-by", how] => jobs::daemon::main(how),
        ["shim", dir] => jobs::shim::run(std::path::Path::new(dir), false),
        ["shim", dir, "--resume"] => jobs::shim::run(std::path::Path::new(dir), true),
        // Not in the usage: only `serve` starts it, with a pipe on stdin.
        ["guard"] => guard::main(),
        ["--version" | "-V" | "version"] => {
            println!("{}", identity::version_line());
            0
        }
        ["--help" | "-h" | "help"] => {
            print!("{USAGE}");
            0
        }
        _ => {
            eprint!("{USAGE}");
            2
        }
    };
    ExitCode::from(code as u8)
}
