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

use trellis_runner::runtime::{ExecutionEvent, ExecutionId, ExecutionKind, Runtime};

use crate::events::EventLog;

use crate::App;
use crate::api::{ApiError, body_object};

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
        return Err(ApiError::not_found(format!(
            "step_id {step:?}: the plan has no such step (its steps: {})",
            ids.join(", ")
        )));
    }
    if request.step_id.is_some() && request.group.is_some() {
        return Err(ApiError::bad_request(
            "give step_id or group, not both: a step runs in the active run of the workflow",
        ));
    }
    let mut options = app.template.clone();
    options.run.group = request.group;
    options.run.inputs = request.inputs;
    options.run.route_selections = request.route_selections;
    let id = match request.step_id {
        Some(step) => app.runtime.start_step(&app.root, &step, options),
        None => app.runtime.start_workflow(&app.root, options),
    };
    app.watcher.watch(id.clone(), "api");
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"execution_id": id.as_str(), "status": "running"})),
    ))
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
}

impl Watcher {
    /// Copies the events of execution `id` into the log until it ends (`started_by`:
    /// `api`, or the builder session that started it).
    pub(crate) fn watch(&self, id: ExecutionId, started_by: &str) {
        let Some(mut events) = self.runtime.events(&id) else {
            return;
        };
        let target = self
            .runtime
            .list()
            .into_iter()
            .find(|e| e.id == id)
            .map_or_else(|| "workflow".to_string(), |e| target(&e.kind));
        let log = self.log.clone();
        log.push(
            json!({"type": "execution_started", "execution_id": id.as_str(),
                        "target": target, "started_by": started_by}),
        );
        self.handle.spawn(async move {
            while let Some(event) = events.next().await {
                let value = match &event {
                    ExecutionEvent::Run(run) => json!({"type": "execution", "execution_id":
                        id.as_str(), "line": trellis_builder::executions::event_line(run)}),
                    ExecutionEvent::Delivery { text, delivery } => json!({"type": "execution",
                        "execution_id": id.as_str(),
                        "line": format!("message {text:?}: {delivery:?}")}),
                    ExecutionEvent::End { status, error } => json!({"type": "execution_ended",
                        "execution_id": id.as_str(), "status": status.to_string(),
                        "error": error}),
                };
                log.push(value);
            }
        });
    }
}
