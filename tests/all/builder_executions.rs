//! The builder's execution tools (`trellis_builder::executions`) on real workspaces,
//! against a real OpenAI-compatible server on 127.0.0.1 that holds answers back until the
//! test lets them go: a start returns at once and the run is watched live, a step started
//! twice is one execution, a message reaches the running agent's next request, a stop
//! cancels, a full run missing an answer starts nothing, the poll guard, the end reported
//! once, `debug_step` on a failed step, and executions sharing the workspace lock.

use crate::support;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::tree_digest;
use support::workspace::write_file;
use trellis_builder::executions::{Executions, Finished};
use trellis_builder::{BuilderEvent, BuilderObserver, Mode, ToolContext};
use trellis_runner::runtime::{ExecutionStatus, Runtime, StartOptions};
use trellis_runner::workflow_run::RunOptions;
use trellis_runner::workspace_lock::is_held;
use trellis_sandbox::Limits;
use trellis_sandbox::capabilities::DbWriteBudget;

/// Answers held back: request `n` (from 0) waits while `held(n)` and the gate is closed.
#[derive(Clone, Default)]
struct Gate {
    open: Arc<AtomicBool>,
    arrived: Arc<AtomicUsize>,
}

impl Gate {
    fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }

    /// Waits until `n` requests have reached the server.
    async fn arrived(&self, n: usize) {
        let waited = Instant::now();
        while self.arrived.load(Ordering::SeqCst) < n {
            assert!(
                waited.elapsed() < Duration::from_secs(120),
                "no request {n}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A server answering request `n` with `answer(n)`, holding it while `held(n)` until the
/// gate opens.
fn server(
    gate: &Gate,
    held: impl Fn(usize) -> bool + Send + Sync + 'static,
    answer: impl Fn(usize) -> Value + Send + Sync + 'static,
) -> FakeServer {
    let gate = gate.clone();
    FakeServer::start(Box::new(move |_| {
        let n = gate.arrived.fetch_add(1, Ordering::SeqCst);
        if held(n) {
            let waited = Instant::now();
            while !gate.open.load(Ordering::SeqCst) && waited.elapsed() < Duration::from_secs(120) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        (200, answer(n))
    }))
}

/// A workspace of agent steps (`regular`, in order) on `server`, plus `extra` plan steps.
fn workspace(root: &Path, server: &FakeServer, steps: &[&str], extra: Value) {
    let mut plan_steps: Vec<Value> = steps
        .iter()
        .map(|id| json!({"id": id, "type": "regular", "title": id, "description": format!("Do {id}.")}))
        .collect();
    plan_steps.extend(extra.as_array().cloned().unwrap_or_default());
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "t", "steps": plan_steps}).to_string(),
    );
    write_file(root, "planning/step_config.json", r#"{"steps": []}"#);
    write_file(
        root,
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": server.providers()})
            .to_string(),
    );
}

/// A builder session's executions, and the lines their events reported.
struct Session {
    runtime: Runtime,
    executions: Executions,
    lines: Arc<Mutex<Vec<(String, String)>>>,
    observer: BuilderObserver,
    limits: Limits,
}

impl Session {
    async fn new() -> Session {
        let runtime = Runtime::new(Arc::new(support::registry().await));
        let template =
            StartOptions::new(RunOptions::default(), support::fake_llm::loopback_llm(None));
        let executions = Executions::new(runtime.clone(), template);
        let lines = Arc::new(Mutex::new(Vec::new()));
        let seen = lines.clone();
        let observer = BuilderObserver::new(move |event| {
            if let BuilderEvent::Execution { id, line } = event {
                seen.lock().unwrap().push((id.clone(), line.clone()));
            }
        });
        Session {
            runtime,
            executions,
            lines,
            observer,
            limits: Limits::default(),
        }
    }

    async fn call(&self, root: &Path, tool: &str, args: Value) -> Result<Value, Value> {
        let writes = DbWriteBudget::new(self.limits.fs);
        let ctx = ToolContext {
            root,
            mode: Mode::Optimizer,
            registry: self.runtime.registry(),
            limits: &self.limits,
            turn_writes: &writes,
            session_id: "test-session",
            observer: &self.observer,
            work: &trellis_builder::call_work(),
        };
        self.executions
            .call(&ctx, tool, &args)
            .await
            .map_err(|f| f.to_json())
    }

    async fn ok(&self, root: &Path, tool: &str, args: Value) -> Value {
        match self.call(root, tool, args.clone()).await {
            Ok(answer) => answer,
            Err(e) => panic!("{tool} {args}: {e}"),
        }
    }

    async fn refused(&self, root: &Path, tool: &str, args: Value) -> Value {
        match self.call(root, tool, args.clone()).await {
            Ok(answer) => panic!("{tool} {args} was not refused: {answer}"),
            Err(e) => e,
        }
    }

    /// Waits until execution `id` reported a line containing `text`.
    async fn line(&self, id: &str, text: &str) {
        let waited = Instant::now();
        loop {
            if self
                .lines
                .lock()
                .unwrap()
                .iter()
                .any(|(i, l)| i == id && l.contains(text))
            {
                return;
            }
            assert!(
                waited.elapsed() < Duration::from_secs(120),
                "{id} never reported {text:?}: {:?}",
                self.lines.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn messages_of(body: &Value) -> Vec<(String, String)> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_string(),
                m["content"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The output folder of step `a`, which its agent may list.
const OUT: &str = "runs/iteration-0/execution/a";

#[tokio::test(flavor = "multi_thread")]
async fn a_start_returns_at_once_and_the_run_is_watched_live_then_reported_once() {
    // The first answer asks for a tool call; the second is held until the test lets it go.
    let gate = Gate::default();
    let server = server(
        &gate,
        |n| n == 1,
        |n| match n {
            0 => completion("", &[("workspace__list_dir", json!({"path": OUT}))]),
            _ => completion("all done", &[]),
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, &server, &["a"], json!([]));
    let session = Session::new().await;

    let started = session
        .ok(root, "execute_step", json!({"step_id": "a"}))
        .await;
    assert_eq!(
        started,
        json!({"execution_id": "exec-a-1", "status": "running"})
    );
    let running = session.executions.running();
    assert_eq!(running.len(), 1);
    assert_eq!(
        (running[0].id.as_str(), running[0].target.as_str()),
        ("exec-a-1", "a")
    );

    // The tool call ran and the second LLM call waits at the server: the step still runs.
    gate.arrived(2).await;
    session.line("exec-a-1", "tool workspace:list_dir").await;
    let live = session
        .ok(root, "query_step", json!({"execution_id": "exec-a-1"}))
        .await;
    assert_eq!(live["status"], "running", "{live}");
    assert_eq!(live["current_turn"], 1, "{live}");
    assert_eq!(live["current_item"]["step_id"], "a", "{live}");
    let calls = live["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{live}");
    assert_eq!(calls[0]["name"], "workspace:list_dir");
    assert_eq!(calls[0]["status"], "ok", "{live}");
    assert_eq!(calls[0]["arguments"], json!({"path": OUT}).to_string());
    assert!(
        live.get("result").is_none(),
        "no result while running: {live}"
    );
    let call_id = calls[0]["tool_call_id"].as_str().unwrap();
    let whole = session
        .ok(
            root,
            "query_step",
            json!({"step_id": "a", "tool_call_id": call_id}),
        )
        .await;
    assert_eq!(whole["tool_call"]["arguments"], json!({"path": OUT}));
    let missing = session
        .refused(
            root,
            "query_step",
            json!({"execution_id": "exec-a-1", "tool_call_id": "nope"}),
        )
        .await;
    assert!(
        missing["error"].as_str().unwrap().contains(call_id),
        "{missing}"
    );
    assert!(
        session.executions.take_finished().is_empty(),
        "not ended yet"
    );

    gate.open();
    session.executions.wait_all().await;
    assert!(session.executions.running().is_empty());
    let finished = session.executions.take_finished();
    assert_eq!(finished.len(), 1, "{finished:?}");
    let Finished {
        id,
        status,
        summary,
    } = &finished[0];
    assert_eq!((id.as_str(), *status), ("exec-a-1", ExecutionStatus::Done));
    assert!(summary.contains("a completed"), "{summary}");
    assert!(
        session.executions.take_finished().is_empty(),
        "an end is reported once"
    );
    let done = session
        .ok(root, "query_step", json!({"execution_id": "exec-a-1"}))
        .await;
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(
        done["result"]["steps"][0]["final_reply"], "all done",
        "{done}"
    );
    session.line("exec-a-1", "ended: done").await;
    session.line("exec-a-1", "step a (regular): started").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_running_step_started_again_is_the_same_execution_and_others_run_beside_it() {
    let gate = Gate::default();
    let server = server(&gate, |_| true, |_| completion("done", &[]));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, &server, &["a", "b"], json!([]));
    let session = Session::new().await;

    let first = session
        .ok(root, "execute_step", json!({"step_id": "a"}))
        .await;
    let again = session
        .ok(
            root,
            "execute_step",
            json!({"step_id": "a", "instructions": "Hurry."}),
        )
        .await;
    assert_eq!(first["execution_id"], "exec-a-1");
    assert_eq!(again["execution_id"], "exec-a-1", "{again}");
    assert_eq!(again["already_running"], true);
    assert!(
        again["message"]
            .as_str()
            .unwrap()
            .contains("send_step_message"),
        "{again}"
    );
    // Another step of the same workspace runs at the same time, in the same process: the
    // two executions share the workspace lock.
    let b = session
        .ok(root, "execute_step", json!({"step_id": "b"}))
        .await;
    assert_eq!(b["execution_id"], "exec-b-1");
    gate.arrived(2).await;
    let listed = session.ok(root, "list_executions", json!({})).await;
    let ids: Vec<&str> = listed["executions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["execution_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["exec-a-1", "exec-b-1"], "{listed}");

    gate.open();
    session.executions.wait_all().await;
    let finished = session.executions.take_finished();
    assert_eq!(finished.len(), 2, "{finished:?}");
    assert!(
        finished.iter().all(|f| f.status == ExecutionStatus::Done),
        "both ran to the end: {finished:?}"
    );
    assert_eq!(
        server.seen().len(),
        2,
        "one LLM call per step, no duplicate"
    );
    // Once ended, the same start is a new execution.
    let next = session
        .ok(root, "execute_step", json!({"step_id": "a"}))
        .await;
    assert_eq!(next["execution_id"], "exec-a-2");
    session.executions.wait_all().await;
    let done = session
        .ok(root, "list_executions", json!({"status": "done"}))
        .await;
    assert_eq!(done["executions"].as_array().unwrap().len(), 3, "{done}");
}

#[tokio::test(flavor = "multi_thread")]
async fn instructions_and_a_sent_message_reach_the_agents_requests() {
    let gate = Gate::default();
    let server = server(
        &gate,
        |n| n == 0,
        |n| completion(if n == 0 { "first answer" } else { "done" }, &[]),
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, &server, &["a"], json!([]));
    let session = Session::new().await;

    let started = session
        .ok(
            root,
            "execute_step",
            json!({"step_id": "a", "instructions": "Use the refund table only."}),
        )
        .await;
    let id = started["execution_id"].as_str().unwrap().to_string();
    gate.arrived(1).await;
    let sent = session
        .ok(
            root,
            "send_step_message",
            json!({"execution_id": id, "message": "Also look at the March tickets."}),
        )
        .await;
    assert_eq!(
        sent,
        json!({"execution_id": id, "delivery_status": "queued_for_injection", "phase": "llm_call"})
    );
    gate.open();
    session.executions.wait_all().await;

    let seen = server.seen();
    assert_eq!(seen.len(), 2, "the pending message kept the turn going");
    let instructions = ("user".to_string(), "Use the refund table only.".to_string());
    let first = messages_of(&seen[0]);
    // The instructions follow the step's first user message, before its first LLM call.
    assert_eq!(first.last(), Some(&instructions), "{first:?}");
    assert_eq!(first[first.len() - 2].0, "user");
    let second = messages_of(&seen[1]);
    assert_eq!(
        second[second.len() - 1],
        ("user".into(), "Also look at the March tickets.".into())
    );
    assert_eq!(
        second[second.len() - 2],
        ("assistant".into(), "first answer".into())
    );

    let late = session
        .ok(
            root,
            "send_step_message",
            json!({"execution_id": id, "message": "too late"}),
        )
        .await;
    assert_eq!(late["delivery_status"], "not_running");
    let unknown = session
        .refused(
            root,
            "send_step_message",
            json!({"execution_id": "exec-zz-1", "message": "x"}),
        )
        .await;
    assert!(
        unknown["error"].as_str().unwrap().contains("exec-a-1"),
        "lists the session's executions: {unknown}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_step_cancels_the_execution() {
    // Every answer asks for another tool round: only a stop ends this step.
    let gate = Gate::default();
    let server = server(
        &gate,
        |n| n == 0,
        |_| completion("", &[("workspace__list_dir", json!({"path": "."}))]),
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, &server, &["a"], json!([]));
    let session = Session::new().await;
    session
        .ok(root, "execute_step", json!({"step_id": "a"}))
        .await;
    gate.arrived(1).await;
    let stopping = session
        .ok(root, "stop_step", json!({"execution_id": "exec-a-1"}))
        .await;
    assert_eq!(stopping["status"], "stopping", "{stopping}");
    gate.open();
    session.executions.wait_all().await;
    let finished = session.executions.take_finished();
    assert_eq!(
        finished[0].status,
        ExecutionStatus::Cancelled,
        "{finished:?}"
    );
    let query = session
        .ok(root, "query_step", json!({"execution_id": "exec-a-1"}))
        .await;
    assert_eq!(query["status"], "cancelled", "{query}");
    assert_eq!(server.seen().len(), 1, "no LLM call after the stop");
    let again = session
        .ok(root, "stop_step", json!({"execution_id": "exec-a-1"}))
        .await;
    assert_eq!(again["status"], "cancelled", "{again}");
    let all = session.ok(root, "stop_all_executions", json!({})).await;
    assert_eq!(all, json!({"stopping": []}));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_run_missing_a_human_answer_starts_nothing() {
    let gate = Gate::default();
    gate.open();
    let server = server(&gate, |_| false, |_| completion("done", &[]));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        &["a"],
        json!([
            {"id": "ask", "type": "human_input", "title": "Ask", "description": "Ask.",
             "question": "Ship it?", "variable_name": "ship"},
            {"id": "route", "type": "routing", "title": "Route", "description": "Route.",
             "routes": [{"route_id": "end-it", "next_step_id": "end"}]}
        ]),
    );
    let session = Session::new().await;
    let before = tree_digest(root);

    let refused = session.refused(root, "run_full_workflow", json!({})).await;
    let text = refused["error"].as_str().unwrap();
    assert!(text.contains("nothing started"), "{refused}");
    assert!(text.contains("ask"), "{refused}");
    assert_eq!(
        refused["details"]["missing_human_inputs"],
        json!([{"step_id": "ask", "question": "Ship it?"}])
    );
    let typo = session
        .refused(
            root,
            "run_full_workflow",
            json!({"human_inputs": {"nope": "yes"}}),
        )
        .await;
    // Keyed by any step (a step that is not a human_input step takes it as context): a key
    // that is no step at all is refused.
    assert!(
        typo["error"]
            .as_str()
            .unwrap()
            .starts_with("human_inputs: no step \"nope\" in the plan"),
        "{typo}"
    );
    assert!(
        typo["details"]["valid_step_ids"]
            .as_array()
            .unwrap()
            .contains(&json!("ask")),
        "{typo}"
    );
    let bad_route = session
        .refused(
            root,
            "run_full_workflow",
            json!({"human_inputs": {"ask": "yes"}, "route_selections": {"route": "nowhere"}}),
        )
        .await;
    assert_eq!(
        bad_route["details"]["route_ids"],
        json!(["end-it"]),
        "{bad_route}"
    );
    assert_eq!(tree_digest(root), before, "a refused run changed nothing");
    assert!(server.seen().is_empty());
    let listed = session.ok(root, "list_executions", json!({})).await;
    assert_eq!(listed["executions"], json!([]));

    let started = session
        .ok(
            root,
            "run_full_workflow",
            json!({"human_inputs": {"ask": "yes"}, "route_selections": {"route": "end-it"}}),
        )
        .await;
    assert_eq!(started["execution_id"], "workflow-full-1", "{started}");
    session.executions.wait_all().await;
    let finished = session.executions.take_finished();
    assert_eq!(finished[0].status, ExecutionStatus::Done, "{finished:?}");
    assert!(
        finished[0].summary.contains("ask completed"),
        "{finished:?}"
    );
    let query = session
        .ok(
            root,
            "query_step",
            json!({"execution_id": "workflow-full-1"}),
        )
        .await;
    let ended: Vec<&str> = query["steps_ended"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step_id"].as_str().unwrap())
        .collect();
    assert_eq!(ended, ["a", "ask", "route"], "{query}");
    assert!(root.join("runs/iteration-0/execution/ask").is_dir());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_third_poll_in_a_minute_with_nothing_changed_ends_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let gate = Gate::default();
    gate.open();
    let server = server(&gate, |_| false, |_| completion("done", &[]));
    workspace(root, &server, &["a"], json!([]));
    let now = Arc::new(Mutex::new(Instant::now()));
    let clock = {
        let now = now.clone();
        Arc::new(move || *now.lock().unwrap())
    };
    let mut session = Session::new().await;
    session.executions = Executions::new(
        session.runtime.clone(),
        StartOptions::new(RunOptions::default(), support::fake_llm::loopback_llm(None)),
    )
    .with_clock(clock);

    session
        .ok(root, "execute_step", json!({"step_id": "a"}))
        .await;
    session.executions.wait_all().await;
    let first = session.ok(root, "list_executions", json!({})).await;
    assert_eq!(first["executions"][0]["status"], "done", "{first}");
    let second = session
        .ok(root, "query_step", json!({"step_id": "a"}))
        .await;
    assert_eq!(second["status"], "done", "{second}");
    let third = session.ok(root, "list_executions", json!({})).await;
    assert_eq!(third["unchanged"], true, "{third}");
    assert!(
        third["message"].as_str().unwrap().contains("End your turn"),
        "{third}"
    );
    assert!(third.get("executions").is_none(), "only that: {third}");
    // A minute later the window is empty again.
    *now.lock().unwrap() += Duration::from_secs(61);
    let later = session
        .ok(root, "query_step", json!({"execution_id": "exec-a-1"}))
        .await;
    assert_eq!(later["status"], "done", "{later}");
    // A change (a new execution and its events) makes polls answer again.
    session.ok(root, "list_executions", json!({})).await;
    session
        .ok(root, "execute_step", json!({"step_id": "a"}))
        .await;
    session.executions.wait_all().await;
    let after_change = session.ok(root, "list_executions", json!({})).await;
    assert_eq!(
        after_change["executions"].as_array().unwrap().len(),
        2,
        "{after_change}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn debug_step_shows_a_failed_steps_gate_items_learnings_and_logs() {
    let gate = Gate::default();
    gate.open();
    // The agent never writes the file its gate wants.
    let server = server(&gate, |_| false, |_| completion("I wrote nothing.", &[]));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        &[],
        json!([
            {"id": "report", "type": "regular", "title": "Report", "description": "Write report.json.",
             "validation_schema": {"files": [{"file_name": "report.json", "must_exist": true}]}}
        ]),
    );
    write_file(
        root,
        "learnings/report/notes.md",
        "Always write report.json first.",
    );
    let session = Session::new().await;
    session
        .ok(root, "execute_step", json!({"step_id": "report"}))
        .await;
    session.executions.wait_all().await;
    let finished = session.executions.take_finished();
    assert_eq!(finished[0].status, ExecutionStatus::Failed, "{finished:?}");

    let debug = session
        .ok(root, "debug_step", json!({"step_id": "report"}))
        .await;
    assert_eq!(
        debug["learnings"]["files"][0]["content"], "Always write report.json first.",
        "{debug}"
    );
    let run = &debug["runs"][0];
    assert_eq!(run["run_folder"], "iteration-0", "{debug}");
    assert_eq!(run["status"], "failed", "{debug}");
    let validation = run["validation"].as_array().unwrap();
    assert!(!validation.is_empty(), "{debug}");
    let failing = validation
        .iter()
        .find(|g| g["passed"] == false)
        .expect("a failed gate");
    assert!(
        failing["failed_checks"].to_string().contains("report.json"),
        "{failing}"
    );
    let report = failing["report"].as_str().unwrap();
    assert!(root.join(report).is_file(), "{report}");
    assert!(
        !run["failed_items"].as_array().unwrap().is_empty(),
        "{debug}"
    );
    let logs = run["logs"].as_array().unwrap();
    assert!(!logs.is_empty(), "{debug}");
    assert!(
        logs.iter()
            .all(|l| root.join(l.as_str().unwrap()).is_file()),
        "{logs:?}"
    );
    assert_eq!(debug["last_execution"]["execution_id"], "exec-report-1");
    assert_eq!(debug["last_execution"]["status"], "failed");

    let unknown = session
        .refused(root, "debug_step", json!({"step_id": "nope"}))
        .await;
    assert_eq!(unknown["details"]["valid_step_ids"], json!(["report"]));
}

#[tokio::test(flavor = "multi_thread")]
async fn misuse_is_refused_with_what_to_do_and_starts_nothing() {
    let gate = Gate::default();
    let server = server(&gate, |_| false, |_| completion("done", &[]));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(
        root,
        &server,
        &["a"],
        json!([{"id": "ask", "type": "human_input", "title": "Ask", "description": "Ask.",
                "question": "Ship it?"}]),
    );
    let session = Session::new().await;
    let before = tree_digest(root);

    let unknown = session
        .refused(root, "execute_step", json!({"step_id": "zz"}))
        .await;
    assert_eq!(unknown["details"]["valid_step_ids"], json!(["a", "ask"]));
    let wrong_type = session
        .refused(root, "execute_step", json!({"step_id": 5}))
        .await;
    assert!(
        wrong_type["error"].as_str().unwrap().contains("step_id"),
        "{wrong_type}"
    );
    let extra = session
        .refused(
            root,
            "execute_step",
            json!({"step_id": "a", "iteration": 3}),
        )
        .await;
    assert!(
        extra["error"].as_str().unwrap().contains("iteration"),
        "{extra}"
    );
    let no_answer = session
        .refused(root, "execute_step", json!({"step_id": "ask"}))
        .await;
    assert!(
        no_answer["error"].as_str().unwrap().contains("human_input"),
        "{no_answer}"
    );
    let no_group = session
        .refused(
            root,
            "execute_step",
            json!({"step_id": "a", "group_name": "g"}),
        )
        .await;
    assert!(
        no_group["error"].as_str().unwrap().contains("no groups"),
        "{no_group}"
    );
    let status = session
        .refused(root, "list_executions", json!({"status": "finished"}))
        .await;
    assert!(
        status["error"].as_str().unwrap().contains("status"),
        "{status}"
    );
    let neither = session.refused(root, "query_step", json!({})).await;
    assert!(
        neither["error"].as_str().unwrap().contains("execution_id"),
        "{neither}"
    );
    let not_ours = session.refused(root, "run_in_background", json!({})).await;
    assert!(not_ours["error"].as_str().is_some());
    assert_eq!(
        tree_digest(root),
        before,
        "nothing started, nothing written"
    );
    assert!(server.seen().is_empty());
    assert!(session.runtime.list().is_empty());

    // A human_input step runs with its answer.
    session
        .ok(
            root,
            "execute_step",
            json!({"step_id": "ask", "human_input": "yes"}),
        )
        .await;
    session.executions.wait_all().await;
    assert_eq!(
        session.executions.take_finished()[0].status,
        ExecutionStatus::Done
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_workspace_is_shared_by_executions_and_refused_to_another_process() {
    let gate = Gate::default();
    let server = server(&gate, |_| true, |_| completion("done", &[]));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    workspace(&root, &server, &["a", "b"], json!([]));
    let session = Session::new().await;
    let hold = session.runtime.hold_workspace(&root).unwrap();
    // A second hold of the same runtime shares the lock.
    let second = session.runtime.hold_workspace(&root.join(".")).unwrap();
    drop(second);

    session
        .ok(&root, "execute_step", json!({"step_id": "a"}))
        .await;
    session
        .ok(&root, "execute_step", json!({"step_id": "b"}))
        .await;
    gate.arrived(2).await;

    // Another process finds the workspace busy, held by this one.
    let other = support::trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(!other.status.success());
    assert!(
        stderr.contains(&format!("in use by pid {}", std::process::id())),
        "{stderr}"
    );

    gate.open();
    session.executions.wait_all().await;
    let finished = session.executions.take_finished();
    assert!(
        finished.iter().all(|f| f.status == ExecutionStatus::Done),
        "{finished:?}"
    );
    assert!(is_held(&root), "the session's hold outlives the executions");
    drop(hold);
    assert!(!is_held(&root), "the last holder let the lock go");
}

/// While the full-workflow execution runs step `a`, `execute_step` of `a` is refused (both
/// would use its one output folder); step `b`, which the full run has not reached, starts.
#[tokio::test(flavor = "multi_thread")]
async fn a_step_the_full_run_is_running_is_not_started_again() {
    let gate = Gate::default();
    let server = server(&gate, |n| n == 0, |_| completion("done", &[]));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, &server, &["a", "b"], json!([]));
    let session = Session::new().await;
    session.ok(root, "run_full_workflow", json!({})).await;
    gate.arrived(1).await;
    let refused = session
        .refused(root, "execute_step", json!({"step_id": "a"}))
        .await;
    assert_eq!(
        refused["error"],
        "step \"a\" is running now in this workspace's full-workflow execution, in the same \
         output folder: wait for that step to end (list_executions) or stop the execution \
         first",
        "{refused}"
    );
    gate.open();
    session.executions.wait_all().await;
    let finished = session.executions.take_finished();
    assert_eq!(finished.len(), 1, "only the full run ran: {finished:?}");
    assert_eq!(finished[0].status, ExecutionStatus::Done, "{finished:?}");
    assert_eq!(
        server.seen().len(),
        2,
        "one LLM call per step of the full run"
    );
}
