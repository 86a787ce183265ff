//! `trellis mcp serve`: the tools of loaded plugins offered to MCP clients, over stdio or
//! streamable HTTP.
//!
//! The grant of every call is the operator's, fixed when the server starts: a client names a
//! tool and its arguments, never a folder. Each call goes through
//! [`PluginRegistry::call_tool_cancellable`], the same sandboxed call as `trellis tool call`:
//! a fresh instance with the usual limits, which an MCP cancellation stops. A tool's error
//! and arguments that do not match its schema are results with `isError: true`; only a name
//! that is not offered is a protocol error.
//!
//! Calls run at most [`ToolServer::max_concurrent_calls`] at a time, whichever transport and
//! session they come from; a call over the cap waits for a slot, for at most its own timeout,
//! and is then refused as a result with `isError: true` naming the limit. At most
//! [`DEFAULT_MAX_WAITING_CALLS`] calls wait (`--max-waiting-calls`), however many CPUs the
//! machine has; one past them is refused so at once.
//!
//! Over HTTP the server answers at `/mcp` only. It keeps rmcp's `Host` check against DNS
//! rebinding, and when a bearer token is set (required off loopback) a request without it
//! is refused before anything else looks at it. Everything a client can make it hold is
//! bounded ([`HttpLimits`]): open connections (`503` past the cap), live sessions (`503` to an
//! `initialize` past the cap), requests without a session in progress (rmcp serves a request
//! that names its protocol version itself without one: `503` past the same cap, until its
//! answer is sent), a request's headers ([`HEADER_READ_TIMEOUT`], then closed) and its body
//! ([`MAX_BODY_BYTES`], else `413`; [`BODY_READ_TIMEOUT`], else `408`). Over stdio a
//! message is one line of at most [`MAX_LINE_BYTES`] bytes and [`MAX_BODY_VALUES`] JSON
//! values; a line over either is dropped unparsed and answered with an `Invalid Request`
//! error.

mod sessions;
mod stdio_lines;

use sessions::{
    CappedSessions, SESSION_HEADER, SESSION_REFUSED, opens_session, sessionless_full, sessions_full,
};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
pub use stdio_lines::MAX_LINE_BYTES;

use anyhow::{Context, Result};
use http_body_util::BodyExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use trellis_sandbox::json_values::json_values;
use trellis_sandbox::plugins::PluginKind;
use trellis_sandbox::{Grant, Limits, PluginRegistry};

/// The JSON values a request body (or a stdio line) may hold: arrays, objects and scalars
/// together.
pub const MAX_BODY_VALUES: usize = 100_000;

/// Separates the plugin id from the tool name in an MCP tool name (`workspace__read_file`):
/// clients accept only `^[a-zA-Z0-9_-]{1,64}$`, so the `:` of `server:tool` cannot stay.
pub const NAME_SEPARATOR: &str = "__";

/// The path the HTTP transport answers at.
pub const HTTP_PATH: &str = "/mcp";

