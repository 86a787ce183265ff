//! Red team round 32 and this round's review: each a test that failed before its fix.

use crate::support;

use serde_json::json;

/// A call of an external MCP server's tool was stopped after a plugin call's 30 s deadline,
/// where the docs give it 300 s, and the error blamed the turn's call time
/// (`--max-turn-call-seconds`) it had not reached. It may take its 300 s.
#[test]
fn an_external_servers_call_may_take_longer_than_a_plugin_call() {
    use support::mcp_servers::{asking_for, fixture_entry, server_file, with_servers};
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let config = server_file(
        &dir.path().join("servers.json"),
        json!({"fx": fixture_entry(&started)}),
    );
    let llm = asking_for(vec![("fx__hang", json!({"seconds": 32}))]);
    let ws = dir.path().join("ws");
    support::mcp_servers::workspace(&ws, json!({"selected_tools": ["fx:hang"]}), &llm);
    let out = with_servers(&["run", ws.to_str().unwrap()], &config)
        .output()
        .unwrap();
    let said = support::plugin_build::all_output(&out);
    assert!(out.status.success(), "{said}");
    let results = llm.last_tool_results();
    assert_eq!(results.len(), 1, "{said}");
    assert!(results[0].1.contains("woke"), "{}", results[0].1);
}

/// The plan of one scripted step `s` running `script` (with `lock_code`: no repair).
fn scripted_step(root: &std::path::Path, script: &str) {
    support::workspace::write_files(
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
                    {"declared_execution_mode": "scripted", "lock_code": true}}]})
                .to_string(),
            ),
            ("code/s/main.py", script.to_string()),
        ],
    );
}

/// `trellis run` of `root` with `--max-turn-call-seconds SECONDS`, its model on loopback.
fn run_with_call_seconds(root: &std::path::Path, seconds: u32) -> std::process::Output {
    support::trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-turn-call-seconds",
        &seconds.to_string(),
    ])
}

/// A failed script's traceback was printed by `trellis run` as one line with every newline
/// shown as `\x0a` (LOW): its lines are printed under the step's line, each marked as its
/// continuation, so the error reads as written and none reads as a line of the run's.
#[test]
fn a_failed_scripts_error_keeps_its_lines_and_forges_none() {
    const FORGED: &str = "step s: completed (0 turn(s))";
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    scripted_step(
        root,
        &format!("raise ValueError('bad\\n{FORGED}\\x1b[2J')\n"),
    );
    let out = support::trellis(&["run", root.to_str().unwrap()]);
    let stdout = support::plugin_build::text(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("step s: failed (") && !l.contains("\\x0a")),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l == format!("    | {FORGED}\\x1b[2J")),
        "{stdout}"
    );
    assert!(!stdout.lines().any(|l| l.starts_with(FORGED)), "{stdout}");
}

/// A failed execution's `execution_ended` event said `"error": null` (LOW); a
/// `Last-Event-ID` that is not a number was read as 0 where `?since=` of it is refused, and a
/// number past the log's end (one from before a restart, the log numbering from 1 again)
/// was waited on, giving the client nothing (LOW). The event names the step that failed;
/// a bad id is `400`; a stale one starts from the beginning.
#[test]
fn a_failed_execution_says_why_and_a_stale_or_bad_event_id_is_not_waited_on() {
    use support::serve::Serve;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    scripted_step(&root, "raise ValueError('no counts today')\n");
    let serve = Serve::start(&root, None, &[]);
    let (status, started) = serve.post("/api/executions", &json!({"step_id": "s"}));
    assert_eq!(status, 202, "{started}");
    // A stale id (past the end) reads from the beginning, the execution's start first.
    let events = serve.stream_at_until(
        "/api/executions/events/stream",
        Some(1_000_000),
        "execution_ended",
    );
    assert_eq!(events[0]["type"], "execution_started", "{events:?}");
    let ended = events.last().unwrap();
    assert_eq!(ended["status"], "failed", "{ended}");
    let error = ended["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("step s: failed: ") && error.contains("no counts today"),
        "{ended}"
    );
    let (status, page) = serve.get("/api/executions/events?since=1000000", &[]);
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["events"][0]["type"], "execution_started", "{page}");
    assert_eq!(page["last"], ended["id"], "{page}");
    let (status, _, body) = serve.request(
        "GET",
        "/api/executions/events/stream",
        &["Last-Event-ID: abc"],
        "",
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("Last-Event-ID"), "{body}");
}

