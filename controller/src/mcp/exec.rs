//! `exec_bash`: one command on one sandbox, or the same command on several
//! (fan-out, identical outcomes grouped), run only once the config file's
//! policy allows it (`permit`, which asks the person through elicitation
//! where a confirm rule says so). The request and the exit status come from
//! [`crate::ops::exec`].
//!
//! A command whose timeout is longer than the client will wait for the call
//! ([`super::budget`]) runs inline like any other, but handed over as a job
//! ([`exec::run_within`]) if it still runs when the client's patience is
//! nearly spent: the call then answers with the job's name, the output so
//! far and the call that follows it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outpost_protocol::{ExecProgress, ExecRequest};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::RequestMetaObject;
use rmcp::{Json, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::OutpostServer;
use super::progress::{AGENT_EVERY_MS, Progress, Report};
use crate::ops::exec::Outcome;
use crate::ops::{exec, human_bytes};
use crate::policy::Planned;
use crate::session::CallError;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExecParams {
    pub command: String,
    #[schemars(extend("default" = "~"))]
    pub cwd: Option<String>,
    #[schemars(extend("default" = 120))]
    pub timeout_s: Option<f64>,
    /// Per stream: head and tail.
    #[schemars(extend("default" = 20000))]
    pub max_output_chars: Option<i64>,
    pub sandbox_name: Option<String>,
    /// Run on each (["all"]: all); like outputs grouped.
    pub sandboxes: Option<Vec<String>>,
    /// Sets CUDA_VISIBLE_DEVICES.
    pub gpu_lease: Option<String>,
    /// Default: the client's call limit.
    pub background_after_s: Option<f64>,
    pub env: Option<std::collections::BTreeMap<String, String>>,
    pub stdin: Option<String>,
}

#[derive(Debug, PartialEq, Serialize, JsonSchema)]
pub struct ExecOutput {
    /// Exit status; 124 on timeout, 128+N when killed by signal N, -1 when the
    /// connection failed. Absent while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Still running, as background job `job`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub running: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// The call that returns its end and the rest of its output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Set when the host could not be reached or the connection dropped; the
    /// command may not have run. Not retried automatically.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub connection_error: bool,
    /// In a group: the sandboxes that gave this outcome.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sandboxes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// host:port its sandbox's allow_hosts refused.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub egress_denied: Vec<String>,
    /// Ports it began listening on (expose_port serves them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub listening: Vec<u16>,
}

/// exec_bash's result: the single-sandbox fields, or with `sandboxes`, one
/// group per distinct outcome.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ExecReply {
    #[serde(flatten)]
    pub single: Option<ExecOutput>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "groups_schema")]
    pub groups: Option<Vec<ExecOutput>>,
}

/// A group is an exec result of its own (naming its `sandboxes`): the
/// schema says so by pointing at itself rather than repeating every field.
fn groups_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "array", "items": {"$ref": "#"}})
}

/// Builds the agent request for an `exec_bash` call, or says what is wrong.
fn exec_request(p: &ExecParams, stream: bool) -> Result<ExecRequest, String> {
    let mut req = exec::request(&exec::Command {
        command: &p.command,
        cwd: p.cwd.as_deref(),
        timeout_s: Some(p.timeout_s.unwrap_or(exec::DEFAULT_TIMEOUT_S)),
        max_output: p.max_output_chars.unwrap_or(exec::DEFAULT_MAX_OUTPUT),
        stream,
    })?;
    if let Some(env) = &p.env {
        for name in env.keys() {
            exec::check_env_name(name)?;
        }
        req.env
            .extend(env.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    req.stdin = p.stdin.as_ref().map(|s| s.clone().into_bytes());
    Ok(req)
}

/// The text the policy checks: the command, preceded by the caller's
/// `env` as shell assignments, so rules see every byte the caller chose.
/// What the policy checks of an exec on `sandbox`: its command, and its
/// stdin as data.
fn planned<'a>(sandbox: &'a str, command: &'a str, stdin: Option<&'a str>) -> Vec<Planned<'a>> {
    let stdin = stdin.filter(|s| !s.is_empty());
    std::iter::once(Planned::command(sandbox, "command", command))
        .chain(stdin.map(|text| Planned::data(sandbox, "stdin", text)))
        .collect()
}

