//! The plan edits: add and update each step type, delete steps, set a step's validation
//! schema, run the code-item migration.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use trellis_sandbox::store::WorkspaceFs;
use trellis_workflow::migrate::{MigrationError, migrate_message_sequence_code_items};
use trellis_workflow::{PLAN_FILE, STEP_CONFIG_FILE, step_config_location};

use super::args::{opt_str, req_str, str_list};
use super::changelog::{self, Change};
use super::draft::Draft;
use super::tool_specs::kind_fields;
use crate::builder::{ToolFailure, ToolResult};

/// The step types the plan tools add and update (a scripted step is a `regular` step whose
/// step config declares it scripted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Sequence,
    Scripted,
    Routing,
    HumanInput,
    TodoTask,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Sequence,
        Kind::Scripted,
        Kind::Routing,
        Kind::HumanInput,
        Kind::TodoTask,
    ];

    /// The `type` written in the plan.
    pub fn type_name(self) -> &'static str {
        match self {
            Kind::Sequence => "message_sequence",
            Kind::Scripted => "regular",
            Kind::Routing => "routing",
            Kind::HumanInput => "human_input",
            Kind::TodoTask => "todo_task",
        }
    }

    fn of_type(type_name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.type_name() == type_name)
    }

    pub fn add_tool(self) -> &'static str {
        match self {
            Kind::Sequence => "add_message_sequence_step",
            Kind::Scripted => "add_scripted_step",
            Kind::Routing => "add_routing_step",
            Kind::HumanInput => "add_human_input_step",
            Kind::TodoTask => "add_todo_task_step",
        }
    }

    pub fn update_tool(self) -> &'static str {
        match self {
            Kind::Sequence => "update_message_sequence_step",
            Kind::Scripted => "update_scripted_step",
            Kind::Routing => "update_routing_step",
            Kind::HumanInput => "update_human_input_step",
            Kind::TodoTask => "update_todo_task_step",
        }
    }

    pub fn add_description(self) -> &'static str {
        match self {
            Kind::Sequence => {
                "Adds a message_sequence step (the canonical agent step: one conversation, its items run in order) to the main path."
            }
            Kind::Scripted => {
                "Adds a scripted step: a regular step, declared_execution_mode \"scripted\" in planning/step_config.json, and its script at code/<id>/main.py. Deterministic fetching and normalization belong here."
            }
            Kind::Routing => {
                "Adds a routing step: a deterministic switch on {\"select_route\": \"<route_id>\"} read from route_selection.json or route_source_file; never calls an LLM."
            }
            Kind::HumanInput => {
                "Adds a human_input step: a question for a person (text, yesno, multiple_choice), answered up front in a full run."
            }
            Kind::TodoTask => {
                "Adds a todo_task step (the original's orchestrator): one agent turn whose task is its description, delegating to its predefined_routes."
            }
        }
    }

    pub fn update_description(self) -> &'static str {
        match self {
            Kind::Sequence => {
                "Changes fields of a message_sequence step: only the fields given change (null removes an optional one); insert_after_step_id moves it."
            }
            Kind::Scripted => {
                "Changes fields of a scripted (regular) step and, with script, replaces code/<id>/main.py: only the fields given change; insert_after_step_id moves it."
            }
            Kind::Routing => {
                "Changes fields of a routing step: only the fields given change (null removes an optional one); insert_after_step_id moves it."
            }
            Kind::HumanInput => {
                "Changes fields of a human_input step: only the fields given change (null removes an optional one); insert_after_step_id moves it."
            }
            Kind::TodoTask => {
                "Changes fields of a todo_task step: only the fields given change (null removes an optional one); insert_after_step_id moves it."
            }
        }
    }
}

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

fn steps_mut<'a>(plan: &'a mut Value, list: &str) -> &'a mut Vec<Value> {
    if !plan.is_object() {
        *plan = json!({"steps": []});
    }
    let v = plan
        .as_object_mut()
        .expect("an object")
        .entry(list)
        .or_insert_with(|| json!([]));
    if !v.is_array() {
        *v = json!([]);
    }
    v.as_array_mut().expect("an array")
}

