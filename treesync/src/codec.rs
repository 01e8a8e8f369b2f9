//! zstd for file content on the wire.
//!
//! The peer is not trusted to be honest about sizes: every decompression has
//! an output bound, and a frame that would exceed it is an error before the
//! memory is spent.

use std::io::{self, Read};

/// Level 3 (zstd's default): several hundred MB/s per core, so it keeps up
/// with any SSH link while still shrinking text well.
const LEVEL: i32 = 3;

/// Largest decoder window accepted (16 MiB). Our encoder's level uses far
/// less; a frame asking for more is refused instead of allocated.
const WINDOW_LOG_MAX: u32 = 24;

/// zstd's fastest level, for data a sample shows to be incompressible
/// (already compressed media, model weights): it emits raw blocks at close to
/// memory speed instead of spending level 3's effort for nothing.
const LEVEL_INCOMPRESSIBLE: i32 = -7;

/// Bytes sampled to judge compressibility.
const SAMPLE: usize = 64 * 1024;

/// Compresses at a fast level (the link, not the CPU, is usually the limit);
/// data whose sample does not shrink by 5 % gets the fastest level.
pub fn compress(data: &[u8]) -> Vec<u8> {
    let level = if data.len() > 2 * SAMPLE && !compressible(&data[..SAMPLE]) {
        LEVEL_INCOMPRESSIBLE
    } else {
        LEVEL
    };
    // Compressing into a buffer we sized with zstd's own bound cannot fail.
    zstd::bulk::compress(data, level).expect("zstd compression into a bounded buffer")
}

fn compressible(sample: &[u8]) -> bool {
    zstd::bulk::compress(sample, 1).is_ok_and(|c| c.len() * 100 < sample.len() * 95)
}

/// Decompresses, refusing output larger than `max_len` (a hostile or corrupt
/// frame must not allocate without bound).
pub fn decompress(data: &[u8], max_len: usize) -> Result<Vec<u8>, String> {
    // Fast path: a single frame that declares its size (ours always do) is
    // decoded in one call into an exactly sized buffer.
    if let Ok(Some(size)) = zstd::zstd_safe::get_frame_content_size(data) {
        if size > max_len as u64 {
            return Err(format!(
                "compressed data claims {size} bytes, more than the {max_len} allowed"
            ));
        }
        if let Ok(out) = zstd::bulk::decompress(data, size as usize) {
            return Ok(out);
        }
        // Several frames, or a lying header: the streaming path decides.
    }
    let mut out = Vec::new();
    decompress_into(data, max_len as u64, &mut |piece| {
        out.extend_from_slice(piece);
        Ok(())
    })?;
    Ok(out)
}

/// Decompresses `data` in pieces handed to `sink`, refusing output larger than
/// `max_len`. Returns the number of bytes produced. Memory stays bounded
/// whatever the frame claims, so it suits whole files written straight to disk.
pub fn decompress_into(
    data: &[u8],
    max_len: u64,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<u64, String> {
    let mut decoder =
        zstd::stream::read::Decoder::with_buffer(data).map_err(|err| format!("zstd: {err}"))?;
    decoder
        .window_log_max(WINDOW_LOG_MAX)
        .map_err(|err| format!("zstd: {err}"))?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = match decoder.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(format!("corrupt compressed data: {err}")),
        };
        total += n as u64;
        if total > max_len {
            return Err(format!(
                "compressed data expands past the {max_len} bytes allowed"
            ));
        }
        sink(&buf[..n]).map_err(|err| format!("write failed: {err}"))?;
    }
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
        let data = pseudo_random(100_000, 3);
        let z = compress(&data);
        assert!(decompress(&z[..z.len() / 2], data.len()).is_err());
        assert!(decompress(b"not zstd at all", 1000).is_err());
        let mut bad = z.clone();
        let mid = bad.len() / 2;
        bad[mid] ^= 0xff;
        // zstd checks its own structure; a flipped byte in raw data may pass
        // here, which is why every file is also checked against its BLAKE3.
        if let Ok(out) = decompress(&bad, data.len()) {
            assert_ne!(out, data);
        }
    }

    #[test]
    fn streaming_bound_without_declared_size() {
        // A streamed frame does not declare its size; the bound must still hold.
        let data = vec![0u8; 1 << 20];
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        std::io::Write::write_all(&mut enc, &data).unwrap();
        let z = enc.finish().unwrap();
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
    fn incompressible_data_round_trips_at_the_fast_level() {
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
        assert!(z.len() < noise.len() + 1024, "raw blocks cost little");
        assert_eq!(decompress(&z, noise.len()).unwrap(), noise);
        // Text still gets the real level.
        let text = b"the quick brown fox jumps over the lazy dog\n".repeat(4096);
        assert!(compressible(&text[..SAMPLE]));
        assert!(compress(&text).len() < text.len() / 10);
    }
}
