//! Content-defined chunking (FastCDC) and whole-file hashing.
//!
//! A large file is described by its BLAKE3 hash and by a list of chunks whose
//! boundaries depend on the content (FastCDC 2020), so inserting or changing a
//! few bytes moves only the boundaries next to the edit and the receiver can
//! reuse every other chunk it already has.
//!
//! The chunker here is `fastcdc::v2020::cut` driven over one large read
//! buffer instead of `StreamCDC`, which copies every chunk out and shifts its
//! buffer after each one; the cut points are identical (a test checks it).

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use fastcdc::v2020::{Normalization, cut, select_masks};
use outpost_protocol::ChunkRef;

/// Files at least this large get chunk lists, so an edit resends only the
/// changed chunks.
pub const CHUNKED_MIN_SIZE: u64 = 1 << 20;

/// Chunk sizes for a file: FastCDC's minimum, average and maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSizes {
    pub min: usize,
    pub avg: usize,
    pub max: usize,
}

/// Smallest average chunk: an edit costs about this much on the wire, a
/// chunk or two (a 4 KiB edit in a 20 MB file: 35 KiB on average over 40
/// places, where rsync sends ~70 KiB; 59 KiB with 32 KiB chunks, 119 KiB
/// with 64 KiB), while a chunk list stays at most [`TARGET_CHUNKS`] entries
/// for files up to 128 MiB.
const AVG_MIN: usize = 16 * 1024;
/// Largest average chunk (fastcdc allows up to 4 MiB).
const AVG_MAX: usize = 1 << 20;
/// Chunks a file is cut into, about, before the average grows.
const TARGET_CHUNKS: u64 = 8192;

/// The chunk sizes for a file of `size` bytes: 16 KiB on average up to
/// 128 MiB, then doubling with the size up to 1 MiB (from 8 GiB), so a chunk
/// list stays a few hundred KiB where it could otherwise outgrow a frame, and
/// a 64 GiB checkpoint still gets one (3 MB) instead of being resent whole
/// after every change. Both ends derive it from the size alone, so they cut
/// a file alike; a file that crosses a tier is resent once.
pub fn chunk_sizes(size: u64) -> ChunkSizes {
    let wanted = (size / TARGET_CHUNKS).max(1).next_power_of_two();
    let avg = (wanted.min(AVG_MAX as u64) as usize).max(AVG_MIN);
    ChunkSizes {
        min: avg / 4,
        avg,
        max: avg * 4,
    }
}

/// Least read size for large files: big enough that syscalls are noise next
/// to hashing, small enough to stay in cache. The buffer must also hold two
/// maximum-size chunks.
const READ_BUF: usize = 2 << 20;

/// BLAKE3 of the whole file and, when `chunks`, its FastCDC chunks (sizes by
/// [`chunk_sizes`]), read in one pass.
pub fn hash_file(path: &Path, chunks: bool) -> std::io::Result<([u8; 32], Vec<ChunkRef>)> {
    let mut file = File::open(path)?;
    let sizes = chunk_sizes(file.metadata()?.len());
    let mut buf = Vec::new();
    let (hash, list, _) = hash_reader(&mut file, chunks.then_some(sizes), &mut buf)?;
    Ok((hash, list))
}

