//! Reading job logs of any size in bounded memory: ranges, last lines, and
//! line matching forwards and backwards, always in fixed-size chunks.
//!
//! A log may be gigabytes and still growing. Nothing here reads a whole file,
//! and every loop is bounded by a byte budget, so one request cannot hold the
//! agent for long either.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use regex::bytes::Regex;

/// Read size for every scan.
pub const CHUNK: usize = 64 * 1024;
/// Longest line kept whole for matching; longer lines are matched on their
/// first this-many bytes (forwards) or last (backwards).
pub const MAX_LINE: usize = 1024 * 1024;

/// Reads `len` bytes at `offset`, fewer at end of file.
pub fn read_range(file: &File, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    let mut out = vec![0u8; len as usize];
    let mut done = 0;
    while done < out.len() {
        match file.read_at(&mut out[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    out.truncate(done);
    Ok(out)
}

/// Where the last `lines` lines of the first `size` bytes start, looking back
/// at most `max_bytes` (the start is then `size - max_bytes`, mid-line). A
/// final newline ends the last line rather than starting an empty one.
pub fn tail_start(file: &File, size: u64, lines: u32, max_bytes: u64) -> io::Result<u64> {
    let floor = size.saturating_sub(max_bytes);
    if lines == 0 {
        return Ok(size);
    }
    let mut end = size;
    // The newline that ends the file belongs to the last line.
    let mut skip_final = true;
    let mut seen = 0u32;
    while end > floor {
        let start = end.saturating_sub(CHUNK as u64).max(floor);
        let chunk = read_range(file, start, end - start)?;
        for (i, &b) in chunk.iter().enumerate().rev() {
            let at = start + i as u64;
            if b != b'\n' {
                skip_final = false;
                continue;
            }
            if skip_final && at + 1 == size {
                skip_final = false;
                continue;
            }
            seen += 1;
            if seen == lines {
                return Ok(at + 1);
            }
        }
        end = start;
    }
    Ok(floor)
}

/// Matches a regex against whole lines of a growing byte stream fed in
/// pieces; the unfinished last line is carried over (up to [`MAX_LINE`]).
pub struct LineMatcher {
    re: Regex,
    /// The unfinished line so far and where it starts in the stream.
    carry: Vec<u8>,
    carry_start: u64,
    /// Stream offset just past the last byte fed.
    pos: u64,
}

impl LineMatcher {
    pub fn new(re: Regex, start: u64) -> LineMatcher {
        LineMatcher {
            re,
            carry: Vec::new(),
            carry_start: start,
            pos: start,
        }
    }

    /// Offset just past the last byte fed.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// Feeds the bytes at [`Self::pos`]; returns the offset just past the
    /// first matching line (its newline included), if a whole line matched.
    /// Bytes after that line are not consumed: feed them again (from the
    /// returned offset) to go on.
    pub fn feed(&mut self, data: &[u8]) -> Option<u64> {
        let base = self.pos;
        let mut line_start = 0usize;
        while let Some(nl) = memchr(b'\n', &data[line_start..]) {
            let nl = line_start + nl;
            let matched = if self.carry.is_empty() {
                self.re.is_match(&data[line_start..nl])
            } else {
                self.extend_carry(&data[line_start..nl]);
                let m = self.re.is_match(&self.carry);
                self.carry.clear();
                m
            };
            line_start = nl + 1;
            self.carry_start = base + line_start as u64;
            if matched {
                self.pos = self.carry_start;
                return Some(self.pos);
            }
        }
        self.extend_carry(&data[line_start..]);
        self.pos = base + data.len() as u64;
        None
    }

    /// Whether the unfinished last line matches (a progress line without a
    /// newline, or the end of a finished job's output).
    pub fn partial_matches(&self) -> bool {
        !self.carry.is_empty() && self.re.is_match(&self.carry)
    }

    fn extend_carry(&mut self, data: &[u8]) {
        let room = MAX_LINE.saturating_sub(self.carry.len());
        self.carry.extend_from_slice(&data[..data.len().min(room)]);
    }
}

/// Matching lines from `from` on, each with its newline, until `max_bytes`
/// are collected, `scan_budget` bytes were scanned, or `size` is reached.
/// Returns the lines and where a next call should continue. The unfinished
/// last line counts only when `final_line` (the log has stopped growing).
pub fn grep_forward(
    file: &File,
    re: &Regex,
    from: u64,
    size: u64,
    max_bytes: u64,
    scan_budget: u64,
    final_line: bool,
) -> io::Result<(Vec<u8>, u64)> {
    let mut out = Vec::new();
    let mut line: Vec<u8> = Vec::new();
    let mut line_start = from;
    let mut pos = from;
    let limit = size.min(from.saturating_add(scan_budget));
    let push = |out: &mut Vec<u8>, line: &[u8]| -> bool {
        if !re.is_match(line) {
            return false;
        }
        let room = (max_bytes as usize).saturating_sub(out.len());
        if room == 0 {
            return true;
        }
        out.extend_from_slice(&line[..line.len().min(room.saturating_sub(1))]);
        out.push(b'\n');
        out.len() as u64 >= max_bytes
    };
    while pos < limit {
        let chunk = read_range(file, pos, (limit - pos).min(CHUNK as u64))?;
        if chunk.is_empty() {
            break;
        }
        let mut i = 0;
        while let Some(nl) = memchr(b'\n', &chunk[i..]) {
            let nl = i + nl;
            let room = MAX_LINE.saturating_sub(line.len());
            line.extend_from_slice(&chunk[i..nl.min(i + room)]);
            let full = push(&mut out, &line);
            line.clear();
            i = nl + 1;
            line_start = pos + i as u64;
            if full {
                return Ok((out, line_start));
            }
        }
        let room = MAX_LINE.saturating_sub(line.len());
        line.extend_from_slice(&chunk[i..chunk.len().min(i + room)]);
        pos += chunk.len() as u64;
    }
    if final_line && pos >= size && !line.is_empty() {
        push(&mut out, &line);
        return Ok((out, size));
    }
    if line_start == from && pos < size {
        // One line longer than the whole budget: skip what was scanned so
        // paging always moves on.
        return Ok((out, pos));
    }
    Ok((out, line_start))
}

/// The last `lines` matching lines before `size`, oldest first, each with
/// its newline, at most `max_bytes` in all (older ones dropped), scanning
/// back at most `scan_budget` bytes. Returns the lines and where the scan
/// stopped.
pub fn grep_backward(
    file: &File,
    re: &Regex,
    size: u64,
    lines: u32,
    max_bytes: u64,
    scan_budget: u64,
) -> io::Result<(Vec<u8>, u64)> {
    let floor = size.saturating_sub(scan_budget);
    let mut found: Vec<Vec<u8>> = Vec::new();
    let mut bytes = 0u64;
    // The start of the line being assembled (its end is known), in
    // reverse: chunks are read backwards, so `pending` grows at the front.
    let mut pending: Vec<u8> = Vec::new();
    let mut end = size;
    let mut stopped = floor;
    let mut take = |line: &[u8], found: &mut Vec<Vec<u8>>| -> bool {
        if !line.is_empty() && re.is_match(line) {
            let mut l = line.to_vec();
            l.push(b'\n');
            bytes += l.len() as u64;
            found.push(l);
        }
        found.len() as u32 >= lines || bytes >= max_bytes
    };
    'scan: while end > floor {
        let start = end.saturating_sub(CHUNK as u64).max(floor);
        let chunk = read_range(file, start, end - start)?;
        let mut tail_end = chunk.len();
        while let Some(nl) = memrchr(b'\n', &chunk[..tail_end]) {
            // chunk[nl+1..tail_end] + pending is one whole line.
            let mut line = chunk[nl + 1..tail_end].to_vec();
            line.extend_from_slice(&pending);
            pending.clear();
            tail_end = nl;
            if take(&line, &mut found) {
                stopped = start + nl as u64 + 1;
                break 'scan;
            }
        }
        let mut head = chunk[..tail_end].to_vec();
        if pending.len() < MAX_LINE {
            head.extend_from_slice(&pending);
            pending = head;
        }
        end = start;
    }
    if end == 0 && !pending.is_empty() && (found.len() as u32) < lines {
        take(&pending, &mut found);
        stopped = 0;
    }
    found.reverse();
    let mut out: Vec<u8> = found.concat();
    if out.len() as u64 > max_bytes {
        out.drain(..out.len() - max_bytes as usize);
    }
    Ok((out, stopped))
}

fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|&b| b == needle)
}

