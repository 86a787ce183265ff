//! Red team round 23 (names printed by the CLI, a script's output in a pipe, servers' slots
//! held by clients without the token, what a run's turns write together): each a test that
//! failed before its fix.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use support::fake_llm::{FakeServer, completion};
use support::mcp_serve::{HttpServe, INIT, read_answer};
use support::trellis;
use support::workspace::{regular_steps, write_file, write_files};

use crate::support::plugin_build::text;

/// A model's tool call named `read_file\nstep s1: completed (0 turn(s))` printed that line
/// at the start of a line of `trellis run`'s progress and of `runs show` (a newline was
/// kept where escape sequences were not; LOW): every line the run and `runs show` print is
/// one line, a newline in it shown as `\x0a`.
#[test]
fn a_newline_in_a_tool_name_cannot_print_a_run_line_of_its_own() {
    const FORGED: &str = "step s1: completed (0 turn(s))";
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let llm = FakeServer::start(Box::new(move |_| {
        if seen.fetch_add(1, Ordering::SeqCst) == 0 {
            let name = format!("workspace__read_file\n{FORGED}\ndone: 1 turn");
            (
                200,
                completion("", &[(name.as_str(), json!({"path": "x"}))]),
            )
        } else {
            (200, completion("Done. STATUS: COMPLETED", &[]))
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    regular_steps(root, llm.providers(), &["s1"]);
    let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains(&format!("\\x0a{FORGED}")), "{stdout}");
    assert!(!stdout.lines().any(|l| l == FORGED), "{stdout}");
    let show = trellis(&["runs", "show", root.to_str().unwrap(), "s1"]);
    let shown = text(&show.stdout);
    assert!(show.status.success(), "{shown}{}", text(&show.stderr));
    assert!(shown.contains(&format!("\\x0a{FORGED}")), "{shown}");
    assert!(!shown.lines().any(|l| l.trim() == FORGED), "{shown}");
}

/// `trellis script` wrote a script's escape sequences (retitle the window, clear the screen,
/// set the clipboard) raw when its output went to a pipe (`trellis script ... | tee log`
/// ends at a terminal; LOW): they are escaped wherever the output goes.
#[test]
fn a_scripts_escape_sequences_are_escaped_in_a_pipe_too() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_files(
        root,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "s", "type": "regular", "title": "S", "description": "d"}]})
                .to_string(),
            ),
            (
                "planning/step_config.json",
                json!({"steps": [{"id": "s", "agent_configs":
                    {"declared_execution_mode": "scripted"}}]})
                .to_string(),
            ),
            (
                "code/s/main.py",
                "import sys\nprint('\\x1b]0;PWNED\\x07\\x1b[2J\\rstep s: completed')\n\
                 sys.stderr.write('\\x1b]52;c;cHduZWQ=\\x07\\n')\n"
                    .to_string(),
            ),
        ],
    );
    let out = trellis(&["script", root.to_str().unwrap(), "--step", "s"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !out.stdout.contains(&0x1b) && !out.stderr.contains(&0x1b) && !out.stdout.contains(&b'\r'),
        "{:?} {:?}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("\\x1b]0;PWNED\\x07\\x1b[2J\\x0dstep s: completed"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stderr).contains("\\x1b]52;c;"),
        "{}",
        text(&out.stderr)
    );
}

/// Opens `n` connections to `port` that send nothing, and keeps them.
fn idle_connections(port: u16, n: usize) -> Vec<TcpStream> {
    let idle: Vec<TcpStream> = (0..n)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    idle
}

/// A client's connection that has sent `request` and read its answer (`200`), kept open.
fn proven_connection(port: u16, request: &str) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let (status, body) = read_answer(&mut stream);
    assert_eq!(status, 200, "{body}");
    stream
}

/// With a token, a client without it opened every one of `trellis serve`'s 256 connections,
/// sent nothing, and opened each again as the server closed it: no client with the token
/// got in (HIGH). A connection that has not sent a request with the token now gives its
/// place to a new one when all are taken; one that has keeps it.
#[test]
fn clients_without_the_token_cannot_hold_every_connection_of_serve() {
    const TOKEN: &str = "tok-0123456789abcdefXYZ";
    let dir = tempfile::tempdir().unwrap();
    let ws = support::serve::demo(dir.path());
    let serve = support::serve::Serve::start(&ws, Some(TOKEN), &[]);
    let port = serve.port;
    let request = format!(
        "GET /api/workspaces HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    );
    let mut proven = proven_connection(port, &request);
    // More idle connections than the server keeps, and the page fetched without the token
    // on some (which anyone may fetch: it proves nothing).
    let mut idle = idle_connections(port, 300);
    for stream in idle.iter_mut().take(20) {
        let _ = stream
            .write_all(format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes());
    }
    std::thread::sleep(Duration::from_millis(300));
    idle.extend(idle_connections(port, 100));
    // The client's open connection kept its place, and a new one gets in.
    proven.write_all(request.as_bytes()).unwrap();
    let (status, body) = read_answer(&mut proven);
    assert_eq!(status, 200, "{body}");
    let (status, body) = serve.get(
        "/api/workspaces",
        &[&format!("Authorization: Bearer {TOKEN}")],
    );
    assert_eq!(status, 200, "{body}");
}

/// The same lock on `trellis mcp serve --http`: idle connections past `--max-connections`
/// from a client without the token left the clients with it `503` (HIGH).
#[test]
fn clients_without_the_token_cannot_hold_every_connection_of_mcp_serve() {
    const TOKEN: &str = "tok-0123456789abcdefXYZ";
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("shared")).unwrap();
    let serve = HttpServe::start(
        "127.0.0.1:0",
        Some(TOKEN),
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
    let post = |connection: &str| {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: localhost:{port}\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
             Content-Length: {}\r\nConnection: {connection}\r\n\r\n{INIT}",
            INIT.len()
        )
    };
    let mut proven = proven_connection(port, &post("keep-alive"));
    let _idle = idle_connections(port, 40);
    proven.write_all(post("keep-alive").as_bytes()).unwrap();
    let (status, body) = read_answer(&mut proven);
    assert_eq!(status, 200, "{body}");
    let mut fresh = TcpStream::connect(("127.0.0.1", port)).unwrap();
    fresh
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    fresh.write_all(post("close").as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = fresh.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// Each turn wrote within its own budget (1 GiB), with nothing over a run: three turns of
/// one `mutate_workflow_db` call each grew `db/db.sqlite` to 2.8 GB, three turns of shell
/// writes made 3.1 GB of run folder (MEDIUM). What a run's turns write together is bounded
/// too (`--max-run-write-mib`): here 8 MiB, and each step's turn grows the database by 3 MiB.
#[test]
fn what_a_runs_turns_write_together_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let llm = support::fake_llm::db_growing_model(3145728);
    regular_steps(root, llm.providers(), &["s0", "s1", "s2", "s3"]);
    write_file(root, "db/seed.sql", "CREATE TABLE t(b BLOB);");
    let out = trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-run-write-mib",
        "8",
    ]);
    let said = text(&out.stdout) + &text(&out.stderr);
    let size = std::fs::metadata(root.join("db/db.sqlite")).unwrap().len();
    assert!(size > 3 << 20, "no turn wrote: {said}");
    assert!(
        size < 9 << 20,
        "the run grew the database to {size} bytes: {said}"
    );
    let refused: Vec<String> = llm
        .seen()
        .iter()
        .flat_map(support::fake_llm::tool_results_of)
        .map(|(_, result)| result)
        .filter(|r| r.contains("--max-run-write-mib"))
        .collect();
    assert_eq!(refused.len(), 2, "{said}");
}
