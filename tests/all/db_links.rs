//! Hard links at the files SQLite opens for the workflow database (`db/db.sqlite`, its
//! `-journal`, `-wal` and `-shm`), each a second name for a file outside the workspace, met by
//! every kind of connection the host opens, through the binary: an agent's database tools, a
//! script's `trellis_db`, a read-only foreach `source_sql`, a gate's db rule and a database
//! seeded from `db/seed.sql`. Each connection is refused with a message naming the file, and
//! the file outside keeps every byte.

use crate::support;

use std::path::PathBuf;

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion, result_of};
use support::workspace::{create_db, write_file};
use support::{tree_digest, trellis};

/// The four files, by name in `db/`.
const FILES: [&str; 4] = [
    "db.sqlite",
    "db.sqlite-journal",
    "db.sqlite-wal",
    "db.sqlite-shm",
];

/// The refusal of a hard link at `db/name`, word for word.
fn refusal(name: &str) -> String {
    format!(
        "db/{name} has other hard links (2 names for one file, one of them perhaps outside the \
         workspace), so Trellis will not open it: remove the link"
    )
}

use crate::support::plugin_build::text;

/// A workspace `ws/` beside a folder `outside/` holding the file a hard link in `ws/db/`
/// names.
struct World {
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws/db")).unwrap();
        std::fs::create_dir_all(dir.path().join("outside")).unwrap();
        World { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    fn root_str(&self) -> String {
        self.root().to_str().unwrap().to_string()
    }

    fn outside(&self) -> PathBuf {
        self.dir.path().join("outside")
    }

    /// `db/db.sqlite` with `t(x)` = 1, 2, 3; in WAL mode when `wal` (SQLite removes its
    /// `-wal` and `-shm` when the connection closes).
    fn database(&self, wal: bool) {
        create_db(
            &self.root(),
            "CREATE TABLE t(x); INSERT INTO t VALUES (1), (2), (3);",
        );
        if wal {
            self.database_mode_wal();
        }
    }

    /// Makes `db/name` a second name for `outside/file`: for the database, a database (the
    /// workspace's own, moved out); for the others, bytes SQLite would read or overwrite.
    /// Returns the bytes of the file outside.
    fn plant(&self, name: &str) -> Vec<u8> {
        let at = self.root().join("db").join(name);
        let outside = self.outside().join("file");
        let bytes = match name {
            "db.sqlite" => {
                let bytes = std::fs::read(&at).unwrap();
                std::fs::remove_file(&at).unwrap();
                bytes
            }
            "db.sqlite-shm" => vec![9u8; 32768],
            // A journal that starts with a non-zero byte is hot: a reader opens it too.
            _ => vec![7u8; 8192],
        };
        std::fs::write(&outside, &bytes).unwrap();
        std::fs::hard_link(&outside, &at).unwrap();
        bytes
    }

    /// Asserts that the file outside (and everything else there) is as planted.
    fn assert_outside_unchanged(&self, bytes: &[u8], case: &str) {
        assert_eq!(
            std::fs::read(self.outside().join("file")).unwrap(),
            bytes,
            "{case}: the file outside changed"
        );
        let names: Vec<_> = tree_digest(&self.outside()).into_keys().collect();
        assert_eq!(names, ["file"], "{case}: files appeared outside");
    }
}

/// The answers of a fake model: one answer asking for a query and a mutation, then "done".
fn db_tool_calls() -> FakeServer {
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let call = |id: &str, name: &str, args: Value| {
        json!({"id": id, "type": "function",
               "function": {"name": name, "arguments": args.to_string()}})
    };
    let mut first = completion("", &[("x", json!({}))]);
    first["choices"][0]["message"]["tool_calls"] = json!([
        call("q", "query_workflow_db", json!({"sql": "SELECT x FROM t"})),
        call(
            "m",
            "mutate_workflow_db",
            json!({"statements": [{"sql": "INSERT INTO t VALUES (4)"}]})
        ),
    ]);
    let replies = [first, completion("done", &[])];
    FakeServer::start(Box::new(move |_| {
        let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        (200, replies[i.min(1)].clone())
    }))
}

/// An agent turn's `query_workflow_db` and `mutate_workflow_db` (`trellis run`): both
/// calls are refused naming the file; the run goes on and ends.
#[test]
fn the_db_tools_of_an_agent_refuse_a_hard_link_at_any_database_file() {
    for name in FILES {
        let world = World::new();
        let server = db_tool_calls();
        crate::agent_db_tools::workspace(
            &world.root(),
            &server,
            json!([{"id": "go", "type": "user_message", "message": "Go."}]),
            json!({}),
        );
        if name == "db.sqlite-shm" {
            world.database_mode_wal();
        }
        let bytes = world.plant(name);
        let out = trellis(&["run", &world.root_str(), "--allow-host", "127.0.0.1"]);
        let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{name}: {all}");
        let results = server.last_tool_results();
        for id in ["q", "m"] {
            let result = result_of(&results, id);
            assert!(result.contains(&refusal(name)), "{name}, {id}: {result}");
        }
        world.assert_outside_unchanged(&bytes, name);
    }
}

impl World {
    /// Puts the existing `db/db.sqlite` in WAL mode.
    fn database_mode_wal(&self) {
        let conn = rusqlite::Connection::open(self.root().join("db/db.sqlite")).unwrap();
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }

