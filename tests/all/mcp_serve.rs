//! `trellis mcp serve` driven by an independent client, the official Python MCP SDK
//! (`tests/mcp/sdk_client.py`, run in a virtual environment under the target folder that
//! these tests make when it is missing): tools listed and called over stdio and HTTP,
//! denials as `isError` results with nothing outside the grant read or changed, the bearer
//! token and the Host check of the HTTP transport, and cancellation.
//!
//! Without `python3` the SDK tests skip (`support::skip`: a failure under
//! `TRELLIS_REQUIRE_ALL=1`); CI makes the environment first (`.ci/run`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::mcp_serve::{HttpServe, INIT, post};
use crate::support::{self, tree_digest};

/// The pinned SDK release.
const SDK_VERSION: &str = "2.3.0";

/// The SDK's python, in `<target>/mcp-python/venv` (made here when missing), or `None` when
/// this machine has no `python3`.
fn sdk_python() -> Option<PathBuf> {
    static PYTHON: OnceLock<Option<PathBuf>> = OnceLock::new();
    PYTHON
        .get_or_init(|| support::venv::python_with("mcp-python", "mcp", SDK_VERSION))
        .clone()
}

/// Runs the SDK client on `plan`; `None` (a skip) without python3.
fn sdk_client(plan: Value) -> Option<Value> {
    let Some(python) = sdk_python() else {
        support::skip("python3 is not installed, so the MCP Python SDK cannot run");
        return None;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/sdk_client.py");
    let mut child = Command::new(python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(plan.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the SDK client failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

/// A tree with a granted folder, a secret beside it inside ROOT, a file outside ROOT and a
/// link from the granted folder to the secret.
struct Tree {
    dir: tempfile::TempDir,
}

const SECRET: &str = "the-secret-42";

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("shared")).unwrap();
        std::fs::create_dir_all(root.join("private")).unwrap();
        std::fs::write(root.join("shared/notes.md"), "granted notes\n").unwrap();
        std::fs::write(root.join("private/key.txt"), SECRET).unwrap();
        std::fs::write(dir.path().join("outside.txt"), SECRET).unwrap();
        std::os::unix::fs::symlink("../private/key.txt", root.join("shared/link.txt")).unwrap();
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
}

/// What a client tries against a read-only grant of `shared`: one good read, then escapes.
fn calls() -> Value {
    json!([
        {"name": "workspace__read_file", "arguments": {"path": "shared/notes.md"}},
        {"name": "workspace__read_file", "arguments": {"path": "private/key.txt"}},
        {"name": "workspace__read_file", "arguments": {"path": "../outside.txt"}},
        {"name": "workspace__read_file", "arguments": {"path": "shared/../../outside.txt"}},
        {"name": "workspace__read_file", "arguments": {"path": "shared/link.txt"}},
        {"name": "adversary__read", "arguments": {"path": "/private/key.txt"}},
        {"name": "workspace__write_file", "arguments": {"path": "shared/new.txt", "content": "x"}},
        {"name": "workspace__read_file", "arguments": {"wrong": 1}},
        {"name": "workspace:read_file", "arguments": {"path": "shared/notes.md"}},
    ])
}

/// Checks the answers to [`calls`] and that nothing under the tree changed.
fn check_answers(out: &Value) {
    let results = out["results"].as_array().unwrap();
    assert_eq!(results.len(), 9, "{out:#}");
    assert_eq!(results[0]["is_error"], false, "{out:#}");
    assert_eq!(results[0]["structured"]["content"], "granted notes\n");
    for denied in &results[1..8] {
        assert_eq!(denied["is_error"], true, "expected a denial: {denied:#}");
        assert!(
            !denied.to_string().contains(SECRET),
            "leaked the secret: {denied:#}"
        );
    }
    assert!(
        results[7]["text"]
            .as_str()
            .unwrap()
            .contains("invalid arguments"),
        "{:#}",
        results[7]
    );
    assert!(
        results[8]["protocol_error"]
            .as_str()
            .is_some_and(|e| e.contains("no tool")),
        "{:#}",
        results[8]
    );
}

fn check_listing(out: &Value) {
    assert_eq!(out["server"], "trellis");
    let tools = out["tools"].as_array().unwrap();
    let read = tools
        .iter()
        .find(|t| t["name"] == "workspace__read_file")
        .expect("workspace__read_file is listed");
    assert_eq!(read["annotations"]["readOnlyHint"], true, "{read:#}");
    let write = tools
        .iter()
        .find(|t| t["name"] == "workspace__write_file")
        .unwrap();
    assert_eq!(write["annotations"]["destructiveHint"], true, "{write:#}");
    assert!(tools.iter().any(|t| t["name"] == "adversary__spin"));
    for tool in tools {
        let name = tool["name"].as_str().unwrap();
        assert!(
            (1..=64).contains(&name.len())
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
            "{name} is not a name every client accepts"
        );
    }
}

fn cache_dir() -> String {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("component-cache")
        .display()
        .to_string()
}

#[test]
fn stdio_client_lists_and_calls_tools_and_cannot_leave_the_grant() {
    let tree = Tree::new();
    let plugins = tree.plugins();
    let before = tree_digest(tree.dir.path());
    let root = tree.root();
    let command = [
        env!("CARGO_BIN_EXE_trellis"),
        "mcp",
        "serve",
        "--root",
        root.to_str().unwrap(),
        "--read",
        "shared",
        "--plugins",
        plugins.to_str().unwrap(),
    ];
    let Some(out) = sdk_client(json!({
        "transport": "stdio",
        "command": command,
        "env": {"TRELLIS_CACHE_DIR": cache_dir()},
        "calls": calls(),
    })) else {
        return;
    };
    check_listing(&out);
    check_answers(&out);
    assert_eq!(tree_digest(tree.dir.path()), before);
}

#[test]
fn tool_flag_narrows_what_is_offered() {
    let tree = Tree::new();
    let root = tree.root();
    let command = [
        env!("CARGO_BIN_EXE_trellis"),
        "mcp",
        "serve",
        "--root",
        root.to_str().unwrap(),
        "--read",
        "shared",
        "--tool",
        "workspace:read_file",
    ];
    let Some(out) = sdk_client(json!({
        "transport": "stdio",
        "command": command,
        "env": {"TRELLIS_CACHE_DIR": cache_dir()},
        "calls": [{"name": "workspace__list_dir", "arguments": {"path": "shared"}}],
    })) else {
        return;
    };
    let names: Vec<&str> = out["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["workspace__read_file"]);
    assert!(out["results"][0]["protocol_error"].is_string(), "{out:#}");
}

/// `trellis mcp serve --http ADDR` on the tree's `shared`, read-only, with its plugins.
fn serve_http(tree: &Tree, addr: &str, token: Option<&str>) -> HttpServe {
    let (root, plugins) = (tree.root(), tree.plugins());
    HttpServe::start(
        addr,
        token,
        &[
            "--root",
            root.to_str().unwrap(),
            "--read",
            "shared",
            "--plugins",
            plugins.to_str().unwrap(),
            "--timeout",
            "600",
        ],
    )
}

/// The status of an `initialize` POST to `port` with these Host and Authorization headers.
fn raw_status(port: u16, host: &str, token: Option<&str>) -> u16 {
    let auth = token.map_or(String::new(), |t| format!("\r\nAuthorization: Bearer {t}"));
    post(port, &format!("\r\nHost: {host}{auth}"), INIT)
}

#[test]
fn http_client_lists_and_calls_tools_on_loopback() {
    let tree = Tree::new();
    let before = tree_digest(tree.dir.path());
    let server = serve_http(&tree, "0", None);
    // DNS rebinding: a page of another name that resolves to 127.0.0.1 is refused.
    assert_eq!(raw_status(server.port(), "evil.example", None), 403);
    assert_eq!(
        raw_status(
            server.port(),
            &format!("evil.example:{}", server.port()),
            None
        ),
        403
    );
    assert_eq!(
        raw_status(server.port(), &format!("localhost:{}", server.port()), None),
        200
    );
    let Some(out) = sdk_client(json!({
        "transport": "http",
        "url": server.url(),
        "calls": calls(),
    })) else {
        return;
    };
    check_listing(&out);
    check_answers(&out);
    assert_eq!(tree_digest(tree.dir.path()), before);
}

#[test]
fn http_off_loopback_needs_the_token() {
    let tree = Tree::new();
    // Without a token the server does not start on a non-loopback address.
    let out = support::trellis_command(&[
        "mcp",
        "serve",
        "--http",
        "0.0.0.0:0",
        "--root",
        tree.root().to_str().unwrap(),
    ])
    .env_remove("TRELLIS_TOKEN")
    .output()
    .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("TRELLIS_TOKEN"), "{stderr}");

    let before = tree_digest(tree.dir.path());
    let token = "s3cret-token";
    let server = serve_http(&tree, "0.0.0.0:0", Some(token));
    let host = format!("localhost:{}", server.port());
    assert_eq!(raw_status(server.port(), &host, None), 401);
    assert_eq!(raw_status(server.port(), &host, Some("wrong")), 401);
    assert_eq!(
        raw_status(server.port(), &host, Some(&format!("{token}x"))),
        401
    );
    assert_eq!(raw_status(server.port(), "evil.example", Some(token)), 403);
    assert_eq!(raw_status(server.port(), &host, Some(token)), 200);
    let Some(out) = sdk_client(json!({
        "transport": "http",
        "url": server.url(),
        "token": token,
        "calls": calls(),
    })) else {
        return;
    };
    check_answers(&out);
    assert_eq!(tree_digest(tree.dir.path()), before);
}

#[test]
fn a_client_cancellation_stops_the_call() {
    let tree = Tree::new();
    std::fs::create_dir(tree.root().join("scratch")).unwrap();
    let (root, plugins) = (tree.root(), tree.plugins());
    let server = HttpServe::start(
        "127.0.0.1:0",
        None,
        &[
            "--root",
            root.to_str().unwrap(),
            "--read",
            "shared",
            "--write",
            "scratch",
            "--plugins",
            plugins.to_str().unwrap(),
            "--timeout",
            "600",
        ],
    );
    let marker = root.join("scratch/started");
    // Cancelled once the guest says it is in its loop.
    let Some(out) = sdk_client(json!({
        "transport": "http",
        "url": server.url(),
        "calls": [
            {"name": "adversary__spin_marked", "arguments": {"marker": "/scratch/started"},
             "cancel_when_exists": marker},
            {"name": "workspace__read_file", "arguments": {"path": "shared/notes.md"}},
        ],
    })) else {
        return;
    };
    assert_eq!(out["cancelled"], json!(["adversary__spin_marked"]));
    assert_eq!(out["results"][0]["is_error"], false, "{out:#}");
    // The spinning guest was stopped (the call's own deadline is ten minutes away).
    let mut stopped = false;
    for _ in 0..200 {
        if server
            .log()
            .iter()
            .any(|l| l.contains("adversary:spin_marked") && l.contains("cancelled"))
        {
            stopped = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        stopped,
        "no cancelled call in the log:\n{:#?}",
        server.log()
    );
}

#[tokio::test]
async fn a_cancelled_call_stops_a_busy_guest() {
    let registry = support::registry_with_adversary().await;
    let limits = trellis_sandbox::Limits {
        timeout: Duration::from_secs(600),
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("started");
    let cancel = tokio_util::sync::CancellationToken::new();
    let trigger = cancel.clone();
    // From another thread, once the guest says it is in its loop (the marker written, not
    // only created: a cancel between the two found it empty): the loop holds this one until
    // the epoch check stops it.
    let watcher = {
        let marker = marker.clone();
        std::thread::spawn(move || {
            while std::fs::read_to_string(&marker).ok().as_deref() != Some("started") {
                std::thread::sleep(Duration::from_millis(5));
            }
            trigger.cancel();
        })
    };
    let args = json!({"marker": "/scratch/started"});
    let grant = trellis_sandbox::Grant::none()
        .write(dir.path(), "/scratch")
        .unwrap();
    let call =
        registry.call_tool_cancellable("adversary:spin_marked", &args, &grant, &limits, &cancel);
    // A generous bound that only a call left spinning reaches.
    let outcome = tokio::time::timeout(Duration::from_secs(120), call)
        .await
        .expect("the cancelled call ended");
    assert!(
        matches!(
            outcome,
            Err(trellis_sandbox::ToolCallError::Cancelled { .. })
        ),
        "{outcome:?}"
    );
    watcher.join().unwrap();
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "started");
}

/// A guest reading its stdin under `trellis mcp serve` over stdio gets end of file with no
/// byte, while the next request already waits on the server's stdin: the guest's stdin is
/// not the server's, and the request it did not read is answered after it.
#[test]
fn a_guest_reading_stdin_gets_nothing_of_the_protocol() {
    use std::io::{BufRead, BufReader};
    let tree = Tree::new();
    let root = tree.root();
    let plugins = tree.plugins();
    let mut child = support::trellis_command(&[
        "mcp",
        "serve",
        "--root",
        root.to_str().unwrap(),
        "--read",
        "shared",
        "--plugins",
        plugins.to_str().unwrap(),
    ])
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let call = |id: u32, name: &str, arguments: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": name, "arguments": arguments}})
        .to_string()
    };
    // All in one write: the echo request is on the pipe while the stdin call runs.
    let requests = [
        INIT.to_owned(),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string(),
        call(2, "adversary__stdin", json!({})),
        call(3, "adversary__echo", json!({"value": "after"})),
    ];
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(format!("{}\n", requests.join("\n")).as_bytes())
        .unwrap();
    stdin.flush().unwrap();
    // A server that never answers is killed, so the test fails instead of hanging.
    let pid = child.id() as libc::pid_t;
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let answered = answered.clone();
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            while !answered.load(std::sync::atomic::Ordering::SeqCst) {
                if started.elapsed() > Duration::from_secs(120) {
                    // SAFETY: the server this test started, not yet waited for.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let mut answers = std::collections::BTreeMap::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while answers.len() < 3 {
        let line = lines
            .next()
            .expect("the server answered every request before closing its stdout")
            .unwrap();
        let answer: Value = serde_json::from_str(&line).unwrap();
        if let Some(id) = answer["id"].as_u64() {
            answers.insert(id, answer);
        }
    }
    answered.store(true, std::sync::atomic::Ordering::SeqCst);
    watchdog.join().unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(
        answers[&2]["result"]["structuredContent"],
        json!({"bytes": 0, "read": ""}),
        "{:#}",
        answers[&2]
    );
    assert_eq!(
        answers[&3]["result"]["content"],
        json!([{"type": "text", "text": "\"after\""}]),
        "{:#}",
        answers[&3]
    );
}
