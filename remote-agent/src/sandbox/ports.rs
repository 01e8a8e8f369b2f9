//! A sandbox's ports, reached from the controller's machine.
//!
//! `SandboxExpose` asks for one (`meta/ports/<port>.want`). The keeper,
//! which lives exactly as long as the sandbox, listens for it on a socket
//! in the agent's private socket directory (short, so any path fits
//! `sun_path`; see [`crate::socket_dir`]), records where in
//! `meta/ports/<port>.path`, and removes it at the end; for each
//! connection it starts `outpost-agent relay PORT`
//! inside the sandbox through `enter`, the connection as its stdin and
//! stdout: so the relay connects to `127.0.0.1:PORT` in the sandbox's own
//! network namespace, also with `network: false`. The controller reaches
//! the socket over SSH (`direct-streamlocal`) or, on its own machine,
//! directly; a connection that breaks is made again by the next one. All
//! of it ends with the keeper.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use outpost_protocol::{AgentError, ErrorKind, Isolation, Response};

use super::isolation::AGENT_INSIDE;
use super::store::{Dirs, PORTS, Setup, error};
use super::{Scope, agent_exe, ended_error};
use crate::statefile::{make_dir_all, write_atomic};

/// How long `SandboxExpose` waits for the keeper to listen.
const LISTEN_WAIT: Duration = Duration::from_secs(5);

/// Where `port`'s socket path is recorded.
fn record(dirs: &Dirs, port: u16) -> PathBuf {
    dirs.meta().join(PORTS).join(format!("{port}.path"))
}

/// The socket of `port`, named by a hash of the sandbox's id, in the
/// agent's socket directory.
fn socket(dirs: &Dirs, port: u16) -> Result<PathBuf, String> {
    let state = crate::paths::state_dir().ok_or("no state directory")?;
    let dir = crate::socket_dir::prepare_socket_dir(&state)?;
    let tag = blake3::hash(dirs.dir.as_os_str().as_encoded_bytes());
    Ok(dir.join(format!("pt-{}-{port}.sock", &tag.to_hex()[..8])))
}

/// Removes the sockets of a sandbox that ended.
pub fn remove_all(dirs: &Dirs) {
    for port in dirs.exposed_ports() {
        if let Ok(path) = fs::read_to_string(record(dirs, port)) {
            let _ = fs::remove_file(path);
        }
    }
}

/// `SandboxExpose`: asks the keeper for `port` and answers its socket once
/// it listens.
pub fn expose(id: &str, port: u16) -> Result<Response, AgentError> {
    if port == 0 {
        return Err(error(ErrorKind::BadRequest, "port must be 1 to 65535"));
    }
    let dirs = Dirs::find(id)?;
    ended_error(&dirs)?;
    let dir = dirs.meta().join(PORTS);
    let failed = |e: io::Error| error(ErrorKind::Internal, format!("sandbox {id}: {e}"));
    make_dir_all(&dir).map_err(failed)?;
    write_atomic(&dir.join(format!("{port}.want")), b"", false).map_err(failed)?;
    dirs.nudge_keeper();
    let recorded = record(&dirs, port);
    let deadline = Instant::now() + LISTEN_WAIT;
    while !recorded.exists() {
        ended_error(&dirs)?;
        if Instant::now() >= deadline {
            return Err(error(
                ErrorKind::Unavailable,
                format!("sandbox {id}'s keeper did not start listening for port {port}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let socket = fs::read_to_string(&recorded).map_err(failed)?;
    Ok(Response::Exposed { socket })
}

/// The keeper's listeners, one thread each.
#[derive(Default)]
pub struct Listeners {
    serving: HashSet<u16>,
}

impl Listeners {
    /// Starts listening for every port asked for and not yet served.
    pub fn serve_new(&mut self, dirs: &Dirs, setup: &Setup) {
        let Ok(entries) = fs::read_dir(dirs.meta().join(PORTS)) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(port) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".want"))
                .and_then(|p| p.parse::<u16>().ok())
            else {
                continue;
            };
            if !self.serving.insert(port) {
                continue;
            }
            if let Err(e) = listen(dirs, setup, port) {
                eprintln!("outpost-agent keeper {}: port {port}: {e}", dirs.id);
            }
        }
    }
}

fn listen(dirs: &Dirs, setup: &Setup, port: u16) -> io::Result<()> {
    let path = socket(dirs, port).map_err(io::Error::other)?;
    let _ = fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;
    // Recorded only once it listens: `expose` waits for the record.
    write_atomic(
        &record(dirs, port),
        path.as_os_str().as_encoded_bytes(),
        false,
    )?;
    let program = if setup.isolation == Isolation::Bwrap {
        AGENT_INSIDE.to_string()
    } else {
        agent_exe()
            .map_err(io::Error::other)?
            .to_string_lossy()
            .into_owned()
    };
    let id = dirs.id.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            if let Err(e) = relay_one(&id, &program, port, stream) {
                eprintln!("outpost-agent keeper {id}: port {port}: {e}");
            }
        }
    });
    Ok(())
}

/// One connection: `relay PORT` inside the sandbox, the connection as its
/// stdin and stdout, reaped by a thread of its own.
fn relay_one(
    id: &str,
    program: &str,
    port: u16,
    stream: std::os::unix::net::UnixStream,
) -> Result<(), String> {
    let scope = Scope::of(id).map_err(|e| e.message)?;
    let cwd = scope.cwd(None).map_err(|e| e.message)?;
    let port_arg = port.to_string();
    let mut cmd = scope.program(program, &["relay", &port_arg], &cwd, &[])?;
    let output = stream.try_clone().map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::from(OwnedFd::from(stream)))
        .stdout(Stdio::from(OwnedFd::from(output)))
        .stderr(Stdio::null());
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    std::thread::spawn(move || child.wait());
    Ok(())
}

/// `outpost-agent relay PORT`: run inside a sandbox, connects to PORT on
/// its loopback and copies stdin to it and it to stdout until both ends
/// are done.
pub fn relay(port: u16) -> i32 {
    let tcp = match TcpStream::connect(("127.0.0.1", port))
        .or_else(|_| TcpStream::connect(("::1", port)))
    {
        Ok(tcp) => tcp,
        Err(e) => {
            eprintln!("outpost-agent relay: nothing answers on port {port}: {e}");
            return 1;
        }
    };
    let _ = tcp.set_nodelay(true);
    let Ok(mut to_port) = tcp.try_clone() else {
        return 1;
    };
    let upstream = std::thread::spawn(move || {
        let _ = io::copy(&mut io::stdin().lock(), &mut to_port);
        let _ = to_port.shutdown(Shutdown::Write);
    });
    let mut from_port = tcp;
    let mut out = io::stdout().lock();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from_port.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if out.write_all(&buf[..n]).and_then(|()| out.flush()).is_err() {
                    break;
                }
            }
        }
    }
    drop(out);
    // The peer closed: nothing more goes to it either.
    let _ = from_port.shutdown(Shutdown::Both);
    // Stdin and stdout are one socket: only its sending half ends, so the
    // other side hears we are done and may still finish sending.
    // SAFETY: shutdown of our own stdout.
    unsafe { libc::shutdown(1, libc::SHUT_WR) };
    let _ = upstream.join();
    0
}
