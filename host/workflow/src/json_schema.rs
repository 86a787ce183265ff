//! JSON Schemas (draft 2020-12) of the workflow files, for editors (`trellis schema
//! plan|step-config|workflow|validation`).
//!
//! The schemas describe the same keys the checkers accept, with `additionalProperties: false`
//! where Trellis rejects unknown keys, so an editor flags a typo as the loader would. They
//! cannot express every cross-field rule (unique ids, references); `trellis validate` does.

use serde_json::{Value, json};

const DRAFT: &str = "https://json-schema.org/draft/2020-12/schema";

/// The schema named on the command line: `plan`, `step-config`, `workflow` or `validation`.
pub fn schema_for(name: &str) -> Option<Value> {
    match name {
        "plan" => Some(plan_schema()),
        "step-config" | "step_config" => Some(step_config_schema()),
        "workflow" => Some(workflow_schema()),
        "validation" | "validation-schema" => Some(validation_schema()),
        _ => None,
    }
}

/// The names [`schema_for`] knows.
pub const SCHEMA_NAMES: &[&str] = &["plan", "step-config", "workflow", "validation"];

fn strings() -> Value {
    json!({"type": "array", "items": {"type": "string"}})
}

fn validation_defs() -> Value {
    json!({
        "validationSchema": {
            "type": "object",
            "description": "Deterministic acceptance contract of a step (spec section 5).",
            "additionalProperties": false,
            "properties": {
                "files": {"type": "array", "maxItems": 20, "items": {"$ref": "#/$defs/fileRule"}},
                "db": {"type": "array", "items": {"$ref": "#/$defs/dbRule"}}
            }
        },
        "fileRule": {
            "type": "object",
            "required": ["file_name"],
            "properties": {
                "file_name": {"type": "string", "minLength": 1,
                    "description": "Bare name: in the step output folder; db/... or knowledgebase/...: from the workspace root."},
                "must_exist": {"type": "boolean"},
                "required": {"type": "boolean", "description": "Doc-era spelling of must_exist."},
                "validation_type": {"type": "string", "minLength": 1,
                    "description": "\"json\": the file must parse as JSON; any other value names a custom validator plugin, which reads the rule's other keys as its options."},
                "json_checks": {"type": "array", "maxItems": 100, "items": {"$ref": "#/$defs/jsonCheck"}}
            },
            "if": {"not": {"required": ["validation_type"], "properties": {"validation_type": {"not": {"const": "json"}}}}},
            "then": {"properties": {"file_name": true, "must_exist": true, "required": true, "validation_type": true, "json_checks": true},
                     "additionalProperties": false}
        },
        "jsonCheck": {
            "type": "object",
            "required": ["path"],
            "additionalProperties": false,
            "properties": {
                "path": {"type": "string", "pattern": "^\\$", "description": "RFC 9535 JSONPath."},
                "must_exist": {"type": "boolean"},
                "value_type": {"enum": ["string", "number", "boolean", "array", "object"]},
                "min_length": {"type": "integer", "minimum": 0},
                "max_length": {"type": "integer", "minimum": 0},
                "min_value": {"type": "number"},
                "max_value": {"type": "number"},
                "pattern": {"type": "string", "format": "regex"},
                "consistency_check": {
                    "type": "object",
                    "required": ["type", "compare_with_path"],
                    "additionalProperties": false,
                    "properties": {
                        "type": {"enum": ["equals", "greater_than", "less_than", "array_length", "in_array"]},
                        "compare_with_path": {"type": "string", "pattern": "^\\$"}
                    }
                }
            }
        },
        "dbRule": {
            "type": "object",
            "required": ["sql"],
            "additionalProperties": false,
            "properties": {
                "name": {"type": "string"},
                "sql": {"type": "string", "minLength": 1, "description": "One read-only statement on db/db.sqlite."},
                "min_rows": {"type": "integer", "minimum": 0},
                "max_rows": {"type": "integer", "minimum": 0},
                "checks": {"type": "array", "maxItems": 100, "items": {"$ref": "#/$defs/jsonCheck"}}
            }
        }
    })
}

