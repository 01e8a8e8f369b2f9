//! The way into a bwrap sandbox, prepared before any fork: its namespaces
//! and root opened, and each step a plain value. The processes that take
//! the steps are forks of a threaded process, which may only make
//! async-signal-safe calls; so the steps are raw syscalls on descriptors
//! that already exist.
//!
//! The steps come in two parts. [`Entry::before`] is for the process that
//! forks the command: a pid namespace applies to the children of whoever
//! joined it, and joining it takes rights in the user namespace that owns
//! it. [`Entry::inside`] is for the command itself, before its exec: the
//! other namespaces, the holder's root, then (as root) the sandbox's own
//! uid and its user namespaces, its process limit, and no capabilities.
//! Root never joins the sandbox's user namespace itself: a root process in
//! there would hold every capability over the sandbox's files and mounts.
//!
//! Two take these steps: `outpost-agent enter` ([`super::enter`]), and a
//! supervised exec ([`crate::supervisor`]), which thereby starts a command
//! inside without an exec of the agent in between.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;

use crate::account::Account;

/// One step into the sandbox; descriptors are indices into [`Entry::fds`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `setns` to the namespace, of the kind the flag names.
    Join(usize, libc::c_int),
    /// The holder's root as `/`.
    Chroot(usize),
    /// The sandbox's own uid and gid, with no supplementary groups.
    Become(Account),
    /// `RLIMIT_NPROC`, counted per user namespace under bwrap.
    Nproc(u64),
    /// Every capability dropped (a joined user namespace grants them all),
    /// and no new privileges; the number is the kernel's last capability.
    DropCaps(u64),
    /// No new privileges (which Landlock and seccomp require).
    NoNewPrivs,
    /// The Landlock ruleset applied to itself.
    Landlock(usize),
    /// [`Entry::filter`] applied to itself.
    Seccomp,
}

/// Why a step failed, with the errno: `stage << 16 | errno`, small enough
/// for the supervisor's 4-byte messages.
pub type Failure = i32;

const STAGE_ACCOUNT: i32 = 1;
const STAGE_ROOT: i32 = 2;
const STAGE_LIMIT: i32 = 3;
const STAGE_PRIVILEGES: i32 = 4;
/// The working directory inside (taken by the supervisor, after the steps).
pub const STAGE_CWD: i32 = 5;
const STAGE_LANDLOCK: i32 = 6;
const STAGE_SECCOMP: i32 = 7;
/// A namespace: this plus its index in [`NS_NAMES`].
const STAGE_NAMESPACE: i32 = 8;

pub fn failure(stage: i32, errno: i32) -> Failure {
    stage << 16 | (errno & 0xffff)
}

/// A prepared way into one sandbox.
pub struct Entry {
    fds: Vec<OwnedFd>,
    /// For the process that forks the command.
    pub before: Vec<Step>,
    /// For the command, before its exec.
    pub inside: Vec<Step>,
    /// The cgroup (v2) the command is born in, when it has one.
    pub cgroup: Option<OwnedFd>,
    /// The seccomp program of [`Step::Seccomp`].
    filter: seccompiler::BpfProgram,
}

impl Entry {
    /// Opens the namespaces of the running `holder`. `account`: the uid the
    /// sandbox's commands run as (the agent is root); `nproc`: their limit.
    pub fn open(holder: i32, account: Option<Account>, nproc: Option<u64>) -> io::Result<Entry> {
        let ns = |name: &str| File::open(format!("/proc/{holder}/ns/{name}"));
        let as_root = is_root();
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut add = |f: File| {
            fds.push(f.into());
            fds.len() - 1
        };
        let user = ns("user")?;
        let user_ino = user.metadata()?.ino();
        // The user namespace that owns the mount namespace: bwrap's first.
        // Unprivileged bwrap nests a second one for the sandbox's uid map,
        // joined last.
        let owner = owner_of(&ns("mnt")?);
        let nested = match &owner {
            Some(first) => first.metadata()?.ino() != user_ino,
            None => false,
        };
        let first_user = add(owner.unwrap_or(user.try_clone()?));
        let nested_user = nested.then(|| add(user));
        let (mut before, mut inside) = (Vec::new(), Vec::new());
        if !as_root {
            before.push(Step::Join(first_user, libc::CLONE_NEWUSER));
        }
        for (name, flag) in [
            ("ipc", libc::CLONE_NEWIPC),
            ("uts", libc::CLONE_NEWUTS),
            ("net", libc::CLONE_NEWNET),
            ("pid", libc::CLONE_NEWPID),
            ("mnt", libc::CLONE_NEWNS),
        ] {
            let theirs = ns(name)?;
            // One the sandbox shares with the host (the network, when on)
            // is not joined: it belongs to the host's user namespace, which
            // grants nothing to a process in the sandbox's.
            let ours = std::fs::metadata(format!("/proc/self/ns/{name}"))?;
            if theirs.metadata()?.ino() == ours.ino() {
                continue;
            }
            let step = Step::Join(add(theirs), flag);
            if flag == libc::CLONE_NEWPID {
                before.push(step);
            } else {
                inside.push(step);
            }
        }
        inside.push(Step::Chroot(add(File::open(format!(
            "/proc/{holder}/root"
        ))?)));
        if as_root {
            if let Some(account) = account {
                inside.push(Step::Become(account));
            }
            inside.push(Step::Join(first_user, libc::CLONE_NEWUSER));
        }
        if let Some(nested) = nested_user {
            inside.push(Step::Join(nested, libc::CLONE_NEWUSER));
        }
        if let Some(n) = nproc {
            inside.push(Step::Nproc(n));
        }
        inside.push(Step::DropCaps(last_cap()));
        Ok(Entry {
            fds,
            before,
            inside,
            cgroup: None,
            filter: Vec::new(),
        })
    }

