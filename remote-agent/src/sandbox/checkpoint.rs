//! Checkpoints of a sandbox's work dir, their restore and diff, and forks.
//!
//! A checkpoint is `meta/checkpoints/<n>/tree`, a copy of `work` taken
//! with the sandbox's commands frozen ([`super::pause::Frozen`]), shared
//! copy-on-write where the filesystem allows and copied otherwise, its
//! files unchanged since the latest checkpoint hard-linked to that one's
//! (see [`outpost_treesync::snapshot`]), and `info.json`. It is made under a
//! temporary name and renamed into place, so a failed one leaves nothing
//! that lists. `meta/` is never bound into the sandbox: nothing it runs can
//! change a checkpoint. A restore mirrors a checkpoint back, all of it or
//! named paths, writing only files written since; a fork is a new sandbox
//! with the same spec whose work dir is mirrored from this one.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use outpost_protocol::{
    AgentError, Change, CheckpointInfo, CopyReport, ErrorKind, PathChange, Response, SandboxSpec,
};
use outpost_treesync::mirror::{self, Difference, MirrorOptions, MirrorReport};
use outpost_treesync::snapshot::{Earlier, snapshot};
use serde::{Deserialize, Serialize};

use super::pause::Frozen;
use super::store::{CHECKPOINTS, Dirs, error};
use super::{ended_error, lifecycle_lock};
use crate::statefile::{make_dir_all, now_unix, read_json, write_json};

const INFO: &str = "info.json";
const TREE: &str = "tree";
/// Checkpoints a sandbox may hold; the oldest must be named to go.
const MAX_CHECKPOINTS: usize = 64;
const MAX_LABEL: usize = 200;
/// A checkpoint's ctime threshold lies this far before its freeze: file
/// times come from a coarse clock, so a write just after the freeze could
/// carry a time a little before it.
const CLOCK_SLACK_NS: i64 = 50_000_000;
/// Files up to this size get a unified diff, and all diffs of one answer
/// up to the second.
const DIFF_FILE_MAX: u64 = 64 * 1024;
const DIFF_TOTAL_MAX: usize = 256 * 1024;
/// Paths one diff answer lists at most.
const MAX_CHANGES: usize = 2000;

/// `info.json`: the answer, and when the freeze began.
#[derive(Serialize, Deserialize)]
struct Stored {
    info: CheckpointInfo,
    taken_ns: i64,
}

