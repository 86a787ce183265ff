//! Step scripts in the sandbox: real Python scripts in the Python script runner built from
//! source, a real Rust `wasi:cli` command as `main.wasm`, real SQLite files.
//!
//! Every escape attempt asserts the denial *and* that nothing outside the grant changed
//! (the workspace is hashed before and after, the step's output folder and logs aside).

use crate::support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};
use support::tree_digest;
use support::workspace::{read_json, write_file};
use trellis_runner::grants::TurnAccess;
use trellis_runner::step_script::{self, ScriptOptions};
use trellis_sandbox::Limits;
use trellis_sandbox::script::{ScriptFailure, ScriptKind, ScriptOutcome, ScriptRunner};
use trellis_workflow::Workspace;

const STEP: &str = "fetch";

/// One runner per test binary: the Python runner is compiled (or read from the cache) once.
fn runner() -> &'static ScriptRunner {
    static RUNNER: OnceLock<ScriptRunner> = OnceLock::new();
    RUNNER.get_or_init(|| ScriptRunner::new(support::engine()).expect("script runner"))
}

/// A workspace with one scripted step `fetch`, a database with a `tickets` table, a
/// knowledgebase, a secret outside the workspace, and an earlier step's output.
struct World {
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        let write = |rel: &str, text: &str| write_file(&root, rel, text);
        write(
            "planning/plan.json",
            &json!({"steps": [
                {"id": "earlier", "type": "regular", "title": "Earlier", "description": "d", "next_step_id": STEP},
                {"id": STEP, "type": "regular", "title": "Fetch", "description": "Fetch the tickets.",
                 "context_output": ["tickets.json"], "next_step_id": "end"}
            ]})
            .to_string(),
        );
        write(
            "planning/step_config.json",
            &json!({"steps": [{"id": STEP, "agent_configs": {"declared_execution_mode": "scripted"}}]})
                .to_string(),
        );
        write(
            "workflow.json",
            &json!({"version": "1.0.11",
                    "variables": {"region": "emea", "max_items": {"value": "3"}},
                    "groups": [{"id": "nordics", "variables": {"region": "nordics"}}]})
            .to_string(),
        );
        write("knowledgebase/notes/a.md", "a note\n");
        write("code/other/main.py", "print('other step')\n");
        write("code/fetch/input.txt", "input beside the script\n");
        write(
            "runs/iteration-0/execution/earlier/out.json",
            "{\"n\": 1}\n",
        );
        write("../outside/secret.txt", "outside secret\n");
        let db = rusqlite::Connection::open(root.join("db/db.sqlite")).unwrap_or_else(|_| {
            std::fs::create_dir_all(root.join("db")).unwrap();
            rusqlite::Connection::open(root.join("db/db.sqlite")).unwrap()
        });
        db.execute_batch(
            "CREATE TABLE tickets (id INTEGER PRIMARY KEY, subject TEXT, status TEXT);
             INSERT INTO tickets VALUES (1, 'Refund', 'open'), (2, 'Login', 'open'), (3, 'Spam', 'closed');",
        )
        .unwrap();
        drop(db);
        World { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    fn script(&self, source: &str) -> &Self {
        std::fs::write(self.root().join("code/fetch/main.py"), source).unwrap();
        self
    }

    fn workspace(&self) -> Workspace {
        Workspace::open(self.root()).unwrap_or_else(|d| panic!("workspace: {d:?}"))
    }

    fn output(&self, name: &str) -> PathBuf {
        self.root()
            .join("runs/iteration-0/execution")
            .join(STEP)
            .join(name)
    }

    fn logs(&self) -> PathBuf {
        self.root().join("runs/iteration-0/logs").join(STEP)
    }

    /// Everything under the temp folder except the step's output folder and its logs,
    /// which a run may change.
    fn outside_grant(&self) -> BTreeMap<String, String> {
        let mut digest = tree_digest(self.dir.path());
        digest.retain(|k, _| {
            !k.starts_with("ws/runs/iteration-0/execution/fetch")
                && !k.starts_with("ws/runs/iteration-0/logs")
                && !k.starts_with("ws/runs/iteration-0/execution/Downloads")
        });
        // The grant creates db/assets/ (writable with the database); it stays empty.
        if digest.get("ws/db/assets").map(String::as_str) == Some("dir") {
            digest.remove("ws/db/assets");
        }
        digest
    }

    async fn run(&self, options: &ScriptOptions) -> ScriptOutcome {
        step_script::run(runner(), &self.workspace(), STEP, options)
            .await
            .expect("the script runs")
    }
}

fn options() -> ScriptOptions {
    ScriptOptions {
        limits: Limits {
            memory_bytes: 256 << 20,
            // Generous: a loaded CI machine must not turn a slow first run into a timeout.
            timeout: Duration::from_secs(60),
            output_bytes: 0,
            stdio_bytes: 64 << 10,
            ..Limits::default()
        },
        ..ScriptOptions::default()
    }
}

#[tokio::test]
async fn a_python_script_writes_its_outputs_with_env_cwd_and_variables() {
    let world = World::new();
    world.script(
        r#"
import json, os, sys
out = os.environ["STEP_OUTPUT_DIR"]
with open("input.txt") as f:          # relative to the working directory code/fetch/
    beside = f.read()
with open(os.path.join(os.environ["STEP_EXECUTION_DIR"], "earlier", "out.json")) as f:
    earlier = json.load(f)
report = {
    "env": {k: v for k, v in os.environ.items()},
    "cwd": os.getcwd(),
    "argv": sys.argv,
    "beside": beside,
    "earlier": earlier,
}
with open(os.path.join(out, "tickets.json"), "w") as f:
    json.dump(report, f)
print("wrote tickets.json")
print("a warning", file=sys.stderr)
"#,
    );
    let outcome = world.run(&options()).await;
    assert!(outcome.succeeded(), "{:?}", outcome.error_message());
    assert_eq!(outcome.kind, ScriptKind::Python);
    assert_eq!(outcome.script, "code/fetch/main.py");
    assert_eq!(outcome.exit_code, Some(0));
    assert_eq!(outcome.stdout, "wrote tickets.json\n");
    assert_eq!(outcome.stderr, "a warning\n");

    let report = read_json(&world.output("tickets.json"));
    let env = report["env"].as_object().unwrap();
    let expected = json!({
        "STEP_OUTPUT_DIR": "/runs/iteration-0/execution/fetch",
        "STEP_EXECUTION_DIR": "/runs/iteration-0/execution",
        "DB_PATH": "/db/db.sqlite",
        "VAR_REGION": "emea",
        "VAR_MAX_ITEMS": "3",
    });
    assert_eq!(
        Value::Object(env.clone()),
        expected,
        "nothing else in the environment"
    );
    assert_eq!(report["cwd"], "/code/fetch");
    assert_eq!(report["argv"], json!(["main.py"]));
    assert_eq!(report["beside"], "input beside the script\n");
    assert_eq!(report["earlier"], json!({"n": 1}));

    // The logs folder has stdout, stderr and the record.
    let logs = world.logs();
    assert_eq!(outcome.log_dir.as_deref(), Some(logs.as_path()));
    assert_eq!(
        std::fs::read_to_string(logs.join("script-stdout.txt")).unwrap(),
        "wrote tickets.json\n"
    );
    assert_eq!(
        std::fs::read_to_string(logs.join("script-stderr.txt")).unwrap(),
        "a warning\n"
    );
    let record = read_json(&logs.join("script-result.json"));
    assert_eq!(record["status"], "succeeded");
    assert_eq!(record["exit_code"], 0);
    assert_eq!(record["script"], "code/fetch/main.py");
    assert_eq!(record["kind"], "python");
}

#[tokio::test]
async fn a_group_and_the_caller_override_variables() {
    let world = World::new();
    world.script("import os\nprint(os.environ['VAR_REGION'], os.environ['VAR_MAX_ITEMS'], os.environ['VAR_ANSWER'])\n");
    let mut options = options();
    options.group = Some("nordics".into());
    options.variables.insert("answer".into(), "yes".into());
    let outcome = world.run(&options).await;
    assert!(outcome.succeeded(), "{:?}", outcome.error_message());
    assert_eq!(outcome.stdout, "nordics 3 yes\n");
}

#[tokio::test]
async fn the_common_standard_library_modules_work() {
    let world = World::new();
    // A module beside the script can be imported.
    std::fs::write(
        world.root().join("code/fetch/helper.py"),
        "def double(n):\n    return 2 * n\n",
    )
    .unwrap();
    world.script(
        r#"
import base64, collections, csv, datetime, hashlib, io, itertools, json, math, os, pathlib, re, textwrap, urllib.parse
checks = {
    "base64": base64.b64encode(b"trellis").decode(),
    "collections": collections.Counter("abca").most_common(1)[0][0],
    "csv": next(csv.reader(io.StringIO('a,"b,c"\n'))),
    "datetime": datetime.date(2024, 2, 28).isoformat(),
    "hashlib": hashlib.sha256(b"x").hexdigest()[:8],
    "itertools": list(itertools.accumulate([1, 2, 3])),
    "math": math.isqrt(17),
    "pathlib": sorted(p.name for p in pathlib.Path(".").iterdir()),
    "re": re.findall(r"\d+", "a1b22"),
    "textwrap": textwrap.shorten("one two three four", width=12),
    "urllib.parse": urllib.parse.urlencode({"q": "a b"}),
    "strptime": datetime.datetime.strptime("2024-03-01 10:30", "%Y-%m-%d %H:%M").isoformat(),
    "latin-1": "café".encode("latin-1").decode("latin-1"),
    "helper": __import__("helper").double(21),
}
with open(os.environ["STEP_OUTPUT_DIR"] + "/stdlib.json", "w") as f:
    json.dump(checks, f)
"#,
    );
    let outcome = world.run(&options()).await;
    assert!(outcome.succeeded(), "{:?}", outcome.error_message());
    assert_eq!(
        read_json(&world.output("stdlib.json")),
        json!({
            "base64": "dHJlbGxpcw==",
            "collections": "a",
            "csv": ["a", "b,c"],
            "datetime": "2024-02-28",
            "hashlib": "2d711642",
            "itertools": [1, 3, 6],
            "math": 4,
            "pathlib": ["helper.py", "input.txt", "main.py"],
            "re": ["1", "22"],
            "textwrap": "one [...]",
            "urllib.parse": "q=a+b",
            "strptime": "2024-03-01T10:30:00",
            "latin-1": "café",
            "helper": 42,
        })
    );
}

#[tokio::test]
async fn an_exception_is_reported_with_the_script_and_line() {
    let world = World::new();
    world.script(
        "import json\nprint('before')\ndata = json.loads('{\"a\": 1}')\nvalue = data['missing']\n",
    );
    let outcome = world.run(&options()).await;
    assert!(!outcome.succeeded());
    assert_eq!(outcome.exit_code, Some(1));
    let Some(ScriptFailure::Exception {
        exception,
        location,
        traceback,
    }) = &outcome.failure
    else {
        panic!("expected an exception, got {:?}", outcome.failure);
    };
    assert_eq!(exception, "KeyError: 'missing'");
    assert_eq!(
        (location.file.as_str(), location.line),
        ("code/fetch/main.py", 4)
    );
    assert!(
        traceback.starts_with("Traceback (most recent call last):"),
        "{traceback}"
    );
    assert!(
        !traceback.contains("trellis_runner"),
        "the runner's frame is left out: {traceback}"
    );
    let message = outcome.error_message().unwrap();
    assert!(
        message.starts_with(
            "code/fetch/main.py raised KeyError: 'missing' (code/fetch/main.py, line 4)"
        ),
        "{message}"
    );
    assert_eq!(outcome.stdout, "before\n");
    let record = read_json(&world.logs().join("script-result.json"));
    assert_eq!(record["status"], "exception");
    assert_eq!(
        record["location"],
        json!({"file": "code/fetch/main.py", "line": 4})
    );

    // An error inside the standard library is blamed on the script's line that called it.
    world.script("import json\n\njson.loads('{')\n");
    let outcome = world.run(&options()).await;
    match &outcome.failure {
        Some(ScriptFailure::Exception {
            exception,
            location,
            ..
        }) => {
            assert!(
                exception.starts_with("json.decoder.JSONDecodeError"),
                "{exception}"
            );
            assert_eq!(location.line, 3);
        }
        other => panic!("expected an exception, got {other:?}"),
    }

    // A syntax error names its line too.
    world.script("x = 1\ny = (\n");
    let outcome = world.run(&options()).await;
    match &outcome.failure {
        Some(ScriptFailure::Exception {
            exception,
            location,
            ..
        }) => {
            assert!(exception.starts_with("SyntaxError"), "{exception}");
            assert_eq!(location.file, "code/fetch/main.py");
            assert_eq!(location.line, 2);
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
}

#[tokio::test]
async fn exit_statuses_are_reported() {
    let world = World::new();
    world.script("import sys\nprint('partial')\nsys.exit(3)\n");
    let outcome = world.run(&options()).await;
    assert_eq!(outcome.exit_code, Some(3));
    assert_eq!(outcome.failure, Some(ScriptFailure::Exit { code: 3 }));
    assert_eq!(outcome.stdout, "partial\n");
    assert!(
        outcome
            .error_message()
            .unwrap()
            .starts_with("code/fetch/main.py exited with status 3")
    );

    world.script("import sys\nsys.exit(0)\n");
    assert!(world.run(&options()).await.succeeded());
}

#[tokio::test]
async fn escapes_are_denied_and_change_nothing_outside_the_grant() {
    let world = World::new();
    world.script(
        r#"
import json, os
results = {}
def attempt(name, fn):
    try:
        fn()
        results[name] = "allowed"
    except OSError as e:
        results[name] = type(e).__name__

def write(path):
    with open(path, "w") as f:
        f.write("x")

attempt("read /etc/passwd", lambda: open("/etc/passwd").read())
attempt("read planning", lambda: open("/planning/plan.json").read())
attempt("read outside", lambda: open("/../outside/secret.txt").read())
attempt("read via ..", lambda: open("../../../outside/secret.txt").read())
attempt("write code/ (cwd)", lambda: write("main.py"))
attempt("write code/ (absolute)", lambda: write("/code/fetch/new.py"))
attempt("write other step code", lambda: write("/code/other/main.py"))
attempt("write knowledgebase", lambda: write("/knowledgebase/notes/a.md"))
attempt("write earlier output", lambda: write("/runs/iteration-0/execution/earlier/out.json"))
attempt("write db file", lambda: write("/db/db.sqlite"))
attempt("remove earlier output", lambda: os.remove("/runs/iteration-0/execution/earlier/out.json"))
attempt("mkdir at root", lambda: os.mkdir("/new"))
attempt("list root", lambda: os.listdir("/etc"))
with open(os.environ["STEP_OUTPUT_DIR"] + "/attempts.json", "w") as f:
    json.dump(results, f)
"#,
    );
    let before = world.outside_grant();
    let outcome = world.run(&options()).await;
    assert!(outcome.succeeded(), "{:?}", outcome.error_message());
    let results = read_json(&world.output("attempts.json"));
    for (name, result) in results.as_object().unwrap() {
        assert_ne!(result, "allowed", "{name} was allowed");
    }
    assert_eq!(results.as_object().unwrap().len(), 13);
    assert_eq!(
        world.outside_grant(),
        before,
        "nothing outside the grant changed"
    );
}

#[tokio::test]
async fn an_uncaught_escape_fails_the_script_with_the_denial() {
    let world = World::new();
    world.script("data = open('/etc/passwd').read()\n");
    let before = world.outside_grant();
    let outcome = world.run(&options()).await;
    match &outcome.failure {
        Some(ScriptFailure::Exception {
            exception,
            location,
            ..
        }) => {
            assert!(exception.starts_with("FileNotFoundError"), "{exception}");
            assert_eq!(location.line, 1);
        }
        other => panic!("expected a denial, got {other:?}"),
    }

    assert_eq!(world.outside_grant(), before);

    world.script("open('main.py', 'a').write('# changed')\n");
    let before = world.outside_grant();
    let outcome = world.run(&options()).await;
    let message = outcome.error_message().expect("writing code/ fails");
    assert!(message.contains("line 1"), "{message}");
    // The read-only grant's `not-permitted`, as Python names it.
    assert!(
        message.contains("PermissionError: [Errno 63] Operation not permitted: 'main.py'"),
        "{message}"
    );
    assert_eq!(world.outside_grant(), before);
}

#[tokio::test]
async fn there_is_no_network() {
    // A real listener on the loopback: no script may reach it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (host, port) = addr.split_once(':').unwrap();
    let world = World::new();

    // The interpreter has no `socket` module, so neither has anything built on it.
    world.script(&format!(
        "HOST, PORT = {host:?}, {port}\n{}",
        r#"
import json, os
results = {}
for name in ["socket", "urllib.request", "http.client", "ssl"]:
    try:
        __import__(name)
        results[name] = "imported"
    except ImportError as e:
        results[name] = type(e).__name__
# The C module under `socket` is there: the host refuses what it asks for.
import _socket
def attempt(name, fn):
    try:
        results[name] = "allowed: " + repr(fn())
    except OSError as e:
        results[name] = type(e).__name__ + ": " + str(e)
def tcp():
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    s.settimeout(5)
    return s.connect((HOST, PORT))
def udp():
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    return s.sendto(b"x", (HOST, PORT))
attempt("tcp", tcp)
attempt("udp", udp)
attempt("lookup", lambda: _socket.getaddrinfo("localhost", 80))
with open(os.environ["STEP_OUTPUT_DIR"] + "/net.json", "w") as f:
    json.dump(results, f)
"#
    ));
    let before = world.outside_grant();
    let outcome = world.run(&options()).await;
    assert!(outcome.succeeded(), "{:?}", outcome.error_message());
    let results = read_json(&world.output("net.json"));
    for name in ["socket", "urllib.request", "http.client", "ssl"] {
        assert_eq!(results[name], "ModuleNotFoundError", "{name}: {results}");
    }
    for name in ["tcp", "udp", "lookup"] {
        let result = results[name].as_str().unwrap();
        assert!(!result.starts_with("allowed"), "{name}: {results}");
    }

    // A command component that does have sockets: the host refuses the connection and
    // the name lookup.
    assert_eq!(world.outside_grant(), before);
    install_probe(&world);
    let before = world.outside_grant();
    let mut options = options();
    options.variables.insert("connect".into(), addr);
    let outcome = world.run(&options).await;
    assert!(outcome.succeeded(), "{:?}", outcome.error_message());
    let probe = read_json(&world.output("probe.json"));
    assert!(probe["connect"].get("err").is_some(), "{probe}");
    assert!(probe["lookup"].get("err").is_some(), "{probe}");

    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "nothing connected to the listener"
    );
    assert_eq!(world.outside_grant(), before);
}

#[tokio::test]
async fn a_script_that_loops_forever_times_out() {
    let world = World::new();
    world.script("print('spinning')\nn = 0\nwhile True:\n    n += 1\n");
    let mut options = options();
    options.limits.timeout = Duration::from_secs(2);
    let outcome = world.run(&options).await;
    assert_eq!(
        outcome.failure,
        Some(ScriptFailure::Timeout {
            after: Duration::from_secs(2)
        })
    );
    assert_eq!(outcome.exit_code, None);
    assert!(
        outcome
            .error_message()
            .unwrap()
            .contains("did not finish within 2s and was stopped (timeout)")
    );
    assert_eq!(
        read_json(&world.logs().join("script-result.json"))["status"],
        "timeout"
    );
    // The host carries on.
    world.script("print('next')\n");
    assert_eq!(world.run(&options).await.stdout, "next\n");
}

#[tokio::test]
async fn a_flood_of_output_is_capped_and_the_traceback_survives() {
    let world = World::new();
    world.script(
        "import sys\nline = 'x' * 1023\nfor i in range(8 * 1024):\n    print(line)\n    print(line, file=sys.stderr)\nraise RuntimeError('after the flood')\n",
    );
    let outcome = world.run(&options()).await;
    // 8 MiB on each stream; 64 KiB kept of each.
    assert!(outcome.stdout.len() < 70 << 10, "{}", outcome.stdout.len());
    assert!(outcome.stderr.len() < 70 << 10, "{}", outcome.stderr.len());
    assert!(outcome.stdout.contains("bytes dropped"));
    match &outcome.failure {
        Some(ScriptFailure::Exception {
            exception,
            location,
            ..
        }) => {
            assert_eq!(exception, "RuntimeError: after the flood");
            assert_eq!(location.line, 6);
        }
        other => panic!("expected the exception after the flood, got {other:?}"),
    }
    let logged = std::fs::metadata(world.logs().join("script-stdout.txt")).unwrap();
    assert!(logged.len() < 70 << 10);
}

#[tokio::test]
async fn a_memory_bomb_hits_the_memory_limit() {
    let world = World::new();
    world.script("blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 1024 * 1024))\n");
    let mut options = options();
    options.limits.memory_bytes = 128 << 20;
    let outcome = world.run(&options).await;
    assert_eq!(
        outcome.failure,
        Some(ScriptFailure::MemoryLimit { limit: 128 << 20 })
    );
    assert!(
        outcome
            .error_message()
            .unwrap()
            .contains("exceeded its memory limit of 128 MiB")
    );
    // The host carries on.
    world.script("print('next')\n");
    assert_eq!(world.run(&options).await.stdout, "next\n");
}

const DB_SCRIPT: &str = r#"
import json, os, trellis_db
rows = trellis_db.query("SELECT id, subject FROM tickets WHERE status = ? ORDER BY id", ["open"])
result = {"rows": rows}
try:
    result["changed"] = trellis_db.execute("UPDATE tickets SET status = ? WHERE id = ?", ["done", 1])
except trellis_db.ReadOnlyError as e:
    result["denied"] = str(e)
try:
    trellis_db.query("DELETE FROM tickets")
except trellis_db.DbError as e:
    result["query_refuses_writes"] = type(e).__name__
try:
    trellis_db.query("SELECT nope FROM tickets")
except trellis_db.SqlError as e:
    result["sql_error"] = str(e)
with open(os.environ["STEP_OUTPUT_DIR"] + "/db.json", "w") as f:
    json.dump(result, f)
"#;

fn db_statuses(world: &World) -> Vec<(i64, String)> {
    let db = rusqlite::Connection::open(world.root().join("db/db.sqlite")).unwrap();
    let mut stmt = db
        .prepare("SELECT id, status FROM tickets ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[tokio::test]
async fn the_db_module_queries_and_writes_only_with_write_access() {
    let world = World::new();
    world.script(DB_SCRIPT);
    let statuses = db_statuses(&world);

    // Without db write access: query works, execute is denied, the file is unchanged.
    let read_only = ScriptOptions {
        access: Some(TurnAccess {
            db_write: false,
            ..TurnAccess::for_step(&Default::default())
        }),
        ..options()
    };
    let before = world.outside_grant();
    let outcome = world.run(&read_only).await;
    assert!(outcome.succeeded(), "{:?}", outcome.error_message());
    let result = read_json(&world.output("db.json"));
    assert_eq!(
        result["rows"],
        json!([{"id": 1, "subject": "Refund"}, {"id": 2, "subject": "Login"}])
    );
    assert!(result.get("changed").is_none(), "{result}");
    assert!(
        result["denied"].as_str().unwrap().contains("read-only"),
        "{result}"
    );
    assert_eq!(result["query_refuses_writes"], "ReadOnlyError");
    assert!(
        result["sql_error"]
            .as_str()
            .unwrap()
            .contains("no such column"),
        "{result}"
    );
    assert_eq!(db_statuses(&world), statuses);
    assert_eq!(world.outside_grant(), before);

    // With it (the step's default): the update lands in the real file.
    let outcome = world.run(&options()).await;
    assert!(outcome.succeeded(), "{:?}", outcome.error_message());
    let result = read_json(&world.output("db.json"));
    assert_eq!(result["changed"], 1);
    assert!(result.get("denied").is_none(), "{result}");
    assert_eq!(db_statuses(&world)[0], (1, "done".to_string()));
}

#[tokio::test]
async fn without_a_database_the_module_says_so() {
    let world = World::new();
    std::fs::remove_dir_all(world.root().join("db")).unwrap();
    world.script(
        "import os, trellis_db\nassert 'DB_PATH' not in os.environ\ntry:\n    trellis_db.query('SELECT 1')\nexcept trellis_db.NotGrantedError as e:\n    print('not granted:', e)\n",
    );
    let outcome = world.run(&options()).await;
    assert!(outcome.succeeded(), "{:?}", outcome.error_message());
    assert!(
        outcome.stdout.starts_with("not granted: "),
        "{}",
        outcome.stdout
    );
}

fn install_probe(world: &World) {
    std::fs::copy(
        trellis_test_programs::path("script_probe"),
        world.root().join("code/fetch/main.wasm"),
    )
    .unwrap();
}

#[tokio::test]
async fn a_wasm_command_runs_the_same_way_and_wins_over_main_py() {
    let world = World::new();
    world.script("raise SystemExit('main.py must not run when main.wasm exists')\n");
    install_probe(&world);
    let before = world.outside_grant();
    let outcome = world.run(&options()).await;
    assert!(outcome.succeeded(), "{:?}", outcome.error_message());
    assert_eq!(outcome.kind, ScriptKind::Wasm);
    assert_eq!(outcome.script, "code/fetch/main.wasm");
    assert_eq!(
        outcome.stdout,
        "probe: wrote /runs/iteration-0/execution/fetch/probe.json\n"
    );
    assert_eq!(outcome.stderr, "probe: a line on stderr\n");

    let probe = read_json(&world.output("probe.json"));
    assert_eq!(
        probe["env"],
        json!({
            "STEP_OUTPUT_DIR": "/runs/iteration-0/execution/fetch",
            "STEP_EXECUTION_DIR": "/runs/iteration-0/execution",
            "DB_PATH": "/db/db.sqlite",
            "VAR_REGION": "emea",
            "VAR_MAX_ITEMS": "3",
        })
    );
    assert_eq!(probe["args"], json!(["main.wasm"]));
    assert_eq!(probe["input"], json!({"ok": "input beside the script\n"}));
    for attempt in ["read_etc_passwd", "read_plan", "write_code"] {
        assert!(probe[attempt].get("err").is_some(), "{attempt}: {probe}");
    }
    assert_eq!(world.outside_grant(), before);
    assert_eq!(
        read_json(&world.logs().join("script-result.json"))["kind"],
        "wasm"
    );
}

#[tokio::test]
async fn a_main_wasm_past_its_compile_deadline_is_not_run() {
    let world = World::new();
    install_probe(&world);
    let before = world.outside_grant();
    // No cache: a compiled copy of the probe found there would need no compile.
    let engine = trellis_sandbox::Engine::new(trellis_sandbox::CacheSetting::Disabled).unwrap();
    let runner = ScriptRunner::new(&engine)
        .unwrap()
        .with_compile_deadline(Duration::ZERO);
    let err = step_script::run(&runner, &world.workspace(), STEP, &options())
        .await
        .unwrap_err();
    assert_eq!(
        format!("{err:#}"),
        "code/fetch/main.wasm: compiling took longer than the limit of 0 s; gave up (the \
         component is too large or too complex to load)"
    );
    assert!(!world.output("probe.json").exists());
    assert_eq!(world.outside_grant(), before);
}

#[tokio::test]
async fn a_wasm_command_reports_its_exit_status_and_times_out() {
    let world = World::new();
    install_probe(&world);
    let mut options = options();
    options.variables.insert("exit_code".into(), "7".into());
    let outcome = world.run(&options).await;
    assert_eq!(outcome.failure, Some(ScriptFailure::Exit { code: 7 }));
    assert!(world.output("probe.json").is_file());

    options.variables.clear();
    options.variables.insert("spin".into(), "1".into());
    options.limits.timeout = Duration::from_secs(1);
    let outcome = world.run(&options).await;
    assert_eq!(
        outcome.failure,
        Some(ScriptFailure::Timeout {
            after: Duration::from_secs(1)
        })
    );
}

#[tokio::test]
async fn a_step_without_a_script_or_with_a_bad_one_is_an_error() {
    let world = World::new();
    let err = step_script::run(runner(), &world.workspace(), STEP, &options())
        .await
        .unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("code/fetch/ has neither main.wasm nor main.py"),
        "{text}"
    );

    let err = step_script::run(runner(), &world.workspace(), "missing", &options())
        .await
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("planning/plan.json has no step \"missing\""),
        "{err:#}"
    );

    // A main.wasm that is not a command component names itself.
    std::fs::write(world.root().join("code/fetch/main.wasm"), b"not wasm").unwrap();
    let err = step_script::run(runner(), &world.workspace(), STEP, &options())
        .await
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("code/fetch/main.wasm: not a valid WebAssembly component"),
        "{err:#}"
    );
    std::fs::copy(
        trellis_test_programs::path("adversary"),
        world.root().join("code/fetch/main.wasm"),
    )
    .unwrap();
    let err = step_script::run(runner(), &world.workspace(), STEP, &options())
        .await
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("code/fetch/main.wasm is not a wasi:cli command"),
        "{err:#}"
    );
}

