//! A live agent connection: a reader task dispatching responses by request
//! id, a writer task owning the agent's stdin, a heartbeat; and the calls in
//! flight on it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outpost_protocol::{
    AgentMessage, ClientMessage, Hello, Request, RequestId, Response, decode, encode_frame,
    encode_frame_with_tail,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::host::bootstrap::HostFacts;
use crate::host::link::LinkReader;
use crate::host::{AgentLink, Host, LinkEvent};

use super::error::CallError;
use super::heartbeat::{
    HEARTBEAT_DEAD, HEARTBEAT_DEAD_SENDING, HEARTBEAT_ID, HEARTBEAT_IDLE, Liveness,
};
use super::writer::{Lane, OutFrame, write_frame};

type Pending = HashMap<RequestId, mpsc::UnboundedSender<Response>>;

/// A live agent connection.
pub struct Connection {
    pub hello: Hello,
    pub agent_path: String,
    pub uploaded: bool,
    pub facts: Option<HostFacts>,
    next_id: AtomicU64,
    pending: Mutex<Pending>,
    /// Frames for the writer, in two lanes (see [`Lane`]).
    urgent: mpsc::UnboundedSender<OutFrame>,
    bulk: mpsc::UnboundedSender<OutFrame>,
    closed: Mutex<Option<String>>,
    liveness: Arc<Liveness>,
    tasks: Mutex<Vec<AbortHandle>>,
    keep: Mutex<Option<Box<dyn Send + Sync>>>,
    host: Arc<dyn Host>,
}

impl Connection {
    /// The host this connection's agent runs on, for starting more there
    /// (a Slurm step through a login node's connection).
    pub fn host(&self) -> Arc<dyn Host> {
        Arc::clone(&self.host)
    }

    pub(super) fn open(
        link: AgentLink,
        reader: LinkReader,
        hello: Hello,
        agent_path: String,
        uploaded: bool,
        facts: Option<HostFacts>,
        host: Arc<dyn Host>,
    ) -> Arc<Connection> {
        let AgentLink {
            events,
            mut writer,
            _keep,
        } = link;
        let (urgent_tx, mut urgent) = mpsc::unbounded_channel::<OutFrame>();
        let (bulk_tx, mut bulk) = mpsc::unbounded_channel::<OutFrame>();
        let conn = Arc::new(Connection {
            hello,
            agent_path,
            uploaded,
            facts,
            next_id: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            urgent: urgent_tx,
            bulk: bulk_tx,
            closed: Mutex::new(None),
            liveness: Arc::new(Liveness::new()),
            tasks: Mutex::new(Vec::new()),
            keep: Mutex::new(Some(_keep)),
            host,
        });

        let weak = Arc::downgrade(&conn);
        let liveness = Arc::clone(&conn.liveness);
        let writer_task = tokio::spawn(async move {
            loop {
                let frame = tokio::select! {
                    biased;
                    Some(frame) = urgent.recv() => frame,
                    Some(frame) = bulk.recv() => frame,
                    else => break,
                };
                let mut result = write_frame(&mut writer, &frame, &liveness).await;
                // Coalesce urgent frames queued meanwhile before flushing.
                while result.is_ok()
                    && let Ok(more) = urgent.try_recv()
                {
                    result = write_frame(&mut writer, &more, &liveness).await;
                }
                if let Err(e) = result.and(writer.flush().await) {
                    if let Some(conn) = weak.upgrade() {
                        conn.fail(format!("cannot write to the agent: {e}"));
                    }
                    return;
                }
            }
            let _ = writer.shutdown().await;
        });

        let weak = Arc::downgrade(&conn);
        let liveness = Arc::clone(&conn.liveness);
        let reader_task = tokio::spawn(read_loop(weak, liveness, reader, events));

        let weak = Arc::downgrade(&conn);
        let heartbeat_task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            let mut last_ping = Instant::now();
            loop {
                tick.tick().await;
                let Some(conn) = weak.upgrade() else { return };
                let silent = conn.liveness.silence();
                let limit = if conn.liveness.sending() {
                    HEARTBEAT_DEAD_SENDING
                } else {
                    HEARTBEAT_DEAD
                };
                if silent >= limit {
                    conn.fail(format!(
                        "no answer from the host for {:.1} s (host frozen or network down)",
                        silent.as_secs_f64()
                    ));
                    return;
                }
                if silent >= HEARTBEAT_IDLE && last_ping.elapsed() >= HEARTBEAT_IDLE {
                    last_ping = Instant::now();
                    conn.send_ping();
                }
            }
        });
        conn.tasks.lock().unwrap().extend([
            writer_task.abort_handle(),
            reader_task.abort_handle(),
            heartbeat_task.abort_handle(),
        ]);
        conn
    }

    pub fn closed_reason(&self) -> Option<String> {
        self.closed.lock().unwrap().clone()
    }

    /// Marks the connection dead, fails every call in flight, and tears it down.
    pub fn fail(&self, reason: String) {
        tracing::warn!("connection lost: {reason}");
        self.close(reason);
    }

    /// Like [`Connection::fail`], for a deliberate close.
    pub fn close(&self, reason: String) {
        {
            let mut closed = self.closed.lock().unwrap();
            if closed.is_some() {
                return;
            }
            *closed = Some(reason);
        }
        // Dropping the senders wakes every waiting call.
        self.pending.lock().unwrap().clear();
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
        drop(self.keep.lock().unwrap().take());
        let host = Arc::clone(&self.host);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(1), host.disconnect()).await;
        });
    }

    /// Sends `request` as it is; the answer arrives through the returned
    /// [`Call`]. Only the session sends bare requests: everything else goes
    /// through a [`super::ScopedConn`], which puts a sandbox's inside it.
    pub(super) fn start(self: &Arc<Self>, request: Request) -> Result<Call, CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = encode_frame(&ClientMessage::Request { id, body: request })
            .map_err(|e| CallError::Protocol(e.to_string()))?;
        self.start_frame(id, OutFrame::whole(frame))
    }

    /// Sends `request` with `content` as the content it carries (see
    /// [`Request::content_mut`]; the request's own is left empty): the
    /// frame is written as its head and then `content`, which is never
    /// copied, so hosts given the same part share one buffer.
    pub(super) fn start_with_content(
        self: &Arc<Self>,
        request: Request,
        content: Arc<Vec<u8>>,
    ) -> Result<Call, CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let protocol = |e: outpost_protocol::ProtocolError| CallError::Protocol(e.to_string());
        let with = |bytes: Vec<u8>| {
            let mut body = request.clone();
            if let Some(data) = body.content_mut() {
                *data = bytes;
            }
            ClientMessage::Request { id, body }
        };
        let frame = match encode_frame_with_tail(with, content.len()).map_err(protocol)? {
            Some(head) => OutFrame {
                head,
                tail: Some(content),
            },
            // Not a request that carries content: sent whole.
            None => OutFrame::whole(encode_frame(&with(content.to_vec())).map_err(protocol)?),
        };
        self.start_frame(id, frame)
    }

    fn start_frame(self: &Arc<Self>, id: RequestId, frame: OutFrame) -> Result<Call, CallError> {
        let (tx, rx) = mpsc::unbounded_channel();
        {
            // Checked under the pending lock so `fail` cannot slip in between.
            let mut pending = self.pending.lock().unwrap();
            if let Some(reason) = self.closed_reason() {
                return Err(CallError::ConnectionLost(reason));
            }
            pending.insert(id, tx);
        }
        let lane = Lane::of(&frame);
        if !self.send_frame(frame, lane) {
            self.pending.lock().unwrap().remove(&id);
            return Err(CallError::ConnectionLost(
                self.closed_reason()
                    .unwrap_or_else(|| "writer stopped".into()),
            ));
        }
        Ok(Call {
            id,
            lane,
            rx,
            conn: self.clone(),
            finished: false,
        })
    }

    /// Heartbeat ping under the reserved id 0: its pong only needs to arrive,
    /// since any frame resets the silence.
    fn send_ping(&self) {
        if let Ok(frame) = encode_frame(&ClientMessage::Request {
            id: HEARTBEAT_ID,
            body: Request::Ping,
        }) {
            self.send_frame(OutFrame::whole(frame), Lane::Urgent);
        }
    }

    /// Queues a frame for the writer; false if the writer is gone.
    fn send_frame(&self, frame: OutFrame, lane: Lane) -> bool {
        let len = frame.len() as u64;
        self.liveness.unsent.fetch_add(len, Ordering::Relaxed);
        let queue = match lane {
            Lane::Urgent => &self.urgent,
            Lane::Bulk => &self.bulk,
        };
        if queue.send(frame).is_err() {
            self.liveness.unsent.fetch_sub(len, Ordering::Relaxed);
            return false;
        }
        true
    }

    fn dispatch(&self, id: RequestId, body: Response) {
        let is_final = body.is_final();
        let mut pending = self.pending.lock().unwrap();
        if let Some(tx) = pending.get(&id) {
            let _ = tx.send(body);
        }
        if is_final {
            pending.remove(&id);
        }
    }

    /// Number of requests waiting for an answer (heartbeat pings included).
    pub fn in_flight(&self) -> usize {
        self.pending.lock().unwrap().len()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        for task in self.tasks.get_mut().unwrap().drain(..) {
            task.abort();
        }
    }
}

