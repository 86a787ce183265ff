//! The builder in a workspace the original system worked in (`tests/scenarios/original-builder/`),
//! driven by a fake model on 127.0.0.1 that answers the builder's requests in order and every
//! step's with a plain "done": run artifacts where the original's readers look, its costs,
//! index and conversation read and kept, its tool names and arguments, and its tools Trellis
//! had no counterpart of.

use crate::support;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion, result_of, tool_results_of};
use support::workspace::{copy_workspace, create_db, read_json, write_file};
use trellis_builder::executions::Executions;
use trellis_builder::{BuilderObserver, BuilderSession, Mode, SessionOptions};
use trellis_runner::llm_choice::parse_llm_spec;
use trellis_runner::runtime::{Runtime, StartOptions};
use trellis_runner::workflow_run::RunOptions;

/// The original's builder state.
const FIXTURE: &str = "tests/scenarios/original-builder/workspace";

/// A copy of the fixture and the fake model: the builder's requests (those offering
/// `read_plan`) get `replies` in order, then "nothing more"; a step's get "done".
struct World {
    dir: tempfile::TempDir,
    server: FakeServer,
    builder_requests: Arc<Mutex<Vec<Value>>>,
    today: String,
}

impl World {
    fn new(replies: Vec<Value>) -> World {
        let dir = tempfile::tempdir().unwrap();
        copy_workspace(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE),
            dir.path(),
            &[],
        );
        let today: String = trellis_sandbox::store::now_rfc3339()
            .chars()
            .take(10)
            .collect();
        let daily = dir.path().join("costs/phase/daily");
        let text = std::fs::read_to_string(daily.join("DAY.json")).unwrap();
        std::fs::remove_file(daily.join("DAY.json")).unwrap();
        std::fs::write(
            daily.join(format!("{today}.json")),
            text.replace("\"DAY\"", &format!("\"{today}\"")),
        )
        .unwrap();
        let next = Arc::new(AtomicUsize::new(0));
        let builder_requests = Arc::new(Mutex::new(Vec::new()));
        let seen = builder_requests.clone();
        let server = FakeServer::start(Box::new(move |body| {
            let is_builder = body["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| t["function"]["name"] == "read_plan");
            if !is_builder {
                return (200, completion("done", &[]));
            }
            seen.lock().unwrap().push(body.clone());
            let n = next.fetch_add(1, Ordering::SeqCst);
            (
                200,
                replies
                    .get(n)
                    .cloned()
                    .unwrap_or_else(|| completion("nothing more to do", &[])),
            )
        }));
        let mut manifest = read_json(&dir.path().join("workflow.json"));
        manifest["providers"] = server.providers();
        manifest["tiers"] = json!({"low": {"provider": "openai", "model_id": "step-low"}});
        write_file(dir.path(), "workflow.json", manifest.to_string());
        World {
            dir,
            server,
            builder_requests,
            today,
        }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn file(&self, rel: &str) -> Value {
        read_json(&self.root().join(rel))
    }

    /// A session on the workspace: `id` resumed, else a new one in `mode`.
    async fn session(&self, id: Option<&str>, mode: Option<Mode>) -> BuilderSession {
        let runtime = Runtime::new(Arc::new(support::registry().await));
        let executions = Executions::new(
            runtime.clone(),
            StartOptions::new(RunOptions::default(), support::fake_llm::loopback_llm(None)),
        );
        BuilderSession::open(
            &runtime,
            executions,
            SessionOptions {
                root: self.root().to_path_buf(),
                session_id: id.map(str::to_string),
                mode,
                llm: support::fake_llm::loopback_llm(Some(
                    parse_llm_spec("openai:builder-model").unwrap(),
                )),
                limits: Default::default(),
                retry: Default::default(),
                max_rounds: 10,
                max_turn_result_bytes: trellis_builder::DEFAULT_TURN_RESULT_BYTES,
                max_turn_write_bytes: trellis_builder::DEFAULT_TURN_WRITE_BYTES,
                max_run_write_bytes: trellis_runner::driver::DEFAULT_RUN_WRITE_BYTES,
                max_workspace_bytes: trellis_runner::driver::DEFAULT_WORKSPACE_BYTES,
                max_model_calls: trellis_runner::driver::DEFAULT_RUN_MODEL_CALLS,
                observer: BuilderObserver::none(),
            },
        )
        .unwrap()
    }

    /// The builder's request `n` (from 0).
    fn builder_request(&self, n: usize) -> Value {
        self.builder_requests.lock().unwrap()[n].clone()
    }

    /// The result of call `id` as the builder's request `n` carried it last (the fake
    /// model numbers the calls of each answer from 0), as JSON.
    fn result(&self, n: usize, id: &str) -> Value {
        let mut results = tool_results_of(&self.builder_request(n));
        results.reverse();
        let text = result_of(&results, id);
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    }

    /// The user messages of every step request (not the builder's).
    fn step_user_messages(&self) -> Vec<(String, String)> {
        self.server
            .seen()
            .iter()
            .filter(|b| {
                !b["tools"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|t| t["function"]["name"] == "read_plan")
            })
            .flat_map(|b| {
                let model = b["model"].as_str().unwrap_or_default().to_string();
                b["messages"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|m| m["role"] == "user")
                    .map(move |m| {
                        (
                            model.clone(),
                            m["content"].as_str().unwrap_or_default().to_string(),
                        )
                    })
            })
            .collect()
    }
}

fn call(name: &str, args: Value) -> (&str, Value) {
    (name, args)
}

// ------------------------------------------------------------------ 1. run artifacts

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_logs_where_the_original_reads_and_the_earlier_layout_still_reads() {
    let w = World::new(vec![completion(
        "",
        &[call("execute_step", json!({"step_id": "fetch"}))],
    )]);
    let mut session = w.session(None, Some(Mode::Builder)).await;
    session.turn("run fetch").await.unwrap();
    session.settle().await.unwrap();

    let logs = w.root().join("runs/iteration-0/logs/fetch/execution");
    for name in [
        "execution-attempt-1-iteration-1.json",
        "execution-attempt-1-iteration-1-conversation.json",
    ] {
        assert!(logs.join(name).is_file(), "{name} in {}", logs.display());
    }
    let beside_logs = read_json(&logs.join("execution-final-summary.json"));
    assert_eq!(beside_logs["status"], "completed", "{beside_logs}");
    assert_eq!(
        read_json(
            &w.root()
                .join("runs/iteration-0/execution/fetch/execution-final-summary.json")
        ),
        beside_logs
    );

    // The earlier layout: turn logs in logs/fetch/ itself, the summary only in the output
    // folder. `runs show` and the builder's read tools read it as it is.
    let old = w.root().join("runs/iteration-0/logs/fetch");
    for name in [
        "execution-attempt-1-iteration-1.json",
        "execution-attempt-1-iteration-1-conversation.json",
    ] {
        std::fs::rename(logs.join(name), old.join(name)).unwrap();
    }
    std::fs::remove_dir_all(&logs).unwrap();
    let report = trellis_runner::runs::show_step(w.root(), "iteration-0", "fetch").unwrap();
    assert_eq!(report.status, "completed");
    assert_eq!(report.turns.len(), 1);
    assert!(
        report.turns[0]
            .path
            .ends_with("logs/fetch/execution-attempt-1-iteration-1.json")
    );
    let listed = session
        .operator_call("list_run_artifacts", &json!({}))
        .await;
    let step = listed["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["step_id"] == "fetch")
        .unwrap()
        .clone();
    assert_eq!(
        step["turn_logs"][0]["path"],
        "runs/iteration-0/logs/fetch/execution-attempt-1-iteration-1.json",
        "{step}"
    );
    assert_eq!(
        step["final_summary"]["path"],
        "runs/iteration-0/execution/fetch/execution-final-summary.json",
        "{step}"
    );
}

// ------------------------------------------------------------------ 2. builder state

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_originals_costs_index_and_conversation_are_extended_kept_and_resumed() {
    let w = World::new(vec![completion("Resumed where we were.", &[])]);
    let index_before =
        std::fs::read(w.root().join("builder/conversation/chat-index.json")).unwrap();
    let conv_rel = "builder/conversation/2026-11-28/session-orig-1-conversation.json";
    let original = w.file(conv_rel);

    let mut session = w.session(Some("orig-1"), None).await;
    assert_eq!(session.mode(), Mode::Builder);
    let report = session.turn("go on").await.unwrap();
    assert!(report.ended_normally, "{report:?}");

    // The model saw the original's history, its tool call answered, then the new message.
    let sent = w.builder_request(0);
    let shape: Vec<(String, String)> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] != "system")
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_string(),
                m["content"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("user", "Add a step that fetches prices"),
            ("assistant", "Reading the plan first."),
            ("tool", "{\"steps\": []}"),
            ("assistant", "The plan is empty: shall I add a fetch step?"),
            ("user", "go on"),
        ]
        .map(|(r, c)| (r.to_string(), c.to_string()))
    );

    // Written back where it was, with the original's keys and parts its readers take.
    let after = w.file(conv_rel);
    assert_eq!(after["ui_events"], original["ui_events"]);
    assert_eq!(after["agent_mode"], "workflow");
    let history = after["conversation_history"].as_array().unwrap();
    assert_eq!(history.len(), 6);
    assert_eq!(
        history[0]["parts"],
        json!([{"type": "text", "content": "Add a step that fetches prices"}])
    );
    assert_eq!(history[5]["content"], "Resumed where we were.");
    // The original's index is its own cache: left byte for byte.
    assert_eq!(
        std::fs::read(w.root().join("builder/conversation/chat-index.json")).unwrap(),
        index_before
    );

    // Totals: the original's entries kept as they were, this turn's 11 + 7 tokens added.
    let usage = w.file("costs/phase/token_usage.json");
    let theirs = &usage["by_phase_and_model"]["workflow-builder"]["claude-sonnet-4"];
    assert_eq!(
        (
            &theirs["input_tokens"],
            &theirs["total_cost_usd"],
            &theirs["llm_call_count"],
            &theirs["provider"]
        ),
        (
            &json!(120000),
            &json!(0.48),
            &json!(42),
            &json!("anthropic")
        )
    );
    assert_eq!(
        usage["by_phase_and_model"]["planning"]["claude-sonnet-4"]["input_tokens"],
        3000
    );
    let ours = &usage["by_phase_and_model"]["workflow-builder"]["openai:builder-model"];
    assert_eq!(
        (
            &ours["input_tokens"],
            &ours["output_tokens"],
            &ours["prompt_tokens"]
        ),
        (&json!(11), &json!(7), &json!(11)),
        "{usage}"
    );
    // The session's figure goes on from the original's, so the delta was this turn's.
    assert_eq!(
        usage["session_cumulative"]["orig-1"]["input_tokens"],
        120011
    );
    assert_eq!(usage["created_at"], "2026-11-20T10:00:00Z");

    let daily = w.file(&format!("costs/phase/daily/{}.json", w.today));
    let day = &daily["token_usage"]["by_phase_and_model"]["workflow-builder"];
    assert_eq!(day["claude-sonnet-4"]["input_tokens"], 1000, "{daily}");
    assert_eq!(day["openai:builder-model"]["output_tokens"], 7, "{daily}");
    assert!(daily.get("by_model").is_none(), "{daily}");
}

