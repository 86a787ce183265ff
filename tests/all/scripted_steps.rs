//! Scripted steps through `trellis run` (spec section 7): the script runs first; a script
//! that succeeds and passes the gate ends the step with no LLM call (and no provider
//! configured); a failure goes to the agent for repair unless `lock_code`, and the repaired
//! script runs again. The agent is a fake OpenAI-compatible server on 127.0.0.1.

use crate::support;

use std::path::Path;

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::trellis;
use support::workspace::{read_json, write_file};

const STEP: &str = "fetch";
const OUT: &str = "runs/iteration-0/execution/fetch";

/// Counts the open tickets into `count.json`; the gate wants `count` >= 1.
const GOOD_SCRIPT: &str = r#"import json, os
from trellis_db import query
rows = query("SELECT id FROM tickets WHERE status = 'open'")
with open(os.path.join(os.environ['STEP_OUTPUT_DIR'], 'count.json'), 'w') as f:
    json.dump({'count': len(rows)}, f)
print('counted', len(rows))
"#;

/// Like GOOD_SCRIPT, but reads a column that does not exist (line 3).
const BROKEN_SCRIPT: &str = r#"import json, os
from trellis_db import query
rows = [r['identifier'] for r in query("SELECT id FROM tickets WHERE status = 'open'")]
with open(os.path.join(os.environ['STEP_OUTPUT_DIR'], 'count.json'), 'w') as f:
    json.dump({'count': len(rows)}, f)
"#;

/// Exits cleanly with an output that fails the gate.
const WRONG_OUTPUT_SCRIPT: &str = r#"import json, os
with open(os.path.join(os.environ['STEP_OUTPUT_DIR'], 'count.json'), 'w') as f:
    json.dump({'count': 0}, f)
"#;

/// A workspace with the scripted step `fetch`, its script, a tickets table and a gate.
fn workspace(root: &Path, script: &str, agent_configs: Value, manifest: Value) {
    let write = |rel: &str, text: &str| write_file(root, rel, text);
    write(
        "planning/plan.json",
        &json!({"objective": "count tickets", "steps": [{
            "id": STEP, "type": "regular", "title": "Count", "description": "Count the open tickets.",
            "context_output": ["count.json"],
            "validation_schema": {"files": [{"file_name": "count.json", "must_exist": true,
                "json_checks": [{"path": "$.count", "min_value": 1}]}]}
        }]})
        .to_string(),
    );
    let mut configs = json!({"declared_execution_mode": "scripted",
                             "selected_tools": ["workspace:read_file", "workspace:write_file"]});
    for (k, v) in agent_configs.as_object().unwrap() {
        configs[k] = v.clone();
    }
    write(
        "planning/step_config.json",
        &json!({"steps": [{"id": STEP, "agent_configs": configs}]}).to_string(),
    );
    write("workflow.json", &manifest.to_string());
    write(&format!("code/{STEP}/main.py"), script);
    write(
        "db/seed.sql",
        "CREATE TABLE tickets (id INTEGER PRIMARY KEY, status TEXT);\n\
         INSERT INTO tickets VALUES (1, 'open'), (2, 'closed'), (3, 'open');\n",
    );
}

use crate::support::plugin_build::text;

/// `(entry_id, item_type, status)` of every session entry of the step.
fn entries(root: &Path) -> Vec<(String, String, String)> {
    let session = read_json(&root.join(OUT).join("session.json"));
    session["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (s("entry_id"), s("item_type"), s("status"))
        })
        .collect()
}

fn entry(id: &str, item_type: &str, status: &str) -> (String, String, String) {
    (id.into(), item_type.into(), status.into())
}

/// Files under the step's logs folder.
/// The files of the step's logs folder, those of its `execution/` folder (turn logs and the
/// final summary) as `execution/<name>`.
fn log_files(root: &Path) -> Vec<String> {
    let logs = root.join("runs/iteration-0/logs").join(STEP);
    let mut names: Vec<String> = std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "execution")
        .collect();
    if let Ok(entries) = std::fs::read_dir(logs.join("execution")) {
        names.extend(
            entries
                .flatten()
                .map(|e| format!("execution/{}", e.file_name().to_string_lossy())),
        );
    }
    names.sort();
    names
}

#[test]
fn a_passing_script_ends_the_step_with_no_llm_and_no_provider() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, GOOD_SCRIPT, json!({}), json!({}));
    let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert_eq!(
        read_json(&root.join(OUT).join("count.json")),
        json!({"count": 2})
    );
    assert_eq!(entries(root), [entry("script-1", "script", "completed")]);
    let summary = read_json(&root.join(OUT).join("execution-final-summary.json"));
    assert_eq!(summary["status"], "completed");
    let result = summary["execution_result"].as_str().unwrap();
    assert!(
        result.contains("code/fetch/main.py succeeded") && result.contains("counted 2"),
        "{result}"
    );
    let logs = log_files(root);
    assert!(logs.contains(&"script-stdout.txt".to_string()), "{logs:?}");
    assert!(
        !logs
            .iter()
            .any(|l| l.starts_with("execution/execution-attempt")),
        "no turn ran: {logs:?}"
    );
}

