//! Steps run elsewhere: a [`StepDispatch`] given to a run ([`crate::workflow_run::RunEnv`])
//! runs its agent steps on other machines (`trellis worker`), while the run itself (plan
//! order, routing, human inputs, groups, loops) goes on here exactly as locally. What a step
//! may read and write is its grant's folders ([`step_folders`]): the dispatcher sends the
//! first, and takes the second back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use trellis_sandbox::capabilities::Access;
use trellis_sandbox::store::WorkspaceFs;
use trellis_workflow::{Step, Workspace};

use crate::driver::StepOutcome;
use crate::events::{Observer, RunEvent};
use crate::grants::{GrantedFolder, TurnAccess, TurnContext, grant_for_access};
use crate::prerequisites::GoBack;
use crate::session::Status;

/// One step to run elsewhere.
#[derive(Debug, Clone)]
pub struct RemoteStep {
    /// The workspace folder (the dispatcher's).
    pub workspace: PathBuf,
    /// The run folder under `runs/`: `iteration-0` or `iteration-0/<group>`.
    pub run_folder: String,
    /// The step.
    pub step_id: String,
    /// The group the run unit is of, if any.
    pub group: Option<String>,
    /// The `human_input` answers of the run.
    pub inputs: BTreeMap<String, String>,
    /// Set when the run is stopped: the step is stopped wherever it runs.
    pub cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Sees the step's events (turns, model and tool calls) as they happen where it runs.
    pub observer: Observer,
    /// How often the step already sent this run back to a prerequisite.
    pub prerequisite_returns: u32,
    /// High-priority context from the operator for the step's agent (`--step-context`).
    pub context: Option<String>,
}

/// How a step run elsewhere ended: what the run needs of a [`StepOutcome`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoteOutcome {
    /// `completed`, `failed` or `stopped`.
    pub status: Status,
    /// The `CONCERNS:` lines of the step's replies.
    pub concerns: Vec<String>,
    /// Turns run.
    pub turns: u64,
    /// The last reply of the agent.
    pub final_text: Option<String>,
    /// Why the step failed or stopped.
    pub error: Option<String>,
    /// The step asks to run a prerequisite first: `(step, missing, count)`.
    pub go_back: Option<(String, String, u32)>,
    /// The worker that ran it.
    #[serde(default)]
    pub worker: Option<String>,
}

impl RemoteOutcome {
    /// The outcome of a step run here.
    pub fn of(outcome: &StepOutcome) -> Self {
        RemoteOutcome {
            status: outcome.status,
            concerns: outcome.concerns.clone(),
            turns: outcome.turns,
            final_text: outcome.final_text.clone(),
            error: outcome.error.clone(),
            go_back: outcome
                .go_back
                .as_ref()
                .map(|g| (g.step.clone(), g.missing.clone(), g.count)),
            worker: None,
        }
    }

    /// The outcome as the run reads it, its output folder `output_dir`.
    pub fn into_outcome(self, output_dir: PathBuf) -> StepOutcome {
        StepOutcome {
            status: self.status,
            go_back: self.go_back.map(|(step, missing, count)| GoBack {
                step,
                missing,
                count,
            }),
            concerns: self.concerns,
            turns: self.turns,
            final_text: self.final_text,
            error: self.error,
            output_dir,
        }
    }
}

/// The file under a step's logs folder (`logs/<step>/`) where the run records what its step
/// running elsewhere did so far: what `trellis runs show` reads while the step runs. The
/// step's own logs replace the folder when it ends.
pub const REMOTE_PROGRESS_FILE: &str = "remote-progress.json";

/// Tool names kept in [`RemoteProgress::recent_tools`].
const RECENT_TOOLS: usize = 20;
/// Bytes kept of each name in a [`RemoteProgress`] (the events come from another machine).
const NAME_BYTES: usize = 200;

