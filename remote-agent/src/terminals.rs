//! Terminals: a command on a pseudo-terminal of its own, its output
//! rendered by a terminal emulator (the `vt100` crate) into the screen a
//! person would see, held by the daemon so that it outlives the connection
//! that opened it, as jobs and code contexts do.
//!
//! Keys go in as bytes; the screen comes out as text, with the lines that
//! scrolled off since the last answer. The pty is the controlling terminal
//! of the command's session, so `C-c` interrupts and password prompts that
//! open `/dev/tty` work. In a sandbox the command starts through `enter`
//! like any other, on a pty owned by the sandbox's account.

use std::collections::HashMap;
use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use outpost_protocol::{AgentError, ErrorKind, Response, TermRequest, TermScreen};

use crate::sandbox::Scope;
use crate::statefile::error;

/// Lines kept above the screen.
const SCROLLBACK: usize = 10_000;
/// Scrolled-off lines one answer carries at most.
const MAX_NEW_LINES: usize = 1000;
/// After keys are sent, output is taken as settled once it pauses this long.
const SETTLE: Duration = Duration::from_millis(60);
const MAX_WAIT: Duration = Duration::from_secs(30);
const MAX_OPEN: usize = 32;
/// Between SIGHUP and SIGKILL when a terminal is closed.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

#[derive(Default)]
pub struct Terminals {
    open: Mutex<HashMap<String, Arc<Terminal>>>,
}

struct Terminal {
    /// The sandbox it runs in; only requests in that scope reach it.
    sandbox: Option<String>,
    master: File,
    child: Mutex<Child>,
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    parser: vt100::Parser,
    /// Lines of history at the last answer.
    answered_history: usize,
    unread: bool,
    last_output: Instant,
    exit_code: Option<i32>,
}

fn bad(message: impl Into<String>) -> AgentError {
    error(ErrorKind::BadRequest, message)
}

fn internal(what: &str, e: impl std::fmt::Display) -> AgentError {
    error(ErrorKind::Internal, format!("{what}: {e}"))
}

impl Terminals {
    /// Whether a terminal still runs (the daemon stays for it).
    pub fn any_running(&self) -> bool {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.values()
            .any(|t| t.state.lock().is_ok_and(|s| s.exit_code.is_none()))
    }

    /// One request, on a blocking thread (it may wait for output).
    pub fn answer(&self, sandbox: Option<String>, request: TermRequest) -> Response {
        self.answer_inner(sandbox, request)
            .unwrap_or_else(Response::Error)
    }

    fn answer_inner(
        &self,
        sandbox: Option<String>,
        request: TermRequest,
    ) -> Result<Response, AgentError> {
        let wait = Duration::from_millis(u64::from(request.wait_ms())).min(MAX_WAIT);
        match request {
            TermRequest::Open {
                command,
                cols,
                rows,
            } => {
                let (id, terminal) = self.open(sandbox, &command, cols, rows)?;
                Ok(terminal.answer(&id, Instant::now(), Duration::from_millis(300)))
            }
            TermRequest::Send { id, data, .. } => {
                let terminal = self.find(&sandbox, &id)?;
                let sent = Instant::now();
                (&terminal.master)
                    .write_all(&data)
                    .map_err(|e| internal("cannot type into the terminal", e))?;
                Ok(terminal.answer(&id, sent, wait))
            }
            TermRequest::Read { id, .. } => {
                let terminal = self.find(&sandbox, &id)?;
                Ok(terminal.read(&id, wait))
            }
            TermRequest::Resize { id, cols, rows } => {
                let terminal = self.find(&sandbox, &id)?;
                check_size(cols, rows)?;
                set_size(&terminal.master, cols, rows)
                    .map_err(|e| internal("cannot resize the terminal", e))?;
                terminal.lock().parser.screen_mut().set_size(rows, cols);
                Ok(terminal.answer(&id, Instant::now(), Duration::from_millis(300)))
            }
            TermRequest::Close { id } => {
                let terminal = self.find(&sandbox, &id)?;
                self.open.lock().unwrap().remove(&id);
                terminal.hang_up();
                let screen = terminal.answer(&id, Instant::now(), Duration::ZERO);
                Ok(screen)
            }
        }
    }

