//! Scripted fetchers through `trellis run`: a step script's HTTP(S) requests to its step's
//! `allowed_hosts` (a server on 127.0.0.1 the test starts, approved with `--allow-host`),
//! secrets as placeholders the host substitutes for approved origins only, and the attacks
//! on that capability (an unlisted host, loopback without approval, a redirect to another
//! host, a secret to an unapproved origin, an oversized body, a name resolving to a private
//! address), each checking that nothing was sent and nothing else changed. Then scripts
//! written for the original: `sqlite3.connect(DB_PATH)`, `learnings/<id>/main.py`,
//! `context_dependencies` as `argv`, a non-zero exit whose outputs pass the gate, a missing
//! script written by an agent turn, and `lock_code` falling back to an agentic run.

use crate::support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::workspace::{read_json, write_file};
use support::{tree_digest, trellis_command};

const STEP: &str = "fetch";
const OUT: &str = "runs/iteration-0/execution/fetch";

/// One request the API server saw: its path and `Authorization` header.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    path: String,
    authorization: Option<String>,
}

/// A small HTTP/1.1 server on 127.0.0.1: `/items.json` answers a JSON list, `/redirect`
/// sends the client to `redirect_to`, `/big` declares a 64 MiB body, `/echo` answers the
/// `Authorization` it got; every request is recorded.
struct ApiServer {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl ApiServer {
    fn start(redirect_to: Option<String>) -> ApiServer {
        ApiServer::serving(redirect_to, Vec::new())
    }

