//! The original system's plan and config tools that Trellis had no counterpart of:
//! `add_todo_task_route`, `update_todo_task_route`, `delete_todo_task_route` (the routes of a
//! `todo_task` step), `cleanup_orphan_step_configs`, `set_workflow_contract_version` and
//! `set_workflow_llm_config`. Each goes through the same [`Draft`] as every edit: checked
//! against the whole workspace before anything is written, written atomically (a link on the
//! way refused), logged to the changelog.

use std::path::Path;

use serde_json::{Map, Value, json};

use super::args::{opt_str, req_str};
use super::changelog::Change;
use super::draft::Draft;
use super::plan_tools::{all_step_ids, unknown_step};
use crate::{ToolFailure, ToolResult};
use trellis_workflow::ContractVersion;

/// The rationale of a tool whose original takes none.
const NO_REASON: &str = "(no reason given)";

/// The routes of top-level `todo_task` step `parent` of the draft's plan.
fn routes_of<'a>(draft: &'a mut Draft, parent: &str) -> Result<&'a mut Vec<Value>, ToolFailure> {
    let ids = all_step_ids(&draft.plan.value);
    let found = ["steps", "orphan_steps"].into_iter().find_map(|list| {
        draft
            .plan
            .value
            .get(list)
            .and_then(Value::as_array)?
            .iter()
            .position(|s| s.get("id").and_then(Value::as_str) == Some(parent))
            .map(|i| (list, i))
    });
    let Some((list, index)) = found else {
        return Err(unknown_step(parent, ids));
    };
    let step = &mut draft.plan.value[list][index];
    let kind = step
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("regular");
    if kind != "todo_task" {
        return Err(ToolFailure::new(format!(
            "parent_step_id {parent:?} is a {kind} step: routes of this tool belong to todo_task \
             steps (a routing step's routes are edited with update_routing_step)"
        )));
    }
    let obj = step.as_object_mut().expect("a step is an object");
    let routes = obj.entry("predefined_routes").or_insert_with(|| json!([]));
    if !routes.is_array() {
        *routes = json!([]);
    }
    Ok(routes.as_array_mut().expect("an array"))
}

fn route_ids(routes: &[Value]) -> Vec<String> {
    routes
        .iter()
        .filter_map(|r| r.get("route_id").and_then(Value::as_str))
        .map(str::to_string)
        .collect()
}

fn no_route(parent: &str, id: &str, routes: &[Value]) -> ToolFailure {
    let ids = route_ids(routes);
    ToolFailure::with_details(
        format!(
            "step {parent:?} has no route {id:?} (its routes: {})",
            if ids.is_empty() {
                "none".to_string()
            } else {
                ids.join(", ")
            }
        ),
        json!({"route_ids": ids}),
    )
}

/// `add_todo_task_route`.
pub(super) fn add_todo_task_route(root: &Path, args: &Value) -> ToolResult {
    let reason = req_str(args, "reason")?;
    let parent = req_str(args, "parent_step_id")?;
    let route = args
        .get("new_route")
        .filter(|r| r.is_object())
        .cloned()
        .ok_or_else(|| ToolFailure::new("new_route: expected an object"))?;
    let id = route
        .get("route_id")
        .and_then(Value::as_str)
        .ok_or_else(|| ToolFailure::new("new_route.route_id: expected a string"))?
        .to_string();
    let mut draft = Draft::open(root)?;
    let routes = routes_of(&mut draft, parent)?;
    if route_ids(routes).contains(&id) {
        return Err(ToolFailure::new(format!(
            "step {parent:?} already has a route {id:?}: change it with update_todo_task_route"
        )));
    }
    routes.push(route.clone());
    let change = Change::new(
        Some(parent),
        format!("predefined_routes[{id}]"),
        Value::Null,
        route,
    );
    let done = draft.commit(
        "add_todo_task_route",
        reason,
        &[parent.to_string()],
        &[change],
    )?;
    Ok(done.answer(json!({"parent_step_id": parent, "route_id": id})))
}

/// The route fields `update_todo_task_route` sets.
const ROUTE_FIELDS: [&str; 4] = [
    "route_name",
    "condition",
    "orphan_step_ref",
    "sub_agent_step",
];

