//! LLM provider plugins against a fake OpenAI-compatible server on 127.0.0.1:
//! tool calls and usage, the API key added by the host and never seen by the
//! plugin, refused destinations, retries, fallbacks, malformed and slow answers,
//! and the `replay` provider with its cassettes.

use crate::support;

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::{Value, json};
use support::{engine, plugin_folder};
use trellis_sandbox::llm::{
    self, AttemptStatus, Endpoint, LlmCallError, LlmError, Message, Recorder, ReplayCursor,
    Request, RetryPolicy, Role, Secret, StopReason, Target, ToolCall, ToolDefinition,
};
use trellis_sandbox::{Limits, PluginRegistry};

// ---------------------------------------------------------------- fake server

/// A request as the fake server saw it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: BTreeMap<String, String>,
    body: Value,
}

/// What the fake server answers.
#[derive(Debug, Clone)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
    delay: Duration,
}

impl Reply {
    fn json(body: Value) -> Reply {
        Reply::status(200, &body.to_string())
    }

    fn status(status: u16, body: &str) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: body.to_string(),
            delay: Duration::ZERO,
        }
    }

    fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }

    fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

type Script = Box<dyn Fn(&Seen) -> Reply + Send>;

/// An OpenAI-compatible server answering from a script, one entry per request;
/// when the script runs out it answers 500.
struct FakeServer {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl FakeServer {
    fn start(script: Vec<Script>) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        let log = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let log = log.clone();
                let script = script.clone();
                std::thread::spawn(move || serve(stream, &log, &script));
            }
        });
        FakeServer { addr, seen }
    }

    fn replies(replies: Vec<Reply>) -> FakeServer {
        FakeServer::start(
            replies
                .into_iter()
                .map(|r| Box::new(move |_: &Seen| r.clone()) as Script)
                .collect(),
        )
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(stream: TcpStream, log: &Mutex<Vec<Seen>>, script: &Mutex<VecDeque<Script>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut headers = BTreeMap::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).unwrap();
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').unwrap();
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    let length: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    let seen = Seen {
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    let next = script.lock().unwrap().pop_front();
    let reply = match next {
        Some(f) => f(&seen),
        None => Reply::status(500, "script exhausted"),
    };
    log.lock().unwrap().push(seen);
    std::thread::sleep(reply.delay);
    let mut out = format!(
        "HTTP/1.1 {} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        reply.status,
        reply.body.len()
    );
    for (name, value) in &reply.headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(&reply.body);
    let mut stream = stream;
    let _ = stream.write_all(out.as_bytes());
}

fn completion(message: Value, usage: Value) -> Value {
    let finish = if message.get("tool_calls").is_some() {
        "tool_calls"
    } else {
        "stop"
    };
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "fake-model-2025",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    })
}

fn text_reply(text: &str) -> Reply {
    Reply::json(completion(
        json!({"role": "assistant", "content": text}),
        json!({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}),
    ))
}

// ---------------------------------------------------------------- helpers

