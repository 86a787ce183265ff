//! The builder's read set and file tools (`trellis_builder::{reads, files}`) on real
//! workspaces, with the bundled `workspace` plugin: each tool's answer, and the attacks a
//! model can try through them (secrets, links out, `..`, SQL that writes, writes outside the
//! mode's folders), each refused with nothing outside the grant changed.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};
use support::tree_digest;
use support::workspace::{copy_workspace, example_dir, write_file, write_files};
use trellis_builder::{BuilderObserver, Mode, ToolContext, ToolFailure, files, reads};
use trellis_sandbox::capabilities::DbWriteBudget;
use trellis_sandbox::{Limits, PluginRegistry};

const STEP: &str = "triage-tickets";

/// A copy of the example workspace with its database, a script, a secret-laden corner and a
/// file outside it (`outside/`, beside the workspace `ws/`).
struct Ws {
    dir: tempfile::TempDir,
}

impl Ws {
    fn new() -> Ws {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        copy_workspace(&example_dir(), &root, &["runs", "db.sqlite", "cassettes"]);
        support::workspace::create_db(
            &root,
            &std::fs::read_to_string(root.join("db/seed.sql")).unwrap(),
        );
        write_files(
            &root,
            &[
                (
                    "code/fetch/main.py",
                    "print('one')\nprint('two')\nprint('three')\n",
                ),
                (".env", "OPENAI_API_KEY=sk-live-secret\n"),
                (".env.local", "TOKEN=also-secret\n"),
                ("code/fetch/.env", "DB_PASSWORD=hunter2\n"),
                (".git/config", "[remote] url = https://token@example.com\n"),
                (
                    "knowledgebase/notes/server.pem",
                    "-----BEGIN PRIVATE KEY-----\n",
                ),
                ("knowledgebase/credentials.json", "{\"password\": \"pw\"}\n"),
            ],
        );
        write_file(dir.path(), "outside/notes.md", "OUTSIDE-SECRET\n");
        Ws { dir }
    }

    fn root(&self) -> std::path::PathBuf {
        self.dir.path().join("ws")
    }

    fn outside(&self) -> std::path::PathBuf {
        self.dir.path().join("outside")
    }

    /// Every entry of the whole temp folder (the workspace and `outside/`), except those
    /// under the workspace folders `except`.
    fn digest_except(&self, except: &[&str]) -> BTreeMap<String, String> {
        let mut digest = tree_digest(self.dir.path());
        digest.retain(|k, _| {
            !except
                .iter()
                .any(|e| k == &format!("ws/{e}") || k.starts_with(&format!("ws/{e}/")))
        });
        digest
    }
}

fn symlink(target: &Path, link: &Path) {
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(target, link).unwrap();
}

async fn registry() -> PluginRegistry {
    support::registry().await
}

async fn read(
    registry: &PluginRegistry,
    root: &Path,
    tool: &str,
    args: Value,
) -> Result<Value, ToolFailure> {
    read_in(registry, root, Mode::Builder, tool, args).await
}

async fn read_in(
    registry: &PluginRegistry,
    root: &Path,
    mode: Mode,
    tool: &str,
    args: Value,
) -> Result<Value, ToolFailure> {
    let limits = Limits::default();
    let observer = BuilderObserver::none();
    let writes = DbWriteBudget::new(limits.fs);
    let ctx = ToolContext {
        root,
        mode,
        registry,
        limits: &limits,
        turn_writes: &writes,
        session_id: "test",
        observer: &observer,
        work: &trellis_builder::call_work(),
    };
    reads::call(&ctx, tool, &args).await
}

async fn file_tool(
    registry: &PluginRegistry,
    root: &Path,
    mode: Mode,
    tool: &str,
    args: Value,
) -> Result<Value, ToolFailure> {
    let limits = Limits::default();
    let observer = BuilderObserver::none();
    let writes = DbWriteBudget::new(limits.fs);
    let ctx = ToolContext {
        root,
        mode,
        registry,
        limits: &limits,
        turn_writes: &writes,
        session_id: "test",
        observer: &observer,
        work: &trellis_builder::call_work(),
    };
    files::call(&ctx, tool, &args).await
}

fn refused(result: Result<Value, ToolFailure>, words: &str) -> ToolFailure {
    let failure = result.expect_err("refused");
    assert!(
        failure.message.contains(words),
        "{words:?} in {}",
        failure.message
    );
    failure
}

