//! A host for tests: the agent runs in this process, on one end of an
//! in-memory pipe, so session, fleet and sync logic can be tested without
//! sshd, child processes or an agent binary.
//!
//! [`MemoryHost::open`] starts the agent's serve loop
//! ([`outpost_agent::serve::serve_on`], in-process options: no guard, no job
//! daemon, no signals) on one end of a [`tokio::io::duplex`] and returns the
//! other end as the [`AgentLink`]: what the agent writes arrives as
//! [`LinkEvent::Stdout`], and [`LinkEvent::Closed`] when its session ends
//! or the link is cut. Commands still run for real (`bash -c`), with the
//! agent's timeouts, cancels and tree kills.
//!
//! How a test reaches it: the seam is the one place sandboxes become hosts,
//! [`super::start`], which in test builds first asks [`start`] here. A test
//! makes a [`MemoryHost`], asks it for a [`HostConfig`]
//! ([`MemoryHost::sandbox`]: an SSH target with a unique `.invalid` host
//! name, recorded in a registry of this module), and builds a `Session` or
//! a `Fleet` from that config as production code does; connecting it,
//! reconnecting included, gets a fresh link to the in-process agent. Nothing
//! else changes: no constructor, field or `Target` variant exists for tests,
//! and this module, the seam and the agent library (a dev-dependency) are
//! absent from normal builds.
//!
//! Each connection gets a handle of its own ([`MemoryHost::connect`]), as
//! SSH gets a TCP connection of its own, so the `disconnect` of an old
//! connection never cuts the link of the next one. [`MemoryHost::sever`]
//! cuts every link at once, as a network failure would.

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use outpost_agent::serve::{ServeOptions, serve_on};
use tokio::io::{AsyncReadExt, ReadHalf};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::bootstrap::{Artifacts, Started};
use super::link::read_hello;
use super::{AgentLink, CapturedRun, Host, HostContext, LinkEvent};
use crate::config::{HostConfig, SshTarget, Target};

/// Suffix of the host names [`MemoryHost::sandbox`] hands out.
const HOST_SUFFIX: &str = ".memory.invalid";
/// Bytes the pipe holds each way, as the agent's widened stdout pipe.
const PIPE_BYTES: usize = 1 << 20;

/// One in-process "machine": every link opened through it, and its agents.
pub struct MemoryHost {
    id: u64,
    /// The handle a connection got from [`MemoryHost::connect`]; 0 for the
    /// machine itself.
    conn: u64,
    machine: Arc<Machine>,
}

#[derive(Default)]
struct Machine {
    next_conn: AtomicU64,
    opened: AtomicUsize,
    links: Mutex<Vec<Link>>,
}

/// One agent session and the switch that cuts its link.
struct Link {
    conn: u64,
    cut: watch::Sender<bool>,
    agent: JoinHandle<i32>,
}

impl MemoryHost {
    /// A machine with no links yet.
    pub fn new() -> Arc<MemoryHost> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Arc::new(MemoryHost {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            conn: 0,
            machine: Arc::default(),
        })
    }

    /// A new handle on the same machine whose [`Host::disconnect`] cuts
    /// only the links opened through it.
    pub fn connect(&self) -> MemoryHost {
        MemoryHost {
            id: self.id,
            conn: self.machine.next_conn.fetch_add(1, Ordering::Relaxed) + 1,
            machine: Arc::clone(&self.machine),
        }
    }

    /// A sandbox named `name` that connects to this machine. The registry
    /// keeps the machine for the rest of the process (a test may drop its
    /// handle and keep the session).
    pub fn sandbox(self: &Arc<Self>, name: &str) -> HostConfig {
        let hostname = format!("{name}.{}{HOST_SUFFIX}", self.id);
        registry()
            .lock()
            .unwrap()
            .insert(hostname.clone(), Arc::clone(self));
        HostConfig {
            name: name.to_string(),
            slurm: None,
            allow_hosts: Vec::new(),
            sandbox_uids: None,
            target: Target::Ssh(SshTarget {
                host: name.to_string(),
                hostname,
                port: 0,
                user: "memory".into(),
                key_file: None,
                key_passphrase: None,
                password: None,
                identity_files: Vec::new(),
                identities_only: false,
                connect_timeout: None,
                strict_host_keys: true,
                remote_dir: "~/.outpost".into(),
                jump: Vec::new(),
                user_known_hosts: None,
                unusable: None,
            }),
        }
    }

    /// Links opened so far (one per connection).
    pub fn opened(&self) -> usize {
        self.machine.opened.load(Ordering::Relaxed)
    }

    /// Agent sessions not yet ended.
    pub fn agents_running(&self) -> usize {
        let mut links = self.machine.links.lock().unwrap();
        links.retain(|l| !l.agent.is_finished());
        links.len()
    }

    /// Cuts every link, as a network failure would: the controller sees
    /// the link close, and the agent the end of its input once the
    /// controller lets go of its end.
    pub fn sever(&self) {
        self.cut(|_| true);
    }

    fn cut(&self, which: impl Fn(&Link) -> bool) {
        for link in self.machine.links.lock().unwrap().iter() {
            if which(link) {
                let _ = link.cut.send(true);
            }
        }
    }
}

