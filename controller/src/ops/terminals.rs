//! Terminals on a host or in a sandbox: open one on a command, type text
//! and keys into it, read its rendered screen, close it. The host's daemon
//! holds each (so it outlives this controller's connection); its name here
//! is `SANDBOX#ID`, the sandbox it runs in and its id there.

use outpost_protocol::{Request, Response, TermRequest, TermScreen};
use serde::Serialize;

use super::jobs::{ask as ask_session, unexpected};
use crate::fleet::Fleet;

/// Longest wait a read or a send may ask for.
const MAX_WAIT_MS: u32 = 30_000;

/// A terminal's screen, as both front ends show it.
#[derive(Debug, Clone, Serialize)]
pub struct TerminalView {
    /// `SANDBOX#ID`.
    pub terminal: String,
    pub screen: String,
    /// Lines that scrolled off since the last look.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scrollback: Vec<String>,
    /// `[row, col]`.
    pub cursor: [u16; 2],
    /// Once its command ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

/// `SANDBOX#ID` into its parts.
pub fn parse(terminal: &str) -> Result<(&str, &str), String> {
    terminal
        .rsplit_once('#')
        .filter(|(s, id)| !s.is_empty() && !id.is_empty())
        .ok_or_else(|| {
            format!("bad terminal {terminal:?}: give SANDBOX#ID, as open_terminal answers")
        })
}

/// The bytes a key name stands for: `Enter`, `Tab`, `Esc`, `Backspace`,
/// `Up`/`Down`/`Left`/`Right`, `Home`, `End`, `PageUp`, `PageDown`,
/// `Delete`, `C-a` … `C-z`.
pub fn key_bytes(key: &str) -> Result<Vec<u8>, String> {
    let bytes: &[u8] = match key {
        "Enter" => b"\r",
        "Tab" => b"\t",
        "Esc" | "Escape" => b"\x1b",
        "Backspace" => b"\x7f",
        "Space" => b" ",
        "Up" => b"\x1b[A",
        "Down" => b"\x1b[B",
        "Right" => b"\x1b[C",
        "Left" => b"\x1b[D",
        "Home" => b"\x1b[H",
        "End" => b"\x1b[F",
        "PageUp" => b"\x1b[5~",
        "PageDown" => b"\x1b[6~",
        "Delete" => b"\x1b[3~",
        _ => {
            let letter = key
                .strip_prefix("C-")
                .filter(|l| l.len() == 1)
                .map(|l| l.as_bytes()[0].to_ascii_lowercase())
                .filter(u8::is_ascii_lowercase);
            return match letter {
                Some(l) => Ok(vec![l - b'a' + 1]),
                None => Err(format!(
                    "unknown key {key:?}: Enter, Tab, Esc, Backspace, Up, Down, Left, Right, Home, End, PageUp, PageDown, Delete, Space or C-a … C-z"
                )),
            };
        }
    };
    Ok(bytes.to_vec())
}

async fn ask(fleet: &Fleet, sandbox: &str, request: TermRequest) -> Result<TerminalView, String> {
    let session = fleet.get(Some(sandbox))?;
    let answer = ask_session(&session, Request::Terminal(request))
        .await
        .map_err(|e| e.to_string())?;
    match answer {
        Response::Terminal(screen) => Ok(view(session.name(), screen)),
        other => Err(unexpected("a terminal request", other).to_string()),
    }
}

fn view(sandbox: &str, s: TermScreen) -> TerminalView {
    TerminalView {
        terminal: format!("{sandbox}#{}", s.id),
        screen: s.screen,
        scrollback: s.scrollback,
        cursor: [s.cursor.0, s.cursor.1],
        exit_code: s.exit_code,
    }
}

/// `command` (default `bash`) on a terminal of `cols` x `rows` in
/// `sandbox` (or the active one).
pub async fn open(
    fleet: &Fleet,
    sandbox: Option<&str>,
    command: Option<String>,
    cols: u16,
    rows: u16,
) -> Result<TerminalView, String> {
    let name = fleet.get(sandbox)?.name().to_string();
    let command = command
        .filter(|c| !c.trim().is_empty())
        .unwrap_or_else(|| "bash".into());
    ask(
        fleet,
        &name,
        TermRequest::Open {
            command,
            cols,
            rows,
        },
    )
    .await
}

/// Types `text`, then `keys`; resizes first when `size` is given; answers
/// the screen once the output settles (at most `wait_ms`).
pub async fn send(
    fleet: &Fleet,
    terminal: &str,
    text: &str,
    keys: &[String],
    size: Option<(u16, u16)>,
    wait_ms: u32,
) -> Result<TerminalView, String> {
    let (sandbox, id) = parse(terminal)?;
    if let Some((cols, rows)) = size {
        let resize = TermRequest::Resize {
            id: id.to_string(),
            cols,
            rows,
        };
        ask(fleet, sandbox, resize).await?;
    }
    let mut data = text.as_bytes().to_vec();
    for key in keys {
        data.extend(key_bytes(key)?);
    }
    let request = TermRequest::Send {
        id: id.to_string(),
        data,
        wait_ms: wait_ms.min(MAX_WAIT_MS),
    };
    ask(fleet, sandbox, request).await
}

/// The screen, once there is new output or `wait_ms` passed.
pub async fn read(fleet: &Fleet, terminal: &str, wait_ms: u32) -> Result<TerminalView, String> {
    let (sandbox, id) = parse(terminal)?;
    let request = TermRequest::Read {
        id: id.to_string(),
        wait_ms: wait_ms.min(MAX_WAIT_MS),
    };
    ask(fleet, sandbox, request).await
}

/// Hangs it up (SIGHUP, SIGKILL after a grace); answers its last screen.
pub async fn close(fleet: &Fleet, terminal: &str) -> Result<TerminalView, String> {
    let (sandbox, id) = parse(terminal)?;
    ask(fleet, sandbox, TermRequest::Close { id: id.to_string() }).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_names() {
        assert_eq!(key_bytes("C-c").unwrap(), [3]);
        assert_eq!(key_bytes("Enter").unwrap(), b"\r");
        assert_eq!(key_bytes("Up").unwrap(), b"\x1b[A");
        assert!(key_bytes("C-1").unwrap_err().contains("unknown key"));
        assert_eq!(
            parse("gpu1/sbx-1#t-00ab12").unwrap(),
            ("gpu1/sbx-1", "t-00ab12")
        );
        assert!(parse("t-1").is_err());
    }
}