fn step_list<'a>(plan: &'a Value, list: &str) -> &'a [Value] {
    plan.get(list)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn id_of(step: &Value) -> Option<&str> {
    step.get("id").and_then(Value::as_str)
}

/// Every step id of the plan: main path, orphans, and route sub-agent steps at any depth.
pub(super) fn all_step_ids(plan: &Value) -> Vec<String> {
    fn walk(step: &Value, out: &mut Vec<String>, depth: usize) {
        if let Some(id) = id_of(step) {
            out.push(id.to_string());
        }
        if depth > 8 {
            return;
        }
        for r in step
            .get("predefined_routes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(sub) = r.get("sub_agent_step") {
                walk(sub, out, depth + 1);
            }
        }
    }
    let mut out = Vec::new();
    for list in ["steps", "orphan_steps"] {
        for s in step_list(plan, list) {
            walk(s, &mut out, 0);
        }
    }
    out
}

/// The ids of the main path and orphan steps (the ones the plan tools edit).
fn top_ids(plan: &Value) -> Vec<String> {
    ["steps", "orphan_steps"]
        .iter()
        .flat_map(|l| step_list(plan, l))
        .filter_map(id_of)
        .map(str::to_string)
        .collect()
}

/// The failure for a step id the plan does not have: lists the valid ids.
pub(super) fn unknown_step(id: &str, valid: Vec<String>) -> ToolFailure {
    let hint = trellis_workflow::diagnostics::did_you_mean(id, valid.iter().map(String::as_str))
        .map(|c| format!(" (did you mean {c:?}?)"))
        .unwrap_or_default();
    ToolFailure::with_details(
        format!(
            "unknown step id {id:?}{hint}; the plan's step ids are: {}",
            if valid.is_empty() {
                "(none yet)".to_string()
            } else {
                valid.join(", ")
            }
        ),
        json!({"valid_step_ids": valid}),
    )
}

/// Where the step `id` is: its list and index.
fn locate(plan: &Value, id: &str) -> Option<(&'static str, usize)> {
    ["steps", "orphan_steps"].into_iter().find_map(|list| {
        step_list(plan, list)
            .iter()
            .position(|s| id_of(s) == Some(id))
            .map(|i| (list, i))
    })
}

