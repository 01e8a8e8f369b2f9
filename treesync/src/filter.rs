//! Excludes in gitignore syntax.
//!
//! Two sources of patterns, checked in this order:
//!
//! 1. The caller's `excludes`, matched against the path relative to the root
//!    (a leading `/` anchors a pattern at the root). They are absolute: a
//!    `.gitignore` inside the tree cannot re-include what they exclude, so a
//!    project cannot opt back into, say, `node_modules/` behind the user's back.
//!    A `!pattern` among the excludes only re-includes what an earlier exclude
//!    pattern excluded.
//! 2. With `use_gitignore`, every `.gitignore` from the root down to the
//!    path's directory, the deepest deciding first, as git does.
//!
//! Names starting with [`TEMP_PREFIX`] are always excluded, and so is every
//! path below an excluded directory.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use outpost_protocol::FilterSpec;

use crate::{relpath, sys};

/// remote-sandbox-mcp's default excludes.
pub const DEFAULT_EXCLUDES: &[&str] = &[
    ".git/",
    ".idea/",
    ".vscode/",
    "__pycache__/",
    "*.pyc",
    "node_modules/",
];

/// Prefix of Outpost's temporary files; never listed, never synced.
pub const TEMP_PREFIX: &str = ".outpost-";

/// `.gitignore` files larger than this are not read (a generated multi-megabyte
/// file is more likely a mistake than a list of patterns).
const MAX_GITIGNORE_LEN: u64 = 4 << 20;

/// A compiled filter for one root.
pub struct Filter {
    root: PathBuf,
    excludes: Gitignore,
    use_gitignore: bool,
    /// Directory (relative path) → its `.gitignore`, read on first use. Both
    /// ends may check paths from several threads, hence the lock.
    gitignores: Mutex<HashMap<Vec<u8>, Option<Arc<Gitignore>>>>,
}

impl Filter {
    /// Compiles `spec` for `root`; a bad pattern is an error naming it.
    pub fn new(root: &Path, spec: &FilterSpec) -> Result<Filter, String> {
        // Matchers are built on a root of `/` and always given paths relative
        // to their own directory: the crate strips a matcher's root from any
        // path that starts with it, and a relative scan root such as `src`
        // would then wrongly strip the first component of `src/main.rs`.
        let mut builder = GitignoreBuilder::new("/");
        for pattern in &spec.excludes {
            check_pattern(pattern)?;
            builder
                .add_line(None, pattern)
                .map_err(|err| format!("bad exclude pattern {pattern:?}: {err}"))?;
        }
        let excludes = builder
            .build()
            .map_err(|err| format!("bad exclude patterns: {err}"))?;
        Ok(Filter {
            root: root.to_path_buf(),
            excludes,
            use_gitignore: spec.use_gitignore,
            gitignores: Mutex::new(HashMap::new()),
        })
    }

    /// Whether the relative path (of a directory when `is_dir`) is excluded.
    ///
    /// A path below an excluded directory is excluded too.
    pub fn excluded(&self, rel: &[u8], is_dir: bool) -> bool {
        let mut end = 0;
        while let Some(i) = rel[end..].iter().position(|&b| b == b'/') {
            let dir = &rel[..end + i];
            if self.excluded_leaf(dir, true) {
                return true;
            }
            end += i + 1;
        }
        self.excluded_leaf(rel, is_dir)
    }

    /// Like [`Filter::excluded`], for a path whose parent directories are
    /// known not to be excluded (a walk that does not enter excluded
    /// directories).
    pub(crate) fn excluded_leaf(&self, rel: &[u8], is_dir: bool) -> bool {
        if rel.is_empty() {
            return false;
        }
        if relpath::file_name(rel).starts_with(TEMP_PREFIX.as_bytes()) {
            return true;
        }
        if let Match::Ignore(_) = self.excludes.matched(sys::path_of(rel), is_dir) {
            return true;
        }
        if !self.use_gitignore {
            return false;
        }
        // The deepest .gitignore with an opinion decides.
        let mut dir = relpath::parent(rel);
        loop {
            if let Some(gi) = self.gitignore_of(dir) {
                let below = if dir.is_empty() {
                    rel
                } else {
                    &rel[dir.len() + 1..]
                };
                match gi.matched(sys::path_of(below), is_dir) {
                    Match::Ignore(_) => return true,
                    Match::Whitelist(_) => return false,
                    Match::None => {}
                }
            }
            if dir.is_empty() {
                return false;
            }
            dir = relpath::parent(dir);
        }
    }

