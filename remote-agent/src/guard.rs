//! The guard: a small watchdog process per `serve` that ends the process
//! trees of inline commands still running when `serve` dies, however it dies.
//!
//! `serve` kills what it started when it ends normally (EOF, SIGTERM, ...),
//! but a SIGKILL (an OOM kill, a `kill -9`) gives it no chance, and its
//! commands, each in a session of its own, would go on under init. So
//! `serve` starts `outpost-agent guard` once, with the read end of a pipe as
//! its stdin. The write end exists only in `serve` (close-on-exec, so no
//! command inherits it), and `serve` tells the guard about every exec:
//!
//! * `watch <token>` before the command is spawned,
//! * `root <token> <pid> <start time>` once its main process exists,
//! * `end <token>` once it ended on its own, or once `serve` killed it.
//!
//! End of file on the pipe means `serve` is gone; the guard then kills the
//! trees of the execs not ended ([`proctree::terminate_tree`]: TERM, grace,
//! KILL, re-scan) and exits. Background processes of a command that already
//! finished were ended in the guard's books and are left alone.
//!
//! The guard is not given a parent-death signal: it must outlive `serve`
//! to do its work, and the end of file already tells it, whatever killed
//! `serve`. It holds no descriptor of the connection (stdin is the pipe,
//! stdout `/dev/null`, stderr `serve`'s log), so it never keeps a channel
//! open. A guard that dies is replaced, and told again about every exec
//! still running.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use crate::proctree;

/// Pause before a dead guard is replaced, so a guard that cannot start
/// does not turn into a busy loop.
const RESPAWN_PAUSE: Duration = Duration::from_millis(100);

/// The main process of an exec, named across pid reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Root {
    pid: i32,
    start_time: u64,
}

/// What `serve` knows about its guard. `running` is the truth; the guard
/// is told every change, and told all of it again when it is replaced.
#[derive(Default)]
struct Books {
    running: HashMap<String, Option<Root>>,
    /// The write end of the guard's pipe, while a guard runs.
    pipe: Option<File>,
    /// The guard's pid while it is alive or an unreaped zombie, so that a
    /// signal to it can never reach a process that reused the pid.
    guard_pid: Option<i32>,
}

static BOOKS: OnceLock<Mutex<Books>> = OnceLock::new();

fn books() -> MutexGuard<'static, Books> {
    BOOKS
        .get_or_init(Mutex::default)
        .lock()
        // A panic while holding the lock leaves usable books; keep going.
        .unwrap_or_else(|p| p.into_inner())
}

/// Starts the guard of this `serve`, and keeps one running from then on.
pub fn start() {
    let spawned = std::thread::Builder::new()
        .name("guard-keeper".into())
        .spawn(keep);
    if let Err(e) = spawned {
        eprintln!("outpost-agent: cannot start the guard's keeper: {e}");
    }
}

/// One exec, known to the guard until [`Supervised::ended`]. One dropped
/// without it (its request aborted halfway) stays in the guard's books, so
/// its tree is still killed when `serve` dies.
pub struct Supervised {
    token: String,
}

/// Puts the exec marked `token` under the guard; call before spawning it,
/// so that no instant exists where it runs unsupervised.
pub fn watch(token: &str) -> Supervised {
    let mut books = books();
    books.running.insert(token.to_string(), None);
    tell(&mut books, &format!("watch {token}\n"));
    Supervised {
        token: token.to_string(),
    }
}

impl Supervised {
    /// Names the exec's main process (just spawned, not yet reaped), whose
    /// process group and session hold the tree.
    pub fn rooted(&self, pid: i32) {
        let Some((_, start_time)) = proctree::state_and_start(pid) else {
            return;
        };
        let mut books = books();
        books
            .running
            .insert(self.token.clone(), Some(Root { pid, start_time }));
        tell(
            &mut books,
            &format!("root {} {pid} {start_time}\n", self.token),
        );
    }

    /// The exec ended on its own or was killed by `serve` (or never
    /// started): whatever it left is no longer the guard's business.
    pub fn ended(self) {
        let mut books = books();
        books.running.remove(&self.token);
        tell(&mut books, &format!("end {}\n", self.token));
    }
}