/// The index on the main path a step goes to after `after` ("" = first).
fn insert_index(plan: &Value, after: Option<&str>) -> Result<usize, ToolFailure> {
    let steps = step_list(plan, "steps");
    match after {
        None => Ok(steps.len()),
        Some("") => Ok(0),
        Some(id) => steps
            .iter()
            .position(|s| id_of(s) == Some(id))
            .map(|i| i + 1)
            .ok_or_else(|| {
                let valid = steps.iter().filter_map(id_of).map(str::to_string).collect();
                unknown_step(id, valid)
            }),
    }
}

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
pub(super) fn add(root: &Path, kind: Kind, args: &Value) -> ToolResult {
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
pub(super) fn update(root: &Path, kind: Kind, args: &Value) -> ToolResult {
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

/// A reference to a step that a deletion would leave dangling.
fn reference(file: &str, from: Option<&str>, path: String, target: &str) -> Value {
    json!({"file": file, "from_step": from, "json_path": path, "points_at": target})
}

/// Every reference in the plan and the step config to one of `gone` from what stays.
fn dangling_references(draft: &Draft, gone: &[String]) -> Vec<Value> {
    let is_gone = |t: &str| gone.iter().any(|g| g == t);
    let mut out = Vec::new();
    fn walk(
        step: &Value,
        path: String,
        is_gone: &dyn Fn(&str) -> bool,
        out: &mut Vec<Value>,
        depth: usize,
    ) {
        let from = id_of(step);
        let mut check = |p: String, v: Option<&Value>| {
            if let Some(t) = v.and_then(Value::as_str)
                && is_gone(t)
            {
                out.push(reference(PLAN_FILE, from, p, t));
            }
        };
        for key in ["next_step_id", "if_yes_next_step_id", "if_no_next_step_id"] {
            check(format!("{path}.{key}"), step.get(key));
        }
        for (j, r) in step
            .get("routes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            check(
                format!("{path}.routes[{j}].next_step_id"),
                r.get("next_step_id"),
            );
        }
        for (k, v) in step
            .get("option_routes")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            check(format!("{path}.option_routes.{k}"), Some(v));
        }
        for (j, d) in step
            .get("context_dependencies")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            // An output of a deleted step: `.../execution/<id>/...`.
            if let Some(text) = d.as_str() {
                let parts: Vec<&str> = text.split('/').collect();
                for w in parts.windows(2) {
                    if w[0] == "execution" && is_gone(w[1]) {
                        out.push(reference(
                            PLAN_FILE,
                            from,
                            format!("{path}.context_dependencies[{j}]"),
                            w[1],
                        ));
                    }
                }
            }
        }
        for (j, r) in step
            .get("predefined_routes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let rp = format!("{path}.predefined_routes[{j}]");
            if let Some(t) = r.get("orphan_step_ref").and_then(Value::as_str)
                && is_gone(t)
            {
                out.push(reference(
                    PLAN_FILE,
                    from,
                    format!("{rp}.orphan_step_ref"),
                    t,
                ));
            }
            if let Some(sub) = r.get("sub_agent_step")
                && depth < 8
            {
                walk(sub, format!("{rp}.sub_agent_step"), is_gone, out, depth + 1);
            }
        }
    }
    for list in ["steps", "orphan_steps"] {
        for (i, s) in step_list(&draft.plan.value, list).iter().enumerate() {
            if id_of(s).is_some_and(is_gone) {
                continue;
            }
            walk(s, format!("{list}[{i}]"), &is_gone, &mut out, 0);
        }
    }
    let entries = draft
        .config
        .value
        .get("steps")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    for (i, e) in entries.iter().enumerate() {
        if id_of(e).is_some_and(is_gone) {
            continue;
        }
        for (j, r) in e
            .pointer("/agent_configs/prerequisite_rules")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            if let Some(t) = r.get("depends_on_step").and_then(Value::as_str)
                && is_gone(t)
            {
                out.push(reference(
                    STEP_CONFIG_FILE,
                    id_of(e),
                    format!("steps[{i}].agent_configs.prerequisite_rules[{j}].depends_on_step"),
                    t,
                ));
            }
        }
    }
    out
}

