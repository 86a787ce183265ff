//! The handlers of `/api`: builder queries and their events, executions, and what the
//! workspace holds (plan, runs). Every error is JSON `{error, detail}` with its status.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Deserialize;
use serde_json::{Value, json};

use trellis_builder::Mode;
use trellis_runner::runtime::ExecutionId;

use crate::App;
use crate::events::EventLog;

/// The heartbeat of an event stream: a comment line this often keeps proxies from closing it.
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// Events one poll or one stream read gives at most.
const EVENTS_PER_READ: usize = 500;

/// An error answer: `{error, detail}` with `status`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    error: &'static str,
    detail: String,
}

impl ApiError {
    /// An error `error` (a stable code) with `detail` (a sentence).
    pub fn new(status: StatusCode, error: &'static str, detail: impl Into<String>) -> Self {
        ApiError {
            status,
            error,
            detail: detail.into(),
        }
    }

    /// Its status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Its sentence.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    pub(crate) fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", detail)
    }

    /// `422 refused`: the workspace holds something Trellis will not read or use.
    pub(crate) fn refused(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "refused", detail)
    }

    pub(crate) fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", detail)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"error": self.error, "detail": self.detail})),
        )
            .into_response()
    }
}

/// The query string as `T`: a bad one is a JSON `400 bad_request` naming what is wrong
/// (axum's own `Query` answers plain text).
#[derive(Debug)]
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| Params(q))
            .map_err(|e| ApiError::bad_request(format!("the query string: {}", e.body_text())))
    }
}

/// A JSON answer or an error.
pub type ApiResult = Result<Json<Value>, ApiError>;

/// The JSON object of a request body, or the error naming what is wrong with it.
pub(crate) fn body_object<T: for<'de> Deserialize<'de>>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|e| match e {
        BytesRejection::FailedToBufferBody(_) => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "a request body may be {} bytes at most",
                crate::MAX_BODY_BYTES
            ),
        ),
        other => ApiError::bad_request(other.body_text()),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::bad_request(format!("the body: {e}")))
}

/// `POST /api/query`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryRequest {
    query: String,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    workspace: Option<String>,
    #[serde(default)]
    agent_mode: Option<String>,
    #[serde(default)]
    phase_id: Option<String>,
    #[serde(default)]
    execution_options: Option<ExecutionOptions>,
}

/// The options of a query.
#[derive(Debug, Deserialize)]
pub struct ExecutionOptions {
    #[serde(default)]
    workshop_mode: Option<String>,
}

/// Starts a builder turn on `query` in the background: answers at once with the session
/// and the query's id; `409 workflow_busy` while another turn runs on the workspace.
pub async fn query(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let request: QueryRequest = body_object(body)?;
    if request.query.trim().is_empty() {
        return Err(ApiError::bad_request(
            "query: give the message for the builder",
        ));
    }
    let app = app.resolve(request.workspace.as_deref())?;
    if let Some(phase) = request.phase_id.as_deref()
        && phase != trellis_builder::PHASE_ID
    {
        return Err(ApiError::bad_request(format!(
            "phase_id {phase:?}: this server runs the builder's phase, {:?}",
            trellis_builder::PHASE_ID
        )));
    }
    if let Some(agent_mode) = request.agent_mode.as_deref()
        && agent_mode != "workflow_phase"
    {
        return Err(ApiError::bad_request(format!(
            "agent_mode {agent_mode:?}: only \"workflow_phase\" is served"
        )));
    }
    let mode = request
        .execution_options
        .and_then(|o| o.workshop_mode)
        .map(|m| m.parse::<Mode>())
        .transpose()
        .map_err(|e| ApiError::bad_request(format!("execution_options.workshop_mode: {e}")))?;
    if app.busy.swap(true, Ordering::SeqCst) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "workflow_busy",
            "a builder turn (or the executions it started and their completion turns, or a \
             schedule's firing) runs on this workspace; wait for the session's session_status \
             event",
        ));
    }
    let live = match app.session(request.session_id.as_deref(), mode) {
        Ok(live) => live,
        Err(e) => {
            app.busy.store(false, Ordering::SeqCst);
            return Err(e);
        }
    };
    *app.last_session.lock().unwrap_or_else(|e| e.into_inner()) = Some(live.clone());
    let query_id = format!("q-{}", app.queries.fetch_add(1, Ordering::SeqCst) + 1);
    let session_id = live.id.clone();
    let task_app = app.clone();
    let task_query = query_id.clone();
    tokio::spawn(async move {
        let log = live.log.clone();
        log.push(json!({"type": "query", "query_id": task_query, "query": request.query}));
        let outcome = async {
            let mut session = live.session.lock().await;
            if let Some(mode) = mode {
                session.set_mode(mode)?;
            }
            session.turn(&request.query).await?;
            session.settle().await
        }
        .await;
        if let Err(e) = outcome {
            log.push(json!({"type": "error", "query_id": task_query, "detail": format!("{e:#}")}));
        }
        // Free before it says so: a client that waits for `idle` may send the next query.
        task_app.busy.store(false, Ordering::SeqCst);
        log.push(json!({"type": "session_status", "status": "idle", "query_id": task_query}));
    });
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"session_id": session_id, "query_id": query_id, "status": "accepted"})),
    ))
}

