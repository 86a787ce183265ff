//! The agent loop of one step (spec sections 4, 8 and 10): runs the items of a
//! `message_sequence` (or the single turn of a `regular` step, or of a `todo_task`
//! orchestrator) of a loaded [`Workspace`]. An agent step that ran no turn completes with a
//! concern saying so, never as a plain success.
//!
//! Here: the public types, [`StepRunner`] and its builder, and `run_step`, the outline of a
//! step: set-up, the items in order (or the script of a scripted step), the reflection turn,
//! the end. The jobs are child modules:
//!
//! - `run`: the per-agent `Run` state (a step's own agent or a sub-agent call), the set-up
//!   of a step's own agent, its grants and its entries in `session.json`;
//! - `items`: the items in order, `foreach` rows, gates recorded `skipped` under
//!   `disable_validation`, the automatic final gate, cancellation between items and rows;
//! - `step_end`: the end of a step: the no-turn concern, the status, prerequisite
//!   detection, the final summary and the [`StepOutcome`];
//! - `turn`: per turn, LLM call -> the tool calls it asked for (only tools passing the
//!   step's [`ToolPolicy`](crate::filters::ToolPolicy), under the turn's grant) -> results ->
//!   again, until a reply without tool calls; `STATUS: FAILED` / `CONCERNS:`, steering, and
//!   `enable_context_offloading` (large tool results go to
//!   `<output>/tool-results/<call-id>.json`);
//! - `gate`: validation gates and their repair turns;
//! - `sub_agents`: `call_sub_agent`, a route's sub-agent run as a child agent with its own
//!   conversation per route and a fresh call folder per call ([`crate::routes`]): a
//!   `message_sequence` or `regular` step (inline or an orphan step), a scripted regular
//!   step running its script in the call folder; a later call continues the conversation
//!   with the new instructions alone. It talks to the models its [`ModelResolver`] names
//!   for it, else to its parent's;
//! - `scripted_step`: the script / gate / repair loop of a scripted step;
//! - `reflection`: the closing `<step-id>-reflection` turn, writing only the stores due;
//! - `prompts`: every text the runner sends to the model.

mod budget;
mod gate;
mod items;
mod prompts;
mod reflection;
mod results;
mod run;
mod scripted_step;
mod step_end;
mod sub_agents;
mod turn;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};

use crate::events::Observer;
use crate::grants::reflection_due;
use crate::mcp_servers::ToolServers;
use crate::prerequisites::GoBack;
use crate::routes::MAX_ROUTE_DEPTH;
use crate::session::Status;
use crate::steering::Steering;
use crate::step_script::ScriptOptions;
use trellis_sandbox::Limits;
use trellis_sandbox::llm::{Options, Recorder, ReplayCursor, RetryPolicy, Target};
use trellis_sandbox::plugins::PluginRegistry;
use trellis_sandbox::script::ScriptRunner;
use trellis_workflow::Workspace;
use trellis_workflow::plan::{Item, StepKind};

/// Default cap on tool rounds (LLM calls answered with tool calls) per turn, as the
/// original allows; past it the turn gets one last call without tools to answer.
pub const DEFAULT_MAX_TOOL_ROUNDS: usize = 500;
/// Repair turns a failing gate gets before the step fails.
pub const MAX_REPAIR_TURNS: u32 = 3;

/// Corrective turns of a `todo_task` gate message without `max_corrections` (the
/// original's default).
pub const TODO_TASK_CORRECTIONS: u32 = 1;
/// The item id of the automatic final gate.
pub const FINAL_GATE_ID: &str = "__automatic_final_validation__";
/// Tool results larger than this (bytes) are offloaded to a file when the step enables
/// context offloading.
pub const OFFLOAD_THRESHOLD: usize = 16 * 1024;
/// The summary of a gate entry skipped because of `disable_validation`.
pub const GATE_SKIPPED_SUMMARY: &str = "validation disabled by disable_validation";
/// The concern of an agentic step that completed without running a single agent turn.
pub const NO_TURN_CONCERN: &str = "the step ran no agent turn";
/// The session item type of the reflection turn.
pub const REFLECTION_ITEM_TYPE: &str = "reflection";

