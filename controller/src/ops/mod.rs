//! Operations: what a tool call or a command does, written once for both
//! front ends (`mcp/` and the CLI), on top of the fleet, its sessions and
//! the sync engine.
//!
//! * [`exec`]: an exec request from its parameters, the exit status a
//!   shell would report for its result, and a fan-out's outcomes grouped.
//! * [`jobs`]: background jobs on a host (start, status, wait, logs, events).
//! * [`slurm_jobs`]: Slurm batch jobs as background tasks (`slurm-<jobid>`),
//!   submitted and followed through a login node's shell.
//! * [`events`]: job event followers, the config file's hooks, reachability
//!   alerts.
//! * [`files`]: syncs inline or in the background, remote listing, reading
//!   and writing.
//! * [`transfers`]: background syncs polled by task id.
//! * [`sandboxes`]: isolated sandboxes on a host (create, status, renew,
//!   delete, list), named `HOST/ID`.
//! * [`code`]: code contexts (interpreters that keep their state between
//!   runs), package installs for them, and one-shot runs in a sandbox made
//!   for them.
//! * [`localpath`]: the local paths the file tools may touch, inside their
//!   roots.
//! * [`audit`]: one JSON line per MCP tool call.
//! * [`grants`]: the OAuth clients and grants the HTTP server's
//!   authorization server keeps, and `outpost auth` shows and revokes.

pub mod audit;
pub mod checkpoints;
pub mod code;
pub mod events;
pub mod exec;
pub mod files;
pub mod grants;
pub mod jobs;
pub mod localpath;
pub mod ports;
pub mod sandboxes;
pub mod slurm;
pub mod slurm_jobs;
pub mod terminals;
pub mod transfers;

/// Bytes for people: "512 B", "3.4 KiB", "12.0 MiB", "1.5 GiB".
pub fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}
