//! `trellis run`: runs a workflow, its steps in plan order.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use trellis_runner::llm_choice::{LlmSetup, parse_llm_spec};
use trellis_runner::runtime::{ExecutionEvent, Runtime, StartOptions};
use trellis_runner::session::Status;
use trellis_runner::workflow_run::RunOptions;
use trellis_sandbox::Engine;

use super::{CacheArgs, McpConfigArg, PluginDirs, plural, registry};
use crate::progress::{Mode, Progress};
use crate::terminal::{shown, shown_name};
use tokio::signal::unix::{SignalKind, signal};

/// Arguments of `trellis run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The workspace folder.
    pub(crate) workspace: PathBuf,
    /// Run only this step, in the existing run folder (with groups, give --group too).
    #[arg(long, value_name = "ID")]
    step: Option<String>,
    /// Resume from this step in the existing run folder: it and every later step start
    /// with empty output folders, then the run goes on as usual.
    #[arg(long, value_name = "ID", conflicts_with = "step")]
    from: Option<String>,
    /// Pre-select the route of a routing step (repeatable): written to its
    /// `route_selection.json` once its output folder is emptied.
    #[arg(long = "route", value_name = "STEP=ROUTE")]
    routes: Vec<String>,
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
    /// MiB the --record cassette may take (default 64, the most Trellis reads of a
    /// workspace file); an interaction past it is not recorded, the recording stops with an
    /// error and the run goes on.
    #[arg(long, value_name = "MIB", requires = "record", value_parser = clap::value_parser!(u64).range(1..=65_536))]
    record_max_mib: Option<u64>,
    /// Ask no model to stream its reply, whatever workflow.json says (for a server that
    /// cannot stream; `"stream": false` in workflow.json's `providers.<id>` or a model's
    /// `options` does it for one provider or model).
    #[arg(long)]
    no_stream: bool,
    /// Let the key in environment variable VAR go to ORIGIN (`scheme://host[:port]`)
    /// when the workspace asks for it (repeatable). Also in
    /// $XDG_CONFIG_HOME/trellis/config.toml (else ~/.config/trellis/config.toml).
    #[arg(long = "allow-key", value_name = "VAR=ORIGIN")]
    allow_keys: Vec<String>,
    /// Let step scripts reach HOST (listed in their step's allowed_hosts) although it is,
    /// or resolves to, a loopback or private address, and LLM providers reach it when
    /// workflow.json's base_url names it; HOST:PORT, that port only (repeatable).
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_hosts: Vec<String>,
    /// The answer of a human_input step, by its variable_name (repeatable).
    #[arg(long = "input", value_name = "NAME=VALUE")]
    inputs: Vec<String>,
    /// Tool rounds a turn may take before it must answer (default 500, or
    /// `max_tool_rounds` in the user config file).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    max_tool_rounds: Option<u32>,
    /// Tool calls of one model answer that run (default 64); the model is told the rest
    /// were not run and why.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    max_calls_per_answer: Option<u32>,
    /// Seconds the tool calls of one turn take together, each call's time added (default
    /// 600); each call's deadline is no later than what is left, and past it a call is not
    /// run and the model is told why.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    max_turn_call_seconds: Option<u64>,
    /// Tool calls of one turn running at once (default: the number of CPUs).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    max_concurrent_calls: Option<u32>,
    /// MiB of tool results one turn keeps, in its conversation and offloaded to
    /// tool-results/ (default 256); a result past it is replaced by an error telling the
    /// model so.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=65_536))]
    max_turn_result_mib: Option<u64>,
    /// MiB of model answers, tool results, turn messages and system prompts the whole run
    /// keeps, every turn of every step together (default 1024); a result past it is replaced
    /// by an error telling the model so, an answer, a message or a system prompt past it
    /// ends the run.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    max_run_result_mib: Option<u64>,
    #[command(flatten)]
    writes: super::WriteBudgetArgs,
    /// Model calls of the whole run, every step, turn and sub-agent together (default
    /// 10000); past it no call is made and the run ends, failed.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    max_model_calls: Option<u64>,
    /// Retries of a failed LLM call on the same provider and model before its
    /// fallbacks (default 3): after a rate limit, a 5xx, no answer in time or a
    /// connection refused, reset or cut mid-answer.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=100))]
    llm_retries: Option<u32>,
    /// Wait before the first retry of an LLM call, in milliseconds (default 1000),
    /// doubled for each further one up to 30 s; a server's Retry-After wins.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(0..=600_000))]
    llm_retry_delay: Option<u64>,
    /// Seconds one attempt of an LLM call may take to connect, send the request and read
    /// the whole answer (default 30); a server that stalls is then retried.
    #[arg(long, value_name = "SECS")]
    llm_timeout: Option<f64>,
    /// When another process runs on the workspace, wait for it to end rather than fail
    /// at once.
    #[arg(long)]
    wait: bool,
    /// Run the agent steps on `trellis worker`s through the NATS JetStream server at URL
    /// (`nats://HOST:PORT`); the run itself (plan order, routing, human inputs, groups,
    /// loops) goes on here, and steps that write the workflow database run here too.
    /// docs/workers.md.
    #[arg(long, value_name = "URL")]
    dispatch: Option<String>,
    #[command(flatten)]
    nats: super::worker::NatsArgs,
    /// Print only the final summary.
    #[arg(long, short)]
    quiet: bool,
    #[command(flatten)]
    plugins: PluginDirs,
    #[command(flatten)]
    mcp: McpConfigArg,
    #[command(flatten)]
    pub(crate) cache: CacheArgs,
}

