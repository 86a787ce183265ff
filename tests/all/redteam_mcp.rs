//! Attacks on the two MCP capabilities, as a hostile party would make them.
//!
//! `trellis mcp serve`: a client (or a web page) that tries to widen the operator's grant with
//! the arguments it sends, to call a tool not offered, to get past the bearer token or the
//! Host and Origin checks, to hold the server with huge or nested bodies and trickled
//! headers, and to cancel another client's call. External MCP servers: a workspace that
//! names paths and commands as servers, and a hostile server that answers with a huge
//! result or dies in the middle of a call. Each attack asserts the denial and that nothing
//! outside the grant changed.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::fake_llm::{FakeServer, completion, result_of};
use crate::support::mcp_fixture;
use crate::support::mcp_serve::{HttpServe, INIT, post, raw, sessionless_post};
use crate::support::mcp_servers::{
    asking_for, fixture_entry, server_file, with_servers, workspace,
};
use crate::support::measure::high_water;
use crate::support::{self, tree_digest, trellis_command};

const SECRET: &str = "the-secret-42";

/// A tree with a read-only `shared`, a read-write `notes` holding links planted by someone
/// outside (to the secret beside it, to a file outside ROOT, and a hard link to a read-only
/// file), a `private` folder and a file outside ROOT.
struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        for sub in ["shared", "private", "notes"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        std::fs::write(root.join("shared/notes.md"), "granted notes\n").unwrap();
        std::fs::write(root.join("private/key.txt"), SECRET).unwrap();
        std::fs::write(dir.path().join("outside.txt"), SECRET).unwrap();
        std::os::unix::fs::symlink("../private/key.txt", root.join("notes/link")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside.txt"), root.join("notes/abs")).unwrap();
        std::fs::hard_link(root.join("shared/notes.md"), root.join("notes/hard")).unwrap();
        support::plugin_folder(
            &dir.path().join("plugins"),
            "adversary",
            "adversary",
            "tool",
        );
        Tree { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn plugins(&self) -> PathBuf {
        self.dir.path().join("plugins")
    }

    /// Everything outside the read-write grant, whose entries may change.
    fn outside_grant(&self) -> Vec<(String, String)> {
        tree_digest(self.dir.path())
            .into_iter()
            .filter(|(k, _)| !k.starts_with("root/notes"))
            .collect()
    }
}

fn cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("component-cache")
}

/// `trellis -v mcp serve` over stdio, spoken to line by line, its log kept.
struct StdioServe {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    next_id: u64,
}

impl StdioServe {
    fn start(tree: &Tree, extra: &[&str]) -> StdioServe {
        let (root, plugins) = (tree.root(), tree.plugins());
        let mut args = vec![
            "-v",
            "mcp",
            "serve",
            "--root",
            root.to_str().unwrap(),
            "--read",
            "shared",
            "--write",
            "notes",
        ];
        args.extend_from_slice(extra);
        args.extend(["--plugins", plugins.to_str().unwrap()]);
        let mut child = trellis_command(&args)
            .env("TRELLIS_CACHE_DIR", cache_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut serve = StdioServe {
            child,
            stdin,
            lines,
            log,
            next_id: 1,
        };
        let init = serve.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "redteam", "version": "1"}}),
        );
        assert_eq!(init["result"]["serverInfo"]["name"], "trellis", "{init}");
        serve.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string());
        serve
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        );
        loop {
            // A generous bound that only a server that stopped answering reaches.
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(120))
                .expect("the server answered");
            let Ok(message) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if message["id"] == json!(id) {
                return message;
            }
        }
    }

    fn call(&mut self, name: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": name, "arguments": arguments}))
    }

    /// Sends call `id` without waiting for its answer.
    fn send_call(&mut self, id: u64, name: &str, arguments: Value) {
        self.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                    "params": {"name": name, "arguments": arguments}})
            .to_string(),
        );
    }

    /// The answers to the requests `ids`, in whatever order the server sends them: each
    /// request's id and its result's first text.
    fn answers(&mut self, ids: std::ops::RangeInclusive<u64>) -> BTreeMap<u64, Value> {
        let mut answers = BTreeMap::new();
        while answers.len() < ids.clone().count() {
            // A generous bound that only a server that stopped answering reaches.
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(120))
                .expect("the server answered");
            if let Ok(message) = serde_json::from_str::<Value>(&line)
                && let Some(id) = message["id"].as_u64()
                && ids.contains(&id)
            {
                answers.insert(id, message["result"]["content"][0]["text"].clone());
            }
        }
        answers
    }

    /// Waits until `n` lines of the log contain `text`.
    fn wait_for_log(&self, text: &str, n: usize) {
        while self
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(text))
            .count()
            < n
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for StdioServe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether an answer is a denial: a protocol error or a result with `isError`.
fn denied(answer: &Value) -> bool {
    answer.get("error").is_some() || answer["result"]["isError"] == json!(true)
}