/// A [`HostContext`] for sessions on memory hosts; its paths are never
/// used.
pub fn context() -> HostContext {
    HostContext {
        known_hosts: std::env::temp_dir().join("outpost-memory-known_hosts"),
        user_known_hosts: None,
        connect_timeout: Duration::from_secs(5),
        artifacts: Artifacts {
            native: None,
            portable: Vec::new(),
            searched: Vec::new(),
        },
    }
}

fn registry() -> &'static Mutex<HashMap<String, Arc<MemoryHost>>> {
    static HOSTS: OnceLock<Mutex<HashMap<String, Arc<MemoryHost>>>> = OnceLock::new();
    HOSTS.get_or_init(Mutex::default)
}

/// The seam [`super::start`] asks first: `None` unless `target` came from
/// [`MemoryHost::sandbox`], else the started agent on a new handle.
pub async fn start(
    target: &Target,
    ctx: &HostContext,
) -> Option<Result<(Arc<dyn Host>, Started), String>> {
    let Target::Ssh(ssh) = target else {
        return None;
    };
    if !ssh.hostname.ends_with(HOST_SUFFIX) {
        return None;
    }
    let host = Arc::new(registry().lock().unwrap().get(&ssh.hostname)?.connect());
    Some(start_on(host, ctx.connect_timeout).await)
}

async fn start_on(
    host: Arc<MemoryHost>,
    timeout: Duration,
) -> Result<(Arc<dyn Host>, Started), String> {
    let mut link = host.open("outpost-agent serve").await?;
    let (reader, hello) = read_hello(&mut link, timeout).await?;
    let started = Started {
        link,
        reader,
        hello,
        agent_path: "in-process".into(),
        uploaded: false,
        facts: None,
    };
    Ok((host, started))
}

impl Host for MemoryHost {
    fn run<'a>(&'a self, _command: &'a str) -> BoxFuture<'a, Result<CapturedRun, String>> {
        Box::pin(async { Err("the in-memory host runs no shell commands".to_string()) })
    }

    fn copy_in<'a>(
        &'a self,
        _from: &'a Path,
        _dirs: &'a [String],
        _to: &'a str,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Err("the in-memory host installs nothing".to_string()) })
    }

    /// Starts an in-process agent session; `command` is not run.
    fn open<'a>(&'a self, _command: &'a str) -> BoxFuture<'a, Result<AgentLink, String>> {
        Box::pin(async move {
            let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
            let (input, output) = tokio::io::split(theirs);
            let agent = tokio::spawn(serve_on(input, output, ServeOptions::in_process()));
            let (from_agent, to_agent) = tokio::io::split(ours);
            let (cut, cut_rx) = watch::channel(false);
            let (tx, events) = mpsc::channel(256);
            tokio::spawn(pump(from_agent, cut_rx, tx));
            self.machine.opened.fetch_add(1, Ordering::Relaxed);
            self.machine.links.lock().unwrap().push(Link {
                conn: self.conn,
                cut,
                agent,
            });
            Ok(AgentLink {
                events,
                writer: Box::pin(to_agent),
                _keep: Box::new(()),
            })
        })
    }

    fn disconnect(&self) -> BoxFuture<'_, ()> {
        let conn = self.conn;
        self.cut(|link| link.conn == conn);
        Box::pin(async {})
    }
}

/// Hands what the agent writes to the link until it ends or is cut.
async fn pump(
    mut from: ReadHalf<tokio::io::DuplexStream>,
    mut cut: watch::Receiver<bool>,
    to: mpsc::Sender<LinkEvent>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let reason = loop {
        tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) => break "the in-process agent ended its session".to_string(),
                Ok(n) => {
                    if to.send(LinkEvent::Stdout(buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
                Err(e) => break format!("cannot read from the in-process agent: {e}"),
            },
            true = async { cut.wait_for(|cut| *cut).await.is_ok() } => break "the in-memory link was cut".to_string(),
        }
    };
    let _ = to.send(LinkEvent::Closed(reason)).await;
}
