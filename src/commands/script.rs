//! `trellis script`: runs one step's script in its sandbox, outside a workflow run.
//!
//! The workspace's database is seeded first, as `trellis run` seeds it: a script run on a
//! fresh workspace would otherwise leave an empty `db/db.sqlite`, which no run seeds after.

// What is printed here was written by models, guests or workspaces: escaped.
use crate::terminal::eprintln_shown as eprintln;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use trellis_runner::events::RunEvent;
use trellis_runner::step_script::{self, ScriptOptions};
use trellis_runner::workflow_run::{DB_FILE, SEED_SQL, seed_database};
use trellis_sandbox::Engine;
use trellis_sandbox::script::ScriptRunner;

use super::open_workspace;

/// Arguments of `trellis script`.
#[derive(Args, Debug)]
pub struct ScriptArgs {
    /// The workspace folder.
    pub(crate) workspace: PathBuf,
    /// The step whose script to run (`code/<ID>/main.wasm`, else `code/<ID>/main.py`).
    #[arg(long, value_name = "ID")]
    step: String,
    /// Run folder under `runs/` [default: iteration-0].
    #[arg(long, value_name = "FOLDER")]
    run: Option<String>,
    /// The group of workflow.json (its id) whose variable values apply.
    #[arg(long, value_name = "ID")]
    group: Option<String>,
    /// A variable over workflow.json's, seen as VAR_<NAME> (repeatable).
    #[arg(long = "var", value_name = "NAME=VALUE")]
    vars: Vec<String>,
    /// Wall-clock deadline, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 120.0)]
    timeout: f64,
    /// Memory limit, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 512)]
    memory: usize,
    /// Let the secret in environment variable VAR (SECRET_<NAME>) go to ORIGIN
    /// (`scheme://host[:port]`) in the script's request headers (repeatable).
    #[arg(long = "allow-key", value_name = "VAR=ORIGIN")]
    allow_keys: Vec<String>,
    /// Let the script reach HOST (listed in its step's allowed_hosts) although it is, or
    /// resolves to, a loopback or private address; HOST:PORT, that port only (repeatable).
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_hosts: Vec<String>,
    /// MiB the script writes, to its folders and the database, as a run's scripts do
    /// (default 4096).
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=16_777_216))]
    max_run_write_mib: Option<u64>,
    /// MiB the workspace's folder may take on disk, as for `trellis run` (default 16384): the
    /// script writes no more than what is left of it, and does not run when none is.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=1_073_741_824))]
    max_workspace_mib: Option<u64>,
    #[command(flatten)]
    pub(crate) cache: super::CacheArgs,
}

/// Runs the script, replays its stdout and stderr, and prints one line saying how it
/// ended. Exit status 1 when the script failed or could not run.
pub async fn run(engine: &Engine, args: ScriptArgs) -> Result<ExitCode> {
    anyhow::ensure!(
        args.timeout.is_finite() && args.timeout > 0.0,
        "--timeout: expected a positive number of seconds, found {}",
        args.timeout
    );
    let mut options = ScriptOptions {
        group: args.group,
        approvals: std::sync::Arc::new(super::approvals(&args.allow_keys, &args.allow_hosts)?),
        ..ScriptOptions::default()
    };
    options.limits.timeout = Duration::from_secs_f64(args.timeout);
    options.limits.memory_bytes = args
        .memory
        .checked_mul(1 << 20)
        .context("--memory is too large")?;
    for var in &args.vars {
        let (name, value) = var
            .split_once('=')
            .with_context(|| format!("--var {var:?}: expected NAME=VALUE"))?;
        options
            .variables
            .insert(name.to_string(), value.to_string());
    }
    let _lock = trellis_runner::workspace_lock::acquire_for(&args.workspace, "trellis script")?;
    let ws = open_workspace(&args.workspace, args.run.as_deref())?;
    // What the script writes comes out of a run's budget and the workspace's quota, as a
    // run's scripts' writes do.
    let budgets = trellis_runner::driver::TurnBudgets {
        run_write_bytes: super::mib_or(
            args.max_run_write_mib,
            trellis_runner::driver::DEFAULT_RUN_WRITE_BYTES,
        ),
        workspace_bytes: super::mib_or(
            args.max_workspace_mib,
            trellis_runner::driver::DEFAULT_WORKSPACE_BYTES,
        ),
        ..Default::default()
    };
    let calls = trellis_runner::driver::ModelCalls::default();
    if let Err(why) = calls.begin_run(&budgets, options.limits.fs, &ws.root) {
        anyhow::bail!("{why}");
    }
    let writes = calls.run_writes(&budgets, options.limits.fs, &ws.root);
    options.run_writes = Some(writes.clone());
    if seed_database(&ws.fs, &writes)? {
        let seeded = RunEvent::DatabaseSeeded {
            database: DB_FILE.to_string(),
            seed: SEED_SQL.to_string(),
        };
        if let Some(line) = seeded.run_line() {
            eprintln!("{line}");
        }
    }
    let runner = ScriptRunner::new(engine)?;
    let outcome = step_script::run(&runner, &ws, &args.step, &options).await?;

    // The script's own output, escaped wherever it goes: a pipe often ends at a terminal
    // (`trellis script ... | tee log`). Its bytes as written are in its log files.
    {
        let out = crate::terminal::shown(&outcome.stdout);
        let err = crate::terminal::shown(&outcome.stderr);
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(out.as_bytes())?;
        stdout.flush()?;
        std::io::stderr().lock().write_all(err.as_bytes())?;
    }
    let logs = outcome
        .log_dir
        .as_ref()
        .and_then(|d| d.strip_prefix(&ws.root).ok())
        .map(|d| format!("; logs in {}/", d.display()))
        .unwrap_or_default();
    match &outcome.failure {
        None => {
            eprintln!(
                "{}: succeeded in {} ms{logs}",
                outcome.script,
                outcome.duration.as_millis()
            );
            Ok(ExitCode::SUCCESS)
        }
        Some(failure) => {
            eprintln!("error: {}{logs}", failure.describe(&outcome.script));
            Ok(ExitCode::FAILURE)
        }
    }
}
