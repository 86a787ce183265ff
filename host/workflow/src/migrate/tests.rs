//! Tests of the code-item migration: one per conversion shape, one per blocked case. Every
//! blocked test also checks that no file of the workspace changed.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use super::*;

fn snapshot(root: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn workspace(plan: Value, config: Option<Value>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    crate::test_files::write_json_atomic(&root.join(PLAN_FILE), &plan).unwrap();
    if let Some(c) = config {
        crate::test_files::write_json_atomic(&root.join(STEP_CONFIG_FILE), &c).unwrap();
    }
    crate::test_files::write_json_atomic(
        &root.join(WORKFLOW_FILE),
        &json!({"contract_version": "1.0.9", "variables": {"A": "1"}}),
    )
    .unwrap();
    std::fs::create_dir_all(root.join("scripts")).unwrap();
    for name in ["fetch", "normalize", "other"] {
        std::fs::write(
            root.join("scripts").join(format!("{name}.py")),
            format!("print('{name}')\n"),
        )
        .unwrap();
    }
    dir
}

fn code(id: &str, script: &str, outputs: &[&str]) -> Value {
    json!({"id": id, "type": "code", "runtime": "python", "script_path": format!("scripts/{script}.py"),
           "output_files": outputs})
}

fn gate(id: &str, file: &str) -> Value {
    json!({"id": id, "type": "prevalidation",
           "validation_schema": {"files": [{"file_name": file, "must_exist": true}]}})
}

fn seq(id: &str, items: Vec<Value>) -> Value {
    json!({"id": id, "type": "message_sequence", "title": "Seq", "description": "Fetch the data.",
           "context_dependencies": ["knowledgebase/notes/sources.md"], "items": items})
}

fn read(root: &Path, rel: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(root.join(rel)).unwrap()).unwrap()
}

fn blocked(plan: Value, expected: &str) {
    let ws = workspace(plan, Some(json!({"steps": []})));
    let before = snapshot(ws.path());
    let err = migrate_message_sequence_code_items(ws.path()).unwrap_err();
    let MigrationError::Blocked(b) = &err else {
        panic!("expected a blocked migration, got {err}");
    };
    assert!(
        b.reasons.iter().any(|r| r.contains(expected)),
        "no reason contains {expected:?}: {:#?}",
        b.reasons
    );
    assert!(err.to_string().starts_with(BLOCKED_CODE));
    assert_eq!(
        snapshot(ws.path()),
        before,
        "a blocked migration changed files"
    );
}

#[test]
fn converts_a_single_code_item() {
    let plan = json!({"steps": [seq("fetch-seq", vec![code("fetch", "fetch", &["raw.json"])])]});
    let ws = workspace(plan, None);
    let summary = migrate_message_sequence_code_items(ws.path()).unwrap();
    assert_eq!(summary.converted[0].new_step_ids, ["fetch"]);
    assert_eq!(summary.contract_after, "1.0.11");
    let plan = read(ws.path(), PLAN_FILE);
    assert_eq!(
        plan["steps"][0],
        json!({"id": "fetch", "type": "regular", "title": "Fetch",
               "description": "Runs code/fetch/main.py. Migrated by migrate_message_sequence_code_items (contract v1.0.10) from code item \"fetch\" of message sequence \"fetch-seq\".\n\nSequence contract: Fetch the data.",
               "context_dependencies": ["knowledgebase/notes/sources.md"],
               "context_output": ["raw.json"]})
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("code/fetch/main.py")).unwrap(),
        "print('fetch')\n"
    );
    let config = read(ws.path(), STEP_CONFIG_FILE);
    assert_eq!(
        config,
        json!({"steps": [{"id": "fetch", "title": "Fetch", "agent_configs": {"declared_execution_mode": "scripted"}}]})
    );
    assert_eq!(
        read(ws.path(), WORKFLOW_FILE),
        json!({"version": "1.0.11", "variables": {"A": "1"}})
    );
    // The result loads as a workspace without errors.
    crate::Workspace::open(ws.path()).unwrap();
}

