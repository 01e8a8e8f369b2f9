//! The `serve` side of the daemon: finding it, starting it (in its own
//! systemd scope where that helps), and handing it `JobStart`,
//! `SandboxCreate` and the code context requests ([`ask_code`]).
//!
//! Of the job requests only `JobStart` needs the daemon; everything else
//! `serve` answers from the job files. A daemon that does not answer is started, and the request
//! retried for a few seconds; a request is never sent twice, so a job never
//! starts twice.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use outpost_protocol::{
    AgentMessage, ClientMessage, DecodeEvent, ErrorKind, FrameDecoder, JobSpec, PROTOCOL_VERSION,
    Request, Response, decode, encode_frame,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::{DaemonInfo, info_path, socket_path};
use crate::code::contexts::{GRACE, START_WAIT};
use crate::paths;
use crate::sandbox::{self, Scope};
use crate::statefile::{self, error};

/// How long `serve` keeps trying to reach a daemon it just started.
const CONNECT_WAIT: Duration = Duration::from_secs(3);
/// How long `serve` waits for the daemon's answer.
const ANSWER_WAIT: Duration = Duration::from_secs(15);
/// How long a daemon of another protocol version gets to leave.
const LEAVE_WAIT: Duration = Duration::from_secs(2);

pub const STARTED_BY_SYSTEMD: &str = "systemd-run --user --scope";
pub const STARTED_BY_FORK: &str = "double fork";

/// Time the daemon gets beyond a code run's own limits to answer.
const CODE_ANSWER_SLACK: Duration = Duration::from_secs(10);

/// `CodeRun`, `CodeContexts`, `CodeControl` or `Terminal`, asked of the daemon (in the
/// sandbox `scope`, if any). A cancelled request interrupts its run; the
/// answer still comes.
pub async fn ask_code(
    request: Request,
    scope: Option<&Scope>,
    mut cancel: tokio::sync::watch::Receiver<bool>,
) -> Response {
    let (wait, context) = match &request {
        Request::CodeRun(run) => {
            let wait = if run.wait_ms > 0 {
                Some(Duration::from_millis(run.wait_ms))
            } else if run.timeout_ms > 0 {
                Some(Duration::from_millis(run.timeout_ms) + GRACE + START_WAIT)
            } else {
                None
            };
            // Only a run is interrupted: a collect that is cancelled just
            // stops waiting for the run it would have collected.
            (
                wait,
                Some(run.context.clone()).filter(|_| !run.code.is_empty()),
            )
        }
        Request::Terminal(t) => (Some(Duration::from_millis(u64::from(t.wait_ms()))), None),
        _ => (Some(Duration::ZERO), None),
    };
    // Unbounded runs wait as long as a sandbox may live.
    let wait = wait.map_or(Duration::from_secs(7 * 24 * 3600), |w| {
        w + CODE_ANSWER_SLACK
    });
    let scoped = |request: Request| match scope {
        Some(scope) => Request::InSandbox {
            id: scope.dirs.id.clone(),
            request: Box::new(request),
        },
        None => request,
    };
    let asked = ask_daemon(scoped(request), wait);
    tokio::pin!(asked);
    let mut interrupted = false;
    loop {
        tokio::select! {
            response = &mut asked => return response,
            changed = cancel.changed(), if !interrupted => {
                interrupted = true;
                if changed.is_ok() && *cancel.borrow() && let Some(context) = &context {
                    let interrupt = Request::CodeControl { context: context.clone(), action: outpost_protocol::CodeAction::Interrupt };
                    let _ = ask_daemon(scoped(interrupt), CODE_ANSWER_SLACK).await;
                    // Code that ignores the interrupt keeps running; the
                    // cancelled call answers anyway, and a later run with
                    // empty code collects its result.
                    let grace = GRACE + Duration::from_secs(1);
                    return match tokio::time::timeout(grace, &mut asked).await {
                        Ok(response) => response,
                        Err(_) => Response::CodeRan(outpost_protocol::CodeExecution {
                            running: true,
                            ..Default::default()
                        }),
                    };
                }
            }
        }
    }
}

/// Sends `JobStart` to the daemon, starting the daemon if none answers.
pub async fn start_job(spec: JobSpec) -> Response {
    ask_daemon(Request::JobStart(spec), ANSWER_WAIT).await
}

/// Sends one request (`JobStart` or `SandboxCreate`) to the daemon,
/// starting the daemon if none answers, and waits up to `wait` for the
/// answer.
pub async fn ask_daemon(body: Request, wait: Duration) -> Response {
    match ask_daemon_inner(body, wait).await {
        Ok(response) => response,
        Err(e) => Response::Error(e),
    }
}

