//! Red team round 14 (the server's scheduler, the builder's steering, two processes on one
//! workspace, guests of one's own): each a test that failed before its fix.

use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion, result_of};
use support::serve::Serve;
use support::trellis;
use support::workspace::{create_db, write_file, write_files};

use crate::support::plugin_build::text;

/// A workspace of one scripted step `s` whose `main.py` is `script`.
fn scripted(root: &Path, script: &str) {
    write_files(
        root,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "s", "type": "regular", "title": "S", "description": "d"}]})
                .to_string(),
            ),
            (
                "planning/step_config.json",
                json!({"steps": [{"id": "s", "agent_configs":
                    {"declared_execution_mode": "scripted"}}]})
                .to_string(),
            ),
            ("code/s/main.py", script.to_string()),
        ],
    );
}

/// A schedule delay of 2^63-1 minutes panicked the server's scheduler at every tick, and
/// 2^64-1 overflowed its decisions (HIGH, LOW); ids of 150,000 characters made 30 MB of
/// history a minute (MEDIUM). `validate` refuses each, naming the field and the limit.
#[test]
fn schedule_delays_past_a_year_and_ids_past_128_bytes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    scripted(root, "print('hi')\n");
    let long = "x".repeat(200);
    write_file(
        root,
        "workflow.json",
        json!({"schedules": [
            {"id": "a", "cron_expression": "* * * * *", "max_start_delay_minutes": 9_223_372_036_854_775_807u64},
            {"id": "b", "cron_expression": "* * * * *"},
            {"id": "c", "cron_expression": "* * * * *", "after_schedule_id": "b",
             "after_delay_minutes": 18_446_744_073_709_551_615u64},
            {"id": long, "cron_expression": "* * * * *"}
        ]})
        .to_string(),
    );
    let out = trellis(&["validate", root.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    for expected in [
        "schedules[0].max_start_delay_minutes: max_start_delay_minutes is 9223372036854775807: at most 527040 (a year) is accepted",
        "schedules[2].after_delay_minutes: after_delay_minutes is 18446744073709551615: at most 527040",
        "schedules[3].id: schedule id is 200 bytes long: at most 128",
    ] {
        assert!(stdout.contains(expected), "{expected}\n{stdout}");
    }
}

/// `trellis script` ran while a run held the workspace, and wrote into the run's folders
/// (LOW): it is refused, naming the holder, and writes nothing.
#[test]
fn a_script_does_not_run_while_another_process_holds_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    scripted(root, "open('/tmp-never', 'w')\n");
    let held = trellis_runner::workspace_lock::WorkspaceLock::try_acquire(root).unwrap();
    for command in [
        vec!["script", root.to_str().unwrap(), "--step", "s"],
        vec!["check", root.to_str().unwrap(), "--step", "s"],
    ] {
        let out = trellis(&command);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{command:?}");
        assert!(
            stderr.contains("is in use by pid") && stderr.contains("runs only when no run"),
            "{command:?}: {stderr}"
        );
    }
    assert!(!root.join("runs").exists());
    drop(held);
    let out = trellis(&["script", root.to_str().unwrap(), "--step", "s"]);
    assert!(root.join("runs").exists(), "{}", text(&out.stderr));
}

