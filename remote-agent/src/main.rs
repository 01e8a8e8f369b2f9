//! `outpost-agent`: the command line over the `outpost_agent` library.
//!
//! Arguments are parsed by hand to keep the binary small. In `serve` mode
//! stdout carries protocol bytes and nothing else.

use std::path::Path;
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
  keeper <dir>
              Set up and end one sandbox (the daemon starts these)
  enter <dir> <cwd> -- PROGRAM [ARGS...]
              Run PROGRAM inside a sandbox
  --version   Print the version and build hash
  --help      Print this help
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let code = match args.as_slice() {
        ["serve"] => {
            let code = outpost_agent::serve::run();
            // Exit right away: the blocking stdin reader must not be joined.
            std::process::exit(code);
        }
        ["diagnose"] => outpost_agent::diagnose(),
        ["daemon"] => outpost_agent::daemon(None),
        ["daemon", "--started-by", how] => outpost_agent::daemon(Some(how)),
        ["shim", dir] => outpost_agent::shim(Path::new(dir), false),
        ["shim", dir, "--resume"] => outpost_agent::shim(Path::new(dir), true),
        // Not in the usage: an exec's supervisor becomes this (see supervisor/).
        ["shim", "--adopt", dir, pid, elapsed_ms] => match (pid.parse(), elapsed_ms.parse()) {
            (Ok(pid), Ok(elapsed_ms)) => outpost_agent::adopt(Path::new(dir), pid, elapsed_ms),
            _ => 2,
        },
        // Not in the usage: only `serve` starts it, with a pipe on stdin.
        ["guard"] => outpost_agent::guard(),
        ["keeper", dir] => outpost_agent::keeper(Path::new(dir), false),
        ["keeper", dir, "--adopt"] => outpost_agent::keeper(Path::new(dir), true),
        ["enter", dir, cwd, "--", argv @ ..] if !argv.is_empty() => {
            let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
            outpost_agent::enter(Path::new(dir), Path::new(cwd), &argv)
        }
        // Not in the usage: the keeper runs it inside a sandbox per
        // connection to an exposed port.
        ["relay", port] => match port.parse() {
            Ok(port) => outpost_agent::relay(port),
            Err(_) => 2,
        },
        // Not in the usage: the command bwrap runs to hold a sandbox open.
        ["hold"] => outpost_agent::hold(false),
        ["hold", "--egress"] => outpost_agent::hold(true),
        ["--version" | "-V" | "version"] => {
            println!("{}", outpost_agent::version_line());
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
