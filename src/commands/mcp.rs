//! `trellis mcp`: serves tool plugins to MCP clients.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Subcommand;
use trellis_mcp::serve::{
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_SESSIONS, DEFAULT_MAX_WAITING_CALLS, HTTP_PATH,
    HttpAccess, HttpLimits, HttpServer, ToolServer, default_max_concurrent_calls,
};
use trellis_sandbox::Engine;

use super::{CacheArgs, PluginDirs, registry, tool};

/// The environment variable that holds the HTTP transport's bearer token.
const TOKEN_VAR: &str = "TRELLIS_TOKEN";

/// Subcommands of `trellis mcp`.
#[derive(Subcommand, Debug)]
pub enum McpCommand {
    /// Serve the tools of the loaded plugins to MCP clients.
    ///
    /// Speaks MCP on stdin and stdout, or with --http as streamable HTTP at
    /// `http://ADDR/mcp`. Each tool is offered as `<plugin>__<tool>` (e.g.
    /// `workspace__read_file`) with its schema and behaviour hints. Every call runs
    /// in a fresh sandbox that sees ROOT as `/` with only the --read and --write
    /// folders in it, as `trellis tool call` does: the grant is set here, and no
    /// client can widen it. A tool's error, or arguments that do not match its
    /// schema, come back as a result with `isError: true`; a client's cancellation
    /// stops the call.
    ///
    /// HTTP binds ADDR (a port alone means 127.0.0.1:PORT) and accepts only requests
    /// whose Host header names a loopback address, the bound address or an
    /// --allow-host name. Off loopback it needs a bearer token in $TRELLIS_TOKEN,
    /// which every request must then send (`Authorization: Bearer <token>`); on
    /// loopback the token is checked when it is set.
    ///
    /// At most --max-concurrent-calls calls run at once (from every client together);
    /// a call over it waits for a slot for up to --timeout seconds, then comes back
    /// with `isError: true` saying the server is busy. Over HTTP at most
    /// --max-sessions sessions live at once (a new one past it gets 503; a session
    /// ends when its client deletes it or after 5 minutes idle), as many requests
    /// without a session in progress (503 past it), and at most
    /// --max-connections connections are open (one past it gets 503). A request has
    /// 10 s to send its headers and 30 s more for its body (408), of at most 4 MiB (413).
    ///
    /// Examples:
    ///   trellis mcp serve --root examples/ticket-triage --read knowledgebase
    ///   trellis mcp serve --http 8808 --root . --write notes --tool workspace:write_file
    #[command(verbatim_doc_comment)]
    Serve {
        /// Serve streamable HTTP on ADDR (`HOST:PORT`, or a port on 127.0.0.1) instead of stdio.
        #[arg(long, value_name = "ADDR")]
        http: Option<String>,
        /// Offer only this tool, `server:tool` (repeatable) [default: every tool].
        #[arg(long = "tool", value_name = "SERVER:TOOL")]
        tools: Vec<String>,
        /// Folder the plugins see as `/`; --read and --write are relative to it.
        #[arg(long, default_value = ".", value_name = "ROOT")]
        root: PathBuf,
        /// Grant a folder read-only (repeatable).
        #[arg(long = "read", value_name = "DIR")]
        read: Vec<String>,
        /// Grant a folder read-write (repeatable).
        #[arg(long = "write", value_name = "DIR")]
        write: Vec<String>,
        /// Also accept this name in the Host header of HTTP requests (repeatable).
        #[arg(long = "allow-host", value_name = "HOST", requires = "http")]
        allow_hosts: Vec<String>,
        /// Stop each call after this many seconds.
        #[arg(long, default_value_t = 30.0, value_name = "SECS")]
        timeout: f64,
        /// Run at most N tool calls at once; more wait for a slot [default: the number of CPUs].
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        max_concurrent_calls: Option<u32>,
        /// Let at most N tool calls wait for a slot, however many CPUs there are; a call
        /// past them is refused at once as a result with `isError: true`.
        #[arg(long, default_value_t = DEFAULT_MAX_WAITING_CALLS as u32, value_name = "N",
              value_parser = clap::value_parser!(u32).range(0..=100_000))]
        max_waiting_calls: u32,
        /// Keep at most N HTTP sessions alive at once, and at most N requests without a
        /// session in progress.
        #[arg(long, default_value_t = DEFAULT_MAX_SESSIONS as u32, value_name = "N",
              value_parser = clap::value_parser!(u32).range(1..), requires = "http")]
        max_sessions: u32,
        /// Keep at most N HTTP connections open at once.
        #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS as u32, value_name = "N",
              value_parser = clap::value_parser!(u32).range(1..), requires = "http")]
        max_connections: u32,
        /// MiB of answers being sent at once over HTTP (an answer waits in memory until its
        /// client reads it); past it an answer is refused with 503.
        #[arg(long, default_value_t = 256, value_name = "MIB",
              value_parser = clap::value_parser!(u64).range(1..=65_536), requires = "http")]
        max_answer_mib: u64,
        /// Memory limit of each plugin instance (all its memories and tables together), in MiB.
        #[arg(long, default_value_t = 256, value_name = "MIB")]
        memory: usize,
        /// MiB ROOT may take on disk (default 16384), with --write: ROOT is measured as each
        /// call begins, and the calls going on write from what is left of it (each also at
        /// most 1 GiB); a write past it fails, naming it.
        #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=1_073_741_824))]
        max_workspace_mib: Option<u64>,
        #[command(flatten)]
        plugins: PluginDirs,
        #[command(flatten)]
        cache: CacheArgs,
    },
}

