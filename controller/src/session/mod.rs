//! One connection per host, shared by every call, with requests multiplexed.
//!
//! A [`Session`] is `Disconnected` until a call needs it, then holds a live
//! [`Connection`]: a reader task dispatching responses by request id, a writer task
//! owning the agent's stdin, and a heartbeat. Any of them failing moves the
//! connection to `Closed(reason)`: every call in flight fails at once with
//! [`CallError::ConnectionLost`], and the next call connects afresh.
//!
//! The session of an isolated sandbox `HOST/ID` ([`Session::isolated`]) has
//! no connection of its own: it is a view of HOST's session whose requests
//! go out inside `InSandbox` ([`ScopedConn`]), all but GPU leases.
//!
//! The session of a Slurm allocation `CLUSTER/job-N` ([`Session::allocation`])
//! has a connection of its own, to an agent on the allocated node started
//! as a job step through the login node's live connection
//! ([`crate::host::srun`]); when either drops, the next call reconnects
//! both as needed.
//!
//! Architecture invariant: a request is sent at most once. Connecting is retried
//! by the next call; a request whose connection died is reported, never re-sent,
//! so no command runs twice.

mod connection;
mod error;
mod heartbeat;
mod scoped;
mod writer;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outpost_protocol::{
    ExecProgress, ExecRequest, ExecResult, GpuLease, GpuLeaseRequest, HostMetrics, OutputStream,
    Request, Response,
};

use crate::config::HostConfig;
use crate::host::{self, HostContext};

pub use connection::{Call, Connection};
pub use error::CallError;
pub use scoped::ScopedConn;

pub struct Session {
    pub config: HostConfig,
    place: Place,
}

/// Where a session's requests go.
enum Place {
    /// A configured host: its own connection to its host's agent.
    Host(HostLink),
    /// An isolated sandbox made on a configured host: that one's connection,
    /// every request inside the sandbox `id`.
    Isolated { host: Arc<Session>, id: Arc<str> },
    /// A Slurm allocation made on a cluster's login node `login`: its own
    /// connection, through the login node's.
    Allocation {
        login: Arc<Session>,
        job: u64,
        id: Arc<str>,
        link: HostLink,
    },
}

/// A configured host's connection, made on demand.
struct HostLink {
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
    pub fn new(config: HostConfig, ctx: Arc<HostContext>) -> Session {
        Session {
            config,
            place: Place::Host(HostLink {
                ctx,
                current: tokio::sync::Mutex::new(None),
                last_error: Mutex::new(None),
            }),
        }
    }

    /// The isolated sandbox `id` on `host` (a configured host), named
    /// `HOST/ID`. Nothing is asked of the host: whether the sandbox exists
    /// is its agent's answer to the first request.
    ///
    /// # Panics
    ///
    /// If `host` is itself an isolated sandbox.
    pub fn isolated(host: Arc<Session>, id: &str) -> Session {
        assert!(
            host.isolated_in().is_none(),
            "a sandbox is made on a configured host"
        );
        Session {
            config: HostConfig {
                name: format!("{}/{id}", host.name()),
                target: host.config.target.clone(),
                slurm: None,
                allow_hosts: Vec::new(),
                sandbox_uids: None,
            },
            place: Place::Isolated {
                host,
                id: id.into(),
            },
        }
    }

