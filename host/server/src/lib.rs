//! `trellis serve`: one workspace's builder, live executions and run results over HTTP (spec
//! section 12), for the web page at `/` and for any other client.
//!
//! - [`api`]: the handlers of `/api` for the builder and the plan, every error JSON
//!   `{error, detail}`.
//! - [`executions`]: executions started without the chat, and the log of every execution's
//!   events.
//! - [`workspace`]: costs, changelog, knowledge, artifacts, files and the database, read
//!   through the builder's read tools.
//! - [`events`]: the numbered events of each builder session, streamed and polled.
//! - [`guard`]: what every request must show (token, `Host`, `Origin`, JSON writes).
//!
//! The server is a client of the runner's [`Runtime`] and of the builder only. It binds
//! `127.0.0.1:7878` by default; any other address needs a token. Connections, request
//! headers, bodies, event streams and sessions are bounded ([`Limits`]).

pub mod api;
pub mod events;
pub mod executions;
pub mod guard;
pub mod scheduler;
pub mod scheduler_api;
pub mod workspace;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::Semaphore;

use trellis_builder::{BuilderObserver, BuilderSession, Mode};
use trellis_runner::runtime::{Runtime, StartOptions};

use api::ApiError;
use events::EventLog;
use guard::Guard;

/// The address `trellis serve` binds unless told otherwise.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7878";

/// The largest request body, in bytes (`413` past it).
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// How long a client may take to send a request's headers before the connection closes.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The page at `/`.
const PAGE: &str = include_str!("page.html");

/// Opens (or, given an id, restores) a builder session whose events go to the observer.
pub type SessionFactory = Arc<
    dyn Fn(Option<&str>, Option<Mode>, BuilderObserver) -> Result<BuilderSession> + Send + Sync,
>;

/// The bounds of a server.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once (`503` past it).
    pub connections: usize,
    /// Event streams open at once (`503` past it).
    pub streams: usize,
    /// Builder sessions the server keeps (`503` to a query that would open one more).
    pub sessions: usize,
    /// Executions running at once on a workspace that `POST /api/executions` may add to
    /// (`503` past it).
    pub executions: usize,
    /// Bytes of answers being sent at once (an answer waits in memory until its client
    /// reads it): one past it is refused with `503 busy`.
    pub answer_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 256,
            streams: 64,
            sessions: 16,
            executions: trellis_runner::runtime::DEFAULT_MAX_RUNNING,
            answer_bytes: trellis_sandbox::answers::DEFAULT_ANSWER_BYTES,
        }
    }
}

/// One workspace a server serves, and how its builder sessions are opened.
pub struct ServedWorkspace {
    /// The workspace folder; requests name it by its folder name (`?workspace=NAME`).
    pub root: PathBuf,
    /// How its builder sessions are opened.
    pub sessions: SessionFactory,
}

impl std::fmt::Debug for ServedWorkspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedWorkspace")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// What `trellis serve` serves.
pub struct ServerOptions {
    /// The workspaces: a request without `?workspace=` is for the first.
    pub workspaces: Vec<ServedWorkspace>,
    /// Where to listen.
    pub addr: SocketAddr,
    /// The bearer token every request needs (`TRELLIS_TOKEN`); required off loopback.
    pub token: Option<String>,
    /// The runtime executions run on.
    pub runtime: Runtime,
    /// What an execution started without the chat runs with (models, approvals, limits).
    pub template: StartOptions,
    /// The bounds.
    pub limits: Limits,
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field(
                "workspaces",
                &self.workspaces.iter().map(|w| &w.root).collect::<Vec<_>>(),
            )
            .field("addr", &self.addr)
            .field("token", &self.token.as_ref().map(|_| "[set]"))
            .field("limits", &self.limits)
            .finish()
    }
}

