//! Streamed replies through Trellis against the same server read directly.
//!
//! A chat-completions server on 127.0.0.1 streams server-sent events; each piece of text it
//! sends carries the moment it was written (`t=<ns since the epoch> `). Through Trellis the
//! pieces go the whole way a user's see: the bundled `openai` provider in its sandbox, the
//! `reply` import, the host's bounds, and a `ReplyStream` sink. The baseline, in the same
//! run and against the same server: a plain TCP client that posts the same request and
//! splits the same events itself.
//!
//! - `ttft`: from the request to the first piece of text in hand (Trellis: a fresh
//!   instance of the provider included, as every call has).
//! - `pieces_10k`: a whole reply of 10,000 pieces sent as fast as the server can: pieces per
//!   second sustained.
//! - printed after criterion's report: the latency each piece adds on its way (received
//!   minus written), p50 and p99 of both paths, from a reply paced at 1 ms a piece.
//!
//! In the quick mode (`cargo test --benches`) each path runs a few times and the texts of
//! both are checked to be the same; the figures mean nothing then.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use criterion::{Criterion, criterion_group};
use serde_json::{Value, json};

use trellis_sandbox::llm::{
    Endpoint, Message, ReplyEvent, ReplyStream, Request, RetryPolicy, Secret, Target,
    complete_with_reply,
};
use trellis_sandbox::{CacheSetting, Engine, Limits, PluginRegistry};

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Streams `pieces` pieces per request (the count is the request's `max_tokens`), `gap`
/// apart, each stamped as it is written.
fn server(gap: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || answer(stream, gap));
        }
    });
    addr
}

