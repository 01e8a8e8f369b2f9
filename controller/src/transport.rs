//! Byte pipes to an agent: an SSH exec channel (russh) or a local child process.
//!
//! Both produce an [`AgentLink`]: a writer for the agent's stdin and a channel of
//! [`LinkEvent`]s (stdout bytes, stderr bytes, close). The session layer above
//! knows nothing about SSH.
//!
//! SSH specifics live here too: host-key checking against the user's
//! `~/.ssh/known_hosts` and Outpost's own known_hosts (accept-new unless strict;
//! a changed key is always refused), authentication (key file, ssh-agent,
//! `~/.ssh/config` identities, default keys, password), keepalives and timeouts.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::client::{self, Handle};
use russh::keys::ssh_key::{self, HashAlg};
use russh::keys::{PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use russh::{ChannelMsg, Disconnect};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::mpsc;

use crate::config::SshTarget;

/// What arrives from an agent.
#[derive(Debug)]
pub enum LinkEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// The pipe is gone; the text says why (exit status, channel closed).
    Closed(String),
}

/// A live byte pipe to one agent process.
pub struct AgentLink {
    pub events: mpsc::Receiver<LinkEvent>,
    pub writer: Pin<Box<dyn AsyncWrite + Send>>,
    /// Keeps the underlying process or channel alive as long as the link.
    pub _keep: Box<dyn Send + Sync>,
}

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
    #[error("authentication failed for {user}@{addr} (tried: {tried})")]
    Auth {
        user: String,
        addr: String,
        tried: String,
    },
    #[error("SSH error with {addr}: {reason}")]
    Ssh { addr: String, reason: String },
}

/// AES-GCM first: it runs on the CPU's AES instructions, several times faster
/// than ChaCha20-Poly1305 (russh's first choice) for bulk transfers.
const CIPHERS: &[russh::cipher::Name] = &[
    russh::cipher::AES_256_GCM,
    russh::cipher::CHACHA20_POLY1305,
    russh::cipher::AES_256_CTR,
    russh::cipher::AES_128_CTR,
];

/// Outcome of the host-key check, kept so a refused connection can explain itself.
#[derive(Debug, Clone)]
enum HostKeyVerdict {
    Changed {
        offered: String,
        recorded: String,
        file: String,
    },
    UnknownStrict {
        offered: String,
    },
}

struct Client {
    hostname: String,
    port: u16,
    known_hosts: Vec<PathBuf>,
    own_known_hosts: PathBuf,
    strict: bool,
    verdict: Arc<Mutex<Option<HostKeyVerdict>>>,
    /// Why the connection ended, once it has: what a closed channel reports.
    ended: Arc<Mutex<Option<String>>>,
}

fn known_host_pattern(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

impl client::Handler for Client {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        server_key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let key = match server_key {
            PublicKeyOrCertificate::PublicKey { key, .. } => key.clone(),
            PublicKeyOrCertificate::Certificate(cert) => {
                ssh_key::PublicKey::from(cert.public_key().clone())
            }
        };
        let offered = key.fingerprint(HashAlg::Sha256).to_string();
        let mut files: Vec<&PathBuf> = self.known_hosts.iter().collect();
        files.push(&self.own_known_hosts);
        for file in files {
            if !file.exists() {
                continue;
            }
            match russh::keys::check_known_hosts_path(&self.hostname, self.port, &key, file) {
                Ok(true) => return Ok(true),
                Ok(false) => {}
                Err(russh::keys::Error::KeyChanged { line }) => {
                    let recorded = russh::keys::known_hosts::known_host_keys_path(
                        &self.hostname,
                        self.port,
                        file,
                    )
                    .ok()
                    .and_then(|keys| keys.into_iter().find(|(l, _)| *l == line))
                    .map(|(_, k)| {
                        format!(
                            "{}:{} records {}",
                            file.display(),
                            line,
                            k.fingerprint(HashAlg::Sha256)
                        )
                    })
                    .unwrap_or_else(|| format!("{}:{line} records another key", file.display()));
                    *self.verdict.lock().unwrap() = Some(HostKeyVerdict::Changed {
                        offered,
                        recorded,
                        file: file.display().to_string(),
                    });
                    return Ok(false);
                }
                Err(e) => {
                    tracing::warn!("cannot read {}: {e}", file.display());
                }
            }
        }
        if self.strict {
            *self.verdict.lock().unwrap() = Some(HostKeyVerdict::UnknownStrict { offered });
            return Ok(false);
        }
        // accept-new: record in Outpost's own file, never in the user's.
        if let Err(e) = russh::keys::known_hosts::learn_known_hosts_path(
            &self.hostname,
            self.port,
            &key,
            &self.own_known_hosts,
        ) {
            tracing::warn!(
                "cannot record host key in {}: {e}",
                self.own_known_hosts.display()
            );
        } else {
            tracing::info!(
                "recorded new host key {offered} for {} in {}",
                known_host_pattern(&self.hostname, self.port),
                self.own_known_hosts.display()
            );
        }
        Ok(true)
    }

    async fn disconnected(
        &mut self,
        reason: client::DisconnectReason<Self::Error>,
    ) -> Result<(), Self::Error> {
        let why = match &reason {
            client::DisconnectReason::ReceivedDisconnect(info) => {
                format!("the host closed the connection ({})", info.message)
            }
            client::DisconnectReason::Error(russh::Error::KeepaliveTimeout) => format!(
                "no answer from the host for {} s (host frozen or network down)",
                KEEPALIVE.as_secs() * (KEEPALIVE_MAX as u64 + 1)
            ),
            client::DisconnectReason::Error(e) => format!("SSH connection failed: {e}"),
        };
        *self.ended.lock().unwrap() = Some(why);
        match reason {
            client::DisconnectReason::ReceivedDisconnect(_) => Ok(()),
            client::DisconnectReason::Error(e) => Err(e),
        }
    }
}

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
}