#[test]
fn converts_code_with_gates_chaining_outputs_and_merging_the_final_schema() {
    let mut s = seq(
        "pipeline",
        vec![
            code("fetch", "fetch", &["raw.json"]),
            gate("check-raw", "raw.json"),
            json!({"id": "normalize", "type": "code", "title": "Normalize rows",
                   "script_path": "scripts/normalize.py", "input_files": ["db/seed.csv"],
                   "output_files": ["clean.json"], "write_access": {"db": true}}),
            gate("check-clean", "clean.json"),
        ],
    );
    s["validation_schema"] =
        json!({"files": [{"file_name": "clean.json", "validation_type": "json"}]});
    let plan = json!({"objective": "o", "steps": [
        {"id": "start", "type": "regular", "title": "S", "description": "d", "next_step_id": "pipeline"},
        s,
        {"id": "report", "type": "message_sequence", "title": "R", "description": "d",
         "context_dependencies": ["runs/iteration-0/execution/pipeline/clean.json"],
         "items": [{"id": "m", "type": "user_message", "message": "write it"}]}
    ]});
    let config = json!({"steps": [
        {"id": "pipeline", "title": "Seq", "agent_configs": {"lock_code": true, "review_notes": "kept",
          "execution_llm": {"provider": "openai", "model_id": "gpt-4o"}}},
        {"id": "report", "agent_configs": {"enable_prerequisite_detection": true,
          "prerequisite_rules": [{"depends_on_step": "pipeline", "description": "re-fetch"}]}}
    ]});
    let ws = workspace(plan, Some(config));
    let summary = migrate_message_sequence_code_items(ws.path()).unwrap();
    assert_eq!(summary.converted[0].new_step_ids, ["fetch", "normalize"]);
    assert_eq!(summary.scripts.len(), 2);
    let plan = read(ws.path(), PLAN_FILE);
    let ids: Vec<&str> = plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["start", "fetch", "normalize", "report"]);
    assert_eq!(plan["steps"][0]["next_step_id"], "fetch");
    assert_eq!(
        plan["steps"][1]["validation_schema"],
        json!({"files": [{"file_name": "raw.json", "must_exist": true}]})
    );
    assert_eq!(plan["steps"][2]["title"], "Normalize rows");
    assert_eq!(
        plan["steps"][2]["context_dependencies"],
        json!([
            "knowledgebase/notes/sources.md",
            "runs/iteration-0/execution/fetch/raw.json",
            "db/seed.csv"
        ])
    );
    assert_eq!(
        plan["steps"][2]["validation_schema"],
        json!({"files": [{"file_name": "clean.json", "must_exist": true}, {"file_name": "clean.json", "validation_type": "json"}]})
    );
    assert_eq!(
        plan["steps"][3]["context_dependencies"],
        json!(["runs/iteration-0/execution/normalize/clean.json"])
    );
    let config = read(ws.path(), STEP_CONFIG_FILE);
    assert_eq!(config["steps"][0]["id"], "fetch");
    assert_eq!(config["steps"][0]["agent_configs"]["lock_code"], true);
    assert_eq!(config["steps"][0]["agent_configs"]["review_notes"], "kept");
    assert_eq!(
        config["steps"][1]["agent_configs"]["declared_execution_mode"],
        "scripted"
    );
    assert_eq!(
        config["steps"][2]["agent_configs"]["prerequisite_rules"][0]["depends_on_step"],
        "fetch"
    );
    crate::Workspace::open(ws.path()).unwrap();
}

#[test]
fn converts_several_sequences_and_keeps_other_steps_verbatim() {
    let plan = json!({"steps": [
        seq("a", vec![code("fetch", "fetch", &["a.json"])]),
        {"id": "keep", "type": "regular", "title": "K", "description": "untouched", "context_output": "k.json"},
        seq("b", vec![code("other", "other", &["b.json"]), gate("g", "b.json")]),
    ]});
    let ws = workspace(plan.clone(), None);
    let summary = migrate_message_sequence_code_items(ws.path()).unwrap();
    assert_eq!(summary.converted.len(), 2);
    let new_plan = read(ws.path(), PLAN_FILE);
    assert_eq!(new_plan["steps"][1], plan["steps"][1]);
    assert_eq!(new_plan["steps"][2]["id"], "other");
}

#[test]
fn an_unversioned_workspace_without_code_is_only_stamped() {
    let plan = json!({"steps": [{"id": "a", "type": "regular", "title": "A", "description": "d"}]});
    let ws = workspace(plan.clone(), None);
    std::fs::remove_file(ws.path().join(WORKFLOW_FILE)).unwrap();
    let summary = migrate_message_sequence_code_items(ws.path()).unwrap();
    assert!(summary.converted.is_empty());
    assert_eq!(read(ws.path(), PLAN_FILE), plan);
    assert_eq!(read(ws.path(), WORKFLOW_FILE), json!({"version": "1.0.11"}));
}

#[test]
fn a_current_workspace_is_left_alone() {
    let plan = json!({"steps": [{"id": "a", "type": "regular", "title": "A", "description": "d"}]});
    let ws = workspace(plan, None);
    crate::test_files::write_json_atomic(
        &ws.path().join(WORKFLOW_FILE),
        &json!({"version": "1.0.11"}),
    )
    .unwrap();
    let before = snapshot(ws.path());
    let summary = migrate_message_sequence_code_items(ws.path()).unwrap();
    assert_eq!(summary.contract_after, "1.0.11");
    assert_eq!(snapshot(ws.path()), before);
}

#[test]
fn blocked_code_in_an_orphan_step() {
    let plan = json!({"steps": [], "orphan_steps": [seq("util", vec![code("fetch", "fetch", &["a.json"])])]});
    blocked(
        plan,
        "orphan step \"util\" item \"fetch\": code items in an orphan step",
    );
}

#[test]
fn blocked_code_nested_in_a_route() {
    let mut s = seq(
        "parent",
        vec![json!({"id": "m", "type": "user_message", "message": "go"})],
    );
    s["predefined_routes"] = json!([{"route_id": "child", "sub_agent_step":
        seq("child", vec![code("fetch", "fetch", &["a.json"])])}]);
    blocked(
        json!({"steps": [s]}),
        "step \"parent\" route \"child\" item \"fetch\": code nested inside a route",
    );
}

