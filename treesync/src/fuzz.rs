//! Hostile and damaged input never panics the decoders a peer or a disk can
//! feed: encoded content (bounded output), relative paths, partial-file names
//! and stat cache files.
//!
//! `OUTPOST_FUZZ_ITERS` sets the rounds of each loop (default 20 000, about a
//! second in all); `OUTPOST_FUZZ_SEED` replays or explores another sequence.

use std::path::Path;

use outpost_protocol::FilterSpec;

use crate::apply::{parse_resumable_name, resumable_name};
use crate::cache::{self, StatCache};
use crate::codec;
use crate::relpath;
use crate::scan::{ScanOptions, scan};
use crate::testutil::{TempDir, pseudo_random};

fn iters() -> u64 {
    std::env::var("OUTPOST_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(20_000)
}

fn seed() -> u64 {
    std::env::var("OUTPOST_FUZZ_SEED")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0x2545_f491_4f6c_dd1d)
}

/// xorshift64*: deterministic, dependency-free randomness.
struct Rng(u64);

impl Rng {
    fn new(salt: u64) -> Rng {
        Rng((seed() ^ salt) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// Damages `bytes` a little: overwritten bytes, a cut, a repeated or a
/// removed stretch.
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        if bytes.is_empty() {
            bytes.push(rng.next() as u8);
            continue;
        }
        let i = rng.below(bytes.len());
        match rng.below(8) {
            0 => bytes.truncate(i),
            1 => {
                let end = (i + 1 + rng.below(32)).min(bytes.len());
                let copy = bytes[i..end].to_vec();
                bytes.splice(i..i, copy);
            }
            2 => {
                let end = (i + 1 + rng.below(32)).min(bytes.len());
                bytes.drain(i..end);
            }
            _ => bytes[i] = rng.next() as u8,
        }
    }
}

#[test]
fn damaged_compressed_content_is_an_error_within_its_bound() {
    let text = b"the quick brown fox jumps over the lazy dog\n".repeat(300);
    let noise = pseudo_random(200_000, 5);
    let zeros = vec![0u8; 300_000];
    let mut two = vec![codec::ZSTD];
    two.extend(zstd::bulk::compress(b"first frame ", 3).unwrap());
    two.extend(zstd::bulk::compress(&text, 3).unwrap());
    let valid = [
        (codec::compress(&text), text.len()),
        (codec::compress(&noise), noise.len()),
        (codec::compress(&zeros), zeros.len()),
        (codec::compress(b""), 0),
        (two, 12 + text.len()),
    ];
    let mut rng = Rng::new(1);
    for round in 0..iters() {
        let (mut data, len) = valid[rng.below(valid.len())].clone();
        if round % 8 == 7 {
            // A zstd magic number and a random header: frame and window
            // sizes claimed out of thin air.
            data = [codec::ZSTD, 0x28, 0xb5, 0x2f, 0xfd].to_vec();
            let rest = rng.below(24);
            data.extend(rng.bytes(rest));
        } else {
            mutate(&mut rng, &mut data);
        }
        // Within, below and far above what the frame holds; unbounded, a
        // size the header claims must still not be reserved on trust.
        let max = match rng.below(4) {
            0 => len,
            1 => rng.below(len + 1),
            2 => 1 << 20,
            _ => usize::MAX,
        };
        if let Ok(out) = codec::decompress(&data, max) {
            assert!(out.len() <= max, "round {round}: {} > {max}", out.len());
        }
        let mut seen = 0u64;
        let streamed = codec::decompress_into(&data, max as u64, &mut |piece| {
            seen += piece.len() as u64;
            Ok(())
        });
        assert!(seen <= max as u64, "round {round}: {seen} > {max}");
        if let Ok(total) = streamed {
            assert_eq!(total, seen, "round {round}");
        }
    }
    // The decoders are still sound after all that.
    for (data, len) in &valid {
        assert_eq!(codec::decompress(data, *len).unwrap().len(), *len);
    }
}

#[test]
fn hostile_relative_paths_never_escape() {
    let pieces: [&[u8]; 9] = [b"a", b"..", b".", b"/", b"", b"\0", b"\xff", b"b c", b"~"];
    let mut rng = Rng::new(2);
    for round in 0..iters() {
        let mut rel = Vec::new();
        if round % 2 == 0 {
            for _ in 0..rng.below(6) {
                rel.extend_from_slice(pieces[rng.below(pieces.len())]);
                if rng.below(2) == 0 {
                    rel.push(b'/');
                }
            }
        } else {
            let len = rng.below(24);
            rel = rng.bytes(len);
            for b in rel.iter_mut() {
                // Mostly the bytes that matter.
                if rng.below(2) == 0 {
                    *b = b"/.\0a"[rng.below(4)];
                }
            }
        }
        let Ok(parts) = relpath::components(&rel) else {
            continue;
        };
        assert!(!rel.starts_with(b"/") && !rel.contains(&0), "{rel:?}");
        for part in parts {
            assert!(!matches!(part, b"" | b"." | b".."), "{rel:?}");
            assert!(!part.contains(&b'/'), "{rel:?}");
        }
        let joined = relpath::join(Path::new("/root"), &rel).unwrap();
        assert!(joined.starts_with("/root") && joined != Path::new("/root"));
    }
}

#[test]
fn partial_file_names_parse_or_are_refused() {
    let mut rng = Rng::new(3);
    for round in 0..iters() {
        let hash: [u8; 32] = std::array::from_fn(|_| rng.next() as u8);
        let size = rng.next() >> rng.below(64);
        let name = resumable_name(&hash, size);
        assert_eq!(
            parse_resumable_name(name.as_bytes()),
            Some((hash[..16].try_into().unwrap(), size))
        );
        let mut bytes = name.into_bytes();
        if round % 4 == 0 {
            let len = rng.below(80);
            bytes = rng.bytes(len);
        } else {
            mutate(&mut rng, &mut bytes);
        }
        let _ = parse_resumable_name(&bytes);
    }
}

#[test]
fn damaged_stat_cache_files_load_or_are_refused() {
    // A real cache of a few files, some of them chunked.
    let t = TempDir::new();
    for i in 0..4 {
        let len = if i % 2 == 0 { 100 } else { (1 << 20) + 5000 };
        std::fs::write(t.path().join(format!("f{i}")), pseudo_random(len, i)).unwrap();
    }
    let mut cache = StatCache::default();
    cache.racy_window_ns = 0;
    let options = ScanOptions {
        hashes: true,
        chunk_lists: true,
        recursive: true,
        max_entries: 0,
        reap_stale_temps: false,
    };
    scan(t.path(), &FilterSpec::default(), &options, Some(&mut cache));
    assert_eq!(cache.len(), 4);
    let good = cache.encode();
    assert_eq!(cache::decode(&good).map(|r| r.len()), Some(4));

    let mut rng = Rng::new(4);
    for _ in 0..iters() / 4 {
        // Damage the body, then seal it with a matching checksum so the
        // parser, not the checksum, has to cope.
        let mut body = good[..good.len() - 32].to_vec();
        mutate(&mut rng, &mut body);
        if rng.below(4) == 0 && body.len() >= 16 {
            // A record count out of all proportion.
            let count = rng.next() >> rng.below(64);
            body[8..16].copy_from_slice(&count.to_le_bytes());
        }
        let sum = blake3::hash(&body);
        body.extend_from_slice(sum.as_bytes());
        if let Some(records) = cache::decode(&body) {
            assert!(records.len() <= 4 + body.len() / 76);
        }
    }
}
