//! Files the agent writes (scripts, knowledge notes, learnings, evaluation artefacts,
//! reports), through the sandboxed `workspace` plugin with the folders of the mode granted
//! and nothing else (never `planning/`).

use serde_json::Value;

use super::{ToolContext, ToolFailure, ToolResult, ToolSpec};

/// The specs of the file tools ([`super::modes::FILE_TOOLS`]).
pub fn specs() -> Vec<ToolSpec> {
    Vec::new()
}

/// Calls file tool `name`.
pub async fn call(_ctx: &ToolContext<'_>, name: &str, _args: &Value) -> ToolResult {
    Err(ToolFailure::new(format!(
        "tool {name:?} is not implemented"
    )))
}