    /// The Slurm allocation `job` on the cluster whose login node is
    /// `login` (a configured host), named `LOGIN/job-N`. Nothing is asked
    /// of the cluster until the first request.
    ///
    /// # Panics
    ///
    /// If `login` is not a configured host.
    pub fn allocation(login: Arc<Session>, job: u64) -> Session {
        assert!(
            login.isolated_in().is_none(),
            "an allocation is made on a configured login node"
        );
        let ctx = Arc::clone(&login.link().ctx);
        let id: Arc<str> = format!("job-{job}").into();
        Session {
            config: HostConfig {
                name: format!("{}/{id}", login.name()),
                target: login.config.target.clone(),
                slurm: None,
                allow_hosts: Vec::new(),
                sandbox_uids: None,
            },
            place: Place::Allocation {
                login,
                job,
                id,
                link: HostLink {
                    ctx,
                    current: tokio::sync::Mutex::new(None),
                    last_error: Mutex::new(None),
                },
            },
        }
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// For a sandbox made on a configured host (isolated, or a Slurm
    /// allocation), that one's session and the sandbox's id.
    pub fn isolated_in(&self) -> Option<(&Arc<Session>, &str)> {
        match &self.place {
            Place::Host(_) => None,
            Place::Isolated { host, id } => Some((host, id)),
            Place::Allocation { login, id, .. } => Some((login, id)),
        }
    }

    /// For a Slurm allocation, its job id.
    pub fn allocation_job(&self) -> Option<u64> {
        match &self.place {
            Place::Allocation { job, .. } => Some(*job),
            _ => None,
        }
    }

    /// The connection state this session uses: its own, or its host's.
    fn link(&self) -> &HostLink {
        match &self.place {
            Place::Host(link) | Place::Allocation { link, .. } => link,
            Place::Isolated { host, .. } => match &host.place {
                Place::Host(link) => link,
                _ => unreachable!("a sandbox is made on a host"),
            },
        }
    }

    /// The configured host that owns the connection.
    fn host_config(&self) -> &HostConfig {
        match &self.place {
            Place::Host(_) | Place::Allocation { .. } => &self.config,
            Place::Isolated { host, .. } => &host.config,
        }
    }

    /// Current state without connecting (an isolated sandbox's is its
    /// host's connection's).
    pub fn state(&self) -> SessionState {
        let link = self.link();
        let last_error = link.last_error.lock().unwrap().clone();
        match link.current.try_lock() {
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

    /// The live connection, connecting first if there is none, as this
    /// sandbox sees it: an isolated sandbox's requests go inside it.
    pub async fn connection(&self) -> Result<ScopedConn, CallError> {
        let conn = self.bare_connection().await?;
        let sandbox = match &self.place {
            Place::Host(_) | Place::Allocation { .. } => None,
            Place::Isolated { id, .. } => Some(Arc::clone(id)),
        };
        Ok(ScopedConn::new(conn, sandbox))
    }

    /// The host's live connection, connecting first if there is none;
    /// requests sent on it run on the host, outside any sandbox.
    /// Boxed: an allocation's connecting connects its login node's.
    fn bare_connection(
        &self,
    ) -> futures::future::BoxFuture<'_, Result<Arc<Connection>, CallError>> {
        Box::pin(async move {
            let link = self.link();
            let mut current = link.current.lock().await;
            if let Some(conn) = current.as_ref()
                && conn.closed_reason().is_none()
            {
                return Ok(conn.clone());
            }
            *current = None;
            match self.connect(&link.ctx).await {
                Ok(conn) => {
                    *link.last_error.lock().unwrap() = None;
                    *current = Some(conn.clone());
                    Ok(conn)
                }
                Err(e) => {
                    *link.last_error.lock().unwrap() = Some(e.clone());
                    Err(CallError::Connect(e))
                }
            }
        })
    }

    async fn connect(&self, ctx: &HostContext) -> Result<Arc<Connection>, String> {
        let config = self.host_config();
        let began = Instant::now();
        let (host, started) = match &self.place {
            Place::Allocation { login, job, .. } => {
                let through = login
                    .bare_connection()
                    .await
                    .map_err(|e| format!("cannot reach the login node {}: {e}", login.name()))?;
                host::start_in_allocation(through.host(), &login.config.target, *job, ctx).await?
            }
            _ => host::start(&config.target, ctx).await?,
        };
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
            sandbox = %config.name,
            ms = began.elapsed().as_millis() as u64,
            uploaded = conn.uploaded,
            "connected"
        );
        Ok(conn)
    }

    /// Sends one request (inside the sandbox, for an isolated one); the
    /// returned [`Call`] yields its responses.
    pub async fn start(&self, request: Request) -> Result<Call, CallError> {
        self.connection().await?.start(request)
    }

    /// Runs a command. `on_output` sees streamed chunks when `req.stream` is set.
    pub async fn exec(
        &self,
        req: ExecRequest,
        on_output: impl FnMut(OutputStream, &[u8]),
    ) -> Result<ExecResult, CallError> {
        self.exec_watched(req, on_output, |_| {}).await
    }

    /// [`Session::exec`], and `on_progress` sees the agent's progress reports
    /// when `req.progress_ms` is set.
    pub async fn exec_watched(
        &self,
        req: ExecRequest,
        on_output: impl FnMut(OutputStream, &[u8]),
        on_progress: impl FnMut(ExecProgress),
    ) -> Result<ExecResult, CallError> {
        let timeout_ms = req.timeout_ms;
        self.exec_like(Request::Exec(req), timeout_ms, on_output, on_progress)
            .await
    }

    /// Sends `request`, which the agent answers as it does an exec (output,
    /// progress, then `ExecDone`), and returns its result. `timeout_ms` is
    /// the request's own limit.
    pub async fn exec_like(
        &self,
        request: Request,
        timeout_ms: Option<u64>,
        on_output: impl FnMut(OutputStream, &[u8]),
        on_progress: impl FnMut(ExecProgress),
    ) -> Result<ExecResult, CallError> {
        match self
            .exec_end(request, timeout_ms, on_output, on_progress)
            .await?
        {
            ExecEnd::Done(result) => Ok(result),
            other => Err(CallError::Protocol(format!(
                "unexpected answer to exec: {other:?}"
            ))),
        }
    }

    /// [`Session::exec_like`], for an exec that may be handed over as a job
    /// (`hand_over`): how it ended. `limit_ms`: when the agent answers at
    /// the latest (its timeout or its hand-over time).
    pub async fn exec_end(
        &self,
        request: Request,
        limit_ms: Option<u64>,
        mut on_output: impl FnMut(OutputStream, &[u8]),
        mut on_progress: impl FnMut(ExecProgress),
    ) -> Result<ExecEnd, CallError> {
        // The agent enforces the limit; this deadline only guards against an
        // agent that stops answering without the heartbeat noticing.
        let deadline = limit_ms.map(|ms| Duration::from_millis(ms) + Duration::from_secs(15));
        let mut call = self.start(request).await?;
        let wait = async {
            loop {
                match call.next().await? {
                    Response::Output { stream, data } => on_output(stream, &data),
                    Response::ExecProgress(p) => on_progress(p),
                    Response::ExecDone(result) => return Ok(ExecEnd::Done(result)),
                    Response::ExecHandedOver { job, so_far } => {
                        return Ok(ExecEnd::HandedOver { job, so_far });
                    }
                    Response::ExecCutShort { result, why } => {
                        return Ok(ExecEnd::CutShort { result, why });
                    }
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

    /// Whether the agent answers (inside the sandbox, for an isolated one:
    /// so also whether that sandbox still exists).
    pub async fn ping(&self) -> Result<(), CallError> {
        let mut call = self.start(Request::Ping).await?;
        match call.next().await? {
            Response::Pong => Ok(()),
            Response::Error(e) => Err(CallError::Agent(e)),
            other => Err(CallError::Protocol(format!(
                "unexpected answer to a ping: {other:?}"
            ))),
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

    /// Reserves GPUs on the host (an isolated sandbox's host: the agent
    /// takes no lease inside one). The lease lives as long as the returned
    /// connection (the agent holding it) or until [`Session::release`].
    pub async fn lease(
        &self,
        request: GpuLeaseRequest,
    ) -> Result<(GpuLease, Arc<Connection>), CallError> {
        let conn = self.bare_connection().await?;
        let mut call = conn.start(Request::GpuLease(request))?;
        match call.next().await? {
            Response::GpuLease(lease) => Ok((lease, conn)),
            Response::Error(e) => Err(CallError::Agent(e)),
            other => Err(CallError::Protocol(format!(
                "unexpected answer to a GPU lease: {other:?}"
            ))),
        }
    }

    /// Ends a lease [`Session::lease`] took, on the host.
    pub async fn release(&self, lease_id: &str) -> Result<(), CallError> {
        let mut call = self.bare_connection().await?.start(Request::GpuRelease {
            lease_id: lease_id.to_string(),
        })?;
        match call.next().await? {
            Response::Released => Ok(()),
            Response::Error(e) => Err(CallError::Agent(e)),
            other => Err(CallError::Protocol(format!(
                "unexpected answer to a GPU release: {other:?}"
            ))),
        }
    }

    /// A stream to the unix socket `path` on this session's host, over its
    /// live connection (connecting first if there is none).
    pub async fn open_socket(&self, path: &str) -> Result<crate::host::SocketStream, CallError> {
        let conn = self.bare_connection().await?;
        conn.host()
            .open_socket(path)
            .await
            .map_err(CallError::Protocol)
    }

    /// The host's live connection if there is one, without connecting.
    pub fn current(&self) -> Option<Arc<Connection>> {
        let guard = self.link().current.try_lock().ok()?;
        guard
            .as_ref()
            .filter(|c| c.closed_reason().is_none())
            .cloned()
    }

    /// Drops the connection (the agent sees EOF and stops what it runs).
    /// An isolated sandbox's is its host's, which it leaves alone.
    pub async fn disconnect(&self) {
        let (Place::Host(link) | Place::Allocation { link, .. }) = &self.place else {
            return;
        };
        if let Some(conn) = link.current.lock().await.take() {
            conn.close("disconnected by the controller".into());
        }
    }
}

/// How an exec that may be handed over as a job ended.
#[derive(Debug)]
pub enum ExecEnd {
    Done(ExecResult),
    /// Still running at its hand-over time: now the background job `job`.
    HandedOver {
        job: String,
        so_far: ExecResult,
    },
    /// It could not become a job, so it was stopped then (why).
    CutShort {
        result: ExecResult,
        why: String,
    },
}