    /// A plan of the one step `step` and its configs.
    fn plan(&self, step: Value, configs: Value) {
        write_file(
            &self.root(),
            "planning/plan.json",
            json!({"objective": "links", "steps": [step]}).to_string(),
        );
        write_file(
            &self.root(),
            "planning/step_config.json",
            json!({ "steps": configs }).to_string(),
        );
    }

    /// A `workflow.json` naming the fake model of `server`.
    fn workflow(&self, server: &FakeServer) {
        write_file(
            &self.root(),
            "workflow.json",
            json!({"llm": {"provider": "openai", "model_id": "m"},
                   "providers": server.providers()})
            .to_string(),
        );
    }
}

/// A step script's `trellis_db` (`trellis script`): the query and the write are refused
/// naming the file.
#[test]
fn a_scripts_trellis_db_refuses_a_hard_link_at_any_database_file() {
    for name in FILES {
        let world = World::new();
        world.plan(
            json!({"id": "fetch", "type": "regular", "title": "Fetch", "description": "d"}),
            json!([{"id": "fetch", "agent_configs": {"declared_execution_mode": "scripted"}}]),
        );
        write_file(
            &world.root(),
            "code/fetch/main.py",
            r#"import trellis_db
attempts = [
    ("query", lambda: trellis_db.query("SELECT x FROM t", [])),
    ("execute", lambda: trellis_db.execute("INSERT INTO t VALUES (4)", [])),
]
for what, attempt in attempts:
    try:
        attempt()
        print(what, "ALLOWED")
    except trellis_db.DbError as e:
        print(what, type(e).__name__, e)
"#,
        );
        world.database(name == "db.sqlite-shm");
        let bytes = world.plant(name);
        let out = trellis(&["script", &world.root_str(), "--step", "fetch"]);
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: {stdout}\n{}",
            text(&out.stderr)
        );
        for what in ["query", "execute"] {
            let line = stdout
                .lines()
                .find(|l| l.starts_with(&format!("{what} ")))
                .unwrap_or_else(|| panic!("{name}: no {what} line in {stdout}"));
            assert!(
                line.starts_with(&format!("{what} SqlError ")) && line.contains(&refusal(name)),
                "{name}: {line}"
            );
        }
        world.assert_outside_unchanged(&bytes, name);
    }
}

/// A foreach step reading `t`, with a model that only says "done".
fn foreach_world(world: &World) -> FakeServer {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    world.plan(
        json!({"id": "each", "type": "message_sequence", "title": "Each", "description": "d",
               "items": [{"id": "rows", "type": "foreach", "source_sql": "SELECT x FROM t",
                          "message": "Row {{.x}}"}]}),
        json!([]),
    );
    world.workflow(&server);
    server
}

/// A foreach `source_sql`, on a read-only connection (`trellis run`): the run fails naming
/// the file, and no turn runs.
#[test]
fn a_foreach_source_sql_refuses_a_hard_link_at_any_database_file() {
    for name in FILES {
        let world = World::new();
        let server = foreach_world(&world);
        world.database(name == "db.sqlite-shm");
        let bytes = world.plant(name);
        let out = trellis(&["run", &world.root_str(), "--allow-host", "127.0.0.1"]);
        let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(1), "{name}: {all}");
        assert!(all.contains(&refusal(name)), "{name}: {all}");
        assert!(server.seen().is_empty(), "{name}: a turn ran: {all}");
        world.assert_outside_unchanged(&bytes, name);
    }
}

