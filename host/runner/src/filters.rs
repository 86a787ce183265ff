//! Which tools a step's turns are offered (spec section 10).
//!
//! Plugin tools are named `server:tool` (server = plugin id). The filter of a step is built
//! once from its `selected_servers` and `selected_tools`; host-provided tools are enabled by
//! category from `enabled_custom_tools` (and the legacy `enabled_custom_tool_categories`).
//! All names are compared normalized, as [`normalize_tool_name`] does: lowercase, `-` -> `_`,
//! CamelCase -> snake_case.

use std::collections::{BTreeMap, BTreeSet};

use trellis_sandbox::plugins::normalize_tool_name;
use trellis_workflow::step_config::AgentConfigs;

/// The host tool that delegates to a route's sub-agent; offered exactly when the step has
/// routes.
pub const CALL_SUB_AGENT: &str = "call_sub_agent";
/// The host-tool category of `call_sub_agent`.
pub const DELEGATION_CATEGORY: &str = "delegation";
/// The built-in tool servers (bundled tool plugins): their tools are built-in tools of the
/// category of the same name, which `selected_servers` never removes; only `selected_tools`
/// and `enabled_custom_tools` entries naming the category filter them.
pub const BUILTIN_TOOL_SERVERS: &[&str] = &["workspace"];

/// The bundled shell's server: a built-in plugin, but offered only to a step that asks for
/// it (it widens what one call can do), through its own name in `selected_servers` /
/// `selected_tools` or through the original's category in `enabled_custom_tools`.
pub const SHELL_SERVER: &str = "shell";
/// The shell's one tool.
pub const SHELL_TOOL: &str = "execute_shell_command";
/// The original's category of the shell and of the patch tool.
pub const ORIGINAL_SHELL_CATEGORY: &str = "workspace_advanced";
/// The original's name of the patch tool: Trellis's `workspace:apply_patch`, which the
/// built-in `workspace` tools offer anyway.
pub const ORIGINAL_PATCH_TOOL: &str = "diff_patch_workspace_file";

fn norm(name: &str) -> String {
    normalize_tool_name(name.trim())
}

/// The filter on plugin tools of a step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginToolFilter {
    /// No `selected_servers` and no `selected_tools`: everything is in.
    open: bool,
    /// Servers listed as `server:*`.
    wildcard: BTreeSet<String>,
    /// Servers with specific `server:tool` entries, and those tools.
    specific: BTreeMap<String, BTreeSet<String>>,
    /// `selected_servers`.
    servers: BTreeSet<String>,
    /// `enabled_custom_tools` entries naming a built-in category: `None` for `category:*`,
    /// else the tools listed.
    builtin_categories: BTreeMap<String, Option<BTreeSet<String>>>,
    /// `enabled_custom_tools` names the shell through the original's category
    /// (`workspace_advanced`, `workspace_advanced:*`, `workspace_advanced:execute_shell_command`).
    original_shell: bool,
}

impl PluginToolFilter {
    /// The filter of a step's settings.
    pub fn new(selected_servers: &[String], selected_tools: &[String]) -> Self {
        let mut filter = PluginToolFilter {
            open: selected_servers.iter().all(|s| s.trim().is_empty())
                && selected_tools.iter().all(|s| s.trim().is_empty()),
            servers: selected_servers
                .iter()
                .filter(|s| !s.trim().is_empty())
                .map(|s| norm(s))
                .collect(),
            ..Default::default()
        };
        for entry in selected_tools {
            // A bare name with no server cannot select anything: it is ignored rather than
            // read as a server, which would widen the filter.
            let Some((server, tool)) = entry.split_once(':') else {
                continue;
            };
            let (server, tool) = (norm(server), tool.trim());
            if tool == "*" {
                filter.wildcard.insert(server);
            } else if !tool.is_empty() {
                filter
                    .specific
                    .entry(server)
                    .or_default()
                    .insert(norm(tool));
            }
        }
        filter
    }

