//! The requests that list or change a sandbox as a whole, answered in
//! `serve` on a blocking thread, each by the module that does it. Making
//! one (`SandboxCreate`, `SandboxFork`) goes through the daemon instead, so
//! that its keeper is the daemon's child.

use outpost_protocol::{AgentError, ErrorKind, Request, Response};

use super::store::error;
use super::{checkpoint, pause, ports};

pub fn answer(request: Request) -> Result<Response, AgentError> {
    match request {
        Request::SandboxList => super::list(),
        Request::SandboxRenew { id, ttl_ms } => super::renew(&id, ttl_ms),
        Request::SandboxDelete { id } => super::delete(&id),
        Request::SandboxPause { id, stop_clock } => pause::pause(&id, stop_clock),
        Request::SandboxResume { id } => pause::resume(&id),
        Request::SandboxCheckpoint { id, label } => checkpoint::create(&id, label),
        Request::SandboxCheckpoints { id } => checkpoint::list(&id),
        Request::SandboxRestore { id, number, paths } => checkpoint::restore(&id, number, &paths),
        Request::SandboxDiff { id, number } => checkpoint::diff(&id, number),
        Request::SandboxExpose { id, port } => ports::expose(&id, port),
        _ => Err(error(
            ErrorKind::Internal,
            "not a request for a sandbox as a whole",
        )),
    }
}
