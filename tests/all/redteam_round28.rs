//! Red team round 28 (the host's own writes and what it keeps): each a test that failed
//! before its fix.

use crate::support;

use serde_json::json;
use support::plugin_build::all_output;
use support::trellis;
use support::workspace::{tree_bytes, write_file};

/// A gate recorded every check of every value: 20 failing `pattern` checks over a 50 KB
/// file of 10,000 values made 200,000 records, 200 MB of reports and a 31 MB line on stdout,
/// under a 1 MiB run budget (MEDIUM); a server keeping the failed executions held 35 MB each.
/// A report records 100 failed and 100 passed checks, each text cut to 512 bytes, and
/// counts the rest.
#[test]
fn a_gate_of_many_failing_checks_records_a_bounded_number() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let checks: Vec<serde_json::Value> = (0..20)
        .map(|i| json!({"path": "$.a[*]", "pattern": format!("^y{i}$")}))
        .collect();
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "x", "steps": [{"id": "s", "type": "regular", "title": "s",
            "description": "s", "context_output": ["data.json"],
            "validation_schema": {"files": [{"file_name": "data.json", "must_exist": true,
                                             "json_checks": checks}]}}]})
        .to_string(),
    );
    write_file(
        root,
        "planning/step_config.json",
        json!({"steps": [{"id": "s", "agent_configs": {
            "declared_execution_mode": "scripted", "lock_code": true}}]})
        .to_string(),
    );
    write_file(root, "workflow.json", "{}");
    write_file(
        root,
        "code/s/main.py",
        "import os, json\n\
         json.dump({'a': ['x'] * 10000}, open(os.path.join(os.environ['STEP_OUTPUT_DIR'], \
         'data.json'), 'w'))\n",
    );
    let out = trellis(&["run", root.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        out.stdout.len() < 1 << 20,
        "{} bytes of stdout",
        out.stdout.len()
    );
    let written = tree_bytes(&root.join("runs"));
    assert!(written < 4 << 20, "{written} bytes written");
    let report: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.join("runs/iteration-0/logs/s/pre_validation.json")).unwrap(),
    )
    .unwrap();
    let failed = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["passed"] == false)
        .count();
    assert_eq!(failed, 100, "{}", all_output(&out));
    assert_eq!(report["failures_left_out"], 200_000 - 100);
}

/// The messages the host builds for a turn (a foreach row's, from database rows; a gate
/// repair's) were kept and sent outside every budget: rows of 1 MiB made a 100 MB run
/// folder under a 1 MiB `--max-run-result-mib` (MEDIUM). They count in what the run keeps:
/// past it the run ends, naming the budget.
#[test]
fn the_messages_of_foreach_rows_count_in_what_the_run_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let llm = support::fake_llm::FakeServer::start(Box::new(|_| {
        (200, support::fake_llm::completion("done", &[]))
    }));
    support::workspace::regular_steps(root, llm.providers(), &[]);
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "x", "steps": [{"id": "each", "type": "message_sequence",
            "title": "Each", "description": "d",
            "items": [{"id": "rows", "type": "foreach", "source_sql": "SELECT b FROM t",
                       "message": "Row: {{.b}}"}]}]})
        .to_string(),
    );
    write_file(root, "planning/step_config.json", r#"{"steps": []}"#);
    support::workspace::create_db(
        root,
        "CREATE TABLE t(b TEXT); \
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10) \
         INSERT INTO t SELECT printf('%.*c', 1048576, 'x') FROM n;",
    );
    let out = trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-run-result-mib",
        "2",
    ]);
    let said = all_output(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("--max-run-result-mib"), "{said}");
    let sent: usize = llm.seen().iter().map(|b| b.to_string().len()).sum();
    assert!(sent < 8 << 20, "{sent} bytes sent to the model: {said}");
}

/// `trellis schedules trigger` on a workspace at its quota left its firing recorded as
/// `running` (later `interrupted`), the quota never named (LOW): it is recorded as an
/// error saying why.
#[test]
fn a_firing_the_quota_refuses_is_recorded_as_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let llm = support::fake_llm::FakeServer::start(Box::new(|_| {
        (200, support::fake_llm::completion("done", &[]))
    }));
    support::workspace::regular_steps(root, llm.providers(), &["s"]);
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("workflow.json")).unwrap()).unwrap();
    manifest["schedules"] =
        json!([{"id": "daily", "cron_expression": "0 9 * * *", "enabled": true}]);
    write_file(root, "workflow.json", manifest.to_string());
    std::fs::create_dir_all(root.join("knowledge")).unwrap();
    std::fs::write(root.join("knowledge/data.bin"), vec![7u8; 5 << 20]).unwrap();
    let out = trellis(&[
        "schedules",
        "trigger",
        root.to_str().unwrap(),
        "daily",
        "--allow-host",
        "127.0.0.1",
        "--max-workspace-mib",
        "4",
    ]);
    let said = all_output(&out);
    assert!(!out.status.success(), "{said}");
    let runs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("schedule-runs.json")).unwrap()).unwrap();
    assert_eq!(runs[0]["status"], "error", "{runs}");
    assert!(
        runs[0]["error"]
            .as_str()
            .unwrap()
            .contains("--max-workspace-mib"),
        "{runs}"
    );
}
