//! `trellis worker`: runs the steps that `trellis run --dispatch` publishes to a pool, each
//! through the same runtime, sandbox, limits, plugins and key approvals as a local run.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use clap::Args;
use tokio::signal::unix::{SignalKind, signal};
use trellis_runner::dispatch::RemoteOutcome;
use trellis_runner::llm_choice::LlmSetup;
use trellis_runner::runtime::{Runtime, StartOptions};
use trellis_sandbox::Engine;
use trellis_worker::{Bus, StepRunner, Worker};

use super::{CacheArgs, McpConfigArg, PluginDirs, registry};

/// How to reach the NATS server: shared by `trellis worker` and `trellis run --dispatch`.
#[derive(Args, Debug, Default)]
pub struct NatsArgs {
    /// The pool of workers: a dispatcher's steps go to the workers of its pool (default
    /// `default`).
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub pool: String,
    /// A NATS credentials file (JWT and NKey seed), as `nsc` writes it.
    #[arg(long = "nats-creds", value_name = "FILE")]
    pub creds: Option<PathBuf>,
    /// A file holding an NKey seed.
    #[arg(long = "nats-nkey", value_name = "FILE")]
    pub nkey: Option<PathBuf>,
    /// The environment variable holding a token for the NATS server.
    #[arg(long = "nats-token-env", value_name = "VAR")]
    pub token_env: Option<String>,
    /// A user for the NATS server; its password is in the environment variable
    /// TRELLIS_NATS_PASSWORD.
    #[arg(long = "nats-user", value_name = "USER")]
    pub user: Option<String>,
    /// CA certificates (PEM) to trust for the NATS server's TLS; TLS is then required.
    #[arg(long = "nats-ca", value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Require TLS with the NATS server (also `tls://` URLs).
    #[arg(long = "nats-tls")]
    pub tls: bool,
    /// Keep the steps' bundles (what a step may read, what it wrote) in DIR, a folder the
    /// dispatcher and every worker of the pool reach (a shared file system), instead of the
    /// NATS server's object store. Give the same folder on both sides.
    #[arg(long = "artifacts", value_name = "DIR")]
    pub artifacts: Option<PathBuf>,
}

impl NatsArgs {
    /// The store of `--artifacts DIR`, when given.
    pub fn artifact_store(&self) -> Result<Option<Arc<dyn trellis_worker::ArtifactStore>>> {
        Ok(match &self.artifacts {
            Some(dir) => Some(Arc::new(trellis_worker::FolderArtifacts::new(dir)?)),
            None => None,
        })
    }

    /// The connection options for the server at `url`.
    pub fn options(&self, url: &str) -> Result<trellis_worker::NatsOptions> {
        let token = match &self.token_env {
            Some(var) => Some(
                std::env::var(var)
                    .with_context(|| format!("--nats-token-env {var}: the variable is not set"))?,
            ),
            None => None,
        };
        let user = match &self.user {
            Some(user) => Some((
                user.clone(),
                std::env::var("TRELLIS_NATS_PASSWORD").context(
                    "--nats-user: its password goes in the environment variable \
                     TRELLIS_NATS_PASSWORD, which is not set",
                )?,
            )),
            None => None,
        };
        trellis_worker::check_pool(&self.pool)?;
        Ok(trellis_worker::NatsOptions {
            url: url.to_string(),
            creds: self.creds.clone(),
            nkey: self.nkey.clone(),
            token,
            user,
            tls_ca: self.ca.clone(),
            tls: self.tls || url.starts_with("tls://"),
        })
    }
}

/// Arguments of `trellis worker`.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The NATS server, `nats://HOST:PORT` (`tls://` for TLS).
    #[arg(long, value_name = "URL")]
    nats: String,
    #[command(flatten)]
    connection: NatsArgs,
    /// Steps this worker runs at once (default 1).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    concurrency: u32,
    /// The name this worker goes by in step states and failures (default: host-pid).
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// Let the key in environment variable VAR go to ORIGIN (repeatable), as `trellis run`.
    #[arg(long = "allow-key", value_name = "VAR=ORIGIN")]
    allow_keys: Vec<String>,
    /// Let scripts and providers reach HOST at a loopback or private address (repeatable),
    /// as `trellis run`.
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_hosts: Vec<String>,
    #[command(flatten)]
    plugins: PluginDirs,
    #[command(flatten)]
    mcp: McpConfigArg,
    #[command(flatten)]
    pub(crate) cache: CacheArgs,
}

