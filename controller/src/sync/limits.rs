//! The bounds of a sync's requests: bytes and files per request, requests
//! and bytes in flight, ops per metadata request, chunks per resume. They
//! stand together because they are chosen together (see [`REQUEST_BYTES`]).

/// Content per request: compressed bytes of a `PutFiles` batch or a
/// `PutPart`, raw bytes asked for by one `ReadFiles`. The controller hears
/// nothing from the agent while it uploads one request, and the heartbeat
/// gives a connection up after 4 s of silence, so a request must cross even
/// a slow uplink in well under that; per-request costs on the host (one
/// flush per batch) stay small next to 2 MiB.
pub(super) const REQUEST_BYTES: u64 = 2 << 20;
/// Files up to this size travel whole inside a batch; larger ones as parts.
pub(super) const INLINE_MAX: u64 = REQUEST_BYTES;
/// Most files in one batch: bounds the per-file overhead of a frame and how
/// long one request holds the root on the host.
pub(super) const BATCH_FILES: usize = 1_000;
/// Most raw bytes read for one batch, however well they compress.
pub(super) const BATCH_RAW: u64 = 16 << 20;
/// Requests in flight on the connection, and their content bytes: enough to
/// fill a fast link's round trip, little enough that an exec sent meanwhile
/// is not queued behind a long transfer.
pub(super) const MAX_IN_FLIGHT: usize = 8;
pub(super) const MAX_IN_FLIGHT_BYTES: u64 = 16 << 20;
/// Most ops, and estimated bytes, in one `ApplyMeta` (far below the frame cap
/// even for paths and link targets of the longest kind).
pub(super) const META_OPS: usize = 2_000;
pub(super) const META_BYTES: usize = 1 << 20;
/// Most chunks a `Resume` lists, so it fits a frame whatever the offsets
/// (at most ~47 encoded bytes a chunk): about 85 GiB at the largest chunk
/// size. Larger files are sent afresh.
pub(super) const MAX_RESUME_CHUNKS: usize = outpost_protocol::limits::MAX_FRAME_LEN / 2 / 48;