// ---------------------------------------------------------------- plan and configs

#[tokio::test]
async fn read_plan_answers_the_plan_one_step_and_lists_ids_for_an_unknown_one() {
    let ws = Ws::new();
    let reg = registry().await;
    let all = read(&reg, &ws.root(), "read_plan", json!({}))
        .await
        .unwrap();
    assert_eq!(all["file"], "planning/plan.json");
    assert_eq!(all["valid"], true, "{all}");
    assert_eq!(all["plan"]["steps"][0]["id"], STEP);

    let one = read(&reg, &ws.root(), "read_plan", json!({"step_id": STEP}))
        .await
        .unwrap();
    assert_eq!(one["step"]["id"], STEP);
    assert!(one.get("plan").is_none());

    let unknown = refused(
        read(&reg, &ws.root(), "read_plan", json!({"step_id": "nope"})).await,
        "unknown step id \"nope\"",
    );
    assert!(unknown.message.contains(STEP), "{}", unknown.message);
    assert_eq!(unknown.details.unwrap()["valid_step_ids"], json!([STEP]));
}

#[tokio::test]
async fn arguments_are_checked_against_the_schema() {
    let ws = Ws::new();
    let reg = registry().await;
    let failure = refused(
        read(&reg, &ws.root(), "read_plan", json!({"step": "x"})).await,
        "invalid arguments for read_plan",
    );
    assert!(failure.message.contains("step"), "{}", failure.message);
    refused(
        read(&reg, &ws.root(), "read_workspace_file", json!({"path": 3})).await,
        "argument \"path\"",
    );
    refused(
        read(&reg, &ws.root(), "read_workspace_file", json!({})).await,
        "path",
    );
    refused(
        file_tool(
            &reg,
            &ws.root(),
            Mode::Builder,
            "write_workspace_file",
            json!({"path": "code/a.py"}),
        )
        .await,
        "content",
    );
}

#[tokio::test]
async fn read_step_config_names_the_file_in_force() {
    let ws = Ws::new();
    let reg = registry().await;
    let default = read(&reg, &ws.root(), "read_step_config", json!({}))
        .await
        .unwrap();
    assert_eq!(default["file"], "planning/step_config.json");
    assert_eq!(default["run_folder"], "iteration-0");
    assert_eq!(default["step_config"]["steps"][0]["id"], STEP);
    let route = read(
        &reg,
        &ws.root(),
        "read_step_config",
        json!({"step_id": "refunds"}),
    )
    .await
    .unwrap();
    assert_eq!(route["entry"]["agent_configs"]["learnings_access"], "read");

    // A run-specific file wins and the answer says so.
    write_file(
        &ws.root(),
        "runs/iteration-0/planning/step_config.json",
        r#"{"steps": [{"id": "triage-tickets", "agent_configs": {"knowledgebase_access": "none"}}]}"#,
    );
    let one = read(
        &reg,
        &ws.root(),
        "read_step_config",
        json!({"step_id": STEP}),
    )
    .await
    .unwrap();
    assert_eq!(
        one["file"], "runs/iteration-0/planning/step_config.json",
        "{one}"
    );
    assert_eq!(
        one["entry"]["agent_configs"]["knowledgebase_access"],
        "none"
    );
    assert!(
        one["note"]
            .as_str()
            .unwrap()
            .contains("wins over planning/step_config.json"),
        "{one}"
    );
    // An id of the default file only (a route's entry) is not in force any more.
    let shadowed = refused(
        read(
            &reg,
            &ws.root(),
            "read_step_config",
            json!({"step_id": "refunds"}),
        )
        .await,
        "unknown step id \"refunds\"",
    );
    assert!(shadowed.message.contains(STEP), "{}", shadowed.message);
    refused(
        read(
            &reg,
            &ws.root(),
            "read_step_config",
            json!({"group_name": "Team A"}),
        )
        .await,
        "unknown group",
    );
}

