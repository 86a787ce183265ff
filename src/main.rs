//! `trellis`: the command-line front end of the Trellis runtime.
//!
//! Parses arguments and calls into `trellis-runner` (through its Runtime facade),
//! `trellis-workflow` and `trellis-sandbox`; all behaviour lives there. Each
//! subcommand is a module of [`commands`]: its arguments and its `run`.

mod commands;
mod progress;
mod terminal;

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};
use trellis_sandbox::{CacheSetting, Engine};

use commands::{
    builder, check, mcp, migrate, plugin, plugins, run, runs, schedules, schema, script, serve,
    tool, validate, worker,
};

/// Trellis: a sandboxed runtime for agent workflows.
///
/// Every tool, validator, LLM provider and step script is a WebAssembly
/// component that sees only the folders its turn grants it.
#[derive(Parser, Debug)]
#[command(name = "trellis", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,

    /// Log more (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

// Parsed once, held by `main`: the size of its largest arguments costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// List and inspect plugins.
    #[command(subcommand)]
    Plugins(plugins::PluginsCommand),
    /// Start a plugin project (`new`) and build it into a loadable plugin (`build`).
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Call tools directly, outside a workflow.
    #[command(subcommand)]
    Tool(tool::ToolCommand),
    /// Serve tool plugins to MCP clients.
    #[command(subcommand)]
    Mcp(mcp::McpCommand),
    /// List past runs and inspect their steps.
    #[command(subcommand)]
    Runs(runs::RunsCommand),
    /// The schedules of workflow.json: list them, print their next firings, fire one now.
    ///
    /// `trellis serve` fires them at their time (docs/schedules.md).
    #[command(subcommand)]
    Schedules(schedules::SchedulesCommand),
    /// Run a step's script in its sandbox, outside a workflow run.
    ///
    /// Runs `code/<step>/main.wasm` (any wasi:cli command component) if it exists, else
    /// `code/<step>/main.py` (else `learnings/<step>/main.py`) in the bundled Python
    /// runner, with working directory `code/<step>/` (read-only), the step's folder
    /// grants, STEP_OUTPUT_DIR, STEP_EXECUTION_DIR, DB_PATH, VAR_<NAME> for workflow
    /// variables, a placeholder SECRET_<NAME> for each such variable of the environment,
    /// and the step's context_dependencies as arguments. HTTP(S) only to the hosts of the
    /// step's allowed_hosts (loopback and private ones with --allow-host; a secret goes
    /// only where --allow-key SECRET_<NAME>=ORIGIN approves it). Python scripts reach the
    /// database with `import sqlite3` or `import trellis_db`, the network with
    /// `import trellis_http`. Its stdout and stderr are printed and written to
    /// `runs/<run>/logs/<step>/script-stdout.txt` and `script-stderr.txt`, with
    /// `script-result.json` beside them. Exit status 1 when the script fails (non-zero
    /// exit, exception, timeout, memory limit).
    ///
    /// Example:
    ///   trellis script WS --step fetch-tickets --timeout 30 --var region=emea
    #[command(verbatim_doc_comment)]
    Script(script::ScriptArgs),
    /// Check a workspace's plan.json, step_config.json and workflow.json.
    ///
    /// Prints every problem found, each with its file and JSON path. Exit
    /// status 1 when there is an error; warnings alone exit 0.
    Validate(validate::ValidateArgs),
    /// Run a step's validation gate on its current outputs and print each check.
    ///
    /// The schema is the step's `validation_schema` (plan.json, else its step
    /// config). Outputs are read from `runs/<run>/execution/<step>/`; the report is
    /// written to `runs/<run>/logs/<step>/pre_validation.json` and a per-attempt
    /// file beside it. Exit status 1 when a check fails or the gate cannot run.
    Check(check::CheckArgs),
    /// Print a JSON Schema of a workspace file, for editors.
    Schema(schema::SchemaArgs),
    /// Convert legacy `code` items of message sequences into scripted steps
    /// (migrate_message_sequence_code_items, contract v1.0.10, then v1.0.11).
    ///
    /// Converts only unambiguous sequences; anything else is refused with
    /// MESSAGE_SEQUENCE_CODE_MIGRATION_BLOCKED and what to split, changing no file.
    Migrate(migrate::MigrateArgs),
    /// Run a workflow: its steps in plan order, following `next_step_id` and routes.
    ///
    /// A full run first moves `runs/iteration-0` to the next free `runs/iteration-N`, then
    /// runs the steps in `runs/iteration-0` (with workflow.json groups: in
    /// `runs/iteration-0/<group>`, one group after the other). `--step` and `--group` run
    /// in the existing `iteration-0` without moving it. Outputs go to
    /// `runs/iteration-0[/<group>]/execution/<step>/`.
    ///
    /// The model of a step: `--llm` when given, else its step config's `execution_llm`
    /// (its `fallbacks` tried in order when it fails), else its `execution_tier` through
    /// workflow.json `tiers`, else workflow.json's `llm`. A step that needs a model and has
    /// none is an error before anything runs. The `replay` provider answers from
    /// `<workspace>/cassettes/<model_id>.json`; others reach the provider's `base_url` in
    /// workflow.json (else $OPENAI_BASE_URL) with the key from its `api_key_env` (else
    /// $OPENAI_API_KEY). A key goes only to origins the operator approved for its variable
    /// (OPENAI_API_KEY: the OpenAI API and $OPENAI_BASE_URL; more with --allow-key or the
    /// user config file, see docs/configuration.md). A workspace may ship `db/seed.sql` instead of a binary database:
    /// `db/db.sqlite` is created from it when missing.
    ///
    /// A scripted step (`declared_execution_mode: "scripted"`) runs `code/<step>/main.py`
    /// (or `main.wasm`) in its sandbox first: when the script succeeds and its outputs pass
    /// the step's gate, no model is called (a non-zero exit whose outputs pass counts as a
    /// success). A failure goes to the step's model for a repair of the script (up to
    /// three), then the script runs again; with `lock_code` the step runs agentically
    /// instead. A scripted step with no script yet first gets a turn that writes it.
    ///
    /// On a terminal a status line shows the step, item, turn, tool calls and tokens as
    /// they go; otherwise one line per item, turn, LLM call, tool call and gate.
    /// Ctrl-C stops at the next boundary. Exit status 1 when a step fails.
    ///
    /// Examples:
    ///   trellis run examples/ticket-triage
    ///   trellis run examples/ticket-digest         (scripted steps, no model)
    ///   trellis run WS --llm openai:gpt-4o --record WS/cassettes/demo.json
    ///   trellis run WS --llm replay:demo
    ///   trellis run WS --group us --step summarize
    #[command(verbatim_doc_comment)]
    Run(run::RunArgs),
    /// Chat with the builder: an agent that designs, runs and repairs the workflow.
    ///
    /// The agent edits the plan and step config through validated tools (an edit that
    /// would not validate is refused whole, nothing written; every edit is logged to
    /// planning/changelog/), writes scripts and notes through the sandboxed workspace
    /// plugin, runs steps and whole workflows in the background in runs/iteration-0, reads
    /// their results and steers them. What it may do is set by the workshop mode:
    /// `trellis builder tools --mode M` lists a mode's tools. The conversation is kept in
    /// builder/conversation/ and resumed with --session; costs go to costs/phase/. One
    /// builder per workspace at a time.
    ///
    /// In the chat: /mode NAME, /executions, /stop [ID], /cost, /help, /quit.
    ///
    /// Examples:
    ///   trellis builder WS --llm openai:gpt-4o
    ///   trellis builder WS --session 20261130-190512-3f2a
    ///   trellis builder WS --llm replay:NAME -m "add a step that ..." -m "run it"
    ///   trellis builder tools --mode run
    #[command(verbatim_doc_comment)]
    Builder(builder::BuilderArgs),
    /// Serve the operator console of a workspace over HTTP: the builder chat, live
    /// executions and run results, at http://127.0.0.1:7878/ by default.
    ///
    /// A query to the builder is answered at once and its turn runs in the background; its
    /// events (the agent's text, each tool call, executions) stream as server-sent events.
    /// Any address but loopback needs TRELLIS_TOKEN (every request then needs
    /// `Authorization: Bearer <token>`). docs/server.md lists every endpoint.
    ///
    /// Examples:
    ///   trellis serve examples/builder-demo
    ///   TRELLIS_TOKEN=... trellis serve WS --addr 0.0.0.0:7878
    #[command(verbatim_doc_comment)]
    Serve(serve::ServeArgs),
    /// Run the steps that `trellis run --dispatch` publishes, from a NATS JetStream server.
    ///
    /// Each step runs in a private scratch workspace made of what the step may read, under
    /// the same sandbox, limits, plugins and key approvals as a local run; what it writes
    /// goes back to the dispatcher, committed once. docs/workers.md shows a server, two
    /// workers and a dispatched run.
    ///
    /// Examples:
    ///   trellis worker --nats nats://127.0.0.1:4222
    ///   trellis worker --nats tls://nats.example:4222 --nats-creds worker.creds --pool gpu
    #[command(verbatim_doc_comment)]
    Worker(worker::WorkerArgs),
}

