//! `trellis serve` under load, on loopback, against a fake model (an OpenAI-compatible server
//! in this process, a thread per connection):
//!
//! 1. **Streams**: 50 clients hold `/api/executions/events/stream` open while 20 executions
//!    run at once (each step's agent makes 8 tool calls, then answers). Every client must see
//!    every event, numbered 1, 2, 3, ... with no gap, in the same order as every other client
//!    (checked; a lost or reordered event fails the bench). Reported: the latency from the
//!    server logging an event (`at_us`) to a client reading it, p50 and p99, beside the same
//!    number of events written to 50 plain loopback sockets by one thread (the baseline: what
//!    the operating system alone costs); and the server's peak memory, threads and
//!    descriptors.
//! 2. **Scale**: 1,000 executions started at once through the API, on a model that answers
//!    each call after one second. Every one must end `done` (checked): LLM calls past what
//!    the runtime runs at once wait for their turn instead of failing. Reported: the time
//!    until the last ends, peak memory, threads and descriptors.
//!
//! `BENCHMARKS.md` records the figures of `cargo bench --bench serve_load`. Under `cargo test
//! --benches` (quick mode) it runs 5 clients and 4 executions, then 20 executions, with the
//! same checks.

#[path = "../tests/all/support/fake_llm.rs"]
#[allow(dead_code)]
mod fake_llm;
mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fake_llm::{FakeServer, completion};
use serde_json::{Value, json};

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// A `trellis serve` child, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(ws: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_trellis"))
            .args(["serve", ws.to_str().unwrap(), "--addr", "127.0.0.1:0"])
            .args([
                "--allow-host",
                "127.0.0.1",
                "--max-streams",
                "200",
                "--max-executions",
                "1000",
            ])
            .env("TRELLIS_CACHE_DIR", support::component_cache())
            .env_remove("TRELLIS_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("trellis serve");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        let port = loop {
            line.clear();
            assert!(
                stderr.read_line(&mut line).unwrap() > 0,
                "serve ended early"
            );
            if let Some((_, url)) = line.trim().split_once(" on http://127.0.0.1:") {
                break url.split('/').next().unwrap().parse().unwrap();
            }
        };
        std::thread::spawn(move || for _ in stderr.lines() {});
        Server { child, port }
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let body = body.to_string();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        let status = answer[9..12].parse().unwrap_or(0);
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    }

    fn get(&self, path: &str) -> Value {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
            self.port
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        serde_json::from_str(body).unwrap_or(Value::Null)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The most memory (KiB), threads and descriptors the process had, sampled every 20 ms
/// until `stop`.
fn sample(pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(u64, u64, u64)> {
    std::thread::spawn(move || {
        let (mut rss, mut threads, mut fds) = (0, 0, 0);
        while !stop.load(Ordering::Relaxed) {
            if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                for line in status.lines() {
                    let n = |l: &str| {
                        l.split_whitespace()
                            .nth(1)
                            .and_then(|n| n.parse::<u64>().ok())
                            .unwrap_or(0)
                    };
                    if line.starts_with("VmHWM:") {
                        rss = rss.max(n(line));
                    } else if line.starts_with("Threads:") {
                        threads = threads.max(n(line));
                    }
                }
            }
            if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
                fds = fds.max(dir.count() as u64);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (rss, threads, fds)
    })
}

/// A workflow of `steps` agent steps `s0`, `s1`, ... on the model at `llm`.
fn workspace(root: &Path, steps: usize, llm: &FakeServer) {
    let plan: Vec<Value> = (0..steps)
        .map(|i| {
            json!({"id": format!("s{i}"), "type": "regular", "title": format!("Step {i}"),
                   "description": format!("Work {i}.")})
        })
        .collect();
    std::fs::create_dir_all(root.join("planning")).unwrap();
    std::fs::write(
        root.join("planning/plan.json"),
        json!({"objective": "o", "steps": plan}).to_string(),
    )
    .unwrap();
    std::fs::write(root.join("planning/step_config.json"), r#"{"steps": []}"#).unwrap();
    std::fs::write(
        root.join("workflow.json"),
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": llm.providers()})
            .to_string(),
    )
    .unwrap();
}

/// What one stream client read: each event's number, and its latency in microseconds.
type Seen = Vec<(u64, u64)>;

/// Reads `/api/executions/events/stream` until `ends` executions have ended.
fn client(port: u16, ends: usize, ready: Arc<std::sync::Barrier>) -> Seen {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET /api/executions/events/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    )
    .unwrap();
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    // The response head, then the stream.
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
    }
    ready.wait();
    let (mut seen, mut ended) = (Vec::new(), 0);
    while ended < ends {
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 {
            panic!("the stream ended after {} events", seen.len());
        }
        if let Some(data) = line.trim().strip_prefix("data: ") {
            let at = now_us();
            let event: Value = serde_json::from_str(data).unwrap();
            seen.push((
                event["id"].as_u64().unwrap(),
                at.saturating_sub(event["at_us"].as_u64().unwrap()),
            ));
            if event["type"] == "execution_ended" {
                assert_eq!(event["status"], "done", "{event}");
                ended += 1;
            }
        }
    }
    seen
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// `events` SSE-framed events written by one thread to `clients` loopback sockets, each
/// stamped as it is written: the latency plain sockets give.
fn baseline(clients: usize, events: usize) -> (u64, u64) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let readers: Vec<_> = (0..clients)
        .map(|_| {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(TcpStream::connect(("127.0.0.1", port)).unwrap());
                let mut line = String::new();
                let mut latencies = Vec::new();
                while latencies.len() < events {
                    line.clear();
                    reader.read_line(&mut line).unwrap();
                    if let Some(data) = line.trim().strip_prefix("data: ") {
                        let at = now_us();
                        let event: Value = serde_json::from_str(data).unwrap();
                        latencies.push(at.saturating_sub(event["at_us"].as_u64().unwrap()));
                    }
                }
                latencies
            })
        })
        .collect();
    let mut sockets: Vec<TcpStream> = (0..clients).map(|_| listener.accept().unwrap().0).collect();
    for id in 1..=events {
        let frame = format!(
            "id: {id}\nevent: execution\ndata: {}\n\n",
            json!({"type": "execution", "id": id, "at_us": now_us(), "line": "s1: tool workspace:list_dir (2 ms)"})
        );
        for s in &mut sockets {
            s.write_all(frame.as_bytes()).unwrap();
        }
        // The runtime's events come a few at a time, not in one burst.
        if id % 8 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let mut all: Vec<u64> = readers
        .into_iter()
        .flat_map(|r| r.join().unwrap())
        .collect();
    all.sort_unstable();
    (percentile(&all, 0.5), percentile(&all, 0.99))
}

