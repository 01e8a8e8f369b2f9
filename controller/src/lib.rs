//! Outpost's controller: turns a user's own Linux machines into sandboxes for AI
//! agents (over MCP) and for people (over the `outpost` CLI).
//!
//! A tool call flows one way, each step in its own module:
//!
//! ```text
//! mcp / cli  →  fleet  →  session  →  (protocol)  →  transport  →  outpost-agent
//! ```
//!
//! * [`config`]: sandboxes from remote-sandbox-mcp's environment variables, a TOML
//!   file and `~/.ssh/config`; the zero-config `local` sandbox.
//! * [`fleet`]: the sandboxes, the active one, concurrent queries, placement.
//! * [`resources`]: host metrics as clients see them, idle score, requirements.
//! * [`session`]: one connection per sandbox, requests multiplexed by id,
//!   heartbeats, reconnect on the next call, never a re-sent request.
//! * [`bootstrap`]: probe a host, pick the agent build that fits, install it over
//!   SFTP when missing or corrupt, verify its hello.
//! * [`sync`]: tree sync in both directions, remote file reads and writes.
//! * [`transfers`]: background syncs polled by task id.
//! * [`jobs`]: background jobs on a host (start, status, wait, logs, events).
//! * [`watch`]: job event followers, the config file's hooks, reachability
//!   alerts (`outpost watch`, and `outpost mcp` for the sandboxes it uses).
//! * [`transport`]: SSH via russh (host keys, auth, keepalive) or a local child.
//! * [`link`]: frames off a transport: preamble, hello, messages.
//! * [`files`]: the file tools behind MCP (sync inline or background, list,
//!   read, write).
//! * [`mcp`]: the MCP tools, resources and prompts.
//! * [`policy`]: which commands may run where (deny, allow, confirm rules from
//!   the config file), for the MCP exec tools and `outpost exec`.
//! * [`audit`]: one JSON line per MCP tool call in `$OUTPOST_HOME/audit.jsonl`.

pub mod audit;
pub mod config;
pub mod files;
pub mod fleet;
pub mod host;
pub mod jobs;
pub mod linelimit;
pub mod localpath;
pub mod mcp;
pub mod policy;
pub mod resources;
pub mod session;
pub mod sync;
pub mod transfers;
pub mod watch;