    /// Like [`ApiServer::start`], also answering each `(path, body)` of `files`.
    fn serving(redirect_to: Option<String>, files: Vec<(String, String)>) -> ApiServer {
        let files = Arc::new(files);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let log = log.clone();
                let redirect_to = redirect_to.clone();
                let files = files.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
                    let (mut length, mut authorization) = (0usize, None);
                    loop {
                        let mut header = String::new();
                        if reader.read_line(&mut header).unwrap_or(0) == 0 {
                            break;
                        }
                        let header = header.trim_end();
                        if header.is_empty() {
                            break;
                        }
                        if let Some((name, value)) = header.split_once(':') {
                            if name.eq_ignore_ascii_case("content-length") {
                                length = value.trim().parse().unwrap_or(0);
                            } else if name.eq_ignore_ascii_case("authorization") {
                                authorization = Some(value.trim().to_string());
                            }
                        }
                    }
                    let mut body = vec![0; length.min(1 << 20)];
                    let _ = reader.read_exact(&mut body);
                    log.lock().unwrap().push(Seen {
                        path: path.clone(),
                        authorization: authorization.clone(),
                    });
                    let mut stream = stream;
                    let reply = |status: &str, extra: &str, body: &str| {
                        format!(
                            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    };
                    let file = files.iter().find(|(p, _)| *p == path);
                    let out = match path.as_str() {
                        _ if file.is_some() => reply("200 OK", "", &file.unwrap().1),
                        "/items.json" => reply(
                            "200 OK",
                            "",
                            r#"[{"id": 1, "name": "alpha"}, {"id": 2, "name": "beta"}]"#,
                        ),
                        "/redirect" => reply(
                            "302 Found",
                            &format!("location: {}\r\n", redirect_to.unwrap_or_default()),
                            "",
                        ),
                        "/echo" => reply(
                            "200 OK",
                            "",
                            &json!({"authorization": authorization}).to_string(),
                        ),
                        "/big" => {
                            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 67108864\r\nconnection: close\r\n\r\n";
                            let _ = stream.write_all(head.as_bytes());
                            let chunk = vec![b' '; 1 << 20];
                            for _ in 0..64 {
                                if stream.write_all(&chunk).is_err() {
                                    break;
                                }
                            }
                            return;
                        }
                        _ => reply("404 Not Found", "", "{}"),
                    };
                    let _ = stream.write_all(out.as_bytes());
                });
            }
        });
        ApiServer { addr, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Fetches `URL` (first argument after the step's dependencies: an environment variable)
/// and writes its items into the `items` table and `fetched.json`.
const FETCHER: &str = r#"import json, os, sqlite3, trellis_http
items = trellis_http.get_json(os.environ["VAR_URL"])
db = sqlite3.connect(os.environ["DB_PATH"])
db.executemany("INSERT INTO items (id, name) VALUES (?, ?)", [(i["id"], i["name"]) for i in items])
db.commit()
with open(os.path.join(os.environ["STEP_OUTPUT_DIR"], "fetched.json"), "w") as f:
    json.dump({"count": len(items)}, f)
print("fetched", len(items))
"#;

/// A workspace with the scripted step `fetch` (`script` in `code/fetch/main.py`), an `items`
/// table, a gate wanting `fetched.json` with `count` >= 1, and the variable `url`.
fn workspace(root: &Path, script: &str, agent_configs: Value, url: &str) {
    let write = |rel: &str, text: &str| write_file(root, rel, text);
    write(
        "planning/plan.json",
        &json!({"objective": "fetch items", "steps": [{
            "id": STEP, "type": "regular", "title": "Fetch", "description": "Fetch the items.",
            "context_output": ["fetched.json"],
            "validation_schema": {"files": [{"file_name": "fetched.json", "must_exist": true,
                "json_checks": [{"path": "$.count", "min_value": 1}]}]}
        }]})
        .to_string(),
    );
    let mut configs = json!({"declared_execution_mode": "scripted", "lock_code": true});
    for (k, v) in agent_configs.as_object().unwrap() {
        configs[k] = v.clone();
    }
    write(
        "planning/step_config.json",
        &json!({"steps": [{"id": STEP, "agent_configs": configs}]}).to_string(),
    );
    write(
        "workflow.json",
        &json!({"variables": {"url": url}}).to_string(),
    );
    write(&format!("code/{STEP}/main.py"), script);
    write(
        "db/seed.sql",
        "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT);\n",
    );
}

use crate::support::plugin_build::text;

/// `trellis run WS --step fetch` with `args` and `env`; its output.
fn run(root: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut all = vec!["run", root.to_str().unwrap(), "--step", STEP];
    all.extend_from_slice(args);
    let mut command = trellis_command(&all);
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("the trellis binary runs")
}

/// The rows of `items`.
fn items(root: &Path) -> Vec<(i64, String)> {
    let db = rusqlite::Connection::open(root.join("db/db.sqlite")).unwrap();
    let mut stmt = db
        .prepare("SELECT id, name FROM items ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Everything in the workspace but the logs and the step's session bookkeeping: what a
/// refused request must leave as it was.
fn state(root: &Path) -> BTreeMap<String, String> {
    tree_digest(root)
        .into_iter()
        .filter(|(k, _)| !k.starts_with("runs/iteration-0/logs"))
        .filter(|(k, _)| {
            !k.starts_with(OUT)
                || !["session.json", "execution-final-summary.json"]
                    .iter()
                    .any(|f| k.ends_with(f))
        })
        .collect()
}

/// The script's stderr of the last run.
fn script_stderr(root: &Path) -> String {
    std::fs::read_to_string(root.join("runs/iteration-0/logs/fetch/script-stderr.txt"))
        .unwrap_or_default()
}

/// Runs once with a script that does nothing, so the database exists and a later run's
/// changes show against it.
fn prepared(root: &Path) -> BTreeMap<String, String> {
    let script = std::fs::read_to_string(root.join("code/fetch/main.py")).unwrap();
    write_file(root, "code/fetch/main.py", "print('nothing')\n");
    let out = run(root, &[], &[]);
    assert!(!out.status.success(), "the gate fails with no fetched.json");
    write_file(root, "code/fetch/main.py", script);
    std::fs::remove_dir_all(root.join("runs/iteration-0/logs")).unwrap();
    state(root)
}

/// Asserts a refused run: the step failed with `reason` in the script's error, the server
/// got nothing, and nothing changed but the logs.
fn assert_refused(
    root: &Path,
    before: &BTreeMap<String, String>,
    out: &std::process::Output,
    reason: &str,
) {
    let stdout = text(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    let stderr = script_stderr(root);
    // Every refusal reaches the script as the module's own exception.
    assert!(stderr.contains("trellis_http.RequestRefused: "), "{stderr}");
    assert!(stderr.contains(reason), "{stderr}");
    assert_eq!(
        &state(root),
        before,
        "a refused request changed the workspace"
    );
    assert!(items(root).is_empty());
}

#[test]
fn a_scripted_fetcher_pulls_json_from_an_allowed_host_into_db_rows() {
    let server = ApiServer::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        FETCHER,
        json!({"allowed_hosts": ["127.0.0.1"]}),
        &server.url("/items.json"),
    );
    let out = run(root, &["--allow-host", "127.0.0.1"], &[]);
    assert!(
        out.status.success(),
        "{}\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr),
        script_stderr(root)
    );
    assert_eq!(items(root), [(1, "alpha".into()), (2, "beta".into())]);
    assert_eq!(
        read_json(&root.join(OUT).join("fetched.json")),
        json!({"count": 2})
    );
    assert_eq!(
        server.seen(),
        [Seen {
            path: "/items.json".into(),
            authorization: None
        }]
    );
}

#[test]
fn a_step_with_no_allowed_hosts_has_no_network() {
    let server = ApiServer::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, FETCHER, json!({}), &server.url("/items.json"));
    let before = prepared(root);
    let out = run(root, &["--allow-host", "127.0.0.1"], &[]);
    assert_refused(root, &before, &out, "the host refused the request");
    assert!(server.seen().is_empty());
}

#[test]
fn a_host_not_in_allowed_hosts_is_refused_before_a_byte_is_sent() {
    let server = ApiServer::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        FETCHER,
        json!({"allowed_hosts": ["api.example.com"]}),
        &server.url("/items.json"),
    );
    let before = prepared(root);
    let out = run(root, &["--allow-host", "127.0.0.1"], &[]);
    assert_refused(
        root,
        &before,
        &out,
        "host 127.0.0.1 is not in this step's agent_configs.allowed_hosts",
    );
    assert!(server.seen().is_empty());
}

#[test]
fn loopback_needs_the_operators_allow_host() {
    let server = ApiServer::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        FETCHER,
        json!({"allowed_hosts": ["127.0.0.1"]}),
        &server.url("/items.json"),
    );
    let before = prepared(root);
    let out = run(root, &[], &[]);
    assert_refused(root, &before, &out, "--allow-host 127.0.0.1");
    assert!(server.seen().is_empty());
}

#[test]
fn a_name_resolving_to_a_private_address_needs_the_operators_allow_host() {
    // This machine's own name resolves to one of its addresses: loopback, or a private one
    // on most networks. A workspace listing it reaches local services by name, not number.
    let mut name = vec![0u8; 256];
    // SAFETY: a writable buffer of the length given.
    assert_eq!(
        unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) },
        0
    );
    let name = text(&name).trim_end_matches('\0').to_string();
    let resolved: Vec<std::net::IpAddr> =
        std::net::ToSocketAddrs::to_socket_addrs(&(name.as_str(), 80))
            .map(|a| a.map(|a| a.ip()).collect())
            .unwrap_or_default();
    let private = |ip: &std::net::IpAddr| match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback() || v4.is_private() || v4.is_link_local(),
        std::net::IpAddr::V6(v6) => v6.is_loopback(),
    };
    if !resolved.iter().any(private) {
        support::skip(&format!(
            "this machine's name {name:?} resolves to no private address"
        ));
        return;
    }
    let server = ApiServer::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let url = format!("http://{name}:{}/items.json", server.port());
    workspace(
        root,
        FETCHER,
        json!({"allowed_hosts": [name.clone()]}),
        &url,
    );
    let before = prepared(root);
    // Loopback approved by number does not approve a name resolving to it.
    let out = run(root, &["--allow-host", "127.0.0.1"], &[]);
    assert_refused(
        root,
        &before,
        &out,
        &format!("--allow-host {}", name.to_ascii_lowercase()),
    );
    assert!(server.seen().is_empty());
}

