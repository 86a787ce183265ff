//! Attacks on a step script's network and database capability, through `trellis script`:
//! a workspace (plan, step config, script) written by an attacker, the operator's flags
//! given by the test. Each attack's script tries its requests and writes what happened
//! to `result.json`; the test checks the refusal, that the server the test started on
//! 127.0.0.1 received nothing it should not have (every request's raw bytes are kept),
//! and that nothing outside the grant changed. Where the defence holds, the test is its
//! proof.

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::workspace::{create_db, read_json, write_file};
use support::{tree_digest, trellis_command};

const STEP: &str = "fetch";
const OUT: &str = "runs/iteration-0/execution/fetch";
/// The secret the operator's environment holds: it must reach no one but approved origins.
const SECRET: &str = "s3cret-value-XYZ";

/// One request a [`Server`] received: its path and its raw bytes (head and body).
#[derive(Debug, Clone)]
struct Received {
    path: String,
    raw: String,
}

/// An HTTP/1.1 server on 127.0.0.1 that keeps every request it receives. `/ok...` answers
/// `{"ok": true}` (`POST /ok/extra` also keeps what follows the declared body on the
/// connection); `/redirect` sends the client to the location given at start; `/hang` never
/// answers; `/drip` sends a body that never ends, a byte at a time; `/huge-head` answers a
/// 2 MiB header.
struct Server {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Server {
    fn start(redirect_to: Option<String>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let log = log.clone();
                let redirect_to = redirect_to.clone();
                std::thread::spawn(move || serve(stream, &log, redirect_to.as_deref()));
            }
        });
        Server { addr, received }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port())
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// Answers one connection (one request: `connection: close`).
fn serve(stream: TcpStream, log: &Mutex<Vec<Received>>, redirect_to: Option<&str>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut head = String::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    if head.is_empty() {
        return;
    }
    let mut body = vec![0; length.min(1 << 20)];
    let _ = reader.read_exact(&mut body);
    if head.starts_with("POST /ok/extra ") {
        // Whatever follows the declared body on the connection: a smuggled request.
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        let mut extra = [0u8; 4096];
        while let Ok(n @ 1..) = reader.read(&mut extra) {
            body.extend_from_slice(&extra[..n]);
        }
    }
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
    log.lock().unwrap().push(Received {
        path: path.clone(),
        raw: head + &String::from_utf8_lossy(&body),
    });
    let mut stream = stream;
    let reply = |status: &str, extra: &str, body: &str| {
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let out = match path.as_str() {
        "/redirect" => reply(
            "302 Found",
            &format!("location: {}\r\n", redirect_to.unwrap_or_default()),
            "",
        ),
        "/hang" => {
            // Holds the connection without a byte until the client goes (or five minutes).
            stream
                .set_read_timeout(Some(Duration::from_secs(1)))
                .unwrap();
            let mut byte = [0u8; 1];
            for _ in 0..300 {
                match stream.read(&mut byte) {
                    Ok(0) => return,
                    Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => return,
                    _ => {}
                }
            }
            return;
        }
        "/drip" => {
            // A chunked body that never ends: a byte every 50 ms until the client goes (or
            // five minutes), each well within any between-bytes timeout.
            let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
            let _ = stream.write_all(head.as_bytes());
            for _ in 0..6000 {
                if stream.write_all(b"1\r\n \r\n").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            return;
        }
        "/huge-head" => reply(
            "200 OK",
            &format!("x-huge: {}\r\n", "a".repeat(2 << 20)),
            "{}",
        ),
        "/many-heads" => reply("200 OK", &"x-many: a\r\n".repeat(10_000), "{}"),
        "/big-chunked" => {
            // 40 MiB in chunks, no length declared up front.
            let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
            let _ = stream.write_all(head.as_bytes());
            let chunk = format!("100000\r\n{}\r\n", " ".repeat(1 << 20));
            for _ in 0..40 {
                if stream.write_all(chunk.as_bytes()).is_err() {
                    return;
                }
            }
            let _ = stream.write_all(b"0\r\n\r\n");
            return;
        }
        p if p.starts_with("/ok") => reply("200 OK", "", r#"{"ok": true}"#),
        _ => reply("404 Not Found", "", "{}"),
    };
    let _ = stream.write_all(out.as_bytes());
}

/// The script's prelude: `attempt(name, fn)` runs one request and records `ok <status>`
/// or `<exception class>: <message>`; `done()` writes the record to `result.json`.
const PRELUDE: &str = r#"import json, os, urllib.parse, trellis_http
RESULT = {}
def attempt(name, fn):
    try:
        reply = fn()
        RESULT[name] = f"ok {reply.status}"
    except Exception as e:
        RESULT[name] = f"{type(e).__name__}: {e}"
def done():
    with open(os.path.join(os.environ["STEP_OUTPUT_DIR"], "result.json"), "w") as f:
        json.dump(RESULT, f)
    print(json.dumps(RESULT))
"#;

/// A workspace with the scripted step `fetch` listing `allowed_hosts`, its script
/// `PRELUDE` + `script`, and a database whose `items` table has one row.
fn workspace(root: &Path, allowed_hosts: Value, script: &str) {
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "fetch", "steps": [{
            "id": STEP, "type": "regular", "title": "Fetch", "description": "Fetch.",
            "context_output": ["result.json"]
        }]})
        .to_string(),
    );
    write_file(
        root,
        "planning/step_config.json",
        json!({"steps": [{"id": STEP, "agent_configs": {
            "declared_execution_mode": "scripted", "lock_code": true,
            "allowed_hosts": allowed_hosts
        }}]})
        .to_string(),
    );
    write_file(root, "workflow.json", "{}");
    write_file(
        root,
        &format!("code/{STEP}/main.py"),
        format!("{PRELUDE}{script}"),
    );
    create_db(
        root,
        "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT);\n\
         INSERT INTO items (name) VALUES ('alpha');",
    );
}