#[test]
fn serve_arguments_cannot_widen_the_grant() {
    let tree = Tree::new();
    let before = tree.outside_grant();
    let mut serve = StdioServe::start(&tree, &[]);
    let long = format!("shared/{}", "a".repeat(100_000));
    let climb = format!("shared/{}outside.txt", "../".repeat(2_000));
    let reads = [
        "/private/key.txt",
        "/shared/../private/key.txt",
        "private/key.txt",
        "../outside.txt",
        "shared/notes.md\0/../../private/key.txt",
        "notes/link",
        "notes/abs",
        "shared\\..\\private\\key.txt",
        long.as_str(),
        climb.as_str(),
    ];
    for path in reads {
        let answer = serve.call("workspace__read_file", json!({"path": path}));
        let shown: String = path.chars().take(60).collect();
        assert!(denied(&answer), "read {shown:?}: {answer}");
        assert!(
            !answer.to_string().contains(SECRET),
            "read {shown:?}: {answer}"
        );
    }
    // The guest reads absolute paths itself: the grant still holds.
    for path in [
        "/private/key.txt",
        "/notes/link",
        "/notes/abs",
        "/../outside.txt",
    ] {
        let answer = serve.call("adversary__read", json!({"path": path}));
        assert!(!answer.to_string().contains(SECRET), "{path}: {answer}");
    }
    for path in [
        "/shared/notes.md",
        "/private/key.txt",
        "/notes/link",
        "/notes/abs",
        "/notes/hard",
        "/../outside.txt",
    ] {
        serve.call(
            "adversary__write",
            json!({"path": path, "content": "pwned"}),
        );
    }
    // The guest gets the raw WASI error code: a file with other hard links is not writable
    // in place, and a read-only folder is not writable at all.
    let text = |answer: &Value| {
        answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let hard = serve.call(
        "adversary__write",
        json!({"path": "/notes/hard", "content": "pwned"}),
    );
    assert!(denied(&hard), "{hard}");
    assert_eq!(text(&hard), "adversary:write: failed: EACCES", "{hard}");
    let read_only = serve.call(
        "adversary__write",
        json!({"path": "/shared/new.txt", "content": "pwned"}),
    );
    assert!(denied(&read_only), "{read_only}");
    assert_eq!(
        text(&read_only),
        "adversary:write: failed: EPERM",
        "{read_only}"
    );
    let writes = [
        "shared/new.txt",
        "shared/notes.md",
        "notes/../private/key.txt",
        "/private/key.txt",
        "notes/../../outside.txt",
    ];
    for path in writes {
        let answer = serve.call(
            "workspace__write_file",
            json!({"path": path, "content": "pwned"}),
        );
        assert!(denied(&answer), "write {path:?}: {answer}");
    }
    // Writing through the links planted in the read-write grant changes nothing they point
    // to (the results may differ; the files outside the grant may not).
    for path in ["notes/link", "notes/abs", "notes/hard"] {
        serve.call(
            "workspace__write_file",
            json!({"path": path, "content": "pwned"}),
        );
    }
    // A message nested deeper than the parser takes does not stop the server.
    serve.send(&format!(
        r#"{{"jsonrpc":"2.0","id":999,"method":"tools/call","params":{{"name":"workspace__read_file","arguments":{{"path":{}"x"{}}}}}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    ));
    let answer = serve.call("workspace__read_file", json!({"path": "shared/notes.md"}));
    assert!(!denied(&answer), "{answer}");
    assert!(answer.to_string().contains("granted notes"), "{answer}");
    drop(serve);
    assert_eq!(tree.outside_grant(), before);
    assert_eq!(
        std::fs::read_to_string(tree.root().join("shared/notes.md")).unwrap(),
        "granted notes\n"
    );
}

#[test]
fn serve_offers_and_runs_only_the_tools_named() {
    let tree = Tree::new();
    let before = tree.outside_grant();
    let mut serve = StdioServe::start(&tree, &["--tool", "workspace:read_file"]);
    let listed = serve.request("tools/list", json!({}));
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["workspace__read_file"], "{listed}");
    for name in [
        "workspace__write_file",
        "workspace:write_file",
        "WORKSPACE__WRITE_FILE",
        "Workspace__Write_File",
        "workspace__write_file ",
        "workspace__write_file\0",
        "../workspace__write_file",
        "adversary__read",
        "adversary:read",
        "workspace__",
        "",
    ] {
        let answer = serve.call(name, json!({"path": "notes/x", "content": "pwned"}));
        assert!(answer.get("error").is_some(), "{name:?}: {answer}");
    }
    let answer = serve.call(&"a".repeat(1 << 20), json!({}));
    assert!(answer.get("error").is_some());
    drop(serve);
    assert_eq!(tree.outside_grant(), before);
    assert!(!tree.root().join("notes/x").exists());
}

/// `trellis mcp serve --http ADDR` on the tree (`shared` read-only, `notes` read-write) with
/// its plugins, each call stopped after `timeout` seconds.
fn serve_http(tree: &Tree, addr: &str, token: Option<&str>, timeout: &str) -> HttpServe {
    serve_http_with(tree, addr, token, timeout, &[])
}

/// [`serve_http`] with `extra` arguments (limits).
fn serve_http_with(
    tree: &Tree,
    addr: &str,
    token: Option<&str>,
    timeout: &str,
    extra: &[&str],
) -> HttpServe {
    let (root, plugins) = (tree.root(), tree.plugins());
    let mut args = vec![
        "--root",
        root.to_str().unwrap(),
        "--read",
        "shared",
        "--write",
        "notes",
        "--plugins",
        plugins.to_str().unwrap(),
        "--timeout",
        timeout,
    ];
    args.extend_from_slice(extra);
    HttpServe::start(addr, token, &args)
}

#[test]
fn serve_host_and_origin_tricks_are_refused() {
    let tree = Tree::new();
    let before = tree.outside_grant();
    let serve = serve_http(&tree, "127.0.0.1:0", None, "30");
    let port = serve.port();
    for host in [
        "localhost.".to_string(),
        format!("localhost.:{port}"),
        "localhost.evil".into(),
        format!("localhost.evil:{port}"),
        format!("localhost.evil.example:{port}"),
        format!("127.0.0.1.nip.io:{port}"),
        format!("0.0.0.0:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
        format!("evil.example:{port}"),
        format!("[::2]:{port}"),
    ] {
        // rmcp's Host check answers 403 Forbidden to a name or address not allowed.
        let status = post(port, &format!("\r\nHost: {host}"), INIT);
        assert_eq!(status, 403, "Host {host:?}");
    }
    for host in [format!("[::1]:{port}"), format!("LocalHost:{port}")] {
        assert_eq!(
            post(port, &format!("\r\nHost: {host}"), INIT),
            200,
            "{host}"
        );
    }
    let host = format!("\r\nHost: localhost:{port}");
    for origin in [
        "null".to_string(),
        "http://evil.example".into(),
        "http://localhost.evil.example".into(),
        format!("http://127.0.0.1.evil.example:{port}"),
        format!("http://localhost.:{port}"),
        format!("file://localhost:{port}"),
    ] {
        let status = post(port, &format!("{host}\r\nOrigin: {origin}"), INIT);
        assert_eq!(status, 403, "Origin {origin:?}");
    }
    assert_eq!(
        post(
            port,
            &format!("{host}\r\nOrigin: http://localhost:{port}"),
            INIT
        ),
        200
    );
    // A second Host or Origin after an allowed one was let through: only the first was
    // checked (round 12, LOW). Both orders are refused now.
    // A Host with userinfo, and an absolute target, named another host past the Host check
    // (round 13, LOW).
    assert_eq!(
        post(
            port,
            &format!("\r\nHost: evil.example@127.0.0.1:{port}"),
            INIT
        ),
        400
    );
    let head = format!("POST http://evil.example/mcp HTTP/1.1{host}");
    assert_eq!(raw(port, &head, INIT.as_bytes()).0, 400);
    for twice in [
        format!("{host}\r\nHost: evil.example:{port}"),
        format!("\r\nHost: evil.example:{port}{host}"),
        format!("{host}\r\nOrigin: http://localhost:{port}\r\nOrigin: http://evil.example"),
    ] {
        assert_eq!(post(port, &twice, INIT), 400, "{twice:?}");
    }
    drop(serve);
    assert_eq!(tree.outside_grant(), before);
}

#[test]
fn serve_token_cannot_be_bypassed() {
    let tree = Tree::new();
    let before = tree.outside_grant();
    let token = "s3cret-token";
    let serve = serve_http(&tree, "0.0.0.0:0", Some(token), "30");
    let port = serve.port();
    let host = format!("\r\nHost: localhost:{port}");
    for auth in [
        String::new(),
        format!("\r\nAuthorization: Bearer  {token}"),
        format!("\r\nAuthorization: Bearer {token}x"),
        format!("\r\nAuthorization: Bearer {}", &token[..token.len() - 1]),
        format!("\r\nAuthorization: Bearer {}", token.to_uppercase()),
        format!("\r\nAuthorization: {token}"),
        "\r\nAuthorization: Bearer".into(),
        "\r\nAuthorization: Bearer ".into(),
        "\r\nAuthorization: Basic czNjcmV0LXRva2VuOg==".into(),
        format!("\r\nAuthorization: Basic {token}"),
        format!("\r\nX-Authorization: Bearer {token}"),
        format!("\r\nCookie: token={token}"),
    ] {
        assert_eq!(post(port, &format!("{host}{auth}"), INIT), 401, "{auth:?}");
    }
    // Two Authorization headers are refused whichever comes first.
    for auth in [
        format!("\r\nAuthorization: Bearer wrong\r\nAuthorization: Bearer {token}"),
        format!("\r\nAuthorization: Bearer {token}\r\nAuthorization: Bearer wrong"),
    ] {
        assert_eq!(post(port, &format!("{host}{auth}"), INIT), 400, "{auth:?}");
    }
    // A token in the query is not a token.
    for query in ["token", "access_token", "auth"] {
        let head = format!("POST /mcp?{query}={token} HTTP/1.1{host}");
        assert_eq!(raw(port, &head, INIT.as_bytes()).0, 401, "{query}");
    }
    // Other paths are not found, token or not.
    let auth = format!("{host}\r\nAuthorization: Bearer {token}");
    for path in ["/mcp/", "/MCP", "//mcp", "/mcp/../mcp2", "/"] {
        let head = format!("POST {path} HTTP/1.1{auth}");
        assert_eq!(raw(port, &head, INIT.as_bytes()).0, 404, "{path}");
    }
    // Without the token a huge body is refused before it is read: the answer comes while
    // the client has sent only its headers.
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    write!(
        stream,
        "POST /mcp HTTP/1.1{host}\r\nContent-Type: application/json\r\n\
         Content-Length: 1073741824\r\n\r\n"
    )
    .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).unwrap();
    assert_eq!(&head[9..12], b"401");
    assert_eq!(post(port, &auth, INIT), 200);
    drop(serve);
    assert_eq!(tree.outside_grant(), before);
}

#[test]
fn serve_refuses_huge_and_nested_bodies_and_closes_trickled_headers() {
    let tree = Tree::new();
    let before = tree.outside_grant();
    let serve = serve_http(&tree, "127.0.0.1:0", None, "30");
    let port = serve.port();
    let host = format!("\r\nHost: localhost:{port}");
    // A body over the cap is refused.
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"pad":"{}"}}}}"#,
        "x".repeat(8 << 20)
    );
    assert_eq!(post(port, &host, &huge), 413);
    // Nesting deeper than the parser takes is a client error, not a crash.
    let nested = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}{}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let status = post(port, &host, &nested);
    assert!((400..500).contains(&status), "{status}");
    // A client that never finishes its headers is cut off (slowloris).
    let mut slow = TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    write!(slow, "POST /mcp HTTP/1.1{host}\r\nX-Slow: 1").unwrap();
    let mut buf = [0u8; 256];
    match slow.read(&mut buf) {
        Ok(_) => {}
        Err(e) => assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the server kept a connection that never sent its headers: {e}"
        ),
    }
    // The server still serves.
    assert_eq!(post(port, &host, INIT), 200);
    drop(serve);
    assert_eq!(tree.outside_grant(), before);
}

