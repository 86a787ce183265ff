//! The builder's plan and config edits (`trellis_builder::edits`) on real workspaces
//! in temp folders: each edit re-read through the typed model, logged to the changelog, and
//! refused whole (no byte changed) when the workspace would not validate after it.

use std::path::Path;

use serde_json::{Value, json};

use trellis_builder::edits;
use trellis_builder::{BuilderObserver, Mode, ToolContext, ToolFailure};
use trellis_sandbox::Limits;
use trellis_sandbox::capabilities::DbWriteBudget;
use trellis_sandbox::plugins::PluginRegistry;
use trellis_workflow::{StepKind, Workspace};

use crate::support::{self, tree_digest, workspace::write_file};

struct Env {
    dir: tempfile::TempDir,
    registry: PluginRegistry,
    limits: Limits,
    observer: BuilderObserver,
}

impl Env {
    fn new() -> Self {
        Env {
            dir: tempfile::tempdir().unwrap(),
            registry: PluginRegistry::empty(support::engine()).unwrap(),
            limits: Limits::default(),
            observer: BuilderObserver::none(),
        }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn call(&self, tool: &str, args: Value) -> Result<Value, ToolFailure> {
        let writes = DbWriteBudget::new(self.limits.fs);
        let ctx = ToolContext {
            root: self.root(),
            mode: Mode::Builder,
            registry: &self.registry,
            limits: &self.limits,
            turn_writes: &writes,
            session_id: "test",
            observer: &self.observer,
            work: &trellis_builder::call_work(),
        };
        edits::call(&ctx, tool, &args)
    }

    fn ok(&self, tool: &str, args: Value) -> Value {
        match self.call(tool, args) {
            Ok(v) => v,
            Err(e) => panic!("{tool} failed: {}", e.to_json()),
        }
    }

    fn refused(&self, tool: &str, args: Value) -> ToolFailure {
        let before = tree_digest(self.root());
        let err = self
            .call(tool, args)
            .expect_err(&format!("{tool} should be refused"));
        assert_eq!(
            tree_digest(self.root()),
            before,
            "{tool} was refused but changed files: {err}"
        );
        err
    }

    fn open(&self) -> Workspace {
        Workspace::open(self.root()).unwrap_or_else(|d| panic!("does not validate:\n{d}"))
    }

    fn changelog(&self) -> Vec<Value> {
        let dir = self.root().join(edits::CHANGELOG_DIR);
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let v: Value =
                serde_json::from_str(&std::fs::read_to_string(entry.path()).unwrap()).unwrap();
            out.extend(v.as_array().unwrap().iter().cloned());
        }
        out.sort_by(|a, b| a["timestamp"].as_str().cmp(&b["timestamp"].as_str()));
        out
    }
}

fn sequence(id: &str) -> Value {
    json!({"id": id, "reason": "analysis", "title": "Analyze", "description": "Read the data and write report.json.",
           "items": [{"id": "write", "type": "user_message", "message": "Write report.json"}],
           "context_output": "report.json"})
}

fn ids(ws: &Workspace) -> Vec<&str> {
    ws.plan.steps.iter().map(|s| s.id.as_str()).collect()
}

/// A workspace made only with the edit tools, from an empty folder.
fn built() -> Env {
    let env = Env::new();
    env.ok(
        "add_scripted_step",
        json!({"id": "fetch", "reason": "fetch data deterministically", "title": "Fetch",
               "description": "Fetch prices into prices.json", "context_output": ["prices.json"],
               "script": "import json\nprint('ok')\n"}),
    );
    env.ok("add_message_sequence_step", sequence("analyze"));
    env.ok(
        "add_human_input_step",
        json!({"id": "confirm", "reason": "ask first", "question": "Go on?", "response_type": "yesno",
               "if_yes_next_step_id": "fetch", "if_no_next_step_id": "end",
               "insert_after_step_id": ""}),
    );
    env.ok(
        "add_routing_step",
        json!({"id": "route", "reason": "branch on the analysis",
               "routes": [{"route_id": "done", "next_step_id": "end"},
                          {"route_id": "again", "next_step_id": "analyze"}],
               "default_route_id": "done", "insert_after_step_id": "analyze"}),
    );
    env.ok(
        "add_todo_task_step",
        json!({"id": "wrap", "reason": "summarize", "title": "Wrap up",
               "description": "Summarize the report", "messages": ["Be short."]}),
    );
    env.ok(
        "update_step_config",
        json!({"step_id": "analyze", "reason": "cheaper model", "execution_tier": "low",
               "learning_objective": "what fails"}),
    );
    env.ok(
        "update_workflow_config",
        json!({"reason": "default model",
               "llm": {"provider": "openai", "model_id": "gpt-4o-mini"}}),
    );
    env.ok(
        "update_variable",
        json!({"reason": "market", "action": "add", "name": "REGION", "value": "eu"}),
    );
    env.ok(
        "add_group",
        json!({"reason": "us run", "name": "US", "id": "us", "variables": {"REGION": "us"}}),
    );
    env.ok("add_group", json!({"reason": "eu run", "name": "eu"}));
    env
}

