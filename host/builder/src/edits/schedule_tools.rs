//! The builder's schedule tools, and the same edits of `workflow.json` `schedules[]` made
//! outside a turn (the server's scheduler API): validated and logged like every other edit.

use std::path::Path;

use serde_json::{Value, json};

use super::changelog::Change;
use super::draft::Draft;
use crate::{ToolFailure, ToolResult};

/// Sets `enabled` of schedule `id` in `workflow.json`, for `reason` (logged to the changelog).
/// A schedule already so answers `changed: false`; an unknown one is a failure naming the
/// schedules there are.
pub fn set_schedule_enabled(root: &Path, id: &str, enabled: bool, reason: &str) -> ToolResult {
    let mut draft = Draft::open(root)?;
    let schedules = draft
        .manifest
        .value
        .get_mut("schedules")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| ToolFailure::new("workflow.json has no schedules"))?;
    let i = index_of(schedules, id)?;
    let schedule = &mut schedules[i];
    let old = schedule.get("enabled").cloned().unwrap_or(Value::Null);
    if old == json!(enabled) {
        return Ok(json!({"ok": true, "changed": false, "schedule_id": id, "enabled": enabled}));
    }
    schedule["enabled"] = json!(enabled);
    let change = Change::new(None, format!("schedules.{id}.enabled"), old, json!(enabled));
    let tool = if enabled {
        "enable_schedule"
    } else {
        "disable_schedule"
    };
    let done = draft.commit(tool, reason, &[], &[change])?;
    Ok(done.answer(json!({"schedule_id": id, "enabled": enabled})))
}

/// Adds `schedule` to `workflow.json` (as `add_schedule` does), for `reason`. Its fields are
/// checked with the whole workspace, as `trellis validate` checks them (a JSON path, and
/// the closest key for an unknown one).
pub fn add_schedule(root: &Path, schedule: Value, reason: &str) -> ToolResult {
    if !schedule.get("id").is_some_and(Value::is_string) {
        return Err(ToolFailure::new(format!(
            "a schedule is a JSON object with a string `id`, found {}",
            trellis_workflow::diagnostics::kind_of(&schedule)
        )));
    }
    add(root, &json!({"schedule": schedule, "reason": reason}))
}

/// Replaces schedule `id` of `workflow.json` with `schedule` whole (its `id`, when it has
/// one, must be `id`), for `reason`; checked as [`add_schedule`] checks one.
pub fn replace_schedule(root: &Path, id: &str, mut schedule: Value, reason: &str) -> ToolResult {
    let Some(fields) = schedule.as_object_mut() else {
        return Err(ToolFailure::new(format!(
            "a schedule is a JSON object, found {}",
            trellis_workflow::diagnostics::kind_of(&schedule)
        )));
    };
    match fields.get("id") {
        None => {
            fields.insert("id".into(), json!(id));
        }
        Some(given) if given == id => {}
        Some(given) => {
            return Err(ToolFailure::new(format!(
                "schedule.id is {given}, and the schedule replaced is {id:?}: a schedule keeps \
                 its id (delete it and add another to rename it)"
            )));
        }
    }
    let mut draft = Draft::open(root)?;
    let list = schedules_of(&mut draft)?;
    let i = index_of(list, id)?;
    if list[i] == schedule {
        return Ok(json!({"ok": true, "changed": false, "schedule_id": id}));
    }
    let old = std::mem::replace(&mut list[i], schedule.clone());
    let change = Change::new(None, format!("schedules.{id}"), old, schedule);
    let done = draft.commit("update_schedule", reason, &[], &[change])?;
    Ok(done.answer(json!({"schedule_id": id})))
}

/// Removes schedule `id` from `workflow.json` (as `delete_schedule` does), for `reason`.
pub fn delete_schedule(root: &Path, id: &str, reason: &str) -> ToolResult {
    let args = json!({"schedule_id": id, "reason": reason});
    checked("delete_schedule", &args)?;
    delete(root, &args)
}

/// Refuses `args` unless they match the schema of schedule tool `name`.
fn checked(name: &str, args: &Value) -> Result<(), ToolFailure> {
    let spec = specs()
        .into_iter()
        .find(|s| s.name == name)
        .expect("a schedule tool");
    super::args::check(&spec, args)
}

