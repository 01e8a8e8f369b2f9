//! Outpost through the official Python MCP SDK (1.x): progress during long
//! calls, a client with a short budget, remote-sandbox-mcp's call shapes,
//! Streamable HTTP with and without the token, every structured result
//! validated by the SDK against its output schema.
//! The script is tests/py/official_sdk.py; the SDK's virtual environment is
//! made by scripts/setup-test-env.

use std::path::PathBuf;
use std::process::Command;

use outpost_e2e::{McpHttp, Sshd, TempDir, target_bin};

/// Where scripts/setup-test-env puts the SDK's virtual environment.
fn sdk_python() -> PathBuf {
    let env = std::env::var_os("OUTPOST_TEST_PYENV").map_or_else(
        || PathBuf::from("/var/tmp/outpost-test-pyenv"),
        PathBuf::from,
    );
    env.join("bin/python")
}

/// Runs tests/py/`script` with the SDK's Python, `args` and only `HOME`
/// and `PATH` in its environment; fails the test with `what` and the
/// script's output unless it succeeds.
fn run_script(script: &str, args: &[&std::ffi::OsStr], home: &std::path::Path, what: &str) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("py")
        .join(script);
    let out = Command::new(sdk_python())
        .arg(&script)
        .args(args)
        .env_clear()
        .env("HOME", home)
        .env("PATH", std::env::var("PATH").unwrap())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "{what}:\n{text}");
}

#[test]
fn the_official_python_sdk_sees_progress_budgets_and_valid_results() {
    let python = sdk_python();
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-test-env (it installs the MCP Python SDK)",
        python.display()
    );
    let sshd = Sshd::new();
    let scratch = TempDir::new("python-sdk");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let config = scratch.path().join("base.toml");
    std::fs::write(&config, sshd.sandbox_toml("box")).unwrap();
    let http = McpHttp::start();
    let url = format!("http://{}/mcp", http.addr);
    let outpost = target_bin("outpost");
    run_script(
        "official_sdk.py",
        &[
            outpost.as_os_str(),
            config.as_os_str(),
            scratch.path().as_os_str(),
            url.as_ref(),
            http.token.as_ref(),
        ],
        &home,
        "the SDK checks failed",
    );
}

/// remote-sandbox-mcp 0.7.6 and Outpost, configured alike for the same
/// sshd, get the same calls through the official SDK: Outpost answers
/// wherever remote-sandbox-mcp does, with every key it returns (but for the
/// documented differences listed in tests/py/side_by_side.py).
#[test]
fn remote_sandbox_mcp_calls_get_the_same_answers_from_outpost() {
    let installed = Command::new(sdk_python())
        .args(["-c", "import remote_sandbox_mcp"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        installed,
        "remote-sandbox-mcp is missing beside the SDK in {}: run scripts/setup-test-env",
        sdk_python().display()
    );
    let sshd = Sshd::new();
    let scratch = TempDir::new("side-by-side");
    let outpost = target_bin("outpost");
    let port = sshd.port().to_string();
    run_script(
        "side_by_side.py",
        &[
            outpost.as_os_str(),
            sshd.host().as_ref(),
            port.as_ref(),
            sshd.user().as_ref(),
            sshd.client_key().as_os_str(),
            sshd.remote_dir().as_os_str(),
            scratch.path().as_os_str(),
        ],
        scratch.path(),
        "the side-by-side calls differ",
    );
}
