//! `trellis builder`: the interactive builder, a chat whose agent designs, runs and repairs
//! the workflow of one workspace (spec section 11).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde_json::Value;
use tokio::sync::mpsc;

use trellis_builder::agent::{DEFAULT_MAX_ROUNDS, specs_of};
use trellis_builder::executions::Executions;
use trellis_builder::{
    BuilderEvent, BuilderObserver, BuilderSession, Mode, SessionOptions, TurnReport,
};
use trellis_runner::llm_choice::{LlmSetup, parse_llm_spec};
use trellis_runner::runtime::{Runtime, StartOptions};
use trellis_runner::workflow_run::RunOptions;
use trellis_sandbox::Engine;
use trellis_sandbox::llm::{ReplyEvent, RetryPolicy};

use super::{CacheArgs, PluginDirs, registry};

/// Arguments of `trellis builder`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BuilderArgs {
    #[command(subcommand)]
    command: Option<BuilderCommand>,
    /// The workspace folder.
    #[arg(required = true)]
    pub(crate) workspace: Option<PathBuf>,
    /// The workshop mode: builder (default), optimizer, run, debugger, eval, output
    /// (aliases: workshop, runner, ask). A resumed session keeps its own unless given.
    #[arg(long, value_name = "MODE")]
    mode: Option<String>,
    /// Resume this session exactly where it was (history and mode).
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// The builder's own model, `provider:model` (e.g. `openai:gpt-4o`, `replay:NAME`);
    /// else workflow.json `builder_llm`, else its `llm`. Executions use their steps' models,
    /// as `trellis run` does.
    #[arg(long, value_name = "PROVIDER:MODEL")]
    llm: Option<String>,
    /// Write every answered LLM call of the builder to the cassette FILE (replaced); put it
    /// at `<workspace>/cassettes/NAME.json` and replay the session with `--llm replay:NAME`.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// MiB the --record cassette may take (default 64, the most Trellis reads of a
    /// workspace file); an interaction past it is not recorded, the recording stops with an
    /// error and the run goes on.
    #[arg(long, value_name = "MIB", requires = "record", value_parser = clap::value_parser!(u64).range(1..=65_536))]
    record_max_mib: Option<u64>,
    /// Run non-interactively: each message is a turn (repeatable). A turn starts only once
    /// the executions of the previous turns and their completion turns have finished; the
    /// command waits the same way before it exits. Exit status 0 when the last turn ended
    /// normally.
    #[arg(long = "message", short = 'm', value_name = "TEXT")]
    messages: Vec<String>,
    /// Let the key in environment variable VAR go to ORIGIN (repeatable), as for `trellis run`.
    #[arg(long = "allow-key", value_name = "VAR=ORIGIN")]
    allow_keys: Vec<String>,
    /// Let step scripts, and LLM providers at workflow.json's base_url, reach HOST although
    /// it is loopback or private (repeatable), as for `trellis run`.
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_hosts: Vec<String>,
    /// Tool rounds a builder turn may take before it must answer.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_ROUNDS as u32,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    max_rounds: u32,
    /// Model calls of the whole session, every turn, side agent and execution it started
    /// together (default 10000, as for a run); past it no call is made and the turn (or the
    /// execution) ends saying so.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    max_model_calls: Option<u64>,
    /// MiB of tool results one builder turn keeps in its conversation (default 256), as for
    /// `trellis run`; a result past it is replaced by an error telling the model so.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=65_536))]
    max_turn_result_mib: Option<u64>,
    #[command(flatten)]
    writes: super::WriteBudgetArgs,
    /// Retries of a failed LLM call (default 3), as for `trellis run`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=100))]
    llm_retries: Option<u32>,
    /// Ask no model to stream its reply, whatever workflow.json says (for a server that
    /// cannot stream; `"stream": false` in workflow.json's `providers.<id>` or a model's
    /// `options` does it for one provider or model).
    #[arg(long)]
    no_stream: bool,
    #[command(flatten)]
    plugins: PluginDirs,
    #[command(flatten)]
    mcp: super::McpConfigArg,
    #[command(flatten)]
    pub(crate) cache: CacheArgs,
}