    /// Into a Landlock sandbox: its keeper's `ruleset`, then the socket
    /// `filter` if any, as the sandbox's `account` when the agent is root.
    pub fn landlock(
        ruleset: OwnedFd,
        filter: Option<seccompiler::BpfProgram>,
        account: Option<Account>,
    ) -> Entry {
        let mut inside = Vec::new();
        if is_root()
            && let Some(account) = account
        {
            inside.push(Step::Become(account));
        }
        inside.extend([Step::NoNewPrivs, Step::Landlock(0)]);
        if filter.is_some() {
            inside.push(Step::Seccomp);
        }
        Entry {
            fds: vec![ruleset],
            before: Vec::new(),
            inside,
            cgroup: None,
            filter: filter.unwrap_or_default(),
        }
    }

    /// Its descriptors, which a process taking the steps must have open at
    /// the index's number in `fd(index)`.
    pub fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.fds.iter().map(AsRawFd::as_raw_fd)
    }

    /// Descriptor `i` of this process's own.
    pub fn fd(&self, i: usize) -> RawFd {
        self.fds[i].as_raw_fd()
    }

    /// Whether `steps` join a user namespace, which a process that shares
    /// its memory with another cannot.
    pub fn joins_user(steps: &[Step]) -> bool {
        steps
            .iter()
            .any(|s| matches!(s, Step::Join(_, libc::CLONE_NEWUSER)))
    }

    /// Takes `steps`, finding descriptor `i` at `fd(i)`.
    ///
    /// # Safety
    /// Only async-signal-safe calls: fit for a fork of a threaded process.
    /// The caller must be single-threaded and share no filesystem context
    /// (a user or mount namespace is only joined by such a process).
    pub unsafe fn take(&self, steps: &[Step], fd: impl Fn(usize) -> RawFd) -> Result<(), Failure> {
        for step in steps {
            // SAFETY: plain syscalls on descriptors and values that exist.
            let (done, stage) = unsafe {
                match *step {
                    Step::Join(i, flag) => (
                        libc::setns(fd(i), flag) == 0,
                        STAGE_NAMESPACE + ns_index(flag),
                    ),
                    Step::Chroot(i) => (
                        libc::fchdir(fd(i)) == 0 && libc::chroot(c".".as_ptr()) == 0,
                        STAGE_ROOT,
                    ),
                    // Raw syscalls: glibc's wrappers would signal threads
                    // that only the parent has.
                    Step::Become(a) => (
                        libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) == 0
                            && libc::syscall(libc::SYS_setresgid, a.gid, a.gid, a.gid) == 0
                            && libc::syscall(libc::SYS_setresuid, a.uid, a.uid, a.uid) == 0,
                        STAGE_ACCOUNT,
                    ),
                    Step::Nproc(n) => {
                        let limit = libc::rlimit {
                            rlim_cur: n as libc::rlim_t,
                            rlim_max: n as libc::rlim_t,
                        };
                        (
                            libc::setrlimit(libc::RLIMIT_NPROC, &limit) == 0,
                            STAGE_LIMIT,
                        )
                    }
                    Step::DropCaps(last) => (drop_capabilities(last), STAGE_PRIVILEGES),
                    Step::NoNewPrivs => (
                        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0,
                        STAGE_PRIVILEGES,
                    ),
                    Step::Landlock(i) => (
                        libc::syscall(libc::SYS_landlock_restrict_self, fd(i), 0) == 0,
                        STAGE_LANDLOCK,
                    ),
                    Step::Seccomp => {
                        let program = libc::sock_fprog {
                            len: self.filter.len() as libc::c_ushort,
                            filter: self.filter.as_ptr().cast_mut().cast(),
                        };
                        let mode = libc::SECCOMP_MODE_FILTER as libc::c_ulong;
                        let program = &program as *const libc::sock_fprog;
                        (
                            libc::prctl(libc::PR_SET_SECCOMP, mode, program) == 0,
                            STAGE_SECCOMP,
                        )
                    }
                }
            };
            if !done {
                let errno = io::Error::last_os_error().raw_os_error();
                return Err(failure(stage, errno.unwrap_or(libc::EIO)));
            }
        }
        Ok(())
    }
}

