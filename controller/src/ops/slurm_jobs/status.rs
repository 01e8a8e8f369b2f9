//! Batch jobs' status: one login-node command answers for any number of
//! jobs (`squeue` for what `slurmctld` still holds, the job files for the rest).

use super::*;

/// How the ids to report are chosen.
pub(super) enum Select<'a> {
    /// These jobs.
    Ids(&'a [u64]),
    /// This user's Outpost batch jobs (live ones from `squeue`, ended ones
    /// from their files), the newest `limit`.
    Newest(u32),
}

/// The one command that reports on the jobs `select` picks. Prints
/// `N|<count>` (lists: jobs there are), then one `Q|id|STATE|reason|time|
/// limit` line per job `slurmctld` still holds, then one
/// `X|id|ours|exit|submitted|STATE|ExitCode|reason|command` line per job
/// from its files. A job that ended otherwise than by its command's exit
/// has its end kept in `<id>.state` the first time it is seen here
/// (`scontrol` for its `ExitCode`), so it outlives `MinJobAge`.
pub(super) fn status_script(select: Select<'_>) -> String {
    let mut s = String::new();
    let (ids, list) = match select {
        Select::Ids(ids) => (
            format!(
                "ids={}\n",
                shell_quote(&ids.iter().map(u64::to_string).collect::<Vec<_>>().join(" "))
            ),
            false,
        ),
        Select::Newest(limit) => {
            let limit = if limit == 0 {
                LIST_MAX
            } else {
                limit.min(LIST_MAX)
            };
            (
                format!(
                    "live=$(squeue -h -u \"$(id -un)\" -n {JOB_NAME} -o %i) || exit 3\n\
                     all=$( {{ printf '%s\\n' \"$live\"; [ -d \"$d\" ] && cd \"$d\" && for f in *.cmd; do [[ $f =~ ^[0-9]+\\.cmd$ ]] && echo \"${{f%.cmd}}\"; done; }} | grep -E '^[0-9]+$' | sort -nu )\n\
                     echo \"N|$(printf '%s\\n' \"$all\" | grep -c .)\"\n\
                     ids=$(printf '%s\\n' \"$all\" | tail -n {limit})\n"
                ),
                true,
            )
        }
    };
    if list {
        s.push_str("command -v squeue >/dev/null 2>&1 || exit 0\n");
    } else {
        s.push_str("command -v squeue >/dev/null 2>&1 || { echo 'no squeue on this host: not a Slurm login node' >&2; exit 3; }\n");
    }
    s.push_str(&format!("d={DIR_WORD}\n"));
    s.push_str(&ids);
    s.push_str("set -f\n");
    let live = LIVE_STATES.join("|");
    let read_cmd = if list {
        "{ read -r t; read -r cm; } < \"$f.cmd\""
    } else {
        ":"
    };
    s.push_str(&format!(
        r#"set -- $ids
[ $# -gt 0 ] || exit 0
jl=$(printf '%s,' "$@"); jl=${{jl%,}}
# The first id twice: squeue fails on one id it no longer knows.
q=$(squeue -h -t all -u "$(id -un)" -n {JOB_NAME} -j "$jl,$1" -o '%i|%T|%r|%M|%l') || exit 3
declare -A st
while IFS='|' read -r i s r m l; do
  [ -n "$i" ] || continue
  st[$i]="$s|$r"
  printf 'Q|%s|%s|%s|%s|%s\n' "$i" "$s" "$r" "$m" "$l"
done <<< "$q"
for i in "$@"; do
  f="$d/$i"; e=; k=; c=0; t=; cm=
  {{ read -r e < "$f.exit"; }} 2>/dev/null
  {{ read -r k < "$f.state"; }} 2>/dev/null
  if [ -e "$f.cmd" ]; then
    c=1
    {read_cmd}
    if [ -z "$k" ] && [ -n "${{st[$i]}}" ]; then
      s=${{st[$i]%%|*}}
      case $s in
        {live}) ;;
        COMPLETED|FAILED) [ -n "$e" ] || k=keep ;;
        *) k=keep ;;
      esac
      if [ "$k" = keep ]; then
        j=$(scontrol -o show job "$i" 2>/dev/null); x=
        case $j in *' ExitCode='*) x=${{j#*' ExitCode='}}; x=${{x%% *}} ;; esac
        k="$s|$x|${{st[$i]#*|}}"
        printf '%s\n' "$k" > "$f.state"
      fi
    fi
  fi
  printf 'X|%s|%s|%s|%s|%s|%s\n' "$i" "$c" "$e" "$t" "${{k:-||}}" "$cm"
done
"#
    ));
    s
}