/// `update_todo_task_route`.
pub(super) fn update_todo_task_route(root: &Path, args: &Value) -> ToolResult {
    let reason = req_str(args, "reason")?;
    let parent = req_str(args, "parent_step_id")?;
    let id = req_str(args, "existing_route_id")?;
    let mut draft = Draft::open(root)?;
    let routes = routes_of(&mut draft, parent)?;
    let Some(at) = routes
        .iter()
        .position(|r| r.get("route_id").and_then(Value::as_str) == Some(id))
    else {
        return Err(no_route(parent, id, routes));
    };
    let route = routes[at]
        .as_object_mut()
        .ok_or_else(|| ToolFailure::new(format!("route {id:?} of {parent:?} is not an object")))?;
    let mut changes = Vec::new();
    for field in ROUTE_FIELDS {
        let Some(new) = args.get(field).filter(|v| !v.is_null()) else {
            continue;
        };
        let old = route.get(field).cloned().unwrap_or(Value::Null);
        if old == *new {
            continue;
        }
        route.insert(field.into(), new.clone());
        // One definition of the route's agent: an inline step or an orphan's, not both.
        let other = match field {
            "sub_agent_step" => Some("orphan_step_ref"),
            "orphan_step_ref" => Some("sub_agent_step"),
            _ => None,
        };
        if let Some(other) = other
            && let Some(gone) = route.remove(other)
        {
            changes.push(Change::new(
                Some(parent),
                format!("predefined_routes[{id}].{other}"),
                gone,
                Value::Null,
            ));
        }
        changes.push(Change::new(
            Some(parent),
            format!("predefined_routes[{id}].{field}"),
            old,
            new.clone(),
        ));
    }
    if changes.is_empty() {
        return Ok(json!({"ok": true, "changed": false,
            "note": "nothing to change: give route_name, condition, orphan_step_ref or sub_agent_step"}));
    }
    let done = draft.commit(
        "update_todo_task_route",
        reason,
        &[parent.to_string()],
        &changes,
    )?;
    Ok(done.answer(json!({"parent_step_id": parent, "route_id": id})))
}

/// `delete_todo_task_route`.
pub(super) fn delete_todo_task_route(root: &Path, args: &Value) -> ToolResult {
    let reason = req_str(args, "reason")?;
    let parent = req_str(args, "parent_step_id")?;
    let id = req_str(args, "deleted_route_id")?;
    let mut draft = Draft::open(root)?;
    let routes = routes_of(&mut draft, parent)?;
    let Some(at) = routes
        .iter()
        .position(|r| r.get("route_id").and_then(Value::as_str) == Some(id))
    else {
        return Err(no_route(parent, id, routes));
    };
    let old = routes.remove(at);
    let change = Change::new(
        Some(parent),
        format!("predefined_routes[{id}]"),
        old,
        Value::Null,
    );
    let done = draft.commit(
        "delete_todo_task_route",
        reason,
        &[parent.to_string()],
        &[change],
    )?;
    Ok(done.answer(json!({"parent_step_id": parent, "deleted_route_id": id})))
}

/// `cleanup_orphan_step_configs`: removes the entries of `planning/step_config.json` whose id
/// is no step of the plan (main path, orphans, routes' sub-agent steps).
pub(super) fn cleanup_orphan_step_configs(root: &Path, args: &Value) -> ToolResult {
    let reason = opt_str(args, "reason").unwrap_or(NO_REASON);
    let mut draft = Draft::open(root)?;
    let ids = all_step_ids(&draft.plan.value);
    let entries = draft.config_entries();
    let mut removed = Vec::new();
    let mut changes = Vec::new();
    entries.retain(|e| {
        let id = e.get("id").and_then(Value::as_str).unwrap_or_default();
        if ids.iter().any(|s| s == id) {
            return true;
        }
        removed.push(id.to_string());
        changes.push(Change::new(
            Some(id),
            "step_config entry",
            e.clone(),
            Value::Null,
        ));
        false
    });
    if removed.is_empty() {
        return Ok(
            json!({"ok": true, "removed": [], "note": "no entry of planning/step_config.json is orphaned"}),
        );
    }
    let done = draft.commit("cleanup_orphan_step_configs", reason, &removed, &changes)?;
    Ok(done.answer(json!({"removed": removed})))
}

