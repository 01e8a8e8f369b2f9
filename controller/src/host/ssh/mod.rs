//! SSH hosts through russh: one TCP connection per host, checked against
//! the known_hosts files ([`hostkeys`]), authenticated ([`auth`]), with
//! keepalives and a connect timeout; the agent runs on an exec channel and is
//! installed over SFTP ([`sftp`]).

mod auth;
mod hostkeys;
mod sftp;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use russh::client::{self, Handle};
use russh::{ChannelMsg, Disconnect};
use tokio::sync::mpsc;

use super::{
    AgentLink, CapturedRun, HOST_KEY_CONFIRMATION, Host, HostKeyDecision, LinkEvent, SocketStream,
    UnknownHostKey,
};
use crate::config::SshTarget;
use hostkeys::{Client, HostKeyVerdict, known_host_pattern};

/// Why a connection could not be made. Each message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot resolve host {host:?}: {reason}")]
    Resolve { host: String, reason: String },
    #[error("connection to {addr} refused: is sshd running and listening on port {port}?")]
    Refused { addr: String, port: u16 },
    #[error(
        "connecting to {addr} timed out after {secs:.0} s (host down, firewalled, or wrong port)"
    )]
    Timeout { addr: String, secs: f64 },
    #[error("cannot connect to {addr}: {reason}")]
    Io { addr: String, reason: String },
    #[error(
        "HOST KEY CHANGED for {host}: the server offers {offered} but {recorded}. This may be an attack. If the change is expected, remove the old entry: ssh-keygen -R '{host}' -f {file}"
    )]
    HostKeyChanged {
        host: String,
        offered: String,
        recorded: String,
        file: String,
    },
    #[error(
        "host key {offered} of {host} is not known and strict_host_keys is set; add it first, e.g. ssh-keyscan -p {port} {hostname} >> ~/.ssh/known_hosts"
    )]
    HostKeyUnknown {
        host: String,
        hostname: String,
        port: u16,
        offered: String,
    },
    #[error(
        "host key {offered} of {host} was not trusted ({why}); nothing was recorded. Check the fingerprint on the host (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub) and try again"
    )]
    HostKeyRejected {
        host: String,
        offered: String,
        why: &'static str,
    },
    #[error("authentication failed for {user}@{addr} (tried: {tried})")]
    Auth {
        user: String,
        addr: String,
        tried: String,
    },
    #[error("SSH error with {addr}: {reason}")]
    Ssh { addr: String, reason: String },
    #[error("through jump host {hop}: {reason}")]
    Jump { hop: String, reason: String },
    /// An unknown key waits for a person's decision (never leaves
    /// [`SshConnection::connect`]).
    /// The key, what the person is shown, and the hostname it was dialled as.
    #[error("host key {} of {} is not confirmed yet", .0.1.fingerprint, .0.1.host)]
    Unconfirmed(Box<(russh::keys::ssh_key::PublicKey, UnknownHostKey, String)>),
}

/// AES-GCM first: it runs on the CPU's AES instructions, several times faster
/// than ChaCha20-Poly1305 (russh's first choice) for bulk transfers.
const CIPHERS: &[russh::cipher::Name] = &[
    russh::cipher::AES_256_GCM,
    russh::cipher::CHACHA20_POLY1305,
    russh::cipher::AES_256_CTR,
    russh::cipher::AES_128_CTR,
];

/// SSH keepalive: a blackholed or frozen peer must be noticed in seconds, not
/// never. Any packet from the host counts (window adjusts come every ~96 KiB
/// it consumes), so a slow but live link is not mistaken for a dead one.
const KEEPALIVE: Duration = Duration::from_secs(1);
const KEEPALIVE_MAX: usize = 3;