/// `?since=N`.
#[derive(Debug, Deserialize)]
pub struct Since {
    #[serde(default)]
    since: Option<u64>,
}

fn log_of(app: &App, id: &str) -> Result<Arc<EventLog>, ApiError> {
    app.sessions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(id)
        .map(|live| live.log.clone())
        .ok_or_else(|| ApiError::not_found(format!("no session {id:?} on this server")))
}

/// The events of `log` after `since` (at most [`EVENTS_PER_READ`]), and `last`: the number
/// of the last one given (`since` when none), where the next poll starts. (The log's own
/// last number, read apart from the events, skipped the events past a read's cap and any
/// event appended in between.)
fn page(log: &EventLog, since: u64) -> Value {
    let since = resume_after(log, since);
    let events = log.since(since, EVENTS_PER_READ);
    let last = events
        .last()
        .and_then(|e| e["id"].as_u64())
        .unwrap_or(since);
    json!({"events": events, "last": last})
}

/// Where a reader resumes: after event `since`, or from the start when `since` is past the
/// log's last event (a number from before the server started again, whose logs number
/// their events from 1 again: waiting for it would give the reader nothing).
fn resume_after(log: &EventLog, since: u64) -> u64 {
    if since > log.last() { 0 } else { since }
}

/// `GET /api/sessions/{id}/events?since=N`: the events after `N` (at most 500), and the
/// number of the last one.
pub async fn events(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Params(q): Params<Since>,
) -> ApiResult {
    let log = log_of(&app, &id)?;
    let since = q.since.unwrap_or(0);
    Ok(Json(page(&log, since)))
}

/// `GET /api/sessions/{id}/events/stream`: server-sent events, each with its number as its
/// `id`, from after `Last-Event-ID` (or `?since=`), and a heartbeat comment every 15 s.
/// At most `--max-streams` are open at once (`503` past it).
pub async fn stream(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Params(q): Params<Since>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let log = log_of(&app, &id)?;
    sse(
        &app,
        log,
        &format!("/api/sessions/{id}/events"),
        q,
        &headers,
    )
}

/// `GET /api/executions/events?since=N`: the events of every execution, as
/// [`events`] gives a session's.
pub async fn execution_events(State(app): State<Arc<App>>, Params(q): Params<Since>) -> ApiResult {
    let log = &app.execution_log;
    let since = q.since.unwrap_or(0);
    Ok(Json(page(log, since)))
}

/// `GET /api/executions/events/stream`: the events of every execution, streamed as
/// [`stream`] streams a session's.
pub async fn execution_stream(
    State(app): State<Arc<App>>,
    Params(q): Params<Since>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let log = app.execution_log.clone();
    sse(&app, log, "/api/executions/events", q, &headers)
}

