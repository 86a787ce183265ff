//! The runtime facade against a real OpenAI-compatible server on 127.0.0.1: executions run
//! in the background, are steered between tool results and the next LLM call, stop
//! mid-turn, refuse messages when no agent is in a turn, and a step started twice while it
//! runs is one execution.

use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::workspace::write_file;
use trellis_runner::events::RunEvent;
use trellis_runner::runtime::{
    ExecutionEvent, ExecutionId, ExecutionKind, ExecutionStatus, Runtime, StartOptions,
};
use trellis_runner::steering::{DeliveryStatus, Phase};
use trellis_runner::workflow_run::RunOptions;

/// A workspace with one agent step `answer` talking to `server`.
fn agent_workspace(root: &Path, server: &FakeServer) {
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "t", "steps": [
            {"id": "answer", "type": "regular", "title": "Answer", "description": "Answer."}
        ]})
        .to_string(),
    );
    write_file(root, "planning/step_config.json", r#"{"steps": []}"#);
    write_file(
        root,
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": server.providers()})
            .to_string(),
    );
}

async fn runtime() -> Runtime {
    Runtime::new(Arc::new(support::registry().await))
}

fn options() -> StartOptions {
    StartOptions::new(RunOptions::default(), support::fake_llm::loopback_llm(None))
}

/// Holds the server's answers back until the test lets them go, and counts the requests
/// that reached it (the server's own log is locked while an answer is held).
#[derive(Clone, Default)]
struct Gate {
    open: Arc<AtomicBool>,
    arrived: Arc<AtomicUsize>,
}

