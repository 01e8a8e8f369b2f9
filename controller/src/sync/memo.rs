//! The host's side of recent syncs, kept: each complete hashing scan the
//! agent answered, with its digest. The next scan of the same root names
//! that digest (`ScanRequest.known`); when the host finds exactly the same,
//! it says so instead of sending every entry again, so a no-op sync costs
//! the host's walk but not the list.
//!
//! A kept scan is only ever used on the host's word that its own scan has
//! the same digest, so the key serves finding one, never correctness: a
//! connection's address reused by another host's finds nothing the host
//! does not confirm.

use std::sync::{Arc, Mutex};

use outpost_protocol::{FilterSpec, ScanRequest, TreeEntry};

use crate::session::ScopedConn;

/// Entries kept in all; the least recently used scans go first.
const KEPT_ENTRIES: usize = 100_000;

/// Which scan: the connection (by address), the sandbox and the request.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Key {
    conn: usize,
    sandbox: Option<String>,
    root: String,
    filter: FilterSpec,
    chunk_lists: bool,
}

struct Kept {
    key: Key,
    digest: [u8; 32],
    entries: Arc<Vec<TreeEntry>>,
}

/// Most recently used last.
static KEPT: Mutex<Vec<Kept>> = Mutex::new(Vec::new());

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
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    let at = kept.iter().position(|k| k.key == *key)?;
    let found = kept.remove(at);
    let answer = (found.digest, Arc::clone(&found.entries));
    kept.push(found);
    Some(answer)
}

/// Keeps `entries` as the scan of `key` with `digest`, in place of any
/// earlier one; a scan larger than the whole allowance is not kept.
pub(super) fn keep(key: Key, digest: [u8; 32], entries: &[TreeEntry]) {
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    kept.retain(|k| k.key != key);
    if entries.len() > KEPT_ENTRIES / 2 {
        return;
    }
    let mut total: usize = kept.iter().map(|k| k.entries.len()).sum::<usize>() + entries.len();
    while total > KEPT_ENTRIES && !kept.is_empty() {
        total -= kept.remove(0).entries.len();
    }
    kept.push(Kept {
        key,
        digest,
        entries: Arc::new(entries.to_vec()),
    });
}
