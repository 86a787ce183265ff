//! The agent loop of one step (`sequence::driver`) with the bundled `replay` provider and the
//! real `workspace` plugin. Each test writes its cassette next to a temp workspace: the replay
//! provider compares every request exactly, so the cassette is built from the same system
//! prompt the driver sends (`step_system_prompt`) and from tool results obtained by calling the
//! same tool under the same grant in a twin workspace.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use serde_json::{Value, json};
use support::engine;
use trellis_host::capabilities::turn::reflection_due;
use trellis_host::capabilities::turn::{TurnContext, TurnPurpose, turn_grant};
use trellis_host::llm::{
    Cassette, Endpoint, Interaction, Message, RecordedRequest, ReplayCursor, Response, Secret,
    StopReason, Target, ToolCall, Usage,
};
use trellis_host::sequence::driver::{
    FINAL_GATE_ID, GATE_SKIPPED_SUMMARY, OFFLOAD_THRESHOLD, StepRunner, offload_reference,
    reflection_message, step_system_prompt,
};
use trellis_host::sequence::session::Status;
use trellis_host::workflow::Workspace;
use trellis_host::{Limits, PluginRegistry};

const MODEL: &str = "m-test";
const OUT: &str = "runs/iteration-0/execution/s1";

fn plan(items: Value, schema: Option<Value>) -> String {
    let mut step = json!({"id": "s1", "type": "message_sequence", "title": "S1",
        "description": "You write small files.", "items": items});
    if let Some(s) = schema {
        step["validation_schema"] = s;
    }
    json!({"objective": "driver tests", "steps": [step]}).to_string()
}

const STEP_CONFIG: &str =
    r#"{"steps": [{"id": "s1", "agent_configs": {"selected_servers": ["workspace"]}}]}"#;

fn workspace(root: &Path, plan: &str) -> Workspace {
    workspace_with(root, plan, STEP_CONFIG)
}

/// A step config for `s1` with the workspace tools and these agent settings besides.
fn config_with(settings: Value) -> String {
    let mut configs = json!({"selected_servers": ["workspace"]});
    for (k, v) in settings.as_object().unwrap() {
        configs[k] = v.clone();
    }
    json!({"steps": [{"id": "s1", "agent_configs": configs}]}).to_string()
}

