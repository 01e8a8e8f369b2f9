//! What `tools/list` says about each tool. Agents pay for every character of
//! the list in every session, and clients that validate results (the
//! official Python SDK does, on every call) pay for every schema node, so
//! the schemas schemars derives are made compact here, once, when the server
//! is built:
//!
//! * parameters keep their docs (one line each) but lose what the type
//!   already says: `format`, `minimum: 0`, `default: false`, and the `null`
//!   an optional parameter admits (leaving it out is how a caller says
//!   "default");
//! * results keep their structure (every field's name, nested objects'
//!   `properties`, the `items` of arrays of objects, maps, `$defs`) and lose
//!   their prose, `required` lists and types (a list of plain values is a
//!   value): the agent reads the values in every result
//!   anyway, and at about 20 characters a field the types would cost more
//!   than all the tools' descriptions together; fields are named
//!   [`NAMED_LEVELS`] deep (`list_sandboxes` names `sandboxes`, not each
//!   sandbox's fields);
//! * a `$defs` entry used once is written where it is used;
//! * remote-sandbox-mcp parameters that are refused or have nothing left to
//!   do are accepted but not listed, and `exec_bash_background`'s watch
//!   settings are listed with the watch tools ([`unlisted`]);
//! * every tool that only reads, never destroys or is idempotent says so,
//!   so clients can auto-approve it ([`hints`]); the defaults go unsaid;
//! * a tool that is only another name of a listed one is callable but not
//!   listed ([`UNLISTED_TOOLS`]), and rarely needed ones are callable but
//!   listed only with the advanced tools ([`LISTED_WHEN_ADVANCED`]).
//!
//! Also [`unknown_argument`]: a call naming an argument its tool does not
//! take is refused, so a typo never loses a setting silently.

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::Value;

/// Each tool's parameters that it takes but does not list.
pub(super) type Unlisted = HashMap<String, Vec<&'static str>>;

/// Makes every tool of `router` compact and annotated; `advanced`: the
/// watch tools are listed too; `slurm`: a Slurm cluster is configured, so
/// its parameters are listed. Returns what each tool takes unlisted.
pub(super) fn finish<S>(router: &mut ToolRouter<S>, advanced: bool, slurm: bool) -> Unlisted {
    let mut unlisted_by_tool = Unlisted::new();
    for route in router.map.values_mut() {
        let tool = &mut route.attr;
        let mut input = compact(&tool.input_schema, Part::Parameters);
        if let Some(Value::Object(properties)) = input.get_mut("properties") {
            // Only what the tool takes: hiding a name it lacks would make
            // that name accepted, and silently dropped.
            let hidden: Vec<&'static str> = unlisted(&tool.name, advanced)
                .chain(
                    if slurm {
                        &[][..]
                    } else {
                        slurm_only(&tool.name)
                    }
                    .iter()
                    .copied(),
                )
                .filter(|name| properties.remove(*name).is_some())
                .collect();
            if !hidden.is_empty() {
                unlisted_by_tool.insert(tool.name.to_string(), hidden);
            }
        }
        tool.input_schema = Arc::new(input);
        if let Some(output) = &tool.output_schema {
            let mut output = compact(output, Part::Result);
            if CALLED_OFTEN.contains(&tool.name.as_ref()) {
                output.insert("$schema".into(), DRAFT_07.into());
            }
            tool.output_schema = Some(Arc::new(output));
        }
        let hints = hints(&tool.name);
        // Nothing said is the defaults (destructive, open world).
        tool.annotations = (hints != ToolAnnotations::new()).then_some(hints);
    }
    unlisted_by_tool
}

/// The tools an agent calls again and again. A validating client checks
/// the schema itself against its metaschema on every call (the Python SDK
/// through `jsonschema.validate`): 2020-12's, the default, costs about
/// 5 ms a call, draft-07's under 1 ms. Their schemas use nothing draft-07
/// lacks; the rest go without the 50 characters it costs in the list.
const CALLED_OFTEN: &[&str] = &[
    "exec_bash",
    "wait_background_task",
    "check_background_task",
    "read_remote_file",
    "write_remote_file",
    "list_remote_files",
    "sync_local_to_remote",
    "sync_remote_to_local",
];

/// Short for draft-07 (with or without its empty fragment, validators
/// know it).
const DRAFT_07: &str = "http://json-schema.org/draft-07/schema";

