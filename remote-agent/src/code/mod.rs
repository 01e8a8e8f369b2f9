//! Code contexts: interpreters that keep their state between runs, for
//! `execute_code`. The job daemon holds them ([`contexts`]), so they outlive
//! the SSH connection and the controller; `serve` only forwards `CodeRun`,
//! `CodeContexts` and `CodeControl` to it (the job daemon's client does),
//! and answers `CodeInstall` itself by
//! running pip or uv like any command ([`install`]).
//!
//! The workers are carried in this binary: [`PYTHON_WORKER`] runs under the
//! host's `python3` (sent on fd 3 after a one-line bootstrap, so nothing is
//! written to the host first), [`BASH_WORKER`] under `bash`. Both start
//! inside the scope's isolation like any command of it.
//!
//! Each host and each sandbox has one virtual environment for
//! `install_package` ([`venv`]): made with the host's packages visible, and
//! put first on a Python context's `sys.path` as soon as it exists, so a
//! package installed there imports in the next run without a restart.

pub mod contexts;
mod worker;

use std::path::{Path, PathBuf};

use outpost_protocol::limits::MAX_CODE_CONTEXT_LEN;
use outpost_protocol::{AgentError, CodeInstall, ErrorKind, ExecRequest, Response};
use tokio::sync::watch;

use crate::outbox::Outbox;
use crate::sandbox::Scope;
use crate::{exec, paths};

/// The Python worker's source.
pub const PYTHON_WORKER: &str = include_str!("worker.py");
/// What `python3 -c` runs: reads the worker's source (one JSON string) from
/// fd 3 and runs it.
pub const PYTHON_BOOT: &str = "import json,os;_in=os.fdopen(3,'rb');exec(compile(json.loads(_in.readline()),'<outpost-worker>','exec'),{'_in':_in,'__name__':'__outpost_worker__'})";
/// The bash worker's script.
pub const BASH_WORKER: &str = include_str!("worker.sh");

/// Most packages one install names, and the longest name.
const MAX_PACKAGES: usize = 64;
const MAX_PACKAGE_LEN: usize = 256;

pub(crate) fn error(kind: ErrorKind, message: impl Into<String>) -> AgentError {
    AgentError {
        kind,
        message: message.into(),
    }
}

pub fn validate_context(name: &str) -> Result<(), AgentError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_CODE_CONTEXT_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(error(
            ErrorKind::BadRequest,
            format!("context {name:?}: use 1-{MAX_CODE_CONTEXT_LEN} of A-Z a-z 0-9 . _ -"),
        ))
    }
}

/// The virtual environment of the host (under the agent's state dir) or of
/// a sandbox (in its home).
pub fn venv(scope: Option<&Scope>) -> Result<PathBuf, AgentError> {
    match scope {
        Some(scope) => Ok(scope.dirs.home().join(".venv")),
        None => paths::state_dir()
            .map(|s| s.join("venv"))
            .ok_or_else(|| error(ErrorKind::Internal, "no state directory ($HOME unset)")),
    }
}

/// `CodeInstall`: creates the venv if needed and installs into it, as a
/// command of the scope (streamed progress, timeout and cancel as `Exec`).
pub async fn install(
    id: outpost_protocol::RequestId,
    req: CodeInstall,
    outbox: &Outbox,
    cancel: watch::Receiver<bool>,
    scope: Option<Scope>,
) -> Response {
    let command = match check_packages(&req.packages).and_then(|()| {
        // With allow_hosts the index is reached through its proxy (pip and
        // uv honour HTTPS_PROXY); a listed index is the caller's to name.
        if let Some(scope) = &scope
            && !scope.has_network()
            && scope.egress_watermark().is_none()
        {
            return Err(error(
                ErrorKind::BadRequest,
                format!(
                    "sandbox {} has no network (network: false), so packages cannot be downloaded; create it with allow_hosts: [\"pypi.org\", \"files.pythonhosted.org\"]",
                    scope.dirs.id
                ),
            ));
        }
        Ok(install_command(&venv(scope.as_ref())?, &req.packages))
    }) {
        Ok(command) => command,
        Err(e) => return Response::Error(e),
    };
    let exec = ExecRequest {
        command,
        cwd: None,
        env: Vec::new(),
        stdin: None,
        timeout_ms: req.timeout_ms,
        output_limit: req.output_limit,
        stream: false,
        progress_ms: req.progress_ms,
        hand_over: None,
    };
    exec::run(id, exec, outbox, cancel, scope).await
}

