//! Side agents (`run_in_background`): a builder agent on an instruction of its own, on a
//! thread of its own, whose end is announced to the session like an execution's.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;

use super::agent::TurnReport;
use super::executions::Finished;
use super::{ToolFailure, ToolResult, ToolSpec};
use trellis_runner::runtime::{ExecutionStatus, panic_message};

/// Side agents of one session running at once.
pub const MAX_RUNNING: usize = 4;
/// Side agents one session may start in all.
pub const MAX_PER_SESSION: u64 = 32;

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
        // Held while the count is checked and the thread started: two calls at once cannot
        // both take the last place.
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let busy = running.values().filter(|h| !h.is_finished()).count();
        if busy >= MAX_RUNNING {
            return Err(ToolFailure::new(format!(
                "{busy} side agents are running, the most a session runs at once \
                 ({MAX_RUNNING}); wait for one to finish"
            )));
        }
        let started = self.next.load(Ordering::SeqCst);
        if started >= MAX_PER_SESSION {
            return Err(ToolFailure::new(format!(
                "this session started {started} side agents, the most one session may \
                 ({MAX_PER_SESSION}); do the rest of the work yourself"
            )));
        }
        let n = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let id = format!("bg-{slug}-{n}");
        let side = self.clone();
        let thread_id = id.clone();
        let handle = std::thread::Builder::new()
            .name(format!("trellis-{id}"))
            .spawn(move || {
                // A panic ends the side agent as failed, announced like any other end.
                let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
                let (status, summary) = match ended {
                    Ok(Ok(report)) if report.ended_normally => (ExecutionStatus::Done, report.text),
                    Ok(Ok(report)) => (ExecutionStatus::Failed, report.error.unwrap_or_default()),
                    Ok(Err(e)) => (ExecutionStatus::Failed, format!("{e:#}")),
                    Err(panic) => (
                        ExecutionStatus::Failed,
                        format!("the side agent panicked: {}", panic_message(&*panic)),
                    ),
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
        running.insert(id.clone(), handle);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::mpsc;

    fn report(text: &str) -> TurnReport {
        TurnReport {
            text: text.to_string(),
            ended_normally: true,
            error: None,
            tool_calls: 0,
            usage: Default::default(),
        }
    }

    async fn ended(side: &SideAgents, n: usize) -> Vec<Finished> {
        let mut out = Vec::new();
        while out.len() < n {
            out.extend(side.take_finished());
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        out
    }

    #[tokio::test]
    async fn a_session_runs_a_few_side_agents_at_once_and_a_bounded_number_in_all() {
        let side = Arc::new(SideAgents::default());
        let (release, held) = mpsc::channel::<()>();
        let held = Arc::new(Mutex::new(held));
        for i in 0..MAX_RUNNING {
            let held = held.clone();
            side.start(&format!("w{i}"), move || {
                let _ = held.lock().unwrap().recv();
                Ok(report("ok"))
            })
            .unwrap();
        }
        let refused = side.start("one-more", || Ok(report("never"))).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "4 side agents are running, the most a session runs at once (4); wait for one to \
             finish"
        );
        for _ in 0..MAX_RUNNING {
            release.send(()).unwrap();
        }
        ended(&side, MAX_RUNNING).await;
        for i in MAX_RUNNING as u64..MAX_PER_SESSION {
            side.start(&format!("w{i}"), || Ok(report("ok"))).unwrap();
            ended(&side, 1).await;
        }
        let refused = side
            .start("past-the-total", || Ok(report("never")))
            .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "this session started 32 side agents, the most one session may (32); do the rest \
             of the work yourself"
        );
    }

    #[tokio::test]
    async fn a_side_agent_that_panics_ends_as_failed_with_the_message() {
        let side = Arc::new(SideAgents::default());
        side.start("breaks", || panic!("broken on purpose"))
            .unwrap();
        let finished = ended(&side, 1).await;
        assert_eq!(finished[0].status, ExecutionStatus::Failed);
        assert_eq!(
            finished[0].summary,
            "the side agent panicked: broken on purpose"
        );
        assert!(side.running_ids().is_empty());
    }
}