/// Runs the workflow as an execution of the runtime, showing its events as live progress
/// (or plain lines), then prints the outputs of every step and the totals. Exit status 1
/// when a step fails.
pub async fn run(engine: &Engine, args: RunArgs) -> Result<ExitCode> {
    let runtime = Runtime::new(Arc::new(registry(engine, &args.plugins).await?));
    let mcp = super::mcp_config(&args.mcp, runtime.registry())?;
    let root = args.workspace.as_path();
    let mut opts = RunOptions {
        step: args.step,
        from: args.from,
        group: args.group,
        ..RunOptions::default()
    };
    for route in &args.routes {
        let (step, id) = route
            .split_once('=')
            .with_context(|| format!("--route {route:?}: expected STEP=ROUTE"))?;
        opts.route_selections
            .insert(step.to_string(), id.to_string());
    }
    for input in &args.inputs {
        let (name, value) = input
            .split_once('=')
            .with_context(|| format!("--input {input:?}: expected NAME=VALUE"))?;
        opts.inputs.insert(name.to_string(), value.to_string());
    }
    let override_llm = args.llm.as_deref().map(parse_llm_spec).transpose()?;
    let approvals = super::approvals(&args.allow_keys, &args.allow_hosts)?;
    let max_tool_rounds = args
        .max_tool_rounds
        .map(|n| n as usize)
        .or(approvals.max_tool_rounds());
    let mut llm = LlmSetup::new(override_llm.clone()).with_approvals(approvals);
    if args.no_stream {
        llm = llm.without_streaming();
    }
    if let Some(file) = &args.record {
        llm = llm.with_recorder(super::recorder(
            file,
            override_llm.as_ref(),
            args.record_max_mib,
        )?);
    }
    let recorder = llm.recorder().cloned();
    let progress = Arc::new(Progress::new(Mode::detect(args.quiet)));
    let mut start = StartOptions::new(opts, llm);
    if let Some(n) = max_tool_rounds {
        start.max_tool_rounds = n;
    }
    if let Some(n) = args.max_calls_per_answer {
        start.turn_budgets.calls_per_answer = n as usize;
    }
    if let Some(seconds) = args.max_turn_call_seconds {
        start.turn_budgets.call_seconds = seconds;
    }
    if let Some(n) = args.max_concurrent_calls {
        start.turn_budgets.concurrent_calls = n as usize;
    }
    if let Some(mib) = args.max_turn_result_mib {
        start.turn_budgets.result_bytes = mib << 20;
    }
    if let Some(mib) = args.max_run_result_mib {
        start.turn_budgets.run_result_bytes = mib << 20;
    }
    args.writes.apply(&mut start.turn_budgets);
    if let Some(n) = args.max_model_calls {
        start.turn_budgets.run_model_calls = n;
    }
    if let Some(n) = args.llm_retries {
        start.retry.max_retries = n;
    }
    if let Some(ms) = args.llm_retry_delay {
        start.retry.base_delay = Duration::from_millis(ms);
    }
    if let Some(secs) = args.llm_timeout {
        anyhow::ensure!(
            secs.is_finite() && secs > 0.0 && secs <= 3600.0,
            "--llm-timeout: expected a number of seconds from 0 to 3600, found {secs}"
        );
        start.retry.attempt_timeout = Some(Duration::from_secs_f64(secs));
    }
    start.wait_for_workspace = args.wait;
    if let Some(url) = &args.dispatch {
        anyhow::ensure!(
            args.record.is_none()
                && !override_llm
                    .as_ref()
                    .is_some_and(|l| { l.provider == trellis_runner::llm_choice::REPLAY_PROVIDER }),
            "--dispatch: a recorded or replayed run keeps one cassette position for all its \
             steps, which workers on other machines cannot share; run it locally"
        );
        start.dispatch = Some(args.nats.dispatcher(url, runtime.registry()).await?);
    }
    start.mcp_config = Arc::new(mcp);
    start.tool_servers = Arc::new(trellis_mcp::client::McpClient);
    let holder = trellis_runner::workspace_lock::holder_of(root);
    if holder.is_none() {
        // Nobody holds the workspace: a step still `running` was interrupted (its process
        // was killed). Said of the current run folder (its groups too), before this run
        // moves or empties it; archived runs are left to `runs list`.
        let runs = trellis_runner::runs::list_runs(root).unwrap_or_default();
        for run in runs
            .into_iter()
            .filter(|r| r.run_folder == "iteration-0" || r.run_folder.starts_with("iteration-0/"))
        {
            for step in run.steps {
                if step.status == trellis_runner::runs::INTERRUPTED {
                    println!(
                        "step {} in runs/{} was interrupted (its process is gone)",
                        step.step_id, run.run_folder
                    );
                }
            }
        }
    }
    if args.wait
        && let Some(holder) = holder
    {
        eprintln!(
            "waiting for workspace {} (in use by {holder})",
            root.display()
        );
    }
    // Ctrl-C is listened for before the run starts: one that comes early is never lost (and
    // a disposition inherited as ignored, as in a background job, is replaced).
    let mut interrupts = signal(SignalKind::interrupt()).context("listening for Ctrl-C")?;
    let id = runtime.start_workflow(root, start);
    // Ctrl-C asks the execution to stop at the next boundary (before an item, between
    // foreach rows or tool rounds; a model reply in flight ends at once); the session
    // records `stopped`. A second cancels the
    // tool calls in flight too (guest code is interrupted); a third is the usual hard stop.
    let watcher = {
        let (runtime, id) = (runtime.clone(), id.clone());
        let progress = progress.clone();
        tokio::spawn(async move {
            if interrupts.recv().await.is_some() {
                progress.finish();
                eprintln!(
                    "stopping at the next boundary (Ctrl-C again to cancel the tool calls running)"
                );
                runtime.stop(&id);
                let _ = interrupts.recv().await;
                eprintln!("cancelling the tool calls running (Ctrl-C again to abort)");
                runtime.stop_now(&id);
                let _ = interrupts.recv().await;
                // An exit runs no destructors: the MCP servers' processes are ended first.
                trellis_mcp::client::kill_servers();
                std::process::exit(130);
            }
        })
    };
    let ticker = (progress.mode() == Mode::Live).then(|| {
        let progress = progress.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(250));
            loop {
                every.tick().await;
                progress.tick();
            }
        })
    });
    let mut events = runtime.events(&id).context("the execution just started")?;
    while let Some(event) = events.next().await {
        match event {
            ExecutionEvent::Run(event) => progress.event(&event),
            ExecutionEvent::Delivery { .. } | ExecutionEvent::End { .. } => {}
        }
    }
    let run = runtime
        .wait(&id)
        .await
        .context("the execution just started")?
        .map_err(anyhow::Error::msg);
    watcher.abort();
    if let Some(t) = ticker {
        t.abort();
    }
    progress.finish();
    let run = run?;
    for unit in &run.units {
        match &unit.group {
            // A group's name comes from the workspace (variables/variables.json): escaped.
            Some(g) => println!(
                "outputs of group {}: {}",
                shown(g),
                shown(&unit.run_dir.join("execution").display().to_string())
            ),
            None => println!("outputs: {}", unit.run_dir.join("execution").display()),
        }
        for step in &unit.steps {
            println!(
                "  {} [{}]: {} -> {}",
                step.step_id,
                step.step_type,
                step.status,
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
            // File names, concerns and details come from guests and models: shown escaped.
            for file in files {
                println!("    {}", shown_name(&file.display().to_string()));
            }
            if let Some(outcome) = &step.outcome {
                for concern in &outcome.concerns {
                    println!("    CONCERNS: {}", shown(concern));
                }
            }
            if step.status != Status::Completed {
                println!(
                    "    {}",
                    shown(step.detail.lines().next().unwrap_or_default())
                );
            }
        }
    }
    if let Some(why) = &run.cut_short {
        println!("the run stopped before its end: {why}");
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
    if let Some(recorder) = recorder {
        println!("{}", super::recorded_line(&recorder));
    }
    Ok(if run.succeeded() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
