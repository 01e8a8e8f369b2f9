//! [`ScopedConn`]: a connection as one sandbox sees it. Everything above
//! the session (exec, jobs, syncs, file tools) sends its requests through
//! one, so a request for an isolated sandbox `HOST/ID` always crosses the
//! wire inside `InSandbox { id, … }` on HOST's connection, and the host's
//! agent confines it. What must not run inside (GPU leases, the heartbeat)
//! is sent by the session on the bare [`Connection`].

use std::ops::Deref;
use std::sync::Arc;

use outpost_protocol::Request;

use super::connection::{Call, Connection};
use super::error::CallError;

/// A live connection and the isolated sandbox its requests are for (None:
/// the host itself). Cheap to clone; derefs to the [`Connection`] for its
/// hello, facts and state.
#[derive(Clone)]
pub struct ScopedConn {
    conn: Arc<Connection>,
    sandbox: Option<Arc<str>>,
}

impl ScopedConn {
    pub(super) fn new(conn: Arc<Connection>, sandbox: Option<Arc<str>>) -> ScopedConn {
        ScopedConn { conn, sandbox }
    }

    /// Sends `request` (inside the sandbox, for one); the answer arrives
    /// through the returned [`Call`].
    pub fn start(&self, request: Request) -> Result<Call, CallError> {
        self.conn.start(scoped(request, self.sandbox.as_deref()))
    }

    /// [`Connection::start_with_content`], in the sandbox if there is one.
    pub fn start_with_content(
        &self,
        request: Request,
        content: Arc<Vec<u8>>,
    ) -> Result<Call, CallError> {
        self.conn
            .start_with_content(scoped(request, self.sandbox.as_deref()), content)
    }

    /// The isolated sandbox's id; None for the host itself.
    pub fn sandbox(&self) -> Option<&str> {
        self.sandbox.as_deref()
    }
}

impl Deref for ScopedConn {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.conn
    }
}

/// `request` as sent for `sandbox`: wrapped in `InSandbox` for one, as it
/// is for the host.
pub(super) fn scoped(request: Request, sandbox: Option<&str>) -> Request {
    match sandbox {
        Some(id) => Request::InSandbox {
            id: id.to_string(),
            request: Box::new(request),
        },
        None => request,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_for_a_sandbox_go_inside_it() {
        assert_eq!(scoped(Request::Ping, None), Request::Ping);
        assert_eq!(
            scoped(Request::Metrics, Some("sbx-1")),
            Request::InSandbox {
                id: "sbx-1".into(),
                request: Box::new(Request::Metrics)
            }
        );
    }
}