/// Why a channel closed without an exit status: the connection's end, when
/// it ended (the handler hears of it just after the channels close).
async fn connection_end(ended: &Mutex<Option<String>>) -> String {
    for _ in 0..10 {
        if let Some(why) = ended.lock().unwrap().clone() {
            return why;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    "SSH channel closed".to_string()
}

/// An authenticated SSH connection. Cheap to clone; the connection closes when the
/// last clone is dropped.
#[derive(Clone)]
pub struct SshConnection {
    handle: Arc<Handle<Client>>,
    pub addr: String,
    ended: Arc<Mutex<Option<String>>>,
    /// The jump hosts' connections, which carry this one: kept as long as
    /// it is.
    via: Arc<Vec<Arc<Handle<Client>>>>,
}

pub struct HostKeyFiles<'a> {
    pub user: Option<&'a Path>,
    pub own: &'a Path,
}

impl SshConnection {
    /// Connects, checks the host key and authenticates, all within `timeout`.
    /// An unknown host key (a jump host's or the sandbox's) goes to the
    /// person [`HOST_KEY_CONFIRMATION`] asks when the caller has one (their
    /// time to answer is not counted); once trusted, the connection is made
    /// again, which may meet the next hop's unknown key.
    pub async fn connect(
        target: &SshTarget,
        keys: HostKeyFiles<'_>,
        timeout: Duration,
    ) -> Result<SshConnection, ConnectError> {
        let addr = format!("{}:{}", target.hostname, target.port);
        let confirmation = HOST_KEY_CONFIRMATION.try_with(Arc::clone).ok();
        let ask = confirmation.is_some();
        let attempt = || async {
            let inner = Self::connect_inner(target, &keys, &addr, ask);
            match tokio::time::timeout(timeout, inner).await {
                Ok(result) => result,
                Err(_) => Err(ConnectError::Timeout {
                    addr: addr.clone(),
                    secs: timeout.as_secs_f64(),
                }),
            }
        };
        let Some(confirm) = confirmation else {
            return attempt().await;
        };
        // Hosts whose key the person trusted in this call.
        let mut confirmed: Vec<String> = Vec::new();
        loop {
            let (key, unknown, hostname) = match attempt().await {
                Err(ConnectError::Unconfirmed(pending)) => *pending,
                other => return other,
            };
            let rejected = |why| ConnectError::HostKeyRejected {
                host: unknown.host.clone(),
                offered: unknown.fingerprint.clone(),
                why,
            };
            // A host offering yet another key: not the one the person saw.
            if confirmed.contains(&unknown.host) {
                return Err(rejected(
                    "the host offered a different key after this one was confirmed",
                ));
            }
            match confirm.confirm(unknown.clone()).await {
                HostKeyDecision::Reject => {
                    hostkeys::reject(unknown.clone());
                    return Err(rejected("the user rejected it"));
                }
                HostKeyDecision::TrustOnce => hostkeys::trust_once(unknown.clone()),
                HostKeyDecision::TrustAndSave => {
                    hostkeys::record(&hostname, unknown.port, &key, keys.own).map_err(
                        |reason| ConnectError::Io {
                            addr: addr.clone(),
                            reason,
                        },
                    )?;
                }
            }
            confirmed.push(unknown.host);
        }
    }

    async fn connect_inner(
        target: &SshTarget,
        keys: &HostKeyFiles<'_>,
        addr: &str,
        ask: bool,
    ) -> Result<SshConnection, ConnectError> {
        // Through the jump hosts first, each connection opened over the one
        // before it (OpenSSH's ProxyJump). Their keys are checked against
        // their own names, and an unknown one is put to the person like the
        // sandbox's own.
        let mut via: Vec<Arc<Handle<Client>>> = Vec::new();
        for hop in &target.jump {
            let hop_addr = format!("{}:{}", hop.hostname, hop.port);
            let connected = match via.last() {
                None => match dial(hop, &hop_addr).await {
                    Ok(socket) => Self::handshake(hop, keys, &hop_addr, ask, socket).await,
                    Err(e) => Err(e),
                },
                Some(prev) => match tunnel(prev, hop, &hop_addr).await {
                    Ok(stream) => Self::handshake(hop, keys, &hop_addr, ask, stream).await,
                    Err(e) => Err(e),
                },
            };
            let (handle, _) = connected.map_err(|e| match e {
                // `connect` asks the person, then comes back through here.
                ConnectError::Unconfirmed(_) => e,
                e => ConnectError::Jump {
                    hop: hop_addr.clone(),
                    reason: e.to_string(),
                },
            })?;
            via.push(Arc::new(handle));
        }
        let (handle, ended) = match via.last() {
            None => Self::handshake(target, keys, addr, ask, dial(target, addr).await?).await?,
            Some(prev) => {
                let stream = tunnel(prev, target, addr).await?;
                Self::handshake(target, keys, addr, ask, stream).await?
            }
        };
        Ok(SshConnection {
            handle: Arc::new(handle),
            addr: addr.to_string(),
            ended,
            via: Arc::new(via),
        })
    }

    /// The SSH handshake over `stream`: host key check, authentication.
    async fn handshake<S>(
        target: &SshTarget,
        keys: &HostKeyFiles<'_>,
        addr: &str,
        ask: bool,
        stream: S,
    ) -> Result<(Handle<Client>, Arc<Mutex<Option<String>>>), ConnectError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let config = Arc::new(client::Config {
            keepalive_interval: Some(KEEPALIVE),
            keepalive_max: KEEPALIVE_MAX,
            nodelay: true,
            preferred: russh::Preferred {
                cipher: std::borrow::Cow::Borrowed(CIPHERS),
                ..Default::default()
            },
            ..Default::default()
        });
        let verdict = Arc::new(Mutex::new(None));
        let ended = Arc::new(Mutex::new(None));
        let handler = Client {
            hostname: target.hostname.clone(),
            port: target.port,
            known_hosts: target
                .user_known_hosts
                .clone()
                .unwrap_or_else(|| keys.user.map(Path::to_path_buf).into_iter().collect()),
            own_known_hosts: keys.own.to_path_buf(),
            strict: target.strict_host_keys,
            ask,
            verdict: verdict.clone(),
            ended: ended.clone(),
        };
        let mut handle = match client::connect_stream(config, stream, handler).await {
            Ok(h) => h,
            Err(e) => {
                let host = known_host_pattern(&target.hostname, target.port);
                return Err(match verdict.lock().unwrap().take() {
                    Some(HostKeyVerdict::Changed {
                        offered,
                        recorded,
                        file,
                    }) => ConnectError::HostKeyChanged {
                        host,
                        offered,
                        recorded,
                        file,
                    },
                    Some(HostKeyVerdict::Rejected { unknown, why }) => {
                        ConnectError::HostKeyRejected {
                            host,
                            offered: unknown.fingerprint,
                            why,
                        }
                    }
                    Some(HostKeyVerdict::ToConfirm { key, unknown }) => ConnectError::Unconfirmed(
                        Box::new((*key, unknown, target.hostname.clone())),
                    ),
                    Some(HostKeyVerdict::UnknownStrict { offered }) => {
                        ConnectError::HostKeyUnknown {
                            host,
                            hostname: target.hostname.clone(),
                            port: target.port,
                            offered,
                        }
                    }
                    None => ConnectError::Ssh {
                        addr: addr.to_string(),
                        reason: e.to_string(),
                    },
                });
            }
        };
        auth::authenticate(&mut handle, target, addr).await?;
        Ok((handle, ended))
    }

    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// Runs `command` and collects its exit status, stdout and stderr.
    /// Dropped before the end (a timeout), it closes its channel: the
    /// command gets EOF and the session is freed, not left open on a
    /// connection that other channels share.
    pub async fn exec_capture(&self, command: &str) -> Result<CapturedRun, russh::Error> {
        let channel = self.handle.channel_open_session().await?;
        channel.exec(true, command).await?;
        let (mut read, write) = channel.split();
        let _guard = ChannelGuard {
            write: Some(write),
            _conn: self.clone(),
        };
        let mut run = CapturedRun::default();
        while let Some(msg) = read.wait().await {
            match msg {
                ChannelMsg::Data { data } => run.stdout.extend_from_slice(&data),
                ChannelMsg::ExtendedData { data, .. } => run.stderr.extend_from_slice(&data),
                ChannelMsg::ExitStatus { exit_status } => run.exit_status = Some(exit_status),
                ChannelMsg::Close => break,
                _ => {}
            }
        }
        Ok(run)
    }

    /// Starts `command` (an agent in serve mode) and returns a link to it.
    pub async fn open_agent(&self, command: &str) -> Result<AgentLink, russh::Error> {
        let channel = self.handle.channel_open_session().await?;
        channel.exec(true, command).await?;
        let (mut read, write) = channel.split();
        let writer = Box::pin(write.make_writer());
        let (tx, rx) = mpsc::channel(256);
        let ended = Arc::clone(&self.ended);
        tokio::spawn(async move {
            let mut exit = None;
            let reason = loop {
                match read.wait().await {
                    Some(ChannelMsg::Data { data }) => {
                        if tx.send(LinkEvent::Stdout(data.to_vec())).await.is_err() {
                            return;
                        }
                    }
                    Some(ChannelMsg::ExtendedData { data, .. }) => {
                        let _ = tx.send(LinkEvent::Stderr(data.to_vec())).await;
                    }
                    Some(ChannelMsg::ExitStatus { exit_status }) => {
                        exit = Some(format!("agent exited with status {exit_status}"));
                    }
                    Some(ChannelMsg::ExitSignal { signal_name, .. }) => {
                        exit = Some(format!("agent killed by signal {signal_name:?}"));
                    }
                    Some(ChannelMsg::Close) | None => {
                        break match exit {
                            Some(exit) => exit,
                            None => connection_end(&ended).await,
                        };
                    }
                    Some(_) => {}
                }
            };
            let _ = tx.send(LinkEvent::Closed(reason)).await;
        });
        Ok(AgentLink {
            events: rx,
            writer,
            _keep: Box::new(ChannelGuard {
                write: Some(write),
                _conn: self.clone(),
            }),
        })
    }

    /// Opens an SFTP session on a fresh channel.
    pub async fn sftp(&self) -> Result<russh_sftp::client::SftpSession, String> {
        let channel = self
            .handle
            .channel_open_session()
            .await
            .map_err(|e| e.to_string())?;
        channel
            .request_subsystem(true, "sftp")
            .await
            .map_err(|e| e.to_string())?;
        russh_sftp::client::SftpSession::new(channel.into_stream())
            .await
            .map_err(|e| format!("SFTP unavailable: {e}"))
    }

    pub async fn disconnect(&self) {
        let _ = self
            .handle
            .disconnect(Disconnect::ByApplication, "", "en")
            .await;
        for hop in self.via.iter().rev() {
            let _ = hop.disconnect(Disconnect::ByApplication, "", "en").await;
        }
    }
}

