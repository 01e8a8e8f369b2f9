//! Code contexts: interpreters (Python, bash) a host or sandbox keeps
//! between runs, so that variables, imports and a shell's `cd` carry from
//! one run to the next, as in a notebook. The host's agent makes a context
//! on first use and its job daemon holds it, so a context outlives the
//! connection; this module checks a front end's request, sends it through
//! the sandbox's session (inside the sandbox, for `HOST/ID`), and installs
//! Python packages where the next run finds them.
//!
//! A run that outlasts the `wait_ms` its caller can wait answers `running`
//! and goes on; a later run with empty code collects it.
//!
//! [`create_run_close`] is the one-shot form: an isolated sandbox made for
//! one run and deleted after it, whatever happens to the call.

use std::sync::Arc;
use std::time::Duration;

use outpost_protocol::limits::MAX_CODE_CONTEXT_LEN;
use outpost_protocol::{
    CodeAction, CodeContextInfo, CodeExecution, CodeInstall, CodeLanguage, CodeRun, ErrorKind,
    ExecProgress, ExecResult, Isolation, Request, Response,
};

use super::jobs::{ask, unexpected};
use super::sandboxes::{self, CreateRequest, SandboxView, isolation_name};
use crate::fleet::Fleet;
use crate::session::{CallError, Session};

/// The context a run uses when its caller names none.
pub const DEFAULT_CONTEXT: &str = "default";
/// … and a bash run's (one context speaks one language).
pub const DEFAULT_BASH_CONTEXT: &str = "bash";

/// The context a run in `language` uses when its caller names none.
pub fn default_context(language: &str) -> &'static str {
    if language == "bash" {
        DEFAULT_BASH_CONTEXT
    } else {
        DEFAULT_CONTEXT
    }
}
/// A run's timeout when its caller gives none, in seconds (as `exec_bash`).
pub const DEFAULT_TIMEOUT_S: f64 = super::exec::DEFAULT_TIMEOUT_S;
/// A package install's timeout when its caller gives none, in seconds.
pub const DEFAULT_INSTALL_TIMEOUT_S: f64 = 600.0;
/// A one-shot sandbox's life, renewed every [`ONE_SHOT_RENEW_EVERY`] while
/// its run is awaited: one whose controller is gone ends within this long.
pub const ONE_SHOT_TTL_S: f64 = 60.0;
/// How often a one-shot sandbox is renewed: a third of its life, so that a
/// renew or two can be late or lost.
const ONE_SHOT_RENEW_EVERY: Duration = Duration::from_secs(20);
/// How long past the time a run should answer by the controller waits for
/// the agent before calling the connection dead (the agent interrupts at the
/// timeout, then restarts an interpreter that ignores it).
const ANSWER_SLACK: Duration = Duration::from_secs(30);

/// A run, as plain data from a front end; [`request`] checks it.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// Empty: collect the context's last run.
    pub code: String,
    /// `python` or `bash`.
    pub language: String,
    pub context: String,
    /// Seconds; None: no limit.
    pub timeout_s: Option<f64>,
    pub env: Vec<(String, String)>,
    /// Bytes kept per stream (head and tail).
    pub max_output: u64,
    /// Answer `running` after this long; 0: when the run ends.
    pub wait_ms: u64,
}

impl Default for RunRequest {
    fn default() -> Self {
        RunRequest {
            code: String::new(),
            language: "python".into(),
            context: DEFAULT_CONTEXT.into(),
            timeout_s: Some(DEFAULT_TIMEOUT_S),
            env: Vec::new(),
            max_output: super::exec::DEFAULT_MAX_OUTPUT as u64,
            wait_ms: 0,
        }
    }
}

pub fn parse_language(s: &str) -> Result<CodeLanguage, String> {
    match s {
        "python" => Ok(CodeLanguage::Python),
        "bash" => Ok(CodeLanguage::Bash),
        _ => Err(format!("language must be python or bash, got {s:?}")),
    }
}

/// A context name is `[A-Za-z0-9._-]`, 1 to 64 bytes.
pub fn check_context(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_CODE_CONTEXT_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "bad context name {name:?}: 1 to {MAX_CODE_CONTEXT_LEN} of A-Z a-z 0-9 . _ -"
        ))
    }
}

