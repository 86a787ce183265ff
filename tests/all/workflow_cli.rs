//! `trellis validate`, `check`, `schema` and `migrate`, run as a user runs them
//! against real workspace folders.

use crate::support;

use std::path::{Path, PathBuf};

use support::trellis;

use serde_json::{Value, json};

use crate::support::plugin_build::text;

/// A copy of the fixture workspace that uses every step type.
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("host/workflow/tests/data/workflow/workspace"),
        dir.path(),
    );
    dir
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut value: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut value);
    std::fs::write(path, serde_json::to_string_pretty(&value).unwrap()).unwrap();
}

#[test]
fn validate_accepts_a_good_workspace() {
    let ws = workspace();
    let out = trellis(&["validate", ws.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    // The seed's step config names MCP servers this run does not load: warnings, not errors.
    let stdout = text(&out.stdout);
    assert!(stdout.ends_with("0 errors, 2 warnings\n"), "{stdout}");
    assert!(
        stdout.contains(
            "steps[1].agent_configs.selected_servers[0] (step \"review-and-correct\"): server \"server1\" is not loaded"
        ),
        "{stdout}"
    );
}

#[test]
fn validate_reports_every_error_with_file_path_and_suggestion() {
    let ws = workspace();
    edit_json(&ws.path().join("planning/plan.json"), |plan| {
        let step = &mut plan["steps"][2];
        step["items"][0]["mesage"] = step["items"][0]["message"].take();
        step["items"][0].as_object_mut().unwrap().remove("message");
        step["titel"] = json!("typo");
    });
    let out = trellis(&["validate", ws.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("planning/plan.json: steps[2]"), "{stdout}");
    assert!(
        stdout.contains("unknown key \"titel\" (did you mean \"title\"?)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("unknown key \"mesage\" (did you mean \"message\"?)"),
        "{stdout}"
    );
    assert!(stdout.ends_with(": 3 errors, 0 warnings\n"), "{stdout}");
}

#[test]
fn validate_rejects_legacy_code_items_naming_the_migration() {
    let ws = workspace();
    edit_json(&ws.path().join("planning/plan.json"), |plan| {
        plan["steps"][2]["items"]
            .as_array_mut()
            .unwrap()
            .push(json!({"id": "legacy", "type": "code", "script_path": "scripts/x.py", "output_files": ["x.json"]}));
    });
    let out = trellis(&["validate", ws.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("migrate_message_sequence_code_items"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn validate_refuses_foreach_messages_the_template_parser_hangs_or_panics_on() {
    // The template parser's lexer sent tokens for ever on these (an action still open at the
    // end of the message; found by the `plan` fuzz target): `validate` never returned and its
    // memory grew. A non-ASCII character inside an action made that lexer panic, and some
    // escapes its parser, on validate's own thread.
    for (message, expected) in [
        ("Review finding {{.iproof.json.", "is not closed by `}}`"),
        ("Review finding {{ ", "is not closed by `}}`"),
        (
            "Review finding {{.id}} {{ é}}",
            "is not supported outside a quoted string",
        ),
        // A raw string ending in `\` made the parser panic (the `foreach_template` target).
        (
            "Review finding {{`a\\`}}",
            "is not supported: a `\\` at the end",
        ),
    ] {
        let ws = workspace();
        edit_json(&ws.path().join("planning/plan.json"), |plan| {
            plan["steps"][2]["items"][1]["message"] = json!(message);
        });
        let out = trellis(&["validate", ws.path().to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{message}");
        let stdout = text(&out.stdout);
        assert!(
            stdout.contains("steps[2].items[1].message") && stdout.contains(expected),
            "{message}: {stdout}"
        );
        assert!(stdout.ends_with(": 1 error, 0 warnings\n"), "{stdout}");
        assert!(
            !text(&out.stderr).contains("panicked"),
            "{}",
            text(&out.stderr)
        );
    }
}

#[test]
fn check_runs_the_gate_prints_each_check_and_writes_the_report() {
    let ws = workspace();
    let root = ws.path().to_str().unwrap();
    let out_dir = ws
        .path()
        .join("runs/iteration-0/execution/review-and-correct");
    std::fs::create_dir_all(&out_dir).unwrap();
    std::fs::write(out_dir.join("report.json"), "{\"ok\": true}").unwrap();
    std::fs::write(out_dir.join("report_proof.json"), "not json").unwrap();

    let out = trellis(&["check", root, "--step", "review-and-correct"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("PASS report.json"), "{stdout}");
    assert!(stdout.contains("FAIL report_proof.json"), "{stdout}");

    let logs = ws.path().join("runs/iteration-0/logs/review-and-correct");
    let latest: Value =
        serde_json::from_str(&std::fs::read_to_string(logs.join("pre_validation.json")).unwrap())
            .unwrap();
    assert_eq!(latest["passed"], false);
    assert!(logs.join("pre_validation_check_attempt_1.json").exists());

    std::fs::write(out_dir.join("report_proof.json"), "[]").unwrap();
    let out = trellis(&["check", root, "--step", "review-and-correct"]);
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(logs.join("pre_validation_check_attempt_2.json").exists());

    let out = trellis(&["check", root, "--step", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no step `nope` in the plan"),
        "{}",
        text(&out.stderr)
    );
    // A run folder that is not there is refused, nothing made for it.
    let out = trellis(&[
        "check",
        root,
        "--step",
        "review-and-correct",
        "--run",
        "iteration-01",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("runs/iteration-01: no such run folder"),
        "{}",
        text(&out.stderr)
    );
    assert!(!ws.path().join("runs/iteration-01").exists());
    // A run folder outside `runs/` is refused, the workspace's diagnostic labelled once.
    let out = trellis(&[
        "check",
        root,
        "--step",
        "review-and-correct",
        "--run",
        "../..",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("error: ") && !stderr.contains("error: error:"),
        "{stderr}"
    );
}

#[test]
fn schema_prints_each_editor_schema() {
    for which in ["plan", "step-config", "workflow", "validation"] {
        let out = trellis(&["schema", which]);
        assert!(out.status.success(), "{which}");
        let schema: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            schema.get("$schema").is_some() || schema.get("type").is_some(),
            "{which}: {schema}"
        );
    }
    let out = trellis(&["schema", "plans"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("possible values: plan, step-config, workflow, validation"));
}

#[test]
fn migrate_converts_a_code_sequence_and_refuses_an_ambiguous_one() {
    let ws = tempfile::tempdir().unwrap();
    let root = ws.path();
    std::fs::create_dir_all(root.join("planning")).unwrap();
    std::fs::create_dir_all(root.join("scripts")).unwrap();
    std::fs::write(root.join("scripts/fetch.py"), "print('fetch')\n").unwrap();
    std::fs::write(root.join("workflow.json"), r#"{"version": "1.0.9"}"#).unwrap();
    let plan = json!({"steps": [{
        "id": "collect", "type": "message_sequence", "title": "Collect", "description": "Collect data.",
        "items": [
            {"id": "fetch", "type": "code", "script_path": "scripts/fetch.py", "output_files": ["data.json"]},
            {"id": "gate", "type": "prevalidation", "validation_schema": {"files": [{"file_name": "data.json", "must_exist": true}]}}
        ]
    }]});
    std::fs::write(
        root.join("planning/plan.json"),
        serde_json::to_string_pretty(&plan).unwrap(),
    )
    .unwrap();

    // Mixed with a conversational item: refused, nothing changed.
    let mut mixed = plan.clone();
    mixed["steps"][0]["items"]
        .as_array_mut()
        .unwrap()
        .push(json!({"id": "ask", "type": "user_message", "message": "Summarise."}));
    std::fs::write(
        root.join("planning/plan.json"),
        serde_json::to_string_pretty(&mixed).unwrap(),
    )
    .unwrap();
    let before = std::fs::read(root.join("planning/plan.json")).unwrap();
    let out = trellis(&["migrate", root.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("MESSAGE_SEQUENCE_CODE_MIGRATION_BLOCKED"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read(root.join("planning/plan.json")).unwrap(),
        before
    );
    assert!(!root.join("code").exists());

    std::fs::write(
        root.join("planning/plan.json"),
        serde_json::to_string_pretty(&plan).unwrap(),
    )
    .unwrap();
    let out = trellis(&["migrate", root.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(root.join("code/fetch/main.py")).unwrap(),
        "print('fetch')\n"
    );
    let migrated: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("planning/plan.json")).unwrap())
            .unwrap();
    assert_eq!(migrated["steps"][0]["id"], "fetch");
    assert_eq!(migrated["steps"][0]["type"], "regular");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("workflow.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["version"], "1.0.11");
    assert!(manifest.get("contract_version").is_none(), "{manifest}");
    let out = trellis(&["validate", root.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stdout));
}