/// How long a connection may take to send a request's headers before it is closed, so a
/// client that trickles them (slowloris) cannot hold connections open for ever.
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a request may take to send its whole body once its headers are in, so a body
/// trickled a byte at a time cannot hold a connection (and its session's slot) for ever.
pub const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The largest request body read (rmcp's own default cap, applied before rmcp sees it).
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// The default cap on HTTP sessions alive at once (`--max-sessions`).
pub const DEFAULT_MAX_SESSIONS: usize = 64;

/// The default cap on open HTTP connections (`--max-connections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// The default cap on tool calls running at once (`--max-concurrent-calls`): the number of
/// CPUs, since each call is a busy sandboxed instance.
pub fn default_max_concurrent_calls() -> usize {
    std::thread::available_parallelism().map_or(4, usize::from)
}

/// Calls that may wait for a call slot by default (`--max-waiting-calls`), whatever the
/// number of slots: a waiting call holds its arguments (up to a 16 MiB line over stdio), so
/// past this many a call is refused at once as a result with `isError: true` naming the
/// limit, instead of queued.
pub const DEFAULT_MAX_WAITING_CALLS: usize = 16;

/// What the server offers and with which grant; cheap to clone (one per HTTP session).
#[derive(Clone)]
pub struct ToolServer {
    registry: Arc<PluginRegistry>,
    grant: Arc<Grant>,
    limits: Limits,
    /// MCP name to the tool's `server:tool` name and its listing.
    tools: Arc<BTreeMap<String, (String, Tool)>>,
    /// One permit per call allowed to run at once, shared by every session.
    calls: Arc<tokio::sync::Semaphore>,
    max_calls: usize,
    /// Calls that may wait for a slot ([`ToolServer::max_waiting_calls`]).
    max_waiting: usize,
    /// Calls waiting for a slot now, shared by every session.
    waiting: Arc<std::sync::atomic::AtomicUsize>,
}

/// One call counted in [`ToolServer::waiting`] until dropped.
struct Waiting(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl std::fmt::Debug for ToolServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolServer")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl ToolServer {
    /// A server of the tools named in `only` (`server:tool`; every tool of every tool plugin
    /// when empty), each called under `grant` and `limits`.
    pub fn new(
        registry: Arc<PluginRegistry>,
        grant: Grant,
        limits: Limits,
        only: &[String],
    ) -> Result<Self> {
        let mut wanted = Vec::with_capacity(only.len());
        for name in only {
            let (plugin, spec) = registry
                .resolve_tool(name)
                .with_context(|| format!("--tool {name}"))?;
            wanted.push((plugin.manifest().id.clone(), spec.name.clone()));
        }
        let mut tools = BTreeMap::new();
        for plugin in registry.plugins() {
            if plugin.manifest().kind != PluginKind::Tool {
                continue;
            }
            let id = &plugin.manifest().id;
            for spec in plugin.tools() {
                if !wanted.is_empty() && !wanted.iter().any(|(p, t)| p == id && *t == spec.name) {
                    continue;
                }
                let name = format!("{id}{NAME_SEPARATOR}{}", spec.name);
                if !is_client_safe_name(&name) {
                    tracing::warn!(
                        "{id}:{}: not offered: {name:?} is not a valid MCP tool name \
                         (1-64 characters of a-z, A-Z, 0-9, `_` or `-`)",
                        spec.name
                    );
                    continue;
                }
                let schema = match &spec.input_schema {
                    serde_json::Value::Object(schema) => schema.clone(),
                    _ => {
                        tracing::warn!(
                            "{id}:{}: not offered: its schema is not an object",
                            spec.name
                        );
                        continue;
                    }
                };
                let mut tool = Tool::new(name.clone(), spec.description.clone(), schema);
                tool.annotations = Some(
                    ToolAnnotations::new()
                        .read_only(spec.read_only)
                        .destructive(spec.destructive)
                        .idempotent(spec.idempotent),
                );
                tools.insert(name, (format!("{id}:{}", spec.name), tool));
            }
        }
        Ok(ToolServer {
            registry,
            // A long-lived grant: a folder moved away since the server started, another made at
            // its path, is refused rather than served from where it went.
            grant: Arc::new(grant.rechecked_every_call()),
            limits,
            tools: Arc::new(tools),
            calls: Arc::new(tokio::sync::Semaphore::new(default_max_concurrent_calls())),
            max_calls: default_max_concurrent_calls(),
            max_waiting: DEFAULT_MAX_WAITING_CALLS,
            waiting: Arc::default(),
        })
    }

    /// Lets at most `max` calls run at once (at least one); up to
    /// [`ToolServer::max_waiting_calls`] more wait for a slot, the others are refused.
    pub fn max_concurrent_calls(mut self, max: usize) -> Self {
        self.max_calls = max.max(1);
        self.calls = Arc::new(tokio::sync::Semaphore::new(self.max_calls));
        self
    }

    /// Lets at most `max` calls wait for a slot (default [`DEFAULT_MAX_WAITING_CALLS`]); a
    /// call past them is refused at once.
    pub fn max_waiting_calls(mut self, max: usize) -> Self {
        self.max_waiting = max;
        self
    }

    /// A slot to run a call in: at once when one is free, else the first to free up within
    /// the call's timeout. `Err` is the refusal the client sees.
    async fn call_slot(
        &self,
        tool: &str,
        cancelled: &tokio_util::sync::CancellationToken,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, String> {
        if let Ok(permit) = self.calls.clone().try_acquire_owned() {
            return Ok(permit);
        }
        let max_waiting = self.max_waiting;
        let _waiting = Waiting(self.waiting.clone());
        if self
            .waiting
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            >= max_waiting
        {
            return Err(format!(
                "the server is busy: all {max} call slots are taken and {max_waiting} calls \
                 already wait for one, the most that may (`trellis mcp serve \
                 --max-waiting-calls N` sets how many may wait, `--max-concurrent-calls N` how \
                 many run at once); try again later",
                max = self.max_calls,
            ));
        }
        tracing::debug!(
            tool,
            max = self.max_calls,
            "waiting for a call slot (--max-concurrent-calls)"
        );
        tokio::select! {
            permit = self.calls.clone().acquire_owned() => {
                permit.map_err(|_| "the server is stopping".to_string())
            }
            () = tokio::time::sleep(self.limits.timeout) => Err(format!(
                "the server is busy: all {max} call slots stayed taken for {secs} s, the \
                 call's timeout (`trellis mcp serve --max-concurrent-calls {max}` sets how \
                 many calls run at once); try again later",
                max = self.max_calls,
                secs = self.limits.timeout.as_secs_f64(),
            )),
            () = cancelled.cancelled() => Err("cancelled before it started".to_string()),
        }
    }

    /// The MCP names of the offered tools.
    pub fn tool_names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// Serves one client on the process's stdin and stdout until it closes them.
    pub async fn serve_stdio(self) -> Result<()> {
        let (stdin, stdout) = rmcp::transport::stdio_pipes();
        self.serve_pipes(stdin, stdout).await
    }

    /// Serves one client that sends newline-delimited JSON-RPC on `reader` and reads the
    /// answers on `writer`, as over stdio, until it closes `reader`.
    pub async fn serve_pipes<R, W>(self, reader: R, writer: W) -> Result<()>
    where
        R: tokio::io::AsyncRead + Send + Unpin + 'static,
        W: tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let unread = std::sync::Arc::new(stdio_lines::Unread::default());
        let running = self
            .serve((
                stdio_lines::paced_lines(reader, unread.clone()),
                stdio_lines::CountingWriter::new(writer, unread),
            ))
            .await
            .context("starting the MCP session on stdio")?;
        running.waiting().await.context("serving MCP on stdio")?;
        Ok(())
    }
}

/// Whether every MCP client accepts `name` as a tool name.
fn is_client_safe_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl ServerHandler for ToolServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("trellis", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.tools.values().map(|(_, tool)| tool.clone()).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some((full_name, _)) = self.tools.get(request.name.as_ref()) else {
            return Err(ErrorData::invalid_params(
                format!("no tool {:?} is offered", request.name),
                None,
            ));
        };
        let _slot = match self.call_slot(full_name, &context.ct).await {
            Ok(slot) => slot,
            Err(refused) => {
                tracing::info!(tool = %full_name, "call refused: {refused}");
                return Ok(CallToolResult::error(vec![ContentBlock::text(refused)]).into());
            }
        };
        tracing::debug!(tool = %full_name, "call started");
        let args = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let outcome = self
            .registry
            .call_tool_cancellable(full_name, &args, &self.grant, &self.limits, &context.ct)
            .await;
        let result = match outcome {
            Ok(value) => {
                let text = value.to_string();
                let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
                if value.is_object() {
                    result.structured_content = Some(value);
                }
                result
            }
            Err(err) => {
                tracing::debug!(tool = %full_name, kind = err.kind(), "tool call failed");
                CallToolResult::error(vec![ContentBlock::text(err.to_string())])
            }
        };
        Ok(result.into())
    }
}

