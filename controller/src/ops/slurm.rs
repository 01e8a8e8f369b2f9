//! Slurm allocations as sandboxes. On a cluster (a configured host with
//! `[sandbox.slurm]`, its login node) `create_sandbox` submits a holder job
//! with the resources asked for, waits until it runs (saying Slurm's reason
//! while it pends), and starts an agent on the allocated node through the
//! login node's connection ([`Session::allocation`]); the sandbox is named
//! `CLUSTER/job-N`. Its status comes from `squeue`, a renewal moves the
//! holder's deadline, a delete is `scancel`.
//!
//! The holder is the allocation's life. It records its pid in the
//! allocation's state dir, where the node's agent watches it (every job and
//! code context there ends when it is gone), and sleeps until its deadline
//! file says the TTL has passed; Slurm ends it at its time limit, `scancel`
//! at a delete. So an allocation ends at its TTL with no controller
//! connected, and whatever ends the allocation ends everything the sandbox
//! ran.
//!
//! Every value that reaches `sbatch` is checked ([`check_slurm_name`],
//! [`check_slurm_time`]) and shell-quoted: a tool argument never becomes an
//! option.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outpost_protocol::ExecRequest;

use crate::config::{SlurmDefaults, Target, check_slurm_name, check_slurm_time};
use crate::fleet::Fleet;
use crate::host::bootstrap::shell_quote;
use crate::host::srun::{HOLDER_JOB_NAME, OWNER_FILE, slurm_dir_word};
use crate::session::Session;

/// How long one Slurm command on the login node may take.
const COMMAND_TIMEOUT_MS: u64 = 30_000;
/// How long `create_sandbox` waits for a pending allocation to start
/// before it answers `pending` (the sandbox is made; a later call uses it
/// once it runs).
const START_WAIT: Duration = Duration::from_secs(30);
/// How long a delete waits for the job to leave the running state.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// The allocation's state dir on its node, as the holder's shell names it.
fn holder_dir(login: &Session) -> String {
    format!("{}/\"$SLURM_JOB_ID\"", slurm_dir_word(remote_dir(login)))
}

fn remote_dir(login: &Session) -> &str {
    match &login.config.target {
        Target::Ssh(t) => &t.remote_dir,
        Target::Command(t) => &t.remote_dir,
        Target::Local => crate::config::DEFAULT_REMOTE_DIR,
    }
}

/// Runs `script` on `session`'s host with the shell and returns its
/// stdout, or its stderr (else stdout) as the error when it fails.
pub async fn run(session: &Session, script: &str) -> Result<String, String> {
    run_raw(session, script, None)
        .await
        .map(|out| String::from_utf8_lossy(&out).into_owned())
}

/// [`run`] with `input` on the script's stdin: what must not be seen in
/// the login node's process list (a batch script carrying env values).
pub async fn run_with_input(
    session: &Session,
    script: &str,
    input: Vec<u8>,
) -> Result<String, String> {
    run_raw(session, script, Some(input))
        .await
        .map(|out| String::from_utf8_lossy(&out).into_owned())
}

/// [`run`], stdout as bytes: all of it (up to the agent's output limit, an
/// error past that, never a part).
pub async fn run_raw(
    session: &Session,
    script: &str,
    input: Option<Vec<u8>>,
) -> Result<Vec<u8>, String> {
    let req = ExecRequest {
        command: script.to_string(),
        cwd: None,
        env: Vec::new(),
        stdin: input,
        timeout_ms: Some(COMMAND_TIMEOUT_MS),
        output_limit: outpost_protocol::limits::MAX_EXEC_OUTPUT_LIMIT,
        stream: false,
        progress_ms: None,
        hand_over: None,
    };
    let result = session
        .exec(req, |_, _| {})
        .await
        .map_err(|e| e.to_string())?;
    if result.exit_code == Some(0) {
        if result.stdout.omitted > 0 {
            return Err("the answer did not fit one exec's output".into());
        }
        let mut out = result.stdout.head;
        out.extend_from_slice(&result.stdout.tail);
        return Ok(out);
    }
    let (stdout, stderr) = (result.stdout.to_text(), result.stderr.to_text());
    let said = if stderr.trim().is_empty() {
        stdout.trim()
    } else {
        stderr.trim()
    };
    Err(match (result.timed_out, result.exit_code) {
        (true, _) => format!(
            "no answer from Slurm within {} s",
            COMMAND_TIMEOUT_MS / 1000
        ),
        (_, Some(code)) => format!("exit status {code}: {said}"),
        _ => format!("killed: {said}"),
    })
}

