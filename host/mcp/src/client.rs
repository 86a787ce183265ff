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
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use rmcp::RoleClient;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, ContentBlock};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::Value;
use tokio::io::AsyncRead;
use trellis_runner::mcp_servers::{
    BoxFuture, McpConfig, ServerConfig, ServerStarter, ToolServers, Transport, UNSANDBOXED_MARK,
};
use trellis_sandbox::llm::ToolDefinition;
use trellis_sandbox::plugins::{MAX_LIST_TOOLS_BYTES, MAX_TOOLS, normalize_tool_name};

/// How long a server may take to start and list its tools.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one tool call may take.
pub const CALL_TIMEOUT: Duration = trellis_runner::mcp_servers::EXTERNAL_CALL_TIMEOUT;
/// How long a server is given to stop before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest message (one line) read from a stdio server: four times a call's output
/// limit (4 MiB), so a result at the limit fits twice (servers send it as text and as
/// structured content) with its JSON escapes and framing.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

mod transport;

pub use transport::{MAX_MESSAGE_DEPTH, MAX_MESSAGE_VALUES};
use transport::{http_client, install_crypto_provider, log_stderr, message_limits, over_lines};

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
