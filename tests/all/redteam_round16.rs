//! Red team round 16 (variables in a plan's texts, the schedules' history file, a workspace
//! another process holds, the turn's call time): each a test that failed before its fix.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion, result_of};
use support::serve::Serve;
use support::trellis;
use support::workspace::{create_db, write_files};

use crate::support::plugin_build::text;

/// A 1 MB variable named 1,000 times in a `human_input` question made a 1 GB step file and
/// took 4 GB of memory; through `trellis serve`, one request took more than 6 GB (MEDIUM,
/// MEDIUM), and `validate` passed it. Now `validate`, `run` and the server refuse it,
/// naming the JSON path and the limit, before anything is expanded or written; an answer
/// that makes a question too long is refused when the run starts.
#[test]
fn a_variable_named_many_times_in_a_question_is_refused_before_it_is_expanded() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let big = "a".repeat(100_000);
    write_files(
        &ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "ask", "type": "human_input", "title": "Ask",
                     "question": "Q {{A}}".repeat(20), "variable_name": "B"},
                    {"id": "again", "type": "human_input", "title": "Again",
                     "question": "Q {{B}}".repeat(20), "variable_name": "C"},
                    {"id": "pick", "type": "human_input", "title": "Pick",
                     "question": "Which?", "response_type": "multiple_choice",
                     "options": vec!["{{A}}".repeat(3); 5]}]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            (
                "workflow.json",
                json!({"variables": {"A": big}}).to_string(),
            ),
        ],
    );
    let root = ws.to_str().unwrap();
    let out = trellis(&["validate", root]);
    let stderr = text(&out.stderr) + &text(&out.stdout);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("steps[0].question") && stderr.contains("1 MiB"),
        "{stderr}"
    );
    let out = trellis(&["run", root, "--input", "B=b", "--input", "C=c"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("steps[0].question"), "{stderr}");
    assert!(
        stderr.len() < 100_000,
        "the error is short: {}",
        stderr.len()
    );
    assert!(support::bytes_under(&ws.join("runs")) < 100_000);

    let serve = Serve::start(&ws, None, &[]);
    let (status, body) = serve.post("/api/executions", &json!({}));
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("steps[0].question"), "{body}");
    drop(serve);

    // Within the limits with workflow.json's values; an answer makes the next question too
    // long: the run refuses before its first step.
    write_files(
        &ws,
        &[(
            "workflow.json",
            json!({"variables": {"A": "x"}}).to_string(),
        )],
    );
    let out = trellis(&["validate", root]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let answer = format!("B={}", "b".repeat(60_000));
    let out = trellis(&[
        "run", root, "--input", &answer, "--input", "C=c", "--input", "pick=xxx",
    ]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("steps[1].question") && stderr.contains("step again"),
        "{stderr}"
    );
    assert!(support::bytes_under(&ws.join("runs")) < 100_000);
    let out = trellis(&[
        "run", root, "--input", "B=b", "--input", "C=c", "--input", "pick=xxx",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// A `schedule-runs.json` that is a symbolic link or a FIFO read as an empty history:
/// `history_error` null, and each firing unrecorded (MEDIUM). The API names the file, and
/// the next firing sets it aside (the link itself, never followed) and starts the history.
#[test]
fn a_schedule_history_that_is_not_a_file_is_an_error_not_no_runs() {
    let llm = crate::serve_schedules::model();
    let dir = tempfile::tempdir().unwrap();
    let ws = crate::serve_schedules::workspace(dir.path(), &llm);
    let outside = dir.path().join("outside.json");
    std::fs::write(&outside, "[]").unwrap();
    let config = dir.path().join("config");
    let serve = Serve::start_with(
        &ws,
        None,
        &["--allow-host", "127.0.0.1"],
        &[
            ("XDG_CONFIG_HOME", config.to_str().unwrap()),
            ("TRELLIS_SCHEDULER", "off"),
        ],
    );
    // Planted while the server runs (one starting sets an unreadable history aside).
    std::os::unix::fs::symlink(&outside, ws.join("schedule-runs.json")).unwrap();
    let (status, body) = serve.get("/api/scheduler/jobs/daily/runs", &[]);
    assert_eq!(status, 200, "{body}");
    assert!(
        body["history_error"]
            .as_str()
            .is_some_and(|e| e.contains("symbolic link")),
        "{body}"
    );
    let (status, body) = serve.post("/api/scheduler/jobs/daily/trigger", &json!({}));
    assert_eq!(status, 202, "{body}");
    let job = crate::serve_schedules::ended(&serve, "daily");
    assert_eq!(job["last_run"]["status"], "success", "{job}");
    let (_, body) = serve.get("/api/scheduler/jobs/daily/runs", &[]);
    assert_eq!(body["history_error"], Value::Null, "{body}");
    assert_eq!(body["runs"].as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "[]");
    let aside: Vec<String> = std::fs::read_dir(&ws)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("schedule-runs.unreadable-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(
        ws.join(&aside[0]).is_symlink(),
        "the link is kept as it was"
    );
}

/// `POST /api/executions` while another process (`trellis script`, `trellis run`) held the
/// workspace answered `202` and the execution then failed (LOW): it is `409 workspace_busy`
/// naming the holder, and nothing is started.
#[test]
fn an_execution_on_a_workspace_another_process_holds_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    write_files(
        &ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "ask", "type": "human_input", "title": "Ask", "question": "Q?"}]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
        ],
    );
    let serve = Serve::start(&ws, None, &[]);
    let held = trellis_runner::workspace_lock::WorkspaceLock::try_acquire(&ws).unwrap();
    let (status, body) = serve.post("/api/executions", &json!({}));
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "workspace_busy", "{body}");
    assert!(body.to_string().contains("in use by pid"), "{body}");
    let (_, events) = serve.get("/api/executions/events?since=0", &[]);
    assert_eq!(
        events["events"].as_array().map(Vec::len),
        Some(0),
        "{events}"
    );
    drop(held);
    let (status, body) = serve.post("/api/executions", &json!({}));
    assert_eq!(status, 202, "{body}");
}

