//! The two ways [`crate::exec`] holds a running command: as a direct child
//! of `serve`, or under a [supervisor](crate::supervisor) that can hand it
//! over as a job.

use std::io;
use std::process::ExitStatus;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::process::Child;

use crate::supervisor::{Started, Supervised};

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
