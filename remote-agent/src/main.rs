//! `outpost-agent`: Outpost's helper on each host.
//!
//! The controller uploads this binary and runs `outpost-agent serve` over one
//! SSH exec channel (or as a local child); the two then speak the framed
//! protocol of `outpost-protocol` on stdin/stdout. The agent exists so that
//! commands get real timeouts (whole process trees killed), bounded output
//! capture, concurrency on one connection, host metrics, GPU leases and the
//! host side of file sync.
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
mod identity;
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