/// The events of `log` as server-sent events, from after `Last-Event-ID` (or `?since=`),
/// under the server's cap of streams (`poll`: the polling form, named when refused).
fn sse(
    app: &App,
    log: Arc<EventLog>,
    poll: &str,
    q: Since,
    headers: &HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>> + use<>>, ApiError> {
    let permit = app.streams.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_streams",
            format!(
                "{} event streams are open, the limit (`trellis serve --max-streams`); poll \
                 {poll} instead, or close one",
                app.max_streams
            ),
        )
    })?;
    let resume = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "Last-Event-ID: expected the number of an event (a whole number from \
                         0), as each event's `id` gives it",
                    )
                })?,
        ),
    };
    let since = resume_after(&log, resume.or(q.since).unwrap_or(0));
    let rx = log.subscribe();
    let state = (log, rx, since, Vec::<Value>::new().into_iter(), permit);
    let stream = futures::stream::unfold(
        state,
        |(log, mut rx, mut since, mut pending, permit)| async move {
            loop {
                if let Some(event) = pending.next() {
                    since = event["id"].as_u64().unwrap_or(since);
                    let sse = Event::default()
                        .id(since.to_string())
                        .event(event["type"].as_str().unwrap_or("event"))
                        .data(event.to_string());
                    return Some((Ok(sse), (log, rx, since, pending, permit)));
                }
                let batch = log.since(since, EVENTS_PER_READ);
                if !batch.is_empty() {
                    pending = batch.into_iter();
                    continue;
                }
                // Nothing new: wait for the next event (a closed log ends the stream).
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        },
    );
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat")))
}

/// `GET /api/workflow/builder-session`: the session to show when the page opens: the one
/// this server last ran a turn of, else the latest in the workspace's index; with its
/// messages. `POST /api/query` with its `session_id` continues it.
pub async fn builder_session(
    State(app): State<Arc<App>>,
    Params(q): Params<WorkspaceQuery>,
) -> ApiResult {
    let app = app.resolve(q.workspace.as_deref())?;
    let live = app
        .last_session
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some(live) = live {
        // A turn holds the session: its messages are in its events until it ends.
        let shown = match live.session.try_lock() {
            Ok(session) => Some(messages_json(session.history())),
            Err(_) => None,
        };
        let (messages, earlier) = shown.map_or((None, 0), |(m, e)| (Some(m), e));
        return Ok(Json(json!({
            "session_id": live.id, "live": true, "busy": messages.is_none(),
            "last_event": live.log.last(), "messages": messages, "earlier": earlier,
        })));
    }
    // The conversation file is read off the server's threads, among the reads at once.
    let reader = app.clone();
    crate::workspace::blocking_read(&app, move || {
        let (fs, index) = session_index(&reader)?;
        let Some(latest) = index.sessions.last() else {
            return Ok(Json(
                json!({"session_id": null, "live": false, "messages": []}),
            ));
        };
        let (file, _) = trellis_builder::persist::load(&fs, &latest.session_id)
            .map_err(|e| ApiError::refused(format!("{e:#}")))?;
        let (messages, earlier) = messages_json(&file.conversation_history);
        Ok(Json(json!({
            "session_id": latest.session_id, "live": false, "mode": latest.workshop_mode,
            "updated_at": latest.updated_at, "messages": messages, "earlier": earlier,
        })))
    })
    .await?
}

/// The workspace's handle and its index of builder sessions.
fn session_index(
    app: &App,
) -> Result<
    (
        trellis_sandbox::store::WorkspaceFs,
        trellis_builder::persist::ChatIndex,
    ),
    ApiError,
> {
    let fs = app.workspace_fs()?;
    let index = trellis_builder::persist::read_index(&fs)
        .map_err(|e| ApiError::refused(format!("{e:#}")))?;
    Ok((fs, index))
}

/// `GET /api/workflow/builder-sessions`: the sessions of the workspace's index, newest
/// first (`session_id`, `workshop_mode`, `updated_at`, `message_count`, `first_query`).
pub async fn builder_sessions(State(app): State<Arc<App>>) -> ApiResult {
    let reader = app.clone();
    let (_, index) =
        crate::workspace::blocking_read(&app, move || session_index(&reader)).await??;
    let sessions: Vec<Value> = index
        .sessions
        .iter()
        .rev()
        .take(200)
        .map(|s| {
            json!({"session_id": s.session_id, "workshop_mode": s.workshop_mode,
                   "updated_at": s.updated_at, "message_count": s.message_count,
                   "first_query": s.first_query})
        })
        .collect();
    Ok(Json(json!({"sessions": sessions})))
}