// ------------------------------------------------------------------ 3. names and arguments

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_originals_execution_arguments_are_taken() {
    let w = World::new(vec![
        completion(
            "",
            &[
                call(
                    "execute_step",
                    json!({"step_id": "step-1", "human_input": "Use EUR prices", "tier": "low"}),
                ),
                call("execute_step", json!({"step_id": "checker"})),
                call("execute_step", json!({"step_id": "refresh"})),
                call("execute_step", json!({"step_id": "nope"})),
            ],
        ),
        completion("started", &[]),
    ]);
    let mut session = w.session(None, Some(Mode::Optimizer)).await;
    session.turn("run them").await.unwrap();
    session.settle().await.unwrap();
    let status = |step: &str| {
        read_json(&w.root().join(format!(
            "runs/iteration-0/logs/{step}/execution/execution-final-summary.json"
        )))["status"]
            .clone()
    };
    // A positional id, a route's sub-agent step and an orphan step all ran.
    for step in ["fetch", "checker", "refresh"] {
        assert_eq!(status(step), "completed", "{step}");
    }
    let unknown = w.result(1, "call-3");
    let message = unknown["error"].as_str().unwrap();
    assert!(
        message.contains("orphan steps: refresh")
            && message.contains("route sub-agent steps: checker"),
        "{message}"
    );
    // The tier's model ran the step; the human input reached its agent as context.
    let fetch_messages: Vec<(String, String)> = w
        .step_user_messages()
        .into_iter()
        .filter(|(_, text)| text.contains("Use EUR prices"))
        .collect();
    assert!(!fetch_messages.is_empty());
    for (model, text) in &fetch_messages {
        assert_eq!(model, "step-low");
        assert!(
            text.starts_with(
                "High-priority context from the operator for this run:\nUse EUR prices"
            ),
            "{text}"
        );
    }

    // A full run with human_inputs keyed by a step that is not a human_input step, and
    // disable_eval; then list_executions with status_filter.
    let w2 = World::new(vec![
        completion(
            "",
            &[call(
                "run_full_workflow",
                json!({"human_inputs": {"coordinate": "Check only tea"}, "disable_eval": true}),
            )],
        ),
        completion("running", &[]),
        completion(
            "",
            &[call("list_executions", json!({"status_filter": "done"}))],
        ),
        completion("listed", &[]),
    ]);
    let mut session = w2.session(None, Some(Mode::Optimizer)).await;
    session.turn("run all").await.unwrap();
    session.settle().await.unwrap();
    let started = w2.result(1, "call-0");
    assert_eq!(started["status"], "running", "{started}");
    assert!(started["evaluation"].is_string(), "{started}");
    let messages: Vec<String> = w2
        .step_user_messages()
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    assert!(
        messages.iter().any(|t| t.contains("Check only tea")),
        "{messages:?}"
    );
    // Only the step it is keyed by sees it.
    assert!(
        !messages
            .iter()
            .any(|t| t.contains("Write prices.json") && t.contains("Check only tea")),
        "{messages:?}"
    );
    // The completion turn's answer asked for the list.
    let listed = w2.result(3, "call-0");
    let executions = listed["executions"].as_array().unwrap();
    assert_eq!(executions.len(), 1, "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_originals_database_and_step_config_arguments_are_taken() {
    let w = World::new(vec![
        completion(
            "",
            &[
                call("query_workflow_db", json!({"action": "describe"})),
                call(
                    "query_workflow_db",
                    json!({"action": "describe", "table": "prices"}),
                ),
                call(
                    "query_workflow_db",
                    json!({"query": "SELECT item FROM prices", "max_rows": 5000}),
                ),
                call("query_workflow_db", json!({"action": "integrity_check"})),
                call(
                    "mutate_workflow_db",
                    json!({"sql": "INSERT INTO prices (item, eur) VALUES (?, ?)", "params": ["tea", 3]}),
                ),
                call(
                    "update_step_config",
                    json!({"step_id": "refresh", "reason": "the original's names",
                           "servers": ["web"], "tools": ["web:get"],
                           "validation_llm": {"provider": "openai", "model_id": "checker"},
                           "validation_schema": {"files": [{"file_name": "cache.json", "must_exist": true}]}}),
                ),
            ],
        ),
        completion("done", &[]),
    ]);
    create_db(
        w.root(),
        "CREATE TABLE prices (item TEXT, eur INTEGER); INSERT INTO prices VALUES ('coffee', 4);",
    );
    let mut session = w.session(None, Some(Mode::Builder)).await;
    session.turn("look at the data").await.unwrap();

    let tables = w.result(1, "call-0");
    assert_eq!(tables["tables"][0]["name"], "prices", "{tables}");
    let columns = w.result(1, "call-1");
    let names: Vec<&str> = columns["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["item", "eur"]);
    assert_eq!(w.result(1, "call-2")["rows"], json!([{"item": "coffee"}]));
    assert_eq!(w.result(1, "call-3")["ok"], true);
    assert_eq!(w.result(1, "call-4")["total_rows_changed"], 1);
    let conn = rusqlite::Connection::open(w.root().join("db/db.sqlite")).unwrap();
    let n: i64 = conn
        .query_row("SELECT count(*) FROM prices WHERE item = 'tea'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(n, 1);

    let config = w.result(1, "call-5");
    assert_eq!(config["ok"], true, "{config}");
    let entry = w.file("planning/step_config.json")["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == "refresh")
        .unwrap()
        .clone();
    assert_eq!(entry["agent_configs"]["selected_servers"], json!(["web"]));
    assert_eq!(entry["agent_configs"]["selected_tools"], json!(["web:get"]));
    assert_eq!(
        entry["agent_configs"]["validation_llm"]["model_id"],
        "checker"
    );
    assert_eq!(
        entry["validation_schema"]["files"][0]["file_name"],
        "cache.json"
    );
}

// ------------------------------------------------------------------ 4. the original's tools

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_originals_tools_trellis_lacked_do_their_work() {
    let w = World::new(vec![
        completion(
            "",
            &[
                call("get_workflow_config", json!({})),
                call("get_llm_config", json!({})),
                call("get_step_prompts", json!({"step_id": "1"})),
                call(
                    "validate_plan_change",
                    json!({"forbidden_references": ["retired-step"],
                           "expected_context_dependencies": {"fetch": ["prices.json"]}}),
                ),
                call(
                    "review_step_code",
                    json!({"step_id": "fetch", "focus": "output format"}),
                ),
                call(
                    "add_todo_task_route",
                    json!({"parent_step_id": "coordinate", "reason": "reuse the refresher",
                           "new_route": {"route_id": "refresher", "route_name": "Refresher",
                                         "condition": "stale prices", "orphan_step_ref": "refresh"}}),
                ),
                call(
                    "set_workflow_contract_version",
                    json!({"version": "1.0.11"}),
                ),
                call(
                    "set_workflow_llm_config",
                    json!({"mode": "explicit",
                           "tier_1": {"provider": "openai", "model_id": "big", "fallbacks": []},
                           "pulse_llm": {"provider": "openai", "model_id": "pulse"}}),
                ),
            ],
        ),
        completion(
            "",
            &[
                call("cleanup_orphan_step_configs", json!({})),
                call(
                    "validate_plan_change",
                    json!({"forbidden_references": ["retired-step"]}),
                ),
                call(
                    "update_todo_task_route",
                    json!({"parent_step_id": "coordinate", "existing_route_id": "refresher",
                           "condition": "prices older than a day", "reason": "sharper"}),
                ),
                call(
                    "delete_todo_task_route",
                    json!({"parent_step_id": "coordinate", "deleted_route_id": "checker",
                           "reason": "merged"}),
                ),
            ],
        ),
        completion("done", &[]),
    ]);
    let mut session = w.session(None, Some(Mode::Builder)).await;
    session.turn("tidy up").await.unwrap();

    assert!(w.result(1, "call-0")["files"]["workflow.json"]["exists"] == true);
    let llm = w.result(1, "call-1");
    assert_eq!(llm["llm"]["model_id"], "builder-model", "{llm}");
    let prompts = w.result(1, "call-2");
    assert_eq!(prompts["step_id"], "fetch", "{prompts}");
    assert!(
        prompts["system_prompt"]
            .as_str()
            .unwrap()
            .contains("Write prices.json"),
        "{prompts}"
    );
    let before = w.result(1, "call-3");
    assert_eq!(before["passed"], false);
    let checks: Vec<&str> = before["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["check"].as_str().unwrap())
        .collect();
    assert_eq!(
        checks,
        ["forbidden_reference", "context_dependencies"],
        "{before}"
    );
    assert_eq!(w.result(1, "call-4")["focus"], "output format");
    for id in ["call-5", "call-6"] {
        assert_eq!(w.result(1, id)["ok"], true, "{id}: {}", w.result(1, id));
    }
    let llm_set = w.result(1, "call-7");
    assert_eq!(
        llm_set["not_used"],
        json!(["tier_1.fallbacks", "pulse_llm"]),
        "{llm_set}"
    );

    let cleaned = w.result(2, "call-0");
    assert_eq!(cleaned["removed"], json!(["retired-step"]), "{cleaned}");
    assert_eq!(w.result(2, "call-1")["passed"], true);
    let manifest = w.file("workflow.json");
    assert_eq!(manifest["version"], "1.0.11");
    assert!(manifest.get("contract_version").is_none(), "{manifest}");
    assert_eq!(manifest["tiers"]["high"]["model_id"], "big");
    let plan = w.file("planning/plan.json");
    let routes = plan["steps"][1]["predefined_routes"].as_array().unwrap();
    assert_eq!(routes.len(), 1, "{plan}");
    assert_eq!(routes[0]["route_id"], "refresher");
    assert_eq!(routes[0]["condition"], "prices older than a day");

    // The original's mode name for reports.
    drop(session);
    let reporting = w.session(None, Some("reporting".parse().unwrap())).await;
    assert_eq!(reporting.mode(), Mode::Output);
}

// ------------------------------------------------------------------ fences of the new tools

/// Every file under `root`, by path, with its digest.
fn digest(root: &Path) -> std::collections::BTreeMap<String, String> {
    support::tree_digest(root)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_db_tools_refuse_attach_pragma_writes_odd_tables_and_a_linked_database() {
    let outside = tempfile::tempdir().unwrap();
    let evil = outside.path().join("evil.db");
    let w = World::new(vec![
        completion(
            "",
            &[
                call(
                    "mutate_workflow_db",
                    json!({"sql": "ATTACH DATABASE ? AS x", "params": [evil.to_str().unwrap()]}),
                ),
                call(
                    "mutate_workflow_db",
                    json!({"sql": "PRAGMA writable_schema = 1"}),
                ),
                call(
                    "query_workflow_db",
                    json!({"action": "describe", "table": "prices\"); DROP TABLE prices; --"}),
                ),
                call(
                    "query_workflow_db",
                    json!({"sql": "SELECT 1", "query": "SELECT 2"}),
                ),
            ],
        ),
        completion("done", &[]),
    ]);
    create_db(
        w.root(),
        "CREATE TABLE prices (item TEXT); INSERT INTO prices VALUES ('tea');",
    );
    let before = digest(&w.root().join("db"));
    let mut session = w.session(None, Some(Mode::Builder)).await;
    session.turn("try").await.unwrap();
    // ATTACH meets the connection's limit of no attached database, the pragma write the
    // authorizer.
    let attach = w.result(1, "call-0")["error"].as_str().unwrap().to_string();
    assert!(
        attach.contains("too many attached databases - max 0"),
        "{attach}"
    );
    let pragma = w.result(1, "call-1")["error"].as_str().unwrap().to_string();
    assert!(pragma.contains("not authorized"), "{pragma}");
    assert_eq!(
        w.result(1, "call-2")["error"],
        "query_workflow_db: table \"prices\\\"); DROP TABLE prices; --\": letters, digits, '_', '.' and '-' only (at most 128)"
    );
    assert_eq!(
        w.result(1, "call-3")["error"],
        "query_workflow_db: sql and query were both given, with different statements: give only sql (query is its alias)"
    );
    assert_eq!(digest(&w.root().join("db")), before);
    assert!(!evil.exists());

    // A database that is a link to a file outside is never opened, for writing or reading.
    let w = World::new(vec![
        completion(
            "",
            &[
                call("mutate_workflow_db", json!({"sql": "DELETE FROM prices"})),
                call("query_workflow_db", json!({"sql": "SELECT * FROM prices"})),
            ],
        ),
        completion("done", &[]),
    ]);
    create_db(
        outside.path(),
        "CREATE TABLE prices (item TEXT); INSERT INTO prices VALUES ('tea');",
    );
    std::fs::create_dir_all(w.root().join("db")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("db/db.sqlite"),
        w.root().join("db/db.sqlite"),
    )
    .unwrap();
    let outside_before = digest(outside.path());
    let mut session = w.session(None, Some(Mode::Builder)).await;
    session.turn("try").await.unwrap();
    for (id, tool) in [
        ("call-0", "mutate_workflow_db"),
        ("call-1", "query_workflow_db"),
    ] {
        assert_eq!(
            w.result(1, id)["error"],
            "db/db.sqlite is not a regular file (a link or a special file); it is not opened",
            "{tool}"
        );
    }
    assert_eq!(digest(outside.path()), outside_before);

    // Run mode has no mutate_workflow_db.
    let w = World::new(vec![
        completion(
            "",
            &[call(
                "mutate_workflow_db",
                json!({"sql": "DELETE FROM prices"}),
            )],
        ),
        completion("done", &[]),
    ]);
    create_db(
        w.root(),
        "CREATE TABLE prices (item TEXT); INSERT INTO prices VALUES ('tea');",
    );
    let before = digest(&w.root().join("db"));
    let mut session = w.session(None, Some(Mode::Run)).await;
    session.turn("try").await.unwrap();
    let err = w.result(1, "call-0")["error"].as_str().unwrap().to_string();
    assert!(
        err.starts_with("tool \"mutate_workflow_db\" is not available in run mode"),
        "{err}"
    );
    assert_eq!(digest(&w.root().join("db")), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edit_tools_write_nothing_through_a_linked_step_config() {
    let outside = tempfile::tempdir().unwrap();
    let w = World::new(vec![
        completion(
            "",
            &[
                call("cleanup_orphan_step_configs", json!({})),
                call(
                    "update_step_config",
                    json!({"step_id": "fetch", "reason": "r", "servers": ["web"]}),
                ),
            ],
        ),
        completion("done", &[]),
    ]);
    let config = w.root().join("planning/step_config.json");
    std::fs::rename(&config, outside.path().join("step_config.json")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("step_config.json"), &config).unwrap();
    let outside_before = digest(outside.path());
    let mut session = w.session(None, Some(Mode::Builder)).await;
    session.turn("tidy").await.unwrap();
    for id in ["call-0", "call-1"] {
        let err = w.result(1, id)["error"].as_str().unwrap().to_string();
        assert!(
            err.starts_with("planning/step_config.json cannot be read"),
            "{id}: {err}"
        );
    }
    assert_eq!(digest(outside.path()), outside_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agent_step_and_step_prompts_write_nothing_through_linked_output_folders() {
    let outside = tempfile::tempdir().unwrap();
    let w = World::new(vec![
        completion(
            "",
            &[
                call("execute_step", json!({"step_id": "checker"})),
                call("get_step_prompts", json!({"step_id": "fetch"})),
            ],
        ),
        completion("started", &[]),
    ]);
    let exec = w.root().join("runs/iteration-0/execution");
    std::fs::create_dir_all(&exec).unwrap();
    for step in ["checker", "fetch"] {
        std::fs::create_dir_all(outside.path().join(step)).unwrap();
        std::os::unix::fs::symlink(outside.path().join(step), exec.join(step)).unwrap();
    }
    let outside_before = digest(outside.path());
    let mut session = w.session(None, Some(Mode::Builder)).await;
    session.turn("run the checker").await.unwrap();
    session.settle().await.unwrap();
    let prompts = w.result(1, "call-1");
    assert!(
        prompts["system_prompt"]
            .as_str()
            .unwrap()
            .starts_with("(not built here:"),
        "{prompts}"
    );
    assert_eq!(digest(outside.path()), outside_before);
    let listed = session.operator_call("list_executions", &json!({})).await;
    assert_eq!(listed["executions"][0]["status"], "failed", "{listed}");
}
