//! Rescans answered against a scan the other side keeps.
//!
//! The controller and the host's agent both keep the last complete hashing
//! scan of a tree they exchanged ([`KeptScans`]), named by its [`digest`].
//! A rescan names that digest; the host then answers with the digest alone
//! when nothing changed, or with only the entries added or changed since
//! and the paths gone ([`delta`]), which the controller puts back together
//! ([`patched`]) and checks against the whole scan's digest. A sync after a
//! sync that changed a few files so sends those few, not the whole list.

use std::sync::{Arc, Mutex};

use outpost_protocol::{RelPath, ScanSummary, TreeEntry, encode_frame};

/// BLAKE3 of a scan's entries and summary as they are encoded, one by one,
/// the summary without the fields that describe the answer rather than the
/// tree (`digest`, `unchanged`, `delta`, `removed`): equal digests, equal
/// scans. None when an entry cannot be encoded (nothing is kept then).
pub fn digest(entries: &[TreeEntry], summary: &ScanSummary) -> Option<[u8; 32]> {
    let mut hasher = blake3::Hasher::new();
    for entry in entries {
        hasher.update(&encode_frame(entry).ok()?);
    }
    let tree = ScanSummary {
        digest: None,
        unchanged: false,
        delta: false,
        removed: Vec::new(),
        ..summary.clone()
    };
    hasher.update(&encode_frame(&tree).ok()?);
    Some(*hasher.finalize().as_bytes())
}

/// What changed from `kept` to `now`, both in scan order (by path).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Delta {
    /// Entries of `now` that `kept` lacks or has otherwise, in scan order.
    pub changed: Vec<TreeEntry>,
    /// Paths of `kept` that `now` lacks, in scan order.
    pub removed: Vec<RelPath>,
}

impl Delta {
    /// Whether sending it is worth it over sending `now` whole: at most
    /// half as many items, and few removed paths (they travel in one frame).
    pub fn worth_it(&self, now: &[TreeEntry]) -> bool {
        let removed_bytes: usize = self.removed.iter().map(|p| p.len() + 2).sum();
        (self.changed.len() + self.removed.len()) * 2 <= now.len() && removed_bytes <= 1 << 20
    }
}

/// The changes from `kept` to `now`, both sorted by path as scans are.
pub fn delta(kept: &[TreeEntry], now: &[TreeEntry]) -> Delta {
    let mut out = Delta::default();
    let (mut k, mut n) = (kept.iter().peekable(), now.iter().peekable());
    loop {
        match (k.peek(), n.peek()) {
            (None, None) => return out,
            (Some(old), Some(new)) if old.path == new.path => {
                if old != new {
                    out.changed.push((*new).clone());
                }
                k.next();
                n.next();
            }
            (Some(old), Some(new)) if old.path < new.path => {
                out.removed.push(old.path.clone());
                k.next();
            }
            (Some(old), None) => {
                out.removed.push(old.path.clone());
                k.next();
            }
            (_, Some(new)) => {
                out.changed.push((*new).clone());
                n.next();
            }
        }
    }
}

/// `kept` with `removed` taken out and `changed` put in, in scan order; None
/// when the two do not fit `kept` (out of order, or a removed path it lacks).
pub fn patched(
    kept: &[TreeEntry],
    changed: Vec<TreeEntry>,
    removed: &[RelPath],
) -> Option<Vec<TreeEntry>> {
    if !ascending(changed.iter().map(|e| &e.path)) || !ascending(removed.iter()) {
        return None;
    }
    let mut out = Vec::with_capacity(kept.len() + changed.len());
    let mut removed = removed.iter().peekable();
    let mut changed = changed.into_iter().peekable();
    for old in kept {
        while changed.peek().is_some_and(|c| c.path < old.path) {
            out.extend(changed.next());
        }
        if removed.peek() == Some(&&old.path) {
            removed.next();
            continue;
        }
        match changed.peek() {
            Some(c) if c.path == old.path => out.extend(changed.next()),
            _ => out.push(old.clone()),
        }
    }
    out.extend(changed);
    removed.next().is_none().then_some(out)
}

fn ascending<'a>(mut paths: impl Iterator<Item = &'a RelPath>) -> bool {
    let mut last: Option<&RelPath> = None;
    paths.all(|p| last.replace(p).is_none_or(|before| before < p))
}

/// Entries kept in all by one [`KeptScans`]; the least recently used scans
/// go first.
const KEPT_ENTRIES: usize = 100_000;

/// The last scan of each key, with its digest, at most [`KEPT_ENTRIES`]
/// entries in all. A kept scan is only ever used where the other side
/// names the same digest, so a key serves finding one, never correctness.
pub struct KeptScans<K> {
    /// Most recently used last.
    kept: Mutex<Vec<Kept<K>>>,
}

struct Kept<K> {
    key: K,
    digest: [u8; 32],
    entries: Arc<Vec<TreeEntry>>,
}

