//! One connection per sandbox, shared by every call, with requests multiplexed.
//!
//! A [`Session`] is `Disconnected` until a call needs it, then holds a live
//! [`Connection`]: a reader task dispatching responses by request id, a writer task
//! owning the agent's stdin, and a heartbeat. Any of them failing moves the
//! connection to `Closed(reason)`: every call in flight fails at once with
//! [`CallError::ConnectionLost`], and the next call connects afresh.
//!
//! Architecture invariant: a request is sent at most once. Connecting is retried
//! by the next call; a request whose connection died is reported, never re-sent,
//! so no command runs twice.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outpost_protocol::{
    AgentError, AgentMessage, ClientMessage, ExecRequest, ExecResult, GpuLease, GpuLeaseRequest,
    Hello, HostMetrics, OutputStream, Request, RequestId, Response, decode, encode_frame,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::config::SandboxConfig;
use crate::host::bootstrap::HostFacts;
use crate::host::link::LinkReader;
use crate::host::{self, AgentLink, Host, HostContext, LinkEvent};

/// Send a ping after this long without a sign of life from the host…
const HEARTBEAT_IDLE: Duration = Duration::from_millis(1000);
/// …and give the connection up after this long…
const HEARTBEAT_DEAD: Duration = Duration::from_millis(4000);
/// …or this long while bulk data of ours is queued or was sent this
/// recently: the agent answers a large request only once all of it has
/// crossed, so on a slow uplink its answers come seconds apart even from a
/// healthy host, and a ping waits behind the data. A frozen host still
/// stops our writes (SSH's window, or the pipe, fills), so it is noticed.
const HEARTBEAT_DEAD_SENDING: Duration = Duration::from_millis(15_000);
/// A frame at least this large is bulk data.
const BULK_FRAME: usize = 64 * 1024;
/// Request id of heartbeat pings; calls start at 1.
const HEARTBEAT_ID: RequestId = 0;

/// Why a call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// No connection could be made; nothing ran.
    #[error("{0}")]
    Connect(String),
    /// The connection died while the call was in flight; the command may or may
    /// not have run, and is not retried.
    #[error("connection lost: {0}")]
    ConnectionLost(String),
    /// The agent refused or failed the request.
    #[error("{}", .0.message)]
    Agent(AgentError),
    #[error("{0}")]
    Protocol(String),
}

impl CallError {
    /// Whether the failure is about reaching the host (as opposed to the request).
    pub fn is_connection(&self) -> bool {
        matches!(self, CallError::Connect(_) | CallError::ConnectionLost(_))
    }
}

pub struct Session {
    pub config: SandboxConfig,
    ctx: Arc<HostContext>,
    /// Serializes connecting, so concurrent first calls share one connection.
    current: tokio::sync::Mutex<Option<Arc<Connection>>>,
    last_error: Mutex<Option<String>>,
}

/// The observable state of a session.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionState {
    Disconnected,
    Connected,
    Closed(String),
}

