//! `outpost attach TERMINAL`: a terminal that `open_terminal` (or this
//! command, with `--command`) opened, shown and typed into from this one.
//!
//! Keys pass as they are (this terminal in raw mode when it is one); the
//! screen is drawn again whenever it changes. `C-]` detaches and leaves the
//! terminal running on its host; it ends when its command does, with that
//! command's exit code.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use outpost::fleet::Fleet;
use outpost::ops::terminals;

/// `C-]`, as telnet has it.
const DETACH: u8 = 0x1d;

/// The local terminal in raw mode while this lives, when stdin is one.
struct Raw(Option<libc::termios>);

impl Raw {
    fn enter() -> Raw {
        // SAFETY: tcgetattr/tcsetattr on our own stdin with a zeroed struct
        // it fills in.
        unsafe {
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::isatty(0) != 1 || libc::tcgetattr(0, &mut saved) != 0 {
                return Raw(None);
            }
            let mut raw = saved;
            libc::cfmakeraw(&mut raw);
            libc::tcsetattr(0, libc::TCSANOW, &raw);
            Raw(Some(saved))
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            // SAFETY: restores what `enter` read.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, saved) };
        }
    }
}

fn draw(screen: &str) {
    let mut out = std::io::stdout().lock();
    // Home, clear, then the rows with CR LF (raw mode adds no CR).
    let _ = write!(out, "\x1b[H\x1b[2J{}", screen.replace('\n', "\r\n"));
    let _ = out.flush();
}

pub(super) async fn attach(
    fleet: &Fleet,
    terminal: Option<String>,
    sandbox: Option<String>,
    command: Option<String>,
) -> Result<ExitCode> {
    let msg = anyhow::Error::msg;
    let terminal = match terminal {
        Some(t) => t,
        None => {
            let (cols, rows) = size();
            terminals::open(fleet, sandbox.as_deref(), command, cols, rows)
                .await
                .map_err(msg)?
                .terminal
        }
    };
    eprintln!("outpost: attached to {terminal}; C-] detaches");
    let raw = Raw::enter();
    let (keys_tx, mut keys) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    // A thread of its own, not the runtime's: a read of stdin that never
    // returns must not hold up the exit.
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 1024];
        while let Ok(n) = std::io::Read::read(&mut stdin, &mut buf) {
            if n == 0 || keys_tx.blocking_send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut shown = String::new();
    let code = loop {
        let view = tokio::select! {
            typed = keys.recv() => match typed {
                Some(bytes) if bytes.contains(&DETACH) => break None,
                Some(bytes) => {
                    let text = String::from_utf8_lossy(&bytes).into_owned();
                    terminals::send(fleet, &terminal, &text, &[], None, 100).await
                }
                None => terminals::read(fleet, &terminal, 500).await,
            },
            read = terminals::read(fleet, &terminal, 500) => read,
        }
        .map_err(msg)?;
        if view.screen != shown {
            draw(&view.screen);
            shown = view.screen;
        }
        if let Some(code) = view.exit_code {
            break Some(code);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    drop(raw);
    println!();
    Ok(match code {
        Some(code) => ExitCode::from(code.clamp(0, 255) as u8),
        None => {
            eprintln!("outpost: detached; {terminal} runs on");
            ExitCode::SUCCESS
        }
    })
}

/// This terminal's size, else 80 x 24.
fn size() -> (u16, u16) {
    // SAFETY: TIOCGWINSZ fills the struct it is given.
    unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        if libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0 {
            return (ws.ws_col.clamp(10, 1000), ws.ws_row.clamp(2, 500));
        }
    }
    (80, 24)
}
