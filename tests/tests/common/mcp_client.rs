//! A real MCP client (rmcp's) driving `outpost mcp` over stdio.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use outpost_e2e::{Sshd, TempDir, target_bin};
use rmcp::model::{CallToolRequestParams, ProgressNotificationParam};
use rmcp::service::NotificationContext;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient};
use serde_json::{Value, json};

pub type Client<H = ()> = rmcp::service::RunningService<RoleClient, H>;

/// A client that keeps every progress notification it receives.
#[derive(Clone, Default)]
pub struct ProgressLog(pub std::sync::Arc<Mutex<Vec<ProgressNotificationParam>>>);

impl ProgressLog {
    pub fn take(&self) -> Vec<ProgressNotificationParam> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl ClientHandler for ProgressLog {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.0.lock().unwrap().push(params);
    }
}

/// `outpost mcp` with only `env` and an empty home; the home lives as long as
/// the returned guard.
pub async fn start(env: &[(&str, String)]) -> (Client, TempDir) {
    start_as((), env).await
}

/// [`start`] with `handler` as the client's handler.
pub async fn start_as<H: ClientHandler>(
    handler: H,
    env: &[(&str, String)],
) -> (Client<H>, TempDir) {
    start_in_era(handler, env, rmcp::service::ClientLifecycleMode::Initialize).await
}

/// [`start_as`] in the 2026-07-28 era: `server/discover`, no handshake, each
/// request carrying its version and the client's capabilities.
#[allow(dead_code)] // not every test binary speaks it
pub async fn start_modern<H: ClientHandler>(
    handler: H,
    env: &[(&str, String)],
) -> (Client<H>, TempDir) {
    let era = rmcp::service::ClientLifecycleMode::Discover {
        preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
    };
    start_in_era(handler, env, era).await
}

async fn start_in_era<H: ClientHandler>(
    handler: H,
    env: &[(&str, String)],
    era: rmcp::service::ClientLifecycleMode,
) -> (Client<H>, TempDir) {
    let home = super::scratch("mcp-home");
    let transport = TokioChildProcess::new(
        tokio::process::Command::new(target_bin("outpost")).configure(|cmd| {
            // The start directory is the server's local root when the
            // client declares none; the tests' scratch trees live here.
            cmd.arg("mcp")
                .current_dir(std::env::temp_dir())
                .env_clear()
                .env("HOME", home.path())
                .env("PATH", std::env::var("PATH").unwrap());
            for (k, v) in env {
                cmd.env(k, v);
            }
        }),
    )
    .unwrap();
    let client = rmcp::service::ClientServiceExt::serve_with_lifecycle(handler, transport, era)
        .await
        .unwrap();
    (client, home)
}

/// remote-sandbox-mcp's single-host variables for `sshd`.
pub fn ssh_env(sshd: &Sshd) -> Vec<(&'static str, String)> {
    vec![
        ("REMOTE_HOST", sshd.host().to_string()),
        ("REMOTE_PORT", sshd.port().to_string()),
        ("REMOTE_USER", sshd.user().to_string()),
        ("REMOTE_KEY_FILE", sshd.client_key().display().to_string()),
    ]
}