/// Raises the soft limit on open files to the hard limit: a turn's grant holds one descriptor
/// per granted folder while the turn lasts, and many executions may run at once; the soft
/// limit is often 1024 where the hard one is far higher.
fn raise_open_file_limit() {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit and setrlimit with a valid pointer to an rlimit this function owns.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0
                && limit.rlim_cur < limit.rlim_max
            {
                limit.rlim_cur = limit.rlim_max;
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    tracing::debug!("could not raise the open-file limit");
                }
            }
        }
    }
}

fn main() -> ExitCode {
    // Temp files older than this process are no writes of its own (a run killed a moment
    // before this one started left them): see `remove_stale_temp_files`.
    trellis_sandbox::store::mark_process_start();
    // A CLI whose output is piped into `head` should end quietly when the pipe
    // closes, as other Unix tools do, not panic inside `println!`.
    #[cfg(unix)]
    // SAFETY: called first thing in main, before any other thread exists;
    // SIG_DFL is a valid disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    raise_open_file_limit();
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
            // A workspace's diagnostics label each line themselves (`error:`, `warning:`).
            let text = format!("{err:#}");
            let labelled = text.starts_with("error: ") || text.starts_with("warning: ");
            let label = if labelled { "" } else { "error: " };
            eprintln!("{label}{}", terminal::shown(&text));
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
        .with_ansi(colour_on_stderr())
        .init();
}