fn internal(dirs: &Dirs, e: impl std::fmt::Display) -> AgentError {
    error(ErrorKind::Internal, format!("sandbox {}: {e}", dirs.id))
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

fn report(r: MirrorReport, started: Instant) -> CopyReport {
    CopyReport {
        files: r.files,
        bytes: r.bytes,
        cloned: r.cloned,
        unchanged: r.linked,
        removed: r.removed,
        skipped: r.skipped,
        took_ms: started.elapsed().as_millis() as u64,
    }
}

fn numbers(root: &Path) -> Vec<u32> {
    let mut out: Vec<u32> = fs::read_dir(root)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    out.sort_unstable();
    out
}

/// The live sandbox, under its lifecycle lock (a checkpoint, restore or
/// fork never races its end).
fn live(id: &str) -> Result<(Dirs, fs::File), AgentError> {
    let dirs = Dirs::find(id)?;
    let lock = lifecycle_lock(&dirs)?;
    ended_error(&dirs)?;
    Ok((dirs, lock))
}

fn stored(dirs: &Dirs, number: u32) -> Result<(Stored, PathBuf), AgentError> {
    let dir = dirs.meta().join(CHECKPOINTS).join(number.to_string());
    let stored: Stored = read_json(&dir.join(INFO)).ok_or_else(|| {
        let have = numbers(&dirs.meta().join(CHECKPOINTS));
        error(
            ErrorKind::BadRequest,
            format!(
                "sandbox {} has no checkpoint {number} (it has {})",
                dirs.id,
                if have.is_empty() {
                    "none".to_string()
                } else {
                    format!("{have:?}")
                }
            ),
        )
    })?;
    Ok((stored, dir.join(TREE)))
}

/// `SandboxCheckpoint`.
pub fn create(id: &str, label: Option<String>) -> Result<Response, AgentError> {
    if label.as_ref().is_some_and(|l| l.len() > MAX_LABEL) {
        return Err(error(
            ErrorKind::BadRequest,
            format!("label is longer than {MAX_LABEL} bytes"),
        ));
    }
    let (dirs, _lock) = live(id)?;
    let root = dirs.meta().join(CHECKPOINTS);
    make_dir_all(&root).map_err(|e| internal(&dirs, e))?;
    let have = numbers(&root);
    if have.len() >= MAX_CHECKPOINTS {
        return Err(error(
            ErrorKind::BadRequest,
            format!("sandbox {id} holds {MAX_CHECKPOINTS} checkpoints, the most it may"),
        ));
    }
    let number = have.last().map_or(1, |n| n + 1);
    // The latest checkpoint: what is unchanged since is linked to its copy.
    let latest = have.last().and_then(|&n| stored(&dirs, n).ok());
    let partial = root.join(format!(".{number}.partial"));
    let _ = fs::remove_dir_all(&partial);
    let result = (|| {
        make_dir_all(&partial.join(TREE)).map_err(|e| internal(&dirs, e))?;
        let started = Instant::now();
        let taken_ns = now_ns();
        let earlier_tree = latest.as_ref().map(|(then, tree)| Earlier {
            tree,
            unchanged_before_ns: then.taken_ns - CLOCK_SLACK_NS,
        });
        let frozen = Frozen::new(&dirs)?;
        let copied = snapshot(&dirs.work(), &partial.join(TREE), earlier_tree)
            .map_err(|e| internal(&dirs, format!("checkpoint failed: {e}")))?;
        drop(frozen);
        let info = CheckpointInfo {
            number,
            label,
            created_unix: now_unix(),
            copy: report(copied, started),
        };
        let stored = Stored {
            info: info.clone(),
            taken_ns,
        };
        write_json(&partial.join(INFO), &stored, true).map_err(|e| internal(&dirs, e))?;
        fs::rename(&partial, root.join(number.to_string())).map_err(|e| internal(&dirs, e))?;
        Ok(info)
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(&partial);
    }
    result.map(Response::Checkpoint)
}

/// `SandboxCheckpoints`.
pub fn list(id: &str) -> Result<Response, AgentError> {
    let dirs = Dirs::find(id)?;
    let root = dirs.meta().join(CHECKPOINTS);
    let infos = numbers(&root)
        .into_iter()
        .filter_map(|n| read_json::<Stored>(&root.join(n.to_string()).join(INFO)))
        .map(|s| s.info)
        .collect();
    Ok(Response::Checkpoints(infos))
}

/// `SandboxRestore`.
pub fn restore(id: &str, number: u32, paths: &[String]) -> Result<Response, AgentError> {
    let (dirs, _lock) = live(id)?;
    let (stored, tree) = stored(&dirs, number)?;
    let only = if paths.is_empty() {
        None
    } else {
        let mut rels = Vec::new();
        for raw in paths {
            let rel = raw.trim_start_matches("./").trim_end_matches('/');
            outpost_treesync::relpath::components(rel.as_bytes()).map_err(|e| {
                error(
                    ErrorKind::BadRequest,
                    format!("{e}: paths are relative to the work dir"),
                )
            })?;
            rels.push(rel.as_bytes().to_vec());
        }
        Some(rels)
    };
    let options = MirrorOptions {
        only,
        unchanged_before_ns: Some(stored.taken_ns - CLOCK_SLACK_NS),
        owner: None,
    };
    let started = Instant::now();
    let frozen = Frozen::new(&dirs)?;
    let copied = mirror::mirror(&tree, &dirs.work(), &options)
        .map_err(|e| internal(&dirs, format!("restore failed: {e}")))?;
    drop(frozen);
    Ok(Response::Restored(report(copied, started)))
}

/// `SandboxDiff`.
pub fn diff(id: &str, number: u32) -> Result<Response, AgentError> {
    let (dirs, _lock) = live(id)?;
    let (stored, tree) = stored(&dirs, number)?;
    let work = dirs.work();
    let found = mirror::compare(&tree, &work, Some(stored.taken_ns - CLOCK_SLACK_NS))
        .map_err(|e| internal(&dirs, format!("diff failed: {e}")))?;
    let mut budget = DIFF_TOTAL_MAX;
    let mut changes = Vec::new();
    let more = found.len().saturating_sub(MAX_CHANGES) as u64;
    for (rel, difference, size) in found.into_iter().take(MAX_CHANGES) {
        let path = String::from_utf8_lossy(&rel).into_owned();
        let change = match difference {
            Difference::Added => Change::Added,
            Difference::Changed => Change::Changed,
            Difference::Removed => Change::Removed,
        };
        let diff = (change == Change::Changed && budget > 0)
            .then(|| text_diff(&tree, &work, &rel, &path))
            .flatten()
            .filter(|d| d.len() <= budget);
        budget -= diff.as_ref().map_or(0, String::len);
        changes.push(PathChange {
            path,
            change,
            size,
            diff,
        });
    }
    Ok(Response::CheckpointDiff { changes, more })
}

/// A unified diff of `rel` between the two trees, when both sides are
/// small UTF-8 text.
fn text_diff(then: &Path, now: &Path, rel: &[u8], path: &str) -> Option<String> {
    let read = |root: &Path| {
        mirror::read_small(root, rel, DIFF_FILE_MAX)
            .ok()
            .flatten()
            .and_then(|b| String::from_utf8(b).ok())
    };
    let (a, b) = (read(then)?, read(now)?);
    Some(
        similar::TextDiff::from_lines(&a, &b)
            .unified_diff()
            .context_radius(3)
            .header(&format!("a/{path}"), &format!("b/{path}"))
            .to_string(),
    )
}

/// The spec a fork of `id` is made with: the same, but a new id.
pub fn fork_spec(id: &str) -> Result<SandboxSpec, AgentError> {
    let dirs = Dirs::find(id)?;
    ended_error(&dirs)?;
    let record = dirs
        .record()
        .ok_or_else(|| internal(&dirs, "its record is unreadable"))?;
    Ok(SandboxSpec {
        id: None,
        ..record.spec
    })
}

/// Fills the new sandbox `to` with `from`'s work dir, `from` frozen
/// meanwhile; owned by `to`'s account where it has one.
pub fn fill_fork(from: &str, to: &str) -> Result<CopyReport, AgentError> {
    let (source, _lock) = live(from)?;
    let target = Dirs::find(to)?;
    let owner = target
        .record()
        .and_then(|r| r.account)
        .map(|a| (a.uid, a.gid));
    let options = MirrorOptions {
        owner,
        ..MirrorOptions::default()
    };
    let started = Instant::now();
    let frozen = Frozen::new(&source)?;
    let copied = mirror::mirror(&source.work(), &target.work(), &options)
        .map_err(|e| internal(&source, format!("fork failed: {e}")))?;
    drop(frozen);
    Ok(report(copied, started))
}