fn llm_ref() -> Value {
    json!({
        "type": "object",
        "required": ["provider", "model_id"],
        "additionalProperties": false,
        "properties": {
            "provider": {"type": "string", "minLength": 1},
            "model_id": {"type": "string", "minLength": 1},
            "options": {"type": "object"}
        }
    })
}

fn with_defs(mut schema: Value, extra: Value) -> Value {
    let mut defs = validation_defs();
    if let (Some(d), Some(e)) = (defs.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            d.insert(k.clone(), v.clone());
        }
    }
    schema["$defs"] = defs;
    schema
}

/// The schema of a `validation_schema` on its own.
pub fn validation_schema() -> Value {
    let mut s = with_defs(json!({"$ref": "#/$defs/validationSchema"}), json!({}));
    s["$schema"] = json!(DRAFT);
    s["title"] = json!("Trellis validation_schema");
    s
}

/// The schema of `planning/plan.json`.
pub fn plan_schema() -> Value {
    let common = json!({
        "id": {"type": "string", "minLength": 1},
        "title": {"type": "string"},
        "description": {"type": "string"},
        "context_dependencies": strings(),
        "context_output": {"oneOf": [{"type": "string"}, strings()]},
        "validation_schema": {"$ref": "#/$defs/validationSchema"},
        "next_step_id": {"type": "string"}
    });
    let step_of = |ty: &str, extra: Value, required: Value| {
        let mut props = common.clone();
        props["type"] = json!({"const": ty});
        for (k, v) in extra.as_object().into_iter().flatten() {
            props[k] = v.clone();
        }
        json!({"type": "object", "required": required, "additionalProperties": false, "properties": props})
    };
    let routes = json!({"type": "array", "items": {"$ref": "#/$defs/predefinedRoute"}});
    let write_access = json!({
        "type": "object",
        "description": "Per-folder write access of the turn; narrows the step's, never widens it.",
        "additionalProperties": false,
        "properties": {"db": {"type": "boolean"}, "knowledgebase": {"type": "boolean"}, "learnings": {"type": "boolean"}}
    });
    let item_common = json!({
        "id": {"type": "string", "minLength": 1},
        "title": {"type": "string"},
        "kind": {"enum": ["execution", "learning", "knowledgebase", "db"]}
    });
    let item_of = |ty: &str, extra: Value, required: Value| {
        let mut props = item_common.clone();
        props["type"] = json!({"const": ty});
        for (k, v) in extra.as_object().into_iter().flatten() {
            props[k] = v.clone();
        }
        json!({"type": "object", "required": required, "additionalProperties": false, "properties": props})
    };
    let defs = json!({
        "step": {"oneOf": [
            step_of("message_sequence", json!({
                "items": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/item"}},
                "predefined_routes": routes
            }), json!(["id", "type", "title", "description", "items"])),
            step_of("regular", json!({}), json!(["id", "type"])),
            step_of("routing", json!({
                "routes": {"type": "array", "items": {
                    "type": "object", "required": ["route_id", "next_step_id"], "additionalProperties": false,
                    "properties": {"route_id": {"type": "string"}, "route_name": {"type": "string"},
                                   "condition": {"type": "string"}, "next_step_id": {"type": "string"}}}},
                "default_route_id": {"type": "string"},
                "route_source_file": {"type": "string"},
                "routing_question": {"type": "string", "description": "Accepted and ignored (older plans)."}
            }), json!(["id", "type", "routes"])),
            step_of("human_input", json!({
                "question": {"type": "string"},
                "variable_name": {"type": "string"},
                "response_type": {"enum": ["text", "yesno", "multiple_choice"]},
                "options": strings(),
                "if_yes_next_step_id": {"type": "string"},
                "if_no_next_step_id": {"type": "string"},
                "option_routes": {"type": "object", "additionalProperties": {"type": "string"}}
            }), json!(["id", "type"])),
            step_of("todo_task", json!({
                "predefined_routes": routes,
                "messages": {"type": "array", "items": {"oneOf": [{"type": "string"}, {"$ref": "#/$defs/item"}]}}
            }), json!(["id", "type"]))
        ]},
        "item": {"oneOf": [
            item_of("user_message", json!({"message": {"type": "string", "minLength": 1}, "write_access": write_access}),
                    json!(["id", "type", "message"])),
            item_of("foreach", json!({
                "source_sql": {"type": "string", "minLength": 1},
                "message": {"type": "string", "minLength": 1, "description": "Go text/template; the row is bound to ."},
                "max_iterations": {"type": "integer", "minimum": 1},
                "write_access": write_access
            }), json!(["id", "type", "source_sql", "message"])),
            item_of("prevalidation", json!({
                "validation_schema": {"$ref": "#/$defs/validationSchema"},
                "prevalidation": {"$ref": "#/$defs/validationSchema"}
            }), json!(["id", "type"]))
        ]},
        "predefinedRoute": {
            "type": "object",
            "required": ["route_id"],
            "oneOf": [{"required": ["sub_agent_step"]}, {"required": ["orphan_step_ref"]}],
            "additionalProperties": false,
            "properties": {
                "route_id": {"type": "string"}, "route_name": {"type": "string"}, "condition": {"type": "string"},
                "sub_agent_step": {"$ref": "#/$defs/step"},
                "orphan_step_ref": {"type": "string", "description": "An orphan step the route runs instead of an inline sub_agent_step."}
            }
        }
    });
    with_defs(
        json!({
            "$schema": DRAFT,
            "title": "Trellis planning/plan.json",
            "type": "object",
            "required": ["steps"],
            "additionalProperties": false,
            "properties": {
                "objective": {"type": "string"},
                "success_criteria": {"type": "string"},
                "steps": {"type": "array", "items": {"$ref": "#/$defs/step"}},
                "orphan_steps": {"type": "array", "items": {"$ref": "#/$defs/step"}}
            }
        }),
        defs,
    )
}