    fn find(&self, sandbox: &Option<String>, id: &str) -> Result<Arc<Terminal>, AgentError> {
        let open = self.open.lock().unwrap();
        open.get(id)
            .filter(|t| &t.sandbox == sandbox)
            .cloned()
            .ok_or_else(|| bad(format!("no terminal {id} here (closed, or never opened)")))
    }

    fn open(
        &self,
        sandbox: Option<String>,
        command: &str,
        cols: u16,
        rows: u16,
    ) -> Result<(String, Arc<Terminal>), AgentError> {
        check_size(cols, rows)?;
        {
            let mut open = self.open.lock().unwrap();
            // Ended ones make room first.
            if open.len() >= MAX_OPEN {
                open.retain(|_, t| t.lock().exit_code.is_none());
            }
            if open.len() >= MAX_OPEN {
                return Err(bad(format!(
                    "{MAX_OPEN} terminals are open here; close one first"
                )));
            }
        }
        let (master, slave) = open_pty(cols, rows).map_err(|e| internal("no pty", e))?;
        let mut cmd = match &sandbox {
            Some(id) => {
                let scope = Scope::of(id)?;
                if let Some((uid, gid)) = scope.account_ids() {
                    // SAFETY: fchown on the pty we just opened.
                    unsafe { libc::fchown(slave.as_raw_fd(), uid, gid) };
                }
                let cwd = scope.cwd(None)?;
                let term = [("TERM".to_string(), "xterm-256color".to_string())];
                scope
                    .command(Path::new("/bin/bash"), command, &cwd, &term)
                    .map_err(|e| error(ErrorKind::SpawnFailed, e))?
            }
            None => {
                let mut cmd = Command::new("bash");
                cmd.args(["-c", command]).env("TERM", "xterm-256color");
                if let Some(home) = std::env::var_os("HOME") {
                    cmd.current_dir(home);
                }
                cmd
            }
        };
        let stdio = |fd: &OwnedFd| fd.try_clone().map(Stdio::from);
        cmd.stdin(stdio(&slave).map_err(|e| internal("pty", e))?)
            .stdout(stdio(&slave).map_err(|e| internal("pty", e))?)
            .stderr(stdio(&slave).map_err(|e| internal("pty", e))?);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() == -1 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| {
            error(
                ErrorKind::SpawnFailed,
                format!("cannot start {command:?}: {e}"),
            )
        })?;
        drop(slave);
        let master = File::from(master);
        let reader = master.try_clone().map_err(|e| internal("pty", e))?;
        let terminal = Arc::new(Terminal {
            sandbox,
            master,
            child: Mutex::new(child),
            state: Mutex::new(State {
                parser: vt100::Parser::new(rows, cols, SCROLLBACK),
                answered_history: 0,
                unread: false,
                last_output: Instant::now(),
                exit_code: None,
            }),
            changed: Condvar::new(),
        });
        let id = format!("t-{:06x}", rand_u32() & 0xff_ffff);
        self.open
            .lock()
            .unwrap()
            .insert(id.clone(), Arc::clone(&terminal));
        let pumped = Arc::clone(&terminal);
        std::thread::spawn(move || pumped.pump(reader));
        Ok((id, terminal))
    }
}

