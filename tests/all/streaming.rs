//! Replies that stream: the bundled `openai` and `anthropic` providers read server-sent
//! events from a server on 127.0.0.1 that streams as a script says, report the pieces as
//! they arrive and answer what the whole response gives; a cut stream is retried (the
//! retry said), a stall fails at the idle timeout, malformed events fail naming them, a
//! cancelled call closes its connection; a provider of the 0.1.0 world answers whole; the
//! host bounds the pieces of one reply and hides a key split over them; a recording keeps
//! the pieces and a replay gives them back; and the front ends show them: `trellis builder`
//! prints a reply while it arrives, `trellis run`'s Ctrl-C ends one at once, and
//! `trellis serve` joins them into at most one event per 50 ms.

use crate::support;

use std::io::Read;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_stream::{Answer, Step, StreamServer, openai_chunks};
use support::workspace::write_file;
use support::{engine, plugin_folder};
use trellis_sandbox::llm::{
    self, Delta, Endpoint, LlmError, Message, Recorder, ReplayCursor, ReplyEvent, ReplyStream,
    Request, RetryPolicy, Secret, Target,
};
use trellis_sandbox::{Limits, PluginRegistry};

async fn registry() -> &'static PluginRegistry {
    static REGISTRY: tokio::sync::OnceCell<PluginRegistry> = tokio::sync::OnceCell::const_new();
    REGISTRY
        .get_or_init(|| async {
            let plugins = tempfile::tempdir().unwrap();
            let mut registry = PluginRegistry::with_bundled(engine()).await.unwrap();
            for (component, id) in [("test_snoop", "snoop"), ("old_provider", "old")] {
                let folder = plugin_folder(plugins.path(), component, id, "llm-provider");
                registry.load_dir(&folder).await.unwrap();
            }
            registry
        })
        .await
}

fn limits(timeout: Duration) -> Limits {
    Limits {
        memory_bytes: 64 << 20,
        timeout,
        output_bytes: 1 << 20,
        stdio_bytes: 16 << 10,
        ..Limits::default()
    }
}

fn no_retries() -> RetryPolicy {
    RetryPolicy {
        max_retries: 0,
        ..fast_retries()
    }
}

fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        max_retries: 2,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        max_retry_after: Duration::from_millis(50),
        attempt_timeout: None,
    }
}

fn request(model: &str) -> Request {
    Request {
        model: model.into(),
        messages: vec![Message::system("Be brief."), Message::user("hi")],
        tools: Vec::new(),
        options: Default::default(),
    }
}

/// A stream whose events are collected.
fn watched(streaming: bool) -> (ReplyStream, Arc<Mutex<Vec<ReplyEvent>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let stream = ReplyStream::new(streaming, move |e| log.lock().unwrap().push(e));
    (stream, seen)
}

fn texts(events: &[ReplyEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            ReplyEvent::Text(t) => Some(t.clone()),
            _ => None,
        })
        .collect()
}

fn target(provider: &str, server: &StreamServer, secret: Secret) -> Target {
    let base_url = match provider {
        // The Messages API's path is `/v1/messages` under a base URL without `/v1`.
        "anthropic" => server.base_url().trim_end_matches("/v1").to_string(),
        _ => server.base_url(),
    };
    Target {
        provider: provider.into(),
        model: "m-1".into(),
        endpoint: Endpoint::new(base_url),
        secret,
        stream: true,
    }
}

async fn call(
    target: Target,
    policy: &RetryPolicy,
    limits: &Limits,
    reply: &ReplyStream,
) -> trellis_sandbox::llm::Completion {
    llm::complete_with_reply(
        registry().await,
        &[target],
        &[],
        &request("m-1"),
        policy,
        limits,
        Some(reply),
    )
    .await
}

