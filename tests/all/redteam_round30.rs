//! Red team round 30 (builder sessions, side agents, servers): each a test that failed
//! before its fix.

use crate::support;

use serde_json::json;
use support::fake_llm::{FakeServer, completion};
use support::plugin_build::all_output;
use support::trellis;
use support::workspace::{create_db, regular_steps};

/// Each side agent's turn kept a whole turn's tool results: a session's turn and its four
/// side agents held five times `--max-turn-result-mib` (1.45 GB peak with 256 MiB each,
/// MEDIUM). A side agent's turn keeps a quarter of it: here 1 MiB of a 4 MiB budget, so
/// its 2 MB query result is not kept, and the model is told why.
#[test]
fn a_side_agent_keeps_a_share_of_a_turns_tool_results() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // Answers by what the conversation is: the side agent and the session's own turns call
    // the model at the same time.
    let llm = FakeServer::start(Box::new(|body| {
        let messages = body["messages"].as_array().unwrap();
        let last = messages.last().unwrap();
        let first_user = messages
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default();
        let reply = if first_user == "side work" {
            if last["role"] == "tool" {
                completion("side work done", &[])
            } else {
                let sql = "SELECT printf('%.*c', 2000000, 'a') AS big";
                completion("", &[("query_database", json!({"sql": sql}))])
            }
        } else if last["role"] == "tool" {
            completion("A side agent is at work.", &[])
        } else if last["content"]
            .as_str()
            .is_some_and(|c| c.contains("bg-side-1"))
        {
            completion("Noted.", &[])
        } else {
            let args = json!({"name": "side", "instruction": "side work"});
            completion("", &[("run_in_background", args)])
        };
        (200, reply)
    }));
    regular_steps(root, llm.providers(), &["s"]);
    create_db(root, "CREATE TABLE t(a);");
    let out = trellis(&[
        "builder",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-turn-result-mib",
        "4",
        "-m",
        "start the side work",
    ]);
    let said = all_output(&out);
    let side_results: Vec<String> = llm
        .seen()
        .iter()
        .filter(|b| b["messages"][1]["content"] == "side work")
        .flat_map(support::fake_llm::tool_results_of)
        .map(|(_, result)| result)
        .collect();
    assert_eq!(side_results.len(), 1, "{side_results:.300?} {said}");
    assert!(
        side_results[0].contains("result not kept") && side_results[0].contains("budget of 1 MiB"),
        "{:.300} {said}",
        side_results[0]
    );
}

/// A run whose model calls ran out between two groups skipped the later groups and said
/// `done`, exiting 0 (and an execution a builder session started once its calls were used
/// ended `done: no step ran`, LOW): the run fails, saying which budget stopped it and how
/// many groups did not run.
#[test]
fn a_run_that_stops_for_its_model_calls_before_its_last_group_fails() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let llm = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    regular_steps(root, llm.providers(), &["s"]);
    support::workspace::with_groups(root, 3);
    let out = trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-model-calls",
        "1",
    ]);
    let said = all_output(&out);
    assert_eq!(llm.seen().len(), 1, "{said}");
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("the run made its 1 model calls")
            && said.contains("2 of its 3 groups did not run"),
        "{said}"
    );
}

/// A gate's report was written outside every budget: 2,000 prevalidation items of a passing
/// gate, no model call, wrote 247 MB of reports under a 1 MiB `--max-run-result-mib`
/// (MEDIUM). A report counts in what the run keeps: the step fails naming the budget.
#[test]
fn gate_reports_count_in_what_the_run_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let checks: Vec<serde_json::Value> = (0..100)
        .map(|_| json!({"path": "$.a[*]", "pattern": "^x$"}))
        .collect();
    // The model writes the file the gates check, then 300 gates pass over it.
    let mut items = vec![json!({"id": "write", "type": "user_message", "message": "Write it."})];
    items.extend((0..300).map(|i| json!({"id": format!("p{i}"), "type": "prevalidation"})));
    let llm = FakeServer::start(Box::new(|body| {
        let written = body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        if written {
            return (200, completion("done", &[]));
        }
        let args = json!({"path": "runs/iteration-0/execution/s/data.json",
                          "content": json!({"a": vec!["x"; 100]}).to_string()});
        (200, completion("", &[("workspace__write_file", args)]))
    }));
    regular_steps(root, llm.providers(), &[]);
    support::workspace::write_file(
        root,
        "planning/plan.json",
        json!({"objective": "o", "steps": [{"id": "s", "type": "message_sequence",
               "title": "S", "description": "d", "items": items,
               "validation_schema": {"files": [{"file_name": "data.json", "must_exist": true,
                                                "json_checks": checks}]}}]})
        .to_string(),
    );
    let out = trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-run-result-mib",
        "1",
    ]);
    let said = all_output(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("--max-run-result-mib"), "{said}");
    assert!(said.contains("gate p"), "{said}");
    let written = support::workspace::tree_bytes(&root.join("runs"));
    assert!(written < 3 << 20, "{written} bytes under runs/: {said}");
    assert_eq!(llm.seen().len(), 2, "{said}");
}

/// `db/seed.sql` made a database of any size (up to 1 GiB): a 140-byte seed of blobs wrote
/// 300 MB under an 8 MiB `--max-run-write-mib` (MEDIUM). The database a seed makes is
/// written out of the run's write budget: past it nothing is left behind, and the error
/// names the budget.
#[test]
fn a_seed_writes_within_the_runs_write_budget() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let llm = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    regular_steps(root, llm.providers(), &["s"]);
    support::workspace::write_file(
        root,
        "db/seed.sql",
        "CREATE TABLE t(b); WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n \
         WHERE i < 30) INSERT INTO t SELECT randomblob(1000000) FROM n;",
    );
    for command in ["run", "script"] {
        let mut args = vec![command, root.to_str().unwrap()];
        if command == "script" {
            support::workspace::write_file(root, "code/s/main.py", "print('hi')\n");
            args.extend(["--step", "s"]);
        }
        args.extend(["--allow-host", "127.0.0.1", "--max-run-write-mib", "8"]);
        let out = trellis(&args);
        let said = all_output(&out);
        assert!(!out.status.success(), "{command}: {said}");
        assert!(said.contains("--max-run-write-mib"), "{command}: {said}");
        let left: Vec<_> = std::fs::read_dir(root.join("db"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["seed.sql"], "{command}: {said}");
    }
    assert!(llm.seen().is_empty());
}
