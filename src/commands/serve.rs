//! `trellis serve`: the operator console of one workspace over HTTP: the builder chat, live
//! executions and run results, for the page at `/` and any other client (docs/server.md).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;

use trellis_builder::executions::Executions;
use trellis_builder::{BuilderSession, Mode, SessionOptions};
use trellis_sandbox::Engine;
use trellis_server::{Limits, ServedWorkspace, ServerOptions, SessionFactory};

use super::builder::{Approvals, BuilderSetup, builder_setup};
use super::{CacheArgs, PluginDirs};

/// Arguments of `trellis serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The workspace folder, and any more to serve beside it (a request names one by its
    /// folder's name with `?workspace=NAME`; without it, the first).
    #[arg(required = true, num_args = 1.., value_name = "WORKSPACE")]
    pub(crate) workspaces: Vec<PathBuf>,
    /// The address to listen on. Any address but loopback needs TRELLIS_TOKEN set; with it
    /// set, every request needs `Authorization: Bearer <token>`.
    #[arg(long, value_name = "IP:PORT", default_value = trellis_server::DEFAULT_ADDR)]
    addr: SocketAddr,
    /// The builder's model (PROVIDER:MODEL), over workflow.json's `builder_llm`.
    #[arg(long, value_name = "PROVIDER:MODEL")]
    llm: Option<String>,
    /// Ask no model to stream its reply, whatever workflow.json says (for a server that
    /// cannot stream; `"stream": false` in workflow.json's `providers.<id>` or a model's
    /// `options` does it for one provider or model).
    #[arg(long)]
    no_stream: bool,
    /// Let the key in environment variable VAR go to ORIGIN (repeatable), as for `trellis run`.
    #[arg(long = "allow-key", value_name = "VAR=ORIGIN")]
    allow_keys: Vec<String>,
    /// Let step scripts, and LLM providers at workflow.json's base_url, reach HOST although
    /// it is loopback or private (repeatable), as for `trellis run`.
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_hosts: Vec<String>,
    /// Event streams open at once (default 64); past it a stream is refused with 503.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    max_streams: Option<u32>,
    /// MiB of answers being sent at once (default 256; an answer waits in memory until its
    /// client reads it); past it an answer is refused with 503 busy.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=65_536))]
    max_answer_mib: Option<u64>,
    /// Builder sessions the server holds per workspace (default 16); past it a query for a new session is
    /// refused with 503.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000))]
    max_sessions: Option<u32>,
    /// Executions running at once on a workspace that the API may start one more beside
    /// (default 8); past it a start is refused with 503.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000))]
    max_executions: Option<u32>,
    /// Run the agent steps of the executions (the API's, the builder's, the schedules') on
    /// `trellis worker`s through the NATS JetStream server at URL, as `trellis run
    /// --dispatch` does. docs/workers.md.
    #[arg(long, value_name = "URL")]
    dispatch: Option<String>,
    #[command(flatten)]
    nats: super::worker::NatsArgs,
    #[command(flatten)]
    writes: super::WriteBudgetArgs,
    #[command(flatten)]
    plugins: PluginDirs,
    #[command(flatten)]
    mcp: super::McpConfigArg,
    #[command(flatten)]
    pub(crate) cache: CacheArgs,
}