fn policy_text(p: &ExecParams) -> String {
    let env = p.env.iter().flatten();
    crate::policy::policy_text(env.map(|(k, v)| (k.as_str(), v.as_str())), &p.command)
}

/// A progress notification from the agent's last report: seconds elapsed
/// (of the timeout), output so far and its last line.
/// A ticker reporting the latest [`ExecProgress`] an exec gave, and the slot
/// each one goes into as it arrives.
pub(super) fn exec_ticker(
    progress: &Progress,
    timeout_s: Option<f64>,
) -> (super::progress::Ticker, Arc<Mutex<Option<ExecProgress>>>) {
    let latest: Arc<Mutex<Option<ExecProgress>>> = Arc::default();
    let ticker = progress.every({
        let latest = latest.clone();
        move || {
            let seen = latest.lock().unwrap_or_else(|p| p.into_inner()).clone();
            async move { exec_report(seen, timeout_s) }
        }
    });
    (ticker, latest)
}

pub(super) fn exec_report(seen: Option<ExecProgress>, timeout_s: Option<f64>) -> Report {
    let Some(p) = seen else {
        return Report {
            done: 0.0,
            total: timeout_s,
            message: "started".into(),
        };
    };
    let elapsed = p.elapsed_ms as f64 / 1000.0;
    let so_far = format!(
        "{} lines, {}",
        p.lines,
        human_bytes(p.stdout_bytes + p.stderr_bytes)
    );
    running_report(elapsed, timeout_s, &so_far, &p.last_line)
}

/// `N s, <so far>: <last line>`, counting toward the timeout.
fn running_report(elapsed: f64, timeout_s: Option<f64>, so_far: &str, last_line: &str) -> Report {
    let mut message = format!("{elapsed:.0} s, {so_far}");
    if !last_line.is_empty() {
        message.push_str(": ");
        message.push_str(last_line);
    }
    Report {
        done: elapsed,
        total: timeout_s,
        message,
    }
}

impl ExecOutput {
    /// No outcome yet: every field empty or false.
    fn blank() -> ExecOutput {
        ExecOutput {
            exit_code: None,
            stdout: String::new(),
            stderr: String::new(),
            running: false,
            job: None,
            next: None,
            duration_s: None,
            timed_out: false,
            signal: None,
            connection_error: false,
            sandboxes: Vec::new(),
            note: None,
            egress_denied: Vec::new(),
            listening: Vec::new(),
        }
    }
}

/// Shapes an agent exec result for the `exec_bash` tool (without a
/// duration: fan-out groups compare outcomes).
fn exec_output(
    result: Result<outpost_protocol::ExecResult, CallError>,
) -> Result<ExecOutput, String> {
    let blank = ExecOutput::blank();
    match result {
        Ok(r) => Ok(ExecOutput {
            exit_code: Some(exec::shell_status(&r)),
            stdout: r.stdout.to_text(),
            stderr: r.stderr.to_text(),
            timed_out: r.timed_out,
            signal: if r.timed_out { None } else { r.signal },
            egress_denied: r.egress_denied,
            listening: r.listening,
            ..blank
        }),
        Err(e) if e.is_connection() => Ok(ExecOutput {
            exit_code: Some(-1),
            stderr: e.to_string(),
            connection_error: true,
            ..blank
        }),
        Err(e) => Err(e.to_string()),
    }
}