/// A body within the byte cap that is two million tiny JSON values (which a parse would
/// make into two million allocations) is refused unparsed, and the server's memory stays
/// where it was.
#[test]
fn serve_refuses_a_body_of_many_small_values_without_parsing_it() {
    let tree = Tree::new();
    let serve = serve_http(&tree, "127.0.0.1:0", None, "30");
    let port = serve.port();
    let host = format!("\r\nHost: localhost:{port}");
    assert_eq!(post(port, &host, INIT), 200);
    let digits = "1,".repeat(2_000_000 - 1) + "1";
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"x","arguments":{{"v":[{digits}]}}}}}}"#
    );
    assert!(body.len() <= 4 << 20, "within the byte cap: {}", body.len());
    let (status, _, text) = raw(port, &format!("POST /mcp HTTP/1.1{host}"), body.as_bytes());
    assert_eq!(status, 413, "{text}");
    assert!(
        text.starts_with(
            "payload too large: a request body may hold 100000 JSON values, this one holds about 2000015"
        ),
        "{text}"
    );
    let peak = high_water(serve.pid()).expect("the server runs");
    assert!(peak < 200 << 20, "peak {peak} bytes");
    assert_eq!(post(port, &host, INIT), 200, "the server still serves");
}

/// A stdio line within the byte cap that is eight million tiny JSON values is dropped
/// unparsed: the client is answered with an error, the operator's log says why, the server's
/// memory stays where it was, and the next message is served.
#[test]
fn serve_over_stdio_refuses_a_line_of_many_small_values_without_parsing_it() {
    let tree = Tree::new();
    let mut serve = StdioServe::start(&tree, &[]);
    let digits = "1,".repeat(8_000_000 - 1) + "1";
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":90,"method":"tools/call","params":{{"name":"x","arguments":{{"v":[{digits}]}}}}}}"#
    );
    assert!(line.len() < 16 << 20, "within the byte cap: {}", line.len());
    serve.send(&line);
    let answer = loop {
        let line = serve
            .lines
            .recv_timeout(Duration::from_secs(120))
            .expect("the server answered");
        if let Ok(message) = serde_json::from_str::<Value>(&line) {
            break message;
        }
    };
    assert_eq!(answer["id"], Value::Null, "{answer}");
    assert_eq!(answer["error"]["code"], json!(-32600), "{answer}");
    serve.wait_for_log(
        "refused a message from the client: a message may hold 100000 JSON values, this one holds more",
        1,
    );
    let peak = high_water(serve.child.id()).expect("the server runs");
    assert!(peak < 200 << 20, "peak {peak} bytes");
    let list = serve.request("tools/list", json!({}));
    assert!(list["result"]["tools"].is_array(), "{list}");
}