impl Gate {
    fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }

    fn hold(&self) -> usize {
        let n = self.arrived.fetch_add(1, Ordering::SeqCst);
        while !self.open.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        n
    }

    /// Waits until `n` requests have reached the server.
    async fn arrived(&self, n: usize) {
        while self.arrived.load(Ordering::SeqCst) < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A server that answers request `n` (from 0) with `answer(n)` once `gate` is open.
fn gated_server(
    gate: &Gate,
    answer: impl Fn(usize) -> Value + Send + Sync + 'static,
) -> FakeServer {
    let gate = gate.clone();
    FakeServer::start(Box::new(move |_| (200, answer(gate.hold()))))
}

/// Waits for the first event of `id` that `wanted` accepts.
async fn wait_for(runtime: &Runtime, id: &ExecutionId, wanted: impl Fn(&ExecutionEvent) -> bool) {
    let mut events = runtime.events(id).expect("a known execution");
    while let Some(event) = events.next().await {
        if wanted(&event) {
            return;
        }
    }
    panic!("execution {id} ended before the event");
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

#[tokio::test(flavor = "multi_thread")]
async fn a_message_joins_the_running_agents_next_llm_call() {
    let gate = Gate::default();
    let server = gated_server(&gate, |n| {
        completion(if n == 0 { "first answer" } else { "done" }, &[])
    });
    let dir = tempfile::tempdir().unwrap();
    agent_workspace(dir.path(), &server);
    let runtime = runtime().await;
    let id = runtime.start_step(dir.path(), "answer", options());
    assert_eq!(runtime.status(&id), Some(ExecutionStatus::Running));

    // The first LLM call waits at the server: the agent is inside its turn.
    gate.arrived(1).await;
    let delivery = runtime.send_message(&id, "Also look at the refund tickets.");
    assert_eq!(delivery.status, DeliveryStatus::QueuedForInjection);
    assert_eq!(delivery.phase, Phase::LlmCall);
    gate.open();

    let run = runtime.wait(&id).await.unwrap().unwrap();
    assert!(run.succeeded());
    assert_eq!(runtime.status(&id), Some(ExecutionStatus::Done));
    // The final answer came with a message pending: the loop went on, the message in the
    // next request, after the answer it followed.
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let steered = (
        "user".to_string(),
        "Also look at the refund tickets.".to_string(),
    );
    assert!(!messages_of(&seen[0]).contains(&steered));
    let second = messages_of(&seen[1]);
    assert_eq!(
        second[second.len() - 2],
        ("assistant".into(), "first answer".into())
    );
    assert_eq!(second[second.len() - 1], steered);

    // After the end, nothing is accepted.
    let late = runtime.send_message(&id, "too late");
    assert_eq!(late.status, DeliveryStatus::NotRunning);
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stop_mid_turn_ends_the_step_before_another_llm_call() {
    // Every answer asks for another tool round: only a stop ends this step.
    let gate = Gate::default();
    let server = gated_server(&gate, |_| {
        completion("", &[("workspace__list_dir", json!({"path": "."}))])
    });
    let dir = tempfile::tempdir().unwrap();
    agent_workspace(dir.path(), &server);
    let runtime = runtime().await;
    let id = runtime.start_step(dir.path(), "answer", options());
    // Stopped while the first LLM call waits at the server; its answer comes after.
    gate.arrived(1).await;
    assert!(runtime.stop(&id));
    gate.open();
    let run = runtime.wait(&id).await.unwrap().unwrap();
    assert!(!run.succeeded());
    assert_eq!(runtime.status(&id), Some(ExecutionStatus::Cancelled));
    assert_eq!(runtime.status(&id).unwrap().to_string(), "cancelled");
    assert_eq!(server.seen().len(), 1, "no LLM call after the stop");
    let session = support::workspace::read_json(
        &dir.path()
            .join("runs/iteration-0/execution/answer/session.json"),
    );
    assert_eq!(session["status"], "stopped", "{session}");
    assert!(!runtime.stop(&id), "an ended execution is not running");
}

#[tokio::test(flavor = "multi_thread")]
async fn no_agent_takes_a_message_while_a_script_runs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "t", "steps": [
            {"id": "fetch", "type": "regular", "title": "Fetch", "description": "Fetch."}
        ]})
        .to_string(),
    );
    write_file(
        root,
        "planning/step_config.json",
        json!({"steps": [{"id": "fetch", "agent_configs": {"declared_execution_mode": "scripted"}}]})
            .to_string(),
    );
    write_file(
        root,
        "code/fetch/main.py",
        // Runs until the test puts `go` in its output folder.
        "import os\ngo = os.environ['STEP_OUTPUT_DIR'] + '/go'\nwhile not os.path.exists(go):\n    pass\nprint('fetched')\n",
    );
    let runtime = runtime().await;
    let id = runtime.start_step(root, "fetch", options());
    wait_for(&runtime, &id, |e| {
        matches!(e, ExecutionEvent::Run(RunEvent::ItemStarted { item_type, .. }) if item_type == "script")
    })
    .await;
    // The script phase begins right after the item's event: ask until it shows.
    let delivery = loop {
        let delivery = runtime.send_message(&id, "hurry up");
        if delivery.phase == Phase::Script {
            break delivery;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(delivery.status, DeliveryStatus::NoActiveAgent);
    std::fs::write(root.join("runs/iteration-0/execution/fetch/go"), "").unwrap();
    let run = runtime.wait(&id).await.unwrap().unwrap();
    assert!(run.succeeded(), "{run:?}");
    // The refused message was recorded as an event, and never reached anyone.
    let mut events = runtime.events(&id).unwrap();
    let mut deliveries = Vec::new();
    while let Some(event) = events.next().await {
        if let ExecutionEvent::Delivery { text, delivery } = event {
            deliveries.push((text, delivery.status));
        }
    }
    assert!(!deliveries.is_empty());
    assert!(
        deliveries
            .iter()
            .all(|d| *d == ("hurry up".to_string(), DeliveryStatus::NoActiveAgent)),
        "{deliveries:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn starting_a_running_step_again_returns_its_execution() {
    let gate = Gate::default();
    let server = gated_server(&gate, |_| completion("done", &[]));
    let dir = tempfile::tempdir().unwrap();
    agent_workspace(dir.path(), &server);
    let runtime = runtime().await;
    let first = runtime.start_step(dir.path(), "answer", options());
    let again = runtime.start_step(&dir.path().join("."), "answer", options());
    assert_eq!(first, again);
    let listed = runtime.list();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].kind, ExecutionKind::Step("answer".into()));
    assert_eq!(listed[0].status.to_string(), "running");
    gate.open();
    runtime.wait(&first).await.unwrap().unwrap();
    // Once it ended, the same start is a new execution.
    let next = runtime.start_step(dir.path(), "answer", options());
    assert_ne!(next, first);
    runtime.wait(&next).await.unwrap().unwrap();
    assert_eq!(server.seen().len(), 2);
    assert!(
        runtime.status(&ExecutionId::from("exec-99")).is_none(),
        "an id never given is unknown"
    );
}

