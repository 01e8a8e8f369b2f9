//! `outpost code` (a run in a code context that keeps its state between
//! runs, or the contexts listed) and `outpost install-package`, under the
//! config file's command policy as `exec` is.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use outpost::fleet::Fleet;
use outpost::ops::code::{self, RunRequest};
use outpost::ops::human_bytes;
use outpost::ops::jobs::utc_time;
use outpost::session::{CallError, Session};
use outpost_protocol::{CodeAction, CodeExecution, CodeResult};

/// What `outpost code` was given, as clap parsed it.
pub(super) struct CodeArgs {
    /// `[SANDBOX] CODE`, or `[SANDBOX]` with `list`.
    pub args: Vec<String>,
    pub context: Option<String>,
    pub language: String,
    pub timeout: Option<f64>,
    pub restart: bool,
    pub list: bool,
    /// `interrupt`, `restart` or `remove` the context, instead of a run.
    pub control: Option<String>,
    pub save_images: Option<PathBuf>,
}

/// The status for a refusal by the policy, as `outpost exec` exits.
const REFUSED: u8 = 126;

pub(super) async fn code(fleet: &Fleet, a: CodeArgs) -> Result<ExitCode> {
    let no_code = a.list || a.control.is_some();
    let (sandbox, code) = match (no_code, a.args.as_slice()) {
        (true, []) => (None, None),
        (true, [sandbox]) => (Some(sandbox.clone()), None),
        (false, [code]) => (None, Some(code.clone())),
        (false, [sandbox, code]) => (Some(sandbox.clone()), Some(code.clone())),
        (true, _) => anyhow::bail!("--list and --control take at most a SANDBOX"),
        (false, _) => anyhow::bail!("give [SANDBOX] CODE (CODE - reads standard input)"),
    };
    let session = fleet.get(sandbox.as_deref()).map_err(anyhow::Error::msg)?;
    let Some(code) = code else {
        if let Some(action) = &a.control {
            let context = a
                .context
                .unwrap_or_else(|| code::default_context(&a.language).into());
            return control(&session, &context, action).await;
        }
        return list(&session).await;
    };
    let code = if code == "-" { read_stdin()? } else { code };
    let req = code::request(&RunRequest {
        code,
        context: a
            .context
            .unwrap_or_else(|| code::default_context(&a.language).into()),
        language: a.language,
        timeout_s: a.timeout,
        ..RunRequest::default()
    })
    .map_err(|e| anyhow::anyhow!("{}", e.replace("timeout_s", "--timeout")))?;
    if !req.code.is_empty() {
        let permitted = match fleet
            .policy
            .check_unmatchable(session.name(), "code", "code")
        {
            Ok(()) => {
                super::exec::permit_field(fleet, session.name(), "code", &code::policy_text(&req))
                    .await
            }
            Err(refusal) => Err(refusal.to_string()),
        };
        if let Err(refusal) = permitted {
            eprintln!("outpost: {refusal}");
            return Ok(ExitCode::from(REFUSED));
        }
    }
    if a.restart
        && let Err(e) = code::restart(&session, &req.context).await
    {
        return Ok(failed(&session, &e));
    }
    let context = req.context.clone();
    let run = code::run(&session, req);
    tokio::pin!(run);
    let mut interrupted = false;
    let result = loop {
        tokio::select! {
            result = &mut run => break result,
            _ = tokio::signal::ctrl_c() => {
                if interrupted {
                    eprintln!(
                        "outpost: left without the run's result; it may go on.\n{}",
                        stop_hint(session.name(), &context)
                    );
                    return Ok(ExitCode::from(130));
                }
                interrupted = true;
                eprintln!("\noutpost: interrupting (state kept); Ctrl-C again leaves without waiting");
                interrupt(&session, &context);
            }
        }
    };
    match result {
        // Stopped by the person, as a shell reports Ctrl-C.
        Ok(exec) if interrupted && !exec.timed_out && exec.error.is_some() => {
            show(&exec, a.save_images.as_deref())?;
            Ok(ExitCode::from(130))
        }
        Ok(exec) => show(&exec, a.save_images.as_deref()),
        Err(e) => Ok(failed(&session, &e)),
    }
}

