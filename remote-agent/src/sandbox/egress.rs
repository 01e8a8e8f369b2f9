//! Egress by allowlist: a bwrap sandbox made with `network: false` and
//! `allow_hosts` has no route out of its network namespace, and reaches the
//! listed places only through an HTTP proxy its keeper runs outside.
//!
//! - The keeper listens on a unix socket in the sandbox's `meta` dir
//!   ([`serve`]), bound into the sandbox at [`SOCKET_INSIDE`].
//! - Inside, the holder (`outpost-agent hold --egress`) listens on
//!   `127.0.0.1:`[`PORT`] and carries each connection to that socket
//!   ([`forward`]); commands get `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY`
//!   (and the lower-case ones) pointing there.
//! - The proxy reads one request head: `CONNECT host:port` (HTTPS) or an
//!   `http://` request in absolute form. A name the list allows (exact, or
//!   under a `*.` suffix; the port too when the entry gives one) is
//!   resolved and connected here, on the host's network; anything else
//!   gets a 403 that says what to add, and is recorded in
//!   [`DENIED`]. Names are resolved by the proxy alone (no DNS inside); an
//!   address is allowed only when listed as such.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

/// The proxy's socket, as the sandbox sees it.
pub const SOCKET_INSIDE: &str = "/run/outpost-egress.sock";
/// The proxy's socket in the sandbox's `meta` dir.
pub const SOCKET: &str = "egress.sock";
/// Refused destinations, one `host:port` per line, in the `meta` dir.
pub const DENIED: &str = "egress-denied";
/// Where commands find the proxy inside.
pub const PORT: u16 = 3128;

const HEAD_MAX: usize = 16 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The refusal log stops growing here.
const DENIED_MAX: u64 = 256 * 1024;
/// Connections the proxy carries at once: each holds threads of the
/// keeper, outside the sandbox's limits.
const MAX_CONNECTIONS: usize = 128;

/// Where a sandbox's refusal log stood before a command ran.
pub struct Watermark {
    path: std::path::PathBuf,
    /// Its length then.
    pub from: u64,
}

impl Watermark {
    pub fn of(meta: &Path) -> Watermark {
        let from = std::fs::metadata(meta.join(DENIED)).map_or(0, |m| m.len());
        Watermark::at(meta, from)
    }

    /// The log in `meta` as it stood at `from` bytes.
    pub fn at(meta: &Path, from: u64) -> Watermark {
        Watermark {
            path: meta.join(DENIED),
            from,
        }
    }

    /// What the proxy refused since, each place once, the first 20.
    pub fn since(&self) -> Vec<String> {
        use std::io::{Read, Seek, SeekFrom};
        let mut text = String::new();
        let read = std::fs::File::open(&self.path).and_then(|mut f| {
            f.seek(SeekFrom::Start(self.from))?;
            f.take(64 * 1024).read_to_string(&mut text)
        });
        let mut seen: Vec<String> = Vec::new();
        if read.is_ok() {
            for line in text.lines().filter(|l| !l.is_empty()) {
                if seen.len() < 20 && !seen.iter().any(|s| s == line) {
                    seen.push(line.to_string());
                }
            }
        }
        seen
    }
}

/// The proxy variables every command of such a sandbox gets.
pub fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{PORT}");
    [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ]
    .iter()
    .map(|name| (name.to_string(), url.clone()))
    .chain([
        ("NO_PROXY".into(), String::new()),
        ("no_proxy".into(), String::new()),
    ])
    .collect()
}

/// What is wrong with an `allow_hosts` entry, if anything.
pub fn check_entry(entry: &str) -> Result<(), String> {
    let (name, port) = split_port(entry);
    let name = name.strip_prefix("*.").unwrap_or(name);
    let fine = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b))
        && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
    if fine {
        Ok(())
    } else {
        Err(format!(
            "allow_hosts entry {entry:?}: give a host name (or *.suffix, or an address), with :port if only one port"
        ))
    }
}

/// `name[:port]`, an IPv6 address in brackets.
fn split_port(entry: &str) -> (&str, Option<&str>) {
    if let Some(rest) = entry.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((addr, tail)) => (addr, tail.strip_prefix(':')),
            None => (entry, None),
        };
    }
    match entry.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => (name, Some(port)),
        _ => (entry, None),
    }
}

/// Whether `allow` lets a connection to `host:port` through.
pub fn allowed(allow: &[String], host: &str, port: u16) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    allow.iter().any(|entry| {
        let (name, entry_port) = split_port(entry);
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let name_fits = match name.strip_prefix("*.") {
            Some(suffix) => host.ends_with(&format!(".{suffix}")),
            None => host == name,
        };
        name_fits && entry_port.is_none_or(|p| p.parse() == Ok(port))
    })
}