/// The third-party plugins of `registry`, `(id, version)`: what a step may need a worker to
/// have.
pub fn third_party(registry: &trellis_sandbox::PluginRegistry) -> Vec<(String, String)> {
    registry
        .plugins()
        .filter(|p| !matches!(p.source(), trellis_sandbox::plugins::PluginSource::Bundled))
        .map(|p| (p.manifest().id.clone(), p.manifest().version.clone()))
        .collect()
}

impl NatsArgs {
    /// The dispatcher of `--dispatch URL` for a run or server whose plugins are those of
    /// `registry`: the pool's workers, with its connection options and `--artifacts`.
    pub async fn dispatcher(
        &self,
        url: &str,
        registry: &trellis_sandbox::PluginRegistry,
    ) -> Result<Arc<dyn trellis_runner::dispatch::StepDispatch>> {
        let dispatch = trellis_worker::NatsDispatch::connect(&self.options(url)?, &self.pool)
            .await?
            .with_plugins(third_party(registry));
        Ok(match self.artifact_store()? {
            Some(store) => Arc::new(dispatch.with_artifacts(store)),
            None => Arc::new(dispatch),
        })
    }
}

/// Takes tasks until Ctrl-C or SIGTERM.
pub async fn run(engine: &Engine, args: WorkerArgs) -> Result<ExitCode> {
    let runtime = Runtime::new(Arc::new(registry(engine, &args.plugins).await?));
    let plugins = third_party(runtime.registry());
    let mcp = Arc::new(super::mcp_config(&args.mcp, runtime.registry())?);
    let approvals = super::approvals(&args.allow_keys, &args.allow_hosts)?;
    let llm = LlmSetup::new(None).with_approvals(approvals);
    let mut bus = Bus::open(&args.connection.options(&args.nats)?).await?;
    if let Some(store) = args.connection.artifact_store()? {
        bus = bus.with_artifacts(store);
    }
    let runner: StepRunner = Arc::new(move |root, run, cancel: Arc<AtomicBool>, observer| {
        let (runtime, llm, mcp) = (runtime.clone(), llm.clone(), mcp.clone());
        Box::pin(async move {
            let step = run.step.clone().unwrap_or_default();
            let mut start = StartOptions::new(run, llm);
            start.observer = observer;
            start.mcp_config = mcp;
            start.tool_servers = Arc::new(trellis_mcp::client::McpClient);
            let id = runtime.start_workflow(&root, start);
            let stopper = {
                let (runtime, id) = (runtime.clone(), id.clone());
                tokio::spawn(async move {
                    while !cancel.load(Ordering::SeqCst) {
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                    runtime.stop_now(&id);
                })
            };
            let ended = runtime.wait(&id).await;
            stopper.abort();
            let run = ended
                .context("the execution just started")?
                .map_err(anyhow::Error::msg)?;
            let outcome = run
                .units
                .iter()
                .flat_map(|u| u.steps.iter())
                .rev()
                .find(|s| s.step_id == step)
                .and_then(|s| s.outcome.as_ref())
                .with_context(|| format!("step {step} ran no agent"))?;
            Ok(RemoteOutcome::of(outcome))
        })
    });
    let name = args
        .name
        .clone()
        .unwrap_or_else(trellis_worker::default_name);
    let worker = Worker::new(
        bus,
        &args.connection.pool,
        &name,
        args.concurrency as usize,
        runner,
    )?
    .with_plugins(plugins);
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        tokio::spawn(async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
            stop.store(true, Ordering::SeqCst);
        });
    }
    eprintln!(
        "worker {name} takes the steps of pool {} from {}",
        args.connection.pool, args.nats
    );
    worker.run(stop).await?;
    Ok(ExitCode::SUCCESS)
}
