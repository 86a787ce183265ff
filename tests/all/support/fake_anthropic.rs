//! An Anthropic Messages API server on 127.0.0.1 for tests of the bundled `anthropic`
//! provider: it answers each request from a handler (given the request's number, from 0)
//! and keeps every request with its path and headers, so a test can check what the
//! provider and the host sent.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

/// A request as the server saw it (header names in lower case).
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: BTreeMap<String, String>,
    pub body: Value,
}

/// What the server answers to request `n`: status and JSON body.
pub type Handler = Box<dyn Fn(usize, &Seen) -> (u16, Value) + Send + Sync>;

/// The server; it lives until the test process ends.
pub struct FakeAnthropic {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl FakeAnthropic {
    /// Starts a server answering every request with `handler`.
    pub fn start(handler: Handler) -> FakeAnthropic {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let handler = Arc::new(handler);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (log, handler) = (log.clone(), handler.clone());
                std::thread::spawn(move || {
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
                        if let Some((name, value)) = header.split_once(':') {
                            headers
                                .insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
                        }
                    }
                    let length = headers
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
                    let n = {
                        let mut log = log.lock().unwrap();
                        log.push(seen.clone());
                        log.len() - 1
                    };
                    let (status, reply) = handler(n, &seen);
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
        FakeAnthropic { addr, seen }
    }

    /// The base URL to configure (`http://127.0.0.1:PORT`), also the origin.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request seen so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// A Messages answer: `text` (if any) then a `tool_use` block per call (id, API tool name,
/// input), with the matching `stop_reason` and usage of 21 tokens in and 8 out.
pub fn message(text: &str, calls: &[(&str, &str, Value)]) -> Value {
    let mut content = Vec::new();
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for (id, name, input) in calls {
        content.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
    }
    json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-fake-1",
           "content": content,
           "stop_reason": if calls.is_empty() { "end_turn" } else { "tool_use" },
           "stop_sequence": null,
           "usage": {"input_tokens": 21, "output_tokens": 8}})
}

/// An error body as the API sends it.
pub fn error(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}