#[tokio::test]
async fn a_script_symlinked_out_of_the_workspace_is_not_read() {
    let world = World::new();
    std::os::unix::fs::symlink(
        world.dir.path().join("outside/secret.txt"),
        world.root().join("code/fetch/main.py"),
    )
    .unwrap();
    let outcome = step_script::run(runner(), &world.workspace(), STEP, &options()).await;
    // Either refused up front or unreadable inside the sandbox: never run.
    match outcome {
        Err(_) => {}
        Ok(outcome) => {
            assert!(!outcome.succeeded());
            assert!(!outcome.stdout.contains("outside secret"));
            assert!(
                !outcome.stderr.contains("outside secret"),
                "{}",
                outcome.stderr
            );
        }
    }
}

#[test]
fn the_cli_runs_a_step_script_and_fails_with_its_error() {
    let world = World::new();
    let root = world.root().to_str().unwrap().to_string();
    let trellis = |args: &[&str]| {
        support::trellis(&[&["script", root.as_str(), "--step", STEP][..], args].concat())
    };
    world.script("import os\nprint('region', os.environ['VAR_REGION'])\n");
    let out = trellis(&["--var", "region=apac"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "region apac\n");
    assert!(
        stderr.contains("code/fetch/main.py: succeeded in")
            && stderr.contains("logs in runs/iteration-0/logs/fetch/"),
        "{stderr}"
    );

    world.script("x = 1\nraise ValueError('bad input')\n");
    let out = trellis(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Traceback (most recent call last):"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "error: code/fetch/main.py raised ValueError: bad input (code/fetch/main.py, line 2)"
        ),
        "{stderr}"
    );

    let out = trellis(&["--timeout", "0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--timeout: expected a positive number"));
}