    /// The filter of a step's agent settings: `selected_servers` and `selected_tools`, and
    /// the `enabled_custom_tools` entries that name a built-in category (`workspace:*`).
    pub fn from_configs(configs: &AgentConfigs) -> Self {
        let mut filter = Self::new(
            configs.selected_servers.as_deref().unwrap_or_default(),
            configs.selected_tools.as_deref().unwrap_or_default(),
        );
        let custom = configs.enabled_custom_tools.iter().flatten();
        let legacy = configs.enabled_custom_tool_categories.iter().flatten();
        for entry in custom.chain(legacy) {
            let (category, tool) = entry.split_once(':').unwrap_or((entry, "*"));
            let category = norm(category);
            if category == ORIGINAL_SHELL_CATEGORY
                && (tool.trim() == "*" || norm(tool) == SHELL_TOOL)
            {
                filter.original_shell = true;
            }
            if !BUILTIN_TOOL_SERVERS.contains(&category.as_str()) {
                continue;
            }
            let slot = filter
                .builtin_categories
                .entry(category)
                .or_insert_with(|| Some(BTreeSet::new()));
            match (tool.trim(), slot) {
                ("*", slot) => *slot = None,
                (tool, Some(tools)) if !tool.is_empty() => {
                    tools.insert(norm(tool));
                }
                _ => {}
            }
        }
        filter
    }

    /// Whether `server:tool` is offered. A built-in server's tools are in unless
    /// `selected_tools` or `enabled_custom_tools` name that server with specific tools
    /// (then only those). For other servers, in order: no filters lets everything in;
    /// `server:*` lets the whole server in; specific `server:tool` entries let only those
    /// tools of the server in (even when the server is in `selected_servers`); a selected
    /// server lets all its tools in; everything else is out.
    pub fn allows(&self, server: &str, tool: &str) -> bool {
        let server = norm(server);
        if server == SHELL_SERVER {
            return self.original_shell
                || self.servers.contains(&server)
                || self.wildcard.contains(&server)
                || self
                    .specific
                    .get(&server)
                    .is_some_and(|t| t.contains(&norm(tool)));
        }
        if BUILTIN_TOOL_SERVERS.contains(&server.as_str()) {
            return self.allows_builtin(&server, tool);
        }
        if self.open {
            return true;
        }
        if self.wildcard.contains(&server) {
            return true;
        }
        if let Some(tools) = self.specific.get(&server) {
            return tools.contains(&norm(tool));
        }
        self.servers.contains(&server)
    }

    fn allows_builtin(&self, server: &str, tool: &str) -> bool {
        let tool = norm(tool);
        let by_tools = self.wildcard.contains(server)
            || self.specific.get(server).is_none_or(|t| t.contains(&tool));
        let by_category = match self.builtin_categories.get(server) {
            None | Some(None) => true,
            Some(Some(tools)) => tools.contains(&tool),
        };
        by_tools && by_category
    }

    /// The `selected_servers` entries that are neither built-in nor among `loaded` (the
    /// plugin ids of the run): they select nothing.
    pub fn unknown_servers<'a>(&self, loaded: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        let loaded: BTreeSet<String> = loaded.into_iter().map(norm).collect();
        self.servers
            .iter()
            .filter(|s| !loaded.contains(*s) && !BUILTIN_TOOL_SERVERS.contains(&s.as_str()))
            .cloned()
            .collect()
    }

    /// Whether the step has no tool filters at all (every tool is in).
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Whether an external MCP server's tools may be offered: the step has no filters (every
    /// tool is in, as in the original system), or its settings name `server` itself, in
    /// `selected_servers`, as `server:*` or with specific tools.
    pub fn names_server(&self, server: &str) -> bool {
        let server = norm(server);
        self.open
            || self.servers.contains(&server)
            || self.wildcard.contains(&server)
            || self.specific.contains_key(&server)
    }

    /// Whether `server:tool` (a full name) is offered; a name without a server is not.
    pub fn allows_full_name(&self, full: &str) -> bool {
        full.split_once(':')
            .is_some_and(|(server, tool)| self.allows(server, tool))
    }
}

/// The filter on host-provided tools of a step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostToolFilter {
    /// An empty list enables all categories.
    open: bool,
    categories: BTreeSet<String>,
    tools: BTreeMap<String, BTreeSet<String>>,
    routes: bool,
}