fn memrchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().rposition(|&b| b == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(data: &[u8]) -> (File, std::path::PathBuf) {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("outpost-log-{}-{n}", std::process::id()));
        let mut f = File::create(&path).unwrap();
        f.write_all(data).unwrap();
        (File::open(&path).unwrap(), path)
    }

    #[test]
    fn tails() {
        let (f, p) = file_with(b"a\nbb\nccc\n");
        let size = 9;
        assert_eq!(tail_start(&f, size, 1, 100).unwrap(), 5);
        assert_eq!(tail_start(&f, size, 2, 100).unwrap(), 2);
        assert_eq!(tail_start(&f, size, 3, 100).unwrap(), 0);
        assert_eq!(tail_start(&f, size, 9, 100).unwrap(), 0);
        assert_eq!(tail_start(&f, size, 9, 4).unwrap(), 5);
        // Without a final newline the last line is the unfinished one.
        assert_eq!(tail_start(&f, 7, 1, 100).unwrap(), 5);
        std::fs::remove_file(p).unwrap();

        // Lines across chunk boundaries.
        let mut big = Vec::new();
        for i in 0..50_000 {
            big.extend_from_slice(format!("line {i}\n").as_bytes());
        }
        let (f, p) = file_with(&big);
        let start = tail_start(&f, big.len() as u64, 3, u64::MAX).unwrap();
        assert_eq!(
            &big[start as usize..],
            b"line 49997\nline 49998\nline 49999\n"
        );
        let re = Regex::new("^line 1234[0-9]$").unwrap();
        let (out, next) =
            grep_forward(&f, &re, 0, big.len() as u64, 1 << 20, u64::MAX, true).unwrap();
        let expected: String = (12340..12350).map(|i| format!("line {i}\n")).collect();
        assert_eq!(String::from_utf8(out).unwrap(), expected);
        assert_eq!(next, big.len() as u64);
        // A full page stops at the end of its last line.
        let (out, next) = grep_forward(&f, &re, 0, big.len() as u64, 22, u64::MAX, true).unwrap();
        assert_eq!(out, b"line 12340\nline 12341\n");
        assert_eq!(&big[next as usize..next as usize + 10], b"line 12342");
        let (out, _) = grep_backward(&f, &re, big.len() as u64, 2, 1 << 20, u64::MAX).unwrap();
        assert_eq!(out, b"line 12348\nline 12349\n");
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn grep_edges() {
        let (f, p) = file_with(b"x1\ny\nx2");
        let re = Regex::new("x").unwrap();
        // The unfinished line counts only once the log is final.
        let (out, next) = grep_forward(&f, &re, 0, 7, 100, u64::MAX, false).unwrap();
        assert_eq!((out.as_slice(), next), (&b"x1\n"[..], 5));
        let (out, next) = grep_forward(&f, &re, 0, 7, 100, u64::MAX, true).unwrap();
        assert_eq!((out.as_slice(), next), (&b"x1\nx2\n"[..], 7));
        let (out, _) = grep_backward(&f, &re, 7, 10, 100, u64::MAX).unwrap();
        assert_eq!(out, b"x1\nx2\n");
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn matcher_finds_lines_across_pieces() {
        let re = Regex::new("loss=[0-9.]+").unwrap();
        let mut m = LineMatcher::new(re, 100);
        assert_eq!(m.feed(b"warming up\nepoch 3 lo"), None);
        assert_eq!(m.pos(), 121);
        assert!(!m.partial_matches());
        assert_eq!(m.feed(b"ss=0.25\nmore\n"), Some(129));
        assert_eq!(m.feed(b"more\nno"), None);
        assert_eq!(m.pos(), 136);
        assert_eq!(m.feed(b" loss=1"), None);
        assert!(m.partial_matches());
    }
}