/// Tools that are callable but never listed: other names of listed tools,
/// for agents that guess them.
pub(super) const UNLISTED_TOOLS: &[&str] = &["close_sandbox"];

/// Tools every client may call but only the advanced listing names: what
/// an agent rarely needs (a sandbox's own status is in list_sandboxes, its
/// TTL is set at creation, GPUs come with `create_sandbox(gpus)`, a job's
/// name with its start), and one call that create_sandbox, execute_code
/// and delete_sandbox make up. Every session pays for the default list.
pub(super) const LISTED_WHEN_ADVANCED: &[&str] = &[
    "get_sandbox_status",
    "renew_sandbox",
    "reserve_gpus",
    "release_gpus",
    "list_background_tasks",
    "create_run_close",
    "list_checkpoints",
    "pause_sandbox",
    "resume_sandbox",
    "open_terminal",
    "send_terminal",
    "read_terminal",
    "close_terminal",
];

/// Whether `tools/list` names `tool`; `advanced`: the advanced listing.
pub(super) fn is_listed(tool: &str, advanced: bool) -> bool {
    !UNLISTED_TOOLS.contains(&tool) && (advanced || !LISTED_WHEN_ADVANCED.contains(&tool))
}

/// remote-sandbox-mcp's job parameters that are refused (hooks come from
/// the user's config, never from a call) or have nothing left to do (every
/// job is supervised by its host and keeps its whole log): accepted so that
/// its calls work unchanged, never listed.
const INERT_OR_REFUSED: &[&str] = &[
    "webhook_url",
    "event_command",
    "codex_command",
    "codex_wakeup",
    "notify_local",
    "ensure_watchdog",
    "max_log_lines",
];

/// `exec_bash_background`'s settings for the watch tools, which only those
/// who list the watch tools need to read about.
const WATCH_SETTINGS: &[&str] = &[
    "watch",
    "watch_name",
    "run_id",
    "metadata_json",
    "checkpoint_path",
    "checkpoint_format",
    "checkpoint_command",
    "resume_command",
    "resume_plan_json",
    "auto_resume",
    "resume_delay_s",
    "max_resume_attempts",
    "interval_s",
    "alert_after_failures",
];

/// `tool`'s parameters for a Slurm cluster: listed only where one is
/// configured (a call with them elsewhere is told they are Slurm's).
fn slurm_only(tool: &str) -> &'static [&'static str] {
    match tool {
        "exec_bash_background" => &["scheduler", "gpus", "time", "partition"],
        "create_sandbox" => &["time", "partition"],
        _ => &[],
    }
}

/// The parameters `tool` takes but does not list.
fn unlisted(tool: &str, advanced: bool) -> impl Iterator<Item = &'static str> {
    let (inert, watch) = match tool {
        "exec_bash_background" => (
            INERT_OR_REFUSED,
            if advanced { &[][..] } else { WATCH_SETTINGS },
        ),
        "exec_bash_background_watch" | "watch_background_task" => (INERT_OR_REFUSED, &[][..]),
        // A job's watch id is its name; only the watch tools hand one out.
        "check_background_task" if !advanced => (&[][..], &["watch_id"][..]),
        _ => (&[][..], &[][..]),
    };
    inert.iter().chain(watch).copied()
}

#[derive(Clone, Copy, PartialEq)]
enum Part {
    Parameters,
    Result,
}

fn compact(schema: &JsonObject, part: Part) -> JsonObject {
    let mut top = schema.clone();
    top.remove("$schema");
    let mut top = match compact_value(Value::Object(top), part) {
        Value::Object(top) => inline_single_use(top),
        _ => unreachable!("an object stays an object"),
    };
    if part == Part::Result {
        let mut whole = Value::Object(top);
        open_below(&mut whole, 0);
        let Value::Object(open) = whole else {
            unreachable!("an object stays an object")
        };
        top = open;
    }
    // MCP wants every schema to say it describes an object.
    top.entry("type").or_insert_with(|| "object".into());
    top
}

/// How many levels of a result's fields its schema names: the top, where
/// a field's name says what it holds; below it the values speak.
const NAMED_LEVELS: usize = 1;

/// Leaves the objects below [`NAMED_LEVELS`] open; `schema` describes a
/// value `level` fields down.
fn open_below(schema: &mut Value, level: usize) {
    let Value::Object(map) = schema else {
        return;
    };
    if let Some(items) = map.get_mut("items") {
        open_below(items, level);
    }
    if level >= NAMED_LEVELS {
        map.remove("properties");
    } else if let Some(Value::Object(fields)) = map.get_mut("properties") {
        for field in fields.values_mut() {
            open_below(field, level + 1);
        }
    }
}