/// A builder session the server holds, with its events.
pub struct LiveSession {
    /// The session id.
    pub id: String,
    /// Its events.
    pub log: Arc<EventLog>,
    /// The session; one turn at a time.
    pub session: tokio::sync::Mutex<BuilderSession>,
    /// Stops the turn it runs now (held outside the lock the turn holds).
    pub stop: trellis_builder::TurnStop,
    /// The executions it started (from its events), for `POST /api/session/stop`.
    pub executions: Arc<Mutex<BTreeSet<String>>>,
}

impl std::fmt::Debug for LiveSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveSession").field("id", &self.id).finish()
    }
}

/// The workspaces of a server by name, the first first.
pub type Workspaces = Arc<Vec<(String, Arc<App>)>>;

/// Sessions let go whose event numbers a server remembers (then it starts again).
const EVICTED_KEPT: usize = 10_000;

/// The state the handlers of one workspace share.
pub struct App {
    /// The workspace folder.
    pub root: PathBuf,
    /// Its name in requests: the folder's name.
    pub name: String,
    /// Every workspace of the server (this one too), set once they all exist.
    pub(crate) peers: std::sync::OnceLock<Workspaces>,
    runtime: Runtime,
    template: StartOptions,
    /// The events of every execution, the server's and the sessions'.
    execution_log: Arc<EventLog>,
    /// Copies each execution's events into `execution_log`.
    watcher: executions::Watcher,
    factory: SessionFactory,
    sessions: Mutex<HashMap<String, Arc<LiveSession>>>,
    /// The session of the latest query.
    last_session: Mutex<Option<Arc<LiveSession>>>,
    /// The last event number of each session let go to make room, for its restore.
    evicted: Mutex<HashMap<String, u64>>,
    max_sessions: usize,
    /// Set while a builder turn runs on the workspace.
    busy: AtomicBool,
    queries: AtomicU64,
    streams: Arc<Semaphore>,
    max_streams: usize,
    /// Executions running at once on the workspace a start may join.
    max_executions: usize,
    /// Reads through the builder's read tools in progress (server-wide).
    reads: Arc<Semaphore>,
    guard: Guard,
    /// Fires the workspace's schedules.
    scheduler: scheduler::Scheduler,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").field("root", &self.root).finish()
    }
}

impl App {
    /// The workspace `given` names (by folder name), this one when none is given; `404
    /// unknown_workspace` naming the served ones for any other.
    fn resolve(self: &Arc<Self>, given: Option<&str>) -> Result<Arc<App>, ApiError> {
        let Some(given) = given else {
            return Ok(self.clone());
        };
        let peers = self.peers.get().cloned().unwrap_or_default();
        peers
            .iter()
            .find(|(name, _)| name == given)
            .map(|(_, app)| app.clone())
            .ok_or_else(|| unknown_workspace(given, &peers))
    }

    /// The executions of this workspace (the runtime runs every served workspace's).
    pub(crate) fn executions_here(&self) -> Vec<trellis_runner::runtime::ExecutionInfo> {
        self.runtime
            .list()
            .into_iter()
            .filter(|e| e.workspace == self.root)
            .collect()
    }

    /// Execution `id` when it is this workspace's; `404` else (another workspace's too).
    pub(crate) fn execution_here(
        &self,
        id: &str,
    ) -> Result<trellis_runner::runtime::ExecutionId, ApiError> {
        let id = trellis_runner::runtime::ExecutionId::from(id);
        if self.executions_here().iter().any(|e| e.id == id) {
            Ok(id)
        } else {
            Err(ApiError::not_found(format!(
                "no execution {id} on this workspace"
            )))
        }
    }