/// The agent's request for `r`, or what is wrong with it.
pub fn request(r: &RunRequest) -> Result<CodeRun, String> {
    check_context(&r.context)?;
    let language = parse_language(&r.language)?;
    let timeout_ms = match r.timeout_s {
        Some(t) if t > 0.0 && t.is_finite() => {
            (t * 1000.0).clamp(1.0, u64::MAX as f64 / 2.0) as u64
        }
        Some(t) => {
            return Err(format!(
                "timeout_s must be a positive number of seconds, got {t}"
            ));
        }
        None => 0,
    };
    for (name, _) in &r.env {
        super::exec::check_env_name(name)?;
    }
    Ok(CodeRun {
        context: r.context.clone(),
        language,
        code: r.code.clone(),
        env: r.env.clone(),
        timeout_ms,
        wait_ms: r.wait_ms,
        output_limit: r.max_output,
    })
}

/// The text the policy checks for a run: the code, preceded by the
/// caller's `env` as shell assignments.
pub fn policy_text(run: &CodeRun) -> String {
    let env = run.env.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    crate::policy::policy_text(env, &run.code)
}

/// Runs `req` in its context on `session` (made on first use), or with
/// empty code collects the context's last run.
pub async fn run(session: &Session, req: CodeRun) -> Result<CodeExecution, CallError> {
    // The agent answers by `wait_ms`, or at the timeout (plus its grace);
    // this deadline only guards against one that stops answering without
    // the heartbeat noticing. A collected run keeps the timeout it started
    // with, which this request does not know.
    let timeout_ms = if req.code.is_empty() {
        0
    } else {
        req.timeout_ms
    };
    let by = [req.wait_ms, timeout_ms]
        .into_iter()
        .filter(|&ms| ms > 0)
        .min();
    let answer = ask(session, Request::CodeRun(req));
    let answer = match by {
        Some(ms) => {
            let limit = Duration::from_millis(ms) + ANSWER_SLACK;
            tokio::time::timeout(limit, answer).await.map_err(|_| {
                CallError::ConnectionLost(format!(
                    "the agent did not answer the code run within {} s",
                    limit.as_secs()
                ))
            })?
        }
        None => answer.await,
    };
    match answer? {
        Response::CodeRan(execution) => Ok(execution),
        other => Err(unexpected("a code run", other)),
    }
}

/// The code contexts of `session`'s host or sandbox.
pub async fn contexts(session: &Session) -> Result<Vec<CodeContextInfo>, CallError> {
    contexts_of(
        ask(session, Request::CodeContexts).await?,
        "listing code contexts",
    )
}

/// Interrupts, restarts or removes `context`; answers the contexts after.
pub async fn control(
    session: &Session,
    context: &str,
    action: CodeAction,
) -> Result<Vec<CodeContextInfo>, CallError> {
    let request = Request::CodeControl {
        context: context.to_string(),
        action,
    };
    contexts_of(ask(session, request).await?, "a code context action")
}

/// Gives `context` a fresh interpreter for its next run. A context not
/// made yet is fresh already: nothing is sent for it.
pub async fn restart(session: &Session, context: &str) -> Result<(), CallError> {
    if contexts(session).await?.iter().any(|c| c.name == context) {
        control(session, context, CodeAction::Restart).await?;
    }
    Ok(())
}

fn contexts_of(response: Response, what: &str) -> Result<Vec<CodeContextInfo>, CallError> {
    match response {
        Response::CodeContexts(all) => Ok(all),
        other => Err(unexpected(what, other)),
    }
}

/// Parses an action's name as front ends take it.
pub fn parse_action(s: &str) -> Result<Option<CodeAction>, String> {
    match s {
        "list" => Ok(None),
        "interrupt" => Ok(Some(CodeAction::Interrupt)),
        "restart" => Ok(Some(CodeAction::Restart)),
        "remove" => Ok(Some(CodeAction::Remove)),
        _ => Err(format!(
            "action must be list, interrupt, restart or remove, got {s:?}"
        )),
    }
}

/// The agent's install request, or what is wrong with the packages.
pub fn install_request(
    packages: &[String],
    timeout_s: f64,
    max_output: u64,
) -> Result<CodeInstall, String> {
    if packages.is_empty() {
        return Err("packages is empty; name at least one (numpy, pandas==2.2)".into());
    }
    let mut kept = Vec::with_capacity(packages.len());
    for p in packages {
        let p = p.trim();
        check_package(p)?;
        kept.push(p.to_string());
    }
    if !(timeout_s > 0.0 && timeout_s.is_finite()) {
        return Err(format!(
            "timeout_s must be a positive number of seconds, got {timeout_s}"
        ));
    }
    Ok(CodeInstall {
        packages: kept,
        timeout_ms: Some((timeout_s * 1000.0).clamp(1.0, u64::MAX as f64 / 2.0) as u64),
        output_limit: max_output,
        progress_ms: None,
    })
}