impl Session {
    pub fn new(config: SandboxConfig, ctx: Arc<HostContext>) -> Session {
        Session {
            config,
            ctx,
            current: tokio::sync::Mutex::new(None),
            last_error: Mutex::new(None),
        }
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Current state without connecting.
    pub fn state(&self) -> SessionState {
        let last_error = self.last_error.lock().unwrap().clone();
        match self.current.try_lock() {
            Ok(guard) => match guard.as_ref() {
                Some(conn) => match conn.closed_reason() {
                    None => SessionState::Connected,
                    Some(reason) => SessionState::Closed(reason),
                },
                None => match last_error {
                    Some(e) => SessionState::Closed(e),
                    None => SessionState::Disconnected,
                },
            },
            // Someone is connecting right now.
            Err(_) => SessionState::Disconnected,
        }
    }

    /// The live connection, connecting first if there is none.
    pub async fn connection(&self) -> Result<Arc<Connection>, CallError> {
        let mut current = self.current.lock().await;
        if let Some(conn) = current.as_ref()
            && conn.closed_reason().is_none()
        {
            return Ok(conn.clone());
        }
        *current = None;
        match self.connect().await {
            Ok(conn) => {
                *self.last_error.lock().unwrap() = None;
                *current = Some(conn.clone());
                Ok(conn)
            }
            Err(e) => {
                *self.last_error.lock().unwrap() = Some(e.clone());
                Err(CallError::Connect(e))
            }
        }
    }

    async fn connect(&self) -> Result<Arc<Connection>, String> {
        let began = Instant::now();
        let (host, started) = host::start(&self.config.target, &self.ctx).await?;
        let conn = Connection::open(
            started.link,
            started.reader,
            started.hello,
            started.agent_path,
            started.uploaded,
            started.facts,
            host,
        );
        tracing::info!(
            sandbox = %self.config.name,
            ms = began.elapsed().as_millis() as u64,
            uploaded = conn.uploaded,
            "connected"
        );
        Ok(conn)
    }

    /// Sends one request; the returned [`Call`] yields its responses.
    pub async fn start(&self, request: Request) -> Result<Call, CallError> {
        let conn = self.connection().await?;
        conn.start(request)
    }

    /// Runs a command. `on_output` sees streamed chunks when `req.stream` is set.
    pub async fn exec(
        &self,
        req: ExecRequest,
        mut on_output: impl FnMut(OutputStream, &[u8]),
    ) -> Result<ExecResult, CallError> {
        // The agent enforces the timeout; this deadline only guards against an
        // agent that stops answering without the heartbeat noticing.
        let deadline = req
            .timeout_ms
            .map(|ms| Duration::from_millis(ms) + Duration::from_secs(15));
        let mut call = self.start(Request::Exec(req)).await?;
        let wait = async {
            loop {
                match call.next().await? {
                    Response::Output { stream, data } => on_output(stream, &data),
                    Response::ExecDone(result) => return Ok(result),
                    Response::Error(e) => return Err(CallError::Agent(e)),
                    other => {
                        return Err(CallError::Protocol(format!(
                            "unexpected answer to exec: {other:?}"
                        )));
                    }
                }
            }
        };
        match deadline {
            Some(d) => tokio::time::timeout(d, wait).await.map_err(|_| {
                CallError::ConnectionLost(format!(
                    "the agent did not finish the command within {} s",
                    d.as_secs()
                ))
            })?,
            None => wait.await,
        }
    }

    pub async fn metrics(&self) -> Result<HostMetrics, CallError> {
        let mut call = self.start(Request::Metrics).await?;
        match call.next().await? {
            Response::Metrics(m) => Ok(m),
            Response::Error(e) => Err(CallError::Agent(e)),
            other => Err(CallError::Protocol(format!(
                "unexpected answer to metrics: {other:?}"
            ))),
        }
    }

    /// Reserves GPUs on the host. The lease lives as long as the returned
    /// connection (the agent holding it) or until [`Session::release`].
    pub async fn lease(
        &self,
        request: GpuLeaseRequest,
    ) -> Result<(GpuLease, Arc<Connection>), CallError> {
        let conn = self.connection().await?;
        let mut call = conn.start(Request::GpuLease(request))?;
        match call.next().await? {
            Response::GpuLease(lease) => Ok((lease, conn)),
            Response::Error(e) => Err(CallError::Agent(e)),
            other => Err(CallError::Protocol(format!(
                "unexpected answer to a GPU lease: {other:?}"
            ))),
        }
    }

    pub async fn release(&self, lease_id: &str) -> Result<(), CallError> {
        let mut call = self
            .start(Request::GpuRelease {
                lease_id: lease_id.to_string(),
            })
            .await?;
        match call.next().await? {
            Response::Released => Ok(()),
            Response::Error(e) => Err(CallError::Agent(e)),
            other => Err(CallError::Protocol(format!(
                "unexpected answer to a GPU release: {other:?}"
            ))),
        }
    }

    /// The live connection if there is one, without connecting.
    pub fn current(&self) -> Option<Arc<Connection>> {
        let guard = self.current.try_lock().ok()?;
        guard
            .as_ref()
            .filter(|c| c.closed_reason().is_none())
            .cloned()
    }

    /// Drops the connection (the agent sees EOF and stops what it runs).
    pub async fn disconnect(&self) {
        if let Some(conn) = self.current.lock().await.take() {
            conn.close("disconnected by the controller".into());
        }
    }
}

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
    urgent: mpsc::UnboundedSender<Vec<u8>>,
    bulk: mpsc::UnboundedSender<Vec<u8>>,
    closed: Mutex<Option<String>>,
    liveness: Arc<Liveness>,
    tasks: Mutex<Vec<AbortHandle>>,
    keep: Mutex<Option<Box<dyn Send + Sync>>>,
    host: Arc<dyn Host>,
}

