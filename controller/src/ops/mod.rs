//! Operations: what a tool call or a command does, written once for both
//! front ends (`mcp/` and the CLI), on top of the fleet, its sessions and
//! the sync engine.
//!
//! * [`exec`]: an exec request from its parameters, the exit status a
//!   shell would report for its result, and a fan-out's outcomes grouped.
//! * [`jobs`]: background jobs on a host (start, status, wait, logs, events).
//! * [`events`]: job event followers, the config file's hooks, reachability
//!   alerts.
//! * [`files`]: syncs inline or in the background, remote listing, reading
//!   and writing.
//! * [`transfers`]: background syncs polled by task id.
//! * [`localpath`]: the local paths the file tools may touch, inside their
//!   roots.
//! * [`audit`]: one JSON line per MCP tool call.

pub mod audit;
pub mod events;
pub mod exec;
pub mod files;
pub mod jobs;
pub mod localpath;
pub mod transfers;
