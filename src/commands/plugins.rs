//! `trellis plugins`: lists and inspects plugins.

// What is printed here was written by models, guests or workspaces: escaped.
use crate::terminal::println_shown as println;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Subcommand;
use trellis_sandbox::plugins::PluginSource;
use trellis_sandbox::{Engine, PluginRegistry};

use super::{CacheArgs, McpConfigArg, PluginDirs, registry};
use trellis_runner::mcp_servers::{McpConfig, ServerConfig, Transport};

/// Subcommands of `trellis plugins`.
#[derive(Subcommand, Debug)]
pub enum PluginsCommand {
    /// List the bundled plugins and those found in --plugins folders.
    List {
        #[command(flatten)]
        plugins: PluginDirs,
        #[command(flatten)]
        mcp: McpConfigArg,
        #[command(flatten)]
        cache: CacheArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show a plugin's tools and the JSON Schema of their arguments.
    Inspect {
        /// Plugin id, e.g. `workspace`.
        id: String,
        #[command(flatten)]
        plugins: PluginDirs,
        #[command(flatten)]
        cache: CacheArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a `trellis plugins` subcommand.
pub async fn run(engine: &Engine, command: PluginsCommand) -> Result<ExitCode> {
    match command {
        PluginsCommand::List {
            plugins, mcp, json, ..
        } => {
            // One bad plugin does not hide the others: it is listed with its error.
            let mut registry = PluginRegistry::with_bundled(engine).await?;
            let mut failures = Vec::new();
            for dir in &plugins.dirs {
                for outcome in registry.load_dir_each(dir).await? {
                    if let Err(err) = outcome.result {
                        failures.push((outcome.manifest, format!("{err:#}")));
                    }
                }
            }
            let mcp = super::mcp_config(&mcp, &registry)?;
            list_plugins(&registry, &failures, &mcp, json)?;
            Ok(ExitCode::SUCCESS)
        }
        PluginsCommand::Inspect {
            id, plugins, json, ..
        } => {
            let registry = registry(engine, &plugins).await?;
            inspect_plugin(&registry, &id, json)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

impl PluginsCommand {
    /// Its compile-cache options.
    pub fn cache(&self) -> &CacheArgs {
        match self {
            PluginsCommand::List { cache, .. } | PluginsCommand::Inspect { cache, .. } => cache,
        }
    }
}

/// Lists the loaded plugins, then each plugin that failed to load (its manifest
/// and error; in JSON an object with `manifest` and `error` instead of `id`).
fn list_plugins(
    registry: &PluginRegistry,
    failures: &[(PathBuf, String)],
    mcp: &McpConfig,
    json: bool,
) -> Result<()> {
    if json {
        let mut list: Vec<_> = registry
            .plugins()
            .map(|p| {
                let m = p.manifest();
                serde_json::json!({
                    "id": m.id, "kind": m.kind.as_str(), "version": m.version,
                    "description": m.description, "source": p.source().to_string(),
                    "tools": p.tools().iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
                })
            })
            .collect();
        list.extend(mcp.servers().map(|(_, server)| {
            let (transport, target) = server_target(server);
            serde_json::json!({
                "id": server.key, "kind": "mcp_server", "transport": transport,
                "target": target, "description": server.description,
                "source": server.file.display().to_string(), "sandboxed": false,
            })
        }));
        list.extend(failures.iter().map(|(manifest, error)| {
            serde_json::json!({"manifest": manifest.display().to_string(), "error": error})
        }));
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    println!(
        "{:<16} {:<13} {:<9} {:<12} {:<6} DESCRIPTION",
        "ID", "KIND", "VERSION", "SOURCE", "TOOLS"
    );
    for plugin in registry.plugins() {
        let m = plugin.manifest();
        let source = match plugin.source() {
            PluginSource::Bundled => "bundled",
            PluginSource::File(_) => "third-party",
        };
        println!(
            "{:<16} {:<13} {:<9} {:<12} {:<6} {}",
            m.id,
            m.kind.as_str(),
            m.version,
            source,
            plugin.tools().len(),
            m.description
        );
    }
    // External MCP servers are not started here: they have no tool count until a run.
    for (_, server) in mcp.servers() {
        let (transport, target) = server_target(server);
        let description = if server.description.is_empty() {
            format!("{transport}: {target}")
        } else {
            format!("{} ({transport}: {target})", server.description)
        };
        println!(
            "{:<16} {:<13} {:<9} {:<12} {:<6} {}",
            server.key, "mcp-server", "-", "UNSANDBOXED", "-", description
        );
    }
    for (manifest, error) in failures {
        println!("{}  error: {error}", manifest.display());
    }
    Ok(())
}

/// The transport of an external server and what it reaches: the command line (without
/// its environment) or the URL (without its headers).
fn server_target(server: &ServerConfig) -> (&'static str, String) {
    let target = match &server.transport {
        Transport::Stdio { command, args, .. } => std::iter::once(command.as_str())
            .chain(args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        Transport::Http { url, .. } => url.clone(),
    };
    (server.transport.name(), target)
}

fn inspect_plugin(registry: &PluginRegistry, id: &str, json: bool) -> Result<()> {
    let plugin = registry.get(id).with_context(|| {
        let ids: Vec<_> = registry
            .plugins()
            .map(|p| p.manifest().id.as_str())
            .collect();
        format!("no plugin `{id}` (loaded: {})", ids.join(", "))
    })?;
    let m = plugin.manifest();
    if json {
        let value = serde_json::json!({
            "id": m.id, "kind": m.kind.as_str(), "version": m.version,
            "description": m.description, "source": plugin.source().to_string(),
            "tools": plugin.tool_listings(),
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    println!("{} {} ({}, {})", m.id, m.version, m.kind, plugin.source());
    println!("{}", m.description);
    for tool in plugin.tool_listings() {
        let mut hints = Vec::new();
        if tool.read_only {
            hints.push("read-only");
        }
        if tool.destructive {
            hints.push("destructive");
        }
        if tool.idempotent {
            hints.push("idempotent");
        }
        println!("\n{}  [{}]", tool.name, hints.join(", "));
        println!("  {}", tool.description);
        let schema = serde_json::to_string_pretty(tool.input_schema)?;
        for line in schema.lines() {
            println!("    {line}");
        }
    }
    Ok(())
}
