//! Whether the tools a step config names exist, checked before anything runs (`trellis run`'s
//! preflight and `trellis validate --plugins`).
//!
//! - A `selected_tools` or `enabled_custom_tools` entry `server:tool` whose server is loaded
//!   but has no such tool is an error, with the closest name when one is close (a typo would
//!   otherwise leave the agent without the tool, failing its gate for no visible reason).
//! - A server that is not loaded (`selected_servers`, or the server of a `selected_tools`
//!   entry) is a warning saying how to load it: the original skips unknown servers, and the
//!   step runs with the tools it has.
//! - A step whose config names tools but ends up with no plugin tool says so.
//! - A configured external MCP server ([`crate::mcp_servers`]) counts as loaded: its tools
//!   are checked when it runs (a run's preflight), not by `validate`, which starts nothing.

use std::collections::{BTreeMap, BTreeSet};

use trellis_sandbox::plugins::{PluginRegistry, normalize_tool_name};
use trellis_workflow::diagnostics::{Diagnostic, Diagnostics, JsonPath, Severity, did_you_mean};
use trellis_workflow::{AgentConfigs, Workspace};

use crate::db_tools::{MUTATE_WORKFLOW_DB, QUERY_WORKFLOW_DB, WORKFLOW_DB_CATEGORY};
use crate::filters::{
    BUILTIN_TOOL_SERVERS, ORIGINAL_PATCH_TOOL, ORIGINAL_SHELL_CATEGORY, SHELL_TOOL, ToolPolicy,
};

/// The tools of each loaded tool plugin, by server id (names as the plugin lists them).
fn servers(registry: &PluginRegistry) -> BTreeMap<String, Vec<String>> {
    let mut servers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for plugin in registry.plugins() {
        for listing in plugin.tool_listings() {
            if let Some((server, tool)) = listing.name.split_once(':') {
                servers
                    .entry(normalize_tool_name(server))
                    .or_default()
                    .push(tool.to_string());
            }
        }
    }
    servers
}

/// The diagnostics of every step config entry's tool names against the plugins of
/// `registry` (bundled and `--plugins`), each at its JSON path in the step config file.
pub fn check_step_tools(ws: &Workspace, registry: &PluginRegistry) -> Diagnostics {
    check_step_tools_with(ws, registry, &BTreeMap::new())
}

/// [`check_step_tools`], with external MCP servers too: by key, the tools of a started one
/// (checked like a plugin's), or `None` for one configured but not started (any tool name
/// is accepted).
pub fn check_step_tools_with(
    ws: &Workspace,
    registry: &PluginRegistry,
    external: &BTreeMap<String, Option<Vec<String>>>,
) -> Diagnostics {
    let mut servers = servers(registry);
    let mut unchecked = BTreeSet::new();
    for (key, tools) in external {
        match tools {
            Some(tools) => {
                servers.insert(key.clone(), tools.clone());
            }
            None => {
                unchecked.insert(key.clone());
            }
        }
    }
    let file = ws.step_config_file.display().to_string();
    let mut diags = Diagnostics::new();
    for (i, entry) in ws.step_configs.steps.iter().enumerate() {
        let Some(configs) = &entry.agent_configs else {
            continue;
        };
        let mut out = StepChecks {
            file: &file,
            step: &entry.id,
            base: JsonPath::root().key("steps").index(i).key("agent_configs"),
            servers: &servers,
            unchecked: &unchecked,
            external,
            diags: &mut diags,
            unloaded: BTreeSet::new(),
        };
        out.check(configs, registry);
    }
    diags
}

/// The errors of `selected_tools` entries naming a tool that a started external MCP server
/// (`servers`: its tools by key) does not list.
pub fn check_external_tools(
    ws: &Workspace,
    servers: &BTreeMap<String, Vec<String>>,
) -> Diagnostics {
    let file = ws.step_config_file.display().to_string();
    let mut diags = Diagnostics::new();
    let (unchecked, external) = (BTreeSet::new(), BTreeMap::new());
    for (i, entry) in ws.step_configs.steps.iter().enumerate() {
        let Some(configs) = &entry.agent_configs else {
            continue;
        };
        let base = JsonPath::root().key("steps").index(i).key("agent_configs");
        let mut out = StepChecks {
            file: &file,
            step: &entry.id,
            base: base.clone(),
            servers,
            unchecked: &unchecked,
            external: &external,
            diags: &mut diags,
            unloaded: BTreeSet::new(),
        };
        for (j, entry) in configs.selected_tools.iter().flatten().enumerate() {
            if let Some((server, tool)) = entry.split_once(':')
                && servers.contains_key(&normalize_tool_name(server.trim()))
            {
                let path = base.key("selected_tools").index(j);
                out.tool_exists(server, tool, path, "selected_tools");
            }
        }
    }
    diags
}

struct StepChecks<'a> {
    file: &'a str,
    step: &'a str,
    base: JsonPath,
    servers: &'a BTreeMap<String, Vec<String>>,
    /// External servers whose tools are not known (not started).
    unchecked: &'a BTreeSet<String>,
    external: &'a BTreeMap<String, Option<Vec<String>>>,
    diags: &'a mut Diagnostics,
    /// Unloaded servers already warned about for this step.
    unloaded: BTreeSet<String>,
}

