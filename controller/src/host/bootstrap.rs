//! Getting a matching agent running on a host: probe, pick, upload, verify.
//!
//! 1. One probe command reports OS, arch, libc and `$HOME` (only the lines after a
//!    marker are parsed, so shell rc noise cannot confuse it).
//! 2. [`Artifacts`] picks the agent build that fits: the one built next to this
//!    controller when the host matches it, else a portable build from an agents
//!    directory (`<arch>-linux-gnu` for glibc ≥ its `min-glibc`, `<arch>-linux-musl`).
//! 3. The installed agent lives at `<remote_dir>/agents/<version>-<hash12>/outpost-agent`.
//!    It is started first; only when it is missing, or reports another build hash
//!    or protocol version, is it copied in ([`Host::copy_in`]: over SFTP, or
//!    through a command host's own stream; temp name, mode 0700, rename) and
//!    started again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outpost_protocol::Hello;

use super::link::{LinkReader, read_hello};
use super::{AgentLink, CapturedRun, Host};

const PROBE_MARKER: &str = "__OUTPOST_PROBE__";

/// What the probe learned about a host.
#[derive(Debug, Clone, PartialEq)]
pub struct HostFacts {
    pub os: String,
    pub arch: String,
    /// None when not glibc (musl or unknown).
    pub glibc: Option<(u32, u32)>,
    pub libc_line: String,
    pub home: String,
}

pub fn probe_command() -> String {
    format!(
        "printf '\\n{PROBE_MARKER}\\n'; uname -s; uname -m; (ldd --version 2>&1 || true) | head -n1; printf '%s\\n' \"$HOME\""
    )
}

pub fn parse_probe(stdout: &[u8]) -> Result<HostFacts, String> {
    let text = String::from_utf8_lossy(stdout);
    let after = text
        .rsplit_once(PROBE_MARKER)
        .map(|(_, rest)| rest)
        .ok_or_else(|| format!("host probe printed no marker; output was {text:?}"))?;
    let lines: Vec<&str> = after.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.len() < 4 {
        return Err(format!("host probe output incomplete: {after:?}"));
    }
    let n = lines.len();
    let (os, arch, libc_line, home) = (lines[n - 4], lines[n - 3], lines[n - 2], lines[n - 1]);
    let glibc = parse_glibc(libc_line);
    Ok(HostFacts {
        os: os.trim().to_lowercase(),
        arch: normalize_arch(arch.trim()),
        glibc,
        libc_line: libc_line.trim().to_string(),
        home: home.trim().to_string(),
    })
}

/// `ldd (Debian GLIBC 2.36-9) 2.36` → (2, 36). musl's ldd prints "musl libc".
fn parse_glibc(line: &str) -> Option<(u32, u32)> {
    let lower = line.to_lowercase();
    if !(lower.contains("glibc") || lower.contains("gnu libc")) {
        return None;
    }
    line.split_whitespace().rev().find_map(parse_version)
}

fn parse_version(s: &str) -> Option<(u32, u32)> {
    let mut parts = s.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts
        .next()?
        .trim_end_matches(|c: char| !c.is_ascii_digit());
    Some((major, minor.parse().ok()?))
}

