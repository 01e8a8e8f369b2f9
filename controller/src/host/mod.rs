//! Hosts: places an agent can be started, and the byte pipe to it.
//!
//! A [`Host`] can do three things: run a command and collect its output (the
//! probe), copy a file in (the agent install), and start a command whose
//! stdin and stdout become an [`AgentLink`]. [`bootstrap`] gets a matching
//! agent running over those three, whatever the host is, and [`link`] reads
//! the agent's hello and frames off the pipe; the session layer above sees
//! only the link.
//!
//! Implementations: [`ssh`] (russh: connect, host keys, auth, SFTP),
//! [`local`] (this machine, a child process) and [`command`] (any command
//! that gives a shell in the target on its stdin and stdout: `kubectl exec
//! -i`, `docker exec -i`, `srun`, `ssh`; the agent copied in through that
//! same stream) and [`srun`] (the node of a Slurm allocation, each command a
//! job step started through the login node's host). [`start`] picks one from the sandbox's [`Target`]. Tests
//! also have `memory` (an in-process agent over an in-memory pipe), which
//! [`start`] asks first in test builds only.
//!
//! Architecture invariant: only `host/ssh` knows russh. Adding a transport is
//! one module here that implements [`Host`], one [`Target`] variant in
//! `config`, and one arm in [`start`].

pub mod bootstrap;
pub mod command;
pub mod link;
pub mod local;
#[cfg(test)]
pub mod memory;
pub mod srun;
pub mod ssh;

/// Mode of an installed agent binary: executable by every uid, so an agent
/// running as root can start it inside its sandboxes, whose commands run as
/// uids of their own. Nothing in it is secret; the directories above it
/// stay 0700.
pub const AGENT_MODE: u32 = 0o755;

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::AsyncWrite;
use tokio::sync::mpsc;

use crate::config::Target;
use bootstrap::{Artifacts, Started};

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

/// A finished command's exit status and output.
#[derive(Debug, Default)]
pub struct CapturedRun {
    pub exit_status: Option<u32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl From<std::process::Output> for CapturedRun {
    fn from(out: std::process::Output) -> Self {
        CapturedRun {
            exit_status: out.status.code().map(|c| c as u32),
            stdout: out.stdout,
            stderr: out.stderr,
        }
    }
}

/// A place an agent can be started.
pub trait Host: Send + Sync {
    /// Runs `command` with the host's shell and collects what it printed.
    fn run<'a>(&'a self, command: &'a str) -> BoxFuture<'a, Result<CapturedRun, String>>;

    /// Copies the local file `from` to `to` on the host with mode 0700,
    /// creating `dirs` (mode 0700, in order) first. `to` appears whole or not
    /// at all.
    fn copy_in<'a>(
        &'a self,
        from: &'a Path,
        dirs: &'a [String],
        to: &'a str,
    ) -> BoxFuture<'a, Result<(), String>>;

    /// Starts `command` with the host's shell; its stdin and stdout are the
    /// link, its stderr arrives as [`LinkEvent::Stderr`].
    fn open<'a>(&'a self, command: &'a str) -> BoxFuture<'a, Result<AgentLink, String>>;

    /// Closes what connects us to the host; links opened on it end.
    fn disconnect(&self) -> BoxFuture<'_, ()>;

    /// A stream to the unix socket `path` on the host (an exposed port of
    /// a sandbox). Only hosts this machine reaches as a socket have one.
    fn open_socket<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<SocketStream, String>> {
        let _ = path;
        Box::pin(async {
            Err("ports are exposed from SSH hosts and the local host only".to_string())
        })
    }
}

/// A byte stream to a socket on a host ([`Host::open_socket`]).
pub type SocketStream = Box<dyn AsyncStream>;

pub trait AsyncStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> AsyncStream for T {}

/// A host key that no known_hosts file records, as a person would check it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownHostKey {
    /// `host` or `[host]:port`, as known_hosts writes it.
    pub host: String,
    pub port: u16,
    /// e.g. `ssh-ed25519`.
    pub key_type: String,
    /// `SHA256:…`, as `ssh-keygen -l` prints it.
    pub fingerprint: String,
}

/// What a person decided about an [`UnknownHostKey`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKeyDecision {
    Reject,
    /// For as long as this process runs; nothing is recorded.
    TrustOnce,
    /// Recorded in Outpost's own known_hosts.
    TrustAndSave,
}

