//! What `tools/list` says about each tool. Agents pay for every character of
//! the list in every session, and clients that validate results (the
//! official Python SDK does, on every call) pay for every schema node, so
//! the schemas schemars derives are made compact here, once, when the server
//! is built:
//!
//! * parameters keep their docs (one line each) but lose what the type
//!   already says: `format`, `minimum: 0`, and the `null` an optional
//!   parameter admits (leaving it out is how a caller says "default");
//! * results keep their structure (properties, types, `$defs`) and lose
//!   their prose and `required` lists;
//! * every tool gets annotations, so clients can auto-approve the read-only
//!   ones ([`hints`]).
//!
//! Also [`unknown_argument`]: a call naming an argument its tool does not
//! take is refused, so a typo never loses a setting silently.

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::Value;

/// Makes every tool of `router` compact and annotated.
pub(super) fn finish<S>(router: &mut ToolRouter<S>) {
    for route in router.map.values_mut() {
        let tool = &mut route.attr;
        tool.input_schema = Arc::new(compact(&tool.input_schema, Part::Parameters));
        if let Some(output) = &tool.output_schema {
            tool.output_schema = Some(Arc::new(compact(output, Part::Result)));
        }
        tool.annotations = Some(hints(&tool.name));
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Part {
    Parameters,
    Result,
}

fn compact(schema: &JsonObject, part: Part) -> JsonObject {
    let mut top = schema.clone();
    top.remove("$schema");
    match compact_value(Value::Object(top), part) {
        Value::Object(top) => top,
        _ => unreachable!("an object stays an object"),
    }
}

fn compact_value(value: Value, part: Part) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = JsonObject::new();
            for (key, v) in map {
                match key.as_str() {
                    "format" => continue,
                    "minimum" if v == 0 => continue,
                    // Which fields a result always has shows in every result.
                    "description" | "title" | "required" if part == Part::Result => continue,
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
            if part == Part::Parameters {
                drop_null(&mut out);
            }
            Value::Object(out)
        }
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|v| compact_value(v, part)).collect())
        }
        other => other,
    }
}

/// `"type": ["string", "null"]` → `"type": "string"`, and `anyOf: [X, {"type":
/// "null"}]` → X: an optional parameter is left out, not sent as null (the
/// server still accepts null).
fn drop_null(schema: &mut JsonObject) {
    if let Some(Value::Array(types)) = schema.get("type") {
        let kept: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        if kept.len() == 1 {
            schema.insert("type".into(), kept[0].clone());
        }
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
pub(super) fn unknown_argument(tool: &Tool, args: &JsonObject) -> Option<String> {
    let known = tool.input_schema.get("properties")?.as_object()?;
    let unknown = args.keys().find(|k| !known.contains_key(*k))?;
    let closest = known
        .keys()
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

/// Each tool's behaviour hints. A tool missing here gets none (the
/// end-to-end tests require every listed tool to have some).
fn hints(tool: &str) -> ToolAnnotations {
    let base = ToolAnnotations::new();
    match tool {
        // Read the state of sandboxes, jobs, transfers and files.
        "list_sandboxes"
        | "get_active_sandbox"
        | "check_background_task"
        | "list_background_tasks"
        | "wait_background_task"
        | "read_background_log"
        | "list_remote_files"
        | "read_remote_file"
        | "check_file_transfer_task"
        | "list_background_watches"
        | "get_background_watch"
        | "get_background_watch_progress"
        | "read_background_watch_log"
        | "read_background_watch_checkpoint"
        | "list_background_watch_events"
        | "get_watchdog_status"
        | "install_macos_watchdog"
        | "uninstall_macos_watchdog" => base.read_only(true),
        // Run whatever the command says, with whatever it reaches.
        "exec_bash" | "exec_bash_background" | "exec_bash_background_watch" => {
            base.destructive(true).open_world(true)
        }
        "watch_background_task" => base.destructive(true).open_world(true),
        // Kill, overwrite or delete; doing it twice changes nothing more.
        "cancel_background_task"
        | "cancel_file_transfer_task"
        | "cancel_background_watch"
        | "sync_local_to_remote"
        | "sync_local_to_remote_background"
        | "sync_remote_to_local"
        | "write_remote_file" => base.destructive(true).idempotent(true).open_world(false),
        "select_sandbox" | "release_gpus" => {
            base.destructive(false).idempotent(true).open_world(false)
        }
        "reserve_gpus" => base.destructive(false).open_world(false),
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
                "state": {"anyOf": [{"$ref": "#/$defs/State"}, {"type": "null"}]},
                "format": {"type": "string"}
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
                    "state": {"$ref": "#/$defs/State"},
                    "format": {"type": "string"}
                },
                "required": ["format"],
                "$defs": {"State": {"enum": ["a", "b"], "type": "string"}}
            })
        );
    }

    #[test]
    fn results_keep_structure_and_nulls_and_lose_prose() {
        let schema = object(json!({
            "type": "object",
            "description": "A result.",
            "properties": {
                "error": {"description": "Why.", "type": ["string", "null"]},
                "size": {"format": "uint64", "minimum": 0, "type": "integer"},
                "delta": {"minimum": -1, "type": "integer"}
            },
            "required": ["size"]
        }));
        assert_eq!(
            Value::Object(compact(&schema, Part::Result)),
            json!({
                "type": "object",
                "properties": {
                    "error": {"type": ["string", "null"]},
                    "size": {"type": "integer"},
                    "delta": {"minimum": -1, "type": "integer"}
                },
            })
        );
    }

    #[test]
    fn unknown_arguments_are_named_with_the_closest_known_one() {
        let schema = object(json!({"type": "object", "properties": {
            "command": {"type": "string"}, "timeout_s": {"type": "number"}}}));
        let tool = Tool::new("exec_bash", "Run.", Arc::new(schema));
        let args = |v: Value| object(v);
        assert_eq!(
            unknown_argument(&tool, &args(json!({"command": "x"}))),
            None
        );
        assert_eq!(
            unknown_argument(&tool, &args(json!({"command": "x", "timeout": 3}))).unwrap(),
            "exec_bash has no argument `timeout`; did you mean `timeout_s`?"
        );
        assert_eq!(
            unknown_argument(&tool, &args(json!({"zzz": 1}))).unwrap(),
            "exec_bash has no argument `zzz`; it takes command, timeout_s"
        );
    }

    #[test]
    fn read_only_tools_say_so() {
        assert_eq!(hints("list_sandboxes").read_only_hint, Some(true));
        let exec = hints("exec_bash");
        assert_eq!(
            (exec.destructive_hint, exec.open_world_hint),
            (Some(true), Some(true))
        );
        assert_eq!(hints("cancel_background_task").idempotent_hint, Some(true));
    }
}
