//! Freezing a sandbox's commands: `pause_sandbox` until `resume_sandbox`,
//! and for the length of a checkpoint, a restore or a fork, so the copy is
//! of one moment and nothing it runs can swap a file for a link meanwhile.
//!
//! A sandbox with a cgroup of its own (v2) is frozen by `cgroup.freeze`:
//! atomic, and a process that joins later is frozen too. Otherwise each of
//! its commands gets SIGSTOP, again until a sweep finds none running (a
//! fork in between is caught by the next sweep), and SIGCONT when thawed;
//! the holder is spared. `meta/paused.json` records a pause, and `meta/
//! frozen` a short freeze: new commands are refused while paused and wait
//! out a short freeze.

use std::fs;

use outpost_protocol::{AgentError, ErrorKind, Response};

use super::limits::{freeze, thaw};
use super::store::{Dirs, FROZEN, PAUSED, Paused, Setup, error};
use super::{info, lifecycle_lock, now_ms};
use crate::statefile::{ProcId, write_json};

/// The sandbox frozen for as long as this lives (a no-op when it is
/// paused already: it stays so).
pub struct Frozen<'a> {
    dirs: &'a Dirs,
    setup: Option<Setup>,
}

impl<'a> Frozen<'a> {
    pub fn new(dirs: &'a Dirs) -> Result<Frozen<'a>, AgentError> {
        let setup = dirs.setup().ok_or_else(|| {
            error(
                ErrorKind::Unavailable,
                format!("sandbox {} is still being set up", dirs.id),
            )
        })?;
        if dirs.paused().is_some() {
            return Ok(Frozen { dirs, setup: None });
        }
        // Who froze it: a keeper thaws a freeze whose maker died.
        let me = ProcId::of(std::process::id() as i32);
        write_json(&dirs.meta().join(FROZEN), &me, false)
            .map_err(|e| error(ErrorKind::Internal, format!("sandbox {}: {e}", dirs.id)))?;
        let frozen = Frozen {
            dirs,
            setup: Some(setup),
        };
        if let Err(e) = freeze(&dirs.id, frozen.setup.as_ref().unwrap()) {
            return Err(error(
                ErrorKind::Internal,
                format!("cannot freeze sandbox {}: {e}", dirs.id),
            ));
        }
        Ok(frozen)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        if let Some(setup) = &self.setup {
            thaw(&self.dirs.id, setup);
            let _ = fs::remove_file(self.dirs.meta().join(FROZEN));
        }
    }
}

/// `SandboxPause`.
pub fn pause(id: &str, stop_clock: bool) -> Result<Response, AgentError> {
    let dirs = Dirs::find(id)?;
    let lock = lifecycle_lock(&dirs)?;
    super::ended_error(&dirs)?;
    if dirs.paused().is_none() {
        let setup = dirs.setup().ok_or_else(|| {
            error(
                ErrorKind::Unavailable,
                format!("sandbox {id} is still being set up"),
            )
        })?;
        let now = now_ms();
        let record = Paused {
            since_ms: now,
            remaining_ms: stop_clock.then(|| dirs.expires_ms().unwrap_or(now).saturating_sub(now)),
        };
        // Recorded first: a command starting meanwhile is refused.
        write_json(&dirs.meta().join(PAUSED), &record, true)
            .map_err(|e| error(ErrorKind::Internal, format!("cannot pause {id}: {e}")))?;
        if let Err(e) = freeze(id, &setup) {
            thaw(id, &setup);
            let _ = fs::remove_file(dirs.meta().join(PAUSED));
            return Err(error(
                ErrorKind::Internal,
                format!("cannot pause {id}: {e}"),
            ));
        }
    }
    drop(lock);
    info(&dirs)
}

/// `SandboxResume`: thawed, and a stopped clock started again where it
/// stood.
pub fn resume(id: &str) -> Result<Response, AgentError> {
    let dirs = Dirs::find(id)?;
    let lock = lifecycle_lock(&dirs)?;
    super::ended_error(&dirs)?;
    if let Some(record) = dirs.paused() {
        if let Some(remaining) = record.remaining_ms {
            dirs.set_expires_ms(now_ms() + remaining)
                .map_err(|e| error(ErrorKind::Internal, format!("cannot resume {id}: {e}")))?;
        }
        if let Some(setup) = dirs.setup() {
            thaw(id, &setup);
        }
        fs::remove_file(dirs.meta().join(PAUSED))
            .map_err(|e| error(ErrorKind::Internal, format!("cannot resume {id}: {e}")))?;
    }
    drop(lock);
    info(&dirs)
}