/// Lines rmcp cannot parse (nested past its parser's depth, a number past what JSON numbers
/// are here, text that is no JSON) were dropped without an answer, and the client waited
/// (round 12, LOW): each is answered with Invalid Request, and the session goes on.
#[test]
fn serve_over_stdio_answers_every_line_it_cannot_read() {
    let tree = Tree::new();
    let mut serve = StdioServe::start(&tree, &[]);
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":91,"method":"tools/list","params":{{"x":{}1{}}}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let long_number = format!(
        r#"{{"jsonrpc":"2.0","id":92,"method":"tools/list","params":{{"x":{}}}}}"#,
        "9".repeat(5000)
    );
    // The third's reason starts like the second's: its log line is the second of them.
    let cases = [
        (
            deep,
            "a message may nest arrays and objects 127 levels deep, this one nests deeper",
            1,
        ),
        (
            long_number,
            "the message is not JSON that can be read: number out of range",
            1,
        ),
        (
            "{oops".to_string(),
            "the message is not JSON that can be read",
            2,
        ),
    ];
    for (line, why, seen) in &cases {
        serve.send(line);
        let answer = loop {
            let line = serve
                .lines
                .recv_timeout(Duration::from_secs(60))
                .expect("the server answered");
            if let Ok(message) = serde_json::from_str::<Value>(&line) {
                break message;
            }
        };
        assert_eq!(answer["id"], Value::Null, "{answer}");
        assert_eq!(answer["error"]["code"], json!(-32600), "{answer}");
        serve.wait_for_log(&format!("refused a message from the client: {why}"), *seen);
    }
    let list = serve.request("tools/list", json!({}));
    assert!(list["result"]["tools"].is_array(), "{list}");
}

