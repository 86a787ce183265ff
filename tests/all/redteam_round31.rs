//! Red team round 31: each a test that failed before its fix.

use crate::support;

use serde_json::json;
use support::fake_llm::{FakeServer, completion};
use support::workspace::write_file;

/// Calls of one route rewrote its whole `session.json` at each call's start and end, so
/// the bytes written grew with the square of the calls (5,000 calls of one turn wrote
/// 15 GB for a 241 KB session, MEDIUM). A call checkpoints it (written when it grew by half),
/// and the calling step's end writes it whole.
#[test]
fn a_routes_calls_write_its_session_a_bounded_number_of_times() {
    const ANSWERS: usize = 3;
    let llm = FakeServer::start(Box::new(|body| {
        let results = support::fake_llm::tool_results_of(body).len();
        if results >= 64 * ANSWERS {
            return (200, completion("done", &[]));
        }
        let args = json!({"route_id": "counter", "instructions": "Count."});
        let calls: Vec<(&str, serde_json::Value)> =
            (0..64).map(|_| ("call_sub_agent", args.clone())).collect();
        (200, completion("", &calls))
    }));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    support::workspace::counter_route(root, llm.providers());
    write_file(
        root,
        "planning/step_config.json",
        json!({"steps": [{"id": "count-rows",
                          "agent_configs": {"declared_execution_mode": "scripted"}}]})
        .to_string(),
    );
    write_file(root, "code/count-rows/main.py", "print('counted')\n");
    #[allow(
        clippy::zombie_processes,
        reason = "reaped by wait4 below, which also gives its resource use"
    )]
    let child =
        support::trellis_command(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
    // The child's own accounting of what it wrote (as `time -v` reads it).
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: plain POSIX calls on zeroed, owned out-parameters.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::wait4(pid, &mut status, 0, &mut usage), pid);
        usage
    };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status}"
    );
    let written = usage.ru_oublock as u64 * 512;
    let session = support::workspace::read_json(
        &root.join("runs/iteration-0/execution/desk/agents/counter/session.json"),
    );
    let calls = session["entries"].as_array().unwrap().len();
    assert_eq!(
        calls,
        64 * ANSWERS,
        "every call is in the session at the end"
    );
    let final_size =
        std::fs::metadata(root.join("runs/iteration-0/execution/desk/agents/counter/session.json"))
            .unwrap()
            .len();
    assert!(
        written < 16 << 20,
        "{written} bytes written for a session of {final_size} bytes"
    );
}

/// A conversation file planted in the workspace was parsed whole at each read of the
/// server's `GET /api/workflow/builder-session` and at each resumed session: 66.8 MB of
/// 950,000 values (under the 64 MiB and 1,000,000-value caps of any JSON file) cost about
/// 500 MB a read, and four reads at once held 2.25 GB (MEDIUM). A conversation file is read
/// within what the builder writes (32 MiB, 600,000 values), one parse at a time, its memory
/// given back after; the page is given the latest 500 messages.
#[test]
fn a_planted_conversation_is_refused_unparsed_and_reads_do_not_add_up() {
    use std::path::PathBuf;
    use support::serve::{DEMO_QUERY, Serve, demo};
    let dir = tempfile::tempdir().unwrap();
    let ws = demo(dir.path());
    let serve = Serve::start(&ws, None, &[]);
    let (_, ack) = serve.post("/api/query", &json!({"query": DEMO_QUERY}));
    let session = ack["session_id"].as_str().unwrap().to_string();
    serve.stream_until(&session, None, "session_status");
    drop(serve);
    let file: PathBuf = std::fs::read_dir(ws.join("builder/conversation"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| {
            e.path()
                .join(format!("session-{session}-conversation.json"))
        })
        .find(|p| p.is_file())
        .expect("the session's conversation file");
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    // The session's file with `messages` more answers of `text` each.
    let plant = |messages: usize, text: &str| {
        let mut planted = written.clone();
        let history = planted["conversation_history"].as_array_mut().unwrap();
        history.extend((0..messages).map(|_| json!({"role": "assistant", "content": text})));
        let bytes = serde_json::to_vec(&planted).unwrap();
        std::fs::write(&file, &bytes).unwrap();
        bytes.len()
    };

    // Too many values, and too many bytes: each refused naming the file and the limit, by
    // the page's read and by a query resuming the session.
    plant(150_000, "ok");
    let serve = Serve::start(&ws, None, &[]);
    let (status, refused) = serve.get("/api/workflow/builder-session", &[]);
    assert_eq!(status, 422, "{refused}");
    let message = refused["detail"].as_str().unwrap_or_default();
    assert!(
        message.contains("holds about") && message.contains("600000 JSON values"),
        "{refused}"
    );
    plant(8, &"x".repeat(5 << 20));
    let (status, refused) = serve.post(
        "/api/query",
        &json!({"query": "more", "session_id": session}),
    );
    assert_eq!(status, 400, "{refused}");
    let message = refused["detail"].as_str().unwrap_or_default();
    assert!(message.contains("33554432"), "{refused}");
    drop(serve);

    // A file just within the limits, read four times at once: the server's memory grows by
    // about one read, not four.
    let bytes = plant(110_000, &"y".repeat(250));
    assert!(bytes > 28 << 20, "{bytes}");
    let serve = Serve::start(&ws, None, &[]);
    let before = support::measure::high_water(serve.pid()).unwrap();
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..4)
            .map(|_| s.spawn(|| serve.get("/api/workflow/builder-session", &[])))
            .collect();
        for reader in readers {
            let (status, read) = reader.join().unwrap();
            assert_eq!(status, 200, "{}", read["detail"]);
            // The page opens with the latest messages; the rest are counted.
            let shown = read["messages"].as_array().unwrap().len();
            let earlier = read["earlier"].as_u64().unwrap() as usize;
            assert_eq!(shown, 500);
            assert!(shown + earlier > 110_000, "{earlier}");
        }
    });
    let grew = support::measure::high_water(serve.pid()).unwrap() - before;
    eprintln!("four reads of a {bytes}-byte conversation: the server grew by {grew} bytes");
    assert!(grew < 400 << 20, "{grew}");
}
