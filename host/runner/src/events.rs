//! What a running workflow reports as it goes (the run as a whole: warnings, the run folder
//! rotated, groups, steps started and ended, loop jumps; inside a step: items, turns, LLM and
//! tool calls, gates, sub-agent calls), for live progress (`trellis run`) and for anyone
//! embedding the runtime. One channel: a front end shows these, no text beside them. Events are advisory: the files of section 8 are the
//! record, and a slow observer only slows the run, never changes it. Events of a route's
//! sub-agent carry `<step>/<route>` as their step id.

use std::fmt;
use std::sync::Arc;

use crate::session::Status;

/// One thing that happened in a run (as JSON, what a worker sends its dispatcher).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum RunEvent {
    /// A problem found while loading the workspace that does not stop the run.
    Warning {
        /// What, with the file and JSON path.
        message: String,
    },
    /// The workflow database was created from its seed.
    DatabaseSeeded {
        /// The database, workspace-relative.
        database: String,
        /// The seed it was made from.
        seed: String,
    },
    /// A full run moved the previous `runs/iteration-0` aside.
    RunArchived {
        /// Where it went, relative to `runs/` (`iteration-3`).
        folder: String,
    },
    /// Archived runs past `run_retention_count` were deleted.
    ArchivedRunsDeleted {
        /// The folders deleted, relative to `runs/`.
        folders: Vec<String>,
        /// How many archived runs are kept.
        kept: usize,
    },
    /// A group's steps start, in their own run folder.
    GroupStarted {
        /// The group id.
        group_id: String,
        /// Its run folder, relative to `runs/`.
        folder: String,
    },
    /// A jump back to a step that already ran moved outputs to an archive.
    Jump {
        /// The step jumping.
        from: String,
        /// The step jumped to.
        to: String,
        /// Which jump of this pair this is.
        count: u32,
        /// The most jumps the pair may make.
        cap: u32,
        /// Output folders moved.
        moved: usize,
        /// The archive, relative to `execution/` (`archived/run-2`).
        archive: String,
    },
    /// A step started.
    StepStarted {
        /// The step id.
        step_id: String,
        /// `regular`, `routing`, `human_input`, ...
        step_type: String,
    },
    /// A step running elsewhere (`trellis run --dispatch`) was taken by a worker: its
    /// events that follow come from there. Said again when another worker takes it over.
    StepOnWorker {
        /// The step id.
        step_id: String,
        /// The worker's name.
        worker: String,
    },
    /// A `human_input` step whose answer was not given waits for one
    /// ([`crate::human_inputs::HumanInputs::answer`]); its end follows once it comes.
    InputRequested {
        /// The question, its step and what it takes.
        question: crate::human_inputs::Question,
    },
    /// A step ended.
    StepEnded {
        /// The step id.
        step_id: String,
        /// How it ended.
        status: Status,
        /// One line on what it did or why it failed.
        detail: String,
    },
    /// An item (or the automatic final gate) started.
    ItemStarted {
        /// The step id.
        step_id: String,
        /// The item id.
        item_id: String,
        /// `user_message`, `foreach`, `prevalidation`, ...
        item_type: String,
    },
    /// A turn started: one user message sent to the agent.
    TurnStarted {
        /// The step id.
        step_id: String,
        /// The item id (a repair turn carries its own id, `<item>-repair-N`).
        item_id: String,
        /// The foreach row (1-based) or 1.
        iteration: u32,
        /// The step's turn counter after this turn started.
        turn: u64,
    },
    /// One LLM call of a turn ended.
    LlmCall {
        /// The step id.
        step_id: String,
        /// The provider that answered (or the last one tried).
        provider: String,
        /// Its model.
        model: String,
        /// Prompt tokens.
        prompt_tokens: u64,
        /// Completion tokens.
        completion_tokens: u64,
        /// Tool calls the model asked for.
        tool_calls: usize,
        /// Milliseconds, retries included.
        duration_ms: u64,
        /// The error, when the call failed.
        error: Option<String>,
    },
    /// A piece of the model's reply as it arrives (a provider that streams): text, a tool
    /// call beginning, or a retry voiding what was shown. The `LlmCall` that follows carries
    /// the whole answer; turn logs keep that, not the pieces.
    Reply {
        /// The step id.
        step_id: String,
        /// The piece.
        event: trellis_sandbox::llm::ReplyEvent,
    },
    /// One tool call ended.
    ToolCall {
        /// The step id.
        step_id: String,
        /// The call's id, as the model gave it.
        call_id: String,
        /// The full tool name (`server:tool`).
        tool: String,
        /// Its arguments, as the model sent them (parsed; `null` when they were not JSON).
        arguments: serde_json::Value,
        /// The error, when the tool failed.
        error: Option<String>,
        /// Milliseconds.
        duration_ms: u64,
    },
    /// The tool calls one answer asked for past the per-answer budget were not run: one
    /// event for all of them, however many (each still gets its error as a tool result).
    ToolCallsRefused {
        /// The step id.
        step_id: String,
        /// Tool calls the answer asked for.
        asked: usize,
        /// How many of them were not run.
        refused: usize,
        /// Tool calls that run per answer (`--max-calls-per-answer`).
        budget: usize,
    },
    /// A validation gate ran.
    Gate {
        /// The step id.
        step_id: String,
        /// The gate's item id.
        item_id: String,
        /// 1 for the first run, then one more per repair turn.
        attempt: u32,
        /// Whether every check passed.
        passed: bool,
        /// Failing checks.
        failures: usize,
    },
    /// A `call_sub_agent` call started a route's sub-agent.
    SubAgentStarted {
        /// The calling agent: the step id, `<step>/<route>` for a sub-agent calling deeper.
        step_id: String,
        /// The route called.
        route_id: String,
        /// The call (`call-0001`), its folder name.
        call_id: String,
        /// The sub-agent's depth (1 for a step's own routes).
        depth: usize,
    },
    /// A route's sub-agent ended its call.
    SubAgentEnded {
        /// The calling agent.
        step_id: String,
        /// The route called.
        route_id: String,
        /// The call.
        call_id: String,
        /// How the call ended.
        status: Status,
    },
    /// An item ended.
    ItemEnded {
        /// The step id.
        step_id: String,
        /// The item id.
        item_id: String,
        /// How it ended.
        status: Status,
    },
}

