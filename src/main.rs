//! `trellis`: the command-line front end of the Trellis runtime.
//!
//! Parses arguments and calls into `trellis-host`; all behaviour lives there.

mod progress;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use trellis_host::capabilities::resolve_in_root;
use trellis_host::plugins::PluginValidators;
use trellis_host::workflow::{self, Workspace};
use trellis_host::{CacheSetting, Engine, Grant, Limits, PluginRegistry, validation};

mod script_command;

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
    /// List past runs and inspect their steps.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// Run a step's script in its sandbox, outside a workflow run.
    ///
    /// Runs `code/<step>/main.wasm` (any wasi:cli command component) if it exists, else
    /// `code/<step>/main.py` in the bundled Python runner, with working directory
    /// `code/<step>/` (read-only), the step's folder grants, STEP_OUTPUT_DIR,
    /// STEP_EXECUTION_DIR, DB_PATH and VAR_<NAME> for workflow variables, no network.
    /// Python scripts reach the database with `import trellis_db`. Its stdout and stderr
    /// are printed and written to `runs/<run>/logs/<step>/script-stdout.txt` and
    /// `script-stderr.txt`, with `script-result.json` beside them. Exit status 1 when the
    /// script fails (non-zero exit, exception, timeout, memory limit).
    ///
    /// Example:
    ///   trellis script WS --step fetch-tickets --timeout 30 --var region=emea
    #[command(verbatim_doc_comment)]
    Script(script_command::ScriptArgs),
    /// Check a workspace's plan.json, step_config.json and workflow.json.
    ///
    /// Prints every problem found, each with its file and JSON path. Exit
    /// status 1 when there is an error; warnings alone exit 0.
    Validate {
        /// The workspace folder.
        workspace: PathBuf,
        /// Check the run-specific step config of this run folder (e.g. `iteration-0`).
        #[arg(long, value_name = "FOLDER")]
        run: Option<String>,
    },
    /// Run a step's validation gate on its current outputs and print each check.
    ///
    /// The schema is the step's `validation_schema` (plan.json, else its step
    /// config). Outputs are read from `runs/<run>/execution/<step>/`; the report is
    /// written to `runs/<run>/logs/<step>/pre_validation.json` and a per-attempt
    /// file beside it. Exit status 1 when a check fails or the gate cannot run.
    Check {
        /// The workspace folder.
        workspace: PathBuf,
        /// The step whose outputs to check.
        #[arg(long, value_name = "ID")]
        step: String,
        /// Run folder under `runs/` [default: iteration-0].
        #[arg(long, value_name = "FOLDER")]
        run: Option<String>,
        #[command(flatten)]
        plugins: PluginDirs,
    },
    /// Print a JSON Schema of a workspace file, for editors.
    Schema {
        /// Which file.
        #[arg(value_enum)]
        which: SchemaKind,
    },
    /// Convert legacy `code` items of message sequences into scripted steps
    /// (migrate_message_sequence_code_items, contract v1.0.10, then v1.0.11).
    ///
    /// Converts only unambiguous sequences; anything else is refused with
    /// MESSAGE_SEQUENCE_CODE_MIGRATION_BLOCKED and what to split, changing no file.
    Migrate {
        /// The workspace folder.
        workspace: PathBuf,
    },
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
    /// the step's gate, no model is called. A failure goes to the step's model for a
    /// repair of the script (up to three, not with `lock_code`), then the script runs again.
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
    Run {
        /// The workspace folder.
        workspace: PathBuf,
        /// Run only this step, in the existing run folder (with groups, give --group too).
        #[arg(long, value_name = "ID")]
        step: Option<String>,
        /// Run only this group of workflow.json (its id or display name), in
        /// `runs/iteration-0/<group>`, without rotating `iteration-0`.
        #[arg(long, value_name = "GROUP")]
        group: Option<String>,
        /// The model of every step, `provider:model` (e.g. `openai:gpt-4o`, `replay:demo`);
        /// overrides execution_llm (fallbacks included), tiers and workflow.json's llm.
        #[arg(long, value_name = "PROVIDER:MODEL")]
        llm: Option<String>,
        /// Write every answered LLM call to the cassette FILE (replaced). Put it at
        /// `<workspace>/cassettes/NAME.json` and replay the run with `--llm replay:NAME`.
        #[arg(long, value_name = "FILE")]
        record: Option<PathBuf>,
        /// Let the key in environment variable VAR go to ORIGIN (`scheme://host[:port]`)
        /// when the workspace asks for it (repeatable). Also in
        /// $XDG_CONFIG_HOME/trellis/config.toml (else ~/.config/trellis/config.toml).
        #[arg(long = "allow-key", value_name = "VAR=ORIGIN")]
        allow_keys: Vec<String>,
        /// The answer of a human_input step, by its variable_name (repeatable).
        #[arg(long = "input", value_name = "NAME=VALUE")]
        inputs: Vec<String>,
        /// Print only the final summary.
        #[arg(long, short)]
        quiet: bool,
        #[command(flatten)]
        plugins: PluginDirs,
    },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum SchemaKind {
    /// planning/plan.json
    Plan,
    /// planning/step_config.json
    StepConfig,
    /// workflow.json
    Workflow,
    /// A step's validation_schema.
    Validation,
}

