//! The audit log: one JSON line per MCP tool call, appended to
//! `$OUTPOST_HOME/audit.jsonl`.
//!
//! Each line holds the time (UTC, RFC 3339), the MCP client's name, the tool,
//! the sandbox (the `sandbox_name` argument, the fan-out list, or the active
//! sandbox), a digest of the arguments, the outcome (`ok`, `tool_error`,
//! `refused`, `error`, `cancelled`), the error's first line and the duration.
//! The digest never holds file contents (a `content` becomes its length and a
//! BLAKE3 prefix) nor secrets (arguments named like passwords, tokens or keys
//! are redacted, and so are `NAME_TOKEN=…`, `--password …`, `Authorization:`
//! values and URL passwords inside strings); long strings are cut.
//!
//! Lines are written with one `write` on an `O_APPEND` descriptor, so servers
//! sharing the file interleave whole lines. The file (mode 0600) is rotated by
//! size under `flock`: `audit.jsonl` → `audit.jsonl.1` → … → `audit.jsonl.N`.
//! A failure to write is logged to stderr and never fails the call.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

pub const FILE_NAME: &str = "audit.jsonl";
/// Size at which the log is rotated.
pub const MAX_BYTES: u64 = 10 << 20;
/// Rotated files kept (`audit.jsonl.1` … `.KEEP`).
pub const KEEP: u32 = 3;

/// Longest string kept in a digest, in bytes.
const MAX_STRING: usize = 200;
/// Longest command kept in a digest.
const MAX_COMMAND: usize = 1000;
/// Longest error message kept.
const MAX_ERROR: usize = 300;
/// Array items kept in a digest.
const MAX_ITEMS: usize = 20;
/// Nesting kept in a digest.
const MAX_DEPTH: usize = 4;

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// UTC, RFC 3339 with milliseconds.
    pub time: String,
    /// The MCP client's name from `initialize` (`clientInfo.name`).
    pub client: String,
    /// Over HTTP with an OAuth access token: who signed in, and through
    /// which OAuth client (its registered name and id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth_client: Option<String>,
    pub tool: String,
    /// A sandbox name, or a list of them for a fan-out.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub sandbox: Value,
    /// The arguments without contents or secrets; long strings cut.
    pub args: Value,
    /// ok, tool_error, refused, error or cancelled.
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: u64,
    /// What the tool added: e.g. `confirmed` when the user approved.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub notes: Map<String, Value>,
}

/// The log file and its rotation limits.
#[derive(Debug, Clone)]
pub struct AuditLog {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
}

impl AuditLog {
    /// `audit.jsonl` under `home` (`$OUTPOST_HOME`).
    pub fn new(home: &Path) -> AuditLog {
        AuditLog::with_limits(home.join(FILE_NAME), MAX_BYTES, KEEP)
    }