fn normalize_arch(arch: &str) -> String {
    match arch {
        "amd64" => "x86_64".into(),
        "arm64" => "aarch64".into(),
        other => other.to_string(),
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Libc {
    /// Needs glibc at least this version.
    Gnu {
        min: (u32, u32),
    },
    Musl,
}

/// One agent build the controller can install.
#[derive(Debug, Clone)]
pub struct Artifact {
    pub path: PathBuf,
    pub os: String,
    pub arch: String,
    pub libc: Libc,
    pub label: String,
    /// Shared by clones, so a hash taken ahead serves them all.
    hash: Arc<ArtifactHash>,
}

/// An artifact's hash, kept with the identity of the file it was taken of.
#[derive(Debug, Default)]
struct ArtifactHash {
    taken: Mutex<Option<(FileId, String)>>,
    /// Whether [`Artifacts::hash_ahead`] has started hashing it.
    ahead: AtomicBool,
}

/// Device, inode, size and mtime: a rebuilt file differs in one of them.
type FileId = (u64, u64, u64, i64);

fn file_id(meta: &std::fs::Metadata) -> FileId {
    use std::os::unix::fs::MetadataExt;
    (
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
    )
}

impl Artifact {
    /// BLAKE3 of the file, hex; hashed again only when the file is not the
    /// one hashed before (a rebuild while the server runs).
    pub fn hash(&self) -> std::io::Result<String> {
        // One hashing at a time: a fleet connecting at once would otherwise
        // read and hash the same file once per host before the first result
        // lands.
        static HASHING: Mutex<()> = Mutex::new(());
        let id = file_id(&std::fs::metadata(&self.path)?);
        if let Some(h) = self.hash_of(id) {
            return Ok(h);
        }
        let _one = HASHING.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = self.hash_of(id) {
            return Ok(h);
        }
        let mut file = std::fs::File::open(&self.path)?;
        let before = file_id(&file.metadata()?);
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut bytes)?;
        let h = blake3::hash(&bytes).to_hex().to_string();
        // Kept only if the file did not change while it was read.
        if file_id(&file.metadata()?) == before {
            *self.hash.taken.lock().unwrap_or_else(|p| p.into_inner()) = Some((before, h.clone()));
        }
        Ok(h)
    }

    fn hash_of(&self, id: FileId) -> Option<String> {
        let taken = self.hash.taken.lock().unwrap_or_else(|p| p.into_inner());
        taken
            .as_ref()
            .filter(|(of, _)| *of == id)
            .map(|(_, h)| h.clone())
    }

    fn fits(&self, host: &HostFacts) -> bool {
        if self.os != host.os || self.arch != host.arch {
            return false;
        }
        match (&self.libc, host.glibc) {
            (Libc::Musl, _) => true,
            (Libc::Gnu { min }, Some(have)) => have >= *min,
            (Libc::Gnu { .. }, None) => false,
        }
    }
}

/// The agent builds found on this machine.
#[derive(Debug, Clone)]
pub struct Artifacts {
    pub native: Option<Artifact>,
    pub portable: Vec<Artifact>,
    pub searched: Vec<PathBuf>,
}

impl Artifacts {
    /// Hashes the native build on a thread of its own, once, so that the
    /// first connection finds the hash ready after its SSH handshake instead
    /// of reading and hashing the file (several MB) then.
    pub fn hash_ahead(&self) {
        if let Some(native) = self.native.clone()
            && !native.hash.ahead.swap(true, Ordering::Relaxed)
        {
            let _ = std::thread::Builder::new()
                .name("agent-hash".into())
                .spawn(move || native.hash().map(|_| ()));
        }
    }

    /// Finds the native agent (`agent_bin`, else next to the controller
    /// executable) and portable builds under `extra_dirs`, `<exe dir>/agents` and
    /// the source tree's `dist/agents`.
    pub fn discover(agent_bin: Option<&Path>, extra_dirs: &[PathBuf]) -> Artifacts {
        let exe_dir = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf));
        let native_path = agent_bin
            .map(Path::to_path_buf)
            .or_else(|| exe_dir.as_ref().map(|d| d.join("outpost-agent")))
            .filter(|p| p.is_file());
        let native = native_path.map(|path| Artifact {
            path,
            os: std::env::consts::OS.into(),
            arch: std::env::consts::ARCH.into(),
            libc: native_libc(),
            label: "native build".into(),
            hash: Default::default(),
        });
        let mut dirs: Vec<PathBuf> = extra_dirs.to_vec();
        if let Some(d) = &exe_dir {
            dirs.push(d.join("agents"));
            // target/{debug,release}/ → <repo>/dist/agents
            if let Some(repo) = d.parent().and_then(Path::parent) {
                dirs.push(repo.join("dist/agents"));
            }
        }
        let mut portable = Vec::new();
        for dir in &dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                let bin = entry.path().join("outpost-agent");
                if !bin.is_file() {
                    continue;
                }
                // <arch>-linux-<gnu|musl>
                let parts: Vec<&str> = name.splitn(3, '-').collect();
                if parts.len() != 3 {
                    continue;
                }
                let libc = match parts[2] {
                    "gnu" => {
                        let min = std::fs::read_to_string(entry.path().join("min-glibc"))
                            .ok()
                            .and_then(|s| parse_version(&s))
                            .unwrap_or((2, 17));
                        Libc::Gnu { min }
                    }
                    "musl" => Libc::Musl,
                    _ => continue,
                };
                portable.push(Artifact {
                    path: bin,
                    os: parts[1].into(),
                    arch: parts[0].into(),
                    libc,
                    label: format!("{name} from {}", dir.display()),
                    hash: Default::default(),
                });
            }
        }
        Artifacts {
            native,
            portable,
            searched: dirs,
        }
    }

    /// Why no host can get an agent: no build was found at all (not a
    /// portability problem: the agent was never installed).
    pub fn missing(&self) -> Option<String> {
        if self.native.is_some() || !self.portable.is_empty() {
            return None;
        }
        let beside = std::env::current_exe()
            .ok()
            .and_then(|p| Some(p.parent()?.join("outpost-agent")))
            .map_or("beside outpost".into(), |p| p.display().to_string());
        Some(format!(
            "outpost-agent is missing: it belongs at {beside} (or name it with $OUTPOST_AGENT_BIN); \
             `cargo install --locked --path remote-agent` installs it beside a cargo-installed \
             outpost, `scripts/run` builds both"
        ))
    }

    /// The best build for `host`: native first (always in step with this
    /// controller), then portable glibc (can load NVML), then static musl.
    pub fn pick(&self, host: &HostFacts) -> Result<&Artifact, String> {
        let mut candidates: Vec<&Artifact> = self.native.iter().collect();
        let mut portable: Vec<&Artifact> = self.portable.iter().collect();
        portable.sort_by_key(|a| matches!(a.libc, Libc::Musl));
        candidates.extend(portable);
        if let Some(a) = candidates.into_iter().find(|a| a.fits(host)) {
            return Ok(a);
        }
        let have: Vec<String> = self
            .native
            .iter()
            .chain(&self.portable)
            .map(|a| format!("{} ({} {} {})", a.label, a.os, a.arch, libc_text(&a.libc)))
            .collect();
        if let Some(missing) = self.missing() {
            return Err(missing);
        }
        let wanted_dir = format!(
            "{}-{}-{}",
            host.arch,
            host.os,
            if host.glibc.is_some() { "gnu" } else { "musl" }
        );
        Err(format!(
            "no outpost-agent build fits this host ({} {}, {}). Available: {}. Build one with scripts/build-agents (portable glibc 2.17 and musl builds; needs `pip install ziglang cargo-zigbuild` and the Rust target for {}), or place a build at <agents dir>/{wanted_dir}/outpost-agent (searched: {})",
            host.os,
            host.arch,
            if host.libc_line.is_empty() {
                "libc unknown"
            } else {
                &host.libc_line
            },
            if have.is_empty() {
                "none".to_string()
            } else {
                have.join(", ")
            },
            host.arch,
            self.searched
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

fn libc_text(libc: &Libc) -> String {
    match libc {
        Libc::Gnu { min } => format!("glibc ≥ {}.{}", min.0, min.1),
        Libc::Musl => "static musl".into(),
    }
}

#[cfg(target_env = "gnu")]
fn native_libc() -> Libc {
    // SAFETY: returns a pointer to a static NUL-terminated string.
    let version = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
    let min = parse_version(&version.to_string_lossy()).unwrap_or((2, 17));
    Libc::Gnu { min }
}

#[cfg(not(target_env = "gnu"))]
fn native_libc() -> Libc {
    Libc::Musl
}

/// Shell-quotes `s` for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The command that starts the agent of build `hash` installed under
/// `remote_dir`, the shell expanding `~` (as the probe's `$HOME` does): for
/// starting it before the probe has answered.
fn guessed_start_command(remote_dir: &str, hash: &str) -> String {
    let dir = remote_dir.trim_end_matches('/');
    let agent = agent_path(dir, hash);
    match dir.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            let rest = &agent[1..];
            format!("exec \"$HOME\"{} serve", shell_quote(rest))
        }
        _ => format!("exec {} serve", shell_quote(&agent)),
    }
}

/// The directory of the agent of build `hash` under `state_dir`.
fn version_dir(state_dir: &str, hash: &str) -> String {
    format!(
        "{state_dir}/agents/{}-{}",
        env!("CARGO_PKG_VERSION"),
        &hash[..12]
    )
}

/// Where the agent of build `hash` lives under `state_dir`.
fn agent_path(state_dir: &str, hash: &str) -> String {
    format!("{}/outpost-agent", version_dir(state_dir, hash))
}

/// The remote state dir with `~` expanded against the probed home.
pub fn remote_state_dir(remote_dir: &str, facts: &HostFacts) -> String {
    let dir = remote_dir.trim_end_matches('/');
    match dir.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("{}{rest}", facts.home),
        _ => dir.to_string(),
    }
}