#[test]
fn a_redirect_to_another_host_is_not_followed() {
    // The second server is reached through `localhost`, a host the step does not list.
    let elsewhere = ApiServer::start(None);
    let server = ApiServer::start(Some(format!(
        "http://localhost:{}/items.json",
        elsewhere.port()
    )));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        FETCHER,
        json!({"allowed_hosts": ["127.0.0.1"]}),
        &server.url("/redirect"),
    );
    let before = prepared(root);
    let out = run(
        root,
        &["--allow-host", "127.0.0.1", "--allow-host", "localhost"],
        &[],
    );
    assert_refused(
        root,
        &before,
        &out,
        "host localhost is not in this step's agent_configs.allowed_hosts",
    );
    assert_eq!(server.seen().len(), 1, "the first request went out");
    assert!(elsewhere.seen().is_empty(), "the redirect was not followed");
}

#[test]
fn a_redirect_within_the_allowed_host_is_followed() {
    let target = ApiServer::start(None);
    // Both servers are on 127.0.0.1, the one host the step lists.
    let server = ApiServer::start(Some(target.url("/items.json")));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        FETCHER,
        json!({"allowed_hosts": ["127.0.0.1"]}),
        &server.url("/redirect"),
    );
    let out = run(root, &["--allow-host", "127.0.0.1"], &[]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        script_stderr(root)
    );
    assert_eq!(items(root), [(1, "alpha".into()), (2, "beta".into())]);
    assert_eq!(server.seen().len(), 1);
    assert_eq!(target.seen().len(), 1);
}