/// The resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn serve_caps_sessions_and_connections() {
    let tree = Tree::new();
    let before = tree.outside_grant();
    let serve = serve_http_with(
        &tree,
        "127.0.0.1:0",
        None,
        "30",
        &["--max-sessions", "2", "--max-connections", "4"],
    );
    let port = serve.port();
    let host = format!("\r\nHost: localhost:{port}");
    let first = session(port);
    let second = session(port);
    // A third session is refused, with the limit and its flag named.
    let (status, headers, body) = raw(port, &format!("POST /mcp HTTP/1.1{host}"), INIT.as_bytes());
    assert_eq!(status, 503, "{headers}{body}");
    assert!(
        body.contains("2 MCP sessions") && body.contains("--max-sessions"),
        "{body}"
    );
    // Many more cost the server no memory to speak of: none of them is kept (each session
    // kept would hold some 50 KiB).
    let rss = rss_kib(serve.pid());
    for _ in 0..2_000 {
        assert_eq!(post(port, &host, INIT), 503);
    }
    let grown = rss_kib(serve.pid()).saturating_sub(rss);
    assert!(grown < 32 << 10, "the server grew by {grown} KiB");
    // The sessions in place still work, and closing one makes room for another.
    let list = br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let in_session = |id: &str| format!("POST /mcp HTTP/1.1{host}\r\nMcp-Session-Id: {id}");
    assert_eq!(raw(port, &in_session(&second), list).0, 200);
    let (status, _, _) = raw(
        port,
        &format!("DELETE /mcp HTTP/1.1{host}\r\nMcp-Session-Id: {first}"),
        b"",
    );
    assert!((200..300).contains(&status), "{status}");
    let third = session(port);
    assert_eq!(raw(port, &in_session(&third), list).0, 200);
    // Connections: three that each sent a request and stay open give their places to new
    // ones (a server without a token: the one idle longest goes); four waiting for their
    // answers keep theirs, and the next one is told why and closed. (Connections closed
    // just before may hold their places for a moment: the refusal is waited for.)
    let proven = |_| {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let request = format!(
            "DELETE /mcp HTTP/1.1{host}\r\nMcp-Session-Id: none\r\nContent-Length: 0\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).unwrap();
        let (status, body) = crate::support::mcp_serve::read_answer(&mut stream);
        assert_ne!(status, 0, "{body}");
        stream
    };
    let held: Vec<TcpStream> = (0..3).map(proven).collect();
    // Four waiting for their answers (calls that spin until their deadline) keep their
    // places: the next one is told why and closed.
    let busy: Vec<TcpStream> = (0..4)
        .map(|i| {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"adversary__spin","arguments":{{}}}}}}"#,
                100 + i
            );
            let request = format!(
                "POST /mcp HTTP/1.1{host}\r\nMcp-Session-Id: {third}\r\n\
                 Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
                 MCP-Protocol-Version: 2025-06-18\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(request.as_bytes()).unwrap();
            stream
        })
        .collect();
    // Each of the four has its call under way (or waiting for a slot) before the fifth.
    let under_way = || {
        serve
            .log()
            .iter()
            .filter(|l| l.contains("call started") || l.contains("waiting for a call slot"))
            .count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while under_way() < 4 {
        assert!(std::time::Instant::now() < deadline, "{:#?}", serve.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut refused = false;
    for _ in 0..50 {
        let (status, _, body) = raw(port, &in_session(&third), list);
        if status == 503 {
            assert!(body.contains("--max-connections"), "{body}");
            refused = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        refused,
        "a fifth connection went through while four calls held theirs"
    );
    drop((held, busy));
    // Once they are closed (the server notices in its own time), calls go through again.
    let mut status = 0;
    for _ in 0..600 {
        status = raw(port, &in_session(&third), list).0;
        if status == 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(status, 200);
    drop(serve);
    assert_eq!(tree.outside_grant(), before);
}

#[test]
fn serve_caps_requests_without_a_session_like_sessions() {
    let tree = Tree::new();
    let before = tree.outside_grant();
    // Two requests without a session at once, one call at a time, each stopped after 3 s.
    let serve = serve_http_with(
        &tree,
        "127.0.0.1:0",
        None,
        "3",
        &["--max-sessions", "2", "--max-concurrent-calls", "1"],
    );
    let port = serve.port();
    let list = || sessionless_post(port, 1, "tools/list", json!({}));
    // rmcp answers such a request on its own, no session opened.
    let (status, body) = list();
    assert_eq!(status, 200, "{body}");
    assert!(sse_result(&body, 1)["tools"].is_array(), "{body}");
    // Two calls without a session hold both places until their answers are sent: one runs,
    // the other waits for the call slot.
    let spins: Vec<_> = (10..12)
        .map(|id| {
            let call = json!({"name": "adversary__spin", "arguments": {}});
            std::thread::spawn(move || sessionless_post(port, id, "tools/call", call))
        })
        .collect();
    while !serve
        .log()
        .iter()
        .any(|l| l.contains("waiting for a call slot"))
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    // A third is refused, naming the cap and its flag.
    let (status, body) = list();
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body,
        "service unavailable: 2 requests without an MCP session are in progress, the limit \
         (`trellis mcp serve --max-sessions`, which caps them apart from the sessions); wait \
         for one to end, or open a session (`initialize`)"
    );
    // A session still opens and is served meanwhile.
    let id = session(port);
    let in_session =
        format!("POST /mcp HTTP/1.1\r\nHost: localhost:{port}\r\nMcp-Session-Id: {id}");
    let (status, _, body) = raw(
        port,
        &in_session,
        br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    );
    assert_eq!(status, 200, "{body}");
    // The calls end at their deadline; then requests without a session are answered again.
    for spin in spins {
        let (status, body) = spin.join().unwrap();
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = list();
    assert_eq!(status, 200, "{body}");
    assert!(sse_result(&body, 1)["tools"].is_array(), "{body}");
    drop(serve);
    assert_eq!(tree.outside_grant(), before);
}

#[test]
fn serve_answers_a_trickled_body_with_408() {
    let tree = Tree::new();
    let before = tree.outside_grant();
    let serve = serve_http(&tree, "127.0.0.1:0", None, "30");
    let port = serve.port();
    // Complete headers, then a few bytes of the body, then nothing: the server answers
    // once the body's time is up instead of waiting for ever.
    let mut slow = TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(300)))
        .unwrap();
    write!(
        slow,
        "POST /mcp HTTP/1.1\r\nHost: localhost:{port}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{}",
        INIT.len(),
        &INIT[..10]
    )
    .unwrap();
    let mut answer = String::new();
    let _ = slow.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("did not arrive"), "{answer}");
    // The server still serves.
    assert_eq!(
        post(port, &format!("\r\nHost: localhost:{port}"), INIT),
        200
    );
    drop(serve);
    assert_eq!(tree.outside_grant(), before);
}

/// The `result` of the answer to request `id` in an SSE body.
fn sse_result(body: &str, id: u64) -> Value {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m["id"] == json!(id))
        .unwrap_or_else(|| panic!("no answer to request {id}: {body}"))["result"]
        .clone()
}

#[test]
fn serve_runs_at_most_the_calls_allowed_and_refuses_those_that_wait_too_long() {
    let tree = Tree::new();
    let before = tree.outside_grant();
    // One call at a time, each stopped after 3 s.
    let serve = serve_http_with(
        &tree,
        "127.0.0.1:0",
        None,
        "3",
        &["--max-concurrent-calls", "1"],
    );
    let port = serve.port();
    let spin = |id: u64| {
        let session = session(port);
        std::thread::spawn(move || {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"adversary__spin","arguments":{{}}}}}}"#
            );
            let (status, _, answer) = raw(
                port,
                &format!(
                    "POST /mcp HTTP/1.1\r\nHost: localhost:{port}\r\nMcp-Session-Id: {session}"
                ),
                body.as_bytes(),
            );
            assert_eq!(status, 200, "{answer}");
            sse_result(&answer, id)
        })
    };
    let first = spin(1);
    // Once the first call holds the only slot, two more come: the slot it frees can go to
    // one of them only, and the other's wait reaches its timeout while that one runs.
    while !serve.log().iter().any(|l| l.contains("call started")) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (second, third) = (spin(2), spin(3));
    let results = [
        first.join().unwrap(),
        second.join().unwrap(),
        third.join().unwrap(),
    ];
    let text = |r: &Value| {
        r["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        results.iter().all(|r| r["isError"] == json!(true)),
        "{results:?}"
    );
    assert!(!text(&results[0]).contains("busy"), "{results:?}");
    let refused: Vec<String> = results[1..]
        .iter()
        .map(text)
        .filter(|t| t.contains("busy"))
        .collect();
    assert!(!refused.is_empty(), "{results:?}");
    assert!(
        refused
            .iter()
            .all(|t| t.contains("--max-concurrent-calls 1")),
        "{refused:?}"
    );
    assert!(
        serve
            .log()
            .iter()
            .any(|l| l.contains("waiting for a call slot")),
        "{:#?}",
        serve.log()
    );
    drop(serve);
    assert_eq!(tree.outside_grant(), before);
}