/// `delete_plan_steps`.
pub(super) fn delete(root: &Path, args: &Value) -> ToolResult {
    let reason = req_str(args, "reason")?;
    let ids = str_list(args, "step_ids");
    let mut draft = Draft::open(root)?;
    let valid = top_ids(&draft.plan.value);
    for id in &ids {
        if !valid.contains(id) {
            return Err(unknown_step(id, valid));
        }
    }
    // A deleted step takes its route sub-agent steps with it.
    let mut gone = ids.clone();
    for list in ["steps", "orphan_steps"] {
        for s in step_list(&draft.plan.value, list) {
            if id_of(s).is_some_and(|i| ids.iter().any(|g| g == i)) {
                let nested = all_step_ids(&json!({"steps": [s]}));
                gone.extend(nested.into_iter().skip(1));
            }
        }
    }
    let refs = dangling_references(&draft, &gone);
    if !refs.is_empty() {
        let lines: Vec<String> = refs
            .iter()
            .map(|r| {
                format!(
                    "{} {} (step {}) points at {}",
                    r["file"].as_str().unwrap_or_default(),
                    r["json_path"].as_str().unwrap_or_default(),
                    r["from_step"],
                    r["points_at"]
                )
            })
            .collect();
        return Err(ToolFailure::with_details(
            format!(
                "refused: nothing was deleted; these references still point at a step to \
                 delete: change or remove them first (or delete their steps in the same call):\n- {}",
                lines.join("\n- ")
            ),
            json!({"references": refs}),
        ));
    }
    let mut changes = Vec::new();
    for list in ["steps", "orphan_steps"] {
        let steps = steps_mut(&mut draft.plan.value, list);
        steps.retain(|s| {
            let hit = id_of(s).is_some_and(|i| ids.iter().any(|g| g == i));
            if hit {
                changes.push(Change::new(id_of(s), "step", s.clone(), Value::Null));
            }
            !hit
        });
        if list == "orphan_steps"
            && steps.is_empty()
            && let Some(o) = draft.plan.value.as_object_mut()
        {
            o.remove("orphan_steps");
        }
    }
    let mut removed_configs = Vec::new();
    draft.config_entries().retain(|e| {
        let hit = id_of(e).is_some_and(|i| gone.iter().any(|g| g == i));
        if hit {
            removed_configs.push(id_of(e).unwrap_or_default().to_string());
            changes.push(Change::new(id_of(e), "step_config", e.clone(), Value::Null));
        }
        !hit
    });
    let scripts: Vec<String> = gone
        .iter()
        .filter(|id| draft.fs.exists(Path::new("code").join(id)))
        .map(|id| format!("code/{id}/"))
        .collect();
    let mut notes = Vec::new();
    if !scripts.is_empty() {
        notes.push(format!(
            "the script folders {} were left in place",
            scripts.join(", ")
        ));
    }
    for file in super::config_tools::run_specific_configs(&draft.fs) {
        let text = draft.fs.read_to_string(&file).unwrap_or_default();
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let entries = match &value {
            Value::Array(a) => a.as_slice(),
            v => v
                .get("steps")
                .and_then(Value::as_array)
                .map_or(&[][..], Vec::as_slice),
        };
        let stale: Vec<&str> = entries
            .iter()
            .filter_map(id_of)
            .filter(|i| gone.iter().any(|g| g == i))
            .collect();
        if !stale.is_empty() {
            notes.push(format!(
                "{file} (a run's own step config, not edited by tools) still has entries for {}",
                stale.join(", ")
            ));
        }
    }
    let done = draft.commit("delete_plan_steps", reason, &ids, &changes)?;
    let mut extra = json!({"deleted": ids, "removed_step_config_entries": removed_configs});
    if !notes.is_empty() {
        extra["notes"] = json!(notes);
    }
    Ok(done.answer(extra))
}

/// The step config in force for builder runs (`runs/iteration-0/...` when it exists) and the
/// `validation_schema` it holds for step `id`.
fn config_schema_in_force(fs: &WorkspaceFs, draft_config: &Value, id: &str) -> Option<String> {
    let rel = step_config_location(fs, Some("iteration-0"));
    let text = if rel == Path::new(STEP_CONFIG_FILE) {
        draft_config.clone()
    } else {
        serde_json::from_str(&fs.read_to_string(&rel).ok()?).ok()?
    };
    let entries = match &text {
        Value::Array(a) => a.as_slice(),
        v => v
            .get("steps")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice),
    };
    entries
        .iter()
        .find(|e| id_of(e) == Some(id))
        .filter(|e| e.get("validation_schema").is_some_and(|v| !v.is_null()))
        .map(|_| rel.to_string_lossy().replace('\\', "/"))
}

/// `update_validation_schema`.
pub(super) fn update_validation_schema(root: &Path, args: &Value) -> ToolResult {
    let reason = req_str(args, "reason")?;
    let id = req_str(args, "step_id")?;
    let new = args
        .get("validation_schema")
        .cloned()
        .unwrap_or(Value::Null);
    let mut draft = Draft::open(root)?;
    let Some((list, index)) = locate(&draft.plan.value, id) else {
        return Err(unknown_step(id, top_ids(&draft.plan.value)));
    };
    let step = &mut steps_mut(&mut draft.plan.value, list)[index];
    let old = step
        .get("validation_schema")
        .cloned()
        .unwrap_or(Value::Null);
    if let Some(o) = step.as_object_mut() {
        if new.is_null() {
            o.remove("validation_schema");
        } else {
            o.insert("validation_schema".into(), new.clone());
        }
    }
    let shadowed = config_schema_in_force(&draft.fs, &draft.config.value, id);
    let changes = [Change::new(Some(id), "validation_schema", old, new)];
    let done = draft.commit(
        "update_validation_schema",
        reason,
        &[id.to_string()],
        &changes,
    )?;
    let mut extra = json!({"step_id": id});
    if let Some(file) = shadowed {
        extra["shadowed_by"] = json!(file);
        extra["note"] = json!(format!(
            "{file} holds a validation_schema for step {id:?}: that one wins over the plan's \
             at run time; change it there (update_step_config cannot) or remove it for this \
             edit to take effect"
        ));
    }
    Ok(done.answer(extra))
}

