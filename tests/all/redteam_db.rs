//! Attacks on the database tools of agent turns and on the folder operations a plan can
//! trigger (emptying, archiving, answer files, retention, variables, skills, soul), through
//! the binary against the fake OpenAI-compatible server. Each asserts the denial and that
//! nothing outside the grant changed.

use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::agent_db_tools::workspace;
use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion, result_of};
use support::workspace::{create_db, write_file, write_files};
use support::{tree_digest, trellis_command};

/// A server answering the n-th request with `replies[n]` (the last one after that).
fn scripted(replies: Vec<Value>) -> FakeServer {
    let n = Arc::new(AtomicUsize::new(0));
    FakeServer::start(Box::new(move |_| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        (200, replies[i.min(replies.len() - 1)].clone())
    }))
}

fn call(id: &str, name: &str, args: Value) -> Value {
    json!({"id": id, "type": "function",
           "function": {"name": name, "arguments": args.to_string()}})
}

/// A completion asking for `calls` (built with [`call`]).
fn calls(calls: Vec<Value>) -> Value {
    let mut c = completion("", &[("x", json!({}))]);
    c["choices"][0]["message"]["tool_calls"] = Value::Array(calls);
    c
}

use crate::support::plugin_build::text;

/// `trellis run ROOT ARGS`, killed if it has not ended after two minutes (a run that loops
/// forever fails its test instead of hanging it); the operator approves loopback, where the
/// workspace's fake LLM is.
fn run(root: &Path, args: &[&str]) -> std::process::Output {
    let logs = tempfile::tempdir().unwrap();
    let (stdout, stderr) = (logs.path().join("out"), logs.path().join("err"));
    let root = root.to_str().unwrap();
    let approved = ["run", root, "--allow-host", "127.0.0.1"];
    let mut child = trellis_command(&[&approved[..], args].concat())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > std::time::Duration::from_secs(120) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "trellis run {root} {args:?} did not end: {}",
                std::fs::read_to_string(&stdout).unwrap()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    std::process::Output {
        status,
        stdout: std::fs::read(&stdout).unwrap(),
        stderr: std::fs::read(&stderr).unwrap(),
    }
}

fn rows(root: &Path, sql: &str) -> Vec<String> {
    let conn = rusqlite::Connection::open(root.join("db/db.sqlite")).unwrap();
    let mut stmt = conn.prepare(sql).unwrap();
    stmt.query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect()
}

/// The workspace's tree without the run folder and `db/assets/` (which a turn creates).
fn hex_digest(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// `runs/` is never walked: a test may plant a FIFO there.
fn outside_the_run(root: &Path) -> std::collections::BTreeMap<String, String> {
    let mut tree = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(root).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name == "runs" {
            continue;
        }
        let path = root.join(&name);
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.is_symlink() {
            let target = std::fs::read_link(&path).unwrap();
            tree.insert(name, format!("link -> {}", target.display()));
        } else if meta.is_dir() {
            tree.insert(name.clone(), "dir".to_string());
            for (k, v) in tree_digest(&path) {
                tree.insert(format!("{name}/{k}"), v);
            }
        } else {
            tree.insert(name, hex_digest(&std::fs::read(&path).unwrap()));
        }
    }
    tree.retain(|k, _| !k.starts_with("db/assets"));
    tree
}

// ------------------------------------------------------------------------- SQL