/// `set_workflow_contract_version`: stamps `version` in workflow.json (the original's key;
/// Trellis's earlier `contract_version` is read and replaced). A version below the one
/// stamped, or above what Trellis reads, is refused.
pub(super) fn set_workflow_contract_version(root: &Path, args: &Value) -> ToolResult {
    let text = req_str(args, "version")?.trim();
    let reason = opt_str(args, "reason").unwrap_or(NO_REASON);
    let version = ContractVersion::parse(text).ok_or_else(|| {
        ToolFailure::new(format!(
            "version {text:?}: expected MAJOR.MINOR.PATCH such as 1.0.11"
        ))
    })?;
    if version > ContractVersion::CURRENT {
        return Err(ToolFailure::new(format!(
            "version {version}: Trellis reads workflow contracts up to {}; it cannot stamp a \
             later one",
            ContractVersion::CURRENT
        )));
    }
    let mut draft = Draft::open(root)?;
    let Some(manifest) = draft.manifest.value.as_object_mut() else {
        return Err(ToolFailure::new(
            "workflow.json is not a JSON object: fix it by hand first",
        ));
    };
    let old = manifest
        .get("version")
        .or_else(|| manifest.get("contract_version"))
        .cloned()
        .unwrap_or(Value::Null);
    if let Some(before) = old.as_str().and_then(ContractVersion::parse)
        && before > version
    {
        return Err(ToolFailure::new(format!(
            "version {version}: workflow.json is stamped {before} already; a contract version \
             never goes back"
        )));
    }
    let new = Value::String(version.to_string());
    if old == new && !manifest.contains_key("contract_version") {
        return Ok(json!({"ok": true, "changed": false, "version": new}));
    }
    manifest.remove("contract_version");
    manifest.insert("version".into(), new.clone());
    let change = Change::new(None, "version", old, new.clone());
    let done = draft.commit("set_workflow_contract_version", reason, &[], &[change])?;
    Ok(done.answer(json!({"version": new})))
}

/// The original's tier names and Trellis's.
const TIERS: [(&str, &str); 3] = [("tier_1", "high"), ("tier_2", "medium"), ("tier_3", "low")];

/// An LLM entry of the original (`{provider, model_id, ...}`) as workflow.json holds one:
/// provider, model and options; its other keys (`fallbacks`, ...) are named in `dropped`.
fn llm_entry(field: &str, v: &Value, dropped: &mut Vec<String>) -> Result<Value, ToolFailure> {
    let obj = v
        .as_object()
        .ok_or_else(|| ToolFailure::new(format!("{field}: expected an object")))?;
    let mut out = Map::new();
    for key in ["provider", "model_id"] {
        let value = obj
            .get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ToolFailure::new(format!("{field}.{key}: expected a string")))?;
        out.insert(key.into(), json!(value));
    }
    if let Some(options) = obj.get("options").filter(|o| o.is_object()) {
        out.insert("options".into(), options.clone());
    }
    for key in obj.keys() {
        if !["provider", "model_id", "options"].contains(&key.as_str()) {
            dropped.push(format!("{field}.{key}"));
        }
    }
    Ok(Value::Object(out))
}

/// `set_workflow_llm_config` in the original's explicit mode: `builder_llm` becomes
/// workflow.json `llm`, `tier_1`..`tier_3` its `tiers` high, medium and low.
pub(super) fn set_workflow_llm_config(root: &Path, args: &Value) -> ToolResult {
    let reason = opt_str(args, "reason").unwrap_or(NO_REASON);
    match opt_str(args, "mode") {
        Some("explicit") => {}
        Some(other) => {
            return Err(ToolFailure::new(format!(
                "mode {other:?}: Trellis has no provider profiles; give mode \"explicit\" with \
                 builder_llm and tier_1..tier_3"
            )));
        }
        None => return Err(ToolFailure::new("mode: expected \"explicit\"")),
    }
    let mut dropped = Vec::new();
    let mut draft = Draft::open(root)?;
    let Some(manifest) = draft.manifest.value.as_object_mut() else {
        return Err(ToolFailure::new(
            "workflow.json is not a JSON object: fix it by hand first",
        ));
    };
    let mut changes = Vec::new();
    if let Some(v) = args.get("builder_llm").filter(|v| !v.is_null()) {
        let new = llm_entry("builder_llm", v, &mut dropped)?;
        let old = manifest.get("llm").cloned().unwrap_or(Value::Null);
        if old != new {
            manifest.insert("llm".into(), new.clone());
            changes.push(Change::new(None, "llm", old, new));
        }
    }
    for (theirs, ours) in TIERS {
        let Some(v) = args.get(theirs).filter(|v| !v.is_null()) else {
            continue;
        };
        let new = llm_entry(theirs, v, &mut dropped)?;
        let tiers = manifest.entry("tiers").or_insert_with(|| json!({}));
        if !tiers.is_object() {
            *tiers = json!({});
        }
        let tiers = tiers.as_object_mut().expect("an object");
        let old = tiers.get(ours).cloned().unwrap_or(Value::Null);
        if old != new {
            tiers.insert(ours.into(), new.clone());
            changes.push(Change::new(None, format!("tiers.{ours}"), old, new));
        }
    }
    for key in ["pulse_llm", "provider"] {
        if args.get(key).is_some_and(|v| !v.is_null()) {
            dropped.push(key.to_string());
        }
    }
    if changes.is_empty() {
        return Ok(json!({"ok": true, "changed": false, "not_used": dropped}));
    }
    let done = draft.commit("set_workflow_llm_config", reason, &[], &changes)?;
    let mut answer = done.answer(json!({"changed_fields":
        changes.iter().map(|c| c.field.clone()).collect::<Vec<_>>()}));
    if !dropped.is_empty() {
        answer["not_used"] = json!(dropped);
        answer["note"] = json!(
            "Trellis has no pulse model and no fallbacks per tier: those parts were not written"
        );
    }
    Ok(answer)
}