#[test]
fn every_tool_has_a_strict_schema_and_the_family_covers_its_table_rows() {
    let specs = edits::specs();
    let names: Vec<&str> = specs.iter().map(|s| s.name).collect();
    let mut expected: Vec<&str> = trellis_builder::modes::PLAN_TOOLS.to_vec();
    expected.extend(trellis_builder::modes::CONFIG_TOOLS);
    expected.extend(trellis_builder::modes::SCHEDULE_TOOLS);
    assert_eq!(names, expected);
    // The original system calls these with no reason: they take one, and log a placeholder
    // without it. `list_schedules` is a read, and `trigger_schedule` no edit.
    let reason_optional = [
        "list_schedules",
        "cleanup_orphan_step_configs",
        "set_workflow_contract_version",
        "set_workflow_llm_config",
    ];
    for s in &specs {
        assert_eq!(s.parameters["type"], "object", "{}", s.name);
        assert_eq!(s.parameters["additionalProperties"], false, "{}", s.name);
        if s.name == "list_schedules" || s.name == "trigger_schedule" {
            continue;
        }
        if reason_optional.contains(&s.name) {
            assert!(
                s.parameters["properties"]["reason"].is_object(),
                "{}",
                s.name
            );
            continue;
        }
        assert!(
            s.parameters["required"]
                .as_array()
                .unwrap()
                .contains(&json!("reason")),
            "{} must require a reason",
            s.name
        );
    }
}

