//! The database tools of every agent turn, `query_workflow_db` and `mutate_workflow_db`,
//! through the binary against the fake OpenAI-compatible server: what they do with the
//! default (read-write) access, what a read-only turn is refused, and the fences they share
//! with scripts (no ATTACH, no file-moving pragmas, no VACUUM INTO, no transaction control,
//! row caps, the deadline), each with a check that nothing outside the grant changed.

use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion, result_of};
use support::workspace::{create_db, write_files};
use support::{tree_digest, trellis};

/// A server answering the n-th request with `replies[n]` (the last one after that).
fn scripted(replies: Vec<Value>) -> FakeServer {
    let n = Arc::new(AtomicUsize::new(0));
    FakeServer::start(Box::new(move |_| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        (200, replies[i.min(replies.len() - 1)].clone())
    }))
}

/// A one-step workspace (`work`, a message_sequence of `items`) with a database holding
/// `t(x)` = 1, 2, 3, the step config `configs` and the server's provider.
pub(crate) fn workspace(root: &Path, server: &FakeServer, items: Value, configs: Value) {
    let plan = json!({"objective": "db tools", "steps": [
        {"id": "work", "type": "message_sequence", "title": "Work",
         "description": "Work with the database.", "items": items}]});
    write_files(
        root,
        &[
            ("planning/plan.json", plan.to_string()),
            (
                "planning/step_config.json",
                json!({"steps": [{"id": "work", "agent_configs": configs}]}).to_string(),
            ),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": server.providers()})
                .to_string(),
            ),
            ("knowledgebase/notes/keep.md", "kept".to_string()),
        ],
    );
    create_db(
        root,
        "CREATE TABLE t(x); INSERT INTO t VALUES (1), (2), (3);",
    );
}

/// `trellis run ROOT`; the operator approves loopback, where the fake LLM is.
fn run(root: &Path) -> std::process::Output {
    trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"])
}

use crate::support::plugin_build::text;

fn rows(root: &Path, sql: &str) -> Vec<i64> {
    let conn = rusqlite::Connection::open(root.join("db/db.sqlite")).unwrap();
    let mut stmt = conn.prepare(sql).unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect()
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

#[test]
fn an_agent_describes_queries_and_modifies_the_database_and_writes_its_assets() {
    let server = scripted(vec![
        calls(vec![call("c1", "query_workflow_db", json!({}))]),
        calls(vec![call(
            "c2",
            "mutate_workflow_db",
            json!({"statements": [
                {"sql": "CREATE TABLE findings(id INTEGER PRIMARY KEY, note TEXT)"},
                {"sql": "INSERT INTO findings(note) VALUES (?), (?)", "params": ["a", "b"]},
                {"sql": "UPDATE t SET x = x * ? WHERE x > ?", "params": [10, 1]}
            ]}),
        )]),
        calls(vec![
            call(
                "c3",
                "query_workflow_db",
                json!({"sql": "SELECT x FROM t ORDER BY x", "max_rows": 2}),
            ),
            call(
                "c4",
                "workspace__write_file",
                json!({"path": "db/assets/chart.svg", "content": "<svg/>"}),
            ),
        ]),
        completion("done", &[]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([{"id": "go", "type": "user_message", "message": "Record the findings."}]),
        json!({}),
    );
    let out = run(root);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );

    let first = &server.seen()[0];
    let names: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"query_workflow_db") && names.contains(&"mutate_workflow_db"),
        "{names:?}"
    );
    let system = first["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("query and modify through the db tools"),
        "{system}"
    );
    assert!(system.contains("db/assets/ (read-write)"), "{system}");

    let results = server.last_tool_results();
    let tables: Value = serde_json::from_str(&result_of(&results, "c1")).unwrap();
    assert_eq!(tables["tables"][0]["name"], "t", "{tables}");
    assert!(
        tables["tables"][0]["sql"]
            .as_str()
            .unwrap()
            .contains("CREATE TABLE t")
    );
    let mutated: Value = serde_json::from_str(&result_of(&results, "c2")).unwrap();
    assert_eq!(mutated["rows_changed"], json!([0, 2, 2]), "{mutated}");
    let queried: Value = serde_json::from_str(&result_of(&results, "c3")).unwrap();
    assert_eq!(
        queried,
        json!({"row_count": 2, "truncated": true, "rows": [{"x": 1}, {"x": 20}]})
    );
    assert!(
        !result_of(&results, "c4").starts_with("error"),
        "{results:?}"
    );

    assert_eq!(rows(root, "SELECT x FROM t ORDER BY x"), [1, 20, 30]);
    assert_eq!(rows(root, "SELECT id FROM findings"), [1, 2]);
    assert_eq!(
        std::fs::read_to_string(root.join("db/assets/chart.svg")).unwrap(),
        "<svg/>"
    );
}

