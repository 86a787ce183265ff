//! The config edits: a step's `agent_configs`, `workflow.json` fields, variables and groups.
//! Variables and groups go to `variables/variables.json` when it exists (where the original
//! keeps them, and the file that wins on a name both define), else to `workflow.json`.

use std::path::Path;

use serde_json::{Map, Value, json};

use trellis_sandbox::store::WorkspaceFs;
use trellis_workflow::manifest::VARIABLES_FILE;
use trellis_workflow::{STEP_CONFIG_FILE, WORKFLOW_FILE};

use super::args::{opt_str, req_str, str_list};
use super::changelog::Change;
use super::draft::Draft;
use super::plan_tools::{all_step_ids, unknown_step};
use super::tool_specs::{step_config_fields, workflow_fields};
use crate::{ToolFailure, ToolResult};

/// Arguments of the field-setting tools that are not fields.
const CONTROL_ARGS: &[&str] = &["step_id", "reason", "clear_fields"];

/// Sets the given fields of `target` and removes `clear`; the changes, field by field.
fn set_fields(
    target: &mut Map<String, Value>,
    args: &Value,
    known: &Map<String, Value>,
    clear: &[String],
    step_id: Option<&str>,
    prefix: &str,
) -> Result<Vec<Change>, ToolFailure> {
    let mut changes = Vec::new();
    for name in clear {
        if !known.contains_key(name) {
            let names: Vec<&String> = known.keys().collect();
            return Err(ToolFailure::new(format!(
                "clear_fields: unknown field {name:?}; the fields are: {}",
                names
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if args.get(name).is_some() {
            return Err(ToolFailure::new(format!(
                "{name:?} is both set and in clear_fields: do one or the other"
            )));
        }
        if let Some(old) = target.remove(name) {
            changes.push(Change::new(
                step_id,
                format!("{prefix}{name}"),
                old,
                Value::Null,
            ));
        }
    }
    for (key, new) in args.as_object().into_iter().flatten() {
        if CONTROL_ARGS.contains(&key.as_str()) {
            continue;
        }
        let old = target.get(key).cloned().unwrap_or(Value::Null);
        if old != *new {
            target.insert(key.clone(), new.clone());
            changes.push(Change::new(
                step_id,
                format!("{prefix}{key}"),
                old,
                new.clone(),
            ));
        }
    }
    Ok(changes)
}

/// Run-specific step configs that win over the default one in builder runs
/// (`runs/iteration-0/planning/step_config.json`, and the same under each group folder).
pub(super) fn run_specific_configs(fs: &WorkspaceFs) -> Vec<String> {
    let mut out = Vec::new();
    let base = Path::new("runs").join("iteration-0");
    if fs.is_file(base.join(STEP_CONFIG_FILE)) {
        out.push(format!("runs/iteration-0/{STEP_CONFIG_FILE}"));
    }
    for (name, _) in fs.list(&base).unwrap_or_default() {
        if name != "planning" && fs.is_file(base.join(&name).join(STEP_CONFIG_FILE)) {
            out.push(format!("runs/iteration-0/{name}/{STEP_CONFIG_FILE}"));
        }
    }
    out
}

/// `update_step_config`.
pub(super) fn update_step_config(root: &Path, args: &Value) -> ToolResult {
    let args = &step_config_aliases(args)?;
    let reason = req_str(args, "reason")?;
    let id = req_str(args, "step_id")?;
    let mut clear = str_list(args, "clear_fields");
    let clear_schema = clear.iter().any(|c| c == "validation_schema");
    clear.retain(|c| c != "validation_schema");
    let schema = args.get("validation_schema").filter(|v| !v.is_null());
    if clear_schema && schema.is_some() {
        return Err(ToolFailure::new(
            "\"validation_schema\" is both set and in clear_fields: do one or the other",
        ));
    }
    let mut draft = Draft::open(root)?;
    let ids = all_step_ids(&draft.plan.value);
    if !ids.iter().any(|s| s == id) {
        return Err(unknown_step(id, ids));
    }
    let mut known = step_config_fields();
    // The entry's own key, set below, not an agent_configs field.
    known.remove("validation_schema");
    let entries = draft.config_entries();
    let at = match entries
        .iter()
        .position(|e| e.get("id").and_then(Value::as_str) == Some(id))
    {
        Some(at) => at,
        None => {
            entries.push(json!({"id": id, "agent_configs": {}}));
            entries.len() - 1
        }
    };
    let entry = entries[at].as_object_mut().ok_or_else(|| {
        ToolFailure::new(format!("the step config entry of {id:?} is not an object"))
    })?;
    let ac = entry.entry("agent_configs").or_insert_with(|| json!({}));
    if !ac.is_object() {
        *ac = json!({});
    }
    let ac = ac.as_object_mut().expect("an object");
    let mut field_args = args.clone();
    if let Some(map) = field_args.as_object_mut() {
        map.remove("validation_schema");
    }
    let mut changes = set_fields(ac, &field_args, &known, &clear, Some(id), "agent_configs.")?;
    let old = entry.get("validation_schema").cloned();
    match (schema, old) {
        (Some(new), old) if old.as_ref() != Some(new) => {
            entry.insert("validation_schema".into(), new.clone());
            changes.push(Change::new(
                Some(id),
                "validation_schema",
                old.unwrap_or(Value::Null),
                new.clone(),
            ));
        }
        (None, Some(old)) if clear_schema => {
            entry.remove("validation_schema");
            changes.push(Change::new(Some(id), "validation_schema", old, Value::Null));
        }
        _ => {}
    }
    if changes.is_empty() {
        return Ok(json!({"ok": true, "step_id": id, "changed": false,
            "note": "nothing to change: every field given already has that value"}));
    }
    let shadows = run_specific_configs(&draft.fs);
    let fields: Vec<String> = changes.iter().map(|c| c.field.clone()).collect();
    let done = draft.commit("update_step_config", reason, &[id.to_string()], &changes)?;
    let mut extra = json!({"step_id": id, "changed_fields": fields, "file": STEP_CONFIG_FILE});
    if let Some(first) = shadows.first() {
        extra["shadowed_by"] = json!(first);
        extra["note"] = json!(format!(
            "{} exists and wins over {STEP_CONFIG_FILE} in builder runs: this edit takes \
             effect there only once that file is removed or changed the same way",
            shadows.join(" and ")
        ));
    }
    Ok(done.answer(extra))
}

/// `args` with the original's argument names (`servers`, `tools`) as the `agent_configs`
/// fields they set, in the arguments and in `clear_fields`; a name given both ways with
/// different values is refused.
fn step_config_aliases(args: &Value) -> Result<Value, ToolFailure> {
    let mut out = args.clone();
    let Some(map) = out.as_object_mut() else {
        return Ok(out);
    };
    for (alias, field) in super::tool_specs::STEP_CONFIG_ALIASES {
        if let Some(v) = map.remove(alias) {
            if map.get(field).is_some_and(|f| *f != v) {
                return Err(ToolFailure::new(format!(
                    "{alias:?} and {field:?} are the same field, given different values: give \
                     one"
                )));
            }
            map.insert(field.into(), v);
        }
    }
    if let Some(Value::Array(clear)) = map.get_mut("clear_fields") {
        for name in clear.iter_mut() {
            if let Some((_, field)) = super::tool_specs::STEP_CONFIG_ALIASES
                .iter()
                .find(|(a, _)| name.as_str() == Some(a))
            {
                *name = Value::String(field.to_string());
            }
        }
    }
    Ok(out)
}

/// `update_workflow_config`.
pub(super) fn update_workflow_config(root: &Path, args: &Value) -> ToolResult {
    let reason = req_str(args, "reason")?;
    let clear = str_list(args, "clear_fields");
    let mut draft = Draft::open(root)?;
    let known = workflow_fields();
    if !draft.manifest.value.is_object() {
        return Err(ToolFailure::new(format!(
            "{WORKFLOW_FILE} is not a JSON object: fix it by hand first"
        )));
    }
    let m = draft.manifest.value.as_object_mut().expect("an object");
    let changes = set_fields(m, args, &known, &clear, None, "workflow.")?;
    if changes.is_empty() {
        return Ok(json!({"ok": true, "changed": false,
            "note": "nothing to change: every field given already has that value"}));
    }
    let fields: Vec<String> = changes.iter().map(|c| c.field.clone()).collect();
    let done = draft.commit("update_workflow_config", reason, &[], &changes)?;
    Ok(done.answer(json!({"changed_fields": fields, "file": WORKFLOW_FILE})))
}

/// The variables list of `variables/variables.json` (made one when absent).
fn vars_list<'a>(v: &'a mut Value, key: &str) -> Result<&'a mut Vec<Value>, ToolFailure> {
    if !v.is_object() {
        return Err(ToolFailure::new(format!(
            "{VARIABLES_FILE} is not a JSON object: fix it by hand first"
        )));
    }
    let list = v
        .as_object_mut()
        .expect("an object")
        .entry(key)
        .or_insert_with(|| json!([]));
    if !list.is_array() {
        return Err(ToolFailure::new(format!(
            "{VARIABLES_FILE}: \"{key}\" is not an array: fix it by hand first"
        )));
    }
    Ok(list.as_array_mut().expect("an array"))
}

/// The variables object of `workflow.json` (made one when absent).
fn manifest_map<'a>(v: &'a mut Value, key: &str) -> Result<&'a mut Value, ToolFailure> {
    if !v.is_object() {
        return Err(ToolFailure::new(format!(
            "{WORKFLOW_FILE} is not a JSON object: fix it by hand first"
        )));
    }
    Ok(v.as_object_mut()
        .expect("an object")
        .entry(key)
        .or_insert_with(|| {
            if key == "groups" {
                json!([])
            } else {
                json!({})
            }
        }))
}