pub struct HostKeyFiles<'a> {
    pub user: Option<&'a Path>,
    pub own: &'a Path,
}

impl SshConnection {
    /// Connects, checks the host key and authenticates, all within `timeout`.
    pub async fn connect(
        target: &SshTarget,
        keys: HostKeyFiles<'_>,
        timeout: Duration,
    ) -> Result<SshConnection, ConnectError> {
        let addr = format!("{}:{}", target.hostname, target.port);
        match tokio::time::timeout(timeout, Self::connect_inner(target, keys, &addr)).await {
            Ok(result) => result,
            Err(_) => Err(ConnectError::Timeout {
                addr,
                secs: timeout.as_secs_f64(),
            }),
        }
    }

    async fn connect_inner(
        target: &SshTarget,
        keys: HostKeyFiles<'_>,
        addr: &str,
    ) -> Result<SshConnection, ConnectError> {
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
            known_hosts: keys.user.map(Path::to_path_buf).into_iter().collect(),
            own_known_hosts: keys.own.to_path_buf(),
            strict: target.strict_host_keys,
            verdict: verdict.clone(),
            ended: ended.clone(),
        };
        let mut handle = match client::connect_stream(config, socket, handler).await {
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
        authenticate(&mut handle, target, addr).await?;
        Ok(SshConnection {
            handle: Arc::new(handle),
            addr: addr.to_string(),
            ended,
        })
    }

    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// Runs `command` and collects its exit status, stdout and stderr.
    pub async fn exec_capture(&self, command: &str) -> Result<CapturedRun, russh::Error> {
        let mut channel = self.handle.channel_open_session().await?;
        channel.exec(true, command).await?;
        let mut run = CapturedRun::default();
        while let Some(msg) = channel.wait().await {
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
    }
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

#[derive(Debug, Default)]
pub struct CapturedRun {
    pub exit_status: Option<u32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Tries, in order: the configured key file, ssh-agent, `~/.ssh/config`
/// identities and the default keys (when no key file is configured), then the
/// password. Stops at the first success.
async fn authenticate(
    handle: &mut Handle<Client>,
    target: &SshTarget,
    addr: &str,
) -> Result<(), ConnectError> {
    let ssh_err = |e: russh::Error| ConnectError::Ssh {
        addr: addr.to_string(),
        reason: e.to_string(),
    };
    let mut tried: Vec<String> = Vec::new();
    let rsa_hash = handle
        .best_supported_rsa_hash()
        .await
        .map_err(ssh_err)?
        .flatten();

    if let Some(key) = &target.key_file {
        let passphrase = target.key_passphrase.as_deref();
        if try_key(handle, &target.user, key, passphrase, rsa_hash, &mut tried)
            .await
            .map_err(ssh_err)?
        {
            return Ok(());
        }
    } else {
        if let Ok(mut agent) = russh::keys::agent::client::AgentClient::connect_env().await {
            let identities = agent.request_identities().await.unwrap_or_default();
            let count = identities.len();
            for identity in identities {
                let public = identity.public_key().into_owned();
                let hash = if matches!(public.algorithm(), ssh_key::Algorithm::Rsa { .. }) {
                    rsa_hash
                } else {
                    None
                };
                if let Ok(result) = handle
                    .authenticate_publickey_with(&target.user, public, hash, &mut agent)
                    .await
                    && result.success()
                {
                    return Ok(());
                }
            }
            tried.push(format!("ssh-agent ({count} keys)"));
        }
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let defaults = ["id_ed25519", "id_ecdsa", "id_rsa"]
            .iter()
            .filter_map(|name| home.as_ref().map(|h| h.join(".ssh").join(name)))
            .filter(|p| p.exists() && !target.identity_files.contains(p));
        let candidates: Vec<PathBuf> = target
            .identity_files
            .iter()
            .cloned()
            .chain(defaults)
            .collect();
        for path in &candidates {
            if try_key(handle, &target.user, path, None, rsa_hash, &mut tried)
                .await
                .map_err(ssh_err)?
            {
                return Ok(());
            }
        }
    }

    if let Some(password) = &target.password {
        let result = handle
            .authenticate_password(&target.user, password)
            .await
            .map_err(ssh_err)?;
        if result.success() {
            return Ok(());
        }
        tried.push("password (refused)".into());
    }
    if tried.is_empty() {
        tried.push("nothing: configure key_file or password".into());
    }
    Err(ConnectError::Auth {
        user: target.user.clone(),
        addr: addr.to_string(),
        tried: tried.join(", "),
    })
}

/// Offers one key file; records why it did not work in `tried`.
async fn try_key(
    handle: &mut Handle<Client>,
    user: &str,
    path: &Path,
    passphrase: Option<&str>,
    rsa_hash: Option<HashAlg>,
    tried: &mut Vec<String>,
) -> Result<bool, russh::Error> {
    match russh::keys::load_secret_key(path, passphrase) {
        Ok(key) => {
            let key = PrivateKeyWithHashAlg::new(Arc::new(key), rsa_hash);
            if handle.authenticate_publickey(user, key).await?.success() {
                return Ok(true);
            }
            tried.push(format!("key {} (refused)", path.display()));
        }
        Err(e) => tried.push(format!(
            "key {} ({})",
            path.display(),
            key_load_problem(&e, passphrase.is_some())
        )),
    }
    Ok(false)
}

fn key_load_problem(e: &russh::keys::Error, had_passphrase: bool) -> String {
    let text = e.to_string();
    match e {
        russh::keys::Error::KeyIsEncrypted => "encrypted: set key_passphrase".into(),
        russh::keys::Error::IO(io) if io.kind() == std::io::ErrorKind::NotFound => {
            "not found".into()
        }
        // Decryption with the wrong passphrase surfaces as a crypto error.
        russh::keys::Error::SshKey(_) if had_passphrase => "wrong passphrase?".into(),
        _ => text,
    }
}

/// Starts `program serve` as a local child process and links to it.
pub fn spawn_local_agent(program: &Path) -> std::io::Result<AgentLink> {
    let mut child = tokio::process::Command::new(program)
        .arg("serve")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel(256);
    let err_tx = tx.clone();
    tokio::spawn(pump(stderr, err_tx, LinkEvent::Stderr));
    tokio::spawn(async move {
        pump(stdout, tx.clone(), LinkEvent::Stdout).await;
        let _ = tx
            .send(LinkEvent::Closed("local agent closed its output".into()))
            .await;
    });
    Ok(AgentLink {
        events: rx,
        writer: Box::pin(stdin),
        _keep: Box::new(LocalChild(Some(child))),
    })
}

/// Reaps the local agent when its link goes. Its stdin is closed by then, so it
/// stops its commands and exits by itself; it is killed only if it lingers.
struct LocalChild(Option<tokio::process::Child>);

impl Drop for LocalChild {
    fn drop(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if tokio::time::timeout(Duration::from_secs(5), child.wait())
                    .await
                    .is_err()
                {
                    let _ = child.kill().await;
                }
            });
        }
    }
}

async fn pump(
    mut from: impl AsyncRead + Unpin,
    to: mpsc::Sender<LinkEvent>,
    wrap: fn(Vec<u8>) -> LinkEvent,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.send(wrap(buf[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
}
