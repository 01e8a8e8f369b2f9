//! The host's side of recent syncs, kept: each complete hashing scan the
//! agent answered, with its digest. The next scan of the same root names
//! that digest (`ScanRequest.known`); when the host finds exactly the same,
//! it says so instead of sending every entry again, so a no-op sync costs
//! the host's walk but not the list; when the host kept that scan too, it
//! sends only what changed since (`outpost_treesync::known`).
//!
//! A kept scan is only ever used on the host's word that its own scan has
//! the same digest, so the key serves finding one, never correctness: a
//! connection's address reused by another host's finds nothing the host
//! does not confirm.

use std::sync::Arc;

use outpost_protocol::{FilterSpec, ScanRequest, TreeEntry};
use outpost_treesync::known::KeptScans;

use crate::session::ScopedConn;

/// Which scan: the connection (by address), the sandbox and the request.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Key {
    conn: usize,
    sandbox: Option<String>,
    root: String,
    filter: FilterSpec,
    chunk_lists: bool,
}

static KEPT: KeptScans<Key> = KeptScans::new();

/// The key of `request` on `conn`, for a scan worth keeping: a whole tree,
/// hashed, as a sync asks.
pub(super) fn key(conn: &ScopedConn, request: &ScanRequest) -> Option<Key> {
    (request.hashes && request.recursive && request.max_entries == 0).then(|| Key {
        conn: &**conn as *const _ as usize,
        sandbox: conn.sandbox().map(str::to_string),
        root: request.root.clone(),
        filter: request.filter.clone(),
        chunk_lists: request.chunk_lists,
    })
}

/// The kept scan of `key`: its digest and entries.
pub(super) fn get(key: &Key) -> Option<([u8; 32], Arc<Vec<TreeEntry>>)> {
    KEPT.get(key)
}

/// Keeps `entries` as the scan of `key` with `digest`, in place of any
/// earlier one.
pub(super) fn keep(key: Key, digest: [u8; 32], entries: Arc<Vec<TreeEntry>>) {
    KEPT.keep(key, digest, entries);
}

/// Whether a whole-tree scan of `root` on `conn` is kept: the path was a
/// directory when it was last synced.
pub(super) fn was_tree(conn: &ScopedConn, root: &str) -> bool {
    let (at, sandbox) = (&**conn as *const _ as usize, conn.sandbox());
    KEPT.holds(|k| k.conn == at && k.sandbox.as_deref() == sandbox && k.root == root)
}