fn in_variables_file(draft: &Draft, name: &str) -> bool {
    draft
        .variables
        .value
        .get("variables")
        .and_then(Value::as_array)
        .is_some_and(|l| {
            l.iter()
                .any(|v| v.get("name").and_then(Value::as_str) == Some(name))
        })
}

fn in_manifest(draft: &Draft, name: &str) -> bool {
    draft
        .manifest
        .value
        .get("variables")
        .and_then(Value::as_object)
        .is_some_and(|m| m.contains_key(name))
}

fn declared_names(draft: &Draft) -> Vec<String> {
    let mut names: Vec<String> = draft
        .manifest
        .value
        .get("variables")
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    for v in draft
        .variables
        .value
        .get("variables")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(n) = v.get("name").and_then(Value::as_str)
            && !names.iter().any(|x| x == n)
        {
            names.push(n.to_string());
        }
    }
    names
}

/// `update_variable`.
pub(super) fn update_variable(root: &Path, args: &Value) -> ToolResult {
    let reason = req_str(args, "reason")?;
    let action = req_str(args, "action")?;
    let name = req_str(args, "name")?;
    let value = opt_str(args, "value");
    let description = opt_str(args, "description");
    let mut draft = Draft::open(root)?;
    let use_file = draft.variables.exists();
    let (in_vars, in_wf) = (in_variables_file(&draft, name), in_manifest(&draft, name));
    let mut changes = Vec::new();
    let mut files = Vec::new();
    let field = format!("variables.{name}");
    match action {
        "add" | "update" => {
            if action == "add" && (in_vars || in_wf) {
                return Err(ToolFailure::new(format!(
                    "variable {name:?} already exists: use action \"update\""
                )));
            }
            if action == "update" && !in_vars && !in_wf {
                let names = declared_names(&draft);
                return Err(ToolFailure::with_details(
                    format!(
                        "no variable {name:?}: use action \"add\"; the variables are: {}",
                        if names.is_empty() {
                            "(none)".to_string()
                        } else {
                            names.join(", ")
                        }
                    ),
                    json!({"variables": names}),
                ));
            }
            if action == "update" && value.is_none() && description.is_none() {
                return Err(ToolFailure::new(
                    "give \"value\" or \"description\" (or both) to update",
                ));
            }
            // variables/variables.json when it holds the name or exists (and workflow.json
            // does not hold it alone).
            if in_vars || (use_file && !in_wf) {
                let list = vars_list(&mut draft.variables.value, "variables")?;
                let at = match list
                    .iter()
                    .position(|v| v.get("name").and_then(Value::as_str) == Some(name))
                {
                    Some(at) => at,
                    None => {
                        list.push(json!({"name": name}));
                        list.len() - 1
                    }
                };
                let old = list[at].clone();
                if let Some(v) = value {
                    list[at]["value"] = json!(v);
                }
                if let Some(d) = description {
                    list[at]["description"] = json!(d);
                }
                changes.push(Change::new(None, field.clone(), old, list[at].clone()));
                files.push(VARIABLES_FILE);
            } else {
                let map = manifest_map(&mut draft.manifest.value, "variables")?;
                if !map.is_object() {
                    return Err(ToolFailure::new(format!(
                        "{WORKFLOW_FILE}: \"variables\" is not an object: fix it by hand first"
                    )));
                }
                let old = map.get(name).cloned().unwrap_or(Value::Null);
                let mut new = match &old {
                    Value::Object(o) => Value::Object(o.clone()),
                    Value::String(s) => json!({"value": s}),
                    _ => json!({}),
                };
                if let Some(v) = value {
                    new["value"] = json!(v);
                }
                if let Some(d) = description {
                    new["description"] = json!(d);
                }
                // The short form when there is only a value.
                if new
                    .as_object()
                    .is_some_and(|o| o.len() == 1 && o.contains_key("value"))
                {
                    new = new["value"].clone();
                }
                map[name] = new.clone();
                changes.push(Change::new(None, field.clone(), old, new));
                files.push(WORKFLOW_FILE);
            }
        }
        _ => {
            if !in_vars && !in_wf {
                let names = declared_names(&draft);
                return Err(ToolFailure::with_details(
                    format!(
                        "no variable {name:?}; the variables are: {}",
                        if names.is_empty() {
                            "(none)".to_string()
                        } else {
                            names.join(", ")
                        }
                    ),
                    json!({"variables": names}),
                ));
            }
            if in_vars {
                let list = vars_list(&mut draft.variables.value, "variables")?;
                if let Some(at) = list
                    .iter()
                    .position(|v| v.get("name").and_then(Value::as_str) == Some(name))
                {
                    let old = list.remove(at);
                    changes.push(Change::new(None, field.clone(), old, Value::Null));
                    files.push(VARIABLES_FILE);
                }
            }
            if in_wf {
                let map = manifest_map(&mut draft.manifest.value, "variables")?;
                if let Some(old) = map.as_object_mut().and_then(|m| m.remove(name)) {
                    changes.push(Change::new(None, field.clone(), old, Value::Null));
                    files.push(WORKFLOW_FILE);
                }
            }
        }
    }
    let done = draft.commit("update_variable", reason, &[], &changes)?;
    let mut extra = json!({"variable": name, "action": action, "files": files});
    if in_vars && in_wf && action != "delete" {
        extra["note"] = json!(format!(
            "{name:?} is defined in both {VARIABLES_FILE} and {WORKFLOW_FILE}: the value in \
             {VARIABLES_FILE} wins (that is the one changed)"
        ));
        extra["wins"] = json!(VARIABLES_FILE);
    }
    Ok(done.answer(extra))
}

