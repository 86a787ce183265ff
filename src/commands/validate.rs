//! `trellis validate`: checks a workspace's plan.json, step_config.json and workflow.json.

// What is printed here was written by models, guests or workspaces: escaped.
use crate::terminal::println_shown as println;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use trellis_runner::mcp_servers::workspace_server_files;
use trellis_runner::tool_check::check_step_tools_with;
use trellis_sandbox::Engine;
use trellis_workflow::Workspace;
use trellis_workflow::diagnostics::{Diagnostic, Severity};
use trellis_workflow::foreach_sql::check_foreach_queries;

use super::{CacheArgs, McpConfigArg, PluginDirs, plural, registry};

/// Arguments of `trellis validate`.
#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// The workspace folder.
    pub(crate) workspace: PathBuf,
    /// Check the run-specific step config of this run folder (e.g. `iteration-0`).
    #[arg(long, value_name = "FOLDER")]
    run: Option<String>,
    /// The plugins the step configs' tool names are checked against (with the bundled ones).
    #[command(flatten)]
    pub(crate) plugins: PluginDirs,
    /// Server keys of the external MCP servers are accepted as tool servers (nothing is
    /// started, so their tool names are checked by `trellis run`).
    #[command(flatten)]
    pub(crate) mcp: McpConfigArg,
    #[command(flatten)]
    pub(crate) cache: CacheArgs,
}

/// Prints every problem found and a count. Exit status 1 when there is an error; `Err` when
/// the plugins to check tool names against cannot be loaded.
pub async fn run(engine: &Engine, args: &ValidateArgs) -> Result<ExitCode> {
    let root = &args.workspace;
    let diagnostics = match Workspace::open_run(root, args.run.as_deref()) {
        Ok(ws) => {
            let mut all = ws.warnings.clone();
            all.0.extend(check_foreach_queries(&ws).0);
            // Tool names are checked against the bundled plugins and those of --plugins,
            // loaded only when a step config names tools.
            if names_tools(&ws) {
                let registry = registry(engine, &args.plugins).await?;
                let mcp = super::mcp_config(&args.mcp, &registry)?;
                let external = mcp
                    .servers()
                    .map(|(key, _)| (key.to_string(), None))
                    .collect();
                all.0
                    .extend(check_step_tools_with(&ws, &registry, &external).0);
            }
            for warning in workspace_server_files(&ws) {
                all.push(Diagnostic {
                    file: ws.root.display().to_string(),
                    json_path: String::new(),
                    step_id: None,
                    message: warning,
                    severity: Severity::Warning,
                });
            }
            all
        }
        Err(diagnostics) => diagnostics,
    };
    for line in diagnostics.lines() {
        println!("{line}");
    }
    let errors = diagnostics.errors().count();
    let warnings = diagnostics.warnings().count();
    println!(
        "{}: {errors} error{}, {warnings} warning{}",
        root.display(),
        plural(errors),
        plural(warnings)
    );
    Ok(if errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Whether any step config names servers or tools (then plugins must be loaded to check them).
fn names_tools(ws: &Workspace) -> bool {
    ws.step_configs
        .steps
        .iter()
        .filter_map(|s| s.agent_configs.as_ref())
        .any(|c| {
            [
                &c.selected_servers,
                &c.selected_tools,
                &c.enabled_custom_tools,
            ]
            .iter()
            .any(|list| list.iter().flatten().next().is_some())
        })
}