#[test]
fn serve_refuses_a_call_past_the_calls_waiting_for_a_slot() {
    let tree = Tree::new();
    // The calls that may wait are a number of their own, not a multiple of the slots (which
    // follow the CPUs by default).
    let mut serve = StdioServe::start(
        &tree,
        &[
            "--max-concurrent-calls",
            "1",
            "--max-waiting-calls",
            "3",
            "--timeout",
            "600",
        ],
    );
    // One call holds the only slot; as many calls as may wait for it come next.
    serve.send_call(100, "adversary__spin", json!({}));
    serve.wait_for_log("call started", 1);
    let waiting = 3;
    for id in 101..=100 + waiting {
        serve.send_call(id, "adversary__echo", json!({"value": id}));
    }
    serve.wait_for_log("waiting for a call slot", waiting as usize);
    let refused = serve.call("adversary__echo", json!({"value": "late"}));
    assert_eq!(refused["result"]["isError"], json!(true), "{refused}");
    assert_eq!(
        refused["result"]["content"][0]["text"],
        "the server is busy: all 1 call slots are taken and 3 calls already wait for one, the \
         most that may (`trellis mcp serve --max-waiting-calls N` sets how many may wait, \
         `--max-concurrent-calls N` how many run at once); try again later"
    );
    // The slow call stopped, the waiting ones run, and a new call runs.
    serve.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": 100}})
        .to_string(),
    );
    let ids = 101..=100 + waiting;
    let expected: BTreeMap<u64, Value> =
        ids.clone().map(|id| (id, json!(id.to_string()))).collect();
    assert_eq!(serve.answers(ids), expected);
    let after = serve.call("adversary__echo", json!({"value": "after"}));
    assert_eq!(
        after["result"]["content"][0]["text"], "\"after\"",
        "{after}"
    );
    assert_ne!(after["result"]["isError"], json!(true), "{after}");
}

/// An MCP session over raw HTTP: its id after `initialize` and `initialized`.
fn session(port: u16) -> String {
    let host = format!("Host: localhost:{port}");
    let (status, headers, _) = raw(
        port,
        &format!("POST /mcp HTTP/1.1\r\n{host}"),
        INIT.as_bytes(),
    );
    assert_eq!(status, 200, "{headers}");
    let id = headers
        .lines()
        .find_map(|l| l.strip_prefix("mcp-session-id:"))
        .expect("a session id")
        .trim()
        .to_string();
    let (status, _, _) = raw(
        port,
        &format!("POST /mcp HTTP/1.1\r\n{host}\r\nMcp-Session-Id: {id}"),
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    // A notification has no answer: 202 Accepted.
    assert_eq!(status, 202);
    id
}

#[test]
fn serve_a_client_cannot_cancel_another_clients_call() {
    let tree = Tree::new();
    // Each call stops after 5 s: the victim's call ends by its deadline, not by the attack.
    let serve = serve_http(&tree, "127.0.0.1:0", None, "5");
    let port = serve.port();
    let victim = session(port);
    let attacker = session(port);
    let call = std::thread::spawn(move || {
        raw(
            port,
            &format!("POST /mcp HTTP/1.1\r\nHost: localhost:{port}\r\nMcp-Session-Id: {victim}"),
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"adversary__spin","arguments":{}}}"#,
        )
    });
    // The attacker cancels request 7 in its own session (the victim's id is not its to know),
    // over and over while the victim's call runs.
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(200));
        raw(
            port,
            &format!("POST /mcp HTTP/1.1\r\nHost: localhost:{port}\r\nMcp-Session-Id: {attacker}"),
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"attack"}}"#,
        );
    }
    let (status, _, body) = call.join().unwrap();
    assert_eq!(status, 200, "{body}");
    let result = body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m["id"] == json!(7))
        .unwrap_or_else(|| panic!("no answer to the call: {body}"));
    assert_eq!(result["result"]["isError"], json!(true), "{result}");
    let text = result["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_lowercase();
    assert!(
        !text.contains("cancel"),
        "cancelled by another client: {text}"
    );
    assert!(
        !serve
            .log()
            .iter()
            .any(|l| l.contains("adversary:spin") && l.contains("cancelled")),
        "{:#?}",
        serve.log()
    );
}

/// The operator's server file in `dir`, with the stdio fixture as `fx`.
fn fixture_file(dir: &Path, started: &Path) -> PathBuf {
    server_file(
        &dir.join("servers.json"),
        json!({"fx": fixture_entry(started)}),
    )
}

fn outside_runs(root: &Path) -> Vec<(String, String)> {
    tree_digest(root)
        .into_iter()
        .filter(|(k, _)| !k.starts_with("runs"))
        .collect()
}

#[test]
fn a_workspace_cannot_name_a_path_or_a_command_as_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let config = fixture_file(dir.path(), &started);
    let marker = dir.path().join("pwned");
    let touch = format!("touch {}", marker.display());
    let names = [
        mcp_fixture::python().display().to_string(),
        "/bin/sh".into(),
        "../fx".into(),
        "./fx".into(),
        "fx/..".into(),
        "~/fx".into(),
        format!("fx; {touch}"),
        format!("$({touch})"),
        format!("`{touch}`"),
        format!("fx && {touch}"),
        "fx\0".into(),
        mcp_fixture::script().display().to_string(),
    ];
    let tools: Vec<String> = names.iter().map(|n| format!("{n}:echo")).collect();
    let llm = asking_for(vec![("fx__echo", json!({"text": "hi"}))]);
    let ws = dir.path().join("ws");
    workspace(
        &ws,
        json!({"selected_servers": names, "selected_tools": tools}),
        &llm,
    );
    let before = outside_runs(&ws);
    for command in ["validate", "run"] {
        let out = with_servers(&[command, ws.to_str().unwrap()], &config)
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!marker.exists(), "{command} ran a shell: {all}");
        assert!(!started.exists(), "{command} started the server: {all}");
    }
    // The model's call of the server it never selected was refused.
    let seen = llm.seen();
    if seen.last().is_some_and(|last| {
        last["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"))
    }) {
        let result = result_of(&llm.last_tool_results(), "call-0");
        assert!(result.starts_with("error:"), "{result}");
    }
    assert_eq!(outside_runs(&ws), before);
}

#[test]
fn a_hostile_server_that_floods_or_dies_fails_its_calls_only() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let config = fixture_file(dir.path(), &started);
    // More than the 4 MiB a plugin's result may have.
    let size = 5 << 20;
    // One call a turn: the flood first, then the exit.
    let llm = huge_then(size, "fx__die", json!({}));
    let ws = dir.path().join("ws");
    workspace(&ws, json!({"selected_servers": ["fx"]}), &llm);
    let before = outside_runs(&ws);
    let out = with_servers(&["run", ws.to_str().unwrap()], &config)
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let results = llm.last_tool_results();
    assert_eq!(results.len(), 2, "{all}");
    let (huge, died) = (&results[0].1, &results[1].1);
    assert!(
        huge.starts_with("error:") && huge.contains("larger than the limit"),
        "{}",
        &huge[..huge.len().min(300)]
    );
    assert!(died.starts_with("error:"), "{died}");
    // The flood reached neither the model nor any record.
    assert_flood_kept_out(&ws, &llm);
    assert!(out.status.success(), "{all}");
    let pid: u32 = std::fs::read_to_string(&started).unwrap().parse().unwrap();
    assert!(mcp_fixture::process_gone(pid));
    assert_eq!(outside_runs(&ws), before);
}

