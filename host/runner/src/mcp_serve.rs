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
//! Over HTTP the server answers at `/mcp` only. It keeps rmcp's `Host` check against DNS
//! rebinding, and when a bearer token is set (required off loopback) a request without it
//! is refused before anything else looks at it. A request body is capped (rmcp's 4 MiB), and
//! a connection that does not finish its headers within [`HEADER_READ_TIMEOUT`] is closed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use trellis_sandbox::plugins::PluginKind;
use trellis_sandbox::{Grant, Limits, PluginRegistry};

/// Separates the plugin id from the tool name in an MCP tool name (`workspace__read_file`):
/// clients accept only `^[a-zA-Z0-9_-]{1,64}$`, so the `:` of `server:tool` cannot stay.
pub const NAME_SEPARATOR: &str = "__";

/// The path the HTTP transport answers at.
pub const HTTP_PATH: &str = "/mcp";

/// How long a connection may take to send a request's headers before it is closed, so a
/// client that trickles them (slowloris) cannot hold connections open for ever.
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the server offers and with which grant; cheap to clone (one per HTTP session).
#[derive(Clone)]
pub struct ToolServer {
    registry: Arc<PluginRegistry>,
    grant: Arc<Grant>,
    limits: Limits,
    /// MCP name to the tool's `server:tool` name and its listing.
    tools: Arc<BTreeMap<String, (String, Tool)>>,
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
            grant: Arc::new(grant),
            limits,
            tools: Arc::new(tools),
        })
    }

    /// The MCP names of the offered tools.
    pub fn tool_names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// Serves one client on the process's stdin and stdout until it closes them.
    pub async fn serve_stdio(self) -> Result<()> {
        let running = self
            .serve(rmcp::transport::stdio_pipes())
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

/// The loopback names every HTTP server accepts in `Host`.
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// A bound HTTP server, not yet serving.
#[derive(Debug)]
pub struct HttpServer {
    listener: tokio::net::TcpListener,
    server: ToolServer,
    access: HttpAccess,
}

impl HttpServer {
    /// Binds `addr`. Off loopback a token is required, and the address itself joins the
    /// hosts a request may name.
    pub async fn bind(
        server: ToolServer,
        addr: SocketAddr,
        mut access: HttpAccess,
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
            StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
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
            .with_cancellation_token(shutdown.child_token());
        let server = self.server.clone();
        let service = StreamableHttpService::new(
            move || Ok(server.clone()),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        let token = self.access.token.map(Arc::<str>::from);
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
            let service = service.clone();
            let token = token.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let handler = hyper::service::service_fn(move |request| {
                    let mut service = service.clone();
                    let token = token.clone();
                    async move {
                        if let Some(refused) = refuse(&request, token.as_deref()) {
                            return Ok::<_, std::convert::Infallible>(refused);
                        }
                        tower_service::Service::call(&mut service, request).await
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
                }
            });
        }
    }
}

type Response =
    hyper::Response<http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>>;

/// The answer to a request that does not reach the MCP service: a path other than
/// [`HTTP_PATH`] (404), a missing or wrong bearer token (401).
fn refuse<B>(request: &hyper::Request<B>, token: Option<&str>) -> Option<Response> {
    if request.uri().path() != HTTP_PATH {
        return Some(plain(
            hyper::StatusCode::NOT_FOUND,
            "not found: MCP is served at /mcp",
        ));
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
    use http_body_util::BodyExt;
    let body = http_body_util::Full::new(bytes::Bytes::from_static(text.as_bytes())).boxed();
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
