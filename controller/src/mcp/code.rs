//! The code tools: `execute_code` (a run in a context that keeps its state
//! between calls, as a notebook's cell), `install_package` (into the Python
//! those contexts use), `create_run_close` (one run in an isolated sandbox
//! made for it and deleted after it), and, with the advanced tools,
//! `code_contexts`. The work is [`crate::ops::code`]'s.
//!
//! A run's result is built by hand rather than as structured output: its
//! first content block is compact JSON (empty fields left out), and each
//! image a run displayed follows as an image block, named in the JSON as
//! `[image N]`, so that a client shows it and the model sees it (one a
//! client could not show is left out, and the JSON says why). Text values
//! are cut to what `exec_bash` keeps of a stream.
//!
//! A run that outlasts what the client waits for a call ([`super::budget`])
//! answers `running` with the call that collects it, as `exec_bash` answers
//! with a job.
//!
//! Policy: code cannot be matched whole against allow patterns, so where a
//! sandbox has any, these tools are refused; elsewhere deny and confirm
//! patterns apply to the code's text (and to `pip install <packages>`)
//! through the same `permit` as `exec_bash`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use outpost_protocol::{CodeContextInfo, CodeExecution, ExecResult};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, RequestMetaObject};
use rmcp::{Json, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize, Serializer};

use super::OutpostServer;
use super::exec::exec_ticker;
use super::progress::{AGENT_EVERY_MS, Progress, Report, Ticker};
use crate::ops::code::{self, RunRequest};
use crate::ops::exec::{DEFAULT_MAX_OUTPUT, shell_status};
use crate::ops::jobs::utc_time;
use crate::ops::sandboxes::{self, CreateRequest};
use crate::policy::Planned;
use crate::session::CallError;

