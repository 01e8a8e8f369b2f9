//! The agent's architecture invariants (ARCHITECTURE.md), checked on its
//! source: which module may name which.

#[path = "../../controller/tests/layers/mod.rs"]
mod layers;

use std::path::Path;

/// Layers, top down; a module may use those below it and never one beside
/// or above it. The session (`serve`) over the hand-over and the report,
/// over the per-user daemon, over its services (jobs, code contexts), over
/// the exec path, over the running command, over its supervisor (which
/// starts commands into sandboxes), over sandboxes, over what a command or
/// request needs (files, metrics, leases, the guard), over the primitives
/// (accounts, GPUs, state files, capture), over paths, process trees and
/// locks, which use nothing of the crate.
#[test]
fn every_module_uses_only_the_layers_below_it() {
    let layers: &[&[&str]] = &[
        &["main", "lib"],
        &["serve"],
        &["handover", "diagnose"],
        &["daemon"],
        &["jobs"],
        &["code", "terminals"],
        &["exec"],
        &["running"],
        &["supervisor"],
        &["sandbox"],
        &[
            "files",
            "metrics",
            "leases",
            "guard",
            "cleanup",
            "socket_dir",
        ],
        &[
            "account",
            "gpu",
            "statefile",
            "capture",
            "outbox",
            "heap",
            "identity",
        ],
        &["paths", "proctree", "flock"],
    ];
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let bad = layers::arrows_up(&src, layers);
    assert!(bad.is_empty(), "arrows running up:\n{}", bad.join("\n"));
}

/// Only the protocol crate is shared with the controller: the agent links
/// no SSH or MCP library.
#[test]
fn the_agent_knows_neither_ssh_nor_mcp() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for (path, code) in layers::sources(&src) {
        for needle in ["russh", "rmcp", "outpost::"] {
            assert!(!code.contains(needle), "{} names {needle}", path.display());
        }
    }
}
