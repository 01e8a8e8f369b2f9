//! The writer's side of a connection: two lanes of frames, and how one
//! frame is handed to the link.

use std::sync::atomic::Ordering;

use tokio::io::AsyncWriteExt;

use super::heartbeat::{BULK_FRAME, Liveness};

/// Which queue a frame waits in. The writer always takes urgent frames
/// first, so a command or a ping never waits behind megabytes of file data
/// queued by a sync; it waits at most for the frame being written. Order
/// holds within a lane only, which is all the protocol needs: requests are
/// independent (a sync sends a commit only once its parts are answered), and
/// a cancel travels in its request's lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lane {
    Urgent,
    Bulk,
}

impl Lane {
    pub(super) fn of(frame: &[u8]) -> Lane {
        if frame.len() >= BULK_FRAME {
            Lane::Bulk
        } else {
            Lane::Urgent
        }
    }
}

/// Hands one frame to the link and accounts for it. A bulk frame goes in
/// slices, each one the link accepts being a sign of life: past the first
/// window's worth, SSH takes more only as the host consumes data (and a pipe
/// only as the agent reads), so on a slow uplink the heartbeat hears the
/// host through our own progress while it cannot answer.
pub(super) async fn write_frame(
    writer: &mut (impl tokio::io::AsyncWrite + Unpin),
    frame: &[u8],
    liveness: &Liveness,
) -> std::io::Result<()> {
    if frame.len() < BULK_FRAME {
        writer.write_all(frame).await?;
        liveness
            .unsent
            .fetch_sub(frame.len() as u64, Ordering::Relaxed);
        return Ok(());
    }
    for slice in frame.chunks(BULK_FRAME) {
        writer.write_all(slice).await?;
        liveness
            .unsent
            .fetch_sub(slice.len() as u64, Ordering::Relaxed);
        liveness.touch();
        // Never 0, which means "no bulk sent yet".
        liveness
            .bulk_ms
            .store(liveness.now_ms().max(1), Ordering::Relaxed);
    }
    Ok(())
}
