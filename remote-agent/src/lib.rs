//! `outpost-agent`: Outpost's helper on each host.
//!
//! The controller uploads this crate's binary and runs `outpost-agent serve`
//! over one SSH exec channel (or as a local child); the two then speak the
//! framed protocol of `outpost-protocol` on stdin/stdout. The agent exists so
//! that commands get real timeouts (whole process trees killed), bounded
//! output capture, concurrency on one connection, host metrics, GPU leases,
//! the host side of file sync, and background jobs that outlive the
//! connection (`daemon` and `shim` are the processes behind those; see
//! `jobs`).
//!
//! The library holds everything; `main.rs` only parses arguments. Besides the
//! entry points of the binary's commands it offers [`serve::serve_on`], the
//! protocol session on any reader and writer, so a program can run an agent
//! in-process (the controller's tests do, over an in-memory pipe).
//!
//! Logs and diagnostics go to stderr only: in `serve` mode stdout carries
//! protocol bytes and nothing else.

mod account;
mod capture;
mod cleanup;
mod code;
mod daemon;
mod diagnose;
mod exec;
mod files;
mod flock;
mod gpu;
mod guard;
mod handover;
mod heap;
mod identity;
mod jobs;
mod leases;
mod metrics;
mod outbox;
mod paths;
mod proctree;
mod running;
mod sandbox;
pub mod serve;
mod socket_dir;
mod statefile;
mod supervisor;
mod terminals;

/// `outpost-agent diagnose`: prints a report about this host and the
/// agent's state; returns the exit code.
pub fn diagnose() -> i32 {
    diagnose::run()
}

/// `outpost-agent daemon`: the per-user job daemon. `started_by` says how
/// it was started (`None`: by a double fork).
/// `outpost-agent relay PORT`: inside a sandbox, one connection to an
/// exposed port (see `sandbox::ports`).
pub fn relay(port: u16) -> i32 {
    sandbox::ports::relay(port)
}

pub fn daemon(started_by: Option<&str>) -> i32 {
    daemon::main(started_by.unwrap_or(daemon::client::STARTED_BY_FORK))
}

/// `outpost-agent shim <dir>`: supervises one background job.
pub fn shim(dir: &std::path::Path, resume: bool) -> i32 {
    jobs::shim::run(dir, resume)
}

/// `outpost-agent shim --adopt <dir> <pid> <elapsed_ms>`: an exec's
/// supervisor turned into the shim of the job it became.
pub fn adopt(dir: &std::path::Path, pid: i32, elapsed_ms: u64) -> i32 {
    jobs::shim::adopt(dir, pid, elapsed_ms)
}

/// `outpost-agent keeper <dir> [--adopt]`: sets up and ends one sandbox.
pub fn keeper(dir: &std::path::Path, adopt: bool) -> i32 {
    sandbox::keeper::main(dir, adopt)
}

/// `outpost-agent enter <dir> <cwd> -- argv`: runs `argv` in a sandbox.
pub fn enter(dir: &std::path::Path, cwd: &std::path::Path, argv: &[String]) -> i32 {
    sandbox::enter::main(dir, cwd, argv)
}

/// `outpost-agent hold [--egress]`: keeps a bwrap sandbox open.
pub fn hold(egress: bool) -> i32 {
    sandbox::keeper::hold(egress)
}

/// `outpost-agent guard`: the watchdog `serve` starts with a pipe on stdin.
pub fn guard() -> i32 {
    guard::main()
}

/// `outpost-agent <version> (<first 12 hex digits of the build hash>)`.
pub fn version_line() -> String {
    identity::version_line()
}