#[tokio::test]
async fn read_workflow_config_names_the_file_of_each_variable_and_group() {
    let ws = Ws::new();
    let reg = registry().await;
    write_files(
        &ws.root(),
        &[
            (
                "workflow.json",
                r#"{"version": "1.0.11", "variables": {"REGION": "eu", "TEAM": "core"},
                   "llm": {"provider": "replay", "model_id": "triage-demo"}}"#,
            ),
            (
                "variables/variables.json",
                r#"{"variables": [{"name": "TEAM", "value": "payments"}],
                   "groups": [{"name": "Team A", "values": {"REGION": "us"}}]}"#,
            ),
        ],
    );
    let config = read(&reg, &ws.root(), "read_workflow_config", json!({}))
        .await
        .unwrap();
    assert_eq!(config["valid"], true, "{config}");
    assert_eq!(config["variables"]["REGION"]["file"], "workflow.json");
    assert_eq!(config["variables"]["TEAM"]["value"], "payments");
    assert_eq!(
        config["variables"]["TEAM"]["file"],
        "variables/variables.json"
    );
    assert!(
        config["variables"]["TEAM"]["shadows"]
            .as_str()
            .unwrap()
            .contains("variables/variables.json wins"),
        "{config}"
    );
    assert_eq!(config["groups"][0]["id"], "Team A");
    assert_eq!(config["groups"][0]["folder"], "team-a");
    assert_eq!(config["groups"][0]["file"], "variables/variables.json");
    assert_eq!(config["variables_written_to"], "variables/variables.json");
    assert_eq!(config["settings"]["llm"]["model_id"], "triage-demo");
    assert_eq!(
        config["files"]["workflow.json"]["content"]["variables"]["TEAM"],
        "core"
    );

    // The group's run folder is where its step config is read.
    let step = read(
        &reg,
        &ws.root(),
        "read_step_config",
        json!({"group_name": "Team A"}),
    )
    .await
    .unwrap();
    assert_eq!(step["run_folder"], "iteration-0/team-a");
}

// ---------------------------------------------------------------- workspace files

#[tokio::test]
async fn listing_leaves_out_hidden_and_secret_entries_and_shows_links_as_links() {
    let ws = Ws::new();
    let reg = registry().await;
    symlink(
        Path::new("/etc/passwd"),
        &ws.root().join("knowledgebase/notes/system.md"),
    );
    let listing = read(
        &reg,
        &ws.root(),
        "list_workspace_files",
        json!({"max_depth": 3}),
    )
    .await
    .unwrap();
    let paths: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    for present in [
        "code/fetch/main.py",
        "planning/plan.json",
        "knowledgebase/notes/refunds.md",
        "db/db.sqlite",
    ] {
        assert!(paths.contains(&present), "{present} in {paths:?}");
    }
    for absent in [".env", ".env.local", ".git", "code/fetch/.env"] {
        assert!(!paths.contains(&absent), "{absent} in {paths:?}");
    }
    assert!(
        !paths.iter().any(|p| p.contains("server.pem")
            || p.contains("credentials")
            || p.starts_with(".git")),
        "{paths:?}"
    );
    assert!(listing["left_out"].as_u64().unwrap() >= 5, "{listing}");
    let link = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == "knowledgebase/notes/system.md")
        .unwrap();
    assert_eq!(link["type"], "symlink");

    let notes = read(
        &reg,
        &ws.root(),
        "list_workspace_files",
        json!({"path": "knowledgebase/notes", "max_depth": 1}),
    )
    .await
    .unwrap();
    assert_eq!(notes["entries"].as_array().unwrap().len(), 3, "{notes}");
    refused(
        read(
            &reg,
            &ws.root(),
            "list_workspace_files",
            json!({"path": ".git"}),
        )
        .await,
        "hidden",
    );
    refused(
        read(
            &reg,
            &ws.root(),
            "list_workspace_files",
            json!({"path": "../outside"}),
        )
        .await,
        "leaves the workspace",
    );
}