/// How the HTTP transport admits requests.
#[derive(Debug, Clone)]
pub struct HttpAccess {
    /// The bearer token every request must carry; `None` admits any (loopback only).
    pub token: Option<String>,
    /// Names and addresses a request's `Host` may give, besides the loopback ones.
    pub extra_hosts: Vec<String>,
}

/// What one HTTP server holds at most at once.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Live sessions; an `initialize` past it gets `503`. A session ends when its client
    /// deletes it or after 5 minutes idle. Requests without a session in progress at once
    /// (each a session of one request) have the same cap, counted apart.
    pub max_sessions: usize,
    /// Open connections; one past it gets `503` and is closed.
    pub max_connections: usize,
    /// Bytes of answers being sent at once (an answer waits in memory until its client
    /// reads it): one past it gets `503`, a stream past it ends.
    pub answer_bytes: u64,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            answer_bytes: trellis_sandbox::answers::DEFAULT_ANSWER_BYTES,
        }
    }
}

/// The loopback names every HTTP server accepts in `Host`.
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// A bound HTTP server, not yet serving.
#[derive(Debug)]
pub struct HttpServer {
    listener: tokio::net::TcpListener,
    server: ToolServer,
    access: HttpAccess,
    limits: HttpLimits,
}

impl HttpServer {
    /// Binds `addr`. Off loopback a token is required, and the address itself joins the
    /// hosts a request may name.
    pub async fn bind(
        server: ToolServer,
        addr: SocketAddr,
        mut access: HttpAccess,
        limits: HttpLimits,
    ) -> Result<Self> {
        if access.token.as_deref().is_some_and(str::is_empty) {
            access.token = None;
        }
        if !addr.ip().is_loopback() {
            anyhow::ensure!(
                access.token.is_some(),
                "{addr} is not a loopback address: set TRELLIS_TOKEN to the bearer token \
                 clients must send"
            );
            if !addr.ip().is_unspecified() {
                access.extra_hosts.push(addr.ip().to_string());
            }
        }
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        Ok(HttpServer {
            listener,
            server,
            access,
            limits,
        })
    }

