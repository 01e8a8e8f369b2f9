//! Outpost's controller: turns a user's own Linux machines into sandboxes for AI
//! agents (over MCP) and for people (over the `outpost` CLI).
//!
//! A tool call flows one way, each step in its own module:
//!
//! ```text
//! mcp / cli  →  fleet  →  session  →  (protocol)  →  host  →  outpost-agent
//! ```
//!
//! * [`config`]: sandboxes from remote-sandbox-mcp's environment variables, a TOML
//!   file and `~/.ssh/config`; the zero-config `local` sandbox.
//! * [`fleet`]: the sandboxes, the active one, concurrent queries, placement.
//! * [`resources`]: host metrics as clients see them, idle score, requirements.
//! * [`session`]: one connection per sandbox, requests multiplexed by id,
//!   heartbeats, reconnect on the next call, never a re-sent request.
//! * [`sync`]: tree sync in both directions, remote file reads and writes.
//! * [`transfers`]: background syncs polled by task id.
//! * [`jobs`]: background jobs on a host (start, status, wait, logs, events).
//! * [`watch`]: job event followers, the config file's hooks, reachability
//!   alerts (`outpost watch`, and `outpost mcp` for the sandboxes it uses).
//! * [`host`]: places an agent can be started (SSH via russh, the local
//!   machine) behind one trait; bootstrap (probe, pick the agent build that
//!   fits, install it when missing or corrupt, verify its hello) and the
//!   frames off the link, written once over it.
//! * [`files`]: the file tools behind MCP (sync inline or background, list,
//!   read, write).
//! * [`mcp`]: the MCP tools, resources and prompts.
//! * [`policy`]: which commands may run where (deny, allow, confirm rules from
//!   the config file), for the MCP exec tools and `outpost exec`.
//! * [`audit`]: one JSON line per MCP tool call in `$OUTPOST_HOME/audit.jsonl`.
//! * [`localpath`]: the local paths the file tools may touch, inside their roots.
//! * [`linelimit`]: every MCP message answered, even one too large to read.

pub mod config;
pub mod fleet;
pub mod host;
pub mod linelimit;
pub mod mcp;
pub mod ops;
pub mod policy;
pub mod resources;
pub mod session;
pub mod sync;