#[test]
fn a_workspace_built_with_the_tools_validates_and_every_edit_is_logged() {
    let env = built();
    let ws = env.open();
    assert_eq!(ids(&ws), ["confirm", "fetch", "analyze", "route", "wrap"]);
    assert!(matches!(
        ws.plan.step("fetch").unwrap().kind,
        StepKind::Regular
    ));
    assert!(ws.agent_configs("fetch").is_scripted());
    assert_eq!(
        std::fs::read_to_string(env.root().join("code/fetch/main.py")).unwrap(),
        "import json\nprint('ok')\n"
    );
    assert!(matches!(
        ws.plan.step("route").unwrap().kind,
        StepKind::Routing(_)
    ));
    assert!(matches!(
        ws.plan.step("confirm").unwrap().kind,
        StepKind::HumanInput(_)
    ));
    assert!(matches!(
        ws.plan.step("wrap").unwrap().kind,
        StepKind::TodoTask(_)
    ));
    let ac = serde_json::to_value(ws.agent_configs("analyze")).unwrap();
    assert_eq!(ac["execution_tier"], "low");
    assert_eq!(ac["learning_objective"], "what fails");
    assert_eq!(ws.manifest.llm.as_ref().unwrap().model_id, "gpt-4o-mini");
    assert_eq!(ws.manifest.resolved_variables(Some("us"))["REGION"], "us");
    assert_eq!(ws.manifest.resolved_variables(Some("eu"))["REGION"], "eu");

    let log = env.changelog();
    let tools: Vec<&str> = log.iter().map(|e| e["tool"].as_str().unwrap()).collect();
    assert_eq!(
        tools,
        [
            "add_scripted_step",
            "add_message_sequence_step",
            "add_human_input_step",
            "add_routing_step",
            "add_todo_task_step",
            "update_step_config",
            "update_workflow_config",
            "update_variable",
            "add_group",
            "add_group"
        ]
    );
    // The first edit created the plan; each plan edit chains its hashes.
    assert_eq!(log[0]["before_sha256"], Value::Null);
    for pair in log.windows(2) {
        assert_eq!(pair[1]["before_sha256"], pair[0]["after_sha256"]);
    }
    let plan_bytes = std::fs::read(env.root().join("planning/plan.json")).unwrap();
    // Written in a reading order, not with every key sorted.
    let text = String::from_utf8_lossy(&plan_bytes);
    let at = |needle: &str| {
        text.find(needle)
            .unwrap_or_else(|| panic!("{needle} in {text}"))
    };
    assert!(at("\"id\": \"fetch\"") < at("\"type\": \"regular\""));
    assert!(at("\"type\": \"regular\"") < at("\"title\": \"Fetch\""));
    assert!(at("\"title\": \"Fetch\"") < at("\"description\": \"Fetch prices"));
    assert_eq!(
        log.last().unwrap()["after_sha256"],
        json!(hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
            &plan_bytes
        )))
    );
    assert_eq!(log[0]["reason"], "fetch data deterministically");
    assert_eq!(log[0]["step_ids"], json!(["fetch"]));
    let fields: Vec<&str> = log[0]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "step",
            "agent_configs.declared_execution_mode",
            "code/fetch/main.py"
        ]
    );
    assert_eq!(
        log[5]["changes"][0],
        json!({"step_id": "analyze", "field": "agent_configs.execution_tier", "old": null, "new": "low"})
    );

    // The binary agrees.
    let out = support::trellis(&["validate", env.root().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "trellis validate failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn an_update_changes_only_the_fields_given_and_can_move_and_remove() {
    let env = built();
    let answer = env.ok(
        "update_message_sequence_step",
        json!({"step_id": "analyze", "reason": "clearer", "title": "Analyze prices",
               "context_output": null, "insert_after_step_id": ""}),
    );
    assert_eq!(answer["position"], 0);
    let ws = env.open();
    let step = ws.plan.step("analyze").unwrap();
    assert_eq!(step.title.as_deref(), Some("Analyze prices"));
    assert_eq!(
        step.description.as_deref(),
        Some("Read the data and write report.json.")
    );
    assert!(step.context_output.is_none());
    assert_eq!(ids(&ws)[0], "analyze");
    let entry = env.changelog().pop().unwrap();
    assert_eq!(entry["tool"], "update_message_sequence_step");
    let changes = entry["changes"].as_array().unwrap();
    assert!(changes.contains(
        &json!({"step_id": "analyze", "field": "title", "old": "Analyze", "new": "Analyze prices"})
    ));
    let fields: Vec<&str> = changes
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields.len(), 3, "{fields:?}");
    assert!(fields.contains(&"context_output") && fields.contains(&"position"));

    env.ok(
        "update_scripted_step",
        json!({"step_id": "fetch", "reason": "fix", "script": "print('v2')\n"}),
    );
    assert_eq!(
        std::fs::read_to_string(env.root().join("code/fetch/main.py")).unwrap(),
        "print('v2')\n"
    );

    env.ok(
        "update_human_input_step",
        json!({"step_id": "confirm", "reason": "clearer", "question": "Continue?"}),
    );
    env.ok(
        "update_todo_task_step",
        json!({"step_id": "wrap", "reason": "longer", "messages": ["Be thorough."]}),
    );
    let ws = env.open();
    match &ws.plan.step("confirm").unwrap().kind {
        StepKind::HumanInput(h) => assert_eq!(h.question.as_deref(), Some("Continue?")),
        other => panic!("{other:?}"),
    }

    // The wrong update tool names the right one.
    let err = env.refused(
        "update_routing_step",
        json!({"step_id": "analyze", "reason": "x", "default_route_id": "y"}),
    );
    assert!(
        err.message.contains("update_message_sequence_step"),
        "{err}"
    );
}

