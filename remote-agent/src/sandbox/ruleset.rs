//! A Landlock sandbox's ruleset, built once by its keeper and handed to
//! each `enter` over a socket in the sandbox's `meta` dir, so a command
//! pays a connect and a `recvmsg` instead of opening every path the rules
//! name (a hundred and more: each entry of `/dev` beside the hidden ones).
//!
//! `enter` takes a ruleset only from the process that the sandbox records
//! as its keeper (the socket's peer credentials say who listens), and
//! builds the same rules itself when there is none: never weaker rules.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

/// The socket's name in `meta`.
pub const SOCKET: &str = "landlock.sock";

/// Serves `ruleset` on `path` for as long as this process lives.
pub fn serve(path: &Path, ruleset: OwnedFd) -> io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let _ = send_fd(&stream, ruleset.as_raw_fd());
        }
    });
    Ok(())
}

/// The ruleset the keeper `keeper_pid` serves on `path`, if it does.
pub fn fetch(path: &Path, keeper_pid: i32) -> Option<OwnedFd> {
    let stream = UnixStream::connect(path).ok()?;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt fills the ucred it is given, of the given size.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 || cred.pid != keeper_pid {
        return None;
    }
    receive_fd(&stream)
}

/// One byte of payload and room for one descriptor: what each side passes
/// to `sendmsg` / `recvmsg`. The header points into `self`, so it is built
/// where it is used.
struct OneFd {
    byte: [u8; 1],
    iov: libc::iovec,
    control: Vec<u8>,
}

impl OneFd {
    fn new() -> OneFd {
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        OneFd {
            byte: [0],
            iov: libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 1,
            },
            control: vec![0u8; space],
        }
    }

    fn header(&mut self) -> libc::msghdr {
        self.iov.iov_base = self.byte.as_mut_ptr().cast();
        // SAFETY: a zeroed msghdr is valid; it points at buffers of `self`.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut self.iov;
        msg.msg_iovlen = 1;
        msg.msg_control = self.control.as_mut_ptr().cast();
        msg.msg_controllen = self.control.len() as _;
        msg
    }
}

fn send_fd(stream: &UnixStream, fd: RawFd) -> io::Result<()> {
    let mut one = OneFd::new();
    let msg = one.header();
    // SAFETY: the one cmsg header is written within `control`.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        if libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

pub(super) fn receive_fd(stream: &UnixStream) -> Option<OwnedFd> {
    let mut one = OneFd::new();
    let mut msg = one.header();
    // SAFETY: recvmsg into `one`'s buffers; a descriptor received is ours.
    unsafe {
        if libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) != 1 {
            return None;
        }
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return None;
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
        Some(OwnedFd::from_raw_fd(fd))
    }
}
