//! Admission: starting an execution for someone else's request only when what runs on the
//! workspace allows it ([`Runtime::start_admitted`]).

use std::fmt;
use std::path::Path;

use super::{
    ExecutionId, ExecutionInfo, ExecutionKind, ExecutionStatus, Runtime, StartOptions, same_folder,
};

/// Executions running at once on a workspace an admitted start may join, by default.
pub const DEFAULT_MAX_RUNNING: usize = 8;

/// Why [`Runtime::start_admitted`] started nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// What runs would fight over the run folder with it: what, and what to do.
    Busy(String),
    /// The workspace runs the most executions at once already.
    Full {
        /// How many run.
        running: usize,
    },
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Busy(why) => f.write_str(why),
            Refused::Full { running } => write!(
                f,
                "{running} executions run on this workspace, the most at once; wait for one to end"
            ),
        }
    }
}

impl Runtime {
    /// Starts `kind` on `workspace` only when what runs there allows it, checked and started
    /// as one step (no other admitted start comes between): the whole workflow only when
    /// nothing runs there (it starts a new run folder), a step neither while the whole
    /// workflow runs (it runs every step in the same folders) nor while that step runs, and
    /// at most `max_running` at once. Every front end that starts executions for someone
    /// else's request (the server's API, the builder's tools) starts them through here.
    pub fn start_admitted(
        &self,
        workspace: &Path,
        kind: ExecutionKind,
        mut options: StartOptions,
        max_running: usize,
    ) -> Result<ExecutionId, Refused> {
        let _one = self.admit.lock().unwrap_or_else(|e| e.into_inner());
        let running: Vec<ExecutionInfo> = self
            .list()
            .into_iter()
            .filter(|e| {
                e.status == ExecutionStatus::Running && same_folder(&e.workspace, workspace)
            })
            .collect();
        let ids = |keep: &dyn Fn(&ExecutionKind) -> bool| {
            running
                .iter()
                .filter(|e| keep(&e.kind))
                .map(|e| e.id.as_str().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let whole = ids(&|k| *k == ExecutionKind::Workflow);
        match &kind {
            ExecutionKind::Workflow if !running.is_empty() => {
                return Err(Refused::Busy(format!(
                    "executions run on this workspace ({}): the whole workflow starts a new run \
                     folder, so it waits for them; stop them or wait for their end",
                    ids(&|_| true)
                )));
            }
            ExecutionKind::Step(_) if !whole.is_empty() => {
                return Err(Refused::Busy(format!(
                    "the whole workflow runs ({whole}): a step runs in its run folder once it ends"
                )));
            }
            ExecutionKind::Step(step) => {
                let same = ids(&|k| matches!(k, ExecutionKind::Step(s) if s == step));
                if !same.is_empty() {
                    return Err(Refused::Busy(format!(
                        "step {step:?} runs already ({same}): stop it or wait for its end"
                    )));
                }
            }
            ExecutionKind::Workflow => {}
        }
        if running.len() >= max_running {
            return Err(Refused::Full {
                running: running.len(),
            });
        }
        if let ExecutionKind::Step(step) = &kind {
            options.run.step = Some(step.clone());
        }
        // Another process holding the workspace refuses the start here, not once it runs:
        // the hold taken now is the execution's until its thread has its own.
        let early = if options.wait_for_workspace {
            None
        } else {
            Some(
                self.hold_workspace(workspace)
                    .map_err(|e| Refused::Busy(format!("{e:#}")))?,
            )
        };
        Ok(self.start_holding(workspace, kind, options, early))
    }
}
