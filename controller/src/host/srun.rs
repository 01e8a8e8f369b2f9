//! The compute node of one Slurm allocation, reached from its cluster's
//! login node. Every command runs as a job step,
//! `srun --jobid=JOB --overlap -u -N1 -n1 sh -c CMD`, started through the
//! login node's own [`Host`] (its SSH connection): nothing but that one
//! connection crosses the network, and the node needs no SSH of its own.
//!
//! `-u` passes bytes as they come (without it srun holds output until a
//! newline, and the protocol is binary); `--overlap` shares the
//! allocation's CPUs with the holder instead of waiting for free ones;
//! `--whole` gives the step all of the allocation's CPUs, memory and GPUs
//! (a plain `-n1` step is bound to one CPU where tasks are confined);
//! `--quiet` keeps srun's own notes off the stream. Before each step the
//! login node checks that the job is an Outpost holder and runs, so a
//! pending, ended or foreign job is an error that says so, never a step
//! that waits or lands in someone's training run.
//!
//! The agent there keeps its state in the allocation's own directory
//! (`OUTPOST_STATE_DIR`, `<dir>/slurm/<job>`), apart from the login node's
//! even on a shared home: its jobs and code contexts end with the
//! allocation (see the agent's `OWNER_FILE`).

use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::bootstrap::shell_quote;
use super::command::{copy_in_command, open_sized};
use super::{AgentLink, CapturedRun, Host, LinkEvent};

/// The variable that gives the node's agent its state dir.
const STATE_DIR_ENV: &str = "OUTPOST_STATE_DIR";
/// Where the holder writes its pid, in the allocation's state dir (the
/// agent's `OWNER_FILE`).
pub const OWNER_FILE: &str = "owner.pid";
/// The holder jobs' name: how this user's sandboxes are told apart from
/// their other jobs.
pub const HOLDER_JOB_NAME: &str = "outpost-sandbox";

/// One allocation's node, through its login node.
pub struct SrunHost {
    login: Arc<dyn Host>,
    job: u64,
    /// The allocation's state dir as a shell word for the node's shell
    /// (`"$HOME"'/.outpost/slurm/42'`).
    state_dir: String,
}

impl SrunHost {
    /// `remote_dir` is the login node's (`~/.outpost`); the allocation's
    /// state lives in `<remote_dir>/slurm/<job>` on the node.
    pub fn new(login: Arc<dyn Host>, job: u64, remote_dir: &str) -> SrunHost {
        SrunHost {
            login,
            job,
            state_dir: format!("{}/{job}", slurm_dir_word(remote_dir)),
        }
    }

    /// `command` as a step of the allocation, as the login node's shell
    /// reads it. On the node it waits (at most 5 s) for the holder's pid
    /// file, so that the agent's daemon is tied to the holder from its start.
    fn step(&self, command: &str) -> String {
        let inner = format!(
            "{STATE_DIR_ENV}={}; export {STATE_DIR_ENV}; i=0; \
             while [ ! -e \"${STATE_DIR_ENV}/{OWNER_FILE}\" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; \
             {command}",
            self.state_dir
        );
        let job = self.job;
        format!(
            "s=$(squeue -h -j {job} -o '%T|%j|%r' 2>&1) || {{ echo \"Slurm job {job} has ended ($s)\" >&2; exit 1; }}; \
             case \"$s\" in \
             'RUNNING|{HOLDER_JOB_NAME}|'*) ;; \
             '') echo 'Slurm job {job} has ended' >&2; exit 1 ;; \
             *'|{HOLDER_JOB_NAME}|'*) echo \"Slurm job {job} is not running: $s\" >&2; exit 1 ;; \
             *) echo 'Slurm job {job} is not an Outpost sandbox' >&2; exit 1 ;; \
             esac; \
             exec srun --jobid={job} --overlap --whole -u --quiet -N1 -n1 sh -c {}",
            shell_quote(&inner)
        )
    }
}