/// Colour codes only for a person at a terminal: never when stderr is a file or a pipe
/// (logs, CI), nor when `NO_COLOR` is set to anything but the empty string.
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

impl Command {
    /// The workspace a command runs plugins on, if it does.
    fn workspace(&self) -> Option<&Path> {
        match self {
            Command::Script(args) => Some(&args.workspace),
            Command::Check(args) => Some(&args.workspace),
            Command::Run(args) => Some(&args.workspace),
            Command::Validate(args) => Some(&args.workspace),
            Command::Builder(args) => args.workspace(),
            Command::Serve(args) => Some(args.workspace()),
            Command::Schedules(command) => Some(command.workspace()),
            // A long-lived server may grant folders of ROOT read-write: no cache there.
            Command::Mcp(command) => Some(command.root()),
            _ => None,
        }
    }
}

impl Command {
    /// The compile-cache options of a command that runs plugins.
    fn cache(&self) -> Option<&commands::CacheArgs> {
        match self {
            Command::Plugins(command) => Some(command.cache()),
            Command::Plugin(command) => command.cache(),
            Command::Tool(command) => Some(command.cache()),
            Command::Mcp(command) => Some(command.cache()),
            Command::Script(args) => Some(&args.cache),
            Command::Check(args) => Some(&args.cache),
            Command::Run(args) => Some(&args.cache),
            Command::Validate(args) => Some(&args.cache),
            Command::Builder(args) => Some(&args.cache),
            Command::Serve(args) => Some(&args.cache),
            Command::Worker(args) => Some(&args.cache),
            Command::Schedules(command) => command.cache(),
            _ => None,
        }
    }

