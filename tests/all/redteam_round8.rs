//! Attacks of the eighth red team on `trellis serve`, through the binary over real HTTP: a
//! session's events are bounded in bytes, a refused request ends its connection, the
//! builder starts executions under the API's rules and cap, executions belong to their
//! workspace, a restored session numbers its events on, and a grouped workflow's step runs
//! from the API.

use crate::support;

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::serve::Serve;
use support::workspace::write_files;

/// A workspace of `steps` regular steps on the model `llm`, with `extra` in workflow.json.
fn workspace(
    dir: &Path,
    name: &str,
    llm: &FakeServer,
    steps: &[&str],
    extra: Value,
) -> std::path::PathBuf {
    let ws = dir.join(name);
    let plan: Vec<Value> = steps
        .iter()
        .map(|id| json!({"id": id, "type": "regular", "title": id, "description": format!("Do {id}.")}))
        .collect();
    let mut manifest = json!({"llm": {"provider": "openai", "model_id": "m"},
                              "providers": llm.providers()});
    if let (Some(m), Some(e)) = (manifest.as_object_mut(), extra.as_object()) {
        m.extend(e.clone());
    }
    write_files(
        &ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": plan}).to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            ("workflow.json", manifest.to_string()),
        ],
    );
    ws
}

fn is_builder(body: &Value) -> bool {
    body["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["function"]["name"] == "execute_step"))
}

/// Each reply of a hostile builder model was kept whole in the session's events (10,000 of
/// them, no byte bound): 3.9 MB a round held for good, and one poll answered 628 MB (round 8,
/// finding 4). An event now keeps 64 KiB of a string, a log 16 MiB, and a read 4 MiB.
#[test]
fn a_sessions_events_are_bounded_in_bytes() {
    let reply = "r".repeat(3 << 20);
    let llm = FakeServer::start(Box::new(move |_| (200, completion(&reply, &[]))));
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), "ws", &llm, &["a"], json!({}));
    let serve = Serve::start(&ws, None, &["--allow-host", "127.0.0.1"]);
    let mut session: Option<String> = None;
    let mut last = 0;
    for _ in 0..4 {
        let mut body = json!({"query": "q".repeat(512 << 10)});
        if let Some(id) = &session {
            body["session_id"] = json!(id);
        }
        let (status, ack) = serve.post("/api/query", &body);
        assert_eq!(status, 202, "{ack}");
        let id = ack["session_id"].as_str().unwrap().to_string();
        let events = serve.stream_until(&id, Some(last), "session_status");
        last = events.last().unwrap()["id"].as_u64().unwrap();
        session = Some(id);
    }
    let (status, _, body) = serve.request(
        "GET",
        &format!("/api/sessions/{}/events?since=0", session.unwrap()),
        &[],
        "",
    );
    assert_eq!(status, 200);
    // Whole, the 4 turns held some 26 MB (each reply twice, and the queries); an event
    // keeps 64 KiB of a string, and a read gives 4 MiB at most.
    assert!(
        body.len() < (4 << 20) + (64 << 10),
        "a poll of {} bytes",
        body.len()
    );
    let answer: Value = serde_json::from_str(&body).unwrap();
    let text = answer["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "text")
        .unwrap()["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        text.ends_with("[cut: 3145728 bytes, limit 65536]"),
        "{:.100}",
        &text[text.len() - 60..]
    );
}

/// A `401` kept its connection open: 256 clients without the token held every connection
/// slot and the operator's requests were reset (round 8, finding 1). A refused request now
/// ends its connection.
#[test]
fn a_refused_request_ends_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::serve::demo(dir.path());
    let serve = Serve::start(&ws, Some("a-token-of-enough-length"), &[]);
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", serve.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        stream,
        "GET /api/workflow/plan HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
        serve.port
    )
    .unwrap();
    // Read to the end: the server closes after the 401 (a kept connection would time out).
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
}

