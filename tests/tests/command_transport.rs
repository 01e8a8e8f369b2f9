//! Hosts reached through a command (`command = [...]` in the config file),
//! end to end with real commands: `ssh` to the private test sshd and
//! bubblewrap on this machine, the agent copied in through the command's own
//! stream on first use and reused after; and the errors for a program that
//! does not exist, a target the command cannot reach, and a template without
//! `{command}`.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::mcp_client::{Client, call, start};
use outpost_e2e::{Sshd, TempDir, target_bin};
use serde_json::{Value, json};

/// A config file whose one `[[sandbox]]`, `name`, is reached through `argv`
/// with the agent's state in `remote_dir`; the environment that selects it,
/// and the file's guard.
fn command_config(
    name: &str,
    argv: &[&str],
    remote_dir: &Path,
) -> (Vec<(&'static str, String)>, TempDir) {
    let dir = TempDir::new("cmd-config");
    let path = dir.path().join("config.toml");
    // A JSON string or array of strings is a TOML one too.
    let text = format!(
        "[[sandbox]]\nname = {}\ncommand = {}\nremote_dir = {}\n",
        json!(name),
        json!(argv),
        json!(remote_dir.display().to_string()),
    );
    fs::write(&path, text).unwrap();
    (vec![("OUTPOST_CONFIG", path.display().to_string())], dir)
}

/// The agents installed under the state dir `state`.
fn installed_agents(state: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(state.join("agents")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path().join("outpost-agent"))
        .filter(|p| p.is_file())
        .collect()
}

async fn exec(client: &Client, sandbox: &str, command: &str) -> Value {
    let (err, r) = call(
        client,
        "exec_bash",
        json!({"command": command, "sandbox_name": sandbox}),
    )
    .await;
    assert!(!err, "{command}: {r}");
    assert_eq!(r["exit_code"], 0, "{command}: {r}");
    r
}

/// Writes `path` through the agent, reads it back, and checks it on disk.
async fn write_and_read(client: &Client, sandbox: &str, path: &Path) {
    let remote_path = path.display().to_string();
    let (err, r) = call(
        client,
        "write_remote_file",
        json!({"remote_path": remote_path, "content": "héllo\nworld\n", "sandbox_name": sandbox}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["status"], "written");
    let (err, r) = call(
        client,
        "read_remote_file",
        json!({"remote_path": remote_path, "sandbox_name": sandbox}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["content"], "héllo\nworld\n");
    assert_eq!(fs::read_to_string(path).unwrap(), "héllo\nworld\n");
}

/// Over `ssh` as a plain command (no russh, no SFTP): the first call copies
/// the agent in through the command's stdin, exec, the file tools and a
/// background job work through it, and a second controller starts the
/// installed agent without copying it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ssh_command_gets_the_agent_copied_in_and_reused() {
    let sshd = Sshd::start();
    let key = sshd.client_key().display().to_string();
    let port = sshd.port().to_string();
    let login = format!("{}@{}", sshd.user(), sshd.host());
    let argv = [
        "ssh",
        "-i",
        &key,
        "-p",
        &port,
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "LogLevel=ERROR",
        "-F",
        "/dev/null",
        &login,
        "{command}",
    ];
    // Not there yet: the first call must install the agent.
    let state = sshd.remote_dir().join("via-command");
    assert!(!state.exists());
    let (env, _config) = command_config("cmd", &argv, &state);
    let (client, _home) = start(&env).await;

    let r = exec(&client, "cmd", "echo hi; id -un").await;
    assert_eq!(r["stdout"], format!("hi\n{}\n", sshd.user()));
    let agents = installed_agents(&state);
    assert_eq!(agents.len(), 1, "one agent under {}", state.display());
    let agent = &agents[0];
    let meta = fs::metadata(agent).unwrap();
    // Runnable by a root login's sandbox uids; its directories stay 0700.
    assert_eq!(meta.mode() & 0o777, 0o755);
    let owner = fs::metadata(sshd.remote_dir()).unwrap().uid();
    assert_eq!(meta.uid(), owner, "installed as the login");
    assert_eq!(fs::metadata(&state).unwrap().mode() & 0o777, 0o700);
    assert!(
        fs::read(agent).unwrap() == fs::read(target_bin("outpost-agent")).unwrap(),
        "the installed agent is this build, byte for byte"
    );
    let beside: Vec<_> = fs::read_dir(agent.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(beside, ["outpost-agent"], "no temp file left");

    // Listed by its program, with no port or user of its own.
    let (_, r) = call(&client, "list_sandboxes", json!({})).await;
    let row = r["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "cmd")
        .cloned()
        .unwrap_or_else(|| panic!("no cmd in {r}"));
    assert_eq!((&row["host"], &row["port"]), (&json!("ssh"), &json!(0)));

    write_and_read(&client, "cmd", &sshd.remote_dir().join("files/hello.txt")).await;

    let (err, r) = call(
        &client,
        "exec_bash_background",
        json!({"command": "sleep 1; echo bg-done", "sandbox_name": "cmd"}),
    )
    .await;
    assert!(!err, "{r}");
    let job = r["tmux_session"].as_str().unwrap().to_string();
    let (err, r) = call(
        &client,
        "wait_background_task",
        json!({"name": job, "timeout_s": 30, "sandbox_name": "cmd"}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(
        (&r["reason"], &r["exit_code"]),
        (&json!("ended"), &json!(0))
    );
    let (_, r) = call(
        &client,
        "check_background_task",
        json!({"tmux_session": job, "sandbox_name": "cmd"}),
    )
    .await;
    assert!(r["log_tail"].as_str().unwrap().contains("bg-done"), "{r}");
    client.cancel().await.unwrap();

    // A second controller starts the installed agent: not copied again.
    let before = (meta.ino(), meta.mtime(), meta.mtime_nsec());
    let (client, _home) = start(&env).await;
    let r = exec(&client, "cmd", "echo again").await;
    assert_eq!(r["stdout"], "again\n");
    let meta = fs::metadata(agent).unwrap();
    assert_eq!((meta.ino(), meta.mtime(), meta.mtime_nsec()), before);
    assert_eq!(installed_agents(&state).len(), 1);
    client.cancel().await.unwrap();
}

const BWRAP_BASE: &[&str] = &[
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--unshare-pid",
    "--die-with-parent",
];

fn bwrap_usable() -> bool {
    Command::new("bwrap")
        .args(BWRAP_BASE)
        .arg("true")
        .status()
        .is_ok_and(|s| s.success())
}

/// Through a `sh -c` wrapper in bubblewrap: everything read-only but one
/// directory, its own pid namespace; the agent is copied into that
/// directory through the wrapper and works there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bubblewrap_wrapper_gets_the_agent_copied_in() {
    if !bwrap_usable() {
        outpost_e2e::skip("bwrap cannot run here (scripts/setup-test-env installs it)");
        return;
    }
    let dir = TempDir::new("cmd-bwrap");
    let d = dir.path().display().to_string();
    let mut argv = vec!["bwrap"];
    argv.extend_from_slice(BWRAP_BASE);
    argv.extend(["--bind", &d, &d, "sh", "-c", "{command}"]);
    let state = dir.path().join("state");
    let (env, _config) = command_config("wrapped", &argv, &state);
    let (client, _home) = start(&env).await;

    let r = exec(
        &client,
        "wrapped",
        "readlink /proc/self/ns/pid; if [ -w /usr ]; then echo writable; else echo read-only; fi",
    )
    .await;
    let ours = fs::read_link("/proc/self/ns/pid").unwrap();
    let stdout = r["stdout"].as_str().unwrap();
    let (ns, usr) = stdout.trim().split_once('\n').unwrap();
    assert_ne!(ns, ours.display().to_string(), "a pid namespace of its own");
    assert_eq!(usr, "read-only", "{stdout}");
    assert_eq!(installed_agents(&state).len(), 1, "{}", state.display());

    write_and_read(&client, "wrapped", &dir.path().join("work/hello.txt")).await;
    client.cancel().await.unwrap();
}

/// `outpost ARGS` with only `env` and an empty home.
fn outpost(home: &TempDir, env: &[(&str, String)], args: &[&str]) -> Output {
    let mut cmd = Command::new(target_bin("outpost"));
    cmd.args(args)
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var("PATH").unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn a_missing_program_an_unreachable_target_or_no_placeholder_is_explained() {
    let home = TempDir::new("cmd-home");
    let state = TempDir::new("cmd-state");
    let run = |argv: &[&str]| {
        let (env, _config) = command_config("there", argv, state.path());
        let out = outpost(&home, &env, &["exec", "there", "--", "true"]);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{stderr}");
        stderr
    };

    let stderr = run(&["outpost-no-such-program", "{command}"]);
    assert!(
        stderr.contains("\"outpost-no-such-program\"") && stderr.contains("not found"),
        "{stderr}"
    );

    // What the command printed when it could not reach its target.
    let stderr = run(&[
        "sh",
        "-c",
        "echo 'error: pods \"trainer-0\" not found' >&2; exit 1",
        "{command}",
    ]);
    assert!(
        stderr.contains("pods \"trainer-0\" not found") && stderr.contains("exited with status 1"),
        "{stderr}"
    );

    // Refused when the file is read, before anything runs.
    let stderr = run(&["docker", "exec", "-i", "ctr", "sh"]);
    assert!(
        stderr.contains("\"there\"") && stderr.contains("no \"{command}\" element"),
        "{stderr}"
    );
    assert!(
        fs::read_dir(state.path()).unwrap().next().is_none(),
        "nothing installed"
    );
}