    /// The workspace's handle; `500` when its folder cannot be opened.
    pub(crate) fn workspace_fs(&self) -> Result<trellis_sandbox::store::WorkspaceFs, ApiError> {
        trellis_sandbox::store::WorkspaceFs::open(&self.root).map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "workspace",
                e.to_string(),
            )
        })
    }

    /// The session `id` (held, or restored from its conversation file), or a new one.
    fn session(&self, id: Option<&str>, mode: Option<Mode>) -> Result<Arc<LiveSession>, ApiError> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(live) = id.and_then(|id| sessions.get(id)) {
            return Ok(live.clone());
        }
        if sessions.len() >= self.max_sessions {
            // An idle session (no turn holds it) makes room: it is on disk, and a query
            // naming it later restores it.
            let idle = sessions
                .iter()
                .find(|(_, live)| live.session.try_lock().is_ok())
                .map(|(id, _)| id.clone());
            if let Some(idle) = idle
                && let Some(gone) = sessions.remove(&idle)
            {
                // Restored later, its events go on from where they were.
                let mut numbers = self.evicted.lock().unwrap_or_else(|e| e.into_inner());
                if numbers.len() >= EVICTED_KEPT {
                    numbers.clear();
                }
                numbers.insert(idle, gone.log.last());
            }
        }
        if sessions.len() >= self.max_sessions {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_sessions",
                format!(
                    "this server holds {} builder sessions, the limit (`trellis serve \
                     --max-sessions`); continue one of them",
                    self.max_sessions
                ),
            ));
        }
        let resumed = id.and_then(|id| {
            self.evicted
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(id)
                .copied()
        });
        let log = EventLog::for_workspace(&self.root);
        let log = Arc::new(match resumed {
            Some(last) => log.numbered_from(last + 1),
            None => log,
        });
        let sink = events::Joiner::new(log.clone(), |_, text| events::text_delta(text));
        let executions = Arc::new(Mutex::new(BTreeSet::new()));
        let (watcher, started) = (self.watcher.clone(), executions.clone());
        let by = Arc::new(Mutex::new(String::new()));
        let session_of = by.clone();
        let observer = BuilderObserver::new(move |event| {
            if let trellis_builder::BuilderEvent::Execution { id, .. } = event {
                let new = started
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id.clone());
                if new {
                    let by = session_of.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    watcher.watch(trellis_runner::runtime::ExecutionId::from(id.as_str()), &by);
                }
            }
            match event {
                trellis_builder::BuilderEvent::Reply(trellis_sandbox::llm::ReplyEvent::Text(
                    text,
                )) => sink.piece("", text),
                other => sink.push(events::builder_event(other)),
            }
        });
        let mut session = (self.factory)(id, mode, observer)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "session", format!("{e:#}")))?;
        session.set_trigger_hook(self.scheduler.hook());
        *by.lock().unwrap_or_else(|e| e.into_inner()) = format!("session {}", session.id());
        let live = Arc::new(LiveSession {
            id: session.id().to_string(),
            log,
            stop: session.turn_stop(),
            session: tokio::sync::Mutex::new(session),
            executions,
        });
        sessions.insert(live.id.clone(), live.clone());
        Ok(live)
    }
}