pub use budget::not_run;
pub use budget::{
    DEFAULT_CALLS_PER_ANSWER, DEFAULT_RUN_MODEL_CALLS, DEFAULT_RUN_RESULT_BYTES,
    DEFAULT_RUN_WRITE_BYTES, DEFAULT_TURN_RESULT_BYTES, DEFAULT_TURN_WRITE_BYTES,
    DEFAULT_WORKSPACE_BYTES, ModelCalls, TurnBudgets, default_concurrent_calls,
};
pub use prompts::{
    TOOL_POLICY_NOTE, offload_reference, out_of_tool_rounds, reflection_message, repair_message,
    step_system_prompt, sub_agent_system_prompt, system_prompt,
};
pub use reflection::reflection_item_id;
pub use turn::scan_reply;

use run::{AgentSetup, Run, TurnEnd, TurnOk, entry_outcome, failed};
use sub_agents::SubAgentSession;

/// How a step ended.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutcome {
    /// `completed`, `failed` or `stopped`.
    pub status: Status,
    /// The step asks to run a prerequisite step again first (prerequisite detection).
    pub go_back: Option<GoBack>,
    /// The `CONCERNS:` lines of the step's replies, in order.
    pub concerns: Vec<String>,
    /// Turns run (item turns, foreach rows and repair turns).
    pub turns: u64,
    /// The last reply of the agent.
    pub final_text: Option<String>,
    /// Why the step failed or stopped.
    pub error: Option<String>,
    /// The step output folder (`STEP_OUTPUT_DIR`), where `session.json` and the summary are.
    pub output_dir: PathBuf,
}

/// The models one agent talks to: targets in order (primary, then fallbacks), the request
/// options of each by position, and the cassette position when the primary replays.
#[derive(Debug, Clone, Default)]
pub struct AgentModels {
    /// Primary, then fallbacks.
    pub targets: Vec<Target>,
    /// The request options of each target, by position; `None` sends the defaults.
    pub options: Vec<Option<Options>>,
    /// Answers from a cassette: each call takes the primary with the cursor's next endpoint.
    pub replay: Option<ReplayCursor>,
}

/// Names the models of a route's sub-agent step (`(workspace, sub-agent step id)`):
/// `Ok(None)` when it talks to its parent's.
pub type ModelResolver = Arc<dyn Fn(&Workspace, &str) -> Result<Option<AgentModels>> + Send + Sync>;

/// A [`ModelResolver`] in a runner (closures have no `Debug`).
#[derive(Clone)]
struct Resolver(ModelResolver);

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ModelResolver")
    }
}

/// Runs steps: the plugins, the LLM targets and the bounds of every call.
#[derive(Debug)]
pub struct StepRunner<'a> {
    registry: &'a PluginRegistry,
    models: AgentModels,
    resolver: Option<Resolver>,
    retry: RetryPolicy,
    limits: Limits,
    max_tool_rounds: usize,
    budgets: TurnBudgets,
    /// The model calls of the run this step belongs to ([`StepRunner::with_model_calls`]).
    model_calls: Arc<ModelCalls>,
    max_route_depth: usize,
    cancel: Arc<AtomicBool>,
    /// Cancelled with the flag by whoever stops the run: ends the guest code of tool calls
    /// in flight, which also yield to the executor while they run.
    cancel_calls: tokio_util::sync::CancellationToken,
    observer: Observer,
    recorder: Option<Arc<Recorder>>,
    scripts: Option<(Arc<ScriptRunner>, ScriptOptions)>,
    steering: Option<Arc<Steering>>,
    /// The external MCP servers of the run (outside the sandbox).
    mcp: Option<Arc<dyn ToolServers>>,
    /// How often the step run already sent the run back to a prerequisite.
    prerequisite_returns: u32,
    /// The step's end does not wait for the disk ([`StepRunner::with_step_ends_behind`]).
    ends_behind: bool,
    /// Context for the step's agent, read before its first user message
    /// ([`StepRunner::with_context`]).
    context: Option<String>,
    /// Each route's conversation as the host last saved it, by its home folder. A later call
    /// continues from this copy, not from `session.json`, which sits in a folder the
    /// calling agent's tools can write.
    sub_agent_sessions: std::sync::Mutex<std::collections::HashMap<PathBuf, SubAgentSession>>,
}