/// Shapes how a [`exec::run_within`] went.
fn outcome_output(outcome: Result<Outcome, CallError>) -> Result<ExecOutput, String> {
    let next = |job: &str| Some(format!("wait_background_task(name=\"{job}\")"));
    match outcome {
        Ok(Outcome::Done(r)) => {
            let duration_s = Some(r.duration_ms as f64 / 1000.0);
            Ok(ExecOutput {
                duration_s,
                ..exec_output(Ok(r))?
            })
        }
        Ok(Outcome::Inline { result, why }) => Ok(ExecOutput {
            note: Some(why),
            ..outcome_output(Ok(Outcome::Done(result)))?
        }),
        Ok(Outcome::Running { job, so_far }) => Ok(ExecOutput {
            exit_code: None,
            running: true,
            next: next(&job),
            job: Some(job),
            duration_s: Some(so_far.duration_ms as f64 / 1000.0),
            ..exec_output(Ok(so_far))?
        }),
        Ok(Outcome::Unknown { job, error }) => Ok(ExecOutput {
            exit_code: Some(-1),
            stderr: format!("{error}; the command may still run as background job {job}"),
            connection_error: error.is_connection(),
            next: next(&job),
            job: Some(job),
            ..ExecOutput::blank()
        }),
        Err(e) => exec_output(Err(e)),
    }
}