/// `404 unknown_workspace` for `given`, naming the served ones.
fn unknown_workspace(given: &str, peers: &[(String, Arc<App>)]) -> ApiError {
    let names: Vec<&str> = peers.iter().map(|(n, _)| n.as_str()).collect();
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_workspace",
        format!(
            "workspace {given:?}: this server serves {}",
            names
                .iter()
                .map(|n| format!("{n:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
}

/// The routes, with every request through the guard.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/api/query", post(api::query))
        .route("/api/sessions/{id}/events", get(api::events))
        .route("/api/sessions/{id}/events/stream", get(api::stream))
        .route("/api/session/stop", post(api::stop_session))
        .route("/api/workspaces", get(api::workspaces))
        .route("/api/workflow/builder-session", get(api::builder_session))
        .route("/api/workflow/plan", get(api::plan))
        .route("/api/workflow/runs", get(api::runs))
        .route("/api/workflow/executions", get(api::executions))
        .route("/api/workflow/costs", get(workspace::costs))
        .route("/api/workflow/llm-config", get(workspace::llm_config))
        .route("/api/workflow/steps/{id}/grant", get(workspace::step_grant))
        .route("/api/workflow/builder-sessions", get(api::builder_sessions))
        .route("/api/workflow/changelog", get(workspace::changelog))
        .route("/api/workflow/knowledge", get(workspace::knowledge))
        .route("/api/workflow/artifacts", get(workspace::artifacts))
        .route("/api/workflow/files", get(workspace::list_files))
        .route("/api/workflow/file", get(workspace::read_file))
        .route("/api/workflow/db/query", post(workspace::db_query))
        .route("/api/executions", post(executions::start))
        .route("/api/executions/events", get(api::execution_events))
        .route("/api/executions/events/stream", get(api::execution_stream))
        .route("/api/executions/{id}/stop", post(api::stop_execution))
        .route("/api/executions/{id}/message", post(api::message_execution))
        .route("/api/executions/{id}/input", post(api::answer_execution))
        .route(
            "/api/scheduler/config",
            get(scheduler_api::config).put(scheduler_api::set_config),
        )
        .route(
            "/api/scheduler/jobs",
            get(scheduler_api::jobs).post(scheduler_api::create),
        )
        .route(
            "/api/scheduler/jobs/{id}",
            get(scheduler_api::one)
                .put(scheduler_api::replace)
                .delete(scheduler_api::remove),
        )
        .route("/api/scheduler/jobs/{id}/runs", get(scheduler_api::runs))
        .route(
            "/api/scheduler/jobs/{id}/trigger",
            post(scheduler_api::trigger),
        )
        .route("/api/scheduler/jobs/{id}/stop", post(scheduler_api::stop))
        .route(
            "/api/scheduler/jobs/{id}/enable",
            post(scheduler_api::enable),
        )
        .route(
            "/api/scheduler/jobs/{id}/disable",
            post(scheduler_api::disable),
        )
        .fallback(api::unknown)
        .method_not_allowed_fallback(api::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(app.clone(), guarded))
        .with_state(app)
}

/// How long a client may take to send a request's body.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

async fn guarded(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let (mut response, refused) = match admitted(&app, request).await {
        Ok(request) => (next.run(request).await, false),
        Err(refusal) => (refusal.into_response(), true),
    };
    let headers = response.headers_mut();
    // A refused request (no token, a foreign Host or Origin, a slow body) ends its
    // connection: a client without the token cannot keep one of the server's slots.
    if refused {
        headers.insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    // No other site may frame the page (to trick clicks on its buttons).
    headers.insert(
        axum::http::header::X_FRAME_OPTIONS,
        axum::http::HeaderValue::from_static("DENY"),
    );
    headers.insert(
        axum::http::header::CONTENT_SECURITY_POLICY,
        axum::http::HeaderValue::from_static("frame-ancestors 'none'"),
    );
    headers.insert(
        axum::http::header::X_CONTENT_TYPE_OPTIONS,
        axum::http::HeaderValue::from_static("nosniff"),
    );
    response
}

/// Marks a request the guard let through as it came in ([`Dispatch`]): the router's layer
/// does not check it again.
#[derive(Debug, Clone, Copy)]
struct Passed;

/// The request once the guard lets it through, its body read whole: within
/// [`BODY_READ_TIMEOUT`] (a body sent a byte at a time would hold a connection forever)
/// and [`MAX_BODY_BYTES`].
async fn admitted(app: &App, request: Request) -> Result<Request, ApiError> {
    if request.uri().authority().is_some() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "absolute request targets are not served: ask for the path",
        ));
    }
    if request.extensions().get::<Passed>().is_none() {
        app.guard
            .check(request.method(), request.uri().path(), request.headers())?;
    }
    let (parts, body) = request.into_parts();
    let read = axum::body::to_bytes(body, MAX_BODY_BYTES);
    let bytes = match tokio::time::timeout(BODY_READ_TIMEOUT, read).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("a request body may be {MAX_BODY_BYTES} bytes at most"),
            ));
        }
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "timeout",
                format!(
                    "the request body did not arrive within {} s",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            ));
        }
    };
    Ok(Request::from_parts(parts, axum::body::Body::from(bytes)))
}

