//! The heartbeat's clock: when the host last showed a sign of life, and
//! whether bulk data of ours is on its way, which lengthens the patience.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use outpost_protocol::RequestId;

/// Send a ping after this long without a sign of life from the host…
pub(super) const HEARTBEAT_IDLE: Duration = Duration::from_millis(1000);
/// …and give the connection up after this long…
pub(super) const HEARTBEAT_DEAD: Duration = Duration::from_millis(4000);
/// …or this long while bulk data of ours is queued or was sent this
/// recently: the agent answers a large request only once all of it has
/// crossed, so on a slow uplink its answers come seconds apart even from a
/// healthy host, and a ping waits behind the data. A frozen host still
/// stops our writes (SSH's window, or the pipe, fills), so it is noticed.
pub(super) const HEARTBEAT_DEAD_SENDING: Duration = Duration::from_millis(15_000);
/// A frame at least this large is bulk data.
pub(super) const BULK_FRAME: usize = 64 * 1024;
/// Request id of heartbeat pings; calls start at 1.
pub(super) const HEARTBEAT_ID: RequestId = 0;

/// What the heartbeat goes by: when bytes last arrived from the host (in any
/// piece, not only whole frames, so a large answer on a slow link counts
/// while it arrives), and whether we are in the middle of sending bulk data.
pub(super) struct Liveness {
    pub(super) epoch: Instant,
    pub(super) heard_ms: AtomicU64,
    /// When the link last accepted a bulk frame of ours.
    pub(super) bulk_ms: AtomicU64,
    /// Bytes queued for the writer and not yet accepted by the link.
    pub(super) unsent: AtomicU64,
}

impl Liveness {
    pub(super) fn new() -> Liveness {
        Liveness {
            epoch: Instant::now(),
            heard_ms: AtomicU64::new(0),
            bulk_ms: AtomicU64::new(0),
            unsent: AtomicU64::new(0),
        }
    }

    pub(super) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub(super) fn touch(&self) {
        self.heard_ms.fetch_max(self.now_ms(), Ordering::Relaxed);
    }

    pub(super) fn silence(&self) -> Duration {
        let last = Duration::from_millis(self.heard_ms.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }

    /// Whether bulk data is queued, or was handed to the link within the
    /// longer heartbeat limit.
    pub(super) fn sending(&self) -> bool {
        let since_bulk = self
            .now_ms()
            .saturating_sub(self.bulk_ms.load(Ordering::Relaxed));
        self.unsent.load(Ordering::Relaxed) >= BULK_FRAME as u64
            || (self.bulk_ms.load(Ordering::Relaxed) > 0
                && since_bulk < HEARTBEAT_DEAD_SENDING.as_millis() as u64)
    }
}
