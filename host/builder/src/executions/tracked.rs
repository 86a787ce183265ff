//! The state of the session's executions, kept from their events: a thread per execution
//! reads them as they come ([`follow`]), updates the execution's [`Tracked`], reports a line
//! per event to the session's observer, and at the end records how it ended.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde_json::{Value, json};
use tokio::sync::Notify;

use super::super::{BuilderEvent, BuilderObserver, ToolFailure, ToolResult};
use super::{ARGUMENTS_SHOWN, Finished, POLL_WINDOW, Running, UNCHANGED_POLLS};
use trellis_runner::events::RunEvent;
use trellis_runner::runtime::{
    ExecutionEvent, ExecutionId, ExecutionKind, ExecutionStatus, Runtime,
};
use trellis_runner::session::now_rfc3339;
use trellis_runner::workflow_run::WorkflowRun;
use trellis_sandbox::llm::ReplyEvent;

/// What the executions of a session share with the threads following them.
#[derive(Default)]
pub(super) struct Shared {
    state: Mutex<State>,
    ended: Notify,
}

#[derive(Default)]
struct State {
    /// In start order.
    executions: Vec<Tracked>,
    /// Bumped by every start and every event: what the poll guard compares.
    changes: u64,
    /// The polls of the window: when, and `changes` then.
    polls: VecDeque<(Instant, u64)>,
}

/// One execution of the session as its events left it.
#[derive(Debug, Clone)]
pub(super) struct Tracked {
    pub id: String,
    pub runtime_id: ExecutionId,
    pub target: ExecutionKind,
    pub group: Option<String>,
    pub started_at: String,
    pub status: ExecutionStatus,
    /// (step, item) of the latest item started.
    item: Option<(String, String)>,
    /// The step's turn counter of the latest turn started.
    turn: Option<u64>,
    /// The steps that ended: (step, status, detail).
    steps: Vec<(String, String, String)>,
    tool_calls: Vec<ToolCallSeen>,
    /// The error of a broken setup.
    pub error: Option<String>,
    /// What it did, once it ended.
    result: Option<Value>,
    /// What it did, in a line, once it ended.
    pub summary: Option<String>,
    /// Its thread has recorded the end.
    ended: bool,
    /// [`Shared::take_finished`] has returned it.
    reported: bool,
}

#[derive(Debug, Clone)]
struct ToolCallSeen {
    step_id: String,
    call_id: String,
    tool: String,
    arguments: Value,
    error: Option<String>,
    duration_ms: u64,
}

impl ToolCallSeen {
    fn status(&self) -> &'static str {
        if self.error.is_some() { "error" } else { "ok" }
    }
}

impl Tracked {
    fn target_name(&self) -> &str {
        match &self.target {
            ExecutionKind::Step(s) => s,
            ExecutionKind::Workflow => "workflow",
        }
    }

    /// What `query_step` answers.
    pub fn report(&self) -> Value {
        let tool_calls: Vec<Value> = self
            .tool_calls
            .iter()
            .map(|c| {
                json!({
                    "tool_call_id": c.call_id,
                    "name": c.tool,
                    "step_id": c.step_id,
                    "status": c.status(),
                    "duration_ms": c.duration_ms,
                    "arguments": cut(&c.arguments.to_string(), ARGUMENTS_SHOWN),
                })
            })
            .collect();
        let mut answer = json!({
            "execution_id": self.id,
            "target": self.target_name(),
            "status": self.status.to_string(),
            "started_at": self.started_at,
            "current_item": self.item.as_ref().map(|(step, item)| json!({"step_id": step, "item_id": item})),
            "current_turn": self.turn,
            "tool_calls": tool_calls,
        });
        if let Some(group) = &self.group {
            answer["group"] = json!(group);
        }
        if matches!(self.target, ExecutionKind::Workflow) {
            answer["steps_ended"] = self
                .steps
                .iter()
                .map(|(step, status, detail)| {
                    json!({"step_id": step, "status": status, "detail": detail})
                })
                .collect();
        }
        if self.ended {
            answer["result"] = self.result.clone().unwrap_or(Value::Null);
            answer["summary"] = json!(self.summary);
            if let Some(error) = &self.error {
                answer["error"] = json!(error);
            }
        }
        answer
    }

