//! The forks that start a command into a sandbox (see [`Entry`]): the
//! entrant, which takes the steps that apply to the command's parent (its
//! pid namespace) and forks the command as the supervisor's child (its own
//! sibling), and the command's own fork. Async-signal-safe calls only, as
//! in the rest of the supervisor.

use std::os::fd::RawFd;

use super::{
    ENTRANT_READ, ENTRANT_WRITE, ENTRY_FIRST, FIRST_FREE, Prepared, STACK_LEN, command_entry,
    errno, receive, run_command, tagged,
};
use crate::sandbox::cgroup_entry::fork_into;
use crate::sandbox::entry::{self, Entry};

/// Where slot `i` of a sandbox's descriptors is.
pub(super) fn slot(i: usize) -> RawFd {
    ENTRY_FIRST + i as RawFd
}

/// Starts the entrant, which joins what the command's parent must join
/// ([`Entry::before`]) and forks the command as this supervisor's child;
/// the command's pid, or why there is none. The entrant shares this
/// process's memory unless it joins a user namespace (a process that
/// shares its memory cannot); it ends once it has said the pid.
pub(super) unsafe fn start_entrant(p: &Prepared) -> Result<i32, entry::Failure> {
    // SAFETY: async-signal-safe calls only, as in `supervise`.
    unsafe {
        let entry = &*p.entry;
        // It shares this process's stack too, so it may not start a
        // command that would share it as well.
        let own_command_memory = Entry::joins_user(&entry.inside) || p.cgroup >= 0;
        let entrant = if Entry::joins_user(&entry.before) || !own_command_memory {
            let pid = fork_into(None, 0);
            if pid == 0 {
                entrant(p);
            }
            pid
        } else {
            libc::clone(
                entrant_entry,
                p.stack.add(STACK_LEN).cast(),
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                (p as *const Prepared).cast_mut().cast(),
            )
        };
        if entrant < 0 {
            return Err(errno());
        }
        libc::close(ENTRANT_WRITE);
        let mut said = [0u8; 5];
        let heard = receive(ENTRANT_READ, &mut said);
        libc::waitpid(entrant, std::ptr::null_mut(), 0);
        // The sandbox's namespaces are not held open for as long as the
        // command runs (or by the shim this process may become).
        for fd in ENTRANT_READ..FIRST_FREE {
            libc::close(fd);
        }
        let value = i32::from_le_bytes([said[1], said[2], said[3], said[4]]);
        match said[0] {
            b'P' if heard => Ok(value),
            _ if heard => Err(value),
            _ => Err(libc::ECHILD),
        }
    }
}

/// Starts the command of an entry (`flags`: 0 or `CLONE_PARENT`): in a
/// fork when it joins a user namespace or is born in a cgroup, else sharing
/// this process's memory until its exec, as `supervise` starts any command.
/// Its pid, or -1 and errno.
pub(super) unsafe fn fork_command(p: &Prepared, flags: libc::c_int) -> libc::pid_t {
    // SAFETY: async-signal-safe calls only, as in `supervise`.
    unsafe {
        if Entry::joins_user(&(*p.entry).inside) || p.cgroup >= 0 {
            let cgroup = (p.cgroup >= 0).then_some(p.cgroup);
            let pid = fork_into(cgroup, flags as u64);
            if pid == 0 {
                run_command(p);
            }
            return pid;
        }
        // A sibling shares its creator's exit signal.
        let signal = if flags & libc::CLONE_PARENT != 0 {
            0
        } else {
            libc::SIGCHLD
        };
        libc::clone(
            command_entry,
            p.stack.add(STACK_LEN).cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | flags | signal,
            (p as *const Prepared).cast_mut().cast(),
        )
    }
}

extern "C" fn entrant_entry(prepared: *mut libc::c_void) -> libc::c_int {
    // SAFETY: as for `command_entry`.
    unsafe { entrant(&*prepared.cast::<Prepared>()) }
}

/// The entrant: runs in the supervisor's clone or fork, never returns.
unsafe fn entrant(p: &Prepared) -> ! {
    // SAFETY: async-signal-safe calls only, as in `supervise`.
    unsafe {
        let entry = &*p.entry;
        if let Err(code) = entry.take(&entry.before, slot) {
            tagged(ENTRANT_WRITE, b'E', code);
            libc::_exit(0);
        }
        // CLONE_PARENT: the command is the supervisor's child, as any is.
        let command = fork_command(p, libc::CLONE_PARENT);
        if command < 0 {
            tagged(ENTRANT_WRITE, b'E', errno());
        } else {
            tagged(ENTRANT_WRITE, b'P', command);
        }
        libc::_exit(0);
    }
}
