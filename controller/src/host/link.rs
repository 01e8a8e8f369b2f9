//! Reading protocol frames off an [`AgentLink`]: preamble, hello (its
//! protocol version checked first), then messages.

use std::time::Duration;

use outpost_protocol::{DecodeEvent, FrameDecoder, Hello, HelloVersion, PROTOCOL_VERSION, Payload};
use tokio::sync::mpsc;

use super::{AgentLink, LinkEvent};

/// Keeps the decoder state and the last stderr bytes of the agent (shown when it
/// dies, since that is where it explains why).
pub struct LinkReader {
    decoder: FrameDecoder,
    stderr_tail: Vec<u8>,
}

const STDERR_TAIL: usize = 4096;

impl LinkReader {
    fn new() -> Self {
        LinkReader {
            decoder: FrameDecoder::after_preamble(),
            stderr_tail: Vec::new(),
        }
    }

    /// The next frame payload, or why there will be none. `heard` is called
    /// for every piece of output that arrives, whole frame or not.
    pub async fn next_frame(
        &mut self,
        events: &mut mpsc::Receiver<LinkEvent>,
        heard: &(dyn Fn() + Sync),
    ) -> Result<Payload, String> {
        loop {
            match self.decoder.next_event() {
                Ok(Some(DecodeEvent::Frame(payload))) => return Ok(payload),
                Ok(Some(DecodeEvent::Noise(noise))) => {
                    tracing::debug!(
                        "skipped {} bytes of shell output before the agent started: {:?}",
                        noise.len(),
                        String::from_utf8_lossy(&noise[..noise.len().min(200)])
                    );
                    continue;
                }
                Ok(None) => {}
                Err(e) => return Err(format!("protocol error: {e}")),
            }
            let event = events.recv().await;
            if matches!(event, Some(LinkEvent::Stdout(_) | LinkEvent::Stderr(_))) {
                heard();
            }
            match event {
                Some(LinkEvent::Stdout(data)) => self.decoder.push(&data),
                Some(LinkEvent::Stderr(data)) => {
                    for line in String::from_utf8_lossy(&data).lines() {
                        tracing::debug!("agent stderr: {line}");
                    }
                    self.stderr_tail.extend_from_slice(&data);
                    if self.stderr_tail.len() > STDERR_TAIL {
                        let cut = self.stderr_tail.len() - STDERR_TAIL;
                        self.stderr_tail.drain(..cut);
                    }
                }
                Some(LinkEvent::Closed(reason)) => return Err(self.explain(&reason)),
                None => return Err(self.explain("link closed")),
            }
        }
    }

    fn explain(&self, reason: &str) -> String {
        let stderr = String::from_utf8_lossy(&self.stderr_tail);
        let stderr = stderr.trim();
        if stderr.is_empty() {
            reason.to_string()
        } else {
            format!("{reason}: {stderr}")
        }
    }
}

/// Waits for the agent's preamble and hello, within `timeout`.
pub async fn read_hello(
    link: &mut AgentLink,
    timeout: Duration,
) -> Result<(LinkReader, Hello), String> {
    let mut reader = LinkReader::new();
    let frame = tokio::time::timeout(timeout, reader.next_frame(&mut link.events, &|| {}))
        .await
        .map_err(|_| format!("agent did not answer within {} s", timeout.as_secs()))??;
    let hello = check_protocol(&frame)?;
    Ok((reader, hello))
}

/// Checks the version field of a hello before trusting the rest of it.
fn check_protocol(payload: &[u8]) -> Result<Hello, String> {
    let version: HelloVersion = outpost_protocol::decode(payload).map_err(|e| e.to_string())?;
    if version.protocol_version != PROTOCOL_VERSION {
        return Err(format!(
            "agent speaks protocol {}, this controller {}",
            version.protocol_version, PROTOCOL_VERSION
        ));
    }
    outpost_protocol::decode(payload).map_err(|e| e.to_string())
}
