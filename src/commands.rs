//! The subcommands of `trellis`, one module each (its arguments and its `run`), and what
//! they share: loading the plugin registry, opening a workspace.

pub mod builder;
pub mod check;
pub mod mcp;
pub mod migrate;
pub mod plugin;
pub mod plugins;
pub mod run;
pub mod runs;
pub mod schedules;
pub mod schema;
pub mod script;
pub mod serve;
pub mod tool;
pub mod validate;
pub mod worker;

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use trellis_runner::mcp_servers::McpConfig;
use trellis_runner::run_folder::ACTIVE_RUN;
use trellis_sandbox::{CacheSetting, Engine, PluginRegistry};
use trellis_workflow::Workspace;

/// The `--plugins` option of the commands that load plugins.
#[derive(Args, Debug)]
pub struct PluginDirs {
    /// Also load third-party plugins from DIR: `DIR/plugin.json` or `DIR/*/plugin.json` (repeatable).
    #[arg(long = "plugins", value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
}

/// The `--mcp-config` option of the commands that use external MCP servers.
#[derive(Args, Debug, Default)]
pub struct McpConfigArg {
    /// The external MCP servers, `{"mcpServers": {KEY: {...}}}` [default:
    /// mcp_servers.json and mcp_servers_user.json in $XDG_CONFIG_HOME/trellis, else
    /// ~/.config/trellis]. They run outside the sandbox.
    #[arg(long = "mcp-config", value_name = "FILE")]
    pub file: Option<PathBuf>,
}

/// The operator's external MCP servers: their warnings printed, a server key that is also
/// a plugin id of `registry` an error.
fn mcp_config(arg: &McpConfigArg, registry: &PluginRegistry) -> Result<McpConfig> {
    let config = McpConfig::load(arg.file.as_deref())?;
    for warning in &config.warnings {
        eprintln!("warning: {warning}");
    }
    config.check_collisions(registry.plugins().map(|p| p.manifest().id.as_str()))?;
    Ok(config)
}

/// The compile-cache options of the commands that run plugins (the others compile nothing).
#[derive(Args, Debug, Default)]
pub struct CacheArgs {
    /// Folder for compiled components [default: $TRELLIS_CACHE_DIR, else ~/.cache/trellis/components].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Compile components on every start instead of caching them.
    #[arg(long, conflicts_with = "cache_dir")]
    pub no_cache: bool,
}

/// The write budgets of the commands that run model turns: a turn's, a run's (a builder
/// session's, with the executions it starts) and the workspace's quota.
#[derive(Args, Debug, Clone, Copy)]
pub struct WriteBudgetArgs {
    /// MiB the tool calls of one turn write together, to their folders and the database
    /// (default 1024; each call also at most 1 GiB); a write past it fails and the model is
    /// told the call went over the turn's limit.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub max_turn_write_mib: Option<u64>,
    /// MiB a whole run writes, every turn, sub-agent and script together (a builder session:
    /// its turns and the executions it starts), to their folders and the database (default
    /// 4096); a write past it fails and the model is told the call went over the run's limit.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=16_777_216))]
    pub max_run_write_mib: Option<u64>,
    /// MiB the workspace's folder may take on disk, its database, run folders and shared
    /// folders together (default 16384): a run (a builder session, an execution) writes no
    /// more than what is left of it when it begins; a write past it fails, naming it.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=1_073_741_824))]
    pub max_workspace_mib: Option<u64>,
}

/// The bytes of a `--max-...-mib` flag, `default` bytes without it.
pub fn mib_or(mib: Option<u64>, default: u64) -> u64 {
    mib.map_or(default, |mib| mib << 20)
}

impl WriteBudgetArgs {
    /// Bytes the calls of one turn write together.
    pub fn turn_bytes(&self) -> u64 {
        mib_or(
            self.max_turn_write_mib,
            trellis_runner::driver::DEFAULT_TURN_WRITE_BYTES,
        )
    }

    /// Bytes a run (a builder session) writes.
    pub fn run_bytes(&self) -> u64 {
        mib_or(
            self.max_run_write_mib,
            trellis_runner::driver::DEFAULT_RUN_WRITE_BYTES,
        )
    }

    /// Bytes the workspace's folder may take.
    pub fn workspace_bytes(&self) -> u64 {
        mib_or(
            self.max_workspace_mib,
            trellis_runner::driver::DEFAULT_WORKSPACE_BYTES,
        )
    }