    /// One tool call in full, or a failure listing the calls.
    pub fn tool_call(&self, call_id: &str) -> ToolResult {
        let Some(c) = self.tool_calls.iter().find(|c| c.call_id == call_id) else {
            let ids: Vec<&str> = self.tool_calls.iter().map(|c| c.call_id.as_str()).collect();
            return Err(ToolFailure::with_details(
                format!(
                    "execution {} has no tool call {call_id:?} (its calls: {})",
                    self.id,
                    if ids.is_empty() {
                        "none yet".to_string()
                    } else {
                        ids.join(", ")
                    }
                ),
                json!({"tool_call_ids": ids}),
            ));
        };
        Ok(json!({
            "execution_id": self.id,
            "tool_call": {
                "tool_call_id": c.call_id,
                "name": c.tool,
                "step_id": c.step_id,
                "status": c.status(),
                "duration_ms": c.duration_ms,
                "arguments": c.arguments,
                "error": c.error,
            },
        }))
    }

    /// Its row in `list_executions`.
    pub fn listing(&self) -> Value {
        let mut row = json!({
            "execution_id": self.id,
            "target": self.target_name(),
            "status": self.status.to_string(),
            "started_at": self.started_at,
        });
        if let Some(group) = &self.group {
            row["group"] = json!(group);
        }
        if let Some(summary) = &self.summary {
            row["summary"] = json!(summary);
        }
        row
    }

    /// Records `event`; the line to report for it, if any.
    fn record(&mut self, event: &ExecutionEvent) -> Option<String> {
        match event {
            ExecutionEvent::Run(run) => {
                match run {
                    RunEvent::ItemStarted {
                        step_id, item_id, ..
                    } => self.item = Some((step_id.clone(), item_id.clone())),
                    RunEvent::TurnStarted { turn, .. } => self.turn = Some(*turn),
                    RunEvent::StepEnded {
                        step_id,
                        status,
                        detail,
                    } => self
                        .steps
                        .push((step_id.clone(), status.to_string(), detail.clone())),
                    RunEvent::ToolCall {
                        step_id,
                        call_id,
                        tool,
                        arguments,
                        error,
                        duration_ms,
                    } => self.tool_calls.push(ToolCallSeen {
                        step_id: step_id.clone(),
                        call_id: call_id.clone(),
                        tool: tool.clone(),
                        arguments: arguments.clone(),
                        error: error.clone(),
                        duration_ms: *duration_ms,
                    }),
                    // The pieces of a reply are not lines: only a retry that voids them is.
                    RunEvent::Reply { event, .. }
                        if !matches!(event, ReplyEvent::Restarted { .. }) =>
                    {
                        return None;
                    }
                    _ => {}
                }
                Some(line(run))
            }
            ExecutionEvent::Delivery { delivery, .. } => {
                Some(format!("message {} ({})", delivery.status, delivery.phase))
            }
            ExecutionEvent::End { status, error, .. } => {
                self.status = *status;
                self.error = error.clone();
                None
            }
        }
    }

    /// Records how it ended: its result and summary line.
    fn finish(&mut self, status: ExecutionStatus, outcome: Option<Result<WorkflowRun, String>>) {
        self.status = status;
        let (result, summary) = match outcome {
            Some(Ok(run)) => {
                let steps: Vec<Value> = run
                    .units
                    .iter()
                    .flat_map(|u| {
                        u.steps.iter().map(move |s| {
                            json!({
                                "step_id": s.step_id,
                                "run_folder": u.run_folder,
                                "status": s.status.to_string(),
                                "detail": s.detail,
                                "final_reply": s.outcome.as_ref().and_then(|o| o.final_text.as_deref()).map(|t| cut(t, 2000)),
                                "concerns": s.outcome.as_ref().map(|o| o.concerns.clone()).unwrap_or_default(),
                                "error": s.outcome.as_ref().and_then(|o| o.error.clone()),
                            })
                        })
                    })
                    .collect();
                let summary = summarize(&run, status);
                (json!({"archived": run.archived, "steps": steps}), summary)
            }
            Some(Err(e)) => (
                Value::Null,
                format!("failed: {}", e.lines().next().unwrap_or("")),
            ),
            None => (Value::Null, status.to_string()),
        };
        self.result = Some(result);
        self.summary = Some(summary);
        self.ended = true;
    }
}

