//! The command policy and the audit log through the real `outpost mcp` (driven
//! by rmcp's MCP client) and the `outpost` CLI, on the zero-config local
//! sandbox with a config file that has only a `[policy]`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use outpost_e2e::{TempDir, target_bin};
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ElicitRequestParams, ElicitResult,
    ElicitationAction, ElicitationCapability, Implementation, InitializeRequestParams,
};
use rmcp::service::{RequestContext, RoleClient, RunningService};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{ClientHandler, ErrorData};
use serde_json::{Value, json};

/// `outpost-deny-marker` anywhere is denied; `outpost-confirm` needs the
/// user's OK.
const CONFIG: &str = r#"
[policy]
deny = ['rm\s+-rf\s+/', 'outpost-deny-marker']
confirm = ['outpost-confirm']
confirm_timeout_s = 30
"#;

/// A home with the config file; the audit log lands in `<home>/.outpost`.
struct Setup {
    home: TempDir,
    config: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let home = TempDir::new("audit-home");
        let config = home.path().join("config.toml");
        std::fs::write(&config, CONFIG).unwrap();
        Setup { home, config }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.home.path().join(name)
    }

    fn audit_file(&self) -> PathBuf {
        self.path(".outpost/audit.jsonl")
    }

    fn audit_lines(&self) -> Vec<Value> {
        std::fs::read_to_string(self.audit_file())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(target_bin("outpost"));
        cmd.args(args)
            .env_clear()
            .env("HOME", self.home.path())
            .env("PATH", std::env::var("PATH").unwrap())
            .env("OUTPOST_CONFIG", &self.config);
        cmd
    }

    fn cli(&self, args: &[&str]) -> Output {
        self.command(args).stdin(Stdio::null()).output().unwrap()
    }

    async fn client<H: ClientHandler>(&self, handler: H) -> RunningService<RoleClient, H> {
        self.client_in_era(handler, rmcp::service::ClientLifecycleMode::Initialize)
            .await
    }

    async fn client_in_era<H: ClientHandler>(
        &self,
        handler: H,
        era: rmcp::service::ClientLifecycleMode,
    ) -> RunningService<RoleClient, H> {
        let transport = TokioChildProcess::new(
            tokio::process::Command::new(target_bin("outpost")).configure(|cmd| {
                cmd.arg("mcp")
                    .env_clear()
                    .env("HOME", self.home.path())
                    .env("PATH", std::env::var("PATH").unwrap())
                    .env("OUTPOST_CONFIG", &self.config);
            }),
        )
        .unwrap();
        rmcp::service::ClientServiceExt::serve_with_lifecycle(handler, transport, era)
            .await
            .unwrap()
    }
}