/// `GET /api/workspaces`: the workspaces this server serves, the first the one a request
/// without `?workspace=` is for.
pub async fn workspaces(State(app): State<Arc<App>>) -> ApiResult {
    let peers = app.peers.get().cloned().unwrap_or_default();
    let list: Vec<Value> = peers
        .iter()
        .map(|(name, a)| json!({"name": name, "root": a.root.display().to_string()}))
        .collect();
    Ok(Json(json!({"workspaces": list})))
}

/// `?workspace=`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceQuery {
    #[serde(default)]
    workspace: Option<String>,
}

/// The latest [`SHOWN_MESSAGES`] user and assistant messages of a history, as the page shows
/// them (tool results and the system prompt left out), and how many earlier ones are not.
fn messages_json(history: &[trellis_sandbox::llm::Message]) -> (Vec<Value>, usize) {
    use trellis_sandbox::llm::Role;
    let shown: Vec<&trellis_sandbox::llm::Message> = history
        .iter()
        .filter(|m| matches!(m.role, Role::User | Role::Assistant))
        .collect();
    let earlier = shown.len().saturating_sub(SHOWN_MESSAGES);
    let messages = shown[earlier..]
        .iter()
        .map(|m| {
            json!({
                "role": if m.role == Role::User { "user" } else { "assistant" },
                "text": trellis_sandbox::cut::marked(&m.content, crate::events::EVENT_STRING_BYTES),
                "tool_calls": m.tool_calls.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
            })
        })
        .collect();
    (messages, earlier)
}

/// The latest messages of a session its page opens with; the rest are counted (`earlier`).
pub const SHOWN_MESSAGES: usize = 500;

/// `POST /api/session/stop {session_id}`: stops the session's turn running now (before its
/// next model call; a call in flight is let go) and asks every execution the session started
/// to stop at its next boundary.
pub async fn stop_session(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct StopRequest {
        session_id: String,
    }
    let request: StopRequest = body_object(body)?;
    let live = app
        .sessions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&request.session_id)
        .cloned()
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "no session {:?} on this server",
                request.session_id
            ))
        })?;
    let ids: Vec<String> = live
        .executions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .cloned()
        .collect();
    let stopping: Vec<String> = ids
        .into_iter()
        .filter(|id| app.runtime.stop(&ExecutionId::from(id.as_str())))
        .collect();
    // A turn holds the session's lock while it runs.
    let turn_running = live.session.try_lock().is_err();
    if turn_running {
        live.stop.stop();
    }
    Ok(Json(
        json!({"session_id": live.id, "stopping": stopping, "turn_stopped": turn_running}),
    ))
}

/// `GET /api/workflow/plan`: the plan and the step config as Trellis reads them, or every
/// problem the workspace's files have.
pub async fn plan(State(app): State<Arc<App>>) -> ApiResult {
    let root = app.root.clone();
    crate::workspace::blocking_read(&app, move || {
        match trellis_workflow::Workspace::open(&root) {
            Ok(ws) => Ok(Json(json!({
                "plan": serde_json::to_value(&ws.plan).unwrap_or(Value::Null),
                "step_config": serde_json::to_value(&ws.step_configs).unwrap_or(Value::Null),
                "groups": serde_json::to_value(&ws.manifest.groups).unwrap_or(Value::Null),
                "warnings": ws.warnings.lines(),
            }))),
            Err(diags) => Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "workspace_errors",
                diags.lines().join("\n"),
            )),
        }
    })
    .await?
}

