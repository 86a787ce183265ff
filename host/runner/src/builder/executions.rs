//! Steps and whole workflows run in the background on the [`Runtime`]: started (at most once
//! per step at a time), watched, steered and stopped; their ends announced to the session.

use serde_json::Value;

use super::{ToolContext, ToolFailure, ToolResult, ToolSpec};
use crate::runtime::{Runtime, StartOptions};

/// The executions of one builder session.
#[derive(Debug)]
pub struct Executions {
    #[allow(dead_code)]
    runtime: Runtime,
    #[allow(dead_code)]
    template: StartOptions,
}

impl Executions {
    /// Executions started on `runtime` with the models, limits and retries of `template`.
    pub fn new(runtime: Runtime, template: StartOptions) -> Self {
        Executions { runtime, template }
    }

    /// The specs of the execution tools.
    pub fn specs() -> Vec<ToolSpec> {
        Vec::new()
    }

    /// Calls execution tool `name`.
    pub async fn call(&self, _ctx: &ToolContext<'_>, name: &str, _args: &Value) -> ToolResult {
        Err(ToolFailure::new(format!(
            "tool {name:?} is not implemented"
        )))
    }
}

/// An execution that ended, announced to the session in a synthetic turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The builder's id (`exec-<step>-<n>`).
    pub id: String,
    /// `done`, `failed` or `cancelled`.
    pub status: String,
    /// What it came to, in a line or two.
    pub summary: String,
}

impl Executions {
    /// The executions that ended since the last call, oldest first.
    pub fn take_finished(&self) -> Vec<Finished> {
        Vec::new()
    }

    /// Waits until every execution this session started has ended.
    pub async fn wait_all(&self) {}

    /// The ids of the executions still running.
    pub fn running(&self) -> Vec<String> {
        Vec::new()
    }
}
