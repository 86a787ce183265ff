//! `trellis migrate`: converts legacy `code` items of message sequences into scripted steps.

// What is printed here was written by models, guests or workspaces: escaped.
use crate::terminal::eprintln_shown as eprintln;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

/// Arguments of `trellis migrate`.
#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// The workspace folder.
    pub(crate) workspace: PathBuf,
}

/// Migrates and prints what changed; exit status 1 (with the reason) when it is refused.
pub fn run(args: &MigrateArgs) -> Result<ExitCode> {
    match trellis_workflow::migrate::migrate_message_sequence_code_items(&args.workspace) {
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
                "version: {} -> {}",
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