#[test]
fn an_oversized_response_body_is_refused() {
    let server = ApiServer::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        FETCHER,
        json!({"allowed_hosts": ["127.0.0.1"]}),
        &server.url("/big"),
    );
    let before = prepared(root);
    let out = run(root, &["--allow-host", "127.0.0.1"], &[]);
    let stdout = text(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    let stderr = script_stderr(root);
    assert!(stderr.contains("HttpResponseBodySize"), "{stderr}");
    assert_eq!(state(root), before);
    assert!(items(root).is_empty());
}

#[test]
fn an_oversized_request_body_is_refused_before_it_is_sent() {
    let server = ApiServer::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let script = "import os, trellis_http\n\
                  trellis_http.post(os.environ['VAR_URL'], data=b'x' * (33 << 20))\n";
    workspace(
        root,
        script,
        json!({"allowed_hosts": ["127.0.0.1"]}),
        &server.url("/echo"),
    );
    let before = prepared(root);
    let out = run(root, &["--allow-host", "127.0.0.1"], &[]);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let stderr = script_stderr(root);
    assert!(
        stderr.contains(
            "the script sent a request body of 34603008 bytes, over the limit of 33554432 bytes"
        ),
        "{stderr}"
    );
    assert_eq!(state(root), before);
    assert!(server.seen().is_empty());
}

/// Sends the secret's placeholder in `Authorization` and writes what the server echoed.
const SECRET_SCRIPT: &str = r#"import json, os, trellis_http
token = os.environ["SECRET_API_TOKEN"]
print("token seen by the script:", token)
reply = trellis_http.get_json(os.environ["VAR_URL"], headers={"Authorization": f"Bearer {token}"})
print("the server echoed:", reply["authorization"])
with open(os.path.join(os.environ["STEP_OUTPUT_DIR"], "fetched.json"), "w") as f:
    json.dump({"count": 1, "echo_is_secret": reply["authorization"] == "Bearer s3cret-value"}, f)
"#;

#[test]
fn a_secret_goes_only_to_the_origin_the_operator_approved_for_it() {
    let server = ApiServer::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        SECRET_SCRIPT,
        json!({"allowed_hosts": ["127.0.0.1"]}),
        &server.url("/echo"),
    );
    let env = [("SECRET_API_TOKEN", "s3cret-value")];

    // Not approved for this origin: refused before anything is sent.
    let before = prepared(root);
    let out = run(root, &["--allow-host", "127.0.0.1"], &env);
    assert_refused(
        root,
        &before,
        &out,
        &format!(
            "the secret in SECRET_API_TOKEN is not approved for http://127.0.0.1:{}",
            server.port()
        ),
    );
    assert!(server.seen().is_empty());

    // Approved: the server gets the secret, the script only ever held the placeholder.
    let origin = format!("SECRET_API_TOKEN=http://127.0.0.1:{}", server.port());
    let out = run(
        root,
        &["--allow-host", "127.0.0.1", "--allow-key", &origin],
        &env,
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        script_stderr(root)
    );
    assert_eq!(
        server.seen(),
        [Seen {
            path: "/echo".into(),
            authorization: Some("Bearer s3cret-value".into())
        }]
    );
    let stdout =
        std::fs::read_to_string(root.join("runs/iteration-0/logs/fetch/script-stdout.txt"))
            .unwrap();
    assert!(
        stdout.contains("token seen by the script: trellis-secret:SECRET_API_TOKEN"),
        "{stdout}"
    );
    // What the approved server echoed back is hidden in the script's logs too.
    assert!(
        stdout.contains("the server echoed: Bearer [REDACTED]"),
        "{stdout}"
    );
    assert!(!stdout.contains("s3cret-value"), "{stdout}");
}

