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
use trellis_host::capabilities::turn::{TurnContext, TurnPurpose, turn_grant};
use trellis_host::llm::{
    Cassette, Endpoint, Interaction, Message, RecordedRequest, ReplayCursor, Response, Secret,
    StopReason, Target, ToolCall, Usage,
};
use trellis_host::sequence::driver::{StepRunner, step_system_prompt};
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
    for (rel, text) in [
        ("planning/plan.json", plan),
        ("planning/step_config.json", STEP_CONFIG),
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
    let ws = workspace(twin.path(), plan);
    let step = ws.plan.step("s1").unwrap();
    let configs = ws.agent_configs("s1");
    let items = step.effective_items();
    let item = items.iter().find(|i| i.id == item_id).unwrap();
    let ctx = TurnContext {
        root: &ws.root,
        run_folder: "iteration-0",
        step,
        configs: &configs,
    };
    let grant = turn_grant(&ctx, TurnPurpose::Item(item)).unwrap();
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
    let plan = plan(
        json!([
            {"id": "start", "type": "user_message", "message": "Begin."},
            {"id": "gate", "type": "prevalidation", "validation_schema": schema}
        ]),
        Some(schema.clone()),
    );
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &plan);
    let args = json!({"path": format!("{OUT}/report.json"), "content": "{}"});
    let result = expected_tool_text(&registry, &plan, "start", "workspace:write_file", &args).await;

    // The repair message is whatever the driver builds from the real report: run the gate on
    // the empty output folder the same way to know it.
    let validators = trellis_host::plugins::PluginValidators::new(&registry, Limits::default());
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
    let outcome = runner(&registry, &cassette)
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
