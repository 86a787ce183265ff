//! An OpenAI-compatible chat completions server on 127.0.0.1 for tests that run workflows
//! against a real HTTP endpoint: it answers from a handler and keeps every request body,
//! and counts the connections it accepted.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use trellis_runner::llm_choice::LlmSetup;
use trellis_sandbox::llm::{KeyApprovals, Response, StopReason};
use trellis_workflow::step_config::LlmRef;

/// What the server answers: status and JSON body, from the request body.
pub type Handler = Box<dyn Fn(&Value) -> (u16, Value) + Send + Sync>;

/// A handler that also sees the request's `Authorization` header.
pub type AuthHandler = Box<dyn Fn(&Value, Option<&str>) -> (u16, Value) + Send + Sync>;

/// The server; it lives until the test process ends.
pub struct FakeServer {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Value>>>,
    connections: Arc<AtomicUsize>,
}

impl FakeServer {
    /// Starts a server answering every request with `handler`.
    pub fn start(handler: Handler) -> FakeServer {
        FakeServer::start_with_auth(Box::new(move |body, _| handler(body)))
    }

    /// Starts a server answering every request with `handler`, which sees the
    /// `Authorization` header too.
    pub fn start_with_auth(handler: AuthHandler) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let log = seen.clone();
        let count = connections.clone();
        let handler = Arc::new(handler);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                count.fetch_add(1, Ordering::SeqCst);
                let log = log.clone();
                let handler = handler.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut length = 0;
                    let mut authorization = None;
                    loop {
                        let mut header = String::new();
                        reader.read_line(&mut header).unwrap();
                        let header = header.trim_end();
                        if header.is_empty() {
                            break;
                        }
                        if let Some((name, value)) = header.split_once(':') {
                            if name.eq_ignore_ascii_case("content-length") {
                                length = value.trim().parse().unwrap();
                            } else if name.eq_ignore_ascii_case("authorization") {
                                authorization = Some(value.trim().to_string());
                            }
                        }
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    // Logged before answering (the handler may count earlier requests), and
                    // not locked while the handler runs: a test may hold an answer back
                    // while it looks at what was seen.
                    log.lock().unwrap().push(body.clone());
                    let (status, reply) = handler(&body, authorization.as_deref());
                    let reply = reply.to_string();
                    let out = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
                        reply.len()
                    );
                    let mut stream = stream;
                    let _ = stream.write_all(out.as_bytes());
                });
            }
        });
        FakeServer {
            addr,
            seen,
            connections,
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// The base URL to configure (`http://127.0.0.1:PORT/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request body seen so far, in order.
    pub fn seen(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }

    /// The `model` of every request seen so far.
    pub fn models(&self) -> Vec<String> {
        self.seen()
            .iter()
            .map(|b| b["model"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// The tool results of request `n`, as (tool call id, content), in order.
    pub fn tool_results(&self, n: usize) -> Vec<(String, String)> {
        tool_results_of(&self.seen()[n])
    }

    /// The tool results of the last request, as (tool call id, content), in order.
    pub fn last_tool_results(&self) -> Vec<(String, String)> {
        tool_results_of(self.seen().last().expect("a request was seen"))
    }

    /// This server's `--allow-host` (`127.0.0.1:PORT`): a workspace's `base_url` on
    /// loopback needs the operator's approval.
    pub fn allow_host(&self) -> String {
        self.addr.to_string()
    }

    /// workflow.json `providers` reaching this server as `openai`, with no key (a run
    /// needs [`FakeServer::allow_host`] to reach it).
    pub fn providers(&self) -> Value {
        json!({"openai": {"base_url": self.base_url(), "api_key_env": "TRELLIS_TEST_NO_KEY"}})
    }
}

/// The models of an in-process run whose workspace reaches fake servers on this machine:
/// the workspace's own choices, with the operator's approval of loopback
/// (`--allow-host 127.0.0.1`).
pub fn loopback_llm(override_llm: Option<LlmRef>) -> LlmSetup {
    let mut approvals = KeyApprovals::defaults();
    approvals.allow_host("127.0.0.1").unwrap();
    LlmSetup::new(override_llm).with_approvals(approvals)
}

/// A chat completion answering `text`, or asking for `calls` (API tool name, arguments).
pub fn completion(text: &str, calls: &[(&str, Value)]) -> Value {
    let mut message = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        message["tool_calls"] = calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| {
                json!({"id": format!("call-{i}"), "type": "function",
                       "function": {"name": name, "arguments": args.to_string()}})
            })
            .collect();
    }
    json!({"id": "c", "object": "chat.completion", "model": "fake-model",
           "choices": [{"index": 0, "message": message,
                        "finish_reason": if calls.is_empty() { "stop" } else { "tool_calls" }}],
           "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}})
}

/// A model whose every turn grows the workflow database by `bytes` (one
/// `mutate_workflow_db` call inserting a blob into table `t`), then ends the turn.
pub fn db_growing_model(bytes: usize) -> FakeServer {
    FakeServer::start(Box::new(move |body: &Value| {
        let last = &body["messages"].as_array().unwrap().last().unwrap()["role"];
        if last == "tool" {
            return (200, completion("done", &[]));
        }
        let grow = json!({"statements": [
            {"sql": format!("INSERT INTO t VALUES (randomblob({bytes}))")}]});
        (200, completion("", &[("mutate_workflow_db", grow)]))
    }))
}

/// The chat completion the bundled `openai` provider reads back as `response` (tool names in
/// their API form `server__tool`; no `model`, so none is reported).
pub fn completion_of(response: &Response) -> Value {
    let mut message = json!({"role": "assistant", "content": response.text});
    if !response.tool_calls.is_empty() {
        message["tool_calls"] = response
            .tool_calls
            .iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                       "function": {"name": c.name.replace(':', "__"), "arguments": c.arguments}})
            })
            .collect();
    }
    let finish = match response.stop_reason {
        StopReason::ToolCalls => "tool_calls",
        StopReason::Length => "length",
        StopReason::ContentFilter => "content_filter",
        _ => "stop",
    };
    json!({"id": "c", "object": "chat.completion",
           "choices": [{"index": 0, "message": message, "finish_reason": finish}],
           "usage": {"prompt_tokens": response.usage.prompt_tokens,
                     "completion_tokens": response.usage.completion_tokens,
                     "total_tokens": response.usage.total_tokens}})
}

/// The tool messages of a request body, as (tool call id, content).
pub fn tool_results_of(request: &Value) -> Vec<(String, String)> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap_or_default().to_string(),
                m["content"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The content of the tool result with call id `id`; panics naming what there is.
pub fn result_of(results: &[(String, String)], id: &str) -> String {
    results
        .iter()
        .find(|(i, _)| i == id)
        .unwrap_or_else(|| panic!("no result for {id}: {results:?}"))
        .1
        .clone()
}

/// The name of the offered tool whose API name contains `part`.
pub fn tool_named(body: &Value, part: &str) -> String {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str())
        .find(|n| n.contains(part))
        .unwrap_or_else(|| panic!("a {part} tool is offered"))
        .to_string()
}
