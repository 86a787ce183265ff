//! Red team round 25 (a re-check of round 24's fixes): each a test that failed before its
//! fix.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::mcp_serve::{HttpServe, INIT};

/// Opens `n` connections to `port` that each send `head` (a request announcing a body of
/// 100,000 bytes) and one byte of its body, and keeps them.
fn trickling(port: u16, n: usize, head: &str) -> Vec<TcpStream> {
    let held: Vec<TcpStream> = (0..n)
        .filter_map(|_| {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
            stream.write_all(head.as_bytes()).ok()?;
            stream.write_all(b"{").ok()?;
            Some(stream)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    held
}

/// Without a token, a request whose body was still coming in kept its connection's place:
/// 300 connections trickling a body a byte a second locked every other client out of
/// `trellis serve` (MEDIUM). A connection is busy (keeps its place) while its answer is
/// sent, not while its request comes in.
#[test]
fn connections_trickling_a_body_do_not_hold_the_places_of_serve() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::serve::demo(dir.path());
    let serve = support::serve::Serve::start(&ws, None, &[]);
    let port = serve.port;
    let head = format!(
        "POST /api/workflow/db/query HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    );
    let _held = trickling(port, 300, &head);
    for _ in 0..5 {
        let (status, body) = serve.get("/api/workspaces", &[]);
        assert_eq!(status, 200, "{body}");
    }
}

/// The same on `trellis mcp serve --http` without a token: 300 trickling `POST /mcp` left
/// every `initialize` a `503` (MEDIUM).
#[test]
fn connections_trickling_a_body_do_not_hold_the_places_of_mcp_serve() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("shared")).unwrap();
    let serve = HttpServe::start(
        "127.0.0.1:0",
        None,
        &[
            "--root",
            dir.path().to_str().unwrap(),
            "--read",
            "shared",
            "--max-connections",
            "8",
        ],
    );
    let port = serve.port();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: localhost:{port}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: 100000\r\n\r\n"
    );
    let _held = trickling(port, 40, &head);
    for _ in 0..3 {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let request = format!(
            "POST /mcp HTTP/1.1\r\nHost: localhost:{port}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{INIT}",
            INIT.len()
        );
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}
