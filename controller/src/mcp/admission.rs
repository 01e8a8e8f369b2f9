//! How much one HTTP server takes on at once, so that no client, with a
//! token or without, can exhaust it: connections (each a file descriptor and
//! a task) and MCP sessions (each a server and its buffers until it ends or
//! idles out), in all and per caller. Past a limit the answer is a 503 that
//! says which limit, never a silent stall.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Caller;

/// Connections open at once; the rest are answered 503 and closed.
pub(super) const MAX_CONNECTIONS: usize = 256;
/// Live MCP sessions, in all.
pub(super) const MAX_SESSIONS: usize = 512;
/// Live MCP sessions of one caller.
pub(super) const MAX_SESSIONS_PER_CALLER: usize = 64;

pub(super) struct Admission {
    connections: Arc<Semaphore>,
    /// Which caller opened each session rmcp holds (pruned as they end).
    sessions: Mutex<HashMap<String, Caller>>,
    live: Arc<LocalSessionManager>,
}

impl Admission {
    pub(super) fn new(live: Arc<LocalSessionManager>) -> Admission {
        Admission {
            connections: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            sessions: Mutex::default(),
            live,
        }
    }

    /// A place for one more connection, held while it is open; `None` when
    /// all are taken.
    pub(super) fn connection(&self) -> Option<OwnedSemaphorePermit> {
        self.connections.clone().try_acquire_owned().ok()
    }

    /// Records that `caller` opened session `id`; past a limit the session
    /// is closed again and the reason returned.
    pub(super) async fn opened(&self, id: &str, caller: &Caller) -> Result<(), String> {
        let live: Vec<String> = self
            .live
            .sessions
            .read()
            .await
            .keys()
            .map(|k| k.to_string())
            .collect();
        let refusal = {
            let mut sessions = self.sessions.lock().unwrap();
            sessions.retain(|known, _| live.contains(known));
            let own = sessions.values().filter(|c| *c == caller).count();
            if own >= MAX_SESSIONS_PER_CALLER {
                Some(format!(
                    "caller `{}` has {own} MCP sessions open, the most one caller may; \
                     close some (DELETE with their Mcp-Session-Id) or let them idle out",
                    caller.name()
                ))
            } else if live.len() > MAX_SESSIONS {
                Some(format!(
                    "{MAX_SESSIONS} MCP sessions are open, the most this server takes"
                ))
            } else {
                sessions.insert(id.to_string(), caller.clone());
                None
            }
        };
        match refusal {
            None => Ok(()),
            Some(why) => {
                let _ = self.live.close_session(&id.to_string().into()).await;
                Err(why)
            }
        }
    }
}