/// `validate` and `run` made every group's variables at once to check the plan's
/// substitutions: five variables of 1 MB and 200 groups held 828 MB, 1,000 groups over
/// 3.5 GB (MEDIUM). The groups' variables are made one group at a time.
#[test]
fn the_variables_of_many_groups_are_not_held_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    scripted_step(&root, "print('ok')\n");
    let variables: Vec<serde_json::Value> = (0..5)
        .map(|i| json!({"name": format!("BIG{i}"), "value": "x".repeat(1 << 20)}))
        .collect();
    let groups: Vec<serde_json::Value> = (0..200)
        .map(|j| json!({"name": format!("g{j}"), "values": {"BIG0": format!("v{j}")}}))
        .collect();
    support::workspace::write_files(
        &root,
        &[(
            "variables/variables.json",
            json!({"variables": variables, "groups": groups}).to_string(),
        )],
    );
    let (code, peak, said) = support::measure::peak_memory(
        support::trellis_command(&["validate", root.to_str().unwrap()]),
        &dir.path().join("validate.log"),
    );
    assert_eq!(code, 0, "{said}");
    eprintln!("validate of 200 groups of 5 MB of variables: peak {peak} bytes");
    assert!(peak < 300 << 20, "{peak}");
}

/// A schedule's `route_selections` had no bound: eight additions over HTTP made an 11.9 MB
/// `workflow.json` that validated, and `serve` held 1 GB for it (parsed, and copied at each
/// second's tick and each request; MEDIUM). The schedules of a workflow hold at most
/// 200,000 JSON values together.
#[test]
fn the_schedules_of_a_workflow_hold_a_bounded_number_of_values() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    scripted_step(&root, "print('ok')\n");
    let routes: serde_json::Map<String, serde_json::Value> = (0..110_000)
        .map(|i| (format!("step-{i}"), json!("r")))
        .collect();
    support::workspace::write_files(
        &root,
        &[(
            "workflow.json",
            json!({"schedules": [{"id": "daily", "cron_expression": "0 9 * * *",
                                  "route_selections": routes}]})
            .to_string(),
        )],
    );
    let out = support::trellis(&["validate", root.to_str().unwrap()]);
    let said = support::plugin_build::all_output(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("workflow.json: schedules: the schedules hold 220")
            && said.contains("more than the 200000"),
        "{said}"
    );
}

/// The answers to an answer's calls past `--max-calls-per-answer` (`not run: ...`, each a
/// result and a record) were kept outside `--max-run-result-mib` and sent back every round:
/// 10 rounds of 10,000 calls left a 141 MB run folder under an 8 MiB budget (MEDIUM). They
/// count with the answer; the first says why, the rest point to it.
#[test]
fn the_answers_to_calls_past_an_answers_limit_count_in_what_the_run_keeps() {
    use support::fake_llm::{FakeServer, completion};
    let llm = FakeServer::start(Box::new(|_| {
        let calls: Vec<(&str, serde_json::Value)> = (0..3_000)
            .map(|_| ("workspace__list_dir", json!({"path": "."})))
            .collect();
        (200, completion("", &calls))
    }));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    support::workspace::regular_steps(root, llm.providers(), &["s"]);
    let out = support::trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-run-result-mib",
        "1",
        "--max-tool-rounds",
        "10",
    ]);
    let said = support::plugin_build::all_output(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("the model's answer") && said.contains("--max-run-result-mib"),
        "{said}"
    );
    let kept = support::workspace::tree_bytes(&root.join("runs"));
    assert!(kept < 4 << 20, "{kept} bytes kept under a 1 MiB budget");
}