/// Writes each `$defs` entry that one `$ref` uses in that place: a name and
/// a reference cost more than they save when used once.
fn inline_single_use(mut top: JsonObject) -> JsonObject {
    let Some(Value::Object(defs)) = top.remove("$defs") else {
        return top;
    };
    let text = serde_json::to_string(&top).unwrap_or_default()
        + &serde_json::to_string(&defs).unwrap_or_default();
    let (once, shared): (JsonObject, JsonObject) = defs.into_iter().partition(|(name, def)| {
        let pointer = format!("\"#/$defs/{name}\"");
        let own = serde_json::to_string(def).unwrap_or_default();
        text.matches(&pointer).count() == 1 && !own.contains(&pointer)
    });
    let mut top = match substitute(Value::Object(top), &once) {
        Value::Object(top) => top,
        _ => unreachable!("an object stays an object"),
    };
    let shared: JsonObject = shared
        .into_iter()
        .map(|(name, def)| (name, substitute(def, &once)))
        .collect();
    if !shared.is_empty() {
        top.insert("$defs".into(), Value::Object(shared));
    }
    top
}

/// `value` with each `{"$ref": "#/$defs/X", …}` whose X is in `defs`
/// replaced by X itself, the reference's own keys (a description, a
/// default) written over it.
fn substitute(value: Value, defs: &JsonObject) -> Value {
    match value {
        Value::Object(mut map) => {
            if let Some(Value::Object(def)) = map
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix("#/$defs/"))
                .and_then(|name| defs.get(name))
            {
                let mut def = def.clone();
                map.remove("$ref");
                def.extend(map);
                return substitute(Value::Object(def), defs);
            }
            Value::Object(
                map.into_iter()
                    .map(|(k, v)| (k, substitute(v, defs)))
                    .collect(),
            )
        }
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|v| substitute(v, defs)).collect())
        }
        other => other,
    }
}

fn compact_value(value: Value, part: Part) -> Value {
    match value {
        Value::Object(mut map) => {
            // Before the parts are compacted, while a null still reads as one.
            drop_null(&mut map);
            if part == Part::Parameters {
                split_type_list(&mut map);
            }
            let mut out = JsonObject::new();
            for (key, v) in map {
                match key.as_str() {
                    "format" => continue,
                    "minimum" if v == 0 => continue,
                    // A flag is off unless given.
                    "default" if v == false => continue,
                    // Which fields a result always has shows in every result.
                    "description" | "title" | "required" if part == Part::Result => continue,
                    // Emptied, a result's alternatives would all match.
                    "oneOf" if part == Part::Result => {
                        out.insert("anyOf".into(), compact_value(v, part));
                    }
                    "description" => {
                        // Doc comments wrap; a description is one line.
                        let text = v.as_str().unwrap_or_default().replace('\n', " ");
                        out.insert(key, Value::String(text));
                    }
                    // Map keys, not schemas: never rewritten as schemas are.
                    "properties" | "$defs" => {
                        let Value::Object(entries) = v else {
                            out.insert(key, v);
                            continue;
                        };
                        let entries = entries
                            .into_iter()
                            .map(|(name, schema)| (name, compact_value(schema, part)))
                            .collect();
                        out.insert(key, Value::Object(entries));
                    }
                    _ => {
                        out.insert(key, compact_value(v, part));
                    }
                }
            }
            if part == Part::Result {
                // A list of plain values (or of anything: a bare `true`,
                // which some clients refuse as a schema) is a value too.
                if out.get("items").is_some_and(|items| {
                    items == &Value::Object(JsonObject::new()) || items == &Value::Bool(true)
                }) {
                    out.remove("items");
                }
                if is_scalar(&out) {
                    out.clear();
                } else if out.contains_key("properties") || out.contains_key("items") {
                    // Fields say it is an object, items that it is an array.
                    out.remove("type");
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|v| compact_value(v, part)).collect())
        }
        other => other,
    }
}

/// Whether `schema` describes a plain value: no fields, items, map values,
/// references or alternatives of its own.
fn is_scalar(schema: &JsonObject) -> bool {
    const STRUCTURE: [&str; 7] = [
        "properties",
        "items",
        "additionalProperties",
        "$ref",
        "$defs",
        "anyOf",
        "oneOf",
    ];
    !STRUCTURE.iter().any(|k| schema.contains_key(*k))
}

