//! Helpers shared by the unit tests.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A directory under the system's temp dir, removed (with everything in it)
/// when dropped.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new() -> TempDir {
        let path =
            std::env::temp_dir().join(format!("treesync-test-{:016x}", crate::sys::random_u64()));
        std::fs::create_dir(&path).unwrap();
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A directory on a filesystem that shares extents (`FICLONE`), from
/// `OUTPOST_TEST_REFLINK_DIR` (scripts/test mounts an XFS there). Without
/// one a test of that sharing says so, and fails under CI.
pub fn reflink_dir() -> Option<PathBuf> {
    match std::env::var_os("OUTPOST_TEST_REFLINK_DIR") {
        Some(dir) => Some(PathBuf::from(dir)),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!(
                "OUTPOST_TEST_REFLINK_DIR is not set: run the tests through scripts/test, which mounts an XFS for it"
            )
        }
        None => {
            eprintln!("no OUTPOST_TEST_REFLINK_DIR: copy-on-write left untested");
            None
        }
    }
}

/// Deterministic incompressible bytes (xorshift), so tests need no RNG crate.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Each entry under `root` by relative path: a directory's mode, a file's
/// mode and bytes, a symlink's target; "special" for anything else.
pub fn describe_tree(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in walk(root) {
        let rel = entry.strip_prefix(root).unwrap().display().to_string();
        let meta = std::fs::symlink_metadata(&entry).unwrap();
        let what = if meta.is_symlink() {
            format!("-> {}", std::fs::read_link(&entry).unwrap().display())
        } else if meta.is_dir() {
            format!("dir {:o}", meta.permissions().mode() & 0o7777)
        } else if !meta.is_file() {
            "special".to_string()
        } else {
            format!(
                "{:o} {:?}",
                meta.permissions().mode() & 0o7777,
                std::fs::read(&entry).unwrap()
            )
        };
        out.insert(rel, what);
    }
    out
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        out.push(e.path());
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        }
    }
    out
}
