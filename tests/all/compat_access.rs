//! Workflows written for the original run as they are: who may write what, missing
//! context entries, variables and groups, the fields real workspaces carry, run retention
//! and unsafe ids, each through the binary.

use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion, result_of};
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

use crate::support::plugin_build::text;

/// Writes a workspace: `steps` of the plan, their step configs, workflow.json reaching
/// `server` (plus `manifest_extra`), and a database with `t(x)`.
fn workspace(
    root: &Path,
    server: &FakeServer,
    steps: Value,
    configs: Value,
    manifest_extra: Value,
) {
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
    create_db(root, "CREATE TABLE IF NOT EXISTS t(x);");
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
    let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("warning: planning/step_config.json: steps[0].agent_configs.db_access")
            && all.contains("ignored"),
        "{all}"
    );
    let results = server.tool_results(1);
    for id in ["kb", "learn"] {
        assert!(
            result_of(&results, id).starts_with("error"),
            "{id}: {results:?}"
        );
    }
    assert!(!root.join("knowledgebase/notes/x.md").exists());
    assert!(!root.join("learnings/_global/x.md").exists());
    assert!(
        !result_of(&results, "db").starts_with("error"),
        "{results:?}"
    );
    assert!(
        !result_of(&results, "asset").starts_with("error"),
        "{results:?}"
    );
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
    let out = trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--step",
        "second",
    ]);
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
    let out = trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--step",
        "second",
    ]);
    assert!(!out.status.success());
}

// ---------------------------------------------------------------- fields real workspaces carry

/// `workflow.json`'s `capabilities`, `execution_defaults` and `run_retention_count`, a
/// `db_access`, a `published_llm_id` among the fallbacks and index-keyed `option_routes` load
/// (validate passes) and the workflow runs.
#[test]
fn the_originals_keys_load_and_the_workflow_runs() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([
            {"id": "ask", "type": "human_input", "title": "Ask", "description": "Ask.",
             "question": "Which?", "response_type": "multiple_choice", "options": ["a", "b"],
             "option_routes": {"0": "work", "1": "end"}, "variable_name": "CHOICE"},
            {"id": "work", "type": "regular", "title": "Work", "description": "Work."}
        ]),
        json!([{"id": "work", "agent_configs": {
            "db_access": "read-write",
            "execution_llm": {"provider": "openai", "model_id": "m",
                "fallbacks": [{"provider": "openai", "model_id": "n", "published_llm_id": "p-1"}]}}}]),
        json!({"capabilities": {"web_search": true}, "execution_defaults": {"timeout": 60},
               "run_retention_count": 3}),
    );
    let out = trellis(&["validate", root.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("0 errors"), "{stdout}");
    let out = trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--input",
        "CHOICE=a",
    ]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// Context offloading is on unless a step turns it off: a large tool result goes to a file
/// and the conversation gets a reference; `false` keeps it in the conversation.
#[test]
fn large_tool_results_are_offloaded_unless_the_step_turns_it_off() {
    for (configs, offloaded) in [
        (json!({}), true),
        (json!({"enable_context_offloading": false}), false),
    ] {
        let server = scripted(vec![
            calls(vec![call(
                "big",
                "workspace__read_file",
                json!({"path": "knowledgebase/big.md"}),
            )]),
            completion("done", &[]),
        ]);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        workspace(
            root,
            &server,
            json!([{"id": "work", "type": "regular", "title": "Work", "description": "Read."}]),
            json!([{"id": "work", "agent_configs": configs}]),
            json!({}),
        );
        write_files(root, &[("knowledgebase/big.md", "x".repeat(40_000))]);
        let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let result = result_of(&server.tool_results(1), "big");
        let file = root.join("runs/iteration-0/execution/work/tool-results/big.json");
        assert_eq!(file.is_file(), offloaded, "{configs}");
        assert_eq!(
            result.starts_with("The result of this tool call ("),
            offloaded,
            "{configs}: {}",
            &result[..80.min(result.len())]
        );
        assert_eq!(result.len() > 40_000, !offloaded);
    }
}

// ---------------------------------------------------------------- run retention

fn archived(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "iteration-0")
        .collect();
    names.sort();
    names
}

