//! `add_*_step` and `update_*_step`: a step of each type added to or changed in the plan
//! (a scripted step's step config entry and script with it).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::{
    Kind, all_step_ids, id_of, insert_index, locate, step_list, steps_mut, top_ids, unknown_step,
};
use crate::edits::args::{opt_str, req_str};
use crate::edits::changelog::{self, Change};
use crate::edits::draft::Draft;
use crate::edits::tool_specs::kind_fields;
use crate::{ToolFailure, ToolResult};

/// Arguments that are not step fields.
const CONTROL_ARGS: &[&str] = &[
    "id",
    "step_id",
    "reason",
    "insert_after_step_id",
    "script",
    "orphan",
];

/// The order fields are written in a new step.
const FIELD_ORDER: &[&str] = &[
    "title",
    "description",
    "context_dependencies",
    "context_output",
];

fn script_path(id: &str) -> PathBuf {
    Path::new("code").join(id).join("main.py")
}

/// Sets `declared_execution_mode: scripted` on the step config entry of `id` (adding one).
fn declare_scripted(draft: &mut Draft, id: &str, title: Option<&str>) -> Option<Change> {
    let entries = draft.config_entries();
    let at = match entries.iter().position(|e| id_of(e) == Some(id)) {
        Some(at) => at,
        None => {
            let mut e = json!({"id": id});
            if let Some(t) = title {
                e["title"] = json!(t);
            }
            entries.push(e);
            entries.len() - 1
        }
    };
    let entry = &mut entries[at];
    let ac = entry
        .as_object_mut()?
        .entry("agent_configs")
        .or_insert_with(|| json!({}));
    if !ac.is_object() {
        *ac = json!({});
    }
    let old = ac
        .get("declared_execution_mode")
        .cloned()
        .unwrap_or(Value::Null);
    if old == json!("scripted") {
        return None;
    }
    ac["declared_execution_mode"] = json!("scripted");
    Some(Change::new(
        Some(id),
        "agent_configs.declared_execution_mode",
        old,
        json!("scripted"),
    ))
}

/// `add_*_step`.
pub(in crate::edits) fn add(root: &Path, kind: Kind, args: &Value) -> ToolResult {
    let reason = req_str(args, "reason")?;
    let id = req_str(args, "id")?;
    let mut draft = Draft::open(root)?;
    if all_step_ids(&draft.plan.value).iter().any(|s| s == id) {
        return Err(ToolFailure::with_details(
            format!(
                "a step {id:?} already exists: choose another id, or change it with {}",
                kind.update_tool()
            ),
            json!({"valid_step_ids": all_step_ids(&draft.plan.value)}),
        ));
    }
    let orphan = args.get("orphan").and_then(Value::as_bool) == Some(true);
    let after = opt_str(args, "insert_after_step_id");
    if orphan && after.is_some() {
        return Err(ToolFailure::new(
            "an orphan step has no place on the main path: give insert_after_step_id or \
             orphan, not both",
        ));
    }
    let list = if orphan { "orphan_steps" } else { "steps" };
    let at = if orphan {
        step_list(&draft.plan.value, list).len()
    } else {
        insert_index(&draft.plan.value, after)?
    };
    let mut step = Map::new();
    step.insert("id".into(), json!(id));
    step.insert("type".into(), json!(kind.type_name()));
    let own: Vec<&str> = kind_fields(kind).iter().map(|(k, _)| *k).collect();
    let ordered = FIELD_ORDER
        .iter()
        .copied()
        .chain(own.iter().copied())
        .chain(["validation_schema", "next_step_id"]);
    for key in ordered {
        if CONTROL_ARGS.contains(&key) {
            continue;
        }
        if let Some(v) = args.get(key).filter(|v| !v.is_null()) {
            step.insert(key.into(), v.clone());
        }
    }
    let step = Value::Object(step);
    steps_mut(&mut draft.plan.value, list).insert(at, step.clone());
    let mut changes = vec![Change::new(Some(id), "step", Value::Null, step)];
    if kind == Kind::Scripted {
        let script = req_str(args, "script")?;
        if let Some(c) = declare_scripted(&mut draft, id, opt_str(args, "title")) {
            changes.push(c);
        }
        let rel = script_path(id);
        changes.push(Change::new(
            Some(id),
            rel.to_string_lossy(),
            changelog::sha256(draft.fs.read(&rel).ok().as_deref()),
            changelog::sha256(Some(script.as_bytes())),
        ));
        draft.new_files.push((rel, script.as_bytes().to_vec()));
    }
    let done = draft.commit(kind.add_tool(), reason, &[id.to_string()], &changes)?;
    Ok(done.answer(json!({"step_id": id, "type": kind.type_name(), "list": list, "position": at})))
}