#[derive(Subcommand, Debug)]
enum BuilderCommand {
    /// Print the tools of a workshop mode, with what each does.
    Tools {
        /// The mode (or alias).
        #[arg(long, value_name = "MODE", default_value = "builder")]
        mode: String,
    },
}

impl BuilderArgs {
    /// The workspace folder, when a session is asked for.
    pub fn workspace(&self) -> Option<&std::path::Path> {
        match self.command {
            Some(_) => None,
            None => self.workspace.as_deref(),
        }
    }
}

/// The `--allow-key` and `--allow-host` arguments of a command.
pub(crate) struct Approvals<'a> {
    pub keys: &'a [String],
    pub hosts: &'a [String],
}

/// What a builder session is made with: the runtime its executions run on, the builder's
/// own model setup (`--llm` over `builder_llm`), the options its executions start with
/// (their steps' own models, the operator's MCP servers) and the retries of its LLM calls.
pub(crate) struct BuilderSetup {
    pub runtime: Runtime,
    pub own: LlmSetup,
    pub template: StartOptions,
    pub retry: RetryPolicy,
}

/// The [`BuilderSetup`] of `trellis builder` and `trellis serve`.
pub(crate) async fn builder_setup(
    engine: &Engine,
    plugins: &PluginDirs,
    mcp: &super::McpConfigArg,
    approvals: Approvals<'_>,
    llm: Option<&str>,
    llm_retries: Option<u32>,
    no_stream: bool,
) -> Result<BuilderSetup> {
    let runtime = Runtime::new(Arc::new(registry(engine, plugins).await?));
    let approvals = super::approvals(approvals.keys, approvals.hosts)?;
    let override_llm = llm.map(parse_llm_spec).transpose()?;
    let mut own = LlmSetup::new(override_llm)
        .with_approvals(approvals.clone())
        .with_providers(runtime.registry().llm_provider_ids());
    let mut retry = RetryPolicy::default();
    if let Some(n) = llm_retries {
        retry.max_retries = n;
    }
    let mut steps_llm = LlmSetup::new(None)
        .with_approvals(approvals)
        .with_providers(runtime.registry().llm_provider_ids());
    if no_stream {
        own = own.without_streaming();
        steps_llm = steps_llm.without_streaming();
    }
    let mut template = StartOptions::new(RunOptions::default(), steps_llm);
    template.retry = retry;
    template.mcp_config = Arc::new(super::mcp_config(mcp, runtime.registry())?);
    template.tool_servers = Arc::new(trellis_mcp::client::McpClient);
    Ok(BuilderSetup {
        runtime,
        own,
        template,
        retry,
    })
}

