//! Hosts reached through a command run on this machine: `kubectl exec -i`,
//! `docker exec -i`, `srun --overlap -u`, `ssh`, `bwrap`, … whatever gives a
//! shell in the target on its stdin and stdout. The sandbox's
//! [`CommandTarget`] is an argv template; its one `{command}` element becomes
//! the shell command to run (the template hands it to a shell, e.g. `sh -c
//! {command}`).
//!
//! Everything crosses that one stream, so the target needs nothing but a
//! POSIX shell and the usual tools: the probe and the agent's start are shell
//! commands as over SSH, and the agent is copied in as the stdin of a `cat`
//! (temp name, size checked, mode 0755, renamed), with no SFTP, `kubectl cp`
//! or shared filesystem. The agent's link is the child process's pipes, as
//! for the `local` sandbox (`local::spawn_agent`).

use std::path::Path;
use std::process::Stdio;

use futures::future::BoxFuture;
use tokio::io::AsyncWriteExt;

use super::bootstrap::shell_quote;
use super::local::spawn_agent;
use super::{AgentLink, CapturedRun, Host};
use crate::config::{COMMAND_PLACEHOLDER, CommandTarget};

/// How much of a failed command's stderr an error carries.
const STDERR_TAIL: usize = 2000;

/// A host reached by running the target's command template.
pub struct CommandHost {
    target: CommandTarget,
}

impl CommandHost {
    pub fn new(target: CommandTarget) -> CommandHost {
        CommandHost { target }
    }

    fn program(&self) -> &str {
        self.target.program()
    }

    /// The template with `shell_command` in place of `{command}`, ready to
    /// spawn.
    fn command(&self, shell_command: &str) -> tokio::process::Command {
        let argv = substitute(&self.target.argv, shell_command);
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        cmd
    }

    /// Why the template's program could not be started, naming it.
    fn spawn_error(&self, e: std::io::Error) -> String {
        let program = self.program();
        if e.kind() == std::io::ErrorKind::NotFound {
            format!(
                "cannot run {program:?}: not found (the first element of the sandbox's \"command\"; is it installed and on PATH?)"
            )
        } else {
            format!("cannot run {program:?} (the sandbox's \"command\"): {e}")
        }
    }
}

impl Host for CommandHost {
    fn run<'a>(&'a self, command: &'a str) -> BoxFuture<'a, Result<CapturedRun, String>> {
        Box::pin(async move {
            let out = self
                .command(command)
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output()
                .await
                .map_err(|e| self.spawn_error(e))?;
            Ok(CapturedRun::from(out))
        })
    }

    fn copy_in<'a>(
        &'a self,
        from: &'a Path,
        dirs: &'a [String],
        to: &'a str,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let (mut file, size) = open_sized(from).await?;
            let script = copy_in_command(dirs, to, &temp_name(to), size);
            let mut child = self
                .command(&script)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| self.spawn_error(e))?;
            let mut stdin = child.stdin.take().expect("piped stdin");
            // Written while the output is read, so a chatty command cannot
            // block on a full stderr pipe while we block on its stdin.
            let feed = async move {
                tokio::io::copy(&mut file, &mut stdin).await?;
                // The end of our bytes is the end of `cat`'s input.
                stdin.shutdown().await
            };
            let (fed, out) = tokio::join!(feed, child.wait_with_output());
            let out = out.map_err(|e| format!("waiting for {:?}: {e}", self.program()))?;
            if !out.status.success() {
                // A command that stopped reading is why a write failed; its
                // status and stderr say more than the broken pipe.
                return Err(format!(
                    "{:?} exited with {}{}",
                    self.program(),
                    out.status,
                    stderr_tail(&out.stderr)
                ));
            }
            fed.map_err(|e| format!("writing the agent to {:?}: {e}", self.program()))
        })
    }

    fn open<'a>(&'a self, command: &'a str) -> BoxFuture<'a, Result<AgentLink, String>> {
        Box::pin(async move {
            let closed = format!(
                "{:?} (the sandbox's command) closed its output",
                self.program()
            );
            spawn_agent(self.command(command), &closed).map_err(|e| self.spawn_error(e))
        })
    }

    fn disconnect(&self) -> BoxFuture<'_, ()> {
        // Each link owns its child; there is no connection besides them.
        Box::pin(async {})
    }
}

/// `template` with its `{command}` element replaced by `command`, whole: the
/// element is one argument, so nothing in `command` is split or expanded here.
pub fn substitute(template: &[String], command: &str) -> Vec<String> {
    template
        .iter()
        .map(|arg| {
            if arg == COMMAND_PLACEHOLDER {
                command.to_string()
            } else {
                arg.clone()
            }
        })
        .collect()
}

/// The shell command that installs its stdin at `to`: `dirs` made (mode 0700
/// by the umask, in order), the bytes written to `tmp` beside `to`, their
/// count checked against `size` (a stream cut short must not install half an
/// agent), mode 0755 (see [`super::AGENT_MODE`]), renamed over `to`. On any failure the temp file is
/// removed and the command exits non-zero, so `to` appears whole or not at
/// all.
pub fn copy_in_command(dirs: &[String], to: &str, tmp: &str, size: u64) -> String {
    let dirs: Vec<String> = dirs.iter().map(|d| shell_quote(d)).collect();
    let (to, tmp) = (shell_quote(to), shell_quote(tmp));
    let mkdir = if dirs.is_empty() {
        String::new()
    } else {
        format!("mkdir -p -- {} && ", dirs.join(" "))
    };
    format!(
        "umask 077 && {mkdir}{{ cat > {tmp} && n=$(wc -c < {tmp}) && \
         {{ [ $n -eq {size} ] || {{ echo \"only $n of {size} bytes arrived\" >&2; false; }}; }} && \
         chmod 755 {tmp} && mv -f -- {tmp} {to} || {{ rm -f -- {tmp}; exit 1; }}; }}"
    )
}

