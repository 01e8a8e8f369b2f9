//! Hard limits both ends enforce. A peer that exceeds one gets a protocol error,
//! never an allocation of the size it asked for.

/// Largest frame payload accepted or produced. Bigger data is chunked.
pub const MAX_FRAME_LEN: usize = 8 * 1024 * 1024;

/// Bytes of shell noise tolerated before the preamble. A stream that has not shown
/// the preamble by then is not an agent (wrong binary, a shell stuck at a prompt).
pub const MAX_NOISE_LEN: usize = 64 * 1024;

/// Largest per-stream output an exec result may carry (head + tail), so that a
/// finished exec with both streams always fits in one frame.
pub const MAX_EXEC_OUTPUT_LIMIT: u64 = 3 * 1024 * 1024;

/// Size of one streamed output chunk.
pub const OUTPUT_CHUNK_LEN: usize = 64 * 1024;

/// Largest stdin an exec request may carry.
pub const MAX_STDIN_LEN: usize = 1024 * 1024;

/// Longest `last_line` of an [`crate::ExecProgress`], in bytes.
pub const PROGRESS_LINE_LEN: usize = 200;

/// Shortest interval between two [`crate::ExecProgress`] of one command.
pub const MIN_PROGRESS_MS: u32 = 100;

/// Shortest and longest TTL of a sandbox.
pub const MIN_SANDBOX_TTL_MS: u64 = 1000;
pub const MAX_SANDBOX_TTL_MS: u64 = 7 * 24 * 3600 * 1000;

/// Largest per-stream output a code run's result may carry (head + tail), so
/// that both streams and [`MAX_CODE_RESULTS_LEN`] fit one frame.
pub const MAX_CODE_OUTPUT_LIMIT: u64 = 1024 * 1024;

/// Most bytes of displayed values (images in base64 included) one code run
/// returns; later values are replaced by a note.
pub const MAX_CODE_RESULTS_LEN: usize = 4 * 1024 * 1024;

/// Longest code context name.
pub const MAX_CODE_CONTEXT_LEN: usize = 64;
