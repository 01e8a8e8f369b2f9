//! How each changed file travels: whole in a batch with other small files
//! ([`Route::Inline`]), or in [`Part`]s (copies of chunks the receiver
//! already has, data for the rest, nothing for what a resumed partial file
//! holds) and then committed; [`Staged`], the state of one file sent in
//! parts; and [`Pace`], which keeps the two kinds in step. Push and pull
//! share all of it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

use outpost_protocol::{ChunkRef, Expect, FileContent, FilePut, TreeEntry};
use outpost_treesync::plan::FileChange;

use super::limits::{INLINE_MAX, REQUEST_BYTES};

/// One piece of a file sent in parts, at `offset` in the new file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// Bytes the receiver already has, at `from` in its current file.
    Copy { offset: u64, from: u64, len: u64 },
    /// Bytes to send.
    Data { offset: u64, len: u64 },
}

impl Part {
    pub(super) fn len(&self) -> u64 {
        match *self {
            Part::Copy { len, .. } | Part::Data { len, .. } => len,
        }
    }
}

/// How far a sync's small files (whole, in batches) and its large ones (in
/// parts) have gone, each as its share of its own bytes. A batch of small
/// files goes whenever their share is behind, so the receiver creates,
/// flushes and renames small files (a matter of the disk's latency) while
/// the large ones stream (of the link's bandwidth), rather than one after
/// the other.
#[derive(Debug, Default)]
pub(super) struct Pace {
    small_sent: u128,
    small_total: u128,
    large_sent: u128,
    large_total: u128,
}

impl Pace {
    /// For the small files `small` and the large files `large`.
    pub(super) fn new<'a>(
        small: impl Iterator<Item = &'a FileChange>,
        large: impl Iterator<Item = &'a FileChange>,
    ) -> Pace {
        let size = |c: &FileChange| u128::from(c.src.size);
        Pace {
            small_total: small.map(size).sum(),
            large_total: large.map(size).sum(),
            ..Pace::default()
        }
    }

    /// Whether small files go next.
    pub(super) fn small_behind(&self) -> bool {
        self.small_sent * self.large_total <= self.large_sent * self.small_total
    }

    /// Small files' bytes sent (or skipped).
    pub(super) fn small(&mut self, bytes: u64) {
        self.small_sent += u128::from(bytes);
    }

    /// Large files' bytes sent, skipped, or already held by the receiver.
    pub(super) fn large(&mut self, bytes: u64) {
        self.large_sent += u128::from(bytes);
    }

    /// Every large file is on its way: the small ones left go now.
    pub(super) fn large_done(&mut self) {
        self.large_sent = self.large_total;
    }
}

/// How a changed file travels.
pub(super) enum Route {
    /// Whole, compressed, in a batch with other small files.
    Inline,
    /// In parts, then committed.
    Parts(Vec<Part>),
}

pub(super) fn route(change: &FileChange) -> Route {
    let dst_chunks = change.dst.as_ref().map_or(&[][..], |d| &d.chunks[..]);
    if !change.src.chunks.is_empty() && !dst_chunks.is_empty() {
        Route::Parts(plan_parts(
            change.src.size,
            &change.src.chunks,
            dst_chunks,
            REQUEST_BYTES,
            &HashSet::new(),
        ))
    } else if change.src.size <= INLINE_MAX {
        Route::Inline
    } else {
        Route::Parts(plan_parts(
            change.src.size,
            &[],
            &[],
            REQUEST_BYTES,
            &HashSet::new(),
        ))
    }
}

/// The hash and size of a change's new content.
pub(super) fn content_of(change: &FileChange) -> ([u8; 32], u64) {
    (change.src.hash.unwrap_or_default(), change.src.size)
}

/// A resumed file's parts: what the partial file does not hold yet (copied
/// from the current file where it has it). Returns the bytes held and the
/// parts.
pub(super) fn resume_plan(change: &FileChange, present: &[u32]) -> (u64, Vec<Part>) {
    let src = &change.src;
    let in_place: HashSet<u32> = present
        .iter()
        .copied()
        .filter(|&i| (i as usize) < src.chunks.len())
        .collect();
    let held = in_place
        .iter()
        .map(|&i| u64::from(src.chunks[i as usize].len))
        .sum();
    let dst_chunks = change.dst.as_ref().map_or(&[][..], |d| &d.chunks[..]);
    let parts = plan_parts(src.size, &src.chunks, dst_chunks, REQUEST_BYTES, &in_place);
    (held, parts)
}