/// The chat-completions chunks of a reply with text and a tool call whose arguments come in
/// three pieces, and the whole answer the same reply is unstreamed.
fn openai_tool_reply() -> (Vec<Value>, Value) {
    let chunks = vec![
        json!({"model": "m-1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me "}}]}),
        json!({"model": "m-1", "choices": [{"index": 0, "delta": {"content": "look."}}]}),
        json!({"model": "m-1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "workspace__read_file", "arguments": ""}}]}}]}),
        json!({"model": "m-1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"pa"}}]}}]}),
        json!({"model": "m-1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "th\":\"notes/a.md\"}"}}]}}]}),
        json!({"model": "m-1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        json!({"model": "m-1", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}}),
    ];
    let whole = json!({"model": "m-1", "choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "workspace__read_file",
             "arguments": "{\"path\":\"notes/a.md\"}"}}]}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}});
    (chunks, whole)
}

#[tokio::test]
async fn openai_streams_the_pieces_and_answers_what_the_whole_response_gives() {
    let (chunks, whole) = openai_tool_reply();
    let server = StreamServer::start(move |_, body| {
        if body["stream"] == true {
            Answer::events(&chunks, Duration::ZERO)
        } else {
            Answer::json(&whole)
        }
    });
    let mut req = request("m-1");
    req.tools = vec![llm::ToolDefinition {
        name: "workspace:read_file".into(),
        description: "Reads a file.".into(),
        parameters: json!({"type": "object"}),
    }];
    let (streamed, events) = watched(true);
    let (unstreamed, quiet) = watched(false);
    let mut answers = Vec::new();
    for reply in [&streamed, &unstreamed] {
        let done = llm::complete_with_reply(
            registry().await,
            &[target("openai", &server, Secret::none())],
            &[],
            &req,
            &no_retries(),
            &limits(Duration::from_secs(10)),
            Some(reply),
        )
        .await;
        answers.push(done.result.unwrap());
    }
    assert_eq!(answers[0], answers[1], "streamed and whole answers differ");
    assert_eq!(answers[0].tool_calls[0].name, "workspace:read_file");
    assert_eq!(
        answers[0].tool_calls[0].arguments,
        r#"{"path":"notes/a.md"}"#
    );
    assert_eq!(answers[0].usage.total_tokens, 21);
    let events = events.lock().unwrap().clone();
    assert_eq!(texts(&events), ["Let me ", "look."]);
    assert!(
        events.contains(&ReplyEvent::ToolCall {
            index: 0,
            name: "workspace:read_file".into()
        }),
        "{events:?}"
    );
    assert!(
        quiet.lock().unwrap().is_empty(),
        "an unstreamed call showed pieces"
    );
    let seen = server.seen();
    assert_eq!(seen[0]["stream"], true);
    assert_eq!(seen[0]["stream_options"]["include_usage"], true);
    assert!(seen[1].get("stream").is_none(), "{}", seen[1]);
}

