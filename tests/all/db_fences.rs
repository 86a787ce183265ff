//! The workflow database as guests and plans reach it, attacked through the `trellis` binary:
//! `ATTACH` (and `VACUUM INTO`, which attaches under the hood) must not reach any other file,
//! and a runaway statement must end with its call's deadline. Every way in is tried: a step
//! script's `trellis_db`, a tool plugin's `workflow-db`, a foreach `source_sql` and a db rule
//! of a validation gate.

use crate::support;

use std::path::PathBuf;

use serde_json::json;
use support::fake_llm::{FakeServer, completion};
use support::workspace::{create_db, write_file};
use support::{plugin_folder, tree_digest, trellis};

/// A workspace with one step `fetch` and a database, beside an `outside` folder where the
/// attacks try to create their files.
struct World {
    dir: tempfile::TempDir,
}

const ENDLESS: &str =
    "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) SELECT count(*) FROM c";

impl World {
    fn new(step: serde_json::Value, configs: serde_json::Value) -> World {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        write_file(
            &root,
            "planning/plan.json",
            json!({"objective": "attacks", "steps": [step]}).to_string(),
        );
        write_file(
            &root,
            "planning/step_config.json",
            json!({ "steps": configs }).to_string(),
        );
        create_db(
            &root,
            "CREATE TABLE tickets (id INTEGER, subject TEXT); INSERT INTO tickets VALUES (1, 'a');",
        );
        std::fs::create_dir_all(dir.path().join("outside")).unwrap();
        World { dir }
    }