/// A panic inside an execution (here in an observer of its events, when the step starts)
/// ends it as failed with the panic's message: whoever waits for it is not left waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_an_execution_ends_it_as_failed() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    agent_workspace(dir.path(), &server);
    let runtime = runtime().await;
    let mut start = options();
    start.observer = trellis_runner::events::Observer::new(|event| {
        if let RunEvent::StepStarted { .. } = event {
            panic!("observer broke on purpose");
        }
    });
    let id = runtime.start_workflow(dir.path(), start);
    let outcome = tokio::time::timeout(Duration::from_secs(120), runtime.wait(&id))
        .await
        .expect("the execution ended instead of hanging")
        .expect("the id is known");
    assert_eq!(
        outcome.err().as_deref(),
        Some("the execution panicked: observer broke on purpose")
    );
    assert_eq!(runtime.status(&id), Some(ExecutionStatus::Failed));
    assert!(server.seen().is_empty(), "the step never reached its model");
    // The workspace was let go: the next execution on it runs.
    let next = runtime.start_workflow(dir.path(), options());
    let ended = tokio::time::timeout(Duration::from_secs(120), runtime.wait(&next))
        .await
        .expect("the next execution ended")
        .expect("the id is known");
    assert!(ended.is_ok(), "{ended:?}");
    assert_eq!(runtime.status(&next), Some(ExecutionStatus::Done));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stop_ends_a_spinning_guest_while_the_turns_other_calls_finish() {
    // One answer asks for a guest call that loops forever and for a write. Before, a call
    // of `trellis run` had no cancel token: the spinning guest held its thread until its
    // deadline (here ten minutes) and a stop waited for it. Now `stop_now` interrupts it, its
    // call ends cancelled, and the write of the same turn is done meanwhile.
    let out = "runs/iteration-0/execution/answer";
    let server = FakeServer::start(Box::new(move |body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if messages.last().is_some_and(|m| m["role"] == "tool") {
            return (200, completion("done", &[]));
        }
        (
            200,
            completion(
                "",
                &[
                    (
                        "adversary__spin_marked",
                        json!({"marker": format!("/{out}/started")}),
                    ),
                    (
                        "workspace__write_file",
                        json!({"path": format!("{out}/note.txt"), "content": "written"}),
                    ),
                ],
            ),
        )
    }));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    agent_workspace(root, &server);
    let runtime = Runtime::new(Arc::new(support::registry_with_adversary().await));
    let mut options = options();
    options.limits.timeout = Duration::from_secs(600);
    let id = runtime.start_step(root, "answer", options);
    // The guest has started spinning once its marker is there, and the write is done.
    let marker = root.join(out).join("started");
    let note = root.join(out).join("note.txt");
    while !(marker.exists() && note.exists()) {
        assert_eq!(runtime.status(&id), Some(ExecutionStatus::Running));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(runtime.stop_now(&id));
    let run = runtime.wait(&id).await.unwrap().unwrap();
    assert!(!run.succeeded());
    assert_eq!(runtime.status(&id), Some(ExecutionStatus::Cancelled));
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "written");
    let session = support::workspace::read_json(&root.join(out).join("session.json"));
    assert_eq!(session["status"], "stopped", "{session}");
    let text = session.to_string();
    assert!(
        text.contains("adversary:spin_marked: cancelled and stopped"),
        "{text}"
    );
}