/// A line on how a run ended: the steps run and their status, the first failure's detail.
fn summarize(run: &WorkflowRun, status: ExecutionStatus) -> String {
    let steps: Vec<String> = run
        .units
        .iter()
        .flat_map(|u| {
            u.steps.iter().map(move |s| match &u.group {
                Some(g) => format!("{g}/{} {}", s.step_id, s.status),
                None => format!("{} {}", s.step_id, s.status),
            })
        })
        .collect();
    let failure = run
        .units
        .iter()
        .flat_map(|u| &u.steps)
        .find(|s| s.status != trellis_runner::session::Status::Completed)
        .map(|s| format!(": {}", cut(&s.detail, 300)))
        .or_else(|| run.cut_short.as_ref().map(|why| format!(": {why}")))
        .unwrap_or_default();
    let steps = if steps.is_empty() {
        "no step ran".to_string()
    } else {
        steps.join(", ")
    };
    format!("{status}: {steps}{failure}")
}

/// The first `max` characters of `text`, with `…` when cut.
pub(super) fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// The line reported for a run event: the run's own line, else a short one for an event
/// inside a step.
pub fn line(event: &RunEvent) -> String {
    if let Some(line) = event.run_line() {
        return line;
    }
    match event {
        RunEvent::ItemStarted {
            step_id,
            item_id,
            item_type,
        } => format!("{step_id}: item {item_id} ({item_type}) started"),
        RunEvent::TurnStarted {
            step_id,
            item_id,
            turn,
            ..
        } => format!("{step_id}: turn {turn} ({item_id})"),
        RunEvent::LlmCall {
            step_id,
            provider,
            model,
            tool_calls,
            error,
            ..
        } => match error {
            Some(e) => format!(
                "{step_id}: LLM call to {provider}:{model} failed: {}",
                e.lines().next().unwrap_or("")
            ),
            None => format!("{step_id}: {provider}:{model} answered ({tool_calls} tool call(s))"),
        },
        RunEvent::ToolCall {
            step_id,
            tool,
            error,
            duration_ms,
            ..
        } => match error {
            Some(e) => format!(
                "{step_id}: tool {tool}: error: {}",
                e.lines().next().unwrap_or("")
            ),
            None => format!("{step_id}: tool {tool} ({duration_ms} ms)"),
        },
        RunEvent::Gate {
            step_id,
            item_id,
            attempt,
            passed,
            failures,
        } => {
            if *passed {
                format!("{step_id}: gate {item_id} passed (attempt {attempt})")
            } else {
                format!("{step_id}: gate {item_id} failed {failures} check(s) (attempt {attempt})")
            }
        }
        RunEvent::ToolCallsRefused {
            step_id,
            asked,
            refused,
            budget,
        } => format!(
            "{step_id}: {refused} of the {asked} tool calls of one answer not run (at most \
             {budget} per answer)"
        ),
        RunEvent::SubAgentStarted {
            step_id, route_id, ..
        } => format!("{step_id}: sub-agent {route_id} started"),
        RunEvent::SubAgentEnded {
            step_id,
            route_id,
            status,
            ..
        } => format!("{step_id}: sub-agent {route_id} {status}"),
        RunEvent::ItemEnded {
            step_id,
            item_id,
            status,
        } => format!("{step_id}: item {item_id} {status}"),
        RunEvent::Reply {
            step_id,
            event: ReplyEvent::Restarted { reason },
        } => format!(
            "{step_id}: model reply restarted: {}",
            reason.lines().next().unwrap_or("")
        ),
        other => format!("{other:?}"),
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tracks the execution `runtime_id` of `target`, unless it is tracked already (the
    /// runtime gave back a running execution): its builder id, and whether it is new.
    pub fn track(
        &self,
        runtime_id: ExecutionId,
        target: ExecutionKind,
        group: Option<&str>,
    ) -> (String, bool) {
        let mut state = self.state();
        if let Some(t) = state.executions.iter().find(|t| t.runtime_id == runtime_id) {
            return (t.id.clone(), false);
        }
        // The runtime's id, which the server and the events use too.
        let id = runtime_id.as_str().to_string();
        state.changes += 1;
        state.executions.push(Tracked {
            id: id.clone(),
            runtime_id,
            target,
            group: group.map(str::to_string),
            started_at: now_rfc3339(),
            status: ExecutionStatus::Running,
            item: None,
            turn: None,
            steps: Vec::new(),
            tool_calls: Vec::new(),
            error: None,
            result: None,
            summary: None,
            ended: false,
            reported: false,
        });
        (id, true)
    }

    pub fn get(&self, id: &str) -> Option<Tracked> {
        self.state().executions.iter().find(|t| t.id == id).cloned()
    }

    pub fn all(&self) -> Vec<Tracked> {
        self.state().executions.clone()
    }

    pub fn ids(&self) -> Vec<String> {
        self.state()
            .executions
            .iter()
            .map(|t| t.id.clone())
            .collect()
    }

    /// The latest execution of step `step`.
    pub fn latest_of_step(&self, step: &str) -> Option<Tracked> {
        self.state()
            .executions
            .iter()
            .rev()
            .find(|t| t.target == ExecutionKind::Step(step.to_string()))
            .cloned()
    }

    /// The id of the running execution of step `step`, if any.
    pub fn running_step(&self, step: &str) -> Option<String> {
        self.latest_of_step(step)
            .filter(|t| !t.ended && t.status == ExecutionStatus::Running)
            .map(|t| t.id)
    }

    /// The id of the running full run, if any.
    pub fn running_workflow(&self) -> Option<String> {
        self.state()
            .executions
            .iter()
            .find(|t| {
                t.target == ExecutionKind::Workflow
                    && !t.ended
                    && t.status == ExecutionStatus::Running
            })
            .map(|t| t.id.clone())
    }

    pub fn running(&self) -> Vec<Running> {
        self.state()
            .executions
            .iter()
            .filter(|t| !t.ended)
            .map(|t| Running {
                id: t.id.clone(),
                target: t.target_name().to_string(),
            })
            .collect()
    }

    pub fn take_finished(&self) -> Vec<Finished> {
        let mut state = self.state();
        state
            .executions
            .iter_mut()
            .filter(|t| t.ended && !t.reported)
            .map(|t| {
                t.reported = true;
                Finished {
                    id: t.id.clone(),
                    status: t.status,
                    summary: t.summary.clone().unwrap_or_default(),
                }
            })
            .collect()
    }

    pub async fn wait_all(&self) {
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            // Registered before the check: an end between the check and the wait wakes it.
            ended.as_mut().enable();
            if self.state().executions.iter().all(|t| t.ended) {
                return;
            }
            ended.await;
        }
    }

    /// Counts a poll made at `now`: whether it is one too many (the window already holds
    /// [`UNCHANGED_POLLS`] polls that saw what this one sees).
    pub fn poll(&self, now: Instant) -> bool {
        let mut state = self.state();
        state
            .polls
            .retain(|(at, _)| now.saturating_duration_since(*at) < POLL_WINDOW);
        let changes = state.changes;
        let unchanged = state.polls.iter().filter(|(_, c)| *c == changes).count();
        state.polls.push_back((now, changes));
        unchanged >= UNCHANGED_POLLS
    }

    fn record(&self, id: &str, event: &ExecutionEvent) -> Option<String> {
        let mut state = self.state();
        state.changes += 1;
        let tracked = state.executions.iter_mut().find(|t| t.id == id)?;
        tracked.record(event)
    }

    fn finish(
        &self,
        id: &str,
        status: ExecutionStatus,
        outcome: Option<Result<WorkflowRun, String>>,
    ) -> Option<String> {
        let mut state = self.state();
        state.changes += 1;
        let tracked = state.executions.iter_mut().find(|t| t.id == id)?;
        tracked.finish(status, outcome);
        tracked.summary.clone()
    }
}

/// Follows execution `id` on a thread of its own until it ends: records its events,
/// reports a line per event to `observer`, then records the end and wakes
/// [`Shared::wait_all`].
pub(super) fn follow(runtime: Runtime, shared: Arc<Shared>, id: String, observer: BuilderObserver) {
    let Some(runtime_id) = shared.get(&id).map(|t| t.runtime_id) else {
        return;
    };
    let body = {
        let shared = shared.clone();
        let id = id.clone();
        move || {
            futures::executor::block_on(async {
                if let Some(mut events) = runtime.events(&runtime_id) {
                    while let Some(event) = events.next().await {
                        if let Some(line) = shared.record(&id, &event) {
                            observer.report(&BuilderEvent::Execution {
                                id: id.clone(),
                                line,
                            });
                        }
                    }
                }
                let outcome = runtime.wait(&runtime_id).await;
                let status = runtime
                    .status(&runtime_id)
                    .unwrap_or(ExecutionStatus::Failed);
                if let Some(summary) = shared.finish(&id, status, outcome) {
                    observer.report(&BuilderEvent::Execution {
                        id: id.clone(),
                        line: format!("ended: {summary}"),
                    });
                }
                shared.ended.notify_waiters();
            })
        }
    };
    let spawned = std::thread::Builder::new()
        .name(format!("builder-{id}"))
        .spawn(body);
    if let Err(e) = spawned {
        shared.finish(
            &id,
            ExecutionStatus::Failed,
            Some(Err(format!("following the execution: {e}"))),
        );
        shared.ended.notify_waiters();
    }
}
