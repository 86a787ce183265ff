//! Side agents (`run_in_background`): a builder agent on an instruction of its own, on a
//! thread of its own, whose end is announced to the session like an execution's.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;

use super::agent::TurnReport;
use super::executions::Finished;
use super::{ToolFailure, ToolResult, ToolSpec};
use crate::runtime::ExecutionStatus;

/// The name of the side-agent tool.
pub const RUN_IN_BACKGROUND: &str = "run_in_background";

/// The spec of `run_in_background`.
pub fn run_in_background_spec() -> ToolSpec {
    ToolSpec {
        name: RUN_IN_BACKGROUND,
        description: "Start a side agent with the same tools as you, on an instruction of its \
             own. Returns {execution_id: \"bg-<name>-<n>\", status: \"running\"} at once; you \
             get a message with its answer when it finishes.",
        parameters: json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "A short name for it."},
                "instruction": {"type": "string", "description": "What it should do."}
            },
            "required": ["name", "instruction"],
            "additionalProperties": false
        }),
    }
}

/// The side agents of a session: those running, and those ended but not yet announced.
#[derive(Debug, Default)]
pub(super) struct SideAgents {
    next: AtomicU64,
    running: Mutex<BTreeMap<String, std::thread::JoinHandle<()>>>,
    finished: Mutex<Vec<Finished>>,
}

impl SideAgents {
    /// Starts `work` on a thread of its own as `bg-<slug of name>-<n>`; answers its id at once.
    pub(super) fn start(
        self: &std::sync::Arc<Self>,
        name: &str,
        work: impl FnOnce() -> anyhow::Result<TurnReport> + Send + 'static,
    ) -> ToolResult {
        let slug = slug(name);
        if slug.is_empty() {
            return Err(ToolFailure::new(
                "argument \"name\": expected a short name with letters or digits",
            ));
        }
        let n = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let id = format!("bg-{slug}-{n}");
        let side = self.clone();
        let thread_id = id.clone();
        let handle = std::thread::Builder::new()
            .name(format!("trellis-{id}"))
            .spawn(move || {
                let (status, summary) = match work() {
                    Ok(report) if report.ended_normally => (ExecutionStatus::Done, report.text),
                    Ok(report) => (ExecutionStatus::Failed, report.error.unwrap_or_default()),
                    Err(e) => (ExecutionStatus::Failed, format!("{e:#}")),
                };
                side.finished
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(Finished {
                        id: thread_id,
                        status,
                        summary,
                    });
            })
            .map_err(|e| ToolFailure::new(format!("starting the side agent: {e}")))?;
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), handle);
        Ok(json!({"execution_id": id, "status": "running"}))
    }

    /// The side agents that ended since the last call.
    pub(super) fn take_finished(&self) -> Vec<Finished> {
        let finished =
            std::mem::take(&mut *self.finished.lock().unwrap_or_else(|e| e.into_inner()));
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        for f in &finished {
            running.remove(&f.id);
        }
        finished
    }

    /// The ids of those still running.
    pub(super) fn running_ids(&self) -> Vec<String> {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running
            .iter()
            .filter(|(_, h)| !h.is_finished())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Waits until none runs.
    pub(super) async fn wait_all(&self) {
        while !self.running_ids().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

/// A name as an id part: lower-case letters and digits, other runs as one `-`, 32 at most.
fn slug(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
        if out.len() >= 32 {
            break;
        }
    }
    out.trim_end_matches('-').to_string()
}