/// What a call keeps of the client's patience for its answer to travel back.
const ANSWER_MARGIN: Duration = Duration::from_secs(2);
/// What a one-shot run leaves of the client's patience besides: the
/// interrupt at its timeout, and deleting the sandbox.
const ONE_SHOT_MARGIN: Duration = Duration::from_secs(8);
/// Below this much of the client's patience left (or half of it, for a
/// client that waits less than twice this), an install or a one-shot run is
/// not started: it would be stopped before it could do anything.
const MIN_LEFT: Duration = Duration::from_secs(10);
/// Each stream's last bytes a failed install answers with.
const INSTALL_TAIL: usize = 3000;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExecuteParams {
    /// "": collect a run that answered running.
    pub code: String,
    #[schemars(extend("enum" = ["python", "bash"], "default" = "python"))]
    pub language: Option<String>,
    /// Default: "default" (bash: "bash").
    pub context: Option<String>,
    pub sandbox_name: Option<String>,
    #[schemars(extend("default" = 120))]
    pub timeout_s: Option<f64>,
    pub env: Option<BTreeMap<String, String>>,
    /// Fresh interpreter first.
    #[serde(default)]
    pub restart: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct InstallParams {
    pub packages: Vec<String>,
    pub sandbox_name: Option<String>,
    #[schemars(extend("default" = 600))]
    pub timeout_s: Option<f64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct OneShotParams {
    pub code: String,
    #[schemars(extend("enum" = ["python", "bash"], "default" = "python"))]
    pub language: Option<String>,
    #[schemars(extend("default" = "auto"))]
    pub host: Option<String>,
    #[schemars(extend("default" = 120))]
    pub timeout_s: Option<f64>,
    #[schemars(extend("enum" = ["auto", "bwrap", "landlock", "none"], "default" = "auto"))]
    pub isolation: Option<String>,
    #[schemars(extend("default" = true))]
    pub network: Option<bool>,
    pub gpus: Option<u32>,
    pub env: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ContextsParams {
    pub sandbox_name: Option<String>,
    #[schemars(extend("enum" = ["list", "interrupt", "restart", "remove"], "default" = "list"))]
    pub action: Option<String>,
    /// The one to act on.
    pub context: Option<String>,
}

/// `code_contexts`' answer: the contexts after the action.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ContextsReply {
    pub contexts: Vec<ContextRow>,
}

#[derive(Debug, PartialEq, Serialize, JsonSchema)]
pub struct ContextRow {
    pub name: String,
    pub language: String,
    /// idle, running, or stopped (no interpreter until its next run).
    pub state: String,
    pub execution_count: u32,
    /// Resident memory of the interpreter and its children.
    pub rss_mb: u64,
    /// UTC.
    pub last_used: String,
}

impl From<CodeContextInfo> for ContextRow {
    fn from(c: CodeContextInfo) -> Self {
        ContextRow {
            name: c.name,
            language: c.language.name().into(),
            state: c.state,
            execution_count: c.execution_count,
            rss_mb: c.rss_bytes.div_ceil(1 << 20),
            last_used: utc_time(c.last_used_ms / 1000),
        }
    }
}

/// A run as the model reads it; empty fields are left out.
#[derive(Debug, Default, Serialize)]
struct RunView {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    results: Vec<Bundle>,
    #[serde(skip_serializing_if = "String::is_empty")]
    stdout: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    stderr: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ErrorView>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    timed_out: bool,
    /// Why the interpreter was restarted (its state is gone).
    #[serde(skip_serializing_if = "Option::is_none")]
    restarted: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    running: bool,
    #[serde(skip_serializing_if = "is_zero")]
    execution_count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_s: Option<f64>,
    /// The call that collects a run still going.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
    /// A one-shot run's sandbox: what isolated it.
    #[serde(skip_serializing_if = "Option::is_none")]
    isolation: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Debug, Serialize)]
struct ErrorView {
    name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    value: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    traceback: String,
}

/// One displayed value: MIME type → data, in the order the agent sent them.
#[derive(Debug)]
struct Bundle(Vec<(String, String)>);

impl Serialize for Bundle {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

/// Image types a client can show from base64 data.
const IMAGE_TYPES: &[&str] = &["image/png", "image/jpeg", "image/gif", "image/webp"];
/// Each text value of a result (a repr, HTML, SVG, JSON, an error's
/// traceback) is cut to this many bytes, head and tail, as `exec_bash`
/// cuts each stream by default.
const MAX_VALUE: usize = DEFAULT_MAX_OUTPUT as usize;
/// The largest image passed on, decoded: a client may refuse the whole
/// result for a larger one, and the model pays for every pixel.
const MAX_IMAGE_BYTES: usize = 4 << 20;
/// … and its widest side, in pixels.
const MAX_IMAGE_SIDE: u32 = 8000;

/// A run as the model reads it, and the image blocks its JSON names.
fn run_view(
    exec: CodeExecution,
    next: Option<String>,
    note: Option<String>,
) -> (RunView, Vec<ContentBlock>) {
    let mut images = Vec::new();
    let mut seen = 0;
    let results = exec
        .results
        .into_iter()
        .map(|result| bundle(result.data, &mut images, &mut seen))
        .collect();
    let view = RunView {
        results,
        stdout: exec.stdout.to_text(),
        stderr: exec.stderr.to_text(),
        error: exec.error.map(|e| ErrorView {
            name: e.name,
            value: head_tail(&e.value, MAX_VALUE),
            traceback: head_tail(&e.traceback, MAX_VALUE),
        }),
        timed_out: exec.timed_out,
        restarted: exec.restarted,
        running: exec.running,
        execution_count: exec.execution_count,
        duration_s: (!exec.running).then_some(exec.duration_ms as f64 / 1000.0),
        next: next.filter(|_| exec.running),
        note,
        ..RunView::default()
    };
    (view, images)
}

/// The tool result for a run: its JSON, then each image it displayed as an
/// image block (named `[image N]` in the JSON; see [`bundle`]).
fn run_result(exec: CodeExecution, next: Option<String>, note: Option<String>) -> CallToolResult {
    let (view, images) = run_view(exec, next, note);
    view_result(&view, images)
}

fn view_result(view: &RunView, mut images: Vec<ContentBlock>) -> CallToolResult {
    let text = serde_json::to_string(view).unwrap_or_default();
    let mut content = vec![ContentBlock::text(text)];
    content.append(&mut images);
    CallToolResult::success(content)
}

/// One displayed value as the model reads it, its images moved to
/// `images` and named `[image N]` (N counting every image of the run), or
/// where one cannot be shown, `[image N left out: why]`.
///
/// Of the forms of one value, those that say nothing more cost the model
/// for nothing: HTML beside a real `text/plain` (a DataFrame's table) is
/// left out, as is SVG beside a PNG or a real `text/plain`. But a
/// `text/plain` that is only Python's default repr (`<… object at 0x…>`,
/// as an IPython `HTML` object or a `df.style` has) is left out instead of
/// the HTML that is the value. Every other value is cut to [`MAX_VALUE`].
fn bundle(data: Vec<(String, String)>, images: &mut Vec<ContentBlock>, seen: &mut usize) -> Bundle {
    let plain = data
        .iter()
        .find(|(mime, _)| mime == "text/plain")
        .map(|(_, text)| text.as_str());
    let default_plain = plain.is_some_and(is_default_repr);
    let real_plain = plain.is_some() && !default_plain;
    let has = |wanted: &str| data.iter().any(|(mime, _)| mime == wanted);
    let (has_html, has_png) = (has("text/html"), has("image/png"));
    let kept = data
        .into_iter()
        .filter(|(mime, _)| match mime.as_str() {
            "text/html" => !real_plain,
            "text/plain" => !(default_plain && has_html),
            "image/svg+xml" => !(has_png || real_plain),
            _ => true,
        })
        .map(|(mime, data)| {
            if !IMAGE_TYPES.contains(&mime.as_str()) {
                let data = head_tail(&data, MAX_VALUE);
                return (mime, data);
            }
            *seen += 1;
            match check_image(&mime, &data) {
                Ok(clean) => {
                    images.push(ContentBlock::image(clean, mime.clone()));
                    (mime, format!("[image {seen}]"))
                }
                Err(why) => (mime, format!("[image {seen} left out: {why}]")),
            }
        })
        .collect();
    Bundle(kept)
}

/// Whether `plain` is Python's default repr, which names the object's type
/// and nothing of its value: `<IPython.core.display.HTML object>`,
/// `<pandas.io.formats.style.Styler object at 0x7f…>`.
fn is_default_repr(plain: &str) -> bool {
    static DEFAULT: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"^<[^>]* object( at 0x[0-9a-fA-F]+)?>$").expect("default repr")
    });
    DEFAULT.is_match(plain.trim())
}