async fn registry() -> &'static PluginRegistry {
    static REGISTRY: tokio::sync::OnceCell<PluginRegistry> = tokio::sync::OnceCell::const_new();
    REGISTRY
        .get_or_init(|| async {
            let plugins = tempfile::tempdir().unwrap();
            let folder = plugin_folder(plugins.path(), "test_snoop", "snoop", "llm-provider");
            let mut registry = PluginRegistry::with_bundled(engine()).await.unwrap();
            registry.load_dir(&folder).await.unwrap();
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

fn quick() -> Limits {
    limits(Duration::from_secs(10))
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

fn simple_request(text: &str) -> Request {
    Request {
        model: "gpt-test".into(),
        messages: vec![Message::system("Be brief."), Message::user(text)],
        tools: Vec::new(),
        options: Default::default(),
    }
}

fn tool(name: &str) -> ToolDefinition {
    ToolDefinition {
        name: name.into(),
        description: format!("The {name} tool."),
        parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
    }
}

/// A key held only by the host, set once in an environment variable of the
/// test process (the host reads keys from the environment).
fn test_key() -> (&'static str, Secret) {
    const VAR: &str = "TRELLIS_LLM_TEST_KEY";
    const KEY: &str = "sk-test-0123456789-never-in-the-guest";
    static SET: OnceLock<()> = OnceLock::new();
    SET.get_or_init(|| {
        // SAFETY: set once, before any test reads it, and only read through std.
        unsafe { std::env::set_var(VAR, KEY) };
    });
    (KEY, Secret::from_env(VAR))
}

fn valid_function_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

// ---------------------------------------------------------------- openai

#[tokio::test]
async fn bundled_providers_are_loaded_as_llm_providers() {
    let registry = registry().await;
    for id in ["openai", "anthropic", "replay"] {
        let plugin = registry.get(id).unwrap();
        assert_eq!(plugin.manifest().kind.as_str(), "llm-provider");
    }
}

#[tokio::test]
async fn openai_round_trips_tool_calls_with_usage_and_the_host_adds_the_key() {
    // The model answers by calling the tools under the names it was offered.
    let server = FakeServer::start(vec![Box::new(|seen: &Seen| {
        let tools = seen.body["tools"].as_array().unwrap();
        let api = |i: usize| tools[i]["function"]["name"].as_str().unwrap().to_string();
        Reply::json(completion(
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": api(0), "arguments": "{\"path\":\"notes/a.md\"}"}},
                {"id": "call_b", "type": "function", "function": {"name": api(1), "arguments": "{\"path\":\"x\"}"}},
            ]}),
            json!({"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}),
        ))
    }) as Script]);
    let (key, secret) = test_key();
    let mut request = simple_request("Read the notes.");
    request.tools = vec![
        tool("workspace:read_file"),
        tool("db.tools:run.query"),
        tool("a__b:c"),
        tool("a:b__c"),
    ];
    // History with an earlier tool call and its result goes out mapped too.
    request.messages.push(Message {
        role: Role::Assistant,
        content: String::new(),
        tool_calls: vec![ToolCall {
            id: "call_0".into(),
            name: "db.tools:run.query".into(),
            arguments: "{\"path\":\"y\"}".into(),
        }],
        tool_call_id: None,
    });
    request.messages.push(Message::tool_result("call_0", "[]"));
    request.options.temperature = Some(0.2);
    request.options.max_tokens = Some(500);

    let response = registry()
        .await
        .complete(
            "openai",
            &Endpoint::new(server.base_url()),
            &secret,
            &request,
            &quick(),
        )
        .await
        .unwrap();

    let names: Vec<&str> = response
        .tool_calls
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["workspace:read_file", "db.tools:run.query"]);
    assert_eq!(response.tool_calls[0].id, "call_a");
    assert_eq!(
        response.tool_calls[0].arguments,
        "{\"path\":\"notes/a.md\"}"
    );
    assert_eq!(response.stop_reason, StopReason::ToolCalls);
    assert_eq!(
        (
            response.usage.prompt_tokens,
            response.usage.completion_tokens,
            response.usage.total_tokens
        ),
        (120, 30, 150)
    );
    assert_eq!(response.model.as_deref(), Some("fake-model-2025"));

    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    let sent = &seen[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(
        sent.headers.get("authorization").map(String::as_str),
        Some(format!("Bearer {key}").as_str())
    );
    assert_eq!(sent.body["model"], "gpt-test");
    assert_eq!(sent.body["max_tokens"], 500);
    assert_eq!(sent.body["temperature"], 0.2);
    let api_names: Vec<&str> = sent.body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        api_names.iter().all(|n| valid_function_name(n)),
        "{api_names:?}"
    );
    let unique: std::collections::BTreeSet<_> = api_names.iter().collect();
    assert_eq!(unique.len(), 4, "names collide: {api_names:?}");
    assert_eq!(api_names[0], "workspace__read_file");
    let messages = sent.body["messages"].as_array().unwrap();
    assert_eq!(
        messages[2]["tool_calls"][0]["function"]["name"],
        api_names[1]
    );
    assert_eq!(messages[3]["role"], "tool");
    assert_eq!(messages[3]["tool_call_id"], "call_0");
}