/// `"type": ["string", "integer"]` → `anyOf` of one type each: clients that
/// map schemas onto a single-`type` dialect (Gemini's function
/// declarations) refuse a list of types.
fn split_type_list(schema: &mut JsonObject) {
    if let Some(Value::Array(types)) = schema.get("type") {
        let options = types
            .iter()
            .map(|t| serde_json::json!({ "type": t }))
            .collect();
        schema.remove("type");
        schema.insert("anyOf".into(), Value::Array(options));
    }
}

/// `"type": ["string", "null"]` → `"type": "string"`, and `anyOf: [X, {"type":
/// "null"}]` → X: an optional parameter is left out, not sent as null (the
/// server still accepts null), and a result leaves out a field it has no
/// value for (every `Option` in a result is `skip_serializing_if`).
fn drop_null(schema: &mut JsonObject) {
    if let Some(Value::Array(types)) = schema.get("type") {
        let mut kept: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        let kept = match kept.len() {
            1 => kept.remove(0),
            _ => Value::Array(kept),
        };
        schema.insert("type".into(), kept);
    }
    if let Some(Value::Array(options)) = schema.get("anyOf") {
        let kept: Vec<&Value> = options
            .iter()
            .filter(|o| o.get("type").is_none_or(|t| t != "null"))
            .collect();
        if kept.len() == 1
            && let Value::Object(only) = kept[0].clone()
        {
            schema.remove("anyOf");
            schema.extend(only);
        }
    }
}

/// The error for the first argument of `args` that `tool` does not take,
/// naming the closest one it does.
pub(super) fn unknown_argument(
    tool: &Tool,
    unlisted: &[&str],
    args: &JsonObject,
) -> Option<String> {
    let known = tool.input_schema.get("properties")?.as_object()?;
    let unknown = args
        .keys()
        .find(|k| !known.contains_key(*k) && !unlisted.contains(&k.as_str()))?;
    let closest = known
        .keys()
        .map(String::as_str)
        .chain(unlisted.iter().copied())
        .map(|k| (strsim::jaro_winkler(unknown, k), k))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .filter(|(score, _)| *score >= 0.8);
    let name = &tool.name;
    Some(match closest {
        Some((_, k)) => format!("{name} has no argument `{unknown}`; did you mean `{k}`?"),
        None => {
            let all: Vec<&str> = known.keys().map(String::as_str).collect();
            format!(
                "{name} has no argument `{unknown}`; it takes {}",
                all.join(", ")
            )
        }
    })
}

/// The error for a call of a tool `router` lacks, naming the closest listed
/// one, or the list when none is close.
pub(super) fn unknown_tool<S>(name: &str, router: &ToolRouter<S>) -> String {
    let mut listed: Vec<&str> = router
        .map
        .keys()
        .map(|k| k.as_ref())
        .filter(|k| is_listed(k, true))
        .collect();
    listed.sort_unstable();
    let closest = listed
        .iter()
        .map(|k| (strsim::jaro_winkler(name, k), *k))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .filter(|(score, _)| *score >= 0.8);
    match closest {
        Some((_, k)) => format!("no tool `{name}`; did you mean `{k}`?"),
        None => format!("no tool `{name}`; the tools are {}", listed.join(", ")),
    }
}

