//! What names an execution, where it is, and what it tells its readers.

use std::fmt;
use std::path::PathBuf;

#[cfg(doc)]
use super::{Runtime, StartOptions};
use crate::events::RunEvent;
use crate::steering::Delivery;

/// Names one execution of a [`Runtime`]: `exec-<step>-<n>` for the `n`th execution of a step,
/// `workflow-full-<n>` for the `n`th of a whole workflow (the original system's names), counted
/// per runtime.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExecutionId(pub(super) String);

impl ExecutionId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for ExecutionId {
    fn from(id: &str) -> Self {
        ExecutionId(id.to_string())
    }
}

impl fmt::Display for ExecutionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where an execution is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionStatus {
    /// Still working.
    Running,
    /// Ended, every step completed.
    Done,
    /// Ended with a failed step or a broken setup.
    Failed,
    /// Stopped by [`Runtime::stop`].
    Cancelled,
}

impl fmt::Display for ExecutionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ExecutionStatus::Running => "running",
            ExecutionStatus::Done => "done",
            ExecutionStatus::Failed => "failed",
            ExecutionStatus::Cancelled => "cancelled",
        })
    }
}

/// One thing an execution reports.
#[derive(Debug, Clone)]
pub enum ExecutionEvent {
    /// Something in the run: a step started or ended, the run folder rotated, and inside a
    /// step an item, turn, LLM call, tool call, gate or sub-agent call.
    Run(RunEvent),
    /// A message sent with [`Runtime::send_message`] and what became of it.
    Delivery {
        /// The message.
        text: String,
        /// Its delivery.
        delivery: Delivery,
    },
    /// The execution ended; the last event.
    End {
        /// How.
        status: ExecutionStatus,
        /// The error of a broken setup, or what cut the run short.
        error: Option<String>,
        /// Else, for a run that did not succeed, its first step that did not complete (its
        /// id, status and the first line of its detail).
        failure: Option<String>,
    },
}

/// What an execution runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecutionKind {
    /// A whole workflow (or one group of it).
    Workflow,
    /// One step.
    Step(String),
}

/// An execution as [`Runtime::list`] shows it.
#[derive(Debug, Clone)]
pub struct ExecutionInfo {
    /// Its id.
    pub id: ExecutionId,
    /// The workspace folder.
    pub workspace: PathBuf,
    /// What it runs.
    pub kind: ExecutionKind,
    /// Where it is.
    pub status: ExecutionStatus,
    /// The question of the `human_input` step it waits on, if it waits
    /// ([`StartOptions::ask_for_inputs`]).
    pub waiting_for: Option<crate::human_inputs::Question>,
}