/// The commands that stop a run left going in `context` on `sandbox`.
fn stop_hint(sandbox: &str, context: &str) -> String {
    let command = |action: &str| {
        format!(
            "outpost code --control {action} --context {} {}",
            shell_word(context),
            shell_word(sandbox)
        )
    };
    format!(
        "  interrupt it again (state kept): {}\n  stop it for sure (state lost):   {}",
        command("interrupt"),
        command("restart")
    )
}

/// `s` as one shell word: as it is when it needs no quotes.
fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/@:+=,".contains(&b));
    if plain {
        s.to_string()
    } else {
        outpost::host::bootstrap::shell_quote(s)
    }
}

/// `outpost code --control ACTION`: the action on `context`, then the
/// contexts left.
async fn control(session: &Session, context: &str, action: &str) -> Result<ExitCode> {
    code::check_context(context).map_err(anyhow::Error::msg)?;
    let Some(action) = code::parse_action(action).map_err(anyhow::Error::msg)? else {
        return list(session).await;
    };
    match code::control(session, context, action).await {
        Ok(all) => {
            print_contexts(all);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Ok(failed(session, &e)),
    }
}

/// Sends the context an interrupt, beside the run that waits for it.
fn interrupt(session: &Arc<Session>, context: &str) {
    let session = session.clone();
    let context = context.to_string();
    tokio::spawn(async move {
        if let Err(e) = code::control(&session, &context, CodeAction::Interrupt).await {
            eprintln!("outpost: cannot interrupt: {e}");
        }
    });
}

/// 255 when the host could not be reached (as ssh), else 1.
fn failed(session: &Session, e: &CallError) -> ExitCode {
    eprintln!("outpost: {}: {e}", session.name());
    ExitCode::from(if e.is_connection() { 255 } else { 1 })
}

/// Prints a run as a terminal shows a notebook cell's output, and exits
/// with 0, 1 on an error (or a restarted interpreter), 124 on timeout.
fn show(exec: &CodeExecution, save_images: Option<&Path>) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    out.write_all(exec.stdout.to_text().as_bytes())?;
    let mut images = 0;
    for result in &exec.results {
        let line = result_line(result, save_images, &mut images)?;
        if !line.is_empty() {
            writeln!(out, "{}", line.trim_end_matches('\n'))?;
        }
    }
    out.flush()?;
    let mut err = std::io::stderr().lock();
    err.write_all(exec.stderr.to_text().as_bytes())?;
    if exec.running {
        // Only a run collected with empty code by a caller with a wait.
        writeln!(
            err,
            "outpost: still running; run again with empty code to collect it"
        )?;
        return Ok(ExitCode::from(1));
    }
    if let Some(e) = &exec.error {
        let text = if e.traceback.is_empty() {
            format!("{}: {}", e.name, e.value)
        } else {
            e.traceback.clone()
        };
        writeln!(err, "{}", text.trim_end_matches('\n'))?;
    }
    if let Some(why) = &exec.restarted {
        writeln!(
            err,
            "outpost: the interpreter was restarted, its state is gone: {why}"
        )?;
    }
    if exec.timed_out {
        writeln!(err, "outpost: timed out; the run was interrupted")?;
        return Ok(ExitCode::from(124));
    }
    Ok(ExitCode::from(u8::from(
        exec.error.is_some() || exec.restarted.is_some(),
    )))
}