/// `GET /api/workflow/runs`: each run folder with the state of its steps.
pub async fn runs(State(app): State<Arc<App>>) -> ApiResult {
    let root = app.root.clone();
    let runs =
        crate::workspace::blocking_read(&app, move || trellis_runner::runs::list_runs(&root))
            .await?
            .map_err(|e| {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "runs", format!("{e:#}"))
            })?;
    let runs: Vec<Value> = runs
        .iter()
        .map(|run| {
            json!({
                "run_folder": run.run_folder,
                "steps": run.steps.iter().map(|s| json!({
                    "step_id": s.step_id, "status": s.status, "completed_at": s.completed_at,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(Json(json!({"runs": runs})))
}

/// `GET /api/workflow/executions`: the executions of this workspace.
pub async fn executions(State(app): State<Arc<App>>) -> ApiResult {
    let list: Vec<Value> = app
        .executions_here()
        .into_iter()
        .map(|e| {
            json!({
                "execution_id": e.id.as_str(),
                "kind": format!("{:?}", e.kind),
                "status": e.status.to_string(),
                "waiting_for": e.waiting_for,
            })
        })
        .collect();
    Ok(Json(json!({"executions": list})))
}

/// `POST /api/executions/{id}/stop`: asks the execution to stop at its next step boundary.
pub async fn stop_execution(State(app): State<Arc<App>>, Path(id): Path<String>) -> ApiResult {
    let id = app.execution_here(&id)?;
    Ok(Json(
        json!({"execution_id": id.as_str(), "stopping": app.runtime.stop(&id)}),
    ))
}

/// `POST /api/executions/{id}/message {message}`: a message for the running step's agent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SteerRequest {
    message: String,
}

/// Delivers a steering message to an execution.
pub async fn message_execution(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let request: SteerRequest = body_object(body)?;
    let most = trellis_runner::steering::MAX_MESSAGE_BYTES;
    if request.message.len() > most {
        return Err(ApiError::bad_request(format!(
            "message: at most {most} bytes, not {}",
            request.message.len()
        )));
    }
    let id = app.execution_here(&id)?;
    let delivery = app.runtime.send_message(&id, &request.message);
    Ok(Json(
        json!({"execution_id": id.as_str(), "delivery": delivery.status.to_string()}),
    ))
}

/// `POST /api/executions/{id}/input {answer, step_id?}`: the answer of the `human_input`
/// step the execution waits on.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputRequest {
    answer: String,
    #[serde(default)]
    step_id: Option<String>,
}

/// Answers the question an execution waits on: `200 {execution_id, answered}`, `404` for an
/// unknown execution, `409 not_waiting` when it waits on no question (or another step's),
/// `400` for an answer too long.
pub async fn answer_execution(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    use trellis_runner::human_inputs::AnswerRefused;
    let request: InputRequest = body_object(body)?;
    let id = app.execution_here(&id)?;
    let answered = app
        .runtime
        .answer_input(&id, request.step_id.as_deref(), &request.answer)
        .ok_or_else(|| ApiError::not_found(format!("no execution {id}")))?;
    match answered {
        Ok(question) => Ok(Json(
            json!({"execution_id": id.as_str(), "answered": question.step_id}),
        )),
        Err(refused @ AnswerRefused::TooLong { .. }) => {
            Err(ApiError::bad_request(format!("answer: {refused}")))
        }
        Err(refused) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_waiting",
            format!("execution {id}: {refused}"),
        )),
    }
}

/// A path served, with another method.
pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this path is served with another method; see docs/server.md",
    )
}

/// Any other path under `/api`.
pub async fn unknown() -> ApiError {
    ApiError::not_found("no such endpoint; see docs/server.md")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A poll's `last` is where the next poll starts: the number of the last event it gave,
    /// so a client polling from it misses none (the log's own last number skipped the events
    /// past a read's 500).
    #[test]
    fn a_poll_from_last_misses_no_event() {
        let log = EventLog::default();
        for n in 0..600 {
            log.push(json!({"type": "text", "text": n.to_string()}));
        }
        let first = page(&log, 0);
        assert_eq!(first["events"].as_array().unwrap().len(), EVENTS_PER_READ);
        assert_eq!(first["last"], EVENTS_PER_READ as u64);
        let second = page(&log, first["last"].as_u64().unwrap());
        assert_eq!(second["events"][0]["id"], EVENTS_PER_READ as u64 + 1);
        assert_eq!(second["last"], 600);
        assert_eq!(page(&log, 600), json!({"events": [], "last": 600}));
    }
}