impl HostToolFilter {
    /// The filter of `enabled_custom_tools` entries (`category:tool`, `category:*`, or a bare
    /// category as the legacy list has them) for a step that has routes or not.
    pub fn new<'a>(entries: impl IntoIterator<Item = &'a str>, has_routes: bool) -> Self {
        let mut filter = HostToolFilter {
            routes: has_routes,
            ..Default::default()
        };
        for entry in entries.into_iter().filter(|e| !e.trim().is_empty()) {
            match entry.split_once(':') {
                None => {
                    filter.categories.insert(norm(entry));
                }
                Some((category, tool)) if tool.trim() == "*" => {
                    filter.categories.insert(norm(category));
                }
                Some((category, tool)) => {
                    filter
                        .tools
                        .entry(norm(category))
                        .or_default()
                        .insert(norm(tool));
                }
            }
        }
        filter.open = filter.categories.is_empty() && filter.tools.is_empty();
        filter
    }

    /// The filter of a step's agent settings (`enabled_custom_tools` plus the legacy
    /// `enabled_custom_tool_categories`).
    pub fn from_configs(configs: &AgentConfigs, has_routes: bool) -> Self {
        let tools = configs.enabled_custom_tools.iter().flatten();
        let legacy = configs.enabled_custom_tool_categories.iter().flatten();
        Self::new(tools.chain(legacy).map(String::as_str), has_routes)
    }

    /// Whether the host tool `tool` of `category` is offered. `call_sub_agent` is offered
    /// exactly when the step has routes, whatever the list says.
    pub fn allows(&self, category: &str, tool: &str) -> bool {
        let tool = norm(tool);
        if tool == CALL_SUB_AGENT {
            return self.routes;
        }
        if self.open {
            return true;
        }
        let category = norm(category);
        self.categories.contains(&category)
            || self.tools.get(&category).is_some_and(|t| t.contains(&tool))
    }
}

/// The whole tool policy of a step: plugin tools and host tools.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolPolicy {
    /// Plugin tools.
    pub plugins: PluginToolFilter,
    /// Host-provided tools.
    pub host: HostToolFilter,
}

impl ToolPolicy {
    /// The policy of a step's agent settings.
    pub fn from_configs(configs: &AgentConfigs, has_routes: bool) -> Self {
        ToolPolicy {
            plugins: PluginToolFilter::from_configs(configs),
            host: HostToolFilter::from_configs(configs, has_routes),
        }
    }

