//! The wire protocol spoken between the Outpost controller and `outpost-agent`.
//!
//! One byte stream (an SSH exec channel or a child's pipes) carries everything:
//!
//! ```text
//! agent → controller:  [noise …] PREAMBLE frame(Hello) frame(AgentMessage)*
//! controller → agent:  frame(ClientMessage)*
//! frame:               u32 little-endian payload length, payload (postcard)
//! ```
//!
//! * [`messages`] enumerates every message in one place.
//! * [`codec`] turns messages into frames and an incoming byte stream back into
//!   frames, skipping (and reporting) whatever a login shell printed before the
//!   preamble.
//! * [`limits`] holds the hard caps both ends enforce.
//!
//! This crate does no IO and depends on serde and postcard only, so both ends and
//! the tests share exactly one definition of the wire. Postcard is not
//! self-describing: enum variants are only ever appended, and any change to an
//! existing message bumps [`PROTOCOL_VERSION`].

pub mod codec;
pub mod limits;
pub mod messages;

pub use codec::{
    DecodeEvent, FrameDecoder, PREAMBLE, Payload, ProtocolError, decode, encode_file_data_frame,
    encode_frame, encode_frame_with_tail,
};
pub use messages::*;

/// Version of the message layout. The controller refuses an agent that reports
/// another version and installs the matching agent instead.
pub const PROTOCOL_VERSION: u32 = 21;
