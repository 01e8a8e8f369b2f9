//! Files of the agent's state directory, shared by jobs, sandboxes and the
//! daemon: atomic and durable writes, JSON records, `O_EXCL` markers, the
//! rule for names that are one path component, and process identities that
//! pid reuse cannot fool.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use outpost_protocol::{AgentError, ErrorKind};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{paths, proctree};

pub fn error(kind: ErrorKind, message: impl Into<String>) -> AgentError {
    AgentError {
        kind,
        message: message.into(),
    }
}

fn internal(what: impl std::fmt::Display, e: impl std::fmt::Display) -> AgentError {
    error(ErrorKind::Internal, format!("{what}: {e}"))
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `<state>/<name>`, created (0700) if missing.
pub fn state_subdir(name: &str) -> Result<PathBuf, AgentError> {
    let state = paths::state_dir().ok_or_else(|| {
        error(
            ErrorKind::Internal,
            "no state directory ($HOME unset and no passwd entry)",
        )
    })?;
    let root = state.join(name);
    make_dir_all(&root).map_err(|e| internal(format!("cannot create {}", root.display()), e))?;
    Ok(root)
}

/// Creates `dir` and its parents with mode 0700 (before umask).
pub fn make_dir_all(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Whether `name` may name a job: `[A-Za-z0-9._-]{1,64}`, and not `.`/`..`,
/// so a name is always one plain path component.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !name.bytes().all(|b| b == b'.')
}

/// A process named so that pid reuse cannot fool a liveness check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcId {
    pub pid: i32,
    /// Field 22 of `/proc/<pid>/stat`.
    pub start_time: u64,
    #[serde(default)]
    pub boot_id: String,
}

impl ProcId {
    pub fn of(pid: i32) -> Option<ProcId> {
        let (_, start_time) = proctree::state_and_start(pid)?;
        Some(ProcId {
            pid,
            start_time,
            boot_id: proctree::boot_id().to_string(),
        })
    }

    /// Alive and the same process: same boot, same start time, not a zombie.
    pub fn alive(&self) -> bool {
        let boot = proctree::boot_id();
        if !self.boot_id.is_empty() && !boot.is_empty() && self.boot_id != boot {
            return false;
        }
        matches!(
            proctree::state_and_start(self.pid),
            Some((state, start)) if start == self.start_time && !proctree::is_dead_state(state)
        )
    }
}

/// Reads a JSON file; None when it is missing or unreadable. Files are
/// written by rename, so a torn file cannot be seen.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Option<T> {
    serde_json::from_slice(&fs::read(path).ok()?).ok()
}

/// Replaces `path` by rename of a 0600 temp file beside it. `durable`: the
/// content and the rename are flushed to disk before returning (for records
/// that must survive a crash, like exit codes).
pub fn write_atomic(path: &Path, data: &[u8], durable: bool) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        out.write_all(data)?;
        if durable {
            out.sync_all()?;
        }
        drop(out);
        fs::rename(&tmp, path)?;
        if durable {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

pub fn write_json<T: Serialize>(path: &Path, value: &T, durable: bool) -> io::Result<()> {
    let data = serde_json::to_vec(value).map_err(io::Error::other)?;
    write_atomic(path, &data, durable)
}

/// Creates the marker `name` in `dir`; true only for the one caller that
/// created it.
pub fn claim(dir: &Path, name: &str) -> bool {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join(name))
        .is_ok()
}