/// The schema of `step_config.json` (object format; the legacy root-level array is read but
/// not offered to editors).
pub fn step_config_schema() -> Value {
    let enum_or_empty = |values: &[&str]| {
        let mut v: Vec<&str> = values.to_vec();
        v.push("");
        json!({"enum": v})
    };
    let bool_keys = [
        "use_code_execution_mode",
        "disable_parallel_tool_execution",
        "disable_validation",
        "enable_prerequisite_detection",
        "enable_context_offloading",
        "lock_code",
        "lock_learnings",
        "disable_learning",
    ];
    let list_keys = [
        "selected_servers",
        "selected_tools",
        "enabled_custom_tools",
        "enabled_custom_tool_categories",
        "additional_read_paths",
        "enabled_skills",
        "allowed_hosts",
    ];
    let string_keys = [
        "execution_llm_reason",
        "execution_tier_reason",
        "learning_objective",
        "knowledgebase_contribution",
        "lock_learnings_reason",
    ];
    let mut props = serde_json::Map::new();
    for k in bool_keys {
        props.insert(k.into(), json!({"type": "boolean"}));
    }
    for k in list_keys {
        props.insert(k.into(), strings());
    }
    for k in string_keys {
        props.insert(k.into(), json!({"type": "string"}));
    }
    for k in super::step_config::BOOKKEEPING_KEYS {
        props.insert(
            (*k).into(),
            json!({"description": "Bookkeeping of the original: kept, no runtime effect."}),
        );
    }
    props.insert(
        "execution_max_turns".into(),
        json!({"type": "integer", "deprecated": true,
        "description": "Retired: ignored on load and dropped on save."}),
    );
    props.insert(
        "declared_execution_mode".into(),
        enum_or_empty(&["scripted", "agentic"]),
    );
    props.insert(
        "learnings_access".into(),
        enum_or_empty(&["read", "read-write", "none"]),
    );
    props.insert(
        "learning_detail_level".into(),
        enum_or_empty(&["exact", "general", "none"]),
    );
    props.insert(
        "knowledgebase_access".into(),
        enum_or_empty(&["read", "write", "read-write", "none"]),
    );
    props.insert(
        "llm_validation_mode".into(),
        enum_or_empty(&["skip", "auto", "always"]),
    );
    props.insert(
        "execution_tier".into(),
        enum_or_empty(&["high", "medium", "low"]),
    );
    props.insert("execution_llm".into(), json!({
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "provider": {"type": "string"}, "model_id": {"type": "string"}, "options": {"type": "object"},
            "published_llm_id": {"type": "string"},
            "fallbacks": {"type": "array", "items": llm_ref()}
        }
    }));
    props.insert(
        "prerequisite_rules".into(),
        json!({"type": "array", "items": {
        "type": "object", "required": ["depends_on_step"], "additionalProperties": false,
        "properties": {"depends_on_step": {"type": "string"}, "description": {"type": "string"}}}}),
    );
    with_defs(
        json!({
            "$schema": DRAFT,
            "title": "Trellis step_config.json",
            "type": "object",
            "required": ["steps"],
            "additionalProperties": false,
            "properties": {"steps": {"type": "array", "items": {
                "type": "object",
                "required": ["id"],
                "additionalProperties": false,
                "properties": {
                    "id": {"type": "string", "minLength": 1},
                    "title": {"type": "string"},
                    "agent_configs": {"type": "object", "additionalProperties": false, "properties": props},
                    "validation_schema": {"$ref": "#/$defs/validationSchema"}
                }
            }}}
        }),
        json!({}),
    )
}

