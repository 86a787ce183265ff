//! The agent loop of one step (`sequence::driver`) with the bundled `replay` provider and the
//! real `workspace` plugin. Each test writes its cassette next to a temp workspace: the replay
//! provider compares every request exactly, so the cassette is built from the same system
//! prompt the driver sends (`step_system_prompt`) and from tool results obtained by calling the
//! same tool under the same grant in a twin workspace (tests/support/tape.rs).

use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use serde_json::{Value, json};
use support::registry;
use support::tape::{Conv, Tape, Twin, replay_runner, write_calls};
use support::workspace::{create_db, read_json, write_files};
use trellis_runner::driver::{
    FINAL_GATE_ID, GATE_SKIPPED_SUMMARY, OFFLOAD_THRESHOLD, StepOutcome, StepRunner,
    offload_reference, reflection_message, step_system_prompt,
};
use trellis_runner::grants::reflection_due;
use trellis_runner::session::Status;
use trellis_sandbox::Limits;
use trellis_sandbox::PluginRegistry;
use trellis_workflow::Workspace;

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
    write_files(
        root,
        &[
            ("planning/plan.json", plan),
            ("planning/step_config.json", config),
        ],
    );
    create_db(
        root,
        "CREATE TABLE tickets (id INTEGER, title TEXT);
         INSERT INTO tickets VALUES (1, 'printer'), (2, 'login');",
    );
    Workspace::open(root).expect("the test workspace loads")
}

/// What a tool call of item `item_id` returns to the model, found by making the same call
/// in a fresh twin workspace.
async fn expected_tool_text(
    registry: &PluginRegistry,
    plan: &str,
    item_id: &str,
    tool: &str,
    args: &Value,
) -> String {
    Twin::new(|root| workspace(root, plan))
        .item(registry, "s1", item_id, tool, args)
        .await
}

/// The conversation of step `s1` in `ws`, opening with the system prompt the driver sends.
fn conversation(ws: &Workspace) -> (Tape, Conv) {
    (
        Tape::new(MODEL),
        Conv::new(step_system_prompt(ws, "s1").unwrap()),
    )
}

fn runner<'a>(registry: &'a PluginRegistry, cassette: &Path) -> StepRunner<'a> {
    replay_runner(registry, MODEL, cassette)
}