/// Calls a tool: whether it was an error, and its structured result (or text).
async fn call<H: ClientHandler>(
    client: &RunningService<RoleClient, H>,
    tool: &'static str,
    args: Value,
) -> (bool, Value) {
    let result = client
        .call_tool(
            CallToolRequestParams::new(tool).with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    let value = result.structured_content.clone().unwrap_or_else(|| {
        json!(
            result
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                .collect::<Vec<_>>()
                .join("\n")
        )
    });
    (result.is_error.unwrap_or(false), value)
}

fn info(name: &str, elicitation: bool) -> InitializeRequestParams {
    let mut capabilities = ClientCapabilities::default();
    if elicitation {
        capabilities.elicitation = Some(ElicitationCapability::default());
    }
    InitializeRequestParams::new(capabilities, Implementation::new(name, "1.0"))
}

/// A client whose user answers every confirmation the same way: approve
/// (true), say no in the form (false), or decline to answer (None).
#[derive(Clone)]
struct Person {
    answer: Option<bool>,
    asked: Arc<Mutex<Vec<String>>>,
}

impl ClientHandler for Person {
    fn get_info(&self) -> InitializeRequestParams {
        info("confirming-client", true)
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        if let ElicitRequestParams::FormElicitationParams { message, .. } = &request {
            self.asked.lock().unwrap().push(message.clone());
        }
        Ok(match self.answer {
            Some(yes) => {
                ElicitResult::new(ElicitationAction::Accept).with_content(json!({"approve": yes}))
            }
            None => ElicitResult::new(ElicitationAction::Decline),
        })
    }
}

fn exists(path: &Path) -> bool {
    path.symlink_metadata().is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_commands_are_refused_not_run_and_every_call_is_audited() {
    let setup = Setup::new();
    let client = setup.client(info("plain-client", false)).await;
    let marker = setup.path("outpost-deny-marker");
    let touch = format!("touch {}", marker.display());

    let (err, r) = call(&client, "exec_bash", json!({"command": touch})).await;
    assert!(err, "{r}");
    let text = r.as_str().unwrap();
    assert_eq!(
        text,
        format!(
            "refused by policy: deny rule \"outpost-deny-marker\" ([policy]) for sandbox local (config: {})",
            setup.config.display()
        )
    );
    // Fan-out and a background job's resume command are checked too.
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": touch, "sandboxes": ["all"]}),
    )
    .await;
    assert!(err && r.to_string().contains("refused by policy"), "{r}");
    let (err, r) = call(
        &client,
        "exec_bash_background",
        json!({"command": "sleep 0", "resume_command": touch, "auto_resume": true}),
    )
    .await;
    assert!(
        err && r.to_string().contains("resume_command: deny rule"),
        "{r}"
    );
    // A confirm rule with a client that cannot ask its user: refused.
    let confirm_marker = setup.path("outpost-confirm-marker");
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": format!("touch {}", confirm_marker.display())}),
    )
    .await;
    assert!(err, "{r}");
    assert!(
        r.to_string().contains("cannot ask the user")
            && r.to_string()
                .contains("confirm rule \\\"outpost-confirm\\\""),
        "{r}"
    );
    assert!(!exists(&marker), "a denied command ran");
    assert!(!exists(&confirm_marker), "an unconfirmed command ran");

    // Allowed calls run; secrets and contents stay out of the log.
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": "HF_TOKEN=tok-abc-123 echo ran", "sandbox_name": "local"}),
    )
    .await;
    assert!(!err && r["stdout"] == "ran\n", "{r}");
    let written = setup.path("written.txt");
    let (err, r) = call(
        &client,
        "write_remote_file",
        json!({"remote_path": written.display().to_string(), "content": "FILE-CONTENT-SECRET-42"}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(
        std::fs::read_to_string(&written).unwrap(),
        "FILE-CONTENT-SECRET-42"
    );
    let (err, _) = call(&client, "exec_bash", json!({"command": " "})).await;
    assert!(err);
    client.cancel().await.unwrap();

    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(setup.audit_file())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let raw = std::fs::read_to_string(setup.audit_file()).unwrap();
    for secret in ["tok-abc-123", "FILE-CONTENT-SECRET-42"] {
        assert!(!raw.contains(secret), "{secret} in the audit log:\n{raw}");
    }
    let lines = setup.audit_lines();
    let outcomes: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (l["tool"].as_str().unwrap(), l["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(
        outcomes,
        vec![
            ("exec_bash", "refused"),
            ("exec_bash", "refused"),
            ("exec_bash_background", "refused"),
            ("exec_bash", "refused"),
            ("exec_bash", "ok"),
            ("write_remote_file", "ok"),
            ("exec_bash", "tool_error"),
        ]
    );
    for l in &lines {
        assert_eq!(l["client"], "plain-client", "{l}");
        assert!(l["time"].as_str().unwrap().ends_with('Z'), "{l}");
        assert!(l["duration_ms"].is_u64(), "{l}");
    }
    assert_eq!(lines[0]["sandbox"], "local", "the active sandbox");
    assert_eq!(lines[0]["args"]["command"], touch.as_str());
    assert!(
        lines[0]["error"]
            .as_str()
            .unwrap()
            .starts_with("refused by policy: deny rule"),
        "{}",
        lines[0]
    );
    assert_eq!(lines[1]["sandbox"], json!(["all"]));
    assert_eq!(lines[4]["args"]["command"], "HF_TOKEN=[redacted] echo ran");
    assert_eq!(lines[5]["args"]["content"]["len"], 22);
    assert!(lines[6]["error"].as_str().unwrap().contains("empty"));

    // `outpost audit`: the raw last line, and aligned lines for people.
    let out = setup.cli(&["audit", "--tail", "1", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.trim_end(), raw.lines().last().unwrap());
    let out = setup.cli(&["audit", "--tail", "3"]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<&str> = stdout.lines().collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    assert!(
        rows[0].contains("plain-client") && rows[0].contains("echo ran"),
        "{stdout}"
    );
    assert!(rows[1].contains("write_remote_file"), "{stdout}");
    assert!(rows[2].contains("tool_error"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_rules_ask_the_person_through_elicitation() {
    let setup = Setup::new();
    // A 2025-11-25 session is asked with elicitation/create; a 2026-07-28
    // client without MCP Tasks by input_required and a retry that carries
    // the answer (rmcp's client drives the rounds through its handler).
    let answers = [(Some(true), "yes"), (Some(false), "no"), (None, "declined")];
    for (era, (answer, name)) in ["legacy", "modern"]
        .into_iter()
        .flat_map(|era| answers.map(|a| (era, a)))
    {
        let person = Person {
            answer,
            asked: Arc::default(),
        };
        let lifecycle = match era {
            "legacy" => rmcp::service::ClientLifecycleMode::Initialize,
            _ => rmcp::service::ClientLifecycleMode::Discover {
                preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
            },
        };
        let client = setup.client_in_era(person.clone(), lifecycle).await;
        let name = format!("{era}-{name}");
        let marker = setup.path(&format!("outpost-confirm-{name}"));
        let command = format!("touch {}", marker.display());
        let (err, r) = call(&client, "exec_bash", json!({"command": command})).await;
        let asked = person.asked.lock().unwrap().clone();
        assert_eq!(asked.len(), 1, "{name}: {asked:?}");
        assert!(
            asked[0].contains(&command) && asked[0].contains("\"outpost-confirm\""),
            "{}",
            asked[0]
        );
        if answer == Some(true) {
            assert!(!err, "{r}");
            assert!(exists(&marker), "approved, so it ran");
        } else {
            assert!(err, "{name}: {r}");
            assert!(r.to_string().contains("declined"), "{r}");
            assert!(!exists(&marker), "{name}: it ran anyway");
        }
        // A denied command is refused before anyone is asked.
        let (err, _) = call(
            &client,
            "exec_bash",
            json!({"command": "echo outpost-confirm outpost-deny-marker"}),
        )
        .await;
        assert!(err);
        assert_eq!(
            person.asked.lock().unwrap().len(),
            1,
            "asked about a denied command"
        );
        client.cancel().await.unwrap();
    }
    let lines = setup.audit_lines();
    // Legacy: the call and the denied one, three times; modern: the round
    // that asked, the retry, the denied call.
    assert_eq!(lines.len(), 6 + 9);
    assert_eq!(lines[0]["client"], "confirming-client");
    assert_eq!(lines[0]["outcome"], "ok");
    assert_eq!(lines[0]["notes"]["confirmed"]["by"], "elicitation");
    assert_eq!(lines[2]["outcome"], "refused");
    assert!(lines[2].get("notes").is_none(), "{}", lines[2]);
    // Each 2026-07-28 request names its client in its metadata.
    assert_eq!(lines[6]["client"], "confirming-client");
    assert_eq!(lines[6]["outcome"], "input_required");
    assert_eq!(lines[7]["outcome"], "ok");
    assert_eq!(lines[7]["notes"]["confirmed"]["by"], "elicitation");
    assert_eq!(lines[10]["outcome"], "refused");
}

#[test]
fn the_cli_honours_the_same_policy() {
    let setup = Setup::new();
    let marker = setup.path("outpost-deny-marker");
    let out = setup.cli(&["exec", "--", "touch", &marker.display().to_string()]);
    assert_eq!(out.status.code(), Some(126), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refused by policy: deny rule \"outpost-deny-marker\""),
        "{stderr}"
    );
    assert!(!exists(&marker));

    // A confirm rule with no terminal to ask on: refused, not run.
    let marker = setup.path("outpost-confirm-cli");
    let out = setup.cli(&[
        "exec",
        "local",
        "--",
        "touch",
        &marker.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(126), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a terminal"), "{stderr}");
    assert!(!exists(&marker));

    let out = setup.cli(&["exec", "--", "echo", "fine"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "fine\n");

    // The CLI's own commands are not MCP tool calls.
    let out = setup.cli(&["audit"]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no tool calls"));

    // A bad pattern stops everything with a message naming it.
    std::fs::write(&setup.config, "[policy]\nallow = ['(oops']\n").unwrap();
    let out = setup.cli(&["exec", "--", "true"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("(oops"), "{stderr}");
}

/// A 2026-07-28 client (`server/discover`, no session) that takes form
/// elicitation and MCP Tasks.
#[derive(Clone)]
struct TasksClient;

impl ClientHandler for TasksClient {
    fn get_info(&self) -> InitializeRequestParams {
        let mut capabilities = ClientCapabilities::builder().enable_tasks().build();
        capabilities.elicitation = Some(ElicitationCapability::default());
        InitializeRequestParams::new(capabilities, Implementation::new("tasks-client", "1.0"))
    }
}

/// Polls task `id` until it is no longer working; returns it.
async fn poll_until<H: ClientHandler>(
    client: &RunningService<RoleClient, H>,
    id: &str,
) -> rmcp::model::DetailedTask {
    use rmcp::model::TaskStatus;
    for _ in 0..200 {
        let got = client
            .peer()
            .get_task(rmcp::model::GetTaskParams::new(id.to_string()))
            .await
            .unwrap();
        if got.task.status() != TaskStatus::Working {
            return got.task;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("task {id} stayed working");
}

/// In the 2026-07-28 era there are no server-to-client requests: a call
/// that must ask its person becomes an MCP Task at once and asks through
/// it (`input_required`, answered with `tasks/update`). A client without
/// elicitation cannot be asked, and the command is refused, not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_rules_ask_a_2026_client_through_its_task() {
    use rmcp::model::{InputRequest, TaskPayload, TaskStatus};
    let setup = Setup::new();
    let era = || rmcp::service::ClientLifecycleMode::Discover {
        preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
    };
    let client = setup.client_in_era(TasksClient, era()).await;
    for (approve, name) in [(true, "yes"), (false, "no")] {
        let marker = setup.path(&format!("outpost-confirm-modern-{name}"));
        let command = format!("touch {}", marker.display());
        let response = client
            .peer()
            .call_tool_once(
                CallToolRequestParams::new("exec_bash")
                    .with_arguments(json!({"command": command}).as_object().unwrap().clone()),
            )
            .await
            .unwrap();
        let rmcp::model::CallToolResponse::Task(created) = response else {
            panic!("{name}: no task: {response:?}");
        };
        let id = created.task.task_id;
        let waiting = poll_until(&client, &id).await;
        assert_eq!(waiting.status(), TaskStatus::InputRequired, "{waiting:?}");
        let TaskPayload::InputRequired { input_requests } = waiting.payload else {
            unreachable!()
        };
        assert_eq!(input_requests.len(), 1, "{input_requests:?}");
        let (key, request) = input_requests.into_iter().next().unwrap();
        let InputRequest::Elicitation(request) = request else {
            panic!("{request:?}");
        };
        let ElicitRequestParams::FormElicitationParams { message, .. } = request.params else {
            panic!("not a form");
        };
        assert!(message.contains(&command), "{message}");
        assert!(!exists(&marker), "it ran before the answer");
        let answer = json!({"action": "accept", "content": {"approve": approve}});
        client
            .peer()
            .update_task(rmcp::model::UpdateTaskParams::new(
                id.clone(),
                [(key, answer)].into_iter().collect(),
            ))
            .await
            .unwrap();
        let done = poll_until(&client, &id).await;
        let TaskPayload::Completed { result } = done.payload else {
            panic!("{done:?}");
        };
        if approve {
            assert_ne!(result["isError"], true, "{result:?}");
            assert!(exists(&marker), "approved, so it ran");
        } else {
            assert_eq!(result["isError"], true, "{result:?}");
            assert!(json!(result).to_string().contains("declined"), "{result:?}");
            assert!(!exists(&marker), "declined, yet it ran");
        }
    }
    client.cancel().await.unwrap();

    // Without elicitation a 2026 client has no way to be asked.
    let client = setup
        .client_in_era(info("plain-modern-client", false), era())
        .await;
    let marker = setup.path("outpost-confirm-modern-notasks");
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": format!("touch {}", marker.display())}),
    )
    .await;
    assert!(err && r.to_string().contains("cannot ask the user"), "{r}");
    assert!(!exists(&marker));
    client.cancel().await.unwrap();
}

/// What a call passes beside its command is checked too; and where allow
/// rules vouch for command text, nothing may change what that text runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_env_and_files_cannot_get_around_the_rules() {
    let setup = Setup::new();
    let client = setup.client(info("plain-client", false)).await;
    let refused = |r: &Value, start: &str| r.as_str().is_some_and(|t| t.starts_with(start));
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": "cat", "stdin": "x outpost-deny-marker"}),
    )
    .await;
    assert!(
        err && refused(&r, "refused by policy: stdin: deny rule"),
        "{r}"
    );
    let (err, r) = call(
        &client,
        "create_sandbox",
        json!({"host": "local", "env": {"X": "outpost-deny-marker"}}),
    )
    .await;
    assert!(
        err && refused(&r, "refused by policy: env: deny rule"),
        "{r}"
    );
    // An install names index projects only, never a local archive.
    let (err, r) = call(&client, "install_package", json!({"packages": ["x.whl"]})).await;
    assert!(
        err && r.to_string().contains("no options, paths or URLs"),
        "{r}"
    );
    client.cancel().await.unwrap();

    std::fs::write(
        &setup.config,
        "[policy.sandbox.local]\nallow = ['python3 train\\.py', 'ls']\n",
    )
    .unwrap();
    let client = setup.client(info("plain-client", false)).await;
    let changes = "could change what they run";
    let script = setup.path("train.py");
    let (err, r) = call(
        &client,
        "write_remote_file",
        json!({"remote_path": script.display().to_string(), "content": "import os\n"}),
    )
    .await;
    assert!(err && r.to_string().contains(changes), "{r}");
    assert!(!exists(&script));
    let pushed = setup.path("pushed");
    let (err, r) = call(
        &client,
        "sync_local_to_remote",
        json!({"local_path": ".", "remote_path": pushed.display().to_string()}),
    )
    .await;
    assert!(err && r.to_string().contains(changes), "{r}");
    assert!(!exists(&pushed));
    let (err, r) = call(
        &client,
        "create_sandbox",
        json!({"host": "local", "env": {"PATH": "/tmp/fake:/usr/bin"}}),
    )
    .await;
    assert!(err && r.to_string().contains("a sandbox env"), "{r}");
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": "ls", "env": {"PATH": "/tmp/fake"}}),
    )
    .await;
    assert!(
        err && r.to_string().contains("matches no allow rule"),
        "{r}"
    );
    let (err, r) = call(&client, "exec_bash", json!({"command": "ls"})).await;
    assert!(!err, "{r}");
    client.cancel().await.unwrap();
}

/// What a terminal runs is a command: deny rules hold for its command and
/// for typed text, and where allow rules list what may run, terminals and
/// restores are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminals_and_restores_answer_to_the_policy() {
    let setup = Setup::new();
    let client = setup.client(()).await;
    let (err, r) = call(
        &client,
        "open_terminal",
        json!({"command": "echo outpost-deny-marker"}),
    )
    .await;
    assert!(err && r.to_string().contains("deny rule"), "{r}");
    let (err, r) = call(&client, "open_terminal", json!({})).await;
    assert!(!err, "{r}");
    let terminal = r["terminal"].as_str().unwrap().to_string();
    let (err, r) = call(
        &client,
        "send_terminal",
        json!({"terminal": terminal, "text": "echo outpost-deny-marker", "keys": ["Enter"]}),
    )
    .await;
    assert!(err && r.to_string().contains("deny rule"), "{r}");
    let (err, r) = call(&client, "close_terminal", json!({"terminal": terminal})).await;
    assert!(!err, "{r}");
    client.cancel().await.unwrap();

    std::fs::write(&setup.config, "[policy]\nallow = ['ls']\n").unwrap();
    let client = setup.client(()).await;
    let (err, r) = call(&client, "open_terminal", json!({"command": "ls"})).await;
    assert!(err && r.to_string().contains("a terminal"), "{r}");
    let (err, r) = call(
        &client,
        "restore_checkpoint",
        json!({"checkpoint": "local/sbx-x@1"}),
    )
    .await;
    assert!(err && r.to_string().contains("restoring its files"), "{r}");
    client.cancel().await.unwrap();
}

/// A `checkpoint` rule: the matching command runs after a checkpoint of its
/// sandbox, which the result names and which undoes it; other commands and
/// configured hosts get none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_rules_make_a_checkpoint_before_the_command() {
    let setup = Setup::new();
    std::fs::write(&setup.config, "[policy]\ncheckpoint = ['\\brm\\b']\n").unwrap();
    let client = setup.client(()).await;
    let (err, made) = call(
        &client,
        "create_sandbox",
        json!({"host": "local", "isolation": "none", "ttl_s": 300}),
    )
    .await;
    assert!(!err, "{made}");
    let name = made["sandbox_name"].as_str().unwrap();
    let run = |command: &str| {
        call(
            &client,
            "exec_bash",
            json!({"sandbox_name": name, "command": command}),
        )
    };
    let (err, r) = run("echo keep > precious.txt").await;
    assert!(!err && r.get("note").is_none(), "{r}");
    let (err, r) = run("rm precious.txt").await;
    assert!(!err && r["exit_code"] == 0, "{r}");
    let note = r["note"].as_str().unwrap_or_default();
    let checkpoint = format!("{name}@1");
    assert!(note.contains(&checkpoint), "{r}");

    let (err, r) = call(
        &client,
        "restore_checkpoint",
        json!({"checkpoint": checkpoint}),
    )
    .await;
    assert!(!err, "{r}");
    let (err, r) = run("cat precious.txt").await;
    assert!(!err && r["stdout"] == "keep\n", "{r}");
    let (err, r) = call(&client, "list_checkpoints", json!({"sandbox_name": name})).await;
    assert!(!err, "{r}");
    assert!(
        r.to_string().contains("policy rule"),
        "the label says why: {r}"
    );

    // `outpost exec` too, saying so on stderr.
    let out = setup.cli(&["exec", "-n", name, "--", "rm", "-f", "nothing"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    assert!(stderr.contains(&format!("{name}@2 made first")), "{stderr}");

    // The host itself has no work dir to checkpoint: the command just runs.
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"command": "rm -f /nonexistent-outpost"}),
    )
    .await;
    assert!(
        !err && r["exit_code"] == 0 && r.get("note").is_none(),
        "{r}"
    );
    client.cancel().await.unwrap();
}