/// The folder granted to a running server deleted and made again (a fresh checkout, a
/// cleaned output folder), or renamed away with a new one made at its path: the client is
/// told, for each call, that the folder was deleted, or replaced, since it was granted and
/// that the server needs a restart; nothing is written in the new folder, the moved one or anywhere else.
#[test]
fn serve_tells_the_client_its_folder_was_replaced_since_it_was_granted() {
    for renamed in [false, true] {
        let tree = Tree::new();
        let mut serve = StdioServe::start(&tree, &[]);
        let first = serve.call(
            "workspace__write_file",
            json!({"path": "notes/first.md", "content": "first\n"}),
        );
        assert!(!denied(&first), "{first}");
        if renamed {
            std::fs::rename(tree.root().join("notes"), tree.root().join("notes.bak")).unwrap();
        } else {
            std::fs::remove_dir_all(tree.root().join("notes")).unwrap();
        }
        std::fs::create_dir(tree.root().join("notes")).unwrap();
        let before = tree_digest(tree.dir.path());
        for (tool, args) in [
            (
                "workspace__write_file",
                json!({"path": "notes/second.md", "content": "second\n"}),
            ),
            ("workspace__read_file", json!({"path": "shared/notes.md"})),
        ] {
            let answer = serve.call(tool, args);
            assert!(denied(&answer), "{tool}: {answer}");
            let text = answer.to_string();
            let (what, restart) = if renamed {
                (
                    "was replaced since it was granted",
                    "`trellis mcp serve` needs a restart",
                )
            } else {
                (
                    "was deleted since it was granted",
                    "`trellis mcp serve`'s needs a restart",
                )
            };
            assert!(
                text.contains(what) && text.contains(restart),
                "renamed {renamed}, {tool}: {answer}"
            );
        }
        assert_eq!(tree_digest(tree.dir.path()), before, "renamed {renamed}");
    }
}

#[test]
fn a_server_message_over_the_cap_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let config = fixture_file(dir.path(), &started);
    // A result past the 16 MiB a message from a server may have: the line is refused while
    // it streams in, and the server is disconnected, so the next call fails too.
    let size = 20 << 20;
    let llm = huge_then(size, "fx__echo", json!({"text": "hi"}));
    let ws = dir.path().join("ws");
    workspace(&ws, json!({"selected_servers": ["fx"]}), &llm);
    let before = outside_runs(&ws);
    let out = trellis_command(&[
        "run",
        ws.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--mcp-config",
        config.to_str().unwrap(),
    ])
    .output()
    .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let results = llm.last_tool_results();
    assert_eq!(results.len(), 2, "{all}");
    let (huge, next) = (&results[0].1, &results[1].1);
    assert!(
        huge.starts_with("error:")
            && huge.contains(r#"MCP server "fx""#)
            && huge.contains("longer than the limit of 16777216 bytes"),
        "{}",
        &huge[..huge.len().min(300)]
    );
    assert!(next.starts_with("error:") && next.contains("fx"), "{next}");
    assert_flood_kept_out(&ws, &llm);
    assert!(out.status.success(), "{all}");
    let pid: u32 = std::fs::read_to_string(&started).unwrap().parse().unwrap();
    assert!(mcp_fixture::process_gone(pid));
    assert_eq!(outside_runs(&ws), before);
}

/// A result of 1,100,000 zeros (a few MB, under the byte cap) would cost over 30 times its
/// bytes parsed (862 MB for a 16 MiB line): the line is refused while it streams in, as a
/// line over the byte cap is.
#[test]
fn a_server_message_of_too_many_values_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let config = fixture_file(dir.path(), &started);
    let llm = FakeServer::start(Box::new(move |body| {
        let answered = body["messages"]
            .as_array()
            .map_or(0, |m| m.iter().filter(|m| m["role"] == "tool").count());
        match answered {
            0 => (
                200,
                completion("", &[("fx__many", json!({"count": 1_100_000}))]),
            ),
            _ => (200, completion("done", &[])),
        }
    }));
    let ws = dir.path().join("ws");
    workspace(&ws, json!({"selected_servers": ["fx"]}), &llm);
    let out = trellis_command(&[
        "run",
        ws.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--mcp-config",
        config.to_str().unwrap(),
    ])
    .output()
    .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let results = llm.last_tool_results();
    assert_eq!(results.len(), 1, "{all}");
    let many = &results[0].1;
    assert!(
        many.starts_with("error:")
            && many.contains(r#"MCP server "fx""#)
            && many.contains("of more than 1000000 JSON values"),
        "{}",
        &many[..many.len().min(300)]
    );
    assert!(out.status.success(), "{all}");
}

/// An LLM that asks the `fx` fixture for a result of `size` bytes, then for `tool` with
/// `args`, one call a turn, then ends.
fn huge_then(size: usize, tool: &'static str, args: Value) -> FakeServer {
    FakeServer::start(Box::new(move |body| {
        let answered = body["messages"]
            .as_array()
            .map_or(0, |m| m.iter().filter(|m| m["role"] == "tool").count());
        match answered {
            0 => (200, completion("", &[("fx__huge", json!({"size": size}))])),
            1 => (200, completion("", &[(tool, args.clone())])),
            _ => (200, completion("done", &[])),
        }
    }))
}

/// Neither a file of the workspace nor a request to the model holds a MiB of the fixture's
/// flood.
fn assert_flood_kept_out(ws: &Path, llm: &FakeServer) {
    let flood = "x".repeat(1 << 20);
    for (rel, _) in tree_digest(ws) {
        let path = ws.join(&rel);
        if path.is_file() {
            let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
            assert!(!text.contains(&flood), "{rel} holds the flood");
        }
    }
    assert!(
        llm.seen().iter().all(|r| !r.to_string().contains(&flood)),
        "the model saw the flood"
    );
}