/// Plays `cassette` through step `s1` of `ws`.
async fn play(registry: &PluginRegistry, cassette: &Path, ws: &Workspace) -> StepOutcome {
    runner(registry, cassette).run_step(ws, "s1").await.unwrap()
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
    let (mut tape, mut conv) = conversation(&ws);
    conv.user("Write hello.txt.")
        .reply(&mut tape, "", &[("c1", "workspace:write_file", args)])
        .tool("c1", &result)
        .reply(&mut tape, "Done.\nCONCERNS: none really", &[]);
    let cassette = tape.save_in(dir.path());

    let outcome = play(&registry, &cassette, &ws).await;
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
    let logs: Vec<_> = std::fs::read_dir(dir.path().join("runs/iteration-0/logs/s1/execution"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let conv = logs
        .iter()
        .find(|n| n.ends_with("-conversation.json"))
        .expect("a conversation log");
    let conv = read_json(
        &dir.path()
            .join("runs/iteration-0/logs/s1/execution")
            .join(conv),
    );
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
    let outcome = play(&registry, &cassette, &ws).await;
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
    let validators =
        trellis_workflow::validation::PluginValidators::new(registry, Limits::default());
    let parsed: trellis_workflow::validation::ValidationSchema = ws
        .plan
        .step("s1")
        .unwrap()
        .validation_schema
        .clone()
        .unwrap();
    let report = trellis_workflow::validation::run_gate(
        &ws.root,
        &dir.path().join("nowhere"),
        &parsed,
        &validators,
    )
    .await
    .unwrap();
    assert!(!report.passed);
    let repair = trellis_runner::driver::repair_message("gate", &report);
    assert!(repair.contains("report.json"), "{repair}");

    let (mut tape, mut conv) = conversation(&ws);
    conv.user("Begin.")
        .reply(&mut tape, "Begun.", &[])
        .user(&repair)
        .reply(&mut tape, "", &[("r1", "workspace:write_file", args)])
        .tool("r1", &result)
        .reply(&mut tape, "Fixed.", &[]);
    let cassette = tape.save_in(dir.path());
    let outcome = play(registry, &cassette, &ws).await;
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
    let (mut tape, mut conv) = conversation(&ws);
    conv.user("Try.").reply(
        &mut tape,
        "Cannot.\nSTATUS: FAILED: the data is missing",
        &[],
    );
    let cassette = tape.save_in(dir.path());
    let outcome = play(&registry, &cassette, &ws).await;
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
    let (mut tape, mut conv) = conversation(&ws);
    conv.user("Edit the plan.")
        .reply(&mut tape, "", &[("e1", "workspace:write_file", args)])
        .tool("e1", &result)
        .reply(&mut tape, "I may not write there.", &[]);
    let cassette = tape.save_in(dir.path());
    let outcome = play(&registry, &cassette, &ws).await;
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
    let cassette = Tape::new(MODEL).save_in(dir.path());
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
async fn a_turn_out_of_tool_rounds_answers_without_tools() {
    let registry = registry().await;
    let plan = plan(
        json!([{"id": "loop", "type": "user_message", "message": "Loop."}]),
        None,
    );
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &plan);
    let args = json!({"path": "planning/evil.json", "content": "{}"});
    let result = expected_tool_text(&registry, &plan, "loop", "workspace:write_file", &args).await;
    let (mut tape, mut conv) = conversation(&ws);
    conv.user("Loop.")
        .reply(
            &mut tape,
            "",
            &[
                ("a", "workspace:write_file", args.clone()),
                ("b", "workspace:write_file", args.clone()),
            ],
        )
        .tool("a", &result)
        .tool("b", &result)
        .user(&trellis_runner::driver::out_of_tool_rounds(1))
        .reply(
            &mut tape,
            "what I have",
            &[("c", "workspace:write_file", args)],
        );
    let cassette = tape.save_in(dir.path());
    let outcome = runner(&registry, &cassette)
        .with_max_tool_rounds(1)
        .run_step(&ws, "s1")
        .await
        .unwrap();
    // The last call's reply ends the turn; the tool call it still asked for is not run.
    assert_eq!(outcome.status, Status::Completed, "{:?}", outcome.error);
    assert_eq!(outcome.final_text.as_deref(), Some("what I have"));
    assert!(!dir.path().join("planning/evil.json").exists());
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
        let twin = Twin::new(|root| workspace_with(root, &plan, &config));
        let (mut tape, mut conv) = conversation(&ws);
        conv.user("Work.")
            .reply(&mut tape, "Work done.", &[])
            .user(&message);
        let writes = [
            ("r1", due.to_string(), true),
            ("r2", refused.to_string(), false),
            ("r3", format!("{OUT}/late.txt"), false),
        ];
        let calls = write_calls(&writes, "- a lesson");
        conv.reply(&mut tape, "", &calls);
        for ((id, path, allowed), (_, tool, args)) in writes.iter().zip(&calls) {
            let text = twin.reflection(&registry, "s1", tool, args).await;
            assert_eq!(!text.starts_with("error:"), *allowed, "{path}: {text}");
            conv.tool(id, &text);
        }
        conv.reply(&mut tape, "Recorded.", &[]);
        let cassette = tape.save_in(dir.path());
        let outcome = play(&registry, &cassette, &ws).await;
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
        let (mut tape, mut conv) = conversation(&ws);
        conv.user("Work.").reply(&mut tape, "Work done.", &[]);
        let cassette = tape.save_in(dir.path());
        let outcome = play(&registry, &cassette, &ws).await;
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
    let (mut tape, mut conv) = conversation(&ws);
    conv.user("Work.").reply(&mut tape, "Nothing written.", &[]);
    let cassette = tape.save_in(dir.path());
    let outcome = play(&registry, &cassette, &ws).await;
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
    let cassette = tape.save_in(dir.path());
    let outcome = play(&registry, &cassette, &ws).await;
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
    let twin = Twin::new(|root| workspace_with(root, &plan, &config));
    let big = "0123456789abcdef\n".repeat(1500);
    let write = json!({"path": format!("{OUT}/big.txt"), "content": big});
    let read = json!({"path": format!("{OUT}/big.txt")});
    let (mut tape, mut conv) = conversation(&ws);
    conv.user("Write and read back.").reply(
        &mut tape,
        "",
        &[("w1", "workspace:write_file", write.clone())],
    );
    let written = twin
        .item(&registry, "s1", "work", "workspace:write_file", &write)
        .await;
    assert!(written.len() < OFFLOAD_THRESHOLD, "{written}");
    conv.tool("w1", &written).reply(
        &mut tape,
        "",
        &[("r1", "workspace:read_file", read.clone())],
    );
    let full = twin
        .item(&registry, "s1", "work", "workspace:read_file", &read)
        .await;
    assert!(full.len() > OFFLOAD_THRESHOLD, "{}", full.len());
    let file = format!("{OUT}/tool-results/r1.json");
    let reference = offload_reference(&file, full.len());
    conv.tool("r1", &reference)
        .reply(&mut tape, "Read it.", &[]);
    let cassette = tape.save_in(dir.path());
    let outcome = play(&registry, &cassette, &ws).await;
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