/// `from` opened for reading, and its size.
pub(super) async fn open_sized(from: &Path) -> Result<(tokio::fs::File, u64), String> {
    let read_error = |e: std::io::Error| format!("cannot read {}: {e}", from.display());
    let file = tokio::fs::File::open(from).await.map_err(read_error)?;
    let size = file.metadata().await.map_err(read_error)?.len();
    Ok((file, size))
}

/// A temp name beside `to`, unique to this process and moment, so
/// controllers installing at once never share one.
pub(super) fn temp_name(to: &str) -> String {
    let (dir, name) = to.rsplit_once('/').unwrap_or((".", to));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{dir}/.{name}.{}.{nanos:08x}.tmp", std::process::id())
}

/// `: <last lines of stderr>`, or nothing when it printed nothing.
fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    if text.is_empty() {
        return String::new();
    }
    let mut start = text.len().saturating_sub(STDERR_TAIL);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!(": {}", &text[start..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn sh_host(template: &[&str]) -> CommandHost {
        CommandHost::new(CommandTarget::new(strings(template), "~/.outpost".into()).unwrap())
    }

    fn scratch(label: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "outpost-command-{label}-{}-{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_placeholder_element_is_replaced_whole() {
        let template = strings(&[
            "kubectl",
            "exec",
            "-i",
            "pod",
            "--",
            "sh",
            "-c",
            "{command}",
        ]);
        let argv = substitute(&template, "exec 'a b' serve; echo \"$HOME\" {command}");
        assert_eq!(
            argv,
            strings(&[
                "kubectl",
                "exec",
                "-i",
                "pod",
                "--",
                "sh",
                "-c",
                "exec 'a b' serve; echo \"$HOME\" {command}"
            ])
        );
        // Only the element that is exactly the placeholder is replaced.
        let argv = substitute(&strings(&["ssh", "{command}", "x"]), "true");
        assert_eq!(argv, strings(&["ssh", "true", "x"]));
    }

    #[test]
    fn copy_command_quotes_every_path() {
        let script = copy_in_command(
            &strings(&["/s/it's here", "/s/it's here/agents"]),
            "/s/it's here/agents/outpost-agent",
            "/s/it's here/agents/.tmp",
            42,
        );
        assert!(
            script.starts_with(
                r"umask 077 && mkdir -p -- '/s/it'\''s here' '/s/it'\''s here/agents' && "
            ),
            "{script}"
        );
        assert!(
            script.contains(
                r"mv -f -- '/s/it'\''s here/agents/.tmp' '/s/it'\''s here/agents/outpost-agent'"
            ),
            "{script}"
        );
        assert!(script.contains("-eq 42 ]"), "{script}");
        assert!(!copy_in_command(&[], "/a", "/b", 1).contains("mkdir"));
    }

    /// Through a real `sh -c` template: an awkward path arrives whole, mode
    /// 0700 in 0700 directories; `run` reports status and output.
    #[tokio::test]
    async fn copies_in_and_runs_through_a_shell_template() {
        let dir = scratch("copy");
        let host = sh_host(&["sh", "-c", "{command}"]);
        let from = dir.join("payload");
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&from, &bytes).unwrap();
        let base = dir.join("it's a dir").display().to_string();
        let dirs = vec![base.clone(), format!("{base}/agents")];
        let to = format!("{base}/agents/outpost-agent");
        host.copy_in(&from, &dirs, &to).await.unwrap();
        assert_eq!(std::fs::read(&to).unwrap(), bytes);
        let mode = |p: &str| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&to), 0o755);
        assert_eq!(mode(&dirs[0]), 0o700);
        assert_eq!(mode(&dirs[1]), 0o700);
        // Only the agent is left: no temp file.
        let left: Vec<_> = std::fs::read_dir(&dirs[1]).unwrap().collect();
        assert_eq!(left.len(), 1);

        let run = host.run("echo out; echo err >&2; exit 3").await.unwrap();
        assert_eq!(run.exit_status, Some(3));
        assert_eq!(run.stdout, b"out\n");
        assert_eq!(run.stderr, b"err\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A stream cut short installs nothing and says how much arrived; a
    /// failing command's stderr is in the error; a missing program is named.
    #[tokio::test]
    async fn copy_in_fails_whole_and_explains() {
        let dir = scratch("fail");
        let from = dir.join("payload");
        std::fs::write(&from, vec![7u8; 100_000]).unwrap();
        let to = dir.join("agent").display().to_string();
        // Only the first 10 bytes reach the shell that runs the copy.
        let short = sh_host(&["sh", "-c", "head -c 10 | sh -c \"$0\"", "{command}"]);
        let err = short.copy_in(&from, &[], &to).await.unwrap_err();
        assert!(err.contains("only 10 of 100000 bytes arrived"), "{err}");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "only the payload is left"
        );

        let host = sh_host(&["sh", "-c", "{command}"]);
        let blocked = format!("{}/payload/sub", dir.display());
        let err = host
            .copy_in(
                &from,
                std::slice::from_ref(&blocked),
                &format!("{blocked}/agent"),
            )
            .await
            .unwrap_err();
        assert!(
            err.contains("\"sh\" exited with") && err.contains("mkdir"),
            "{err}"
        );

        let missing = sh_host(&["outpost-no-such-program", "{command}"]);
        let err = missing.run("true").await.unwrap_err();
        assert!(
            err.contains("\"outpost-no-such-program\"") && err.contains("not found"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