#[tool_router(router = exec_router, vis = "pub(super)")]
impl OutpostServer {
    #[tool(
        description = "Run bash; timeout_s kills its process tree. At the client's call limit it answers running and job, and runs on."
    )]
    async fn exec_bash(
        &self,
        Parameters(p): Parameters<ExecParams>,
        peer: rmcp::Peer<RoleServer>,
        meta: RequestMetaObject,
    ) -> Result<Json<ExecReply>, String> {
        // The client's clock started when it sent the call.
        let called = Instant::now();
        let progress = Progress::of(&peer, &meta);
        let mut req = exec_request(&p, false)?;
        let checked = policy_text(&p);
        let mut target = p.sandbox_name.clone();
        if let Some(id) = &p.gpu_lease {
            let (sandbox, devices) = self
                .fleet
                .with_lease(id, |h| (h.sandbox.clone(), h.cuda_visible_devices()))?;
            if target.as_ref().is_some_and(|t| *t != sandbox) || p.sandboxes.is_some() {
                return Err(format!("GPU lease {id} belongs to sandbox {sandbox}"));
            }
            target = Some(sandbox);
            req.env
                .push(("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()));
            req.env.push(("CUDA_VISIBLE_DEVICES".into(), devices));
        }
        Ok(Json(match &p.sandboxes {
            Some(names) => {
                let names = self.fan_out_names(names)?;
                let planned: Vec<Planned> = names
                    .iter()
                    .flat_map(|sandbox| planned(sandbox, &checked, p.stdin.as_deref()))
                    .collect();
                let checkpointed = self.permit(&planned).await?;
                let started = Instant::now();
                let count = names.len();
                let _ticker = progress.every(move || {
                    let elapsed = started.elapsed().as_secs_f64();
                    async move {
                        Report {
                            done: elapsed,
                            total: None,
                            message: format!("running on {count} sandboxes, {elapsed:.0} s"),
                        }
                    }
                });
                let groups = self.fan_out(&names, &req).await?;
                ExecReply {
                    single: None,
                    groups: Some(
                        groups
                            .into_iter()
                            .map(|g| ExecOutput {
                                note: checkpointed.added_to(g.note.clone()),
                                ..g
                            })
                            .collect(),
                    ),
                }
            }
            None => {
                let session = self.fleet.get(target.as_deref())?;
                let checkpointed = self
                    .permit(&planned(session.name(), &checked, p.stdin.as_deref()))
                    .await?;
                let timeout_s = req.timeout_ms.map(|ms| ms as f64 / 1000.0);
                let budget = self.call_budget(&peer, p.background_after_s)?;
                if let Some(budget) =
                    budget.filter(|b| timeout_s.is_none_or(|t| t > b.as_secs_f64()))
                {
                    let (_ticker, latest) = exec_ticker(&progress, timeout_s);
                    if progress.wanted() {
                        req.progress_ms = Some(AGENT_EVERY_MS);
                    }
                    let deadline = called + budget;
                    let outcome = exec::run_within(&session, req, deadline, |p| {
                        *latest.lock().unwrap_or_else(|p| p.into_inner()) = Some(p)
                    })
                    .await;
                    let output = outcome_output(outcome)?;
                    return Ok(Json(ExecReply {
                        single: Some(ExecOutput {
                            note: checkpointed.added_to(output.note.clone()),
                            ..output
                        }),
                        groups: None,
                    }));
                }
                let (_ticker, latest) = exec_ticker(&progress, timeout_s);
                if progress.wanted() {
                    req.progress_ms = Some(AGENT_EVERY_MS);
                }
                let result = session
                    .exec_watched(
                        req,
                        |_, _| {},
                        |p| *latest.lock().unwrap_or_else(|p| p.into_inner()) = Some(p),
                    )
                    .await;
                let duration_s = result.as_ref().ok().map(|r| r.duration_ms as f64 / 1000.0);
                let output = exec_output(result)?;
                ExecReply {
                    single: Some(ExecOutput {
                        duration_s,
                        note: checkpointed.added_to(output.note.clone()),
                        ..output
                    }),
                    groups: None,
                }
            }
        }))
    }
}

impl OutpostServer {
    /// How long this call may take before `exec_bash` answers with a job
    /// name: the call's `background_after_s`, else the client's budget. A
    /// call run as an MCP Task has none (the client polls for its result).
    pub(super) fn call_budget(
        &self,
        peer: &rmcp::Peer<RoleServer>,
        asked: Option<f64>,
    ) -> Result<Option<Duration>, String> {
        if let Some(s) = asked {
            if !(s > 0.0 && s.is_finite()) {
                return Err(format!(
                    "background_after_s must be a positive number of seconds, got {s}"
                ));
            }
            return Ok(Some(Duration::from_secs_f64(s)));
        }
        if super::task_slot::CURRENT_TASK.try_with(|_| ()).is_ok() {
            return Ok(None);
        }
        let client = super::budget::CLIENT_NAME
            .try_with(Clone::clone)
            .ok()
            .flatten()
            .or_else(|| peer.peer_info().map(|info| info.client_info.name.clone()));
        Ok(super::budget::of_client(
            &self.fleet.config.client_budgets,
            client.as_deref(),
        ))
    }

    /// The sandboxes a fan-out names (`["all"]`: every one).
    fn fan_out_names(&self, names: &[String]) -> Result<Vec<String>, String> {
        let names: Vec<String> = if names.iter().any(|n| n == "all") {
            self.fleet.names()
        } else {
            for n in names {
                self.fleet.get(Some(n))?;
            }
            names.to_vec()
        };
        if names.is_empty() {
            return Err("sandboxes is empty; name sandboxes or use [\"all\"]".into());
        }
        Ok(names)
    }

    /// Runs on several sandboxes and groups identical outcomes.
    async fn fan_out(
        &self,
        names: &[String],
        req: &ExecRequest,
    ) -> Result<Vec<ExecOutput>, String> {
        let outputs = self
            .fleet
            .exec_many(names, req)
            .await
            .into_iter()
            .map(|(name, result)| Ok((name, exec_output(result)?)))
            .collect::<Result<Vec<_>, String>>()?;
        Ok(exec::group_outcomes(outputs)
            .into_iter()
            .map(|(sandboxes, output)| ExecOutput {
                sandboxes,
                ..output
            })
            .collect())
    }

    /// Whether the config file's policy lets these commands run: refused
    /// outright by a deny rule or a missing allow rule; with a confirm rule,
    /// only once the person says yes through MCP elicitation. A client that
    /// cannot ask its user gets a refusal; nothing a tool call passes can
    /// approve a command.
    pub(super) async fn permit(&self, planned: &[Planned<'_>]) -> Result<Checkpointed, String> {
        self.permit_as(planned, "outpost exec").await
    }

    /// [`Self::permit`], naming `cli`, the command a person can run instead
    /// where the client cannot ask. Once they may run, the checkpoints the
    /// policy asks for are made.
    pub(super) async fn permit_as(
        &self,
        planned: &[Planned<'_>],
        cli: &str,
    ) -> Result<Checkpointed, String> {
        self.confirm(planned, cli).await?;
        self.checkpoint_first(planned).await
    }

    /// A checkpoint of each isolated sandbox where a planned command
    /// matches a `checkpoint` rule; an error (and nothing runs) when one
    /// cannot be made.
    async fn checkpoint_first(&self, planned: &[Planned<'_>]) -> Result<Checkpointed, String> {
        let mut made = Checkpointed::default();
        for p in planned.iter().filter(|p| !p.data) {
            if made
                .0
                .iter()
                .any(|c| c.starts_with(&format!("{}@", p.sandbox)))
            {
                continue;
            }
            if let Some(checkpoint) =
                crate::ops::checkpoints::before_command(&self.fleet, p).await?
            {
                made.0.push(checkpoint);
            }
        }
        Ok(made)
    }

    /// Asks the person about commands a confirm rule matches; refuses what
    /// the policy refuses.
    async fn confirm(&self, planned: &[Planned<'_>], cli: &str) -> Result<(), String> {
        use super::ask::{Answer, Person};
        let policy = &self.fleet.policy;
        let pending = policy
            .review(planned)
            .map_err(|refusal| refusal.to_string())?;
        if pending.is_empty() {
            return Ok(());
        }
        let refuse = |why: &str| Err(crate::policy::not_confirmed(&pending, why));
        let Some(person) = Person::current() else {
            return refuse(&format!(
                "this MCP client cannot ask the user here (no elicitation; over 2026-07-28, \
                 elicitation and MCP Tasks both); the user can run it with `{cli}`"
            ));
        };
        let question = crate::policy::confirm_question(&pending, policy, "An agent");
        let timeout = policy.confirm_timeout;
        match person.ask::<Approval>(question, timeout).await {
            Answer::Given(Approval { approve: true }) => {
                let rules: Vec<&str> = pending.iter().map(|p| p.rule.as_str()).collect();
                crate::ops::audit::note(
                    "confirmed",
                    serde_json::json!({"by": "elicitation", "rules": rules}),
                );
                Ok(())
            }
            Answer::Given(_) | Answer::Declined => refuse("the user declined"),
            Answer::Dismissed => refuse("the user dismissed the question"),
            Answer::TimedOut => refuse(&format!("no answer came within {} s", timeout.as_secs())),
            Answer::Failed(e) => refuse(&format!("asking the user failed: {e}")),
        }
    }
}

/// The checkpoints a policy rule had made before the commands ran.
#[derive(Debug, Default)]
pub(super) struct Checkpointed(Vec<String>);

impl Checkpointed {
    /// For the result: which checkpoint undoes the command.
    fn note(&self) -> Option<String> {
        (!self.0.is_empty()).then(|| {
            format!(
                "checkpoint {} made first (policy); restore_checkpoint undoes this",
                self.0.join(", ")
            )
        })
    }

    /// `note` with this one's added.
    fn added_to(&self, note: Option<String>) -> Option<String> {
        match (note, self.note()) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b),
        }
    }
}

/// The person's answer to a confirm rule's question.
#[derive(Debug, Deserialize, JsonSchema)]
struct Approval {
    /// Run the command(s) shown.
    approve: bool,
}

rmcp::elicit_safe!(Approval);

#[cfg(test)]
mod tests {
    use super::*;

    fn params(env: &[(&str, &str)]) -> ExecParams {
        let env: serde_json::Map<String, serde_json::Value> = env
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
            .collect();
        serde_json::from_value(serde_json::json!({"command": "make", "env": env})).unwrap()
    }

    #[test]
    fn env_names_that_run_code_are_refused() {
        for name in [
            "BASH_ENV",
            "LD_PRELOAD",
            "PS4",
            "BASH_FUNC_make%%",
            "A-B",
            "1X",
            "",
        ] {
            let err = exec_request(&params(&[(name, "x")]), false).unwrap_err();
            assert!(err.contains("env"), "{name}: {err}");
        }
        let req = exec_request(&params(&[("CFLAGS", "-O2"), ("_X1", "y")]), false).unwrap();
        assert!(req.env.contains(&("CFLAGS".into(), "-O2".into())));
    }

    #[test]
    fn the_policy_sees_the_env_with_the_command() {
        assert_eq!(policy_text(&params(&[])), "make");
        assert_eq!(
            policy_text(&params(&[("MAKEFLAGS", "it's -j8")])),
            "MAKEFLAGS='it'\\''s -j8' make"
        );
    }
}
