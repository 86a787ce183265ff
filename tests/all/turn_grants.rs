//! write_access as capability grants (spec section 6, issue 4 point 4), with real plugins:
//! the grant of each turn is computed from a real plan and step config, and the bundled
//! `workspace` plugin (and the `adversary` test plugin for the database) are called under it.
//! Every test shows both sides: the denial without the access, the write with it, and that
//! nothing outside what the turn may write changed.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use support::grants::{item_grant, reflection_grant};
use support::workspace::{create_db, write_files};
use support::{registry, registry_with_adversary, tree_digest};
use trellis_runner::grants::TurnGrant;
use trellis_sandbox::{Access, Limits, PluginRegistry, ToolCallError};
use trellis_workflow::Workspace;

const PLAN: &str = r#"{
  "objective": "grant tests",
  "steps": [
    {"id": "writer", "type": "message_sequence", "title": "Writer", "description": "writes",
     "items": [
       {"id": "free", "type": "user_message", "message": "go"},
       {"id": "no-kb", "type": "user_message", "message": "go",
        "write_access": {"knowledgebase": false}},
       {"id": "no-learnings", "type": "user_message", "message": "go",
        "write_access": {"learnings": false}},
       {"id": "no-db", "type": "user_message", "message": "go", "write_access": {"db": false}},
       {"id": "kb-only", "type": "user_message", "message": "go", "kind": "knowledgebase"},
       {"id": "kb-and-db", "type": "user_message", "message": "go",
        "write_access": {"knowledgebase": true, "db": true}}
     ]},
    {"id": "reader", "type": "message_sequence", "title": "Reader", "description": "reads",
     "items": [
       {"id": "wants-all", "type": "user_message", "message": "go",
        "write_access": {"knowledgebase": true, "learnings": true, "db": true}}
     ]}
  ]
}"#;

const STEP_CONFIG: &str = r#"{"steps": [
  {"id": "writer", "agent_configs": {
     "knowledgebase_contribution": "escalation notes",
     "learning_objective": "what slowed triage down"}},
  {"id": "reader", "agent_configs": {
     "knowledgebase_access": "read", "learnings_access": "read",
     "additional_read_paths": ["reference"]}}
]}"#;

struct Fixture {
    dir: tempfile::TempDir,
    ws: Workspace,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let files: &[(&str, &str)] = &[
            ("planning/plan.json", PLAN),
            ("planning/step_config.json", STEP_CONFIG),
            ("code/writer/main.py", "print('secret script')\n"),
            ("builder/conversation/x.json", "{}"),
            ("knowledgebase/policy.md", "Refunds within 30 days.\n"),
            ("knowledgebase/notes/escalation.md", "Escalate P1.\n"),
            ("learnings/_global/general.md", "Be brief.\n"),
            ("learnings/writer/own.md", "Check the queue first.\n"),
            ("reference/sla.md", "P1: 1 hour.\n"),
        ];
        write_files(root, files);
        create_db(
            root,
            "CREATE TABLE tickets (id INTEGER); INSERT INTO tickets VALUES (1);",
        );
        let ws = Workspace::open(root).expect("the test workspace loads");
        Fixture { dir, ws }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn grant(&self, step_id: &str, item_id: &str) -> TurnGrant {
        item_grant(&self.ws, step_id, item_id)
    }

    fn reflection(&self, step_id: &str) -> TurnGrant {
        reflection_grant(&self.ws, step_id)
    }

    fn digest(&self) -> BTreeMap<String, String> {
        tree_digest(self.root())
    }
}

async fn call(
    registry: &PluginRegistry,
    tool: &str,
    args: Value,
    grant: &TurnGrant,
) -> Result<Value, ToolCallError> {
    registry
        .call_tool(tool, &args, &grant.grant, &Limits::default())
        .await
}

async fn write(
    registry: &PluginRegistry,
    path: &str,
    grant: &TurnGrant,
) -> Result<Value, ToolCallError> {
    call(
        registry,
        "workspace:write_file",
        json!({"path": path, "content": "written by a turn\n"}),
        grant,
    )
    .await
}