async fn page() -> Html<&'static str> {
    Html(PAGE)
}

/// Binds `options.addr` and serves until the process ends. Calls `bound` with the address
/// bound (the port chosen when `addr` asks for port 0) once it listens.
pub async fn serve(options: ServerOptions, bound: impl FnOnce(SocketAddr)) -> Result<()> {
    if !options.addr.ip().is_loopback() && options.token.is_none() {
        bail!(
            "--addr {}: a server reachable from other machines needs a token; set \
             TRELLIS_TOKEN (every request then needs `Authorization: Bearer <token>`)",
            options.addr
        );
    }
    if options.token.as_deref().is_some_and(|t| t.len() < 16) {
        bail!("TRELLIS_TOKEN: a token needs at least 16 characters");
    }
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .with_context(|| format!("binding {}", options.addr))?;
    let addr = listener.local_addr()?;
    let limits = options.limits;
    let guard = Guard {
        addr,
        token: options.token,
    };
    let streams = Arc::new(Semaphore::new(limits.streams));
    let reads = Arc::new(Semaphore::new(workspace::READS_AT_ONCE));
    let mut apps: Vec<(String, Arc<App>)> = Vec::new();
    for served in options.workspaces {
        let name = served
            .root
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        if apps.iter().any(|(n, _)| *n == name) {
            bail!(
                "two workspaces are named {name:?}: requests name a workspace by its folder's \
                 name, so serve folders of different names"
            );
        }
        let execution_log = Arc::new(EventLog::for_workspace(&served.root));
        let app = Arc::new(App {
            root: served.root,
            name: name.clone(),
            peers: std::sync::OnceLock::new(),
            runtime: options.runtime.clone(),
            template: options.template.clone(),
            execution_log: execution_log.clone(),
            watcher: executions::Watcher {
                runtime: options.runtime.clone(),
                log: execution_log,
                handle: tokio::runtime::Handle::current(),
                watched: Arc::default(),
            },
            max_executions: limits.executions,
            reads: reads.clone(),
            factory: served.sessions,
            sessions: Mutex::default(),
            last_session: Mutex::default(),
            evicted: Mutex::default(),
            max_sessions: limits.sessions,
            busy: AtomicBool::new(false),
            queries: AtomicU64::new(0),
            streams: streams.clone(),
            max_streams: limits.streams,
            guard: guard.clone(),
            scheduler: scheduler::Scheduler::default(),
        });
        apps.push((name, app));
    }
    if apps.is_empty() {
        bail!("no workspace to serve");
    }
    let apps: Workspaces = Arc::new(apps);
    for (_, app) in apps.iter() {
        let _ = app.peers.set(apps.clone());
        scheduler::spawn(app.clone());
    }
    let routers: Arc<Vec<(String, Router)>> = Arc::new(
        apps.iter()
            .map(|(name, app)| (name.clone(), router(app.clone())))
            .collect(),
    );
    bound(addr);
    // A connection that has not sent a request with the token gives its place to a new
    // one when all are taken (clients without the token cannot hold them all; see
    // `trellis_sandbox::connections` for a server without a token).
    let connections =
        trellis_sandbox::connections::Slots::new(limits.connections, guard.token.is_some());
    // What the answers being sent hold together (a client that does not read keeps its
    // answer in memory).
    let answers = trellis_sandbox::answers::AnswerBytes::new(limits.answer_bytes);
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some((slot, evicted)) = connections.admit() else {
            drop(stream);
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(Dispatch {
            routers: routers.clone(),
            apps: apps.clone(),
            guard: guard.clone(),
            answers: answers.clone(),
            prover: slot.prover(),
        });
        tokio::spawn(async move {
            let _slot = slot;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::select! {
                ended = connection => {
                    if let Err(e) = ended {
                        tracing::debug!("HTTP connection: {e}");
                    }
                }
                () = evicted => tracing::debug!("HTTP connection closed for a newer one"),
            }
        });
    }
}