impl McpCommand {
    /// Its compile-cache options.
    pub fn cache(&self) -> &CacheArgs {
        match self {
            McpCommand::Serve { cache, .. } => cache,
        }
    }

    /// The folder its plugins are granted parts of.
    pub fn root(&self) -> &Path {
        match self {
            McpCommand::Serve { root, .. } => root,
        }
    }
}

/// Runs a `trellis mcp` subcommand.
pub async fn run(engine: &Engine, command: McpCommand) -> Result<ExitCode> {
    match command {
        McpCommand::Serve {
            http,
            tools,
            root,
            read,
            write,
            allow_hosts,
            timeout,
            max_concurrent_calls,
            max_waiting_calls,
            max_sessions,
            max_connections,
            max_answer_mib,
            memory,
            max_workspace_mib,
            plugins,
            ..
        } => {
            tool::check_root(&root)?;
            let grant = tool::grant(&root, &read, &write)?;
            let limits = tool::limits(timeout, memory)?;
            let registry = Arc::new(registry(engine, &plugins).await?);
            let writes = !write.is_empty();
            let mut server = ToolServer::new(registry, grant, limits, &tools)?;
            if writes {
                server = server.quota(
                    &root,
                    max_workspace_mib
                        .map_or(trellis_runner::driver::DEFAULT_WORKSPACE_BYTES, |mib| {
                            mib << 20
                        }),
                );
            }
            let server = server
                .max_concurrent_calls(
                    max_concurrent_calls.map_or_else(default_max_concurrent_calls, |n| n as usize),
                )
                .max_waiting_calls(max_waiting_calls as usize);
            anyhow::ensure!(
                server.tool_names().next().is_some(),
                "no tool to serve: no loaded tool plugin offers one"
            );
            match http {
                None => server.serve_stdio().await?,
                Some(addr) => {
                    let addr = http_addr(&addr)?;
                    let access = HttpAccess {
                        token: std::env::var(TOKEN_VAR).ok(),
                        extra_hosts: allow_hosts,
                    };
                    let limits = HttpLimits {
                        max_sessions: max_sessions as usize,
                        max_connections: max_connections as usize,
                        answer_bytes: max_answer_mib << 20,
                    };
                    let server = HttpServer::bind(server, addr, access, limits).await?;
                    // Tests and scripts read the chosen port from this line.
                    eprintln!(
                        "trellis: serving MCP at http://{}{HTTP_PATH}",
                        server.local_addr()?
                    );
                    server
                        .serve(async {
                            let _ = tokio::signal::ctrl_c().await;
                        })
                        .await?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `--http ADDR`: `HOST:PORT`, or a port alone on 127.0.0.1.
fn http_addr(text: &str) -> Result<SocketAddr> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse().with_context(|| {
        format!("--http {text:?}: expected HOST:PORT with an IP address (e.g. 127.0.0.1:8808), or a port")
    })
}