impl<K: PartialEq> KeptScans<K> {
    pub const fn new() -> KeptScans<K> {
        KeptScans {
            kept: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Kept<K>>> {
        // Plain data: a panic elsewhere leaves it consistent.
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The kept scan of `key`: its digest and entries.
    pub fn get(&self, key: &K) -> Option<([u8; 32], Arc<Vec<TreeEntry>>)> {
        let mut kept = self.lock();
        let at = kept.iter().position(|k| k.key == *key)?;
        let found = kept.remove(at);
        let answer = (found.digest, Arc::clone(&found.entries));
        kept.push(found);
        Some(answer)
    }

    /// Whether a scan is kept under a key that `wanted` accepts.
    pub fn holds(&self, wanted: impl Fn(&K) -> bool) -> bool {
        self.lock().iter().any(|k| wanted(&k.key))
    }

    /// Keeps `entries` as the scan of `key` with `digest`, in place of any
    /// earlier one; a scan larger than half the allowance is not kept.
    pub fn keep(&self, key: K, digest: [u8; 32], entries: Arc<Vec<TreeEntry>>) {
        let mut kept = self.lock();
        kept.retain(|k| k.key != key);
        if entries.len() > KEPT_ENTRIES / 2 {
            return;
        }
        let mut total = kept.iter().map(|k| k.entries.len()).sum::<usize>() + entries.len();
        while total > KEPT_ENTRIES && !kept.is_empty() {
            total -= kept.remove(0).entries.len();
        }
        kept.push(Kept {
            key,
            digest,
            entries,
        });
    }
}

impl<K: PartialEq> Default for KeptScans<K> {
    fn default() -> Self {
        KeptScans::new()
    }
}

#[cfg(test)]
mod tests {
    use outpost_protocol::EntryKind;

    use super::*;

    fn file(path: &str, size: u64) -> TreeEntry {
        TreeEntry {
            path: path.as_bytes().to_vec(),
            kind: EntryKind::File,
            mode: 0o644,
            size,
            mtime_ns: 1,
            hash: Some([size as u8; 32]),
            chunks: Vec::new(),
        }
    }

    fn tree(files: &[(&str, u64)]) -> Vec<TreeEntry> {
        files.iter().map(|(p, s)| file(p, *s)).collect()
    }

    #[test]
    fn a_delta_patched_onto_the_kept_scan_is_the_new_scan() {
        let kept = tree(&[("a", 1), ("b/x", 2), ("b/y", 3), ("c", 4), ("e", 5)]);
        let now = tree(&[("0", 9), ("a", 1), ("b/y", 7), ("d", 8), ("e", 5), ("f", 6)]);
        let d = delta(&kept, &now);
        assert_eq!(d.changed, tree(&[("0", 9), ("b/y", 7), ("d", 8), ("f", 6)]));
        assert_eq!(d.removed, vec![b"b/x".to_vec(), b"c".to_vec()]);
        assert_eq!(patched(&kept, d.changed, &d.removed), Some(now.clone()));
        // Nothing changed, everything gone, everything new.
        assert_eq!(delta(&now, &now), Delta::default());
        let gone = delta(&kept, &[]);
        assert_eq!(patched(&kept, gone.changed, &gone.removed), Some(vec![]));
        let new = delta(&[], &now);
        assert_eq!(patched(&[], new.changed, &new.removed), Some(now));
    }

    #[test]
    fn a_delta_that_does_not_fit_the_kept_scan_is_refused() {
        let kept = tree(&[("a", 1), ("c", 3)]);
        assert_eq!(patched(&kept, vec![], &[b"b".to_vec()]), None);
        assert_eq!(patched(&kept, tree(&[("d", 1), ("b", 1)]), &[]), None);
        assert_eq!(
            patched(&kept, vec![], &[b"c".to_vec(), b"a".to_vec()]),
            None
        );
    }

    #[test]
    fn the_digest_is_of_the_tree_not_of_the_answer() {
        let entries = tree(&[("a", 1)]);
        let summary = ScanSummary {
            root_exists: true,
            ..ScanSummary::default()
        };
        let answered = ScanSummary {
            digest: Some([1; 32]),
            unchanged: true,
            delta: true,
            removed: vec![b"z".to_vec()],
            ..summary.clone()
        };
        assert_eq!(digest(&entries, &summary), digest(&entries, &answered));
        assert_ne!(
            digest(&entries, &summary),
            digest(&tree(&[("a", 2)]), &summary)
        );
        let missing = ScanSummary {
            root_exists: false,
            ..summary.clone()
        };
        assert_ne!(digest(&entries, &summary), digest(&entries, &missing));
    }

    #[test]
    fn kept_scans_stay_within_their_allowance() {
        let kept = KeptScans::new();
        let big = Arc::new(vec![file("a", 1); KEPT_ENTRIES / 2]);
        kept.keep(1, [1; 32], Arc::clone(&big));
        kept.keep(2, [2; 32], Arc::clone(&big));
        assert!(kept.get(&1).is_some() && kept.get(&2).is_some());
        assert!(kept.holds(|k| *k == 2) && !kept.holds(|k| *k == 3));
        // The least recently used goes first: 1 was asked for before 2.
        kept.keep(3, [3; 32], Arc::new(tree(&[("b", 1)])));
        assert!(kept.get(&1).is_none() && kept.get(&2).is_some());
        // Keeping a key again replaces its scan; one too large is not kept.
        kept.keep(3, [4; 32], Arc::new(vec![]));
        assert_eq!(kept.get(&3).map(|(d, _)| d), Some([4; 32]));
        kept.keep(3, [5; 32], Arc::new(vec![file("a", 1); KEPT_ENTRIES]));
        assert!(kept.get(&3).is_none());
    }
}