/// Describes a file of `size` bytes made of `src` chunks as parts: a chunk
/// the receiver's current file also has (same hash) is copied from there,
/// anything else is sent, and chunks whose indices are `in_place` (a resumed
/// partial file holds them) need nothing. Adjacent copies from adjacent
/// places become one copy; adjacent data becomes one part of at most
/// `max_data` bytes. Chunk lists that do not tile the file exactly (none, or
/// a file changed while it was described) fall back to sending everything.
pub(super) fn plan_parts(
    size: u64,
    src: &[ChunkRef],
    dst: &[ChunkRef],
    max_data: u64,
    in_place: &HashSet<u32>,
) -> Vec<Part> {
    let mut parts: Vec<Part> = Vec::new();
    if !tiles(src, size) {
        let mut offset = 0;
        while offset < size {
            let len = max_data.min(size - offset);
            parts.push(Part::Data { offset, len });
            offset += len;
        }
        return parts;
    }
    let mut have: HashMap<[u8; 32], u64> = HashMap::with_capacity(dst.len());
    for chunk in dst {
        have.entry(chunk.hash).or_insert(chunk.offset);
    }
    for (index, chunk) in src.iter().enumerate() {
        if in_place.contains(&(index as u32)) {
            continue;
        }
        let len = u64::from(chunk.len);
        let part = match have.get(&chunk.hash) {
            Some(&from) => Part::Copy {
                offset: chunk.offset,
                from,
                len,
            },
            None => Part::Data {
                offset: chunk.offset,
                len,
            },
        };
        // Only neighbours merge: a chunk left out in between breaks a run.
        match (parts.last_mut(), part) {
            (
                Some(Part::Copy {
                    offset: prev_offset,
                    from: prev_from,
                    len: prev_len,
                }),
                Part::Copy { offset, from, len },
            ) if *prev_from + *prev_len == from && *prev_offset + *prev_len == offset => {
                *prev_len += len
            }
            (
                Some(Part::Data {
                    offset: prev_offset,
                    len: prev_len,
                }),
                Part::Data { offset, len },
            ) if *prev_len + len <= max_data && *prev_offset + *prev_len == offset => {
                *prev_len += len
            }
            _ => parts.push(part),
        }
    }
    split_data(parts, max_data)
}

/// Splits data parts longer than `max` (one chunk of a very large file can
/// be up to 4 MiB) so no request outgrows its budget.
fn split_data(parts: Vec<Part>, max: u64) -> Vec<Part> {
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        match part {
            Part::Data { offset, len } if len > max => {
                let mut at = 0;
                while at < len {
                    let piece = max.min(len - at);
                    out.push(Part::Data {
                        offset: offset + at,
                        len: piece,
                    });
                    at += piece;
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// Whether `chunks` cover `0..size` exactly, in order.
pub(super) fn tiles(chunks: &[ChunkRef], size: u64) -> bool {
    let mut end = 0u64;
    for chunk in chunks {
        if chunk.offset != end || chunk.len == 0 {
            return false;
        }
        end += u64::from(chunk.len);
    }
    !chunks.is_empty() && end == size
}

/// Groups consecutive data parts into reads of at most `max` bytes each.
pub(super) fn group_ranges(parts: &[Part], max: u64) -> Vec<Vec<(u64, u64)>> {
    let mut groups = Vec::new();
    let mut group = Vec::new();
    let mut bytes = 0;
    for part in parts {
        if let Part::Data { offset, len } = *part {
            if !group.is_empty() && bytes + len > max {
                groups.push(std::mem::take(&mut group));
                bytes = 0;
            }
            bytes += len;
            group.push((offset, len));
        }
    }
    if !group.is_empty() {
        groups.push(group);
    }
    groups
}

/// What a write must find at its path: nothing for a new file, else the file
/// the plan saw, so a change made meanwhile is never overwritten.
pub(super) fn expect_of(dst: &Option<TreeEntry>) -> Expect {
    match dst {
        None => Expect::Absent,
        Some(d) => Expect::File {
            size: d.size,
            mtime_ns: d.mtime_ns,
        },
    }
}

/// A file's put, content aside.
pub(super) fn put_of(change: &FileChange, hash: [u8; 32], content: FileContent) -> FilePut {
    FilePut {
        path: change.src.path.clone(),
        mode: change.src.mode,
        mtime_ns: change.src.mtime_ns,
        size: change.src.size,
        hash,
        expect: expect_of(&change.dst),
        content,
    }
}

/// Unique transfer ids for this process: appliers are per root and
/// connection, and two syncs of one process may share both.
pub(super) fn next_xfer() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A file sent in parts.
pub(super) struct Staged {
    pub(super) change: FileChange,
    pub(super) xfer: u64,
    /// The receiver holds staging for this transfer (a resume began it, or a
    /// part was sent): a transfer given up must be aborted there.
    pub(super) begun: bool,
    pub(super) sent: usize,
    pub(super) settled: usize,
    pub(super) all_sent: bool,
    pub(super) failed: bool,
    pub(super) resolved: bool,
    pub(super) committed: bool,
    /// Bytes of the file already counted in the progress.
    pub(super) counted: u64,
}

impl Staged {
    pub(super) fn new(change: FileChange) -> Staged {
        Staged {
            change,
            xfer: next_xfer(),
            begun: false,
            sent: 0,
            settled: 0,
            all_sent: false,
            failed: false,
            resolved: false,
            committed: false,
            counted: 0,
        }
    }

    /// Whether every part sent has been answered and no more will be sent.
    pub(super) fn is_settled(&self) -> bool {
        self.all_sent && self.settled == self.sent && !self.resolved
    }
}