/// One displayed value for a terminal: an image as `[image/png 640x480
/// 23.1 KiB]` (and where it was saved), else its plain text, else what it
/// is.
fn result_line(
    result: &CodeResult,
    save_images: Option<&Path>,
    images: &mut usize,
) -> Result<String> {
    let find = |mime: &str| {
        result
            .data
            .iter()
            .find(|(m, _)| m == mime)
            .map(|(_, d)| d.as_str())
    };
    if let Some((mime, data)) = result.data.iter().find(|(m, _)| m.starts_with("image/"))
        && mime != "image/svg+xml"
    {
        let bytes = BASE64.decode(data.trim()).unwrap_or_default();
        let mut line = format!("[{mime}");
        if let Some((w, h)) = png_size(&bytes) {
            line.push_str(&format!(" {w}x{h}"));
        }
        line.push_str(&format!(" {}", human_bytes(bytes.len() as u64)));
        if let Some(dir) = save_images {
            *images += 1;
            // From a fixed list: the MIME type comes from the run, and its
            // text must not make the file's name.
            let ext = match mime.as_str() {
                "image/png" => "png",
                "image/jpeg" => "jpg",
                "image/gif" => "gif",
                "image/webp" => "webp",
                _ => "bin",
            };
            let path = dir.join(format!("image-{images}.{ext}"));
            std::fs::create_dir_all(dir)
                .and_then(|()| std::fs::write(&path, &bytes))
                .with_context(|| format!("cannot save {}", path.display()))?;
            line.push_str(&format!(": {}", path.display()));
        }
        line.push(']');
        return Ok(line);
    }
    if let Some(text) = find("text/plain") {
        return Ok(text.to_string());
    }
    Ok(match result.data.first() {
        Some((mime, data)) => format!("[{mime} {}]", human_bytes(data.len() as u64)),
        None => String::new(),
    })
}

/// A PNG's width and height, from its header.
fn png_size(bytes: &[u8]) -> Option<(u32, u32)> {
    const SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
    if bytes.len() < 24 || !bytes.starts_with(SIGNATURE) || &bytes[12..16] != b"IHDR" {
        return None;
    }
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap_or_default());
    Some((be(16), be(20)))
}

