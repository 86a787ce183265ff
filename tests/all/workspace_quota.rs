//! The workspace's quota (`--max-workspace-mib`): what a workspace's folder may take on disk,
//! over every run, builder session and execution. Each run was bounded alone, so every new
//! one could grow `db/db.sqlite` by its whole budget again (4.4 GB after two builder
//! sessions on default settings, round 25, MEDIUM).

use crate::support;

use serde_json::json;
use support::fake_llm::FakeServer;
use support::plugin_build::all_output;
use support::serve::Serve;
use support::trellis;
use support::workspace::{create_db, regular_steps};

/// A model that grows the database by 3 MiB in each turn, then ends the turn.
fn growing_model() -> FakeServer {
    support::fake_llm::db_growing_model(3 << 20)
}

/// The results of the model's database calls that were refused by the quota.
fn refused_by_quota(llm: &FakeServer) -> usize {
    llm.seen()
        .iter()
        .flat_map(support::fake_llm::tool_results_of)
        .filter(|(_, result)| result.contains("--max-workspace-mib"))
        .count()
}

fn db_size(root: &std::path::Path) -> u64 {
    std::fs::metadata(root.join("db/db.sqlite")).unwrap().len()
}

/// Four runs of one 3 MiB turn each, with an 8 MiB quota: the first two write, the last
/// two find too little left (12 MiB without the quota, each run within its own budget).
#[test]
fn runs_one_after_another_write_within_the_workspaces_quota() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let llm = growing_model();
    regular_steps(root, llm.providers(), &["s"]);
    create_db(root, "CREATE TABLE t(b BLOB);");
    let mut said = String::new();
    for _ in 0..4 {
        let out = trellis(&[
            "run",
            root.to_str().unwrap(),
            "--allow-host",
            "127.0.0.1",
            "--max-workspace-mib",
            "8",
        ]);
        said += &(all_output(&out));
    }
    let size = db_size(root);
    assert!(size > 6 << 20, "the first runs did not write: {said}");
    assert!(
        size < 8 << 20,
        "the runs grew the database to {size} bytes: {said}"
    );
    assert_eq!(refused_by_quota(&llm), 2, "{said}");
}

/// Builder sessions, each its own process with its own run budget, write within the
/// workspace's quota too.
#[test]
fn builder_sessions_one_after_another_write_within_the_workspaces_quota() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let llm = growing_model();
    regular_steps(root, llm.providers(), &["s"]);
    create_db(root, "CREATE TABLE t(b BLOB);");
    let mut refused = 0;
    let mut said = String::new();
    for _ in 0..4 {
        let out = trellis(&[
            "builder",
            root.to_str().unwrap(),
            "--allow-host",
            "127.0.0.1",
            "--max-workspace-mib",
            "8",
            "-m",
            "grow",
        ]);
        let now = all_output(&out);
        refused += now
            .lines()
            .filter(|l| {
                l.contains("FAILED mutate_workflow_db") && l.contains("--max-workspace-mib")
            })
            .count();
        said += &now;
    }
    let size = db_size(root);
    assert!(size > 6 << 20, "the first sessions did not write: {said}");
    assert!(
        size < 8 << 20,
        "the sessions grew the database to {size} bytes: {said}"
    );
    assert_eq!(refused, 2, "{said}");
}

/// The executions a builder session starts begin only within the session's quota: they
/// were checked against the default quota, so a session kept starting executions (each
/// writing its logs) into a workspace far past its `--max-workspace-mib` (round 30,
/// MEDIUM: 379 MB in a 50 MiB workspace). Here the workspace passes its quota after the
/// session opened (6 MiB written beside it); the execution its model starts is refused.
#[test]
fn a_builder_sessions_executions_begin_only_within_its_quota() {
    use support::fake_llm::completion;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let filled = root.join("knowledge/filled.bin");
    let llm = FakeServer::start(Box::new(move |body| {
        let system = body["messages"][0]["content"].as_str().unwrap_or_default();
        let answered = body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        if system.contains("Say hello.") {
            (200, completion("hello", &[]))
        } else if !answered {
            // Another process fills the workspace while the session is open.
            std::fs::create_dir_all(filled.parent().unwrap()).unwrap();
            std::fs::write(&filled, vec![7u8; 6 << 20]).unwrap();
            (
                200,
                completion("", &[("execute_step", json!({"step_id": "s"}))]),
            )
        } else {
            (200, completion("started", &[]))
        }
    }));
    regular_steps(&root, llm.providers(), &[]);
    support::workspace::write_file(
        &root,
        "planning/plan.json",
        json!({"objective": "o", "steps": [{"id": "s", "type": "regular", "title": "S",
               "description": "Say hello."}]})
        .to_string(),
    );
    let out = trellis(&[
        "builder",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-workspace-mib",
        "4",
        "-m",
        "run s",
    ]);
    let said = all_output(&out);
    assert!(said.contains("--max-workspace-mib"), "{said}");
    let step_calls = llm
        .seen()
        .iter()
        .filter(|b| {
            b["messages"][0]["content"]
                .as_str()
                .is_some_and(|s| s.contains("Say hello."))
        })
        .count();
    assert_eq!(step_calls, 0, "the execution ran: {said}");
}

/// `trellis serve` had no write budget flags: its executions, started one after another,
/// write within the quota it is given, counting what is already in the workspace (here a
/// 4 MiB file of the workspace's own, and an 8 MiB quota: one 3 MiB turn fits, no second).
#[test]
fn the_servers_executions_write_within_the_workspaces_quota() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    let llm = growing_model();
    regular_steps(&root, llm.providers(), &["s"]);
    create_db(&root, "CREATE TABLE t(b BLOB);");
    std::fs::create_dir_all(root.join("knowledge")).unwrap();
    std::fs::write(root.join("knowledge/data.bin"), vec![7u8; 4 << 20]).unwrap();
    let serve = Serve::start(
        &root,
        None,
        &["--allow-host", "127.0.0.1", "--max-workspace-mib", "8"],
    );
    for n in 1..=2 {
        let (status, started) = serve.post("/api/executions", &json!({}));
        assert_eq!(status, 202, "{started}");
        let ended = (0..600).find_map(|_| {
            let (_, events) = serve.get("/api/executions/events?since=0", &[]);
            let count = events["events"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| e["type"] == "execution_ended")
                .count();
            if count < n {
                std::thread::sleep(std::time::Duration::from_millis(100));
                return None;
            }
            Some(())
        });
        assert!(ended.is_some(), "execution {n} did not end");
    }
    let size = db_size(&root);
    assert!(size > 3 << 20, "the first execution did not write");
    assert!(
        size < 4 << 20,
        "the executions grew the database to {size} bytes"
    );
    assert_eq!(refused_by_quota(&llm), 1);
}
