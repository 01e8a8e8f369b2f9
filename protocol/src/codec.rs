//! Framing: length-prefixed postcard payloads, and an incremental decoder that
//! finds the agent's preamble in whatever a login shell printed first.
//!
//! The codec is the only place that knows the encoding, so it can be swapped.

use serde::{Serialize, de::DeserializeOwned};
use std::fmt;

use crate::PREAMBLE;
use crate::limits::{MAX_FRAME_LEN, MAX_NOISE_LEN};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// A length prefix announced more than [`MAX_FRAME_LEN`].
    FrameTooLarge {
        len: u64,
        max: usize,
    },
    /// More than [`MAX_NOISE_LEN`] bytes arrived without a preamble.
    NoPreamble {
        noise: Vec<u8>,
    },
    Decode(String),
    Encode(String),
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::FrameTooLarge { len, max } => {
                write!(f, "frame of {len} bytes exceeds the {max}-byte limit")
            }
            ProtocolError::NoPreamble { noise } => write!(
                f,
                "no agent preamble in the first {} bytes; the stream began with {:?}",
                noise.len(),
                String::from_utf8_lossy(&noise[..noise.len().min(200)])
            ),
            ProtocolError::Decode(e) => write!(f, "malformed message: {e}"),
            ProtocolError::Encode(e) => write!(f, "cannot encode message: {e}"),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// Encodes `msg` as one frame: u32 little-endian length, then the payload.
pub fn encode_frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtocolError> {
    let mut out =
        postcard::to_extend(msg, vec![0u8; 4]).map_err(|e| ProtocolError::Encode(e.to_string()))?;
    let len = out.len() - 4;
    if len > MAX_FRAME_LEN {
        return Err(ProtocolError::FrameTooLarge {
            len: len as u64,
            max: MAX_FRAME_LEN,
        });
    }
    out[..4].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(out)
}

/// Decodes one frame payload. Trailing bytes are ignored so that a newer peer's
/// appended fields do not break [`crate::HelloVersion`].
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, ProtocolError> {
    postcard::from_bytes(payload).map_err(|e| ProtocolError::Decode(e.to_string()))
}

/// What [`FrameDecoder::next_event`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeEvent {
    /// Bytes before the preamble (shell rc output, a MOTD). Reported once.
    Noise(Vec<u8>),
    /// One complete frame payload.
    Frame(Vec<u8>),
}

/// Incremental frame decoder: push bytes as they arrive, take events out.
///
/// Memory is bounded by [`MAX_FRAME_LEN`] plus one read: a length prefix over the
/// cap is an error before any payload is buffered.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    start: usize,
    seeking_preamble: bool,
}

impl FrameDecoder {
    /// A decoder for the agent's output: skips noise until the preamble.
    pub fn after_preamble() -> Self {
        FrameDecoder {
            buf: Vec::new(),
            start: 0,
            seeking_preamble: true,
        }
    }

    /// A decoder for a stream that starts directly with frames.
    pub fn framed() -> Self {
        FrameDecoder {
            buf: Vec::new(),
            start: 0,
            seeking_preamble: false,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Bytes received but not yet returned.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next complete event, `Ok(None)` when more bytes are needed.
    pub fn next_event(&mut self) -> Result<Option<DecodeEvent>, ProtocolError> {
        let pending = &self.buf[self.start..];
        if self.seeking_preamble {
            if let Some(pos) = find(pending, &PREAMBLE) {
                let noise = pending[..pos].to_vec();
                self.start += pos + PREAMBLE.len();
                self.seeking_preamble = false;
                if !noise.is_empty() {
                    return Ok(Some(DecodeEvent::Noise(noise)));
                }
                return self.next_event();
            }
            if pending.len() > MAX_NOISE_LEN {
                return Err(ProtocolError::NoPreamble {
                    noise: pending[..MAX_NOISE_LEN].to_vec(),
                });
            }
            return Ok(None);
        }
        if pending.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([pending[0], pending[1], pending[2], pending[3]]) as usize;
        if len > MAX_FRAME_LEN {
            return Err(ProtocolError::FrameTooLarge {
                len: len as u64,
                max: MAX_FRAME_LEN,
            });
        }
        if pending.len() < 4 + len {
            // Reserve once for the whole frame instead of growing repeatedly.
            self.buf.reserve(4 + len - pending.len());
            return Ok(None);
        }
        let frame = pending[4..4 + len].to_vec();
        self.start += 4 + len;
        Ok(Some(DecodeEvent::Frame(frame)))
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_before_preamble_is_reported_then_frames_flow() {
        let mut dec = FrameDecoder::after_preamble();
        let mut input = b"Welcome to host\nlast login\n".to_vec();
        input.extend_from_slice(&PREAMBLE);
        input.extend(encode_frame(&7u32).unwrap());
        // Feed byte by byte to exercise every partial state.
        let mut events = Vec::new();
        for b in input {
            dec.push(&[b]);
            while let Some(ev) = dec.next_event().unwrap() {
                events.push(ev);
            }
        }
        assert_eq!(
            events[0],
            DecodeEvent::Noise(b"Welcome to host\nlast login\n".to_vec())
        );
        match &events[1] {
            DecodeEvent::Frame(p) => assert_eq!(decode::<u32>(p).unwrap(), 7),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(events.len(), 2);
    }

    #[test]
    fn oversized_length_is_an_error_without_allocation() {
        let mut dec = FrameDecoder::framed();
        dec.push(&u32::MAX.to_le_bytes());
        let err = dec.next_event().unwrap_err();
        assert!(matches!(err, ProtocolError::FrameTooLarge { .. }));
        assert!(dec.buf.capacity() < 1024);
    }

    #[test]
    fn endless_noise_is_an_error() {
        let mut dec = FrameDecoder::after_preamble();
        dec.push(&vec![b'x'; MAX_NOISE_LEN + 1]);
        assert!(matches!(
            dec.next_event(),
            Err(ProtocolError::NoPreamble { .. })
        ));
    }
}