/// Where a group is defined: the file, its index, and its id.
struct GroupAt {
    in_vars: bool,
    index: usize,
    id: String,
}

fn groups_of(draft: &Draft) -> Vec<GroupAt> {
    let mut out = Vec::new();
    for (i, g) in draft
        .manifest
        .value
        .get("groups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some(id) = g.get("id").and_then(Value::as_str) {
            out.push(GroupAt {
                in_vars: false,
                index: i,
                id: id.to_string(),
            });
        }
    }
    for (i, g) in draft
        .variables
        .value
        .get("groups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some(id) = g.get("name").and_then(Value::as_str) {
            out.push(GroupAt {
                in_vars: true,
                index: i,
                id: id.to_string(),
            });
        }
    }
    out
}

fn find_group(draft: &Draft, key: &str) -> Result<GroupAt, ToolFailure> {
    let groups = groups_of(draft);
    let names: Vec<String> = groups.iter().map(|g| g.id.clone()).collect();
    let by_name = |g: &GroupAt| {
        !g.in_vars
            && draft.manifest.value["groups"][g.index]
                .get("name")
                .and_then(Value::as_str)
                == Some(key)
    };
    // variables/variables.json wins over workflow.json on the same id.
    let mut found: Vec<GroupAt> = groups
        .into_iter()
        .filter(|g| g.id == key || by_name(g))
        .collect();
    found.sort_by_key(|g| !g.in_vars);
    found.into_iter().next().ok_or_else(|| {
        ToolFailure::with_details(
            format!(
                "no group {key:?}; the groups are: {}",
                if names.is_empty() {
                    "(none)".to_string()
                } else {
                    names.join(", ")
                }
            ),
            json!({"groups": names}),
        )
    })
}

