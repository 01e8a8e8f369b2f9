//! Asking the person at the client (a policy's confirm rule, an unknown
//! host key), each protocol era its way. A 2025-11-25 session asks with
//! `elicitation/create` on the session. A 2026-07-28 request has no
//! server-to-client requests: a call that may run as an MCP Task becomes
//! one at once and asks through the task (`input_required`, answered with
//! `tasks/update`); any other call answers `input_required` with its
//! questions and is retried with the answers (SEP-2322), its
//! `requestState` sealed to the caller and the call's arguments. A client
//! that can do none of these cannot ask, and what needs an answer is
//! refused, never assumed.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolRequestParams, ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationSchema, InputRequest, InputRequiredResult, ProtocolVersion, RequestStateCodec,
    SealOptions,
};
use rmcp::service::{ElicitationError, ElicitationMode, RequestContext, ServiceError};
use rmcp::{Peer, RoleServer};
use serde::de::DeserializeOwned;

use super::caller::Caller;
use super::task_slot::{CURRENT_TASK, TaskSlot};

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
    /// Any other 2026-07-28 request of a client that takes form
    /// elicitation: the answers its retry carries, the questions still open.
    Retry(Arc<Round>),
}

/// One round of a call that asks by `input_required` and retry.
#[derive(Default)]
pub(super) struct Round {
    /// What its state is sealed to ([`bound_to`]).
    bound: Vec<u8>,
    /// Answers the request carried (its sealed state verified), by key.
    answers: HashMap<String, serde_json::Value>,
    /// Questions met this round that have no answer yet.
    open: Mutex<BTreeMap<String, InputRequest>>,
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
        match (form, may_be_task) {
            (false, _) => None,
            (true, true) => Some(Person::Task),
            (true, false) => Some(Person::Retry(Arc::default())),
        }
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
            Person::Retry(round) => {
                // The same question on a retry has the same key.
                let key = format!("ask-{}", &blake3::hash(question.as_bytes()).to_hex()[..16]);
                if let Some(answer) = round.answers.get(&key) {
                    return read_answer(answer.clone());
                }
                match form_request::<T>(question) {
                    Ok(request) => {
                        round.open.lock().unwrap().insert(key, request);
                        Answer::Failed(
                            "the client is asked; the call is retried with the answer".into(),
                        )
                    }
                    Err(e) => Answer::Failed(e),
                }
            }
        }
    }
}

impl Round {
    /// The round a request is: the answers it carries, once its
    /// `requestState` opens for this caller and these arguments. A state
    /// that does not is refused, as the spec asks.
    pub(super) fn of(
        request: &CallToolRequestParams,
        caller: &Caller,
        codec: &RequestStateCodec,
    ) -> Result<Round, McpError> {
        let bound = bound_to(request, caller);
        let (Some(state), Some(responses)) = (&request.request_state, &request.input_responses)
        else {
            return Ok(Round {
                bound,
                ..Round::default()
            });
        };
        let asked: Vec<String> = codec
            .open_with(state, &bound)
            .ok()
            .and_then(|payload| serde_json::from_slice::<Vec<String>>(&payload).ok())
            .ok_or_else(|| {
                McpError::invalid_params(
                    "requestState does not verify for this caller and call (or has expired); \
                     call again without it",
                    None,
                )
            })?;
        let answers = responses
            .iter()
            .filter(|(key, _)| asked.contains(key))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        Ok(Round {
            bound,
            answers,
            open: Mutex::default(),
        })
    }

    /// The `input_required` answer for the questions this round left open,
    /// if it left any; its state sealed for `timeout`.
    pub(super) fn input_required(
        &self,
        codec: &RequestStateCodec,
        timeout: Duration,
    ) -> Option<InputRequiredResult> {
        let open = std::mem::take(&mut *self.open.lock().unwrap());
        if open.is_empty() {
            return None;
        }
        // The retry answers these and carries the answers given before.
        let keys: Vec<&String> = open.keys().chain(self.answers.keys()).collect();
        let payload = serde_json::to_vec(&keys).unwrap_or_default();
        let state = codec.seal_with(
            &payload,
            &SealOptions::new().associated_data(&self.bound).ttl(timeout),
        );
        Some(InputRequiredResult::new(Some(open), Some(state)))
    }
}