async fn ask_daemon_inner(
    body: Request,
    wait: Duration,
) -> Result<Response, outpost_protocol::AgentError> {
    let state = paths::state_dir().ok_or_else(|| {
        error(
            ErrorKind::Internal,
            "no state directory ($HOME unset and no passwd entry)",
        )
    })?;
    let mut stream = connect_or_start(&state).await?;
    let unavailable = |e: io::Error| {
        error(
            ErrorKind::Unavailable,
            format!("the job daemon failed: {e}"),
        )
    };
    let frame = encode_frame(&ClientMessage::Request { id: 1, body }).map_err(|e| {
        error(
            ErrorKind::BadRequest,
            format!("cannot encode the request: {e}"),
        )
    })?;
    stream.write_all(&frame).await.map_err(unavailable)?;
    let answer = tokio::time::timeout(wait, async {
        let mut decoder = FrameDecoder::framed();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err(io::Error::other("it closed the connection"));
            }
            decoder.push(&buf[..n]);
            while let Some(event) = decoder.next_event().map_err(io::Error::other)? {
                if let DecodeEvent::Frame(payload) = event {
                    let AgentMessage::Response { body, .. } =
                        decode::<AgentMessage>(&payload).map_err(io::Error::other)?;
                    return Ok(body);
                }
            }
        }
    })
    .await;
    match answer {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(e)) => Err(unavailable(e)),
        Err(_) => Err(error(
            ErrorKind::Unavailable,
            format!("the job daemon did not answer in {} s", wait.as_secs()),
        )),
    }
}

/// A connection to this state dir's daemon, started if needed.
async fn connect_or_start(state: &Path) -> Result<UnixStream, outpost_protocol::AgentError> {
    if let Some(stream) = connect(state).await {
        return Ok(stream);
    }
    // Concurrent requests of one serve start one daemon, not one each.
    static STARTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _starting = STARTING.lock().await;
    if let Some(stream) = connect(state).await {
        return Ok(stream);
    }
    let started = tokio::task::spawn_blocking(start_daemon)
        .await
        .unwrap_or_else(|_| Err("the starter panicked".into()));
    if let Err(e) = &started {
        return Err(error(
            ErrorKind::Unavailable,
            format!("cannot start the job daemon: {e}"),
        ));
    }
    let deadline = Instant::now() + CONNECT_WAIT;
    loop {
        if let Some(stream) = connect(state).await {
            return Ok(stream);
        }
        if Instant::now() >= deadline {
            return Err(error(
                ErrorKind::Unavailable,
                format!(
                    "the job daemon did not come up; see {}",
                    state.join("run").join("daemon.log").display()
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Connects to the daemon named in `daemon.json`, or at the usual socket.
/// A daemon of another protocol version is asked to leave (its jobs do not
/// mind) and None returned, so that ours gets started.
async fn connect(state: &Path) -> Option<UnixStream> {
    let info: Option<DaemonInfo> = statefile::read_json(&info_path(state));
    let mut candidates = Vec::new();
    if let Some(info) = &info {
        if info.protocol_version != PROTOCOL_VERSION && info.process.alive() {
            // SAFETY: plain syscall; the pid was just checked to be that daemon.
            unsafe {
                libc::kill(info.process.pid, libc::SIGTERM);
            }
            let deadline = Instant::now() + LEAVE_WAIT;
            while info.process.alive() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            return None;
        }
        candidates.push(info.socket.clone());
    }
    let usual = socket_path(state);
    if !candidates.contains(&usual) {
        candidates.push(usual);
    }
    for socket in candidates {
        if let Ok(stream) = UnixStream::connect(&socket).await
            && served_by_us(&stream)
        {
            return Some(stream);
        }
    }
    None
}

/// Whether the peer runs as this user: a job spec (commands, environment)
/// goes to nobody else, whatever socket path an old `daemon.json` names.
fn served_by_us(stream: &UnixStream) -> bool {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    stream.peer_cred().is_ok_and(|c| c.uid() == uid)
}

/// Whether this state dir's daemon answers on its socket.
pub async fn reachable(state: &Path) -> bool {
    connect(state).await.is_some()
}

/// Starts this state dir's daemon unless it runs.
pub async fn ensure(state: &Path) -> Result<(), outpost_protocol::AgentError> {
    connect_or_start(state).await.map(drop)
}

/// Starts a daemon the way [`start_method`] says (falling back to a plain
/// double fork if systemd-run fails); returns how it was started.
fn start_daemon() -> Result<&'static str, String> {
    let exe = paths::running_exe()
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("/proc/self/exe"));
    if start_method() == STARTED_BY_SYSTEMD {
        let mut cmd = Command::new("systemd-run");
        cmd.args(["--user", "--scope", "--quiet", "--"])
            .arg(&exe)
            .args(["daemon", "--started-by", STARTED_BY_SYSTEMD]);
        if run_quietly(&mut cmd, Duration::from_secs(5)).is_ok() {
            return Ok(STARTED_BY_SYSTEMD);
        }
    }
    let mut cmd = Command::new(&exe);
    cmd.args(["daemon", "--started-by", STARTED_BY_FORK]);
    run_quietly(&mut cmd, Duration::from_secs(5)).map(|()| STARTED_BY_FORK)
}

/// Runs `cmd` with no stdio, waiting at most `limit`; Ok on exit status 0.
fn run_quietly(cmd: &mut Command, limit: Duration) -> Result<(), String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("it exited with {status}")),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("it did not return in {} s", limit.as_secs()));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// How a daemon is started on this host: in its own systemd user scope
/// when systemd manages the host (logind may then kill a logged-out user's
/// session processes) and this user's manager answers, else by a double
/// fork. Decided once per process.
pub fn start_method() -> &'static str {
    static METHOD: OnceLock<&'static str> = OnceLock::new();
    METHOD.get_or_init(|| {
        let systemd = Path::new("/run/systemd/system").is_dir()
            && paths::which("systemd-run").is_some()
            && paths::which("systemctl").is_some();
        if systemd && user_manager_answers() {
            STARTED_BY_SYSTEMD
        } else {
            STARTED_BY_FORK
        }
    })
}

fn user_manager_answers() -> bool {
    let Ok(child) = Command::new("systemctl")
        .args(["--user", "is-system-running"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    let output = wait_output(child, Duration::from_secs(2));
    matches!(
        output.trim(),
        "running" | "degraded" | "starting" | "initializing" | "maintenance"
    )
}

/// stdout of `child`, or "" if it takes longer than `limit`.
fn wait_output(mut child: std::process::Child, limit: Duration) -> String {
    use std::io::Read;
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return String::new();
            }
        }
    }
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_to_string(&mut out);
    }
    out
}

