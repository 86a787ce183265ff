//! `trellis check`: runs a step's validation gate on its current outputs.

// What is printed here was written by models, guests or workspaces: escaped.
use crate::terminal::{eprintln_shown as eprintln, println_shown as println};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use trellis_sandbox::{Engine, Limits};
use trellis_workflow::validation;
use trellis_workflow::validation::PluginValidators;

use super::{CacheArgs, PluginDirs, open_workspace, registry};

/// Arguments of `trellis check`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The workspace folder.
    pub(crate) workspace: PathBuf,
    /// The step whose outputs to check.
    #[arg(long, value_name = "ID")]
    step: String,
    /// Run folder under `runs/` [default: iteration-0].
    #[arg(long, value_name = "FOLDER")]
    run: Option<String>,
    #[command(flatten)]
    plugins: PluginDirs,
    #[command(flatten)]
    pub(crate) cache: CacheArgs,
}

/// Runs the gate, writes its report and prints each check. Exit status 1 when a check fails
/// or the gate cannot run.
pub async fn run(engine: &Engine, args: &CheckArgs) -> Result<ExitCode> {
    let registry = registry(engine, &args.plugins).await?;
    let _lock = trellis_runner::workspace_lock::acquire_for(&args.workspace, "trellis check")?;
    let step_id = args.step.as_str();
    let ws = open_workspace(&args.workspace, args.run.as_deref())?;
    // A run folder named is one there: the report is not written into a folder made for it.
    if let Some(run) = &args.run {
        let rel = std::path::Path::new("runs").join(run);
        if ws.fs.kind(&rel)? != Some(trellis_sandbox::store::Kind::Dir) {
            anyhow::bail!(
                "{}: no such run folder (`--run` names a folder under runs/; `trellis runs \
                 list` shows them)",
                rel.display()
            );
        }
    }
    let step = ws.plan.step(step_id).with_context(|| {
        let ids: Vec<_> = ws.plan.all_steps().map(|s| s.id.as_str()).collect();
        format!(
            "no step `{step_id}` in the plan (steps: {})",
            ids.join(", ")
        )
    })?;
    // The step config's schema wins over the plan's, as in a run.
    let schema = ws
        .step_configs
        .get(step_id)
        .and_then(|c| c.validation_schema.clone())
        .or_else(|| step.validation_schema.clone())
        .unwrap_or_default();
    let output_dir = ws.step_output_dir(step_id);
    let validators = PluginValidators::new(&registry, Limits::default());
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
    if report.passed_left_out + report.failures_left_out > 0 {
        println!(
            "... and {} more checks not recorded ({} passed, {} failed: a report records {} \
             of each)",
            report.passed_left_out + report.failures_left_out,
            report.passed_left_out,
            report.failures_left_out,
            validation::report::MAX_KEPT_CHECKS
        );
    }
    let failed = report.failure_count();
    println!(
        "{} checks, {failed} failed; report: {}",
        report.checks.len() + report.passed_left_out + report.failures_left_out,
        latest.display()
    );
    Ok(if report.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