/// A guest's file named `x\nforged` printed a line of its own in `runs show` and `run`;
/// a guest's `session.json` that does not parse made `runs list` fail for every step
/// (LOW, LOW): the name is escaped, and only that step says its session is unreadable.
#[test]
fn a_guests_file_names_and_session_file_cannot_forge_or_hide_run_lines() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    scripted(
        root,
        "import os\nout = os.environ['STEP_OUTPUT_DIR']\nopen(os.path.join(out, 'x\\nforged: yes'), 'w').write('1')\nopen(os.path.join(out, 'session.json'), 'w').write('{not json')\n",
    );
    let out = trellis(&["script", root.to_str().unwrap(), "--step", "s"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let show = trellis(&["runs", "show", root.to_str().unwrap(), "s"]);
    let stdout = text(&show.stdout);
    assert!(show.status.success(), "{stdout}{}", text(&show.stderr));
    assert!(stdout.contains("x\\x0aforged: yes"), "{stdout}");
    assert!(
        !stdout.lines().any(|l| l.trim() == "forged: yes"),
        "{stdout}"
    );
    let list = trellis(&["runs", "list", root.to_str().unwrap()]);
    let stdout = text(&list.stdout);
    assert!(list.status.success(), "{stdout}{}", text(&list.stderr));
    assert!(stdout.contains("unreadable (session.json"), "{stdout}");
}

/// One answer of endless database queries kept `trellis run` working 120 s for 8 calls,
/// 16 minutes for 64, with no bound on the sum (MEDIUM): the calls of a turn share one time
/// budget; a call gets at most what is left, and the calls past it are not run, saying why.
#[test]
fn the_tool_calls_of_a_turn_share_one_time_budget() {
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
        "2",
        "--max-concurrent-calls",
        "1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let results = server.tool_results(1);
    let first = result_of(&results, "q1");
    assert!(
        first.contains("interrupt") || first.contains("deadline"),
        "{first}"
    );
    for id in ["q2", "q3", "q4"] {
        let result = result_of(&results, id);
        assert!(
            result.contains("not run: this turn's tool calls took their 2 s together"),
            "{id}: {result}"
        );
    }
}

/// The scheduler API answered `201` to concurrent adds of which one was lost, and `200` to
/// each of four concurrent deletes of one schedule (LOW): edits are one at a time, so each
/// `201` is in the file and one delete of many succeeds.
#[test]
fn concurrent_schedule_edits_over_http_are_serialized() {
    let llm = crate::serve_schedules::model();
    let dir = tempfile::tempdir().unwrap();
    let ws = crate::serve_schedules::workspace(dir.path(), &llm);
    let config = dir.path().join("config");
    let serve = Arc::new(Serve::start_with(
        &ws,
        None,
        &["--allow-host", "127.0.0.1"],
        &[
            ("XDG_CONFIG_HOME", config.to_str().unwrap()),
            ("TRELLIS_SCHEDULER", "off"),
        ],
    ));
    let adds: Vec<_> = (0..6)
        .map(|i| {
            let serve = serve.clone();
            std::thread::spawn(move || {
                serve.post(
                    "/api/scheduler/jobs",
                    &json!({"id": format!("job{i}"), "cron_expression": "0 9 * * *"}),
                )
            })
        })
        .collect();
    for add in adds {
        let (status, body) = add.join().unwrap();
        assert_eq!(status, 201, "{body}");
    }
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(ws.join("workflow.json")).unwrap()).unwrap();
    let ids: Vec<&str> = manifest["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    for i in 0..6 {
        assert!(ids.contains(&format!("job{i}").as_str()), "{ids:?}");
    }
    let deletes: Vec<_> = (0..4)
        .map(|_| {
            let serve = serve.clone();
            std::thread::spawn(move || {
                serve
                    .request("DELETE", "/api/scheduler/jobs/job0", &[], "")
                    .0
            })
        })
        .collect();
    let mut statuses: Vec<u16> = deletes.into_iter().map(|d| d.join().unwrap()).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 404, 404, 404]);
}

/// A `workflow.json` replaced by a link or a FIFO read as "no schedules" (LOW): the
/// scheduler API answers `422 workspace_errors` naming it, as for a file that does not parse.
#[test]
fn a_workflow_json_that_is_not_a_file_is_an_error_not_no_schedules() {
    let llm = crate::serve_schedules::model();
    let dir = tempfile::tempdir().unwrap();
    let ws = crate::serve_schedules::workspace(dir.path(), &llm);
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
    let (status, _) = serve.get("/api/scheduler/jobs", &[]);
    assert_eq!(status, 200);
    let real = dir.path().join("real.json");
    std::fs::rename(ws.join("workflow.json"), &real).unwrap();
    std::os::unix::fs::symlink(&real, ws.join("workflow.json")).unwrap();
    let (status, body) = serve.get("/api/scheduler/jobs", &[]);
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("not a regular file"), "{body}");
}

/// A `human_input` step's options went whole into its `input_requested` event: 6,000 of
/// them made a 6 MB event (noticed in round 14): the event shows the first 100, each cut,
/// and how many it left out.
#[test]
fn an_input_requested_event_shows_a_bounded_number_of_options() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let options: Vec<String> = (0..150).map(|i| format!("option {i}")).collect();
    write_files(
        &ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "pick", "type": "human_input", "title": "Pick",
                     "question": "Which one?", "response_type": "multiple_choice",
                     "options": options}]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
        ],
    );
    let serve = Serve::start(&ws, None, &[]);
    let (status, started) = serve.post("/api/executions", &json!({}));
    assert_eq!(status, 202, "{started}");
    let asked = (0..600).find_map(|_| {
        let (_, events) = serve.get("/api/executions/events?since=0", &[]);
        let found = events["events"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["type"] == "input_requested")
            .cloned();
        if found.is_none() {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        found
    });
    let asked = asked.expect("an input_requested event");
    assert_eq!(asked["options"].as_array().unwrap().len(), 100, "{asked}");
    assert_eq!(asked["options"][99], "option 99");
    assert_eq!(asked["options_left_out"], 50);
}
