//! stdin and stdout as async streams, for a protocol spoken on them: the
//! agent's (sshd's pipes) and `outpost mcp`'s (an MCP client's pipes, or
//! the socket pairs Node-based clients give their servers).
//!
//! tokio's own stdin and stdout hand every read, write and flush to a
//! blocking thread and back: several thread switches per message, which was
//! most of an agent's CPU per metrics answer and a third of the controller's
//! per MCP call. Pipes and stream sockets are instead registered with the
//! runtime and polled like any socket. Anything else (a terminal, a file)
//! keeps tokio's.
//!
//! Registering sets the descriptor non-blocking. That flag lives on the open
//! pipe or socket end, so it is shared with whoever holds the same end (the
//! descriptor's copies, a child that inherited it, a parent that did not
//! exec), never with the other end. Children started while these streams are
//! open must get stdio of their own.
//!
//! A separate crate because the controller links no part of the agent.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::unix::pipe;

/// An input stream.
pub type Input = Box<dyn AsyncRead + Unpin + Send>;
/// An output stream.
pub type Output = Box<dyn AsyncWrite + Unpin + Send>;

/// stdin and stdout; must be called inside a tokio runtime with IO enabled.
/// Both stay open for the life of the process: the streams own duplicates.
pub fn streams() -> (Input, Output) {
    let input: Input = match dup(libc::STDIN_FILENO) {
        Some(fd) if is_stream_socket(&fd) => match socket(fd) {
            Ok(socket) => Box::new(socket),
            Err(_) => Box::new(tokio::io::stdin()),
        },
        Some(fd) => match pipe::Receiver::from_owned_fd(fd) {
            Ok(pipe) => Box::new(pipe),
            Err(_) => Box::new(tokio::io::stdin()),
        },
        None => Box::new(tokio::io::stdin()),
    };
    let output: Output = match dup(libc::STDOUT_FILENO) {
        Some(fd) if is_stream_socket(&fd) => match socket(fd) {
            Ok(socket) => Box::new(socket),
            Err(_) => Box::new(tokio::io::stdout()),
        },
        Some(fd) => match pipe::Sender::from_owned_fd(fd) {
            Ok(pipe) => Box::new(pipe),
            Err(_) => Box::new(tokio::io::stdout()),
        },
        None => Box::new(tokio::io::stdout()),
    };
    (input, output)
}

/// A close-on-exec duplicate of one of the standard descriptors.
fn dup(fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: `fd` is 0 or 1, open for the whole process; it is only
    // duplicated here, never closed.
    unsafe { BorrowedFd::borrow_raw(fd) }
        .try_clone_to_owned()
        .ok()
}

/// A connected stream socket (a socket pair's end, a TCP connection).
fn is_stream_socket(fd: &OwnedFd) -> bool {
    let fd = fd.as_fd();
    let mut kind: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: SO_TYPE writes one c_int into `kind`, whose size `len` gives;
    // on anything but a socket it fails with ENOTSOCK.
    let got = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&raw mut kind).cast(),
            &mut len,
        )
    };
    got == 0 && kind == libc::SOCK_STREAM
}

/// A stream socket registered with the runtime. tokio's UnixStream only
/// reads, writes and shuts down the descriptor, which any stream socket
/// allows.
fn socket(fd: OwnedFd) -> std::io::Result<tokio::net::UnixStream> {
    let socket = std::os::unix::net::UnixStream::from(fd);
    socket.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(socket)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_pipes_and_files_are_told_apart() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(is_stream_socket(&OwnedFd::from(a)));
        let (reader, _writer) = std::io::pipe().unwrap();
        assert!(!is_stream_socket(&OwnedFd::from(reader)));
        let file = std::fs::File::open("/proc/self/status").unwrap();
        assert!(!is_stream_socket(&OwnedFd::from(file)));
        let datagram = std::os::unix::net::UnixDatagram::unbound().unwrap();
        assert!(!is_stream_socket(&OwnedFd::from(datagram)));
    }
}