fn streams(clients: usize, executions: usize) {
    let llm = FakeServer::start(Box::new(move |body| {
        let system = body["messages"][0]["content"].as_str().unwrap_or_default();
        let step = system
            .split("Work ")
            .nth(1)
            .and_then(|r| r.split('.').next())
            .unwrap_or("0")
            .to_string();
        let tools = body["messages"]
            .as_array()
            .map_or(0, |m| m.iter().filter(|m| m["role"] == "tool").count());
        if tools < 8 {
            let path = format!("runs/iteration-0/execution/s{step}");
            (
                200,
                completion("", &[("workspace__list_dir", json!({ "path": path }))]),
            )
        } else {
            (200, completion("Done. STATUS: COMPLETED", &[]))
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    workspace(dir.path(), executions, &llm);
    let server = Server::start(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample(server.child.id(), stop.clone());
    let ready = Arc::new(std::sync::Barrier::new(clients + 1));
    let port = server.port;
    let readers: Vec<_> = (0..clients)
        .map(|_| {
            let ready = ready.clone();
            std::thread::spawn(move || client(port, executions, ready))
        })
        .collect();
    ready.wait();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for i in 0..executions {
            let server = &server;
            scope.spawn(move || {
                let (status, answer) =
                    server.post("/api/executions", &json!({"step_id": format!("s{i}")}));
                assert_eq!(status, 202, "{answer}");
            });
        }
    });
    let seen: Vec<Seen> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (rss, threads, fds) = sampler.join().unwrap();
    let first: Vec<u64> = seen[0].iter().map(|(id, _)| *id).collect();
    assert_eq!(
        first,
        (1..=first.len() as u64).collect::<Vec<_>>(),
        "events numbered without a gap"
    );
    for other in &seen[1..] {
        let ids: Vec<u64> = other.iter().map(|(id, _)| *id).collect();
        assert_eq!(
            ids, first,
            "every client sees the same events in the same order"
        );
    }
    let mut latencies: Vec<u64> = seen.iter().flatten().map(|(_, l)| *l).collect();
    latencies.sort_unstable();
    let (b50, b99) = baseline(clients, first.len());
    println!(
        "streams: {clients} clients x {} events ({executions} executions, {:.2} s): latency p50 \
         {} us, p99 {} us; plain loopback sockets p50 {b50} us, p99 {b99} us; server peak \
         {} MiB, {threads} threads, {fds} descriptors",
        first.len(),
        elapsed.as_secs_f64(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        rss / 1024
    );
}

fn scale(executions: usize) {
    let llm = FakeServer::start(Box::new(|_| {
        std::thread::sleep(Duration::from_secs(1));
        (200, completion("Done. STATUS: COMPLETED", &[]))
    }));
    let dir = tempfile::tempdir().unwrap();
    workspace(dir.path(), executions, &llm);
    let server = Server::start(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample(server.child.id(), stop.clone());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for chunk in 0..8 {
            let server = &server;
            scope.spawn(move || {
                for i in (chunk..executions).step_by(8) {
                    let (status, answer) =
                        server.post("/api/executions", &json!({"step_id": format!("s{i}")}));
                    assert_eq!(status, 202, "{answer}");
                }
            });
        }
    });
    let posted = started.elapsed();
    let (mut since, mut ended, mut done) = (0u64, 0usize, 0usize);
    let deadline = Instant::now() + Duration::from_secs(900);
    while ended < executions {
        assert!(
            Instant::now() < deadline,
            "{ended} of {executions} ended in 15 minutes"
        );
        let page = server.get(&format!("/api/executions/events?since={since}"));
        let events = page["events"].as_array().cloned().unwrap_or_default();
        if events.is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
        for e in events {
            since = e["id"].as_u64().unwrap();
            if e["type"] == "execution_ended" {
                ended += 1;
                if e["status"] == "done" {
                    done += 1;
                } else {
                    eprintln!("not done: {e}");
                }
            }
        }
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (rss, threads, fds) = sampler.join().unwrap();
    assert_eq!(done, executions, "every execution ends done");
    println!(
        "scale: {executions} executions started in {:.2} s, all done after {:.2} s (model: 1 s \
         per call); server peak {} MiB, {threads} threads, {fds} descriptors",
        posted.as_secs_f64(),
        elapsed.as_secs_f64(),
        rss / 1024
    );
}

fn main() {
    if support::quick() {
        streams(5, 4);
        scale(20);
    } else {
        streams(50, 20);
        scale(1000);
    }
}
