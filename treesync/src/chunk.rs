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

pub const CHUNK_MIN: usize = 16 * 1024;
pub const CHUNK_AVG: usize = 64 * 1024;
pub const CHUNK_MAX: usize = 256 * 1024;

/// Read size for large files: big enough that syscalls are noise next to
/// hashing, small enough to stay in cache.
const READ_BUF: usize = 2 << 20;

/// BLAKE3 of the whole file and, when `chunks`, its FastCDC chunks
/// (min 16 KiB, average 64 KiB, max 256 KiB), read in one pass.
pub fn hash_file(path: &Path, chunks: bool) -> std::io::Result<([u8; 32], Vec<ChunkRef>)> {
    let mut file = File::open(path)?;
    let mut buf = Vec::new();
    let (hash, list, _) = hash_reader(&mut file, chunks, &mut buf)?;
    Ok((hash, list))
}

/// Hashes everything `reader` yields; returns the hash, the chunks (when
/// asked) and the number of bytes read. `buf` is reused between calls.
pub(crate) fn hash_reader<R: Read>(
    reader: &mut R,
    chunks: bool,
    buf: &mut Vec<u8>,
) -> io::Result<([u8; 32], Vec<ChunkRef>, u64)> {
    if buf.len() < READ_BUF {
        buf.resize(READ_BUF, 0);
    }
    let mut hasher = blake3::Hasher::new();
    let mut list = Vec::new();
    let (mask_s, mask_l) = select_masks(CHUNK_AVG, Normalization::Level1);
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
            while pos < end && (eof || end - pos >= CHUNK_MAX) {
                let (_, len) = cut(
                    &buf[pos..end],
                    CHUNK_MIN,
                    CHUNK_AVG,
                    CHUNK_MAX,
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
        let data = pseudo_random(3 * 1024 * 1024 + 12345, 7);
        let expected: Vec<(u64, usize)> =
            fastcdc::v2020::StreamCDC::new(&data[..], CHUNK_MIN, CHUNK_AVG, CHUNK_MAX)
                .map(|c| {
                    let c = c.unwrap();
                    (c.offset, c.length)
                })
                .collect();
        let mut buf = Vec::new();
        let (hash, list, total) = hash_reader(&mut &data[..], true, &mut buf).unwrap();
        let got: Vec<(u64, usize)> = list.iter().map(|c| (c.offset, c.len as usize)).collect();
        assert_eq!(got, expected);
        assert_eq!(total, data.len() as u64);
        assert_eq!(hash, *blake3::hash(&data).as_bytes());
        for c in &list {
            let s = &data[c.offset as usize..c.offset as usize + c.len as usize];
            assert_eq!(c.hash, *blake3::hash(s).as_bytes());
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