#[tokio::test]
async fn the_plugin_sees_no_environment_and_cannot_set_its_own_credentials() {
    let (key, secret) = test_key();
    let registry = registry().await;
    let snoop = |settings: Value, base_url: String| {
        let secret = secret.clone();
        async move {
            registry
                .complete(
                    "snoop",
                    &Endpoint::new(base_url).with_settings(settings),
                    &secret,
                    &simple_request("hi"),
                    &quick(),
                )
                .await
        }
    };

    let seen = snoop(json!({"mode": "env"}), String::new()).await.unwrap();
    let found: Value = serde_json::from_str(&seen.text).unwrap();
    assert_eq!(found["env"], json!([]), "{found}");
    assert!(!seen.text.contains(key));

    // Its own authorization header is refused before anything is sent.
    let server = FakeServer::replies(vec![text_reply("never")]);
    let err = snoop(
        json!({"mode": "fetch", "url": format!("{}/x", server.base_url()),
               "headers": {"authorization": "Bearer stolen"}}),
        server.base_url(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err.llm_error(), Some(LlmError::Transport(m)) if m.contains("headers refused")),
        "{err}"
    );
    assert!(server.seen().is_empty());
}

#[tokio::test]
async fn a_request_to_another_host_is_refused_and_never_sent() {
    let (_, secret) = test_key();
    let allowed = FakeServer::replies(vec![text_reply("ok")]);
    let other = FakeServer::replies(vec![text_reply("should not be reached")]);
    let err = registry()
        .await
        .complete(
            "snoop",
            &Endpoint::new(allowed.base_url()).with_settings(
                json!({"mode": "fetch", "url": format!("{}/steal", other.base_url())}),
            ),
            &secret,
            &simple_request("hi"),
            &quick(),
        )
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err.llm_error(), Some(LlmError::Transport(_))),
        "{message}"
    );
    assert!(
        message.contains(&format!("refused the request to http://{}", other.addr)),
        "{message}"
    );
    assert!(message.contains(&allowed.addr.to_string()), "{message}");
    assert!(other.seen().is_empty(), "the other host got a request");
    assert!(allowed.seen().is_empty());
    // A transport failure is retried, but not the host's refusal: it would only repeat.
    assert!(!err.is_retryable(), "{message}");
    let target = Target {
        provider: "snoop".into(),
        model: "m".into(),
        endpoint: Endpoint::new(allowed.base_url())
            .with_settings(json!({"mode": "fetch", "url": format!("{}/steal", other.base_url())})),
        secret: secret.clone(),
        stream: true,
    };
    let completion = llm::complete_with_retries(
        registry().await,
        &[target],
        &simple_request("hi"),
        &fast_retries(),
        &quick(),
    )
    .await;
    assert!(completion.result.is_err());
    assert_eq!(completion.attempts.len(), 1, "{:?}", completion.attempts);
    assert!(other.seen().is_empty(), "the other host got a request");
}