/// A config file naming `sshd` as sandbox "box", with the agent's state in the
/// sshd's private remote dir (so jobs and daemons of one test never meet
/// another's); returns the environment that selects it, and the file's guard.
pub fn isolated_env(sshd: &Sshd) -> (Vec<(&'static str, String)>, TempDir) {
    let dir = super::scratch("mcp-config");
    let path = dir.path().join("config.toml");
    std::fs::write(&path, sshd.sandbox_toml("box")).unwrap();
    (vec![("OUTPOST_CONFIG", path.display().to_string())], dir)
}

/// Calls a tool; returns whether it was an error and its structured result
/// (or its text, for errors). A structured result must fit the tool's
/// advertised output schema (see [`fits`]).
pub async fn call<H: ClientHandler>(
    client: &Client<H>,
    tool: &'static str,
    args: Value,
) -> (bool, Value) {
    let result = client
        .call_tool(
            CallToolRequestParams::new(tool).with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    let is_error = result.is_error.unwrap_or(false);
    if let (false, Some(value)) = (is_error, &result.structured_content)
        && let Some(schema) = output_schema(client, tool).await
        && let Err(e) = fits(&schema, &schema, value, "$")
    {
        panic!("{tool}'s result does not fit its output schema: {e}\nresult: {value}");
    }
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
    (is_error, value)
}

/// The output schema of `tool`, fetched once per test process (every server
/// advertises the same ones).
/// The output schema `client`'s list gives `tool`; None when the list does
/// not name it (a tool listed only with the advanced tools: a client has
/// nothing to check it against).
async fn output_schema<H: ClientHandler>(client: &Client<H>, tool: &str) -> Option<Value> {
    static SCHEMAS: OnceLock<Mutex<HashMap<String, Value>>> = OnceLock::new();
    let cache = SCHEMAS.get_or_init(Default::default);
    if let Some(schema) = cache.lock().unwrap().get(tool) {
        return Some(schema.clone());
    }
    let tools = client.list_all_tools().await.unwrap();
    let listed = tools.iter().any(|t| t.name == tool);
    let mut cache = cache.lock().unwrap();
    for t in tools {
        if let Some(schema) = &t.output_schema {
            cache.insert(t.name.to_string(), Value::Object((**schema).clone()));
        }
    }
    match cache.get(tool) {
        Some(schema) => Some(schema.clone()),
        None if listed => panic!("{tool} returned structured content but has no output schema"),
        None => None,
    }
}

/// Whether `value` fits `schema`, for the JSON Schema that schemars writes
/// (`$ref` into `$defs` or to the root, `type`, `properties`, `required`, `items`,
/// `anyOf`/`oneOf`/`allOf`, `enum`, `const`). Stricter than JSON Schema in
/// one way: an object key that no applicable `properties` names is an error,
/// so a result type and the schema that describes it cannot drift apart.
pub fn fits(root: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    if schema == &Value::Bool(true) {
        return Ok(());
    }
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        if r == "#" {
            return fits(root, root, value, at);
        }
        let name = r
            .strip_prefix("#/$defs/")
            .ok_or_else(|| format!("{at}: unsupported $ref {r}"))?;
        let target = root["$defs"]
            .get(name)
            .ok_or_else(|| format!("{at}: no $defs/{name}"))?;
        return fits(root, target, value, at);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(branches) = schema.get(key).and_then(Value::as_array) {
            let errors: Vec<String> = branches
                .iter()
                .filter_map(|b| fits(root, b, value, at).err())
                .collect();
            if errors.len() == branches.len() {
                return Err(format!(
                    "{at}: fits no branch of {key}: {}",
                    errors.join("; ")
                ));
            }
        }
    }
    if let Some(types) = schema.get("type") {
        let types: Vec<&str> = match types {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => return Err(format!("{at}: bad type {types}")),
        };
        let ok = types.iter().any(|t| match *t {
            "null" => value.is_null(),
            "boolean" => value.is_boolean(),
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "array" => value.is_array(),
            "object" => value.is_object(),
            _ => false,
        });
        if !ok {
            return Err(format!("{at}: {value} is not of type {types:?}"));
        }
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        return Err(format!("{at}: {value} is not one of {options:?}"));
    }
    if let Some(c) = schema.get("const")
        && c != value
    {
        return Err(format!("{at}: {value} is not {c}"));
    }
    if let (Some(items), Some(values)) = (schema.get("items"), value.as_array()) {
        for (i, v) in values.iter().enumerate() {
            fits(root, items, v, &format!("{at}[{i}]"))?;
        }
    }
    if let Some(object) = value.as_object() {
        let mut known = Vec::new();
        collect_properties(root, schema, &mut known);
        if !known.is_empty() || schema.get("properties").is_some() {
            for (key, v) in object {
                let Some(prop) = known.iter().find(|(k, _)| k == key) else {
                    return Err(format!("{at}: key {key:?} is not in the schema"));
                };
                fits(root, &prop.1, v, &format!("{at}.{key}"))?;
            }
        }
        if let Some(required) = schema.get("required").and_then(Value::as_array) {
            for r in required.iter().filter_map(Value::as_str) {
                if !object.contains_key(r) {
                    return Err(format!("{at}: required key {r:?} is missing"));
                }
            }
        }
    }
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        for s in all {
            fits(root, s, value, at)?;
        }
    }
    Ok(())
}

/// The properties `schema` names for an object, including those of the
/// branches it combines (how schemars writes `#[serde(flatten)]`).
fn collect_properties(root: &Value, schema: &Value, out: &mut Vec<(String, Value)>) {
    if let Some(target) = schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
        .and_then(|n| root["$defs"].get(n))
    {
        collect_properties(root, target, out);
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        out.extend(props.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        for branch in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            collect_properties(root, branch, out);
        }
    }
}