/// Asks a person about a host key. A front end that can ask (MCP with
/// elicitation) provides one for the duration of a call through
/// [`HOST_KEY_CONFIRMATION`]; without one the target's rule applies
/// (accept-new, or refuse with `strict_host_keys`). Never reachable from a
/// tool's arguments.
pub trait ConfirmHostKey: Send + Sync {
    fn confirm(&self, key: UnknownHostKey) -> BoxFuture<'_, HostKeyDecision>;
}

tokio::task_local! {
    /// Who to ask about an unknown host key while connecting in this task.
    pub static HOST_KEY_CONFIRMATION: Arc<dyn ConfirmHostKey>;
}

/// What starting an agent needs besides the target.
pub struct HostContext {
    /// Outpost's own known_hosts, where accepted keys are recorded.
    pub known_hosts: PathBuf,
    /// The user's `~/.ssh/known_hosts`, read only.
    pub user_known_hosts: Option<PathBuf>,
    pub connect_timeout: Duration,
    pub artifacts: Artifacts,
}

/// Connects to `target` and starts an agent there.
pub async fn start(target: &Target, ctx: &HostContext) -> Result<(Arc<dyn Host>, Started), String> {
    #[cfg(test)]
    if let Some(started) = memory::start(target, ctx).await {
        return started;
    }
    match target {
        Target::Local => {
            let host: Arc<dyn Host> = Arc::new(local::LocalHost);
            let started =
                bootstrap::start_in_place(&*host, &ctx.artifacts, ctx.connect_timeout).await?;
            Ok((host, started))
        }
        Target::Ssh(target) => {
            if let Some(why) = &target.unusable {
                return Err(why.clone());
            }
            ctx.artifacts.hash_ahead();
            let keys = ssh::HostKeyFiles {
                user: ctx.user_known_hosts.as_deref(),
                own: &ctx.known_hosts,
            };
            // `ConnectTimeout` of the host's `~/.ssh/config`, else Outpost's,
            // bounds the connection; starting (or uploading) the agent keeps
            // Outpost's own.
            let connect_timeout = target.connect_timeout.unwrap_or(ctx.connect_timeout);
            let host: Arc<dyn Host> = Arc::new(
                ssh::SshConnection::connect(target, keys, connect_timeout)
                    .await
                    .map_err(|e| e.to_string())?,
            );
            let started = start_installed(&*host, &target.remote_dir, ctx).await?;
            Ok((host, started))
        }
        Target::Command(target) => {
            ctx.artifacts.hash_ahead();
            let host: Arc<dyn Host> = Arc::new(command::CommandHost::new(target.clone()));
            let started = start_installed(&*host, &target.remote_dir, ctx).await?;
            Ok((host, started))
        }
    }
}

/// Starts an agent on the node of Slurm allocation `job`, each command a
/// job step started through `login` (the login node's host, reached as
/// `login_target`); the agent binary is looked for, or installed, under the
/// login node's remote dir as the node sees it.
pub async fn start_in_allocation(
    login: Arc<dyn Host>,
    login_target: &Target,
    job: u64,
    ctx: &HostContext,
) -> Result<(Arc<dyn Host>, Started), String> {
    let remote_dir = match login_target {
        Target::Ssh(t) => t.remote_dir.as_str(),
        Target::Command(t) => t.remote_dir.as_str(),
        Target::Local => crate::config::DEFAULT_REMOTE_DIR,
    };
    let host: Arc<dyn Host> = Arc::new(srun::SrunHost::new(login, job, remote_dir));
    let started = start_installed(&*host, remote_dir, ctx)
        .await
        .map_err(|e| format!("starting the agent in Slurm job {job}: {e}"))?;
    Ok((host, started))
}

/// Probes `host` and starts its agent under `remote_dir`, installing it
/// first if needed, all within a bound of Outpost's own.
async fn start_installed(
    host: &dyn Host,
    remote_dir: &str,
    ctx: &HostContext,
) -> Result<Started, String> {
    tokio::time::timeout(
        ctx.connect_timeout * 3,
        bootstrap::start_installed(host, remote_dir, &ctx.artifacts, ctx.connect_timeout),
    )
    .await
    .map_err(|_| "starting the agent timed out".to_string())?
}