/// An allocation to ask for, checked by the caller (a sandbox request's
/// TTL bounds; what a cluster cannot give refused there).
#[derive(Debug, Clone, Default)]
pub struct AllocationRequest {
    pub ttl_s: u64,
    /// Slurm's time limit; None: the cluster's default.
    pub time: Option<String>,
    /// None: the cluster's default.
    pub partition: Option<String>,
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    pub gpus: u32,
}

/// The `sbatch` command that submits `r`'s holder on `login`, whose agent
/// runs from `agent_path` (where a shared home lets the node find it too).
fn submit_command(
    login: &Session,
    agent_path: &str,
    defaults: &SlurmDefaults,
    r: &AllocationRequest,
) -> Result<String, String> {
    let time = r.time.clone().unwrap_or_else(|| defaults.time.clone());
    check_slurm_time(&time)?;
    let partition = r.partition.clone().or_else(|| defaults.partition.clone());
    let mut args = vec![
        "--parsable".to_string(),
        format!("--job-name={HOLDER_JOB_NAME}"),
        "--output=/dev/null".into(),
        "--error=/dev/null".into(),
        // A requeued holder would start over with a fresh TTL.
        "--no-requeue".into(),
        "--nodes=1".into(),
        "--ntasks=1".into(),
        format!("--time={time}"),
    ];
    for (option, value) in [
        ("partition", &partition),
        ("account", &defaults.account),
        ("qos", &defaults.qos),
    ] {
        if let Some(value) = value {
            check_slurm_name(option, value)?;
            args.push(format!("--{option}={value}"));
        }
    }
    if let Some(cpus) = r.cpus {
        if !(cpus.is_finite() && cpus > 0.0 && cpus <= 100_000.0) {
            return Err(format!("cpus must be a positive number, got {cpus}"));
        }
        args.push(format!("--cpus-per-task={}", cpus.ceil() as u64));
    }
    if let Some(mb) = r.memory_mb {
        if mb == 0 {
            return Err("memory_mb must be at least 1".into());
        }
        args.push(format!("--mem={mb}M"));
    }
    if r.gpus > 0 {
        args.push(format!("--gres={}:{}", defaults.gpu_gres, r.gpus));
    }
    let args: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
    Ok(format!(
        "sbatch {} <<'OUTPOST_HOLDER'\n{}OUTPOST_HOLDER\n",
        args.join(" "),
        holder_script(&holder_dir(login), agent_path, r.ttl_s)
    ))
}

/// The batch script that holds an allocation: see the module's overview.
/// `dir` is the allocation's state dir as a shell word.
///
/// Where the node sees the login node's agent (a shared home), the holder
/// starts the agent's job daemon itself: it then lives in the batch step,
/// which lasts as long as the allocation, and not in the step of whichever
/// `serve` needed it first, which ends with its SSH connection (and under
/// `proctrack/cgroup` takes every process of the step along).
fn holder_script(dir: &str, agent_path: &str, ttl_s: u64) -> String {
    let agent = shell_quote(agent_path);
    format!(
        r#"#!/bin/sh
# Holds an Outpost sandbox's allocation until its TTL passes or Slurm ends it.
d={dir}
umask 077
rm -rf "$d"; mkdir -p "$d" || exit 1
echo $$ > "$d/{OWNER_FILE}"
last=$(( $(date +%s) + {ttl_s} ))
echo $last > "$d/deadline"
if [ -x {agent} ]; then
  OUTPOST_STATE_DIR="$d" {agent} daemon --started-by slurm-holder </dev/null >/dev/null 2>&1
fi
# The node's agent ends its jobs and removes the dir once we are gone.
trap '[ -e "$d/run/daemon.json" ] || rm -rf "$d"' EXIT
trap 'exit 0' TERM INT HUP
while [ "$(date +%s)" -lt "$last" ]; do
  sleep 1 & wait $!
  # A deadline that cannot be read now (a busy network home) keeps the last.
  dl=$(cat "$d/deadline" 2>/dev/null) && [ -n "$dl" ] && last=$dl
done
"#
    )
}

