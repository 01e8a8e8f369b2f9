//! Every MCP request gets an answer, even one too large to read or that is
//! not JSON.
//!
//! MCP over stdio is one JSON-RPC message per line. The stdio transport
//! drops without a word a line longer than its limit, and one that is not
//! JSON (invalid UTF-8, a lone surrogate escape, a number no float holds),
//! so the client would wait for an answer until its own timeout.
//! [`LineLimit`] sits between stdin and the transport: it gathers each line
//! while watching it for its top-level `"id"`, passes a well-formed one on
//! untouched, and in place of one too long or not JSON puts a small request
//! of its own with the same id:
//!
//! ```text
//! {"jsonrpc":"2.0","id":<id>,"method":"outpost/oversized","params":{"bytes":N,"limit":L}}
//! {"jsonrpc":"2.0","id":<id>,"method":"outpost/unparsable","params":{"error":"…"}}
//! ```
//!
//! The server answers those with a JSON-RPC error: the limit
//! ([`oversized_error`]), or `-32700` and what is wrong. A message with no
//! id to be found becomes `{"jsonrpc":"2.0"}`, which the transport answers
//! with its `Invalid request`; a notification (no id) that is too large
//! needs no answer and is only logged.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

use crate::ops::human_bytes;

/// The method of the request that stands in for an oversized one.
pub const OVERSIZED_METHOD: &str = "outpost/oversized";
/// The method of the request that stands in for one that is not JSON.
pub const UNPARSABLE_METHOD: &str = "outpost/unparsable";

/// Longest id kept; JSON-RPC ids are short numbers or strings.
const MAX_ID_LEN: usize = 256;

/// An `AsyncRead` that bounds lines; see the module docs.
pub struct LineLimit<R> {
    inner: R,
    limit: usize,
    /// Bytes of the current line seen so far (kept or dropped).
    line_len: usize,
    /// The current line, while it is within the limit.
    line: Vec<u8>,
    /// The current line went past the limit; its rest is dropped.
    dropping: bool,
    scan: IdScan,
    /// Bytes to hand out before reading more.
    pending: VecDeque<u8>,
    /// Room for one read of the inner stream.
    chunk: Box<[u8]>,
}

impl<R> LineLimit<R> {
    pub fn new(inner: R, limit: usize) -> LineLimit<R> {
        LineLimit {
            inner,
            limit,
            line_len: 0,
            line: Vec::new(),
            dropping: false,
            scan: IdScan::default(),
            pending: VecDeque::new(),
            chunk: vec![0; 64 * 1024].into_boxed_slice(),
        }
    }

    /// Runs `input` through the line rules, queueing what to pass on.
    fn absorb(&mut self, input: &[u8]) {
        let mut rest = input;
        while !rest.is_empty() {
            let newline = rest.iter().position(|b| *b == b'\n');
            let end = newline.map_or(rest.len(), |i| i + 1);
            let piece = &rest[..end];
            let body = &piece[..newline.map_or(piece.len(), |_| piece.len() - 1)];
            self.scan.feed(body);
            let room = self.limit.saturating_sub(self.line_len);
            if !self.dropping {
                if body.len() <= room {
                    self.line.extend_from_slice(body);
                } else {
                    self.line = Vec::new();
                    self.dropping = true;
                }
            }
            self.line_len += body.len();
            if newline.is_some() {
                if self.dropping {
                    self.answer_oversized();
                } else {
                    self.pass_line();
                }
                self.line_len = 0;
                self.dropping = false;
                self.scan = IdScan::default();
            }
            rest = &rest[end..];
        }
    }

    /// Passes the line gathered on, or what stands in for it.
    fn pass_line(&mut self) {
        let line = std::mem::take(&mut self.line);
        let text = line.strip_prefix(b"\xef\xbb\xbf").unwrap_or(&line);
        let blank = text.iter().all(u8::is_ascii_whitespace);
        // What the transport could not parse, it would drop unanswered.
        match serde_json::from_slice::<serde_json::Value>(text) {
            Err(e) if !blank => {
                let problem = format!("the message is not JSON ({e})");
                let id = self.scan.id.take();
                match id.and_then(|id| serde_json::from_slice::<serde_json::Value>(&id).ok()) {
                    Some(id) => {
                        let stand_in = serde_json::json!({
                            "jsonrpc": "2.0", "id": id, "method": UNPARSABLE_METHOD,
                            "params": {"error": problem},
                        });
                        self.pending.extend(stand_in.to_string().as_bytes());
                    }
                    None => {
                        tracing::warn!("an MCP message with no id: {problem}");
                        self.pending.extend(b"{\"jsonrpc\":\"2.0\"}");
                    }
                }
            }
            _ => self.pending.extend(&line),
        }
        self.pending.push_back(b'\n');
    }