/// The sandbox's contexts, as [`print_contexts`] shows them.
async fn list(session: &Session) -> Result<ExitCode> {
    match code::contexts(session).await {
        Ok(all) => {
            print_contexts(all);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Ok(failed(session, &e)),
    }
}

fn print_contexts(all: Vec<outpost_protocol::CodeContextInfo>) {
    println!(
        "{:<24} {:<8} {:<8} {:>5} {:>9}  LAST_USED",
        "NAME", "LANGUAGE", "STATE", "RUNS", "RSS"
    );
    for c in all {
        println!(
            "{:<24} {:<8} {:<8} {:>5} {:>9}  {}",
            c.name,
            c.language.name(),
            c.state,
            c.execution_count,
            human_bytes(c.rss_bytes),
            utc_time(c.last_used_ms / 1000)
        );
    }
}

/// All of standard input, as the code to run.
fn read_stdin() -> Result<String> {
    use std::io::Read;
    let max = outpost_protocol::limits::MAX_STDIN_LEN;
    let mut data = Vec::new();
    std::io::stdin()
        .take(max as u64 + 1)
        .read_to_end(&mut data)?;
    if data.len() > max {
        anyhow::bail!(
            "the code on standard input is over {} MiB; sync the file and run it from there",
            max >> 20
        );
    }
    String::from_utf8(data).context("the code on standard input is not UTF-8")
}

/// Bytes of each stream an install keeps (head and tail).
const INSTALL_OUTPUT: u64 = 64 * 1024;

/// `outpost install-package [SANDBOX] PKG…`: the first argument is the
/// sandbox when one has that name.
pub(super) async fn install(fleet: &Fleet, args: Vec<String>, timeout: f64) -> Result<ExitCode> {
    let (sandbox, packages) = match args.split_first() {
        Some((first, rest)) if !rest.is_empty() && fleet.get(Some(first)).is_ok() => {
            (Some(first.as_str()), rest)
        }
        _ => (None, args.as_slice()),
    };
    let session = fleet.get(sandbox).map_err(anyhow::Error::msg)?;
    let mut req = code::install_request(packages, timeout, INSTALL_OUTPUT)
        .map_err(|e| anyhow::anyhow!("{}", e.replace("timeout_s", "--timeout")))?;
    let text = code::install_policy_text(&req);
    let permitted =
        match fleet
            .policy
            .check_unmatchable(session.name(), "command", "a package install")
        {
            Ok(()) => super::exec::permit(fleet, session.name(), &text).await,
            Err(refusal) => Err(refusal.to_string()),
        };
    if let Err(refusal) = permitted {
        eprintln!("outpost: {refusal}");
        return Ok(ExitCode::from(REFUSED));
    }
    // The installer's last line, on a terminal, while it runs.
    let live = std::io::IsTerminal::is_terminal(&std::io::stderr());
    if live {
        req.progress_ms = Some(1000);
    }
    let result = code::install(&session, req, |p| {
        if live && !p.last_line.is_empty() {
            let line: String = p.last_line.chars().take(100).collect();
            eprint!("\r\x1b[K{:.0} s  {line}", p.elapsed_ms as f64 / 1000.0);
        }
    })
    .await;
    if live {
        eprint!("\r\x1b[K");
    }
    let r = match result {
        Ok(r) => r,
        Err(e) => return Ok(failed(&session, &e)),
    };
    let status = outpost::ops::exec::shell_status(&r);
    if status != 0 {
        let _ = std::io::stdout().write_all(r.stdout.to_text().as_bytes());
        let _ = std::io::stderr().write_all(r.stderr.to_text().as_bytes());
        if r.timed_out {
            eprintln!("outpost: the install timed out after {timeout} s");
        }
    } else {
        eprintln!(
            "outpost: installed {} on {} in {:.1} s",
            packages.join(" "),
            session.name(),
            r.duration_ms as f64 / 1000.0
        );
    }
    Ok(ExitCode::from(match status {
        -1 => 255,
        s => s.clamp(0, 255) as u8,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(data: &[(&str, &str)]) -> CodeResult {
        CodeResult {
            data: data
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            is_main_result: false,
        }
    }

    /// A 1x1 PNG's signature and header, as base64.
    fn png(w: u32, h: u32) -> String {
        let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        bytes.extend(w.to_be_bytes());
        bytes.extend(h.to_be_bytes());
        bytes.extend([8, 6, 0, 0, 0]);
        BASE64.encode(bytes)
    }

    #[test]
    fn results_read_as_a_notebook_shows_them() {
        let mut n = 0;
        let line = |r: &CodeResult, n: &mut usize| result_line(r, None, n).unwrap();
        assert_eq!(line(&result(&[("text/plain", "42")]), &mut n), "42");
        let figure = result(&[("text/plain", "<Figure>"), ("image/png", &png(640, 480))]);
        assert_eq!(line(&figure, &mut n), "[image/png 640x480 29 B]");
        assert_eq!(
            line(&result(&[("text/html", "<b>x</b>")]), &mut n),
            "[text/html 8 B]"
        );
        let dir = std::env::temp_dir().join(format!("outpost-code-cli-{}", std::process::id()));
        let saved = result_line(&figure, Some(&dir), &mut n).unwrap();
        let path = dir.join("image-1.png");
        assert!(
            saved.ends_with(&format!(": {}]", path.display())),
            "{saved}"
        );
        assert_eq!(std::fs::read(&path).unwrap().len(), 29);
        // The extension is never the MIME type's own text.
        let jpeg = result(&[("image/jpeg", "/9j/4A==")]);
        let odd = result(&[("image/../../x", "AAAA")]);
        let saved = [&jpeg, &odd].map(|r| result_line(r, Some(&dir), &mut n).unwrap());
        assert!(saved[0].ends_with("image-2.jpg]"), "{}", saved[0]);
        assert!(saved[1].ends_with("image-3.bin]"), "{}", saved[1]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(png_size(b"not a png at all, not at all"), None);
    }

    #[test]
    fn a_run_left_going_says_how_to_stop_it() {
        let hint = stop_hint("gpu1/sbx-1", "train");
        assert!(
            hint.contains("outpost code --control interrupt --context train gpu1/sbx-1")
                && hint.contains("outpost code --control restart --context train gpu1/sbx-1"),
            "{hint}"
        );
        assert_eq!(shell_word("my box"), "'my box'");
    }

    #[test]
    fn control_takes_an_action_and_at_most_a_sandbox() {
        use clap::Parser as _;
        let parse = |args: &[&str]| {
            super::super::Cli::try_parse_from(["outpost", "code"].iter().chain(args))
        };
        assert!(parse(&["--control", "restart", "--context", "train", "gpu1"]).is_ok());
        assert!(parse(&["--control", "kill"]).is_err());
        assert!(parse(&["--control", "remove", "--list"]).is_err());
        assert!(parse(&["--control", "remove", "--restart"]).is_err());
    }
}