#[tokio::test]
async fn read_workspace_file_reads_text_in_windows() {
    let ws = Ws::new();
    let reg = registry().await;
    let whole = read(
        &reg,
        &ws.root(),
        "read_workspace_file",
        json!({"path": "code/fetch/main.py"}),
    )
    .await
    .unwrap();
    assert_eq!(
        whole["content"],
        "print('one')\nprint('two')\nprint('three')\n"
    );
    assert_eq!(whole["total_lines"], 3);
    let window = read(
        &reg,
        &ws.root(),
        "read_workspace_file",
        json!({"path": "code/fetch/main.py", "offset_line": 2, "max_lines": 1}),
    )
    .await
    .unwrap();
    assert_eq!(window["content"], "print('two')\n");
    assert_eq!(window["truncated"], true);
    // A top-level file (its folder is the workspace itself).
    let top = read(
        &reg,
        &ws.root(),
        "read_workspace_file",
        json!({"path": "workflow.json"}),
    )
    .await
    .unwrap();
    assert!(top["content"].as_str().unwrap().contains("\"version\""));
    refused(
        read(
            &reg,
            &ws.root(),
            "read_workspace_file",
            json!({"path": "code/fetch"}),
        )
        .await,
        "is a folder",
    );
    refused(
        read(
            &reg,
            &ws.root(),
            "read_workspace_file",
            json!({"path": "code/missing.py"}),
        )
        .await,
        "does not exist",
    );
}

#[tokio::test]
async fn secret_files_are_never_read() {
    let ws = Ws::new();
    let reg = registry().await;
    for path in [
        ".env",
        ".env.local",
        "code/fetch/.env",
        ".git/config",
        "knowledgebase/notes/server.pem",
        "knowledgebase/credentials.json",
    ] {
        let failure = refused(
            read(
                &reg,
                &ws.root(),
                "read_workspace_file",
                json!({"path": path}),
            )
            .await,
            "refused",
        );
        for secret in [
            "sk-live",
            "also-secret",
            "hunter2",
            "token@",
            "PRIVATE",
            "pw",
        ] {
            assert!(
                !failure.to_json().to_string().contains(secret),
                "{path}: {failure}"
            );
        }
    }
    // Through list_run_artifacts' path too.
    write_file(&ws.root(), "runs/iteration-0/.env", "X=1\n");
    refused(
        read(
            &reg,
            &ws.root(),
            "list_run_artifacts",
            json!({"path": "runs/iteration-0/.env"}),
        )
        .await,
        "hidden",
    );
}

#[tokio::test]
async fn links_out_of_the_workspace_are_not_followed() {
    let ws = Ws::new();
    let reg = registry().await;
    let notes = ws.root().join("knowledgebase/notes");
    symlink(Path::new("/etc/passwd"), &notes.join("system.md"));
    symlink(&ws.outside().join("notes.md"), &notes.join("outside.md"));
    symlink(&ws.outside(), &ws.root().join("knowledgebase/ext"));
    // A link that stays inside the workspace is not followed either.
    symlink(
        &ws.root().join("planning/plan.json"),
        &notes.join("plan-link.md"),
    );
    for path in [
        "knowledgebase/notes/system.md",
        "knowledgebase/notes/outside.md",
        "knowledgebase/ext/notes.md",
        "knowledgebase/notes/plan-link.md",
    ] {
        let failure = refused(
            read(
                &reg,
                &ws.root(),
                "read_workspace_file",
                json!({"path": path}),
            )
            .await,
            "symbolic link",
        );
        let text = failure.to_json().to_string();
        assert!(
            !text.contains("OUTSIDE-SECRET") && !text.contains("root:"),
            "{text}"
        );
    }
    refused(
        read(
            &reg,
            &ws.root(),
            "list_workspace_files",
            json!({"path": "knowledgebase/ext"}),
        )
        .await,
        "symbolic link",
    );
}