/// `text` cut to about `max` bytes: its head and its tail (on character
/// boundaries), and between them how many bytes were left out, marked as
/// a stream's output is.
fn head_tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut head_end = max / 2;
    while !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = text.len() - max / 2;
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    format!(
        "{}\n[… {} bytes omitted …]\n{}",
        &text[..head_end],
        tail_start - head_end,
        &text[tail_start..]
    )
}

/// An image's base64 as a client can show it (without the line breaks
/// some encoders add), or why it is left out: not valid base64, bytes that
/// are not of its MIME type, over [`MAX_IMAGE_BYTES`] or
/// [`MAX_IMAGE_SIDE`]. A client shown a broken or huge image may fail the
/// whole result, and the model would lose the rest of it.
fn check_image(mime: &str, data: &str) -> Result<String, String> {
    let clean: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let kind = mime.trim_start_matches("image/").to_uppercase();
    let too_big = || format!("over {} MiB", MAX_IMAGE_BYTES >> 20);
    // Known from the length, before decoding anything that large.
    if clean.len() / 4 * 3 > MAX_IMAGE_BYTES + 3 {
        return Err(too_big());
    }
    let bytes = BASE64
        .decode(&clean)
        .map_err(|_| format!("not valid base64 for a {kind}"))?;
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(too_big());
    }
    match image_size(mime, &bytes) {
        None => Err(format!("not a valid {kind}")),
        Some(Some((w, h))) if w == 0 || h == 0 => Err(format!("not a valid {kind}")),
        Some(Some((w, h))) if w > MAX_IMAGE_SIDE || h > MAX_IMAGE_SIDE => {
            Err(format!("{w}x{h} px, over {MAX_IMAGE_SIDE} px a side"))
        }
        Some(_) => Ok(clean),
    }
}