/// Sends one message. The pipe does not block: a guard that stops reading
/// (stopped, wedged) must not stall `serve`, so it is killed instead and
/// its replacement gets the whole books.
fn tell(books: &mut Books, message: &str) {
    let Some(pipe) = books.pipe.as_mut() else {
        // No guard right now: the next one is told everything.
        return;
    };
    // Messages are far below PIPE_BUF, so each write is whole or nothing.
    if let Err(e) = pipe.write_all(message.as_bytes()) {
        eprintln!("outpost-agent: the guard does not take messages ({e}); replacing it");
        books.pipe = None;
        if let Some(pid) = books.guard_pid {
            // SAFETY: plain syscall; the pid is our unreaped child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// The keeper thread: starts a guard, waits for it to end, starts another.
fn keep() {
    loop {
        let child = {
            let mut books = books();
            match spawn_guard(&books.running) {
                Ok((child, pipe)) => {
                    books.pipe = Some(pipe);
                    books.guard_pid = Some(child.id() as i32);
                    Some(child)
                }
                Err(e) => {
                    eprintln!("outpost-agent: cannot start the guard: {e}");
                    None
                }
            }
        };
        if let Some(mut child) = child {
            proctree::wait_unreaped(child.id() as i32);
            {
                let mut books = books();
                books.guard_pid = None;
                books.pipe = None;
            }
            let status = child
                .wait()
                .map_or_else(|e| e.to_string(), |s| s.to_string());
            eprintln!("outpost-agent: the guard ended ({status}); starting another");
        }
        std::thread::sleep(RESPAWN_PAUSE);
    }
}

/// Starts a guard and tells it about `running`; its pipe is returned
/// non-blocking.
fn spawn_guard(running: &HashMap<String, Option<Root>>) -> io::Result<(Child, File)> {
    let (read, write) = pipe()?;
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0("outpost-agent")
        .arg("guard")
        .stdin(Stdio::from(read))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let child = cmd.spawn()?;
    let mut pipe = File::from(write);
    // Blocking while the backlog goes in: the new guard reads at once.
    let mut backlog = String::new();
    for (token, root) in running {
        backlog.push_str(&format!("watch {token}\n"));
        if let Some(r) = root {
            backlog.push_str(&format!("root {token} {} {}\n", r.pid, r.start_time));
        }
    }
    pipe.write_all(backlog.as_bytes())?;
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(pipe.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(pipe.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    Ok((child, pipe))
}

/// A pipe whose ends are both close-on-exec (the read end is moved onto the
/// guard's stdin, which clears the flag there only).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills `fds` with two new descriptors on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Entry point of `outpost-agent guard`: keeps the books `serve` sends on
/// stdin; at end of file, kills the trees of the execs still running.
pub fn main() -> i32 {
    // SAFETY: plain syscalls in a single-threaded process.
    unsafe {
        // Out of serve's process group: a terminal's ^C or a signal to the
        // group reaches serve, which then ends its commands itself.
        libc::setsid();
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        libc::signal(libc::SIGINT, libc::SIG_IGN);
    }
    // Hold no directory (and so no mount) busy.
    let _ = std::env::set_current_dir("/");
    let mut running: HashMap<String, Option<Root>> = HashMap::new();
    let mut stdin = BufReader::new(io::stdin().lock());
    let mut line = String::new();
    loop {
        line.clear();
        match stdin.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => apply(&mut running, &line),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // Cannot hear serve any more: act as if it were gone.
            Err(_) => break,
        }
    }
    kill_running(running);
    0
}

/// Applies one message of `serve` to the books.
fn apply(running: &mut HashMap<String, Option<Root>>, line: &str) {
    let words: Vec<&str> = line.split_ascii_whitespace().collect();
    match words.as_slice() {
        ["watch", token] => {
            running.entry(token.to_string()).or_insert(None);
        }
        ["root", token, pid, start] => {
            if let (Ok(pid), Ok(start_time)) = (pid.parse(), start.parse()) {
                running.insert(token.to_string(), Some(Root { pid, start_time }));
            }
        }
        ["end", token] => {
            running.remove(*token);
        }
        _ => eprintln!("outpost-agent guard: ignoring message {line:?}"),
    }
}

/// Kills the tree of every exec in `running`, all at once, so the whole
/// job takes one grace period however many there are.
fn kill_running(running: HashMap<String, Option<Root>>) {
    let killers: Vec<_> = running
        .into_iter()
        .map(|(token, root)| {
            std::thread::spawn(move || {
                // The main process names the process group and session only
                // while it is the same process (alive, or a zombie nobody
                // reaped yet); a reused pid must not be taken for it.
                let root = root
                    .filter(|r| {
                        proctree::state_and_start(r.pid).is_some_and(|(_, s)| s == r.start_time)
                    })
                    .map(|r| r.pid);
                proctree::terminate_tree(root, &token, proctree::TERM_GRACE);
            })
        })
        .collect();
    for killer in killers {
        let _ = killer.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn books_follow_the_messages() {
        let mut running = HashMap::new();
        apply(&mut running, "watch a-1\n");
        apply(&mut running, "watch b-2\n");
        apply(&mut running, "root a-1 123 456\n");
        apply(&mut running, "end b-2\n");
        apply(&mut running, "nonsense\n");
        assert_eq!(running.len(), 1);
        assert_eq!(
            running["a-1"],
            Some(Root {
                pid: 123,
                start_time: 456
            })
        );
    }
}