impl RunEvent {
    /// The one-line text of an event of the run as a whole (what `trellis run` prints for
    /// it); `None` for an event inside a step, which a front end shows with its own state
    /// (indentation, totals).
    pub fn run_line(&self) -> Option<String> {
        Some(match self {
            RunEvent::Warning { message } => format!("warning: {message}"),
            RunEvent::DatabaseSeeded { database, seed } => {
                format!("created {database} from {seed}")
            }
            RunEvent::RunArchived { folder } => format!("previous run moved to runs/{folder}"),
            RunEvent::ArchivedRunsDeleted { folders, kept } => format!(
                "deleted {} archived run{} past the {kept} kept (run_retention_count): runs/{}",
                folders.len(),
                if folders.len() == 1 { "" } else { "s" },
                folders.join(", runs/")
            ),
            RunEvent::GroupStarted { group_id, folder } => {
                format!("group {group_id} (runs/{folder})")
            }
            RunEvent::Jump {
                from,
                to,
                count,
                cap,
                moved,
                archive,
            } => format!(
                "jump {from} -> {to} ({count} of {cap}): {moved} output folder(s) moved to execution/{archive}"
            ),
            RunEvent::StepStarted { step_id, step_type } => {
                format!("step {step_id} ({step_type}): started")
            }
            RunEvent::StepEnded {
                step_id,
                status,
                detail,
            } => format!("step {step_id}: {status} ({detail})"),
            RunEvent::StepOnWorker { step_id, worker } => {
                format!("step {step_id}: running on worker {worker}")
            }
            RunEvent::InputRequested { question } => format!(
                "step {}: waiting for an answer to {:?} ({})",
                question.step_id,
                question.question.as_deref().unwrap_or(&question.variable),
                question.response_type
            ),
            _ => return None,
        })
    }
}

/// Receives [`RunEvent`]s; shared by every step a runner runs.
#[derive(Clone)]
pub struct Observer(Arc<dyn Fn(&RunEvent) + Send + Sync>);

impl Observer {
    /// An observer calling `f` for every event.
    pub fn new(f: impl Fn(&RunEvent) + Send + Sync + 'static) -> Self {
        Observer(Arc::new(f))
    }

    /// Reports one event.
    pub fn emit(&self, event: RunEvent) {
        (self.0)(&event)
    }
}

impl Default for Observer {
    /// An observer that ignores everything.
    fn default() -> Self {
        Observer::new(|_| {})
    }
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Observer")
    }
}
