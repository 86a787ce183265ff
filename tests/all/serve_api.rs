//! The endpoints of `trellis serve` beyond the builder's chat, through the binary over real
//! HTTP: what the workspace holds (files, knowledge, artifacts, costs, changelog, the
//! database) read through the builder's fences, executions started without the chat with
//! their events streamed, and the builder session restored after a restart. Each handler's
//! bad input gets its JSON error.

use crate::support;

use std::path::Path;

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::serve::{DEMO_QUERY, Serve, demo};
use support::tree_digest;
use support::workspace::{create_db, write_files};

const SECRET: &str = "outside-secret-7f3a";

/// The `error` code of an error answer, with the answer when it is not one.
fn code(answer: &(u16, Value)) -> (u16, String) {
    (
        answer.0,
        answer.1["error"]
            .as_str()
            .unwrap_or("(not an error)")
            .to_string(),
    )
}

/// The demo workspace with a database, a key file, and links out: a symbolic link and a
/// hard link in the knowledge base to `outside/secret.txt`.
fn hostile_demo(dir: &Path) -> std::path::PathBuf {
    let ws = demo(dir);
    write_files(dir, &[("outside/secret.txt", SECRET)]);
    write_files(&ws, &[(".env", format!("OPENAI_API_KEY=sk-{SECRET}\n"))]);
    create_db(
        &ws,
        "CREATE TABLE notes(name TEXT); INSERT INTO notes VALUES ('escalation');",
    );
    std::os::unix::fs::symlink(
        dir.join("outside/secret.txt"),
        ws.join("knowledgebase/linked.md"),
    )
    .unwrap();
    std::fs::hard_link(
        dir.join("outside/secret.txt"),
        ws.join("knowledgebase/hard.md"),
    )
    .unwrap();
    ws
}

/// Files, knowledge, artifacts, costs, the changelog and the database through the server:
/// what is in the workspace is served, and nothing outside it (`..`, a symbolic or hard
/// link out, the key file), no SQL write, and every bad request a JSON error.
#[test]
fn workspace_reads_are_served_within_the_builders_fences() {
    let dir = tempfile::tempdir().unwrap();
    let ws = hostile_demo(dir.path());
    let outside = tree_digest(&dir.path().join("outside"));
    let serve = Serve::start(&ws, None, &[]);

    let (status, knowledge) = serve.get("/api/workflow/knowledge", &[]);
    assert_eq!(status, 200, "{knowledge}");
    let listed = knowledge["knowledgebase"].to_string();
    assert!(listed.contains("escalation.md"), "{knowledge}");
    assert!(!knowledge["learnings"].is_null(), "{knowledge}");

    let (status, file) = serve.get(
        "/api/workflow/file?path=knowledgebase/notes/escalation.md",
        &[],
    );
    assert_eq!(status, 200, "{file}");
    let kept = std::fs::read_to_string(ws.join("knowledgebase/notes/escalation.md")).unwrap();
    let first = kept.lines().next().unwrap();
    assert!(file.to_string().contains(first), "{file}");

    for path in [
        "../outside/secret.txt",
        "knowledgebase/linked.md",
        "knowledgebase/hard.md",
        ".env",
        "/etc/passwd",
    ] {
        let answer = serve.get(&format!("/api/workflow/file?path={path}"), &[]);
        assert!(
            matches!(answer.0, 404 | 422),
            "{path}: {} {}",
            answer.0,
            answer.1
        );
        assert!(answer.1["detail"].is_string(), "{path}: {}", answer.1);
        assert!(
            !answer.1.to_string().contains(SECRET),
            "{path}: {}",
            answer.1
        );
    }
    assert_eq!(
        code(&serve.get("/api/workflow/file", &[])),
        (400, "bad_request".into())
    );
    assert_eq!(
        code(&serve.get("/api/workflow/file?path=a&colour=red", &[])),
        (400, "bad_request".into())
    );
    assert_eq!(
        code(&serve.get("/api/workflow/files?max_depth=deep", &[])),
        (400, "bad_request".into())
    );
    let (status, files) = serve.get("/api/workflow/files?path=knowledgebase", &[]);
    assert_eq!(status, 200, "{files}");
    assert!(!files.to_string().contains(SECRET));

    // The database: rows read, writes and attachments refused, the table as it was.
    let (status, rows) = serve.post(
        "/api/workflow/db/query",
        &json!({"sql": "SELECT name FROM notes WHERE name = ?", "params": ["escalation"]}),
    );
    assert_eq!(status, 200, "{rows}");
    assert!(rows.to_string().contains("escalation"), "{rows}");
    for sql in [
        "DELETE FROM notes",
        "ATTACH DATABASE '/tmp/x.db' AS x",
        "PRAGMA writable_schema = 1",
    ] {
        let answer = serve.post("/api/workflow/db/query", &json!({"sql": sql}));
        assert_eq!(
            code(&answer),
            (422, "refused".into()),
            "{sql}: {}",
            answer.1
        );
    }
    let (_, rows) = serve.post(
        "/api/workflow/db/query",
        &json!({"sql": "SELECT count(*) AS n FROM notes"}),
    );
    assert!(rows.to_string().contains("\"n\":1"), "{rows}");
    assert_eq!(
        code(&serve.post("/api/workflow/db/query", &json!({"query": "SELECT 1"}))),
        (400, "bad_request".into())
    );

    let (status, costs) = serve.get("/api/workflow/costs", &[]);
    assert_eq!(status, 200, "{costs}");
    assert!(costs.get("builder").is_some(), "{costs}");
    let (status, changelog) = serve.get("/api/workflow/changelog", &[]);
    assert_eq!(status, 200, "{changelog}");
    assert_eq!(changelog["days"], json!([]), "{changelog}");
    let (status, artifacts) = serve.get("/api/workflow/artifacts", &[]);
    assert_eq!(status, 200, "{artifacts}");
    assert_eq!(
        code(&serve.get(
            "/api/workflow/artifacts?path=runs/../../outside/secret.txt",
            &[]
        ))
        .0,
        422
    );
    let (status, llm) = serve.get("/api/workflow/llm-config", &[]);
    assert_eq!(status, 200, "{llm}");

    assert_eq!(tree_digest(&dir.path().join("outside")), outside);
}

