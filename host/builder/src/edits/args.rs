//! Arguments of an edit tool checked against its schema before anything is read: an unknown
//! argument names the known ones, a missing `reason` says what it is for.

use serde_json::Value;

use trellis_workflow::diagnostics::did_you_mean;

use crate::{ToolFailure, ToolSpec};

/// Violations listed in one refusal at most.
const MAX_LISTED: usize = 10;

/// The names of the properties of a spec's schema, in schema order.
pub(super) fn known(spec: &ToolSpec) -> Vec<&str> {
    spec.parameters
        .get("properties")
        .and_then(Value::as_object)
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

/// Refuses `args` unless they are an object of known arguments that match the schema.
pub(super) fn check(spec: &ToolSpec, args: &Value) -> Result<(), ToolFailure> {
    let Some(obj) = args.as_object() else {
        return Err(ToolFailure::new(format!(
            "{}: expected an object of arguments, found {args}",
            spec.name
        )));
    };
    let names = known(spec);
    for key in obj.keys() {
        if !names.contains(&key.as_str()) {
            let hint = did_you_mean(key, names.iter().copied())
                .map(|c| format!(" (did you mean {c:?}?)"))
                .unwrap_or_default();
            return Err(ToolFailure::with_details(
                format!(
                    "unknown argument {key:?}{hint}: {} takes {}",
                    spec.name,
                    names.join(", ")
                ),
                serde_json::json!({ "known_arguments": names }),
            ));
        }
    }
    let required: Vec<&str> = spec
        .parameters
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for name in required {
        let missing = match obj.get(name) {
            None => true,
            Some(v) => v.is_null() && name == "reason",
        };
        if missing {
            let what = if name == "reason" {
                "every edit takes a reason: say in a sentence why you make this change (it is \
                 logged to planning/changelog/)"
                    .to_string()
            } else {
                describe(spec, name)
            };
            return Err(ToolFailure::new(format!(
                "argument {name:?} is required: {what}"
            )));
        }
    }
    if obj
        .get("reason")
        .and_then(Value::as_str)
        .is_some_and(|r| r.trim().is_empty())
    {
        return Err(ToolFailure::new(
            "argument \"reason\" is empty: say in a sentence why you make this change",
        ));
    }
    if let Some(clear) = obj.get("clear_fields").and_then(Value::as_array) {
        let fields: Vec<&str> = spec
            .parameters
            .pointer("/properties/clear_fields/items/enum")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        for name in clear.iter().filter_map(Value::as_str) {
            if !fields.contains(&name) {
                let hint = did_you_mean(name, fields.iter().copied())
                    .map(|c| format!(" (did you mean {c:?}?)"))
                    .unwrap_or_default();
                return Err(ToolFailure::with_details(
                    format!(
                        "clear_fields: unknown field {name:?}{hint}; the fields are: {}",
                        fields.join(", ")
                    ),
                    serde_json::json!({ "known_fields": fields }),
                ));
            }
        }
    }
    let validator = jsonschema::validator_for(&spec.parameters).map_err(|e| {
        ToolFailure::new(format!("{}: its argument schema is broken: {e}", spec.name))
    })?;
    let mut problems = Vec::new();
    for err in validator.iter_errors(args) {
        if problems.len() == MAX_LISTED {
            break;
        }
        let at = err.instance_path().to_string();
        let arg = at.trim_start_matches('/').replace('/', ".");
        if arg.is_empty() {
            problems.push(err.to_string());
        } else {
            problems.push(format!("argument {arg:?}: {err}"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ToolFailure::new(problems.join("; ")))
    }
}

/// What argument `name` expects, from its description in the schema.
fn describe(spec: &ToolSpec, name: &str) -> String {
    spec.parameters
        .pointer(&format!("/properties/{name}/description"))
        .and_then(Value::as_str)
        .unwrap_or("see the tool's schema")
        .to_string()
}

/// The string argument `key`, when given.
pub(super) fn opt_str<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

/// The string argument `key` (the schema made it required).
pub(super) fn req_str<'a>(args: &'a Value, key: &str) -> Result<&'a str, ToolFailure> {
    opt_str(args, key).ok_or_else(|| ToolFailure::new(format!("argument {key:?} is required")))
}

/// The string-list argument `key`; empty when absent.
pub(super) fn str_list(args: &Value, key: &str) -> Vec<String> {
    args.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}