/// The API's 409 rules and `--max-executions` held only for `POST /api/executions`: a
/// builder query ran the whole workflow over a running step (moving its run folder) and
/// started 256 executions at once (round 8, findings 2 and 3). The builder's starts now go
/// through the same admission.
#[test]
fn the_builder_starts_executions_under_the_apis_rules_and_cap() {
    let llm = FakeServer::start(Box::new(|body| {
        if !is_builder(body) {
            // The steps' agents take their time, a tool call at each answer.
            std::thread::sleep(Duration::from_millis(300));
            return (
                200,
                completion("", &[("workspace__list_dir", json!({"path": "runs"}))]),
            );
        }
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if messages.iter().any(|m| m["role"] == "tool") {
            return (200, completion("done", &[]));
        }
        let calls: Vec<(&str, Value)> = ["b", "c", "d"]
            .iter()
            .map(|s| ("execute_step", json!({"step_id": s})))
            .chain(std::iter::once(("run_full_workflow", json!({}))))
            .collect();
        (200, completion("", &calls))
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), "ws", &llm, &["a", "b", "c", "d"], json!({}));
    let serve = Serve::start(
        &ws,
        None,
        &["--allow-host", "127.0.0.1", "--max-executions", "2"],
    );
    let (status, started) = serve.post("/api/executions", &json!({"step_id": "a"}));
    assert_eq!(status, 202, "{started}");
    let (_, ack) = serve.post(
        "/api/query",
        &json!({"query": "go", "execution_options": {"workshop_mode": "optimizer"}}),
    );
    let session = ack["session_id"].as_str().unwrap().to_string();
    let events = serve.stream_until(&session, None, "turn_ended");
    let ended: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool_ended")
        .collect();
    assert_eq!(ended.len(), 4, "{events:?}");
    let summaries: Vec<&str> = ended
        .iter()
        .map(|e| e["summary"].as_str().unwrap())
        .collect();
    // One more joins the API's step; the cap refuses the next; the whole workflow waits.
    assert_eq!(ended[0]["ok"], true, "{summaries:?}");
    assert!(
        summaries[1].contains("nothing started: 2 executions run on this workspace"),
        "{summaries:?}"
    );
    assert!(summaries[2].contains("nothing started"), "{summaries:?}");
    assert!(
        summaries[3].contains("nothing started: executions run on this workspace"),
        "{summaries:?}"
    );
    assert!(
        !ws.join("runs/iteration-1").exists(),
        "the run folder did not rotate"
    );
    let (_, list) = serve.get("/api/workflow/executions", &[]);
    let running = list["executions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["status"] == "running")
        .count();
    assert!(running <= 2, "{list}");
    for e in list["executions"].as_array().unwrap() {
        let id = e["execution_id"].as_str().unwrap();
        serve.post(&format!("/api/executions/{id}/stop"), &json!({}));
    }
}

/// One workspace's requests listed, stopped and messaged another's executions (round 8,
/// finding 7); a grouped workflow's step could not be run from the API (finding 9).
#[test]
fn executions_belong_to_their_workspace_and_a_grouped_step_runs_in_its_group() {
    let llm = FakeServer::start(Box::new(|_| {
        (200, completion("Hi. STATUS: COMPLETED", &[]))
    }));
    let dir = tempfile::tempdir().unwrap();
    let alpha = workspace(
        dir.path(),
        "alpha",
        &llm,
        &["a"],
        json!({"groups": [{"id": "g1", "name": "Group one"}]}),
    );
    let beta = workspace(dir.path(), "beta", &llm, &["b"], json!({}));
    let serve = Serve::start(
        &alpha,
        None,
        &[beta.to_str().unwrap(), "--allow-host", "127.0.0.1"],
    );
    let (status, started) = serve.post("/api/executions", &json!({"step_id": "a", "group": "g1"}));
    assert_eq!(status, 202, "{started}");
    let id = started["execution_id"].as_str().unwrap().to_string();
    let (_, beta_list) = serve.get("/api/workflow/executions?workspace=beta", &[]);
    assert_eq!(beta_list["executions"], json!([]), "{beta_list}");
    let (status, _) = serve.post(
        &format!("/api/executions/{id}/stop?workspace=beta"),
        &json!({}),
    );
    assert_eq!(status, 404);
    let (status, _) = serve.post(
        &format!("/api/executions/{id}/message?workspace=beta"),
        &json!({"message": "hi"}),
    );
    assert_eq!(status, 404);
    let events = serve.stream_at_until("/api/executions/events/stream", None, "execution_ended");
    assert_eq!(events.last().unwrap()["status"], "done", "{events:?}");
    assert!(
        alpha
            .join("runs/iteration-0/group-one/execution/a")
            .is_dir(),
        "the step ran in its group's folder"
    );
}

/// A session let go to make room and restored numbered its events from 1 again: a client
/// resuming after its last number missed the restored turn (round 8, finding 10).
#[test]
fn a_restored_session_numbers_its_events_on() {
    let llm = FakeServer::start(Box::new(|_| (200, completion("fine", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), "ws", &llm, &["a"], json!({}));
    let serve = Serve::start(
        &ws,
        None,
        &["--allow-host", "127.0.0.1", "--max-sessions", "1"],
    );
    let (_, first) = serve.post("/api/query", &json!({"query": "one"}));
    let a = first["session_id"].as_str().unwrap().to_string();
    let seen = serve.stream_until(&a, None, "session_status");
    let last = seen.last().unwrap()["id"].as_u64().unwrap();
    // A second session takes the only place; then the first is named again.
    let (_, second) = serve.post("/api/query", &json!({"query": "two"}));
    let b = second["session_id"].as_str().unwrap().to_string();
    assert_ne!(a, b);
    serve.stream_until(&b, None, "session_status");
    let (status, again) = serve.post("/api/query", &json!({"query": "three", "session_id": a}));
    assert_eq!(status, 202, "{again}");
    let resumed = serve.stream_until(&a, Some(last), "session_status");
    assert!(
        resumed.iter().all(|e| e["id"].as_u64().unwrap() > last),
        "{resumed:?}"
    );
    assert!(
        resumed
            .iter()
            .any(|e| e["type"] == "query" && e["query"] == "three"),
        "{resumed:?}"
    );
}

/// `runs show` read every turn log whole with no total budget: 200 hard links to one 60 MiB
/// log took 74 s of CPU (round 8, host finding F2). A listing or a show now reads 1 GiB at
/// most (a file at its length), and a hard link not at all (round 13).
#[test]
fn runs_show_reads_within_one_budget() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    write_files(
        ws,
        &[(
            "planning/plan.json",
            json!({"objective": "o", "steps": [
                {"id": "a", "type": "regular", "title": "A", "description": "d"}]})
            .to_string(),
        )],
    );
    let logs = ws.join("runs/iteration-0/logs/a/execution");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::create_dir_all(ws.join("runs/iteration-0/execution/a")).unwrap();
    let first = logs.join("execution-attempt-1-iteration-1.json");
    let log = json!({"step_id": "a", "item_id": "i1", "entry_id": "i1", "attempt": 1,
        "iteration": 1, "provider": "openai", "model_id": "m", "status": "failed",
        "error": "e".repeat(63 << 20), "started_at": "2026-12-03T17:32:59.735Z",
        "completed_at": "2026-12-03T17:33:06.744Z", "duration_ms": 1, "llm_duration_ms": 1,
        "tool_duration_ms": 0, "llm_call_count": 1, "tool_call_count": 0,
        "tool_error_count": 0, "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0});
    std::fs::write(&first, log.to_string()).unwrap();
    // Copies, not hard links (a hard link is refused before it is read): 17 files of
    // 63 MiB, some 1.07 GB, are past the budget.
    for n in 2..=17 {
        std::fs::copy(
            &first,
            logs.join(format!("execution-attempt-1-iteration-{n}.json")),
        )
        .unwrap();
    }
    let out = support::trellis(&["runs", "show", ws.to_str().unwrap(), "a"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("budget of 1073741824 bytes of host reads"),
        "{text:.3000}"
    );
}

/// Past the 100th changelog file of a day, edits went on in the last one, which grew past
/// what its reader takes, each edit rewriting it whole (round 8, host finding F3). With
/// every file of the day full, an edit is now refused, nothing written.
#[test]
fn an_edit_is_refused_when_the_days_changelog_files_are_all_full() {
    let llm = support::mcp_servers::asking_for(vec![(
        "update_variable",
        json!({"reason": "r", "action": "add", "name": "V", "value": "x"}),
    )]);
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), "ws", &llm, &["a"], json!({}));
    let day: String = trellis_runner::session::now_rfc3339()
        .chars()
        .take(10)
        .collect();
    let logs = ws.join("planning/changelog");
    std::fs::create_dir_all(&logs).unwrap();
    for n in 1..=100 {
        let name = if n == 1 {
            format!("changelog-{day}.json")
        } else {
            format!("changelog-{day}-{n}.json")
        };
        std::fs::File::create(logs.join(name))
            .unwrap()
            .set_len(4 << 20)
            .unwrap();
    }
    let before = std::fs::read(ws.join("workflow.json")).unwrap();
    let out = support::trellis(&[
        "builder",
        ws.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "-m",
        "go",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result = &llm.last_tool_results()[0].1;
    assert!(
        result.contains("refused: today's changelog fills its 100 files"),
        "{result}"
    );
    assert_eq!(std::fs::read(ws.join("workflow.json")).unwrap(), before);
}