fn check_packages(packages: &[String]) -> Result<(), AgentError> {
    if packages.is_empty() || packages.len() > MAX_PACKAGES {
        return Err(error(
            ErrorKind::BadRequest,
            format!("packages: name 1 to {MAX_PACKAGES}"),
        ));
    }
    for p in packages {
        if p.len() > MAX_PACKAGE_LEN || !is_index_requirement(p.trim()) {
            return Err(error(
                ErrorKind::BadRequest,
                format!(
                    "package {p:?}: give a name from the package index, e.g. numpy or pandas==2.2 (no paths, URLs or options)"
                ),
            ));
        }
    }
    Ok(())
}

/// A PEP 508 requirement naming a package of the index: a name, optional
/// `[extras]`, optional version specifiers. No options (`-…`), paths, URLs
/// (`@`, `:`, `/`) or markers (`;`): those would let a name build code
/// from somewhere the caller chose.
fn is_index_requirement(req: &str) -> bool {
    let plain = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    let name_end = req.find(|c: char| !plain(c)).unwrap_or(req.len());
    let (name, mut rest) = req.split_at(name_end);
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return false;
    }
    if let Some(extras) = rest.strip_prefix('[') {
        let Some((inside, after)) = extras.split_once(']') else {
            return false;
        };
        let extra_ok = |e: &str| !e.trim().is_empty() && e.trim().chars().all(plain);
        if !inside.split(',').all(extra_ok) {
            return false;
        }
        rest = after;
    }
    let spec = rest.trim();
    spec.is_empty()
        || (spec.starts_with(['<', '>', '=', '!', '~'])
            && spec
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "<>=!~,.* ".contains(c)))
}

/// The shell command that installs `packages` into `venv`, making it first
/// (with the host's own packages visible): uv when the host has it, else
/// the venv's pip.
fn install_command(venv: &Path, packages: &[String]) -> String {
    let quoted: Vec<String> = packages.iter().map(|p| sh_quote(p.trim())).collect();
    let packages = quoted.join(" ");
    let v = sh_quote(&venv.to_string_lossy());
    format!(
        "set -e\nV={v}\n\
         if command -v uv >/dev/null 2>&1; then\n\
         \x20 [ -x \"$V/bin/python\" ] || uv venv -q --system-site-packages --python \"$(command -v python3)\" \"$V\"\n\
         \x20 exec uv pip install --python \"$V/bin/python\" {packages}\n\
         fi\n\
         [ -x \"$V/bin/python\" ] || python3 -m venv --system-site-packages \"$V\"\n\
         exec \"$V/bin/python\" -m pip install --disable-pip-version-check --no-input {packages}\n"
    )
}

pub(crate) fn sh_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_names_are_plain() {
        assert!(validate_context("default").is_ok());
        assert!(validate_context("exp-1.2_b").is_ok());
        for bad in ["", "../x", "a b", "x/y", &"a".repeat(65)] {
            assert!(validate_context(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn packages_are_never_options() {
        for good in [
            "numpy",
            "pandas==2.2",
            "torch>=2,<3",
            "uvicorn[standard]",
            "a.b_c-d ~= 1.0.*",
        ] {
            assert!(check_packages(&[good.into()]).is_ok(), "{good}");
        }
        for bad in [
            "--index-url=http://x",
            " -e .",
            "a\nb",
            ".",
            "./proj",
            "/home/u/proj",
            "file:///tmp/x",
            "git+https://evil/x",
            "x @ https://evil/x.whl",
            "x; python_version>'3'",
            "x[a/b]",
            "x y",
        ] {
            assert!(check_packages(&[bad.into()]).is_err(), "{bad}");
        }
        assert!(check_packages(&[]).is_err());
    }

    #[test]
    fn the_install_command_quotes_each_package() {
        let cmd = install_command(Path::new("/h/it's/.venv"), &["x>=1".into()]);
        assert!(
            cmd.contains(r"V='/h/it'\''s/.venv'") && cmd.contains("'x>=1'"),
            "{cmd}"
        );
    }
}