/// A full run keeps `run_retention_count` archived runs and deletes older ones; an invalid
/// value is a warning and 5 are kept.
#[test]
fn a_full_run_keeps_run_retention_count_archived_runs() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let steps = json!([{"id": "work", "type": "regular", "title": "Work", "description": "W."}]);
    workspace(
        root,
        &server,
        steps.clone(),
        json!([]),
        json!({"run_retention_count": 2}),
    );
    for n in 0..=4 {
        write_files(
            root,
            &[(&format!("runs/iteration-{n}/marker") as &str, "x")],
        );
    }
    write_files(root, &[("runs/notes.txt", "not a run")]);
    let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert_eq!(archived(root), ["iteration-4", "iteration-5", "notes.txt"]);
    assert!(
        stdout.contains("deleted 3 archived runs past the 2 kept"),
        "{stdout}"
    );

    workspace(
        root,
        &server,
        steps,
        json!([]),
        json!({"run_retention_count": "many"}),
    );
    for n in 6..=10 {
        write_files(
            root,
            &[(&format!("runs/iteration-{n}/marker") as &str, "x")],
        );
    }
    let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains(
            "warning: workflow.json: run_retention_count: expected a whole number from 1 to 50"
        ),
        "{all}"
    );
    assert_eq!(
        archived(root),
        [
            "iteration-11",
            "iteration-7",
            "iteration-8",
            "iteration-9",
            "iteration-10",
            "notes.txt"
        ]
        .iter()
        .map(|s| s.to_string())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>()
    );
}

// ---------------------------------------------------------------- unsafe ids

/// A step id that is the name of a folder every run has beside the step output folders
/// (`Downloads/`, `archived/`) is refused by `validate` and `run`, in any case.
#[test]
fn step_ids_naming_a_run_folder_are_refused() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    for (id, folder) in [("Downloads", "Downloads"), ("ARCHIVED", "archived")] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        workspace(
            root,
            &server,
            json!([{"id": id, "type": "regular", "title": "T", "description": "d"}]),
            json!([]),
            json!({}),
        );
        let expected = format!(
            "planning/plan.json: steps[0].id (step \"{id}\"): step id \"{id}\" is the name of a \
             folder every run has (runs/<run>/execution/{folder}/), where the step's output \
             folder would go: choose another id"
        );
        let out = trellis(&["validate", root.to_str().unwrap()]);
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(!out.status.success(), "{all}");
        assert!(all.contains(&expected), "{all}");
        let before = support::tree_digest(root);
        let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
        assert!(!out.status.success());
        assert_eq!(
            support::tree_digest(root),
            before,
            "the run changed nothing"
        );
    }
    assert_eq!(server.connections(), 0);
}

/// Step, item and route ids name folders: one that is not a plain path component is
/// refused by `validate` and by `run` before anything in the workspace changes. A literal
/// `api_key` in workflow.json names the environment variable to use instead.
#[test]
fn unsafe_ids_and_literal_keys_are_refused_before_anything_runs() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let sub = |id: &str| {
        json!({"id": id, "type": "message_sequence", "title": "S", "description": "d",
               "items": [{"id": "i", "type": "user_message", "message": "m"}]})
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            json!([{"id": "../escape", "type": "regular", "title": "T", "description": "d"}]),
            "steps[0].id",
        ),
        (
            json!([{"id": "s", "type": "message_sequence", "title": "T", "description": "d",
                    "items": [{"id": "a/b", "type": "user_message", "message": "m"}]}]),
            "steps[0].items[0].id",
        ),
        (
            json!([{"id": "s", "type": "message_sequence", "title": "T", "description": "d",
                    "items": [{"id": "i", "type": "user_message", "message": "m"}],
                    "predefined_routes": [{"route_id": "..", "sub_agent_step": sub("..")}]}]),
            "steps[0].predefined_routes[0].route_id",
        ),
    ];
    for (steps, at) in cases {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        workspace(root, &server, steps, json!([]), json!({}));
        let out = trellis(&["validate", root.to_str().unwrap()]);
        let stdout = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(!out.status.success(), "{stdout}");
        assert!(
            stdout.contains(&format!("planning/plan.json: {at}"))
                && stdout.contains("not a plain name"),
            "{at}: {stdout}"
        );
        let before = support::tree_digest(root);
        let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
        assert!(!out.status.success());
        assert!(
            text(&out.stderr).contains("not a plain name"),
            "{}",
            text(&out.stderr)
        );
        assert_eq!(
            support::tree_digest(root),
            before,
            "{at}: the run changed the workspace"
        );
    }
    assert_eq!(server.connections(), 0);

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([{"id": "s", "type": "regular", "title": "T", "description": "d"}]),
        json!([]),
        json!({"providers": {"openai": {"base_url": server.base_url(), "api_key": "sk-x"}}}),
    );
    let out = trellis(&["validate", root.to_str().unwrap()]);
    let stdout = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success());
    assert!(
        stdout.contains("providers.openai.api_key")
            && stdout.contains("put the key in the environment variable OPENAI_API_KEY"),
        "{stdout}"
    );

    // A skill named by a path out of the workspace is refused at load too.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([{"id": "s", "type": "regular", "title": "T", "description": "d"}]),
        json!([{"id": "s", "agent_configs": {"enabled_skills": ["../../etc"]}}]),
        json!({}),
    );
    let out = trellis(&["validate", root.to_str().unwrap()]);
    let stdout = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success());
    assert!(
        stdout.contains("steps[0].agent_configs.enabled_skills[0]"),
        "{stdout}"
    );
}