// Scripts written for the original.

/// Reads and writes the database through `sqlite3`, as scripts of the original do.
const SQLITE_SCRIPT: &str = r#"import json, os, sqlite3
conn = sqlite3.connect(os.environ["DB_PATH"])
cur = conn.cursor()
cur.executemany("INSERT INTO items (id, name) VALUES (?, ?)", [(1, "alpha"), (2, "beta")])
cur.execute("INSERT INTO items (name) VALUES (:name)", {"name": "gamma"})
last = cur.lastrowid
conn.commit()
conn.row_factory = sqlite3.Row
row = conn.execute("SELECT name, id FROM items WHERE id = ?", (2,)).fetchone()
names = [r[0] for r in conn.execute("SELECT name FROM items ORDER BY id").fetchall()]
cur = conn.execute("SELECT name, id FROM items ORDER BY id")
columns = [d[0] for d in cur.description]
with open(os.path.join(os.environ["STEP_OUTPUT_DIR"], "fetched.json"), "w") as f:
    json.dump({"count": len(names), "names": names, "row": [row["name"], row["id"]],
               "tuple": list(row), "last": last, "columns": columns}, f)
conn.close()
"#;

#[test]
fn sqlite3_connect_db_path_reads_and_writes_through_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, SQLITE_SCRIPT, json!({}), "");
    let out = run(root, &[], &[]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        script_stderr(root)
    );
    assert_eq!(
        read_json(&root.join(OUT).join("fetched.json")),
        json!({"count": 3, "names": ["alpha", "beta", "gamma"], "row": ["beta", 2],
               "tuple": ["beta", 2], "last": 3, "columns": ["name", "id"]})
    );
    assert_eq!(
        items(root),
        [(1, "alpha".into()), (2, "beta".into()), (3, "gamma".into())]
    );
}

/// Writes the first argument's text into `fetched.json`, with `argv`.
const ARGV_SCRIPT: &str = r#"import json, os, sys
with open(sys.argv[1]) as f:
    text = f.read().strip()
with open(os.path.join(os.environ["STEP_OUTPUT_DIR"], "fetched.json"), "w") as f:
    json.dump({"count": 1, "argv": sys.argv, "text": text}, f)
"#;

#[test]
fn a_script_under_learnings_runs_there_with_its_dependencies_as_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, ARGV_SCRIPT, json!({}), "");
    // Where the original keeps the script; dependencies in plan order.
    std::fs::remove_dir_all(root.join("code")).unwrap();
    write_file(root, "learnings/fetch/main.py", ARGV_SCRIPT);
    write_file(root, "knowledge/emea.md", "regional notes\n");
    write_file(root, "knowledge/all.md", "all\n");
    let mut plan = read_json(&root.join("planning/plan.json"));
    plan["steps"][0]["context_dependencies"] = json!(["knowledge/emea.md", "knowledge/all.md"]);
    write_file(root, "planning/plan.json", plan.to_string());

    let out = run(root, &[], &[]);
    assert!(
        out.status.success(),
        "{}\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr),
        script_stderr(root)
    );
    assert_eq!(
        read_json(&root.join(OUT).join("fetched.json")),
        json!({"count": 1, "argv": ["main.py", "/knowledge/emea.md", "/knowledge/all.md"],
               "text": "regional notes"})
    );
    let result = read_json(&root.join("runs/iteration-0/logs/fetch/script-result.json"));
    assert_eq!(result["script"], "learnings/fetch/main.py");
    let warning = result["warning"].as_str().unwrap();
    assert!(
        warning.contains("code/fetch/main.py is absent")
            && warning.contains("learnings/fetch/main.py")
            && warning.contains("move it to code/fetch/main.py"),
        "{warning}"
    );
    // Run in place, never moved.
    assert!(root.join("learnings/fetch/main.py").is_file());
    assert!(!root.join("code").exists());
    let checked = trellis_command(&["validate", root.to_str().unwrap()])
        .output()
        .unwrap();
    let said = text(&checked.stdout) + &text(&checked.stderr);
    assert!(
        said.contains("the script is at learnings/fetch/main.py")
            && said.contains("move it to code/fetch/main.py"),
        "{said}"
    );
}

