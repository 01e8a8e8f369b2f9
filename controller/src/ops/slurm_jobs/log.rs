//! A batch job's log on the login node: pages, last lines, and the
//! pattern a wait looks for.

use regex::Regex;

use super::*;

/// Bytes `[from, from + len)` of the job's log, and its size: the command
/// prints the size on the first line, then the bytes (clamped to the size
/// it saw).
pub(super) async fn log_range(
    session: &Session,
    job: u64,
    from: Option<u64>,
    len: u64,
) -> Result<(u64, u64, Vec<u8>), String> {
    // from None: the last `len` bytes.
    let start = match from {
        Some(from) => format!("o={from}"),
        None => format!("o=$(( s > {len} ? s - {len} : 0 ))"),
    };
    let script = format!(
        "f={DIR_WORD}/{job}.log\n\
         [ -e \"$f\" ] || {{ echo '0 0'; exit 0; }}\n\
         s=$(stat -c %s -- \"$f\") || exit 3\n\
         {start}\n\
         [ \"$o\" -le \"$s\" ] || o=$s\n\
         n=$(( s - o )); [ \"$n\" -le {len} ] || n={len}\n\
         echo \"$s $o\"\n\
         [ \"$n\" -eq 0 ] || tail -c +$(( o + 1 )) -- \"$f\" | head -c \"$n\"\n"
    );
    let out = run_raw(session, &script, None).await.map_err(|e| {
        format!(
            "reading the log of {} on {}: {e}",
            task_name(job),
            session.name()
        )
    })?;
    let nl = out
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| "no log size in the answer".to_string())?;
    let head = String::from_utf8_lossy(&out[..nl]).into_owned();
    let (size, offset) = head
        .split_once(' ')
        .and_then(|(s, o)| Some((s.parse().ok()?, o.parse().ok()?)))
        .ok_or_else(|| format!("bad log header {head:?}"))?;
    Ok((size, offset, out[nl + 1..].to_vec()))
}

/// A page of the job's log, as `read_background_log` reads an agent job's:
/// from `offset`, the last `tail_lines` lines, or only the lines matching
/// `grep` (Rust regex syntax, as for agent jobs); at most `max_bytes`.
pub async fn read_log(
    session: &Session,
    job: u64,
    offset: Option<u64>,
    tail_lines: Option<u32>,
    grep: Option<&str>,
    max_bytes: u64,
) -> Result<LogPage, String> {
    let max = max_bytes.clamp(1, MAX_READ);
    let re = grep
        .map(|p| Regex::new(p).map_err(|e| format!("bad grep regex: {e}")))
        .transpose()?;
    match (offset, tail_lines, re) {
        (None, Some(lines), None) => {
            let (size, start, data) = log_range(session, job, None, max).await?;
            let (cut, data) = last_lines(&data, start == 0, lines);
            Ok(LogPage {
                offset: start + cut,
                next_offset: size,
                data,
                size,
            })
        }
        (None, Some(lines), Some(re)) => {
            let (size, start, data) = log_range(session, job, None, MAX_READ).await?;
            let from = if start == 0 {
                0
            } else {
                first_line_start(&data)
            };
            let mut matched: Vec<&[u8]> = line_spans(&data[from..])
                .filter(|line| re.is_match(&String::from_utf8_lossy(line)))
                .collect();
            let keep = matched.len().saturating_sub(lines as usize);
            matched.drain(..keep);
            let mut out = matched.concat();
            if out.len() as u64 > max {
                out.drain(..out.len() - max as usize);
            }
            Ok(LogPage {
                data: out,
                offset: start + from as u64,
                next_offset: size,
                size,
            })
        }
        (offset, _, Some(re)) => {
            let from = offset.unwrap_or(0);
            let (size, start, data) = log_range(session, job, Some(from), MAX_READ).await?;
            let mut out = Vec::new();
            let mut consumed = 0usize;
            for line in line_spans(&data) {
                // Only whole lines: the rest is read next time.
                if !line.ends_with(b"\n") {
                    break;
                }
                if re.is_match(&String::from_utf8_lossy(line)) {
                    if (out.len() + line.len()) as u64 > max {
                        break;
                    }
                    out.extend_from_slice(line);
                }
                consumed += line.len();
            }
            Ok(LogPage {
                data: out,
                offset: start,
                next_offset: start + consumed as u64,
                size,
            })
        }
        (offset, _, None) => {
            let (size, start, data) =
                log_range(session, job, Some(offset.unwrap_or(0)), max).await?;
            Ok(LogPage {
                next_offset: start + data.len() as u64,
                offset: start,
                data,
                size,
            })
        }
    }
}

/// The lines of `data`, each with its newline (the last may lack one).
pub(super) fn line_spans(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    data.split_inclusive(|b| *b == b'\n')
}

/// Where the first whole line of a window that may start mid-line begins.
pub(super) fn first_line_start(data: &[u8]) -> usize {
    data.iter()
        .position(|b| *b == b'\n')
        .map_or(data.len(), |i| i + 1)
}

/// The last `lines` lines of a window of a log (`whole`: it starts at the
/// log's start, else its first, partial line is dropped unless it is all
/// there is): how many bytes were cut from its front, and the rest.
pub(super) fn last_lines(data: &[u8], whole: bool, lines: u32) -> (u64, Vec<u8>) {
    let mut from = if whole { 0 } else { first_line_start(data) };
    if from >= data.len() {
        from = 0;
    }
    let window = &data[from..];
    let body = window.strip_suffix(b"\n").unwrap_or(window);
    let mut cut = 0;
    if lines == 0 {
        cut = window.len();
    } else {
        let mut seen = 0;
        for (i, b) in body.iter().enumerate().rev() {
            if *b == b'\n' {
                seen += 1;
                if seen == lines {
                    cut = i + 1;
                    break;
                }
            }
        }
    }
    ((from + cut) as u64, window[cut..].to_vec())
}

// ---------------------------------------------------------------- wait

/// Matches whole lines of a log as they arrive.
pub(super) struct LineMatcher {
    pub(super) re: Regex,
    pub(super) pos: u64,
    pub(super) partial: Vec<u8>,
}

impl LineMatcher {
    /// Feeds bytes that follow `pos`; the offset past the first matching
    /// line, if any.
    pub(super) fn feed(&mut self, data: &[u8]) -> Option<u64> {
        for line in line_spans(data) {
            self.pos += line.len() as u64;
            if !line.ends_with(b"\n") {
                self.partial.extend_from_slice(line);
                // A runaway line is matched by its start only.
                self.partial.truncate(64 << 10);
                continue;
            }
            let matched = if self.partial.is_empty() {
                self.re.is_match(&String::from_utf8_lossy(line))
            } else {
                self.partial.extend_from_slice(line);
                let m = self.re.is_match(&String::from_utf8_lossy(&self.partial));
                self.partial.clear();
                m
            };
            if matched {
                return Some(self.pos);
            }
        }
        None
    }

    pub(super) fn partial_matches(&self) -> bool {
        !self.partial.is_empty() && self.re.is_match(&String::from_utf8_lossy(&self.partial))
    }
}