/// Calls running at once each counted on the whole of the turn's call time: four endless
/// calls with `--max-turn-call-seconds 20` ran 18 s each, 73 s together (LOW). A call
/// starting now takes its deadline out of what is left, so calls running at once share it.
#[test]
fn calls_running_at_once_share_the_turns_call_time() {
    const ENDLESS: &str =
        "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) SELECT count(*) FROM c";
    let n = Arc::new(AtomicUsize::new(0));
    let server = FakeServer::start(Box::new(move |_| {
        if n.fetch_add(1, Ordering::SeqCst) > 0 {
            return (200, completion("done", &[]));
        }
        let mut c = completion("", &[("x", json!({}))]);
        c["choices"][0]["message"]["tool_calls"] = Value::Array(
            (1..=4)
                .map(|i| {
                    json!({"id": format!("q{i}"), "type": "function", "function": {
                        "name": "query_workflow_db",
                        "arguments": json!({"sql": ENDLESS}).to_string()}})
                })
                .collect(),
        );
        (200, c)
    }));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_files(
        root,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "w", "type": "regular", "title": "W", "description": "d"}]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": server.providers()})
                .to_string(),
            ),
        ],
    );
    create_db(root, "CREATE TABLE t(x);");
    let out = trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-turn-call-seconds",
        "4",
        "--max-concurrent-calls",
        "4",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let results = server.tool_results(1);
    let outcomes: Vec<String> = ["q1", "q2", "q3", "q4"]
        .iter()
        .map(|id| result_of(&results, id))
        .collect();
    // Each ran to a deadline of its share: a quarter of the 4 s each, 4 s together (each
    // had the whole 4 s before: 16 s together).
    let deadlines: Vec<u64> = outcomes
        .iter()
        .filter_map(|r| {
            let at = r.find("ran past its deadline and was stopped (")?;
            let rest = &r[at + "ran past its deadline and was stopped (".len()..];
            rest[..rest.find("ms)")?].parse().ok()
        })
        .collect();
    assert_eq!(deadlines.len(), 4, "{outcomes:#?}");
    assert!(
        deadlines.iter().sum::<u64>() <= 4000,
        "{deadlines:?}: {outcomes:#?}"
    );
}
