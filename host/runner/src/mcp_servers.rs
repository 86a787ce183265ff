//! External MCP servers as tool sources: servers the operator configured
//! ([`config`]: `--mcp-config FILE`, else `mcp_servers.json` of the user config folder),
//! named by a workspace's `selected_servers` / `selected_tools` (never defined by it).
//!
//! These servers run **outside the sandbox**. The runner decides which a run needs (the
//! servers its steps name, [`named_servers`]), starts them in its preflight through the
//! [`ServerStarter`] its front end gives it (the MCP client is `trellis_mcp::client`; a
//! front end without one gives [`NoServers`], and a run naming a server then fails before
//! anything changes), checks the tools named against what they list, offers their tools
//! (`KEY:TOOL`, marked unsandboxed) only to the steps that name `KEY`, and stops them when
//! it ends.

pub mod config;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;

use anyhow::Result;
use serde_json::Value;
use trellis_sandbox::llm::ToolDefinition;
use trellis_sandbox::plugins::normalize_tool_name;
use trellis_workflow::Workspace;
use trellis_workflow::plan::StepKind;

use crate::filters::PluginToolFilter;

pub use config::{McpConfig, ServerConfig, Transport};

/// Put before the description of every tool of an external server, as the model sees it.
pub const UNSANDBOXED_MARK: &str = "[unsandboxed: external MCP server]";

/// How long one call of an external server's tool may take (a plugin's call takes its
/// [`trellis_sandbox::Limits::timeout`]); no longer than the turn's tool calls have left.
pub const EXTERNAL_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// The future a [`ToolServers`] or [`ServerStarter`] method gives.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The external servers a run started: what the preflight checks, and what the driver
/// offers the model and calls.
pub trait ToolServers: Send + Sync + std::fmt::Debug {
    /// The tools of each started server, by key (for the preflight's tool checks).
    fn tool_names(&self) -> BTreeMap<String, Vec<String>>;

    /// The key of the started server a tool name `KEY:TOOL` belongs to.
    fn server_of(&self, full_name: &str) -> Option<&str>;

    /// The definitions of the tools `offer(key, tool)` lets in, marked with
    /// [`UNSANDBOXED_MARK`].
    fn definitions(&self, offer: &dyn Fn(&str, &str) -> bool) -> Vec<ToolDefinition>;

    /// Calls tool `full_name` (`KEY:TOOL`) with `args`: the text of its result, or its
    /// error. A result (or error) longer than `max_bytes` is refused.
    fn call<'a>(
        &'a self,
        full_name: &'a str,
        args: Value,
        max_bytes: usize,
    ) -> BoxFuture<'a, Result<Value, String>>;

    /// Stops every server.
    fn stop(&mut self) -> BoxFuture<'_, ()>;
}

/// Starts the servers of `config` with the keys `keys` (and lists their tools): the MCP
/// client a front end gives the runtime.
pub trait ServerStarter: Send + Sync + std::fmt::Debug {
    /// The started servers; any that fails is an error naming it, the others stopped.
    fn start<'a>(
        &'a self,
        config: &'a McpConfig,
        keys: &'a BTreeSet<String>,
    ) -> BoxFuture<'a, Result<Box<dyn ToolServers>>>;
}

/// No server, and a starter that starts none: a run whose steps name a server fails in its
/// preflight saying so.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoServers;

impl ToolServers for NoServers {
    fn tool_names(&self) -> BTreeMap<String, Vec<String>> {
        BTreeMap::new()
    }

    fn server_of(&self, _: &str) -> Option<&str> {
        None
    }

    fn definitions(&self, _: &dyn Fn(&str, &str) -> bool) -> Vec<ToolDefinition> {
        Vec::new()
    }

    fn call<'a>(
        &'a self,
        name: &'a str,
        _: Value,
        _: usize,
    ) -> BoxFuture<'a, Result<Value, String>> {
        Box::pin(async move { Err(format!("{name:?}: no MCP server is running")) })
    }

    fn stop(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

impl ServerStarter for NoServers {
    fn start<'a>(
        &'a self,
        _: &'a McpConfig,
        keys: &'a BTreeSet<String>,
    ) -> BoxFuture<'a, Result<Box<dyn ToolServers>>> {
        Box::pin(async move {
            if keys.is_empty() {
                return Ok(Box::new(NoServers) as Box<dyn ToolServers>);
            }
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            anyhow::bail!(
                "the steps name the external MCP servers {}, and this front end starts no MCP \
                 server",
                keys.join(", ")
            )
        })
    }
}

/// The configured server keys a workspace's step configs name (normalized): in
/// `selected_servers`, or as the server of a `selected_tools` entry. Every configured key
/// when an agent step has no tool filters: such a step gets every tool.
pub fn named_servers(ws: &Workspace, config: &McpConfig) -> BTreeSet<String> {
    let unfiltered = ws
        .plan
        .steps
        .iter()
        .filter(|s| {
            matches!(
                s.kind,
                StepKind::MessageSequence(_) | StepKind::Regular | StepKind::TodoTask(_)
            )
        })
        .any(|s| {
            ws.step_configs
                .get(&s.id)
                .and_then(|c| c.agent_configs.as_ref())
                .is_none_or(|c| PluginToolFilter::from_configs(c).is_open())
        });
    if unfiltered {
        return config.servers().map(|(key, _)| key.to_string()).collect();
    }
    let mut keys = BTreeSet::new();
    for configs in ws
        .step_configs
        .steps
        .iter()
        .filter_map(|s| s.agent_configs.as_ref())
    {
        let servers = configs
            .selected_servers
            .iter()
            .flatten()
            .map(String::as_str);
        let tools = configs
            .selected_tools
            .iter()
            .flatten()
            .filter_map(|t| t.split_once(':').map(|(s, _)| s));
        for server in servers.chain(tools) {
            let key = normalize_tool_name(server.trim());
            if config.get(&key).is_some() {
                keys.insert(key);
            }
        }
    }
    keys
}

/// Files a workspace may hold that look like MCP server definitions: never read.
const WORKSPACE_LOOKALIKES: &[&str] = &[
    config::SERVERS_FILE,
    config::USER_SERVERS_FILE,
    ".mcp.json",
    "mcp.json",
];

/// A warning for each file at the top of the workspace that looks like an MCP server
/// definition: a workspace may name servers, never define them, so it is ignored.
pub fn workspace_server_files(ws: &Workspace) -> Vec<String> {
    WORKSPACE_LOOKALIKES
        .iter()
        .filter(|name| ws.fs.kind(name).ok().flatten().is_some())
        .map(|name| {
            format!(
                "{name} in the workspace is ignored: MCP servers are configured by the operator \
                 (--mcp-config FILE, or {} in the user config folder), a workspace may only name them",
                config::SERVERS_FILE
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_front_end_without_a_client_refuses_a_run_that_names_a_server() {
        let config = McpConfig::empty();
        let none = NoServers.start(&config, &BTreeSet::new()).await.unwrap();
        assert!(none.tool_names().is_empty());
        let named = BTreeSet::from(["notes".to_string()]);
        let err = NoServers.start(&config, &named).await.err().unwrap();
        assert!(
            err.to_string()
                .contains("name the external MCP servers notes"),
            "{err}"
        );
    }
}