/// `text` cut to [`NAME_BYTES`] at a character boundary.
fn name(text: &str) -> String {
    let mut end = text.len().min(NAME_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// What a step running elsewhere did so far, from its events.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RemoteProgress {
    /// The worker running it (the last to take it).
    pub worker: Option<String>,
    /// Turns started.
    pub turns: u64,
    /// The item of the last turn.
    pub item: Option<String>,
    /// LLM calls ended.
    pub llm_calls: u64,
    /// LLM calls that failed.
    pub llm_errors: u64,
    /// `provider:model` of the last LLM call.
    pub model: Option<String>,
    /// Prompt tokens of all LLM calls.
    pub prompt_tokens: u64,
    /// Completion tokens of all LLM calls.
    pub completion_tokens: u64,
    /// Tool calls ended.
    pub tool_calls: u64,
    /// Tool calls that failed.
    pub tool_errors: u64,
    /// The names of the last tool calls, oldest first.
    pub recent_tools: Vec<String>,
    /// Gates run, and how many of them passed.
    pub gates: u64,
    /// Gates that passed.
    pub gates_passed: u64,
}

impl RemoteProgress {
    /// Counts `event` (of the step or of its sub-agents); whether it changed anything.
    pub fn see(&mut self, event: &RunEvent) -> bool {
        match event {
            RunEvent::StepOnWorker { worker, .. } => self.worker = Some(name(worker)),
            RunEvent::TurnStarted { item_id, .. } => {
                self.turns = self.turns.saturating_add(1);
                self.item = Some(name(item_id));
            }
            RunEvent::LlmCall {
                provider,
                model,
                prompt_tokens,
                completion_tokens,
                error,
                ..
            } => {
                self.llm_calls = self.llm_calls.saturating_add(1);
                self.llm_errors = self.llm_errors.saturating_add(u64::from(error.is_some()));
                self.model = Some(name(&format!("{provider}:{model}")));
                self.prompt_tokens = self.prompt_tokens.saturating_add(*prompt_tokens);
                self.completion_tokens = self.completion_tokens.saturating_add(*completion_tokens);
            }
            RunEvent::ToolCall { tool, error, .. } => {
                self.tool_calls = self.tool_calls.saturating_add(1);
                self.tool_errors = self.tool_errors.saturating_add(u64::from(error.is_some()));
                if self.recent_tools.len() == RECENT_TOOLS {
                    self.recent_tools.remove(0);
                }
                self.recent_tools.push(name(tool));
            }
            RunEvent::Gate { passed, .. } => {
                self.gates = self.gates.saturating_add(1);
                self.gates_passed = self.gates_passed.saturating_add(u64::from(*passed));
            }
            _ => return false,
        }
        true
    }

    /// An observer that passes each event on to `inner` and keeps the progress of step
    /// `step_id` in `logs/<step>/`[`REMOTE_PROGRESS_FILE`] under `run_dir` (rewritten whole,
    /// atomically, as events come).
    pub fn recorder(fs: &WorkspaceFs, run_dir: &Path, step_id: &str, inner: Observer) -> Observer {
        let path = crate::session::logs_dir(run_dir, step_id).join(REMOTE_PROGRESS_FILE);
        let fs = fs.clone();
        let progress = std::sync::Mutex::new(RemoteProgress::default());
        Observer::new(move |event: &RunEvent| {
            let changed = progress
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .see(event);
            if changed {
                let now = progress.lock().unwrap_or_else(|e| e.into_inner()).clone();
                // A view for `runs show`: a write that fails leaves the last one.
                if let Err(e) = fs.write_json_atomic(&path, &now) {
                    tracing::debug!("writing {}: {e}", path.display());
                }
            }
            inner.emit(event.clone());
        })
    }
}

/// Runs steps elsewhere.
pub trait StepDispatch: Send + Sync + std::fmt::Debug {
    /// Runs `step` elsewhere and brings its writable folders back into the workspace; an
    /// error when it could not be run (nothing committed).
    fn run_step(&self, step: RemoteStep) -> BoxFuture<'_, Result<RemoteOutcome>>;
}

/// Why step `step_id` runs here rather than elsewhere, when it must: one of its turns (or
/// of its routes' sub-agents) may write the workflow database, which stays with the
/// dispatcher (one writer, under its fences and deadlines). A step whose items all narrow
/// `write_access` to leave the database out (`"db": false`), or a workspace without a
/// database, runs elsewhere.
pub fn runs_here(ws: &Workspace, step_id: &str) -> Option<&'static str> {
    fn may_write_db(ws: &Workspace, step: &Step) -> bool {
        let configs = ws.agent_configs(&step.id);
        step.effective_items()
            .iter()
            .any(|item| TurnAccess::for_item(&configs, item).db_write)
            || step
                .predefined_routes()
                .iter()
                .any(|r| may_write_db(ws, &r.sub_agent_step))
    }
    let step = ws.plan.find_step(step_id)?;
    (ws.fs.is_file("db/db.sqlite") && may_write_db(ws, step))
        .then_some("it may write the workflow database, which stays with the dispatcher")
}

/// The folders a step's turns may reach (its own turns and its closing reflection's),
/// workspace-relative, with the widest access any of them has. Creates the writable ones
/// when missing, as a turn's grant does.
pub fn step_folders(ws: &Workspace, run_folder: &str, step: &Step) -> Result<Vec<GrantedFolder>> {
    let configs = ws.agent_configs(&step.id);
    let ctx = TurnContext {
        root: &ws.root,
        run_folder,
        step,
        configs: &configs,
    };
    let mut folders: Vec<GrantedFolder> = Vec::new();
    for access in [
        TurnAccess::for_step(&configs),
        TurnAccess::for_reflection(&configs),
    ] {
        for folder in grant_for_access(&ctx, access)?.folders {
            match folders.iter_mut().find(|f| f.path == folder.path) {
                Some(kept) if folder.access == Access::ReadWrite => kept.access = Access::ReadWrite,
                Some(_) => {}
                None => folders.push(folder),
            }
        }
    }
    Ok(folders)
}
