//! Plan, step config, workflow config, variables and groups: every edit validated through
//! the typed model before it is written, written atomically, and logged to
//! `planning/changelog/changelog-<UTC date>.json`.

use serde_json::Value;

use super::{ToolContext, ToolFailure, ToolResult, ToolSpec};

/// The specs of the plan and config tools ([`super::modes::PLAN_TOOLS`],
/// [`super::modes::CONFIG_TOOLS`]).
pub fn specs() -> Vec<ToolSpec> {
    Vec::new()
}

/// Calls plan or config tool `name`.
pub fn call(_ctx: &ToolContext<'_>, name: &str, _args: &Value) -> ToolResult {
    Err(ToolFailure::new(format!(
        "tool {name:?} is not implemented"
    )))
}