/// None: `bytes` do not start as a `mime` image does. Else its width and
/// height where its header says them plainly (for a JPEG, its first
/// frame's; a WebP's from its first chunk).
fn image_size(mime: &str, bytes: &[u8]) -> Option<Option<(u32, u32)>> {
    let be16 = |at: usize| {
        Some(u32::from(u16::from_be_bytes(
            bytes.get(at..at + 2)?.try_into().ok()?,
        )))
    };
    let le16 = |at: usize| {
        Some(u32::from(u16::from_le_bytes(
            bytes.get(at..at + 2)?.try_into().ok()?,
        )))
    };
    let le24 = |at: usize| {
        let b = bytes.get(at..at + 3)?;
        Some(u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16)
    };
    match mime {
        "image/png" => {
            if !bytes.starts_with(b"\x89PNG\r\n\x1a\n") || bytes.get(12..16)? != b"IHDR" {
                return None;
            }
            let be32 =
                |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap_or_default());
            (bytes.len() >= 24).then(|| Some((be32(16), be32(20))))
        }
        "image/gif" => {
            if !(bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a")) {
                return None;
            }
            Some(Some((le16(6)?, le16(8)?)))
        }
        "image/jpeg" => {
            if !bytes.starts_with(b"\xff\xd8\xff") {
                return None;
            }
            // The segments up to the first frame header (SOF0 to SOF15,
            // less DHT, JPG and DAC, which share the range).
            let mut at = 2;
            while bytes.get(at) == Some(&0xff) {
                let Some(&marker) = bytes.get(at + 1) else {
                    break;
                };
                match marker {
                    0xff => at += 1,
                    0x01 | 0xd0..=0xd7 => at += 2,
                    0xc0..=0xcf if !matches!(marker, 0xc4 | 0xc8 | 0xcc) => {
                        return Some(be16(at + 7).zip(be16(at + 5)));
                    }
                    _ => at += 2 + be16(at + 2).unwrap_or(0) as usize,
                }
            }
            Some(None)
        }
        "image/webp" => {
            if bytes.get(0..4)? != b"RIFF" || bytes.get(8..12)? != b"WEBP" {
                return None;
            }
            Some(match bytes.get(12..16)? {
                b"VP8X" => le24(24).zip(le24(27)).map(|(w, h)| (w + 1, h + 1)),
                b"VP8L" => bytes.get(21..25).map(|b| {
                    let bits = u32::from_le_bytes(b.try_into().unwrap_or_default());
                    ((bits & 0x3fff) + 1, (bits >> 14 & 0x3fff) + 1)
                }),
                b"VP8 " => le16(26)
                    .zip(le16(28))
                    .map(|(w, h)| (w & 0x3fff, h & 0x3fff)),
                _ => None,
            })
        }
        _ => None,
    }
}

/// The answer to a restart asked with no code to run.
fn restarted_result(context: &str) -> CallToolResult {
    let view = RunView {
        restarted: Some(format!("as asked: context {context} starts afresh")),
        ..RunView::default()
    };
    view_result(&view, Vec::new())
}

/// The call that collects a run still going in `context` on `sandbox`.
fn collect_call(context: &str, sandbox: &str) -> String {
    format!("execute_code(code=\"\", context=\"{context}\", sandbox_name=\"{sandbox}\")")
}

/// Why a run failed, and for a connection lost mid-run, that it may go on
/// (its context is held by the host's daemon) and how to collect it.
fn run_error(e: CallError, collect: Option<String>) -> String {
    match collect {
        Some(call) if matches!(e, CallError::ConnectionLost(_)) => {
            format!("{e}; the run may go on: {call} collects it")
        }
        _ => e.to_string(),
    }
}