    fn scripted() -> World {
        World::new(
            json!({"id": "fetch", "type": "regular", "title": "Fetch", "description": "d"}),
            json!([{"id": "fetch", "agent_configs": {"declared_execution_mode": "scripted"}}]),
        )
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    fn evil(&self) -> PathBuf {
        self.dir.path().join("outside/evil.db")
    }

    fn root_str(&self) -> String {
        self.root().to_str().unwrap().to_string()
    }

    /// The whole tree but the run folders, which a run may write.
    fn digest(&self) -> std::collections::BTreeMap<String, String> {
        let mut digest = tree_digest(self.dir.path());
        digest.retain(|k, _| k != "ws/runs" && !k.starts_with("ws/runs/"));
        // The grant creates db/assets/ (writable with the database); it stays empty.
        if digest.get("ws/db/assets").map(String::as_str) == Some("dir") {
            digest.remove("ws/db/assets");
        }
        digest
    }
}

use crate::support::plugin_build::text;

#[test]
fn a_script_cannot_attach_another_file_or_vacuum_into_one() {
    let world = World::scripted();
    let evil = world.evil().display().to_string();
    write_file(
        &world.root(),
        "code/fetch/main.py",
        format!(
            r#"import trellis_db
attempts = {{
    "query": lambda: trellis_db.query("ATTACH DATABASE '{evil}' AS e", []),
    "execute": lambda: trellis_db.execute("ATTACH DATABASE '{evil}' AS e", []),
    "create": lambda: trellis_db.execute("CREATE TABLE e.t(x)", []),
    "vacuum": lambda: trellis_db.execute("VACUUM INTO '{evil}'", []),
    "pragma": lambda: trellis_db.query("PRAGMA temp_store_directory = '/tmp'", []),
}}
for name, attempt in attempts.items():
    try:
        attempt()
        print(name, "ALLOWED")
    except trellis_db.DbError as e:
        print(name, type(e).__name__, e)
"#
        ),
    );
    let before = world.digest();
    let out = trellis(&["script", &world.root_str(), "--step", "fetch"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(!stdout.contains("ALLOWED"), "{stdout}");
    for line in [
        "query SqlError not authorized",
        "execute SqlError not authorized",
        "create SqlError unknown database e",
        "vacuum SqlError VACUUM is not allowed on the workflow database",
        "pragma SqlError not authorized",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
    assert!(!world.evil().exists(), "ATTACH created a file outside");
    assert_eq!(
        world.digest(),
        before,
        "nothing outside the run folder changed"
    );
}

#[test]
fn a_script_query_ends_with_the_scripts_deadline() {
    let world = World::scripted();
    write_file(
        &world.root(),
        "code/fetch/main.py",
        format!("import trellis_db\ntrellis_db.query({ENDLESS:?}, [])\nprint('finished')\n"),
    );
    let out = trellis(&[
        "script",
        &world.root_str(),
        "--step",
        "fetch",
        "--timeout",
        "2",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!text(&out.stdout).contains("finished"));
    assert!(
        stderr.contains(
            "error: code/fetch/main.py did not finish within 2s and was stopped (timeout)"
        ),
        "{stderr}"
    );
}

/// `trellis tool call adversary:<tool>` with the workspace database granted.
fn adversary_call(world: &World, tool: &str, sql: &str, extra: &[&str]) -> std::process::Output {
    let plugins = world.dir.path().join("adversary");
    let args = json!({ "sql": sql }).to_string();
    let root = world.root_str();
    let mut argv = vec![
        "tool",
        "call",
        tool,
        "--root",
        root.as_str(),
        "--db",
        "db/db.sqlite",
        "--args",
        args.as_str(),
        "--plugins",
        plugins.to_str().unwrap(),
    ];
    argv.extend_from_slice(extra);
    trellis(&argv)
}

#[test]
fn a_tool_plugin_cannot_attach_and_its_queries_end_with_the_call() {
    let world = World::scripted();
    plugin_folder(world.dir.path(), "adversary", "adversary", "tool");
    let evil = world.evil().display().to_string();
    let before = world.digest();
    // ATTACH is refused by the authorizer; VACUUM by the statement check before it.
    for (tool, sql, extra, why) in [
        (
            "adversary:db_query",
            format!("ATTACH DATABASE '{evil}' AS e"),
            &[][..],
            "not authorized",
        ),
        (
            "adversary:db_execute",
            format!("ATTACH DATABASE '{evil}' AS e"),
            &["--db-write"][..],
            "not authorized",
        ),
        (
            "adversary:db_execute",
            format!("VACUUM INTO '{evil}'"),
            &["--db-write"][..],
            "VACUUM is not allowed",
        ),
    ] {
        let out = adversary_call(&world, tool, &sql, extra);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{sql}: {stderr}");
        assert!(
            stderr.contains(&format!("error: {tool}: failed: sql: ")) && stderr.contains(why),
            "{sql}: expected {why:?} in {stderr}"
        );
    }
    assert!(!world.evil().exists(), "ATTACH created a file outside");
    assert_eq!(world.digest(), before);

    let out = adversary_call(&world, "adversary:db_query", ENDLESS, &["--timeout", "1"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error: adversary:db_query: timed out after 1s and was stopped"),
        "{stderr}"
    );
}

#[test]
fn the_db_file_of_a_tool_call_must_be_a_plain_file_inside_the_root() {
    let world = World::scripted();
    std::os::unix::fs::symlink(world.evil(), world.root().join("db/link.sqlite")).unwrap();
    let out = trellis(&[
        "tool",
        "call",
        "workspace:list_dir",
        "--root",
        &world.root_str(),
        "--db",
        "db/link.sqlite",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--db \"db/link.sqlite\""),
        "{}",
        text(&out.stderr)
    );
    assert!(!world.evil().exists());
}

#[test]
fn a_foreach_source_sql_cannot_attach() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let evil = dir.path().join("evil.db");
    let world = World::new(
        json!({"id": "each", "type": "message_sequence", "title": "Each", "description": "d",
               "items": [{"id": "rows", "type": "foreach",
                          "source_sql": format!("ATTACH DATABASE '{}' AS e", evil.display()),
                          "message": "Row {{.id}}"}]}),
        json!([]),
    );
    write_file(
        &world.root(),
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": server.providers()})
            .to_string(),
    );
    let out = trellis(&["run", &world.root_str(), "--allow-host", "127.0.0.1"]);
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{all}");
    // Refused by the preflight, which prepares the query through the same fence.
    assert!(
        all.contains("steps[0].items[0].source_sql (step \"each\"): cannot be prepared")
            && all.contains("not authorized"),
        "{all}"
    );
    assert!(!evil.exists(), "ATTACH created a file outside");
    assert!(server.seen().is_empty(), "no turn ran");
}

#[test]
fn a_db_rule_of_a_gate_cannot_attach() {
    let dir = tempfile::tempdir().unwrap();
    let evil = dir.path().join("evil.db");
    let world = World::new(
        json!({"id": "report", "type": "regular", "title": "Report", "description": "d",
               "validation_schema": {"db": [{"name": "sneaky",
                   "sql": format!("ATTACH DATABASE '{}' AS e", evil.display()), "min_rows": 0}]}}),
        json!([]),
    );
    std::fs::create_dir_all(world.root().join("runs/iteration-0/execution/report")).unwrap();
    let out = trellis(&["check", &world.root_str(), "--step", "report"]);
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("db rule \"sneaky\": the SQL cannot be used: not authorized"),
        "{all}"
    );
    assert!(!evil.exists(), "ATTACH created a file outside");
}

#[test]
fn a_seed_sql_cannot_attach_and_leaves_no_database_behind() {
    let dir = tempfile::tempdir().unwrap();
    let evil = dir.path().join("evil.db");
    let world = World::new(
        json!({"id": "route", "type": "routing", "title": "Route", "description": "d",
               "routes": [{"route_id": "done", "route_name": "Done", "condition": "always",
                           "next_step_id": "end"}],
               "default_route_id": "done"}),
        json!([]),
    );
    std::fs::remove_file(world.root().join("db/db.sqlite")).unwrap();
    write_file(
        &world.root(),
        "db/seed.sql",
        format!(
            "CREATE TABLE t (x INTEGER);\nATTACH DATABASE '{}' AS e;\nCREATE TABLE e.stolen (x);\n",
            evil.display()
        ),
    );
    let out = trellis(&["run", &world.root_str(), "--allow-host", "127.0.0.1"]);
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("running db/seed.sql: not authorized"), "{all}");
    assert!(!evil.exists(), "ATTACH created a file outside");
    let db_folder: Vec<_> = std::fs::read_dir(world.root().join("db"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(db_folder, ["seed.sql"], "no database, no temp file left");
}

#[test]
fn a_tool_plugin_cannot_make_sqlite_call_through_a_pointer_it_chose() {
    // `fts3_tokenizer(?, ?)` with bound arguments stores a guest-chosen address as a
    // tokenizer module; `USING fts3(tokenize=...)` then calls through it. Unfenced, the host
    // process dies of SIGSEGV (or worse: runs what the pointer leads to).
    let world = World::scripted();
    plugin_folder(world.dir.path(), "adversary", "adversary", "tool");
    let plugins = world.dir.path().join("adversary");
    let root = world.root_str();
    let args = json!({"steps": [
        {"sql": "SELECT hex(fts3_tokenizer(?, ?)) AS p",
         "params": ["evil", "A\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}"]},
        {"sql": "CREATE VIRTUAL TABLE v USING fts3(tokenize=evil)", "write": true},
    ]})
    .to_string();
    let out = trellis(&[
        "tool",
        "call",
        "adversary:db_steps",
        "--root",
        root.as_str(),
        "--db",
        "db/db.sqlite",
        "--db-write",
        "--args",
        args.as_str(),
        "--plugins",
        plugins.to_str().unwrap(),
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{:?}: {stderr}", out.status);
    assert!(
        stderr.contains("error: adversary:db_steps: failed: sql: not authorized"),
        "{stderr}"
    );
}

#[test]
fn a_foreach_source_sql_does_not_read_a_database_behind_a_linked_db_folder() {
    // A workspace whose `db` folder is a link to another project's `db` folder: the turn
    // grant refuses it, and so must the foreach query, or that project's rows reach the model.
    // (Tried by the red team; not a hole: it holds.)
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let world = World::new(
        json!({"id": "each", "type": "message_sequence", "title": "Each", "description": "d",
               "items": [{"id": "rows", "type": "foreach",
                          "source_sql": "SELECT secret FROM other_project",
                          "message": "Row {{.secret}}"}]}),
        json!([]),
    );
    let other = world.dir.path().join("outside/db");
    create_db(
        &world.dir.path().join("outside"),
        "CREATE TABLE other_project (secret TEXT); INSERT INTO other_project VALUES ('s3cr3t');",
    );
    std::fs::remove_dir_all(world.root().join("db")).unwrap();
    std::os::unix::fs::symlink(&other, world.root().join("db")).unwrap();
    write_file(
        &world.root(),
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": server.providers()})
            .to_string(),
    );
    let before = tree_digest(&world.dir.path().join("outside"));
    let out = trellis(&["run", &world.root_str(), "--allow-host", "127.0.0.1"]);
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        !serde_json::to_string(&server.seen())
            .unwrap()
            .contains("s3cr3t"),
        "a row of the database outside the workspace reached the model: {all}"
    );
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("db is a symbolic link; Trellis does not read or write through links"),
        "{all}"
    );
    assert_eq!(tree_digest(&world.dir.path().join("outside")), before);
}
