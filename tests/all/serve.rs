//! `trellis serve` through the binary, over real HTTP on 127.0.0.1: a builder query answered
//! at once and its turn streamed as numbered server-sent events (resumed after the last one
//! seen, and polled), the workspace's plan and runs as the turn left them, and every rule of
//! the guard (token, `Host`, `Origin`, JSON writes, body size, stream and turn limits).

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::serve::{DEMO_QUERY, Serve, demo};
use support::workspace::write_files;

/// The builder-demo session through the server, offline (its replay cassette): the query is
/// acknowledged at once, its events stream numbered in order (the agent's tool calls, the
/// executions it started, the completion turns when they end), a stream resumed after an
/// event gives exactly the rest, polling gives the same events, and the plan and the runs
/// show the step the builder added and ran.
#[test]
fn a_query_runs_in_the_background_and_its_events_stream_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let ws = demo(dir.path());
    let serve = Serve::start(&ws, None, &[]);
    let (status, page) = {
        let (status, _, body) = serve.request("GET", "/", &[], "");
        (status, body)
    };
    assert_eq!(status, 200);
    assert!(page.contains("<title>Trellis</title>"), "{page}");
    let (status, ack) = serve.post(
        "/api/query",
        &json!({"query": DEMO_QUERY, "agent_mode": "workflow_phase",
                "phase_id": "workflow-builder", "execution_options": {"workshop_mode": "builder"}}),
    );
    assert_eq!(status, 202, "{ack}");
    assert_eq!(ack["status"], "accepted");
    assert_eq!(ack["query_id"], "q-1");
    let session = ack["session_id"].as_str().unwrap().to_string();
    let events = serve.stream_until(&session, None, "session_status");
    let ids: Vec<u64> = events.iter().map(|e| e["id"].as_u64().unwrap()).collect();
    assert_eq!(
        ids,
        (1..=ids.len() as u64).collect::<Vec<_>>(),
        "numbered in order"
    );
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds[..3],
        ["query", "turn_started", "tool_started"],
        "{kinds:?}"
    );
    let tools: Vec<(&str, bool)> = events
        .iter()
        .filter(|e| e["type"] == "tool_ended")
        .map(|e| (e["name"].as_str().unwrap(), e["ok"].as_bool().unwrap()))
        .collect();
    assert_eq!(
        tools,
        [
            ("add_scripted_step", true),
            ("execute_step", true),
            ("read_workspace_file", true),
            ("write_workspace_file", true),
            ("execute_step", true),
            ("read_workspace_file", true),
        ]
    );
    // One operator turn and a completion turn for each execution that ended.
    assert_eq!(
        kinds.iter().filter(|k| **k == "turn_ended").count(),
        3,
        "{kinds:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "execution" && e["execution_id"] == "exec-count-words-2"),
        "{events:?}"
    );
    let last_text = events.iter().rev().find(|e| e["type"] == "text").unwrap();
    assert!(
        last_text["text"].as_str().unwrap().contains("22 in all"),
        "{last_text}"
    );
    assert_eq!(events.last().unwrap()["status"], "idle");
    // Resumed after event 5: exactly the events after it.
    let rest = serve.stream_until(&session, Some(5), "session_status");
    assert_eq!(rest, events[5..], "a resumed stream gives the rest");
    // Polling gives the same events.
    let (status, polled) = serve.get(&format!("/api/sessions/{session}/events?since=2"), &[]);
    assert_eq!(status, 200);
    assert_eq!(polled["events"].as_array().unwrap()[..], events[2..]);
    assert_eq!(polled["last"], *ids.last().unwrap());
    // The plan has the step the builder added, and the runs its result.
    let (status, plan) = serve.get("/api/workflow/plan", &[]);
    assert_eq!(status, 200, "{plan}");
    let steps: Vec<&str> = plan["plan"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert!(steps.contains(&"count-words"), "{steps:?}");
    let (_, runs) = serve.get("/api/workflow/runs", &[]);
    let run = &runs["runs"][0];
    assert_eq!(run["run_folder"], "iteration-0", "{runs}");
    assert!(
        run["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["step_id"] == "count-words" && s["status"] == "completed"),
        "{runs}"
    );
    let (_, executions) = serve.get("/api/workflow/executions", &[]);
    assert_eq!(
        executions["executions"].as_array().unwrap().len(),
        2,
        "{executions}"
    );
}

/// A workspace whose builder's model is the fake at `llm`.
fn workspace_on(dir: &Path, llm: &FakeServer) -> std::path::PathBuf {
    let ws = dir.join("ws");
    write_files(
        &ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "greet", "type": "regular", "title": "Greet", "description": "Hi."}
                ]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            (
                "workflow.json",
                json!({"builder_llm": {"provider": "openai", "model_id": "m"},
                       "providers": llm.providers()})
                .to_string(),
            ),
        ],
    );
    ws
}

