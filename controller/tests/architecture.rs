//! The controller's architecture invariants (ARCHITECTURE.md), checked on
//! its source: which module may name which. Test code (`tests.rs` files and
//! what follows `#[cfg(test)]`) is left out: tests may reach anywhere.

mod layers;

use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn module(path: &Path) -> String {
    layers::module(&src(), path)
}

fn offenders(allowed: impl Fn(&Path) -> bool, needle: &str) -> Vec<String> {
    layers::sources(&src())
        .into_iter()
        .filter(|(path, code)| !allowed(path) && code.contains(needle))
        .map(|(path, _)| path.display().to_string())
        .collect()
}

#[test]
fn only_mcp_knows_rmcp() {
    let bad = offenders(|p| module(p) == "mcp", "rmcp::");
    assert!(bad.is_empty(), "rmcp named outside mcp/: {bad:?}");
}

#[test]
fn only_host_ssh_knows_russh() {
    let ssh = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/host/ssh");
    let bad = offenders(|p| p.starts_with(&ssh), "russh");
    assert!(bad.is_empty(), "russh named outside host/ssh/: {bad:?}");
}

/// Layers, top down; a module may use those below it and never one above:
/// the tools (`mcp`, the binary's `cli`) over the operations (`ops`), over
/// the fleet, over the resource probes, syncs and sessions, over hosts,
/// over the policy, over the configuration, which uses nothing of the
/// crate.
#[test]
fn every_module_uses_only_the_layers_below_it() {
    let layers: &[&[&str]] = &[
        &["mcp", "cli", "main", "lib"],
        &["ops"],
        &["fleet"],
        &["resources"],
        &["sync"],
        &["session"],
        &["host"],
        &["policy"],
        &["config"],
    ];
    let bad = layers::arrows_up(&src(), layers);
    assert!(bad.is_empty(), "arrows running up:\n{}", bad.join("\n"));
}

/// The checker itself: grouped imports count, nested names do not.
#[test]
fn the_layer_check_reads_grouped_imports() {
    let used = layers::used_modules("use crate::{a, b::{c, d}};\nlet x = crate::e::f();");
    assert_eq!(used.into_iter().collect::<Vec<_>>(), ["a", "b", "e"]);
}