/// `add_group`.
pub(super) fn add_group(root: &Path, args: &Value) -> ToolResult {
    let reason = req_str(args, "reason")?;
    let name = req_str(args, "name")?;
    let vars = args.get("variables").cloned().unwrap_or_else(|| json!({}));
    let mut draft = Draft::open(root)?;
    let id = if draft.variables.exists() {
        name
    } else {
        opt_str(args, "id").unwrap_or(name)
    };
    if groups_of(&draft).iter().any(|g| g.id == id) {
        return Err(ToolFailure::new(format!(
            "a group {id:?} already exists: use update_group"
        )));
    }
    let (file, group) = if draft.variables.exists() {
        let mut g = json!({"name": name, "enabled": true});
        if vars.as_object().is_some_and(|m| !m.is_empty()) {
            g["values"] = vars;
        }
        vars_list(&mut draft.variables.value, "groups")?.push(g.clone());
        (VARIABLES_FILE, g)
    } else {
        let mut g = json!({"id": id});
        if id != name {
            g["name"] = json!(name);
        }
        if vars.as_object().is_some_and(|m| !m.is_empty()) {
            g["variables"] = vars;
        }
        let list = manifest_map(&mut draft.manifest.value, "groups")?;
        match list.as_array_mut() {
            Some(l) => l.push(g.clone()),
            None => {
                return Err(ToolFailure::new(format!(
                    "{WORKFLOW_FILE}: \"groups\" is not an array: fix it by hand first"
                )));
            }
        }
        (WORKFLOW_FILE, g)
    };
    let changes = [Change::new(
        None,
        format!("groups.{id}"),
        Value::Null,
        group,
    )];
    let done = draft.commit("add_group", reason, &[], &changes)?;
    Ok(done.answer(json!({"group": id, "file": file})))
}