/// A db rule of a validation gate (`trellis check`), read-only: the gate fails naming the
/// file.
#[test]
fn a_db_rule_of_a_gate_refuses_a_hard_link_at_any_database_file() {
    for name in FILES {
        let world = World::new();
        world.plan(
            json!({"id": "report", "type": "regular", "title": "Report", "description": "d",
                   "validation_schema": {"db": [{"name": "rows", "sql": "SELECT x FROM t",
                                                 "min_rows": 1}]}}),
            json!([]),
        );
        std::fs::create_dir_all(world.root().join("runs/iteration-0/execution/report")).unwrap();
        world.database(name == "db.sqlite-shm");
        let bytes = world.plant(name);
        let out = trellis(&["check", &world.root_str(), "--step", "report"]);
        let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(1), "{name}: {all}");
        assert!(all.contains(&refusal(name)), "{name}: {all}");
        world.assert_outside_unchanged(&bytes, name);
    }
}

/// A workspace that ships `db/seed.sql` instead of a database, with a hard link planted at a
/// file of the database it seeds: a link at `db/db.sqlite` keeps the seed from running and is
/// refused by the foreach; the seeded database's connection refuses a `-journal` or `-wal`
/// found beside it. A rollback-mode database (a seed cannot change the journal mode) never
/// opens a `-shm`: that run goes on, the file outside unchanged.
#[test]
fn a_seeded_database_refuses_a_hard_link_at_any_database_file() {
    for name in FILES {
        let world = World::new();
        let server = foreach_world(&world);
        world.database(false);
        let bytes = world.plant(name);
        if name != "db.sqlite" {
            std::fs::remove_file(world.root().join("db/db.sqlite")).unwrap();
        }
        write_file(
            &world.root(),
            "db/seed.sql",
            "CREATE TABLE t(x); INSERT INTO t VALUES (1), (2);",
        );
        let out = trellis(&["run", &world.root_str(), "--allow-host", "127.0.0.1"]);
        let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
        if name == "db.sqlite-shm" {
            assert!(out.status.success(), "{name}: {all}");
            assert!(!server.seen().is_empty(), "{name}: no turn ran: {all}");
        } else {
            assert_eq!(out.status.code(), Some(1), "{name}: {all}");
            assert!(all.contains(&refusal(name)), "{name}: {all}");
        }
        world.assert_outside_unchanged(&bytes, name);
    }
}

/// An agent's `read_file` of a hard link to a file outside the workspace is refused, as
/// the builder's reads are: the model never sees the file's content.
#[test]
fn an_agent_does_not_read_through_a_hard_link() {
    let world = World::new();
    std::fs::write(world.outside().join("file"), "outside secret").unwrap();
    let server = {
        let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut first = completion("", &[("x", json!({}))]);
        first["choices"][0]["message"]["tool_calls"] = json!([
            {"id": "r", "type": "function", "function": {
                "name": "workspace__read_file",
                "arguments": json!({"path": "knowledgebase/notes/hard.md"}).to_string()}}
        ]);
        let replies = [first, completion("done", &[])];
        FakeServer::start(Box::new(move |_| {
            let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            (200, replies[i.min(1)].clone())
        }))
    };
    crate::agent_db_tools::workspace(
        &world.root(),
        &server,
        json!([{"id": "go", "type": "user_message", "message": "Read."}]),
        json!({}),
    );
    std::fs::hard_link(
        world.outside().join("file"),
        world.root().join("knowledgebase/notes/hard.md"),
    )
    .unwrap();
    let out = trellis(&["run", &world.root_str(), "--allow-host", "127.0.0.1"]);
    let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{all}");
    let result = result_of(&server.last_tool_results(), "r");
    assert!(
        result.contains("`knowledgebase/notes/hard.md` has other hard links, so it is not read"),
        "{result}"
    );
    let seen = serde_json::to_string(&server.seen()).unwrap();
    assert!(!seen.contains("outside secret"), "the model saw the file");
    assert!(!all.contains("outside secret"), "{all}");
    assert_eq!(
        std::fs::read_to_string(world.outside().join("file")).unwrap(),
        "outside secret"
    );
}
