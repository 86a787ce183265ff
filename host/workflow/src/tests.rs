//! Workspace-level tests: the corpus of malformed inputs with the exact diagnostics each must
//! produce, the seed documents' examples and loading precedence; no-panic property tests in
//! `properties`.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::*;

mod properties;

pub(crate) use properties::arb_json;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/workflow")
}

fn fixture(rel: &str) -> String {
    std::fs::read_to_string(fixtures().join(rel)).unwrap()
}

/// Every diagnostic (errors and warnings) a file of `kind` produces.
fn check(kind: &str, text: &str) -> Vec<String> {
    let lines = |r: Result<Diagnostics, Diagnostics>| match r {
        Ok(d) | Err(d) => d.lines(),
    };
    match kind {
        "P" => lines(plan::parse_plan(text, PLAN_FILE).map(|(_, w)| w)),
        "C" => lines(step_config::parse_step_config(text, STEP_CONFIG_FILE).map(|(_, w)| w)),
        "W" => lines(manifest::parse_manifest(text, WORKFLOW_FILE).map(|(_, w)| w)),
        "S" => {
            lines(crate::validation::schema::parse_schema_text(text, "schema.json").map(|(_, w)| w))
        }
        other => panic!("unknown kind {other}"),
    }
}

/// Malformed inputs and the exact diagnostics each must produce, all of them, in order.
/// Kinds: P = plan.json, C = step_config.json, W = workflow.json, S = a validation schema.
const CORPUS: &[(&str, &str, &[&str])] = &[
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "title": "A", "description": "d", "items": [{"id": "f", "type": "foreach", "source_sq": "SELECT 1", "message": "m"}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].items[0].source_sql (step "a"): missing: expected a string (read-only SQL against db/db.sqlite)"#,
            r#"planning/plan.json: steps[0].items[0] (step "a"): unknown key "source_sq" (did you mean "source_sql"?)"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "title": "A", "description": "d", "items": []}]}"#,
        &[
            r#"planning/plan.json: steps[0].items (step "a"): must not be empty: a message sequence needs at least one item"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "title": "A", "description": "d"}]}"#,
        &[
            r#"planning/plan.json: steps[0].items (step "a"): missing: expected a non-empty array of items"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"type": "message_sequence", "title": "A", "description": "d", "items": [{"id": "m", "type": "user_message", "message": "x"}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].id: missing: expected a string (the step id, unique in the plan)"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "items": [{"id": "m", "type": "user_message", "message": "x"}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].title (step "a"): missing: expected a string (the step title)"#,
            r#"planning/plan.json: steps[0].description (step "a"): missing: expected a string (the step charter shared by every turn)"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "title": "A", "description": "d", "items": [{"id": "m", "type": "user_message", "message": "x"}, {"id": "m", "type": "user_message", "message": "y"}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].items[1].id (step "a"): duplicate item id "m" in this step"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "title": "A", "description": "d", "items": [{"id": "m", "type": "user_message"}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].items[0].message (step "a"): missing: expected a string (the user message)"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "title": "A", "description": "d", "items": [{"id": "f", "type": "foreach"}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].items[0].source_sql (step "a"): missing: expected a string (read-only SQL against db/db.sqlite)"#,
            r#"planning/plan.json: steps[0].items[0].message (step "a"): missing: expected a string (the message template rendered per row)"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "title": "A", "description": "d", "items": [{"id": "g", "type": "prevalidation"}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].items[0] (step "a"): a prevalidation item needs a schema: add "validation_schema" to the item or to its step"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "sequence", "title": "A", "description": "d"}]}"#,
        &[
            r#"planning/plan.json: steps[0].type (step "a"): expected one of "message_sequence", "regular", "routing", "human_input", "todo_task", found "sequence""#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "title": "A", "description": "d", "items": [{"id": "m", "type": "usr_message", "message": "x"}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].items[0].type (step "a"): expected one of "user_message", "foreach", "prevalidation", found "usr_message" (did you mean "user_message"?)"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "title": "A", "description": "d", "items": [{"id": "c", "type": "code", "script_path": "s.py"}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].items[0].type (step "a"): legacy "code" item "c" is not supported since contract v1.0.10: run the migration migrate_message_sequence_code_items (`trellis migrate WORKSPACE`) to turn it into a scripted regular step"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "title": "A", "description": "d", "items": [{"id": "m", "type": "user_message", "message": "x", "write_access": {"paths": ["a.json"], "db": true}}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].items[0].write_access.paths (step "a"): write access is per folder, never per file: remove it and use {"db", "knowledgebase", "learnings"} booleans"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "title": "A", "description": "d", "items": [{"id": "m", "type": "user_message", "message": "x", "write_access": {"db": "yes", "kb": true}}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].items[0].write_access.db (step "a"): expected a boolean, found a string"#,
            r#"planning/plan.json: steps[0].items[0].write_access (step "a"): unknown key "kb" (did you mean "db"?)"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "regular", "title": "A", "description": "d"}, {"id": "a", "type": "regular", "title": "B", "description": "d"}]}"#,
        &[r#"planning/plan.json: steps[1].id (step "a"): duplicate step id "a""#],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "regular", "title": "A", "description": "d", "next_step_id": "summarise"}, {"id": "summarize", "type": "regular"}]}"#,
        &[
            r#"planning/plan.json: steps[0].next_step_id (step "a"): names no step of the plan: "summarise" (did you mean "summarize"?); use a step id or "end""#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "regular", "title": "A", "description": "d", "items": [{"id": "m", "type": "user_message", "message": "x"}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].items (step "a"): applies to message_sequence steps, not to a regular step"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "regular", "titel": "A"}]}"#,
        &[
            r#"planning/plan.json: steps[0] (step "a"): unknown key "titel" (did you mean "title"?)"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "r", "type": "routing", "routes": [{"route_id": "x", "next_step_id": "end"}], "default_route_id": "y"}]}"#,
        &[
            r#"planning/plan.json: steps[0].default_route_id (step "r"): names no route of this step: "y" (did you mean "x"?)"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "r", "type": "routing"}]}"#,
        &[
            r#"planning/plan.json: steps[0].routes (step "r"): missing: expected an array of routes {route_id, route_name, condition, next_step_id}"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "h", "type": "human_input", "question": "q", "response_type": "choice"}]}"#,
        &[
            r#"planning/plan.json: steps[0].response_type (step "h"): expected one of "text", "yesno", "multiple_choice", found "choice""#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "h", "type": "human_input", "question": "q", "response_type": "multiple_choice"}]}"#,
        &[
            r#"planning/plan.json: steps[0].options (step "h"): a multiple_choice question needs a non-empty array of options"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "title": "A", "description": "d", "items": [{"id": "f", "type": "foreach", "source_sql": "SELECT 1", "message": "m", "max_iterations": 0}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].items[0].max_iterations (step "a"): must be greater than 0 (leave it out for no cap)"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "title": "A", "description": "d", "items": [{"id": "f", "type": "foreach", "source_sql": "SELECT 1", "message": "m", "max_iterations": -5}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].items[0].max_iterations (step "a"): expected a non-negative integer, found -5"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "title": "A", "description": "d", "items": [{"id": "m", "type": "user_message", "message": "x", "kind": "learnings"}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].items[0].kind (step "a"): expected one of "execution", "learning", "knowledgebase", "db", found "learnings" (did you mean "learning"?)"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "title": "A", "description": "d", "items": [{"id": "m", "type": "user_message", "message": "x"}], "predefined_routes": [{"route_id": "x", "sub_agent_step": {"id": "y", "type": "message_sequence", "title": "Y", "description": "d", "items": [{"id": "v", "type": "user_message", "message": "m"}]}}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].predefined_routes[0].route_id (step "a"): must equal sub_agent_step.id ("y"), found "x""#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "regular", "context_dependencies": ["../secret", "/etc/passwd"], "context_output": 5}]}"#,
        &[
            r#"planning/plan.json: steps[0].context_dependencies[0] (step "a"): must stay inside the workspace: ".." is not allowed, found "../secret""#,
            r#"planning/plan.json: steps[0].context_dependencies[1] (step "a"): must be a relative path inside the workspace, found the absolute path "/etc/passwd""#,
            r#"planning/plan.json: steps[0].context_output (step "a"): expected a file name or an array of file names, found a number"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "h", "type": "human_input", "title": "H", "description": "d", "question": "q", "variable_name": "v", "context_output": "."}, {"id": "k", "type": "human_input", "title": "K", "description": "d", "question": "q", "variable_name": "w", "context_output": ["x/../a.json", "b.json"]}]}"#,
        &[
            r#"planning/plan.json: steps[0].context_output (step "h"): the answer file "." does not name a file in the step's output folder; expected a name such as "answer.json""#,
            r#"planning/plan.json: steps[1].context_output[0] (step "k"): the answer file "x/../a.json" does not name a file in the step's output folder; expected a name such as "answer.json""#,
        ],
    ),
    (
        "P",
        r#"{"steps": "all of them"}"#,
        &[r#"planning/plan.json: steps: expected an array, found a string"#],
    ),
    (
        "P",
        r#"{"objective": "o"}"#,
        &[r#"planning/plan.json: steps: missing: expected an array of steps"#],
    ),
    (
        "P",
        r#"[1, 2]"#,
        &[r#"planning/plan.json: expected a plan (an object), found an array"#],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "regular",}]}"#,
        &[r#"planning/plan.json: invalid JSON at line 1, column 42: trailing comma"#],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "regular", "validation_schema": {"files": [{"file_name": "r.json", "json_checks": [{"path": "$.x", "value_type": "list"}]}]}}]}"#,
        &[
            r#"planning/plan.json: steps[0].validation_schema.files[0].json_checks[0].value_type (step "a"): expected one of "string", "number", "boolean", "array", "object", found "list""#,
        ],
    ),
    (
        "P",
        r#"{"steps": [{"id": "a", "type": "message_sequence", "title": "A", "description": "d", "items": [{"id": "m", "type": "user_message", "message": "x", "source_sql": "SELECT 1"}]}]}"#,
        &[
            r#"planning/plan.json: steps[0].items[0].source_sql (step "a"): applies to foreach items, not to a user_message item"#,
        ],
    ),
    (
        "P",
        r#"{"steps": [], "orphan_steps": [{"id": "u", "type": "message_sequence", "title": "U", "description": "d", "items": [{"id": "c", "type": "code"}]}]}"#,
        &[
            r#"planning/plan.json: orphan_steps[0].items[0].type (step "u"): legacy "code" item "c" is not supported since contract v1.0.10: migrate_message_sequence_code_items cannot convert code inside an orphan step: move the script to a standalone regular step with declared_execution_mode "scripted""#,
        ],
    ),
    (
        "C",
        r#"{"steps": [{"title": "no id"}]}"#,
        &[
            r#"planning/step_config.json: steps[0].id: missing: expected a string (the id of the plan step)"#,
        ],
    ),
    (
        "C",
        r#"{"steps": [{"id": "a"}, {"id": "a"}]}"#,
        &[
            r#"planning/step_config.json: steps[1].id (step "a"): duplicate step config id "a": each step has one entry"#,
        ],
    ),
    (
        "C",
        r#"{"steps": [{"id": "a", "agent_configs": {"selected_tool": ["x:y"]}}]}"#,
        &[
            r#"planning/step_config.json: steps[0].agent_configs (step "a"): unknown key "selected_tool" (did you mean "selected_tools"?)"#,
        ],
    ),
    (
        "C",
        r#"{"steps": [{"id": "a", "agent_configs": {"learnings_access": "rw", "knowledgebase_access": "readwrite"}}]}"#,
        &[
            r#"planning/step_config.json: steps[0].agent_configs.learnings_access (step "a"): expected one of "read", "read-write", "none", found "rw""#,
            r#"planning/step_config.json: steps[0].agent_configs.knowledgebase_access (step "a"): expected one of "read", "write", "read-write", "none", found "readwrite" (did you mean "read-write"?)"#,
        ],
    ),
    (
        "C",
        r#"{"steps": [{"id": "a", "agent_configs": {"execution_llm": {"provider": "openai"}}}]}"#,
        &[
            r#"planning/step_config.json: steps[0].agent_configs.execution_llm.model_id (step "a"): missing: expected a string (the provider's model id)"#,
        ],
    ),
    (
        "C",
        r#"{"steps": [{"id": "a", "agent_configs": {"selected_tools": ["server_tool"], "enabled_custom_tools": ["workspace_tools"]}}]}"#,
        &[
            r#"planning/step_config.json: steps[0].agent_configs.selected_tools[0] (step "a"): expected "server:tool" or "server:*", found "server_tool""#,
            r#"planning/step_config.json: steps[0].agent_configs.enabled_custom_tools[0] (step "a"): expected "category:tool" or "category:*", found "workspace_tools""#,
        ],
    ),
    (
        "C",
        r#"{"steps": [{"id": "a", "agent_configs": {"use_code_execution_mode": "true", "prerequisite_rules": [{"description": "x"}]}}]}"#,
        &[
            r#"planning/step_config.json: steps[0].agent_configs.use_code_execution_mode (step "a"): expected a boolean, found a string"#,
            r#"planning/step_config.json: steps[0].agent_configs.prerequisite_rules[0].depends_on_step (step "a"): missing: expected a string (the step the run goes back to)"#,
        ],
    ),
    (
        "C",
        r#"{"step": []}"#,
        &[
            r#"planning/step_config.json: unknown key "step" (did you mean "steps"?)"#,
            r#"planning/step_config.json: steps: missing: expected an array of step configs (it may be empty)"#,
        ],
    ),
    (
        "C",
        r#""steps""#,
        &[r#"planning/step_config.json: expected {"steps": [...]} (an object), found a string"#],
    ),
    (
        "C",
        r#"{"steps": [{"id": "a", "agent_configs": {"execution_llm": {"provider": "openai", "model_id": "gpt-4o", "fallbacks": [{"provider": "x"}]}, "declared_execution_mode": "script"}}]}"#,
        &[
            r#"planning/step_config.json: steps[0].agent_configs.execution_llm.fallbacks[0].model_id (step "a"): missing: expected a string (the provider's model id)"#,
            r#"planning/step_config.json: steps[0].agent_configs.declared_execution_mode (step "a"): expected one of "scripted", "agentic", found "script" (did you mean "scripted"?)"#,
        ],
    ),
    (
        "W",
        r#"{"version": "1.0", "variables": {"my-var": "x"}}"#,
        &[
            r#"workflow.json: version: expected a version such as "1.0.11", found "1.0""#,
            r#"workflow.json: variables.my-var: invalid variable name "my-var": use 1 to 128 letters, digits and _ (scripts see it as VAR_<NAME>)"#,
        ],
    ),
    (
        "W",
        r#"{"groups": [{"id": "g", "variables": {"REGOIN": "x"}}], "variables": {"REGION": "eu"}}"#,
        &[
            r#"workflow.json: groups[0].variables.REGOIN: sets "REGOIN" which is not declared in "variables" (did you mean "REGION"?)"#,
        ],
    ),
    (
        "W",
        r#"{"providers": {"openai": {"api_key": "sk-123"}}, "tiers": {"hihg": {"provider": "p", "model_id": "m"}}}"#,
        &[
            r#"workflow.json: tiers.hihg: unknown tier "hihg": expected "high", "medium" or "low" (did you mean "high"?)"#,
            r#"workflow.json: providers.openai.api_key: keys are never stored in workflow.json: remove it, put the key in the environment variable OPENAI_API_KEY and name it here: "api_key_env": "OPENAI_API_KEY""#,
        ],
    ),
    (
        "C",
        r#"{"steps": [{"id": "a", "agent_configs": {"execution_llm": {"provider": "replay", "model_id": "../x", "fallbacks": [{"provider": "replay", "model_id": "/etc/passwd"}]}}}]}"#,
        &[
            r#"planning/step_config.json: steps[0].agent_configs.execution_llm.model_id (step "a"): replay model id "../x" is not one plain name (letters, digits, '.', '_', '-'): it names the cassette cassettes/<model_id>.json of the workspace"#,
            r#"planning/step_config.json: steps[0].agent_configs.execution_llm.fallbacks[0].model_id (step "a"): replay model id "/etc/passwd" is not one plain name (letters, digits, '.', '_', '-'): it names the cassette cassettes/<model_id>.json of the workspace"#,
        ],
    ),
    (
        "W",
        r#"{"tiers": {"low": {"provider": "replay", "model_id": ".."}}}"#,
        &[
            r#"workflow.json: tiers.low.model_id: replay model id ".." is not one plain name (letters, digits, '.', '_', '-'): it names the cassette cassettes/<model_id>.json of the workspace"#,
        ],
    ),
    (
        "W",
        r#"{"llm": {"provider": "openai"}, "contract": "1.0.11"}"#,
        &[
            r#"workflow.json: llm.model_id: missing: expected a string (the provider's model id)"#,
            r#"workflow.json: unknown key "contract" (did you mean "contract_version"?)"#,
        ],
    ),
    (
        "S",
        r#"{"files": [{"file_name": "r.json", "json_checks": [{"path": "$.a", "consistency_check": {"type": "same", "compare_with_path": "b"}}]}]}"#,
        &[
            r#"schema.json: files[0].json_checks[0].consistency_check.type: expected one of "equals", "greater_than", "less_than", "array_length", "in_array", found "same""#,
            r#"schema.json: files[0].json_checks[0].consistency_check.compare_with_path: expected a JSONPath starting with "$" (RFC 9535), found "b" (did you mean "$.b"?)"#,
        ],
    ),
    (
        "S",
        r#"{"files": [{"file_name": "r.json", "json_checks": [{"path": "$[", "min_length": 3, "max_length": 1}]}]}"#,
        &[
            r#"schema.json: files[0].json_checks[0].path: invalid JSONPath "$[": at position 1, parser error"#,
            r#"schema.json: files[0].json_checks[0]: min_length (3) is greater than max_length (1)"#,
        ],
    ),
    (
        "S",
        r#"{"db": [{"name": "x", "query": "SELECT 1", "min_rows": "1"}]}"#,
        &[
            r#"schema.json: db[0].sql: missing: expected a string (one read-only SQL statement)"#,
            r#"schema.json: db[0].min_rows: expected a non-negative integer, found "1""#,
            r#"schema.json: db[0]: unknown key "query""#,
        ],
    ),
    (
        "S",
        r#"{"files": [{"name": "r.json", "must_exist": 1}]}"#,
        &[
            r#"schema.json: files[0].file_name: missing: expected a string (the file to check)"#,
            r#"schema.json: files[0].must_exist: expected a boolean, found a number"#,
            r#"schema.json: files[0]: unknown key "name""#,
        ],
    ),
];

#[test]
fn malformed_corpus_produces_exact_diagnostics() {
    assert!(CORPUS.len() >= 40, "the corpus must keep at least 40 cases");
    let mut mismatches = Vec::new();
    for (i, (kind, input, expected)) in CORPUS.iter().enumerate() {
        let got = check(kind, input);
        if got != *expected {
            mismatches.push(format!(
                "case {i} ({kind}) {input}\n  expected: {expected:#?}\n  got: {got:#?}"
            ));
        }
        // Every case is malformed: at least one error, never a silent pass.
        assert!(!expected.is_empty(), "case {i} expects nothing");
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn seed_step_config_examples_load_and_round_trip() {
    for name in [
        "seeds/000_step_config_object_format.json",
        "seeds/000_step_config_quick_reference.json",
    ] {
        let text = fixture(name);
        let (file, warnings) = step_config::parse_step_config(&text, STEP_CONFIG_FILE)
            .unwrap_or_else(|d| panic!("{name}: {d}"));
        // The original's seeds name its browser category: the one warning expected.
        assert!(
            warnings
                .iter()
                .all(|w| w.message.contains("tool category \"workspace_browser\"")),
            "{name}: {warnings}"
        );
        let back = serde_json::to_value(&file).unwrap();
        assert_eq!(
            back,
            serde_json::from_str::<Value>(&text).unwrap(),
            "{name}"
        );
    }
    let (file, _) = step_config::parse_step_config(
        &fixture("seeds/000_step_config_object_format.json"),
        STEP_CONFIG_FILE,
    )
    .unwrap();
    let c = file
        .get("step-id-here")
        .unwrap()
        .agent_configs
        .as_ref()
        .unwrap();
    assert_eq!(
        c.effective_learnings_access(),
        step_config::LearningsAccess::ReadWrite
    );
    assert_eq!(
        c.prerequisite_rules.as_ref().unwrap()[0].depends_on_step,
        "step-0"
    );
}

#[test]
fn seed_message_sequence_examples_load_with_doc_era_keys() {
    let step: Value =
        serde_json::from_str(&fixture("seeds/003_message_sequence_step.json")).unwrap();
    let plan = json!({"steps": [step.clone()]});
    let (parsed, warnings) =
        plan::parse_plan_value(&plan, PLAN_FILE).unwrap_or_else(|d| panic!("{d}"));
    assert!(warnings.is_empty(), "{warnings}");
    let s = &parsed.steps[0];
    let schema = s.validation_schema.as_ref().unwrap();
    assert!(
        schema
            .files
            .iter()
            .all(|f| f.must_exist() && f.needs_json())
    );
    assert_eq!(s.predefined_routes()[0].sub_agent_step.id, "source-checker");
    assert_eq!(serde_json::to_value(&parsed).unwrap(), plan);

    let foreach: Value = serde_json::from_str(&fixture("seeds/003_foreach_item.json")).unwrap();
    let mut item =
        json!({"id": "tighten", "type": "user_message", "message": "Tighten the summary."});
    let access: Value =
        serde_json::from_str(&fixture("seeds/003_write_access_override.json")).unwrap();
    item["write_access"] = access["write_access"].clone();
    let plan = json!({"steps": [{"id": "findings", "type": "message_sequence", "title": "Findings",
        "description": "Review open findings.", "items": [foreach, item]}]});
    let (parsed, warnings) =
        plan::parse_plan_value(&plan, PLAN_FILE).unwrap_or_else(|d| panic!("{d}"));
    assert!(warnings.is_empty(), "{warnings}");
    assert_eq!(serde_json::to_value(&parsed).unwrap(), plan);
    let plan::StepKind::MessageSequence(seq) = &parsed.steps[0].kind else {
        panic!()
    };
    assert!(matches!(
        &seq.items[0].body,
        plan::ItemBody::Foreach {
            max_iterations: Some(50),
            ..
        }
    ));
    assert_eq!(seq.items[1].body.write_access().unwrap().db, Some(true));
}

#[test]
fn the_example_workspace_loads_clean() {
    let root = fixtures().join("workspace");
    assert_eq!(validate_workspace(&root), Diagnostics::new());
    let ws = Workspace::open(&root).unwrap_or_else(|d| panic!("{d}"));
    assert!(ws.warnings.is_empty());
    assert!(
        ws.agent_configs("fetch-and-normalize-authoritative-data")
            .is_scripted()
    );
    assert_eq!(
        ws.manifest.resolved_variables(Some("us"))["REGION"],
        "us-east-1"
    );
    assert_eq!(ws.plan.orphan_steps[0].id, "refresh-sources");
    assert_eq!(
        ws.step_output_dir("generate"),
        root.join("runs/iteration-0/execution/generate")
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

#[test]
fn run_specific_config_wins_and_problems_of_all_files_are_reported_together() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    copy_dir(&fixtures().join("workspace"), root);
    let run_cfg = root.join("runs/iteration-0/planning/step_config.json");
    crate::test_files::write_json_atomic(
        &run_cfg,
        &json!([{"id": "generate", "agent_configs": {"execution_max_turns": 9, "lock_code": true}}, {"id": "gone"}]),
    )
    .unwrap();
    let ws = Workspace::open_run(root, Some("iteration-0")).unwrap();
    assert_eq!(
        ws.step_config_file,
        PathBuf::from("runs/iteration-0/planning/step_config.json")
    );
    assert_eq!(
        ws.warnings.lines(),
        [
            "runs/iteration-0/planning/step_config.json: legacy format: a root-level array is read, but the file should be {\"steps\": [...]} (it is written that way on the next save)",
            "runs/iteration-0/planning/step_config.json: [0].agent_configs.execution_max_turns (step \"generate\"): retired: ignored (one runtime turn limit applies) and dropped when the file is saved",
            "runs/iteration-0/planning/step_config.json: [1].id (step \"gone\"): orphan config: \"gone\" matches no step of the plan",
        ]
    );
    // Saving writes the object format and drops the retired key.
    ws.save_step_configs().unwrap();
    assert_eq!(
        std::fs::read_to_string(&run_cfg).unwrap(),
        "{\n  \"steps\": [\n    {\n      \"id\": \"generate\",\n      \"agent_configs\": {\n        \"lock_code\": true\n      }\n    },\n    {\n      \"id\": \"gone\"\n    }\n  ]\n}\n"
    );
    // Without the run folder the default config is used.
    assert_eq!(
        Workspace::open(root).unwrap().step_config_file,
        PathBuf::from(STEP_CONFIG_FILE)
    );

    // Errors in several files come back together.
    std::fs::write(root.join(WORKFLOW_FILE), r#"{"version": "one"}"#).unwrap();
    std::fs::write(root.join(STEP_CONFIG_FILE), r#"{"steps": [{"id": ""}]}"#).unwrap();
    let errors = Workspace::open(root).unwrap_err();
    assert_eq!(
        errors.lines(),
        [
            "workflow.json: version: expected a version such as \"1.0.11\", found \"one\"",
            "planning/step_config.json: steps[0].id: must not be empty: expected the id of the plan step",
        ]
    );
    std::fs::remove_file(root.join(PLAN_FILE)).unwrap();
    assert!(validate_workspace(root).lines().contains(
        &"planning/plan.json: missing: a workspace needs planning/plan.json".to_string()
    ));
}

#[test]
fn plan_and_config_are_checked_together() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    crate::test_files::write_json_atomic(
        &root.join(PLAN_FILE),
        &json!({"steps": [
        {"id": "a", "type": "regular", "title": "A", "description": "d"},
        {"id": "s", "type": "message_sequence", "title": "S", "description": "d",
         "items": [{"id": "m", "type": "user_message", "message": "x"}]}]}),
    )
    .unwrap();
    crate::test_files::write_json_atomic(
        &root.join(STEP_CONFIG_FILE),
        &json!({"steps": [
        {"id": "a", "agent_configs": {"declared_execution_mode": "scripted",
            "prerequisite_rules": [{"depends_on_step": "ss"}]}},
        {"id": "s", "agent_configs": {"declared_execution_mode": "scripted"}}]}),
    )
    .unwrap();
    crate::test_files::write_json_atomic(&root.join(WORKFLOW_FILE), &json!({"version": "1.0.9"}))
        .unwrap();
    assert_eq!(
        validate_workspace(root).lines(),
        [
            "planning/step_config.json: steps[0].agent_configs.declared_execution_mode (step \"a\"): scripted step has no script yet: code/a/main.py does not exist",
            "planning/step_config.json: steps[0].agent_configs.prerequisite_rules[0].depends_on_step (step \"a\"): names no step of the plan: \"ss\" (did you mean \"s\"?)",
            "planning/step_config.json: steps[1].agent_configs.declared_execution_mode (step \"s\"): only regular steps can be scripted; \"s\" is a message_sequence step",
            "workflow.json: version: contract 1.0.9 is older than 1.0.11: run `trellis migrate` (migrate_message_sequence_code_items) to upgrade",
        ]
    );
}

#[test]
fn a_candidate_is_checked_as_if_written_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("planning")).unwrap();
    let plan = r#"{"steps": [{"id": "a", "type": "regular", "title": "A", "description": "d"}]}"#;
    std::fs::write(root.join(PLAN_FILE), plan).unwrap();
    assert!(validate_workspace(root).is_empty());

    // A scripted config whose script only the candidate holds: no warning.
    let config =
        br#"{"steps": [{"id": "a", "agent_configs": {"declared_execution_mode": "scripted"}}]}"#;
    let mut candidate = Candidate::new();
    candidate.set(STEP_CONFIG_FILE, config.to_vec());
    candidate.set("code/a/main.py", b"print(1)\n".to_vec());
    assert!(validate_candidate(root, &candidate).is_empty());
    // Without the script the loader says it is missing.
    let mut without = Candidate::new();
    without.set(STEP_CONFIG_FILE, config.to_vec());
    let lines = validate_candidate(root, &without).lines();
    assert!(
        lines[0].contains("code/a/main.py does not exist"),
        "{lines:?}"
    );

    // A broken plan candidate is reported; the disk keeps the valid one.
    let mut broken = Candidate::new();
    broken.set(
        PLAN_FILE,
        br#"{"steps": [{"id": "a", "type": "regular", "next_step_id": "b"}]}"#.to_vec(),
    );
    assert!(validate_candidate(root, &broken).has_errors());
    assert_eq!(std::fs::read_to_string(root.join(PLAN_FILE)).unwrap(), plan);
    assert!(!root.join(STEP_CONFIG_FILE).exists() && !root.join("code").exists());
}
