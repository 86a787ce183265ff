//! The MCP client of a run: starts the external servers the operator configured and a run
//! names, lists their tools, calls them and stops them ([`McpClient`], the runner's
//! [`ServerStarter`]).
//!
//! These servers run **outside the sandbox**: a stdio server is a process of the operator's
//! user started with a cleared environment plus its own `env`; a streamable HTTP server is
//! reached with its own `headers`. A stdio server is killed with the run.
//!
//! What a stdio server sends is read a line (one message) at a time, each at most
//! [`MAX_MESSAGE_BYTES`]: a longer one is not held but refused as it streams in, which
//! closes that server's connection and fails its calls with an error naming it.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use rmcp::RoleClient;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, ContentBlock};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::Value;
use tokio::io::{AsyncRead, ReadBuf};
use trellis_runner::mcp_servers::{
    BoxFuture, McpConfig, ServerConfig, ServerStarter, ToolServers, Transport, UNSANDBOXED_MARK,
};
use trellis_sandbox::llm::ToolDefinition;
use trellis_sandbox::plugins::{MAX_LIST_TOOLS_BYTES, MAX_TOOLS, normalize_tool_name};

/// How long a server may take to start and list its tools.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one tool call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a server is given to stop before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest message (one line) read from a stdio server: four times a call's output
/// limit (4 MiB), so a result at the limit fits twice (servers send it as text and as
/// structured content) with its JSON escapes and framing.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// The runner's [`ServerStarter`]: starts servers with this module's client.
#[derive(Debug, Default, Clone, Copy)]
pub struct McpClient;

impl ServerStarter for McpClient {
    fn start<'a>(
        &'a self,
        config: &'a McpConfig,
        keys: &'a BTreeSet<String>,
    ) -> BoxFuture<'a, Result<Box<dyn ToolServers>>> {
        Box::pin(async move {
            McpServers::start(config, keys)
                .await
                .map(|s| Box::new(s) as Box<dyn ToolServers>)
        })
    }
}

impl ToolServers for McpServers {
    fn tool_names(&self) -> BTreeMap<String, Vec<String>> {
        McpServers::tool_names(self)
    }

    fn server_of(&self, full_name: &str) -> Option<&str> {
        McpServers::server_of(self, full_name)
    }

    fn definitions(&self, offer: &dyn Fn(&str, &str) -> bool) -> Vec<ToolDefinition> {
        McpServers::definitions(self, offer)
    }

    fn call<'a>(
        &'a self,
        full_name: &'a str,
        args: Value,
        max_bytes: usize,
    ) -> BoxFuture<'a, Result<Value, String>> {
        Box::pin(McpServers::call(self, full_name, args, max_bytes))
    }

    fn stop(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(McpServers::stop(self))
    }
}

/// One tool of a started server.
#[derive(Debug, Clone)]
pub struct McpTool {
    /// `KEY:TOOL`, as the model calls it.
    pub full_name: String,
    /// The tool's own name, as the server calls it.
    pub name: String,
    /// The server's description of it.
    pub description: String,
    /// Its arguments' JSON Schema.
    pub input_schema: Value,
}

/// Requests a server may send the host (`roots/list`, `ping`, sampling, elicitation) over
/// its whole connection: past them it is disconnected, its call failing, so a flood of them
/// cannot grow the host.
pub const MAX_SERVER_REQUESTS: u64 = 1000;

/// The host's side of a server's requests: answered as rmcp's plain client does (no roots,
/// no sampling, no elicitation), each counted; past [`MAX_SERVER_REQUESTS`] the
/// connection is ended (`over` fires) and each further one refused.
#[derive(Clone, Default)]
struct Limited {
    requests: Arc<std::sync::atomic::AtomicU64>,
    over: tokio_util::sync::CancellationToken,
}

impl Limited {
    fn count(&self) -> Result<(), rmcp::ErrorData> {
        if self.requests.fetch_add(1, Ordering::SeqCst) >= MAX_SERVER_REQUESTS {
            self.over.cancel();
            return Err(rmcp::ErrorData::internal_error(
                format!("more than {MAX_SERVER_REQUESTS} requests from the server"),
                None,
            ));
        }
        Ok(())
    }
}

