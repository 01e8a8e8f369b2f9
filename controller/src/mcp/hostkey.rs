//! Host keys confirmed by the person at the client: while a tool call of a
//! client that supports elicitation connects to a host whose key no
//! known_hosts file records, the person is shown the host, port, key type
//! and SHA256 fingerprint and chooses: reject, trust once, or trust and
//! save. No answer, a decline or a dismissal is a rejection. There is no
//! tool that accepts a key: a model cannot answer for the person.

use futures::future::BoxFuture;
use rmcp::elicit_safe;
use schemars::JsonSchema;
use serde::Deserialize;

use super::ask::{Answer, Person};
use crate::host::{ConfirmHostKey, HostKeyDecision, UnknownHostKey};

/// Puts an unknown host key to `person`.
pub(super) struct AskThePerson {
    person: Person,
    timeout: std::time::Duration,
}

impl AskThePerson {
    pub(super) fn new(person: Person, timeout: std::time::Duration) -> AskThePerson {
        AskThePerson { person, timeout }
    }
}

/// The person's answer.
#[derive(Debug, Deserialize, JsonSchema)]
struct HostKeyAnswer {
    decision: Decision,
}

// Plain variants: elicitation forms take a string enum (the question says
// what each means).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(inline)]
enum Decision {
    Reject,
    TrustOnce,
    TrustAndSave,
}

elicit_safe!(HostKeyAnswer);

impl ConfirmHostKey for AskThePerson {
    fn confirm(&self, key: UnknownHostKey) -> BoxFuture<'_, HostKeyDecision> {
        Box::pin(async move {
            let question = format!(
                "Outpost is connecting to {} (port {}) for the first time. Its {} host key has the \
                 fingerprint {}. Compare it with the host's own (ssh-keygen -lf \
                 /etc/ssh/ssh_host_*_key.pub on the host) before trusting it. reject: do not \
                 connect; trust_once: connect while this Outpost server runs, record nothing; \
                 trust_and_save: connect and record the key in Outpost's known_hosts.",
                key.host, key.port, key.key_type, key.fingerprint
            );
            match self
                .person
                .ask::<HostKeyAnswer>(question, self.timeout)
                .await
            {
                Answer::Given(HostKeyAnswer { decision }) => match decision {
                    Decision::Reject => HostKeyDecision::Reject,
                    Decision::TrustOnce => HostKeyDecision::TrustOnce,
                    Decision::TrustAndSave => HostKeyDecision::TrustAndSave,
                },
                Answer::Failed(e) => {
                    tracing::warn!("host key of {} not confirmed: {e}", key.host);
                    HostKeyDecision::Reject
                }
                _ => HostKeyDecision::Reject,
            }
        })
    }
}