/// One schedule of `schedules[]` (the builder's schedule tools take it).
pub fn schedule_schema() -> Value {
    schedules_schema()["items"].clone()
}

/// `schedules[]`: when the workflow runs itself (the original's shape).
fn schedules_schema() -> Value {
    let minutes = json!({"type": "integer", "minimum": 0});
    let clock = json!({"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$", "description": "A local time, HH:MM."});
    let strings = json!({"type": "array", "items": {"type": "string"}});
    json!({
        "type": "array",
        "description": "Schedules `trellis serve` fires: each firing is a builder session in run mode that sends `messages` one by one (default: run the full workflow).",
        "maxItems": crate::manifest::schedules::MAX_SCHEDULES,
        "items": {
            "type": "object",
            "required": ["id"],
            "additionalProperties": false,
            "properties": {
                "id": {"type": "string"},
                "name": {"type": "string"},
                "description": {"type": "string"},
                "schedule_type": {"enum": ["cron", "calendar", ""], "description": "cron (the default) or calendar."},
                "cron_expression": {"type": "string", "description": "Five fields: minute hour day month weekday, in `timezone`."},
                "timezone": {"type": "string", "description": "An IANA time zone (UTC when absent)."},
                "enabled": {"type": "boolean", "description": "Whether it fires by itself (false when absent)."},
                "trigger_payload": {},
                "group_names": strings.clone(),
                "route_selections": {"type": "object", "additionalProperties": {"type": "string"}},
                "mode": {"enum": ["workshop", "workflow", ""]},
                "messages": strings.clone(),
                "collision_policy": {"enum": ["skip", "queue_latest", "retry", "coalesce", ""]},
                "max_start_delay_minutes": minutes.clone(),
                "after_schedule_id": {"type": "string"},
                "after_terminal_status": {"enum": ["completed", "any_terminal", ""]},
                "after_delay_minutes": minutes,
                "dependency_deadline": clock.clone(),
                "calendar_items": {"type": "array", "maxItems": crate::manifest::schedules::MAX_CALENDAR_ITEMS, "items": {
                    "type": "object", "required": ["id", "date", "time"], "additionalProperties": false,
                    "properties": {
                        "id": {"type": "string"},
                        "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                        "time": clock,
                        "description": {"type": "string"},
                        "trigger_payload": {},
                        "messages": strings
                    }
                }},
                "created_at": {"type": "string"},
                "updated_at": {"type": "string"},
                "group_ids": {"description": "Read, no effect in Trellis."},
                "resume_previous": {"description": "Read, no effect in Trellis."},
                "pulse_review_only": {"description": "Read, no effect in Trellis."},
                "execution_mode": {"description": "Read, no effect in Trellis."},
                "direct_messages_reason": {"description": "Read, no effect in Trellis."},
                "query": {"description": "Read, no effect in Trellis."},
                "workshop_mode": {"description": "Read, no effect in Trellis."}
            }
        }
    })
}

