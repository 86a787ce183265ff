//! Red team round 17 (variables everywhere, the shell's arithmetic, the server's database
//! queries): each a test that failed before its fix.

use crate::support;

use serde_json::{Value, json};
use support::serve::Serve;
use support::trellis;
use support::workspace::write_files;

use crate::support::plugin_build::text;

/// A workspace of `steps` with `variables`, no model.
fn workspace(root: &std::path::Path, steps: Value, variables: Value) {
    write_files(
        root,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": steps}).to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            ("workflow.json", json!({"variables": variables}).to_string()),
        ],
    );
}

/// `validate`'s error lines.
fn validate_errors(root: &std::path::Path) -> String {
    let out = trellis(&["validate", root.to_str().unwrap()]);
    assert!(!out.status.success(), "validate passed");
    text(&out.stdout) + &text(&out.stderr)
}

/// A 3.8 KB variable named in 60,000 `context_dependencies` entries (each path within its
/// 4 KiB) took 1.9 GB and wrote a 233 MB session (MEDIUM); 300 `human_input` steps each
/// asking a 1 MB variable wrote 1.5 GB with 5 groups (MEDIUM). What substitution adds is
/// bounded per step (1 MiB) and per plan (4 MiB), refused by `validate` and `run`.
#[test]
fn what_substitution_adds_is_bounded_per_step_and_per_plan() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("paths");
    let long = "k".repeat(3800);
    workspace(
        &root,
        json!([{"id": "s", "type": "regular", "title": "S", "description": "d",
                "context_dependencies": vec!["knowledgebase/{{A}}"; 1000]}]),
        json!({"A": long}),
    );
    let said = validate_errors(&root);
    assert!(
        said.contains("steps[0].context_dependencies[") && said.contains("1 MiB"),
        "{said}"
    );
    let out = trellis(&["run", root.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("1 MiB"), "{}", text(&out.stderr));

    let root = dir.path().join("questions");
    let steps: Vec<Value> = (0..10)
        .map(|i| {
            json!({"id": format!("h{i}"), "type": "human_input", "title": "H",
                   "question": "{{A}}", "variable_name": format!("v{i}")})
        })
        .collect();
    workspace(&root, json!(steps), json!({"A": "q".repeat(500_000)}));
    let said = validate_errors(&root);
    assert!(
        said.contains("steps[8].question") && said.contains("4 MiB"),
        "the ninth step goes past the plan's 4 MiB: {said}"
    );
    assert!(!said.contains("steps[7]"), "{said}");
}

/// A NUL character in a workflow variable passed `validate` and crashed every scripted step
/// at its start (LOW): `validate` refuses it, naming where it is set.
#[test]
fn a_nul_character_in_a_variable_is_refused_by_validate() {
    let dir = tempfile::tempdir().unwrap();
    workspace(
        dir.path(),
        json!([{"id": "s", "type": "regular", "title": "S", "description": "d"}]),
        json!({"A": "x\u{0}y"}),
    );
    let said = validate_errors(dir.path());
    assert!(
        said.contains("variables.A") && said.contains("NUL"),
        "{said}"
    );
}

/// In `trellis serve`, an answer given while the run waited for it did not become a
/// variable: a later question was asked as the literal `Q{{ans}}` (LOW), where
/// `trellis run --input` substitutes it.
#[test]
fn an_answer_given_while_the_run_waits_becomes_a_variable() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(
        &ws,
        json!([
            {"id": "first", "type": "human_input", "title": "First", "question": "Name?",
             "variable_name": "ans"},
            {"id": "second", "type": "human_input", "title": "Second", "question": "Q{{ans}}",
             "variable_name": "other"}]),
        json!({}),
    );
    let serve = Serve::start(&ws, None, &[]);
    let (status, started) = serve.post("/api/executions", &json!({}));
    assert_eq!(status, 202, "{started}");
    let id = started["execution_id"].as_str().unwrap().to_string();
    let input = format!("/api/executions/{id}/input");
    crate::serve_api::execution_until(&serve, &id, |e| e["waiting_for"]["step_id"] == "first");
    let (status, _) = serve.post(&input, &json!({"answer": "QQQ"}));
    assert_eq!(status, 200);
    let waiting =
        crate::serve_api::execution_until(&serve, &id, |e| e["waiting_for"]["step_id"] == "second");
    assert_eq!(waiting["waiting_for"]["question"], "QQQQ", "{waiting}");
    let (status, _) = serve.post(&input, &json!({"answer": "done"}));
    assert_eq!(status, 200);
    let ended = crate::serve_api::execution_until(&serve, &id, |e| e["status"] != "running");
    assert_eq!(ended["status"], "done", "{ended}");
}

/// Four large read-only queries at once through the server's database endpoint left the
/// server holding 0.85 to 1.64 GB once idle, round after round (MEDIUM): what SQLite freed
/// stayed with the allocator. Each connection gives it back as it ends.
#[test]
fn the_servers_database_queries_give_their_memory_back() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(
        &ws,
        json!([{"id": "s", "type": "regular", "title": "S", "description": "d"}]),
        json!({}),
    );
    support::workspace::create_db(&ws, "CREATE TABLE t(x);");
    let serve = std::sync::Arc::new(Serve::start(&ws, None, &[]));
    let rss = |pid: u32| -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .unwrap()
    };
    let sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 200000000) \
               SELECT count(*) FROM (SELECT DISTINCT x, hex(x * 7919) || printf('%0200d', x) \
               FROM c)";
    let queries: Vec<_> = (0..4)
        .map(|_| {
            let serve = serve.clone();
            std::thread::spawn(move || serve.post("/api/workflow/db/query", &json!({"sql": sql})))
        })
        .collect();
    for query in queries {
        let (status, body) = query.join().unwrap();
        assert_ne!(status, 200, "the query is stopped: {body}");
        assert!(body.to_string().contains("out of memory"), "{body}");
    }
    let held = rss(serve.pid());
    assert!(
        held < 400 << 10,
        "the server holds {held} kB once its queries ended"
    );
}