#[test]
fn a_scripts_arguments_have_the_workflow_variables_substituted() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, ARGV_SCRIPT, json!({}), "");
    write_file(root, "knowledge/emea.md", "regional notes\n");
    let mut manifest = read_json(&root.join("workflow.json"));
    manifest["variables"] = json!({"REGION": "emea"});
    write_file(root, "workflow.json", manifest.to_string());
    let mut plan = read_json(&root.join("planning/plan.json"));
    plan["steps"][0]["context_dependencies"] = json!(["knowledge/{{REGION}}.md"]);
    write_file(root, "planning/plan.json", plan.to_string());

    let out = run(root, &[], &[]);
    assert!(
        out.status.success(),
        "{}\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr),
        script_stderr(root)
    );
    assert_eq!(
        read_json(&root.join(OUT).join("fetched.json")),
        json!({"count": 1, "argv": ["main.py", "/knowledge/emea.md"], "text": "regional notes"})
    );
}

#[test]
fn a_non_zero_exit_whose_outputs_pass_the_gate_counts_as_success() {
    let script = "import json, os, sys\n\
                  with open(os.path.join(os.environ['STEP_OUTPUT_DIR'], 'fetched.json'), 'w') as f:\n    \
                  json.dump({'count': 2}, f)\n\
                  sys.exit(3)\n";
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, script, json!({}), "");
    let out = run(root, &[], &[]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        script_stderr(root)
    );
    let summary = read_json(&root.join(OUT).join("execution-final-summary.json"));
    assert_eq!(summary["status"], "completed");
    let result = summary["execution_result"].as_str().unwrap();
    assert!(
        result.contains("exited with status 3") && result.contains("counted as a success"),
        "{result}"
    );
    let record = read_json(&root.join("runs/iteration-0/logs/fetch/script-result.json"));
    assert_eq!(record["exit_code"], 3);
}

/// `(entry_id, status)` of every session entry of the step.
fn entries(root: &Path) -> Vec<(String, String)> {
    let session = read_json(&root.join(OUT).join("session.json"));
    session["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["entry_id"].as_str().unwrap().to_string(),
                e["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// An agent that answers the first turn by writing `path` with `content`, then replies.
fn writing_agent(path: &'static str, content: &'static str) -> FakeServer {
    FakeServer::start(Box::new(move |body| {
        let answered = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "tool");
        if answered {
            (200, completion("Done.", &[]))
        } else {
            let args = json!({"path": path, "content": content});
            (200, completion("", &[("workspace__write_file", args)]))
        }
    }))
}

const COUNT_SCRIPT: &str = "import json, os\n\
    with open(os.path.join(os.environ['STEP_OUTPUT_DIR'], 'fetched.json'), 'w') as f:\n    \
    json.dump({'count': 5}, f)\n";

#[test]
fn a_scripted_step_with_no_script_gets_a_turn_that_writes_it() {
    let agent = writing_agent("code/fetch/main.py", COUNT_SCRIPT);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        "",
        json!({"lock_code": false, "selected_tools": ["workspace:write_file"]}),
        "",
    );
    std::fs::remove_dir_all(root.join("code")).unwrap();
    let mut manifest = read_json(&root.join("workflow.json"));
    manifest["llm"] = json!({"provider": "openai", "model_id": "writer"});
    manifest["providers"] = agent.providers();
    write_file(root, "workflow.json", manifest.to_string());

    let out = run(root, &["--allow-host", &agent.allow_host()], &[]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(root.join("code/fetch/main.py")).unwrap(),
        COUNT_SCRIPT
    );
    assert_eq!(
        read_json(&root.join(OUT).join("fetched.json")),
        json!({"count": 5})
    );
    assert_eq!(
        entries(root),
        [
            ("script-write".to_string(), "completed".to_string()),
            ("script-1".to_string(), "completed".to_string())
        ]
    );
    let ask = agent.seen()[0]["messages"].to_string();
    assert!(ask.contains("has no script yet"), "{ask}");
}

#[test]
fn lock_code_with_a_failing_script_runs_the_step_agentically() {
    let agent = writing_agent(
        "runs/iteration-0/execution/fetch/fetched.json",
        "{\"count\": 7}",
    );
    let broken = "raise RuntimeError('the API changed')\n";
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        broken,
        json!({"selected_tools": ["workspace:write_file"]}),
        "",
    );
    let mut manifest = read_json(&root.join("workflow.json"));
    manifest["llm"] = json!({"provider": "openai", "model_id": "agent"});
    manifest["providers"] = agent.providers();
    write_file(root, "workflow.json", manifest.to_string());

    let out = run(root, &["--allow-host", &agent.allow_host()], &[]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    // The script is not rewritten; the agent did the step.
    assert_eq!(
        std::fs::read_to_string(root.join("code/fetch/main.py")).unwrap(),
        broken
    );
    assert_eq!(
        read_json(&root.join(OUT).join("fetched.json")),
        json!({"count": 7})
    );
    let ids: Vec<String> = entries(root).into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids[..2], ["script-1", "script-agentic-fallback"]);
    assert!(ids.contains(&"execute-and-verify".to_string()), "{ids:?}");
    let session = read_json(&root.join(OUT).join("session.json")).to_string();
    assert!(
        session.contains("Running step \\\"fetch\\\" agentically instead"),
        "{session}"
    );
    assert!(
        session.contains("RuntimeError: the API changed"),
        "{session}"
    );
}