/// The specs of the schedule tools ([`crate::modes::SCHEDULE_TOOLS`]).
pub(super) fn specs() -> Vec<crate::ToolSpec> {
    use crate::ToolSpec;
    let reason = json!({"type": "string", "minLength": 1,
        "description": "Why you make this change, in a sentence (logged to planning/changelog/)."});
    let id = json!({"type": "string", "description": "The schedule's id."});
    let strict = |props: Value, required: &[&str]| {
        json!({"type": "object", "properties": props, "required": required,
               "additionalProperties": false})
    };
    vec![
        ToolSpec {
            name: "list_schedules",
            description: "The schedules of workflow.json (cron or calendar, zone, enabled, \
                          messages, collision policy, dependency) with each one's next firing \
                          (UTC) and its last run from schedule-runs.json. `trellis serve` fires \
                          them; each firing is a run-mode builder session sending the messages.",
            parameters: strict(json!({}), &[]),
        },
        ToolSpec {
            name: "add_schedule",
            description: "Adds a schedule to workflow.json: id, cron_expression (five fields, \
                          minute hour day month weekday) or schedule_type calendar with \
                          calendar_items, timezone (IANA), enabled, group_names (required when \
                          the workflow has groups), messages (default: run the full workflow), \
                          collision_policy (skip, queue_latest, retry, coalesce), \
                          max_start_delay_minutes, after_schedule_id with after_terminal_status, \
                          after_delay_minutes, dependency_deadline (HH:MM).",
            parameters: strict(
                json!({"schedule": trellis_workflow::json_schema::schedule_schema(),
                       "reason": reason.clone()}),
                &["schedule", "reason"],
            ),
        },
        ToolSpec {
            name: "update_schedule",
            description: "Changes fields of a schedule of workflow.json: `set` holds the \
                          fields and their new values (as add_schedule takes them), \
                          `clear_fields` the fields to remove.",
            parameters: strict(
                json!({"schedule_id": id.clone(),
                       "set": {"type": "object", "description": "Fields and their new values."},
                       "clear_fields": {"type": "array", "items": {"type": "string"}, "maxItems": 64},
                       "reason": reason.clone()}),
                &["schedule_id", "reason"],
            ),
        },
        ToolSpec {
            name: "delete_schedule",
            description: "Removes a schedule from workflow.json (its history stays in \
                          schedule-runs.json).",
            parameters: strict(
                json!({"schedule_id": id.clone(), "reason": reason.clone()}),
                &["schedule_id", "reason"],
            ),
        },
        ToolSpec {
            name: "trigger_schedule",
            description: "Fires a schedule now, enabled or not, as a manual firing: a run-mode \
                          session of its own sending its messages, once this turn and its \
                          executions end (the workspace is yours until then). Recorded in \
                          schedule-runs.json like every firing; list_schedules shows it.",
            parameters: strict(json!({"schedule_id": id.clone()}), &["schedule_id"]),
        },
        ToolSpec {
            name: "set_schedule_enabled",
            description: "Turns a schedule on (it fires by itself) or off (only a manual \
                          trigger fires it).",
            parameters: strict(
                json!({"schedule_id": id, "enabled": {"type": "boolean"}, "reason": reason}),
                &["schedule_id", "enabled", "reason"],
            ),
        },
    ]
}

fn loaded(root: &Path) -> Result<trellis_workflow::Workspace, ToolFailure> {
    trellis_workflow::Workspace::open(root).map_err(|d| {
        ToolFailure::new(format!(
            "the workspace does not load: {}",
            d.errors()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        ))
    })
}

/// `list_schedules`: a read, no edit.
pub(crate) fn list(root: &Path) -> ToolResult {
    let ws = loaded(root)?;
    let history = trellis_sandbox::store::WorkspaceFs::open(root)
        .map(|fs| crate::schedules::read_runs(&fs))
        .unwrap_or_default();
    let now = chrono::Utc::now();
    let list: Vec<Value> = ws
        .manifest
        .original
        .schedules
        .iter()
        .map(|s| {
            let mut v = serde_json::to_value(s).unwrap_or(Value::Null);
            v["next_firing"] = json!(
                s.enabled
                    .then(|| s.next_after(now))
                    .flatten()
                    .map(|t| t.to_rfc3339())
            );
            v["last_run"] = json!(history.iter().find(|r| r.schedule_id == s.id));
            v
        })
        .collect();
    Ok(json!({"schedules": list, "count": list.len()}))
}

/// `trigger_schedule`: queues a firing of a schedule of workflow.json (enabled or not)
/// through `hook`, the front end's; without one, a refusal naming the commands that fire it.
pub(crate) fn trigger(
    root: &Path,
    hook: Option<&crate::schedules::TriggerHook>,
    args: &Value,
) -> ToolResult {
    checked("trigger_schedule", args)?;
    let id = super::args::req_str(args, "schedule_id")?;
    let ws = loaded(root)?;
    let schedules = &ws.manifest.original.schedules;
    if !schedules.iter().any(|s| s.id == id) {
        return Err(unknown(id, schedules.iter().map(|s| s.id.as_str())));
    }
    let Some(hook) = hook else {
        return Err(ToolFailure::new(format!(
            "this session does not fire schedules: `trellis serve` does (there this tool \
             queues the firing for when the turn ends), or from a terminal, once this session \
             ends, `trellis schedules trigger {} {id}`",
            root.display()
        )));
    };
    hook.queue(id).map_err(ToolFailure::new)
}

