//! The edit tools as the model sees them: each a strict object schema. The step config and
//! workflow config fields come from the workflow model's own JSON Schemas
//! ([`trellis_workflow::json_schema`]), so a field the model gains is offered here too.

use serde_json::{Map, Value, json};

use super::plan_tools::Kind;
use crate::ToolSpec;

fn strings() -> Value {
    json!({"type": "array", "items": {"type": "string"}})
}

fn reason() -> Value {
    json!({"type": "string", "minLength": 1,
           "description": "Why you make this change, in a sentence (logged to planning/changelog/)."})
}

fn object(props: Map<String, Value>, required: &[&str]) -> Value {
    json!({"type": "object", "properties": props, "required": required,
           "additionalProperties": false})
}

/// The fields every step has, beyond its id and type.
fn common_fields() -> Vec<(&'static str, Value)> {
    vec![
        (
            "title",
            json!({"type": "string", "description": "A short label."}),
        ),
        (
            "description",
            json!({"type": "string",
            "description": "The charter of the step: what it must do and produce."}),
        ),
        (
            "context_dependencies",
            json!({"type": "array", "items": {"type": "string"},
            "description": "Workspace-relative paths the step reads."}),
        ),
        (
            "context_output",
            json!({"oneOf": [{"type": "string"}, strings()],
            "description": "The output file name(s) of the step."}),
        ),
        (
            "validation_schema",
            json!({"type": "object",
            "description": "The step's acceptance contract: {files: [{file_name, must_exist, json_checks: [...]}], db: [{name, sql, min_rows, checks}]}."}),
        ),
        (
            "next_step_id",
            json!({"type": "string",
            "description": "The step run next; \"end\" ends the run. Absent: the next step in order."}),
        ),
    ]
}

/// The fields of a step type beyond the common ones.
pub(super) fn kind_fields(kind: Kind) -> Vec<(&'static str, Value)> {
    let routes = json!({"type": "array", "items": {"type": "object"},
        "description": "Sub-agent routes: [{route_id, route_name, condition, sub_agent_step: {id (= route_id), type: message_sequence|regular, ...}} or {route_id, orphan_step_ref}]."});
    match kind {
        Kind::Sequence => vec![
            (
                "items",
                json!({"type": "array", "minItems": 1, "items": {"type": "object"},
                "description": "The turns, in order: {id, type: user_message, message} | {id, type: foreach, source_sql, message} | {id, type: prevalidation, validation_schema?}; optional title, kind, write_access {db, knowledgebase, learnings}."}),
            ),
            ("predefined_routes", routes),
        ],
        Kind::Scripted => vec![(
            "script",
            json!({"type": "string", "minLength": 1,
            "description": "The Python script, written to code/<id>/main.py (run with cwd code/<id>/; STEP_OUTPUT_DIR, DB_PATH and VAR_<NAME> in its environment)."}),
        )],
        Kind::Routing => vec![
            (
                "routes",
                json!({"type": "array", "items": {
                "type": "object", "required": ["route_id", "next_step_id"], "additionalProperties": false,
                "properties": {"route_id": {"type": "string"}, "route_name": {"type": "string"},
                               "condition": {"type": "string"}, "next_step_id": {"type": "string"}}},
                "description": "The choices: the value of select_route picks one, the run goes to its next_step_id."}),
            ),
            (
                "default_route_id",
                json!({"type": "string",
                "description": "The route taken when no route_selection.json exists."}),
            ),
            (
                "route_source_file",
                json!({"type": "string",
                "description": "The prior step's file holding {\"select_route\": \"<route_id>\"}."}),
            ),
        ],
        Kind::HumanInput => vec![
            (
                "question",
                json!({"type": "string", "description": "What to ask the person."}),
            ),
            (
                "variable_name",
                json!({"type": "string", "description": "The variable that receives the answer."}),
            ),
            (
                "response_type",
                json!({"enum": ["text", "yesno", "multiple_choice"]}),
            ),
            ("options", strings()),
            ("if_yes_next_step_id", json!({"type": "string"})),
            ("if_no_next_step_id", json!({"type": "string"})),
            (
                "option_routes",
                json!({"type": "object", "additionalProperties": {"type": "string"},
                "description": "Option -> next step id."}),
            ),
        ],
        Kind::TodoTask => vec![
            ("predefined_routes", routes),
            (
                "messages",
                json!({"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "object"}]},
                "description": "Messages (text or sequence items) run as the step's turns."}),
            ),
        ],
    }
}

/// The arguments an add tool requires beyond `id` and `reason`.
fn add_required(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Sequence => &["title", "description", "items"],
        Kind::Scripted => &["title", "description", "script"],
        Kind::Routing => &["routes"],
        Kind::HumanInput => &["question"],
        Kind::TodoTask => &["title", "description"],
    }
}

fn position(moving: bool) -> Value {
    let what = if moving {
        "Moves the step"
    } else {
        "Where the step goes"
    };
    json!({"type": "string", "description": format!(
        "{what}: after this step id on the main path; \"\" = first; absent = {}.",
        if moving { "where it is" } else { "last" })})
}