/// `after` equals `before` except for `changed`, which is new (or different) in `after`.
fn only_changed(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
    changed: &[&str],
) {
    let mut expected = before.clone();
    for rel in changed {
        let value = after
            .get(*rel)
            .unwrap_or_else(|| panic!("{rel} was not written"));
        assert_ne!(before.get(*rel), Some(value), "{rel} did not change");
        expected.insert(rel.to_string(), value.clone());
    }
    assert_eq!(after, &expected, "something outside the grant changed");
}

#[tokio::test]
async fn knowledgebase_notes_are_writable_only_with_knowledgebase_write_access() {
    let registry = registry().await;
    let fx = Fixture::new();
    let denied = [
        fx.grant("writer", "no-kb"),
        fx.grant("reader", "wants-all"),
        fx.reflection("reader"),
    ];
    let allowed = fx.grant("writer", "free");
    let before = fx.digest();

    for grant in &denied {
        let err = write(&registry, "knowledgebase/notes/x.md", grant)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "denied", "{err}");
        // The notes stay readable.
        let read = call(
            &registry,
            "workspace:read_file",
            json!({"path": "knowledgebase/notes/escalation.md"}),
            grant,
        )
        .await
        .unwrap();
        assert_eq!(read["content"], "Escalate P1.\n");
        assert!(grant.describe().contains("- knowledgebase/ (read-only)"));
        assert!(
            !grant
                .describe()
                .contains("knowledgebase/notes/ (read-write)")
        );
    }
    assert_eq!(fx.digest(), before);

    write(&registry, "knowledgebase/notes/x.md", &allowed)
        .await
        .unwrap();
    assert!(
        allowed
            .describe()
            .contains("- knowledgebase/notes/ (read-write)")
    );
    // Only notes/, never the rest of the knowledgebase.
    let err = write(&registry, "knowledgebase/policy.md", &allowed)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "denied", "{err}");
    only_changed(&before, &fx.digest(), &["knowledgebase/notes/x.md"]);
}

#[tokio::test]
async fn global_learnings_are_writable_only_with_learnings_write_access() {
    let registry = registry().await;
    let fx = Fixture::new();
    let denied = [
        fx.grant("writer", "no-learnings"),
        fx.grant("writer", "kb-only"),
        fx.grant("reader", "wants-all"),
    ];
    let allowed = [fx.grant("writer", "free"), fx.reflection("writer")];
    let before = fx.digest();

    // The step's own learnings are readable, never writable: read-only for the writer's
    // turns, not granted at all to the reader's.
    let own = "`learnings/writer/new.md`";
    let read_only = format!("workspace:write_file: denied: {own} is in a read-only folder");
    let not_granted =
        format!("workspace:write_file: denied: {own} is outside the folders granted to this call");
    for (grant, own_denied) in denied.iter().zip([&read_only, &read_only, &not_granted]) {
        let err = write(&registry, "learnings/_global/new.md", grant)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "denied", "{err}");
        let err = write(&registry, "learnings/writer/new.md", grant)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "denied", "{err}");
        assert_eq!(err.to_string(), *own_denied);
    }
    assert_eq!(fx.digest(), before);

    for (i, grant) in allowed.iter().enumerate() {
        let path = format!("learnings/_global/new-{i}.md");
        write(&registry, &path, grant).await.unwrap();
        let err = write(&registry, "learnings/writer/new.md", grant)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "denied", "{err}");
    }
    only_changed(
        &before,
        &fx.digest(),
        &["learnings/_global/new-0.md", "learnings/_global/new-1.md"],
    );
}

#[tokio::test]
async fn the_reflection_turn_writes_only_the_stores_due() {
    let registry = registry().await;
    let fx = Fixture::new();
    let grant = fx.reflection("writer");
    let before = fx.digest();
    for path in [
        "runs/iteration-0/execution/writer/report.json",
        "runs/iteration-0/execution/Downloads/x",
    ] {
        let err = write(&registry, path, &grant).await.unwrap_err();
        assert_eq!(err.kind(), "denied", "{path}: {err}");
    }
    write(&registry, "knowledgebase/notes/lesson.md", &grant)
        .await
        .unwrap();
    write(&registry, "learnings/_global/lesson.md", &grant)
        .await
        .unwrap();
    only_changed(
        &before,
        &fx.digest(),
        &[
            "knowledgebase/notes/lesson.md",
            "learnings/_global/lesson.md",
        ],
    );
}

