//! File content on the wire: a tag byte, then the content either stored as
//! it is or as zstd frames.
//!
//! Content that would not shrink (compressed media, model weights) is
//! stored: neither side spends a pass over it, and the receiver hashes and
//! writes it straight from the frame it arrived in.
//!
//! The peer is not trusted to be honest about sizes: every decompression has
//! an output bound, and a frame that would exceed it is an error before the
//! memory is spent.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;

/// Level 3 (zstd's default): several hundred MB/s per core, so it keeps up
/// with any SSH link while still shrinking text well.
const LEVEL: i32 = 3;

/// Largest decoder window accepted (16 MiB). Our encoder's level uses far
/// less; a frame asking for more is refused instead of allocated.
const WINDOW_LOG_MAX: u32 = 24;

/// The tag of stored content.
const STORED: u8 = 0;
/// The tag of content as one or more zstd frames.
pub(crate) const ZSTD: u8 = 1;

/// Bytes sampled to judge compressibility.
const SAMPLE: usize = 64 * 1024;

/// Encodes content: zstd at a fast level (the link, not the CPU, is usually
/// the limit), or stored when a sample does not shrink by 5 %, when small
/// content's bytes look uniformly random, or when zstd's output would not
/// be smaller.
pub fn compress(data: &[u8]) -> Vec<u8> {
    if looks_incompressible(data) {
        return stored(data);
    }
    zstd_or_stored(data)
}

/// Up to `len` bytes of `file` at `offset` (fewer only at its end),
/// encoded, and how many there were: read straight into the stored
/// encoding (no buffer zeroed first), and kept there, uncopied, when a
/// sample shows they would not compress.
pub fn read_at(file: &File, offset: u64, len: usize) -> io::Result<(Vec<u8>, usize)> {
    let room = len
        .checked_add(1)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut blob = Vec::with_capacity(room);
    blob.push(STORED);
    let n = crate::sys::pread_append(file.as_fd(), &mut blob, len, offset)?;
    if looks_incompressible(&blob[1..]) {
        return Ok((blob, n));
    }
    Ok((zstd_or_stored(&blob[1..]), n))
}

fn looks_incompressible(data: &[u8]) -> bool {
    looks_random(data) || (data.len() > 2 * SAMPLE && !compressible(&data[..SAMPLE]))
}

/// Whether windows of `data` spread over it (all of it, up to 8 KiB) pass
/// a chi-square test of uniform bytes, as compressed or encrypted content
/// does. Such content is stored without trying zstd, which costs many times
/// this count for nothing: on a small file its setup, match search and a
/// Huffman table it gives up on; on a piece of a large one the 64 KiB
/// sample. Passing means an order-0 entropy within about 0.05 bits of 8, so
/// entropy coding could save under 1 %; the repeats a dictionary coder
/// would find in such bytes are rare in real files, and are only sent as
/// they are.
fn looks_random(data: &[u8]) -> bool {
    // Below this, counts per byte value are too few for the test, and
    // zstd's cost too small to matter.
    const MIN: usize = 512;
    const WINDOW: usize = 1024;
    const WINDOWS: usize = 8;
    if data.len() < MIN {
        return false;
    }
    let step = match data.len() <= WINDOW * WINDOWS {
        true => WINDOW,
        false => (data.len() - WINDOW) / (WINDOWS - 1),
    };
    let mut counts = [0u32; 256];
    let mut n = 0;
    for start in (0..WINDOWS)
        .map(|i| i * step)
        .take_while(|&s| s < data.len())
    {
        let window = &data[start..data.len().min(start + WINDOW)];
        for &b in window {
            counts[usize::from(b)] += 1;
        }
        n += window.len() as u64;
        // Content that is not random nearly always shows it at once.
        if start == 0 && !uniform(&counts, n) {
            return false;
        }
    }
    uniform(&counts, n)
}

/// chi² = Σ (c - n/256)² / (n/256) = 256 Σ c² / n - n. For uniform bytes
/// its mean is 255 and its deviation about 22.6: 400 is over six
/// deviations above the mean.
fn uniform(counts: &[u32; 256], n: u64) -> bool {
    let squares: u64 = counts.iter().map(|&c| u64::from(c) * u64::from(c)).sum();
    256 * squares < (400 + n) * n
}