fn workspace_with(root: &Path, plan: &str, config: &str) -> Workspace {
    for (rel, text) in [
        ("planning/plan.json", plan),
        ("planning/step_config.json", config),
    ] {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    std::fs::create_dir_all(root.join("db")).unwrap();
    let conn = rusqlite::Connection::open(root.join("db/db.sqlite")).unwrap();
    conn.execute_batch(
        "CREATE TABLE tickets (id INTEGER, title TEXT);
         INSERT INTO tickets VALUES (1, 'printer'), (2, 'login');",
    )
    .unwrap();
    drop(conn);
    Workspace::open(root).expect("the test workspace loads")
}

/// What a tool call returns to the model, found by making the same call in a twin workspace.
async fn expected_tool_text(
    registry: &PluginRegistry,
    plan: &str,
    item_id: &str,
    tool: &str,
    args: &Value,
) -> String {
    let twin = tempfile::tempdir().unwrap();
    twin_tool_text(
        registry,
        twin.path(),
        plan,
        STEP_CONFIG,
        Some(item_id),
        tool,
        args,
    )
    .await
}

/// What a tool call returns in the twin workspace at `twin` (created on first use, then
/// kept, so calls build on each other), under the grant of item `item_id`, or of the
/// reflection turn when `None`.
async fn twin_tool_text(
    registry: &PluginRegistry,
    twin: &Path,
    plan: &str,
    config: &str,
    item_id: Option<&str>,
    tool: &str,
    args: &Value,
) -> String {
    let ws = if twin.join("planning").is_dir() {
        Workspace::open(twin).unwrap()
    } else {
        workspace_with(twin, plan, config)
    };
    let step = ws.plan.step("s1").unwrap();
    let configs = ws.agent_configs("s1");
    let items = step.effective_items();
    let ctx = TurnContext {
        root: &ws.root,
        run_folder: "iteration-0",
        step,
        configs: &configs,
    };
    let purpose = match item_id {
        Some(id) => TurnPurpose::Item(items.iter().find(|i| i.id == id).unwrap()),
        None => TurnPurpose::Reflection,
    };
    let grant = turn_grant(&ctx, purpose).unwrap();
    match registry
        .call_tool(tool, args, &grant.grant, &Limits::default())
        .await
    {
        Ok(Value::String(s)) => s,
        Ok(v) => v.to_string(),
        Err(e) => format!("error: {e}"),
    }
}

/// Builds a cassette as the conversation goes.
struct Tape {
    messages: Vec<Message>,
    interactions: Vec<Interaction>,
}

impl Tape {
    fn new(system: String) -> Tape {
        Tape {
            messages: vec![Message::system(system)],
            interactions: Vec::new(),
        }
    }

    fn user(&mut self, text: &str) -> &mut Self {
        self.messages.push(Message::user(text));
        self
    }

    fn reply(&mut self, text: &str, calls: &[(&str, &str, Value)]) -> &mut Self {
        let response = Response {
            text: text.to_string(),
            tool_calls: calls
                .iter()
                .map(|(id, name, args)| ToolCall {
                    id: id.to_string(),
                    name: name.to_string(),
                    arguments: args.to_string(),
                })
                .collect(),
            stop_reason: if calls.is_empty() {
                StopReason::Stop
            } else {
                StopReason::ToolCalls
            },
            usage: Usage {
                prompt_tokens: 10,
                completion_tokens: 5,
                total_tokens: 15,
            },
            model: None,
        };
        self.interactions.push(Interaction {
            request: RecordedRequest {
                model: MODEL.to_string(),
                messages: self.messages.clone(),
                tools: Vec::new(),
            },
            response: response.clone(),
        });
        self.messages.push(Message::assistant(&response));
        self
    }

    fn tool(&mut self, id: &str, text: &str) -> &mut Self {
        self.messages.push(Message::tool_result(id, text));
        self
    }

    fn save(&self, path: &Path) {
        Cassette {
            interactions: self.interactions.clone(),
        }
        .save(path)
        .unwrap();
    }
}

async fn registry() -> PluginRegistry {
    PluginRegistry::with_bundled(engine()).await.unwrap()
}

fn runner<'a>(registry: &'a PluginRegistry, cassette: &Path) -> StepRunner<'a> {
    let target = Target {
        provider: "replay".into(),
        model: MODEL.into(),
        endpoint: Endpoint::replay(cassette, 0).unwrap(),
        secret: Secret::none(),
    };
    StepRunner::new(registry, vec![target], Limits::default())
        .with_replay(ReplayCursor::new(cassette))
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_message_turn_writes_a_file_and_the_logs() {
    let registry = registry().await;
    let plan = plan(
        json!([{"id": "write", "type": "user_message", "message": "Write hello.txt."}]),
        None,
    );
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &plan);
    let args = json!({"path": format!("{OUT}/hello.txt"), "content": "hello"});
    let result = expected_tool_text(&registry, &plan, "write", "workspace:write_file", &args).await;
    let mut tape = Tape::new(step_system_prompt(&ws, "s1").unwrap());
    tape.user("Write hello.txt.")
        .reply("", &[("c1", "workspace:write_file", args)])
        .tool("c1", &result)
        .reply("Done.\nCONCERNS: none really", &[]);
    let cassette = dir.path().join("cassette.json");
    tape.save(&cassette);

    let outcome = runner(&registry, &cassette)
        .run_step(&ws, "s1")
        .await
        .unwrap();
    assert_eq!(outcome.status, Status::Completed, "{:?}", outcome.error);
    assert_eq!(outcome.turns, 1);
    assert_eq!(
        outcome.final_text.as_deref(),
        Some("Done.\nCONCERNS: none really")
    );
    assert_eq!(outcome.concerns, vec!["none really"]);
    let out = dir.path().join(OUT);
    assert_eq!(
        std::fs::read_to_string(out.join("hello.txt")).unwrap(),
        "hello"
    );
    let session = read_json(&out.join("session.json"));
    assert_eq!(session["status"], "completed");
    assert_eq!(session["entries"][0]["status"], "completed");
    let summary = read_json(&out.join("execution-final-summary.json"));
    assert_eq!(summary["status"], "completed");
    let logs: Vec<_> = std::fs::read_dir(dir.path().join("runs/iteration-0/logs/s1"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let conv = logs
        .iter()
        .find(|n| n.ends_with("-conversation.json"))
        .expect("a conversation log");
    let conv = read_json(&dir.path().join("runs/iteration-0/logs/s1").join(conv));
    assert_eq!(conv["llm_calls"].as_array().unwrap().len(), 2);
    assert_eq!(conv["tool_calls"].as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreach_renders_one_turn_per_row() {
    let registry = registry().await;
    let plan = plan(
        json!([{"id": "each", "type": "foreach",
                "source_sql": "SELECT id, title FROM tickets ORDER BY id",
                "message": "Ticket {{.id}}: {{.title}}"}]),
        None,
    );
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &plan);
    // A hand-written cassette: the system prompt is the step description, the grant's
    // description and the tool policy note, all stable.
    let cassette =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sequence/foreach.cassette.json");
    let outcome = runner(&registry, &cassette)
        .run_step(&ws, "s1")
        .await
        .unwrap();
    assert_eq!(outcome.status, Status::Completed, "{:?}", outcome.error);
    assert_eq!(outcome.turns, 2);
    assert_eq!(outcome.final_text.as_deref(), Some("ok 2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_prevalidation_gets_a_repair_turn() {
    let registry = registry().await;
    let schema = json!({"files": [{"file_name": "report.json", "must_exist": true}]});
    // The gate's own schema, or none: then it checks the step's schema.
    for gate in [
        json!({"id": "gate", "type": "prevalidation", "validation_schema": schema}),
        json!({"id": "gate", "type": "prevalidation"}),
    ] {
        repair_turn_case(&registry, &schema, gate).await;
    }
}

async fn repair_turn_case(registry: &PluginRegistry, schema: &Value, gate: Value) {
    let plan = plan(
        json!([
            {"id": "start", "type": "user_message", "message": "Begin."},
            gate
        ]),
        Some(schema.clone()),
    );
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &plan);
    let args = json!({"path": format!("{OUT}/report.json"), "content": "{}"});
    let result = expected_tool_text(registry, &plan, "start", "workspace:write_file", &args).await;

    // The repair message is whatever the driver builds from the real report: run the gate on
    // the empty output folder the same way to know it.
    let validators = trellis_host::plugins::PluginValidators::new(registry, Limits::default());
    let parsed: trellis_host::validation::ValidationSchema = ws
        .plan
        .step("s1")
        .unwrap()
        .validation_schema
        .clone()
        .unwrap();
    let report = trellis_host::validation::run_gate(
        &ws.root,
        &dir.path().join("nowhere"),
        &parsed,
        &validators,
    )
    .unwrap();
    assert!(!report.passed);
    let repair = trellis_host::sequence::driver::repair_message("gate", &report);
    assert!(repair.contains("report.json"), "{repair}");

    let mut tape = Tape::new(step_system_prompt(&ws, "s1").unwrap());
    tape.user("Begin.")
        .reply("Begun.", &[])
        .user(&repair)
        .reply("", &[("r1", "workspace:write_file", args)])
        .tool("r1", &result)
        .reply("Fixed.", &[]);
    let cassette = dir.path().join("cassette.json");
    tape.save(&cassette);
    let outcome = runner(registry, &cassette)
        .run_step(&ws, "s1")
        .await
        .unwrap();
    assert_eq!(outcome.status, Status::Completed, "{:?}", outcome.error);
    assert_eq!(outcome.turns, 2);
    let session = read_json(&dir.path().join(OUT).join("session.json"));
    // The final gate equals the last prevalidation: it is not run again.
    assert_eq!(session["entries"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_failed_ends_the_step() {
    let registry = registry().await;
    let plan = plan(
        json!([
            {"id": "one", "type": "user_message", "message": "Try."},
            {"id": "two", "type": "user_message", "message": "Never sent."}
        ]),
        None,
    );
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &plan);
    let mut tape = Tape::new(step_system_prompt(&ws, "s1").unwrap());
    tape.user("Try.")
        .reply("Cannot.\nSTATUS: FAILED: the data is missing", &[]);
    let cassette = dir.path().join("cassette.json");
    tape.save(&cassette);
    let outcome = runner(&registry, &cassette)
        .run_step(&ws, "s1")
        .await
        .unwrap();
    assert_eq!(outcome.status, Status::Failed);
    assert_eq!(outcome.error.as_deref(), Some("the data is missing"));
    let summary = read_json(&dir.path().join(OUT).join("execution-final-summary.json"));
    assert_eq!(summary["status"], "failed");
    assert_eq!(summary["execution_result"], "the data is missing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_error_goes_back_to_the_model() {
    let registry = registry().await;
    let plan = plan(
        json!([{"id": "evil", "type": "user_message", "message": "Edit the plan."}]),
        None,
    );
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &plan);
    let args = json!({"path": "planning/evil.json", "content": "{}"});
    let result = expected_tool_text(&registry, &plan, "evil", "workspace:write_file", &args).await;
    assert!(result.starts_with("error: "), "{result}");
    let mut tape = Tape::new(step_system_prompt(&ws, "s1").unwrap());
    tape.user("Edit the plan.")
        .reply("", &[("e1", "workspace:write_file", args)])
        .tool("e1", &result)
        .reply("I may not write there.", &[]);
    let cassette = dir.path().join("cassette.json");
    tape.save(&cassette);
    let outcome = runner(&registry, &cassette)
        .run_step(&ws, "s1")
        .await
        .unwrap();
    assert_eq!(outcome.status, Status::Completed, "{:?}", outcome.error);
    assert_eq!(
        outcome.final_text.as_deref(),
        Some("I may not write there.")
    );
    assert!(!dir.path().join("planning/evil.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_before_the_first_item_records_stopped() {
    let registry = registry().await;
    let plan = plan(
        json!([{"id": "one", "type": "user_message", "message": "Go."}]),
        None,
    );
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &plan);
    let cassette = dir.path().join("cassette.json");
    Tape::new(String::new()).save(&cassette);
    let cancel = Arc::new(AtomicBool::new(true));
    let outcome = runner(&registry, &cassette)
        .with_cancel(cancel)
        .run_step(&ws, "s1")
        .await
        .unwrap();
    assert_eq!(outcome.status, Status::Stopped);
    assert_eq!(outcome.turns, 0);
    let session = read_json(&dir.path().join(OUT).join("session.json"));
    assert_eq!(session["status"], "stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_tool_rounds_fail_the_step() {
    let registry = registry().await;
    let plan = plan(
        json!([{"id": "loop", "type": "user_message", "message": "Loop."}]),
        None,
    );
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &plan);
    let args = json!({"path": "planning/evil.json", "content": "{}"});
    let result = expected_tool_text(&registry, &plan, "loop", "workspace:write_file", &args).await;
    let mut tape = Tape::new(step_system_prompt(&ws, "s1").unwrap());
    tape.user("Loop.")
        .reply(
            "",
            &[
                ("a", "workspace:write_file", args.clone()),
                ("b", "workspace:write_file", args.clone()),
            ],
        )
        .tool("a", &result)
        .tool("b", &result)
        .reply("", &[("c", "workspace:write_file", args)]);
    let cassette = dir.path().join("cassette.json");
    tape.save(&cassette);
    let outcome = runner(&registry, &cassette)
        .with_max_tool_rounds(1)
        .run_step(&ws, "s1")
        .await
        .unwrap();
    assert_eq!(outcome.status, Status::Failed);
    let error = outcome.error.unwrap();
    assert!(error.contains("more than 1 tool rounds"), "{error}");
}

fn entries(session: &Value) -> Vec<(String, String, String)> {
    session["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["entry_id"].as_str().unwrap().to_string(),
                e["item_type"].as_str().unwrap().to_string(),
                e["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn owned(v: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    v.iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reflection_turn_writes_only_the_store_that_is_due() {
    let registry = registry().await;
    let plan = plan(
        json!([{"id": "work", "type": "user_message", "message": "Work."}]),
        None,
    );
    let learnings = "learnings/_global/s1.md";
    let note = "knowledgebase/notes/s1.md";
    // (settings, the store written, the store refused)
    let cases = [
        (
            json!({"learning_objective": "which check failed first",
                   "learning_detail_level": "general"}),
            learnings,
            note,
        ),
        (
            json!({"knowledgebase_contribution": "the refund rules met today"}),
            note,
            learnings,
        ),
    ];
    for (settings, due, refused) in cases {
        let config = config_with(settings.clone());
        let dir = tempfile::tempdir().unwrap();
        let ws = workspace_with(dir.path(), &plan, &config);
        let configs = ws.agent_configs("s1");
        let due_stores = reflection_due(&configs).expect("a reflection is due");
        let message = reflection_message("s1", &configs, due_stores);
        if due == learnings {
            assert!(
                message.contains("which check failed first") && message.contains("general"),
                "{message}"
            );
        } else {
            assert!(message.contains("the refund rules met today"), "{message}");
        }
        let twin = tempfile::tempdir().unwrap();
        let mut tape = Tape::new(step_system_prompt(&ws, "s1").unwrap());
        tape.user("Work.").reply("Work done.", &[]).user(&message);
        let writes = [
            ("r1", due.to_string(), true),
            ("r2", refused.to_string(), false),
            ("r3", format!("{OUT}/late.txt"), false),
        ];
        let calls: Vec<(&str, &str, Value)> = writes
            .iter()
            .map(|(id, path, _)| {
                (
                    *id,
                    "workspace:write_file",
                    json!({"path": path, "content": "- a lesson"}),
                )
            })
            .collect();
        tape.reply("", &calls);
        for ((id, path, allowed), (_, tool, args)) in writes.iter().zip(&calls) {
            let text =
                twin_tool_text(&registry, twin.path(), &plan, &config, None, tool, args).await;
            assert_eq!(!text.starts_with("error:"), *allowed, "{path}: {text}");
            tape.tool(id, &text);
        }
        tape.reply("Recorded.", &[]);
        let cassette = dir.path().join("cassette.json");
        tape.save(&cassette);
        let outcome = runner(&registry, &cassette)
            .run_step(&ws, "s1")
            .await
            .unwrap();
        assert_eq!(outcome.status, Status::Completed, "{:?}", outcome.error);
        assert_eq!(outcome.turns, 2);
        assert_eq!(outcome.final_text.as_deref(), Some("Work done."));
        assert!(dir.path().join(due).is_file(), "{due}");
        assert!(!dir.path().join(refused).exists(), "{refused}");
        assert!(!dir.path().join(OUT).join("late.txt").exists());
        let session = read_json(&dir.path().join(OUT).join("session.json"));
        assert_eq!(
            entries(&session),
            owned(&[
                ("work", "user_message", "completed"),
                ("s1-reflection", "reflection", "completed")
            ])
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reflection_turn_when_learnings_are_locked_or_disabled() {
    let registry = registry().await;
    let plan = plan(
        json!([{"id": "work", "type": "user_message", "message": "Work."}]),
        None,
    );
    for settings in [
        json!({"learning_objective": "x", "lock_learnings": true, "lock_learnings_reason": "audited"}),
        json!({"learning_objective": "x", "disable_learning": true}),
        json!({"learnings_access": "read-write"}),
    ] {
        let config = config_with(settings.clone());
        let dir = tempfile::tempdir().unwrap();
        let ws = workspace_with(dir.path(), &plan, &config);
        assert_eq!(reflection_due(&ws.agent_configs("s1")), None, "{settings}");
        // The cassette ends with the work: a reflection call would not be recorded.
        let mut tape = Tape::new(step_system_prompt(&ws, "s1").unwrap());
        tape.user("Work.").reply("Work done.", &[]);
        let cassette = dir.path().join("cassette.json");
        tape.save(&cassette);
        let outcome = runner(&registry, &cassette)
            .run_step(&ws, "s1")
            .await
            .unwrap();
        assert_eq!(
            outcome.status,
            Status::Completed,
            "{settings}: {:?}",
            outcome.error
        );
        let session = read_json(&dir.path().join(OUT).join("session.json"));
        assert_eq!(
            entries(&session),
            owned(&[("work", "user_message", "completed")]),
            "{settings}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_validation_skips_every_gate() {
    let registry = registry().await;
    let plan = plan(
        json!([
            {"id": "work", "type": "user_message", "message": "Work."},
            {"id": "gate", "type": "prevalidation",
             "validation_schema": {"files": [{"file_name": "a.json", "must_exist": true}]}}
        ]),
        Some(json!({"files": [{"file_name": "report.json", "must_exist": true}]})),
    );
    let config = config_with(json!({"disable_validation": true}));
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace_with(dir.path(), &plan, &config);
    let mut tape = Tape::new(step_system_prompt(&ws, "s1").unwrap());
    tape.user("Work.").reply("Nothing written.", &[]);
    let cassette = dir.path().join("cassette.json");
    tape.save(&cassette);
    let outcome = runner(&registry, &cassette)
        .run_step(&ws, "s1")
        .await
        .unwrap();
    assert_eq!(outcome.status, Status::Completed, "{:?}", outcome.error);
    let session = read_json(&dir.path().join(OUT).join("session.json"));
    assert_eq!(
        entries(&session),
        owned(&[
            ("work", "user_message", "completed"),
            ("gate", "prevalidation", "skipped"),
            (FINAL_GATE_ID, "prevalidation", "skipped")
        ])
    );
    assert_eq!(session["entries"][1]["summary"], GATE_SKIPPED_SUMMARY);
    assert!(
        !dir.path()
            .join("runs/iteration-0/logs/s1/pre_validation.json")
            .exists(),
        "no gate ran"
    );

    // The same step with validation on fails its gate: the skip is what let it pass.
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace_with(dir.path(), &plan, STEP_CONFIG);
    let cassette = dir.path().join("cassette.json");
    tape.save(&cassette);
    let outcome = runner(&registry, &cassette)
        .run_step(&ws, "s1")
        .await
        .unwrap();
    assert_eq!(outcome.status, Status::Failed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_tool_results_are_offloaded_to_a_file() {
    let registry = registry().await;
    let plan = plan(
        json!([{"id": "work", "type": "user_message", "message": "Write and read back."}]),
        None,
    );
    let config = config_with(json!({"enable_context_offloading": true}));
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace_with(dir.path(), &plan, &config);
    let twin = tempfile::tempdir().unwrap();
    let big = "0123456789abcdef\n".repeat(1500);
    let write = json!({"path": format!("{OUT}/big.txt"), "content": big});
    let read = json!({"path": format!("{OUT}/big.txt")});
    let mut tape = Tape::new(step_system_prompt(&ws, "s1").unwrap());
    tape.user("Write and read back.")
        .reply("", &[("w1", "workspace:write_file", write.clone())]);
    let written = twin_tool_text(
        &registry,
        twin.path(),
        &plan,
        &config,
        Some("work"),
        "workspace:write_file",
        &write,
    )
    .await;
    assert!(written.len() < OFFLOAD_THRESHOLD, "{written}");
    tape.tool("w1", &written)
        .reply("", &[("r1", "workspace:read_file", read.clone())]);
    let full = twin_tool_text(
        &registry,
        twin.path(),
        &plan,
        &config,
        Some("work"),
        "workspace:read_file",
        &read,
    )
    .await;
    assert!(full.len() > OFFLOAD_THRESHOLD, "{}", full.len());
    let file = format!("{OUT}/tool-results/r1.json");
    let reference = offload_reference(&file, full.len());
    tape.tool("r1", &reference).reply("Read it.", &[]);
    let cassette = dir.path().join("cassette.json");
    tape.save(&cassette);
    let outcome = runner(&registry, &cassette)
        .run_step(&ws, "s1")
        .await
        .unwrap();
    assert_eq!(outcome.status, Status::Completed, "{:?}", outcome.error);
    let offloaded = read_json(&dir.path().join(&file));
    assert_eq!(offloaded, serde_json::from_str::<Value>(&full).unwrap());
    let session = read_json(&dir.path().join(OUT).join("session.json"));
    let history = session["conversation_history"].as_array().unwrap();
    let tool_messages: Vec<&str> = history
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(tool_messages, [written.as_str(), reference.as_str()]);
    assert!(reference.contains(&file), "{reference}");
}