/// Hashes everything `reader` yields; returns the hash, the chunks (when
/// given chunk sizes) and the number of bytes read. `buf` is reused between
/// calls.
pub(crate) fn hash_reader<R: Read>(
    reader: &mut R,
    sizes: Option<ChunkSizes>,
    buf: &mut Vec<u8>,
) -> io::Result<([u8; 32], Vec<ChunkRef>, u64)> {
    let chunks = sizes.is_some();
    let sizes = sizes.unwrap_or(chunk_sizes(0));
    let want = READ_BUF.max(2 * sizes.max);
    if buf.len() < want {
        buf.resize(want, 0);
    }
    let mut hasher = blake3::Hasher::new();
    let mut list = Vec::new();
    let (mask_s, mask_l) = select_masks(sizes.avg, Normalization::Level1);
    // buf[pos..end] holds bytes read but not yet cut into chunks.
    let mut pos = 0usize;
    let mut end = 0usize;
    let mut offset = 0u64; // file offset of buf[pos]
    let mut eof = false;
    let mut total = 0u64;
    loop {
        if !eof {
            if chunks && pos > 0 {
                buf.copy_within(pos..end, 0);
                end -= pos;
                pos = 0;
            } else if !chunks {
                pos = 0;
                end = 0;
            }
            while end < buf.len() {
                match reader.read(&mut buf[end..]) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(n) => {
                        hasher.update(&buf[end..end + n]);
                        end += n;
                        total += n as u64;
                    }
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                    Err(err) => return Err(err),
                }
            }
        }
        if chunks {
            // Cut only when a whole maximum-size window is available (or the
            // file has ended), exactly as a streaming chunker would.
            while pos < end && (eof || end - pos >= sizes.max) {
                let (_, len) = cut(
                    &buf[pos..end],
                    sizes.min,
                    sizes.avg,
                    sizes.max,
                    mask_s,
                    mask_l,
                    mask_s << 1,
                    mask_l << 1,
                );
                let data = &buf[pos..pos + len];
                list.push(ChunkRef {
                    offset,
                    len: len as u32,
                    hash: *blake3::hash(data).as_bytes(),
                });
                pos += len;
                offset += len as u64;
            }
        }
        if eof {
            return Ok((*hasher.finalize().as_bytes(), list, total));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{TempDir, pseudo_random};

    #[test]
    fn same_cuts_as_streamcdc() {
        // The smallest tier, and the largest (whose chunks outgrow the
        // default read buffer).
        for (len, sizes) in [
            (3 * 1024 * 1024 + 12345, chunk_sizes(0)),
            (21 * 1024 * 1024 + 777, chunk_sizes(1 << 40)),
        ] {
            let data = pseudo_random(len, 7);
            let expected: Vec<(u64, usize)> =
                fastcdc::v2020::StreamCDC::new(&data[..], sizes.min, sizes.avg, sizes.max)
                    .map(|c| {
                        let c = c.unwrap();
                        (c.offset, c.length)
                    })
                    .collect();
            let mut buf = Vec::new();
            let (hash, list, total) = hash_reader(&mut &data[..], Some(sizes), &mut buf).unwrap();
            let got: Vec<(u64, usize)> = list.iter().map(|c| (c.offset, c.len as usize)).collect();
            assert_eq!(got, expected);
            assert_eq!(total, data.len() as u64);
            assert_eq!(hash, *blake3::hash(&data).as_bytes());
            for c in &list {
                let s = &data[c.offset as usize..c.offset as usize + c.len as usize];
                assert_eq!(c.hash, *blake3::hash(s).as_bytes());
            }
        }
    }

    #[test]
    fn chunk_sizes_grow_with_the_file_in_tiers() {
        const MIB: u64 = 1 << 20;
        const GIB: u64 = 1 << 30;
        let avg = |size| chunk_sizes(size).avg as u64;
        assert_eq!(avg(0), 16 * 1024);
        assert_eq!(avg(20 * MIB), 16 * 1024);
        assert_eq!(avg(128 * MIB), 16 * 1024);
        assert_eq!(avg(256 * MIB), 32 * 1024);
        assert_eq!(avg(512 * MIB), 64 * 1024);
        assert_eq!(avg(600 * MIB), 128 * 1024);
        assert_eq!(avg(GIB), 128 * 1024);
        assert_eq!(avg(10 * GIB), MIB);
        assert_eq!(avg(1 << 50), MIB);
        for size in [0, 20 * MIB, 3 * GIB, 64 * GIB] {
            let s = chunk_sizes(size);
            assert_eq!((s.min * 4, s.max), (s.avg, s.avg * 4));
            // About TARGET_CHUNKS chunks or fewer, up to the largest tier;
            // at 64 GiB 65,536 chunks of ~47 bytes: 3 MB, under the 4 MiB
            // an entry may take in a scan answer.
            assert!(size / s.avg as u64 <= 65_536, "{size}");
        }
    }

    #[test]
    fn without_chunks_and_empty() {
        let t = TempDir::new();
        let p = t.path().join("f");
        let data = pseudo_random(5 * 1024 * 1024 + 3, 1);
        std::fs::write(&p, &data).unwrap();
        let (hash, list) = hash_file(&p, false).unwrap();
        assert_eq!(hash, *blake3::hash(&data).as_bytes());
        assert!(list.is_empty());
        std::fs::write(&p, b"").unwrap();
        let (hash, list) = hash_file(&p, true).unwrap();
        assert_eq!(hash, *blake3::hash(b"").as_bytes());
        assert!(list.is_empty());
    }
}