#[test]
fn an_edit_that_would_not_validate_is_refused_with_its_diagnostics() {
    let env = built();
    let plan = std::fs::read(env.root().join("planning/plan.json")).unwrap();
    let config = std::fs::read(env.root().join("planning/step_config.json")).unwrap();
    let err = env.refused(
        "add_message_sequence_step",
        json!({"id": "bad", "reason": "try", "title": "T", "description": "d",
               "items": [{"id": "a", "type": "user_message"}]}),
    );
    let diags = err.details.as_ref().unwrap()["diagnostics"]
        .as_array()
        .unwrap();
    let messages: Vec<String> = diags
        .iter()
        .map(|d| {
            format!(
                "{} {}",
                d["json_path"].as_str().unwrap(),
                d["message"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        messages.iter().any(|m| m.contains("items[0].message")),
        "{messages:?}"
    );
    assert!(diags.iter().all(|d| d["file"] == "planning/plan.json"));
    assert!(diags.iter().all(|d| d["before_edit"] == false));
    let err = env.refused(
        "update_scripted_step",
        json!({"step_id": "fetch", "reason": "try", "next_step_id": "nowhere"}),
    );
    let diag = &err.details.unwrap()["diagnostics"][0];
    assert_eq!(diag["json_path"], "steps[1].next_step_id");
    assert!(
        diag["message"].as_str().unwrap().contains("\"nowhere\""),
        "{diag}"
    );

    // A step config value the model rejects: the same, the config unchanged.
    let err = env.refused(
        "update_step_config",
        json!({"step_id": "analyze", "reason": "x", "selected_tools": ["no-colon"]}),
    );
    assert_eq!(
        err.details.unwrap()["diagnostics"][0]["file"],
        "planning/step_config.json"
    );
    assert_eq!(
        std::fs::read(env.root().join("planning/plan.json")).unwrap(),
        plan
    );
    assert_eq!(
        std::fs::read(env.root().join("planning/step_config.json")).unwrap(),
        config
    );

    // A scripted step whose id is taken: nothing written, not even its script.
    let err = env.refused(
        "add_scripted_step",
        json!({"id": "analyze", "reason": "x", "title": "t", "description": "d", "script": "x"}),
    );
    assert!(err.message.contains("already exists"), "{err}");
}

#[test]
fn an_unknown_step_id_lists_the_valid_ones() {
    let env = built();
    for (tool, args) in [
        (
            "update_message_sequence_step",
            json!({"step_id": "analyse", "reason": "x", "title": "t"}),
        ),
        (
            "update_step_config",
            json!({"step_id": "analyse", "reason": "x", "lock_code": true}),
        ),
        (
            "update_validation_schema",
            json!({"step_id": "analyse", "reason": "x", "validation_schema": null}),
        ),
        (
            "delete_plan_steps",
            json!({"step_ids": ["analyse"], "reason": "x"}),
        ),
    ] {
        let err = env.refused(tool, args);
        assert!(
            err.message.contains("did you mean \"analyze\""),
            "{tool}: {err}"
        );
        assert_eq!(
            err.details.unwrap()["valid_step_ids"],
            json!(["confirm", "fetch", "analyze", "route", "wrap"]),
            "{tool}"
        );
    }
    let err = env.refused(
        "add_routing_step",
        json!({"id": "r2", "reason": "x",
        "routes": [{"route_id": "a", "next_step_id": "end"}], "insert_after_step_id": "nope"}),
    );
    assert!(err.message.contains("unknown step id \"nope\""), "{err}");
}

#[test]
fn deleting_a_step_something_still_points_at_is_refused_listing_every_reference() {
    let env = built();
    env.ok(
        "update_step_config",
        json!({"step_id": "wrap", "reason": "go back when data is missing",
               "enable_prerequisite_detection": true,
               "prerequisite_rules": [{"depends_on_step": "analyze", "description": "needs the report"}]}),
    );
    let err = env.refused(
        "delete_plan_steps",
        json!({"step_ids": ["analyze"], "reason": "not needed"}),
    );
    let refs = err.details.unwrap()["references"].clone();
    let found: Vec<(String, String)> = refs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["file"].as_str().unwrap().to_string(),
                r["json_path"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            (
                "planning/plan.json".into(),
                "steps[3].routes[1].next_step_id".into()
            ),
            (
                "planning/step_config.json".into(),
                "steps[2].agent_configs.prerequisite_rules[0].depends_on_step".into()
            ),
        ]
    );

    // Deleting the pointing steps too goes through, their configs with them.
    let answer = env.ok(
        "delete_plan_steps",
        json!({"step_ids": ["analyze", "route", "wrap"], "reason": "simpler"}),
    );
    assert_eq!(
        answer["removed_step_config_entries"],
        json!(["analyze", "wrap"])
    );
    let ws = env.open();
    assert_eq!(ids(&ws), ["confirm", "fetch"]);
    assert!(ws.step_configs.get("analyze").is_none());
    assert!(ws.warnings.is_empty(), "{}", ws.warnings);
    let entry = env.changelog().pop().unwrap();
    assert_eq!(entry["step_ids"], json!(["analyze", "route", "wrap"]));
}

#[test]
fn refusals_of_arguments_name_what_was_expected() {
    let env = built();
    let err = env.refused(
        "add_message_sequence_step",
        json!({"id": "x", "title": "t", "description": "d", "items": [{"id": "a", "type": "user_message", "message": "m"}]}),
    );
    assert!(err.message.contains("\"reason\" is required"), "{err}");
    let err = env.refused("delete_group", json!({"group": "us", "reason": " "}));
    assert!(err.message.contains("\"reason\" is empty"), "{err}");
    let err = env.refused(
        "update_step_config",
        json!({"step_id": "analyze", "reason": "x", "execution_teir": "low"}),
    );
    assert!(
        err.message.contains("did you mean \"execution_tier\""),
        "{err}"
    );
    assert!(err.message.contains("learning_objective"), "{err}");
    let err = env.refused(
        "update_step_config",
        json!({"step_id": "analyze", "reason": "x", "clear_fields": ["colour"]}),
    );
    assert!(err.message.contains("clear_fields"), "{err}");
    assert!(err.message.contains("execution_tier"), "{err}");
    let err = env.refused(
        "update_workflow_config",
        json!({"reason": "x", "colour": "blue"}),
    );
    assert!(err.message.contains("unknown argument \"colour\""), "{err}");
    let err = env.refused(
        "update_step_config",
        json!({"step_id": "analyze", "reason": "x", "execution_tier": "huge"}),
    );
    assert!(err.message.contains("argument \"execution_tier\""), "{err}");
}

#[test]
fn clear_fields_removes_step_config_fields() {
    let env = built();
    env.ok(
        "update_step_config",
        json!({"step_id": "analyze", "reason": "back to default", "clear_fields": ["execution_tier"]}),
    );
    let ac = serde_json::to_value(env.open().agent_configs("analyze")).unwrap();
    assert!(ac.get("execution_tier").is_none(), "{ac}");
    assert_eq!(ac["learning_objective"], "what fails");
}

#[test]
fn edits_shadowed_by_a_winning_file_name_it() {
    let env = built();
    write_file(
        env.root(),
        "runs/iteration-0/planning/step_config.json",
        r#"{"steps": [{"id": "analyze", "validation_schema": {"files": [{"file_name": "report.json", "must_exist": true}]}}]}"#,
    );
    let answer = env.ok(
        "update_step_config",
        json!({"step_id": "analyze", "reason": "x", "lock_code": true}),
    );
    assert_eq!(
        answer["shadowed_by"],
        "runs/iteration-0/planning/step_config.json"
    );
    assert!(answer["note"].as_str().unwrap().contains("wins over"));
    let answer = env.ok(
        "update_validation_schema",
        json!({"step_id": "analyze", "reason": "gate the report",
               "validation_schema": {"files": [{"file_name": "report.json", "must_exist": true,
                 "json_checks": [{"path": "$.items", "value_type": "array"}]}]}}),
    );
    assert_eq!(
        answer["shadowed_by"],
        "runs/iteration-0/planning/step_config.json"
    );
    let ws = env.open();
    assert!(ws.plan.step("analyze").unwrap().validation_schema.is_some());

    // Without the run config, the default one's gate is the winner.
    std::fs::remove_file(
        env.root()
            .join("runs/iteration-0/planning/step_config.json"),
    )
    .unwrap();
    let mut config: Value = serde_json::from_str(
        &std::fs::read_to_string(env.root().join("planning/step_config.json")).unwrap(),
    )
    .unwrap();
    for e in config["steps"].as_array_mut().unwrap() {
        if e["id"] == "analyze" {
            e["validation_schema"] =
                json!({"files": [{"file_name": "other.json", "must_exist": true}]});
        }
    }
    write_file(env.root(), "planning/step_config.json", config.to_string());
    let answer = env.ok(
        "update_validation_schema",
        json!({"step_id": "analyze", "reason": "x", "validation_schema": null}),
    );
    assert_eq!(answer["shadowed_by"], "planning/step_config.json");
    assert!(
        env.open()
            .plan
            .step("analyze")
            .unwrap()
            .validation_schema
            .is_none()
    );
}

#[test]
fn variables_go_to_variables_json_when_it_exists_and_it_wins() {
    let env = built();
    write_file(
        env.root(),
        "variables/variables.json",
        r#"{"variables": [{"name": "REGION", "value": "apac"}], "groups": [{"name": "solo", "enabled": true}]}"#,
    );
    let answer = env.ok(
        "update_variable",
        json!({"reason": "x", "action": "update", "name": "REGION", "value": "latam"}),
    );
    assert_eq!(answer["wins"], "variables/variables.json");
    assert!(answer["note"].as_str().unwrap().contains("wins"));
    let answer = env.ok(
        "update_variable",
        json!({"reason": "x", "action": "add", "name": "TICKER", "value": "ACME"}),
    );
    assert_eq!(answer["files"], json!(["variables/variables.json"]));
    let ws = env.open();
    assert_eq!(ws.manifest.resolved_variables(None)["REGION"], "latam");
    assert_eq!(ws.manifest.resolved_variables(None)["TICKER"], "ACME");
    let wf: Value =
        serde_json::from_str(&std::fs::read_to_string(env.root().join("workflow.json")).unwrap())
            .unwrap();
    assert_eq!(wf["variables"]["REGION"], "eu", "workflow.json untouched");
    assert!(wf["variables"].get("TICKER").is_none());

    // Adding a group goes to variables.json too.
    let answer = env.ok(
        "add_group",
        json!({"reason": "x", "name": "jp", "variables": {"TICKER": "SONY"}}),
    );
    assert_eq!(answer["file"], "variables/variables.json");
    assert_eq!(
        env.open().manifest.resolved_variables(Some("jp"))["TICKER"],
        "SONY"
    );

    // Deleting a variable a group still sets is refused by the model.
    let err = env.refused(
        "update_variable",
        json!({"reason": "x", "action": "delete", "name": "REGION"}),
    );
    assert!(err.details.is_some(), "{err}");
    let err = env.refused(
        "update_variable",
        json!({"reason": "x", "action": "add", "name": "REGION", "value": "x"}),
    );
    assert!(err.message.contains("already exists"), "{err}");
}

#[test]
fn groups_are_updated_and_deleted_but_never_the_last() {
    let env = built();
    env.ok(
        "update_group",
        json!({"reason": "x", "group": "US", "name": "United States", "variables": {"REGION": "na"}}),
    );
    let ws = env.open();
    let us = ws.manifest.groups.iter().find(|g| g.id == "us").unwrap();
    assert_eq!(us.name.as_deref(), Some("United States"));
    assert_eq!(ws.manifest.resolved_variables(Some("us"))["REGION"], "na");
    env.ok("delete_group", json!({"reason": "x", "group": "eu"}));
    let err = env.refused("delete_group", json!({"reason": "x", "group": "us"}));
    assert!(err.message.contains("last group"), "{err}");
    assert!(err.message.contains("\"us\""), "{err}");
    let err = env.refused(
        "update_group",
        json!({"reason": "x", "group": "mars", "name": "m"}),
    );
    assert_eq!(err.details.unwrap()["groups"], json!(["us"]));
    assert_eq!(env.open().manifest.groups.len(), 1);
}

#[test]
fn the_migration_runs_through_the_tool_and_is_logged() {
    let env = Env::new();
    write_file(env.root(), "workflow.json", r#"{"version": "1.0.9"}"#);
    write_file(env.root(), "scripts/fetch.py", "print('fetch')\n");
    write_file(
        env.root(),
        "planning/plan.json",
        r#"{"steps": [{"id": "seq", "type": "message_sequence", "title": "S", "description": "d",
            "items": [{"id": "fetch", "type": "code", "script_path": "scripts/fetch.py", "output_files": ["out.json"]}]}]}"#,
    );
    let answer = env.ok(
        "migrate_message_sequence_code_items",
        json!({"reason": "upgrade the contract"}),
    );
    assert_eq!(answer["converted"][0]["new_step_ids"], json!(["fetch"]));
    assert_eq!(answer["contract_after"], "1.0.11");
    let ws = env.open();
    assert_eq!(ids(&ws), ["fetch"]);
    assert!(ws.agent_configs("fetch").is_scripted());
    let entry = env.changelog().pop().unwrap();
    assert_eq!(entry["tool"], "migrate_message_sequence_code_items");
    assert_eq!(entry["reason"], "upgrade the contract");
    assert_ne!(entry["before_sha256"], entry["after_sha256"]);

    // Blocked: nothing changes and the reasons come back.
    let env = Env::new();
    write_file(
        env.root(),
        "planning/plan.json",
        r#"{"steps": [{"id": "seq", "type": "message_sequence", "title": "S", "description": "d",
            "items": [{"id": "talk", "type": "user_message", "message": "hi"},
                      {"id": "fetch", "type": "code", "script_path": "scripts/fetch.py", "output_files": ["o"]}]}]}"#,
    );
    let err = env.refused(
        "migrate_message_sequence_code_items",
        json!({"reason": "upgrade"}),
    );
    let details = err.details.unwrap();
    assert_eq!(details["code"], "MESSAGE_SEQUENCE_CODE_MIGRATION_BLOCKED");
    assert!(!details["reasons"].as_array().unwrap().is_empty());
}