#[test]
fn a_failing_script_is_repaired_by_the_agent_and_run_again() {
    let fixed = GOOD_SCRIPT.to_string();
    let server = FakeServer::start(Box::new(move |body| {
        let answered = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "tool");
        if answered {
            (
                200,
                completion("Read the id column instead of identifier.", &[]),
            )
        } else {
            let args = json!({"path": "code/fetch/main.py", "content": fixed});
            (200, completion("", &[("workspace__write_file", args)]))
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        BROKEN_SCRIPT,
        json!({}),
        json!({"llm": {"provider": "openai", "model_id": "fixer"},
               "providers": server.providers()}),
    );
    let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));

    // The agent was given the error with its line, and the source.
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "one tool round, then the reply");
    let ask = seen[0]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(ask.contains("KeyError: 'identifier'"), "{ask}");
    assert!(ask.contains("line 3"), "{ask}");
    assert!(ask.contains(BROKEN_SCRIPT.trim_end()), "{ask}");
    assert!(ask.contains("count.json"), "{ask}");

    // The repaired script ran and its output passed.
    assert_eq!(
        std::fs::read_to_string(root.join("code/fetch/main.py")).unwrap(),
        GOOD_SCRIPT
    );
    assert_eq!(
        read_json(&root.join(OUT).join("count.json")),
        json!({"count": 2})
    );
    assert_eq!(
        entries(root),
        [
            entry("script-1", "script", "failed"),
            entry("script-repair-1", "user_message", "completed"),
            entry("script-2", "script", "completed"),
        ]
    );
}

#[test]
fn a_locked_script_is_not_repaired_and_the_step_runs_agentically() {
    // As in the original, a failing script under lock_code is left as it is and the step
    // runs as an agentic step (its description, its gate) instead of failing outright.
    let server = FakeServer::start(Box::new(|_| (200, completion("unused", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        WRONG_OUTPUT_SCRIPT,
        json!({"lock_code": true}),
        json!({"llm": {"provider": "openai", "model_id": "fixer"},
               "providers": server.providers()}),
    );
    let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let stdout = text(&out.stdout);
    // The agent here writes nothing: the gate still fails.
    assert!(!out.status.success(), "{stdout}");
    let seen = server.seen();
    assert!(!seen.is_empty(), "the step ran agentically");
    let asked = serde_json::to_string(&seen).unwrap();
    assert!(
        !asked.contains("Fix the script"),
        "no repair of a locked script: {asked}"
    );
    assert!(asked.contains("Count the open tickets."), "{asked}");
    let summary = read_json(&root.join(OUT).join("execution-final-summary.json"));
    let result = summary["execution_result"].as_str().unwrap();
    assert!(result.contains("$.count"), "{result}");
    assert_eq!(
        std::fs::read_to_string(root.join("code/fetch/main.py")).unwrap(),
        WRONG_OUTPUT_SCRIPT,
        "a locked script is left as it was"
    );
    let all = entries(root);
    assert_eq!(
        all[..2],
        [
            entry("script-1", "script", "failed"),
            entry("script-agentic-fallback", "script", "completed")
        ]
    );
    let session = std::fs::read_to_string(root.join(OUT).join("session.json")).unwrap();
    assert!(session.contains("lock_code is set"), "{session}");
    assert!(session.contains("agentically instead"), "{session}");
}

#[test]
fn a_failing_script_without_a_model_says_how_to_give_one() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, BROKEN_SCRIPT, json!({}), json!({}));
    let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let stdout = text(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    let summary = read_json(&root.join(OUT).join("execution-final-summary.json"));
    let result = summary["execution_result"].as_str().unwrap();
    assert!(result.contains("KeyError: 'identifier'"), "{result}");
    assert!(
        result.contains("Repairing the script needs an LLM"),
        "{result}"
    );
    assert!(result.contains("--llm PROVIDER:MODEL"), "{result}");
}

#[test]
fn the_digest_example_runs_its_scripts_offline_with_no_model() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ticket-digest");
    support::workspace::copy_workspace(&example, &root, &["runs", "db.sqlite"]);
    let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("done: 0 turns, 0 LLM calls"),
        "no model: {stdout}"
    );

    let exec = root.join("runs/iteration-0/execution");
    let export = read_json(&exec.join("export-open/open_tickets.json"));
    assert_eq!(export["count"], 4);
    let ids: Vec<i64> = export["tickets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [1, 2, 3, 4], "open tickets, oldest first");
    let csv = std::fs::read_to_string(exec.join("export-open/open_tickets.csv")).unwrap();
    assert!(
        csv.starts_with("id,subject,customer,priority,opened_at"),
        "{csv}"
    );
    assert_eq!(csv.lines().count(), 5);

    let digest = std::fs::read_to_string(exec.join("digest/digest.md")).unwrap();
    assert!(
        digest.starts_with("# Open tickets for Support EMEA"),
        "{digest}"
    );
    assert!(digest.contains("## High (2)"), "{digest}");
    assert!(
        digest.contains("- #4 Feature request: dark mode (acme, opened 04 Nov)"),
        "{digest}"
    );
    let db = rusqlite::Connection::open(root.join("db/db.sqlite")).unwrap();
    let recorded: (i64, i64) = db
        .query_row("SELECT tickets, high FROM digests", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .expect("one digest recorded through trellis_db");
    assert_eq!(recorded, (4, 2));

    // `runs show` points at the script's logs.
    let out = trellis(&["runs", "show", root.to_str().unwrap(), "export-open"]);
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(shown.contains("script-1 [script] completed"), "{shown}");
    assert!(shown.contains("script logs:"), "{shown}");
    let stdout_log = root.join("runs/iteration-0/logs/export-open/script-stdout.txt");
    assert!(shown.contains(&stdout_log.display().to_string()), "{shown}");
    assert_eq!(
        std::fs::read_to_string(stdout_log).unwrap(),
        "exported 4 open tickets\n"
    );
}