    /// The workspace folder a command reads or changes, if it takes one; checked to be a
    /// folder before the command starts.
    fn workspace_folder(&self) -> Option<&Path> {
        match self {
            Command::Script(args) => Some(&args.workspace),
            Command::Check(args) => Some(&args.workspace),
            Command::Run(args) => Some(&args.workspace),
            Command::Validate(args) => Some(&args.workspace),
            Command::Migrate(args) => Some(&args.workspace),
            Command::Builder(args) => args.workspace(),
            Command::Serve(args) => Some(args.workspace()),
            Command::Runs(command) => Some(command.workspace()),
            Command::Schedules(command) => Some(command.workspace()),
            _ => None,
        }
    }
}

/// Refuses a compile cache inside the workspace: a plugin granted a folder there could
/// write entries, and entries are native code the host loads.
fn refuse_cache_inside(cache: &Path, workspace: &Path) -> Result<()> {
    let Ok(workspace) = workspace.canonicalize() else {
        // A missing workspace is the command's own error to report.
        return Ok(());
    };
    // The cache folder may not exist yet: resolve its nearest existing ancestor.
    let mut existing = cache.to_path_buf();
    while !existing.exists() {
        if !existing.pop() {
            return Ok(());
        }
    }
    let rest = cache.strip_prefix(&existing).unwrap_or(Path::new(""));
    let resolved = existing.canonicalize()?.join(rest);
    anyhow::ensure!(
        !resolved.starts_with(&workspace),
        "the compile cache folder {} is inside the workspace {}: a plugin granted a folder there \
         could plant compiled code; give --cache-dir a folder outside it (or --no-cache)",
        cache.display(),
        workspace.display()
    );
    Ok(())
}

async fn run(cli: Cli) -> Result<ExitCode> {
    // Only the commands that run plugins compile components, so only they take the cache
    // options.
    let cache = cli
        .command
        .cache()
        .map_or(CacheSetting::Disabled, |c| c.setting());
    if let Some(folder) = cli.command.workspace_folder() {
        commands::check_workspace_folder(folder)?;
    }
    if let (CacheSetting::Dir(dir), Some(workspace)) = (&cache, cli.command.workspace()) {
        refuse_cache_inside(dir, workspace)?;
    }
    if let Command::Serve(args) = &cli.command {
        for workspace in args.more_workspaces() {
            commands::check_workspace_folder(workspace)?;
            if let CacheSetting::Dir(dir) = &cache {
                refuse_cache_inside(dir, workspace)?;
            }
        }
    }
    // Commands that run no plugin start no engine. The engine owns the writer of the logs
    // written behind the agent loop: they are on disk once it is dropped, whatever the outcome.
    let engine = move || Engine::new(cache);
    match cli.command {
        Command::Validate(args) => validate::run(&engine()?, &args).await,
        Command::Schema(args) => schema::run(&args),
        Command::Migrate(args) => migrate::run(&args),
        Command::Runs(command) => runs::run(&command),
        Command::Plugins(command) => plugins::run(&engine()?, command).await,
        Command::Plugin(command) => plugin::run(engine, command).await,
        Command::Tool(command) => tool::run(&engine()?, command).await,
        Command::Mcp(command) => mcp::run(&engine()?, command).await,
        Command::Script(args) => script::run(&engine()?, args).await,
        Command::Check(args) => check::run(&engine()?, &args).await,
        Command::Run(args) => run::run(&engine()?, args).await,
        Command::Builder(args) => builder::run(engine, args).await,
        Command::Serve(args) => serve::run(&engine()?, args).await,
        Command::Worker(args) => worker::run(&engine()?, args).await,
        Command::Schedules(command) => schedules::run(engine, command).await,
    }
}