impl StepChecks<'_> {
    fn push(&mut self, path: JsonPath, severity: Severity, message: String) {
        self.diags.push(Diagnostic {
            file: self.file.to_string(),
            json_path: path.to_string(),
            step_id: Some(self.step.to_string()),
            message,
            severity,
        });
    }

    fn check(&mut self, configs: &AgentConfigs, registry: &PluginRegistry) {
        for (j, server) in configs.selected_servers.iter().flatten().enumerate() {
            let path = self.base.key("selected_servers").index(j);
            self.server_loaded(server, path);
        }
        for (j, entry) in configs.selected_tools.iter().flatten().enumerate() {
            let path = self.base.key("selected_tools").index(j);
            let Some((server, tool)) = entry.split_once(':') else {
                self.push(
                    path,
                    Severity::Warning,
                    format!(
                        "{entry:?} names no server: write \"server:tool\" (e.g. \"workspace:read_file\") or \"server:*\""
                    ),
                );
                continue;
            };
            if self.server_loaded(server, path.clone()) {
                self.tool_exists(server, tool, path, "selected_tools");
            }
        }
        let custom = configs.enabled_custom_tools.iter().flatten();
        for (j, entry) in custom.enumerate() {
            let path = self.base.key("enabled_custom_tools").index(j);
            let (category, tool) = entry.split_once(':').unwrap_or((entry, "*"));
            let category = normalize_tool_name(category.trim());
            if BUILTIN_TOOL_SERVERS.contains(&category.as_str()) {
                self.tool_exists(&category, tool, path, "enabled_custom_tools");
            } else if category == ORIGINAL_SHELL_CATEGORY {
                let known = [SHELL_TOOL, ORIGINAL_PATCH_TOOL];
                if tool.trim() != "*" && !known.contains(&normalize_tool_name(tool.trim()).as_str())
                {
                    self.push(
                        path,
                        Severity::Warning,
                        format!(
                            "the {ORIGINAL_SHELL_CATEGORY} tool {:?} is not offered: Trellis has {SHELL_TOOL} (the bundled shell) and {ORIGINAL_PATCH_TOOL} (the workspace tools' apply_patch) in this category",
                            tool.trim()
                        ),
                    );
                }
            } else if category == WORKFLOW_DB_CATEGORY {
                let tool = tool.trim();
                if tool != "*" && tool != QUERY_WORKFLOW_DB && tool != MUTATE_WORKFLOW_DB {
                    let hint = did_you_mean(tool, [QUERY_WORKFLOW_DB, MUTATE_WORKFLOW_DB])
                        .map(|c| format!(" (did you mean \"{WORKFLOW_DB_CATEGORY}:{c}\"?)"))
                        .unwrap_or_default();
                    self.push(
                        path,
                        Severity::Error,
                        format!(
                            "the {WORKFLOW_DB_CATEGORY} category has no tool {tool:?}{hint}: its tools are {QUERY_WORKFLOW_DB} and {MUTATE_WORKFLOW_DB}"
                        ),
                    );
                }
            }
        }
        let names_tools = configs.selected_servers.iter().flatten().next().is_some()
            || configs.selected_tools.iter().flatten().next().is_some();
        if names_tools {
            let policy = ToolPolicy::from_configs(configs, false);
            let offered = registry
                .plugins()
                .flat_map(|p| p.tool_listings())
                .any(|l| policy.plugins.allows_full_name(&l.name))
                || self.external.iter().any(|(key, tools)| match tools {
                    None => policy.plugins.names_server(key),
                    Some(tools) => tools
                        .iter()
                        .any(|t| policy.plugins.names_server(key) && policy.plugins.allows(key, t)),
                });
            if !offered {
                self.push(
                    self.base.clone(),
                    Severity::Warning,
                    "its selected_servers and selected_tools leave the step's turns no plugin tool"
                        .to_string(),
                );
            }
        }
    }

    /// Whether `server` is loaded; a warning saying how to load it when not (once per step).
    fn server_loaded(&mut self, server: &str, path: JsonPath) -> bool {
        let id = normalize_tool_name(server.trim());
        if self.servers.contains_key(&id)
            || self.unchecked.contains(&id)
            || BUILTIN_TOOL_SERVERS.contains(&id.as_str())
        {
            return true;
        }
        if self.unloaded.insert(id.clone()) {
            self.push(
                path,
                Severity::Warning,
                format!(
                    "server {server:?} is not loaded, so it gives the step no tool: load its plugin with --plugins DIR (the folder holding its plugin.json), or configure it as an MCP server; the step runs with the tools it has"
                ),
            );
        }
        false
    }

    /// An error when loaded `server` has no tool `tool` (`*` is every tool).
    fn tool_exists(&mut self, server: &str, tool: &str, path: JsonPath, field: &str) {
        let tool = tool.trim();
        if tool == "*" {
            return;
        }
        let id = normalize_tool_name(server.trim());
        if self.unchecked.contains(&id) {
            return;
        }
        let tools = self.servers.get(&id).map(Vec::as_slice).unwrap_or_default();
        if tools
            .iter()
            .any(|t| normalize_tool_name(t) == normalize_tool_name(tool))
        {
            return;
        }
        let hint = did_you_mean(tool, tools.iter().map(String::as_str))
            .map(|c| format!(" (did you mean \"{id}:{c}\"?)"))
            .unwrap_or_default();
        self.push(
            path,
            Severity::Error,
            format!(
                "{field} names \"{id}:{tool}\", but plugin {id:?} has no tool {tool:?}{hint}; its tools: {}",
                tools.join(", ")
            ),
        );
    }
}