    /// The address it listens on (the port chosen when 0 was asked for).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until `stop` completes.
    pub async fn serve(self, stop: impl Future<Output = ()>) -> Result<()> {
        let shutdown = tokio_util::sync::CancellationToken::new();
        let _stop_all = shutdown.clone().drop_guard();
        let mut stop = std::pin::pin!(stop);
        use rmcp::transport::streamable_http_server::{
            StreamableHttpServerConfig, StreamableHttpService,
        };
        let hosts: Vec<String> = LOOPBACK_HOSTS
            .iter()
            .map(|h| h.to_string())
            .chain(self.access.extra_hosts.iter().cloned())
            .collect();
        // A browser page may call only from a loopback origin; other clients send no Origin.
        let origins = ["http", "https"].into_iter().flat_map(|scheme| {
            ["localhost", "127.0.0.1", "[::1]"]
                .into_iter()
                .map(move |host| format!("{scheme}://{host}:*"))
        });
        let config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(hosts)
            .with_allowed_origins(origins)
            .enforce_origin_validation()
            .with_max_request_body_bytes(MAX_BODY_BYTES)
            .with_cancellation_token(shutdown.child_token());
        let server = self.server.clone();
        let sessions = Arc::new(CappedSessions {
            inner: LocalSessionManager::default(),
            max: self.limits.max_sessions.max(1),
            creating: tokio::sync::Mutex::new(()),
        });
        let service =
            StreamableHttpService::new(move || Ok(server.clone()), sessions.clone(), config);
        let token = self.access.token.map(Arc::<str>::from);
        let max_connections = self.limits.max_connections.max(1);
        // A connection that has not sent a request with the token gives its place to a new
        // one when all are taken (clients without the token cannot hold them all).
        let connections =
            trellis_sandbox::connections::Slots::new(max_connections, token.is_some());
        let sessionless = Arc::new(tokio::sync::Semaphore::new(sessions.max));
        // What the answers being sent hold together (a client that does not read keeps its
        // answer in memory).
        let answers = trellis_sandbox::answers::AnswerBytes::new(self.limits.answer_bytes);
        loop {
            let (stream, _) = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        tracing::warn!("accepting a connection: {err}");
                        continue;
                    }
                },
                () = &mut stop => return Ok(()),
            };
            let Some((connection_slot, evicted)) = connections.admit() else {
                tokio::spawn(refuse_connection(stream, max_connections));
                continue;
            };
            let prover = connection_slot.prover();
            let service = service.clone();
            let token = token.clone();
            let shutdown = shutdown.clone();
            let sessions = sessions.clone();
            let sessionless = sessionless.clone();
            let answers = answers.clone();
            tokio::spawn(async move {
                let _slot = connection_slot;
                let handler = hyper::service::service_fn(move |request| {
                    let mut service = service.clone();
                    let token = token.clone();
                    let prover = prover.clone();
                    let sessions = sessions.clone();
                    let sessionless = sessionless.clone();
                    let answers = answers.clone();
                    let answer = async move {
                        if let Some(refused) = refuse(&request, token.as_deref()) {
                            return Ok::<_, std::convert::Infallible>(refused);
                        }
                        prover.prove();
                        let (request, body) = match read_body(request).await {
                            Ok(read) => read,
                            Err(refused) => return Ok(refused),
                        };
                        // The connection is busy once its request is in whole, until the
                        // answer is sent: a body trickled in does not keep its place.
                        let busy = prover.busy();
                        // A request without a session holds a slot until its answer is sent
                        // (a tool call's stream included): rmcp serves such a request with
                        // an instance of its own, which the session cap does not count. An
                        // `initialize` is the session cap's.
                        let sessionless_slot = if request.headers().contains_key(SESSION_HEADER)
                            || opens_session(&body)
                        {
                            None
                        } else {
                            match sessionless.clone().try_acquire_owned() {
                                Ok(slot) => Some(slot),
                                Err(_) => return Ok(sessionless_full(sessions.max)),
                            }
                        };
                        let (response, refused) = SESSION_REFUSED
                            .scope(std::cell::Cell::new(false), async {
                                let response =
                                    tower_service::Service::call(&mut service, request).await;
                                (response, SESSION_REFUSED.with(std::cell::Cell::get))
                            })
                            .await;
                        if refused {
                            let mut response = plain_owned(
                                hyper::StatusCode::SERVICE_UNAVAILABLE,
                                sessions_full(sessions.max),
                            );
                            response.headers_mut().insert(
                                hyper::header::RETRY_AFTER,
                                hyper::header::HeaderValue::from_static("5"),
                            );
                            return Ok(response);
                        }
                        Ok(match response {
                            Ok(response) => response.map(|body| {
                                body.map_frame(move |frame| {
                                    let _held = (&sessionless_slot, &busy);
                                    frame
                                })
                                .boxed()
                            }),
                            Err(never) => match never {},
                        })
                    };
                    async move {
                        let Ok(answer) = answer.await;
                        Ok::<_, std::convert::Infallible>(within(&answers, answer))
                    }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), handler);
                tokio::select! {
                    result = connection => {
                        if let Err(err) = result {
                            tracing::debug!("HTTP connection: {err}");
                        }
                    }
                    () = shutdown.cancelled() => {}
                    () = evicted => tracing::debug!("HTTP connection closed for a newer one"),
                }
            });
        }
    }
}