/// A package as the index names it (PEP 508's name, extras and version
/// specifiers: `numpy`, `pandas==2.2`, `torch>=2,<3`, `ray[tune]~=2.9`),
/// and nothing else: an option would change what the installer does (an
/// index, a target dir), and a path, a URL (`name @ url`) or a marker
/// (`; …`) installs what no index vouches for.
pub fn check_package(p: &str) -> Result<(), String> {
    static PACKAGE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        let name = r"[A-Za-z0-9][A-Za-z0-9._-]*";
        regex::Regex::new(&format!(
            r"^{name}(?:\[ *{name}(?: *, *{name})* *\])?(?: *[<>=!~][<>=!~,.* A-Za-z0-9]*)?$"
        ))
        .expect("package pattern")
    });
    // pip takes a name that ends like an archive for a local file when one
    // exists (`x.whl` written there first); no index project is named so.
    const ARCHIVES: [&str; 12] = [
        ".whl",
        ".zip",
        ".tar",
        ".tar.gz",
        ".tgz",
        ".tar.bz2",
        ".tbz",
        ".tar.xz",
        ".txz",
        ".tlz",
        ".tar.lz",
        ".tar.lzma",
    ];
    let name = p
        .split(['[', '<', '>', '=', '!', '~', ' '])
        .next()
        .unwrap_or(p);
    let lower = name.to_ascii_lowercase();
    if PACKAGE.is_match(p) && !ARCHIVES.iter().any(|a| lower.ends_with(a)) {
        Ok(())
    } else {
        Err(format!(
            "package {p:?}: give a name from the package index, e.g. numpy or pandas==2.2 (no options, paths or URLs)"
        ))
    }
}

/// The command an install stands for, as the policy checks it.
pub fn install_policy_text(req: &CodeInstall) -> String {
    format!("pip install {}", req.packages.join(" "))
}

/// Installs Python packages where `session`'s code contexts find them;
/// `on_progress` sees the agent's reports when `req.progress_ms` is set.
/// A nonzero exit status means the install failed (its stderr says why).
pub async fn install(
    session: &Session,
    req: CodeInstall,
    on_progress: impl FnMut(ExecProgress),
) -> Result<ExecResult, CallError> {
    let timeout_ms = req.timeout_ms;
    session
        .exec_like(
            Request::CodeInstall(req),
            timeout_ms,
            |_, _| {},
            on_progress,
        )
        .await
}

/// How a [`create_run_close`] went, once its sandbox was made.
#[derive(Debug)]
pub struct OneShot {
    /// The sandbox as it was made (its expiry as last renewed).
    pub sandbox: SandboxView,
    pub result: Result<CodeExecution, CallError>,
    /// Why the sandbox could not be deleted (it still ends at its expiry).
    pub delete_error: Option<String>,
}

/// A fresh one-shot sandbox's id: `sbx-` and 12 random hex digits, in the
/// form the agent takes (`[a-z0-9][a-z0-9-]{0,31}`). Chosen here rather
/// than by the agent so that the delete can be armed before the create is
/// sent; 48 random bits make drawing a live sandbox's id unlikely enough.
pub fn one_shot_id() -> String {
    let mut bytes = [0u8; 6];
    let read = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    if read.is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let mixed = nanos ^ (u128::from(std::process::id()) << 64);
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (mixed >> (i * 8) ^ mixed >> (64 + i * 8)) as u8;
        }
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("sbx-{hex}")
}

