//! One file synced rather than a tree, as remote-sandbox-mcp syncs one: the
//! file goes into the target when that is a directory (or a path ending in
//! `/`), else becomes the target path, under its own name. The sync is the
//! tree sync of the two parent directories restricted to that one name
//! ([`SyncOptions::only`]), so a file keeps every guarantee a tree has: the
//! delta, the hash check, nothing partial at the final path.

use std::path::{Path, PathBuf};

use outpost_protocol::{FilterSpec, ScanRequest, TreeEntry};
use outpost_treesync::plan::Plan;

use super::remote::{scan_on, scan_request};
use super::types::SyncError;
use crate::session::ScopedConn;

/// What a path on the host is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteKind {
    Missing,
    Dir,
    /// A file, or anything else that is not a directory.
    Other,
}

/// Looks at `path` on the host without listing what it holds. No hashes:
/// a hashing scan would load, prune to what it saw (nothing) and rewrite
/// the root's stat cache, and the sync that follows would hash the whole
/// tree again.
pub(super) async fn remote_kind(conn: &ScopedConn, path: &str) -> Result<RemoteKind, SyncError> {
    let nothing = FilterSpec {
        excludes: vec!["*".into()],
        use_gitignore: false,
    };
    let request = ScanRequest {
        hashes: false,
        recursive: false,
        max_entries: 1,
        ..scan_request(conn, path, &nothing)
    };
    let (_, summary) = scan_on(conn, request).await?;
    if !summary.root_exists {
        return Ok(RemoteKind::Missing);
    }
    match summary.problems.iter().find(|p| p.path.is_empty()) {
        None => Ok(RemoteKind::Dir),
        // The scan's words for a root that is no directory.
        Some(p)
            if p.message == "not a directory"
                || p.message.ends_with(", not a file or directory") =>
        {
            Ok(RemoteKind::Other)
        }
        // Unreadable, say: not a file to sync instead.
        Some(p) => Err(SyncError::Invalid(format!("{path}: {}", p.message))),
    }
}

/// A local regular file's directory and name; None for a directory (a
/// symlink to one is a tree's root) or nothing. A symlink to a file is
/// refused: the sync of its directory would send the link, not the file.
pub(super) fn local_file(local: &Path) -> Result<Option<(PathBuf, String)>, SyncError> {
    let Ok(meta) = std::fs::metadata(local) else {
        return Ok(None);
    };
    if !meta.is_file() {
        return Ok(None);
    }
    if std::fs::symlink_metadata(local).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(SyncError::Invalid(format!(
            "{} is a symlink; give the path of the file it points to",
            local.display()
        )));
    }
    let (Some(dir), Some(name)) = (local.parent(), local.file_name().and_then(|n| n.to_str()))
    else {
        return Ok(None);
    };
    Ok(Some((dir.to_path_buf(), name.to_string())))
}

/// Fails unless `entries` (the source's, limited to the one name) hold the
/// file: an excluded file is an error, not a sync that moved nothing.
pub(super) fn the_file_is_there(entries: &[TreeEntry], name: &str) -> Result<(), SyncError> {
    if entries.is_empty() {
        return Err(SyncError::Invalid(format!(
            "{name} is excluded (by the default excludes, yours or a .gitignore) or gone; nothing was synced"
        )));
    }
    Ok(())
}

/// Refuses a plan that would replace what the target holds under the name
/// with a file: a directory of that name is not the file's to delete.
pub(super) fn replaces_nothing(plan: &Plan, name: &str) -> Result<(), SyncError> {
    if !plan.replace_removes.is_empty() {
        return Err(SyncError::Invalid(format!(
            "the target holds something other than a file named {name} (a directory or a symlink); a single-file sync does not replace it"
        )));
    }
    Ok(())
}

/// Where a file named `name` goes for the target `target`: its directory
/// and the name it gets there.
pub fn file_target(target: &str, target_is_dir: bool, name: &str) -> (String, String) {
    let trimmed = target.trim_end_matches('/');
    if target_is_dir || target.ends_with('/') || matches!(trimmed, "" | "." | "~") {
        let dir = if trimmed.is_empty() && target.starts_with('/') {
            "/".to_string()
        } else if trimmed.is_empty() {
            ".".to_string()
        } else {
            trimmed.to_string()
        };
        return (dir, name.to_string());
    }
    match trimmed.rsplit_once('/') {
        Some(("", base)) => ("/".into(), base.into()),
        Some((dir, base)) => (dir.into(), base.into()),
        None => (".".into(), trimmed.into()),
    }
}

/// The refusal of a single-file sync that would rename the file.
pub fn renames(name: &str, target: &str) -> SyncError {
    SyncError::Invalid(format!(
        "a single-file sync keeps the file's name: {name} cannot become {target}; give the target's directory (ending in /), or a path ending in {name}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_goes_into_a_directory_or_becomes_the_target() {
        let t = |target, is_dir| file_target(target, is_dir, "a.py");
        assert_eq!(t("proj", true), ("proj".into(), "a.py".into()));
        assert_eq!(t("proj/", false), ("proj".into(), "a.py".into()));
        assert_eq!(t(".", false), (".".into(), "a.py".into()));
        assert_eq!(t("~", false), ("~".into(), "a.py".into()));
        assert_eq!(t("proj/a.py", false), ("proj".into(), "a.py".into()));
        assert_eq!(t("b.py", false), (".".into(), "b.py".into()));
        assert_eq!(t("/a.py", false), ("/".into(), "a.py".into()));
    }
}