/// Runs `trellis serve` until the process is stopped.
pub async fn run(engine: &Engine, args: ServeArgs) -> Result<ExitCode> {
    let token = std::env::var("TRELLIS_TOKEN")
        .ok()
        .filter(|t| !t.is_empty());
    let BuilderSetup {
        runtime,
        own,
        mut template,
        retry,
    } = builder_setup(
        engine,
        &args.plugins,
        &args.mcp,
        Approvals {
            keys: &args.allow_keys,
            hosts: &args.allow_hosts,
        },
        args.llm.as_deref(),
        None,
        args.no_stream,
    )
    .await?;
    args.writes.apply(&mut template.turn_budgets);
    if let Some(url) = &args.dispatch {
        template.dispatch = Some(args.nats.dispatcher(url, runtime.registry()).await?);
    }
    let api_template = template.clone();
    let max_running = args
        .max_executions
        .map_or(trellis_runner::runtime::DEFAULT_MAX_RUNNING, |n| n as usize);
    let writes = args.writes;
    let workspaces = args
        .workspaces
        .iter()
        .map(|root| {
            let served = root.clone();
            let (root, session_runtime) = (root.clone(), runtime.clone());
            let (template, own) = (template.clone(), own.clone());
            let sessions: SessionFactory = Arc::new(move |id, mode: Option<Mode>, observer| {
                let executions = Executions::new(session_runtime.clone(), template.clone())
                    .with_max_running(max_running);
                BuilderSession::open(
                    &session_runtime,
                    executions,
                    SessionOptions {
                        root: root.clone(),
                        session_id: id.map(str::to_string),
                        mode,
                        // Each session replays a cassette from its start.
                        llm: own.with_own_replay(),
                        limits: Default::default(),
                        retry,
                        max_rounds: trellis_builder::agent::DEFAULT_MAX_ROUNDS,
                        max_turn_result_bytes: trellis_builder::DEFAULT_TURN_RESULT_BYTES,
                        max_turn_write_bytes: writes.turn_bytes(),
                        max_run_write_bytes: writes.run_bytes(),
                        max_workspace_bytes: writes.workspace_bytes(),
                        max_model_calls: trellis_runner::driver::DEFAULT_RUN_MODEL_CALLS,
                        observer,
                    },
                )
            });
            ServedWorkspace {
                root: served,
                sessions,
            }
        })
        .collect();
    let defaults = Limits::default();
    let limits = Limits {
        streams: args.max_streams.map_or(defaults.streams, |n| n as usize),
        answer_bytes: args
            .max_answer_mib
            .map_or(defaults.answer_bytes, |mib| mib << 20),
        sessions: args.max_sessions.map_or(defaults.sessions, |n| n as usize),
        executions: args
            .max_executions
            .map_or(defaults.executions, |n| n as usize),
        ..defaults
    };
    let shown: Vec<String> = args
        .workspaces
        .iter()
        .map(|w| w.display().to_string())
        .collect();
    let workspace = shown.join(", ");
    if args.dispatch.is_some() {
        stop_executions_on_signal(runtime.clone())?;
    }
    trellis_server::serve(
        ServerOptions {
            workspaces,
            addr: args.addr,
            token,
            runtime,
            template: api_template,
            limits,
        },
        |addr| {
            eprintln!("serving {workspace} on http://{addr}/ (Ctrl-C stops)");
        },
    )
    .await
    .context("trellis serve")?;
    Ok(ExitCode::SUCCESS)
}

/// How long a stopped server waits for its executions to end (their steps stopped on their
/// workers, their bundles deleted).
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// On Ctrl-C or SIGTERM, stops every running execution of `runtime` and exits once they
/// ended (at most [`STOP_WAIT`]): a step dispatched to a worker is stopped there, not left
/// running without its dispatcher.
fn stop_executions_on_signal(runtime: trellis_runner::runtime::Runtime) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::spawn(async move {
        let code = tokio::select! {
            _ = interrupt.recv() => 130,
            _ = terminate.recv() => 143,
        };
        let running = || {
            runtime
                .list()
                .into_iter()
                .filter(|e| e.status == trellis_runner::runtime::ExecutionStatus::Running)
                .map(|e| e.id)
                .collect::<Vec<_>>()
        };
        let stopping = running();
        if !stopping.is_empty() {
            eprintln!(
                "stopping {} execution(s) (their steps on workers too)",
                stopping.len()
            );
        }
        for id in &stopping {
            runtime.stop_now(id);
        }
        let deadline = std::time::Instant::now() + STOP_WAIT;
        while !running().is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        std::process::exit(code);
    });
    Ok(())
}

impl ServeArgs {
    /// The first workspace: the one a request without `?workspace=` is for.
    pub(crate) fn workspace(&self) -> &std::path::Path {
        &self.workspaces[0]
    }

    /// The workspaces after the first.
    pub(crate) fn more_workspaces(&self) -> &[PathBuf] {
        &self.workspaces[1..]
    }
}