/// What a [`Failure`] means, for the caller's error; `cwd`: the directory
/// the command was to start in.
pub fn describe(code: Failure, cwd: &str) -> io::Error {
    let os = io::Error::from_raw_os_error(code & 0xffff);
    let what = match code >> 16 {
        0 => return os,
        STAGE_ACCOUNT => "cannot become the sandbox's uid".to_string(),
        STAGE_ROOT => "cannot take the sandbox's root".to_string(),
        STAGE_LIMIT => "cannot limit processes".to_string(),
        STAGE_PRIVILEGES => "cannot drop privileges".to_string(),
        STAGE_CWD => format!("cannot enter {cwd} inside the sandbox"),
        STAGE_LANDLOCK => "landlock".to_string(),
        STAGE_SECCOMP => "seccomp".to_string(),
        n => format!(
            "cannot enter the sandbox's {} namespace",
            NS_NAMES
                .get((n - STAGE_NAMESPACE) as usize)
                .map_or("?", |(name, _)| name)
        ),
    };
    io::Error::new(os.kind(), format!("{what}: {os}"))
}

const NS_NAMES: [(&str, libc::c_int); 6] = [
    ("user", libc::CLONE_NEWUSER),
    ("ipc", libc::CLONE_NEWIPC),
    ("uts", libc::CLONE_NEWUTS),
    ("network", libc::CLONE_NEWNET),
    ("pid", libc::CLONE_NEWPID),
    ("mount", libc::CLONE_NEWNS),
];

fn ns_index(flag: libc::c_int) -> i32 {
    NS_NAMES.iter().position(|(_, f)| *f == flag).unwrap_or(0) as i32
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The user namespace that owns the namespace `ns` is.
fn owner_of(ns: &File) -> Option<File> {
    const NS_GET_USERNS: libc::c_ulong = 0xb701;
    // SAFETY: ioctl on an open namespace descriptor; returns a new fd.
    let owner = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_USERNS) };
    // SAFETY: a descriptor the kernel just gave us.
    (owner >= 0).then(|| unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(owner) })
}

fn last_cap() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// Drops every capability and sets no-new-privileges, as bubblewrap does
/// for its own command. Only raw syscalls.
unsafe fn drop_capabilities(last_cap: u64) -> bool {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    // SAFETY: prctl and capset with valid arguments.
    unsafe {
        for cap in 0..=last_cap {
            // EINVAL for caps this kernel lacks: nothing to drop.
            libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
        }
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        let header = Header {
            version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
            pid: 0,
        };
        let data = [Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        libc::syscall(libc::SYS_capset, &header, data.as_ptr()) == 0
            && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    }
}

impl super::Scope {
    /// The way in for a command that starts without `enter` (see
    /// [`crate::supervisor`]): a bwrap sandbox whose cgroup, if it has one,
    /// a child can be born into. None where only `enter` will do, which
    /// also says what is wrong with a sandbox that cannot be entered.
    pub fn entry(&self) -> Result<Option<Entry>, String> {
        use outpost_protocol::Isolation;
        self.dirs.may_start()?;
        if self.dirs.ending() {
            return Ok(None);
        }
        let Ok(Ok(cgroup)) = super::cgroup_entry::CgroupEntry::open(&self.setup.cgroups)
            .map(super::cgroup_entry::CgroupEntry::into_v2)
        else {
            return Ok(None);
        };
        let entry = match self.setup.isolation {
            Isolation::Bwrap => {
                let Some(holder) = self.setup.holder.as_ref().filter(|h| h.alive()) else {
                    return Ok(None);
                };
                Entry::open(holder.pid, self.account, self.setup.nproc).ok()
            }
            // Only with the keeper's ruleset: `enter` builds one itself.
            Isolation::Landlock => self.dirs.keeper().and_then(|keeper| {
                let rules = super::ruleset::fetch(
                    &self.dirs.meta().join(super::ruleset::SOCKET),
                    keeper.pid,
                )?;
                let filter = super::isolation::socket_program(self.spec.network).ok()?;
                Some(Entry::landlock(rules, filter, self.account))
            }),
            _ => None,
        };
        Ok(entry.map(|entry| Entry { cgroup, ..entry }))
    }

    /// A command's whole environment when it starts through an [`Entry`]:
    /// what `enter` would give it, with `token` (name, value) and the
    /// sandbox's marker, which nothing overrides.
    pub fn entry_env(
        &self,
        env: &[(String, String)],
        token: (&str, &str),
    ) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
        let mut all: Vec<(std::ffi::OsString, std::ffi::OsString)> = Vec::new();
        let last = [
            (token.0.into(), token.1.into()),
            (super::store::MARKER_VAR.into(), self.dirs.id.clone().into()),
        ];
        for (name, value) in self.environment(env).into_iter().chain(last) {
            all.retain(|(n, _)| *n != name);
            all.push((name, value));
        }
        all
    }
}