#[test]
fn the_api_fetcher_example_stores_the_releases_its_local_api_serves() {
    // The example's API is its committed api/releases.json, served here as the README
    // serves it with `python3 -m http.server`; the run stays on this machine.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/api-fetcher");
    let releases = std::fs::read_to_string(example.join("api/releases.json")).unwrap();
    let server = ApiServer::serving(None, vec![("/releases.json".into(), releases)]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    support::workspace::copy_workspace(&example, root, &["runs", "db.sqlite"]);
    let mut manifest = read_json(&root.join("workflow.json"));
    manifest["variables"]["api_url"]["value"] = json!(server.url("/releases.json"));
    write_file(root, "workflow.json", manifest.to_string());

    let out = trellis_command(&[
        "run",
        root.to_str().unwrap(),
        "--step",
        "fetch-releases",
        "--allow-host",
        "127.0.0.1",
    ])
    .output()
    .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("0 LLM calls"), "{stdout}");
    let db = rusqlite::Connection::open(root.join("db/db.sqlite")).unwrap();
    let rows: Vec<(String, i64)> = db
        .prepare("SELECT version, breaking FROM releases ORDER BY released_on DESC")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        rows,
        [
            ("2.3.0".to_string(), 0),
            ("2.2.1".to_string(), 0),
            ("2.2.0".to_string(), 1),
            ("2.1.0".to_string(), 0)
        ]
    );
    let fetched = read_json(&root.join("runs/iteration-0/execution/fetch-releases/fetched.json"));
    assert_eq!(fetched["count"], 4);
    assert_eq!(fetched["source"], json!(server.url("/releases.json")));
    assert_eq!(server.seen().len(), 1);
}

