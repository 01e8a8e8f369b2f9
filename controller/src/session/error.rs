//! Why a call failed.

use outpost_protocol::AgentError;

/// Why a call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// No connection could be made; nothing ran.
    #[error("{0}")]
    Connect(String),
    /// The connection died while the call was in flight; the command may or may
    /// not have run, and is not retried.
    #[error("connection lost: {0}")]
    ConnectionLost(String),
    /// The agent refused or failed the request.
    #[error("{}", .0.message)]
    Agent(AgentError),
    #[error("{0}")]
    Protocol(String),
}

impl CallError {
    /// Whether the failure is about reaching the host (as opposed to the request).
    pub fn is_connection(&self) -> bool {
        matches!(self, CallError::Connect(_) | CallError::ConnectionLost(_))
    }
}