/// What the status command said about one job, before it is mapped.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Report {
    /// From `squeue`: state, reason, time used, time limit.
    queue: Option<(String, String, String, String)>,
    /// Its files are ours (`<id>.cmd` exists).
    ours: bool,
    exit: Option<i32>,
    /// From `<id>.state`: state, ExitCode, reason.
    kept: Option<(String, String, String)>,
    submitted_unix: Option<u64>,
    command: Option<String>,
}

pub(super) fn nonempty(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// Parses [`status_script`]'s output: the count it reported (lists) and
/// each job's report, in the order of the `X` lines.
pub(super) fn parse_reports(out: &str) -> (Option<u64>, Vec<(u64, Report)>) {
    let mut count = None;
    let mut queue = std::collections::HashMap::new();
    let mut reports: Vec<(u64, Report)> = Vec::new();
    for line in out.lines() {
        if let Some(n) = line.strip_prefix("N|") {
            count = n.trim().parse().ok();
        } else if let Some(rest) = line.strip_prefix("Q|") {
            let f: Vec<&str> = rest.splitn(5, '|').collect();
            if let [id, state, reason, used, limit] = f[..]
                && let Ok(id) = id.parse::<u64>()
            {
                queue.insert(
                    id,
                    (
                        state.trim().to_string(),
                        reason.trim().to_string(),
                        used.trim().to_string(),
                        limit.trim().to_string(),
                    ),
                );
            }
        } else if let Some(rest) = line.strip_prefix("X|") {
            let f: Vec<&str> = rest.splitn(8, '|').collect();
            if f.len() != 8 {
                continue;
            }
            let Ok(id) = f[0].parse::<u64>() else {
                continue;
            };
            let kept = nonempty(f[4])
                .map(|state| (state, f[5].trim().to_string(), f[6].trim().to_string()));
            reports.push((
                id,
                Report {
                    queue: None,
                    ours: f[1] == "1",
                    exit: f[2].trim().parse().ok(),
                    kept,
                    submitted_unix: f[3].trim().parse().ok(),
                    command: nonempty(f[7]),
                },
            ));
        }
    }
    for (id, report) in &mut reports {
        report.queue = queue.remove(id);
    }
    (count, reports)
}

/// Slurm's `ExitCode=N:S`: the batch script's exit code and the signal
/// that ended it.
pub(super) fn parse_exit_code(text: &str) -> (Option<i32>, Option<i32>) {
    let Some((code, sig)) = text.trim().split_once(':') else {
        return (text.trim().parse().ok(), None);
    };
    (code.parse().ok(), sig.parse().ok().filter(|s| *s > 0))
}

pub(super) fn reason_detail(reason: &str) -> Option<String> {
    let r = reason.trim().trim_start_matches('(').trim_end_matches(')');
    (!r.is_empty() && r != "None" && r != "NonZeroExitCode").then(|| r.to_string())
}

/// An ended job's status from Slurm's final `state` (`CANCELLED by 0` is
/// `CANCELLED`), its `ExitCode` (may be empty), its reason, and the exit
/// file's status, which is exact when present.
pub(super) fn ended(
    state: &str,
    exit_code: &str,
    reason: &str,
    exit: Option<i32>,
) -> (BatchState, Option<i32>, Option<i32>, Option<String>) {
    let state = state.split_whitespace().next().unwrap_or("");
    match state {
        "COMPLETED" | "FAILED" => match exit {
            Some(code) => (BatchState::Exited, Some(code), None, None),
            None => {
                let (code, signal) = parse_exit_code(exit_code);
                let detail = reason_detail(reason);
                match (code, signal) {
                    (_, Some(sig)) => (BatchState::Exited, None, Some(sig), detail),
                    (Some(code), None) => (BatchState::Exited, Some(code), None, detail),
                    (None, None) => (
                        BatchState::Failed,
                        None,
                        None,
                        Some(detail.unwrap_or_else(|| state.to_string())),
                    ),
                }
            }
        },
        "CANCELLED" => (BatchState::Cancelled, None, None, None),
        "TIMEOUT" => (BatchState::Timeout, None, None, None),
        "OUT_OF_MEMORY" => (BatchState::OutOfMemory, None, None, None),
        // NODE_FAIL, BOOT_FAIL, PREEMPTED, DEADLINE, and any other end.
        other => (BatchState::Failed, None, None, Some(other.to_string())),
    }
}

/// Maps one job's report to Outpost's state; None when the job is neither
/// in Slurm nor among this user's batch files.
pub(super) fn map_report(job: u64, r: &Report) -> Option<BatchStatus> {
    let mut status = BatchStatus {
        job,
        state: BatchState::Lost,
        exit_code: None,
        signal: None,
        detail: None,
        elapsed: None,
        limit: None,
        submitted_unix: r.submitted_unix,
        command: r.command.clone(),
    };
    if let Some((_, _, used, limit)) = &r.queue {
        status.elapsed = nonempty(used);
        status.limit = nonempty(limit);
    }
    // A kept end is a past job's when Slurm runs one under this id now.
    let queued_live = r.queue.as_ref().is_some_and(|(state, ..)| {
        state == "PENDING" || state.starts_with("REQUEUE") || LIVE_STATES.contains(&state.as_str())
    });
    let kept = r.kept.as_ref().filter(|_| !queued_live);
    let (state, exit_code, signal, detail) = if let Some((state, code, reason)) = kept {
        ended(state, code, reason, r.exit)
    } else if let Some((state, reason, _, _)) = &r.queue {
        match state.as_str() {
            "PENDING" => (BatchState::Pending, None, None, reason_detail(reason)),
            "REQUEUED" | "REQUEUE_FED" | "REQUEUE_HOLD" | "RESV_DEL_HOLD" => {
                (BatchState::Pending, None, None, Some(state.clone()))
            }
            "SUSPENDED" | "STOPPED" => (BatchState::Running, None, None, Some(state.clone())),
            // The command has ended and said how; Slurm is cleaning up.
            "COMPLETING" if r.exit.is_some() => (BatchState::Exited, r.exit, None, None),
            s if LIVE_STATES.contains(&s) => (BatchState::Running, None, None, None),
            s => ended(s, "", reason, r.exit),
        }
    } else if let Some(code) = r.exit {
        (BatchState::Exited, Some(code), None, None)
    } else if r.ours {
        (
            BatchState::Lost,
            None,
            None,
            Some("Slurm no longer knows it; no exit status".into()),
        )
    } else {
        return None;
    };
    status.state = state;
    status.exit_code = exit_code;
    status.signal = signal;
    status.detail = detail;
    Some(status)
}

/// The status of each of `ids` (in that order; a job unknown here is left
/// out), in one command on the login node.
pub async fn statuses(session: &Session, ids: &[u64]) -> Result<Vec<BatchStatus>, String> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let out = run(session, &status_script(Select::Ids(ids)))
        .await
        .map_err(|e| format!("Slurm status on {}: {e}", session.name()))?;
    let (_, reports) = parse_reports(&out);
    Ok(reports
        .iter()
        .filter_map(|(id, r)| map_report(*id, r))
        .collect())
}

/// The status of one job, or why there is none.
pub async fn status(session: &Session, job: u64) -> Result<BatchStatus, String> {
    statuses(session, &[job])
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| unknown(session, job))
}

pub(super) fn unknown(session: &Session, job: u64) -> String {
    format!(
        "no Slurm batch task {} on {} (not an Outpost batch job of this user)",
        task_name(job),
        session.name()
    )
}

/// This user's newest `limit` (0: many) Outpost batch jobs, oldest first,
/// and how many older ones were left out; nothing when the host has no
/// Slurm.
pub async fn list(session: &Session, limit: u32) -> Result<(Vec<BatchStatus>, u64), String> {
    if session.isolated_in().is_some() {
        return Ok((Vec::new(), 0));
    }
    let out = run(session, &status_script(Select::Newest(limit)))
        .await
        .map_err(|e| format!("Slurm jobs on {}: {e}", session.name()))?;
    let (count, reports) = parse_reports(&out);
    let jobs: Vec<BatchStatus> = reports
        .iter()
        .filter_map(|(id, r)| map_report(*id, r))
        .collect();
    let omitted = count.unwrap_or(0).saturating_sub(reports.len() as u64);
    Ok((jobs, omitted))
}
