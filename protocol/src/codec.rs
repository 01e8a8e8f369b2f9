//! Framing: length-prefixed postcard payloads, and an incremental decoder that
//! finds the agent's preamble in whatever a login shell printed first.
//!
//! The codec is the only place that knows the encoding, so it can be swapped.

use serde::{Serialize, de::DeserializeOwned};
use std::fmt;

use crate::limits::{MAX_FRAME_LEN, MAX_NOISE_LEN};

/// Written once by the agent before its first frame. Starts with NUL and ESC so no
/// shell banner or MOTD can contain it by accident.
pub const PREAMBLE: [u8; 8] = [0x00, 0x1b, b'O', b'U', b'T', b'P', b'S', 0x01];

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
///
/// The size is counted first (cheap: a byte string counts as its length), so
/// a frame of file content is allocated once, at its size, and its bytes are
/// copied as slices rather than byte by byte.
pub fn encode_frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtocolError> {
    let encode_error = |e: postcard::Error| ProtocolError::Encode(e.to_string());
    let len = postcard::serialize_with_flavor(msg, postcard::ser_flavors::Size::default())
        .map_err(encode_error)?;
    if len > MAX_FRAME_LEN {
        return Err(ProtocolError::FrameTooLarge {
            len: len as u64,
            max: MAX_FRAME_LEN,
        });
    }
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&[0; 4]);
    let mut out = postcard::serialize_with_flavor(msg, FrameBuffer(out)).map_err(encode_error)?;
    // The prefix says what was written, whatever the count said.
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

/// The head of a frame whose last encoded field is a byte string of
/// `tail_len` bytes: the frame is this head, then those bytes, exactly what
/// [`encode_frame`] makes of the whole message. `with(bytes)` is the
/// message holding `bytes`. The head is built without the bytes, so content
/// is written after it without being copied into a frame, or shared by
/// several hosts' frames.
///
/// `None` when the byte string is not what is encoded last (checked: the
/// message with one byte must encode as the one without, plus that byte).
pub fn encode_frame_with_tail<T: Serialize>(
    with: impl Fn(Vec<u8>) -> T,
    tail_len: usize,
) -> Result<Option<Vec<u8>>, ProtocolError> {
    let mut head = encode_frame(&with(Vec::new()))?;
    let one = encode_frame(&with(vec![0xa5]))?;
    // A byte string is its length as a varint, then its bytes: empty, that
    // is a single 0 at the very end.
    let last = head.len() - 1;
    if head[last] != 0 || one.len() != head.len() + 1 || one[4..last] != head[4..last] {
        return Ok(None);
    }
    if one[last..] != [1, 0xa5] {
        return Ok(None);
    }
    head.truncate(last);
    let mut varint = [0u8; 10];
    let length = postcard::to_slice(&(tail_len as u64), &mut varint)
        .map_err(|e| ProtocolError::Encode(e.to_string()))?;
    head.extend_from_slice(length);
    let len = head.len() - 4 + tail_len;
    if len > MAX_FRAME_LEN {
        return Err(ProtocolError::FrameTooLarge {
            len: len as u64,
            max: MAX_FRAME_LEN,
        });
    }
    head[..4].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(Some(head))
}

/// The frame of a `FileData` answer in two parts (see
/// [`encode_frame_with_tail`]): its head, then `data`. The agent writes the
/// two one after the other, so content read from a file goes out without
/// being copied into a frame.
pub fn encode_file_data_frame(
    id: crate::messages::RequestId,
    index: u32,
    offset: u64,
    data: Vec<u8>,
) -> Result<(Vec<u8>, Vec<u8>), ProtocolError> {
    let with = |data| crate::messages::AgentMessage::Response {
        id,
        body: crate::messages::Response::FileData {
            index,
            offset,
            data,
        },
    };
    match encode_frame_with_tail(with, data.len())? {
        Some(head) => Ok((head, data)),
        None => Ok((encode_frame(&with(data))?, Vec::new())),
    }
}

/// postcard output into a `Vec` sized beforehand; postcard's own `Extend`
/// flavor pushes byte by byte.
struct FrameBuffer(Vec<u8>);

impl postcard::ser_flavors::Flavor for FrameBuffer {
    type Output = Vec<u8>;

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }

    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Vec<u8>> {
        Ok(self.0)
    }
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
    Frame(Payload),
}