    /// The plugin tools (as `(server, tool)` pairs) that pass the filter, in their order.
    pub fn select_plugin_tools<'a>(
        &self,
        tools: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Vec<(&'a str, &'a str)> {
        tools
            .into_iter()
            .filter(|(server, tool)| self.plugins.allows(server, tool))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn plugin_filter_table() {
        // (selected_servers, selected_tools, tool, offered)
        let cases: &[(&[&str], &[&str], &str, bool)] = &[
            (&[], &[], "workspace:read_file", true),
            (&[], &[], "anything:at_all", true),
            (&["workspace"], &[], "workspace:read_file", true),
            (&["workspace"], &[], "web:fetch", false),
            (&[], &["web:*"], "web:fetch", true),
            // Built-in tools are filtered only by entries naming their category.
            (&[], &["web:*"], "workspace:read_file", true),
            (&["aws"], &[], "workspace:read_file", true),
            (&["aws"], &[], "web:fetch", false),
            (&[], &["workspace:read_file"], "workspace:read_file", true),
            (&[], &["workspace:read_file"], "workspace:write_file", false),
            // A specific tool beats selected_servers for that server only.
            (
                &["workspace", "web"],
                &["workspace:read_file"],
                "workspace:write_file",
                false,
            ),
            (
                &["workspace", "web"],
                &["workspace:read_file"],
                "web:fetch",
                true,
            ),
            // The wildcard of a server is kept even when one of its tools is listed too.
            (&[], &["web:*", "web:fetch"], "web:search", true),
            // Normalized names on both sides.
            (&["Work-Space"], &[], "work_space:ReadFile", true),
            (&[], &["workspace:ReadFile"], "WORKSPACE:read-file", true),
            (&[], &["workspace:read_file"], "workspace:readFile", true),
            // A bare entry selects nothing and does not open the filter.
            (&[], &["read_file"], "web:fetch", false),
            (&[], &["read_file"], "workspace:read_file", true),
            // Blank lists count as no filter.
            (&[""], &[" "], "workspace:read_file", true),
        ];
        for (servers, tools, full, want) in cases {
            let filter = PluginToolFilter::new(&strings(servers), &strings(tools));
            assert_eq!(
                filter.allows_full_name(full),
                *want,
                "servers {servers:?} tools {tools:?}: {full}"
            );
        }
        assert!(!PluginToolFilter::new(&[], &[]).allows_full_name("no_server"));
    }

    #[test]
    fn host_filter_table() {
        // (entries, has_routes, category, tool, offered)
        let cases: &[(&[&str], bool, &str, &str, bool)] = &[
            (&[], false, "workspace_tools", "read_file", true),
            (&[], false, "human_tools", "ask", true),
            (
                &["workspace_tools:*"],
                false,
                "workspace_tools",
                "read_file",
                true,
            ),
            (&["workspace_tools:*"], false, "human_tools", "ask", false),
            (&["human_tools:ask"], false, "human_tools", "ask", true),
            (&["human_tools:ask"], false, "human_tools", "notify", false),
            (&["human-tools:Ask"], false, "HumanTools", "ask", true),
            (
                &["workspace_advanced"],
                false,
                "workspace_advanced",
                "run",
                true,
            ),
            (
                &["workspace_advanced:run:fast"],
                false,
                "workspace_advanced",
                "run:fast",
                true,
            ),
            // call_sub_agent follows the routes, never the list.
            (&[], false, "delegation", "call_sub_agent", false),
            (&[], true, "delegation", "call_sub_agent", true),
            (
                &["human_tools:*"],
                true,
                "delegation",
                "call_sub_agent",
                true,
            ),
            (
                &["delegation:*"],
                false,
                "delegation",
                "call_sub_agent",
                false,
            ),
        ];
        for (entries, routes, category, tool, want) in cases {
            let filter = HostToolFilter::new(entries.iter().copied(), *routes);
            assert_eq!(
                filter.allows(category, tool),
                *want,
                "{entries:?} routes={routes}: {category}:{tool}"
            );
        }
    }

    #[test]
    fn enabled_custom_tools_select_built_in_categories() {
        let configs = |entries: &[&str]| AgentConfigs {
            selected_servers: Some(strings(&["aws"])),
            enabled_custom_tools: Some(strings(entries)),
            ..Default::default()
        };
        let offered = |entries: &[&str], tool: &str| {
            PluginToolFilter::from_configs(&configs(entries)).allows("workspace", tool)
        };
        assert!(offered(&[], "write_file"));
        assert!(offered(&["workflow_db:*", "human_tools:ask"], "write_file"));
        assert!(offered(&["workspace:*"], "write_file"));
        assert!(offered(&["workspace:read_file"], "read_file"));
        assert!(!offered(&["workspace:read_file"], "write_file"));
        // The shell is offered only when asked for, by the original's category or its name.
        let shell = |entries: &[&str], servers: &[&str], tools: &[&str]| {
            let configs = AgentConfigs {
                selected_servers: Some(strings(servers)),
                selected_tools: Some(strings(tools)),
                enabled_custom_tools: Some(strings(entries)),
                ..Default::default()
            };
            PluginToolFilter::from_configs(&configs).allows("shell", "execute_shell_command")
        };
        assert!(!shell(&[], &[], &[]));
        assert!(!shell(&["workspace:*"], &[], &[]));
        assert!(!shell(
            &["workspace_advanced:diff_patch_workspace_file"],
            &[],
            &[]
        ));
        assert!(shell(&["workspace_advanced:*"], &[], &[]));
        assert!(shell(&["workspace_advanced"], &[], &[]));
        assert!(shell(
            &["workspace_advanced:execute_shell_command"],
            &[],
            &[]
        ));
        assert!(shell(&[], &["shell"], &[]));
        assert!(shell(&[], &[], &["shell:execute_shell_command"]));
        assert!(shell(&[], &[], &["shell:*"]));
        assert!(!shell(&[], &[], &["workspace:*"]));
        let filter = PluginToolFilter::from_configs(&configs(&[]));
        assert_eq!(filter.unknown_servers(["workspace", "csv"]), ["aws"]);
        assert!(filter.unknown_servers(["aws"]).is_empty());
    }

    #[test]
    fn policy_reads_the_step_config_including_legacy_categories() {
        let configs = AgentConfigs {
            selected_tools: Some(strings(&["workspace:read_file", "web:*"])),
            enabled_custom_tools: Some(strings(&["human_tools:ask"])),
            enabled_custom_tool_categories: Some(strings(&["workspace_browser"])),
            ..Default::default()
        };
        let policy = ToolPolicy::from_configs(&configs, false);
        let catalog = [
            ("workspace", "read_file"),
            ("workspace", "write_file"),
            ("web", "fetch"),
            ("other", "x"),
        ];
        assert_eq!(
            policy.select_plugin_tools(catalog),
            [("workspace", "read_file"), ("web", "fetch")]
        );
        assert!(policy.host.allows("human_tools", "ask"));
        assert!(policy.host.allows("workspace_browser", "open"));
        assert!(!policy.host.allows("human_tools", "notify"));
        assert!(!policy.host.allows("x", CALL_SUB_AGENT));
        assert!(
            ToolPolicy::from_configs(&configs, true)
                .host
                .allows("x", CALL_SUB_AGENT)
        );
    }
}