impl Connection {
    fn open(
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
        let (urgent_tx, mut urgent) = mpsc::unbounded_channel::<Vec<u8>>();
        let (bulk_tx, mut bulk) = mpsc::unbounded_channel::<Vec<u8>>();
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

    /// Sends `request`; the answer arrives through the returned [`Call`].
    pub fn start(self: &Arc<Self>, request: Request) -> Result<Call, CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = encode_frame(&ClientMessage::Request { id, body: request })
            .map_err(|e| CallError::Protocol(e.to_string()))?;
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
            self.send_frame(frame, Lane::Urgent);
        }
    }

    /// Queues a frame for the writer; false if the writer is gone.
    fn send_frame(&self, frame: Vec<u8>, lane: Lane) -> bool {
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

/// Which queue a frame waits in. The writer always takes urgent frames
/// first, so a command or a ping never waits behind megabytes of file data
/// queued by a sync; it waits at most for the frame being written. Order
/// holds within a lane only, which is all the protocol needs: requests are
/// independent (a sync sends a commit only once its parts are answered), and
/// a cancel travels in its request's lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Urgent,
    Bulk,
}

impl Lane {
    fn of(frame: &[u8]) -> Lane {
        if frame.len() >= BULK_FRAME {
            Lane::Bulk
        } else {
            Lane::Urgent
        }
    }
}

/// What the heartbeat goes by: when bytes last arrived from the host (in any
/// piece, not only whole frames, so a large answer on a slow link counts
/// while it arrives), and whether we are in the middle of sending bulk data.
struct Liveness {
    epoch: Instant,
    heard_ms: AtomicU64,
    /// When the link last accepted a bulk frame of ours.
    bulk_ms: AtomicU64,
    /// Bytes queued for the writer and not yet accepted by the link.
    unsent: AtomicU64,
}

impl Liveness {
    fn new() -> Liveness {
        Liveness {
            epoch: Instant::now(),
            heard_ms: AtomicU64::new(0),
            bulk_ms: AtomicU64::new(0),
            unsent: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn touch(&self) {
        self.heard_ms.fetch_max(self.now_ms(), Ordering::Relaxed);
    }

    fn silence(&self) -> Duration {
        let last = Duration::from_millis(self.heard_ms.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }

    /// Whether bulk data is queued, or was handed to the link within the
    /// longer heartbeat limit.
    fn sending(&self) -> bool {
        let since_bulk = self
            .now_ms()
            .saturating_sub(self.bulk_ms.load(Ordering::Relaxed));
        self.unsent.load(Ordering::Relaxed) >= BULK_FRAME as u64
            || (self.bulk_ms.load(Ordering::Relaxed) > 0
                && since_bulk < HEARTBEAT_DEAD_SENDING.as_millis() as u64)
    }
}

/// Hands one frame to the link and accounts for it. A bulk frame goes in
/// slices, each one the link accepts being a sign of life: past the first
/// window's worth, SSH takes more only as the host consumes data (and a pipe
/// only as the agent reads), so on a slow uplink the heartbeat hears the
/// host through our own progress while it cannot answer.
async fn write_frame(
    writer: &mut (impl tokio::io::AsyncWrite + Unpin),
    frame: &[u8],
    liveness: &Liveness,
) -> std::io::Result<()> {
    if frame.len() < BULK_FRAME {
        writer.write_all(frame).await?;
        liveness
            .unsent
            .fetch_sub(frame.len() as u64, Ordering::Relaxed);
        return Ok(());
    }
    for slice in frame.chunks(BULK_FRAME) {
        writer.write_all(slice).await?;
        liveness
            .unsent
            .fetch_sub(slice.len() as u64, Ordering::Relaxed);
        liveness.touch();
        // Never 0, which means "no bulk sent yet".
        liveness
            .bulk_ms
            .store(liveness.now_ms().max(1), Ordering::Relaxed);
    }
    Ok(())
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
                self.conn.send_frame(frame, self.lane);
            }
        }
    }
}