    fn gitignore_of(&self, dir: &[u8]) -> Option<Arc<Gitignore>> {
        let mut cache = self.gitignores.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = cache.get(dir) {
            return found.clone();
        }
        let loaded = self.load_gitignore(dir).map(Arc::new);
        cache.insert(dir.to_vec(), loaded.clone());
        loaded
    }

    /// Reads `<dir>/.gitignore`. A missing, unreadable or symlinked file
    /// counts as absent (git itself refuses symlinked `.gitignore`s); lines
    /// that are not UTF-8 or not valid patterns are skipped.
    fn load_gitignore(&self, dir: &[u8]) -> Option<Gitignore> {
        let path = if dir.is_empty() {
            self.root.join(".gitignore")
        } else {
            self.root.join(sys::path_of(dir)).join(".gitignore")
        };
        let fd = sys::open_path(
            &path,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            0,
        )
        .ok()?;
        let st = sys::fstat(std::os::fd::AsFd::as_fd(&fd)).ok()?;
        if !st.is_file() {
            return None;
        }
        let mut text = Vec::new();
        std::fs::File::from(fd)
            .take(MAX_GITIGNORE_LEN)
            .read_to_end(&mut text)
            .ok()?;
        let mut builder = GitignoreBuilder::new("/");
        let text = text.strip_prefix("\u{feff}".as_bytes()).unwrap_or(&text);
        for line in text.split(|&b| b == b'\n') {
            if let Ok(line) = std::str::from_utf8(line) {
                let _ =
                    builder.add_line(Some(path.clone()), line.strip_suffix('\r').unwrap_or(line));
            }
        }
        builder.build().ok().filter(|gi| !gi.is_empty())
    }
}

/// Refuses one of the caller's patterns that the gitignore parser would take
/// as something else than was meant: it reads an unclosed `[` as a literal
/// and a leading `#` as a comment, so the pattern would silently match
/// nothing the caller expects. (A `.gitignore` inside the tree keeps git's
/// leniency.)
fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern.starts_with('#') {
        return Err(format!(
            "bad exclude pattern {pattern:?}: a leading # makes it a comment; write \\# to exclude names that start with #"
        ));
    }
    let glob = pattern.strip_prefix('!').unwrap_or(pattern);
    globset::GlobBuilder::new(glob)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(drop)
        .map_err(|err| format!("bad exclude pattern {pattern:?}: {err}"))
}

