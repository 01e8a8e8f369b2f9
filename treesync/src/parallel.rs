//! Work over many files on several threads: a sync's hashing, on either
//! side (the scan that lists a tree, the apply that checks what it is
//! about to overwrite), and a checkpoint's copies.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs `work(buf, j)` for every `j` below `count` (files of `bytes` in
/// all) and returns the results in that order: on several threads once
/// there is real work, many files (per-file latency overlaps) or many bytes
/// (hashing runs on several cores). Each thread reuses one read buffer.
pub(crate) fn in_parallel<T: Send>(
    count: usize,
    bytes: u64,
    work: impl Fn(&mut Vec<u8>, usize) -> T + Sync,
) -> Vec<T> {
    let threads = if count >= 32 || (count >= 2 && bytes >= 16 << 20) {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .clamp(1, 8)
            .min(count)
    } else {
        1
    };
    if threads <= 1 {
        let mut buf = Vec::new();
        return (0..count).map(|j| work(&mut buf, j)).collect();
    }
    let next = AtomicUsize::new(0);
    let mut results: Vec<Option<T>> = (0..count).map(|_| None).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut buf = Vec::new();
                    let mut done = Vec::new();
                    loop {
                        let j = next.fetch_add(1, Ordering::Relaxed);
                        if j >= count {
                            return done;
                        }
                        done.push((j, work(&mut buf, j)));
                    }
                })
            })
            .collect();
        for handle in handles {
            let done = handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            for (j, result) in done {
                results[j] = Some(result);
            }
        }
    });
    // Every index was taken by a thread that returned (a panic resumed).
    results
        .into_iter()
        .map(|r| r.expect("every job has a result"))
        .collect()
}
