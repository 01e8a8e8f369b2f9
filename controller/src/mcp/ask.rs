//! Asking the person at the client (a policy's confirm rule, an unknown
//! host key), each protocol era its way. A 2025-11-25 session asks with
//! `elicitation/create` on the session. A 2026-07-28 request has no
//! server-to-client requests: a call that may run as an MCP Task becomes
//! one at once and asks through the task (`input_required`, answered with
//! `tasks/update`). A call that can do neither cannot ask, and what needs an
//! answer is refused, never assumed.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema,
    InputRequest, ProtocolVersion,
};
use rmcp::service::{ElicitationError, ElicitationMode, RequestContext, ServiceError};
use rmcp::{Peer, RoleServer};
use serde::de::DeserializeOwned;

use super::tasks::{CURRENT_TASK, TaskSlot};

tokio::task_local! {
    /// How the call being served can ask its person, if it can.
    static PERSON: Option<Person>;
}

/// Where a question goes.
#[derive(Clone)]
pub(super) enum Person {
    /// A 2025-11-25 session whose client takes form elicitation.
    Session(Peer<RoleServer>),
    /// A 2026-07-28 request of a client that takes form elicitation and
    /// MCP Tasks, in a call that may run as a task.
    Task,
}

/// What the person said.
pub(super) enum Answer<T> {
    Given(T),
    Declined,
    Dismissed,
    TimedOut,
    /// The question could not be put (or the answer not read).
    Failed(String),
}

impl Person {
    /// How the request `context` belongs to can ask; `may_be_task`: the
    /// call runs through [`super::tasks::run`].
    pub(super) fn of(context: &RequestContext<RoleServer>, may_be_task: bool) -> Option<Person> {
        let modern = context
            .protocol_version()
            .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
        if !modern {
            return context
                .peer
                .supported_elicitation_modes()
                .contains(&ElicitationMode::Form)
                .then(|| Person::Session(context.peer.clone()));
        }
        let form = context
            .client_capabilities()
            .and_then(|c| c.elicitation)
            .is_some_and(|e| e.form.is_some() || e.url.is_none());
        (form && may_be_task).then_some(Person::Task)
    }

    /// Runs `work` with `person` as the one to ask ([`Self::current`]).
    pub(super) async fn scope<F: Future>(person: Option<Person>, work: F) -> F::Output {
        PERSON.scope(person, work).await
    }

    /// The person the call being served can ask, if any.
    pub(super) fn current() -> Option<Person> {
        PERSON.try_with(Clone::clone).ok().flatten()
    }

    /// Puts `question` with a form of `T`'s fields; waits `timeout` at most.
    pub(super) async fn ask<T>(&self, question: String, timeout: Duration) -> Answer<T>
    where
        T: schemars::JsonSchema + DeserializeOwned + rmcp::service::ElicitationSafe,
    {
        match self {
            Person::Session(peer) => {
                match peer.elicit_with_timeout::<T>(question, Some(timeout)).await {
                    Ok(Some(answer)) => Answer::Given(answer),
                    Ok(None) | Err(ElicitationError::UserDeclined) => Answer::Declined,
                    Err(ElicitationError::UserCancelled) => Answer::Dismissed,
                    Err(ElicitationError::Service(ServiceError::Timeout { .. })) => {
                        Answer::TimedOut
                    }
                    Err(e) => Answer::Failed(e.to_string()),
                }
            }
            Person::Task => {
                let Ok(slot) = CURRENT_TASK.try_with(TaskSlot::clone) else {
                    return Answer::Failed("this call cannot run as a task".into());
                };
                ask_in_task::<T>(&slot, question, timeout).await
            }
        }
    }
}

/// Makes the call a task (now, if it is not one yet) and asks through it.
async fn ask_in_task<T: schemars::JsonSchema + DeserializeOwned>(
    slot: &TaskSlot,
    question: String,
    timeout: Duration,
) -> Answer<T> {
    let schema = match ElicitationSchema::from_type::<T>() {
        Ok(schema) => schema,
        Err(e) => return Answer::Failed(format!("no form for the question: {e}")),
    };
    let task = slot.now().await;
    let request = InputRequest::Elicitation(ElicitRequest::new(
        ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: question,
            requested_schema: schema,
        },
    ));
    let key = slot.next_input_key();
    let answer = match tokio::time::timeout(timeout, task.request_input(key, request)).await {
        Err(_) => return Answer::TimedOut,
        // Cancelled (or the task gone): nobody will answer.
        Ok(Err(_)) => return Answer::Dismissed,
        Ok(Ok(answer)) => answer,
    };
    let result: ElicitResult = match serde_json::from_value(answer) {
        Ok(result) => result,
        Err(e) => return Answer::Failed(format!("the answer is not an elicitation result: {e}")),
    };
    match result.action {
        ElicitationAction::Accept => {
            match serde_json::from_value(result.content.unwrap_or_default()) {
                Ok(answer) => Answer::Given(answer),
                Err(e) => Answer::Failed(format!("the answer does not fit the form: {e}")),
            }
        }
        ElicitationAction::Decline => Answer::Declined,
        _ => Answer::Dismissed,
    }
}

/// `work` with `person` as the one to ask, for policy questions and unknown
/// host keys alike.
pub(super) async fn with_person<F: Future>(
    person: Option<Person>,
    confirm_timeout: Duration,
    work: F,
) -> F::Output {
    let host_keys = person.clone().map(|p| {
        Arc::new(super::hostkey::AskThePerson::new(p, confirm_timeout))
            as Arc<dyn crate::host::ConfirmHostKey>
    });
    let work = Person::scope(person, work);
    match host_keys {
        Some(asker) => crate::host::HOST_KEY_CONFIRMATION.scope(asker, work).await,
        None => work.await,
    }
}