fn add_spec(kind: Kind) -> ToolSpec {
    let mut props = Map::new();
    props.insert(
        "id".into(),
        json!({"type": "string", "minLength": 1,
        "description": "The new step id: unique, one path component (it names folders)."}),
    );
    props.insert("reason".into(), reason());
    for (k, v) in common_fields().into_iter().chain(kind_fields(kind)) {
        props.insert(k.into(), v);
    }
    props.insert("insert_after_step_id".into(), position(false));
    props.insert("orphan".into(), json!({"type": "boolean",
        "description": "true: add it to orphan_steps (utility steps run only when invoked by id, e.g. through a route's orphan_step_ref) instead of the main path."}));
    let mut required = vec!["id", "reason"];
    required.extend(add_required(kind));
    ToolSpec {
        name: kind.add_tool(),
        description: kind.add_description(),
        parameters: object(props, &required),
    }
}

fn nullable(schema: Value) -> Value {
    let description = schema.get("description").cloned();
    let mut out = json!({"anyOf": [schema, {"type": "null"}]});
    let text = match description.as_ref().and_then(Value::as_str) {
        Some(d) => format!("{d} null removes it."),
        None => "null removes it.".to_string(),
    };
    out["description"] = json!(text);
    out
}

fn update_spec(kind: Kind) -> ToolSpec {
    let mut props = Map::new();
    props.insert(
        "step_id".into(),
        json!({"type": "string", "description": "The step to change."}),
    );
    props.insert("reason".into(), reason());
    for (k, v) in common_fields().into_iter().chain(kind_fields(kind)) {
        let v = if k == "script" { v } else { nullable(v) };
        props.insert(k.into(), v);
    }
    props.insert("insert_after_step_id".into(), position(true));
    ToolSpec {
        name: kind.update_tool(),
        description: kind.update_description(),
        parameters: object(props, &["step_id", "reason"]),
    }
}