/// A TCP connection to `target`, with errors that say what to check.
async fn dial(target: &SshTarget, addr: &str) -> Result<tokio::net::TcpStream, ConnectError> {
    let sockaddrs: Vec<_> = tokio::net::lookup_host((target.hostname.as_str(), target.port))
        .await
        .map_err(|e| ConnectError::Resolve {
            host: target.hostname.clone(),
            reason: e.to_string(),
        })?
        .collect();
    if sockaddrs.is_empty() {
        return Err(ConnectError::Resolve {
            host: target.hostname.clone(),
            reason: "no addresses".into(),
        });
    }
    let socket = tokio::net::TcpStream::connect(&sockaddrs[..])
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::ConnectionRefused => ConnectError::Refused {
                addr: addr.to_string(),
                port: target.port,
            },
            _ => ConnectError::Io {
                addr: addr.to_string(),
                reason: e.to_string(),
            },
        })?;
    let _ = socket.set_nodelay(true);
    Ok(socket)
}

/// A connection to `target` opened by the jump host `via` (a direct-tcpip
/// channel), for the next SSH handshake to run over.
async fn tunnel(
    via: &Handle<Client>,
    target: &SshTarget,
    addr: &str,
) -> Result<russh::ChannelStream<client::Msg>, ConnectError> {
    let channel = via
        .channel_open_direct_tcpip(
            target.hostname.clone(),
            u32::from(target.port),
            "127.0.0.1",
            0,
        )
        .await
        .map_err(|e| ConnectError::Io {
            addr: addr.to_string(),
            reason: format!("the jump host could not open a connection to it: {e}"),
        })?;
    Ok(channel.into_stream())
}