#[test]
fn an_orphan_step_is_added_off_the_main_path_and_its_route_keeps_it() {
    let env = built();
    let answer = env.ok(
        "add_message_sequence_step",
        json!({"id": "helper", "reason": "a specialist", "title": "Helper", "description": "d",
               "items": [{"id": "m", "type": "user_message", "message": "help"}], "orphan": true}),
    );
    assert_eq!(answer["list"], "orphan_steps");
    env.ok(
        "update_message_sequence_step",
        json!({"step_id": "analyze", "reason": "delegate",
               "predefined_routes": [{"route_id": "helper", "orphan_step_ref": "helper"}]}),
    );
    let ws = env.open();
    assert_eq!(ws.plan.orphan_steps[0].id, "helper");
    assert_eq!(
        ws.plan.step("analyze").unwrap().predefined_routes()[0].route_id,
        "helper"
    );
    assert!(!ids(&ws).contains(&"helper"));

    let err = env.refused(
        "delete_plan_steps",
        json!({"step_ids": ["helper"], "reason": "x"}),
    );
    assert_eq!(
        err.details.unwrap()["references"][0]["json_path"],
        "steps[2].predefined_routes[0].orphan_step_ref"
    );
    let err = env.refused(
        "add_message_sequence_step",
        json!({"id": "h2", "reason": "x", "title": "t", "description": "d",
               "items": [{"id": "m", "type": "user_message", "message": "m"}],
               "orphan": true, "insert_after_step_id": ""}),
    );
    assert!(err.message.contains("not both"), "{err}");
}

/// An edit's reason is the model's own text: a 3 MB reason made each changelog entry 3 MB,
/// and a day's file passed its 4 MiB roll-over size by one entry's reason (round 26, LOW).
/// The entry keeps 4 KiB of it, the cut marked.
#[test]
fn a_changelog_entry_keeps_a_bounded_reason() {
    let env = Env::new();
    let reason = "why ".repeat(750_000);
    env.ok(
        "update_variable",
        json!({"reason": reason, "action": "add", "name": "REGION", "value": "eu"}),
    );
    let entry = env.changelog().pop().unwrap();
    let kept = entry["reason"].as_str().unwrap();
    assert!(kept.len() < 4200, "{} bytes", kept.len());
    assert!(kept.starts_with("why why "), "{kept}");
    assert!(kept.contains("cut: "), "{kept}");
}