/// Makes an isolated sandbox as `r` says (on `r.host`: pick it first with
/// [`sandboxes::pick_host`] to put the code to the policy of that host),
/// runs `run` in it to its end, and deletes it: also when the run fails,
/// and when the returned future is dropped (a cancelled call).
///
/// The sandbox lives [`ONE_SHOT_TTL_S`] and is renewed while the run is
/// awaited, so one whose delete never arrives (the controller killed, its
/// runtime gone) ends within a minute whatever the run's timeout. Its id is
/// chosen here and the delete armed before the create is sent, so a call
/// dropped mid-create leaves nothing either.
///
/// Where the host gives no isolation (no bubblewrap and no usable
/// Landlock) the sandbox is deleted unrun unless `r.isolation` asked for
/// `none`.
pub async fn create_run_close(
    fleet: &Fleet,
    mut r: CreateRequest,
    mut req: CodeRun,
) -> Result<OneShot, String> {
    if req.timeout_ms == 0 {
        return Err("a one-shot run needs a timeout".into());
    }
    if req.code.trim().is_empty() {
        return Err("code is empty".into());
    }
    // Nothing can collect the run later: the sandbox is gone by then.
    req.wait_ms = 0;
    r.ttl_s = ONE_SHOT_TTL_S;
    r.keep_files = false;
    let (host, _) = sandboxes::pick_host(fleet, &r.host, r.gpus).await?;
    if host.config.slurm.is_some() {
        return Err(format!(
            "{} is a Slurm cluster: a one-shot run waits for no queue; create_sandbox there, then execute_code in it",
            host.name()
        ));
    }
    let id = one_shot_id();
    let name = format!("{}/{id}", host.name());
    if fleet.names().contains(&name) {
        return Err(format!(
            "{name} was drawn, a configured sandbox's name; call again"
        ));
    }
    r.host = host.name().to_string();
    r.id = Some(id.clone());
    let spec = sandboxes::spec(&r, fleet.config.max_sandboxes_per_host)?;
    crate::ops::audit::note("one_shot_sandbox", serde_json::json!(name));
    let mut guard = DeleteOnDrop {
        fleet,
        armed: Some((host.clone(), id.clone())),
        name: name.clone(),
    };
    // Its life starts about when the create is sent; renew from then.
    let first_renew = tokio::time::Instant::now() + ONE_SHOT_RENEW_EVERY;
    let mut view = match ask(&host, Request::SandboxCreate(spec)).await {
        Ok(Response::Sandbox(info)) => SandboxView::of(host.name(), info),
        // The agent refused the request: it made nothing (and a sandbox of
        // that id, if one exists, is not ours to delete).
        Err(CallError::Agent(e)) if e.kind == ErrorKind::BadRequest => {
            guard.disarm();
            return Err(e.message);
        }
        // Made or not, nobody knows (the daemon may finish a create that
        // `serve` gave up waiting for): delete it to be sure.
        Err(e) => {
            guard.delete().await;
            return Err(e.to_string());
        }
        Ok(other) => {
            guard.delete().await;
            return Err(unexpected("creating a sandbox", other).to_string());
        }
    };
    if view.isolation == isolation_name(Isolation::None) && r.isolation != "none" {
        guard.delete().await;
        let why = view
            .note
            .as_deref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        return Err(format!(
            "{} gives no isolation{why}; pass isolation=\"none\" to run there anyway",
            host.name()
        ));
    }
    let result = match fleet.get(Some(&name)) {
        Ok(session) => {
            let run = run(&session, req);
            tokio::pin!(run);
            let mut renew = tokio::time::interval_at(first_renew, ONE_SHOT_RENEW_EVERY);
            renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    result = &mut run => break result,
                    _ = renew.tick() => {
                        let renewed = sandboxes::renew(fleet, &name, ONE_SHOT_TTL_S);
                        match tokio::time::timeout(ONE_SHOT_RENEW_EVERY, renewed).await {
                            Ok(Ok(renewed)) => view.expires_at = renewed.expires_at,
                            Ok(Err(e)) => tracing::warn!("cannot renew {name}: {e}"),
                            Err(_) => tracing::warn!("cannot renew {name}: no answer"),
                        }
                    }
                }
            }
        }
        Err(e) => Err(CallError::Protocol(e)),
    };
    let delete_error = guard.delete().await;
    Ok(OneShot {
        sandbox: view,
        result,
        delete_error,
    })
}

/// Deletes the sandbox of a one-shot call, and forgets its session: at
/// once with [`DeleteOnDrop::delete`], or when dropped still armed (a
/// cancelled call) in a task of its own, so that a cancelled call leaves
/// nothing running behind.
struct DeleteOnDrop<'a> {
    fleet: &'a Fleet,
    /// The host and id still to delete.
    armed: Option<(Arc<Session>, String)>,
    /// `HOST/ID`.
    name: String,
}

impl DeleteOnDrop<'_> {
    fn disarm(&mut self) {
        self.armed = None;
        self.fleet.forget(&self.name);
    }

    /// Deletes the sandbox now; why it could not be, if so. The guard stays
    /// armed until the answer: a call dropped meanwhile deletes it again,
    /// which is harmless.
    async fn delete(&mut self) -> Option<String> {
        let (host, id) = self.armed.clone()?;
        let deleted = ask(&host, Request::SandboxDelete { id }).await;
        self.disarm();
        match deleted {
            Ok(Response::Sandbox(_)) => None,
            Ok(other) => Some(unexpected("deleting a sandbox", other).to_string()),
            Err(e) => Some(e.to_string()),
        }
    }
}