/// Transaction control hidden behind comments or case, `SAVEPOINT`/`RELEASE`, `DETACH`,
/// `fts3_tokenizer`, a schema-qualified pragma, the page-writing `sqlite_dbpage` table,
/// temporary triggers and tables through the read-only tool, and a value past the size
/// limit (a parameter that large cannot arrive: the model's answer is capped at 4 MiB): each is refused, the database and everything else unchanged.
#[test]
fn odd_sql_through_the_db_tools_is_refused_and_changes_nothing() {
    let outside = tempfile::tempdir().unwrap();
    let mutate = |sql: &str| json!({"statements": [{"sql": "DELETE FROM t"}, {"sql": sql}]});
    let attacks: Vec<(&str, &str, Value, &str)> = vec![
        (
            "savepoint",
            "mutate_workflow_db",
            mutate("SAVEPOINT s"),
            "not allowed",
        ),
        (
            "release",
            "mutate_workflow_db",
            mutate("RELEASE s"),
            "not allowed",
        ),
        (
            "begin",
            "mutate_workflow_db",
            mutate("begin deferred"),
            "not allowed",
        ),
        (
            "end",
            "mutate_workflow_db",
            mutate("END TRANSACTION"),
            "not allowed",
        ),
        (
            "rollback",
            "mutate_workflow_db",
            mutate("ROLLBACK"),
            "not allowed",
        ),
        (
            "commented-commit",
            "mutate_workflow_db",
            mutate("/* a */ -- b\n\t CoMmIt"),
            "not allowed",
        ),
        ("detach", "mutate_workflow_db", mutate("DETACH main"), ""),
        (
            "tokenizer",
            "query_workflow_db",
            json!({"sql": "SELECT fts3_tokenizer('simple')"}),
            "not authorized",
        ),
        (
            "tokenizer-set",
            "mutate_workflow_db",
            mutate("SELECT fts3_tokenizer('simple', x'4141414141414141')"),
            "",
        ),
        (
            "qualified-pragma",
            "mutate_workflow_db",
            mutate("PRAGMA main.journal_mode = OFF"),
            "not authorized",
        ),
        (
            "synchronous",
            "mutate_workflow_db",
            mutate("PRAGMA synchronous = OFF"),
            "not authorized",
        ),
        (
            "query-only-off",
            "query_workflow_db",
            json!({"sql": "PRAGMA query_only = 0"}),
            "not authorized",
        ),
        (
            "vacuum-commented",
            "mutate_workflow_db",
            mutate(&format!(
                "-- x\n/**/vacuum main into '{}'",
                outside.path().join("c.db").display()
            )),
            "VACUUM is not allowed",
        ),
        (
            "dbpage",
            "mutate_workflow_db",
            mutate("INSERT INTO sqlite_dbpage VALUES (1, zeroblob(4096))"),
            "",
        ),
        (
            "temp-trigger",
            "query_workflow_db",
            json!({"sql": "CREATE TEMP TRIGGER tt AFTER INSERT ON t BEGIN DELETE FROM t; END"}),
            "read-only",
        ),
        (
            "temp-table",
            "query_workflow_db",
            json!({"sql": "CREATE TEMP TABLE x AS SELECT * FROM t"}),
            "read-only",
        ),
        (
            "cte-write",
            "query_workflow_db",
            json!({"sql": "WITH c AS (SELECT 1) UPDATE t SET x = 0"}),
            "read-only",
        ),
        (
            "huge-value",
            "mutate_workflow_db",
            mutate("INSERT INTO t VALUES (zeroblob(17000000))"),
            "too big",
        ),
    ];
    let server = scripted(vec![
        calls(
            attacks
                .iter()
                .map(|(id, tool, args, _)| call(id, tool, args.clone()))
                .collect(),
        ),
        calls(vec![call(
            "after",
            "query_workflow_db",
            json!({"sql": "SELECT count(*) AS n FROM t"}),
        )]),
        completion("done", &[]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([{"id": "go", "type": "user_message", "message": "Try."}]),
        json!({}),
    );
    let db_before = std::fs::read(root.join("db/db.sqlite")).unwrap();
    let before = outside_the_run(root);
    let out = run(root, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let results = server.last_tool_results();
    for (id, _, _, why) in &attacks {
        let result = result_of(&results, id);
        assert!(
            result.starts_with("error:") && result.contains(why),
            "{id}: {result}"
        );
    }
    assert!(
        result_of(&results, "after").contains("\"n\":3"),
        "{results:?}"
    );
    assert_eq!(std::fs::read(root.join("db/db.sqlite")).unwrap(), db_before);
    assert_eq!(outside_the_run(root), before);
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}

/// A writable turn plants a trigger, an `INSTEAD OF` trigger on a view, a full-text table
/// and a view over a function; the next turn, narrowed away from the database, reads
/// through all of them and tries to write through each: nothing it does changes a row.
#[test]
fn objects_planted_by_a_writable_turn_write_nothing_in_a_read_only_one() {
    let server = scripted(vec![
        calls(vec![call(
            "plant",
            "mutate_workflow_db",
            json!({"statements": [
                {"sql": "CREATE TABLE log(what TEXT)"},
                {"sql": "CREATE TRIGGER on_update AFTER UPDATE ON t \
                         BEGIN INSERT INTO log VALUES ('updated'); END"},
                {"sql": "CREATE VIEW v AS SELECT x FROM t"},
                {"sql": "CREATE TRIGGER through_view INSTEAD OF INSERT ON v \
                         BEGIN DELETE FROM t; INSERT INTO log VALUES ('view'); END"},
                {"sql": "CREATE VIEW w AS SELECT upper(x) AS u, x FROM t"},
                {"sql": "CREATE VIRTUAL TABLE f USING fts5(body)"},
                {"sql": "INSERT INTO f VALUES ('alpha beta')"}
            ]}),
        )]),
        completion("planted", &[]),
        calls(vec![
            call(
                "read-v",
                "query_workflow_db",
                json!({"sql": "SELECT count(*) AS n FROM v"}),
            ),
            call(
                "read-f",
                "query_workflow_db",
                json!({"sql": "SELECT body FROM f WHERE f MATCH 'alpha'"}),
            ),
            call(
                "read-w",
                "query_workflow_db",
                json!({"sql": "SELECT count(*) AS n FROM w"}),
            ),
            call(
                "insert-v",
                "query_workflow_db",
                json!({"sql": "INSERT INTO v VALUES (9)"}),
            ),
            call(
                "update-t",
                "query_workflow_db",
                json!({"sql": "UPDATE t SET x = x"}),
            ),
            call(
                "fts-optimize",
                "query_workflow_db",
                json!({"sql": "INSERT INTO f(f) VALUES ('optimize')"}),
            ),
            call(
                "mutate-v",
                "mutate_workflow_db",
                json!({"statements": [{"sql": "INSERT INTO v VALUES (9)"}]}),
            ),
        ]),
        completion("done", &[]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([
            {"id": "plant", "type": "user_message", "message": "Plant."},
            {"id": "read", "type": "user_message", "message": "Read.",
             "write_access": {"knowledgebase": true}}
        ]),
        json!({"knowledgebase_access": "read-write"}),
    );
    let out = run(root, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let results = server.last_tool_results();
    assert!(
        result_of(&results, "plant").contains("committed"),
        "{results:?}"
    );
    assert!(
        result_of(&results, "read-v").contains("\"n\":3"),
        "{results:?}"
    );
    assert!(
        result_of(&results, "read-f").contains("alpha beta"),
        "{results:?}"
    );
    assert!(
        result_of(&results, "read-w").contains("\"n\":3"),
        "{results:?}"
    );
    for id in ["insert-v", "update-t", "fts-optimize", "mutate-v"] {
        let r = result_of(&results, id);
        assert!(
            r.starts_with("error:") && r.contains("read-only"),
            "{id}: {r}"
        );
    }
    assert_eq!(
        rows(root, "SELECT CAST(x AS TEXT) FROM t ORDER BY x"),
        ["1", "2", "3"]
    );
    assert!(rows(root, "SELECT what FROM log").is_empty());
}

// ------------------------------------------------------------------------- db files

/// What a database tool call and a `db/assets/` write find when the workspace's `db/` was
/// prepared by an attacker: `db/` a link to another project's folder, `db/db.sqlite` a link
/// or a FIFO, `db/assets` a link out, the rollback journal a link to a file outside. A link
/// or FIFO on the way to the database or its assets refuses the run; a journal link makes
/// SQLite refuse to open the database (the calls fail, the assets write goes through) and
/// the run completes. The outside folder is unchanged.
#[test]
fn links_and_fifos_at_the_database_paths_are_never_followed() {
    /// The run completes (the database calls fail).
    const RAN: &str = "";
    type Plant = fn(&Path, &Path);
    let cases: Vec<(&str, Plant, &str)> = vec![
        (
            "db-folder-link",
            |root, out| {
                std::fs::remove_dir_all(root.join("db")).unwrap();
                std::os::unix::fs::symlink(out, root.join("db")).unwrap();
            },
            "error: db is a symbolic link; Trellis does not read or write through links",
        ),
        (
            "db-file-link",
            |root, out| {
                std::fs::remove_file(root.join("db/db.sqlite")).unwrap();
                std::os::unix::fs::symlink(out.join("db.sqlite"), root.join("db/db.sqlite"))
                    .unwrap();
            },
            "error: db/db.sqlite is a symbolic link; Trellis does not read or write through links",
        ),
        (
            "db-file-fifo",
            |root, _| {
                std::fs::remove_file(root.join("db/db.sqlite")).unwrap();
                let path =
                    std::ffi::CString::new(root.join("db/db.sqlite").to_str().unwrap()).unwrap();
                // SAFETY: a plain libc call on a valid C string.
                assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0);
            },
            "error: db/db.sqlite is not a regular file",
        ),
        (
            "assets-link",
            |root, out| {
                std::os::unix::fs::symlink(out.join("assets"), root.join("db/assets")).unwrap();
            },
            "db/assets is a symbolic link; Trellis does not read or write through links",
        ),
        (
            "journal-link",
            |root, out| {
                std::os::unix::fs::symlink(out.join("journal"), root.join("db/db.sqlite-journal"))
                    .unwrap();
            },
            RAN,
        ),
        (
            "wal-link",
            |root, out| {
                let conn = rusqlite::Connection::open(root.join("db/db.sqlite")).unwrap();
                conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
                    .unwrap();
                drop(conn);
                std::os::unix::fs::symlink(out.join("journal"), root.join("db/db.sqlite-wal"))
                    .unwrap();
                std::os::unix::fs::symlink(out.join("shm"), root.join("db/db.sqlite-shm")).unwrap();
            },
            RAN,
        ),
    ];
    for (name, plant, expected) in cases {
        let outside = tempfile::tempdir().unwrap();
        let out_dir = outside.path();
        create_db(
            out_dir,
            "CREATE TABLE secret(s); INSERT INTO secret VALUES ('other project');",
        );
        std::fs::copy(out_dir.join("db/db.sqlite"), out_dir.join("db.sqlite")).unwrap();
        std::fs::create_dir_all(out_dir.join("assets")).unwrap();
        std::fs::write(out_dir.join("journal"), vec![7u8; 8192]).unwrap();
        std::fs::write(out_dir.join("shm"), vec![9u8; 32768]).unwrap();
        let server = scripted(vec![
            calls(vec![
                call(
                    "q",
                    "query_workflow_db",
                    json!({"sql": "SELECT * FROM secret"}),
                ),
                call(
                    "m",
                    "mutate_workflow_db",
                    json!({"statements": [{"sql": "CREATE TABLE planted(x)"},
                                          {"sql": "INSERT INTO t VALUES (4)"}]}),
                ),
                call(
                    "w",
                    "workspace__write_file",
                    json!({"path": "db/assets/x.txt", "content": "x"}),
                ),
            ]),
            completion("done", &[]),
        ]);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        workspace(
            root,
            &server,
            json!([{"id": "go", "type": "user_message", "message": "Go."}]),
            json!({}),
        );
        plant(root, out_dir);
        let outside_before = tree_digest(out_dir);
        let out = run(root, &[]);
        let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
        if expected == RAN {
            assert_eq!(out.status.code(), Some(0), "{name}: {all}");
            // The link is named (it was a bare "unable to open database file").
            let file = if name == "journal-link" {
                "db/db.sqlite-journal"
            } else {
                "db/db.sqlite-wal"
            };
            let unopened = format!(
                "opening the workflow db: {file} is a symbolic link, so Trellis will not open \
                 it (nor what it points to): remove the link"
            );
            assert_eq!(
                server.last_tool_results(),
                [
                    ("q".to_string(), format!("error: {unopened}")),
                    (
                        "m".to_string(),
                        format!(
                            "error: statements[0]: {unopened}; nothing was changed (the \
                             transaction was rolled back)"
                        )
                    ),
                    (
                        "w".to_string(),
                        r#"{"bytes_written":1,"path":"db/assets/x.txt"}"#.to_string()
                    ),
                ],
                "{name}"
            );
        } else {
            assert_eq!(out.status.code(), Some(1), "{name}: {all}");
            assert!(text(&out.stderr).contains(expected), "{name}: {all}");
        }
        assert_eq!(tree_digest(out_dir), outside_before, "{name}: {all}");
        if out.status.success() {
            let results = server.last_tool_results();
            let q = result_of(&results, "q");
            assert!(!q.contains("other project"), "{name}: {q}");
            if name == "assets-link" {
                let w = result_of(&results, "w");
                assert!(w.starts_with("error"), "{name}: {w}");
            }
        }
    }
}

// ------------------------------------------------------------------------- run folders

/// Writes a plan of human_input steps (`id`, `next_step_id`) and an empty workflow.json.
fn human_plan(root: &Path, steps: &[(&str, &str)], manifest: Value) {
    let steps: Vec<Value> = steps
        .iter()
        .map(|(id, next)| {
            json!({"id": id, "type": "human_input", "title": id, "question": "?",
                   "variable_name": format!("{id}_v"), "response_type": "text",
                   "next_step_id": next})
        })
        .collect();
    write_files(
        root,
        &[
            (
                "planning/plan.json",
                json!({"objective": "x", "steps": steps}).to_string(),
            ),
            (
                "planning/step_config.json",
                json!({"steps": []}).to_string(),
            ),
            ("workflow.json", manifest.to_string()),
            ("knowledgebase/notes/keep.md", "kept".to_string()),
        ],
    );
}

/// An outside folder holding one file, to be pointed at by a planted link.
fn outside_folder() -> tempfile::TempDir {
    let outside = tempfile::tempdir().unwrap();
    write_file(outside.path(), "precious.txt", "do not touch");
    write_file(outside.path(), "sub/deep.txt", "nor this");
    outside
}

/// Links planted where the run empties a step's folder (`--step`), archives a loop's
/// outputs (`execution/archived`), prunes old runs (`runs/iteration-7`, with
/// `run_retention_count: 1`) or keeps the whole run (`runs/iteration-0`, `runs`): the link is
/// refused or removed as a link, never followed; the outside folder is unchanged, and
/// nothing of the workspace outside `runs/` changes.
#[test]
fn links_planted_in_the_run_folders_are_never_followed() {
    type Plant = fn(&Path, &Path);
    let cases: Vec<(&str, Plant, Vec<&str>)> = vec![
        (
            "step-folder",
            |root, out| {
                std::fs::create_dir_all(root.join("runs/iteration-0/execution")).unwrap();
                std::os::unix::fs::symlink(out, root.join("runs/iteration-0/execution/a")).unwrap();
            },
            vec!["--step", "a"],
        ),
        (
            "step-folder-from",
            |root, out| {
                std::fs::create_dir_all(root.join("runs/iteration-0/execution")).unwrap();
                std::os::unix::fs::symlink(out, root.join("runs/iteration-0/execution/b")).unwrap();
            },
            vec!["--from", "a"],
        ),
        (
            "archive",
            |root, out| {
                std::fs::create_dir_all(root.join("runs/iteration-0/execution")).unwrap();
                std::os::unix::fs::symlink(out, root.join("runs/iteration-0/execution/archived"))
                    .unwrap();
            },
            vec!["--from", "a"],
        ),
        (
            "archive-file",
            |root, _| {
                write_file(root, "runs/iteration-0/execution/archived", "a file");
            },
            vec!["--from", "a"],
        ),
        (
            "archive-run",
            |root, out| {
                std::fs::create_dir_all(root.join("runs/iteration-0/execution/archived")).unwrap();
                std::os::unix::fs::symlink(
                    out,
                    root.join("runs/iteration-0/execution/archived/run-1"),
                )
                .unwrap();
            },
            vec!["--from", "a"],
        ),
        (
            "retention",
            |root, out| {
                std::fs::create_dir_all(root.join("runs/iteration-0/execution")).unwrap();
                std::fs::create_dir_all(root.join("runs/iteration-8")).unwrap();
                std::fs::create_dir_all(root.join("runs/iteration-9")).unwrap();
                std::os::unix::fs::symlink(out, root.join("runs/iteration-7")).unwrap();
            },
            vec![],
        ),
        (
            "active-run",
            |root, out| {
                std::fs::create_dir_all(root.join("runs")).unwrap();
                std::os::unix::fs::symlink(out, root.join("runs/iteration-0")).unwrap();
            },
            vec!["--from", "a"],
        ),
        (
            "active-run-full",
            |root, out| {
                std::fs::create_dir_all(root.join("runs")).unwrap();
                std::os::unix::fs::symlink(out, root.join("runs/iteration-0")).unwrap();
            },
            vec![],
        ),
        (
            "runs",
            |root, out| std::os::unix::fs::symlink(out, root.join("runs")).unwrap(),
            vec!["--from", "a"],
        ),
    ];
    for (name, plant, args) in cases {
        let outside = outside_folder();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // a -> b -> a: the second visit of `a` is a jump that archives both outputs.
        human_plan(
            root,
            &[("a", "b"), ("b", "a")],
            json!({"run_retention_count": 1}),
        );
        plant(root, outside.path());
        let outside_before = tree_digest(outside.path());
        let before = outside_the_run(root);
        let mut args = args.clone();
        args.extend(["--input", "a_v=x", "--input", "b_v=y"]);
        let out = run(root, &args);
        let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(tree_digest(outside.path()), outside_before, "{name}: {all}");
        assert_eq!(outside_the_run(root), before, "{name}: {all}");
    }
}

/// `variables/`, `skills/<name>/`, `learnings/<name>/` and `soul/` planted as links to a
/// folder outside: none of its text reaches the model, a read through the tools fails, and
/// the outside folder is unchanged.
#[test]
fn variables_skills_and_soul_behind_links_are_not_read() {
    let outside = tempfile::tempdir().unwrap();
    write_files(
        outside.path(),
        &[
            (
                "variables.json",
                json!({"variables": [{"name": "LEAK", "value": "outside-variable"}]}).to_string(),
            ),
            ("SKILL.md", "outside-skill".to_string()),
            ("soul.md", "outside-soul".to_string()),
        ],
    );
    let server = scripted(vec![
        calls(vec![
            call(
                "skill",
                "workspace__read_file",
                json!({"path": "skills/evil/SKILL.md"}),
            ),
            call(
                "learned",
                "workspace__read_file",
                json!({"path": "learnings/evil2/SKILL.md"}),
            ),
            call(
                "soul",
                "workspace__read_file",
                json!({"path": "soul/soul.md"}),
            ),
            call(
                "vars",
                "workspace__read_file",
                json!({"path": "variables/variables.json"}),
            ),
            call(
                "write",
                "workspace__write_file",
                json!({"path": "skills/evil/SKILL.md", "content": "changed"}),
            ),
        ]),
        completion("done", &[]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([{"id": "go", "type": "user_message", "message": "Use {{LEAK}}."}]),
        json!({"enabled_skills": ["evil", "evil2"]}),
    );
    for link in ["variables", "skills/evil", "learnings/evil2", "soul"] {
        std::fs::create_dir_all(root.join(link).parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join(link)).unwrap();
    }
    let outside_before = tree_digest(outside.path());
    let before = outside_the_run(root);
    let out = run(root, &[]);
    let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
    for body in server.seen() {
        let body = body.to_string();
        for secret in ["outside-variable", "outside-skill", "outside-soul"] {
            assert!(!body.contains(secret), "{secret} reached the model: {all}");
        }
    }
    assert!(!all.contains("outside-"), "{all}");
    assert_eq!(tree_digest(outside.path()), outside_before);
    assert_eq!(outside_the_run(root), before, "{all}");
}

/// A human_input step's `context_output` given as an absolute path into the workspace (or
/// out of it), directly or through a variable, and `variable_name`s with path characters:
/// the answer file is written in the step's output folder or the run is refused; nothing
/// outside the run folder changes.
#[test]
fn answer_files_stay_in_the_steps_output_folder() {
    let outside = outside_folder();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let inside = root.join("planning/plan.json").display().to_string();
    let cases: Vec<(Value, Value)> = vec![
        (json!({"context_output": inside}), json!({})),
        (
            json!({"context_output": "{{TARGET}}"}),
            json!({"variables": {"TARGET": inside}}),
        ),
        (
            json!({"context_output": outside.path().join("precious.txt").display().to_string()}),
            json!({}),
        ),
        (
            json!({"context_output": "./../../../knowledgebase/notes/keep.md"}),
            json!({}),
        ),
        (
            json!({"variable_name": "../../../knowledgebase/notes/keep.md"}),
            json!({}),
        ),
        (json!({"variable_name": "a/b\n{{x}}"}), json!({})),
        // `.` named the output folder itself, which became the answer file (round 30).
        (
            json!({"context_output": "{{TARGET}}"}),
            json!({"variables": {"TARGET": "."}}),
        ),
    ];
    for (step, manifest) in cases {
        let mut ask = json!({"id": "ask", "type": "human_input", "title": "Ask",
                             "question": "?", "variable_name": "v", "response_type": "text",
                             "next_step_id": "end"});
        for (k, v) in step.as_object().unwrap() {
            ask[k] = v.clone();
        }
        let key = ask["variable_name"].as_str().unwrap().to_string();
        write_files(
            root,
            &[
                (
                    "planning/plan.json",
                    json!({"objective": "x", "steps": [ask]}).to_string(),
                ),
                (
                    "planning/step_config.json",
                    json!({"steps": []}).to_string(),
                ),
                ("workflow.json", manifest.to_string()),
                ("knowledgebase/notes/keep.md", "kept".to_string()),
            ],
        );
        let outside_before = tree_digest(outside.path());
        let before = outside_the_run(root);
        let out = run(
            root,
            &["--input", &format!("{key}=answer"), "--input", "v=answer"],
        );
        let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(tree_digest(outside.path()), outside_before, "{step}: {all}");
        assert_eq!(outside_the_run(root), before, "{step}: {all}");
        let output = step["context_output"].as_str().unwrap_or_default();
        if output.starts_with('/') || output.starts_with("{{") || output.contains("..") {
            assert!(
                !out.status.success()
                    && all.contains("does not name a file in the step's output folder"),
                "{step}: {all}"
            );
            let folder = root.join("runs/iteration-0/execution/ask");
            assert!(!folder.is_file(), "{step}: {all}");
        }
        let _ = std::fs::remove_dir_all(root.join("runs"));
    }
}

/// Retention meets odd entries under `runs/`: a link to an outside folder, a FIFO and a file
/// named like archived runs, and names rotation never makes (`iteration-01`, `iteration-+4`,
/// a number past `u64`). The link and the others named like runs are removed as themselves,
/// the odd names are left (the active run becomes `iteration-5`: `+4` reads as 4), and the
/// outside folder is unchanged.
#[test]
fn retention_removes_links_and_odd_entries_as_themselves() {
    let outside = outside_folder();
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([{"id": "go", "type": "user_message", "message": "Go."}]),
        json!({}),
    );
    write_file(
        root,
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"},
               "providers": server.providers(), "run_retention_count": 1})
        .to_string(),
    );
    write_file(root, "runs/iteration-0/marker", "x");
    std::os::unix::fs::symlink(outside.path(), root.join("runs/iteration-1")).unwrap();
    let fifo = std::ffi::CString::new(root.join("runs/iteration-2").to_str().unwrap()).unwrap();
    // SAFETY: a plain libc call on a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    write_file(root, "runs/iteration-3", "a file");
    for odd in [
        "iteration-01",
        "iteration-+4",
        "iteration-99999999999999999999999",
    ] {
        write_file(root, &format!("runs/{odd}/marker"), "odd");
    }
    let outside_before = tree_digest(outside.path());
    let before = outside_the_run(root);
    let out = run(root, &[]);
    let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{all}");
    let mut left: Vec<String> = std::fs::read_dir(root.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "iteration-0",
            "iteration-01",
            "iteration-5",
            "iteration-+4",
            "iteration-99999999999999999999999"
        ]
        .iter()
        .map(|s| s.to_string())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>(),
        "{all}"
    );
    assert_eq!(tree_digest(outside.path()), outside_before);
    assert_eq!(outside_the_run(root), before);
}

/// `context_dependencies` and `enabled_skills` naming a hidden folder by an absolute path,
/// through `./` or `..`, or through a link inside the workspace (`knowledgebase/plans ->
/// ../planning`, `skills/plans -> ../planning`): the step fails or the entry is left out, and
/// nothing of `planning/` reaches the model.
#[test]
fn context_dependencies_and_skills_cannot_reach_hidden_folders() {
    let deps = [
        "<root>/planning",
        "./planning",
        "knowledgebase/../planning",
        "knowledgebase/plans",
        "knowledgebase/plans/secret.md",
    ];
    let skills = [
        "../planning",
        "skills/../planning",
        "<root>/planning",
        "planning/",
        "plans",
        "runs/iteration-0/logs",
    ];
    let cases = deps
        .iter()
        .map(|d| ("context_dependencies", d))
        .chain(skills.iter().map(|s| ("enabled_skills", s)));
    for (field, dep) in cases {
        let server = scripted(vec![
            calls(vec![call(
                "read",
                "workspace__read_file",
                json!({"path": "planning/secret.md"}),
            )]),
            completion("done", &[]),
        ]);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let dep = dep.replace("<root>", &root.display().to_string());
        write_file(root, "planning/secret.md", "planning-secret");
        workspace(
            root,
            &server,
            json!([{"id": "go", "type": "user_message", "message": "Go."}]),
            json!({}),
        );
        if field == "context_dependencies" {
            let mut plan = support::workspace::read_json(&root.join("planning/plan.json"));
            plan["steps"][0]["context_dependencies"] = json!([dep]);
            write_file(root, "planning/plan.json", plan.to_string());
        } else {
            write_file(
                root,
                "planning/step_config.json",
                json!({"steps": [{"id": "work", "agent_configs": {"enabled_skills": [dep]}}]})
                    .to_string(),
            );
        }
        std::fs::create_dir_all(root.join("skills")).unwrap();
        std::os::unix::fs::symlink("../planning", root.join("knowledgebase/plans")).unwrap();
        std::os::unix::fs::symlink("../planning", root.join("skills/plans")).unwrap();
        std::fs::create_dir_all(root.join("runs/iteration-0/logs")).unwrap();
        let before = outside_the_run(root);
        let out = run(root, &[]);
        let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
        for body in server.seen() {
            assert!(
                !body.to_string().contains("planning-secret"),
                "{field} {dep}: planning/ reached the model: {all}"
            );
        }
        if out.status.success() {
            let read = result_of(&server.last_tool_results(), "read");
            assert!(read.starts_with("error"), "{field} {dep}: {read}");
        }
        assert_eq!(outside_the_run(root), before, "{field} {dep}: {all}");
    }
}

/// FIFOs at files the run or a turn's tools read: the run ends instead of waiting for a
/// writer, and nothing outside the run folder changes. The files the run reads before any
/// step (`variables/variables.json`, `db/seed.sql`) refuse the run; the ones only a turn's
/// tools read (`soul/soul.md`, a skill's `SKILL.md`) fail the read, and the run goes on.
#[test]
fn fifos_where_the_run_reads_do_not_hang_it() {
    /// The run stops with this error.
    const REFUSED: bool = true;
    let special = "is not a regular file";
    let variables = format!(
        "error: variables/variables.json: cannot be read: variables/variables.json {special} \
         (a FIFO, socket or device); Trellis reads and writes only regular files"
    );
    let denied = |path: &str| {
        format!(
            "error: workspace:read_file: denied: `{path}` is a FIFO, socket or device: only \
             regular files and folders can be opened"
        )
    };
    for (fifo, refused, expected) in [
        ("variables/variables.json", REFUSED, variables),
        ("soul/soul.md", !REFUSED, denied("soul/soul.md")),
        ("skills/s/SKILL.md", !REFUSED, denied("skills/s/SKILL.md")),
        (
            "db/seed.sql",
            REFUSED,
            format!("error: db/seed.sql {special}"),
        ),
    ] {
        let server = scripted(vec![
            calls(vec![call(
                "read",
                "workspace__read_file",
                json!({"path": fifo}),
            )]),
            completion("done", &[]),
        ]);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        workspace(
            root,
            &server,
            json!([{"id": "go", "type": "user_message", "message": "Go."}]),
            json!({"enabled_skills": ["s"]}),
        );
        std::fs::create_dir_all(root.join(fifo).parent().unwrap()).unwrap();
        let path = std::ffi::CString::new(root.join(fifo).to_str().unwrap()).unwrap();
        // SAFETY: a plain libc call on a valid C string.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0);
        let listing = |root: &Path| {
            let mut names: Vec<String> = walk_names(root);
            names.retain(|n| !n.starts_with("runs") && !n.starts_with("db/assets"));
            names
        };
        let before = listing(root);
        let out = run(root, &[]);
        let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
        if refused {
            assert_eq!(out.status.code(), Some(1), "{fifo}: {all}");
            assert!(text(&out.stderr).contains(&expected), "{fifo}: {all}");
            assert!(server.seen().is_empty(), "{fifo}: the model was called");
        } else {
            assert_eq!(out.status.code(), Some(0), "{fifo}: {all}");
            let read = result_of(&server.last_tool_results(), "read");
            assert_eq!(read, expected, "{fifo}");
        }
        assert_eq!(listing(root), before, "{fifo}: {all}");
    }
}

/// Every path under `root`, without reading any file (a FIFO among them).
fn walk_names(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            out.push(path.strip_prefix(root).unwrap().display().to_string());
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

/// A database the workspace brings with functions no statement may call, planted in its
/// schema: a view over `load_extension`, a trigger calling `fts3_tokenizer` with a pointer;
/// or a `CHECK` and a column default calling `load_extension` (written into `sqlite_schema`
/// by hand, as SQLite refuses to create them). Reading the view and writing the tables fail
/// (the second schema is refused whole, `trusted_schema` being off); the database is
/// unchanged.
#[test]
fn functions_planted_in_the_schema_are_fenced_like_statements() {
    let schemas = [
        (
            "CREATE VIEW v AS SELECT load_extension('/tmp/trellis-no-such.so') AS l;
             CREATE TRIGGER tr AFTER INSERT ON t
               BEGIN SELECT fts3_tokenizer('simple', x'4141414141414141'); END;",
            ["load_extension", "fts3_tokenizer"],
        ),
        (
            "CREATE TABLE c(x, y);
             PRAGMA writable_schema = ON;
             UPDATE sqlite_schema SET sql = 'CREATE TABLE c(
                 x CHECK (load_extension(''/tmp/trellis-no-such.so'') IS NULL),
                 y DEFAULT (load_extension(''/tmp/trellis-no-such.so'')))' WHERE name = 'c';
             PRAGMA writable_schema = OFF;",
            ["malformed database schema", "malformed database schema"],
        ),
    ];
    for (schema, why) in schemas {
        let server = scripted(vec![
            calls(vec![
                call(
                    "view",
                    "query_workflow_db",
                    json!({"sql": "SELECT * FROM v"}),
                ),
                call(
                    "write",
                    "mutate_workflow_db",
                    json!({"statements": [{"sql": "INSERT INTO t VALUES (4)"}]}),
                ),
            ]),
            completion("done", &[]),
        ]);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        workspace(
            root,
            &server,
            json!([{"id": "go", "type": "user_message", "message": "Go."}]),
            json!({}),
        );
        create_db(root, schema);
        let db_before = std::fs::read(root.join("db/db.sqlite")).unwrap();
        let out = run(root, &[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let results = server.last_tool_results();
        for (id, why) in ["view", "write"].iter().zip(why) {
            let r = result_of(&results, id);
            assert!(r.starts_with("error:") && r.contains(why), "{id}: {r}");
        }
        assert_eq!(std::fs::read(root.join("db/db.sqlite")).unwrap(), db_before);
    }
}

/// A runaway recursive CTE through each tool, in a mutation too (where it would hold the
/// write lock): both are stopped at the call's deadline (30 s), the mutation is rolled back,
/// and the turn goes on to its answer.
#[test]
fn runaway_statements_through_the_binary_end_at_the_calls_deadline() {
    let runaway = "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) \
                   SELECT count(*) FROM c";
    let server = scripted(vec![
        calls(vec![
            call("query", "query_workflow_db", json!({"sql": runaway})),
            call(
                "mutate",
                "mutate_workflow_db",
                json!({"statements": [{"sql": "DELETE FROM t"},
                                      {"sql": format!("INSERT INTO t {runaway}")}]}),
            ),
        ]),
        completion("done", &[]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        json!([{"id": "go", "type": "user_message", "message": "Count."}]),
        json!({}),
    );
    let db_before = std::fs::read(root.join("db/db.sqlite")).unwrap();
    let out = run(root, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let results = server.last_tool_results();
    for id in ["query", "mutate"] {
        let r = result_of(&results, id);
        assert!(
            r.starts_with("error:") && r.contains("ran past its deadline"),
            "{id}: {r}"
        );
    }
    assert_eq!(std::fs::read(root.join("db/db.sqlite")).unwrap(), db_before);
}