/// Every rule of the guard, each with the answer it gives: a foreign `Host` or `Origin`
/// (403), a write that is not JSON (415), a body over 1 MiB (413), bad JSON and unknown
/// fields (400), unknown sessions, executions and endpoints (404), a second turn while one
/// runs (409 `workflow_busy`), and a stream past `--max-streams` (503).
#[test]
fn the_guard_refuses_each_request_it_should_with_a_json_error() {
    let release = Arc::new(AtomicBool::new(false));
    let held = release.clone();
    let llm = FakeServer::start(Box::new(move |_| {
        // The turn waits here until the test has tried a second one.
        while !held.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        (200, completion("hello", &[]))
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace_on(dir.path(), &llm);
    let serve = Serve::start(
        &ws,
        None,
        &["--allow-host", "127.0.0.1", "--max-streams", "1"],
    );
    let error = |(status, _, body): (u16, String, String)| {
        let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        (
            status,
            body["error"].as_str().unwrap_or_default().to_string(),
        )
    };
    let request =
        |headers: &[&str], body: &str| error(serve.request("POST", "/api/query", headers, body));
    let query = json!({"query": "hi"}).to_string();
    // The Host header of a page reached by DNS rebinding.
    let mut stream = TcpStream::connect(("127.0.0.1", serve.port)).unwrap();
    write!(
        stream,
        "GET /api/workflow/plan HTTP/1.1\r\nHost: attacker.example:{}\r\nConnection: close\r\n\r\n",
        serve.port
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("\"bad_host\""), "{answer}");
    assert_eq!(
        request(
            &[
                "Content-Type: application/json",
                "Origin: http://attacker.example"
            ],
            &query
        ),
        (403, "foreign_origin".into())
    );
    assert_eq!(
        request(&["Content-Type: text/plain"], &query),
        (415, "not_json".into())
    );
    assert_eq!(request(&[], &query), (415, "not_json".into()));
    let big = json!({"query": "x".repeat(2 << 20)}).to_string();
    assert_eq!(
        request(&["Content-Type: application/json"], &big),
        (413, "too_large".into())
    );
    assert_eq!(
        request(&["Content-Type: application/json"], "{not json"),
        (400, "bad_request".into())
    );
    assert_eq!(
        request(
            &["Content-Type: application/json"],
            r#"{"query": "hi", "evil": 1}"#
        ),
        (400, "bad_request".into())
    );
    assert_eq!(
        request(
            &["Content-Type: application/json"],
            r#"{"query": "hi", "workspace": "other"}"#
        ),
        (404, "unknown_workspace".into())
    );
    assert_eq!(
        error(serve.request("GET", "/api/sessions/nope/events", &[], "")),
        (404, "not_found".into())
    );
    assert_eq!(
        error(serve.request(
            "POST",
            "/api/executions/exec-x/stop",
            &["Content-Type: application/json"],
            "{}"
        )),
        (404, "not_found".into())
    );
    assert_eq!(
        error(serve.request("GET", "/api/nothing", &[], "")),
        (404, "not_found".into())
    );
    // The page's own Origin is fine; the turn then holds the workspace.
    let own = format!("Origin: http://127.0.0.1:{}", serve.port);
    let (status, _, body) = serve.request(
        "POST",
        "/api/query",
        &["Content-Type: application/json", &own],
        &query,
    );
    assert_eq!(status, 202, "{body}");
    let session = serde_json::from_str::<Value>(&body).unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        request(&["Content-Type: application/json"], &query),
        (409, "workflow_busy".into())
    );
    // One stream is open (the test's own), so a second is refused.
    let first = Arc::new(Mutex::new(Vec::new()));
    let reader = {
        let port = serve.port;
        let session = session.clone();
        let first = first.clone();
        std::thread::spawn(move || {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
            write!(
                stream,
                "GET /api/sessions/{session}/events/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
            )
            .unwrap();
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                if line.contains("\"session_status\"") {
                    break;
                }
                first.lock().unwrap().push(line.clone());
                line.clear();
            }
        })
    };
    // Wait until the first stream has its answer's head before asking for a second.
    while !first
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.starts_with("HTTP/1.1 200"))
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        error(serve.request(
            "GET",
            &format!("/api/sessions/{session}/events/stream"),
            &[],
            ""
        )),
        (503, "too_many_streams".into())
    );
    release.store(true, Ordering::SeqCst);
    reader.join().unwrap();
    let lines = first.lock().unwrap().join("");
    assert!(lines.contains("\"hello\""), "{lines}");
}

/// With `TRELLIS_TOKEN` set every request needs it (401 without it or with another), and an
/// address off loopback is refused without one.
#[test]
fn a_token_is_needed_when_set_and_off_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let ws = demo(dir.path());
    let token = "s3cret-token-0123456789";
    let serve = Serve::start(&ws, Some(token), &[]);
    assert_eq!(serve.get("/api/workflow/plan", &[]).0, 401);
    assert_eq!(
        serve
            .get(
                "/api/workflow/plan",
                &["Authorization: Bearer s3cret-token-0123456780"]
            )
            .0,
        401
    );
    let (status, body) = serve.get(
        "/api/workflow/plan",
        &[&format!("Authorization: Bearer {token}")],
    );
    assert_eq!(status, 200, "{body}");
    assert!(!body.to_string().contains(token));
    let out = support::trellis(&["serve", ws.to_str().unwrap(), "--addr", "0.0.0.0:0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("needs a token; set TRELLIS_TOKEN"),
        "{stderr}"
    );
}
