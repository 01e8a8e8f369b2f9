//! The controller's architecture invariants (ARCHITECTURE.md), checked on
//! its source: which module may name which. Test code (`tests.rs` files and
//! what follows `#[cfg(test)]`) is left out: tests may reach anywhere.

use std::path::{Path, PathBuf};

/// Every production source file under `src/`, with its text.
fn sources() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs")
                && path.file_name().is_some_and(|n| n != "tests.rs")
            {
                let text = std::fs::read_to_string(&path).unwrap();
                let production = match text.find("#[cfg(test)]") {
                    Some(at) => text[..at].to_string(),
                    None => text,
                };
                // Comments may name anything.
                let code: Vec<&str> = production
                    .lines()
                    .filter(|l| !l.trim_start().starts_with("//"))
                    .collect();
                out.push((path, code.join("\n")));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    walk(&root, &mut out);
    assert!(out.len() > 50, "found only {} source files", out.len());
    out
}

/// The module a file belongs to: its first path component under `src/`.
fn module(path: &Path) -> String {
    let rel = path
        .strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
        .unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

fn offenders(allowed: impl Fn(&Path) -> bool, needle: &str) -> Vec<String> {
    sources()
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
    let layer_of = |m: &str| layers.iter().position(|l| l.contains(&m));
    let mut bad = Vec::new();
    for (path, code) in sources() {
        let own = module(&path);
        let Some(own_layer) = layer_of(&own) else {
            panic!("{} is in no layer: add {own} to this test", path.display());
        };
        for used in code.split("crate::").skip(1) {
            let name: String = used
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name == own {
                continue;
            }
            match layer_of(&name) {
                Some(l) if l <= own_layer => {
                    bad.push(format!("{} uses crate::{name}", path.display()))
                }
                _ => {}
            }
        }
    }
    bad.sort();
    bad.dedup();
    assert!(bad.is_empty(), "arrows running up:\n{}", bad.join("\n"));
}
