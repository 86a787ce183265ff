//! Executions without the chat: `POST /api/executions` starts a step or the whole workflow
//! (or one group) on the runtime, as `trellis run` would with this server's approvals, and
//! the events of every execution (the server's and the builder sessions') go to one numbered
//! log, streamed and polled like a session's.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::json;

use trellis_runner::events::RunEvent;
use trellis_runner::runtime::{ExecutionEvent, ExecutionId, ExecutionKind, Refused, Runtime};
use trellis_sandbox::llm::ReplyEvent;

use crate::events::EventLog;

use crate::App;
use crate::api::{ApiError, body_object};

/// Options of a multiple-choice question an `input_requested` event shows.
const EVENT_OPTIONS: usize = 100;

/// `POST /api/executions {step_id?, group?, inputs?, route_selections?}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// One step (by id) in the active run; without it, the whole workflow.
    #[serde(default)]
    step_id: Option<String>,
    /// One group of the workflow (id or name).
    #[serde(default)]
    group: Option<String>,
    /// Answers of `human_input` steps, by variable name or step id.
    #[serde(default)]
    inputs: BTreeMap<String, String>,
    /// Routes chosen for routing steps (step id -> route id).
    #[serde(default)]
    route_selections: BTreeMap<String, String>,
}

/// Starts an execution; answers `202 {execution_id}` at once.
pub async fn start(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let request: StartRequest = body_object(body)?;
    check_sizes(&request)?;
    let ws = trellis_workflow::Workspace::open(&app.root).map_err(|diags| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "workspace_errors",
            diags.lines().join("\n"),
        )
    })?;
    if let Some(step) = request.step_id.as_deref()
        && ws.plan.find_step(step).is_none()
    {
        let ids: Vec<&str> = ws.plan.steps.iter().map(|s| s.id.as_str()).collect();
        let more = ids.len().saturating_sub(STEPS_NAMED);
        return Err(ApiError::not_found(format!(
            "step_id {step:?}: the plan has no such step (its steps: {}{})",
            ids[..ids.len().min(STEPS_NAMED)].join(", "),
            if more > 0 {
                format!(", and {more} more")
            } else {
                String::new()
            }
        )));
    }
    if let Some(group) = request.group.as_deref()
        && !ws
            .manifest
            .groups
            .iter()
            .any(|g| g.id == group || g.name.as_deref() == Some(group))
    {
        return Err(ApiError::not_found(format!(
            "group {group:?}: workflow.json has no such group (its groups: {})",
            ws.manifest
                .groups
                .iter()
                .map(|g| g.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    if let Some(step) = request
        .route_selections
        .keys()
        .find(|s| ws.plan.find_step(s).is_none())
    {
        return Err(ApiError::not_found(format!(
            "route_selections: the plan has no step {step:?}"
        )));
    }
    // Ended executions beyond the latest ones are forgotten: a server started all day
    // keeps a bounded history.
    app.runtime.forget_ended(KEPT_EXECUTIONS);
    let mut options = app.template.clone();
    options.run.group = request.group;
    options.run.inputs = request.inputs;
    options.run.route_selections = request.route_selections;
    // The operator is at the page: a human_input step without an answer asks there.
    options.ask_for_inputs = true;
    let kind = match request.step_id {
        Some(step) => ExecutionKind::Step(step),
        None => ExecutionKind::Workflow,
    };
    let id = app
        .runtime
        .start_admitted(&app.root, kind, options, app.max_executions)
        .map_err(|refused| match refused {
            Refused::Busy(why) => ApiError::new(StatusCode::CONFLICT, "workspace_busy", why),
            Refused::Full { running } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_executions",
                format!(
                    "{running} executions run on this workspace, the limit (`trellis serve \
                     --max-executions`); wait for one to end"
                ),
            ),
        })?;
    app.watcher.watch(id.clone(), "api");
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"execution_id": id.as_str(), "status": "running"})),
    ))
}

/// The plan's steps an unknown `step_id`'s error names, at most.
const STEPS_NAMED: usize = 20;

/// Ended executions the runtime keeps (with their events) for a server.
const KEPT_EXECUTIONS: usize = 200;

/// The longest step id, group or route the API takes, and the most bytes of inputs.
const MAX_NAME_BYTES: usize = 256;
const MAX_INPUT_BYTES: usize = 64 << 10;