/// `update_*_step`.
pub(in crate::edits) fn update(root: &Path, kind: Kind, args: &Value) -> ToolResult {
    let reason = req_str(args, "reason")?;
    let id = req_str(args, "step_id")?;
    let mut draft = Draft::open(root)?;
    let Some((list, index)) = locate(&draft.plan.value, id) else {
        return Err(unknown_step(id, top_ids(&draft.plan.value)));
    };
    let current = step_list(&draft.plan.value, list)[index].clone();
    let type_name = current.get("type").and_then(Value::as_str).unwrap_or("?");
    if type_name != kind.type_name() {
        let right = Kind::of_type(type_name)
            .map(|k| format!(": use {}", k.update_tool()))
            .unwrap_or_default();
        return Err(ToolFailure::new(format!(
            "step {id:?} is a {type_name} step, not a {} step{right}",
            kind.type_name()
        )));
    }
    let mut step = current.clone();
    let mut changes = Vec::new();
    let obj = step
        .as_object_mut()
        .ok_or_else(|| ToolFailure::new(format!("step {id:?} is not a JSON object")))?;
    for (key, new) in args.as_object().into_iter().flatten() {
        if CONTROL_ARGS.contains(&key.as_str()) {
            continue;
        }
        let old = obj.get(key).cloned().unwrap_or(Value::Null);
        if old == *new {
            continue;
        }
        if new.is_null() {
            obj.remove(key);
        } else {
            obj.insert(key.clone(), new.clone());
        }
        changes.push(Change::new(Some(id), key.clone(), old, new.clone()));
    }
    let mut position = index;
    let plan = &mut draft.plan.value;
    steps_mut(plan, list)[index] = step;
    if let Some(after) = args.get("insert_after_step_id").and_then(Value::as_str) {
        if list != "steps" {
            return Err(ToolFailure::new(format!(
                "step {id:?} is an orphan step: orphan steps are not on the main path and \
                 have no position to move to"
            )));
        }
        if after == id {
            return Err(ToolFailure::new(
                "insert_after_step_id names the step itself: name the step it should follow",
            ));
        }
        let moved = steps_mut(plan, "steps").remove(index);
        match insert_index(plan, Some(after)) {
            Ok(at) => {
                steps_mut(plan, "steps").insert(at, moved);
                position = at;
            }
            Err(e) => return Err(e),
        }
        if position != index {
            changes.push(Change::new(
                Some(id),
                "position",
                json!(index),
                json!(position),
            ));
        }
    }
    if kind == Kind::Scripted {
        if let Some(c) = declare_scripted(&mut draft, id, None) {
            changes.push(c);
        }
        if let Some(script) = opt_str(args, "script") {
            let rel = script_path(id);
            let old = draft.fs.read(&rel).ok();
            if old.as_deref() != Some(script.as_bytes()) {
                changes.push(Change::new(
                    Some(id),
                    rel.to_string_lossy(),
                    changelog::sha256(old.as_deref()),
                    changelog::sha256(Some(script.as_bytes())),
                ));
                draft.new_files.push((rel, script.as_bytes().to_vec()));
            }
        }
    }
    if changes.is_empty() {
        return Ok(json!({"ok": true, "step_id": id, "changed": false,
            "note": "nothing to change: every field given already has that value"}));
    }
    let fields: Vec<String> = changes.iter().map(|c| c.field.clone()).collect();
    let done = draft.commit(kind.update_tool(), reason, &[id.to_string()], &changes)?;
    Ok(done.answer(
        json!({"step_id": id, "changed_fields": fields, "list": list,
        "position": position}),
    ))
}