#[tokio::test]
async fn rate_limits_are_retried_after_the_servers_retry_after() {
    let server = FakeServer::replies(vec![
        Reply::status(429, r#"{"error":{"message":"slow down"}}"#).header("retry-after", "1"),
        text_reply("done"),
    ]);
    let target = Target {
        provider: "openai".into(),
        model: "gpt-test".into(),
        endpoint: Endpoint::new(server.base_url()),
        secret: Secret::none(),
        stream: true,
    };
    let done = llm::complete_with_retries(
        registry().await,
        &[target],
        &simple_request("hi"),
        &fast_retries(),
        &quick(),
    )
    .await;
    assert_eq!(done.result.unwrap().text, "done");
    let statuses: Vec<_> = done.attempts.iter().map(|a| a.status).collect();
    assert_eq!(statuses, [AttemptStatus::RateLimited, AttemptStatus::Ok]);
    assert_eq!(done.attempts[0].retry_after_ms, Some(1000));
    // Retry-After (1 s) is honoured up to the policy's bound (50 ms).
    assert_eq!(done.attempts[0].delay_ms, Some(50));
    assert_eq!(server.seen().len(), 2);
    // Without a key the host sends no authorization at all.
    assert!(!server.seen()[0].headers.contains_key("authorization"));
}

#[tokio::test]
async fn server_errors_exhaust_retries_then_the_fallback_answers() {
    let failing = FakeServer::replies(vec![
        Reply::status(500, "boom"),
        Reply::status(503, "still down"),
        Reply::status(502, "down"),
    ]);
    let fallback = FakeServer::replies(vec![text_reply("from the fallback")]);
    let targets = [
        Target {
            provider: "openai".into(),
            model: "primary-model".into(),
            endpoint: Endpoint::new(failing.base_url()),
            secret: Secret::none(),
            stream: true,
        },
        Target {
            provider: "openai".into(),
            model: "fallback-model".into(),
            endpoint: Endpoint::new(fallback.base_url()),
            secret: Secret::none(),
            stream: true,
        },
    ];
    let done = llm::complete_with_retries(
        registry().await,
        &targets,
        &simple_request("hi"),
        &fast_retries(),
        &quick(),
    )
    .await;
    assert_eq!(done.result.as_ref().unwrap().text, "from the fallback");
    let trail: Vec<_> = done
        .attempts
        .iter()
        .map(|a| (a.model.as_str(), a.status))
        .collect();
    assert_eq!(
        trail,
        [
            ("primary-model", AttemptStatus::ServerError),
            ("primary-model", AttemptStatus::ServerError),
            ("primary-model", AttemptStatus::ServerError),
            ("fallback-model", AttemptStatus::Ok),
        ]
    );
    assert!(done.attempts[0].error.as_deref().unwrap().contains("500"));
    assert_eq!(done.answered_by().unwrap().model, "fallback-model");
    assert_eq!(fallback.seen()[0].body["model"], "fallback-model");
    // The log form of an attempt is plain JSON.
    let logged = serde_json::to_value(&done.attempts[0]).unwrap();
    assert_eq!(logged["status"], "server_error");
}

#[tokio::test]
async fn invalid_requests_are_not_retried() {
    let server = FakeServer::replies(vec![Reply::status(
        400,
        r#"{"error":{"message":"model `nope` does not exist"}}"#,
    )]);
    let target = Target {
        provider: "openai".into(),
        model: "nope".into(),
        endpoint: Endpoint::new(server.base_url()),
        secret: Secret::none(),
        stream: true,
    };
    let done = llm::complete_with_retries(
        registry().await,
        &[target],
        &simple_request("hi"),
        &fast_retries(),
        &quick(),
    )
    .await;
    let err = done.result.unwrap_err();
    assert!(
        matches!(err.llm_error(), Some(LlmError::InvalidRequest(m)) if m.contains("does not exist")),
        "{err}"
    );
    assert_eq!(done.attempts.len(), 1);
}

#[tokio::test]
async fn a_malformed_body_is_a_malformed_response() {
    let server = FakeServer::replies(vec![Reply::status(200, "{\"choices\": [oops")]);
    let err = registry()
        .await
        .complete(
            "openai",
            &Endpoint::new(server.base_url()),
            &Secret::none(),
            &simple_request("hi"),
            &quick(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err.llm_error(), Some(LlmError::MalformedResponse(m)) if m.contains("not JSON")),
        "{err}"
    );
}

#[tokio::test]
async fn a_slow_server_is_a_timeout() {
    let server = FakeServer::replies(vec![text_reply("late").after(Duration::from_secs(4))]);
    let err = registry()
        .await
        .complete(
            "openai",
            &Endpoint::new(server.base_url()),
            &Secret::none(),
            &simple_request("hi"),
            &limits(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    assert!(matches!(err.llm_error(), Some(LlmError::Timeout)), "{err}");
    assert!(err.is_retryable());
}

#[tokio::test]
async fn an_unknown_provider_is_named() {
    let err = registry()
        .await
        .complete(
            "nope",
            &Endpoint::default(),
            &Secret::none(),
            &simple_request("hi"),
            &quick(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LlmCallError::UnknownProvider { .. }));
    assert!(err.to_string().contains("openai"), "{err}");
}

// ---------------------------------------------------------------- replay

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/llm")
        .join(name)
}

fn replay_request(last_user: &str) -> Request {
    Request {
        model: "gpt-test".into(),
        messages: vec![
            Message::system("You triage tickets."),
            Message::user(last_user),
        ],
        tools: vec![tool("workspace:read_file")],
        options: Default::default(),
    }
}

async fn replay(request: &Request, index: usize) -> Result<llm::Response, LlmCallError> {
    let endpoint = Endpoint::replay(&fixture("triage.cassette.json"), index).unwrap();
    registry()
        .await
        .complete("replay", &endpoint, &Secret::none(), request, &quick())
        .await
}

#[tokio::test]
async fn replay_answers_from_the_cassette_in_order() {
    let mut request = replay_request("Triage ticket 7.");
    let first = replay(&request, 0).await.unwrap();
    assert_eq!(first.tool_calls.len(), 1);
    assert_eq!(first.tool_calls[0].name, "workspace:read_file");
    assert_eq!(first.stop_reason, StopReason::ToolCalls);
    assert_eq!(first.usage.total_tokens, 60);

    request.messages.push(Message::assistant(&first));
    request.messages.push(Message::tool_result(
        "call_1",
        "{\"content\":\"printer on fire\"}",
    ));
    let second = replay(&request, 1).await.unwrap();
    assert_eq!(second.text, "Ticket 7 is urgent.");
    assert_eq!(second.stop_reason, StopReason::Stop);
}

#[tokio::test]
async fn replay_shows_the_first_difference() {
    let err = replay(&replay_request("Triage ticket 8."), 0)
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err.llm_error(), Some(LlmError::InvalidRequest(_))),
        "{message}"
    );
    for part in [
        "interaction 0",
        "messages[1].content",
        "character 14",
        "\"Triage ticket 7.\"",
        "\"Triage ticket 8.\"",
    ] {
        assert!(message.contains(part), "missing {part:?} in: {message}");
    }

    let err = replay(&replay_request("Triage ticket 7."), 2)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("call 3 was not recorded"), "{err}");
}