/// A stdio client that sent requests and never read the answers made `mcp serve` queue
/// every answer: 2M pings took it to 2.2 GB (round 8). Now the server stops reading the
/// client's messages while 64 answers wait, so the client's writes block instead.
#[test]
fn serve_over_stdio_stops_reading_a_client_that_reads_no_answers() {
    let tree = Tree::new();
    let (root, plugins) = (tree.root(), tree.plugins());
    let mut child = trellis_command(&[
        "mcp",
        "serve",
        "--root",
        root.to_str().unwrap(),
        "--read",
        "shared",
        "--plugins",
        plugins.to_str().unwrap(),
    ])
    .env("TRELLIS_CACHE_DIR", cache_dir())
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // Held, never read: the pipe fills and the server's writes wait.
    let _stdout = child.stdout.take().unwrap();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = sent.clone();
    let total = 300_000;
    std::thread::spawn(move || {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "redteam", "version": "1"}}});
        let _ = writeln!(stdin, "{init}");
        let _ = writeln!(
            stdin,
            r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#
        );
        for i in 1..=total {
            if writeln!(stdin, r#"{{"jsonrpc":"2.0","id":{i},"method":"ping"}}"#).is_err() {
                return;
            }
            counter.store(i, std::sync::atomic::Ordering::SeqCst);
        }
    });
    std::thread::sleep(Duration::from_secs(8));
    let written = sent.load(std::sync::atomic::Ordering::SeqCst);
    let rss = rss_kib(child.id());
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        written < total / 10,
        "the client wrote {written} of {total} pings unhindered"
    );
    assert!(rss < 150 << 10, "the server holds {rss} KiB");
}

/// A server that sent `roots/list` requests during a call, 600,000 of them, grew the host to
/// 2.1 GB (round 8). Past 1,000 requests of its own a server is disconnected, its call failed.
#[test]
fn a_server_flooding_requests_of_its_own_is_disconnected() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let config = fixture_file(dir.path(), &started);
    let llm = support::mcp_servers::asking_for(vec![("fx__roots_flood", json!({"count": 5000}))]);
    let ws = dir.path().join("ws");
    workspace(&ws, json!({"selected_servers": ["fx"]}), &llm);
    let out = with_servers(&["run", ws.to_str().unwrap()], &config)
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let results = llm.last_tool_results();
    assert_eq!(results.len(), 1, "{all}");
    assert!(
        results[0]
            .1
            .contains("sent more than 1000 requests of its own"),
        "{}",
        results[0].1
    );
}

/// A sessionless `tools/call` of `name` with `arguments` as request `id`, whole, as bytes.
fn sessionless_call(port: u16, id: u64, name: &str, arguments: Value) -> Vec<u8> {
    let version = crate::support::mcp_serve::SESSIONLESS_VERSION;
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": name, "arguments": arguments, "_meta": {
            "io.modelcontextprotocol/protocolVersion": version,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}}}})
    .to_string();
    format!(
        "POST /mcp HTTP/1.1\r\nHost: localhost:{port}\r\nMcp-Method: tools/call\r\n\
         Mcp-Name: {name}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {version}\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Clients that call a tool with a large result and never read the answer: `trellis mcp
/// serve --http` holds the answers being sent within `--max-answer-mib` together; a call past
/// it is not answered (`503 busy`, or its stream ends before the result), and once the
/// stalled clients go a call is answered whole again.
#[test]
fn serve_holds_the_answers_its_clients_do_not_read_within_a_budget() {
    let tree = Tree::new();
    let serve = serve_http_with(
        &tree,
        "127.0.0.1:0",
        None,
        "60",
        &[
            "--max-answer-mib",
            "8",
            "--max-concurrent-calls",
            "32",
            "--max-sessions",
            "64",
            "--max-connections",
            "64",
        ],
    );
    let port = serve.port();
    let big = json!({"bytes": 3_500_000});
    let mut stalled = Vec::new();
    for id in 0..16 {
        let mut stream = crate::support::measure::small_window(port);
        stream
            .write_all(&sessionless_call(
                port,
                id,
                "adversary__huge_output",
                big.clone(),
            ))
            .unwrap();
        stalled.push(stream);
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let answered = |id: u64| {
        let (status, body) = crate::support::mcp_serve::sessionless_post(
            port,
            id,
            "tools/call",
            json!({"name": "adversary__huge_output", "arguments": big}),
        );
        let whole = body.contains(&"x".repeat(3_500_000)) && body.contains(&format!("\"id\":{id}"));
        (status, whole, body.chars().take(300).collect::<String>())
    };
    let (status, whole, start) = answered(100);
    assert!(
        !whole,
        "a call past the budget was answered ({status}): {start}"
    );
    // Refused before it starts (`503`), or its stream ended: cut, or before its headers.
    let ended = || {
        serve
            .log()
            .iter()
            .any(|l| l.contains("an answer stream ended: the server is busy"))
    };
    assert!(
        status == 503 && start.contains("the server is busy") || ended(),
        "{status}: {start}\n{:#?}",
        serve.log()
    );
    drop(stalled);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, whole, start) = answered(101);
        if whole {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not answered once the stalled clients went: {status} {start}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `trellis mcp serve --write` bounded each call alone (1 GiB), so many calls could fill the
/// disk: 4 calls wrote 640 MB (round 26, MEDIUM). The calls write from what is left of the
/// root's quota on disk (`--max-workspace-mib`), measured as each call begins.
#[test]
fn serve_calls_write_within_the_roots_quota() {
    let tree = Tree::new();
    let mut serve = StdioServe::start(&tree, &["--max-workspace-mib", "8"]);
    let content = "x".repeat(3 << 20);
    let mut refused = Vec::new();
    for n in 0..4 {
        let answer = serve.call(
            "workspace__write_file",
            json!({"path": format!("notes/part-{n}.txt"), "content": content}),
        );
        if answer["result"]["isError"] == true {
            refused.push(answer.to_string());
        }
    }
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(refused[0].contains("--max-workspace-mib"), "{refused:?}");
    let written: u64 = std::fs::read_dir(tree.root().join("notes"))
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum();
    assert!(written < 8 << 20, "{written} bytes written");
}