/// `migrate_message_sequence_code_items`.
pub(super) fn migrate(root: &Path, args: &Value) -> ToolResult {
    let reason = req_str(args, "reason")?;
    let fs = WorkspaceFs::open(root)
        .map_err(|e| ToolFailure::new(format!("the workspace cannot be opened: {e}")))?;
    let before = fs.read(PLAN_FILE).ok();
    let log = changelog::changelog_path(&trellis_sandbox::store::now_rfc3339());
    changelog::read_entries(&fs, &log).map_err(|e| ToolFailure::new(e.to_string()))?;
    let summary = match migrate_message_sequence_code_items(root) {
        Ok(s) => s,
        Err(MigrationError::Blocked(b)) => {
            return Err(ToolFailure::with_details(
                b.to_string(),
                json!({"code": trellis_workflow::migrate::BLOCKED_CODE, "reasons": b.reasons}),
            ));
        }
        Err(MigrationError::Invalid(d)) => {
            let diags: Vec<Value> = d
                .errors()
                .map(|d| json!({"file": d.file, "json_path": d.json_path, "step_id": d.step_id, "message": d.message}))
                .collect();
            return Err(ToolFailure::with_details(
                format!("the migration was refused, nothing was written:\n{d}"),
                json!({"diagnostics": diags}),
            ));
        }
        Err(e) => return Err(ToolFailure::new(format!("the migration failed: {e}"))),
    };
    let after = fs.read(PLAN_FILE).ok();
    let converted: Vec<Value> = summary
        .converted
        .iter()
        .map(|c| json!({"sequence_id": c.sequence_id, "new_step_ids": c.new_step_ids}))
        .collect();
    let scripts: Vec<String> = summary
        .scripts
        .iter()
        .map(|p| p.to_string_lossy().replace('\\', "/"))
        .collect();
    let changed =
        before != after || summary.contract_before.as_deref() != Some(&summary.contract_after);
    let mut logged = Value::Null;
    if changed {
        let mut step_ids = Vec::new();
        let mut changes = Vec::new();
        for c in &summary.converted {
            step_ids.push(c.sequence_id.clone());
            step_ids.extend(c.new_step_ids.iter().cloned());
            changes.push(Change::new(
                Some(&c.sequence_id),
                "step",
                json!("message_sequence with code items"),
                json!(c.new_step_ids),
            ));
        }
        changes.push(Change::new(
            None,
            "workflow.contract_version",
            json!(summary.contract_before),
            json!(summary.contract_after),
        ));
        let timestamp = trellis_sandbox::store::now_rfc3339();
        let log = changelog::changelog_path(&timestamp);
        let entry = json!({
            "timestamp": timestamp,
            "tool": "migrate_message_sequence_code_items",
            "reason": reason,
            "step_ids": step_ids,
            "changes": changes.iter().map(Change::to_json).collect::<Vec<_>>(),
            "before_sha256": changelog::sha256(before.as_deref()),
            "after_sha256": changelog::sha256(after.as_deref()),
        });
        changelog::append(&fs, &log, entry).map_err(|e| {
            ToolFailure::new(format!(
                "the migration was written but its changelog entry was not: {e}"
            ))
        })?;
        logged = json!(format!("{}/", super::changelog::CHANGELOG_DIR));
    }
    Ok(json!({
        "ok": true,
        "changed": changed,
        "contract_before": summary.contract_before,
        "contract_after": summary.contract_after,
        "converted": converted,
        "scripts": scripts,
        "changelog": logged,
    }))
}