/// `trellis script WS --step fetch` with `args` and `env`.
fn script(root: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut all = vec!["script", root.to_str().unwrap(), "--step", STEP];
    all.extend_from_slice(args);
    let mut command = trellis_command(&all);
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("the trellis binary runs")
}

use crate::support::plugin_build::text;

/// What the script recorded, by attempt.
fn result(root: &Path, out: &std::process::Output) -> Value {
    let path = root.join(OUT).join("result.json");
    assert!(
        path.exists(),
        "no result.json:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    read_json(&path)
}

/// Everything but the run folder (logs and the step's output): what the script may not
/// change.
fn outside_the_run(root: &Path) -> std::collections::BTreeMap<String, String> {
    tree_digest(root)
        .into_iter()
        .filter(|(k, _)| !k.starts_with("runs"))
        .collect()
}

/// Runs once with a script that only records nothing, so the database exists.
fn prepared(root: &Path) -> std::collections::BTreeMap<String, String> {
    let rel = format!("code/{STEP}/main.py");
    let kept = std::fs::read_to_string(root.join(&rel)).unwrap();
    write_file(root, &rel, format!("{PRELUDE}done()\n"));
    let out = script(root, &[], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    write_file(root, &rel, kept);
    std::fs::remove_file(root.join(OUT).join("result.json")).unwrap();
    outside_the_run(root)
}

fn refused(outcome: &Value) -> bool {
    outcome
        .as_str()
        .is_some_and(|s| s.starts_with("RequestRefused"))
}

fn failed(outcome: &Value) -> bool {
    outcome.as_str().is_some_and(|s| !s.starts_with("ok"))
}

/// A placeholder anywhere but a header value (path, query, body, a header's name), in a
/// header value spelled otherwise (upper case, percent-encoded, split), or naming the
/// operator's LLM key (approved for the same origin, but not a `SECRET_` variable) is sent
/// as it is, even to the origin approved for the secret; the script's environment never
/// holds a value.
#[test]
fn a_placeholder_outside_a_header_value_or_spelled_otherwise_is_sent_as_it_is() {
    let server = Server::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let base = server.url("");
    workspace(
        root,
        json!(["127.0.0.1"]),
        &format!(
            r#"base = "{base}"
p = os.environ["SECRET_TOKEN"]
attempt("path", lambda: trellis_http.get(base + "/ok/" + p))
attempt("query", lambda: trellis_http.get(base + "/ok", params={{"k": p}}))
attempt("body", lambda: trellis_http.post(base + "/ok", data=p))
attempt("json", lambda: trellis_http.post(base + "/ok", json={{"token": p}}))
attempt("upper", lambda: trellis_http.get(base + "/ok", headers={{"X-A": p.upper()}}))
attempt("quoted", lambda: trellis_http.get(base + "/ok", headers={{"X-A": urllib.parse.quote(p, safe="")}}))
attempt("split", lambda: trellis_http.get(base + "/ok", headers={{"X-A": p[:9] + " " + p[9:]}}))
attempt("name", lambda: trellis_http.get(base + "/ok", headers={{"trellis-secret": ":SECRET_TOKEN"}}))
attempt("llm_key", lambda: trellis_http.get(base + "/ok", headers={{"Authorization": "Bearer trellis-secret:OPENAI_API_KEY"}}))
RESULT["env"] = dict(os.environ)
done()
"#
        ),
    );
    let before = prepared(root);
    let key = format!("SECRET_TOKEN={}", server.origin());
    // The operator's LLM key, approved for the same origin (a local model server): not a
    // script's secret at all.
    let llm_key = format!("OPENAI_API_KEY={}", server.origin());
    let out = script(
        root,
        &[
            "--allow-host",
            "127.0.0.1",
            "--allow-key",
            &key,
            "--allow-key",
            &llm_key,
        ],
        &[
            ("SECRET_TOKEN", SECRET),
            ("AWS_SECRET_ACCESS_KEY", "aws-value"),
            ("OPENAI_API_KEY", "sk-operator"),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result = result(root, &out);
    for name in [
        "path", "query", "body", "json", "upper", "quoted", "split", "name", "llm_key",
    ] {
        assert_eq!(result[name], "ok 200", "{name}: {result}");
    }
    let received = server.received();
    assert_eq!(received.len(), 9);
    for request in &received {
        assert!(!request.raw.contains(SECRET), "{}", request.raw);
        assert!(!request.raw.contains("sk-operator"), "{}", request.raw);
    }
    assert!(
        received[0]
            .path
            .ends_with("/ok/trellis-secret:SECRET_TOKEN")
    );
    assert!(received[2].raw.ends_with("trellis-secret:SECRET_TOKEN"));
    // The script holds the placeholder only, and never prints the value.
    assert_eq!(result["env"]["SECRET_TOKEN"], "trellis-secret:SECRET_TOKEN");
    // Nothing else of the operator's environment reaches it either.
    assert!(!result.to_string().contains("aws-value"));
    assert!(!result.to_string().contains("sk-operator"));
    assert!(!result.to_string().contains(SECRET));
    assert!(!text(&out.stdout).contains(SECRET));
    assert!(!text(&out.stderr).contains(SECRET));
    assert_eq!(outside_the_run(root), before);
}

/// Each secret goes only to its own origins: an origin approved for another secret does
/// not receive this one, nor does plain http to the host and port approved for https.
#[test]
fn a_secret_is_refused_at_an_origin_approved_for_a_different_secret() {
    let first = Server::start(None);
    let second = Server::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (a, b) = (first.url("/ok"), second.url("/ok"));
    workspace(
        root,
        json!(["127.0.0.1"]),
        &format!(
            r#"auth = lambda var: {{"Authorization": "Bearer " + os.environ[var]}}
attempt("b_to_first", lambda: trellis_http.get("{a}", headers=auth("SECRET_B")))
attempt("a_to_second", lambda: trellis_http.get("{b}", headers=auth("SECRET_A")))
attempt("both_to_first", lambda: trellis_http.get("{a}", headers={{"X-A": os.environ["SECRET_A"], "X-B": os.environ["SECRET_B"]}}))
attempt("c_over_http", lambda: trellis_http.get("{a}", headers=auth("SECRET_C")))
attempt("a_to_first", lambda: trellis_http.get("{a}", headers=auth("SECRET_A")))
done()
"#
        ),
    );
    let before = prepared(root);
    let (key_a, key_b) = (
        format!("SECRET_A={}", first.origin()),
        format!("SECRET_B={}", second.origin()),
    );
    // Approved for https on the first server's host and port; sent over plain http.
    let key_c = format!("SECRET_C=https://127.0.0.1:{}", first.port());
    let out = script(
        root,
        &[
            "--allow-host",
            "127.0.0.1",
            "--allow-key",
            &key_a,
            "--allow-key",
            &key_b,
            "--allow-key",
            &key_c,
        ],
        &[
            ("SECRET_A", "value-of-a"),
            ("SECRET_B", "value-of-b"),
            ("SECRET_C", "value-of-c"),
        ],
    );
    let result = result(root, &out);
    for name in ["b_to_first", "a_to_second", "both_to_first", "c_over_http"] {
        assert!(refused(&result[name]), "{name}: {result}");
    }
    assert!(
        result["b_to_first"]
            .as_str()
            .unwrap()
            .contains("the secret in SECRET_B is not approved"),
        "{result}"
    );
    // Only the approved pairing went out.
    assert_eq!(result["a_to_first"], "ok 200", "{result}");
    let received = first.received();
    assert_eq!(received.len(), 1);
    assert!(received[0].raw.contains("Bearer value-of-a\r\n"));
    assert!(!received[0].raw.contains("value-of-b"));
    assert!(!received[0].raw.contains("value-of-c"));
    assert!(second.received().is_empty());
    assert_eq!(outside_the_run(root), before);
}

/// `SECRET_API` and `SECRET_API_TOKEN`: the placeholder of the longer name is the shorter
/// one's followed by `_TOKEN`. It stands for its own secret, not for the shorter one's.
#[test]
fn a_placeholder_whose_name_extends_anothers_stands_for_its_own_secret() {
    let server = Server::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let url = server.url("/ok");
    workspace(
        root,
        json!(["127.0.0.1"]),
        &format!(
            r#"attempt("token", lambda: trellis_http.get("{url}", headers={{"Authorization": "Bearer " + os.environ["SECRET_API_TOKEN"]}}))
done()
"#
        ),
    );
    let env = [
        ("SECRET_API", "short-value"),
        ("SECRET_API_TOKEN", "long-value"),
    ];
    let token_key = format!("SECRET_API_TOKEN={}", server.origin());
    let api_key = format!("SECRET_API={}", server.origin());

    // Approved for the longer name only: the request is not refused for the shorter one.
    let out = script(
        root,
        &["--allow-host", "127.0.0.1", "--allow-key", &token_key],
        &env,
    );
    assert_eq!(
        result(root, &out)["token"],
        "ok 200",
        "{}",
        text(&out.stdout)
    );
    // Approved for both: the longer name's value is sent, not the shorter's + "_TOKEN".
    let out = script(
        root,
        &[
            "--allow-host",
            "127.0.0.1",
            "--allow-key",
            &token_key,
            "--allow-key",
            &api_key,
        ],
        &env,
    );
    assert_eq!(
        result(root, &out)["token"],
        "ok 200",
        "{}",
        text(&out.stdout)
    );
    let received = server.received();
    assert_eq!(received.len(), 2);
    for request in &received {
        assert!(
            request.raw.contains("authorization: Bearer long-value\r\n"),
            "{}",
            request.raw
        );
        assert!(!request.raw.contains("short-value"), "{}", request.raw);
    }
}

/// A redirect from the origin approved for a secret to another allowed host: the script
/// follows it with the same headers, and the host refuses the second request.
#[test]
fn a_redirect_carrying_a_placeholder_to_another_allowed_host_is_refused() {
    let elsewhere = Server::start(None);
    let server = Server::start(Some(format!("http://localhost:{}/ok", elsewhere.port())));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let url = server.url("/redirect");
    workspace(
        root,
        json!(["127.0.0.1", "localhost"]),
        &format!(
            r#"attempt("redirect", lambda: trellis_http.get("{url}", headers={{"Authorization": "Bearer " + os.environ["SECRET_TOKEN"]}}))
done()
"#
        ),
    );
    let before = prepared(root);
    let key = format!("SECRET_TOKEN={}", server.origin());
    let out = script(
        root,
        &[
            "--allow-host",
            "127.0.0.1",
            "--allow-host",
            "localhost",
            "--allow-key",
            &key,
        ],
        &[("SECRET_TOKEN", SECRET)],
    );
    let result = result(root, &out);
    let outcome = result["redirect"].as_str().unwrap();
    assert!(refused(&result["redirect"]), "{result}");
    assert!(
        outcome.contains(&format!(
            "the secret in SECRET_TOKEN is not approved for http://localhost:{}",
            elsewhere.port()
        )),
        "{outcome}"
    );
    assert_eq!(server.received().len(), 1, "the approved origin got it");
    assert!(elsewhere.received().is_empty());
    assert_eq!(outside_the_run(root), before);
}

/// `allowed_hosts` entries that are this machine in other spellings: all-zero, an
/// IPv4-mapped or IPv4-compatible IPv6 address, a decimal or hexadecimal or short IPv4
/// form, a trailing dot, `[::1]`, a public name made to resolve to loopback. With the
/// operator's approval of `127.0.0.1` only, none reaches the server.
#[test]
fn other_spellings_of_loopback_in_allowed_hosts_need_their_own_approval() {
    let server = Server::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let port = server.port();
    let hosts = [
        "0.0.0.0",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "[::127.0.0.1]",
        "[::1]",
        "2130706433",
        "0x7f.1",
        "127.1",
        "0177.0.0.1",
        "localhost.",
        "LOCALHOST",
        "127.0.0.1.nip.io",
    ];
    let tries: String = hosts
        .iter()
        .map(|h| format!("attempt({h:?}, lambda: trellis_http.get(\"http://{h}:{port}/ok\"))\n"))
        .collect();
    workspace(root, json!(hosts), &format!("{tries}done()\n"));
    let before = prepared(root);
    let out = script(root, &["--allow-host", "127.0.0.1"], &[]);
    let result = result(root, &out);
    for host in hosts {
        let outcome = &result[host];
        if host.ends_with("nip.io") {
            // Not resolvable without a network; where it is, it resolves to loopback.
            assert!(failed(outcome), "{host}: {outcome}");
        } else {
            assert!(refused(outcome), "{host}: {outcome}");
            assert!(
                outcome.as_str().unwrap().contains("--allow-host"),
                "{host}: {outcome}"
            );
        }
    }
    assert!(server.received().is_empty(), "{:?}", server.received());
    assert_eq!(outside_the_run(root), before);
}

/// A user name in the URL (`allowed@elsewhere`), another port of a listed `host:port`, a
/// listed host as a prefix or suffix of the one asked.
#[test]
fn userinfo_ports_and_lookalike_hosts_are_refused() {
    let server = Server::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let port = server.port();
    workspace(
        root,
        json!(["127.0.0.1:1", "localhost:1"]),
        &format!(
            r#"attempt("other_port", lambda: trellis_http.get("http://127.0.0.1:{port}/ok"))
attempt("userinfo", lambda: trellis_http.get("http://127.0.0.1:1@127.0.0.1:{port}/ok"))
attempt("userinfo_name", lambda: trellis_http.get("http://localhost:1@localhost:{port}/ok"))
attempt("suffix", lambda: trellis_http.get("http://127.0.0.1.:{port}/ok"))
done()
"#
        ),
    );
    let before = prepared(root);
    let out = script(
        root,
        &["--allow-host", "127.0.0.1", "--allow-host", "localhost"],
        &[],
    );
    let result = result(root, &out);
    for name in ["other_port", "userinfo", "userinfo_name", "suffix"] {
        assert!(failed(&result[name]), "{name}: {result}");
    }
    assert!(refused(&result["other_port"]), "{result}");
    assert!(server.received().is_empty(), "{:?}", server.received());
    assert_eq!(outside_the_run(root), before);
}

/// Headers that would point the request elsewhere or split it: `Host`, `:authority`, CR/LF
/// in a value, `Transfer-Encoding`, a `Content-Length` shorter than the body (a second
/// request hidden in the first one's body), and CR/LF in the path or the authority given
/// to `wasi:http` directly.
#[test]
fn host_headers_header_injection_and_smuggling_are_refused() {
    let server = Server::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let url = server.url("/ok");
    workspace(
        root,
        json!(["127.0.0.1"]),
        &format!(
            r#"url = "{url}"
hidden = b"AAAA" + b"GET /smuggled HTTP/1.1\r\nHost: admin.internal\r\n\r\n"
attempt("host", lambda: trellis_http.get(url, headers={{"Host": "admin.internal"}}))
attempt("authority", lambda: trellis_http.get(url, headers={{":authority": "admin.internal"}}))
attempt("crlf", lambda: trellis_http.get(url, headers={{"X-A": "v\r\nX-Injected: admin.internal"}}))
attempt("lf", lambda: trellis_http.get(url, headers={{"X-A": "v\nX-Injected: admin.internal"}}))
attempt("te", lambda: trellis_http.post(url, data=b"0\r\n\r\n", headers={{"Transfer-Encoding": "chunked"}}))
# Through wasi:http itself: a body longer than its Content-Length, CR/LF in the path and
# in the authority.
from componentize_py_types import Err
from wit_world.imports import outgoing_handler, wasi_http_types as t
def raw(authority, path, headers=(), body=None):
    req = t.OutgoingRequest(t.Fields.from_list(list(headers)))
    req.set_method(t.Method_Post())
    req.set_scheme(t.Scheme_Http())
    req.set_authority(authority)
    req.set_path_with_query(path)
    out = req.body()
    future = outgoing_handler.handle(req, None)
    try:
        if body:
            stream = out.write()
            stream.blocking_write_and_flush(body)
            stream.__exit__(None, None, None)
        t.OutgoingBody.finish(out, None)
    except Err as e:
        raise trellis_http.HttpError(f"writing the body: {{e.value}}")
    while (result := future.get()) is None:
        future.subscribe().block()
    if isinstance(result.value, Err):
        raise trellis_http.HttpError(str(result.value.value))
    return result.value.value
authority = url.split("/")[2]
attempt("length", lambda: raw(authority, "/ok/extra", [("content-length", b"4")], hidden))
attempt("path_crlf", lambda: raw(authority, "/ok HTTP/1.1\r\nX-Injected: 1\r\n\r\nGET /smuggled"))
attempt("authority_crlf", lambda: raw(authority + "\r\nX-Injected: admin.internal", "/ok"))
done()
"#
        ),
    );
    let before = prepared(root);
    let out = script(root, &["--allow-host", "127.0.0.1"], &[]);
    let result = result(root, &out);
    for name in [
        "host",
        "authority",
        "crlf",
        "lf",
        "te",
        "length",
        "path_crlf",
        "authority_crlf",
    ] {
        assert!(failed(&result[name]), "{name}: {result}");
    }
    for request in server.received() {
        assert!(!request.raw.contains("admin.internal"), "{}", request.raw);
        assert!(!request.raw.contains("X-Injected"), "{}", request.raw);
        assert_ne!(request.path, "/smuggled");
    }
    assert_eq!(outside_the_run(root), before);
}

/// Many requests: a fifth one opened while four wait for an answer, and the 1,001st of a
/// run (refused ones included), are refused and never sent.
#[test]
fn requests_past_the_live_and_total_limits_are_refused_and_not_sent() {
    let server = Server::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let port = server.port();
    workspace(
        root,
        json!(["127.0.0.1"]),
        &format!(
            r#"import time
from componentize_py_types import Err
from wit_world.imports import outgoing_handler, wasi_http_types as t
def open_request(path):
    req = t.OutgoingRequest(t.Fields.from_list([]))
    req.set_scheme(t.Scheme_Http())
    req.set_authority("127.0.0.1:{port}")
    req.set_path_with_query(path)
    body = req.body()
    future = outgoing_handler.handle(req, None)
    t.OutgoingBody.finish(body, None)
    return future
def outcome(future):
    while (result := future.get()) is None:
        future.subscribe().block()
    inner = result.value
    return f"error {{inner.value}}" if isinstance(inner, Err) else "ok"
# Four live requests (to a server that never answers), then a fifth.
live = [open_request(f"/hang") for i in range(4)]
RESULT["fifth"] = outcome(open_request("/ok/fifth"))
# Dropped, they end; the rest of the 1,000 (refused ones count), one at a time, then one
# more.
del live
count, retries = 5, 0
while count <= 1000:
    try:
        count += 1
        trellis_http.get(f"http://127.0.0.1:{port}/ok/{{count}}")
    except trellis_http.HttpError as e:
        if "open at once" in str(e):
            # The dropped requests are not closed yet.
            retries += 1
            time.sleep(0.05)
            continue
        RESULT["stopped"] = f"{{count - 1}}: {{e}}"
        break
RESULT["retries"] = retries
done()
"#
        ),
    );
    let before = prepared(root);
    let out = script(root, &["--allow-host", "127.0.0.1"], &[]);
    let result = result(root, &out);
    let fifth = result["fifth"].as_str().unwrap();
    assert!(
        fifth.contains("more than 4 requests open at once"),
        "{fifth}"
    );
    let stopped = result["stopped"].as_str().unwrap();
    assert!(stopped.contains("more than 1000 requests"), "{stopped}");
    assert!(stopped.starts_with("1000: "), "{stopped}");
    let received = server.received();
    assert!(!received.iter().any(|r| r.path == "/ok/fifth"));
    // Every request counts toward the 1,000: the four held open (the server may or may not
    // have read them before they were dropped), the refused fifth and any refused while the
    // dropped ones were closing; every other one reached the server, and nothing more.
    let retries = result["retries"].as_u64().unwrap() as usize;
    let ok = received
        .iter()
        .filter(|r| r.path.starts_with("/ok/"))
        .count();
    assert_eq!(ok, 1000 - 4 - 1 - retries, "{stopped}");
    assert!(received.len() - ok <= 4, "{stopped}");
    assert_eq!(outside_the_run(root), before);
}

/// Waits for `child` to end by itself; a watchdog far past any deadline kills it and fails.
fn ends_by_itself(mut child: std::process::Child) -> std::process::Output {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(240) {
            let _ = child.kill();
            panic!("the script's deadline did not stop it");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().unwrap()
}

/// A server that never answers, and one whose body never ends (a byte at a time, each well
/// within any between-bytes timeout): the script's deadline still ends the script.
#[test]
fn a_response_that_never_comes_or_never_ends_stops_at_the_scripts_deadline() {
    let server = Server::start(None);
    for path in ["/hang", "/drip"] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let url = server.url(path);
        workspace(
            root,
            json!(["127.0.0.1"]),
            &format!("trellis_http.get(\"{url}\")\ndone()\n"),
        );
        let before = prepared(root);
        let child = trellis_command(&[
            "script",
            root.to_str().unwrap(),
            "--step",
            STEP,
            "--timeout",
            "3",
            "--allow-host",
            "127.0.0.1",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        let out = ends_by_itself(child);
        assert!(!out.status.success(), "{path}");
        let said = text(&out.stdout) + &text(&out.stderr);
        assert!(said.to_lowercase().contains("timeout"), "{path}: {said}");
        assert!(!root.join(OUT).join("result.json").exists());
        assert_eq!(outside_the_run(root), before);
    }
}

/// A 2 MiB response header, 10,000 response headers, and a 40 MiB chunked body (no length
/// declared up front) are errors the script can catch; the run goes on.
#[test]
fn huge_response_headers_and_an_undeclared_oversized_body_are_errors_the_script_catches() {
    let server = Server::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let base = server.url("");
    workspace(
        root,
        json!(["127.0.0.1"]),
        &format!(
            r#"attempt("huge", lambda: trellis_http.get("{base}/huge-head"))
attempt("many", lambda: trellis_http.get("{base}/many-heads"))
attempt("chunked", lambda: trellis_http.get("{base}/big-chunked"))
attempt("after", lambda: trellis_http.get("{base}/ok"))
done()
"#
        ),
    );
    let out = script(root, &["--allow-host", "127.0.0.1"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result = result(root, &out);
    for name in ["huge", "many", "chunked"] {
        assert!(
            result[name].as_str().unwrap().starts_with("HttpError"),
            "{name}: {result}"
        );
    }
    assert!(
        result["chunked"]
            .as_str()
            .unwrap()
            .contains("reading the response failed"),
        "{result}"
    );
    assert_eq!(result["after"], "ok 200");
}

/// The `sqlite3` module's `executescript` and `execute` with what the database fences
/// refuse: `ATTACH`, `VACUUM INTO`, `load_extension`, `PRAGMA writable_schema`, a
/// statement over the length limit, a write to `sqlite_master`. No other file appears and
/// the database keeps its rows and schema.
#[test]
fn the_sqlite3_module_cannot_attach_vacuum_into_load_extensions_or_rewrite_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        json!([]),
        r#"import sqlite3
conn = sqlite3.connect(os.environ["DB_PATH"])
def sql(name, text, script=False):
    try:
        (conn.executescript if script else conn.execute)(text)
        RESULT[name] = "ok"
    except Exception as e:
        RESULT[name] = f"{type(e).__name__}: {e}"
sql("attach", "SELECT 1; ATTACH DATABASE '/db/other.sqlite' AS o; CREATE TABLE o.t (x);", True)
sql("vacuum_into", "SELECT 1; VACUUM INTO '/db/copy.sqlite';", True)
sql("vacuum_into_comment", "/* x */ VACUUM INTO '/db/copy2.sqlite'")
sql("load_extension", "SELECT load_extension('/db/evil')")
sql("writable_schema", "PRAGMA writable_schema = 1; UPDATE sqlite_master SET sql = 'CREATE TABLE items (x)' WHERE name = 'items';", True)
sql("master", "DELETE FROM sqlite_master WHERE name = 'items'")
sql("long", "SELECT '" + "a" * (2 << 20) + "'")
sql("journal", "PRAGMA journal_mode = OFF")
RESULT["rows"] = [list(r) for r in conn.execute("SELECT id, name FROM items").fetchall()]
done()
"#,
    );
    let before = prepared(root);
    let out = script(root, &[], &[]);
    let result = result(root, &out);
    // The authorizer's `not authorized` (naming the function for load_extension), the
    // statement check's VACUUM refusal and length limit, SQLite's own guard of sqlite_master.
    for (name, error) in [
        ("attach", "OperationalError: not authorized"),
        (
            "vacuum_into",
            "OperationalError: VACUUM is not allowed on the workflow database",
        ),
        (
            "vacuum_into_comment",
            "OperationalError: VACUUM is not allowed on the workflow database",
        ),
        (
            "load_extension",
            "OperationalError: not authorized to use function: load_extension in \
             SELECT load_extension('/db/evil') at offset 7",
        ),
        ("writable_schema", "OperationalError: not authorized"),
        (
            "master",
            "OperationalError: table sqlite_master may not be modified",
        ),
        ("long", "OperationalError: statement too long"),
        ("journal", "OperationalError: not authorized"),
    ] {
        assert_eq!(result[name], json!(error), "{name}: {result}");
    }
    assert_eq!(result["rows"], json!([[1, "alpha"]]));
    let files: Vec<_> = std::fs::read_dir(root.join("db"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with("db.sqlite") && n != "assets")
        .collect();
    assert!(files.is_empty(), "{files:?}");
    assert_eq!(outside_the_run(root), before);
}

/// The operator approves one local service, `--allow-host 127.0.0.1:PORT`; a step listing
/// `127.0.0.1` (any port) reaches that service and no other service of the machine.
#[test]
fn an_allow_host_with_a_port_approves_that_port_only() {
    let service = Server::start(None);
    let other = Server::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (approved, elsewhere) = (service.url("/ok"), other.url("/ok"));
    workspace(
        root,
        json!(["127.0.0.1"]),
        &format!(
            "attempt(\"approved\", lambda: trellis_http.get(\"{approved}\"))\n\
             attempt(\"other_port\", lambda: trellis_http.get(\"{elsewhere}\"))\ndone()\n"
        ),
    );
    let before = prepared(root);
    let host = format!("127.0.0.1:{}", service.port());
    let out = script(root, &["--allow-host", &host], &[]);
    let result = result(root, &out);
    assert_eq!(result["approved"], "ok 200", "{result}");
    assert!(refused(&result["other_port"]), "{result}");
    assert!(
        result["other_port"]
            .as_str()
            .unwrap()
            .contains("--allow-host 127.0.0.1"),
        "{result}"
    );
    assert_eq!(service.received().len(), 1);
    assert!(other.received().is_empty(), "{:?}", other.received());
    assert_eq!(outside_the_run(root), before);
}

/// Refused requests in a loop: each one is a warning in the host's log and a line in its
/// memory. They count toward the 1,000 requests of a run, so the loop ends there and the
/// host logs a bounded number of lines.
#[test]
fn refused_requests_count_toward_the_limit_so_a_loop_of_them_cannot_flood_the_host() {
    let server = Server::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let ok = server.url("/ok");
    workspace(
        root,
        json!(["127.0.0.1"]),
        &format!(
            r#"refused = 0
for i in range(5000):
    try:
        trellis_http.get("http://localhost:9/x")
    except trellis_http.HttpError as e:
        refused += 1
        RESULT["last"] = str(e)
RESULT["refused"] = refused
attempt("allowed", lambda: trellis_http.get("{ok}"))
done()
"#
        ),
    );
    let before = prepared(root);
    let out = script(root, &["--allow-host", "127.0.0.1"], &[]);
    let result = result(root, &out);
    assert_eq!(result["refused"], 5000, "{result}");
    let last = result["last"].as_str().unwrap();
    assert!(last.contains("more than 1000 requests"), "{last}");
    assert!(failed(&result["allowed"]), "{result}");
    assert!(server.received().is_empty());
    // The host's own log: at most one line per request counted, and one for the limit.
    let log = text(&out.stderr);
    let lines = log.lines().filter(|l| l.contains("WARN")).count();
    assert!(lines <= 1001, "{lines} warnings");
    assert_eq!(outside_the_run(root), before);
}

/// Refused requests with 60 KB URLs (a user name in them, or an unlisted host of 60 KB): what
/// the host logs and keeps of each refusal is bounded, not the whole URL.
#[test]
fn a_refused_request_with_a_huge_url_is_logged_in_a_bounded_line() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        json!(["127.0.0.1"]),
        r#"long = "a" * 60000
for i in range(500):
    attempt("userinfo", lambda: trellis_http.get("http://u@127.0.0.1:9/" + long))
    attempt("host", lambda: trellis_http.get("http://" + long[:250] + ".example/" + long))
done()
"#,
    );
    let before = prepared(root);
    let out = script(root, &["--allow-host", "127.0.0.1"], &[]);
    let result = result(root, &out);
    assert!(refused(&result["userinfo"]), "{result}");
    assert!(refused(&result["host"]), "{result}");
    let log = text(&out.stderr);
    let warnings = log.lines().filter(|l| l.contains("WARN")).count();
    assert_eq!(warnings, 1000, "one line per refusal");
    assert!(log.len() < 1 << 20, "{} bytes of log", log.len());
    assert_eq!(outside_the_run(root), before);
}