/// A started agent and what it said about itself.
pub struct Started {
    pub link: AgentLink,
    pub reader: LinkReader,
    pub hello: Hello,
    pub agent_path: String,
    pub uploaded: bool,
    /// What the probe found; none for an agent started in place.
    pub facts: Option<HostFacts>,
}

/// Starts the controller's own agent build where it lies: for a host that
/// shares this machine's filesystem.
pub async fn start_in_place(
    host: &dyn Host,
    artifacts: &Artifacts,
    timeout: Duration,
) -> Result<Started, String> {
    let artifact = artifacts.native.as_ref().ok_or_else(|| {
        "the local sandbox needs outpost-agent next to the outpost binary (cargo build --workspace builds both), or OUTPOST_AGENT_BIN".to_string()
    })?;
    let agent_path = artifact.path.display().to_string();
    let mut link = host
        .open(&format!("exec {} serve", shell_quote(&agent_path)))
        .await
        .map_err(|e| format!("cannot start {agent_path}: {e}"))?;
    let (reader, hello) = read_hello(&mut link, timeout).await?;
    Ok(Started {
        link,
        reader,
        hello,
        agent_path,
        uploaded: false,
        facts: None,
    })
}

/// Probes the host, then starts (installing first if needed) the fitting
/// agent under `remote_dir`.
///
/// The agent this controller would pick for a host like its own machine
/// (the common case) is started beside the probe, which saves a round trip;
/// the probe's facts then confirm that guess or it is dropped (its channel
/// closed, so it exits) and the fitting one started.
pub async fn start_installed(
    host: &dyn Host,
    remote_dir: &str,
    artifacts: &Artifacts,
    timeout: Duration,
) -> Result<Started, String> {
    let guess = artifacts
        .native
        .as_ref()
        .and_then(|native| native.hash().ok())
        .map(|hash| (guessed_start_command(remote_dir, &hash), hash));
    let mut early = Box::pin(async {
        match &guess {
            Some((command, hash)) => Some(try_start(host, command, hash, timeout).await),
            None => None,
        }
    });
    let mut early_done = None;
    let probe_command = probe_command();
    let probe = {
        let mut probe = std::pin::pin!(host.run(&probe_command));
        loop {
            tokio::select! {
                done = &mut probe => break done,
                started = &mut early, if early_done.is_none() => early_done = Some(started),
            }
        }
    };
    let probe = probe.map_err(|e| format!("host probe failed: {e}"))?;
    let facts = parse_probe(&probe.stdout).map_err(|e| probe_failure(e, &probe))?;
    let artifact = artifacts.pick(&facts)?;
    let hash = artifact
        .hash()
        .map_err(|e| format!("cannot read agent {}: {e}", artifact.path.display()))?;
    let state_dir = remote_state_dir(remote_dir, &facts);
    let version_dir = version_dir(&state_dir, &hash);
    let agent_path = agent_path(&state_dir, &hash);
    let command = format!("exec {} serve", shell_quote(&agent_path));
    let started = |(link, reader, hello), uploaded| Started {
        link,
        reader,
        hello,
        agent_path: agent_path.clone(),
        uploaded,
        facts: Some(facts.clone()),
    };

    // The guess started this very build at this very path.
    let guessed = guess.as_ref().is_some_and(|(_, h)| *h == hash);
    let first = if guessed {
        let started = match early_done {
            Some(started) => started,
            None => early.await,
        };
        started.unwrap_or_else(|| Err("no agent was started".into()))
    } else {
        // A wrong guess is seen through, so that its channel is open and
        // its agent exits as the link is dropped (a channel dropped while
        // opening would stay open), beside the right start.
        let wrong = async move {
            if early_done.is_none() {
                early.await;
            }
        };
        tokio::join!(wrong, try_start(host, &command, &hash, timeout)).1
    };
    let reason = match first {
        Ok(running) => return Ok(started(running, false)),
        Err(reason) => reason,
    };
    tracing::info!("installing agent at {agent_path} ({reason})");
    let dirs = [
        state_dir.clone(),
        format!("{state_dir}/agents"),
        version_dir.clone(),
    ];
    host.copy_in(&artifact.path, &dirs, &agent_path)
        .await
        .map_err(|e| format!("cannot install the agent at {agent_path}: {e}"))?;
    match try_start(host, &command, &hash, timeout).await {
        Ok(running) => Ok(started(running, true)),
        Err(reason) => Err(format!(
            "the freshly installed agent at {agent_path} does not start: {reason}"
        )),
    }
}