impl<'a> StepRunner<'a> {
    /// A runner calling `targets` in order (first the step's provider, then fallbacks).
    pub fn new(registry: &'a PluginRegistry, targets: Vec<Target>, limits: Limits) -> Self {
        StepRunner {
            registry,
            models: AgentModels {
                targets,
                ..AgentModels::default()
            },
            resolver: None,
            retry: RetryPolicy::default(),
            limits,
            max_tool_rounds: DEFAULT_MAX_TOOL_ROUNDS,
            budgets: TurnBudgets::default(),
            model_calls: Arc::default(),
            max_route_depth: MAX_ROUTE_DEPTH,
            cancel: Arc::new(AtomicBool::new(false)),
            cancel_calls: tokio_util::sync::CancellationToken::new(),
            observer: Observer::default(),
            recorder: None,
            scripts: None,
            steering: None,
            mcp: None,
            prerequisite_returns: 0,
            ends_behind: false,
            context: None,
            sub_agent_sessions: Default::default(),
        }
    }

    /// Takes messages sent to the step's agent from outside (see [`Steering`]): they join
    /// its conversation before its next LLM call.
    pub fn with_steering(mut self, steering: Arc<Steering>) -> Self {
        self.steering = Some(steering);
        self
    }

    /// Offers the tools of the run's external MCP servers to the steps that name them.
    pub fn with_mcp_servers(mut self, servers: Arc<dyn ToolServers>) -> Self {
        self.mcp = Some(servers);
        self
    }

    /// Runs the scripts of scripted steps (spec section 7) with `scripts`, under `options`
    /// (limits, group, variables). Without it a scripted step fails saying so.
    pub fn with_scripts(mut self, scripts: Arc<ScriptRunner>, options: ScriptOptions) -> Self {
        self.scripts = Some((scripts, options));
        self
    }

    /// High-priority context for the step's agent from whoever started the run (a builder's
    /// `human_inputs` for a step that is not a human_input step): read before the user
    /// message of its first turn. A step without an agent never reads it.
    pub fn with_context(mut self, context: Option<String>) -> Self {
        self.context = context
            .map(|text| format!("High-priority context from the operator for this run:\n{text}"));
        self
    }

    /// How often the step already sent this run back to a prerequisite: prerequisite
    /// detection ([`crate::prerequisites`]) fails the step once that reaches the cap.
    pub fn with_prerequisite_returns(mut self, returns: u32) -> Self {
        self.prerequisite_returns = returns;
        self
    }

    /// Sampling options of each target, by position (`execution_llm.options` of the
    /// primary, then of each fallback); `None` sends the request's defaults.
    pub fn with_target_options(mut self, options: Vec<Option<Options>>) -> Self {
        self.models.options = options;
        self
    }

    /// Asks `resolver` for the models of each route's sub-agent before a call; without one,
    /// or when it answers `None`, a sub-agent talks to its parent's models.
    pub fn with_model_resolver(mut self, resolver: ModelResolver) -> Self {
        self.resolver = Some(Resolver(resolver));
        self
    }

    /// Appends every answered LLM call to `recorder`'s cassette (`trellis run --record`).
    pub fn with_recorder(mut self, recorder: Arc<Recorder>) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// Reports [`RunEvent`](crate::events::RunEvent)s (items, turns, LLM and tool calls,
    /// gates) to `observer`.
    pub fn with_observer(mut self, observer: Observer) -> Self {
        self.observer = observer;
        self
    }