/// A frame's payload. A large one is the buffer it was received into, handed
/// over rather than copied (the payload starts past what came before it).
#[derive(Debug, Clone)]
pub struct Payload {
    bytes: Vec<u8>,
    start: usize,
}

impl Payload {
    pub fn into_vec(mut self) -> Vec<u8> {
        self.bytes.drain(..self.start);
        self.bytes
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        **self == **other
    }
}

impl Eq for Payload {}

impl From<Vec<u8>> for Payload {
    fn from(bytes: Vec<u8>) -> Payload {
        Payload { bytes, start: 0 }
    }
}

impl std::ops::Deref for Payload {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes[self.start..]
    }
}

/// Frames at least this large are handed over in the buffer they arrived
/// in; smaller ones are copied out, which keeps the buffer for the next.
const HANDED_OVER: usize = 64 * 1024;

/// Input buffered at once when no large frame is in progress.
const READ_SIZE: usize = 64 * 1024;

/// Incremental frame decoder: push bytes as they arrive, take events out.
///
/// Memory is bounded by [`MAX_FRAME_LEN`] plus one read: a length prefix over the
/// cap is an error before any payload is buffered, and a frame in progress is
/// given room for exactly its rest (doubling a large frame's buffer would
/// copy it).
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
        self.compact();
        if self.missing().is_some() {
            // Past a frame's reserved end exactly: doubling a large frame's
            // buffer would copy it. Other input grows the buffer as usual.
            self.buf.reserve_exact(data.len());
        }
        self.buf.extend_from_slice(data);
    }

    /// The buffer to append input to in place (`AsyncReadExt::read_buf`,
    /// which fills its spare capacity), instead of [`push`](Self::push)ing
    /// it from another: its room is the rest of the frame in progress, so
    /// that a large frame ends at the buffer's end and is handed over
    /// without copying what follows it; else at least a read's worth. Only
    /// appending is allowed.
    pub fn input(&mut self) -> &mut Vec<u8> {
        self.compact();
        match self.missing() {
            Some(missing) => self.buf.reserve_exact(missing),
            None => self.buf.reserve(READ_SIZE),
        }
        &mut self.buf
    }

    /// Bytes still to come of the frame whose header is buffered.
    fn missing(&self) -> Option<usize> {
        let pending = &self.buf[self.start..];
        if self.seeking_preamble || pending.len() < 4 {
            return None;
        }
        let len = u32::from_le_bytes([pending[0], pending[1], pending[2], pending[3]]) as usize;
        // An oversized prefix is next_event's error to report.
        (len <= MAX_FRAME_LEN && pending.len() < 4 + len).then(|| 4 + len - pending.len())
    }

    fn compact(&mut self) {
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
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
            // Reserve once for the whole frame instead of growing
            // repeatedly, and exactly: what is read in place ends with it.
            self.buf.reserve_exact(4 + len - pending.len());
            return Ok(None);
        }
        let end = self.start + 4 + len;
        if len < HANDED_OVER {
            let frame = self.buf[self.start + 4..end].to_vec();
            self.start = end;
            return Ok(Some(DecodeEvent::Frame(frame.into())));
        }
        // Hand the buffer over; what followed the frame starts the next one
        // (nothing when it was read in place; at most the piece it came in
        // with when pushed).
        let rest = self.buf[end..].to_vec();
        let mut bytes = std::mem::replace(&mut self.buf, rest);
        bytes.truncate(end);
        let frame = Payload {
            bytes,
            start: self.start + 4,
        };
        self.start = 0;
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
    fn file_data_in_two_parts_is_the_frame_in_one() {
        // Lengths on each side of every varint width, and ids and offsets
        // that take several bytes.
        for len in [
            0usize, 1, 127, 128, 16_383, 16_384, 262_144, 2_097_151, 2_097_152,
        ] {
            for (id, index, offset) in [(0u64, 0u32, 0u64), (300, 70_000, u64::MAX)] {
                let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
                let whole = encode_frame(&crate::messages::AgentMessage::Response {
                    id,
                    body: crate::messages::Response::FileData {
                        index,
                        offset,
                        data: data.clone(),
                    },
                })
                .unwrap();
                let (head, tail) = encode_file_data_frame(id, index, offset, data).unwrap();
                assert_eq!([head, tail].concat(), whole, "{len} bytes");
            }
        }
        let over = vec![0; MAX_FRAME_LEN];
        assert!(matches!(
            encode_file_data_frame(1, 0, 0, over),
            Err(ProtocolError::FrameTooLarge { .. })
        ));
    }

    #[test]
    fn a_part_s_content_follows_its_head_in_a_sandbox_too() {
        let part = |data: Vec<u8>| crate::PutPart {
            root: "r".into(),
            xfer: 9,
            path: b"a/b".to_vec(),
            offset: 1 << 40,
            hash: [7; 32],
            size: 0,
            data: crate::PartData::Data(data),
        };
        for sandbox in [None, Some("sbx-1")] {
            let request = |data: Vec<u8>| {
                let body = crate::Request::PutPart(part(data));
                crate::ClientMessage::Request {
                    id: 42,
                    body: match sandbox {
                        Some(id) => crate::Request::InSandbox {
                            id: id.into(),
                            request: Box::new(body),
                        },
                        None => body,
                    },
                }
            };
            for len in [0usize, 1, 200, 70_000] {
                let content: Vec<u8> = (0..len).map(|i| i as u8).collect();
                let head = encode_frame_with_tail(request, len).unwrap().unwrap();
                let whole = encode_frame(&request(content.clone())).unwrap();
                assert_eq!([head, content].concat(), whole);
            }
            let mut body = match request(vec![1, 2]) {
                crate::ClientMessage::Request { body, .. } => body,
                _ => unreachable!(),
            };
            assert_eq!(body.content_mut(), Some(&mut vec![1, 2]));
        }
        // A message whose byte string is not last has no head of its own.
        let not_last = |data: Vec<u8>| (serde_bytes::ByteBuf::from(data), 0u8);
        assert_eq!(encode_frame_with_tail(not_last, 10).unwrap(), None);
        assert_eq!(crate::Request::Ping.content_mut(), None);
    }

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

    /// Small and large frames, fed in pieces of every kind of size both ways
    /// (pushed, and read into the decoder's own buffer), come out whole and in
    /// order, large ones handed over.
    #[test]
    fn frames_of_every_size_survive_any_split() {
        let messages: Vec<Vec<u8>> = [3usize, HANDED_OVER - 5, 0, HANDED_OVER + 7, 200_000, 1]
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|b| (b * 31 + i) as u8).collect())
            .collect();
        let stream: Vec<u8> = messages
            .iter()
            .flat_map(|m| encode_frame(&serde_bytes::Bytes::new(m)).unwrap())
            .collect();
        let largest = messages.iter().map(Vec::len).max().unwrap() + 8;
        for piece in [1, 3, 4096, HANDED_OVER - 1, HANDED_OVER + 3, stream.len()] {
            for in_place in [false, true] {
                let mut dec = FrameDecoder::framed();
                let mut got = Vec::new();
                let mut rest = &stream[..];
                while !rest.is_empty() {
                    let n = if in_place {
                        // As `read_buf` does: at most the spare capacity.
                        let buf = dec.input();
                        let n = piece.min(rest.len()).min(buf.capacity() - buf.len());
                        buf.extend_from_slice(&rest[..n]);
                        n
                    } else {
                        let n = piece.min(rest.len());
                        dec.push(&rest[..n]);
                        n
                    };
                    rest = &rest[n..];
                    assert!(dec.buf.capacity() <= largest + READ_SIZE + piece);
                    while let Some(event) = dec.next_event().unwrap() {
                        let DecodeEvent::Frame(payload) = event else {
                            panic!("noise in a framed stream");
                        };
                        let handed_over = payload.start > 0;
                        assert_eq!(handed_over, payload.len() >= HANDED_OVER);
                        if in_place && handed_over {
                            // Reads were made to end with it (unless the
                            // buffer had room to spare before its header).
                            assert!(payload.bytes.capacity() <= payload.bytes.len() + READ_SIZE);
                        }
                        got.push(decode::<serde_bytes::ByteBuf>(&payload).unwrap().into_vec());
                    }
                }
                assert_eq!(got, messages, "pieces of {piece}, in place: {in_place}");
                assert_eq!(dec.buffered(), 0);
            }
        }
    }

    #[test]
    fn encoded_frames_are_exactly_sized() {
        let data = vec![7u8; 300_000];
        let frame = encode_frame(&serde_bytes::Bytes::new(&data)).unwrap();
        assert_eq!(frame.capacity(), frame.len());
        let len = u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 4);
        assert_eq!(decode::<serde_bytes::ByteBuf>(&frame[4..]).unwrap(), data);
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