/// A probe without a usable answer, explained by how it exited and the end
/// of its stderr: where a host that cannot be reached (a pod that is gone, a
/// job that ended) says why.
fn probe_failure(why: String, probe: &CapturedRun) -> String {
    let stderr = String::from_utf8_lossy(&probe.stderr);
    let mut stderr = stderr.trim();
    let mut start = stderr.len().saturating_sub(1000);
    while !stderr.is_char_boundary(start) {
        start += 1;
    }
    stderr = &stderr[start..];
    match (probe.exit_status, stderr.is_empty()) {
        (Some(0), true) => why,
        (Some(0), false) => format!("{why}; stderr: {stderr}"),
        (status, _) => {
            let how = match status {
                Some(code) => format!("exited with status {code}"),
                None => "ended without an exit status".to_string(),
            };
            if stderr.is_empty() {
                format!(
                    "host probe {how} and printed {:?}",
                    String::from_utf8_lossy(&probe.stdout)
                )
            } else {
                format!("host probe {how}: {stderr}")
            }
        }
    }
}

async fn try_start(
    host: &dyn Host,
    command: &str,
    expected_hash: &str,
    timeout: Duration,
) -> Result<(AgentLink, LinkReader, Hello), String> {
    let mut link = host.open(command).await?;
    let (reader, hello) = read_hello(&mut link, timeout).await?;
    if hello.build_hash != expected_hash {
        return Err(format!(
            "installed agent reports build {}…, expected {}…",
            &hello.build_hash.get(..12).unwrap_or(&hello.build_hash),
            &expected_hash[..12]
        ));
    }
    Ok((link, reader, hello))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guessed_start_names_the_path_the_probe_leads_to() {
        let hash = "0123456789abcdef0123";
        let facts = HostFacts {
            os: "linux".into(),
            arch: "x86_64".into(),
            glibc: Some((2, 36)),
            libc_line: String::new(),
            home: "/home/u".into(),
        };
        let version = env!("CARGO_PKG_VERSION");
        for (remote_dir, guessed) in [
            (
                "~/.outpost/",
                format!(
                    "exec \"$HOME\"'/.outpost/agents/{version}-0123456789ab/outpost-agent' serve"
                ),
            ),
            (
                "/var/lib/o'p",
                format!(
                    "exec '/var/lib/o'\\''p/agents/{version}-0123456789ab/outpost-agent' serve"
                ),
            ),
        ] {
            assert_eq!(guessed_start_command(remote_dir, hash), guessed);
            let expanded = guessed.replace("\"$HOME\"'", "'/home/u");
            let probed = agent_path(&remote_state_dir(remote_dir, &facts), hash);
            assert_eq!(expanded, format!("exec {} serve", shell_quote(&probed)));
        }
    }

    #[test]
    fn probe_output_after_noise() {
        let out = format!(
            "Welcome!\nfortune of the day\n\n{PROBE_MARKER}\nLinux\nx86_64\nldd (Debian GLIBC 2.36-9+deb12u4) 2.36\n/home/u\n"
        );
        let facts = parse_probe(out.as_bytes()).unwrap();
        assert_eq!(facts.os, "linux");
        assert_eq!(facts.arch, "x86_64");
        assert_eq!(facts.glibc, Some((2, 36)));
        assert_eq!(facts.home, "/home/u");
        let musl = format!("\n{PROBE_MARKER}\nLinux\naarch64\nmusl libc (aarch64)\n/root\n");
        assert_eq!(parse_probe(musl.as_bytes()).unwrap().glibc, None);
        assert!(parse_probe(b"garbage").is_err());
    }

    /// A hash taken ahead serves the clones; a build replaced in place (same
    /// inode and size, a new mtime) or by a new file is hashed again.
    #[test]
    fn an_artifact_rebuilt_while_the_controller_runs_is_hashed_again() {
        let dir = std::env::temp_dir().join(format!("outpost-artifact-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("outpost-agent");
        std::fs::write(&path, b"build one").unwrap();
        let native = Artifact {
            path: path.clone(),
            ..artifact("x86_64", Libc::Musl)
        };
        let hex = |b: &[u8]| blake3::hash(b).to_hex().to_string();
        let artifacts = Artifacts {
            native: Some(native.clone()),
            portable: Vec::new(),
            searched: Vec::new(),
        };
        artifacts.hash_ahead();
        assert_eq!(native.hash().unwrap(), hex(b"build one"));

        let file = std::fs::File::options().write(true).open(&path).unwrap();
        std::io::Write::write_all(&mut &file, b"build two").unwrap();
        file.set_modified(std::time::SystemTime::UNIX_EPOCH)
            .unwrap();
        assert_eq!(native.hash().unwrap(), hex(b"build two"));
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"build three, longer").unwrap();
        assert_eq!(native.hash().unwrap(), hex(b"build three, longer"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn artifact(arch: &str, libc: Libc) -> Artifact {
        Artifact {
            path: PathBuf::from("/x"),
            os: "linux".into(),
            arch: arch.into(),
            libc,
            label: "test".into(),
            hash: Default::default(),
        }
    }

    #[test]
    fn picks_the_fitting_build_or_says_what_is_missing() {
        let facts = HostFacts {
            os: "linux".into(),
            arch: "x86_64".into(),
            glibc: Some((2, 31)),
            libc_line: "ldd 2.31".into(),
            home: "/h".into(),
        };
        let arts = Artifacts {
            native: Some(artifact("x86_64", Libc::Gnu { min: (2, 36) })),
            portable: vec![
                artifact("x86_64", Libc::Musl),
                artifact("x86_64", Libc::Gnu { min: (2, 17) }),
            ],
            searched: vec![],
        };
        // Native needs 2.36; the portable glibc build wins over musl.
        assert_eq!(arts.pick(&facts).unwrap().libc, Libc::Gnu { min: (2, 17) });
        let arm = HostFacts {
            arch: "aarch64".into(),
            ..facts
        };
        let err = arts.pick(&arm).unwrap_err();
        assert!(err.contains("aarch64-linux-gnu"), "{err}");
        assert!(err.contains("scripts/build-agents"), "{err}");
        // No build at all: the install is incomplete, whatever the host.
        let none = Artifacts {
            native: None,
            portable: vec![],
            searched: vec![],
        };
        let err = none.pick(&arm).unwrap_err();
        assert!(
            err.starts_with("outpost-agent is missing: it belongs at /")
                && err.contains("cargo install"),
            "{err}"
        );
    }

    #[test]
    fn a_failed_probe_says_how_it_ended() {
        let why = parse_probe(b"").unwrap_err();
        let run = |status, stderr: &str| CapturedRun {
            exit_status: status,
            stdout: Vec::new(),
            stderr: stderr.as_bytes().to_vec(),
        };
        let gone = probe_failure(why.clone(), &run(Some(1), "error: pods \"p\" not found\n"));
        assert_eq!(
            gone,
            "host probe exited with status 1: error: pods \"p\" not found"
        );
        let quiet = probe_failure(why.clone(), &run(None, ""));
        assert_eq!(
            quiet,
            "host probe ended without an exit status and printed \"\""
        );
        assert_eq!(probe_failure(why.clone(), &run(Some(0), "")), why);
        let noisy = probe_failure(why.clone(), &run(Some(0), "motd"));
        assert!(
            noisy.starts_with(&why) && noisy.ends_with("stderr: motd"),
            "{noisy}"
        );
    }

    #[test]
    fn remote_dir_tilde_and_quoting() {
        let facts = HostFacts {
            os: "linux".into(),
            arch: "x86_64".into(),
            glibc: None,
            libc_line: String::new(),
            home: "/home/u".into(),
        };
        assert_eq!(remote_state_dir("~/.outpost", &facts), "/home/u/.outpost");
        assert_eq!(remote_state_dir("/scratch/o/", &facts), "/scratch/o");
        assert_eq!(shell_quote("a'b"), r"'a'\''b'");
    }
}