#[test]
fn blocked_sequence_with_next_step_id() {
    let mut s = seq("s", vec![code("fetch", "fetch", &["a.json"])]);
    s["next_step_id"] = json!("end");
    blocked(
        json!({"steps": [s]}),
        "step \"s\": a sequence with code items and a next_step_id",
    );
}

#[test]
fn blocked_id_collision() {
    let plan = json!({"steps": [
        {"id": "fetch", "type": "regular", "title": "F", "description": "d"},
        seq("s", vec![code("fetch", "fetch", &["a.json"])])]});
    blocked(
        plan,
        "step \"s\" item \"fetch\": the id collides with an existing step id",
    );
}

#[test]
fn blocked_prevalidation_first() {
    blocked(
        json!({"steps": [seq("s", vec![gate("g", "a.json"), code("fetch", "fetch", &["a.json"])])]}),
        "step \"s\" item \"g\": a prevalidation not immediately after exactly one code item",
    );
}

#[test]
fn blocked_two_prevalidations_after_one_code_item() {
    blocked(
        json!({"steps": [seq("s", vec![code("fetch", "fetch", &["a.json"]), gate("g1", "a.json"), gate("g2", "a.json")])]}),
        "step \"s\" item \"g2\": a prevalidation not immediately after exactly one code item",
    );
}

#[test]
fn blocked_prevalidation_without_schema() {
    blocked(
        json!({"steps": [seq("s", vec![code("fetch", "fetch", &["a.json"]), json!({"id": "g", "type": "prevalidation"})])]}),
        "step \"s\" item \"g\": the prevalidation after code item \"fetch\" has no schema",
    );
}

#[test]
fn blocked_mixed_conversational_and_code() {
    blocked(
        json!({"steps": [seq("s", vec![code("fetch", "fetch", &["a.json"]), json!({"id": "ask", "type": "user_message", "message": "m"})])]}),
        "step \"s\" item \"ask\": code mixed with conversational items",
    );
}

#[test]
fn blocked_code_item_without_id() {
    let mut c = code("x", "fetch", &["a.json"]);
    c.as_object_mut().unwrap().remove("id");
    blocked(
        json!({"steps": [seq("s", vec![c])]}),
        "step \"s\" item 0: a code item without an id",
    );
}

#[test]
fn blocked_code_item_without_script_path() {
    let mut c = code("fetch", "fetch", &["a.json"]);
    c.as_object_mut().unwrap().remove("script_path");
    blocked(
        json!({"steps": [seq("s", vec![c])]}),
        "step \"s\" item \"fetch\": no script_path",
    );
}

#[test]
fn blocked_runtime_other_than_python() {
    let mut c = code("fetch", "fetch", &["a.json"]);
    c["runtime"] = json!("node");
    blocked(
        json!({"steps": [seq("s", vec![c])]}),
        "step \"s\" item \"fetch\": runtime \"node\" is not python",
    );
}

#[test]
fn blocked_input_json() {
    let mut c = code("fetch", "fetch", &["a.json"]);
    c["input_json"] = json!({"k": 1});
    blocked(
        json!({"steps": [seq("s", vec![c])]}),
        "step \"s\" item \"fetch\": input_json cannot be converted",
    );
}

#[test]
fn blocked_knowledgebase_write_access() {
    let mut c = code("fetch", "fetch", &["a.json"]);
    c["write_access"] = json!({"knowledgebase": true});
    blocked(
        json!({"steps": [seq("s", vec![c])]}),
        "step \"s\" item \"fetch\": knowledgebase write access is unusual write ownership",
    );
}

#[test]
fn blocked_learnings_write_access() {
    let mut c = code("fetch", "fetch", &["a.json"]);
    c["write_access"] = json!({"learnings": true, "db": true});
    blocked(
        json!({"steps": [seq("s", vec![c])]}),
        "step \"s\" item \"fetch\": learnings write access is unusual write ownership",
    );
}

#[test]
fn blocked_missing_output_files() {
    blocked(
        json!({"steps": [seq("s", vec![code("fetch", "fetch", &[])])]}),
        "step \"s\" item \"fetch\": no output_files",
    );
}

#[test]
fn blocked_missing_script_file() {
    blocked(
        json!({"steps": [seq("s", vec![code("fetch", "absent", &["a.json"])])]}),
        "step \"s\" item \"fetch\": script_path \"scripts/absent.py\" does not exist",
    );
}

#[test]
fn blocked_reports_every_reason_at_once() {
    let ws = workspace(
        json!({"steps": [seq("s", vec![code("fetch", "fetch", &[]), json!({"id": "ask", "type": "user_message", "message": "m"})])]}),
        None,
    );
    let MigrationError::Blocked(b) = migrate_message_sequence_code_items(ws.path()).unwrap_err()
    else {
        panic!("expected blocked");
    };
    assert_eq!(b.reasons.len(), 2, "{:#?}", b.reasons);
}