/// The specs of the tools of this module.
pub(super) fn specs() -> Vec<crate::ToolSpec> {
    use crate::ToolSpec;
    let reason = json!({"type": "string", "minLength": 1,
        "description": "Why you make this change, in a sentence (logged to planning/changelog/)."});
    let strict = |props: Value, required: &[&str]| {
        json!({"type": "object", "properties": props, "required": required,
               "additionalProperties": false})
    };
    let route_fields = json!({
        "route_id": {"type": "string"},
        "route_name": {"type": "string"},
        "condition": {"type": "string", "description": "When the orchestrator uses this route."},
        "orphan_step_ref": {"type": "string", "description": "An orphan step the route runs (instead of sub_agent_step)."},
        "sub_agent_step": {"type": "object", "description": "The route's own step (its id equals route_id)."}
    });
    let mut update = route_fields.clone();
    update
        .as_object_mut()
        .expect("an object")
        .remove("route_id");
    update["parent_step_id"] = json!({"type": "string", "description": "The todo_task step."});
    update["existing_route_id"] = json!({"type": "string"});
    update["reason"] = reason.clone();
    let llm = json!({"type": "object", "properties": {
        "provider": {"type": "string"}, "model_id": {"type": "string"},
        "options": {"type": "object"}}});
    vec![
        ToolSpec {
            name: "add_todo_task_route",
            description: "Adds a route (a sub-agent) to a todo_task step: new_route with \
                          route_id, route_name, condition, and sub_agent_step (its id equals \
                          route_id) or orphan_step_ref.",
            parameters: strict(
                json!({
                    "parent_step_id": {"type": "string", "description": "The todo_task step."},
                    "new_route": {"type": "object", "properties": route_fields,
                                  "required": ["route_id"]},
                    "reason": reason.clone(),
                }),
                &["parent_step_id", "new_route", "reason"],
            ),
        },
        ToolSpec {
            name: "update_todo_task_route",
            description: "Changes fields of a route of a todo_task step (only those given); \
                          setting sub_agent_step removes orphan_step_ref and the other way \
                          round.",
            parameters: strict(update, &["parent_step_id", "existing_route_id", "reason"]),
        },
        ToolSpec {
            name: "delete_todo_task_route",
            description: "Removes a route of a todo_task step.",
            parameters: strict(
                json!({
                    "parent_step_id": {"type": "string"},
                    "deleted_route_id": {"type": "string"},
                    "reason": reason.clone(),
                }),
                &["parent_step_id", "deleted_route_id", "reason"],
            ),
        },
        ToolSpec {
            name: "cleanup_orphan_step_configs",
            description: "Removes the entries of planning/step_config.json whose id is no \
                          step of the plan (main path, orphan steps, routes' sub-agent steps); \
                          returns the ids removed (none when nothing is orphaned).",
            parameters: strict(json!({"reason": reason.clone()}), &[]),
        },
        ToolSpec {
            name: "set_workflow_contract_version",
            description: "Stamps workflow.json contract_version once a migration's work is \
                          done. Never goes back, never past the newest contract Trellis reads.",
            parameters: strict(
                json!({
                    "version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"},
                    "reason": reason.clone(),
                }),
                &["version"],
            ),
        },
        ToolSpec {
            name: "set_workflow_llm_config",
            description: "Sets the workflow's models in the original's explicit mode: \
                          builder_llm becomes workflow.json llm (the builder's and every \
                          step's default), tier_1, tier_2, tier_3 its tiers high, medium, \
                          low. pulse_llm and fallbacks have no counterpart and are reported \
                          as not used.",
            parameters: strict(
                json!({
                    "mode": {"type": "string", "enum": ["explicit", "provider_profile"]},
                    "provider": {"type": "string"},
                    "builder_llm": llm.clone(),
                    "tier_1": llm.clone(),
                    "tier_2": llm.clone(),
                    "tier_3": llm.clone(),
                    "pulse_llm": llm,
                    "reason": reason,
                }),
                &["mode"],
            ),
        },
    ]
}