/// `name` as a gitignore pattern that matches it literally (trailing
/// spaces too, which gitignore would otherwise drop).
pub fn escape(name: &str) -> String {
    let kept = name.trim_end_matches(' ').len();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.char_indices() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '!' | '#') || i >= kept {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Reads an exclude file: one gitignore pattern per line.
///
/// Blank lines and `#` comments are skipped; a trailing `\r` is dropped.
pub fn read_exclude_file(path: &Path) -> Result<Vec<String>, String> {
    let bytes =
        std::fs::read(path).map_err(|err| format!("cannot read {}: {err}", path.display()))?;
    let text = String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8", path.display()))?;
    Ok(text
        .lines()
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(str::to_string)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    fn spec(excludes: &[&str], use_gitignore: bool) -> FilterSpec {
        FilterSpec {
            excludes: excludes.iter().map(|s| s.to_string()).collect(),
            use_gitignore,
        }
    }

    #[test]
    fn excludes_and_subtrees() {
        let f = Filter::new(Path::new("src"), &spec(DEFAULT_EXCLUDES, false)).unwrap();
        assert!(f.excluded(b".git", true));
        assert!(
            !f.excluded(b".git", false),
            "dir-only pattern matched a file"
        );
        assert!(f.excluded(b".git/config", false));
        assert!(f.excluded(b"a/node_modules/x/y.js", false));
        assert!(f.excluded(b"pkg/m.pyc", false));
        assert!(!f.excluded(b"src/main.rs", false));
        assert!(f.excluded(b"a/.outpost-123.tmp", false));
        assert!(f.excluded(b".outpost-part-1.tmp", false));
    }

    #[test]
    fn escaped_names_match_only_themselves() {
        for name in ["a*b[1]?.py", "#notes", "!x", "trail  "] {
            let only = [String::from("/*"), format!("!/{}", escape(name))];
            let only: Vec<&str> = only.iter().map(String::as_str).collect();
            let f = Filter::new(Path::new("/x"), &spec(&only, false)).unwrap();
            assert!(!f.excluded(name.as_bytes(), false), "{name:?} excluded");
            assert!(f.excluded(b"ab1.py", false), "{name:?} let another in");
        }
    }

    #[test]
    fn anchored_and_negated() {
        let f = Filter::new(
            Path::new("/x"),
            &spec(&["/build", "*.log", "!keep.log"], false),
        )
        .unwrap();
        assert!(f.excluded(b"build", true));
        assert!(!f.excluded(b"sub/build", true));
        assert!(f.excluded(b"a.log", false));
        assert!(!f.excluded(b"keep.log", false));
    }

    #[test]
    fn bad_pattern_is_an_error() {
        // Each is refused with an error that names it; the gitignore parser
        // alone takes an unclosed `[` literally and `#…` as a comment.
        for bad in [
            "a{b", "[", "src/[abc", "![", "*.[ch", "#notes", "a\\", "[z-a]",
        ] {
            let err = Filter::new(Path::new("/x"), &spec(&["*.o", bad], false))
                .err()
                .unwrap_or_else(|| panic!("{bad:?} was accepted"));
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
        // Escapes and classes that close are fine.
        for good in [
            "\\#notes",
            "\\[x",
            "[[]x",
            "*.[ch]",
            "!keep.[ch]",
            "a/**/b",
            "/build/",
        ] {
            assert!(
                Filter::new(Path::new("/x"), &spec(&[good], false)).is_ok(),
                "{good:?} was refused"
            );
        }
        let f = Filter::new(Path::new("/x"), &spec(&["\\#notes", "\\[x"], false)).unwrap();
        assert!(f.excluded(b"#notes", false));
        assert!(f.excluded(b"[x", false));
    }

    #[test]
    fn nested_gitignores() {
        let t = TempDir::new();
        std::fs::write(t.path().join(".gitignore"), "*.tmp\n/out/\n").unwrap();
        std::fs::create_dir_all(t.path().join("sub/out")).unwrap();
        std::fs::write(t.path().join("sub/.gitignore"), "!keep.tmp\nlocal\n").unwrap();
        let f = Filter::new(t.path(), &spec(&[], true)).unwrap();
        assert!(f.excluded(b"x.tmp", false));
        assert!(f.excluded(b"sub/x.tmp", false));
        assert!(!f.excluded(b"sub/keep.tmp", false));
        assert!(f.excluded(b"keep.tmp", false), "nested rule leaked upwards");
        assert!(f.excluded(b"out", true));
        assert!(!f.excluded(b"sub/out", true), "anchored rule matched below");
        assert!(f.excluded(b"sub/local", false));
        assert!(!f.excluded(b"local", false));
        let off = Filter::new(t.path(), &spec(&[], false)).unwrap();
        assert!(!off.excluded(b"x.tmp", false));
    }

    #[test]
    fn exclude_file() {
        let t = TempDir::new();
        let p = t.path().join("ex");
        std::fs::write(&p, "# comment\n\n*.o\r\n  \nbuild/\n").unwrap();
        assert_eq!(read_exclude_file(&p).unwrap(), vec!["*.o", "build/"]);
        assert!(read_exclude_file(&t.path().join("missing")).is_err());
    }
}