/// `text`'s last `max` bytes or so, from a line start where one is near.
fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let rest = &text[start..];
    let rest = match rest.find('\n') {
        Some(i) if i + 1 < rest.len() => &rest[i + 1..],
        _ => rest,
    };
    format!("[…]\n{rest}")
}

/// How an install went, as the model reads it: the status and duration,
/// and only when it failed each stream's tail.
#[derive(Debug, Serialize)]
struct InstallView {
    exit_code: i32,
    duration_s: f64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    timed_out: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    stdout: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    stderr: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

fn install_result(r: ExecResult, note: Option<String>) -> CallToolResult {
    let exit_code = shell_status(&r);
    let failed = exit_code != 0;
    let streams = |c: &outpost_protocol::CapturedOutput| {
        if failed {
            tail(&c.to_text(), INSTALL_TAIL)
        } else {
            String::new()
        }
    };
    let view = InstallView {
        exit_code,
        duration_s: r.duration_ms as f64 / 1000.0,
        timed_out: r.timed_out,
        stdout: streams(&r.stdout),
        stderr: streams(&r.stderr),
        note: note.filter(|_| r.timed_out),
    };
    let content = vec![ContentBlock::text(
        serde_json::to_string(&view).unwrap_or_default(),
    )];
    if failed {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    }
}

/// Refuses to start what cannot be collected later (an install, a
/// one-shot run) once the call has spent nearly all of `budget`, the
/// client's patience since `called`: most likely in the confirmation
/// dialog. A new call gets the whole budget again.
fn enough_left(called: Instant, budget: Duration) -> Result<(), String> {
    let left = (called + budget).saturating_duration_since(Instant::now());
    if left < MIN_LEFT.min(budget / 2) {
        return Err("the confirmation used this call's time; call again".into());
    }
    Ok(())
}

/// The caller's `env` as the agent takes it.
fn env_pairs(env: Option<BTreeMap<String, String>>) -> Vec<(String, String)> {
    env.unwrap_or_default().into_iter().collect()
}

/// A ticker reporting the seconds a run has taken (the agent reports no
/// progress of a run, and some clients keep a call alive while it comes).
fn seconds_ticker(progress: &Progress, timeout_s: f64, what: &'static str) -> Ticker {
    let started = Instant::now();
    progress.every(move || {
        let elapsed = started.elapsed().as_secs_f64();
        async move {
            Report {
                done: elapsed,
                total: Some(timeout_s),
                message: format!("{what}, {elapsed:.0} s"),
            }
        }
    })
}

#[tool_router(router = code_router, vis = "pub(super)")]
impl OutpostServer {
    #[tool(
        description = "Python or bash in a context that keeps its state, like a notebook; figures come back as images."
    )]
    async fn execute_code(
        &self,
        Parameters(p): Parameters<ExecuteParams>,
        peer: rmcp::Peer<RoleServer>,
        meta: RequestMetaObject,
    ) -> Result<CallToolResult, String> {
        // The client's clock started when it sent the call.
        let called = Instant::now();
        let progress = Progress::of(&peer, &meta);
        let session = self.fleet.get(p.sandbox_name.as_deref())?;
        let language = p.language.unwrap_or_else(|| "python".into());
        let mut req = code::request(&RunRequest {
            code: p.code,
            context: p
                .context
                .unwrap_or_else(|| code::default_context(&language).into()),
            language,
            timeout_s: Some(p.timeout_s.unwrap_or(code::DEFAULT_TIMEOUT_S)),
            env: env_pairs(p.env),
            max_output: DEFAULT_MAX_OUTPUT as u64,
            wait_ms: 0,
        })?;
        // Empty code only collects what was checked when it started.
        if !req.code.is_empty() {
            self.permit_code(session.name(), &code::policy_text(&req))
                .await?;
        }
        let budget = self.call_budget(&peer, None)?;
        let _ticker = seconds_ticker(&progress, req.timeout_ms as f64 / 1000.0, "running");
        if p.restart {
            code::restart(&session, &req.context)
                .await
                .map_err(|e| e.to_string())?;
            // A restart alone: there is no run to collect.
            if req.code.is_empty() {
                return Ok(restarted_result(&req.context));
            }
        }
        if let Some(budget) = budget {
            let left = (called + budget)
                .saturating_duration_since(Instant::now())
                .saturating_sub(ANSWER_MARGIN);
            req.wait_ms = (left.as_millis() as u64).max(1);
        }
        let collect = collect_call(&req.context, session.name());
        let started_code = !req.code.is_empty();
        match code::run(&session, req).await {
            Ok(exec) => Ok(run_result(exec, Some(collect), None)),
            Err(e) => Err(run_error(e, started_code.then_some(collect))),
        }
    }

    #[tool(description = "pip install for execute_code's Python on that sandbox.")]
    async fn install_package(
        &self,
        Parameters(p): Parameters<InstallParams>,
        peer: rmcp::Peer<RoleServer>,
        meta: RequestMetaObject,
    ) -> Result<CallToolResult, String> {
        let called = Instant::now();
        let progress = Progress::of(&peer, &meta);
        let session = self.fleet.get(p.sandbox_name.as_deref())?;
        let timeout_s = p.timeout_s.unwrap_or(code::DEFAULT_INSTALL_TIMEOUT_S);
        let mut req = code::install_request(&p.packages, timeout_s, DEFAULT_MAX_OUTPUT as u64)?;
        let text = code::install_policy_text(&req);
        let planned = Planned::command(session.name(), "command", &text);
        self.permit_unmatchable(planned, "a package install", "outpost install-package")
            .await?;
        // An install cannot be left running and collected later: past the
        // client's patience it is stopped, and says why.
        let mut note = None;
        if let Some(budget) = self.call_budget(&peer, None)? {
            enough_left(called, budget)?;
            let left = (called + budget)
                .saturating_duration_since(Instant::now())
                .saturating_sub(ANSWER_MARGIN);
            let left_ms = (left.as_millis() as u64).max(1000);
            if req.timeout_ms.is_some_and(|t| t > left_ms) {
                req.timeout_ms = Some(left_ms);
                note = Some(format!(
                    "stopped at this client's call limit ({:.0} s); install fewer packages per call, or ask the user to raise it ([client_budget_s] in the Outpost config)",
                    budget.as_secs_f64()
                ));
            }
        }
        let timeout_s = req.timeout_ms.map(|ms| ms as f64 / 1000.0);
        let (_ticker, latest) = exec_ticker(&progress, timeout_s);
        if progress.wanted() {
            req.progress_ms = Some(AGENT_EVERY_MS);
        }
        let result = code::install(&session, req, |p| {
            *latest.lock().unwrap_or_else(|p| p.into_inner()) = Some(p)
        })
        .await
        .map_err(|e| e.to_string())?;
        Ok(install_result(result, note))
    }

    #[tool(
        description = "Run code once in a new isolated sandbox, deleted after. Result as execute_code's."
    )]
    async fn create_run_close(
        &self,
        Parameters(p): Parameters<OneShotParams>,
        peer: rmcp::Peer<RoleServer>,
        meta: RequestMetaObject,
    ) -> Result<CallToolResult, String> {
        let called = Instant::now();
        let progress = Progress::of(&peer, &meta);
        let defaults = CreateRequest::default();
        let mut create = CreateRequest {
            host: p.host.filter(|h| !h.is_empty()).unwrap_or(defaults.host),
            isolation: p.isolation.unwrap_or(defaults.isolation),
            network: p.network.unwrap_or(defaults.network),
            gpus: p.gpus.unwrap_or(defaults.gpus),
            ..defaults
        };
        let mut req = code::request(&RunRequest {
            code: p.code,
            language: p.language.unwrap_or_else(|| "python".into()),
            timeout_s: Some(p.timeout_s.unwrap_or(code::DEFAULT_TIMEOUT_S)),
            env: env_pairs(p.env),
            ..RunRequest::default()
        })?;
        if req.code.trim().is_empty() {
            return Err("code is empty".into());
        }
        sandboxes::parse_isolation(&create.isolation)?;
        // The sandbox will be under its host's rules: ask them first.
        let (host, _) = sandboxes::pick_host(&self.fleet, &create.host, create.gpus).await?;
        create.host = host.name().to_string();
        self.permit_code(host.name(), &code::policy_text(&req))
            .await?;
        // Nothing can collect this run later: it must end within the
        // client's patience.
        let mut note = None;
        if let Some(budget) = self.call_budget(&peer, None)? {
            enough_left(called, budget)?;
            let left = (called + budget)
                .saturating_duration_since(Instant::now())
                .saturating_sub(ONE_SHOT_MARGIN);
            let left_ms = (left.as_millis() as u64).max(1000);
            if req.timeout_ms > left_ms {
                req.timeout_ms = left_ms;
                note = Some(format!(
                    "timeout_s cut to {:.0}: this client waits {:.0} s for a call; use create_sandbox and execute_code for longer runs",
                    left_ms as f64 / 1000.0,
                    budget.as_secs_f64()
                ));
            }
        }
        let _ticker = seconds_ticker(&progress, req.timeout_ms as f64 / 1000.0, "running");
        let shot = code::create_run_close(&self.fleet, create, req).await?;
        let kept = shot.delete_error.map(|e| {
            format!(
                "{} could not be deleted ({e}); it ends at its expiry, {}",
                shot.sandbox.sandbox_name, shot.sandbox.expires_at
            )
        });
        match shot.result {
            Ok(exec) => {
                // What isolated the run, and what that isolation lacks.
                let notes: Vec<String> = [note.filter(|_| exec.timed_out), shot.sandbox.note, kept]
                    .into_iter()
                    .flatten()
                    .collect();
                let note = (!notes.is_empty()).then(|| notes.join("; "));
                let (mut view, images) = run_view(exec, None, note);
                view.isolation = Some(shot.sandbox.isolation);
                Ok(view_result(&view, images))
            }
            Err(e) => Err(match kept {
                Some(kept) => format!("{e}; {kept}"),
                None => e.to_string(),
            }),
        }
    }
}