#[tokio::test]
async fn db_mutations_need_db_write_access() {
    let registry = registry_with_adversary().await;
    let fx = Fixture::new();
    let denied = [fx.grant("writer", "no-db"), fx.grant("writer", "kb-only")];
    let allowed = [fx.grant("writer", "free"), fx.grant("reader", "wants-all")];
    let before = fx.digest();

    for grant in &denied {
        assert_eq!(grant.db_writable, Some(false));
        assert!(grant.describe().contains("query only"));
        let err = call(
            &registry,
            "adversary:db_execute",
            json!({"sql": "INSERT INTO tickets VALUES (2)"}),
            grant,
        )
        .await
        .unwrap_err();
        assert!(err.to_string().to_lowercase().contains("read"), "{err}");
        let rows = call(
            &registry,
            "adversary:db_query",
            json!({"sql": "SELECT count(*) AS n FROM tickets"}),
            grant,
        )
        .await
        .unwrap();
        assert_eq!(rows, json!([{"n": 1}]));
    }
    assert_eq!(fx.digest(), before, "a read-only turn changed the database");

    // The reader step's item asks for db writes; a step has them by default, so it gets them.
    for grant in &allowed {
        let changed = call(
            &registry,
            "adversary:db_execute",
            json!({"sql": "INSERT INTO tickets VALUES (2)"}),
            grant,
        )
        .await
        .unwrap();
        assert_eq!(changed, json!({"changed": 1}));
    }
    let conn = rusqlite::Connection::open(fx.root().join("db/db.sqlite")).unwrap();
    let n: i64 = conn
        .query_row("SELECT count(*) FROM tickets", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 3);
    let after = fx.digest();
    let mut outside_db = before.clone();
    outside_db.retain(|k, _| !k.starts_with("db/"));
    let mut after_outside_db = after.clone();
    after_outside_db.retain(|k, _| !k.starts_with("db/"));
    assert_eq!(after_outside_db, outside_db);
}

#[tokio::test]
async fn planning_code_and_builder_do_not_exist_for_a_turn() {
    let registry = registry().await;
    let fx = Fixture::new();
    let grants = [
        fx.grant("writer", "free"),
        fx.grant("reader", "wants-all"),
        fx.reflection("writer"),
    ];
    let before = fx.digest();
    for grant in &grants {
        for path in [
            "planning/plan.json",
            "planning/step_config.json",
            "code/writer/main.py",
            "builder/conversation/x.json",
            "runs/../planning/plan.json",
        ] {
            let err = call(
                &registry,
                "workspace:read_file",
                json!({"path": path}),
                grant,
            )
            .await
            .unwrap_err();
            // The path is resolved first: `runs/../planning` is `planning`.
            let shown = path.trim_start_matches("runs/../");
            assert_eq!(err.kind(), "denied", "{path}: {err}");
            assert_eq!(
                err.to_string(),
                format!(
                    "workspace:read_file: denied: `{shown}` is outside the folders granted to \
                     this call"
                )
            );
            assert!(!err.to_string().contains("secret script"), "{path}: {err}");
        }
        for path in ["planning/evil.json", "code/writer/main.py", "evil.md"] {
            let err = write(&registry, path, grant).await.unwrap_err();
            assert_eq!(err.kind(), "denied", "{path}: {err}");
        }
        let text = grant.describe();
        for hidden in ["planning", "code/", "builder"] {
            assert!(!text.contains(hidden), "{hidden} in {text}");
        }
    }
    assert_eq!(fx.digest(), before);
}