async fn read_loop(
    conn: std::sync::Weak<Connection>,
    liveness: Arc<Liveness>,
    mut reader: LinkReader,
    mut events: mpsc::Receiver<LinkEvent>,
) {
    loop {
        let frame = reader.next_frame(&mut events, &|| liveness.touch()).await;
        let Some(c) = conn.upgrade() else { return };
        match frame.and_then(|f| decode::<AgentMessage>(&f).map_err(|e| e.to_string())) {
            Ok(AgentMessage::Response { id, body }) => {
                c.dispatch(id, body);
            }
            Err(reason) => {
                c.fail(reason);
                return;
            }
        }
    }
}

/// One request in flight. Dropping it before its final response cancels it on
/// the agent (an MCP client's cancellation drops the tool future).
pub struct Call {
    id: RequestId,
    /// The lane the request went out in: its cancel follows it there, so it
    /// can never overtake the request it cancels.
    lane: Lane,
    rx: mpsc::UnboundedReceiver<Response>,
    conn: Arc<Connection>,
    finished: bool,
}

impl Call {
    pub async fn next(&mut self) -> Result<Response, CallError> {
        match self.rx.recv().await {
            Some(resp) => {
                if resp.is_final() {
                    self.finished = true;
                }
                Ok(resp)
            }
            None => {
                self.finished = true;
                Err(CallError::ConnectionLost(
                    self.conn
                        .closed_reason()
                        .unwrap_or_else(|| "connection closed".into()),
                ))
            }
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if !self.finished && self.conn.closed_reason().is_none() {
            self.conn.pending.lock().unwrap().remove(&self.id);
            if let Ok(frame) = encode_frame(&ClientMessage::Cancel { id: self.id }) {
                self.conn.send_frame(OutFrame::whole(frame), self.lane);
            }
        }
    }
}
