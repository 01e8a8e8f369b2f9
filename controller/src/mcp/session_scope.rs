//! Sandboxes that end with the MCP session that made them.
//!
//! A sandbox `create_sandbox` (or `fork_sandbox`) makes belongs to its
//! session unless the call says `keep`: when the session ends (stdio closed,
//! an HTTP session deleted or expired) it is deleted, so an agent that
//! forgets its sandboxes leaves none behind. A stateless request has no
//! session, so what it makes lives to its TTL; so does everything when the
//! controller dies without ending its sessions.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fleet::Fleet;
use crate::ops::sandboxes;

/// How long a session's end waits for its sandboxes' deletes; one not
/// deleted by then ends at its TTL.
const END_WAIT: Duration = Duration::from_secs(30);

pub struct SessionScope {
    fleet: Arc<Fleet>,
    /// Set once the server serves a session: stdio, or an HTTP session
    /// whose handshake is done.
    session: AtomicBool,
    owned: Mutex<BTreeSet<String>>,
}

impl SessionScope {
    pub fn new(fleet: Arc<Fleet>) -> Arc<SessionScope> {
        Arc::new(SessionScope {
            fleet,
            session: AtomicBool::new(false),
            owned: Mutex::default(),
        })
    }

    /// The server serves a session: what it makes from now on ends with it.
    pub fn begin(&self) {
        self.session.store(true, Ordering::SeqCst);
    }

    /// Records `name` as the session's; false when there is no session.
    pub fn own(&self, name: &str) -> bool {
        let session = self.session.load(Ordering::SeqCst);
        if session {
            self.owned.lock().unwrap().insert(name.to_string());
        }
        session
    }

    /// `name` was deleted (or kept) by a call: the end leaves it alone.
    pub fn forget(&self, name: &str) {
        self.owned.lock().unwrap().remove(name);
    }

    /// Deletes every sandbox the session still owns, all at once. Runs once:
    /// a second call finds nothing left.
    pub async fn end(&self) {
        let names = std::mem::take(&mut *self.owned.lock().unwrap());
        if names.is_empty() {
            return;
        }
        let deletes = names.iter().map(|name| async move {
            if let Err(e) = sandboxes::delete(&self.fleet, name).await {
                tracing::warn!("session ended; {name} is left to its TTL: {e}");
            }
        });
        if tokio::time::timeout(END_WAIT, futures::future::join_all(deletes))
            .await
            .is_err()
        {
            tracing::warn!(
                "session ended; sandboxes not deleted within {END_WAIT:?} are left to their TTL"
            );
        }
    }

    /// [`end`](Self::end) on the runtime, for a session that ends by being
    /// dropped (HTTP).
    pub fn end_soon(self: &Arc<Self>) {
        if self.owned.lock().unwrap().is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let scope = self.clone();
            runtime.spawn(async move { scope.end().await });
        }
    }
}