#[tokio::test]
async fn the_output_folder_and_downloads_are_writable_earlier_outputs_are_not() {
    let registry = registry().await;
    let fx = Fixture::new();
    let earlier = fx.root().join("runs/iteration-0/execution/reader");
    std::fs::create_dir_all(&earlier).unwrap();
    std::fs::write(earlier.join("out.json"), "{\"n\": 1}").unwrap();
    let grant = fx.grant("writer", "no-kb");
    assert_eq!(
        grant.output_dir,
        fx.root()
            .canonicalize()
            .unwrap()
            .join("runs/iteration-0/execution/writer")
    );
    let before = fx.digest();

    let read = call(
        &registry,
        "workspace:read_file",
        json!({"path": "runs/iteration-0/execution/reader/out.json"}),
        &grant,
    )
    .await
    .unwrap();
    assert_eq!(read["content"], "{\"n\": 1}");
    let err = write(
        &registry,
        "runs/iteration-0/execution/reader/out.json",
        &grant,
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), "denied", "{err}");
    write(
        &registry,
        "runs/iteration-0/execution/writer/report.json",
        &grant,
    )
    .await
    .unwrap();
    write(
        &registry,
        "runs/iteration-0/execution/Downloads/page.html",
        &grant,
    )
    .await
    .unwrap();
    only_changed(
        &before,
        &fx.digest(),
        &[
            "runs/iteration-0/execution/writer/report.json",
            "runs/iteration-0/execution/Downloads/page.html",
        ],
    );
}

#[tokio::test]
async fn additional_read_paths_are_read_only_and_only_for_their_step() {
    let registry = registry().await;
    let fx = Fixture::new();
    let reader = fx.grant("reader", "wants-all");
    let writer = fx.grant("writer", "free");
    let before = fx.digest();

    let read = call(
        &registry,
        "workspace:read_file",
        json!({"path": "reference/sla.md"}),
        &reader,
    )
    .await
    .unwrap();
    assert_eq!(read["content"], "P1: 1 hour.\n");
    assert!(reader.describe().contains("- reference/ (read-only)"));
    let err = write(&registry, "reference/sla.md", &reader)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "denied", "{err}");

    let err = call(
        &registry,
        "workspace:read_file",
        json!({"path": "reference/sla.md"}),
        &writer,
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), "denied", "{err}");
    assert_eq!(
        err.to_string(),
        "workspace:read_file: denied: `reference/sla.md` is outside the folders granted to this \
         call"
    );
    assert_eq!(fx.digest(), before);
}

/// The grant of an item whose `write_access` names two stores, written out by hand: a
/// `write_access` that sets keys grants exactly the stores set `true` (knowledge base notes
/// and the database's assets), so the learnings the step could write are read-only in this
/// turn. The folders are granted in this order, each at the guest path of its workspace path.
#[test]
fn an_items_write_access_grants_exactly_these_folders() {
    use Access::{ReadOnly, ReadWrite};
    let fx = Fixture::new();
    let grant = fx.grant("writer", "kb-and-db");
    let expected: &[(&str, Access)] = &[
        ("runs/iteration-0/execution", ReadOnly),
        ("runs/iteration-0/execution/Downloads", ReadWrite),
        ("runs/iteration-0/execution/writer", ReadWrite),
        ("knowledgebase", ReadOnly),
        ("knowledgebase/notes", ReadWrite),
        ("learnings/_global", ReadOnly),
        ("learnings/writer", ReadOnly),
        ("db", ReadOnly),
        ("db/assets", ReadWrite),
    ];
    let described: Vec<(&str, Access)> = grant
        .folders
        .iter()
        .map(|f| (f.path.as_str(), f.access))
        .collect();
    assert_eq!(described, expected);
    let root = fx.root().canonicalize().unwrap();
    let given: Vec<(PathBuf, String, Access)> = grant
        .grant
        .folders()
        .iter()
        .map(|f| (f.host.clone(), f.guest.clone(), f.access))
        .collect();
    let expected_given: Vec<(PathBuf, String, Access)> = expected
        .iter()
        .map(|(rel, access)| (root.join(rel), format!("/{rel}"), *access))
        .collect();
    assert_eq!(given, expected_given);
    assert_eq!(grant.db_writable, Some(true));
    assert_eq!(
        grant.grant.db().map(|db| (db.path.clone(), db.writable)),
        Some((root.join("db/db.sqlite"), true))
    );
    assert_eq!(
        grant.output_dir,
        root.join("runs/iteration-0/execution/writer")
    );
    assert_eq!(grant.missing, Vec::<(&str, String)>::new());
}
