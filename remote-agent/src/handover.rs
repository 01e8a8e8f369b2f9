//! An exec that becomes a background job when its call's budget runs out,
//! and the two ways [`crate::exec`] holds a running command: as a direct
//! child of `serve`, or under a [supervisor](crate::supervisor) that can
//! hand it over.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use outpost_protocol::{ExecResult, JobSpec, Response, WatchSpec};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::process::Child;
use tokio::sync::watch;

use crate::guard;
use crate::proctree;
use crate::sandbox::Scope;
use crate::supervisor::{Started, Supervised};

/// Upper bound on waits that only a wedged kernel could exceed.
const STUCK: Duration = Duration::from_secs(2);

/// A command just started, with its pipes.
pub struct Running {
    pub pid: i32,
    pub stdin: Option<Box<dyn AsyncWrite + Send + Unpin>>,
    pub stdout: Box<dyn AsyncRead + Send + Unpin>,
    pub stderr: Box<dyn AsyncRead + Send + Unpin>,
    pub process: Process,
}

impl Running {
    pub fn direct(mut child: Child) -> Option<Running> {
        Some(Running {
            pid: child.id()? as i32,
            stdin: child
                .stdin
                .take()
                .map(|p| Box::new(p) as Box<dyn AsyncWrite + Send + Unpin>),
            stdout: Box::new(child.stdout.take()?),
            stderr: Box::new(child.stderr.take()?),
            process: Process::Direct(child),
        })
    }

    /// Hands the descriptors to the runtime (on one of its threads).
    pub fn supervised(started: Started) -> io::Result<Running> {
        let (supervised, stdin, stdout, stderr) = started.into_parts()?;
        Ok(Running {
            pid: supervised.pid,
            stdin: stdin.map(|p| Box::new(p) as Box<dyn AsyncWrite + Send + Unpin>),
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            process: Process::Supervised(supervised),
        })
    }
}

pub enum Process {
    Direct(Child),
    Supervised(Supervised),
}

impl Process {
    /// The exit status once the command exited; cancel-safe. A supervised
    /// command stays unreaped until [`Process::release`].
    pub async fn wait(&mut self) -> Option<ExitStatus> {
        match self {
            Process::Direct(child) => child.wait().await.ok(),
            Process::Supervised(s) => s.wait().await,
        }
    }

    pub async fn try_wait(&mut self) -> Option<ExitStatus> {
        match self {
            Process::Direct(child) => child.try_wait().ok().flatten(),
            Process::Supervised(s) => s.try_wait().await,
        }
    }

    /// Done with it: a supervised command is reaped and its supervisor ends.
    pub async fn release(self) {
        if let Process::Supervised(s) = self {
            s.release().await;
        }
    }
}

/// A command still running at its `hand_over` time, and what the job
/// needs to know of it.
pub struct Handing {
    pub job: String,
    pub command: String,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    pub timeout_ms: Option<u64>,
    pub sandbox: Option<Scope>,
    pub token: String,
    pub pid: i32,
    pub process: Process,
    pub guarded: guard::Supervised,
    pub so_far: ExecResult,
    pub started: Instant,
    pub cancel: watch::Receiver<bool>,
}

/// Records the job, gives the command to it and answers `ExecHandedOver`;
/// if it cannot, stops the command and answers `ExecCutShort` with why.
pub async fn hand_over(h: Handing) -> Response {
    let Handing {
        job,
        command,
        cwd,
        env,
        timeout_ms,
        sandbox,
        token,
        pid,
        mut process,
        guarded,
        so_far,
        started,
        cancel,
    } = h;
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let spec = JobSpec {
        name: Some(job.clone()),
        command,
        cwd: Some(cwd.to_string_lossy().into_owned()),
        env,
        log_file: None,
        watch: WatchSpec::default(),
        timeout_ms,
        split_streams: true,
        stdin: None,
        sandbox: sandbox.map(|s| s.dirs.id.clone()),
    };
    let recorded = {
        let (token, so_far) = (token.clone(), so_far.clone());
        tokio::task::spawn_blocking(move || {
            crate::jobs::record_handed_over(spec, &token, pid, &so_far)
        })
        .await
    };
    let why = match (recorded, &mut process) {
        (Ok(Ok(dir)), Process::Supervised(supervised)) => {
            match supervised.hand_over(&dir, elapsed_ms).await {
                Ok(()) => {
                    // The job's from now on: a dying serve must leave it be.
                    guarded.ended();
                    crate::jobs::nudge();
                    if *cancel.borrow() {
                        let name = job.clone();
                        let _ = tokio::task::spawn_blocking(move || crate::jobs::cancel(&name, 0))
                            .await;
                    }
                    return Response::ExecHandedOver { job, so_far };
                }
                Err(why) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    why
                }
            }
        }
        (Ok(Ok(dir)), Process::Direct(_)) => {
            let _ = std::fs::remove_dir_all(&dir);
            "this command was not started under a supervisor".into()
        }
        (Ok(Err(e)), _) => e.message,
        (Err(_), _) => "recording the job panicked".into(),
    };
    let kill = tokio::task::spawn_blocking(move || proctree::terminate(pid, &token));
    let _ = kill.await;
    let status = tokio::time::timeout(STUCK, process.wait())
        .await
        .ok()
        .flatten();
    process.release().await;
    guarded.ended();
    Response::ExecCutShort {
        result: ExecResult {
            exit_code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s)),
            duration_ms: started.elapsed().as_millis() as u64,
            ..so_far
        },
        why,
    }
}
