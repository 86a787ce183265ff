//! Workflows written for the original run as they are: who may write what, missing
//! context entries, variables and groups, the fields real workspaces carry, run retention
//! and unsafe ids, each through the binary.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::trellis;
use support::workspace::{create_db, write_files};

/// A server answering the n-th request with `replies[n]` (the last one after that).
fn scripted(replies: Vec<Value>) -> FakeServer {
    let n = Arc::new(AtomicUsize::new(0));
    FakeServer::start(Box::new(move |_| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        (200, replies[i.min(replies.len() - 1)].clone())
    }))
}

fn call(id: &str, name: &str, args: Value) -> Value {
    json!({"id": id, "type": "function",
           "function": {"name": name, "arguments": args.to_string()}})
}

/// A completion asking for `calls` (built with [`call`]).
fn calls(calls: Vec<Value>) -> Value {
    let mut c = completion("", &[("x", json!({}))]);
    c["choices"][0]["message"]["tool_calls"] = Value::Array(calls);
    c
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Writes a workspace: `steps` of the plan, their step configs, workflow.json reaching
/// `server` (plus `manifest_extra`), and a database with `t(x)`.
fn workspace(root: &Path, server: &FakeServer, steps: Value, configs: Value, manifest_extra: Value) {
    let mut manifest = json!({"llm": {"provider": "openai", "model_id": "m"},
                              "providers": server.providers()});
    for (k, v) in manifest_extra.as_object().into_iter().flatten() {
        manifest[k] = v.clone();
    }
    write_files(
        root,
        &[
            (
                "planning/plan.json",
                json!({"objective": "compat", "steps": steps}).to_string(),
            ),
            (
                "planning/step_config.json",
                json!({"steps": configs}).to_string(),
            ),
            ("workflow.json", manifest.to_string()),
        ],
    );
    create_db(root, "CREATE TABLE t(x);");
}

/// The tool results of request `n` of `server`, as (tool call id, content).
fn tool_results(server: &FakeServer, n: usize) -> Vec<(String, String)> {
    server.seen()[n]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap_or_default().to_string(),
                m["content"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn result_of(results: &[(String, String)], id: &str) -> String {
    results
        .iter()
        .find(|(i, _)| i == id)
        .unwrap_or_else(|| panic!("no result for {id}: {results:?}"))
        .1
        .clone()
}

// ---------------------------------------------------------------- who may write what

/// `write_access: {"db": true}` narrows the turn to the database alone: the knowledgebase
/// and the learnings the step could write are read-only for it. `db_access` is accepted
/// with a warning and changes nothing.
#[test]
fn a_db_only_item_writes_the_database_and_nothing_else() {
    let server = scripted(vec![
        calls(vec![
            call(
                "kb",
                "workspace__write_file",
                json!({"path": "knowledgebase/notes/x.md", "content": "x"}),
            ),
            call(
                "learn",
                "workspace__write_file",
                json!({"path": "learnings/_global/x.md", "content": "x"}),
            ),
            call(
                "db",
                "mutate_workflow_db",
                json!({"statements": [{"sql": "INSERT INTO t VALUES (7)"}]}),
            ),
            call(
                "asset",
                "workspace__write_file",
                json!({"path": "db/assets/a.txt", "content": "a"}),
            ),
        ]),
        completion("done", &[]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([{"id": "work", "type": "message_sequence", "title": "Work", "description": "Work.",
                "items": [{"id": "go", "type": "user_message", "message": "Go.",
                           "write_access": {"db": true}}]}]),
        json!([{"id": "work", "agent_configs": {
            "knowledgebase_access": "read-write", "learnings_access": "read-write",
            "db_access": "read"}}]),
        json!({}),
    );
    let out = trellis(&["run", root.to_str().unwrap()]);
    let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("warning: planning/step_config.json: steps[0].agent_configs.db_access")
            && all.contains("ignored"),
        "{all}"
    );
    let results = tool_results(&server, 1);
    for id in ["kb", "learn"] {
        assert!(result_of(&results, id).starts_with("error"), "{id}: {results:?}");
    }
    assert!(!root.join("knowledgebase/notes/x.md").exists());
    assert!(!root.join("learnings/_global/x.md").exists());
    assert!(!result_of(&results, "db").starts_with("error"), "{results:?}");
    assert!(!result_of(&results, "asset").starts_with("error"), "{results:?}");
    assert!(root.join("db/assets/a.txt").is_file());
    let conn = rusqlite::Connection::open(root.join("db/db.sqlite")).unwrap();
    let n: i64 = conn
        .query_row("SELECT count(*) FROM t WHERE x = 7", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
}

// ---------------------------------------------------------------- missing context entries

/// A `context_dependencies` or `additional_read_paths` entry that does not exist (a step run
/// on its own before the step that writes it) is context: the run warns, grants what exists
/// and goes on; the agent is told what is missing.
#[test]
fn a_missing_context_entry_is_a_warning_not_a_failed_step() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([
            {"id": "first", "type": "regular", "title": "First", "description": "Write a.json."},
            {"id": "second", "type": "regular", "title": "Second", "description": "Read a.json.",
             "context_dependencies": ["runs/iteration-0/execution/first/a.json",
                                      "knowledgebase/facts.md"]}
        ]),
        json!([{"id": "second", "agent_configs": {"additional_read_paths": ["reference/guide"]}}]),
        json!({}),
    );
    write_files(root, &[("knowledgebase/facts.md", "facts")]);
    let out = trellis(&["run", root.to_str().unwrap(), "--step", "second"]);
    let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{all}");
    for entry in [
        "context_dependencies entry \"runs/iteration-0/execution/first/a.json\" does not exist",
        "additional_read_paths entry \"reference/guide\" does not exist",
    ] {
        assert!(all.contains(entry), "missing {entry:?} in {all}");
    }
    let system = server.seen()[0]["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        system.contains(
            "- runs/iteration-0/execution/first/a.json (declared in context_dependencies) does not exist"
        ),
        "{system}"
    );
    assert!(system.contains("- knowledgebase/ (read-only)"), "{system}");
    // A dependency naming what no turn may see is still refused.
    write_files(
        root,
        &[(
            "planning/plan.json",
            json!({"objective": "compat", "steps": [
                {"id": "second", "type": "regular", "title": "Second", "description": "x",
                 "context_dependencies": ["planning/plan.json"]}]})
            .to_string(),
        )],
    );
    let out = trellis(&["run", root.to_str().unwrap(), "--step", "second"]);
    assert!(!out.status.success());
}