#[tokio::test]
async fn anthropic_streams_the_pieces_and_answers_what_the_whole_response_gives() {
    let events_of = || {
        let events = [
            (
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_1", "model": "m-1", "role": "assistant", "content": [], "usage": {"input_tokens": 12, "output_tokens": 1}}}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
            ("ping", json!({"type": "ping"})),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me "}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "look."}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "workspace__read_file", "input": {}}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"path\": "}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"notes/a.md\"}"}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 1}),
            ),
            (
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
        ];
        events
            .iter()
            .map(|(kind, data)| Step::Send(format!("event: {kind}\ndata: {data}\n\n")))
            .collect::<Vec<_>>()
    };
    let whole = json!({"id": "msg_1", "model": "m-1", "role": "assistant", "stop_reason": "tool_use",
        "content": [{"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "workspace__read_file", "input": {"path": "notes/a.md"}}],
        "usage": {"input_tokens": 12, "output_tokens": 9}});
    let server = StreamServer::start(move |_, body| {
        if body["stream"] == true {
            Answer::stream(events_of())
        } else {
            Answer::json(&whole)
        }
    });
    let mut req = request("m-1");
    req.tools = vec![llm::ToolDefinition {
        name: "workspace:read_file".into(),
        description: "Reads a file.".into(),
        parameters: json!({"type": "object"}),
    }];
    let (streamed, events) = watched(true);
    let (unstreamed, _) = watched(false);
    let mut answers = Vec::new();
    for reply in [&streamed, &unstreamed] {
        let done = llm::complete_with_reply(
            registry().await,
            &[target("anthropic", &server, Secret::none())],
            &[],
            &req,
            &no_retries(),
            &limits(Duration::from_secs(10)),
            Some(reply),
        )
        .await;
        answers.push(done.result.unwrap());
    }
    assert_eq!(answers[0], answers[1], "streamed and whole answers differ");
    assert_eq!(
        answers[0].tool_calls[0].arguments,
        r#"{"path":"notes/a.md"}"#
    );
    assert_eq!(answers[0].usage.prompt_tokens, 12);
    assert_eq!(answers[0].usage.completion_tokens, 9);
    assert_eq!(texts(&events.lock().unwrap()), ["Let me ", "look."]);
    assert_eq!(server.seen()[0]["stream"], true);
}

#[tokio::test]
async fn a_stream_cut_mid_reply_is_retried_and_the_retry_is_said() {
    let server = StreamServer::start(|n, _| {
        let chunks = openai_chunks("m-1", &["The ans", "wer is 42."]);
        if n == 0 {
            Answer::stream(vec![
                Step::Send(format!("data: {}\n\n", chunks[0])),
                Step::Cut,
            ])
        } else {
            Answer::events(&chunks, Duration::ZERO)
        }
    });
    let (reply, events) = watched(true);
    let done = call(
        target("openai", &server, Secret::none()),
        &fast_retries(),
        &limits(Duration::from_secs(10)),
        &reply,
    )
    .await;
    assert_eq!(done.result.unwrap().text, "The answer is 42.");
    assert_eq!(done.attempts.len(), 2, "{:?}", done.attempts);
    let events = events.lock().unwrap().clone();
    let restarted = events
        .iter()
        .position(|e| matches!(e, ReplyEvent::Restarted { .. }))
        .unwrap_or_else(|| panic!("no restart in {events:?}"));
    assert_eq!(texts(&events[..restarted]), ["The ans"]);
    assert_eq!(texts(&events[restarted..]), ["The ans", "wer is 42."]);
    let ReplyEvent::Restarted { reason } = &events[restarted] else {
        unreachable!()
    };
    assert!(
        reason.contains("before the answer was complete"),
        "{reason}"
    );
}

#[tokio::test]
async fn a_stream_that_stalls_fails_at_its_idle_timeout() {
    let server = StreamServer::start(|_, _| {
        let chunks = openai_chunks("m-1", &["Thinking", " about it"]);
        Answer::stream(vec![
            Step::Send(format!("data: {}\n\n", chunks[0])),
            Step::Hold,
            Step::Send(format!("data: {}\n\n", chunks[1])),
        ])
    });
    let (reply, events) = watched(true);
    let done = call(
        target("openai", &server, Secret::none()),
        &no_retries(),
        &limits(Duration::from_secs(2)),
        &reply,
    )
    .await;
    let err = done.result.unwrap_err();
    assert!(
        matches!(err.llm_error(), Some(LlmError::Timeout)),
        "expected a timeout, got {err}"
    );
    assert_eq!(texts(&events.lock().unwrap()), ["Thinking"]);
    // The stalled connection was given up, not kept: once the server sends the rest, it
    // finds the connection closed (a connection kept open would wait for a next request).
    server.release();
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.open_connections() > 0 {
        assert!(
            Instant::now() < deadline,
            "the connection of the stalled call is still open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(server.closed_by_client(), 1);
}

#[tokio::test]
async fn malformed_events_fail_the_call_naming_them_and_are_not_retried() {
    let server = StreamServer::start(|_, _| {
        Answer::stream(vec![Step::Send("data: {\"choices\": [oops\n\n".into())])
    });
    let (reply, _) = watched(true);
    let done = call(
        target("openai", &server, Secret::none()),
        &fast_retries(),
        &limits(Duration::from_secs(10)),
        &reply,
    )
    .await;
    let err = done.result.unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err.llm_error(), Some(LlmError::MalformedResponse(_))),
        "{message}"
    );
    assert!(
        message.contains("a streamed chunk is not JSON"),
        "{message}"
    );
    assert!(message.contains("oops"), "{message}");
    assert_eq!(done.attempts.len(), 1);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_cancelled_stream_closes_its_connection_at_once() {
    // Six hundred pieces, 50 ms apart: half a minute if nothing stops it.
    let server = StreamServer::start(|_, _| {
        let pieces: Vec<String> = (0..600).map(|i| format!("w{i} ")).collect();
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        Answer::events(&openai_chunks("m-1", &pieces), Duration::from_millis(50))
    });
    let (reply, events) = watched(true);
    let seen = events.clone();
    let (policy, limits) = (no_retries(), limits(Duration::from_secs(60)));
    let call = call(
        target("openai", &server, Secret::none()),
        &policy,
        &limits,
        &reply,
    );
    // The call is dropped once its first pieces are shown, as a stop drops it.
    let shown = async {
        while texts(&seen.lock().unwrap()).len() < 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        _ = call => panic!("the call ended before it was cancelled"),
        () = shown => {}
    }
    // The runtime runs on meanwhile: the aborted connection task is dropped on it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.open_connections() > 0 {
        assert!(
            Instant::now() < deadline,
            "the connection of the cancelled call is still open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let shown = texts(&events.lock().unwrap()).len();
    assert!(shown < 600, "the whole reply arrived: {shown} pieces");
}

#[tokio::test]
async fn a_provider_of_the_first_world_loads_and_answers_whole() {
    let registry = registry().await;
    let old = registry
        .plugins()
        .find(|p| p.manifest().id == "old")
        .unwrap();
    assert!(!old.streams(), "a 0.1.0 provider streams");
    let openai = registry
        .plugins()
        .find(|p| p.manifest().id == "openai")
        .unwrap();
    assert!(
        openai.streams(),
        "the bundled openai provider does not stream"
    );
    let (reply, events) = watched(true);
    let answer = registry
        .complete_streaming(
            "old",
            &Endpoint::new(String::new()),
            &Secret::none(),
            &request("m"),
            &limits(Duration::from_secs(10)),
            Some(&reply),
        )
        .await
        .unwrap();
    assert_eq!(answer.text, "old provider: hi");
    assert!(events.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_provider_cannot_report_past_the_bounds_of_one_reply() {
    for (mode, taken) in [
        ("pieces", llm::stream::MAX_REPLY_PIECES as u64),
        ("big_pieces", 1),
    ] {
        let (reply, events) = watched(true);
        let answer = registry()
            .await
            .complete_streaming(
                "snoop",
                &Endpoint::new(String::new()).with_settings(json!({"mode": mode})),
                &Secret::none(),
                &request("m"),
                &limits(Duration::from_secs(30)),
                Some(&reply),
            )
            .await
            .unwrap();
        let said: Value = serde_json::from_str(&answer.text).unwrap();
        assert_eq!(said["streaming"], true);
        assert_eq!(said["taken"], taken, "{mode}: {said}");
        let shown: usize = texts(&events.lock().unwrap()).iter().map(String::len).sum();
        assert!(shown <= 1 << 20, "{mode}: {shown} bytes shown");
    }
}

#[tokio::test]
async fn a_key_split_over_pieces_never_shows_eight_bytes_of_it() {
    let key = "sk-streaming-0123456789abcdefXYZ";
    // The server echoes the key it got, three bytes a piece.
    let server = StreamServer::start(move |_, _| {
        let echo = format!("your key is {key}, thanks");
        let pieces: Vec<String> = echo
            .as_bytes()
            .chunks(3)
            .map(|c| String::from_utf8(c.to_vec()).unwrap())
            .collect();
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        Answer::events(&openai_chunks("m-1", &pieces), Duration::ZERO)
    });
    let (reply, events) = watched(true);
    let done = call(
        target("openai", &server, Secret::new(key)),
        &no_retries(),
        &limits(Duration::from_secs(10)),
        &reply,
    )
    .await;
    let answer = done.result.unwrap();
    assert!(answer.text.contains("[REDACTED]"), "{}", answer.text);
    let shown = texts(&events.lock().unwrap()).concat();
    assert!(shown.starts_with("your key is [REDACTED]"), "{shown}");
    assert!(shown.ends_with(", thanks"), "{shown}");
    for window in key.as_bytes().windows(8) {
        let window = std::str::from_utf8(window).unwrap();
        assert!(!shown.contains(window), "{window:?} shown in {shown:?}");
    }
}

#[tokio::test]
async fn a_recorded_stream_replays_offline_with_the_same_pieces() {
    let pieces = ["Rec", "orded ", "in ", "pieces."];
    let server = StreamServer::start(move |_, _| {
        Answer::events(&openai_chunks("m-1", &pieces), Duration::ZERO)
    });
    let ws = tempfile::tempdir().unwrap();
    let cassette = ws.path().join("cassettes/talk.json");
    std::fs::create_dir_all(cassette.parent().unwrap()).unwrap();
    let recorder = Recorder::create(&cassette).unwrap();
    let (reply, live) = watched(true);
    let recorded = trellis_runner::llm_choice::complete(
        registry().await,
        &[target("openai", &server, Secret::none())],
        &[],
        None,
        Some(&recorder),
        &request("m-1"),
        &no_retries(),
        &limits(Duration::from_secs(10)),
        Some(&reply),
    )
    .await
    .result
    .unwrap();
    let file: Value = serde_json::from_slice(&std::fs::read(&cassette).unwrap()).unwrap();
    let chunks = &file["interactions"][0]["chunks"];
    let texts_kept: Vec<&str> = chunks
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["text"].as_str())
        .collect();
    assert_eq!(texts_kept, pieces, "{chunks}");
    let _: Vec<Delta> = serde_json::from_value(chunks.clone()).unwrap();

    // Offline now: the server is not asked again.
    let cursor = ReplayCursor::in_workspace(ws.path(), "talk").unwrap();
    let replay = Target {
        provider: "replay".into(),
        model: "m-1".into(),
        endpoint: cursor.endpoint_at(0).unwrap(),
        secret: Secret::none(),
        stream: true,
    };
    let (reply, replayed) = watched(true);
    let again = trellis_runner::llm_choice::complete(
        registry().await,
        &[replay],
        &[],
        Some(&cursor),
        None,
        &request("m-1"),
        &no_retries(),
        &limits(Duration::from_secs(10)),
        Some(&reply),
    )
    .await
    .result
    .unwrap();
    assert_eq!(again, recorded);
    assert_eq!(
        texts(&replayed.lock().unwrap()),
        texts(&live.lock().unwrap())
    );
    assert_eq!(server.seen().len(), 1, "the replay asked the server");
}

/// A workspace with one regular step whose model (the builder's too) is `openai:m-1` on
/// `server`.
pub(crate) fn workspace(root: &Path, server: &StreamServer) {
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "Say hello", "steps": [
            {"id": "greet", "type": "regular", "title": "Greet", "description": "Say hello."}
        ]})
        .to_string(),
    );
    write_file(root, "planning/step_config.json", r#"{"steps": []}"#);
    write_file(
        root,
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m-1"},
               "providers": {"openai": {"base_url": server.base_url()}}})
        .to_string(),
    );
}

