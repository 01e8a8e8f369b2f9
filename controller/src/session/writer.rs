//! The writer's side of a connection: two lanes of frames, and how one
//! frame is handed to the link.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::io::AsyncWriteExt;

use super::heartbeat::{BULK_FRAME, Liveness};

/// A frame to write: whole in `head`, or its head and then content that
/// several hosts' frames may share, written as it is (see
/// [`outpost_protocol::encode_frame_with_tail`]).
pub(super) struct OutFrame {
    pub(super) head: Vec<u8>,
    pub(super) tail: Option<Arc<Vec<u8>>>,
}

impl OutFrame {
    pub(super) fn whole(frame: Vec<u8>) -> OutFrame {
        OutFrame {
            head: frame,
            tail: None,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.head.len() + self.tail.as_ref().map_or(0, |t| t.len())
    }
}

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
    pub(super) fn of(frame: &OutFrame) -> Lane {
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
    frame: &OutFrame,
    liveness: &Liveness,
) -> std::io::Result<()> {
    let tail = frame.tail.as_deref().map_or(&[][..], Vec::as_slice);
    if frame.len() < BULK_FRAME {
        writer.write_all(&frame.head).await?;
        writer.write_all(tail).await?;
        liveness
            .unsent
            .fetch_sub(frame.len() as u64, Ordering::Relaxed);
        return Ok(());
    }
    for slice in frame.head.chunks(BULK_FRAME).chain(tail.chunks(BULK_FRAME)) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_frame_is_its_head_then_its_tail_and_counted_as_sent() {
        let liveness = Liveness::new();
        for (head, tail) in [
            (vec![1u8; 10], None),
            (vec![2; 10], Some(vec![3; 5])),
            (vec![4; 100], Some(vec![5; 3 * BULK_FRAME + 7])),
            (vec![6; BULK_FRAME + 1], None),
        ] {
            let frame = OutFrame {
                head: head.clone(),
                tail: tail.clone().map(Arc::new),
            };
            liveness
                .unsent
                .fetch_add(frame.len() as u64, Ordering::Relaxed);
            let mut out = Vec::new();
            write_frame(&mut out, &frame, &liveness).await.unwrap();
            assert_eq!(out, [head, tail.unwrap_or_default()].concat());
            assert_eq!(liveness.unsent.load(Ordering::Relaxed), 0);
        }
    }
}