/// A newcomer's first steps: `trellis script` on a fresh copy of an example with a
/// `db/seed.sql`, then `trellis run`. The script must find the seeded tables (it reads the
/// open tickets), and so must the run after it: an empty database left by the script would
/// never be seeded.
#[test]
fn a_script_on_a_fresh_workspace_seeds_the_database_as_a_run_does() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ticket-digest");
    support::workspace::copy_workspace(&example, &root, &["runs", "db.sqlite"]);
    let ws = root.to_str().unwrap();

    let out = support::trellis(&["script", ws, "--step", "export-open"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.starts_with("created db/db.sqlite from db/seed.sql\n"),
        "{stderr}"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "exported 4 open tickets\n"
    );

    let out = support::trellis(&["run", ws]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let digest =
        std::fs::read_to_string(root.join("runs/iteration-0/execution/digest/digest.md")).unwrap();
    assert!(digest.contains("## High (2)"), "{digest}");

    // Seeded once: a second script finds the database there and says nothing of it.
    let out = support::trellis(&["script", ws, "--step", "export-open"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("created db/db.sqlite"), "{stderr}");

    // The empty database an earlier release's script left holds nothing: it is seeded over.
    std::fs::write(root.join("db/db.sqlite"), "").unwrap();
    let out = support::trellis(&["run", ws]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("created db/db.sqlite from db/seed.sql"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