type Response =
    hyper::Response<http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>>;

/// An answer as sent: within the server's budget of answers being sent, or `503` when the
/// budget does not have room for it.
type Sent = hyper::Response<
    http_body_util::Either<
        trellis_sandbox::answers::Held<
            http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>,
        >,
        http_body_util::Full<bytes::Bytes>,
    >,
>;

/// `answer` within `answers` (see [`trellis_sandbox::answers`]).
fn within(
    answers: &std::sync::Arc<trellis_sandbox::answers::AnswerBytes>,
    answer: Response,
) -> Sent {
    let (parts, body) = answer.into_parts();
    match answers.hold(body) {
        Ok(held) => hyper::Response::from_parts(parts, http_body_util::Either::Left(held)),
        Err(busy) => {
            let mut refused = hyper::Response::new(http_body_util::Either::Right(
                http_body_util::Full::new(bytes::Bytes::from(format!("{busy}\n"))),
            ));
            *refused.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
            refused.headers_mut().insert(
                hyper::header::RETRY_AFTER,
                hyper::header::HeaderValue::from_static("5"),
            );
            refused
        }
    }
}

/// Answers a connection past `--max-connections` with `503` and closes it.
async fn refuse_connection(mut stream: tokio::net::TcpStream, max: usize) {
    use tokio::io::AsyncWriteExt;
    let text = format!(
        "service unavailable: {max} connections are open, the limit \
         (`trellis mcp serve --max-connections`); try again later\n"
    );
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    // A client that does not read its answer does not hold the task.
    let _ = tokio::time::timeout(HEADER_READ_TIMEOUT, async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}

/// Reads the whole body of `request` (at most [`MAX_BODY_BYTES`], within
/// [`BODY_READ_TIMEOUT`]) before rmcp sees it: the request to hand on, and its body.
async fn read_body(
    request: hyper::Request<hyper::body::Incoming>,
) -> Result<
    (
        hyper::Request<http_body_util::Full<bytes::Bytes>>,
        bytes::Bytes,
    ),
    Response,
> {
    let (parts, body) = request.into_parts();
    let limited = http_body_util::Limited::new(body, MAX_BODY_BYTES);
    match tokio::time::timeout(BODY_READ_TIMEOUT, limited.collect()).await {
        Ok(Ok(collected)) => {
            let bytes = collected.to_bytes();
            // Parsed, a body of many small values costs far more than its bytes (a 4 MiB
            // array of digits is two million values): refused before anything parses it.
            let values = json_values(&bytes);
            if values > MAX_BODY_VALUES {
                return Err(plain_owned(
                    hyper::StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "payload too large: a request body may hold {MAX_BODY_VALUES} JSON \
                         values, this one holds about {values}"
                    ),
                ));
            }
            Ok((
                hyper::Request::from_parts(parts, http_body_util::Full::new(bytes.clone())),
                bytes,
            ))
        }
        Ok(Err(err)) if err.is::<http_body_util::LengthLimitError>() => Err(plain_owned(
            hyper::StatusCode::PAYLOAD_TOO_LARGE,
            format!("payload too large: a request body may have {MAX_BODY_BYTES} bytes"),
        )),
        Ok(Err(err)) => Err(plain_owned(
            hyper::StatusCode::BAD_REQUEST,
            format!("bad request: reading the body: {err}"),
        )),
        Err(_) => Err(plain_owned(
            hyper::StatusCode::REQUEST_TIMEOUT,
            format!(
                "request timeout: the body did not arrive within {} s of the headers",
                BODY_READ_TIMEOUT.as_secs()
            ),
        )),
    }
}