/// `call_sub_agent` calls of one turn were not bounded by `--max-turn-call-seconds`: only
/// their sub-agents' tool calls counted, not their model calls, so 2,000 calls of one
/// answer ran for over 1,000 s (MEDIUM). A call's whole time counts; once the turn's is
/// spent, the next call is not run.
#[test]
fn sub_agent_calls_end_within_the_turns_call_time() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use support::fake_llm::{FakeServer, completion, tool_results_of};
    let sub_calls = Arc::new(AtomicUsize::new(0));
    let counted = sub_calls.clone();
    let llm = FakeServer::start(Box::new(move |body| {
        let system = body["messages"][0]["content"].as_str().unwrap_or_default();
        if system.contains("Counts rows.") {
            counted.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(500));
            return (200, completion("Counted. STATUS: COMPLETED", &[]));
        }
        if !tool_results_of(body).is_empty() {
            return (200, completion("done", &[]));
        }
        let args = json!({"route_id": "counter", "instructions": "Count."});
        let calls: Vec<(&str, serde_json::Value)> =
            (0..20).map(|_| ("call_sub_agent", args.clone())).collect();
        (200, completion("", &calls))
    }));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    support::workspace::counter_route(root, llm.providers());
    let out = run_with_call_seconds(root, 2);
    let said = support::plugin_build::all_output(&out);
    // Each call takes at least 0.5 s of the turn's 2 s: at most five begin.
    let made = sub_calls.load(Ordering::SeqCst);
    assert!((1..=5).contains(&made), "{made} sub-agent calls: {said}");
    let results = llm
        .seen()
        .iter()
        .flat_map(tool_results_of)
        .filter(|(_, r)| r.contains("took their 2 s together"))
        .count();
    assert!(results >= 15, "{results}: {said}");
}

/// An edit of `workflow.json` through the server's scheduler API (and any builder edit)
/// wrote a file past the 16 MiB Trellis reads of a JSON file, then answered `422`: the
/// workspace no longer loaded, and no edit could undo it (MEDIUM, round 33). An edit that
/// would make a file Trellis cannot read is refused, nothing written.
#[test]
fn an_edit_never_writes_a_file_trellis_would_not_read() {
    use support::serve::Serve;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    scripted_step(&root, "print('ok')\n");
    let serve = Serve::start(&root, None, &[]);
    let mut refused = None;
    for i in 0..20 {
        let (status, answer) = serve.post(
            "/api/scheduler/jobs",
            &json!({"id": format!("big{i}"), "cron_expression": "0 9 * * *",
                    "enabled": false, "description": "x".repeat(900_000)}),
        );
        if status != 201 {
            refused = Some((i, status, answer));
            break;
        }
    }
    let (i, status, answer) = refused.expect("an edit past the read cap is refused");
    assert!(i >= 15, "{i}: {answer}");
    assert_eq!(status, 422, "{answer}");
    let detail = answer["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("more than the 16777216 bytes") && detail.contains("nothing was written"),
        "{answer}"
    );
    let size = std::fs::metadata(root.join("workflow.json")).unwrap().len();
    assert!(size <= 16 << 20, "{size}");
    // The workspace still loads, and the API still answers from it.
    let (status, jobs) = serve.get("/api/scheduler/jobs", &[]);
    assert_eq!(status, 200, "{jobs}");
}

/// A `call_sub_agent` call running when the turn's call time ran out ran to its end: its
/// model call took its own `--llm-timeout`, whatever the turn had left (10 s budget, 100 s
/// answers: two turns took 3:21; MEDIUM, round 33). A sub-agent's model call ends when the
/// calling turn's call time does.
#[test]
fn a_sub_agents_model_call_ends_with_the_calling_turns_call_time() {
    use support::fake_llm::{FakeServer, completion, tool_results_of};
    let llm = FakeServer::start(Box::new(move |body| {
        let system = body["messages"][0]["content"].as_str().unwrap_or_default();
        if system.contains("Counts rows.") {
            std::thread::sleep(std::time::Duration::from_secs(8));
            return (200, completion("Counted. STATUS: COMPLETED", &[]));
        }
        if !tool_results_of(body).is_empty() {
            return (200, completion("done", &[]));
        }
        let args = json!({"route_id": "counter", "instructions": "Count."});
        (200, completion("", &[("call_sub_agent", args)]))
    }));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    support::workspace::counter_route(root, llm.providers());
    let out = run_with_call_seconds(root, 2);
    let said = support::plugin_build::all_output(&out);
    let result = llm
        .seen()
        .iter()
        .flat_map(tool_results_of)
        .map(|(_, r)| r)
        .next()
        .unwrap_or_default();
    assert!(
        result.contains("stopped: the calling turn's tool calls took their 2 s together"),
        "{result}\n{said}"
    );
}