#[test]
fn a_failing_statement_rolls_the_whole_mutation_back() {
    let server = scripted(vec![
        calls(vec![call(
            "c1",
            "mutate_workflow_db",
            json!({"statements": [
                {"sql": "INSERT INTO t VALUES (4)"},
                {"sql": "DELETE FROM t"},
                {"sql": "INSERT INTO missing VALUES (1)"}
            ]}),
        )]),
        completion("done", &[]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([{"id": "go", "type": "user_message", "message": "Change things."}]),
        json!({}),
    );
    let before = std::fs::read(root.join("db/db.sqlite")).unwrap();
    let out = run(root);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result = result_of(&server.last_tool_results(), "c1");
    assert!(
        result.starts_with("error: statements[2]: no such table: missing")
            && result.contains("nothing was changed"),
        "{result}"
    );
    assert_eq!(rows(root, "SELECT x FROM t ORDER BY x"), [1, 2, 3]);
    assert_eq!(std::fs::read(root.join("db/db.sqlite")).unwrap(), before);
}

/// Every escape a model might try through the two tools, in one response: each is refused
/// with a message, and neither the database nor anything around it changed.
#[test]
fn the_db_tools_refuse_every_escape_and_change_nothing() {
    let outside = tempfile::tempdir().unwrap();
    let evil = outside.path().join("evil.db");
    let copy = outside.path().join("copy.db");
    let attacks: Vec<(&str, &str, Value, &str)> = vec![
        (
            "attach",
            "query_workflow_db",
            json!({"sql": format!("ATTACH DATABASE '{}' AS e", evil.display())}),
            "not authorized",
        ),
        (
            "attach-mutate",
            "mutate_workflow_db",
            json!({"statements": [{"sql": format!("ATTACH '{}' AS e", evil.display())}]}),
            "not authorized",
        ),
        (
            "pragma",
            "mutate_workflow_db",
            json!({"statements": [{"sql": "PRAGMA journal_mode = OFF"}]}),
            "not authorized",
        ),
        (
            "temp-dir",
            "query_workflow_db",
            json!({"sql": "PRAGMA temp_store_directory = '/tmp'"}),
            "not authorized",
        ),
        (
            "vacuum-into",
            "mutate_workflow_db",
            json!({"statements": [{"sql": format!("VACUUM INTO '{}'", copy.display())}]}),
            "VACUUM is not allowed",
        ),
        (
            "extension",
            "query_workflow_db",
            json!({"sql": "SELECT load_extension('/tmp/x.so')"}),
            "not authorized",
        ),
        (
            "write-through-query",
            "query_workflow_db",
            json!({"sql": "DELETE FROM t"}),
            "read-only",
        ),
        (
            "commit-early",
            "mutate_workflow_db",
            json!({"statements": [{"sql": "DELETE FROM t"}, {"sql": "COMMIT"}]}),
            "not allowed",
        ),
        (
            "two-in-one",
            "mutate_workflow_db",
            json!({"statements": [{"sql": "DELETE FROM t; DROP TABLE t"}]}),
            "",
        ),
        (
            "too-many-rows",
            "query_workflow_db",
            json!({"sql": "SELECT 1", "max_rows": 1_000_000}),
            "max_rows: expected 1 to",
        ),
        (
            "schema",
            "mutate_workflow_db",
            json!({"statements": [{"sql": "PRAGMA writable_schema = ON"}]}),
            "not authorized",
        ),
    ];
    let server = scripted(vec![
        calls(
            attacks
                .iter()
                .map(|(id, tool, args, _)| call(id, tool, args.clone()))
                .collect(),
        ),
        completion("done", &[]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([{"id": "go", "type": "user_message", "message": "Try."}]),
        json!({}),
    );
    let db_before = std::fs::read(root.join("db/db.sqlite")).unwrap();
    let mut tree_before = tree_digest(root);
    let out = run(root);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let results = server.last_tool_results();
    for (id, _, _, why) in &attacks {
        let result = result_of(&results, id);
        assert!(
            result.starts_with("error:") && result.contains(why),
            "{id}: {result}"
        );
    }
    assert_eq!(std::fs::read(root.join("db/db.sqlite")).unwrap(), db_before);
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    // Only the run folder and db/assets (created for the turn) are new.
    let mut tree_after = tree_digest(root);
    tree_after.retain(|k, _| !k.starts_with("runs") && !k.starts_with("db/assets"));
    tree_before.retain(|k, _| !k.starts_with("runs"));
    assert_eq!(tree_after, tree_before);
}

/// An item whose `write_access` leaves the database out makes both the database and
/// `db/assets/` read-only for that turn; the next item (no narrowing) may write again.
#[test]
fn a_turn_narrowed_away_from_the_database_cannot_modify_it() {
    let server = scripted(vec![
        calls(vec![
            call(
                "m1",
                "mutate_workflow_db",
                json!({"statements": [{"sql": "DELETE FROM t"}]}),
            ),
            call(
                "w1",
                "workspace__write_file",
                json!({"path": "db/assets/x.txt", "content": "x"}),
            ),
            call(
                "q1",
                "query_workflow_db",
                json!({"sql": "SELECT count(*) AS n FROM t"}),
            ),
        ]),
        completion("done", &[]),
        calls(vec![call(
            "m2",
            "mutate_workflow_db",
            json!({"statements": [{"sql": "DELETE FROM t WHERE x = 1"}]}),
        )]),
        completion("done", &[]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([
            {"id": "notes-only", "type": "user_message", "message": "Notes.",
             "write_access": {"knowledgebase": true}},
            {"id": "free", "type": "user_message", "message": "Clean up."}
        ]),
        json!({"knowledgebase_access": "read-write"}),
    );
    std::fs::create_dir_all(root.join("db/assets")).unwrap();
    let out = run(root);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let seen = server.seen();
    let first_turn: Vec<(String, String)> = seen[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().to_string(),
                m["content"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let m1 = result_of(&first_turn, "m1");
    assert!(
        m1.starts_with("error:") && m1.contains("read-only access to the workflow db"),
        "{m1}"
    );
    assert!(
        result_of(&first_turn, "w1").starts_with("error"),
        "{first_turn:?}"
    );
    assert!(
        result_of(&first_turn, "q1").contains("\"n\":3"),
        "{first_turn:?}"
    );
    assert!(!root.join("db/assets/x.txt").exists());
    let m2 = result_of(&server.last_tool_results(), "m2");
    assert!(m2.contains("\"rows_changed\":[1]"), "{m2}");
    assert_eq!(rows(root, "SELECT x FROM t ORDER BY x"), [2, 3]);
}

/// A statement that runs past the call's deadline is stopped, with a message saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_query_is_stopped_at_the_deadline() {
    use trellis_runner::db_tools::{QUERY_WORKFLOW_DB, call};
    use trellis_sandbox::capabilities::{DbGrant, DbWriteBudget};
    let dir = tempfile::tempdir().unwrap();
    create_db(dir.path(), "CREATE TABLE t(x);");
    let limits = trellis_sandbox::Limits {
        timeout: std::time::Duration::from_millis(300),
        ..Default::default()
    };
    let grant = DbGrant {
        path: dir.path().join("db/db.sqlite"),
        writable: true,
    };
    let err = call(
        QUERY_WORKFLOW_DB,
        json!({"sql": "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) \
                       SELECT count(*) FROM c"}),
        Some(grant.clone()),
        &limits,
        &DbWriteBudget::new(limits.fs),
    )
    .await
    .unwrap_err();
    assert!(err.contains("ran past its deadline"), "{err}");
    // No database: a plain error, nothing created.
    let empty = tempfile::tempdir().unwrap();
    let err = call(
        QUERY_WORKFLOW_DB,
        json!({}),
        None,
        &limits,
        &DbWriteBudget::new(limits.fs),
    )
    .await
    .unwrap_err();
    assert!(err.contains("no database"), "{err}");
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0);
}

/// The database tool calls of one turn share one growth budget: many calls cannot grow the
/// database past what one call may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_db_tool_calls_of_a_turn_share_one_growth_budget() {
    use trellis_runner::db_tools::{MUTATE_WORKFLOW_DB, call};
    use trellis_sandbox::capabilities::{DbGrant, DbWriteBudget, FsLimits};
    let dir = tempfile::tempdir().unwrap();
    create_db(dir.path(), "CREATE TABLE t(x);");
    let limits = trellis_sandbox::Limits {
        fs: FsLimits {
            write_bytes: 3 << 20,
            ..FsLimits::DEFAULT
        },
        ..Default::default()
    };
    let grant = DbGrant {
        path: dir.path().join("db/db.sqlite"),
        writable: true,
    };
    // 2 MiB per call: one fits the 3 MiB budget, two do not.
    let grow = json!({"statements": [{"sql": "INSERT INTO t VALUES (randomblob(2097152))"}]});
    let size = || {
        std::fs::metadata(dir.path().join("db/db.sqlite"))
            .unwrap()
            .len()
    };
    let turn = DbWriteBudget::new(limits.fs);
    call(
        MUTATE_WORKFLOW_DB,
        grow.clone(),
        Some(grant.clone()),
        &limits,
        &turn,
    )
    .await
    .unwrap();
    let after_one = size();
    let err = call(
        MUTATE_WORKFLOW_DB,
        grow.clone(),
        Some(grant.clone()),
        &limits,
        &turn,
    )
    .await
    .unwrap_err();
    assert!(err.contains("the database may grow by"), "{err}");
    assert_eq!(size(), after_one, "the refused call changed nothing");
    // The next turn has a budget of its own.
    let next = DbWriteBudget::new(limits.fs);
    call(MUTATE_WORKFLOW_DB, grow, Some(grant), &limits, &next)
        .await
        .unwrap();
    assert!(size() > after_one);
}

// ---------------------------------------------------------------- tool rounds

/// A server asking for `workspace:list_dir` whenever tools are offered, and answering
/// "final answer" when they are not.
fn looping_server() -> FakeServer {
    FakeServer::start(Box::new(|body| {
        let offered = body["tools"].as_array().is_some_and(|t| !t.is_empty());
        if offered {
            (
                200,
                completion("", &[("workspace__list_dir", json!({"path": "db"}))]),
            )
        } else {
            (200, completion("final answer", &[]))
        }
    }))
}

/// What the last request of `server` says: whether it offered tools, and its last message.
fn last_request(server: &FakeServer) -> (bool, String) {
    let seen = server.seen();
    let last = seen.last().unwrap();
    let offered = last["tools"].as_array().is_some_and(|t| !t.is_empty());
    let messages = last["messages"].as_array().unwrap();
    let message = messages.last().unwrap()["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (offered, message)
}

/// A turn that keeps calling tools is told, after the operator's limit of rounds, that it is
/// out of them, and answers in one last call without tools; the step goes on and completes.
/// The limit comes from `--max-tool-rounds`, else from the user config file.
#[test]
fn a_turn_out_of_tool_rounds_answers_in_a_last_call_without_tools() {
    let server = looping_server();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    workspace(
        &root,
        &server,
        json!([{"id": "go", "type": "user_message", "message": "Look around."}]),
        json!({}),
    );
    let out = trellis(&[
        "run",
        root.to_str().unwrap(),
        "--max-tool-rounds",
        "3",
        "--allow-host",
        "127.0.0.1",
    ]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(server.seen().len(), 4, "3 tool rounds, then the last call");
    let (offered, message) = last_request(&server);
    assert!(!offered);
    assert!(
        message.starts_with("You are out of tool rounds"),
        "{message}"
    );
    let summary: Value = serde_json::from_slice(
        &std::fs::read(root.join("runs/iteration-0/execution/work/execution-final-summary.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(summary["status"], "completed");
    assert_eq!(summary["execution_result"], "final answer");

    // The user config file sets it too.
    let config = dir.path().join("config");
    support::workspace::write_file(&config, "trellis/config.toml", "max_tool_rounds = 2\n");
    let mut command =
        support::trellis_command(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    command.env("XDG_CONFIG_HOME", &config);
    let out = command.output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.seen().len(), 4 + 3);

    // A value out of range names the file and the key.
    support::workspace::write_file(&config, "trellis/config.toml", "max_tool_rounds = 0\n");
    let mut command =
        support::trellis_command(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    command.env("XDG_CONFIG_HOME", &config);
    let out = command.output().unwrap();
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("config.toml: max_tool_rounds: expected 1 to"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------- tool filters

/// The tool names the first request of `server` offered.
fn offered(server: &FakeServer) -> Vec<String> {
    let seen = server.seen();
    seen.last().unwrap()["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// `selected_servers` selects external servers: naming only those (loaded or not) keeps the
/// built-in file tools; `workspace:<tool>` entries of `selected_tools` or
/// `enabled_custom_tools` narrow them; the database tools are never removed.
#[test]
fn tool_filters_keep_built_in_and_database_tools_as_the_original_reads_them() {
    let all_workspace = [
        "workspace__read_file",
        "workspace__write_file",
        "workspace__list_dir",
        "workspace__search",
        "workspace__apply_patch",
        "workspace__delete_file",
        "workspace__move_file",
    ];
    let cases: Vec<(Value, Vec<&str>)> = vec![
        (json!({"selected_servers": ["aws"]}), all_workspace.to_vec()),
        (
            json!({"selected_servers": ["aws"], "selected_tools": ["workspace:read_file"]}),
            vec!["workspace__read_file"],
        ),
        (
            json!({"enabled_custom_tools": ["workspace:list_dir", "workflow_db:query_workflow_db"]}),
            vec!["workspace__list_dir"],
        ),
        (
            json!({"enabled_custom_tools": ["human_tools:*"]}),
            all_workspace.to_vec(),
        ),
    ];
    for (configs, workspace_tools) in cases {
        let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        workspace(
            root,
            &server,
            json!([{"id": "go", "type": "user_message", "message": "Go."}]),
            configs.clone(),
        );
        let out = run(root);
        let stderr = text(&out.stderr);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{configs}: {stderr}");
        let mut want: Vec<String> = workspace_tools.iter().map(|s| s.to_string()).collect();
        want.extend([
            "query_workflow_db".to_string(),
            "mutate_workflow_db".to_string(),
        ]);
        let mut got = offered(&server);
        got.sort();
        want.sort();
        assert_eq!(got, want, "{configs}");
        if configs.get("selected_servers").is_some() {
            assert!(stdout.contains("server \"aws\" is not loaded"), "{stdout}");
        }
    }
}

// ---------------------------------------------------------------- the north star

/// Every turn is told the plan's objective and its step's expected outputs, and reads (never
/// writes) `soul/soul.md`.
#[test]
fn every_turn_reads_the_soul_and_knows_its_objective_and_outputs() {
    let server = scripted(vec![
        calls(vec![
            call(
                "read",
                "workspace__read_file",
                json!({"path": "soul/soul.md"}),
            ),
            call(
                "write",
                "workspace__write_file",
                json!({"path": "soul/soul.md", "content": "new goals"}),
            ),
        ]),
        completion("done", &[]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([{"id": "go", "type": "user_message", "message": "Go."}]),
        json!({}),
    );
    write_files(
        root,
        &[
            (
                "planning/plan.json",
                json!({"objective": "Keep the ledger right.",
                       "success_criteria": "Every row reconciled.",
                       "steps": [{"id": "work", "type": "message_sequence", "title": "Work",
                                  "description": "Reconcile.",
                                  "context_output": ["report.json", "proof.json"],
                                  "items": [{"id": "go", "type": "user_message", "message": "Go."}]}]})
                .to_string(),
            ),
            ("soul/soul.md", "Objective: a right ledger. Never delete rows.".to_string()),
        ],
    );
    let out = run(root);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let system = server.seen()[0]["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    for line in [
        "Workflow objective: Keep the ledger right.",
        "Success criteria: Every row reconciled.",
        "Read soul/soul.md before you start",
        "Expected outputs of this step, in its output folder: report.json, proof.json",
        "- soul/ (read-only)",
    ] {
        assert!(system.contains(line), "missing {line:?} in {system}");
    }
    let results = server.last_tool_results();
    assert!(
        result_of(&results, "read").contains("Never delete rows"),
        "{results:?}"
    );
    assert!(
        result_of(&results, "write").starts_with("error"),
        "{results:?}"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("soul/soul.md")).unwrap(),
        "Objective: a right ledger. Never delete rows."
    );
}

// ---------------------------------------------------------------- skills and learnings

/// `enabled_skills` attaches the named skill folders read-only (`skills/<name>/`, else
/// `learnings/<name>/`; a missing one is named, not fatal), and the reflection turn is asked
/// to keep `learnings/_global/` as a skill: topic files indexed by `SKILL.md`.
#[test]
fn skills_are_attached_read_only_and_learnings_are_kept_as_a_skill() {
    let server = scripted(vec![
        calls(vec![call(
            "w",
            "workspace__write_file",
            json!({"path": "skills/sql-style/SKILL.md", "content": "changed"}),
        )]),
        completion("done", &[]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([{"id": "go", "type": "user_message", "message": "Go."}]),
        json!({"enabled_skills": ["sql-style", "reporting", "nope"],
               "learning_objective": "what made the queries slow"}),
    );
    write_files(
        root,
        &[
            ("skills/sql-style/SKILL.md", "Use CTEs."),
            ("learnings/reporting/SKILL.md", "Tables first."),
        ],
    );
    let out = run(root);
    let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("enabled_skills entry \"nope\" does not exist"),
        "{all}"
    );
    let seen = server.seen();
    let system = seen[0]["messages"][0]["content"].as_str().unwrap();
    for line in [
        "- skills/sql-style/ (read-only): the skill \"sql-style\": read its SKILL.md",
        "- learnings/reporting/ (read-only): the skill \"reporting\"",
        "- nope (declared in enabled_skills) does not exist",
    ] {
        assert!(system.contains(line), "missing {line:?} in {system}");
    }
    let w = result_of(
        &seen[1]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| {
                (
                    m["tool_call_id"].as_str().unwrap().to_string(),
                    m["content"].as_str().unwrap().to_string(),
                )
            })
            .collect::<Vec<_>>(),
        "w",
    );
    assert!(w.starts_with("error"), "{w}");
    assert_eq!(
        std::fs::read_to_string(root.join("skills/sql-style/SKILL.md")).unwrap(),
        "Use CTEs."
    );
    // The reflection turn: its message asks for topic files and the SKILL.md index.
    let reflection = seen.last().unwrap()["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(reflection.starts_with("Reflection:"), "{reflection}");
    assert!(
        reflection.contains("learnings/_global/SKILL.md as its index"),
        "{reflection}"
    );
}

/// A statement that rewrites every page of the database leaves the file as large as it
/// was: it is charged what it writes (the journal and the database), not what the file
/// grew by (round 6: 52.6 GB written in one builder turn on a planted 205 MB database,
/// against a 1 GiB budget). Past the budget the statement is stopped, rolled back, and the
/// reason given.
#[tokio::test]
async fn rewrites_that_do_not_grow_the_database_are_charged_what_they_write() {
    use trellis_runner::db_tools::{MUTATE_WORKFLOW_DB, call};
    use trellis_sandbox::capabilities::{DbGrant, DbWriteBudget, FsLimits};
    let dir = tempfile::tempdir().unwrap();
    // 1,000 rows of 4,000 bytes: a 4 MB database.
    create_db(
        dir.path(),
        "CREATE TABLE t(v); WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n \
         WHERE i < 1000) INSERT INTO t SELECT randomblob(4000) FROM n;",
    );
    let db = dir.path().join("db/db.sqlite");
    let limits = trellis_sandbox::Limits {
        fs: FsLimits {
            write_bytes: 16 << 20,
            ..FsLimits::DEFAULT
        },
        ..Default::default()
    };
    let grant = DbGrant {
        path: db.clone(),
        writable: true,
    };
    let digest = || {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.query_row(
            "SELECT hex(substr(group_concat(hex(v)), 1, 4000)) FROM t",
            [],
            |r| r.get::<_, String>(0),
        )
        .unwrap()
    };
    let size = std::fs::metadata(&db).unwrap().len();
    let rewrite = json!({"statements": [{"sql": "UPDATE t SET v = randomblob(4000)"}]});
    let turn = DbWriteBudget::new(limits.fs);
    let mut done = 0;
    let refusal = loop {
        let before = digest();
        match call(
            MUTATE_WORKFLOW_DB,
            rewrite.clone(),
            Some(grant.clone()),
            &limits,
            &turn,
        )
        .await
        {
            Ok(_) => done += 1,
            Err(e) => {
                assert_eq!(digest(), before, "the stopped statement was rolled back");
                break e;
            }
        }
        assert!(
            done < 5,
            "{done} rewrites of 4 MB ran within a 16 MiB budget"
        );
    };
    assert!(done >= 1, "the first rewrite fits: {refusal}");
    assert!(
        refusal.contains("the statement was stopped")
            && refusal.contains("bytes left of the write budget"),
        "{refusal}"
    );
    assert_eq!(
        std::fs::metadata(&db).unwrap().len(),
        size,
        "the file never grew"
    );
}