    /// Sets the retry policy of LLM calls.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets how deep sub-agents may nest ([`MAX_ROUTE_DEPTH`] by default): a call from an
    /// agent at this depth is refused with a tool error.
    pub fn with_max_route_depth(mut self, depth: usize) -> Self {
        self.max_route_depth = depth;
        self
    }

    /// Sets the cap on tool rounds per turn: once reached, the turn is told so and gets one
    /// last LLM call without tools, whose reply ends it.
    pub fn with_max_tool_rounds(mut self, rounds: usize) -> Self {
        self.max_tool_rounds = rounds.max(1);
        self
    }

    /// Sets the budgets of every turn: tool calls per answer, calls at once, result bytes.
    pub fn with_turn_budgets(mut self, budgets: TurnBudgets) -> Self {
        self.budgets = budgets;
        self
    }

    /// Counts the model calls of this runner's steps (and their sub-agents) in `calls`, the
    /// count of the whole run, against [`TurnBudgets::run_model_calls`]; without it the
    /// runner counts its own.
    pub fn with_model_calls(mut self, calls: Arc<ModelCalls>) -> Self {
        self.model_calls = calls;
        self
    }

    /// Shares a cancellation flag: once set, the step stops at the next boundary (before an
    /// item, between foreach rows, between tool rounds) and is recorded `stopped`.
    pub fn with_cancel(mut self, cancel: Arc<AtomicBool>) -> Self {
        self.cancel = cancel;
        self
    }

    /// Shares the token that stops the tool calls in flight (cancelled with the flag of
    /// [`StepRunner::with_cancel`]): a guest busy in a loop is interrupted, and its call ends
    /// `cancelled and stopped`, while the turn's other calls finish.
    pub fn with_cancel_calls(mut self, token: tokio_util::sync::CancellationToken) -> Self {
        self.cancel_calls = token;
        self
    }

    /// Answers from a replay cassette: every LLM call takes the first target's provider and
    /// model with the cursor's next endpoint.
    pub fn with_replay(mut self, cursor: ReplayCursor) -> Self {
        self.models.replay = Some(cursor);
        self
    }

    /// Lets a step end without waiting for the disk: its final summary is queued on the
    /// writer thread behind its session and turn logs (a crash leaves it missing, never ahead
    /// of them) instead of written once they are on disk. The caller flushes
    /// ([`trellis_sandbox::store::write_behind::flush`]) before it reports the run over, as
    /// [`crate::workflow_run::run_workflow`] does.
    pub fn with_step_ends_behind(mut self) -> Self {
        self.ends_behind = true;
        self
    }

    /// The cancellation flag.
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    /// Runs step `step_id` of `ws`. Errors are for a broken setup (unknown step, unwritable
    /// run folder); a step that fails on its own terms is an `Ok` outcome with status failed.
    #[tracing::instrument(skip(self, ws), fields(step = step_id))]
    pub async fn run_step(&self, ws: &Workspace, step_id: &str) -> Result<StepOutcome> {
        // A route's sub-agent step runs on its own too, when it is asked for by id.
        let step = ws
            .plan
            .find_step(step_id)
            .with_context(|| format!("no step {step_id:?} in the plan"))?;
        let items: Vec<Item> = match &step.kind {
            StepKind::MessageSequence(_) | StepKind::Regular | StepKind::TodoTask(_) => {
                step.effective_items()
            }
            other => bail!(
                "step {step_id:?} is a {} step: the agent loop runs message_sequence, regular \
                 and todo_task steps",
                other.name()
            ),
        };
        let (mut run, started) = self.start_step(ws, step)?;
        let scripted = matches!(step.kind, StepKind::Regular) && run.configs.is_scripted();
        let mut result = if started.is_err() {
            started
        } else if scripted {
            self.run_scripted(&mut run).await
        } else {
            self.run_items(&mut run, &items).await
        };
        if result.is_ok()
            && !scripted
            && let Some(due) = reflection_due(&run.configs)
        {
            result = self.reflection(&mut run, due).await;
        }
        self.end_step(run, result, scripted)
    }
}
