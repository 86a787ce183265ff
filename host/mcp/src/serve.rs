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

mod http;
mod sessions;
mod stdio_lines;

pub use http::{HttpAccess, HttpLimits, HttpServer};

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
    /// The folder the calls write in and its quota on disk ([`ToolServer::quota`]).
    quota: Option<(Arc<std::path::Path>, u64)>,
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
            quota: None,
            limits,
            tools: Arc::new(tools),
            calls: Arc::new(tokio::sync::Semaphore::new(default_max_concurrent_calls())),
            max_calls: default_max_concurrent_calls(),
            max_waiting: DEFAULT_MAX_WAITING_CALLS,
            waiting: Arc::default(),
        })
    }

    /// Bounds what the calls write together to what is left of `quota` bytes on disk for
    /// the folder `root` (the one the grant's folders are in), measured as each call begins:
    /// the calls going on at once write from one count, so many calls cannot each write
    /// their whole budget again.
    pub fn quota(mut self, root: &std::path::Path, quota: u64) -> Self {
        self.quota = Some((Arc::from(root), quota));
        self
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
        let grant = match &self.quota {
            Some((root, quota)) => Arc::new(
                (*self.grant).clone().with_turn_writes(
                    &trellis_sandbox::capabilities::DbWriteBudget::for_run(
                        self.limits.fs,
                        root,
                        *quota,
                    )
                    .0,
                ),
            ),
            None => self.grant.clone(),
        };
        let outcome = self
            .registry
            .call_tool_cancellable(full_name, &args, &grant, &self.limits, &context.ct)
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
}