// ---------------------------------------------------------------- variables and groups

/// `variables/variables.json` is read beside `workflow.json`: its variables and enabled
/// groups take part in the run, `{{VAR}}` is substituted in context entries and human_input
/// texts, and a human_input answer with a `variable_name` becomes a variable.
#[test]
fn variables_json_variables_groups_and_answers_reach_the_run() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([
            {"id": "ask", "type": "human_input", "title": "Ask", "description": "Ask.",
             "question": "Which topic for {{REGION}}?", "response_type": "text",
             "variable_name": "TOPIC"},
            {"id": "work", "type": "regular", "title": "Work", "description": "Work.",
             "context_dependencies": ["reference/{{ REGION }}/{{TOPIC}}.md"],
             "context_output": "report-{{TOPIC}}.json"}
        ]),
        json!([]),
        json!({}),
    );
    write_files(
        root,
        &[
            (
                "variables/variables.json",
                json!({
                    "variables": [{"name": "REGION", "value": "eu", "description": "where"}],
                    "groups": [
                        {"name": "north", "values": {"REGION": "no"}, "enabled": true},
                        {"name": "off", "values": {"REGION": "xx"}, "enabled": false}
                    ]
                })
                .to_string(),
            ),
            ("reference/no/sales.md", "sales in the north".to_string()),
        ],
    );
    let out = trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--input",
        "TOPIC=sales",
    ]);
    let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{all}");
    assert!(root.join("runs/iteration-0/north").is_dir(), "{all}");
    assert!(!root.join("runs/iteration-0/off").exists(), "{all}");
    let answer: Value = serde_json::from_slice(
        &std::fs::read(root.join("runs/iteration-0/north/execution/ask/step-1.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(answer["question"], "Which topic for no?");
    let seen = server.seen();
    assert_eq!(seen.len(), 1, "one group runs");
    let system = seen[0]["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("- REGION = no"), "{system}");
    assert!(system.contains("- TOPIC = sales"), "{system}");
    assert!(system.contains("- reference/no/ (read-only)"), "{system}");
}

/// A script may modify the database and write `db/assets/` by default, as every agent turn
/// may; nothing else outside its output folder changes.
#[test]
fn a_script_modifies_the_database_and_writes_db_assets() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([{"id": "load", "type": "regular", "title": "Load", "description": "Load rows."}]),
        json!([{"id": "load", "agent_configs": {"declared_execution_mode": "scripted",
                                                 "lock_code": true}}]),
        json!({}),
    );
    write_files(
        root,
        &[(
            "code/load/main.py",
            "import trellis_db\n\
             trellis_db.execute('INSERT INTO t VALUES (?)', [42])\n\
             open('/db/assets/chart.txt', 'w').write('chart')\n\
             print('loaded')\n",
        )],
    );
    let mut before = support::tree_digest(root);
    let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(root.join("db/assets/chart.txt")).unwrap(),
        "chart"
    );
    let conn = rusqlite::Connection::open(root.join("db/db.sqlite")).unwrap();
    let n: i64 = conn
        .query_row("SELECT count(*) FROM t WHERE x = 42", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
    let mut after = support::tree_digest(root);
    for digest in [&mut before, &mut after] {
        digest.retain(|k, _| !k.starts_with("runs") && !k.starts_with("db/"));
    }
    assert_eq!(after, before);
    assert_eq!(server.connections(), 0, "no LLM call");
}
