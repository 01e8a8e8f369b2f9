//! Bounded capture of one output stream: the first half of the limit verbatim,
//! the last half in a ring buffer, and a count of what fell in between.
//!
//! Memory stays at the limit however much a command prints, so a runaway
//! `yes` cannot take the agent down with it.

use std::collections::VecDeque;

use outpost_protocol::CapturedOutput;

#[derive(Debug)]
pub struct Capture {
    head: Vec<u8>,
    head_cap: usize,
    tail: VecDeque<u8>,
    tail_cap: usize,
    omitted: u64,
}

impl Capture {
    /// A capture keeping at most `limit` bytes in total.
    pub fn new(limit: usize) -> Capture {
        let head_cap = limit / 2;
        Capture {
            head: Vec::new(),
            head_cap,
            tail: VecDeque::new(),
            tail_cap: limit - head_cap,
            omitted: 0,
        }
    }

    pub fn push(&mut self, mut data: &[u8]) {
        let room = self.head_cap - self.head.len();
        if room > 0 {
            let n = room.min(data.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        if data.is_empty() {
            return;
        }
        if data.len() >= self.tail_cap {
            // The new data alone fills the ring: everything older is dropped.
            let skip = data.len() - self.tail_cap;
            self.omitted += self.tail.len() as u64 + skip as u64;
            self.tail.clear();
            self.tail.extend(&data[skip..]);
            return;
        }
        let overflow = (self.tail.len() + data.len()).saturating_sub(self.tail_cap);
        if overflow > 0 {
            self.tail.drain(..overflow);
            self.omitted += overflow as u64;
        }
        self.tail.extend(data);
    }

    pub fn finish(self) -> CapturedOutput {
        CapturedOutput {
            head: self.head,
            tail: Vec::from(self.tail),
            omitted: self.omitted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(limit: usize, chunks: &[&[u8]]) -> CapturedOutput {
        let mut c = Capture::new(limit);
        for chunk in chunks {
            c.push(chunk);
        }
        c.finish()
    }

    #[test]
    fn small_output_is_all_head() {
        let out = feed(10, &[b"abc"]);
        assert_eq!(out.head, b"abc");
        assert!(out.tail.is_empty());
        assert_eq!(out.omitted, 0);
    }

    #[test]
    fn exact_limit_is_kept_whole() {
        let out = feed(6, &[b"abc", b"def"]);
        assert_eq!(out.head, b"abc");
        assert_eq!(out.tail, b"def");
        assert_eq!(out.omitted, 0);
    }

    #[test]
    fn middle_is_omitted_across_chunk_sizes() {
        let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        for chunk_len in [1, 3, 7, 100, 4096, 10_000] {
            let chunks: Vec<&[u8]> = data.chunks(chunk_len).collect();
            let out = feed(101, &chunks);
            assert_eq!(out.head, &data[..50], "chunk {chunk_len}");
            assert_eq!(out.tail, &data[data.len() - 51..], "chunk {chunk_len}");
            assert_eq!(out.omitted, 10_000 - 101);
            assert_eq!(out.total_len(), 10_000);
        }
    }

    #[test]
    fn zero_limit_counts_everything() {
        let out = feed(0, &[b"abc", b"de"]);
        assert!(out.head.is_empty() && out.tail.is_empty());
        assert_eq!(out.omitted, 5);
    }
}