/// One of this user's holder jobs as `squeue` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedJob {
    pub job: u64,
    /// `PENDING`, `RUNNING`, `COMPLETING`, …
    pub state: String,
    /// Why it pends (`Resources`, `Priority`), `None` when it does not.
    pub reason: String,
    pub node: String,
    /// Seconds until Slurm's time limit, when it runs.
    pub time_left_s: Option<u64>,
    pub cpus: Option<u32>,
    pub memory_mb: Option<u64>,
    pub partition: String,
}

/// `squeue`'s format for [`parse_queue`].
const QUEUE_FORMAT: &str = "%i|%T|%r|%N|%L|%C|%m|%P";

/// Parses `squeue -h -o QUEUE_FORMAT`.
pub fn parse_queue(text: &str) -> Vec<QueuedJob> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.trim().split('|').collect();
            if f.len() != 8 {
                return None;
            }
            Some(QueuedJob {
                job: f[0].parse().ok()?,
                state: f[1].to_string(),
                reason: f[2].to_string(),
                node: f[3].to_string(),
                time_left_s: parse_duration(f[4]),
                cpus: f[5].parse().ok(),
                memory_mb: parse_memory_mb(f[6]),
                partition: f[7].to_string(),
            })
        })
        .collect()
}

/// Seconds from Slurm's `[D-]HH:MM:SS`, `MM:SS` or `M`; None for
/// `INVALID`, `UNLIMITED`, `NOT_SET`.
pub fn parse_duration(text: &str) -> Option<u64> {
    let (days, rest) = match text.split_once('-') {
        Some((d, rest)) => (d.parse::<u64>().ok()?, rest),
        None => (0, text),
    };
    let parts: Vec<u64> = rest
        .split(':')
        .map(|p| p.parse::<u64>().ok())
        .collect::<Option<_>>()?;
    let secs = match parts.as_slice() {
        [m] => m * 60,
        [m, s] => m * 60 + s,
        [h, m, s] => h * 3600 + m * 60 + s,
        _ => return None,
    };
    Some(days * 86_400 + secs)
}