/// The `schedules` array of the draft's workflow.json (made one when absent).
fn schedules_of(draft: &mut Draft) -> Result<&mut Vec<Value>, ToolFailure> {
    let m = draft.manifest.value.as_object_mut().ok_or_else(|| {
        ToolFailure::new("workflow.json is not a JSON object: fix it by hand first")
    })?;
    let list = m.entry("schedules").or_insert_with(|| json!([]));
    if list.is_null() {
        *list = json!([]);
    }
    list.as_array_mut().ok_or_else(|| {
        ToolFailure::new("workflow.json: \"schedules\" is not an array: fix it by hand first")
    })
}

fn index_of(list: &[Value], id: &str) -> Result<usize, ToolFailure> {
    list.iter()
        .position(|s| s.get("id").and_then(Value::as_str) == Some(id))
        .ok_or_else(|| {
            unknown(
                id,
                list.iter()
                    .filter_map(|s| s.get("id").and_then(Value::as_str)),
            )
        })
}

/// No schedule `id` among `ids`.
fn unknown<'a>(id: &str, ids: impl Iterator<Item = &'a str>) -> ToolFailure {
    let ids: Vec<&str> = ids.collect();
    ToolFailure::new(format!(
        "no schedule {id:?} in workflow.json (its schedules: {})",
        if ids.is_empty() {
            "none".to_string()
        } else {
            ids.join(", ")
        }
    ))
}

/// `add_schedule`.
pub(super) fn add(root: &Path, args: &Value) -> ToolResult {
    let reason = super::args::req_str(args, "reason")?;
    let schedule = args["schedule"].clone();
    let id = schedule["id"].as_str().unwrap_or_default().to_string();
    let mut draft = Draft::open(root)?;
    let list = schedules_of(&mut draft)?;
    if index_of(list, &id).is_ok() {
        return Err(ToolFailure::new(format!(
            "workflow.json has a schedule {id:?} already: update_schedule changes it"
        )));
    }
    list.push(schedule.clone());
    let change = Change::new(None, format!("schedules.{id}"), Value::Null, schedule);
    let done = draft.commit("add_schedule", reason, &[], &[change])?;
    Ok(done.answer(json!({"schedule_id": id})))
}

/// `update_schedule`.
pub(super) fn update(root: &Path, args: &Value) -> ToolResult {
    let reason = super::args::req_str(args, "reason")?;
    let id = super::args::req_str(args, "schedule_id")?.to_string();
    let mut draft = Draft::open(root)?;
    let list = schedules_of(&mut draft)?;
    let i = index_of(list, &id)?;
    let old = list[i].clone();
    let Some(entry) = list[i].as_object_mut() else {
        return Err(ToolFailure::new(format!(
            "schedule {id:?} is not an object: fix it by hand first"
        )));
    };
    if let Some(set) = args.get("set").and_then(Value::as_object) {
        for (k, v) in set {
            entry.insert(k.clone(), v.clone());
        }
    }
    for k in args
        .get("clear_fields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(k) = k.as_str() {
            if k == "id" {
                return Err(ToolFailure::new("clear_fields: a schedule keeps its id"));
            }
            entry.remove(k);
        }
    }
    let new = Value::Object(entry.clone());
    if new == old {
        return Ok(json!({"ok": true, "changed": false, "schedule_id": id}));
    }
    let change = Change::new(None, format!("schedules.{id}"), old, new);
    let done = draft.commit("update_schedule", reason, &[], &[change])?;
    Ok(done.answer(json!({"schedule_id": id})))
}

/// `delete_schedule`.
pub(super) fn delete(root: &Path, args: &Value) -> ToolResult {
    let reason = super::args::req_str(args, "reason")?;
    let id = super::args::req_str(args, "schedule_id")?.to_string();
    let mut draft = Draft::open(root)?;
    let list = schedules_of(&mut draft)?;
    let i = index_of(list, &id)?;
    let old = list.remove(i);
    let change = Change::new(None, format!("schedules.{id}"), old, Value::Null);
    let done = draft.commit("delete_schedule", reason, &[], &[change])?;
    Ok(done.answer(json!({"schedule_id": id, "deleted": true})))
}

/// `set_schedule_enabled`.
pub(super) fn set_enabled(root: &Path, args: &Value) -> ToolResult {
    let reason = super::args::req_str(args, "reason")?;
    let id = super::args::req_str(args, "schedule_id")?;
    let enabled = args["enabled"].as_bool().unwrap_or(false);
    set_schedule_enabled(root, id, enabled, reason)
}
