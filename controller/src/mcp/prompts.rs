//! The prompts: ready-made tasks that walk a client through the tools (run
//! on the idlest GPU, test in a sandbox, debug in a sandbox).

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{PromptMessage, Role};
use rmcp::{prompt, prompt_router};
use schemars::JsonSchema;
use serde::Deserialize;

use super::OutpostServer;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct TaskPrompt {
    /// What to run, test or debug.
    pub task: String,
}

#[prompt_router(vis = "pub(super)")]
impl OutpostServer {
    #[prompt(description = "Run a task on the idlest sandbox with a free GPU.")]
    async fn run_on_idlest_gpu(&self, Parameters(p): Parameters<TaskPrompt>) -> Vec<PromptMessage> {
        vec![PromptMessage::new_text(
            Role::User,
            format!(
                "Run this on the idlest sandbox that has a free GPU: {}\n\
                 1. select_sandbox(sandbox_name=\"auto\", min_gpus=1) picks it (or explains why none fits).\n\
                 2. reserve_gpus(count=1) and pass its lease_id as gpu_lease to exec_bash, so the GPU is yours alone.\n\
                 3. release_gpus when done.",
                p.task
            ),
        )]
    }

    #[prompt(description = "Test code in a sandbox: set up, run the tests, report.")]
    async fn test_in_sandbox(&self, Parameters(p): Parameters<TaskPrompt>) -> Vec<PromptMessage> {
        vec![PromptMessage::new_text(
            Role::User,
            format!(
                "Test this in a sandbox: {}\n\
                 Use list_sandboxes to see what is available and exec_bash to install dependencies and run \
                 the tests (set timeout_s to fit). Report the failing tests with the relevant output only.",
                p.task
            ),
        )]
    }

    #[prompt(description = "Debug a problem in a sandbox by reproducing it first.")]
    async fn debug_in_sandbox(&self, Parameters(p): Parameters<TaskPrompt>) -> Vec<PromptMessage> {
        vec![PromptMessage::new_text(
            Role::User,
            format!(
                "Debug this in a sandbox: {}\n\
                 Reproduce it with exec_bash first, then narrow it down step by step (logs, versions, \
                 a minimal case). Change one thing at a time and show the evidence for the cause you find.",
                p.task
            ),
        )]
    }
}