#[tokio::test]
async fn a_recorded_cassette_replays_the_same_answers() {
    let server = FakeServer::replies(vec![
        Reply::json(completion(
            json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "workspace__read_file", "arguments": "{\"path\":\"t.md\"}"}}
            ]}),
            json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}),
        )),
        text_reply("all done"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let cassette = dir.path().join("run.cassette.json");
    let recorder = Recorder::create(&cassette).unwrap();
    let registry = registry().await;
    let endpoint = Endpoint::new(server.base_url());

    let mut request = replay_request("Triage ticket 7.");
    let mut live = Vec::new();
    for turn in 0..2 {
        let response = recorder
            .complete(
                registry,
                "openai",
                &endpoint,
                &Secret::none(),
                &request,
                &quick(),
            )
            .await
            .unwrap();
        request.messages.push(Message::assistant(&response));
        if turn == 0 {
            request
                .messages
                .push(Message::tool_result("c1", "ticket text"));
        }
        live.push(response);
    }
    assert_eq!(recorder.len(), 2);
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&cassette).unwrap()).unwrap();
    assert_eq!(
        saved["interactions"][0]["response"]["tool_calls"][0]["arguments"]["path"],
        "t.md"
    );

    let mut request = replay_request("Triage ticket 7.");
    let cursor = ReplayCursor::new(&cassette);
    for (index, expected) in live.iter().enumerate() {
        let response = registry
            .complete(
                "replay",
                &cursor.next_endpoint().unwrap(),
                &Secret::none(),
                &request,
                &quick(),
            )
            .await
            .unwrap();
        assert_eq!(&response, expected);
        request.messages.push(Message::assistant(&response));
        if index == 0 {
            request
                .messages
                .push(Message::tool_result("c1", "ticket text"));
        }
    }
    assert_eq!(cursor.position(), 2);
}