/// What a request's state is sealed to: its caller, tool and arguments.
fn bound_to(request: &CallToolRequestParams, caller: &Caller) -> Vec<u8> {
    let arguments = serde_json::to_vec(&request.arguments).unwrap_or_default();
    let mut bound = blake3::Hasher::new();
    bound.update(caller.name().as_bytes());
    bound.update(b"\0");
    bound.update(request.name.as_bytes());
    bound.update(b"\0");
    bound.update(&arguments);
    bound.finalize().as_bytes().to_vec()
}

/// A key for sealing request states, new with each process.
pub(super) fn state_codec() -> RequestStateCodec {
    let mut key = [0u8; 32];
    let read = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key));
    if let Err(e) = read {
        // Without a secret key no state can be trusted: every retry asks
        // again, and none is taken as answered.
        tracing::warn!("cannot read /dev/urandom ({e}); request states will not verify");
    }
    RequestStateCodec::try_new(key.to_vec()).expect("a 32-byte key")
}

fn form_request<T: schemars::JsonSchema>(question: String) -> Result<InputRequest, String> {
    let schema = ElicitationSchema::from_type::<T>()
        .map_err(|e| format!("no form for the question: {e}"))?;
    Ok(InputRequest::Elicitation(ElicitRequest::new(
        ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: question,
            requested_schema: schema,
        },
    )))
}

/// An `ElicitResult` as the person's answer.
fn read_answer<T: DeserializeOwned>(answer: serde_json::Value) -> Answer<T> {
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

/// Makes the call a task (now, if it is not one yet) and asks through it.
async fn ask_in_task<T: schemars::JsonSchema + DeserializeOwned>(
    slot: &TaskSlot,
    question: String,
    timeout: Duration,
) -> Answer<T> {
    let request = match form_request::<T>(question) {
        Ok(request) => request,
        Err(e) => return Answer::Failed(e),
    };
    let task = slot.now().await;
    let key = slot.next_input_key();
    match tokio::time::timeout(timeout, task.request_input(key, request)).await {
        Err(_) => Answer::TimedOut,
        // Cancelled (or the task gone): nobody will answer.
        Ok(Err(_)) => Answer::Dismissed,
        Ok(Ok(answer)) => read_answer(answer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
    struct Approval {
        approve: bool,
    }
    rmcp::elicit_safe!(Approval);

    fn request(command: &str) -> CallToolRequestParams {
        CallToolRequestParams::new("exec_bash")
            .with_arguments(json!({"command": command}).as_object().unwrap().clone())
    }

    /// Asks once in a fresh round of `request`; the state and key it sent.
    async fn first_round(
        codec: &RequestStateCodec,
        request: &CallToolRequestParams,
        caller: &Caller,
    ) -> (String, String) {
        let round = Arc::new(Round::of(request, caller, codec).unwrap());
        let person = Person::Retry(round.clone());
        let answer = person
            .ask::<Approval>("run it?".into(), Duration::from_secs(60))
            .await;
        assert!(matches!(answer, Answer::Failed(_)));
        let input = round
            .input_required(codec, Duration::from_secs(60))
            .unwrap();
        let key = input.input_requests.unwrap().into_keys().next().unwrap();
        (input.request_state.unwrap(), key)
    }

    #[tokio::test]
    async fn a_retry_s_answer_counts_only_for_its_own_caller_and_call() {
        let codec = state_codec();
        let alice = Caller::token("alice");
        let asked = request("make");
        let (state, key) = first_round(&codec, &asked, &alice).await;
        let retry = |mut request: CallToolRequestParams, state: &str, approve: bool| {
            request.request_state = Some(state.to_string());
            request.input_responses = Some(
                [(
                    key.clone(),
                    json!({"action": "accept", "content": {"approve": approve}}),
                )]
                .into_iter()
                .collect(),
            );
            request
        };
        let round = Round::of(&retry(asked.clone(), &state, true), &alice, &codec).unwrap();
        let answer = Person::Retry(Arc::new(round))
            .ask::<Approval>("run it?".into(), Duration::from_secs(60))
            .await;
        assert!(matches!(answer, Answer::Given(Approval { approve: true })));
        // The same state for other arguments, another caller, or altered.
        let other_call = retry(request("rm -rf build"), &state, true);
        assert!(Round::of(&other_call, &alice, &codec).is_err());
        let other_caller = retry(asked.clone(), &state, true);
        assert!(Round::of(&other_caller, &Caller::token("bob"), &codec).is_err());
        let mut forged = state.clone();
        forged.pop();
        assert!(Round::of(&retry(asked.clone(), &forged, true), &alice, &codec).is_err());
        // Nor does another process's key open it.
        assert!(Round::of(&retry(asked, &state, true), &alice, &state_codec()).is_err());
    }
}