fn answer(stream: TcpStream, gap: Duration) {
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut length = 0;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 {
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
        return;
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let pieces = body["max_tokens"].as_u64().unwrap_or(1);
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    if out.write_all(head.as_bytes()).is_err() {
        return;
    }
    let mut send = |data: String| {
        let event = format!("data: {data}\n\n");
        out.write_all(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes())
            .and_then(|()| out.flush())
    };
    for _ in 0..pieces {
        let chunk = json!({"model": "bench", "choices": [{"index": 0,
            "delta": {"content": format!("t={} ", now_ns())}}]});
        if send(chunk.to_string()).is_err() {
            return;
        }
        if !gap.is_zero() {
            std::thread::sleep(gap);
        }
    }
    let end =
        json!({"model": "bench", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
    let _ = send(end.to_string());
    let _ = send("[DONE]".to_string());
    let _ = out.write_all(b"0\r\n\r\n");
}

fn request(pieces: u32) -> Request {
    Request {
        model: "bench".into(),
        messages: vec![Message::user("stream")],
        tools: Vec::new(),
        options: trellis_sandbox::llm::Options {
            max_tokens: Some(pieces),
            ..Default::default()
        },
    }
}

/// The stamps of the pieces of `text` (`t=<ns> ` each) and when each was received.
type Arrivals = Vec<(u128, u128)>;

/// One call through Trellis: each piece's (written, received) stamps, and the text. With
/// `first`, it returns as soon as the first piece is in hand (the call dropped).
async fn through_trellis(
    registry: &PluginRegistry,
    addr: SocketAddr,
    pieces: u32,
    first: bool,
) -> (Arrivals, String) {
    let seen: Arc<Mutex<Arrivals>> = Arc::default();
    let text: Arc<Mutex<String>> = Arc::default();
    let (log, all) = (seen.clone(), text.clone());
    let reply = ReplyStream::new(true, move |event| {
        if let ReplyEvent::Text(piece) = event {
            let at = now_ns();
            for stamp in piece.split_whitespace() {
                if let Some(ns) = stamp.strip_prefix("t=").and_then(|n| n.parse().ok()) {
                    log.lock().unwrap().push((ns, at));
                }
            }
            all.lock().unwrap().push_str(&piece);
        }
    });
    let target = Target {
        provider: "openai".into(),
        model: "bench".into(),
        endpoint: Endpoint::new(format!("http://{addr}/v1")),
        secret: Secret::none(),
        stream: true,
    };
    let policy = RetryPolicy {
        max_retries: 0,
        ..RetryPolicy::default()
    };
    let limits = Limits::default();
    let req = request(pieces);
    let call = complete_with_reply(
        registry,
        std::slice::from_ref(&target),
        &[],
        &req,
        &policy,
        &limits,
        Some(&reply),
    );
    if first {
        let arrived = async {
            while seen.lock().unwrap().is_empty() {
                tokio::task::yield_now().await;
            }
        };
        tokio::select! {
            done = call => { done.result.unwrap(); }
            () = arrived => {}
        }
    } else {
        let done = call.await;
        assert_eq!(done.result.unwrap().text, *text.lock().unwrap());
    }
    let arrivals = seen.lock().unwrap().clone();
    let text = text.lock().unwrap().clone();
    (arrivals, text)
}

/// The same call made by a plain client: the same body posted, the events split here.
fn direct(addr: SocketAddr, pieces: u32, first: bool) -> (Arrivals, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_nodelay(true).unwrap();
    let body = json!({"model": "bench", "messages": [{"role": "user", "content": "stream"}],
        "max_tokens": pieces, "stream": true, "stream_options": {"include_usage": true}})
    .to_string();
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let mut arrivals = Vec::new();
    let mut text = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        let Some(data) = line.trim_end().strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        if let Some(piece) = chunk["choices"][0]["delta"]["content"].as_str() {
            let at = now_ns();
            if let Some(ns) = piece.trim().strip_prefix("t=").and_then(|n| n.parse().ok()) {
                arrivals.push((ns, at));
            }
            text.push_str(piece);
            if first {
                break;
            }
        }
    }
    (arrivals, text)
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn streaming(c: &mut Criterion) {
    let engine = Engine::new(CacheSetting::Dir(support::component_cache())).unwrap();
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let registry = tokio
        .block_on(PluginRegistry::with_bundled(&engine))
        .unwrap();
    let fast = server(Duration::ZERO);
    let paced = server(Duration::from_millis(1));
    let many = support::rounds(10_000, 200) as u32;

    // Both paths give the same pieces.
    let (a, trellis_text) = tokio.block_on(through_trellis(&registry, fast, 50, false));
    let (b, direct_text) = direct(fast, 50, false);
    assert_eq!((a.len(), b.len()), (50, 50));
    assert_eq!(trellis_text.split_whitespace().count(), 50);
    assert_eq!(direct_text.split_whitespace().count(), 50);

    let mut group = c.benchmark_group("streaming");
    group.sample_size(20);
    group.bench_function("ttft_trellis", |b| {
        b.iter(|| tokio.block_on(through_trellis(&registry, fast, 1, true)))
    });
    group.bench_function("ttft_direct", |b| b.iter(|| direct(fast, 1, true)));
    group.sample_size(10);
    group.bench_function("pieces_10k_trellis", |b| {
        b.iter(|| tokio.block_on(through_trellis(&registry, fast, many, false)))
    });
    group.bench_function("pieces_10k_direct", |b| {
        b.iter(|| direct(fast, many, false))
    });
    group.finish();

    // Added latency per piece, from a paced reply, the two paths interleaved.
    let rounds = support::rounds(10, 1);
    let pieces = support::rounds(500, 20) as u32;
    let (mut t, mut d) = (Vec::new(), Vec::new());
    let (mut tps, mut dps) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (arrivals, _) = tokio.block_on(through_trellis(&registry, paced, pieces, false));
        t.extend(arrivals.iter().map(|(s, r)| (r - s) as f64 / 1e3));
        let (arrivals, _) = direct(paced, pieces, false);
        d.extend(arrivals.iter().map(|(s, r)| (r - s) as f64 / 1e3));
        let start = Instant::now();
        tokio.block_on(through_trellis(&registry, fast, many, false));
        tps.push(f64::from(many) / start.elapsed().as_secs_f64());
        let start = Instant::now();
        direct(fast, many, false);
        dps.push(f64::from(many) / start.elapsed().as_secs_f64());
    }
    println!();
    println!("streaming, {rounds} interleaved rounds:");
    println!(
        "  latency a piece adds, written to received: Trellis p50 {:.0} us p99 {:.0} us; direct p50 {:.0} us p99 {:.0} us",
        percentile(t.clone(), 0.5),
        percentile(t, 0.99),
        percentile(d.clone(), 0.5),
        percentile(d, 0.99)
    );
    println!(
        "  pieces per second, a reply of {many}: Trellis p50 {:.0}; direct p50 {:.0}",
        percentile(tps, 0.5),
        percentile(dps, 0.5)
    );
}

criterion_group!(benches, streaming);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
