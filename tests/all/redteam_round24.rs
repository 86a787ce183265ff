//! Red team round 24 (a re-check of round 23's fixes: a builder session's writes, a server
//! without a token): each a test that failed before its fix.

use crate::support;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use support::trellis;
use support::workspace::{create_db, regular_steps};

use crate::support::plugin_build::text;

/// A builder session had no write budget over its turns (the run's was for `trellis run`):
/// completion turns that each grew the database by 700 MiB wrote 2.94 GB on default
/// settings (MEDIUM). A session's turns and the executions it starts write within one budget
/// (`--max-run-write-mib`): here 8 MiB, and each of four turns grows the database by 3 MiB.
#[test]
fn a_builder_sessions_turns_write_within_one_budget() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let llm = support::fake_llm::db_growing_model(3145728);
    regular_steps(root, llm.providers(), &["s"]);
    create_db(root, "CREATE TABLE t(b BLOB);");
    let out = trellis(&[
        "builder",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-run-write-mib",
        "8",
        "-m",
        "one",
        "-m",
        "two",
        "-m",
        "three",
        "-m",
        "four",
    ]);
    let said = text(&out.stdout) + &text(&out.stderr);
    let size = std::fs::metadata(root.join("db/db.sqlite")).unwrap().len();
    assert!(size > 3 << 20, "no turn wrote: {said}");
    assert!(
        size < 9 << 20,
        "the session grew the database to {size} bytes: {said}"
    );
    let refused = said
        .lines()
        .filter(|l| l.contains("FAILED mutate_workflow_db") && l.contains("--max-run-write-mib"))
        .count();
    assert_eq!(refused, 2, "{said}");
}

/// Without a token (on loopback), any request proves its connection: 300 connections that
/// each sent one request and stayed open held every place of `trellis serve`, and no other
/// client got in (MEDIUM). When every connection is proven, the one idle longest gives its
/// place to a new one.
#[test]
fn kept_open_connections_of_a_server_without_a_token_give_their_places() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::serve::demo(dir.path());
    let serve = support::serve::Serve::start(&ws, None, &[]);
    let port = serve.port;
    let mut held = Vec::new();
    for _ in 0..300 {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
            continue;
        };
        let request = format!("GET /api/workspaces HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
        if stream.write_all(request.as_bytes()).is_ok() {
            held.push(stream);
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..5 {
        let (status, body) = serve.get("/api/workspaces", &[]);
        assert_eq!(status, 200, "{body}");
    }
}
