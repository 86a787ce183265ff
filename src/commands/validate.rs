//! `trellis validate`: checks a workspace's plan.json, step_config.json and workflow.json.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use trellis_workflow::Workspace;
use trellis_workflow::foreach_sql::check_foreach_queries;

use super::plural;

/// Arguments of `trellis validate`.
#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// The workspace folder.
    pub(crate) workspace: PathBuf,
    /// Check the run-specific step config of this run folder (e.g. `iteration-0`).
    #[arg(long, value_name = "FOLDER")]
    run: Option<String>,
}

/// Prints every problem found and a count. Exit status 1 when there is an error.
pub fn run(args: &ValidateArgs) -> ExitCode {
    let root = &args.workspace;
    let diagnostics = match Workspace::open_run(root, args.run.as_deref()) {
        Ok(ws) => {
            let mut all = ws.warnings.clone();
            all.0.extend(check_foreach_queries(&ws).0);
            all
        }
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