/// `<remote_dir>/slurm`, where each allocation's state dir is named by its
/// job id, as one shell word, `~` left to the shell that reads it (the
/// node's home may not be the login node's).
pub fn slurm_dir_word(remote_dir: &str) -> String {
    let dir = format!("{}/slurm", remote_dir.trim_end_matches('/'));
    match dir.strip_prefix("~/") {
        Some(rest) => format!("\"$HOME\"/{}", shell_quote(rest)),
        None => shell_quote(&dir),
    }
}

impl Host for SrunHost {
    fn run<'a>(&'a self, command: &'a str) -> BoxFuture<'a, Result<CapturedRun, String>> {
        Box::pin(async move { self.login.run(&self.step(command)).await })
    }

    /// The agent goes through the step's own stdin (no shared filesystem
    /// needed), then its size is checked by a second step: a stream cut
    /// short installs nothing (see [`copy_in_command`]).
    fn copy_in<'a>(
        &'a self,
        from: &'a Path,
        dirs: &'a [String],
        to: &'a str,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let (mut file, size) = open_sized(from).await?;
            let tmp = super::command::temp_name(to);
            let mut link = self.open(&copy_in_command(dirs, to, &tmp, size)).await?;
            let mut writer = link.writer;
            let feed = async move {
                let mut buf = vec![0u8; 256 * 1024];
                loop {
                    let n = file.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    if let Err(e) = writer.write_all(&buf[..n]).await {
                        // End the step's input all the same: its `cat` must
                        // not wait for bytes that will never come.
                        let _ = writer.shutdown().await;
                        return Err(e);
                    }
                }
                writer.shutdown().await
            };
            let collect = async {
                let mut stderr = Vec::new();
                while let Some(event) = link.events.recv().await {
                    match event {
                        LinkEvent::Stderr(b) => stderr.extend_from_slice(&b),
                        LinkEvent::Stdout(_) => {}
                        LinkEvent::Closed(_) => break,
                    }
                }
                stderr
            };
            let (fed, stderr) = tokio::join!(feed, collect);
            let check = self.run(&format!("wc -c < {}", shell_quote(to))).await?;
            let arrived = String::from_utf8_lossy(&check.stdout).trim().parse::<u64>();
            if check.exit_status == Some(0) && arrived == Ok(size) {
                return Ok(());
            }
            let stderr = String::from_utf8_lossy(&stderr);
            let why = match (fed, stderr.trim()) {
                (_, text) if !text.is_empty() => text.to_string(),
                (Err(e), _) => format!("writing to the step: {e}"),
                (Ok(()), _) => "the step ended before the copy was complete".to_string(),
            };
            Err(format!(
                "copying the agent to job {}'s node: {why}",
                self.job
            ))
        })
    }

    fn open<'a>(&'a self, command: &'a str) -> BoxFuture<'a, Result<AgentLink, String>> {
        Box::pin(async move { self.login.open(&self.step(command)).await })
    }

    fn disconnect(&self) -> BoxFuture<'_, ()> {
        // The login node's connection is its own session's to close; each
        // step ends with its channel.
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_dir_stays_for_the_nodes_shell() {
        assert_eq!(slurm_dir_word("~/.outpost"), "\"$HOME\"/'.outpost/slurm'");
        assert_eq!(
            slurm_dir_word("/scratch/it's/"),
            r"'/scratch/it'\''s/slurm'"
        );
    }

    #[test]
    fn a_step_carries_the_command_whole() {
        let host = SrunHost::new(Arc::new(super::super::local::LocalHost), 42, "~/.outpost");
        let step = host.step("exec '/a b/outpost-agent' serve");
        assert!(
            step.contains(
                r#"exec srun --jobid=42 --overlap --whole -u --quiet -N1 -n1 sh -c 'OUTPOST_STATE_DIR="$HOME"/'\''.outpost/slurm'\''/42; export OUTPOST_STATE_DIR;"#
            ),
            "{step}"
        );
        assert!(
            step.ends_with(r#"exec '\''/a b/outpost-agent'\'' serve'"#),
            "{step}"
        );
        assert!(step.starts_with("s=$(squeue -h -j 42 "), "{step}");
    }
}