    fn answer_oversized(&mut self) {
        match self.scan.id.take() {
            Some(id) => {
                let line = format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"{OVERSIZED_METHOD}\",\"params\":{{\"bytes\":{},\"limit\":{}}}}}\n",
                    String::from_utf8_lossy(&id),
                    self.line_len,
                    self.limit
                );
                self.pending.extend(line.as_bytes());
            }
            None => tracing::warn!(
                "dropped an MCP message of {} bytes without an id (limit {} bytes)",
                self.line_len,
                self.limit
            ),
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LineLimit<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.pending.is_empty() {
                let (front, _) = this.pending.as_slices();
                let n = front.len().min(buf.remaining());
                buf.put_slice(&front[..n]);
                this.pending.drain(..n);
                return Poll::Ready(Ok(()));
            }
            let mut chunk = std::mem::take(&mut this.chunk);
            let mut read = ReadBuf::new(&mut chunk);
            let polled = Pin::new(&mut this.inner).poll_read(cx, &mut read);
            let filled = read.filled().len();
            let result = match polled {
                Poll::Ready(Ok(())) if filled == 0 => Some(Poll::Ready(Ok(()))),
                Poll::Ready(Ok(())) => {
                    this.absorb(&chunk[..filled]);
                    None
                }
                other => Some(other),
            };
            this.chunk = chunk;
            if let Some(result) = result {
                return result;
            }
        }
    }
}

/// The error a client gets for a message of `bytes` over `limit`.
pub fn oversized_error(bytes: u64, limit: u64) -> String {
    format!(
        "message of {} exceeds the {} limit of one MCP message; send less per call \
         (for file content, write it locally and use sync_local_to_remote)",
        human_bytes(bytes),
        human_bytes(limit)
    )
}

/// The top-level `"id"` of `message`, found even where the rest of it is
/// not JSON; only a number or a string counts.
pub fn top_level_id(message: &[u8]) -> Option<serde_json::Value> {
    let mut scan = IdScan::default();
    scan.feed(message);
    scan.id.and_then(|id| serde_json::from_slice(&id).ok())
}

/// Finds the top-level `"id"` member of one JSON object streamed in pieces,
/// keeping only its raw text.
#[derive(Default)]
struct IdScan {
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// At depth 1, the next string is a member name.
    expect_key: bool,
    /// The member name being read, while it may still be `id`.
    key: Vec<u8>,
    key_is_id: bool,
    /// Reading the value of `id`.
    in_id: bool,
    raw: Vec<u8>,
    id: Option<Vec<u8>>,
    done: bool,
}