/// The `agent_configs` fields `update_step_config` sets, with their schemas.
pub(super) fn step_config_fields() -> Map<String, Value> {
    let schema = trellis_workflow::json_schema::step_config_schema();
    let mut props = schema
        .pointer("/properties/steps/items/properties/agent_configs/properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    // Retired: dropped on save, so never written.
    props.remove("execution_max_turns");
    // Kept as written, with no effect on a run here (the original's validation model).
    props.entry("validation_llm").or_insert_with(|| {
        json!({"type": "object", "description": "The model of the step's validation (kept, not used by Trellis's gates).",
               "properties": {"provider": {"type": "string"}, "model_id": {"type": "string"}}})
    });
    props
}

/// The original system's names of `update_step_config` arguments, and the
/// `agent_configs` fields they set.
pub(super) const STEP_CONFIG_ALIASES: [(&str, &str); 2] =
    [("servers", "selected_servers"), ("tools", "selected_tools")];

/// Keys of `workflow.json` with tools of their own (or none).
const NOT_WORKFLOW_FIELDS: &[&str] = &["version", "contract_version", "variables", "groups"];

/// The `workflow.json` fields `update_workflow_config` sets, with their schemas.
pub(super) fn workflow_fields() -> Map<String, Value> {
    let schema = trellis_workflow::json_schema::workflow_schema();
    let mut props = schema
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for k in NOT_WORKFLOW_FIELDS {
        props.remove(*k);
    }
    // The original's bookkeeping is kept as it is, not edited here.
    for k in trellis_workflow::manifest::KEPT_KEYS {
        props.remove(*k);
    }
    props.entry("run_retention_count").or_insert_with(|| {
        json!({"type": "integer", "minimum": 1,
               "maximum": trellis_workflow::manifest::MAX_RUN_RETENTION,
               "description": "How many archived runs a full run keeps."})
    });
    props
}

fn with_fields(
    mut props: Map<String, Value>,
    fields: Map<String, Value>,
    clear_what: &str,
) -> Map<String, Value> {
    let names: Vec<&String> = fields.keys().collect();
    props.insert(
        "clear_fields".into(),
        json!({"type": "array", "items": {"enum": names},
               "description": format!("{clear_what} to remove (back to the default).")}),
    );
    props.extend(fields);
    props
}

/// Every spec of the family, in the order of [`crate::modes::PLAN_TOOLS`] then
/// [`crate::modes::CONFIG_TOOLS`].
pub(super) fn all() -> Vec<ToolSpec> {
    let mut out: Vec<ToolSpec> = Kind::ALL.into_iter().map(add_spec).collect();
    out.extend(Kind::ALL.into_iter().map(update_spec));

    let mut p = Map::new();
    p.insert(
        "step_ids".into(),
        json!({"type": "array", "minItems": 1, "items": {"type": "string"},
        "description": "The steps to delete, all at once."}),
    );
    p.insert("reason".into(), reason());
    out.push(ToolSpec {
        name: "delete_plan_steps",
        description: "Deletes steps of the plan (main path or orphans) and their step config entries, all or none. Refused, listing them, while any route, next step, prerequisite rule or dependency still points at a deleted step: change those first.",
        parameters: object(p, &["step_ids", "reason"]),
    });

    let mut p = Map::new();
    p.insert("step_id".into(), json!({"type": "string"}));
    p.insert("reason".into(), reason());
    p.insert(
        "validation_schema".into(),
        json!({"type": ["object", "null"],
        "description": "The step's acceptance contract in the plan; null removes it."}),
    );
    out.push(ToolSpec {
        name: "update_validation_schema",
        description: "Sets (or with null removes) the validation_schema of a plan step. When the step config in force holds a validation_schema for the step, that one wins at run time: the answer names it (shadowed_by).",
        parameters: object(p, &["step_id", "reason", "validation_schema"]),
    });

    let mut p = Map::new();
    p.insert("reason".into(), reason());
    out.push(ToolSpec {
        name: "migrate_message_sequence_code_items",
        description: "Runs the contract migration: legacy code items of message sequences become scripted regular steps (code/<id>/main.py), contract stamped 1.0.11. Blocked (nothing changed) when a sequence is ambiguous; the answer lists what to split.",
        parameters: object(p, &["reason"]),
    });

    let mut p = Map::new();
    p.insert(
        "step_id".into(),
        json!({"type": "string", "description": "The step to configure."}),
    );
    p.insert("reason".into(), reason());
    let mut fields = step_config_fields();
    for (alias, field) in STEP_CONFIG_ALIASES {
        fields.insert(
            alias.into(),
            json!({"type": "array", "items": {"type": "string"},
                   "description": format!("The same as {field}.")}),
        );
    }
    fields.insert(
        "validation_schema".into(),
        json!({"type": "object", "description": "The step's validation_schema in the step config (wins over the plan's): {files: [...]}."}),
    );
    out.push(ToolSpec {
        name: "update_step_config",
        description: "Sets agent_configs fields of a step in the default planning/step_config.json (only the fields given change; clear_fields removes fields), and the entry's validation_schema. servers and tools are the original names of selected_servers and selected_tools. When a run-specific step config wins over the default, the answer names it (shadowed_by).",
        parameters: object(
            with_fields(p, fields, "agent_configs fields (or validation_schema)"),
            &["step_id", "reason"],
        ),
    });

    let mut p = Map::new();
    p.insert("reason".into(), reason());
    out.push(ToolSpec {
        name: "update_workflow_config",
        description: "Sets fields of workflow.json (llm, tiers, providers, ...; only the fields given change; clear_fields removes fields). Variables and groups have their own tools.",
        parameters: object(
            with_fields(p, workflow_fields(), "workflow.json fields"),
            &["reason"],
        ),
    });

    let mut p = Map::new();
    p.insert("reason".into(), reason());
    p.insert(
        "action".into(),
        json!({"enum": ["add", "update", "delete"]}),
    );
    p.insert(
        "name".into(),
        json!({"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
        "description": "The variable (scripts see VAR_<NAME>)."}),
    );
    p.insert(
        "value".into(),
        json!({"type": "string", "description": "Its default value (add, update)."}),
    );
    p.insert(
        "description".into(),
        json!({"type": "string", "description": "What it is for (add, update)."}),
    );
    out.push(ToolSpec {
        name: "update_variable",
        description: "Adds, updates or deletes a workflow variable: in variables/variables.json when that file exists, else in workflow.json. When both files define the name, variables/variables.json wins; the answer says so.",
        parameters: object(p, &["reason", "action", "name"]),
    });

    let mut p = Map::new();
    p.insert("reason".into(), reason());
    p.insert(
        "name".into(),
        json!({"type": "string", "minLength": 1,
        "description": "The group's display name (its run folder is the name sanitized)."}),
    );
    p.insert("id".into(), json!({"type": "string", "minLength": 1,
        "description": "The group id (workflow.json only; default: the name). In variables/variables.json the name is the id."}));
    p.insert(
        "variables".into(),
        json!({"type": "object", "additionalProperties": {"type": "string"},
        "description": "Values of declared variables for this group."}),
    );
    out.push(ToolSpec {
        name: "add_group",
        description: "Adds a group (a run unit with its own variable values) to variables/variables.json when that file exists, else to workflow.json.",
        parameters: object(p, &["reason", "name"]),
    });

    let mut p = Map::new();
    p.insert("reason".into(), reason());
    p.insert(
        "group".into(),
        json!({"type": "string", "description": "The group's id or name."}),
    );
    p.insert("name".into(), json!({"type": "string", "minLength": 1, "description": "A new display name (workflow.json groups)."}));
    p.insert(
        "variables".into(),
        json!({"type": "object", "additionalProperties": {"type": ["string", "null"]},
        "description": "Values to set; null removes a value. Values not named stay."}),
    );
    out.push(ToolSpec {
        name: "update_group",
        description: "Changes a group's display name or variable values, where the group is defined.",
        parameters: object(p, &["reason", "group"]),
    });

    let mut p = Map::new();
    p.insert("reason".into(), reason());
    p.insert(
        "group".into(),
        json!({"type": "string", "description": "The group's id or name."}),
    );
    out.push(ToolSpec {
        name: "delete_group",
        description: "Deletes a group; never the last one.",
        parameters: object(p, &["reason", "group"]),
    });
    out
}