/// Runs `trellis builder`.
pub async fn run(engine: impl FnOnce() -> Result<Engine>, args: BuilderArgs) -> Result<ExitCode> {
    if let Some(BuilderCommand::Tools { mode }) = &args.command {
        return print_tools(mode);
    }
    let root = args
        .workspace
        .clone()
        .context("give the workspace folder")?;
    let engine = engine()?;
    let mode = args
        .mode
        .as_deref()
        .map(str::parse::<Mode>)
        .transpose()
        .map_err(anyhow::Error::msg)
        .context("--mode")?;
    let BuilderSetup {
        runtime,
        mut own,
        template,
        retry,
    } = builder_setup(
        &engine,
        &args.plugins,
        &args.mcp,
        Approvals {
            keys: &args.allow_keys,
            hosts: &args.allow_hosts,
        },
        args.llm.as_deref(),
        args.llm_retries,
        args.no_stream,
    )
    .await?;
    if let Some(file) = &args.record {
        let override_llm = args.llm.as_deref().map(parse_llm_spec).transpose()?;
        own = own.with_recorder(super::recorder(
            file,
            override_llm.as_ref(),
            args.record_max_mib,
        )?);
    }
    // The executions the session starts begin within its budgets (their writes come out of
    // the session's, which it shares with them).
    let mut template = template;
    args.writes.apply(&mut template.turn_budgets);
    let executions = Executions::new(runtime.clone(), template);
    let interactive = args.messages.is_empty();
    let observer = printer(interactive);
    let recorder = own.recorder().cloned();
    let mut session = BuilderSession::open(
        &runtime,
        executions,
        SessionOptions {
            root: root.clone(),
            session_id: args.session.clone(),
            mode,
            llm: own,
            limits: Default::default(),
            retry,
            max_rounds: args.max_rounds as usize,
            max_turn_result_bytes: args
                .max_turn_result_mib
                .map_or(trellis_builder::DEFAULT_TURN_RESULT_BYTES, |mib| mib << 20),
            max_turn_write_bytes: args.writes.turn_bytes(),
            max_run_write_bytes: args.writes.run_bytes(),
            max_workspace_bytes: args.writes.workspace_bytes(),
            max_model_calls: args
                .max_model_calls
                .unwrap_or(trellis_runner::driver::DEFAULT_RUN_MODEL_CALLS),
            observer,
        },
    )?;
    eprintln!(
        "builder session {} on {} in {} mode (conversation: {})",
        session.id(),
        root.display(),
        session.mode(),
        session.file().display()
    );
    let ended_normally = if interactive {
        chat(&mut session).await?
    } else {
        scripted(&mut session, &args.messages).await?
    };
    if let Some(recorder) = recorder {
        eprintln!("{}", super::recorded_line(&recorder));
    }
    Ok(if ended_normally {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `--message` mode: each message a turn, each after the previous turn's work and its
/// completion turns; waits the same way at the end. Whether the last turn ended normally.
async fn scripted(session: &mut BuilderSession, messages: &[String]) -> Result<bool> {
    let mut last = true;
    for message in messages {
        println!("> {message}");
        let report = session.turn(message).await?;
        last = show_end(&report);
        for report in session.settle().await? {
            last = show_end(&report);
        }
    }
    Ok(last)
}

/// The interactive chat. Whether the last turn ended normally.
async fn chat(session: &mut BuilderSession) -> Result<bool> {
    println!("Type a message, or /mode NAME, /executions, /stop [ID], /cost, /help, /quit.");
    let (ask, mut lines) = line_reader()?;
    let mut last = true;
    loop {
        ask.send(format!("{}> ", session.mode()))
            .context("the line editor stopped")?;
        let line = loop {
            tokio::select! {
                line = lines.recv() => break line,
                _ = tokio::time::sleep(std::time::Duration::from_millis(250)) => {
                    for report in session.completion_turns().await? {
                        last = show_end(&report);
                    }
                }
            }
        };
        let Some(line) = line else {
            break;
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        match line.split_once(' ').unwrap_or((line, "")) {
            ("/quit" | "/exit", _) => break,
            ("/help", _) => println!(
                "/mode NAME     switch mode (builder, optimizer, run, debugger, eval, output)\n\
                 /executions    list the executions of this session\n\
                 /stop [ID]     stop one execution, or all\n\
                 /cost          tokens and cost of this session\n\
                 /quit          leave (running work is waited for)"
            ),
            ("/mode", name) => match name.trim().parse::<Mode>() {
                Ok(mode) => {
                    session.set_mode(mode)?;
                    println!("mode: {mode} ({})", mode.purpose());
                }
                Err(e) => println!("{e}"),
            },
            ("/executions", _) => {
                print_json(&session_tool(session, "list_executions", &serde_json::json!({})).await)
            }
            ("/stop", id) if id.trim().is_empty() => print_json(
                &session_tool(session, "stop_all_executions", &serde_json::json!({})).await,
            ),
            ("/stop", id) => print_json(
                &session_tool(
                    session,
                    "stop_step",
                    &serde_json::json!({"execution_id": id.trim()}),
                )
                .await,
            ),
            ("/cost", _) => {
                let usage = session.usage();
                let cost = session.cost()?;
                println!(
                    "tokens {} in / {} out{}",
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    cost.cost_usd
                        .map(|c| format!(", ${c:.4}"))
                        .unwrap_or_else(|| " (no price in workflow.json pricing)".into())
                );
            }
            (command, _) if command.starts_with('/') => {
                println!("unknown command {command}: type /help")
            }
            _ => {
                let report = session.turn(line).await?;
                last = show_end(&report);
            }
        }
    }
    let running = session.executions().running();
    if !running.is_empty() || !session.side_agents_running().is_empty() {
        eprintln!("waiting for the work still running to finish (Ctrl-C to leave it)...");
    }
    for report in session.settle().await? {
        last = show_end(&report);
    }
    Ok(last)
}

/// Calls an execution tool for a slash command, in the operator's name.
async fn session_tool(session: &BuilderSession, name: &str, args: &Value) -> Value {
    session.operator_call(name, args).await
}

/// A thread reading lines with history and line editing: send it a prompt, get a line
/// back (`None` at end of input).
fn line_reader() -> Result<(
    std::sync::mpsc::Sender<String>,
    mpsc::UnboundedReceiver<String>,
)> {
    let (ask, prompts) = std::sync::mpsc::channel::<String>();
    let (send, lines) = mpsc::unbounded_channel();
    let mut editor = rustyline::DefaultEditor::new().context("starting the line editor")?;
    let history = history_file();
    if let Some(file) = &history {
        let _ = editor.load_history(file);
    }
    std::thread::Builder::new()
        .name("trellis-line-editor".into())
        .spawn(move || {
            // Output while a prompt is up goes above it (a completion turn's reply, an
            // execution's lines); without a terminal there is no such printer.
            if let Ok(printer) = editor.create_external_printer() {
                *EDITOR_PRINTER.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(printer));
            }
            while let Ok(prompt) = prompts.recv() {
                EDITING.store(true, std::sync::atomic::Ordering::SeqCst);
                let read = editor.readline(&prompt);
                EDITING.store(false, std::sync::atomic::Ordering::SeqCst);
                match read {
                    Ok(line) => {
                        let _ = editor.add_history_entry(line.as_str());
                        if let Some(file) = &history {
                            if let Some(dir) = file.parent() {
                                let _ = std::fs::create_dir_all(dir);
                            }
                            let _ = editor.save_history(file);
                        }
                        if send.send(line).is_err() {
                            return;
                        }
                    }
                    Err(rustyline::error::ReadlineError::Interrupted) => {
                        if send.send(String::new()).is_err() {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
        })
        .context("starting the line editor")?;
    Ok((ask, lines))
}

/// `$XDG_STATE_HOME/trellis/builder_history`, else `~/.local/state/trellis/builder_history`.
fn history_file() -> Option<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
    Some(state.join("trellis").join("builder_history"))
}

/// Where the builder's output goes while the line editor shows a prompt: through the
/// editor's printer, which keeps the prompt and what is typed whole under the lines. Set by
/// the line editor's thread around each prompt.
static EDITOR_PRINTER: std::sync::Mutex<Option<Box<dyn rustyline::ExternalPrinter + Send>>> =
    std::sync::Mutex::new(None);
/// Whether the line editor shows a prompt now.
static EDITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What the printer has shown of the reply arriving.
#[derive(Debug, Default)]
struct Streamed {
    /// The answer arriving showed text already: its whole text is not printed again.
    any: bool,
    /// The last text shown did not end its line.
    open: bool,
    /// Text of a line not shown yet (while a prompt is up only whole lines go out).
    line: String,
}

/// Prints events as they come: the agent's text as it arrives, a line per tool call and per
/// execution event.
pub(crate) fn printer(interactive: bool) -> BuilderObserver {
    use crate::terminal::shown;
    let dim = interactive && std::io::stdout().is_terminal();
    let streamed = std::sync::Mutex::new(Streamed::default());
    BuilderObserver::new(move |event| {
        let mut streamed = streamed.lock().unwrap_or_else(|e| e.into_inner());
        let mut text = String::new();
        // A line of the reply left open ends before anything else is printed.
        let close = |streamed: &mut Streamed, text: &mut String| {
            if streamed.open || !streamed.line.is_empty() {
                text.push_str(&std::mem::take(&mut streamed.line));
                text.push('\n');
                streamed.open = false;
            }
        };
        match event {
            BuilderEvent::Reply(ReplyEvent::Text(piece)) => {
                streamed.any = true;
                let piece = shown(piece);
                if EDITING.load(std::sync::atomic::Ordering::SeqCst) {
                    // Whole lines only, above the prompt.
                    streamed.line.push_str(&piece);
                    if let Some(at) = streamed.line.rfind('\n') {
                        let rest = streamed.line.split_off(at + 1);
                        text = std::mem::replace(&mut streamed.line, rest);
                    }
                } else {
                    text.push_str(&std::mem::take(&mut streamed.line));
                    text.push_str(&piece);
                    streamed.open = !text.ends_with('\n');
                }
            }
            BuilderEvent::Reply(ReplyEvent::Restarted { reason }) => {
                close(&mut streamed, &mut text);
                streamed.any = false;
                text.push_str(&format!(
                    "  (the reply starts over: {})\n",
                    shown(&first_line(reason))
                ));
            }
            BuilderEvent::Reply(ReplyEvent::ToolCall { .. }) => {}
            BuilderEvent::AgentText(whole) => {
                if std::mem::take(&mut streamed.any) {
                    close(&mut streamed, &mut text);
                } else {
                    text = format!("{}\n", shown(whole));
                }
            }
            BuilderEvent::ToolStarted {
                name, arguments, ..
            } => {
                close(&mut streamed, &mut text);
                let args: String = arguments.to_string().chars().take(120).collect();
                let (name, args) = (shown(name), shown(&args));
                text.push_str(&if dim {
                    format!("\x1b[2m  -> {name} {args}\x1b[0m\n")
                } else {
                    format!("  -> {name} {args}\n")
                });
            }
            BuilderEvent::ToolEnded {
                name, ok, summary, ..
            } => {
                close(&mut streamed, &mut text);
                text.push_str(&format!(
                    "  {} {}: {}\n",
                    if *ok { "ok" } else { "FAILED" },
                    shown(name),
                    shown(&first_line(summary))
                ));
            }
            BuilderEvent::Execution { id, line } => {
                close(&mut streamed, &mut text);
                text.push_str(&format!("  [{id}] {}\n", shown(&first_line(line))));
            }
            // The session's loop prints the end of each turn itself.
            BuilderEvent::TurnStarted { .. } => {}
            BuilderEvent::TurnEnded { .. } => {
                close(&mut streamed, &mut text);
                streamed.any = false;
            }
        }
        drop(streamed);
        if !text.is_empty() {
            print_out(text);
        }
    })
}

/// Prints `text`: above the prompt while the line editor shows one, else on stdout as it is.
fn print_out(text: String) {
    if EDITING.load(std::sync::atomic::Ordering::SeqCst) {
        let mut printer = EDITOR_PRINTER.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(printer) = printer.as_mut() {
            let _ = printer.print(text.strip_suffix('\n').unwrap_or(&text).to_string());
            return;
        }
    }
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// The first line of `text`, marked as cut when there is more.
fn first_line(text: &str) -> String {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default();
    if lines.next().is_some() {
        format!("{first} ...")
    } else {
        first.to_string()
    }
}

/// Says how a turn ended when it did not end normally; whether it did.
fn show_end(report: &TurnReport) -> bool {
    use crate::terminal::shown;
    if let Some(error) = &report.error {
        eprintln!("the turn ended early: {}", shown(error));
    }
    report.ended_normally
}

fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

/// `trellis builder tools --mode M`: the mode's row of the table.
fn print_tools(mode: &str) -> Result<ExitCode> {
    let mode: Mode = mode.parse().map_err(anyhow::Error::msg).context("--mode")?;
    println!("{mode} mode: {}", mode.purpose());
    if !mode.writable_folders().is_empty() {
        println!(
            "writes files under: {}",
            mode.writable_folders()
                .iter()
                .map(|f| format!("{f}/"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for spec in specs_of(mode) {
        let first = spec.description.split(". ").next().unwrap_or_default();
        println!("  {:<36} {}", spec.name, first.trim_end_matches('.'));
    }
    let missing: Vec<&str> = mode
        .tools()
        .into_iter()
        .filter(|t| !specs_of(mode).iter().any(|s| s.name == *t))
        .collect();
    anyhow::ensure!(
        missing.is_empty(),
        "tools without a spec: {}",
        missing.join(", ")
    );
    Ok(ExitCode::SUCCESS)
}