/// Runs the proxy on `socket` for `allow`, on threads of its own, for as
/// long as the process lives; `denied` collects refusals.
pub fn serve(socket: &Path, allow: Vec<String>, denied: &Path) -> io::Result<()> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)?;
    let (allow, denied) = (std::sync::Arc::new(allow), denied.to_path_buf());
    let open = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            use std::sync::atomic::Ordering;
            if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                open.fetch_sub(1, Ordering::SeqCst);
                let why = format!(
                    "outpost: {MAX_CONNECTIONS} connections are open through the proxy; close some"
                );
                let _ = answer(&conn, "503 Service Unavailable", &why);
                continue;
            }
            let (allow, denied, open) = (allow.clone(), denied.clone(), open.clone());
            std::thread::spawn(move || {
                let _ = proxy(conn, &allow, &denied);
                open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    Ok(())
}

/// One client connection: its request head, then the tunnel or the refusal.
fn proxy(conn: UnixStream, allow: &[String], denied: &Path) -> io::Result<()> {
    conn.set_read_timeout(Some(HEAD_TIMEOUT))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let before = head.len();
        reader.read_until(b'\n', &mut head)?;
        if head.len() == before || head.len() > HEAD_MAX {
            return answer(
                &conn,
                "400 Bad Request",
                "outpost: a request head was expected",
            );
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let first = text.lines().next().unwrap_or_default();
    let mut words = first.split(' ');
    let (method, target, version) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let (authority, rewritten) = if method == "CONNECT" {
        (target.to_string(), None)
    } else if let Some(rest) = target.strip_prefix("http://") {
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let line = format!("{method} {path} {version}");
        (authority.to_string(), Some(text.replacen(first, &line, 1)))
    } else {
        return answer(
            &conn,
            "400 Bad Request",
            "outpost: the proxy takes CONNECT host:port, or an http:// URL",
        );
    };
    let (host, port) = split_port(&authority);
    let default = if method == "CONNECT" { 443 } else { 80 };
    let port: u16 = match port.map(str::parse).unwrap_or(Ok(default)) {
        Ok(p) => p,
        Err(_) => return answer(&conn, "400 Bad Request", "outpost: a bad port"),
    };
    if !allowed(allow, host, port) {
        // Bounded: the log lies outside the sandbox's disk limit.
        let room = std::fs::metadata(denied).map_or(0, |m| m.len()) < DENIED_MAX;
        let line = format!("{host}:{port}\n");
        if room && line.len() <= 300 {
            let _ = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(denied)
                .and_then(|mut f| f.write_all(line.as_bytes()));
        }
        return answer(
            &conn,
            "403 Forbidden",
            &format!(
                "outpost: egress to {host}:{port} is not in this sandbox's allow_hosts ({}); make a sandbox that lists it",
                allow.join(", ")
            ),
        );
    }
    let upstream = match connect(host, port) {
        Ok(s) => s,
        Err(e) => {
            return answer(
                &conn,
                "502 Bad Gateway",
                &format!("outpost: cannot reach {host}:{port}: {e}"),
            );
        }
    };
    conn.set_read_timeout(None)?;
    let mut to_upstream = upstream.try_clone()?;
    match rewritten {
        None => (&conn).write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?,
        Some(head) => to_upstream.write_all(head.as_bytes())?,
    }
    // What the client sent past its head goes on, then both ways at once.
    let buffered = reader.buffer().to_vec();
    to_upstream.write_all(&buffered)?;
    let mut from_client = reader.into_inner();
    let mut to_client = conn;
    let mut from_upstream = upstream;
    let down = std::thread::spawn(move || {
        let _ = io::copy(&mut from_upstream, &mut to_client);
        let _ = to_client.shutdown(Shutdown::Write);
    });
    let _ = io::copy(&mut from_client, &mut to_upstream);
    let _ = to_upstream.shutdown(Shutdown::Write);
    let _ = down.join();
    Ok(())
}

fn connect(host: &str, port: u16) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for addr in (host, port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn answer(mut conn: &UnixStream, status: &str, body: &str) -> io::Result<()> {
    let body = format!("{body}\n");
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Inside the sandbox: `127.0.0.1:`[`PORT`] carried to the proxy's socket,
/// until the process ends.
pub fn forward(socket: &Path) -> io::Result<()> {
    let listener = TcpListener::bind(("127.0.0.1", PORT))?;
    let socket = socket.to_path_buf();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let Ok(proxy) = UnixStream::connect(&socket) else {
                    return;
                };
                let (Ok(mut a_in), Ok(mut p_in)) = (conn.try_clone(), proxy.try_clone()) else {
                    return;
                };
                let (mut a_out, mut p_out) = (conn, proxy);
                let up = std::thread::spawn(move || {
                    let _ = io::copy(&mut a_in, &mut p_out);
                    let _ = p_out.shutdown(Shutdown::Write);
                });
                let _ = io::copy(&mut p_in, &mut a_out);
                let _ = a_out.shutdown(Shutdown::Write);
                let _ = up.join();
            });
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_match_names_suffixes_and_ports() {
        let allow: Vec<String> = ["pypi.org", "*.github.com", "localhost:8000", "[::1]:9"]
            .map(String::from)
            .to_vec();
        assert!(allowed(&allow, "pypi.org", 443));
        assert!(allowed(&allow, "PyPI.org.", 80));
        assert!(!allowed(&allow, "files.pypi.org", 443));
        assert!(allowed(&allow, "api.github.com", 443));
        assert!(!allowed(&allow, "github.com", 443));
        assert!(!allowed(&allow, "evilgithub.com", 443));
        assert!(allowed(&allow, "localhost", 8000));
        assert!(!allowed(&allow, "localhost", 8001));
        assert!(!allowed(&allow, "127.0.0.1", 8000));
        assert!(allowed(&allow, "::1", 9));
        for good in [
            "pypi.org",
            "*.github.com",
            "localhost:8000",
            "10.0.0.1:80",
            "[::1]:9",
        ] {
            assert_eq!(check_entry(good), Ok(()), "{good}");
        }
        for bad in ["", "*.", "a b", "x:0", "x:99999", "x/y"] {
            assert!(check_entry(bad).is_err(), "{bad}");
        }
    }
}