/// Sends each request to the router of the workspace its `?workspace=` names (the first
/// without one), with that parameter taken out of the query string; an unknown one, once
/// the guard lets the request through, is `404 unknown_workspace`.
#[derive(Clone)]
struct Dispatch {
    routers: Arc<Vec<(String, Router)>>,
    apps: Workspaces,
    guard: Guard,
    answers: Arc<trellis_sandbox::answers::AnswerBytes>,
    /// Marks the connection as its client's once a request passes the guard with the token.
    prover: trellis_sandbox::connections::Prover,
}

impl tower_service::Service<hyper::Request<hyper::body::Incoming>> for Dispatch {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response, Self::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        let (mut parts, body) = request.into_parts();
        let passed = self
            .guard
            .check(&parts.method, parts.uri.path(), &parts.headers)
            .is_ok();
        if self.guard.proves_its_client(passed, &parts.headers) {
            self.prover.prove();
        }
        if passed {
            parts.extensions.insert(Passed);
        }
        let (named, rest) = take_workspace(parts.uri.query());
        let router = match named.as_deref() {
            None => Some(self.routers[0].1.clone()),
            Some(name) => self
                .routers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, r)| r.clone()),
        };
        let Some(router) = router else {
            let answer = match self
                .guard
                .check(&parts.method, parts.uri.path(), &parts.headers)
            {
                Ok(()) => unknown_workspace(named.as_deref().unwrap_or_default(), &self.apps)
                    .into_response(),
                Err(refusal) => {
                    let mut answer = refusal.into_response();
                    answer.headers_mut().insert(
                        axum::http::header::CONNECTION,
                        axum::http::HeaderValue::from_static("close"),
                    );
                    answer
                }
            };
            return Box::pin(async move { Ok(answer) });
        };
        if named.is_some() {
            let path = parts.uri.path().to_string();
            let target = match rest {
                Some(q) => format!("{path}?{q}"),
                None => path,
            };
            if let Ok(uri) = target.parse() {
                parts.uri = uri;
            }
        }
        let request = Request::from_parts(parts, axum::body::Body::new(body));
        let mut router = router;
        let answers = self.answers.clone();
        let prover = self.prover.clone();
        Box::pin(async move {
            let Ok(answer) = tower_service::Service::call(&mut router, request).await;
            // The connection is busy while its answer is sent (an event stream's too), not
            // while its request comes in: a body trickled in does not keep its place.
            let busy = prover.busy();
            let (parts, body) = answer.into_parts();
            Ok(match answers.hold(body) {
                Ok(held) => Response::from_parts(
                    parts,
                    axum::body::Body::new(http_body_util::BodyExt::map_frame(held, move |f| {
                        let _busy = &busy;
                        f
                    })),
                ),
                Err(busy) => {
                    let mut refused =
                        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", busy.to_string())
                            .into_response();
                    refused.headers_mut().insert(
                        axum::http::header::RETRY_AFTER,
                        axum::http::HeaderValue::from_static("5"),
                    );
                    refused
                }
            })
        })
    }
}

/// The `workspace` value of a query string (percent-decoded), and the query string without
/// it (`None` when nothing is left).
fn take_workspace(query: Option<&str>) -> (Option<String>, Option<String>) {
    let Some(query) = query else {
        return (None, None);
    };
    let mut named = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.split_once('=') {
            Some(("workspace", value)) => {
                named = Some(percent_decode(value));
                false
            }
            _ => !pair.is_empty(),
        })
        .collect();
    (named, (!rest.is_empty()).then(|| rest.join("&")))
}

/// `value` with `+` as a space and `%XX` as its byte (invalid escapes kept as they are).
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(value.get(i + 1..i + 3).unwrap_or("zz"), 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