impl Terminal {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Feeds the emulator until the pty closes, then records the exit.
    fn pump(&self, mut reader: File) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let mut state = self.lock();
                    state.parser.process(&buf[..n]);
                    state.unread = true;
                    state.last_output = Instant::now();
                    self.changed.notify_all();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // EIO: every holder of the other side is gone.
                Err(_) => break,
            }
        }
        let status = self.child.lock().unwrap().wait();
        let code = status.map_or(-1, |s| {
            use std::os::unix::process::ExitStatusExt;
            s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
        });
        self.lock().exit_code = Some(code);
        self.changed.notify_all();
    }

    /// The screen once output since `since` has settled, it ended, or
    /// `wait` passed.
    fn answer(&self, id: &str, since: Instant, wait: Duration) -> Response {
        let deadline = Instant::now() + wait;
        let mut state = self.lock();
        loop {
            let now = Instant::now();
            let settled = state.last_output > since && now >= state.last_output + SETTLE;
            if settled || state.exit_code.is_some() || now >= deadline {
                break;
            }
            let until = if state.last_output > since {
                (state.last_output + SETTLE).min(deadline)
            } else {
                deadline
            };
            state = self
                .changed
                .wait_timeout(state, until.saturating_duration_since(now))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Response::Terminal(render(id, &mut state))
    }

    /// The screen once there is output not yet answered, it ended, or
    /// `wait` passed.
    fn read(&self, id: &str, wait: Duration) -> Response {
        let deadline = Instant::now() + wait;
        let mut state = self.lock();
        while !state.unread && state.exit_code.is_none() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Response::Terminal(render(id, &mut state))
    }

    /// SIGHUP to its session, as a closed terminal gives; SIGKILL after a
    /// grace.
    fn hang_up(&self) {
        let pid = self.child.lock().unwrap().id() as i32;
        // SAFETY: signals to the process group the command leads.
        unsafe { libc::kill(-pid, libc::SIGHUP) };
        let deadline = Instant::now() + CLOSE_GRACE;
        let mut state = self.lock();
        while state.exit_code.is_none() && Instant::now() < deadline {
            state = self
                .changed
                .wait_timeout(state, Duration::from_millis(50))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        if state.exit_code.is_none() {
            // SAFETY: as above.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }
}

/// The screen as text, and the lines that scrolled off since the last
/// answer.
fn render(id: &str, state: &mut State) -> TermScreen {
    state.unread = false;
    let screen = state.parser.screen_mut();
    screen.set_scrollback(usize::MAX);
    let history = screen.scrollback();
    let (rows, cols) = screen.size();
    let mut new = history
        .saturating_sub(state.answered_history)
        .min(MAX_NEW_LINES);
    let mut scrollback = Vec::new();
    while new > 0 {
        screen.set_scrollback(new);
        let take = new.min(usize::from(rows));
        scrollback.extend(
            screen
                .rows(0, cols)
                .take(take)
                .map(|l| l.trim_end().to_string()),
        );
        new -= take;
    }
    screen.set_scrollback(0);
    state.answered_history = history;
    let mut lines: Vec<String> = screen
        .rows(0, cols)
        .map(|l| l.trim_end().to_string())
        .collect();
    while lines.last().is_some_and(String::is_empty) {
        lines.pop();
    }
    TermScreen {
        id: id.to_string(),
        screen: lines.join("\n"),
        scrollback,
        cursor: screen.cursor_position(),
        exit_code: state.exit_code,
    }
}

fn check_size(cols: u16, rows: u16) -> Result<(), AgentError> {
    if !(10..=1000).contains(&cols) || !(2..=500).contains(&rows) {
        return Err(bad(format!(
            "a terminal is 10 to 1000 columns and 2 to 500 rows, not {cols}x{rows}"
        )));
    }
    Ok(())
}

fn set_size(master: &File, cols: u16, rows: u16) -> io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ as _, &size) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A pty pair through `posix_openpt` (in libc itself: the portable build
/// links no libutil).
fn open_pty(cols: u16, rows: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: plain calls; each descriptor is owned once made.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if master == -1 {
            return Err(io::Error::last_os_error());
        }
        let master = OwnedFd::from_raw_fd(master);
        if libc::grantpt(master.as_raw_fd()) == -1 || libc::unlockpt(master.as_raw_fd()) == -1 {
            return Err(io::Error::last_os_error());
        }
        let mut name = [0 as libc::c_char; 128];
        if libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let path = CStr::from_ptr(name.as_ptr());
        let slave = libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if slave == -1 {
            return Err(io::Error::last_os_error());
        }
        let slave = OwnedFd::from_raw_fd(slave);
        let master_file = File::from(master.try_clone()?);
        set_size(&master_file, cols, rows)?;
        Ok((master, slave))
    }
}

fn rand_u32() -> u32 {
    let mut buf = [0u8; 4];
    if File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .is_err()
    {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        return nanos ^ std::process::id();
    }
    u32::from_le_bytes(buf)
}