/// Closes the agent's channel when its link goes, so the agent sees EOF and stops
/// what it runs even while other channels keep the connection open.
struct ChannelGuard {
    write: Option<russh::ChannelWriteHalf<client::Msg>>,
    _conn: SshConnection,
}

impl Drop for ChannelGuard {
    fn drop(&mut self) {
        if let (Some(write), Ok(rt)) = (self.write.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(async move {
                let _ = write.eof().await;
                let _ = write.close().await;
            });
        }
    }
}

impl Host for SshConnection {
    fn run<'a>(&'a self, command: &'a str) -> BoxFuture<'a, Result<CapturedRun, String>> {
        Box::pin(async move { self.exec_capture(command).await.map_err(|e| e.to_string()) })
    }

    fn copy_in<'a>(
        &'a self,
        from: &'a Path,
        dirs: &'a [String],
        to: &'a str,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let sftp = self.sftp().await?;
            let result = sftp::upload(&sftp, from, dirs, to).await;
            let _ = sftp.close().await;
            result
        })
    }

    fn open<'a>(&'a self, command: &'a str) -> BoxFuture<'a, Result<AgentLink, String>> {
        Box::pin(async move {
            self.open_agent(command)
                .await
                .map_err(|e| format!("cannot open a channel: {e}"))
        })
    }

    fn disconnect(&self) -> BoxFuture<'_, ()> {
        Box::pin(SshConnection::disconnect(self))
    }

    /// OpenSSH's `direct-streamlocal@openssh.com`: sshd connects to the
    /// socket as the login user.
    fn open_socket<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<SocketStream, String>> {
        Box::pin(async move {
            let channel = self
                .handle
                .channel_open_direct_streamlocal(path)
                .await
                .map_err(|e| format!("the host refused a connection to {path}: {e}"))?;
            Ok(Box::new(channel.into_stream()) as SocketStream)
        })
    }
}
