//! `delete_plan_steps`: steps (with their route sub-agent steps and step config entries)
//! taken out of the plan, refused while anything that stays still points at one of them.

use std::path::Path;

use serde_json::{Value, json};

use trellis_workflow::{PLAN_FILE, STEP_CONFIG_FILE};

use super::{
    all_step_ids, id_of, step_config_entries, step_list, steps_mut, top_ids, unknown_step,
};
use crate::ToolFailure;
use crate::ToolResult;
use crate::edits::args::{req_str, str_list};
use crate::edits::changelog::Change;
use crate::edits::config_tools::run_specific_configs;
use crate::edits::draft::Draft;

/// A reference to a step that a deletion would leave dangling.
fn reference(file: &str, from: Option<&str>, path: String, target: &str) -> Value {
    json!({"file": file, "from_step": from, "json_path": path, "points_at": target})
}

/// Every reference in the plan and the step config to one of `gone` from what stays.
fn dangling_references(draft: &Draft, gone: &std::collections::HashSet<&str>) -> Vec<Value> {
    let is_gone = |t: &str| gone.contains(t);
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
pub(in crate::edits) fn delete(root: &Path, args: &Value) -> ToolResult {
    let reason = req_str(args, "reason")?;
    // Each id once, in the order given; looked up in sets, not lists (a 30,000-step plan
    // took 24 s to delete from).
    let mut seen = std::collections::HashSet::new();
    let ids: Vec<String> = str_list(args, "step_ids")
        .into_iter()
        .filter(|id| seen.insert(id.clone()))
        .collect();
    let mut draft = Draft::open(root)?;
    let valid = top_ids(&draft.plan.value);
    {
        let known: std::collections::HashSet<&String> = valid.iter().collect();
        if let Some(id) = ids.iter().find(|id| !known.contains(id)) {
            return Err(unknown_step(id, valid.clone()));
        }
    }
    let ids_set: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
    // A deleted step takes its route sub-agent steps with it.
    let mut gone = ids.clone();
    for list in ["steps", "orphan_steps"] {
        for s in step_list(&draft.plan.value, list) {
            if id_of(s).is_some_and(|i| ids_set.contains(i)) {
                let nested = all_step_ids(&json!({"steps": [s]}));
                gone.extend(nested.into_iter().skip(1));
            }
        }
    }
    let gone_set: std::collections::HashSet<&str> = gone.iter().map(String::as_str).collect();
    let refs = dangling_references(&draft, &gone_set);
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
            let hit = id_of(s).is_some_and(|i| ids_set.contains(i));
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
        let hit = id_of(e).is_some_and(|i| gone_set.contains(i));
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
    for file in run_specific_configs(&draft.fs) {
        let text = draft.fs.read_json_text(&file).unwrap_or_default();
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let stale: Vec<&str> = step_config_entries(&value)
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