#[test]
fn the_api_fetcher_example_runs_whole_and_its_summary_reads_the_rows_through_the_db_tool() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/api-fetcher");
    let releases = std::fs::read_to_string(example.join("api/releases.json")).unwrap();
    let api = ApiServer::serving(None, vec![("/releases.json".into(), releases)]);
    // The summarizing agent: query the rows, write the summary, answer.
    let query =
        "SELECT version, released_on, breaking, notes FROM releases ORDER BY released_on DESC";
    let replies = [
        completion("", &[("query_workflow_db", json!({"sql": query}))]),
        completion(
            "",
            &[(
                "workspace__write_file",
                json!({"path": "runs/iteration-0/execution/summarize/release_summary.md",
                       "content": "# Releases\n\n## Breaking changes\n- 2.2.0\n"}),
            )],
        ),
        completion("Wrote release_summary.md.", &[]),
    ];
    let next = std::sync::atomic::AtomicUsize::new(0);
    let llm = FakeServer::start(Box::new(move |_| {
        let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        (
            200,
            replies
                .get(i)
                .cloned()
                .unwrap_or_else(|| completion("extra", &[])),
        )
    }));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    support::workspace::copy_workspace(&example, root, &["runs", "db.sqlite"]);
    let mut manifest = read_json(&root.join("workflow.json"));
    manifest["variables"]["api_url"]["value"] = json!(api.url("/releases.json"));
    manifest["llm"] = json!({"provider": "openai", "model_id": "summarizer"});
    manifest["providers"] = llm.providers();
    write_file(root, "workflow.json", manifest.to_string());

    let out = trellis_command(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("step summarize: completed"), "{stdout}");
    // The rows the script stored reached the agent through query_workflow_db.
    let seen = llm.seen();
    assert_eq!(seen.len(), 3, "{seen:?}");
    let tool_result = seen[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect::<String>();
    for version in ["2.3.0", "2.2.1", "2.2.0", "2.1.0"] {
        assert!(tool_result.contains(version), "{tool_result}");
    }
    let summary = std::fs::read_to_string(
        root.join("runs/iteration-0/execution/summarize/release_summary.md"),
    )
    .unwrap();
    assert!(summary.contains("Breaking changes"), "{summary}");
    assert_eq!(api.seen().len(), 1);
}

#[test]
fn a_main_wasm_reaches_allowed_hosts_through_wasi_http_and_nothing_else() {
    let server = ApiServer::start(None);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, "", json!({"allowed_hosts": ["127.0.0.1"]}), "");
    std::fs::remove_file(root.join("code/fetch/main.py")).unwrap();
    std::fs::copy(
        trellis_test_programs::path("script_probe"),
        root.join("code/fetch/main.wasm"),
    )
    .unwrap();
    let probe = |url: &str, args: &[&str]| {
        let mut manifest = read_json(&root.join("workflow.json"));
        manifest["variables"] = json!({"http_get": url});
        write_file(root, "workflow.json", manifest.to_string());
        // The probe writes no fetched.json: the gate fails, and that is not what is tested.
        let _ = run(root, args, &[]);
        read_json(&root.join(OUT).join("probe.json"))["http_get"].clone()
    };
    let allowed = probe(&server.url("/items.json"), &["--allow-host", "127.0.0.1"]);
    assert_eq!(allowed["status"], 200, "{allowed}");
    assert!(
        allowed["body"].as_str().unwrap().contains("alpha"),
        "{allowed}"
    );
    assert_eq!(server.seen().len(), 1);

    // Loopback without the operator's approval, and a host the step does not list.
    let refused = probe(&server.url("/items.json"), &[]);
    assert!(
        refused["err"]
            .as_str()
            .unwrap()
            .contains("--allow-host 127.0.0.1"),
        "{refused}"
    );
    let elsewhere = format!("http://localhost:{}/items.json", server.port());
    let refused = probe(
        &elsewhere,
        &["--allow-host", "127.0.0.1", "--allow-host", "localhost"],
    );
    assert!(
        refused["err"]
            .as_str()
            .unwrap()
            .contains("host localhost is not in this step's agent_configs.allowed_hosts"),
        "{refused}"
    );
    assert_eq!(
        server.seen().len(),
        1,
        "the refused requests were never sent"
    );
}

#[test]
fn an_allowed_hosts_entry_that_is_not_a_host_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        FETCHER,
        json!({"allowed_hosts": ["api.example.com", "https://api.example.com/v1", "h:99999"]}),
        "",
    );
    let out = trellis_command(&["validate", root.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = text(&out.stdout) + &text(&out.stderr);
    for (i, entry) in [(1, "https://api.example.com/v1"), (2, "h:99999")] {
        assert!(
            said.contains(&format!(
                "planning/step_config.json: steps[0].agent_configs.allowed_hosts[{i}] (step \"fetch\"): expected a host name or IP address, optionally with :port (such as \"api.example.com\"), found \"{entry}\""
            )),
            "{said}"
        );
    }
    assert!(!said.contains("allowed_hosts[0]"), "{said}");
}