    /// `budgets` with these write budgets.
    pub fn apply(&self, budgets: &mut trellis_runner::driver::TurnBudgets) {
        budgets.write_bytes = self.turn_bytes();
        budgets.run_write_bytes = self.run_bytes();
        budgets.workspace_bytes = self.workspace_bytes();
    }
}

impl CacheArgs {
    /// The cache these options ask for.
    pub fn setting(&self) -> CacheSetting {
        if self.no_cache {
            CacheSetting::Disabled
        } else if let Some(dir) = &self.cache_dir {
            CacheSetting::Dir(dir.clone())
        } else {
            CacheSetting::from_env()
        }
    }
}

/// The bundled plugins and those of every `--plugins` folder; the first that fails to load
/// is an error.
async fn registry(engine: &Engine, dirs: &PluginDirs) -> Result<PluginRegistry> {
    let mut registry = PluginRegistry::with_bundled(engine).await?;
    for dir in &dirs.dirs {
        registry.load_dir(dir).await?;
    }
    Ok(registry)
}

/// Opens the workspace at `root` for the run folder `run` [default: iteration-0]; its
/// diagnostics are the error.
fn open_workspace(root: &Path, run: Option<&str>) -> Result<Workspace> {
    Workspace::open_run(root, Some(run.unwrap_or(ACTIVE_RUN))).map_err(|d| anyhow::anyhow!("{d}"))
}

/// Refuses a workspace argument that is not a folder: a file (naming the workspace it lies
/// in, when there is one, since a path into it is the usual slip) or nothing at all.
pub fn check_workspace_folder(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => {
            let hint = path
                .ancestors()
                .skip(1)
                .map(|a| {
                    if a.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        a
                    }
                })
                .find(|a| a.join(PLAN_FILE).is_file())
                .map(|ws| format!(": did you mean {}?", ws.display()))
                .unwrap_or_default();
            anyhow::bail!(
                "{}: expected the workspace folder, got a file{hint}",
                path.display()
            )
        }
        Err(_) => anyhow::bail!("{}: no such workspace folder", path.display()),
    }
}

/// A workspace's plan, relative to its folder.
const PLAN_FILE: &str = "planning/plan.json";

/// The recorder of `--record FILE`: refused with a replayed model, which answers from a
/// cassette already; the cassette's model name is the file's stem. `max_mib` caps the
/// cassette (`--record-max-mib`; default [`trellis_sandbox::llm::RECORD_CAP`]).
fn recorder(
    file: &Path,
    override_llm: Option<&trellis_workflow::step_config::LlmRef>,
    max_mib: Option<u64>,
) -> Result<std::sync::Arc<trellis_sandbox::llm::Recorder>> {
    use anyhow::Context;
    anyhow::ensure!(
        override_llm.is_none_or(|l| l.provider != trellis_runner::llm_choice::REPLAY_PROVIDER),
        "--record records the answers of a live provider; `replay` answers from a cassette already"
    );
    let model = file
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| !s.is_empty())
        .with_context(|| format!("--record {}: expected a file name", file.display()))?;
    let mut recorder = trellis_sandbox::llm::Recorder::create(file)?.recording_model(model);
    if let Some(mib) = max_mib {
        recorder = recorder.with_cap(mib << 20);
    }
    Ok(std::sync::Arc::new(recorder))
}

/// The line said after a run or a session that recorded: how many calls, and whether the
/// recording stopped at its cap.
fn recorded_line(recorder: &trellis_sandbox::llm::Recorder) -> String {
    let mut line = format!(
        "recorded {} LLM call{} to {}",
        recorder.len(),
        plural(recorder.len()),
        recorder.path().display()
    );
    if recorder.stopped() {
        line.push_str(" (the recording stopped there: see the error above)");
    }
    line
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The operator's approvals: the defaults, the user config file, then `--allow-key
/// VAR=ORIGIN` and `--allow-host HOST`.
fn approvals(
    allow_keys: &[String],
    allow_hosts: &[String],
) -> Result<trellis_sandbox::llm::KeyApprovals> {
    let mut approvals = trellis_sandbox::llm::KeyApprovals::defaults();
    if let Some(config) = trellis_sandbox::llm::KeyApprovals::user_config_path() {
        approvals.load_config(&config)?;
    }
    for spec in allow_keys {
        approvals.allow_spec(spec)?;
    }
    for host in allow_hosts {
        approvals.allow_host(host)?;
    }
    Ok(approvals)
}