/// A workspace of two steps whose agents answer at once, `slow` after `delay`.
fn two_steps(dir: &Path, llm: &FakeServer) -> std::path::PathBuf {
    let ws = dir.join("ws");
    write_files(
        &ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "greet", "type": "regular", "title": "Greet", "description": "Say hi."},
                    {"id": "slow", "type": "regular", "title": "Slow", "description": "Take time."}
                ]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": llm.providers()})
                .to_string(),
            ),
        ],
    );
    ws
}

/// `POST /api/executions` runs a step without the chat: answered at once with the id the
/// events carry, its events streamed until it ends, its result in the runs; a second one is
/// stopped; bad requests are JSON errors.
#[test]
fn executions_start_without_the_chat_and_stream_their_events() {
    let llm = FakeServer::start(Box::new(|body| {
        let system = body["messages"][0]["content"].as_str().unwrap_or_default();
        if system.contains("Take time.") {
            std::thread::sleep(std::time::Duration::from_millis(1500));
            // A tool call, so the step has another model call to stop before.
            return (
                200,
                completion(
                    "",
                    &[(
                        "workspace__list_dir",
                        json!({"path": "runs/iteration-0/execution/slow"}),
                    )],
                ),
            );
        }
        (200, completion("Hi. STATUS: COMPLETED", &[]))
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = two_steps(dir.path(), &llm);
    let serve = Serve::start(&ws, None, &["--allow-host", "127.0.0.1"]);

    let (status, started) = serve.post("/api/executions", &json!({"step_id": "greet"}));
    assert_eq!(status, 202, "{started}");
    assert_eq!(started["execution_id"], "exec-greet-1");
    let events = serve.stream_at_until("/api/executions/events/stream", None, "execution_ended");
    let ids: Vec<u64> = events.iter().map(|e| e["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>());
    assert_eq!(events[0]["type"], "execution_started", "{events:?}");
    assert!(
        events.iter().all(|e| e["execution_id"] == "exec-greet-1"),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["line"].as_str().is_some_and(|l| l.contains("greet"))),
        "{events:?}"
    );
    assert_eq!(events.last().unwrap()["status"], "done", "{events:?}");
    let (_, runs) = serve.get("/api/workflow/runs", &[]);
    assert!(
        runs["runs"][0]["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["step_id"] == "greet" && s["status"] == "completed"),
        "{runs}"
    );

    let (status, slow) = serve.post("/api/executions", &json!({"step_id": "slow"}));
    assert_eq!(status, 202, "{slow}");
    let (status, stopping) = serve.post("/api/executions/exec-slow-1/stop", &json!({}));
    assert_eq!(status, 200, "{stopping}");
    let last = events.last().unwrap()["id"].as_u64().unwrap();
    let rest = serve.stream_at_until(
        "/api/executions/events/stream",
        Some(last),
        "execution_ended",
    );
    assert_eq!(rest.last().unwrap()["execution_id"], "exec-slow-1");
    assert_eq!(rest.last().unwrap()["status"], "cancelled", "{rest:?}");

    assert_eq!(
        code(&serve.post("/api/executions", &json!({"step_id": "nope"}))),
        (404, "not_found".into())
    );
    assert_eq!(
        code(&serve.post(
            "/api/executions",
            &json!({"step_id": "greet", "group": "g"})
        )),
        (404, "not_found".into())
    );
    assert_eq!(
        code(&serve.post("/api/executions", &json!({"steps": ["greet"]}))),
        (400, "bad_request".into())
    );
    let (status, polled) = serve.get("/api/executions/events?since=0", &[]);
    assert_eq!(status, 200);
    assert_eq!(
        polled["events"].as_array().unwrap().len(),
        events.len() + rest.len()
    );
    // The events name the workspace's files relative to it, not by their host path.
    let host = dir.path().canonicalize().unwrap();
    assert!(
        !polled.to_string().contains(host.to_str().unwrap()),
        "{polled}"
    );
    assert_eq!(
        code(&serve.get("/api/executions/events?since=-1", &[])),
        (400, "bad_request".into())
    );
}

/// The session the page opens: none before any query, the live one after it, and after a
/// restart the latest from the workspace's index, with its messages; a query with its id
/// continues it. Stopping an unknown session is a 404.
#[test]
fn the_builder_session_is_restored_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ws = demo(dir.path());
    let serve = Serve::start(&ws, None, &[]);
    let (status, none) = serve.get("/api/workflow/builder-session", &[]);
    assert_eq!(status, 200, "{none}");
    assert_eq!(none["session_id"], Value::Null);
    let (_, ack) = serve.post("/api/query", &json!({"query": DEMO_QUERY}));
    let session = ack["session_id"].as_str().unwrap().to_string();
    serve.stream_until(&session, None, "session_status");
    let (_, live) = serve.get("/api/workflow/builder-session", &[]);
    assert_eq!(live["session_id"], session.as_str());
    assert_eq!(live["live"], true);
    let (status, stopped) = serve.post("/api/session/stop", &json!({"session_id": session}));
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(
        code(&serve.post("/api/session/stop", &json!({"session_id": "nope"}))),
        (404, "not_found".into())
    );
    assert_eq!(
        code(&serve.get("/api/workflow/builder-session?workspace=other", &[])),
        (404, "unknown_workspace".into())
    );
    drop(serve);

    let serve = Serve::start(&ws, None, &[]);
    let (status, restored) = serve.get("/api/workflow/builder-session", &[]);
    assert_eq!(status, 200, "{restored}");
    assert_eq!(restored["session_id"], session.as_str());
    assert_eq!(restored["live"], false);
    let messages = restored["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "user");
    assert_eq!(messages[0]["text"], DEMO_QUERY);
    assert!(
        messages
            .iter()
            .any(|m| m["text"].as_str().unwrap_or_default().contains("22 in all")),
        "{restored}"
    );
}

/// The bounds no request can see in its answer: a client that sends no headers within 10 s
/// is disconnected, a connection past the 256 open at once is closed unread, and a query
/// for a new session past `--max-sessions` is refused naming the flag.
#[test]
fn idle_connections_time_out_and_connections_and_sessions_are_capped() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let llm = FakeServer::start(Box::new(|_| (200, completion("Hello.", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let ws = two_steps(dir.path(), &llm);
    // The fixture's workflow.json names the model as `llm`: the builder uses it too.
    let serve = Serve::start(
        &ws,
        None,
        &["--allow-host", "127.0.0.1", "--max-sessions", "1"],
    );

    // 256 connections that send nothing take every slot; the next one takes the place of
    // the oldest of them (none has sent a request), which is closed at once.
    let mut idle: Vec<TcpStream> = (0..256)
        .map(|_| TcpStream::connect(("127.0.0.1", serve.port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut extra = TcpStream::connect(("127.0.0.1", serve.port)).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = write!(
        extra,
        "GET /api/workflow/plan HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
        serve.port
    );
    let mut answer = Vec::new();
    let read = extra.read_to_end(&mut answer);
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "the 257th connection is answered: {read:?} {}",
        String::from_utf8_lossy(&answer)
    );
    let mut oldest = idle.remove(0);
    oldest
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut rest = Vec::new();
    assert_eq!(
        oldest.read_to_end(&mut rest).ok(),
        Some(0),
        "the oldest idle one is closed"
    );
    // Each idle one is closed within the header timeout (10 s), and the server answers again.
    let started = Instant::now();
    for mut conn in idle {
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut rest = Vec::new();
        let _ = conn.read_to_end(&mut rest);
        assert!(
            String::from_utf8_lossy(&rest).is_empty() || rest.starts_with(b"HTTP/1.1 408"),
            "{}",
            String::from_utf8_lossy(&rest)
        );
    }
    assert!(started.elapsed() < Duration::from_secs(30));
    let (status, _) = serve.get("/api/workflow/plan", &[]);
    assert_eq!(status, 200);

    // One session held at most: a second one lets the first go (it is on disk), and a
    // query naming the first restores it, with its history.
    let (status, first) = serve.post("/api/query", &json!({"query": "hi"}));
    assert_eq!(status, 202, "{first}");
    let session = first["session_id"].as_str().unwrap().to_string();
    serve.stream_until(&session, None, "session_status");
    let (status, second) = serve.post("/api/query", &json!({"query": "again"}));
    assert_eq!(status, 202, "{second}");
    let other = second["session_id"].as_str().unwrap().to_string();
    assert_ne!(other, session);
    serve.stream_until(&other, None, "session_status");
    let (status, back) = serve.post(
        "/api/query",
        &json!({"query": "more", "session_id": session}),
    );
    assert_eq!(
        (status, back["session_id"].as_str()),
        (202, Some(session.as_str()))
    );
    serve.stream_until(&session, None, "session_status");
    let (_, restored) = serve.get("/api/workflow/builder-session", &[]);
    let users: Vec<&str> = restored["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["text"].as_str())
        .collect();
    assert_eq!(users, ["hi", "more"], "{restored}");
}

/// A workspace `name` under `dir` of one agent step `<name>-step`, on the model at `llm`.
fn named_workspace(dir: &Path, name: &str, llm: &FakeServer) -> std::path::PathBuf {
    let ws = dir.join(name);
    write_files(
        &ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": format!("{name}-step"), "type": "regular", "title": "T",
                     "description": "Answer."}
                ]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": llm.providers()})
                .to_string(),
            ),
        ],
    );
    ws
}

/// One server, two workspaces: a request names its workspace with `?workspace=` (the first
/// without it), a query with `workspace` in its body; each has its own plan, executions and
/// sessions; an unknown name is a 404 naming the served ones (after the guard); two folders
/// of one name are refused at start.
#[test]
fn one_server_serves_several_workspaces_each_on_its_own() {
    let llm = FakeServer::start(Box::new(|_| (200, completion("Hello.", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let alpha = named_workspace(dir.path(), "alpha", &llm);
    let beta = named_workspace(dir.path(), "beta", &llm);
    let serve = Serve::start(
        &alpha,
        None,
        &[beta.to_str().unwrap(), "--allow-host", "127.0.0.1"],
    );
    let step_of = |answer: &Value| {
        answer["plan"]["steps"][0]["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (status, plan) = serve.get("/api/workflow/plan", &[]);
    assert_eq!((status, step_of(&plan)), (200, "alpha-step".into()));
    let (_, plan) = serve.get("/api/workflow/plan?workspace=beta", &[]);
    assert_eq!(step_of(&plan), "beta-step");
    let unknown = serve.get("/api/workflow/plan?workspace=gamma", &[]);
    assert_eq!(code(&unknown), (404, "unknown_workspace".into()));
    let detail = unknown.1["detail"].as_str().unwrap();
    assert!(
        detail.contains("\"alpha\"") && detail.contains("\"beta\""),
        "{detail}"
    );
    let (status, _, _) = serve.request(
        "GET",
        "/api/workflow/plan?workspace=gamma",
        &["Origin: http://evil.example"],
        "",
    );
    assert_eq!(status, 403, "the guard comes first");
    let (_, list) = serve.get("/api/workspaces", &[]);
    let names: Vec<&str> = list["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alpha", "beta"]);

    let (status, started) = serve.post(
        "/api/executions?workspace=beta",
        &json!({"step_id": "beta-step"}),
    );
    assert_eq!(status, 202, "{started}");
    assert_eq!(started["execution_id"], "exec-beta-step-1");
    let events = serve.stream_at_until(
        "/api/executions/events/stream?workspace=beta",
        None,
        "execution_ended",
    );
    assert_eq!(events.last().unwrap()["status"], "done", "{events:?}");
    let (_, alpha_events) = serve.get("/api/executions/events?since=0", &[]);
    assert_eq!(
        alpha_events["events"],
        json!([]),
        "alpha's log has none of beta's"
    );
    assert!(beta.join("runs/iteration-0/execution/beta-step").is_dir());
    assert!(!alpha.join("runs/iteration-0/execution/beta-step").exists());
    assert_eq!(
        code(&serve.post("/api/executions", &json!({"step_id": "beta-step"}))),
        (404, "not_found".into()),
        "without ?workspace= it is alpha's plan"
    );

    // A query naming beta in its body runs there.
    let (status, ack) = serve.post("/api/query", &json!({"query": "hi", "workspace": "beta"}));
    assert_eq!(status, 202, "{ack}");
    let session = ack["session_id"].as_str().unwrap().to_string();
    serve.stream_at_until(
        &format!("/api/sessions/{session}/events/stream?workspace=beta"),
        None,
        "session_status",
    );
    assert!(beta.join("builder").is_dir());
    assert!(!alpha.join("builder").exists());
    assert_eq!(
        code(&serve.post("/api/query", &json!({"query": "hi", "workspace": "gamma"}))),
        (404, "unknown_workspace".into())
    );
    drop(serve);

    let other = tempfile::tempdir().unwrap();
    let twin = named_workspace(other.path(), "alpha", &llm);
    let out = support::trellis(&[
        "serve",
        alpha.to_str().unwrap(),
        twin.to_str().unwrap(),
        "--addr",
        "127.0.0.1:0",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("two workspaces are named \"alpha\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Round 6 of the server's red team: a body sent a byte at a time held a connection for
/// good; executions had no limit and fought over the run folder; messages to an execution
/// queued without end; reads ran on the server's own threads without limit. Each is bounded
/// now, and refused with its reason.
#[test]
fn bodies_executions_and_messages_are_bounded() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;
    let llm = FakeServer::start(Box::new(|body| {
        let system = body["messages"][0]["content"].as_str().unwrap_or_default();
        if system.contains("Take time.") {
            std::thread::sleep(Duration::from_secs(3));
            let path = "runs/iteration-0/execution/slow";
            return (
                200,
                completion("", &[("workspace__list_dir", json!({ "path": path }))]),
            );
        }
        (200, completion("Hi. STATUS: COMPLETED", &[]))
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = two_steps(dir.path(), &llm);
    create_db(&ws, "CREATE TABLE t(x);");
    let serve = Serve::start(
        &ws,
        None,
        &["--allow-host", "127.0.0.1", "--max-executions", "1"],
    );

    // A body that does not arrive within 10 s.
    let mut slow = TcpStream::connect(("127.0.0.1", serve.port)).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        slow,
        "POST /api/query HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{\"query\"",
        serve.port
    )
    .unwrap();
    let mut answer = String::new();
    let _ = slow.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"timeout\""), "{answer}");

    // Names and the group are checked before anything runs.
    let long = "s".repeat(300);
    assert_eq!(
        code(&serve.post("/api/executions", &json!({"step_id": long}))),
        (400, "bad_request".into())
    );
    assert_eq!(
        code(&serve.post("/api/executions", &json!({"group": "nope"}))),
        (404, "not_found".into())
    );

    // One execution at a time here (--max-executions 1), never the same step twice, and the
    // whole workflow not beside it.
    let (status, started) = serve.post("/api/executions", &json!({"step_id": "slow"}));
    assert_eq!(status, 202, "{started}");
    let again = serve.post("/api/executions", &json!({"step_id": "slow"}));
    assert_eq!(code(&again), (409, "workspace_busy".into()), "{}", again.1);
    assert!(again.1["detail"].as_str().unwrap().contains("exec-slow-1"));
    let whole = serve.post("/api/executions", &json!({}));
    assert_eq!(code(&whole), (409, "workspace_busy".into()), "{}", whole.1);
    let other = serve.post("/api/executions", &json!({"step_id": "greet"}));
    assert_eq!(
        code(&other),
        (503, "too_many_executions".into()),
        "{}",
        other.1
    );
    assert!(
        other.1["detail"]
            .as_str()
            .unwrap()
            .contains("--max-executions")
    );

    // Messages: 16 KiB each, 16 waiting.
    let big = json!({"message": "m".repeat(17 << 10)});
    assert_eq!(
        code(&serve.post("/api/executions/exec-slow-1/message", &big)),
        (400, "bad_request".into())
    );
    // Wait until the step's agent is in its model call, where messages queue.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, d) = serve.post(
            "/api/executions/exec-slow-1/message",
            &json!({"message": "m0"}),
        );
        if d["delivery"] == "queued_for_injection" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{d}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let deliveries: Vec<String> = (1..17)
        .map(|i| {
            let (_, d) = serve.post(
                "/api/executions/exec-slow-1/message",
                &json!({"message": format!("m{i}")}),
            );
            d["delivery"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    assert_eq!(deliveries.last().unwrap(), "queue_full", "{deliveries:?}");
    assert!(
        deliveries[..15].iter().all(|d| d == "queued_for_injection"),
        "{deliveries:?}"
    );

    // Four reads of the workspace at once; a fifth is refused while they run.
    let spin = json!({"sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c \
                              WHERE x < 40000000) SELECT count(*) AS n FROM c"});
    std::thread::scope(|scope| {
        let readers: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| serve.post("/api/workflow/db/query", &spin)))
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        let fifth = serve.post("/api/workflow/db/query", &json!({"sql": "SELECT 1"}));
        assert_eq!(code(&fifth), (503, "too_many_reads".into()), "{}", fifth.1);
        // Each reader ran (on a loaded machine one may reach the statement's own limits, a
        // 422); none was refused for the others.
        for r in readers {
            let (status, answer) = r.join().unwrap();
            assert!(status == 200 || status == 422, "{status} {answer}");
        }
    });
    let (_, stopped) = serve.post("/api/executions/exec-slow-1/stop", &json!({}));
    assert_eq!(stopped["stopping"], true);
}

/// The page opens without the token (it holds no data; its requests carry it) and no site
/// may frame it; the API needs the token; a second Host or Authorization header, an
/// absolute target and a wrong method get their JSON errors.
#[test]
fn the_page_needs_no_token_and_requests_are_read_one_way() {
    let dir = tempfile::tempdir().unwrap();
    let ws = demo(dir.path());
    let token = "a-token-of-enough-length";
    let serve = Serve::start(&ws, Some(token), &[]);
    let (status, headers, page) = serve.request("GET", "/", &[], "");
    assert_eq!(status, 200);
    assert!(page.contains("<title>Trellis</title>"));
    assert!(headers.contains("x-frame-options: deny"), "{headers}");
    assert!(headers.contains("frame-ancestors 'none'"), "{headers}");
    assert_eq!(code(&serve.get("/api/workflow/plan", &[])).0, 401);
    let bearer = format!("Authorization: Bearer {token}");
    let (status, _) = serve.get("/api/workflow/plan", &[&bearer]);
    assert_eq!(status, 200);
    let twice = serve.get(
        "/api/workflow/plan",
        &[&bearer, "Authorization: Bearer other"],
    );
    assert_eq!(code(&twice), (400, "bad_request".into()), "{}", twice.1);
    let (status, _, body) = serve.request(
        "GET",
        "/api/workflow/plan",
        &[&bearer, "Host: evil.example"],
        "",
    );
    assert_eq!(status, 400, "{body}");
    let port = serve.port;
    let (status, _, body) = serve.request(
        "GET",
        &format!("http://127.0.0.1:{port}/api/workflow/plan"),
        &[&bearer],
        "",
    );
    assert_eq!(status, 400, "{body}");
    let (status, _, body) = serve.request("DELETE", "/api/query", &[&bearer], "");
    assert_eq!(status, 405, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["error"], "method_not_allowed");
}

/// Polls `GET /api/workflow/executions` until execution `id` satisfies `until`; its entry.
pub(crate) fn execution_until(serve: &Serve, id: &str, until: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (status, list) = serve.get("/api/workflow/executions", &[]);
        assert_eq!(status, 200, "{list}");
        let entry = list["executions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["execution_id"] == id)
            .cloned()
            .unwrap_or(Value::Null);
        if until(&entry) {
            return entry;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "execution {id} never got there: {entry}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A run started over the API does not need its human inputs up front: a `human_input` step
/// without an answer asks (an `input_requested` event, `waiting_for` in the list) and waits
/// for `POST /api/executions/{id}/input`, which takes the answer of the step it waits on
/// only; the run goes on with it (the yes route) and records it. A run stopped while it
/// waits ends `cancelled`.
#[test]
fn a_run_waits_for_the_answers_of_its_human_input_steps() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    write_files(
        &ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "approve", "type": "human_input", "title": "Approve",
                     "question": "Ship it?", "response_type": "yesno",
                     "if_yes_next_step_id": "name", "if_no_next_step_id": "end"},
                    {"id": "name", "type": "human_input", "title": "Name",
                     "question": "Release name?", "variable_name": "release",
                     "context_output": ["release.json"]}
                ]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
        ],
    );
    let serve = Serve::start(&ws, None, &[]);
    let (status, started) = serve.post("/api/executions", &json!({}));
    assert_eq!(status, 202, "{started}");
    let id = started["execution_id"].as_str().unwrap().to_string();
    let path = format!("/api/executions/{id}/input");
    let waiting = execution_until(&serve, &id, |e| !e["waiting_for"].is_null());
    assert_eq!(
        waiting["waiting_for"],
        json!({"step_id": "approve", "variable": "approve", "question": "Ship it?",
               "response_type": "yesno", "options": []}),
        "{waiting}"
    );

    // Only the question it waits on is answered, with a string of at most 64 KiB.
    assert_eq!(
        code(&serve.post(&path, &json!({"step_id": "name", "answer": "x"}))),
        (409, "not_waiting".into())
    );
    assert_eq!(
        code(&serve.post(&path, &json!({"answer": "x".repeat((64 << 10) + 1)}))),
        (400, "bad_request".into())
    );
    assert_eq!(
        code(&serve.post(&path, &json!({"answer": 3}))),
        (400, "bad_request".into())
    );
    assert_eq!(
        code(&serve.post(
            "/api/executions/exec-nope-1/input",
            &json!({"answer": "yes"})
        )),
        (404, "not_found".into())
    );
    let (status, answered) = serve.post(&path, &json!({"step_id": "approve", "answer": "yes"}));
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["answered"], "approve");
    let waiting = execution_until(&serve, &id, |e| e["waiting_for"]["step_id"] == "name");
    assert_eq!(waiting["waiting_for"]["variable"], "release", "{waiting}");
    let (status, _) = serve.post(&path, &json!({"answer": "v1.2 \"Oak\""}));
    assert_eq!(status, 200);
    let ended = execution_until(&serve, &id, |e| e["status"] != "running");
    assert_eq!(ended["status"], "done", "{ended}");
    assert!(ended["waiting_for"].is_null(), "{ended}");
    assert_eq!(
        code(&serve.post(&path, &json!({"answer": "late"}))),
        (409, "not_waiting".into())
    );
    let recorded: Value = serde_json::from_slice(
        &std::fs::read(ws.join("runs/iteration-0/execution/name/release.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(recorded["response"], "v1.2 \"Oak\"", "{recorded}");
    assert_eq!(recorded["question"], "Release name?");
    let (_, events) = serve.get("/api/executions/events?since=0", &[]);
    let asked: Vec<&Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "input_requested")
        .collect();
    assert_eq!(asked.len(), 2, "{events}");
    assert_eq!(asked[0]["step_id"], "approve");
    assert_eq!(asked[0]["question"], "Ship it?");

    // Stopped while it waits: cancelled, and nothing waits any more.
    let (status, started) = serve.post("/api/executions", &json!({}));
    assert_eq!(status, 202, "{started}");
    let second = started["execution_id"].as_str().unwrap().to_string();
    execution_until(&serve, &second, |e| !e["waiting_for"].is_null());
    let (status, _) = serve.post(&format!("/api/executions/{second}/stop"), &json!({}));
    assert_eq!(status, 200);
    let ended = execution_until(&serve, &second, |e| e["status"] != "running");
    assert_eq!(ended["status"], "cancelled", "{ended}");
    assert!(ended["waiting_for"].is_null(), "{ended}");
}

/// `POST /api/session/stop` stops the turn running now: a model that calls a tool at every
/// answer, slowly, would keep the turn for its 500 rounds; stopped, the turn ends before its
/// next model call with the stop as its error, and the session takes the next query.
#[test]
fn stopping_a_session_stops_its_running_turn() {
    let llm = FakeServer::start(Box::new(|body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or(Value::Null);
        if last["role"] == "user" && last["content"] == "and now?" {
            return (200, completion("here", &[]));
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        (200, completion("", &[("read_plan", json!({}))]))
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = two_steps(dir.path(), &llm);
    let serve = Serve::start(&ws, None, &["--allow-host", "127.0.0.1"]);
    let (status, ack) = serve.post("/api/query", &json!({"query": "loop"}));
    assert_eq!(status, 202, "{ack}");
    let session = ack["session_id"].as_str().unwrap().to_string();
    let seen = serve.stream_until(&session, None, "tool_ended");
    let (status, stopped) = serve.post("/api/session/stop", &json!({"session_id": session}));
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(stopped["turn_stopped"], true, "{stopped}");
    let last = seen.last().unwrap()["id"].as_u64().unwrap();
    let rest = serve.stream_until(&session, Some(last), "turn_ended");
    let ended = rest.last().unwrap();
    assert_eq!(ended["ended_normally"], false, "{ended}");
    assert_eq!(
        ended["error"], "the turn was stopped by the operator",
        "{ended}"
    );
    let calls = llm.seen().len();
    assert!(calls < 10, "{calls} model calls: the turn went on");

    // Between turns there is nothing to stop, and the next query runs its turn whole.
    let idle_at = serve.stream_until(&session, Some(last), "session_status");
    let last = idle_at.last().unwrap()["id"].as_u64().unwrap();
    let (_, idle) = serve.post("/api/session/stop", &json!({"session_id": session}));
    assert_eq!(idle["turn_stopped"], false, "{idle}");
    let (status, ack) = serve.post(
        "/api/query",
        &json!({"query": "and now?", "session_id": session}),
    );
    assert_eq!(status, 202, "{ack}");
    let events = serve.stream_until(&session, Some(last), "session_status");
    let next = events
        .iter()
        .rev()
        .find(|e| e["type"] == "turn_ended")
        .unwrap();
    assert_eq!(next["ended_normally"], true, "{next}");
    assert_eq!(next["text"], "here", "{next}");
}