/// MiB from squeue's `%m` (`1000M`, `4G`, `0`).
fn parse_memory_mb(text: &str) -> Option<u64> {
    let (n, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = n.parse().ok()?;
    match unit {
        "K" => Some(n / 1024),
        "M" => Some(n),
        "G" => Some(n * 1024),
        "T" => Some(n * 1024 * 1024),
        _ => None,
    }
    .filter(|mb| *mb > 0)
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The cluster's holder jobs of this user, with the holders' TTL deadlines
/// where the login node can read them (a shared home).
async fn queue(
    login: &Session,
    jobs: Option<u64>,
) -> Result<Vec<(QueuedJob, Option<u64>)>, String> {
    let only = jobs.map(|j| format!(" --jobs={j}")).unwrap_or_default();
    let script = format!(
        "squeue -h -u \"$(id -un)\" --name={HOLDER_JOB_NAME}{only} -o '{QUEUE_FORMAT}' || exit\n\
         echo --\n\
         for f in {}/*/deadline; do [ -r \"$f\" ] && echo \"$f $(cat \"$f\")\"; done; true",
        slurm_dir_word(remote_dir(login))
    );
    let out = match run(login, &script).await {
        Ok(out) => out,
        // A job Slurm has already forgotten (past MinJobAge) is not an error.
        Err(e) if jobs.is_some() && e.contains("Invalid job id") => String::new(),
        Err(e) => return Err(format!("squeue on {}: {e}", login.name())),
    };
    let (queue, deadlines) = out.split_once("\n--\n").unwrap_or((&out, ""));
    let deadline = |job: u64| {
        deadlines.lines().find_map(|l| {
            let (path, value) = l.rsplit_once(' ')?;
            path.ends_with(&format!("/{job}/deadline"))
                .then(|| value.trim().parse::<u64>().ok())
                .flatten()
        })
    };
    Ok(parse_queue(queue)
        .into_iter()
        .map(|q| {
            let d = deadline(q.job);
            (q, d)
        })
        .collect())
}

/// One of this user's allocations: its holder as `squeue` shows it, the
/// holder's TTL deadline where the login node can read it, and (once the
/// node's agent answered) its home.
#[derive(Debug, Clone)]
pub struct Allocation {
    pub queued: QueuedJob,
    /// Unix seconds.
    pub deadline: Option<u64>,
    pub work_dir: String,
    /// When it ends, in unix seconds: its TTL or Slurm's time limit,
    /// whichever comes first (0: unknown).
    pub ends_unix: u64,
    /// What the caller should know (Slurm's time limit comes first).
    pub note: Option<String>,
}

impl Allocation {
    fn of((queued, deadline): (QueuedJob, Option<u64>)) -> Allocation {
        let slurm_end = queued.time_left_s.map(|left| now_unix() + left);
        let ends_unix = match (deadline, slurm_end) {
            (Some(d), Some(e)) => d.min(e),
            (Some(t), None) | (None, Some(t)) => t,
            (None, None) => 0,
        };
        Allocation {
            queued,
            deadline,
            work_dir: String::new(),
            ends_unix,
            note: None,
        }
    }
}

/// Makes a sandbox on the cluster `login`: see the module's overview.
/// `progress` hears what it waits for.
pub async fn create(
    fleet: &Fleet,
    login: &Arc<Session>,
    defaults: &SlurmDefaults,
    r: &AllocationRequest,
    progress: &(dyn Fn(String) + Send + Sync),
) -> Result<Allocation, String> {
    let agent_path = login
        .connection()
        .await
        .map_err(|e| e.to_string())?
        .agent_path
        .clone();
    let command = submit_command(login, &agent_path, defaults, r)?;
    let out = run(login, &command)
        .await
        .map_err(|e| format!("sbatch on {}: {e}", login.name()))?;
    let job: u64 = out
        .trim()
        .split(';')
        .next()
        .and_then(|j| j.trim().parse().ok())
        .ok_or_else(|| format!("sbatch answered {:?}, not a job id", out.trim()))?;
    let name = format!("{}/job-{job}", login.name());
    // From here on the allocation exists: every failure cancels it.
    let made = async {
        let began = Instant::now();
        let mut said = String::new();
        let mut say = |m: String| {
            if m != said {
                progress(m.clone());
                said = m;
            }
        };
        let queued = loop {
            let listed = queue(login, Some(job)).await?;
            let Some((q, deadline)) = listed.into_iter().next() else {
                return Err(format!(
                    "Slurm job {job} ended before it started (squeue no longer lists it)"
                ));
            };
            match q.state.as_str() {
                "RUNNING" => break (q, deadline),
                "PENDING" | "CONFIGURING" => {
                    if began.elapsed() >= START_WAIT {
                        return Ok(Allocation::of((q, deadline)));
                    }
                    say(format!("Slurm job {job} pending: {}", q.reason));
                }
                other => {
                    return Err(format!("Slurm job {job} is {other} ({})", q.reason));
                }
            }
            let pause = if began.elapsed() < Duration::from_secs(2) {
                Duration::from_millis(100)
            } else {
                Duration::from_secs(1)
            };
            tokio::time::sleep(pause).await;
        };
        say(format!(
            "Slurm job {job} runs on {}; starting the agent",
            queued.0.node
        ));
        let session = fleet.get(Some(&name))?;
        let conn = session.connection().await.map_err(|e| e.to_string())?;
        let home = conn
            .facts
            .as_ref()
            .map(|f| f.home.clone())
            .unwrap_or_default();
        Ok(Allocation {
            work_dir: home,
            ..Allocation::of(queued)
        })
    };
    match made.await {
        Ok(allocation) => Ok(allocation),
        Err(e) => {
            let _ = run(login, &format!("scancel {job}")).await;
            fleet.forget(&name);
            Err(e)
        }
    }
}

/// This user's allocations on the cluster `login`, pending and running.
pub async fn list_on(login: &Session) -> Result<Vec<Allocation>, String> {
    Ok(queue(login, None)
        .await?
        .into_iter()
        .map(Allocation::of)
        .collect())
}

/// The allocation `job` on `login`, or why there is none.
pub async fn status(login: &Session, job: u64) -> Result<Allocation, String> {
    let listed = queue(login, Some(job)).await?;
    listed
        .into_iter()
        .next()
        .map(Allocation::of)
        .ok_or_else(|| {
            format!(
                "no sandbox job-{job} on {} (ended, or never made)",
                login.name()
            )
        })
}

/// Moves the allocation's deadline to `ttl_s` from now (Slurm's time limit
/// still ends it first, if earlier).
pub async fn renew(
    fleet: &Fleet,
    login: &Session,
    job: u64,
    ttl_s: u64,
) -> Result<Allocation, String> {
    let session = fleet.get(Some(&format!("{}/job-{job}", login.name())))?;
    let dir = format!("{}/{job}", slurm_dir_word(remote_dir(login)));
    run(
        &session,
        &format!(
            "d={dir}; echo $(( $(date +%s) + {ttl_s} )) > \"$d/deadline.new\" && mv -f \"$d/deadline.new\" \"$d/deadline\""
        ),
    )
    .await
    .map_err(|e| format!("renewing job-{job}: {e}"))?;
    let mut allocation = status(login, job).await?;
    if allocation
        .queued
        .time_left_s
        .is_some_and(|left| left < ttl_s)
    {
        allocation.note = Some("Slurm's time limit ends it first".into());
    }
    Ok(allocation)
}

/// Cancels the allocation `job`: its holder, its steps, and (through the
/// node's agent) every job and context it ran.
pub async fn delete(fleet: &Fleet, login: &Session, job: u64) -> Result<Allocation, String> {
    let name = format!("{}/job-{job}", login.name());
    let before = status(login, job).await?;
    run(login, &format!("scancel {job}"))
        .await
        .map_err(|e| format!("scancel {job} on {}: {e}", login.name()))?;
    let began = Instant::now();
    while began.elapsed() < CANCEL_WAIT {
        match queue(login, Some(job)).await?.first() {
            Some((q, _)) if matches!(q.state.as_str(), "RUNNING" | "PENDING") => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => break,
        }
    }
    if let Ok(session) = fleet.get(Some(&name)) {
        session.disconnect().await;
    }
    fleet.forget(&name);
    let mut after = before;
    after.queued.state = "CANCELLED".into();
    Ok(after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squeue_lines_become_jobs() {
        let text = "17|RUNNING|None|node01|1:59:30|4|8000M|gpu\n\
                    18|PENDING|Resources||2:00:00|1|2G|gpu\n\
                    garbage\n";
        let jobs = parse_queue(text);
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].job, 17);
        assert_eq!(jobs[0].node, "node01");
        assert_eq!(jobs[0].time_left_s, Some(7170));
        assert_eq!(jobs[0].cpus, Some(4));
        assert_eq!(jobs[0].memory_mb, Some(8000));
        assert_eq!(jobs[1].reason, "Resources");
        assert_eq!(jobs[1].memory_mb, Some(2048));
    }

    #[test]
    fn slurm_durations() {
        assert_eq!(parse_duration("5"), Some(300));
        assert_eq!(parse_duration("4:05"), Some(245));
        assert_eq!(parse_duration("1:00:00"), Some(3600));
        assert_eq!(parse_duration("2-00:00:01"), Some(172_801));
        for bad in ["INVALID", "UNLIMITED", "", "1:2:3:4", "x-1"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }
}