/// Records `n` calls of a growing conversation through `recorder`, answered live by the
/// fake server; returns the answers.
async fn record_calls(recorder: &Recorder, n: usize) -> Vec<llm::Response> {
    let server = FakeServer::replies(
        (0..n)
            .map(|i| text_reply(&format!("answer {i}: {}", "x".repeat(200))))
            .collect(),
    );
    let endpoint = Endpoint::new(server.base_url());
    let mut request = replay_request("Triage ticket 7.");
    let mut answers = Vec::new();
    for i in 0..n {
        let response = recorder
            .complete(
                registry().await,
                "openai",
                &endpoint,
                &Secret::none(),
                &request,
                &quick(),
            )
            .await
            .unwrap();
        request.messages.push(Message::assistant(&response));
        request.messages.push(Message::user(format!("go on ({i})")));
        answers.push(response);
    }
    answers
}

#[tokio::test]
async fn a_recording_writes_each_interaction_once() {
    // Before, every interaction rewrote the whole cassette: a run of N calls wrote the sum
    // of N file sizes (here about 20 times the final file). Now the bytes written are the
    // file itself plus one footer per interaction, after every call.
    let dir = tempfile::tempdir().unwrap();
    let cassette = dir.path().join("long.json");
    let recorder = Recorder::create(&cassette).unwrap();
    let empty = (llm::RECORDING_HEADER.len() + llm::RECORDING_FOOTER.len()) as u64;
    assert_eq!(recorder.bytes_written(), empty);
    assert_eq!(std::fs::metadata(&cassette).unwrap().len(), empty);
    let server = FakeServer::replies((0..40).map(|i| text_reply(&format!("a{i}"))).collect());
    let endpoint = Endpoint::new(server.base_url());
    let mut request = replay_request("Triage ticket 7.");
    let mut answers = Vec::new();
    for k in 1..=40u64 {
        let response = recorder
            .complete(
                registry().await,
                "openai",
                &endpoint,
                &Secret::none(),
                &request,
                &quick(),
            )
            .await
            .unwrap();
        request.messages.push(Message::assistant(&response));
        request.messages.push(Message::user("go on"));
        answers.push(response);
        let len = std::fs::metadata(&cassette).unwrap().len();
        assert_eq!(
            recorder.bytes_written(),
            len + k * llm::RECORDING_FOOTER.len() as u64,
            "after {k} interactions"
        );
    }
    let len = std::fs::metadata(&cassette).unwrap().len();
    assert!(
        recorder.bytes_written() < len + 200,
        "{}",
        recorder.bytes_written()
    );
    // The cassette is one JSON document and replays every answer.
    let saved = llm::Cassette::load(&cassette).unwrap();
    assert_eq!(saved.interactions.len(), 40);
    let parsed: Value = serde_json::from_slice(&std::fs::read(&cassette).unwrap()).unwrap();
    assert_eq!(parsed["interactions"].as_array().unwrap().len(), 40);
    let mut request = replay_request("Triage ticket 7.");
    let cursor = ReplayCursor::new(&cassette);
    for expected in &answers {
        let response = registry()
            .await
            .complete(
                "replay",
                &cursor.next_endpoint().unwrap(),
                &Secret::none(),
                &request,
                &quick(),
            )
            .await
            .unwrap();
        assert_eq!(&response, expected);
        request.messages.push(Message::assistant(&response));
        request.messages.push(Message::user("go on"));
    }
}

