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
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 256,
            streams: 64,
            sessions: 16,
        }
    }
}

/// What `trellis serve` serves.
pub struct ServerOptions {
    /// The workspace folder.
    pub root: PathBuf,
    /// Where to listen.
    pub addr: SocketAddr,
    /// The bearer token every request needs (`TRELLIS_TOKEN`); required off loopback.
    pub token: Option<String>,
    /// The runtime executions run on.
    pub runtime: Runtime,
    /// What an execution started without the chat runs with (models, approvals, limits).
    pub template: StartOptions,
    /// How builder sessions are opened.
    pub sessions: SessionFactory,
    /// The bounds.
    pub limits: Limits,
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field("root", &self.root)
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
    /// The executions it started (from its events), for `POST /api/session/stop`.
    pub executions: Arc<Mutex<BTreeSet<String>>>,
}

impl std::fmt::Debug for LiveSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveSession").field("id", &self.id).finish()
    }
}

/// The state the handlers share.
pub struct App {
    /// The workspace folder.
    pub root: PathBuf,
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
    max_sessions: usize,
    /// Set while a builder turn runs on the workspace.
    busy: AtomicBool,
    queries: AtomicU64,
    streams: Arc<Semaphore>,
    max_streams: usize,
    guard: Guard,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").field("root", &self.root).finish()
    }
}

impl App {
    /// Refuses a `workspace` that is not the served one (by folder name or path).
    fn check_workspace(&self, given: Option<&str>) -> Result<(), ApiError> {
        let Some(given) = given else { return Ok(()) };
        let name = self
            .root
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if given == name || std::path::Path::new(given) == self.root {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_workspace",
            format!("workspace {given:?}: this server serves {name:?}"),
        ))
    }

    /// The session `id` (held, or restored from its conversation file), or a new one.
    fn session(&self, id: Option<&str>, mode: Option<Mode>) -> Result<Arc<LiveSession>, ApiError> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(live) = id.and_then(|id| sessions.get(id)) {
            return Ok(live.clone());
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
        let log = Arc::new(EventLog::default());
        let sink = log.clone();
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
            sink.push(events::builder_event(event));
        });
        let session = (self.factory)(id, mode, observer)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "session", format!("{e:#}")))?;
        *by.lock().unwrap_or_else(|e| e.into_inner()) = format!("session {}", session.id());
        let live = Arc::new(LiveSession {
            id: session.id().to_string(),
            log,
            session: tokio::sync::Mutex::new(session),
            executions,
        });
        sessions.insert(live.id.clone(), live.clone());
        Ok(live)
    }
}

/// The routes, with every request through the guard.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/api/query", post(api::query))
        .route("/api/sessions/{id}/events", get(api::events))
        .route("/api/sessions/{id}/events/stream", get(api::stream))
        .route("/api/session/stop", post(api::stop_session))
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
        .fallback(api::unknown)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(app.clone(), guarded))
        .with_state(app)
}

async fn guarded(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    match app.guard.check(request.method(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
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
    let execution_log = Arc::new(EventLog::default());
    let runtime = options.runtime;
    let app = Arc::new(App {
        root: options.root,
        runtime: runtime.clone(),
        template: options.template,
        execution_log: execution_log.clone(),
        watcher: executions::Watcher {
            runtime,
            log: execution_log,
            handle: tokio::runtime::Handle::current(),
        },
        factory: options.sessions,
        sessions: Mutex::default(),
        last_session: Mutex::default(),
        max_sessions: limits.sessions,
        busy: AtomicBool::new(false),
        queries: AtomicU64::new(0),
        streams: Arc::new(Semaphore::new(limits.streams)),
        max_streams: limits.streams,
        guard: Guard {
            addr,
            token: options.token,
        },
    });
    let router = router(app);
    bound(addr);
    let connections = Arc::new(Semaphore::new(limits.connections));
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = connections.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            if let Err(e) = connection.await {
                tracing::debug!("HTTP connection: {e}");
            }
        });
    }
}