/// `update_group`.
pub(super) fn update_group(root: &Path, args: &Value) -> ToolResult {
    let reason = req_str(args, "reason")?;
    let key = req_str(args, "group")?;
    let mut draft = Draft::open(root)?;
    let at = find_group(&draft, key)?;
    let (file, list) = if at.in_vars {
        (
            VARIABLES_FILE,
            vars_list(&mut draft.variables.value, "groups")?,
        )
    } else {
        let l = manifest_map(&mut draft.manifest.value, "groups")?;
        (
            WORKFLOW_FILE,
            l.as_array_mut()
                .ok_or_else(|| ToolFailure::new("\"groups\" is not an array"))?,
        )
    };
    let group = &mut list[at.index];
    let old = group.clone();
    if let Some(name) = opt_str(args, "name") {
        if at.in_vars {
            return Err(ToolFailure::new(format!(
                "group {key:?} is defined in {VARIABLES_FILE}, where its name is its id: add \
                 a group with the new name and delete this one instead"
            )));
        }
        group["name"] = json!(name);
    }
    if let Some(values) = args.get("variables").and_then(Value::as_object) {
        let key = if at.in_vars { "values" } else { "variables" };
        if !group.get(key).is_some_and(Value::is_object) {
            group[key] = json!({});
        }
        let map = group[key].as_object_mut().expect("an object");
        for (k, v) in values {
            if v.is_null() {
                map.remove(k);
            } else {
                map.insert(k.clone(), v.clone());
            }
        }
    }
    let new = group.clone();
    if new == old {
        return Ok(json!({"ok": true, "group": at.id, "changed": false,
            "note": "nothing to change"}));
    }
    let changes = [Change::new(None, format!("groups.{}", at.id), old, new)];
    let done = draft.commit("update_group", reason, &[], &changes)?;
    Ok(done.answer(json!({"group": at.id, "file": file})))
}

/// `delete_group`: never the last one.
pub(super) fn delete_group(root: &Path, args: &Value) -> ToolResult {
    let reason = req_str(args, "reason")?;
    let key = req_str(args, "group")?;
    let mut draft = Draft::open(root)?;
    let at = find_group(&draft, key)?;
    let all = groups_of(&draft);
    let mut distinct: Vec<&str> = all.iter().map(|g| g.id.as_str()).collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() <= 1 {
        return Err(ToolFailure::with_details(
            format!(
                "refused: {:?} is the last group; a workflow with groups keeps at least one \
                 (add another group first)",
                at.id
            ),
            json!({"groups": distinct}),
        ));
    }
    let (file, old) = if at.in_vars {
        (
            VARIABLES_FILE,
            vars_list(&mut draft.variables.value, "groups")?.remove(at.index),
        )
    } else {
        let l = manifest_map(&mut draft.manifest.value, "groups")?;
        (
            WORKFLOW_FILE,
            l.as_array_mut()
                .ok_or_else(|| ToolFailure::new("\"groups\" is not an array"))?
                .remove(at.index),
        )
    };
    let changes = [Change::new(
        None,
        format!("groups.{}", at.id),
        old,
        Value::Null,
    )];
    let done = draft.commit("delete_group", reason, &[], &changes)?;
    Ok(done.answer(json!({"group": at.id, "file": file})))
}
