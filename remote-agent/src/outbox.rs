//! The single writer of the session's output (stdout, for `serve`).
//!
//! Every task hands encoded frames to one channel; one task writes them, so
//! frames never interleave. The channel is bounded, which turns a controller
//! that stops reading into backpressure on the commands instead of memory
//! growth in the agent.

use outpost_protocol::{
    AgentError, AgentMessage, ErrorKind, PREAMBLE, RequestId, Response, encode_frame,
};
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Frames queued for the output. Streamed chunks are at most 64 KiB, so this caps
/// queued output at a few MiB.
const QUEUE: usize = 64;

/// A handle for sending responses; clone it freely.
#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Frame>,
}

/// An encoded frame, written as its two parts one after the other: file
/// content goes in the second, uncopied (see
/// [`outpost_protocol::encode_file_data_frame`]); every other frame is
/// whole in the first.
pub type Frame = (Vec<u8>, Vec<u8>);

impl Outbox {
    /// Queues one response unless the queue is full (or the writer gone):
    /// for reports that a newer one replaces, which must never make their
    /// sender wait.
    pub fn offer(&self, id: RequestId, body: Response) -> bool {
        match encode_frame(&AgentMessage::Response { id, body }) {
            Ok(frame) => self.tx.try_send((frame, Vec::new())).is_ok(),
            Err(_) => false,
        }
    }

    /// Queues a `FileData` answer encoded beforehand (on the thread that
    /// read it). Returns false once the writer is gone.
    pub async fn send_encoded(&self, frame: Frame) -> bool {
        self.tx.send(frame).await.is_ok()
    }

    /// Queues one response. Returns false once the writer is gone.
    pub async fn send(&self, id: RequestId, body: Response) -> bool {
        let frame = match encode_frame(&AgentMessage::Response { id, body }) {
            Ok(frame) => frame,
            // Limits keep every response under the frame cap; if that is ever
            // wrong, the request still gets a final answer.
            Err(e) => {
                let body = Response::Error(AgentError {
                    kind: ErrorKind::Internal,
                    message: format!("cannot encode response: {e}"),
                });
                match encode_frame(&AgentMessage::Response { id, body }) {
                    Ok(frame) => frame,
                    Err(_) => return false,
                }
            }
        };
        self.tx.send((frame, Vec::new())).await.is_ok()
    }
}

/// Starts the writer of `output`. It writes the preamble and `hello_frame`
/// before anything else, and returns once every [`Outbox`] is dropped and all
/// is flushed.
pub fn start<W>(output: W, hello_frame: Vec<u8>) -> (Outbox, JoinHandle<()>)
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel(QUEUE);
    let writer = tokio::spawn(write_frames(output, rx, hello_frame));
    (Outbox { tx }, writer)
}

async fn write_frames<W: AsyncWrite + Unpin>(
    output: W,
    mut rx: mpsc::Receiver<Frame>,
    hello_frame: Vec<u8>,
) {
    let mut out = BufWriter::with_capacity(128 * 1024, output);
    let mut ok = write(&mut out, &PREAMBLE).await
        && write(&mut out, &hello_frame).await
        && out.flush().await.is_ok();
    while let Some(frame) = rx.recv().await {
        // Once the output is gone, keep draining so that senders never block.
        ok = ok && write_frame(&mut out, &frame).await;
        // Batch whatever is already queued into one flush.
        while let Ok(frame) = rx.try_recv() {
            ok = ok && write_frame(&mut out, &frame).await;
        }
        if ok && out.flush().await.is_err() {
            ok = false;
        }
        if !ok {
            report_broken();
        }
    }
    let _ = out.flush().await;
}

async fn write<W: AsyncWrite + Unpin>(out: &mut BufWriter<W>, data: &[u8]) -> bool {
    out.write_all(data).await.is_ok()
}

async fn write_frame<W: AsyncWrite + Unpin>(out: &mut BufWriter<W>, (head, tail): &Frame) -> bool {
    write(out, head).await && write(out, tail).await
}

fn report_broken() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| eprintln!("outpost-agent: the output is closed; dropping responses"));
}
