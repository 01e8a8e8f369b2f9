//! Who is calling. Over stdio the one client that started this process; over
//! HTTP the holder of the bearer token the request carried ([`super::http`]
//! names each token it accepts and puts the name in the request's
//! extensions). What a caller starts that outlives one request (MCP Tasks,
//! background transfers, job read cursors) is kept per caller in
//! [`super::Shared`], so a stateless HTTP client finds it on its next
//! request and no other caller can. An OAuth access token names its
//! subject (`oauth:owner` for the built-in server's one owner): what is
//! kept is bound to the subject, whichever of their clients started it,
//! and the audit log records the client too.

use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::service::RequestContext;

/// A caller's name: `stdio`, the name of the HTTP token it presented, or
/// `oauth:SUBJECT`; equal callers share what they started.
#[derive(Clone, Debug)]
pub struct Caller {
    name: Arc<str>,
    /// The OAuth client the subject signed in with, for the audit log.
    oauth_client: Option<Arc<str>>,
}

/// The name and whether it signed in by OAuth; not the OAuth client.
impl PartialEq for Caller {
    fn eq(&self, other: &Caller) -> bool {
        self.name == other.name && self.oauth_client.is_some() == other.oauth_client.is_some()
    }
}

impl Eq for Caller {}

impl std::hash::Hash for Caller {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.oauth_client.is_some().hash(state);
    }
}

impl Caller {
    /// The client on stdin/stdout.
    pub fn stdio() -> Caller {
        Caller::token("stdio")
    }

    /// The holder of the HTTP token called `name`.
    pub fn token(name: &str) -> Caller {
        Caller {
            name: Arc::from(name),
            oauth_client: None,
        }
    }

    /// The holder of an OAuth access token: its subject, through `client`.
    pub fn oauth(subject: &str, client: &str) -> Caller {
        Caller {
            name: Arc::from(format!("oauth:{subject}")),
            oauth_client: Some(Arc::from(client)),
        }
    }

    /// The OAuth subject and client, for a caller that signed in so.
    pub fn oauth_identity(&self) -> Option<(&str, &str)> {
        let client = self.oauth_client.as_deref()?;
        Some((self.name.strip_prefix("oauth:")?, client))
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
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oauth_subject_is_one_caller_whichever_client_it_uses() {
        let claude = Caller::oauth("owner", "Claude (c1)");
        let chatgpt = Caller::oauth("owner", "ChatGPT (c2)");
        assert_eq!(claude, chatgpt, "tasks are bound to the subject");
        assert_eq!(claude.oauth_identity(), Some(("owner", "Claude (c1)")));
        assert_ne!(claude, Caller::oauth("alice", "Claude (c1)"));
        // A token named like a subject is still another caller.
        assert_ne!(claude, Caller::token("oauth:owner"));
        assert_eq!(Caller::token("codex").oauth_identity(), None);
    }
}