#[tokio::test]
async fn paths_leaving_the_workspace_are_refused() {
    let ws = Ws::new();
    let reg = registry().await;
    for (path, why) in [
        (
            "../outside/notes.md",
            r#""../outside/notes.md" leaves the workspace: `..` is refused"#,
        ),
        (
            "knowledgebase/../../outside/notes.md",
            r#""knowledgebase/../../outside/notes.md" leaves the workspace: `..` is refused"#,
        ),
        ("/etc/passwd", r#""/etc/passwd" is an absolute path"#),
    ] {
        let failure = refused(
            read(
                &reg,
                &ws.root(),
                "read_workspace_file",
                json!({"path": path}),
            )
            .await,
            "",
        );
        assert!(
            failure.message.contains(why),
            "{path}: expected {why:?} in {}",
            failure.message
        );
        assert!(!failure.message.contains("OUTSIDE-SECRET"));
    }
}

// ---------------------------------------------------------------- database

fn db_bytes(ws: &Ws) -> BTreeMap<String, String> {
    let mut digest = tree_digest(&ws.root().join("db"));
    digest.insert(
        "outside".into(),
        format!("{:?}", tree_digest(&ws.outside())),
    );
    digest
}

#[tokio::test]
async fn query_database_answers_rows_with_parameters() {
    let ws = Ws::new();
    let reg = registry().await;
    let rows = read(
        &reg,
        &ws.root(),
        "query_database",
        json!({"sql": "SELECT id, subject FROM tickets WHERE status = ? ORDER BY id", "params": ["open"]}),
    )
    .await
    .unwrap();
    assert_eq!(rows["row_count"], 3, "{rows}");
    assert_eq!(rows["rows"][0]["id"], 1);
    let capped = read(
        &reg,
        &ws.root(),
        "query_database",
        json!({"sql": "SELECT id FROM tickets", "max_rows": 2}),
    )
    .await
    .unwrap();
    assert_eq!(capped["truncated"], true);
    let schema = read(
        &reg,
        &ws.root(),
        "query_database",
        json!({"sql": "PRAGMA table_info(tickets)"}),
    )
    .await
    .unwrap();
    assert_eq!(schema["row_count"], 4, "{schema}");
}

#[tokio::test]
async fn query_database_refuses_writes_attach_and_pragma_writes() {
    let ws = Ws::new();
    let reg = registry().await;
    let before = db_bytes(&ws);
    let attached = ws.outside().join("attached.sqlite");
    for sql in [
        "INSERT INTO tickets (id, subject, body, status) VALUES (9, 'x', 'y', 'open')".to_string(),
        "UPDATE tickets SET status = 'closed'".to_string(),
        "DELETE FROM tickets".to_string(),
        "DELETE FROM tickets RETURNING id".to_string(),
        "DROP TABLE tickets".to_string(),
        "CREATE TABLE evil (x)".to_string(),
        format!("ATTACH DATABASE '{}' AS other", attached.display()),
        "PRAGMA user_version = 7".to_string(),
        "PRAGMA journal_mode = WAL".to_string(),
        "PRAGMA writable_schema = ON".to_string(),
        "SELECT load_extension('/tmp/evil.so')".to_string(),
        "SELECT 1; DELETE FROM tickets".to_string(),
        "VACUUM".to_string(),
    ] {
        let result = read(&reg, &ws.root(), "query_database", json!({ "sql": sql })).await;
        assert!(result.is_err(), "{sql}: {result:?}");
        assert_eq!(db_bytes(&ws), before, "{sql} changed the database");
    }
    assert!(!attached.exists());
    let rows = read(
        &reg,
        &ws.root(),
        "query_database",
        json!({"sql": "SELECT count(*) AS n FROM tickets"}),
    )
    .await
    .unwrap();
    assert_eq!(rows["rows"][0]["n"], 4);
}

#[tokio::test]
async fn query_database_without_a_database_says_so() {
    let ws = Ws::new();
    let reg = registry().await;
    std::fs::remove_file(ws.root().join("db/db.sqlite")).unwrap();
    refused(
        read(
            &reg,
            &ws.root(),
            "query_database",
            json!({"sql": "SELECT 1"}),
        )
        .await,
        "has no database",
    );
    // A link in the database's place is not opened.
    symlink(
        &ws.outside().join("notes.md"),
        &ws.root().join("db/db.sqlite"),
    );
    refused(
        read(
            &reg,
            &ws.root(),
            "query_database",
            json!({"sql": "SELECT 1"}),
        )
        .await,
        "not a regular file",
    );
}

// ---------------------------------------------------------------- runs and costs

#[tokio::test]
async fn run_artifacts_and_costs_before_and_after_a_real_run() {
    let ws = Ws::new();
    let reg = registry().await;
    let before = read(&reg, &ws.root(), "list_run_artifacts", json!({}))
        .await
        .unwrap();
    assert_eq!(before["steps"], json!([]), "{before}");
    assert!(before["note"].as_str().unwrap().contains("nothing has run"));
    let costs = read(&reg, &ws.root(), "get_cost_summary", json!({}))
        .await
        .unwrap();
    assert_eq!(costs["builder"]["recorded"], false);
    assert!(
        costs["note"]
            .as_str()
            .unwrap()
            .contains("nothing is recorded"),
        "{costs}"
    );
    let not_run = read(
        &reg,
        &ws.root(),
        "list_run_artifacts",
        json!({"step_id": STEP}),
    )
    .await
    .unwrap();
    assert_eq!(not_run["status"], "not run");

    // A real run of the example, offline from its cassette.
    copy_workspace(
        &example_dir().join("cassettes"),
        &ws.root().join("cassettes"),
        &[],
    );
    let root = ws.root();
    let out = support::trellis(&["run", root.to_str().unwrap(), "--quiet"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let after = read(
        &reg,
        &ws.root(),
        "list_run_artifacts",
        json!({"step_id": STEP}),
    )
    .await
    .unwrap();
    assert_eq!(after["run_folder"], "iteration-0");
    assert_eq!(after["run_folders"][0]["run_folder"], "iteration-0");
    let step = &after["steps"][0];
    assert_eq!(step["step_id"], STEP);
    assert_eq!(step["status"], "completed", "{step}");
    assert_eq!(
        step["final_summary"]["path"],
        format!("runs/iteration-0/logs/{STEP}/execution/execution-final-summary.json")
    );
    assert_eq!(step["final_summary"]["status"], "completed");
    assert_eq!(
        step["session"],
        format!("runs/iteration-0/execution/{STEP}/session.json")
    );
    assert!(!step["entries"].as_array().unwrap().is_empty());
    let turn = &step["turn_logs"][0];
    assert!(
        turn["path"].as_str().unwrap().starts_with(&format!(
            "runs/iteration-0/logs/{STEP}/execution/execution-attempt-1-"
        )),
        "{turn}"
    );
    assert!(turn["prompt_tokens"].as_u64().unwrap() > 0);
    assert_eq!(step["gates"][0]["passed"], true, "{step}");
    assert!(
        step["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o.as_str().unwrap().ends_with("report.json")),
        "{step}"
    );

    // One artifact by path: JSON comes back parsed.
    let summary = read(
        &reg,
        &ws.root(),
        "list_run_artifacts",
        json!({"path": step["final_summary"]["path"]}),
    )
    .await
    .unwrap();
    assert_eq!(summary["json"]["step_id"], STEP);
    refused(
        read(
            &reg,
            &ws.root(),
            "list_run_artifacts",
            json!({"path": "planning/plan.json"}),
        )
        .await,
        "not under runs/",
    );
    refused(
        read(
            &reg,
            &ws.root(),
            "list_run_artifacts",
            json!({"step_id": "nope"}),
        )
        .await,
        "unknown step id",
    );

    // The steps' tokens are summed from the turn logs; the builder's are read as written.
    let costs = read(&reg, &ws.root(), "get_cost_summary", json!({}))
        .await
        .unwrap();
    assert_eq!(costs["runs"]["recorded"], true, "{costs}");
    assert!(costs["runs"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert!(costs.get("note").is_none());
    write_file(
        &ws.root(),
        "costs/phase/token_usage.json",
        r#"{"by_phase_and_model": {}, "by_model": {"replay:x": {"input_tokens": 5}}, "session_cumulative": {}}"#,
    );
    let costs = read(&reg, &ws.root(), "get_cost_summary", json!({}))
        .await
        .unwrap();
    assert_eq!(costs["builder"]["recorded"], true);
    assert_eq!(
        costs["builder"]["usage"]["by_model"]["replay:x"]["input_tokens"],
        5
    );
}

// ---------------------------------------------------------------- file tools

#[tokio::test]
async fn write_and_patch_inside_the_mode_folders() {
    let ws = Ws::new();
    let reg = registry().await;
    let outside_grant = ws.digest_except(&["code", "knowledgebase/notes", "learnings"]);
    let written = file_tool(
        &reg,
        &ws.root(),
        Mode::Builder,
        "write_workspace_file",
        json!({"path": "code/new-step/main.py", "content": "print('a')\n"}),
    )
    .await
    .unwrap();
    assert_eq!(written["path"], "code/new-step/main.py");
    assert_eq!(
        std::fs::read_to_string(ws.root().join("code/new-step/main.py")).unwrap(),
        "print('a')\n"
    );
    let patch = "--- a/code/new-step/main.py\n+++ b/code/new-step/main.py\n@@ -1 +1 @@\n-print('a')\n+print('b')\n";
    file_tool(
        &reg,
        &ws.root(),
        Mode::Optimizer,
        "patch_workspace_file",
        json!({"path": "code/new-step/main.py", "patch": patch}),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(ws.root().join("code/new-step/main.py")).unwrap(),
        "print('b')\n"
    );
    // A patch that does not apply changes nothing.
    let failure = refused(
        file_tool(
            &reg,
            &ws.root(),
            Mode::Builder,
            "patch_workspace_file",
            json!({"path": "code/new-step/main.py", "patch": patch}),
        )
        .await,
        "patch_workspace_file",
    );
    assert!(failure.details.is_some());
    assert_eq!(
        std::fs::read_to_string(ws.root().join("code/new-step/main.py")).unwrap(),
        "print('b')\n"
    );
    // Notes and learnings (created when missing).
    for path in ["knowledgebase/notes/new.md", "learnings/_global/l.md"] {
        file_tool(
            &reg,
            &ws.root(),
            Mode::Builder,
            "write_workspace_file",
            json!({"path": path, "content": "x\n"}),
        )
        .await
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(ws.root().join(path)).unwrap(),
            "x\n"
        );
    }
    assert_eq!(
        ws.digest_except(&["code", "knowledgebase/notes", "learnings"]),
        outside_grant
    );

    // Eval and output modes write their own folders.
    file_tool(
        &reg,
        &ws.root(),
        Mode::Eval,
        "write_workspace_file",
        json!({"path": "evaluation/cases.json", "content": "[]"}),
    )
    .await
    .unwrap();
    file_tool(
        &reg,
        &ws.root(),
        Mode::Output,
        "write_workspace_file",
        json!({"path": "reports/weekly.md", "content": "# Week\n"}),
    )
    .await
    .unwrap();
    assert!(ws.root().join("evaluation/cases.json").is_file());
    assert!(ws.root().join("reports/weekly.md").is_file());
}

/// How every refusal of a builder-mode write ends: the folders that mode writes.
const ONLY: &str = "; builder mode writes only under code/, knowledgebase/notes/, learnings/ \
                    (planning/ changes only through the plan and step config tools)";

#[tokio::test]
async fn writes_outside_the_mode_folders_are_refused_and_change_nothing() {
    let ws = Ws::new();
    let reg = registry().await;
    // A folder inside code/ that leads out of the workspace, and one that leads to planning/.
    symlink(&ws.outside(), &ws.root().join("code/escape"));
    symlink(
        &ws.root().join("planning"),
        &ws.root().join("code/plan-link"),
    );
    let before = ws.digest_except(&[]);
    let plan = "--- a/planning/plan.json\n+++ b/planning/plan.json\n@@ -1 +1 @@\n-{\n+{}\n";
    for (tool, args) in [
        (
            "write_workspace_file",
            json!({"path": "planning/plan.json", "content": "{}"}),
        ),
        (
            "write_workspace_file",
            json!({"path": "planning/changelog/x.json", "content": "{}"}),
        ),
        (
            "write_workspace_file",
            json!({"path": "runs/iteration-0/execution/a/x.json", "content": "{}"}),
        ),
        (
            "write_workspace_file",
            json!({"path": "db/db.sqlite", "content": "gone"}),
        ),
        (
            "write_workspace_file",
            json!({"path": "workflow.json", "content": "{}"}),
        ),
        (
            "write_workspace_file",
            json!({"path": "knowledgebase/policy.md", "content": "x"}),
        ),
        (
            "write_workspace_file",
            json!({"path": "code", "content": "x"}),
        ),
        (
            "write_workspace_file",
            json!({"path": "code/../planning/plan.json", "content": "{}"}),
        ),
        (
            "write_workspace_file",
            json!({"path": "../outside/notes.md", "content": "x"}),
        ),
        (
            "write_workspace_file",
            json!({"path": "/etc/passwd", "content": "x"}),
        ),
        (
            "write_workspace_file",
            json!({"path": "code/escape/notes.md", "content": "x"}),
        ),
        (
            "write_workspace_file",
            json!({"path": "code/escape/new.md", "content": "x"}),
        ),
        (
            "write_workspace_file",
            json!({"path": "code/plan-link/plan.json", "content": "{}"}),
        ),
        (
            "patch_workspace_file",
            json!({"path": "planning/plan.json", "patch": plan}),
        ),
        // The diff names another file than `path`.
        (
            "patch_workspace_file",
            json!({"path": "code/fetch/main.py", "patch": plan}),
        ),
    ] {
        let failure = file_tool(&reg, &ws.root(), Mode::Builder, tool, args.clone())
            .await
            .expect_err(&format!("{tool} {args} is refused"));
        let path = args["path"].as_str().unwrap();
        let link = |folder: &str| {
            format!(
                "refused: {path:?} cannot be written: {folder} is a symbolic link; Trellis does \
                 not read or write through links{ONLY}"
            )
        };
        let expected = match (tool, path) {
            ("patch_workspace_file", "code/fetch/main.py") => format!(
                "refused: the patch names \"planning/plan.json\", but patch_workspace_file \
                 changes only {path:?} (its `path`); patch one file per call"
            ),
            (_, "code/../planning/plan.json" | "../outside/notes.md") => format!(
                "refused: {path:?} leaves the workspace: `..` is refused; give a path relative \
                 to the workspace{ONLY}"
            ),
            (_, "/etc/passwd") => format!(
                "refused: {path:?} is an absolute path: give a path relative to the workspace \
                 (code/<step>/main.py){ONLY}"
            ),
            (_, "code/escape/notes.md" | "code/escape/new.md") => link("code/escape"),
            (_, "code/plan-link/plan.json") => link("code/plan-link"),
            _ => format!("refused: {path:?} is outside the folders this mode writes{ONLY}"),
        };
        assert_eq!(failure.message, expected, "{tool} {args}");
        assert_eq!(
            ws.digest_except(&[]),
            before,
            "{tool} {args} changed something"
        );
    }
    let failure = file_tool(
        &reg,
        &ws.root(),
        Mode::Builder,
        "write_workspace_file",
        json!({"path": "planning/plan.json", "content": "{}"}),
    )
    .await
    .unwrap_err();
    for folder in ["code/", "knowledgebase/notes/", "learnings/"] {
        assert!(failure.message.contains(folder), "{}", failure.message);
    }
}

#[tokio::test]
async fn eval_and_output_modes_write_only_their_folder() {
    let ws = Ws::new();
    let reg = registry().await;
    std::fs::create_dir_all(ws.root().join("evaluation")).unwrap();
    std::fs::create_dir_all(ws.root().join("reports")).unwrap();
    let before = ws.digest_except(&[]);
    for (mode, path) in [
        (Mode::Eval, "code/fetch/main.py"),
        (Mode::Eval, "reports/r.md"),
        (Mode::Eval, "knowledgebase/notes/n.md"),
        (Mode::Eval, "planning/plan.json"),
        (Mode::Output, "evaluation/cases.json"),
        (Mode::Output, "learnings/_global/l.md"),
        (Mode::Run, "code/fetch/main.py"),
        (Mode::Debugger, "reports/r.md"),
    ] {
        let failure = file_tool(
            &reg,
            &ws.root(),
            mode,
            "write_workspace_file",
            json!({"path": path, "content": "x"}),
        )
        .await
        .unwrap_err();
        assert!(
            failure.message.contains(&format!("{mode} mode")),
            "{mode} {path}: {}",
            failure.message
        );
        assert_eq!(ws.digest_except(&[]), before, "{mode} {path}");
    }
    let failure = file_tool(
        &reg,
        &ws.root(),
        Mode::Eval,
        "write_workspace_file",
        json!({"path": "code/x.py", "content": "x"}),
    )
    .await
    .unwrap_err();
    assert!(
        failure.message.contains("evaluation/"),
        "{}",
        failure.message
    );
}

#[tokio::test]
async fn a_mode_folder_that_is_a_link_is_neither_written_nor_granted() {
    let ws = Ws::new();
    let reg = registry().await;
    symlink(&ws.outside(), &ws.root().join("reports"));
    let before = ws.digest_except(&[]);
    let failure = file_tool(
        &reg,
        &ws.root(),
        Mode::Output,
        "write_workspace_file",
        json!({"path": "reports/weekly.md", "content": "x"}),
    )
    .await
    .unwrap_err();
    assert!(
        failure.message.contains("symbolic link"),
        "{}",
        failure.message
    );
    assert_eq!(ws.digest_except(&[]), before);
    assert!(!ws.outside().join("weekly.md").exists());
}
