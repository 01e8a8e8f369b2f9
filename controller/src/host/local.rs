//! The `local` sandbox's host: this machine, the agent a child process over
//! pipes. `spawn_agent` links to any local child process, so the command
//! transport (`command.rs`) starts its agents with it too.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

use super::{AgentLink, CapturedRun, Host, LinkEvent, SocketStream};

/// This machine.
pub struct LocalHost;

impl Host for LocalHost {
    fn run<'a>(&'a self, command: &'a str) -> BoxFuture<'a, Result<CapturedRun, String>> {
        Box::pin(async move {
            let out = shell(command)
                .stdin(Stdio::null())
                .output()
                .await
                .map_err(|e| format!("cannot run /bin/sh: {e}"))?;
            Ok(CapturedRun::from(out))
        })
    }

    fn copy_in<'a>(
        &'a self,
        from: &'a Path,
        dirs: &'a [String],
        to: &'a str,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let (from, dirs, to) = (from.to_path_buf(), dirs.to_vec(), to.to_string());
            tokio::task::spawn_blocking(move || copy_file(&from, &dirs, &to))
                .await
                .map_err(|e| e.to_string())?
        })
    }

    fn open<'a>(&'a self, command: &'a str) -> BoxFuture<'a, Result<AgentLink, String>> {
        Box::pin(async move {
            spawn_agent(shell(command), "local agent closed its output").map_err(|e| e.to_string())
        })
    }

    fn open_socket<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<SocketStream, String>> {
        Box::pin(async move {
            let stream = tokio::net::UnixStream::connect(path)
                .await
                .map_err(|e| format!("cannot connect to {path}: {e}"))?;
            Ok(Box::new(stream) as SocketStream)
        })
    }

    fn disconnect(&self) -> BoxFuture<'_, ()> {
        // Each link owns its child; nothing else to close.
        Box::pin(async {})
    }
}

fn shell(command: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.arg("-c").arg(command);
    cmd
}

/// Temp name beside `to`, mode 0755 (see [`super::AGENT_MODE`]), flushed,
/// renamed over it.
fn copy_file(from: &Path, dirs: &[String], to: &str) -> Result<(), String> {
    for dir in dirs {
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {dir}: {e}")),
        }
    }
    let bytes = std::fs::read(from).map_err(|e| format!("cannot read {}: {e}", from.display()))?;
    let tmp = format!("{to}.{}.tmp", std::process::id());
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(super::AGENT_MODE)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()));
    match written.and_then(|()| std::fs::rename(&tmp, to)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(format!("cannot write {to}: {e}"))
        }
    }
}

/// Starts `command` as a local child process and links to it: its stdin and
/// stdout are the link, its stderr arrives as [`LinkEvent::Stderr`], and
/// `closed` is the reason given when its stdout ends.
pub(super) fn spawn_agent(
    mut command: tokio::process::Command,
    closed: &str,
) -> std::io::Result<AgentLink> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel(256);
    let err_tx = tx.clone();
    let stderr_done = tokio::spawn(pump(stderr, err_tx, LinkEvent::Stderr));
    let closed = closed.to_string();
    tokio::spawn(async move {
        pump(stdout, tx.clone(), LinkEvent::Stdout).await;
        // What a dying process printed last on stderr says why; give it a
        // moment to arrive, but never wait on a stderr that something else
        // keeps open.
        let _ = tokio::time::timeout(Duration::from_millis(500), stderr_done).await;
        let _ = tx.send(LinkEvent::Closed(closed)).await;
    });
    Ok(AgentLink {
        events: rx,
        writer: Box::pin(stdin),
        _keep: Box::new(LocalChild(Some(child))),
    })
}

/// Reaps the child when its link goes. Its stdin is closed by then, so an
/// agent (or the command carrying it) stops its commands and exits by
/// itself; it is killed only if it lingers.
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
