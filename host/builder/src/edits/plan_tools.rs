//! The plan edits: add and update each step type, delete steps, set a step's validation
//! schema, run the code-item migration.
//!
//! This module holds the step types ([`Kind`]) and the reads of the plan as JSON that every
//! edit shares; the edits themselves are in `steps` (add and update), `delete` (deletion
//! and the references it would leave dangling), `validation_schema` and `migrate`.

use serde_json::{Value, json};

use crate::ToolFailure;

mod delete;
mod migrate;
mod steps;
mod validation_schema;

pub(super) use delete::delete;
pub(super) use migrate::migrate;
pub(super) use steps::{add, update};
pub(super) use validation_schema::update_validation_schema;

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

/// The entries of a step config: its `steps`, or the array it is (either shape is read).
fn step_config_entries(config: &Value) -> &[Value] {
    match config {
        Value::Array(a) => a.as_slice(),
        v => v
            .get("steps")
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice),
    }
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