    pub fn with_limits(path: PathBuf, max_bytes: u64, keep: u32) -> AuditLog {
        AuditLog {
            path,
            max_bytes,
            keep: keep.max(1),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn rotated(&self, n: u32) -> PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    }

    /// Appends `record`; on failure says so on stderr (the call goes on).
    pub fn record(&self, record: &Record) {
        if let Err(e) = self.append(record) {
            tracing::error!(
                "cannot write the audit log {}: {e} (tool {}, outcome {})",
                self.path.display(),
                record.tool,
                record.outcome
            );
        }
    }

    /// Appends one line, rotating first when the file is full.
    pub fn append(&self, record: &Record) -> io::Result<()> {
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        // Another process may rotate between our open and our lock: then the
        // path names a new file and we open again.
        for _ in 0..8 {
            let file = OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .open(&self.path)?;
            let _lock = Flock::exclusive(&file)?;
            let meta = file.metadata()?;
            match std::fs::metadata(&self.path) {
                Ok(now) if now.dev() == meta.dev() && now.ino() == meta.ino() => {}
                _ => continue,
            }
            if meta.mode() & 0o077 != 0 {
                file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            }
            if meta.len() > 0 && meta.len() + line.len() as u64 > self.max_bytes {
                self.rotate()?;
                continue;
            }
            // One write on an O_APPEND descriptor: a whole line or an error.
            return (&file).write_all(&line);
        }
        Err(io::Error::other("the log kept being rotated under us"))
    }

    /// `audit.jsonl.{N-1}` → `.N`, …, `audit.jsonl` → `.1` (the lock on the
    /// current file is held).
    fn rotate(&self) -> io::Result<()> {
        for n in (1..self.keep).rev() {
            match std::fs::rename(self.rotated(n), self.rotated(n + 1)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        std::fs::rename(&self.path, self.rotated(1))
    }

    /// The last `n` lines, oldest first, reaching into rotated files when the
    /// current one holds fewer.
    pub fn tail(&self, n: usize) -> io::Result<Vec<String>> {
        let mut lines: Vec<String> = Vec::new();
        for index in 0..=self.keep {
            if lines.len() >= n {
                break;
            }
            let path = if index == 0 {
                self.path.clone()
            } else {
                self.rotated(index)
            };
            let text = match std::fs::read(&path) {
                Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let mut older: Vec<String> = text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_string)
                .collect();
            let want = n - lines.len();
            if older.len() > want {
                older.drain(..older.len() - want);
            }
            older.append(&mut lines);
            lines = older;
        }
        Ok(lines)
    }
}

/// An exclusive `flock` held until dropped.
pub(crate) struct Flock<'a>(&'a File);

impl<'a> Flock<'a> {
    pub(crate) fn exclusive(file: &'a File) -> io::Result<Flock<'a>> {
        use std::os::fd::AsRawFd;
        loop {
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Flock(file));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: as above.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Now, UTC, RFC 3339 with milliseconds.
pub fn now_rfc3339() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let seconds = crate::ops::jobs::utc_time(now.as_secs());
    format!(
        "{}.{:03}Z",
        seconds.trim_end_matches('Z'),
        now.subsec_millis()
    )
}

// ---------------------------------------------------------------------------
// Argument digests

/// Arguments whose value is a secret: redacted whatever it is.
fn is_secret_name(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "passphrase",
        "token",
        "secret",
        "credential",
        "apikey",
        "api_key",
        "private_key",
        "cookie",
    ]
    .iter()
    .any(|w| k.contains(w))
        || k == "key"
        || k.ends_with("_key")
        || k.ends_with("-key")
}

/// Arguments whose value is data (a file's content): length and hash only.
fn is_content_name(key: &str) -> bool {
    matches!(
        key.to_ascii_lowercase().as_str(),
        "content" | "contents" | "data" | "stdin" | "body"
    )
}

/// Commands, and code for an interpreter (`execute_code`): what ran, kept
/// longer than other strings.
fn is_command_name(key: &str) -> bool {
    key == "command" || key == "code" || key.ends_with("_command")
}

/// A digest of a tool's arguments: no contents, no secrets, short strings.
pub fn digest(args: Option<&Map<String, Value>>) -> Value {
    match args {
        Some(map) => digest_object(map, 0),
        None => Value::Object(Map::new()),
    }
}

fn digest_object(map: &Map<String, Value>, depth: usize) -> Value {
    Value::Object(
        map.iter()
            .map(|(k, v)| (k.clone(), digest_value(Some(k), v, depth + 1)))
            .collect(),
    )
}

fn digest_value(key: Option<&str>, value: &Value, depth: usize) -> Value {
    if let Some(key) = key {
        if is_secret_name(key) && !is_empty(value) {
            return json!("[redacted]");
        }
        if is_content_name(key) && !is_empty(value) {
            return match value {
                Value::String(s) => json!({
                    "len": s.len(),
                    "blake3": blake3::hash(s.as_bytes()).to_hex()[..16].to_string(),
                }),
                _ => json!("[omitted]"),
            };
        }
    }
    match value {
        Value::String(s) => {
            let max = if key.is_some_and(is_command_name) {
                MAX_COMMAND
            } else {
                MAX_STRING
            };
            Value::String(truncate(&scrub(s), max))
        }
        Value::Array(items) if depth > MAX_DEPTH => json!(format!("[{} items]", items.len())),
        Value::Object(map) if depth > MAX_DEPTH => json!(format!("{{{} keys}}", map.len())),
        Value::Array(items) => {
            let mut out: Vec<Value> = items
                .iter()
                .take(MAX_ITEMS)
                .map(|v| digest_value(key, v, depth + 1))
                .collect();
            if items.len() > MAX_ITEMS {
                out.push(json!(format!("… {} more", items.len() - MAX_ITEMS)));
            }
            Value::Array(out)
        }
        Value::Object(map) => digest_object(map, depth),
        other => other.clone(),
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

/// `s` cut to at most `max` bytes (on a character boundary), with how much
/// was cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[+{} bytes]", &s[..end], s.len() - end)
}

/// Secrets written inline in a command, code or any other string,
/// redacted: the values of `NAME_TOKEN=…`-style assignments (also quoted or
/// subscripted, and as a dict's or a YAML key's `"api_key": …`),
/// `--password …`-style options, `Authorization:` headers (quoted too, as in
/// a Python dict), passwords in URLs, and tokens whose shape gives them
/// away wherever they stand (`sk-…`, `hf_…`, `ghp_…`, `AKIA…`, `xoxb-…`).
/// Best effort: a secret in a form none of these recognise stays.
pub fn scrub(text: &str) -> String {
    static RULES: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
        let words = r"(?:PASSWORD|PASSWD|PASSPHRASE|TOKEN|SECRET|CREDENTIALS?|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|AUTH)";
        let value = r#"(?:"[^"]*"|'[^']*'|[^\s'";&|]+)"#;
        [
            // A header, quoted or not: `{"Authorization": "Bearer …"}`,
            // `Authorization=Bearer …`. First, so that the rules for
            // names below do not take `Bearer` for the value.
            (
                r#"(?i)(authorization["']?[ \t]*[:=][ \t]*["']?(?:(?:bearer|basic|token)\s+)?)[^\s'"]+"#
                    .to_string(),
                "${1}[redacted]",
            ),
            (
                format!(r"(?i)(\b[A-Z0-9_]*{words}[A-Z0-9_]*\s*=\s*){value}"),
                "${1}[redacted]",
            ),
            (
                format!(
                    r"(?i)(--?[a-z0-9-]*(?:password|passwd|passphrase|token|secret|api-?key|access-?key)(?:=|\s+)){value}"
                ),
                "${1}[redacted]",
            ),
            (
                format!(r"(?i)(authorization:\s*(?:(?:bearer|basic|token)\s+)?){value}"),
                "${1}[redacted]",
            ),
            // Python and JSON spellings: `os.environ["HF_TOKEN"] = …`,
            // `{"api_key": …}`. On one line only: `for token in tokens:`
            // ends a line, and the next one is code, not a secret.
            (
                format!(r#"(?i)(["']?\b\w*{words}\w*["']?[ \t]*\]?[ \t]*[:=][ \t]*){value}"#),
                "${1}[redacted]",
            ),
            // Short names: `DB_PASS=`, `MYSQL_PWD=`, `GITHUB_PAT=`, `pw=`
            // (a bare `PWD=` is the working directory, a bare `PAT=` no
            // secret: those two only with a prefix).
            (
                format!(
                    r"(?i)(\b(?:(?:[a-z0-9]+_)*(?:pass|pw)|(?:[a-z0-9]+_)+(?:pwd|pat))\s*=\s*){value}"
                ),
                "${1}[redacted]",
            ),
            // Passwords on the command line of tools that take them so:
            // `mysql -pX`, `sshpass -p X`, `curl -u user:X`.
            (
                r#"(\bmysql(?:dump|admin|import|show|check)?\b[^|;&\n]*?\s-p)[^\s'";&|]+"#
                    .to_string(),
                "${1}[redacted]",
            ),
            (
                format!(r"(\bsshpass\b[^|;&\n]*?\s-p\s*){value}"),
                "${1}[redacted]",
            ),
            (
                r#"(\s(?:-u|--user)(?:\s+|=)["']?[^\s:'"]+:)[^\s'"]+"#.to_string(),
                "${1}[redacted]",
            ),
            (r"(://[^/\s:@]+:)[^@\s/]+@".to_string(), "${1}[redacted]@"),
            // Tokens known by their shape: OpenAI and Anthropic, Hugging
            // Face, GitHub, AWS access key ids, Slack.
            (r"\bsk-[A-Za-z0-9_-]{16,}".to_string(), "[redacted]"),
            (r"\bhf_[A-Za-z0-9]{16,}".to_string(), "[redacted]"),
            (r"\bgh[pousr]_[A-Za-z0-9]{20,}".to_string(), "[redacted]"),
            (r"\bAKIA[0-9A-Z]{16}\b".to_string(), "[redacted]"),
            (r"\bxox[abpr]-[A-Za-z0-9-]{10,}".to_string(), "[redacted]"),
        ]
        .into_iter()
        .map(|(pattern, with)| (Regex::new(&pattern).expect("audit scrub pattern"), with))
        .collect()
    });
    let mut out = std::borrow::Cow::Borrowed(text);
    for (regex, with) in RULES.iter() {
        if regex.is_match(&out) {
            out = std::borrow::Cow::Owned(regex.replace_all(&out, *with).into_owned());
        }
    }
    out.into_owned()
}

/// The sandbox a call names: `sandbox_name`, else the `sandboxes` fan-out
/// list, else the active sandbox.
pub fn sandbox_of(args: Option<&Map<String, Value>>, active: impl FnOnce() -> String) -> Value {
    let given = |key: &str| args.and_then(|a| a.get(key));
    if let Some(Value::String(name)) = given("sandbox_name")
        && !name.trim().is_empty()
    {
        return json!(truncate(name, MAX_STRING));
    }
    if let Some(Value::Array(names)) = given("sandboxes") {
        return digest_value(None, &Value::Array(names.clone()), 1);
    }
    json!(active())
}

/// An error message as kept: its first line, scrubbed, cut.
pub fn short_error(text: &str) -> String {
    let first = text.trim().lines().next().unwrap_or("");
    truncate(&scrub(first), MAX_ERROR)
}

// ---------------------------------------------------------------------------
// Notes a tool adds to its own line

tokio::task_local! {
    static NOTES: Mutex<Map<String, Value>>;
}

/// Adds `key: value` to the audit line of the tool call running in this task
/// (nothing outside one).
pub fn note(key: &str, value: Value) {
    let _ = NOTES.try_with(|notes| {
        notes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string(), value)
    });
}

/// A call being audited: written when [`Call::finish`]ed, or as `cancelled`
/// when dropped first (the client cancelled, the server is going away).
pub struct Call {
    log: AuditLog,
    record: Option<Record>,
    started: Instant,
}

impl Call {
    pub fn begin(
        log: &AuditLog,
        client: String,
        tool: String,
        sandbox: Value,
        args: Value,
    ) -> Call {
        Call {
            log: log.clone(),
            record: Some(Record {
                time: now_rfc3339(),
                client,
                subject: None,
                oauth_client: None,
                tool,
                sandbox,
                args,
                outcome: "cancelled".into(),
                error: None,
                duration_ms: 0,
                notes: Map::new(),
            }),
            started: Instant::now(),
        }
    }

    /// Records the OAuth subject and client the call came through.
    pub fn signed_in(mut self, subject: &str, client: &str) -> Call {
        if let Some(record) = self.record.as_mut() {
            record.subject = Some(subject.to_string());
            record.oauth_client = Some(client.to_string());
        }
        self
    }

    /// Runs `call` with a place for its notes, then writes the line with
    /// the outcome `classify` reads from its result (`ok`, `tool_error`,
    /// `refused`, `error`, …, and the error's first line).
    pub async fn run<T, F>(
        mut self,
        call: F,
        classify: impl FnOnce(&T) -> (&'static str, Option<String>),
    ) -> T
    where
        F: Future<Output = T>,
    {
        let (result, notes) = NOTES
            .scope(Mutex::new(Map::new()), async {
                let result = call.await;
                let notes = NOTES
                    .with(|n| std::mem::take(&mut *n.lock().unwrap_or_else(|p| p.into_inner())));
                (result, notes)
            })
            .await;
        let (kind, error) = classify(&result);
        if let Some(record) = self.record.as_mut() {
            record.outcome = kind.into();
            record.error = error;
            record.notes = notes;
        }
        let mut record = self.take();
        let log = self.log.clone();
        // The write may wait for another server's lock: off the runtime.
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(record) = record.as_mut() {
                log.record(record);
            }
        })
        .await;
        result
    }

    fn take(&mut self) -> Option<Record> {
        let mut record = self.record.take()?;
        record.duration_ms = self.started.elapsed().as_millis() as u64;
        Some(record)
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if let Some(record) = self.take() {
            self.log.record(&record);
        }
    }
}

// ---------------------------------------------------------------------------
// Reading

/// One aligned line per call for people: time, client, tool, sandbox,
/// outcome, duration, then the command (or the other arguments) and the error.
pub fn format_human(lines: &[String]) -> Vec<String> {
    let rows: Vec<Option<[String; 7]>> = lines
        .iter()
        .map(|line| {
            let r: Record = serde_json::from_str(line).ok()?;
            let sandbox = match &r.sandbox {
                Value::String(s) => s.clone(),
                Value::Array(a) => a
                    .iter()
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                    .collect::<Vec<_>>()
                    .join(","),
                Value::Null => "-".into(),
                other => other.to_string(),
            };
            let ran = r.args.get("command").or_else(|| r.args.get("code"));
            let mut what = match ran.and_then(Value::as_str) {
                Some(c) => c.replace('\n', "⏎"),
                None => {
                    let mut args = r.args.as_object().cloned().unwrap_or_default();
                    args.remove("sandbox_name");
                    args.remove("sandboxes");
                    if args.is_empty() {
                        String::new()
                    } else {
                        Value::Object(args).to_string()
                    }
                }
            };
            what = truncate(&what, 120);
            if let Some(e) = &r.error {
                what = if what.is_empty() {
                    format!("— {e}")
                } else {
                    format!("{what} — {e}")
                };
            }
            Some([
                r.time.get(..19).map_or(r.time.clone(), |t| format!("{t}Z")),
                if r.client.is_empty() {
                    "-".into()
                } else {
                    r.client
                },
                r.tool,
                sandbox,
                r.outcome,
                format!("{} ms", r.duration_ms),
                what,
            ])
        })
        .collect();
    let mut width = [0usize; 6];
    for row in rows.iter().flatten() {
        for (w, cell) in width.iter_mut().zip(row.iter()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    rows.iter()
        .zip(lines)
        .map(|(row, raw)| match row {
            Some(r) => format!(
                "{:<w0$}  {:<w1$}  {:<w2$}  {:<w3$}  {:<w4$}  {:>w5$}  {}",
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                r[5],
                r[6],
                w0 = width[0],
                w1 = width[1],
                w2 = width[2],
                w3 = width[3],
                w4 = width[4],
                w5 = width[5],
            )
            .trim_end()
            .to_string(),
            None => raw.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests;
