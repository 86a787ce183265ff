//! Red team round 21 (servers holding answers their clients do not read): each a test that
//! failed before its fix. Round 21's findings on the workers are in `workers.rs`.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::measure::{rss, small_window};

use support::workspace::write_files;

/// Clients that asked for large answers and never read them held each in `trellis serve`
/// (250 of them: 2.18 GB). Answers being sent hold at most `--max-answer-mib` together; one
/// past it is refused `503 busy`, and served again once the stalled clients go.
#[test]
fn answers_clients_do_not_read_are_held_within_a_budget() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::serve::demo(dir.path());
    // 690 KB of a control character: 4 MB of JSON once escaped.
    write_files(&ws, &[("knowledgebase/blob.md", "\u{1}".repeat(690_000))]);
    let serve = support::serve::Serve::start(&ws, None, &["--max-answer-mib", "16"]);
    let request = format!(
        "GET /api/workflow/file?path=knowledgebase/blob.md HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
        serve.port
    );
    let before = rss(serve.pid());
    let mut stalled = Vec::new();
    for _ in 0..100 {
        let mut stream = small_window(serve.port);
        stream.write_all(request.as_bytes()).unwrap();
        stalled.push(stream);
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(2));
    let grown = rss(serve.pid()).saturating_sub(before);
    assert!(
        grown < 150 << 20,
        "100 clients that do not read grew the server by {} MiB",
        grown >> 20
    );
    let (status, answer) = serve.get("/api/workflow/file?path=knowledgebase/blob.md", &[]);
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"], "busy", "{answer}");
    drop(stalled);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _) = serve.get("/api/workflow/file?path=knowledgebase/blob.md", &[]);
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "still {status}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // A client that reads gets the whole answer.
    let mut stream = TcpStream::connect(("127.0.0.1", serve.port)).unwrap();
    stream
        .write_all(
            request
                .replace("HTTP/1.1\r\n", "HTTP/1.1\r\nConnection: close\r\n")
                .as_bytes(),
        )
        .unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    assert!(answer.len() > 4_000_000, "{}", answer.len());
}