impl SchemaKind {
    fn name(self) -> &'static str {
        match self {
            SchemaKind::Plan => "plan",
            SchemaKind::StepConfig => "step-config",
            SchemaKind::Workflow => "workflow",
            SchemaKind::Validation => "validation",
        }
    }
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
enum RunsCommand {
    /// One line per run folder under `runs/`, with each step's status.
    ///
    /// `iteration-0` first, then `iteration-N` newest first; group folders follow
    /// their iteration. A step's status is its `execution-final-summary.json`'s, else
    /// its `session.json`'s, else `no summary`.
    List {
        /// The workspace folder.
        workspace: PathBuf,
    },
    /// Show one step of a run: status, concerns, session entries and turn logs.
    ///
    /// Read from `runs/<run>/execution/<step>/` and `runs/<run>/logs/<step>/`.
    /// Exit status 1 when the run folder or the step does not exist.
    Show {
        /// The workspace folder.
        workspace: PathBuf,
        /// The step id.
        step: String,
        /// Run folder under `runs/` [default: iteration-0].
        #[arg(long, value_name = "FOLDER")]
        run: Option<String>,
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
        /// Give the plugin this SQLite file through the `workflow-db` interface, relative to
        /// ROOT (read-only unless --db-write).
        #[arg(long, value_name = "FILE")]
        db: Option<String>,
        /// Let the plugin's `execute` modify the --db file.
        #[arg(long, requires = "db")]
        db_write: bool,
        /// Stop the call after this many seconds.
        #[arg(long, default_value_t = 30.0, value_name = "SECS")]
        timeout: f64,
        /// Memory limit of the plugin instance (all its memories and tables together), in MiB.
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
    let result = runtime.block_on(run(cli));
    // Logs written behind the agent loop are on disk before the process ends, even when a
    // run stopped on an error half way through a step.
    let flushed = trellis_host::store::write_behind::flush();
    match result.and_then(|code| flushed.map(|()| code).map_err(anyhow::Error::from)) {
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
    // Commands that run no plugin start no engine.
    match &cli.command {
        Command::Validate { workspace, run } => return Ok(validate(workspace, run.as_deref())),
        Command::Schema { which } => {
            let schema =
                workflow::json_schema::schema_for(which.name()).context("unknown schema")?;
            println!("{}", serde_json::to_string_pretty(&schema)?);
            return Ok(ExitCode::SUCCESS);
        }
        Command::Migrate { workspace } => return migrate(workspace),
        Command::Runs(RunsCommand::List { workspace }) => {
            list_runs(workspace)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Runs(RunsCommand::Show {
            workspace,
            step,
            run,
        }) => {
            show_run_step(workspace, step, run.as_deref())?;
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
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
            // One bad plugin does not hide the others: it is listed with its error.
            let mut registry = PluginRegistry::with_bundled(&engine).await?;
            let mut failures = Vec::new();
            for dir in &plugins.dirs {
                for outcome in registry.load_dir_each(dir).await? {
                    if let Err(err) = outcome.result {
                        failures.push((outcome.manifest, format!("{err:#}")));
                    }
                }
            }
            list_plugins(&registry, &failures, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugins(PluginsCommand::Inspect { id, plugins, json }) => {
            let registry = registry(&engine, &plugins).await?;
            inspect_plugin(&registry, &id, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Script(args) => script_command::run(&engine, args).await,
        Command::Check {
            workspace,
            step,
            run,
            plugins,
        } => {
            let registry = registry(&engine, &plugins).await?;
            check(&registry, &workspace, &step, run.as_deref()).await
        }
        Command::Validate { .. }
        | Command::Schema { .. }
        | Command::Migrate { .. }
        | Command::Runs(_) => {
            unreachable!("handled above")
        }
        Command::Run {
            workspace,
            step,
            group,
            llm,
            record,
            allow_keys,
            inputs,
            quiet,
            plugins,
        } => {
            let registry = registry(&engine, &plugins).await?;
            let args = RunArgs {
                step,
                group,
                llm,
                record,
                allow_keys,
                inputs,
                quiet,
            };
            run_workflow(&registry, &workspace, args).await
        }
        Command::Tool(ToolCommand::Call {
            name,
            args,
            root,
            read,
            write,
            db,
            db_write,
            timeout,
            memory,
            plugins,
        }) => {
            let args = parse_args(&args)?;
            let mut grant = grant(&root, &read, &write)?;
            if let Some(db) = db {
                grant = grant.with_db(db_file(&root, &db)?, db_write);
            }
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

/// The `--db` file of `tool call`: an existing regular file inside ROOT, not a link.
fn db_file(root: &std::path::Path, rel: &str) -> Result<PathBuf> {
    let (folder, name) = match rel.rsplit_once('/') {
        Some((folder, name)) => (folder, name),
        None => ("", rel),
    };
    let folder = resolve_in_root(root, folder).with_context(|| format!("--db {rel:?}"))?;
    let path = folder.join(name);
    let meta = std::fs::symlink_metadata(&path).with_context(|| format!("--db {rel:?}"))?;
    anyhow::ensure!(
        meta.is_file(),
        "--db {rel:?}: expected an SQLite file, not a link, folder or special file"
    );
    Ok(path)
}

/// `trellis runs list`: one line per run folder, then its steps.
fn list_runs(root: &std::path::Path) -> Result<()> {
    let runs = trellis_host::sequence::runs::list_runs(root)?;
    if runs.is_empty() {
        println!("no runs in {}", root.join("runs").display());
    }
    for run in runs {
        if run.steps.is_empty() {
            println!("{}: no steps", run.run_folder);
            continue;
        }
        let steps: Vec<String> = run
            .steps
            .iter()
            .map(|s| match &s.completed_at {
                Some(at) => format!("{} {} {at}", s.step_id, s.status),
                None => format!("{} {}", s.step_id, s.status),
            })
            .collect();
        println!("{}: {}", run.run_folder, steps.join(", "));
    }
    Ok(())
}

/// `trellis runs show`: one step of one run.
fn show_run_step(root: &std::path::Path, step: &str, run: Option<&str>) -> Result<()> {
    use trellis_host::sequence::run_folder::ACTIVE_RUN;
    use trellis_host::sequence::runs::{first_line, show_step};
    use trellis_host::sequence::workflow_run::status_name;

    let report = show_step(root, run.unwrap_or(ACTIVE_RUN), step)?;
    println!("step: {} (run {})", report.step_id, report.run_folder);
    match &report.completed_at {
        Some(at) => println!("status: {} at {at}", report.status),
        None => println!("status: {}", report.status),
    }
    if report.concerns.is_empty() {
        println!("concerns: none");
    } else {
        println!("concerns:");
        for concern in &report.concerns {
            println!("  - {concern}");
        }
    }
    println!("turns: {}", report.turns.len());
    println!("entries:");
    if report.entries.is_empty() {
        println!("  (no session.json)");
    }
    for e in &report.entries {
        let summary = first_line(e.summary.as_deref());
        let summary = if summary.is_empty() {
            String::new()
        } else {
            format!(": {summary}")
        };
        println!(
            "  {} [{}] {}{summary}",
            e.item_id,
            e.item_type,
            status_name(e.status)
        );
    }
    if !report.script_logs.is_empty() {
        println!("script logs:");
    }
    for path in &report.script_logs {
        println!("  {}", path.display());
    }
    if !report.turns.is_empty() {
        println!("turn logs:");
    }
    for t in &report.turns {
        println!(
            "  attempt {} iteration {}: {} {}, LLM calls {}, tool calls {}{}, tokens {} prompt / {} completion, {} ms",
            t.attempt,
            t.iteration,
            t.model,
            t.status,
            t.llm_calls,
            t.tool_calls,
            if t.tool_names.is_empty() {
                String::new()
            } else {
                format!(" ({})", t.tool_names.join(", "))
            },
            t.prompt_tokens,
            t.completion_tokens,
            t.duration_ms
        );
        if t.tool_errors > 0 {
            println!("    {} tool calls failed", t.tool_errors);
        }
    }
    Ok(())
}

/// The options of `trellis run`.
struct RunArgs {
    step: Option<String>,
    group: Option<String>,
    llm: Option<String>,
    record: Option<PathBuf>,
    allow_keys: Vec<String>,
    inputs: Vec<String>,
    quiet: bool,
}

/// `trellis run`: runs the workflow with live progress (or plain lines), then prints the
/// outputs of every step and the totals.
async fn run_workflow(
    registry: &PluginRegistry,
    root: &std::path::Path,
    args: RunArgs,
) -> Result<ExitCode> {
    use trellis_host::llm::Recorder;
    use trellis_host::sequence::events::Observer;
    use trellis_host::sequence::llm_choice::{LlmSetup, REPLAY_PROVIDER, parse_llm_spec};
    use trellis_host::sequence::workflow_run::{self, RunEnv, RunOptions, status_name};

    let mut opts = RunOptions {
        step: args.step,
        group: args.group,
        ..RunOptions::default()
    };
    for input in &args.inputs {
        let (name, value) = input
            .split_once('=')
            .with_context(|| format!("--input {input:?}: expected NAME=VALUE"))?;
        opts.inputs.insert(name.to_string(), value.to_string());
    }
    let override_llm = args.llm.as_deref().map(parse_llm_spec).transpose()?;
    let mut approvals = trellis_host::llm::KeyApprovals::defaults();
    if let Some(config) = trellis_host::llm::KeyApprovals::user_config_path() {
        approvals.load_config(&config)?;
    }
    for spec in &args.allow_keys {
        approvals.allow_spec(spec)?;
    }
    let mut llm = LlmSetup::new(override_llm.clone()).with_approvals(approvals);
    if let Some(file) = &args.record {
        anyhow::ensure!(
            override_llm
                .as_ref()
                .is_none_or(|l| l.provider != REPLAY_PROVIDER),
            "--record records the answers of a live provider; `replay` answers from a cassette already"
        );
        let model = file
            .file_stem()
            .and_then(|s| s.to_str())
            .filter(|s| !s.is_empty())
            .with_context(|| format!("--record {}: expected a file name", file.display()))?;
        let recorder = Recorder::create(file)?.recording_model(model);
        llm = llm.with_recorder(Arc::new(recorder));
    }
    let progress = Arc::new(progress::Progress::new(progress::Mode::detect(args.quiet)));
    let mut env = RunEnv::new(registry, llm);
    env.observer = {
        let progress = progress.clone();
        Observer::new(move |event| progress.event(event))
    };
    // Ctrl-C asks the runner to stop at the next boundary (before an item, between
    // foreach rows or tool rounds); the session records `stopped`. A second
    // Ctrl-C is the usual hard stop.
    let watcher = {
        let cancel = env.cancel.clone();
        let progress = progress.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                progress.finish();
                eprintln!("stopping at the next boundary (Ctrl-C again to abort)");
                cancel.store(true, Ordering::Relaxed);
                let _ = tokio::signal::ctrl_c().await;
                std::process::exit(130);
            }
        })
    };
    let ticker = (progress.mode() == progress::Mode::Live).then(|| {
        let progress = progress.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(250));
            loop {
                every.tick().await;
                progress.tick();
            }
        })
    });
    let run = workflow_run::run_workflow(&env, root, &opts, &mut |line| progress.line(line)).await;
    watcher.abort();
    if let Some(t) = ticker {
        t.abort();
    }
    progress.finish();
    let run = run?;
    for unit in &run.units {
        match &unit.group {
            Some(g) => println!(
                "outputs of group {g}: {}",
                unit.run_dir.join("execution").display()
            ),
            None => println!("outputs: {}", unit.run_dir.join("execution").display()),
        }
        for step in &unit.steps {
            println!(
                "  {} [{}]: {} -> {}",
                step.step_id,
                step.step_type,
                status_name(step.status),
                step.output_dir.display()
            );
            let mut files: Vec<_> = std::fs::read_dir(&step.output_dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.path().is_file())
                .map(|e| e.path())
                .collect();
            files.sort();
            for file in files {
                println!("    {}", file.display());
            }
            if let Some(outcome) = &step.outcome {
                for concern in &outcome.concerns {
                    println!("    CONCERNS: {concern}");
                }
            }
            if step.status != trellis_host::sequence::session::Status::Completed {
                println!("    {}", step.detail.lines().next().unwrap_or_default());
            }
        }
    }
    let t = progress.totals();
    println!(
        "{}: {} turn{}, {} LLM call{}, {} tool call{} ({} failed), tokens {} in / {} out",
        if run.succeeded() { "done" } else { "failed" },
        t.turns,
        plural(t.turns as usize),
        t.llm_calls,
        plural(t.llm_calls as usize),
        t.tool_calls,
        plural(t.tool_calls as usize),
        t.tool_errors,
        t.prompt_tokens,
        t.completion_tokens
    );
    if let Some(recorder) = env.llm.recorder() {
        println!(
            "recorded {} LLM call{} to {}",
            recorder.len(),
            plural(recorder.len()),
            recorder.path().display()
        );
    }
    Ok(if run.succeeded() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
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

/// Lists the loaded plugins, then each plugin that failed to load (its manifest
/// and error; in JSON an object with `manifest` and `error` instead of `id`).
fn list_plugins(
    registry: &PluginRegistry,
    failures: &[(PathBuf, String)],
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
        list.extend(failures.iter().map(|(manifest, error)| {
            serde_json::json!({"manifest": manifest.display().to_string(), "error": error})
        }));
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    println!(
        "{:<16} {:<13} {:<9} {:<6} DESCRIPTION",
        "ID", "KIND", "VERSION", "TOOLS"
    );
    for plugin in registry.plugins() {
        let m = plugin.manifest();
        println!(
            "{:<16} {:<13} {:<9} {:<6} {}",
            m.id,
            m.kind.as_str(),
            m.version,
            plugin.tools().len(),
            m.description
        );
    }
    for (manifest, error) in failures {
        println!("{}  error: {error}", manifest.display());
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

fn validate(root: &std::path::Path, run: Option<&str>) -> ExitCode {
    let diagnostics = match Workspace::open_run(root, run) {
        Ok(ws) => ws.warnings,
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
    if errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

async fn check(
    registry: &PluginRegistry,
    root: &std::path::Path,
    step_id: &str,
    run: Option<&str>,
) -> Result<ExitCode> {
    let run = run.unwrap_or("iteration-0");
    let ws = Workspace::open_run(root, Some(run)).map_err(|d| anyhow::anyhow!("{d}"))?;
    let step = ws.plan.step(step_id).with_context(|| {
        let ids: Vec<_> = ws.plan.all_steps().map(|s| s.id.as_str()).collect();
        format!(
            "no step `{step_id}` in the plan (steps: {})",
            ids.join(", ")
        )
    })?;
    let schema = step
        .validation_schema
        .clone()
        .or_else(|| {
            ws.step_configs
                .get(step_id)
                .and_then(|c| c.validation_schema.clone())
        })
        .unwrap_or_default();
    let output_dir = ws.step_output_dir(step_id);
    let validators = PluginValidators::new(registry, Limits::default());
    let report = match validation::run_gate(&ws.root, &output_dir, &schema, &validators).await {
        Ok(report) => report,
        Err(err) => {
            eprintln!("error: step `{step_id}`: the gate cannot run: {err}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let run_dir = ws.run_dir();
    let logs = run_dir.join("logs").join(step_id);
    let attempt = (1..)
        .find(|n| {
            !ws.fs
                .exists(logs.join(format!("pre_validation_check_attempt_{n}.json")))
        })
        .unwrap_or(1);
    let (latest, _) =
        validation::write_report(&ws.fs, &run_dir, step_id, "check", attempt, &report)
            .with_context(|| format!("writing the report under {}", logs.display()))?;

    if report.skipped {
        println!("step `{step_id}` has no validation_schema rules: nothing to check");
    }
    for check in &report.checks {
        let mark = if check.passed { "PASS" } else { "FAIL" };
        let at = if check.path.is_empty() {
            String::new()
        } else {
            format!(" {}", check.path)
        };
        println!(
            "{mark} {}{at} [{}] {}",
            check.file, check.kind, check.message
        );
        if !check.passed {
            println!("     expected: {}", check.expected);
            println!("     actual:   {}", check.actual);
        }
    }
    for warning in &report.warnings {
        println!("warning: {warning}");
    }
    let failed = report.failures().count();
    println!(
        "{} checks, {failed} failed; report: {}",
        report.checks.len(),
        latest.display()
    );
    Ok(if report.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn migrate(root: &std::path::Path) -> Result<ExitCode> {
    match workflow::migrate::migrate_message_sequence_code_items(root) {
        Ok(summary) => {
            if summary.converted.is_empty() {
                println!("nothing to migrate: no message sequence has code items");
            }
            for converted in &summary.converted {
                println!(
                    "converted sequence `{}` into scripted steps: {}",
                    converted.sequence_id,
                    converted.new_step_ids.join(", ")
                );
            }
            for script in &summary.scripts {
                println!("wrote {}", script.display());
            }
            println!(
                "contract_version: {} -> {}",
                summary.contract_before.as_deref().unwrap_or("(none)"),
                summary.contract_after
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            eprintln!("{err}");
            Ok(ExitCode::FAILURE)
        }
    }
}
