//! Outpost's controller: turns a user's own Linux machines into sandboxes for AI
//! agents (over MCP) and for people (over the `outpost` CLI).
//!
//! A tool call flows one way, one layer per folder, each importing only the
//! layers below it:
//!
//! ```text
//! mcp/ (and the binary's cli/)  →  ops/  →  sync/, fleet  →  session  →  host/  →  outpost-agent
//! ```
//!
//! * [`mcp`]: the MCP server: one module per area of tools, resources,
//!   prompts; every message answered ([`mcp::linelimit`]).
//! * [`ops`]: what a tool or a command does, written once for both front
//!   ends: exec, jobs and their events, code contexts, files and
//!   transfers, local paths, the audit log.
//! * [`sync`]: tree sync in both directions, remote file reads and writes.
//! * [`fleet`]: the sandboxes, the active one, concurrent queries, placement.
//! * [`resources`]: host metrics as clients see them, idle score, requirements.
//! * [`session`]: one connection per sandbox, requests multiplexed by id,
//!   heartbeats, reconnect on the next call, never a re-sent request.
//! * [`host`]: places an agent can be started (SSH via russh, the local
//!   machine) behind one trait; bootstrap (probe, pick the agent build that
//!   fits, install it when missing or corrupt, verify its hello) and the
//!   frames off the link, written once over it.
//! * [`config`]: sandboxes from remote-sandbox-mcp's environment variables, a
//!   TOML file and `~/.ssh/config`; the zero-config `local` sandbox. Plain
//!   data: it imports nothing from this crate.
//! * [`policy`]: which commands may run where (deny, allow, confirm rules from
//!   the config file), for the MCP exec and code tools, `outpost exec` and
//!   `outpost code`.

pub mod config;
pub mod fleet;
pub mod host;
pub mod mcp;
pub mod ops;
pub mod policy;
pub mod resources;
pub mod session;
pub mod sync;
