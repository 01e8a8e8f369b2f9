//! The check behind each crate's layer test: which top-level module of a
//! crate's `src/` names which, read from its production source. Test code
//! (`tests.rs` files, `tests/` folders and what follows `#[cfg(test)]`) and
//! comments are left out: they may name anything.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Every production source file under `src`, with its code (comments out).
pub fn sources(src: &Path) -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "tests") {
                    walk(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs")
                && path.file_name().is_some_and(|n| n != "tests.rs")
            {
                let text = std::fs::read_to_string(&path).unwrap();
                let production = match text.find("#[cfg(test)]") {
                    Some(at) => &text[..at],
                    None => &text,
                };
                let code: Vec<&str> = production
                    .lines()
                    .filter(|l| !l.trim_start().starts_with("//"))
                    .collect();
                out.push((path, code.join("\n")));
            }
        }
    }
    let mut out = Vec::new();
    walk(src, &mut out);
    out
}

/// The module a file belongs to: its first path component under `src`.
pub fn module(src: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(src).unwrap();
    let first = rel.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_string()
}

fn ident(text: &str) -> String {
    text.trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The crate's modules `code` names: `crate::a::…` and each name directly
/// inside `crate::{a, b::c, …}`.
pub fn used_modules(code: &str) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for after in code.split("crate::").skip(1) {
        let Some(group) = after.strip_prefix('{') else {
            used.insert(ident(after));
            continue;
        };
        let mut depth = 1;
        let mut start = true;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 1 => break,
                '}' => depth -= 1,
                ',' if depth == 1 => start = true,
                c if start && depth == 1 && !c.is_whitespace() => {
                    used.insert(ident(&group[i..]));
                    start = false;
                }
                _ => {}
            }
        }
    }
    used.remove("");
    used
}

/// Each use of a module in the same layer or one above, as `file uses
/// crate::name`; layers are given top down. Panics on a module in no layer.
pub fn arrows_up(src: &Path, layers: &[&[&str]]) -> Vec<String> {
    let layer_of = |m: &str| layers.iter().position(|l| l.contains(&m));
    let files = sources(src);
    assert!(files.len() > 20, "found only {} source files", files.len());
    let mut bad = Vec::new();
    for (path, code) in files {
        let own = module(src, &path);
        let Some(own_layer) = layer_of(&own) else {
            panic!("{} is in no layer: add {own} to the test", path.display());
        };
        for name in used_modules(&code) {
            if name != own && layer_of(&name).is_some_and(|l| l <= own_layer) {
                bad.push(format!("{} uses crate::{name}", path.display()));
            }
        }
    }
    bad.sort();
    bad.dedup();
    bad
}
