//! The bundled `workspace` tool plugin, run for real under workflow-shaped
//! grants: a read-only knowledgebase with a read-write `notes/` inside it, and
//! a read-write step output folder.

use crate::support;

use serde_json::{Value, json};
use support::{engine, tree_digest};
use trellis_sandbox::{Grant, Limits, PluginRegistry, ToolCallError};

struct Ws {
    dir: tempfile::TempDir,
}

const OUT: &str = "runs/iteration-0/execution/step-1";

impl Ws {
    fn new() -> Ws {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for folder in ["knowledgebase/notes", "planning", OUT] {
            std::fs::create_dir_all(root.join(folder)).unwrap();
        }
        std::fs::write(
            root.join("knowledgebase/policy.md"),
            "# Policy\nRefunds within 30 days.\n",
        )
        .unwrap();
        std::fs::write(
            root.join("knowledgebase/notes/escalation.md"),
            "Escalate P1 tickets.\nNever wait.\n",
        )
        .unwrap();
        std::fs::write(root.join("planning/plan.json"), r#"{"steps":[]}"#).unwrap();
        Ws { dir }
    }

    fn grant(&self) -> Grant {
        let root = self.dir.path();
        Grant::none()
            .read(root.join("knowledgebase"), "/knowledgebase")
            .unwrap()
            .write(root.join("knowledgebase/notes"), "/knowledgebase/notes")
            .unwrap()
            .write(root.join(OUT), OUT)
            .unwrap()
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(rel)).unwrap()
    }

    /// Digest of everything but the two read-write folders.
    fn outside_grant(&self) -> std::collections::BTreeMap<String, String> {
        let mut digest = tree_digest(self.dir.path());
        digest.retain(|k, _| {
            !k.starts_with("knowledgebase/notes/") && !k.starts_with(&format!("{OUT}/"))
        });
        digest
    }
}

async fn registry() -> PluginRegistry {
    PluginRegistry::with_bundled(engine()).await.unwrap()
}

async fn call(
    registry: &PluginRegistry,
    ws: &Ws,
    tool: &str,
    args: Value,
) -> Result<Value, ToolCallError> {
    registry
        .call_tool(
            &format!("workspace:{tool}"),
            &args,
            &ws.grant(),
            &Limits::default(),
        )
        .await
}

#[tokio::test]
async fn files_are_read_written_and_listed_inside_the_grant() {
    let (registry, ws) = (registry().await, Ws::new());
    let before = ws.outside_grant();

    let read = call(
        &registry,
        &ws,
        "read_file",
        json!({"path": "knowledgebase/notes/escalation.md"}),
    )
    .await
    .unwrap();
    assert_eq!(read["content"], "Escalate P1 tickets.\nNever wait.\n");
    assert_eq!(read["total_lines"], 2);
    let err = call(
        &registry,
        &ws,
        "read_file",
        json!({"path": "knowledgebase/notes"}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), "invalid-arguments", "{err}");
    assert!(
        err.to_string().contains("is a folder; use list_dir"),
        "{err}"
    );

    let window = call(
        &registry,
        &ws,
        "read_file",
        json!({"path": "knowledgebase/policy.md", "offset_line": 2, "max_lines": 1}),
    )
    .await
    .unwrap();
    assert!(
        window["content"].as_str().unwrap().contains("Refunds"),
        "{window}"
    );

    let path = format!("{OUT}/report.json");
    let written = call(
        &registry,
        &ws,
        "write_file",
        json!({"path": path, "content": "{\"ok\":true}"}),
    )
    .await
    .unwrap();
    assert_eq!(written["bytes_written"], 11);
    assert_eq!(ws.read(&path), "{\"ok\":true}");

    let listed = call(
        &registry,
        &ws,
        "list_dir",
        json!({"path": "knowledgebase", "recursive": true}),
    )
    .await
    .unwrap();
    let paths: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "knowledgebase/notes",
            "knowledgebase/notes/escalation.md",
            "knowledgebase/policy.md"
        ]
    );

    assert_eq!(ws.outside_grant(), before);
}

#[tokio::test]
async fn a_nested_read_write_folder_is_writable_but_its_read_only_parent_is_not() {
    let (registry, ws) = (registry().await, Ws::new());
    let before = ws.outside_grant();

    call(
        &registry,
        &ws,
        "write_file",
        json!({"path": "knowledgebase/notes/new.md", "content": "fresh"}),
    )
    .await
    .unwrap();
    assert_eq!(ws.read("knowledgebase/notes/new.md"), "fresh");

    let err = call(
        &registry,
        &ws,
        "write_file",
        json!({"path": "knowledgebase/policy.md", "content": "changed"}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), "denied", "{err}");
    let err = call(
        &registry,
        &ws,
        "delete_file",
        json!({"path": "knowledgebase/policy.md"}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), "denied", "{err}");
    assert_eq!(ws.outside_grant(), before);
}