impl Drop for DeleteOnDrop<'_> {
    fn drop(&mut self) {
        let Some((host, id)) = self.armed.take() else {
            return;
        };
        self.fleet.forget(&self.name);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                // The sandbox may never have been made (the call dropped
                // before the create arrived): then there is nothing to say.
                if let Err(e) = ask(&host, Request::SandboxDelete { id: id.clone() }).await {
                    tracing::debug!("deleting sandbox {}/{id}: {e}", host.name());
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_checked() {
        let ok = request(&RunRequest {
            code: "1 + 1".into(),
            timeout_s: Some(1.5),
            env: vec![("SEED".into(), "1".into())],
            wait_ms: 40_000,
            ..RunRequest::default()
        })
        .unwrap();
        assert_eq!(
            (ok.timeout_ms, ok.wait_ms, ok.output_limit),
            (1500, 40_000, 20_000)
        );
        assert_eq!(
            (ok.language, ok.context.as_str()),
            (CodeLanguage::Python, "default")
        );
        let err = |r: RunRequest| request(&r).unwrap_err();
        for context in ["", "a b", "x/y", &"c".repeat(65)] {
            let e = err(RunRequest {
                context: context.into(),
                ..RunRequest::default()
            });
            assert!(e.contains("context"), "{context}: {e}");
        }
        let e = err(RunRequest {
            language: "ruby".into(),
            ..RunRequest::default()
        });
        assert!(e.contains("python or bash"), "{e}");
        let unlimited = RunRequest {
            timeout_s: None,
            ..RunRequest::default()
        };
        assert_eq!(request(&unlimited).unwrap().timeout_ms, 0);
        for t in [0.0, -1.0, f64::NAN] {
            let e = err(RunRequest {
                timeout_s: Some(t),
                ..RunRequest::default()
            });
            assert!(e.contains("timeout_s"), "{e}");
        }
        let e = err(RunRequest {
            env: vec![("LD_PRELOAD".into(), "x".into())],
            ..RunRequest::default()
        });
        assert!(e.contains("env"), "{e}");
    }

    #[test]
    fn the_policy_sees_the_env_with_the_code() {
        let run = request(&RunRequest {
            code: "import os".into(),
            env: vec![("A".into(), "it's".into())],
            ..RunRequest::default()
        })
        .unwrap();
        assert_eq!(policy_text(&run), "A='it'\\''s' import os");
    }

    #[test]
    fn installs_take_specifiers_only() {
        let req = install_request(&[" numpy ".into(), "pandas==2.2".into()], 600.0, 100).unwrap();
        assert_eq!(req.packages, ["numpy", "pandas==2.2"]);
        assert_eq!(req.timeout_ms, Some(600_000));
        assert_eq!(install_policy_text(&req), "pip install numpy pandas==2.2");
        assert!(install_request(&[], 1.0, 0).unwrap_err().contains("empty"));
        for bad in [
            "",
            "--index-url=http://x",
            "-e .",
            "a\nb",
            ".",
            "./pkg",
            "../x.whl",
            "/tmp/x.whl",
            "pkg @ https://x/y.whl",
            "git+https://github.com/a/b",
            "file:x",
            "pkg; python_version>'3'",
            "C:\\x",
            "num py",
            "numpy pandas",
            "numpy[a b]",
            "numpy==1\t2",
            "numpy==1\u{a0}2",
            "x[y",
            "x.whl",
            "x.tar.gz",
            "Model.ZIP",
            "x.tgz==1",
        ] {
            let e = install_request(&[bad.into()], 1.0, 0).unwrap_err();
            assert!(
                e.starts_with("package ") && e.contains("no options, paths or URLs"),
                "{bad}: {e}"
            );
        }
        for good in [
            "numpy",
            "scikit-learn",
            "zope.interface",
            "pandas==2.2",
            "torch>=2,<3",
            "ray[tune]~=2.9",
            "ray[tune, serve] >= 2.9",
            "jax[cuda12]",
            "pkg==1.0rc1",
            "pkg==2.*",
            "pkg!=1.5",
            "pkg===1.0",
        ] {
            assert!(check_package(good).is_ok(), "{good}");
        }
        assert!(install_request(&["x".into()], 0.0, 0).is_err());
    }

    #[test]
    fn one_shot_ids_are_sandbox_ids() {
        let (a, b) = (one_shot_id(), one_shot_id());
        assert!(a.starts_with("sbx-") && a.len() == 16, "{a}");
        crate::config::check_sandbox_id(&a).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn actions_by_name() {
        assert_eq!(parse_action("list"), Ok(None));
        assert_eq!(parse_action("remove"), Ok(Some(CodeAction::Remove)));
        assert!(parse_action("kill").is_err());
    }
}
