//! Removal of agent versions that nothing runs any more.
//!
//! The controller installs each version at `~/.outpost/agents/<name>/outpost-agent`
//! and never deletes one itself, because another controller may still use it.
//! A starting agent knows best what is in use on its host: `/proc/*/exe`.

use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::{paths, proctree};

/// Temp upload dirs (`.name`) younger than this may belong to an upload that
/// is still in progress.
const TEMP_GRACE: Duration = Duration::from_secs(10 * 60);

/// Removes sibling version dirs when this executable lives in an `agents` dir.
/// Best effort: every error just leaves the dir in place.
pub fn remove_stale_versions() {
    let Some(exe) = paths::running_exe() else {
        return;
    };
    let Some(own_dir) = exe.parent() else {
        return;
    };
    let Some(agents) = own_dir.parent() else {
        return;
    };
    if agents.file_name().and_then(|n| n.to_str()) != Some("agents") {
        return;
    }
    let Ok(entries) = std::fs::read_dir(agents) else {
        return;
    };
    let in_use = proctree::running_executables();
    for entry in entries.flatten() {
        let path = entry.path();
        if path == own_dir || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if entry.file_name().as_encoded_bytes().starts_with(b".") && is_young(&path) {
            continue;
        }
        if in_use.iter().any(|exe| exe.starts_with(&path)) {
            continue;
        }
        let _ = std::fs::remove_dir_all(&path);
    }
}

/// Unknown age counts as young: keeping a dir is always safe.
fn is_young(path: &Path) -> bool {
    let modified = std::fs::metadata(path).and_then(|m| m.modified());
    match modified {
        // A clock set back makes `t` lie in the future: young, too.
        Ok(t) => !matches!(SystemTime::now().duration_since(t), Ok(age) if age >= TEMP_GRACE),
        Err(_) => true,
    }
}