#[tokio::test]
async fn folders_outside_the_grant_do_not_exist_for_the_plugin() {
    let (registry, ws) = (registry().await, Ws::new());
    let before = ws.outside_grant();
    // Each path is resolved first, against the root of the guest's file system.
    for (path, shown) in [
        ("planning/plan.json", "planning/plan.json"),
        ("../planning/plan.json", "planning/plan.json"),
        ("knowledgebase/../planning/plan.json", "planning/plan.json"),
        ("/etc/passwd", "etc/passwd"),
    ] {
        let err = call(&registry, &ws, "read_file", json!({"path": path}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "denied", "{path}: {err}");
        assert_eq!(
            err.to_string(),
            format!(
                "workspace:read_file: denied: `{shown}` is outside the folders granted to this \
                 call"
            ),
            "{path}"
        );
        assert!(!err.to_string().contains("steps"), "{path}: leaked {err}");
    }
    let err = call(
        &registry,
        &ws,
        "write_file",
        json!({"path": "planning/evil.json", "content": "{}"}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), "denied", "{err}");
    assert!(
        err.to_string().contains("outside the folders granted"),
        "{err}"
    );
    assert_eq!(ws.outside_grant(), before);
}

#[tokio::test]
async fn search_finds_lines_by_regex() {
    let (registry, ws) = (registry().await, Ws::new());
    let found = call(
        &registry,
        &ws,
        "search",
        json!({"pattern": "(?i)escalate|refund", "path": "knowledgebase"}),
    )
    .await
    .unwrap();
    let hits: Vec<(String, u64)> = found["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["path"].as_str().unwrap().to_string(),
                m["line"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        hits,
        [
            ("knowledgebase/notes/escalation.md".to_string(), 1),
            ("knowledgebase/policy.md".to_string(), 2)
        ]
    );
    let err = call(&registry, &ws, "search", json!({"pattern": "(unclosed"}))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "invalid-arguments", "{err}");
}

#[tokio::test]
async fn patches_apply_whole_or_not_at_all() {
    let (registry, ws) = (registry().await, Ws::new());
    let patch = "--- a/knowledgebase/notes/escalation.md\n+++ b/knowledgebase/notes/escalation.md\n@@ -1,2 +1,2 @@\n-Escalate P1 tickets.\n+Escalate P1 and P2 tickets.\n Never wait.\n--- /dev/null\n+++ b/knowledgebase/notes/added.md\n@@ -0,0 +1 @@\n+Added by a patch.\n";
    let applied = call(&registry, &ws, "apply_patch", json!({"patch": patch}))
        .await
        .unwrap();
    assert_eq!(applied["files"].as_array().unwrap().len(), 2, "{applied}");
    assert_eq!(
        ws.read("knowledgebase/notes/escalation.md"),
        "Escalate P1 and P2 tickets.\nNever wait.\n"
    );
    assert_eq!(
        ws.read("knowledgebase/notes/added.md"),
        "Added by a patch.\n"
    );

    // Second hunk's context does not match: nothing at all is written.
    let before = tree_digest(ws.dir.path());
    let bad = "--- a/knowledgebase/notes/added.md\n+++ b/knowledgebase/notes/added.md\n@@ -1 +1 @@\n-Added by a patch.\n+Changed.\n--- a/knowledgebase/notes/escalation.md\n+++ b/knowledgebase/notes/escalation.md\n@@ -1 +1 @@\n-No such line.\n+Whatever.\n";
    call(&registry, &ws, "apply_patch", json!({"patch": bad}))
        .await
        .unwrap_err();
    assert_eq!(tree_digest(ws.dir.path()), before);
}

#[tokio::test]
async fn files_move_and_delete() {
    let (registry, ws) = (registry().await, Ws::new());
    call(
        &registry,
        &ws,
        "write_file",
        json!({"path": format!("{OUT}/a.txt"), "content": "a"}),
    )
    .await
    .unwrap();
    call(
        &registry,
        &ws,
        "move_file",
        json!({"from": format!("{OUT}/a.txt"), "to": format!("{OUT}/b.txt")}),
    )
    .await
    .unwrap();
    assert_eq!(ws.read(&format!("{OUT}/b.txt")), "a");
    assert!(!ws.dir.path().join(OUT).join("a.txt").exists());
    call(
        &registry,
        &ws,
        "delete_file",
        json!({"path": format!("{OUT}/b.txt")}),
    )
    .await
    .unwrap();
    assert!(!ws.dir.path().join(OUT).join("b.txt").exists());
    let err = call(
        &registry,
        &ws,
        "delete_file",
        json!({"path": format!("{OUT}/b.txt")}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), "not-found", "{err}");
}

#[tokio::test]
async fn arguments_are_checked_against_the_schema_before_the_call() {
    let (registry, ws) = (registry().await, Ws::new());
    let err = call(&registry, &ws, "read_file", json!({"pathh": "x"}))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ToolCallError::InvalidArguments { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.starts_with("workspace:read_file: invalid arguments:"),
        "{text}"
    );
    assert!(text.contains("\"path\" is a required property"), "{text}");

    let err = call(
        &registry,
        &ws,
        "write_file",
        json!({"path": 7, "content": "x"}),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("at /path"), "{err}");
}

#[tokio::test]
async fn tool_names_resolve_normalized_and_unknown_ones_list_the_alternatives() {
    let (registry, ws) = (registry().await, Ws::new());
    let read = call(
        &registry,
        &ws,
        "ReadFile",
        json!({"path": "knowledgebase/policy.md"}),
    )
    .await
    .unwrap();
    assert_eq!(read["path"], "knowledgebase/policy.md");

    let err = call(&registry, &ws, "read_everything", json!({}))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("plugin `workspace` has no tool `read_everything` (it has: "),
        "{err}"
    );
    let err = registry
        .call_tool(
            "nope:read_file",
            &json!({}),
            &Grant::none(),
            &Limits::default(),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("no tool plugin `nope` (loaded: shell, workspace)"),
        "{err}"
    );
    let err = registry
        .call_tool("read_file", &json!({}), &Grant::none(), &Limits::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("expected `server:tool`"), "{err}");
}