/// A request whose names or inputs are longer than the API takes: `400`.
fn check_sizes(request: &StartRequest) -> Result<(), ApiError> {
    let names = request
        .step_id
        .iter()
        .chain(&request.group)
        .chain(request.route_selections.keys())
        .chain(request.route_selections.values())
        .chain(request.inputs.keys());
    if let Some(long) = names.into_iter().find(|n| n.len() > MAX_NAME_BYTES) {
        return Err(ApiError::bad_request(format!(
            "a step id, group, route or input name is at most {MAX_NAME_BYTES} bytes; one is {}",
            long.len()
        )));
    }
    let inputs: usize = request.inputs.values().map(String::len).sum();
    if inputs > MAX_INPUT_BYTES {
        return Err(ApiError::bad_request(format!(
            "inputs: at most {MAX_INPUT_BYTES} bytes of answers, not {inputs}"
        )));
    }
    Ok(())
}

/// What an execution runs, as the events say it.
pub(crate) fn target(kind: &ExecutionKind) -> String {
    match kind {
        ExecutionKind::Step(step) => step.clone(),
        ExecutionKind::Workflow => "workflow".into(),
    }
}

/// Where the events of every execution go: the server's log, copied by tasks on the
/// server's runtime (a builder session's side agent reports from a thread of its own).
#[derive(Clone)]
pub(crate) struct Watcher {
    pub(crate) runtime: Runtime,
    pub(crate) log: Arc<EventLog>,
    pub(crate) handle: tokio::runtime::Handle,
    /// The executions watched already.
    pub(crate) watched: Arc<std::sync::Mutex<std::collections::HashSet<ExecutionId>>>,
}

/// The bytes of an event line the log keeps.
const LINE_BYTES: usize = 2048;

/// `text` cut to [`LINE_BYTES`] (at a character), `…` after a cut.
fn cut(text: &str) -> String {
    if text.len() <= LINE_BYTES {
        return text.to_string();
    }
    let mut end = LINE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

impl Watcher {
    /// Copies the events of execution `id` into the log until it ends (`started_by`:
    /// `api`, or the builder session that started it).
    pub(crate) fn watch(&self, id: ExecutionId, started_by: &str) {
        // Each execution once, however often it is reported.
        if !self
            .watched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone())
        {
            return;
        }
        let Some(mut events) = self.runtime.events(&id) else {
            return;
        };
        let target = self
            .runtime
            .list()
            .into_iter()
            .find(|e| e.id == id)
            .map_or_else(|| "workflow".to_string(), |e| target(&e.kind));
        let execution = id.as_str().to_string();
        let log = crate::events::Joiner::new(self.log.clone(), move |step_id, text| {
            json!({"type": "execution_text", "execution_id": execution, "step_id": step_id,
                   "text": text})
        });
        log.push(
            json!({"type": "execution_started", "execution_id": id.as_str(),
                        "target": target, "started_by": started_by}),
        );
        self.handle.spawn(async move {
            while let Some(event) = events.next().await {
                let value = match &event {
                    // The text of a step's reply as it arrives, joined; its other pieces are
                    // not lines (a retry is).
                    ExecutionEvent::Run(RunEvent::Reply { step_id, event: reply }) => {
                        match reply {
                            ReplyEvent::Text(text) => log.piece(step_id, text),
                            ReplyEvent::Restarted { reason } => log.push(json!({
                                "type": "execution", "execution_id": id.as_str(),
                                "line": cut(&format!("{step_id}: model reply restarted: {reason}"))})),
                            ReplyEvent::ToolCall { .. } => {}
                        }
                        continue;
                    }
                    ExecutionEvent::Run(RunEvent::InputRequested { question }) => {
                        // A plan's options are many at will: the event shows the first ones,
                        // each cut, and says how many it left out.
                        let shown: Vec<String> = question
                            .options
                            .iter()
                            .take(EVENT_OPTIONS)
                            .map(|o| cut(o))
                            .collect();
                        let left_out = question.options.len() - shown.len();
                        json!({
                        "type": "input_requested", "execution_id": id.as_str(),
                        "step_id": question.step_id, "variable": question.variable,
                        "question": question.question, "response_type": question.response_type,
                        "options": shown, "options_left_out": left_out})
                    }
                    ExecutionEvent::Run(run) => json!({"type": "execution", "execution_id":
                        id.as_str(), "line": cut(&trellis_builder::executions::event_line(run))}),
                    ExecutionEvent::Delivery { text, delivery } => json!({"type": "execution",
                        "execution_id": id.as_str(),
                        "line": cut(&format!("message {text:?}: {}", delivery.status))}),
                    // A run that failed says why: its setup's error, or its first step
                    // that did not complete.
                    ExecutionEvent::End { status, error, failure } => json!({
                        "type": "execution_ended", "execution_id": id.as_str(),
                        "status": status.to_string(),
                        "error": error.as_deref().or(failure.as_deref()).map(cut)}),
                };
                log.push(value);
            }
        });
    }
}
