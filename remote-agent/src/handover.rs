//! An exec that becomes a background job when its call's budget runs out:
//! [`crate::exec`] says when ([`Handing`]), `serve` calls [`hand_over`],
//! which records the job and turns the command's
//! [supervisor](crate::supervisor) into its shim.

use std::time::Duration;

use outpost_protocol::{ExecResult, JobSpec, Response, WatchSpec};

pub use crate::exec::Handing;
use crate::proctree;
use crate::running::Process;

/// Upper bound on waits that only a wedged kernel could exceed.
const STUCK: Duration = Duration::from_secs(2);

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
                    crate::daemon::client::nudge();
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
