//! A model server on 127.0.0.1 that streams its answers as server-sent events, piece by
//! piece, as a script says: at a pace, held until the test lets it go on, stalled, cut off,
//! or malformed. It keeps every request body, and tells when the client closed a
//! connection, so a test sees a cancelled stream's connection end.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

/// One step of an answer.
#[derive(Debug, Clone)]
pub enum Step {
    /// Sends these bytes as one chunk of the body.
    Send(String),
    /// Waits this long.
    Wait(Duration),
    /// Waits until the test calls [`StreamServer::release`].
    Hold,
    /// Closes the connection where it is, the body unfinished.
    Cut,
}

/// How one request is answered: the status, the content type and the steps of the body
/// (sent chunked).
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// `content-type`.
    pub content_type: String,
    /// The body, step by step.
    pub steps: Vec<Step>,
}

impl Answer {
    /// An event stream of `events` (each the data of one `data:` event), one chunk each,
    /// `gap` apart, ended by `data: [DONE]`.
    pub fn events(events: &[Value], gap: Duration) -> Answer {
        let mut steps = Vec::new();
        for event in events {
            steps.push(Step::Send(format!("data: {event}\n\n")));
            if !gap.is_zero() {
                steps.push(Step::Wait(gap));
            }
        }
        steps.push(Step::Send("data: [DONE]\n\n".into()));
        Answer::stream(steps)
    }

    /// An event stream made of `steps`.
    pub fn stream(steps: Vec<Step>) -> Answer {
        Answer {
            status: 200,
            content_type: "text/event-stream".into(),
            steps,
        }
    }

    /// A whole JSON body.
    pub fn json(body: &Value) -> Answer {
        Answer {
            status: 200,
            content_type: "application/json".into(),
            steps: vec![Step::Send(body.to_string())],
        }
    }
}

/// The chat-completions chunks of a reply of `pieces` of text, the model `model`, usage
/// last (as `stream_options.include_usage` asks).
pub fn openai_chunks(model: &str, pieces: &[&str]) -> Vec<Value> {
    let mut chunks: Vec<Value> = pieces
        .iter()
        .map(|p| json!({"model": model, "choices": [{"index": 0, "delta": {"content": p}}]}))
        .collect();
    chunks.push(
        json!({"model": model, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
    );
    chunks.push(json!({"model": model, "choices": [],
        "usage": {"prompt_tokens": 7, "completion_tokens": pieces.len(), "total_tokens": 7 + pieces.len()}}));
    chunks
}

/// The server; it lives until the test process ends.
pub struct StreamServer {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Value>>>,
    /// Connections whose client closed them (read end-of-file, or a write failed).
    closed: Arc<AtomicUsize>,
    /// Connections open now.
    open: Arc<AtomicUsize>,
    release: Sender<()>,
}

type Script = Box<dyn Fn(usize, &Value) -> Answer + Send + Sync>;

impl StreamServer {
    /// Starts a server answering request `n` (from 0) with `script(n, body)`.
    pub fn start(script: impl Fn(usize, &Value) -> Answer + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let closed = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (release, released) = channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let script: Arc<Script> = Arc::new(Box::new(script));
        let (log, gone, live) = (seen.clone(), closed.clone(), open.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (log, gone, live) = (log.clone(), gone.clone(), live.clone());
                let (script, released) = (script.clone(), released.clone());
                live.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    serve(stream, &log, &gone, &script, &released);
                    live.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        StreamServer {
            addr,
            seen,
            closed,
            open,
            release,
        }
    }

    /// `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The request bodies so far.
    pub fn seen(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }

    /// Lets one held answer ([`Step::Hold`]) go on.
    pub fn release(&self) {
        let _ = self.release.send(());
    }

    /// Connections the client closed while an answer was being sent, or after.
    pub fn closed_by_client(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

/// Answers the requests of one connection until it closes.
fn serve(
    stream: TcpStream,
    log: &Mutex<Vec<Value>>,
    closed: &AtomicUsize,
    script: &Script,
    released: &Mutex<Receiver<()>>,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            closed.fetch_add(1, Ordering::SeqCst);
            return;
        }
        let mut length = 0;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                closed.fetch_add(1, Ordering::SeqCst);
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            closed.fetch_add(1, Ordering::SeqCst);
            return;
        }
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let n = {
            let mut seen = log.lock().unwrap();
            seen.push(body.clone());
            seen.len() - 1
        };
        let answer = script(n, &body);
        let head = format!(
            "HTTP/1.1 {} X\r\ncontent-type: {}\r\ntransfer-encoding: chunked\r\n\r\n",
            answer.status, answer.content_type
        );
        if out.write_all(head.as_bytes()).is_err() {
            closed.fetch_add(1, Ordering::SeqCst);
            return;
        }
        for step in &answer.steps {
            let sent = match step {
                Step::Send(text) => out
                    .write_all(format!("{:x}\r\n{text}\r\n", text.len()).as_bytes())
                    .and_then(|()| out.flush()),
                Step::Wait(gap) => {
                    std::thread::sleep(*gap);
                    Ok(())
                }
                Step::Hold => {
                    let _ = released.lock().unwrap().recv();
                    Ok(())
                }
                Step::Cut => {
                    let _ = out.shutdown(std::net::Shutdown::Both);
                    return;
                }
            };
            if sent.is_err() {
                closed.fetch_add(1, Ordering::SeqCst);
                return;
            }
        }
        if out.write_all(b"0\r\n\r\n").is_err() {
            closed.fetch_add(1, Ordering::SeqCst);
            return;
        }
    }
}