#[test]
fn the_builder_prints_a_reply_while_it_arrives() {
    // The server sends the first half and holds the rest until the test has read the
    // first half on the builder's stdout: a builder that printed only whole answers
    // would never get the rest.
    let server = Arc::new(StreamServer::start(|_, _| {
        let chunks = openai_chunks("m-1", &["first-half ", "second-half"]);
        Answer::stream(vec![
            Step::Send(format!("data: {}\n\n", chunks[0])),
            Step::Hold,
            Step::Send(format!("data: {}\n\n", chunks[1])),
            Step::Send(format!("data: {}\n\n", chunks[2])),
            Step::Send(format!("data: {}\n\n", chunks[3])),
            Step::Send("data: [DONE]\n\n".into()),
        ])
    }));
    let ws = tempfile::tempdir().unwrap();
    workspace(ws.path(), &server);
    let mut child = support::trellis_command(&[
        "builder",
        ws.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "-m",
        "hi",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let releaser = server.clone();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut buf = [0u8; 256];
        let mut released = false;
        loop {
            let n = stdout.read(&mut buf).unwrap_or(0);
            if n == 0 {
                return String::from_utf8_lossy(&out).into_owned();
            }
            out.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&out);
            if !released && text.contains("first-half") {
                assert!(!text.contains("second-half"), "{text}");
                releaser.release();
                released = true;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the builder never printed the first half before the whole reply");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = reader.join().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{out}\n{err}");
    // The reply once, whole, on its own line.
    assert_eq!(out.matches("first-half second-half").count(), 1, "{out}");
    assert!(out.contains("first-half second-half\n"), "{out}");
}

#[test]
fn ctrl_c_ends_a_streaming_reply_of_trellis_run_at_once() {
    let server = StreamServer::start(|_, _| {
        let pieces: Vec<String> = (0..600).map(|i| format!("w{i} ")).collect();
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        Answer::events(&openai_chunks("m-1", &pieces), Duration::from_millis(50))
    });
    let ws = tempfile::tempdir().unwrap();
    workspace(ws.path(), &server);
    let mut child = support::trellis_command(&[
        "run",
        ws.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.seen().is_empty() {
        assert!(Instant::now() < deadline, "the run never asked the model");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A few pieces in, well before the reply's 30 s.
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) with a pid this test spawned and SIGINT.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the run went on after Ctrl-C");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "{out}\n{err}");
    assert!(out.contains("step greet: stopped"), "{out}\n{err}");
    let session: Value = serde_json::from_slice(
        &std::fs::read(
            ws.path()
                .join("runs/iteration-0/execution/greet/session.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(session["status"], "stopped", "{session}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.open_connections() > 0 {
        assert!(Instant::now() < deadline, "a connection is still open");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_server_joins_the_pieces_of_a_reply_to_one_event_per_50_ms() {
    let pieces: Vec<String> = (0..400).map(|i| format!("p{i} ")).collect();
    let whole = pieces.concat();
    let server = StreamServer::start(move |_, _| {
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        // 400 pieces over about 2 s.
        Answer::events(&openai_chunks("m-1", &pieces), Duration::from_millis(5))
    });
    let ws = tempfile::tempdir().unwrap();
    workspace(ws.path(), &server);
    let serve = support::serve::Serve::start(ws.path(), None, &["--allow-host", "127.0.0.1"]);
    let (status, ack) = serve.post("/api/query", &json!({"query": "hi"}));
    assert_eq!(status, 202, "{ack}");
    let session = ack["session_id"].as_str().unwrap().to_string();
    let events = serve.stream_until(&session, None, "turn_ended");
    let deltas: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "text_delta")
        .collect();
    let joined: String = deltas.iter().map(|e| e["text"].as_str().unwrap()).collect();
    assert_eq!(joined, whole);
    assert!(
        deltas.len() > 1 && deltas.len() < 100,
        "{} text events for 400 pieces",
        deltas.len()
    );
    // The last one may come sooner: the end of the reply flushes what waits.
    let at: Vec<u64> = deltas
        .iter()
        .map(|e| e["at_us"].as_u64().unwrap())
        .collect();
    for pair in at[..at.len() - 1].windows(2) {
        assert!(
            pair[1] - pair[0] >= 45_000,
            "two text events {} us apart",
            pair[1] - pair[0]
        );
    }
    // The whole text follows, once.
    let text: Vec<&Value> = events.iter().filter(|e| e["type"] == "text").collect();
    assert_eq!(text.len(), 1);
    assert_eq!(text[0]["text"], whole.as_str());
}
