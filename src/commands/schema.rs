//! `trellis schema`: prints a JSON Schema of a workspace file, for editors.

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

/// Arguments of `trellis schema`.
#[derive(Args, Debug)]
pub struct SchemaArgs {
    /// Which file.
    #[arg(value_enum)]
    which: SchemaKind,
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

/// Prints the schema, pretty.
pub fn run(args: &SchemaArgs) -> Result<ExitCode> {
    let schema =
        trellis_workflow::json_schema::schema_for(args.which.name()).context("unknown schema")?;
    println!("{}", serde_json::to_string_pretty(&schema)?);
    Ok(ExitCode::SUCCESS)
}