#[tokio::test]
async fn a_recording_stops_at_its_cap_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let cassette = dir.path().join("capped.json");
    let recorder = Recorder::create(&cassette).unwrap().with_cap(4096);
    let answers = record_calls(&recorder, 12).await;
    // Every call was answered, though the recording stopped.
    assert_eq!(answers.len(), 12);
    assert!(recorder.stopped());
    let kept = recorder.len();
    assert!((1..12).contains(&kept), "{kept}");
    let len = std::fs::metadata(&cassette).unwrap().len();
    assert!(len <= 4096, "{len}");
    let saved = llm::Cassette::load(&cassette).unwrap();
    assert_eq!(saved.interactions.len(), kept);
    for (interaction, answer) in saved.interactions.iter().zip(&answers) {
        assert_eq!(&interaction.response, answer);
    }
    // Once stopped, nothing more is written.
    let written = recorder.bytes_written();
    recorder
        .record(&replay_request("more"), &answers[0])
        .unwrap();
    assert_eq!(recorder.bytes_written(), written);
    assert_eq!(std::fs::metadata(&cassette).unwrap().len(), len);
    // The error says what happened, once.
    let fresh = Recorder::create(dir.path().join("tiny.json"))
        .unwrap()
        .with_cap(64);
    let err = fresh
        .record(&replay_request("Triage ticket 7."), &answers[0])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("recording stopped: interaction 1 (")
            && err.contains("would take the cassette past its cap of 64 bytes (--record-max-mib); it holds the 0 interaction(s) before, and the run goes on unrecorded"),
        "{err}"
    );
}

#[tokio::test]
async fn a_recording_cut_short_replays_up_to_its_last_whole_interaction() {
    let dir = tempfile::tempdir().unwrap();
    let cassette = dir.path().join("cut.json");
    let recorder = Recorder::create(&cassette).unwrap();
    let answers = record_calls(&recorder, 5).await;
    let whole = std::fs::read(&cassette).unwrap();
    let footer = llm::RECORDING_FOOTER.len();
    // Where the last line starts: after the fourth line's end.
    let body = &whole[..whole.len() - footer];
    let last_start = body[..body.len() - 1]
        .iter()
        .rposition(|&b| b == b'\n')
        .unwrap()
        + 1;
    // A kill between cutting the footer and writing the line, and kills part way through
    // the line (its comma alone, half of it, all but its end of line): four whole ones.
    for cut in [
        last_start,
        last_start + 1,
        (last_start + body.len()) / 2,
        body.len() - 1,
    ] {
        let file = dir.path().join("cut-short.json");
        std::fs::write(&file, &whole[..cut]).unwrap();
        let saved = llm::Cassette::load(&file).unwrap();
        assert_eq!(saved.interactions.len(), 4, "cut at {cut}");
        for (interaction, answer) in saved.interactions.iter().zip(&answers) {
            assert_eq!(&interaction.response, answer);
        }
        let cursor = ReplayCursor::new(&file);
        let endpoint = cursor.endpoint_at(3).unwrap();
        assert_eq!(
            endpoint.settings["interaction"]["response"]["text"],
            answers[3].text.as_str()
        );
    }
    // The whole last line without the footer: five.
    let file = dir.path().join("no-footer.json");
    std::fs::write(&file, body).unwrap();
    assert_eq!(llm::Cassette::load(&file).unwrap().interactions.len(), 5);
    // A broken line before the last is not a cut: the cassette is refused.
    let mut broken = whole.clone();
    broken[last_start - 3] = b'{';
    std::fs::write(&file, &broken[..whole.len() - 5]).unwrap();
    let err = format!("{:#}", llm::Cassette::load(&file).unwrap_err());
    assert!(err.contains("not JSON"), "{err}");
}