fn stored(data: &[u8]) -> Vec<u8> {
    let mut blob = Vec::with_capacity(1 + data.len());
    blob.push(STORED);
    blob.extend_from_slice(data);
    blob
}

fn zstd_or_stored(data: &[u8]) -> Vec<u8> {
    let mut blob = vec![ZSTD; 1 + zstd::zstd_safe::compress_bound(data.len())];
    // Compressing into a buffer we sized with zstd's own bound cannot fail.
    let n = with_compressor(LEVEL, |c| c.compress_to_buffer(data, &mut blob[1..]))
        .expect("zstd compression into a bounded buffer");
    if n >= data.len() {
        return stored(data);
    }
    blob.truncate(1 + n);
    blob
}

fn compressible(sample: &[u8]) -> bool {
    with_compressor(1, |c| c.compress(sample)).is_ok_and(|c| c.len() * 100 < sample.len() * 95)
}

thread_local! {
    // One context per thread, reused: creating one allocates and clears
    // tables each time, which showed up at several percent of a bulk push.
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
    static STREAM_DECODER: RefCell<Option<(zstd::zstd_safe::DCtx<'static>, Vec<u8>)>> =
        const { RefCell::new(None) };
}

fn with_compressor<T>(
    level: i32,
    work: impl FnOnce(&mut zstd::bulk::Compressor<'static>) -> io::Result<T>,
) -> io::Result<T> {
    COMPRESSOR.with_borrow_mut(|slot| {
        let compressor = match slot {
            Some(c) => {
                c.set_compression_level(level)?;
                c
            }
            None => slot.insert(zstd::bulk::Compressor::new(level)?),
        };
        work(compressor)
    })
}

fn with_decompressor<T>(
    work: impl FnOnce(&mut zstd::bulk::Decompressor<'static>) -> io::Result<T>,
) -> io::Result<T> {
    DECOMPRESSOR.with_borrow_mut(|slot| {
        let decompressor = match slot {
            Some(d) => d,
            None => slot.insert(zstd::bulk::Decompressor::new()?),
        };
        work(decompressor)
    })
}

/// Splits a blob into its tag and content; an empty blob is empty content.
fn untag(blob: &[u8]) -> Result<Option<(u8, &[u8])>, String> {
    match blob.split_first() {
        None => Ok(None),
        Some((&tag, content)) if tag == STORED || tag == ZSTD => Ok(Some((tag, content))),
        Some((tag, _)) => Err(format!("unknown content encoding {tag}")),
    }
}

fn too_long(len: usize, max_len: u64) -> Result<(), String> {
    if len as u64 > max_len {
        return Err(format!(
            "content of {len} bytes, more than the {max_len} allowed"
        ));
    }
    Ok(())
}

/// Decodes, refusing output larger than `max_len` (a hostile or corrupt
/// frame must not allocate without bound).
pub fn decompress(blob: &[u8], max_len: usize) -> Result<Vec<u8>, String> {
    let data = match untag(blob)? {
        None => return Ok(Vec::new()),
        Some((STORED, content)) => {
            too_long(content.len(), max_len as u64)?;
            return Ok(content.to_vec());
        }
        Some((_, frames)) => frames,
    };
    // Fast path: a single frame that declares its size (ours always do) is
    // decoded in one call into an exactly sized buffer.
    if let Ok(Some(size)) = zstd::zstd_safe::get_frame_content_size(data) {
        if size > max_len as u64 {
            return Err(format!(
                "compressed data claims {size} bytes, more than the {max_len} allowed"
            ));
        }
        // The buffer is allocated before a byte is decoded, so a size
        // claimed beyond what our own frames hold is not taken on trust:
        // the streaming path grows the output as data really comes.
        if size <= TRUSTED_SIZE
            && let Ok(out) = with_decompressor(|d| d.decompress(data, size as usize))
        {
            return Ok(out);
        }
        // Several frames, or a lying header: the streaming path decides.
    }
    let mut out = Vec::new();
    unzstd_into(data, max_len as u64, &mut |piece| {
        out.extend_from_slice(piece);
        Ok(())
    })?;
    Ok(out)
}

/// Decodes `blob` in pieces handed to `sink`, refusing output larger than
/// `max_len`. Returns the number of bytes produced. Memory stays bounded
/// whatever the frame claims, so it suits whole files written straight to
/// disk; stored content is handed over where it lies.
pub fn decompress_into(
    blob: &[u8],
    max_len: u64,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<u64, String> {
    match untag(blob)? {
        None => Ok(0),
        Some((STORED, content)) => {
            too_long(content.len(), max_len)?;
            // In pieces, so that what a sink does twice (hash and write)
            // reads from the CPU cache the second time.
            for piece in content.chunks(PIECE) {
                sink(piece).map_err(|err| format!("write failed: {err}"))?;
            }
            Ok(content.len() as u64)
        }
        Some((_, frames)) => unzstd_into(frames, max_len, sink),
    }
}

/// [`decompress_into`] for zstd frames.
fn unzstd_into(
    data: &[u8],
    max_len: u64,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<u64, String> {
    if data.is_empty() {
        return Ok(0);
    }
    STREAM_DECODER.with_borrow_mut(|slot| {
        let (dctx, buf) = match slot {
            Some(decoder) => decoder,
            None => {
                let mut dctx = zstd::zstd_safe::DCtx::try_create().ok_or("zstd: out of memory")?;
                dctx.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(WINDOW_LOG_MAX))
                    .map_err(zstd_error)?;
                slot.insert((dctx, vec![0u8; PIECE]))
            }
        };
        // Also clears the error state a corrupt frame left behind.
        dctx.reset(zstd::zstd_safe::ResetDirective::SessionOnly)
            .map_err(zstd_error)?;
        let mut input = zstd::zstd_safe::InBuffer::around(data);
        let mut total = 0u64;
        loop {
            let mut output = zstd::zstd_safe::OutBuffer::around(&mut buf[..]);
            let more = dctx
                .decompress_stream(&mut output, &mut input)
                .map_err(|code| format!("corrupt compressed data: {}", zstd_error(code)))?;
            let n = output.pos();
            total += n as u64;
            if total > max_len {
                return Err(format!(
                    "compressed data expands past the {max_len} bytes allowed"
                ));
            }
            if n > 0 {
                sink(&buf[..n]).map_err(|err| format!("write failed: {err}"))?;
            }
            if input.pos() == data.len() {
                // 0: the last frame is decoded and flushed. A full output
                // buffer may hold back more; anything else is cut short.
                if more == 0 {
                    return Ok(total);
                }
                if n < buf.len() {
                    return Err("corrupt compressed data: truncated".to_string());
                }
            }
        }
    })
}

/// Raw bytes handed to a sink at a time: small enough to stay in the CPU
/// cache between decompression and the write.
const PIECE: usize = 256 * 1024;

/// Largest declared frame size [`decompress`] allocates up front; our frames
/// hold at most a few MiB.
const TRUSTED_SIZE: u64 = 16 << 20;

fn zstd_error(code: usize) -> String {
    zstd::zstd_safe::get_error_name(code).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::pseudo_random;

    #[test]
    fn round_trip_and_bounds() {
        let data = b"hello hello hello hello".repeat(1000);
        let z = compress(&data);
        assert!(z.len() < data.len() / 10);
        assert_eq!(decompress(&z, data.len()).unwrap(), data);
        assert!(decompress(&z, data.len() - 1).is_err());
        let empty = compress(b"");
        assert_eq!(decompress(&empty, 0).unwrap(), b"");
    }

    #[test]
    fn corrupt_and_truncated() {
        let data = text(100_000);
        let z = compress(&data);
        assert_eq!(z[0], ZSTD);
        assert!(decompress(&z[..z.len() / 2], data.len()).is_err());
        assert!(decompress(b"\x01not zstd at all", 1000).is_err());
        let mut bad = z.clone();
        let mid = bad.len() / 2;
        bad[mid] ^= 0xff;
        // zstd checks its own structure, not every byte, and stored content
        // is taken as it comes: which is why every file is also checked
        // against its BLAKE3.
        if let Ok(out) = decompress(&bad, data.len()) {
            assert_ne!(out, data);
        }
    }

    /// Compressible, but not so much that zstd's output is a few bytes.
    fn text(len: usize) -> Vec<u8> {
        pseudo_random(len, 3)
            .iter()
            .map(|b| b'a' + b % 16)
            .collect()
    }

    #[test]
    fn stored_content_is_bounded_and_tags_are_checked() {
        let noise = pseudo_random(3 * SAMPLE, 7);
        let z = compress(&noise);
        assert_eq!((z[0], z.len()), (STORED, noise.len() + 1));
        assert_eq!(decompress(&z, noise.len()).unwrap(), noise);
        assert!(decompress(&z, noise.len() - 1).is_err());
        assert!(stream(&z, noise.len() as u64 - 1).is_err());
        let mut pieces = 0;
        let total = decompress_into(&z, noise.len() as u64, &mut |p| {
            assert!(p.len() <= PIECE);
            pieces += 1;
            Ok(())
        });
        assert_eq!(total, Ok(noise.len() as u64));
        assert_eq!(pieces, noise.len().div_ceil(PIECE));
        // Small content zstd cannot shrink is stored too.
        assert_eq!(compress(b"ab")[0], STORED);
        assert_eq!(decompress(&compress(b"ab"), 2).unwrap(), b"ab");
        assert!(
            decompress(&[7, 1, 2], 10)
                .unwrap_err()
                .contains("encoding 7")
        );
        assert!(stream(&[7], 10).is_err());
        // No content at all, either way.
        for empty in [&[][..], &[STORED], &[ZSTD]] {
            assert_eq!(decompress(empty, 0).unwrap(), b"");
            assert_eq!(stream(empty, 0).unwrap(), b"");
        }
    }

    #[test]
    fn content_read_in_place_encodes_as_compress_does() {
        let dir = crate::testutil::TempDir::new();
        for data in [
            pseudo_random(3 * SAMPLE, 8),
            text(3 * SAMPLE),
            b"x".to_vec(),
        ] {
            let path = dir.path().join("f");
            std::fs::write(&path, &data).unwrap();
            let file = File::open(&path).unwrap();
            let (read, n) = read_at(&file, 0, data.len()).unwrap();
            assert_eq!(n, data.len());
            assert_eq!(read, compress(&data));
            if read[0] == STORED && data.len() > 1 {
                // Kept where it was read: no second buffer.
                assert_eq!(read.capacity(), data.len() + 1);
            }
            // Short only at the end of the file; nothing past it.
            let (tail, n) = read_at(&file, 1, data.len()).unwrap();
            assert_eq!(n, data.len() - 1);
            assert_eq!(decompress(&tail, data.len()).unwrap(), &data[1..]);
            let (none, n) = read_at(&file, data.len() as u64 + 5, 10).unwrap();
            assert_eq!((decompress(&none, 0).unwrap().len(), n), (0, 0));
            assert!(read_at(&file, u64::MAX, 10).is_err());
        }
        let unreadable = File::open(dir.path()).unwrap();
        assert!(read_at(&unreadable, 0, 10).is_err());
    }

    #[test]
    fn streaming_bound_without_declared_size() {
        // A streamed frame does not declare its size; the bound must still hold.
        let data = vec![0u8; 1 << 20];
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        std::io::Write::write_all(&mut enc, &data).unwrap();
        let z = [vec![ZSTD], enc.finish().unwrap()].concat();
        assert!(decompress(&z, 1000).is_err());
        assert_eq!(decompress(&z, 1 << 20).unwrap().len(), 1 << 20);
        let mut n = 0;
        let total = decompress_into(&z, 1 << 20, &mut |p| {
            n += p.len();
            Ok(())
        })
        .unwrap();
        assert_eq!((total, n), (1 << 20, 1 << 20));
    }

    #[test]
    fn incompressible_data_is_stored() {
        // xorshift noise: nothing for zstd to find.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..(1 << 20))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        assert!(!compressible(&noise[..SAMPLE]));
        let z = compress(&noise);
        assert_eq!(z.len(), noise.len() + 1);
        assert_eq!(decompress(&z, noise.len()).unwrap(), noise);
        // Text still gets the real level.
        let text = b"the quick brown fox jumps over the lazy dog\n".repeat(4096);
        assert!(compressible(&text[..SAMPLE]));
        assert!(compress(&text).len() < text.len() / 10);
    }

    #[test]
    fn small_random_content_is_stored_without_zstd() {
        // Noise of every small size a tree holds: stored, found by its
        // byte counts alone.
        for (seed, len) in [(1, 512), (2, 1000), (3, 2048), (4, 7000), (5, 2 * SAMPLE)] {
            let noise = pseudo_random(len, seed);
            assert!(looks_random(&noise), "{len}");
            assert_eq!(compress(&noise), stored(&noise));
        }
        // Bytes of a few values, text, and skewed bytes over all 256
        // values all go to zstd, and shrink.
        let skewed: Vec<u8> = pseudo_random(16384, 9)
            .chunks(4)
            .map(|four| four.iter().copied().fold(u8::MAX, u8::min))
            .collect();
        let prose = b"fn main() { println!(\"hello, world\"); }\n".repeat(100);
        for data in [text(4096), prose, skewed] {
            assert!(!looks_random(&data));
            let z = compress(&data);
            assert_eq!(z[0], ZSTD);
            assert_eq!(decompress(&z, data.len()).unwrap(), data);
        }
        // Too few bytes to judge: zstd decides (and stores what it cannot
        // shrink).
        assert!(!looks_random(&pseudo_random(511, 10)));
    }

    fn stream(data: &[u8], max_len: u64) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        decompress_into(data, max_len, &mut |p| {
            out.extend_from_slice(p);
            Ok(())
        })?;
        Ok(out)
    }

    #[test]
    fn streaming_decoder_is_reused_safely() {
        // Exact multiples of the piece size, concatenated frames, truncation,
        // and a corrupt frame followed by a good one on the same thread's
        // decoder (an error must not poison the next call).
        let data = text(4 * PIECE);
        let z = compress(&data);
        assert_eq!(z[0], ZSTD);
        assert_eq!(stream(&z, data.len() as u64).unwrap(), data);
        let mut two = vec![ZSTD];
        two.extend(zstd::bulk::compress(b"first ", 3).unwrap());
        two.extend(zstd::bulk::compress(b"second", 3).unwrap());
        assert_eq!(stream(&two, 100).unwrap(), b"first second");
        assert!(stream(&z[..z.len() - 3], data.len() as u64).is_err());
        assert!(stream(&z[..z.len() / 2], data.len() as u64).is_err());
        assert!(stream(b"\x01not zstd at all", 1000).is_err());
        assert_eq!(stream(&z, data.len() as u64).unwrap(), data);
        assert!(stream(&z, data.len() as u64 - 1).is_err());
        assert_eq!(stream(b"", 0).unwrap(), b"");
        // A sink error stops the decoding and is reported.
        let failed = decompress_into(&z, data.len() as u64, &mut |_| {
            Err(io::Error::other("disk full"))
        });
        assert!(failed.unwrap_err().contains("disk full"));
    }

    #[test]
    fn a_frame_claiming_a_huge_size_is_not_allocated_up_front() {
        // Magic, a single-segment header with an 8-byte content size of
        // 1 TiB, and one raw last block of one byte.
        let mut frame = vec![ZSTD, 0x28, 0xb5, 0x2f, 0xfd, 0xe0];
        frame.extend((1u64 << 40).to_le_bytes());
        frame.extend([0x09, 0x00, 0x00, b'x']);
        assert!(matches!(
            zstd::zstd_safe::get_frame_content_size(&frame[1..]),
            Ok(Some(size)) if size == 1 << 40
        ));
        assert!(decompress(&frame, 1 << 20).is_err());
        // Allowed any size, it is still an error (it ends early), found
        // without reserving a terabyte.
        assert!(decompress(&frame, usize::MAX).is_err());
    }

    #[test]
    fn frames_asking_for_a_huge_window_are_refused() {
        let data = pseudo_random(1 << 16, 4);
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        enc.window_log(WINDOW_LOG_MAX + 2).unwrap();
        enc.long_distance_matching(true).unwrap();
        enc.include_contentsize(false).unwrap();
        std::io::Write::write_all(&mut enc, &data).unwrap();
        let z = [vec![ZSTD], enc.finish().unwrap()].concat();
        assert!(stream(&z, 1 << 20).is_err());
    }
}