/// The answer to a request that does not reach the MCP service: a path other than
/// [`HTTP_PATH`] (404), a missing or wrong bearer token (401).
fn refuse<B>(request: &hyper::Request<B>, token: Option<&str>) -> Option<Response> {
    if request.uri().path() != HTTP_PATH {
        return Some(plain(
            hyper::StatusCode::NOT_FOUND,
            "not found: MCP is served at /mcp",
        ));
    }
    // A request names this server by its Host alone: an absolute target
    // (`POST http://other/mcp`) or a Host with userinfo (`other@127.0.0.1`) could pass the
    // Host check under another name.
    if request.uri().authority().is_some()
        || request
            .headers()
            .get_all(hyper::header::HOST)
            .iter()
            .any(|h| h.as_bytes().contains(&b'@'))
    {
        return Some(plain(
            hyper::StatusCode::BAD_REQUEST,
            "bad request: an absolute target or a Host with userinfo",
        ));
    }
    // One of each: the checks (rmcp's Host and Origin, the token here) read the first, and
    // another part could read a second one.
    for name in [
        hyper::header::HOST,
        hyper::header::ORIGIN,
        hyper::header::AUTHORIZATION,
    ] {
        if request.headers().get_all(&name).iter().count() > 1 {
            return Some(plain_owned(
                hyper::StatusCode::BAD_REQUEST,
                format!("bad request: more than one {name} header"),
            ));
        }
    }
    let token = token?;
    let given = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given.is_some_and(|given| same_secret(given.as_bytes(), token.as_bytes())) {
        return None;
    }
    let mut response = plain(
        hyper::StatusCode::UNAUTHORIZED,
        "unauthorized: send `Authorization: Bearer <token>`",
    );
    response.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        hyper::header::HeaderValue::from_static("Bearer"),
    );
    Some(response)
}

fn plain(status: hyper::StatusCode, text: &'static str) -> Response {
    plain_owned(status, text.to_string())
}

fn plain_owned(status: hyper::StatusCode, text: String) -> Response {
    let body = http_body_util::Full::new(bytes::Bytes::from(text)).boxed();
    let mut response = hyper::Response::new(body);
    *response.status_mut() = status;
    response
}

/// Compares two secrets in time that depends on their lengths only.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_safe_names() {
        assert!(is_client_safe_name("workspace__read_file"));
        assert!(!is_client_safe_name("workspace:read_file"));
        assert!(!is_client_safe_name(""));
        assert!(!is_client_safe_name(&"a".repeat(65)));
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
    }
}