// Roots and sampling are deprecated in the protocol; a server may still ask for them.
#[allow(deprecated)]
impl rmcp::ClientHandler for Limited {
    async fn ping(
        &self,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<(), rmcp::ErrorData> {
        self.count()
    }

    async fn create_message(
        &self,
        _params: rmcp::model::CreateMessageRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, rmcp::ErrorData> {
        self.count()?;
        Err(rmcp::ErrorData::method_not_found::<
            rmcp::model::CreateMessageRequestMethod,
        >())
    }

    async fn list_roots(
        &self,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ListRootsResult, rmcp::ErrorData> {
        self.count()?;
        Ok(rmcp::model::ListRootsResult::default())
    }

    async fn create_elicitation(
        &self,
        _request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        self.count()?;
        Err(rmcp::ErrorData::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            "elicitation: the host answers no questions of a server",
            None,
        ))
    }

    async fn on_custom_request(
        &self,
        request: rmcp::model::CustomRequest,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CustomResult, rmcp::ErrorData> {
        self.count()?;
        Err(rmcp::ErrorData::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            request.method,
            None,
        ))
    }
}

/// The pids of the stdio servers' processes this host holds now (alive, or ended and not yet
/// reaped: a pid here is never another process's).
static LIVE: std::sync::Mutex<std::collections::BTreeSet<u32>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Kills every stdio server process this host started and still holds: for an exit that
/// runs no destructors (`trellis run`'s third Ctrl-C), which would leave them running.
pub fn kill_servers() {
    let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    for pid in live.iter() {
        if let Ok(pid) = i32::try_from(*pid) {
            // SAFETY: kill(2) on a pid this process spawned and has not reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// A stdio server's process, in [`LIVE`] while it is held; killed when dropped.
struct ServerProcess {
    child: tokio::process::Child,
    pid: Option<u32>,
}

impl ServerProcess {
    fn new(child: tokio::process::Child) -> Self {
        let pid = child.id();
        if let Some(pid) = pid {
            LIVE.lock().unwrap_or_else(|e| e.into_inner()).insert(pid);
        }
        ServerProcess { child, pid }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // Killed first (the child was made with `kill_on_drop`): the pid is released
        // only once it is no longer a process this host could kill by mistake.
        let _ = self.child.start_kill();
        if let Some(pid) = self.pid {
            LIVE.lock().unwrap_or_else(|e| e.into_inner()).remove(&pid);
        }
    }
}

struct Running {
    service: RunningService<RoleClient, Limited>,
    /// Fires when the server sent more requests than the host answers.
    over: tokio_util::sync::CancellationToken,
    tools: Vec<McpTool>,
    /// A stdio server's process, killed when dropped.
    process: Option<ServerProcess>,
    /// Set when a stdio server sent a message over [`MAX_MESSAGE_BYTES`].
    oversized: Arc<AtomicBool>,
}

/// The servers a run started, by normalized key.
#[derive(Default)]
pub struct McpServers {
    running: BTreeMap<String, Running>,
}

impl std::fmt::Debug for McpServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.running.keys()).finish()
    }
}

impl McpServers {
    /// No server.
    pub fn none() -> Self {
        McpServers::default()
    }

    /// Starts (or connects to) the servers of `config` with the keys `keys`, and lists their
    /// tools. Any that fails is an error naming it; those already started are stopped.
    pub async fn start(config: &McpConfig, keys: &BTreeSet<String>) -> Result<Self> {
        if !keys.is_empty() {
            install_crypto_provider();
        }
        let mut servers = McpServers::none();
        for key in keys {
            let Some(server) = config.get(key) else {
                continue;
            };
            let started = tokio::time::timeout(START_TIMEOUT, start_one(key, server)).await;
            let started = match started {
                Ok(Ok(running)) => running,
                Ok(Err(e)) => {
                    servers.stop().await;
                    return Err(e.context(format!(
                        "MCP server {:?} ({}) could not be started",
                        server.key,
                        server.file.display()
                    )));
                }
                Err(_) => {
                    servers.stop().await;
                    anyhow::bail!(
                        "MCP server {:?} ({}) did not answer within {} s",
                        server.key,
                        server.file.display(),
                        START_TIMEOUT.as_secs()
                    );
                }
            };
            servers.running.insert(key.clone(), started);
        }
        Ok(servers)
    }

    /// One server `key` that speaks on `reader` and `writer` as a stdio server does on its
    /// pipes (no process is started), initialized and with its tools listed: what reading a
    /// server's answers does, for the fuzz targets.
    #[doc(hidden)]
    pub async fn over_pipes<R, W>(key: &str, reader: R, writer: W) -> Result<Self>
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let oversized = Arc::new(AtomicBool::new(false));
        let limited = Limited::default();
        let service = over_lines(reader, writer, &oversized, limited.clone()).await?;
        let running = listed(key, service, None, oversized, limited.over).await?;
        let mut servers = McpServers::none();
        servers.running.insert(normalize_tool_name(key), running);
        Ok(servers)
    }

    /// Whether no server runs.
    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// The tools of each started server, by key (for the preflight's tool checks).
    pub fn tool_names(&self) -> BTreeMap<String, Vec<String>> {
        self.running
            .iter()
            .map(|(k, r)| (k.clone(), r.tools.iter().map(|t| t.name.clone()).collect()))
            .collect()
    }

    /// Every tool of every started server.
    pub fn tools(&self) -> impl Iterator<Item = (&str, &McpTool)> {
        self.running
            .iter()
            .flat_map(|(k, r)| r.tools.iter().map(move |t| (k.as_str(), t)))
    }

    /// The key of the started server a tool name `KEY:TOOL` belongs to.
    pub fn server_of(&self, full_name: &str) -> Option<&str> {
        let (server, _) = full_name.split_once(':')?;
        let key = normalize_tool_name(server.trim());
        self.running.get_key_value(&key).map(|(k, _)| k.as_str())
    }

    /// The definitions of the tools `offer(key, tool)` lets in, marked unsandboxed.
    pub fn definitions(&self, offer: impl Fn(&str, &str) -> bool) -> Vec<ToolDefinition> {
        self.tools()
            .filter(|(key, tool)| offer(key, &tool.name))
            .map(|(_, tool)| ToolDefinition {
                name: tool.full_name.clone(),
                description: format!("{UNSANDBOXED_MARK} {}", tool.description)
                    .trim_end()
                    .to_string(),
                parameters: tool.input_schema.clone(),
            })
            .collect()
    }

    /// Calls tool `full_name` (`KEY:TOOL`) with `args`: the text of its result, or its error.
    /// A result (or error) longer than `max_bytes` is refused, as a plugin's larger output is.
    pub async fn call(
        &self,
        full_name: &str,
        args: Value,
        max_bytes: usize,
    ) -> Result<Value, String> {
        let (server, tool) = full_name
            .split_once(':')
            .ok_or_else(|| format!("{full_name:?} names no server"))?;
        let key = normalize_tool_name(server.trim());
        let running = self
            .running
            .get(&key)
            .ok_or_else(|| format!("MCP server {server:?} is not running"))?;
        let wanted = normalize_tool_name(tool.trim());
        let tool = running
            .tools
            .iter()
            .find(|t| normalize_tool_name(&t.name) == wanted)
            .ok_or_else(|| format!("MCP server {server:?} has no tool {tool:?}"))?;
        let arguments = match args {
            Value::Object(map) => map,
            Value::Null => Default::default(),
            other => return Err(format!("the arguments must be a JSON object, not {other}")),
        };
        let params = CallToolRequestParams::new(tool.name.clone()).with_arguments(arguments);
        let call = tokio::time::timeout(CALL_TIMEOUT, running.service.call_tool(params));
        let result = tokio::select! {
            biased;
            () = running.over.cancelled() => {
                return Err(format!(
                    "MCP server {server:?} sent more than {MAX_SERVER_REQUESTS} requests of its \
                     own (roots, sampling, pings): it is disconnected for the rest of the run"
                ));
            }
            result = call => result,
        };
        let result = result
            .map_err(|_| {
                format!(
                    "MCP server {server:?}: no answer within {} s",
                    CALL_TIMEOUT.as_secs()
                )
            })?
            .map_err(|e| {
                if running.oversized.load(Ordering::Relaxed) {
                    format!(
                        "MCP server {server:?} sent {}: it was not read, and the server is \
                         disconnected for the rest of the run",
                        message_limits()
                    )
                } else {
                    format!("MCP server {server:?}: {e}")
                }
            })?;
        let mut parts = Vec::new();
        for block in &result.content {
            match block {
                ContentBlock::Text(t) => parts.push(t.text.clone()),
                other => parts.push(serde_json::to_string(other).unwrap_or_default()),
            }
        }
        let text = match (parts.is_empty(), &result.structured_content) {
            (true, Some(structured)) => structured.to_string(),
            _ => parts.join("\n"),
        };
        if text.len() > max_bytes {
            return Err(format!(
                "MCP server {server:?}: its result of {} bytes is larger than the limit of {max_bytes} bytes",
                text.len()
            ));
        }
        if result.is_error == Some(true) {
            Err(text)
        } else {
            Ok(Value::String(text))
        }
    }

    /// Stops every server: closes its connection, and a stdio server's process is killed
    /// when it does not exit by itself.
    pub async fn stop(&mut self) {
        for (key, running) in std::mem::take(&mut self.running) {
            let mut late = tokio::time::timeout(STOP_TIMEOUT, running.service.cancel())
                .await
                .is_err();
            // Its stdin is closed now: a well-behaved server exits.
            if let Some(mut process) = running.process
                && tokio::time::timeout(STOP_TIMEOUT, process.child.wait())
                    .await
                    .is_err()
            {
                late = true;
                let _ = process.child.kill().await;
            }
            if late {
                tracing::warn!("MCP server {key:?} did not stop in time: killed");
            }
        }
    }
}

/// reqwest is built without a TLS provider of its own: rustls's ring provider, the one the
/// rest of the host links, serves HTTPS servers.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A stdio server's output, refused (an error, and `oversized` set) once a line grows past
/// `max` bytes or [`MAX_MESSAGE_VALUES`] JSON values: nothing past the cap is kept, and no
/// line that would cost far more parsed than its bytes is parsed.
struct LineCap<R> {
    inner: R,
    max: usize,
    line: usize,
    values: trellis_sandbox::json_values::ValueCounter,
    oversized: Arc<AtomicBool>,
}

/// The JSON values one message of an external server may hold.
pub const MAX_MESSAGE_VALUES: usize = trellis_sandbox::json_values::MAX_FILE_VALUES;

/// How deep one message of an external server may nest arrays and objects: the most the
/// JSON parser of the MCP client reads (it refuses the 128th level).
pub const MAX_MESSAGE_DEPTH: usize = 127;

/// What a message refused by [`LineCap`] was over, as the errors name it.
fn message_limits() -> String {
    format!(
        "a message longer than the limit of {MAX_MESSAGE_BYTES} bytes, of more than \
         {MAX_MESSAGE_VALUES} JSON values or nested more than {MAX_MESSAGE_DEPTH} levels deep"
    )
}

impl<R: AsyncRead + Unpin> AsyncRead for LineCap<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let too_long = || std::io::Error::new(std::io::ErrorKind::InvalidData, message_limits());
        if this.oversized.load(Ordering::Relaxed) {
            return Poll::Ready(Err(too_long()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        let mut parts = buf.filled()[before..].split(|&b| b == b'\n').peekable();
        while let Some(part) = parts.next() {
            this.line += part.len();
            this.values.feed(part);
            if this.line > this.max
                || this.values.values() > MAX_MESSAGE_VALUES
                || this.values.deepest() > MAX_MESSAGE_DEPTH
            {
                this.oversized.store(true, Ordering::Relaxed);
                buf.set_filled(before);
                return Poll::Ready(Err(too_long()));
            }
            if parts.peek().is_some() {
                this.line = 0;
                this.values = Default::default();
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// What of a server's stderr is logged: each line up to `STDERR_LINE_BYTES` (the rest of it
/// counted), and `STDERR_TOTAL_BYTES` in all; past that the output is read and dropped, so
/// the server never blocks on a full pipe and never makes the host hold its output.
const STDERR_LINE_BYTES: usize = 4096;
/// What each logged line counts against `STDERR_TOTAL_BYTES` beyond its bytes, so a flood of
/// empty lines is not logged line by line without end.
const STDERR_LINE_COST: usize = 64;
const STDERR_TOTAL_BYTES: usize = 1 << 20;

/// Logs the stderr of server `key` (at debug level) within the caps above.
async fn log_stderr(key: String, mut stderr: impl tokio::io::AsyncRead + Unpin) {
    use tokio::io::AsyncReadExt;
    let mut chunk = vec![0u8; 8192];
    let mut line: Vec<u8> = Vec::new();
    let (mut cut, mut logged) = (0usize, 0usize);
    let flush = |line: &mut Vec<u8>, cut: &mut usize, logged: &mut usize| {
        if *logged < STDERR_TOTAL_BYTES {
            // A line costs a log record whatever its length: empty lines count too.
            *logged += line.len() + STDERR_LINE_COST;
            let text = String::from_utf8_lossy(line);
            if *cut > 0 {
                tracing::debug!(server = %key, "{text} [cut: {cut} more bytes]");
            } else {
                tracing::debug!(server = %key, "{text}");
            }
            if *logged >= STDERR_TOTAL_BYTES {
                tracing::debug!(server = %key, "stderr: the rest is not logged");
            }
        }
        line.clear();
        *cut = 0;
    };
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for part in chunk[..n].split_inclusive(|b| *b == b'\n') {
            let (text, ends) = match part.strip_suffix(b"\n") {
                Some(text) => (text, true),
                None => (part, false),
            };
            let room = STDERR_LINE_BYTES.saturating_sub(line.len());
            line.extend_from_slice(&text[..text.len().min(room)]);
            cut += text.len().saturating_sub(room);
            if ends {
                flush(&mut line, &mut cut, &mut logged);
            }
        }
    }
    if !line.is_empty() || cut > 0 {
        flush(&mut line, &mut cut, &mut logged);
    }
}

async fn start_one(key: &str, server: &ServerConfig) -> Result<Running> {
    let oversized = Arc::new(AtomicBool::new(false));
    let limited = Limited::default();
    let mut process = None;
    let service = match &server.transport {
        Transport::Stdio { command, args, env } => {
            let mut child = tokio::process::Command::new(command)
                .args(args)
                .env_clear()
                .envs(env)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("starting {command:?}"))?;
            let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                anyhow::bail!("starting {command:?}: its stdin or stdout was not piped");
            };
            if let Some(stderr) = child.stderr.take() {
                tokio::spawn(log_stderr(key.to_string(), stderr));
            }
            process = Some(ServerProcess::new(child));
            over_lines(stdout, stdin, &oversized, limited.clone()).await?
        }
        Transport::Http { url, headers } => {
            let mut custom = std::collections::HashMap::new();
            for (name, value) in headers {
                let name = http::HeaderName::from_bytes(name.as_bytes())
                    .with_context(|| format!("header {name:?}"))?;
                let value = http::HeaderValue::from_str(value)
                    .with_context(|| format!("the value of header {name}"))?;
                custom.insert(name, value);
            }
            let transport = StreamableHttpClientTransport::with_client(
                http_client(url)?,
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom),
            );
            limited
                .clone()
                .serve(transport)
                .await
                .map_err(|e| anyhow!("connecting to {url}: {e}"))?
        }
    };
    listed(key, service, process, oversized, limited.over).await
}

/// The client side of a stdio server's pipes: what it sends read a line at a time, each at
/// most [`MAX_MESSAGE_BYTES`] (`oversized` set past that), and the session initialized.
async fn over_lines<R, W>(
    reader: R,
    writer: W,
    oversized: &Arc<AtomicBool>,
    limited: Limited,
) -> Result<RunningService<RoleClient, Limited>>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let reader = LineCap {
        inner: reader,
        max: MAX_MESSAGE_BYTES,
        line: 0,
        values: Default::default(),
        oversized: oversized.clone(),
    };
    // The cap is LineCap's, which refuses a long line instead of skipping it.
    let transport =
        AsyncRwTransport::<RoleClient, _, _>::new(reader, writer).with_max_line_length(usize::MAX);
    limited
        .serve(transport)
        .await
        .map_err(|e| anyhow!("initializing: {e}"))
}

/// A started server with the tools it lists.
async fn listed(
    key: &str,
    service: RunningService<RoleClient, Limited>,
    process: Option<ServerProcess>,
    oversized: Arc<AtomicBool>,
    over: tokio_util::sync::CancellationToken,
) -> Result<Running> {
    let tools = list_tools(&service)
        .await
        .map_err(|e| {
            if oversized.load(Ordering::Relaxed) {
                anyhow!(
                    "listing its tools: it sent {}, which was not read",
                    message_limits()
                )
            } else {
                e
            }
        })?
        .into_iter()
        .map(|t| McpTool {
            full_name: format!("{key}:{}", t.name),
            name: t.name.to_string(),
            description: t.description.as_deref().unwrap_or_default().to_string(),
            input_schema: Value::Object((*t.input_schema).clone()),
        })
        .collect();
    Ok(Running {
        service,
        over,
        tools,
        process,
        oversized,
    })
}

/// The tools a server lists, page by page, held to a plugin's loading limits: at most
/// [`MAX_TOOLS`] tools and [`MAX_LIST_TOOLS_BYTES`] of them as JSON, in at most
/// [`MAX_TOOLS`] pages. A server past one (a page after page of tools, a cursor that never
/// ends) is refused as soon as it crosses it, before more is asked or held: every tool is
/// offered to the model in every request of the steps that name the server.
async fn list_tools(
    service: &RunningService<RoleClient, Limited>,
) -> Result<Vec<rmcp::model::Tool>> {
    let mut tools = Vec::new();
    let (mut bytes, mut pages) = (0usize, 0usize);
    let mut cursor = None;
    loop {
        pages += 1;
        if pages > MAX_TOOLS {
            anyhow::bail!("listing its tools: more than {MAX_TOOLS} pages of tools");
        }
        let page = service
            .list_tools(Some(
                rmcp::model::PaginatedRequestParams::default().with_cursor(cursor),
            ))
            .await
            .map_err(|e| anyhow!("listing its tools: {e}"))?;
        for tool in page.tools {
            bytes += serde_json::to_vec(&tool).map_or(0, |b| b.len());
            tools.push(tool);
            if tools.len() > MAX_TOOLS {
                anyhow::bail!(
                    "listing its tools: more than {MAX_TOOLS} tools (the limit of tools a \
                     plugin may list)"
                );
            }
            if bytes > MAX_LIST_TOOLS_BYTES {
                anyhow::bail!(
                    "listing its tools: the tools listed are more than {MAX_LIST_TOOLS_BYTES} \
                     bytes (the limit of a plugin's tool list)"
                );
            }
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(tools);
        }
    }
}

/// The HTTP client of a streamable HTTP server at `url`. A proxy from the environment
/// (`HTTP_PROXY`, ...) is never used for a loopback host (a proxy cannot reach this
/// machine's loopback, and would see what the operator meant to keep local) nor for a
/// plain `http://` URL (the proxy would read the headers, a bearer token among them, in
/// clear); an `https://` URL may go through one (a tunnel it cannot read). Redirects are
/// followed only to the same origin, 307 and 308 alone (which keep the body), at most 10.
fn http_client(url: &str) -> Result<reqwest::Client> {
    let parsed = reqwest::Url::parse(url).with_context(|| format!("the url {url:?}"))?;
    let origin = parsed.origin();
    let mut builder = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .redirect(reqwest::redirect::Policy::custom(move |attempt| {
            let keeps_body = matches!(attempt.status().as_u16(), 307 | 308);
            if keeps_body && attempt.url().origin() == origin && attempt.previous().len() < 10 {
                attempt.follow()
            } else {
                attempt.stop()
            }
        }));
    if bypasses_proxy(&parsed) {
        builder = builder.no_proxy();
    }
    builder
        .build()
        .with_context(|| format!("making the HTTP client of {url}"))
}

/// Whether the client of `url` leaves out a proxy from the environment: a loopback host in
/// any spelling (`localhost.`, `127.1`, `[::ffff:127.0.0.1]`), or plain `http://`.
fn bypasses_proxy(url: &reqwest::Url) -> bool {
    url.scheme() == "http"
        || trellis_sandbox::llm::is_loopback_host(url.host_str().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_loopback_and_plain_http_bypass_the_environment_proxy() {
        for url in [
            "https://localhost/mcp",
            "https://localhost./mcp",
            "https://LOCALHOST:8443/mcp",
            "https://127.0.0.1/mcp",
            "https://127.1:8443/mcp",
            "https://0x7f.1/mcp",
            "https://[::1]:8443/mcp",
            "https://[::ffff:127.0.0.1]:8443/mcp",
            "http://mcp.example.com/mcp",
        ] {
            let parsed = reqwest::Url::parse(url).unwrap();
            assert!(bypasses_proxy(&parsed), "{url}");
        }
        for url in [
            "https://mcp.example.com/mcp",
            "https://10.0.0.1/mcp",
            "https://[::ffff:10.0.0.1]/mcp",
            "https://localhost.example.com/mcp",
        ] {
            let parsed = reqwest::Url::parse(url).unwrap();
            assert!(!bypasses_proxy(&parsed), "{url}");
        }
    }
}