impl IdScan {
    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.done {
                return;
            }
            self.step(b);
        }
    }

    fn step(&mut self, b: u8) {
        if self.in_id && self.depth == 1 && !self.in_string && matches!(b, b',' | b'}') {
            self.finish_id();
        } else if self.in_id && self.raw.len() < MAX_ID_LEN {
            self.raw.push(b);
        } else if self.in_id {
            // Not a real id: give up on it.
            self.done = true;
            return;
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if self.expect_key && self.depth == 1 {
                    self.key_is_id = self.key == b"id";
                    self.expect_key = false;
                }
            } else if self.expect_key && self.depth == 1 && self.key.len() < 3 {
                // Three bytes are enough to know a name is not `id`.
                self.key.push(b);
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.expect_key && self.depth == 1 {
                    self.key.clear();
                }
            }
            b'{' | b'[' => {
                self.depth += 1;
                if self.depth == 1 {
                    self.expect_key = b == b'{';
                }
            }
            b'}' | b']' => self.depth = self.depth.saturating_sub(1),
            b',' if self.depth == 1 => self.expect_key = true,
            b':' if self.depth == 1 && self.key_is_id => {
                self.key_is_id = false;
                self.in_id = true;
                self.raw.clear();
            }
            _ => {}
        }
    }

    fn finish_id(&mut self) {
        self.in_id = false;
        let text = String::from_utf8_lossy(&self.raw).trim().to_string();
        // Only what JSON-RPC allows as an id is echoed back.
        let valid = serde_json::from_str::<serde_json::Value>(&text)
            .is_ok_and(|v| v.is_number() || v.is_string());
        if valid {
            self.id = Some(text.into_bytes());
        }
        self.done = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::io::AsyncReadExt;

    async fn run(input: Vec<u8>, limit: usize) -> Vec<u8> {
        let mut out = Vec::new();
        LineLimit::new(&input[..], limit)
            .read_to_end(&mut out)
            .await
            .unwrap();
        out
    }

    fn lines(out: &[u8]) -> Vec<String> {
        out.split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect()
    }

    #[tokio::test]
    async fn short_lines_pass_untouched() {
        let input = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n{\"a\":[1,{\"id\":2}]}\n"
            .to_vec();
        assert_eq!(run(input.clone(), 100).await, input);
    }

    #[tokio::test]
    async fn an_oversized_request_becomes_an_answerable_one() {
        let big = "x".repeat(5000);
        let input = format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"tools/call\",\"params\":{{\"name\":\"write_remote_file\",\"arguments\":{{\"id\":99,\"content\":\"{big}\"}}}},\"id\":\"req-7\"}}\n{{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"ping\"}}\n"
        );
        let out = run(input.into_bytes(), 1000).await;
        let got = lines(&out);
        assert_eq!(got.len(), 2, "{got:?}");
        let stand_in: serde_json::Value = serde_json::from_str(&got[0]).unwrap();
        assert_eq!(
            stand_in["id"], "req-7",
            "the top-level id, not a nested one"
        );
        assert_eq!(stand_in["method"], OVERSIZED_METHOD);
        assert!(stand_in["params"]["bytes"].as_u64().unwrap() > 5000);
        assert_eq!(got[1], "{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"ping\"}");
    }

    #[tokio::test]
    async fn split_reads_and_escapes_do_not_confuse_the_scan() {
        let input = format!(
            "{{\"method\":\"x\",\"params\":{{\"s\":\"\\\"id\\\":5, }}\"}},\"id\" : 42 ,\"pad\":\"{}\"}}\n",
            "y".repeat(300)
        );
        // One byte at a time through the scanner.
        let mut limit = LineLimit::new(&b""[..], 100);
        for b in input.as_bytes() {
            limit.absorb(std::slice::from_ref(b));
        }
        let out: Vec<u8> = limit.pending.into_iter().collect();
        let got = lines(&out);
        let stand_in: serde_json::Value = serde_json::from_str(&got[0]).unwrap();
        assert_eq!(stand_in["id"], 42);
    }

    #[tokio::test]
    async fn an_oversized_notification_is_dropped() {
        let input = format!("{{\"method\":\"n\",\"params\":\"{}\"}}\n", "z".repeat(500));
        let out = run(input.into_bytes(), 100).await;
        assert!(lines(&out).is_empty(), "{out:?}");
    }

    #[tokio::test]
    async fn a_message_that_is_not_json_is_answered_by_its_id() {
        let mut input = Vec::new();
        for bad in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"s":"\ud800"}}"#[..],
            br#"{"jsonrpc":"2.0","id":"two","method":"ping","params":{"n":1e400}}"#,
            b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"pi\xffng\"}",
            br#"{"jsonrpc":"2.0","id":4,"method":"ping""#,
            // No id to be found: what the transport answers as invalid.
            br#"{"jsonrpc":"2.0","method":"ping",}"#,
            br#"[{"jsonrpc":"2.0","id":5,"method":"ping"}]"#,
            b"",
        ] {
            input.extend_from_slice(bad);
            input.push(b'\n');
        }
        let got = lines(&run(input, 1000).await);
        let value = |i: usize| serde_json::from_str::<serde_json::Value>(&got[i]).unwrap();
        for (i, id) in [
            (0, json!(1)),
            (1, json!("two")),
            (2, json!(3)),
            (3, json!(4)),
        ] {
            assert_eq!(value(i)["id"], id, "{}", got[i]);
            assert_eq!(value(i)["method"], UNPARSABLE_METHOD);
            assert!(
                value(i)["params"]["error"]
                    .as_str()
                    .unwrap()
                    .contains("not JSON")
            );
        }
        assert_eq!(got[4], r#"{"jsonrpc":"2.0"}"#);
        // A batch is JSON: the transport refuses it itself.
        assert_eq!(got[5], r#"[{"jsonrpc":"2.0","id":5,"method":"ping"}]"#);
        assert_eq!(got.len(), 6, "{got:?}");
    }

    #[test]
    fn the_error_names_the_limit() {
        let msg = oversized_error(17_000_000, 32 << 20);
        assert!(
            msg.contains("16.2 MiB") && msg.contains("32.0 MiB"),
            "{msg}"
        );
    }
}
