//! `trellis`: the command-line front end of the Trellis runtime.
//!
//! Parses arguments and calls into `trellis-host`; all behaviour lives there.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use trellis_host::capabilities::resolve_in_root;
use trellis_host::{CacheSetting, Engine, Grant, Limits, PluginRegistry};

/// Trellis: a sandboxed runtime for agent workflows.
///
/// Every tool, validator, LLM provider and step script is a WebAssembly
/// component that sees only the folders its turn grants it.
#[derive(Parser, Debug)]
#[command(name = "trellis", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,

    /// Folder for compiled components [default: $TRELLIS_CACHE_DIR, else ~/.cache/trellis/components].
    #[arg(long, global = true, value_name = "DIR")]
    cache_dir: Option<PathBuf>,

    /// Compile components on every start instead of caching them.
    #[arg(long, global = true, conflicts_with = "cache_dir")]
    no_cache: bool,

    /// Log more (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List and inspect plugins.
    #[command(subcommand)]
    Plugins(PluginsCommand),
    /// Call tools directly, outside a workflow.
    #[command(subcommand)]
    Tool(ToolCommand),
}

#[derive(Subcommand, Debug)]
enum PluginsCommand {
    /// List the bundled plugins and those found in --plugins folders.
    List {
        #[command(flatten)]
        plugins: PluginDirs,
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
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum ToolCommand {
    /// Call one tool in a fresh sandbox and print its JSON result.
    ///
    /// The plugin sees ROOT as `/`, but only the folders given with --read and
    /// --write exist in it; everything else is invisible. With no grant at all
    /// the plugin sees no files. Exit status: 0 with the result on stdout,
    /// 1 with the error on stderr.
    ///
    /// Example:
    ///   trellis tool call workspace:read_file --root examples/ticket-triage \
    ///     --read knowledgebase --args '{"path": "knowledgebase/notes/escalation.md"}'
    #[command(verbatim_doc_comment)]
    Call {
        /// Full tool name, `server:tool`, e.g. `workspace:read_file`.
        name: String,
        /// Arguments: a JSON object, or @FILE to read it from a file.
        #[arg(long, default_value = "{}", value_name = "JSON")]
        args: String,
        /// Folder the plugin sees as `/`; --read and --write are relative to it.
        #[arg(long, default_value = ".", value_name = "ROOT")]
        root: PathBuf,
        /// Grant a folder read-only (repeatable).
        #[arg(long = "read", value_name = "DIR")]
        read: Vec<String>,
        /// Grant a folder read-write (repeatable).
        #[arg(long = "write", value_name = "DIR")]
        write: Vec<String>,
        /// Stop the call after this many seconds.
        #[arg(long, default_value_t = 30.0, value_name = "SECS")]
        timeout: f64,
        /// Memory limit of the plugin instance, in MiB.
        #[arg(long, default_value_t = 256, value_name = "MIB")]
        memory: usize,
        #[command(flatten)]
        plugins: PluginDirs,
    },
}

#[derive(Args, Debug)]
struct PluginDirs {
    /// Also load third-party plugins from DIR: `DIR/plugin.json` or `DIR/*/plugin.json` (repeatable).
    #[arg(long = "plugins", value_name = "DIR")]
    dirs: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: starting the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let cache = if cli.no_cache {
        CacheSetting::Disabled
    } else if let Some(dir) = cli.cache_dir {
        CacheSetting::Dir(dir)
    } else {
        CacheSetting::from_env()
    };
    let engine = Engine::new(cache)?;
    match cli.command {
        Command::Plugins(PluginsCommand::List { plugins, json }) => {
            let registry = registry(&engine, &plugins).await?;
            list_plugins(&registry, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugins(PluginsCommand::Inspect { id, plugins, json }) => {
            let registry = registry(&engine, &plugins).await?;
            inspect_plugin(&registry, &id, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Tool(ToolCommand::Call {
            name,
            args,
            root,
            read,
            write,
            timeout,
            memory,
            plugins,
        }) => {
            let args = parse_args(&args)?;
            let grant = grant(&root, &read, &write)?;
            anyhow::ensure!(
                timeout.is_finite() && timeout > 0.0,
                "--timeout: expected a positive number of seconds, found {timeout}"
            );
            let limits = Limits {
                memory_bytes: memory
                    .checked_mul(1 << 20)
                    .context("--memory is too large")?,
                timeout: Duration::from_secs_f64(timeout),
                ..Limits::default()
            };
            let registry = registry(&engine, &plugins).await?;
            match registry.call_tool(&name, &args, &grant, &limits).await {
                Ok(result) => {
                    println!("{}", serde_json::to_string_pretty(&result)?);
                    Ok(ExitCode::SUCCESS)
                }
                Err(err) => {
                    eprintln!("error: {err}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}

async fn registry(engine: &Engine, dirs: &PluginDirs) -> Result<PluginRegistry> {
    let mut registry = PluginRegistry::with_bundled(engine).await?;
    for dir in &dirs.dirs {
        registry.load_dir(dir).await?;
    }
    Ok(registry)
}

fn parse_args(text: &str) -> Result<serde_json::Value> {
    let (source, text) = match text.strip_prefix('@') {
        Some(path) => (
            path.to_string(),
            std::fs::read_to_string(path).with_context(|| format!("--args: cannot read {path}"))?,
        ),
        None => ("--args".to_string(), text.to_string()),
    };
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{source}: expected a JSON object"))?;
    anyhow::ensure!(
        value.is_object(),
        "{source}: expected a JSON object, found {}",
        json_kind(&value)
    );
    Ok(value)
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn grant(root: &std::path::Path, read: &[String], write: &[String]) -> Result<Grant> {
    let mut grant = Grant::none();
    for (dirs, access, flag) in [
        (read, trellis_host::Access::ReadOnly, "--read"),
        (write, trellis_host::Access::ReadWrite, "--write"),
    ] {
        for dir in dirs {
            let host = resolve_in_root(root, dir).with_context(|| format!("{flag} {dir}"))?;
            grant = grant.folder(host, dir, access)?;
        }
    }
    Ok(grant)
}

fn list_plugins(registry: &PluginRegistry, json: bool) -> Result<()> {
    if json {
        let list: Vec<_> = registry
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
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    println!(
        "{:<16} {:<10} {:<9} {:<10} DESCRIPTION",
        "ID", "KIND", "VERSION", "TOOLS"
    );
    for plugin in registry.plugins() {
        let m = plugin.manifest();
        println!(
            "{:<16} {:<10} {:<9} {:<10} {}",
            m.id,
            m.kind.as_str(),
            m.version,
            plugin.tools().len(),
            m.description
        );
    }
    Ok(())
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
