//! Who is calling. Over stdio the one client that started this process; over
//! HTTP the holder of the bearer token the request carried ([`super::http`]
//! names each token it accepts and puts the name in the request's
//! extensions). What a caller starts that outlives one request (MCP Tasks,
//! background transfers, job read cursors) is kept per caller in
//! [`super::Shared`], so a stateless HTTP client finds it on its next
//! request and no other caller can.

use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::service::RequestContext;

/// A caller's name: `stdio`, or the name of the HTTP token it presented.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Caller(Arc<str>);

impl Caller {
    /// The client on stdin/stdout.
    pub fn stdio() -> Caller {
        Caller(Arc::from("stdio"))
    }

    /// The holder of the HTTP token called `name`.
    pub fn token(name: &str) -> Caller {
        Caller(Arc::from(name))
    }

    /// The caller of the request `context` belongs to: the one the HTTP
    /// layer recorded, else the stdio client.
    pub fn of(context: &RequestContext<RoleServer>) -> Caller {
        context
            .extensions
            .get::<hyper::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>())
            .cloned()
            .unwrap_or_else(Caller::stdio)
    }

    pub fn name(&self) -> &str {
        &self.0
    }
}
