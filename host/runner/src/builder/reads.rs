//! The read set every mode has: plan, step config, workflow config, workspace files (never
//! secrets), the database read-only, run artifacts and logs, costs.

use serde_json::Value;

use super::{ToolContext, ToolFailure, ToolResult, ToolSpec};

/// The specs of the read tools ([`super::modes::READ_TOOLS`]).
pub fn specs() -> Vec<ToolSpec> {
    Vec::new()
}

/// Calls read tool `name`.
pub async fn call(_ctx: &ToolContext<'_>, name: &str, _args: &Value) -> ToolResult {
    Err(ToolFailure::new(format!(
        "tool {name:?} is not implemented"
    )))
}