/// `loginctl show-user <user> -p Linger`: Some(true) when this user's
/// processes may outlive their last session, None when unknown.
pub fn lingering() -> Option<bool> {
    paths::which("loginctl")?;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let child = Command::new("loginctl")
        .args(["show-user", &uid.to_string(), "-p", "Linger"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    match wait_output(child, Duration::from_secs(2)).trim() {
        "Linger=yes" => Some(true),
        "Linger=no" => Some(false),
        _ => None,
    }
}

/// Makes sure a daemon watches the jobs that need one (running, or lost and
/// not yet handled), starting it in the background; at most once a second
/// per process. So a killed daemon is replaced as soon as anyone looks.
pub fn nudge() {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    {
        let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        *last = Some(Instant::now());
    }
    tokio::spawn(async {
        let Some(state) = paths::state_dir() else {
            return;
        };
        if reachable(&state).await {
            return;
        }
        let root = state.join("jobs");
        let needed = tokio::task::spawn_blocking(move || super::needed(&root))
            .await
            .unwrap_or(false);
        if needed && let Err(e) = ensure(&state).await {
            eprintln!("outpost-agent: {}", e.message);
        }
    });
}

/// `SandboxFork`: the new sandbox made by the daemon with `id`'s spec,
/// then filled with `id`'s work dir; deleted again if that fails.
pub async fn fork_sandbox(id: String) -> Response {
    let from = id.clone();
    let spec =
        match tokio::task::spawn_blocking(move || sandbox::checkpoint::fork_spec(&from)).await {
            Ok(Ok(spec)) => spec,
            Ok(Err(e)) => return Response::Error(e),
            Err(_) => return Response::Error(error(ErrorKind::Internal, "fork worker panicked")),
        };
    let made = ask_daemon(Request::SandboxCreate(spec), sandbox::CREATE_WAIT).await;
    let Response::Sandbox(info) = made else {
        return made;
    };
    let new = info.id.clone();
    let filled =
        tokio::task::spawn_blocking(move || sandbox::checkpoint::fill_fork(&id, &new)).await;
    match filled {
        Ok(Ok(_)) => Response::Sandbox(info),
        failed => {
            let new = info.id.clone();
            let _ = tokio::task::spawn_blocking(move || sandbox::delete(&new)).await;
            Response::Error(match failed {
                Ok(Err(e)) => e,
                _ => error(ErrorKind::Internal, "fork worker panicked"),
            })
        }
    }
}