/// The original's bookkeeping keys of `workflow.json`, kept as written.
fn original_workflow_keys() -> Value {
    json!({
            "schema_version": {"type": "integer"},
            "id": {"type": "string"},
            "label": {"type": "string"},
            "created_at": {"type": "string"},
            "updated_at": {"type": "string"},
            "capabilities": {"type": "object", "description": "The original's workflow-wide settings; Trellis reads llm_config."},
            "execution_defaults": {"type": "object", "description": "The original's execution defaults; Trellis reads workshop_mode."},
            "schedules": schedules_schema(),
            "oversight_mode": {"type": "string"},
            "pace_on_low_quota": {"type": "boolean"},
            "pace_threshold_percent": {"type": "integer"},
            "pulse": {"type": "object"},
            "backup": {"type": "object"},
            "publish": {"type": "object"},
            "ownership": {"type": "object"},
            "objective": {"type": "string"},
            "success_criteria": {"type": "string"},
            "decision_log_mutability": {"type": "string"}
    })
}

/// The schema of `workflow.json` (see [`super::manifest`]).
pub fn workflow_schema() -> Value {
    let mut schema = json!({
        "$schema": DRAFT,
        "title": "Trellis workflow.json",
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$",
                        "description": "The workflow contract the files follow (the original's key)."},
            "contract_version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$",
                                 "description": "Trellis's earlier name of version; read, never written."},
            "run_retention_count": {"type": "integer", "minimum": 1, "maximum": 50,
                                    "description": "How many archived runs a full run keeps."},
            "variables": {
                "type": "object",
                "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                "additionalProperties": {"oneOf": [
                    {"type": "string"},
                    {"type": "object", "additionalProperties": false,
                     "properties": {"value": {"type": "string"}, "description": {"type": "string"}}}
                ]}
            },
            "groups": {"type": "array", "items": {
                "type": "object", "required": ["id"], "additionalProperties": false,
                "properties": {"id": {"type": "string", "minLength": 1}, "name": {"type": "string"},
                               "variables": {"type": "object", "additionalProperties": {"type": "string"}}}
            }},
            "llm": llm_ref(),
            "builder_llm": llm_ref(),
            "pricing": {"type": "object", "description": "USD per million tokens, by model id or provider:model.",
                        "additionalProperties": {
                "type": "object", "additionalProperties": false,
                "properties": {"input": {"type": "number", "minimum": 0},
                               "output": {"type": "number", "minimum": 0}}
            }},
            "tiers": {"type": "object", "propertyNames": {"enum": ["high", "medium", "low"]},
                      "additionalProperties": llm_ref()},
            "providers": {"type": "object", "additionalProperties": {
                "type": "object", "additionalProperties": false,
                "properties": {"base_url": {"type": "string"},
                               "api_key_env": {"type": "string", "description": "The name of the environment variable holding the key."}}
            }}
        }
    });
    if let (Some(props), Value::Object(original)) = (
        schema.get_mut("properties").and_then(Value::as_object_mut),
        original_workflow_keys(),
    ) {
        props.extend(original);
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_schema_exists_and_resolves_its_refs() {
        for name in SCHEMA_NAMES {
            let s = schema_for(name).unwrap();
            assert_eq!(s["$schema"], DRAFT, "{name}");
            // Every local $ref points at a definition that exists.
            fn refs(v: &Value, out: &mut Vec<String>) {
                match v {
                    Value::Object(m) => {
                        if let Some(Value::String(r)) = m.get("$ref") {
                            out.push(r.clone());
                        }
                        m.values().for_each(|x| refs(x, out));
                    }
                    Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
                    _ => {}
                }
            }
            let mut found = Vec::new();
            refs(&s, &mut found);
            for r in found {
                let key = r.trim_start_matches("#/$defs/");
                assert!(s["$defs"].get(key).is_some(), "{name}: dangling {r}");
            }
        }
        assert!(schema_for("nope").is_none());
    }
}
