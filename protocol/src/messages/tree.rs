//! File trees: scans, atomic writes, staged parts of large files,
//! metadata changes and reads.

use serde::{Deserialize, Serialize};

/// A path relative to a sync root, as raw bytes (names need not be UTF-8).
pub type RelPath = Vec<u8>;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanRequest {
    /// The tree's root on the host; `~` is the home.
    pub root: String,
    pub filter: FilterSpec,
    /// Include content hashes. Listings that only show names and sizes
    /// leave it off.
    pub hashes: bool,
    /// With `hashes`, also the chunk lists of large files. A sync leaves
    /// them out (on a no-op they would be most of the answer) and asks
    /// `DescribeFiles` for those of the files it finds changed.
    pub chunk_lists: bool,
    /// Descend into subdirectories.
    pub recursive: bool,
    /// Stop after this many entries (0: no limit); `ScanDone.truncated` says so.
    pub max_entries: u64,
    /// The [`ScanSummary::digest`] of an earlier answer the caller keeps:
    /// when this scan's is the same, no `Entries` come (`ScanDone.unchanged`);
    /// when the host kept that answer too, only what changed since
    /// (`ScanDone.delta`).
    pub known: Option<[u8; 32]>,
}

/// Which paths a scan skips. Patterns use gitignore syntax.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterSpec {
    pub excludes: Vec<String>,
    /// Also honour `.gitignore` files inside the tree.
    pub use_gitignore: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    File,
    Dir,
    Symlink {
        #[serde(with = "serde_bytes")]
        target: Vec<u8>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeEntry {
    #[serde(with = "serde_bytes")]
    pub path: RelPath,
    pub kind: EntryKind,
    /// Permission bits (`mode & 0o7777`).
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i64,
    /// BLAKE3 of the content (files, when hashes were asked for).
    pub hash: Option<[u8; 32]>,
    /// Content-defined chunks of large files (when hashes were asked for).
    pub chunks: Vec<ChunkRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    pub offset: u64,
    pub len: u32,
    pub hash: [u8; 32],
}

/// A problem with one path; the rest of the operation goes on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathProblem {
    #[serde(with = "serde_bytes")]
    pub path: RelPath,
    pub message: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanSummary {
    pub root_exists: bool,
    pub truncated: bool,
    pub problems: Vec<PathProblem>,
    /// Partial files of interrupted transfers that a `Resume` can adopt
    /// (hashing scans only).
    pub partials: Vec<Partial>,
    /// BLAKE3 of the entries and the fields above, for a complete hashing
    /// scan: what a later scan's `known` names.
    pub digest: Option<[u8; 32]>,
    /// The entries are those of the request's `known`, and none were sent.
    pub unchanged: bool,
    /// The entries sent are only those added or changed since the request's
    /// `known`, and `removed` the paths gone since; `digest` is still the
    /// whole scan's.
    pub delta: bool,
    pub removed: Vec<RelPath>,
}

/// The partial content of an interrupted transfer, by the directory of the
/// file it was for and the identity of the content it was becoming.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partial {
    #[serde(with = "serde_bytes")]
    pub dir: RelPath,
    /// The first 16 bytes of the BLAKE3 hash of the complete content.
    pub hash_prefix: [u8; 16],
    /// The complete content's size.
    pub size: u64,
}

/// What a replaced path must still look like for the write to go ahead, so a
/// file changed underneath since the scan is never overwritten.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Expect {
    /// Write regardless.
    Any,
    /// Nothing may exist at the path.
    Absent,
    /// The path holds a file with this size and mtime.
    File { size: u64, mtime_ns: i64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileContent {
    /// The whole content, encoded by `outpost_treesync::codec` (zstd or stored).
    Inline(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Assembled earlier by `PutPart`s with this transfer id.
    Staged { xfer: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilePut {
    #[serde(with = "serde_bytes")]
    pub path: RelPath,
    pub mode: u32,
    pub mtime_ns: i64,
    pub size: u64,
    /// BLAKE3 of the content; the file is committed only if it matches.
    pub hash: [u8; 32],
    pub expect: Expect,
    pub content: FileContent,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutFiles {
    pub root: String,
    /// Create missing parent directories (0755 before umask).
    pub create_parents: bool,
    pub files: Vec<FilePut>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PartData {
    /// Bytes, encoded by `outpost_treesync::codec` (zstd or stored).
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Bytes already in the current file at `path`, from this offset.
    Copy { from_offset: u64, len: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutPart {
    pub root: String,
    pub xfer: u64,
    /// The file being replaced (source of `Copy` parts) and the staging
    /// file's directory.
    #[serde(with = "serde_bytes")]
    pub path: RelPath,
    /// Where the part goes in the new file.
    pub offset: u64,
    /// The whole new file's hash and size: they name its staging file, so
    /// that an interrupted transfer can be resumed by a later one.
    pub hash: [u8; 32],
    pub size: u64,
    /// Last, so that content is encoded last: a frame can be its head, then
    /// content shared with other hosts' frames ([`super::Request::content_mut`]).
    pub data: PartData,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resume {
    pub root: String,
    pub xfer: u64,
    /// The file being replaced; the partial sits in its directory.
    #[serde(with = "serde_bytes")]
    pub path: RelPath,
    pub hash: [u8; 32],
    pub size: u64,
    /// The new content's chunks: the answer lists those the partial already
    /// holds, checked by hash.
    pub chunks: Vec<ChunkRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaOp {
    Mkdir {
        #[serde(with = "serde_bytes")]
        path: RelPath,
        mode: u32,
    },
    Symlink {
        #[serde(with = "serde_bytes")]
        path: RelPath,
        #[serde(with = "serde_bytes")]
        target: Vec<u8>,
    },
    SetAttrs {
        #[serde(with = "serde_bytes")]
        path: RelPath,
        mode: u32,
        mtime_ns: i64,
    },
    /// Remove a file, symlink, or directory tree (never following symlinks).
    Remove {
        #[serde(with = "serde_bytes")]
        path: RelPath,
    },
    /// End a transfer that will not be committed: its resumable partial is
    /// kept (and unlocked) for the next transfer of the same content, other
    /// staging files are removed.
    Abort { xfer: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyMeta {
    pub root: String,
    pub ops: Vec<MetaOp>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyReport {
    pub done: u32,
    pub problems: Vec<PathProblem>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadSpec {
    #[serde(with = "serde_bytes")]
    pub path: RelPath,
    /// (offset, length) ranges; None: the whole file.
    pub ranges: Option<Vec<(u64, u64)>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadFiles {
    pub root: String,
    pub reads: Vec<ReadSpec>,
}