/// Each tool's behaviour hints, where they differ from what MCP assumes of
/// a tool that says nothing (not read-only, destructive, not idempotent,
/// open world). A tool missing here is taken as that.
fn hints(tool: &str) -> ToolAnnotations {
    let base = ToolAnnotations::new();
    match tool {
        // Read the state of sandboxes, jobs, transfers and files.
        "list_sandboxes"
        | "get_active_sandbox"
        | "get_sandbox_status"
        | "check_background_task"
        | "list_background_tasks"
        | "wait_background_task"
        | "read_background_log"
        | "list_remote_files"
        | "read_remote_file"
        | "download_files"
        | "check_file_transfer_task"
        | "list_background_watches"
        | "get_background_watch"
        | "get_background_watch_progress"
        | "read_background_watch_log"
        | "read_background_watch_checkpoint"
        | "list_background_watch_events"
        | "get_watchdog_status"
        | "install_macos_watchdog"
        | "uninstall_macos_watchdog"
        | "list_checkpoints"
        | "diff_checkpoint"
        | "read_terminal" => base.read_only(true),
        // Run whatever the command says, with whatever it reaches.
        "exec_bash"
        | "exec_bash_background"
        | "exec_bash_background_watch"
        | "execute_code"
        | "install_package"
        // (Destructive and open-world are the defaults: not said.)
        | "create_run_close"
        | "watch_background_task" => base,
        // Kill, overwrite or delete; doing it twice changes nothing more.
        "cancel_background_task"
        | "cancel_file_transfer_task"
        | "cancel_background_watch"
        | "sync_local_to_remote"
        | "sync_local_to_remote_background"
        | "sync_remote_to_local"
        | "write_remote_file"
        | "upload_files" => base.idempotent(true),
        "select_sandbox" | "release_gpus" | "renew_sandbox" | "pause_sandbox"
        | "resume_sandbox" | "expose_port" => base.destructive(false).idempotent(true),
        "reserve_gpus" | "create_sandbox" | "checkpoint_sandbox" | "fork_sandbox" => {
            base.destructive(false)
        }
        // Files written since the checkpoint are overwritten or removed.
        "restore_checkpoint" => base.idempotent(true),
        "close_terminal" => base.idempotent(true),
        // Interrupt, restart or remove a context: its state is lost.
        "code_contexts" | "delete_sandbox" | "close_sandbox" => {
            base.idempotent(true)
        }
        _ => base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(v: Value) -> JsonObject {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn parameters_keep_docs_and_lose_what_the_type_says() {
        let schema = object(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "limit": {"description": "Most rows,\nnewest first.", "format": "uint32",
                          "minimum": 0, "type": ["integer", "null"]},
                "state": {"anyOf": [{"$ref": "#/$defs/State"}, {"type": "null"}],
                          "description": "Which."},
                "format": {"type": "string"},
                "id": {"type": ["string", "integer"]}
            },
            "required": ["format"],
            "$defs": {"State": {"enum": ["a", "b"], "type": "string"}}
        }));
        assert_eq!(
            Value::Object(compact(&schema, Part::Parameters)),
            json!({
                "type": "object",
                "properties": {
                    "limit": {"description": "Most rows, newest first.", "type": "integer"},
                    "state": {"enum": ["a", "b"], "type": "string", "description": "Which."},
                    "format": {"type": "string"},
                    "id": {"anyOf": [{"type": "string"}, {"type": "integer"}]}
                },
                "required": ["format"]
            })
        );
    }

    #[test]
    fn results_name_their_top_level_fields_and_lose_the_rest() {
        let schema = object(json!({
            "type": "object",
            "description": "A result.",
            "properties": {
                "error": {"description": "Why.", "type": ["string", "null"]},
                "size": {"format": "uint64", "minimum": 0, "type": "integer"},
                "rows": {"type": "array", "items": {"$ref": "#/$defs/Row"}},
                "tags": {"type": "array", "items": {"type": "string"}},
                "hosts": {"type": "array", "items": true},
                "env": {"type": "object", "additionalProperties": {"type": "string"}},
                "last": {"anyOf": [{"$ref": "#/$defs/Row"}, {"type": "null"}]},
                "once": {"$ref": "#/$defs/Once"},
                "kind": {"oneOf": [{"const": "a"}, {"const": "b"}]},
                "groups": {"type": "array", "items": {"$ref": "#"}},
                "deep": {"type": "object", "properties": {"two": {"type": "object",
                         "properties": {"three": {"type": "object",
                                        "properties": {"four": {"type": "integer"}}}}}}}
            },
            "required": ["size"],
            "$defs": {
                "Row": {"type": "object", "properties": {"state": {"enum": ["a", "b"]}}},
                "Once": {"type": "object", "properties": {"n": {"type": "integer"}}}
            }
        }));
        assert_eq!(
            Value::Object(compact(&schema, Part::Result)),
            json!({
                "type": "object",
                "properties": {
                    "error": {},
                    "size": {},
                    "rows": {"items": {"$ref": "#/$defs/Row"}},
                    "tags": {},
                    "hosts": {},
                    "env": {"type": "object", "additionalProperties": {}},
                    "last": {"$ref": "#/$defs/Row"},
                    "once": {},
                    "kind": {"anyOf": [{}, {}]},
                    "groups": {"items": {"$ref": "#"}},
                    "deep": {}
                },
                "$defs": {"Row": {"properties": {"state": {}}}}
            })
        );
    }

    #[test]
    fn refused_and_inert_parameters_are_accepted_but_not_listed() {
        let schema = object(json!({"type": "object", "properties": {
            "command": {"type": "string"}, "webhook_url": {"type": "string"},
            "run_id": {"type": "string"}, "partition": {"type": "string"}}}));
        let mut router = ToolRouter::<()>::new();
        router.add_route(rmcp::handler::server::router::tool::ToolRoute::new_dyn(
            Tool::new("exec_bash_background", "Start.", Arc::new(schema)),
            |_| Box::pin(async { unreachable!() }),
        ));
        let listed = |advanced: bool| {
            let mut router = router.clone();
            // No Slurm cluster configured: its parameters are hidden too.
            let unlisted = finish(&mut router, advanced, false);
            let tool = router.get("exec_bash_background").unwrap().clone();
            let names: Vec<String> = tool.input_schema["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            (names, unlisted, tool)
        };
        let (names, unlisted, tool) = listed(false);
        assert_eq!(names, ["command"]);
        let hidden = &unlisted["exec_bash_background"];
        // Only names the tool takes are hidden, so only those are accepted.
        assert_eq!(hidden, &["webhook_url", "run_id", "partition"]);
        let args =
            object(json!({"command": "x", "webhook_url": "u", "run_id": "r", "partition": "p"}));
        assert_eq!(unknown_argument(&tool, hidden, &args), None);
        assert_eq!(
            unknown_argument(&tool, hidden, &object(json!({"codex_command": "x"}))).unwrap(),
            "exec_bash_background has no argument `codex_command`; it takes command"
        );
        assert_eq!(
            unknown_argument(&tool, hidden, &object(json!({"run_di": "r"}))).unwrap(),
            "exec_bash_background has no argument `run_di`; did you mean `run_id`?"
        );
        // Listing the watch tools lists the watch settings too.
        let (names, unlisted, _) = listed(true);
        assert_eq!(names, ["command", "run_id"]);
        assert_eq!(
            unlisted["exec_bash_background"],
            ["webhook_url", "partition"]
        );
    }

    #[test]
    fn unknown_arguments_are_named_with_the_closest_known_one() {
        let schema = object(json!({"type": "object", "properties": {
            "command": {"type": "string"}, "timeout_s": {"type": "number"}}}));
        let tool = Tool::new("exec_bash", "Run.", Arc::new(schema));
        let args = |v: Value| object(v);
        assert_eq!(
            unknown_argument(&tool, &[], &args(json!({"command": "x"}))),
            None
        );
        assert_eq!(
            unknown_argument(&tool, &[], &args(json!({"command": "x", "timeout": 3}))).unwrap(),
            "exec_bash has no argument `timeout`; did you mean `timeout_s`?"
        );
        assert_eq!(
            unknown_argument(&tool, &[], &args(json!({"zzz": 1}))).unwrap(),
            "exec_bash has no argument `zzz`; it takes command, timeout_s"
        );
    }

    #[test]
    fn an_unknown_tool_is_named_with_the_closest_listed_one() {
        let router =
            super::super::Shared::new(&crate::fleet::Fleet::new(crate::config::Config::new(
                vec![crate::config::HostConfig::local()],
                std::env::temp_dir().join("outpost-listing-test/known_hosts"),
            )))
            .tool_router
            .clone();
        assert_eq!(
            unknown_tool("exec_bsh", &router),
            "no tool `exec_bsh`; did you mean `exec_bash`?"
        );
        let far = unknown_tool("zzz", &router);
        assert!(far.starts_with("no tool `zzz`; the tools are "), "{far}");
        assert!(
            far.contains("exec_bash") && !far.contains("close_sandbox"),
            "{far}"
        );
    }

    #[test]
    fn read_only_tools_say_so_and_defaults_go_unsaid() {
        assert_eq!(hints("list_sandboxes").read_only_hint, Some(true));
        // Destructive and open-world: what a client assumes of a tool that
        // says nothing.
        assert_eq!(hints("exec_bash"), ToolAnnotations::new());
        let cancel = hints("cancel_background_task");
        assert_eq!(cancel.idempotent_hint, Some(true));
        assert_eq!(cancel.destructive_hint, None);
        assert_eq!(hints("create_sandbox").destructive_hint, Some(false));
    }
}
