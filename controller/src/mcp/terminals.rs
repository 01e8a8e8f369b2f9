//! Terminals for interactive programs (a REPL, a password prompt, a TUI):
//! open one, type into it, read its screen, close it. The work is
//! [`crate::ops::terminals`]'s. Rarely needed, so only the advanced
//! listing names them; every client may call them.
//!
//! What a terminal runs is what a command runs: the command and typed text
//! pass the command policy (deny and confirm rules), and where allow rules
//! list what may run, terminals are refused (typed keys cannot be vouched
//! for).

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::OutpostServer;
use crate::ops::terminals::{self, TerminalView};
use crate::policy::Planned;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct OpenParams {
    pub sandbox_name: Option<String>,
    #[schemars(extend("default" = "bash"))]
    pub command: Option<String>,
    #[schemars(extend("default" = 80))]
    pub cols: Option<u16>,
    #[schemars(extend("default" = 24))]
    pub rows: Option<u16>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SendParams {
    pub terminal: String,
    #[serde(default)]
    pub text: String,
    /// After text: Enter, Tab, Esc, Backspace, Up, Down, Left, Right, C-c…
    #[serde(default)]
    pub keys: Vec<String>,
    /// Resize first.
    pub cols: Option<u16>,
    pub rows: Option<u16>,
    /// Most to wait for output to settle.
    #[schemars(extend("default" = 2000))]
    pub wait_ms: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReadParams {
    pub terminal: String,
    /// Wait this long for new output.
    #[serde(default)]
    pub wait_ms: u32,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CloseParams {
    pub terminal: String,
}

/// The rendered screen, the lines that scrolled off since the last look,
/// the cursor, and the exit code once it ended.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ScreenResult {
    pub terminal: String,
    pub screen: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scrollback: Vec<String>,
    pub cursor: [u16; 2],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

impl From<TerminalView> for ScreenResult {
    fn from(v: TerminalView) -> Self {
        ScreenResult {
            terminal: v.terminal,
            screen: v.screen,
            scrollback: v.scrollback,
            cursor: v.cursor,
            exit_code: v.exit_code,
        }
    }
}

#[tool_router(router = terminals_router, vis = "pub(super)")]
impl OutpostServer {
    #[tool(description = "Start a command on a terminal; answers its screen.")]
    async fn open_terminal(
        &self,
        Parameters(p): Parameters<OpenParams>,
    ) -> Result<Json<ScreenResult>, String> {
        let (cols, rows) = (p.cols.unwrap_or(80), p.rows.unwrap_or(24));
        let sandbox = self
            .fleet
            .get(p.sandbox_name.as_deref())?
            .name()
            .to_string();
        let command = p.command.unwrap_or_else(|| "bash".into());
        let planned = Planned::command(&sandbox, "command", &command);
        self.permit_unmatchable(planned, "a terminal", "outpost attach")
            .await?;
        let view = terminals::open(&self.fleet, Some(&sandbox), Some(command), cols, rows).await?;
        Ok(Json(view.into()))
    }

    #[tool(description = "Type text and keys into a terminal; answers its screen.")]
    async fn send_terminal(
        &self,
        Parameters(p): Parameters<SendParams>,
    ) -> Result<Json<ScreenResult>, String> {
        let size = match (p.cols, p.rows) {
            (None, None) => None,
            (cols, rows) => Some((cols.unwrap_or(80), rows.unwrap_or(24))),
        };
        if !p.text.is_empty() {
            let (sandbox, _) = terminals::parse(&p.terminal)?;
            let planned = Planned::command(sandbox, "text", &p.text);
            self.permit_unmatchable(planned, "a terminal", "outpost attach")
                .await?;
        }
        let wait = p.wait_ms.unwrap_or(2000);
        let view = terminals::send(&self.fleet, &p.terminal, &p.text, &p.keys, size, wait).await?;
        Ok(Json(view.into()))
    }

    #[tool(description = "A terminal's screen.")]
    async fn read_terminal(
        &self,
        Parameters(p): Parameters<ReadParams>,
    ) -> Result<Json<ScreenResult>, String> {
        let view = terminals::read(&self.fleet, &p.terminal, p.wait_ms).await?;
        Ok(Json(view.into()))
    }

    #[tool(description = "Hang up a terminal.")]
    async fn close_terminal(
        &self,
        Parameters(p): Parameters<CloseParams>,
    ) -> Result<Json<ScreenResult>, String> {
        let view = terminals::close(&self.fleet, &p.terminal).await?;
        Ok(Json(view.into()))
    }
}