#[tool_router(router = code_contexts_router, vis = "pub(super)")]
impl OutpostServer {
    #[tool(description = "List a sandbox's code contexts, or interrupt, restart or remove one.")]
    async fn code_contexts(
        &self,
        Parameters(p): Parameters<ContextsParams>,
    ) -> Result<Json<ContextsReply>, String> {
        let session = self.fleet.get(p.sandbox_name.as_deref())?;
        let action = code::parse_action(p.action.as_deref().unwrap_or("list"))?;
        let all = match action {
            None => code::contexts(&session).await,
            Some(action) => {
                let context = p
                    .context
                    .ok_or("context is required for interrupt, restart and remove")?;
                code::check_context(&context)?;
                code::control(&session, &context, action).await
            }
        };
        let all = all.map_err(|e| e.to_string())?;
        Ok(Json(ContextsReply {
            contexts: all.into_iter().map(ContextRow::from).collect(),
        }))
    }
}

impl OutpostServer {
    /// The policy for what `planned` runs (code, or a package install:
    /// `what`): refused where allow rules list what may run on its
    /// sandbox, else deny and confirm rules on its text, as for a command.
    /// `cli` is the command a person can run it with instead.
    pub(super) async fn permit_unmatchable(
        &self,
        planned: Planned<'_>,
        what: &'static str,
        cli: &str,
    ) -> Result<(), String> {
        self.fleet
            .policy
            .check_unmatchable(planned.sandbox, planned.field, what)
            .map_err(|refusal| refusal.to_string())?;
        self.permit_as(&[planned], cli).await.map(drop)
    }

    /// [`Self::permit_unmatchable`] for code on `sandbox`.
    async fn permit_code(&self, sandbox: &str, text: &str) -> Result<(), String> {
        let planned = Planned::command(sandbox, "code", text);
        self.permit_unmatchable(planned, "code", "outpost code")
            .await
    }
}

#[cfg(test)]
mod tests;
