//! The agent loop of one step (spec sections 4, 8 and 10): runs the items of a
//! `message_sequence` (or the single turn of a `regular` step, or of a `todo_task`
//! orchestrator) of a loaded [`Workspace`]. An agent step that ran no turn completes with a
//! concern saying so, never as a plain success.
//!
//! Here: [`StepRunner`] and its builder, `run_step` (set-up, the items in order, the
//! automatic final gate, the final summary), the per-agent `Run` state, item entries in
//! `session.json`, cancellation and `disable_validation` (gates recorded `skipped`). The
//! other jobs are child modules:
//!
//! - `turn`: per turn, LLM call -> the tool calls it asked for (only tools passing the
//!   step's [`ToolPolicy`], under the turn's grant) -> results -> again, until a reply
//!   without tool calls; `STATUS: FAILED` / `CONCERNS:`, steering, and
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

mod gate;
mod prompts;
mod reflection;
mod scripted_step;
mod sub_agents;
mod turn;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::events::{Observer, RunEvent};
use crate::filters::ToolPolicy;
use crate::grants::{
    AgentFolders, TurnAccess, TurnContext, TurnGrant, TurnPurpose, grant_for_access_in,
    reflection_due, turn_grant_in,
};
use crate::mcp_servers::{McpServers, UNSANDBOXED_MARK};
use crate::prerequisites::{self, GoBack};
use crate::routes::MAX_ROUTE_DEPTH;
use crate::session::{FinalSummary, Session, Status, logs_dir, now_rfc3339};
use crate::steering::Steering;
use crate::step_script::ScriptOptions;
use crate::{foreach, template};
use trellis_sandbox::Limits;
use trellis_sandbox::llm::{
    Message, Options, Recorder, ReplayCursor, RetryPolicy, Target, ToolDefinition,
};
use trellis_sandbox::plugins::PluginRegistry;
use trellis_sandbox::script::ScriptRunner;
use trellis_workflow::plan::{Item, ItemBody, Step, StepKind};
use trellis_workflow::{AgentConfigs, Workspace};

/// Default cap on tool rounds (LLM calls answered with tool calls) per turn, as the
/// original allows; past it the turn gets one last call without tools to answer.
pub const DEFAULT_MAX_TOOL_ROUNDS: usize = 500;
/// Repair turns a failing gate gets before the step fails.
pub const MAX_REPAIR_TURNS: u32 = 3;
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

pub use prompts::{
    TOOL_POLICY_NOTE, offload_reference, out_of_tool_rounds, reflection_message, repair_message,
    step_system_prompt, sub_agent_system_prompt, system_prompt,
};
pub use reflection::reflection_item_id;
pub use turn::scan_reply;

use gate::gate_schema;

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
    max_route_depth: usize,
    cancel: Arc<AtomicBool>,
    observer: Observer,
    recorder: Option<Arc<Recorder>>,
    scripts: Option<(Arc<ScriptRunner>, ScriptOptions)>,
    steering: Option<Arc<Steering>>,
    /// The external MCP servers of the run (outside the sandbox).
    mcp: Option<Arc<McpServers>>,
    /// How often the step run already sent the run back to a prerequisite.
    prerequisite_returns: u32,
    /// The step's end does not wait for the disk ([`StepRunner::with_step_ends_behind`]).
    ends_behind: bool,
}

/// Why a turn ended without a final reply.
enum TurnEnd {
    Stopped,
    Failed(String),
}

struct TurnOk {
    text: String,
}

/// State of one agent's run: a step's own agent, or one call of a route's sub-agent.
struct Run<'w> {
    ws: &'w Workspace,
    step: &'w Step,
    configs: AgentConfigs,
    run_folder: String,
    /// The output folder (and shared folder) the agent's turns write to.
    folders: AgentFolders,
    /// `folders.output` on the host.
    output_dir: PathBuf,
    /// Where `session.json` goes: the output folder of a step, the home of a route.
    session_dir: PathBuf,
    /// Workspace-relative folder under which this agent's own routes have their homes.
    owner_rel: String,
    /// The models this agent talks to.
    models: AgentModels,
    logs: PathBuf,
    /// The name in events and messages: the step id, `<step>/<route>` for a sub-agent.
    label: String,
    /// 0 for a step's agent, one more per level of sub-agents.
    depth: usize,
    /// Prefix of session entry ids (`call-0001/` in a sub-agent's session).
    entry_prefix: String,
    /// Text put before the next user message (a caller's instructions).
    preamble: Option<String>,
    session: Session,
    history: Vec<Message>,
    tools: Vec<ToolDefinition>,
    policy: ToolPolicy,
    concerns: Vec<String>,
    final_text: Option<String>,
    turns: u64,
    /// Whether a `STATUS: FAILED` line in the next reply ends the step (not in a foreach
    /// row or a gate's repair turn).
    status_marker_ends: bool,
}

/// What differs between a step's own agent and one call of a route's sub-agent; everything
/// else of a [`Run`] starts the same way ([`StepRunner::new_run`]).
struct AgentSetup {
    configs: AgentConfigs,
    run_folder: String,
    folders: AgentFolders,
    output_dir: PathBuf,
    session_dir: PathBuf,
    owner_rel: String,
    models: AgentModels,
    logs: PathBuf,
    label: String,
    depth: usize,
    entry_prefix: String,
    preamble: Option<String>,
    /// The agent's session and conversation so far (empty for a fresh agent).
    session: Session,
    history: Vec<Message>,
}

impl StepRunner<'_> {
    /// The one constructor of a [`Run`], for steps and sub-agents alike: the tools its
    /// config offers, no turn yet, nothing concluded.
    fn new_run<'w>(&self, ws: &'w Workspace, step: &'w Step, setup: AgentSetup) -> Run<'w> {
        let (policy, tools) = self.tools_of(ws, step, &setup.configs);
        Run {
            ws,
            step,
            configs: setup.configs,
            run_folder: setup.run_folder,
            folders: setup.folders,
            output_dir: setup.output_dir,
            session_dir: setup.session_dir,
            owner_rel: setup.owner_rel,
            models: setup.models,
            logs: setup.logs,
            label: setup.label,
            depth: setup.depth,
            entry_prefix: setup.entry_prefix,
            preamble: setup.preamble,
            session: setup.session,
            history: setup.history,
            tools,
            policy,
            concerns: Vec::new(),
            final_text: None,
            turns: 0,
            status_marker_ends: true,
        }
    }
}

impl<'w> Run<'w> {
    fn ctx(&self) -> TurnContext<'_> {
        TurnContext {
            root: &self.ws.root,
            run_folder: &self.run_folder,
            step: self.step,
            configs: &self.configs,
        }
    }

    fn grant(&self, purpose: TurnPurpose<'_>) -> Result<TurnGrant, TurnEnd> {
        turn_grant_in(&self.ctx(), purpose, &self.folders).map_err(failed)
    }

    fn grant_for(&self, access: TurnAccess) -> Result<TurnGrant, TurnEnd> {
        grant_for_access_in(&self.ctx(), access, &self.folders).map_err(failed)
    }

    fn start_entry(&mut self, item_id: &str, item_type: &str) -> usize {
        let entry_id = format!("{}{item_id}", self.entry_prefix);
        self.session.start_entry(&entry_id, item_id, item_type)
    }

    fn save_session(&mut self) -> Result<()> {
        self.session.conversation_history = self
            .history
            .iter()
            .map(|m| serde_json::to_value(m).unwrap_or(Value::Null))
            .collect();
        self.session
            .write(&self.ws.fs, &self.session_dir)
            .with_context(|| format!("writing session.json in {}", self.session_dir.display()))
    }
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
            max_route_depth: MAX_ROUTE_DEPTH,
            cancel: Arc::new(AtomicBool::new(false)),
            observer: Observer::default(),
            recorder: None,
            scripts: None,
            steering: None,
            mcp: None,
            prerequisite_returns: 0,
            ends_behind: false,
        }
    }

    /// Takes messages sent to the step's agent from outside (see [`Steering`]): they join
    /// its conversation before its next LLM call.
    pub fn with_steering(mut self, steering: Arc<Steering>) -> Self {
        self.steering = Some(steering);
        self
    }

    /// Offers the tools of the run's external MCP servers to the steps that name them.
    pub fn with_mcp_servers(mut self, servers: Arc<McpServers>) -> Self {
        self.mcp = Some(servers);
        self
    }

    /// Runs the scripts of scripted steps (spec section 7) with `scripts`, under `options`
    /// (limits, group, variables). Without it a scripted step fails saying so.
    pub fn with_scripts(mut self, scripts: Arc<ScriptRunner>, options: ScriptOptions) -> Self {
        self.scripts = Some((scripts, options));
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

    /// Reports [`RunEvent`]s (items, turns, LLM and tool calls, gates) to `observer`.
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

    /// Shares a cancellation flag: once set, the step stops at the next boundary (before an
    /// item, between foreach rows, between tool rounds) and is recorded `stopped`.
    pub fn with_cancel(mut self, cancel: Arc<AtomicBool>) -> Self {
        self.cancel = cancel;
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
        let step = ws
            .plan
            .step(step_id)
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
        let configs = ws.agent_configs(step_id);
        let run_folder = ws
            .run_folder
            .clone()
            .unwrap_or_else(|| "iteration-0".to_string());
        let folders = AgentFolders::for_step(&run_folder, step);
        let output_dir = ws.step_output_dir(step_id);
        // Through the workspace handle: a link on the way to any of these folders (the run
        // folder, the step's output or logs) is refused, and a link at `agents/` is removed
        // as a link, never followed.
        ws.fs
            .create_dir_all(&output_dir)
            .with_context(|| format!("creating {}", output_dir.display()))?;
        // The routes' conversations and call folders belong to the step's conversation,
        // which starts afresh: those of an earlier run of the step go with it.
        let agents = output_dir.join(crate::routes::AGENTS_DIR);
        ws.fs
            .remove_all(&agents)
            .with_context(|| format!("clearing {} of an earlier run", agents.display()))?;
        let logs = logs_dir(&ws.run_dir(), step_id);
        ws.fs
            .remove_all(logs.join(crate::routes::AGENTS_DIR))
            .with_context(|| format!("clearing {} of an earlier run", logs.display()))?;
        ws.fs
            .create_dir_all(&logs)
            .with_context(|| format!("creating {}", logs.display()))?;
        let mut run = self.new_run(
            ws,
            step,
            AgentSetup {
                session: Session::new(step_id, &run_folder),
                configs,
                run_folder,
                owner_rel: folders.output.clone(),
                models: self.models.clone(),
                folders,
                session_dir: output_dir.clone(),
                output_dir,
                logs,
                label: step_id.to_string(),
                depth: 0,
                entry_prefix: String::new(),
                preamble: None,
                history: Vec::new(),
            },
        );
        let step_grant =
            grant_for_access_in(&run.ctx(), TurnAccess::for_step(&run.configs), &run.folders)?;
        for (field, path) in &step_grant.missing {
            tracing::warn!(
                "step {step_id:?}: {field} entry {path:?} does not exist: the step runs without it"
            );
        }
        let system = unsandboxed_note(system_prompt(&ws.plan, step, &step_grant), &run.tools);
        run.history.push(Message::system(system));
        run.save_session()?;

        let scripted = matches!(step.kind, StepKind::Regular) && run.configs.is_scripted();
        let mut result = if scripted {
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
        // An agentic step that ran no turn (a foreach over no rows, say) is never a plain
        // success: it completes with a concern saying so.
        if result.is_ok() && !scripted && run.turns == 0 {
            let note = format!(
                "{NO_TURN_CONCERN} (step {step_id:?}: no user message was sent to the agent)"
            );
            tracing::warn!("{note}");
            run.concerns.push(note);
        }
        let (mut status, mut error) = match result {
            Ok(()) => (Status::Completed, None),
            Err(TurnEnd::Stopped) => (Status::Stopped, Some("stop requested".to_string())),
            Err(TurnEnd::Failed(reason)) => (Status::Failed, Some(reason)),
        };
        // Decided before the summary is written, so it is written once and says it all.
        let go_back = match prerequisites::verdict(
            &run.configs,
            status,
            run.final_text.as_deref(),
            self.prerequisite_returns,
        ) {
            Ok(go_back) => go_back,
            Err(reason) => {
                status = Status::Failed;
                error = Some(reason);
                None
            }
        };
        run.session.status = status;
        run.save_session()?;
        let summary = FinalSummary {
            schema_version: crate::session::FINAL_SUMMARY_SCHEMA_VERSION,
            step_id: step_id.to_string(),
            run_folder: run.run_folder.clone(),
            status,
            execution_result: error.clone().or_else(|| run.final_text.clone()),
            concerns: run.concerns.clone(),
            completed_at: now_rfc3339(),
        };
        // The session and the turn logs are written behind the loop: the summary that says
        // the step is over goes after them, queued behind them or once they are on disk.
        if self.ends_behind {
            summary.write_behind(&ws.fs, &run.output_dir)
        } else {
            trellis_sandbox::store::write_behind::flush()
                .context("writing the step's session and turn logs")?;
            summary.write(&ws.fs, &run.output_dir)
        }
        .context("writing execution-final-summary.json")?;
        Ok(StepOutcome {
            status,
            go_back,
            concerns: run.concerns,
            turns: run.turns,
            final_text: run.final_text,
            error,
            output_dir: run.output_dir,
        })
    }

    async fn run_items(&self, run: &mut Run<'_>, items: &[Item]) -> Result<(), TurnEnd> {
        let skip_gates = run.configs.disable_validation == Some(true);
        for item in items {
            if self.cancelled() {
                return Err(TurnEnd::Stopped);
            }
            let is_gate = matches!(item.body, ItemBody::Prevalidation { .. });
            if is_gate && skip_gates {
                self.skip_gate(run, &item.id)?;
                continue;
            }
            let entry = self.begin_item(run, &item.id, item.body.name());
            let result = self.run_item(run, item).await;
            let (status, summary) = entry_outcome(&result, run.final_text.clone());
            self.end_item(run, entry, &item.id, status, summary)?;
            result?;
        }
        // The automatic final gate, unless the last item was the same gate.
        if let Some(schema) = &run.step.validation_schema {
            let same = items
                .last()
                .and_then(|i| gate_schema(run.step, i))
                .is_some_and(|s| s == schema);
            if !same {
                if self.cancelled() {
                    return Err(TurnEnd::Stopped);
                }
                if skip_gates {
                    return self.skip_gate(run, FINAL_GATE_ID);
                }
                let entry = self.begin_item(run, FINAL_GATE_ID, "prevalidation");
                let access = TurnAccess::for_step(&run.configs);
                let result = self.gate(run, FINAL_GATE_ID, schema, access).await;
                let (status, summary) = entry_outcome(&result, None);
                self.end_item(run, entry, FINAL_GATE_ID, status, summary)?;
                result?;
            }
        }
        Ok(())
    }

    /// Records a gate not run because the step sets `disable_validation`.
    fn skip_gate(&self, run: &mut Run<'_>, item_id: &str) -> Result<(), TurnEnd> {
        tracing::info!(
            "{}: gate {item_id} skipped: disable_validation is set in the step config",
            run.label
        );
        let entry = run.start_entry(item_id, "prevalidation");
        self.end_item(
            run,
            entry,
            item_id,
            Status::Skipped,
            Some(GATE_SKIPPED_SUMMARY.to_string()),
        )
    }

    /// Starts item `item_id`: a running entry, written to `session.json`, and an
    /// [`RunEvent::ItemStarted`]. Returns the entry's index.
    fn begin_item(&self, run: &mut Run<'_>, item_id: &str, item_type: &str) -> usize {
        let entry = run.start_entry(item_id, item_type);
        let _ = run.save_session();
        self.observer.emit(RunEvent::ItemStarted {
            step_id: run.label.clone(),
            item_id: item_id.to_string(),
            item_type: item_type.to_string(),
        });
        entry
    }

    /// Ends the entry of item `item_id` as `status` with `summary`: an
    /// [`RunEvent::ItemEnded`], then `session.json` rewritten.
    fn end_item(
        &self,
        run: &mut Run<'_>,
        entry: usize,
        item_id: &str,
        status: Status,
        summary: Option<String>,
    ) -> Result<(), TurnEnd> {
        self.observer.emit(RunEvent::ItemEnded {
            step_id: run.label.clone(),
            item_id: item_id.to_string(),
            status,
        });
        run.session.end_entry(entry, status, summary);
        run.save_session()
            .map_err(|e| TurnEnd::Failed(format!("{e:#}")))
    }

    #[tracing::instrument(skip_all, fields(item = %item.id))]
    async fn run_item(&self, run: &mut Run<'_>, item: &Item) -> Result<(), TurnEnd> {
        match &item.body {
            ItemBody::UserMessage { message, .. } => {
                let grant = run.grant(TurnPurpose::Item(item))?;
                self.turn(run, &item.id, 1, message.clone(), &grant).await?;
            }
            ItemBody::Foreach {
                source_sql,
                message,
                max_iterations,
                ..
            } => {
                // SQLite opens by path: no link on the way (it refuses one at the file).
                let db = run
                    .ws
                    .fs
                    .check_file_path("db/db.sqlite")
                    .map_err(|e| failed(anyhow::anyhow!("foreach item {:?}: {e}", item.id)))?;
                let rows = foreach::query_rows(&db, &item.id, source_sql, *max_iterations)
                    .map_err(failed)?;
                if let Some(note) = rows.cap_message(&item.id) {
                    tracing::warn!("{note}");
                }
                let tpl = template::MessageTemplate::parse(&item.id, message).map_err(failed)?;
                let grant = run.grant(TurnPurpose::Item(item))?;
                for (i, row) in rows.rows.iter().enumerate() {
                    if self.cancelled() {
                        return Err(TurnEnd::Stopped);
                    }
                    let text = tpl.render(i + 1, row).map_err(failed)?;
                    run.status_marker_ends = false;
                    let turn = self.turn(run, &item.id, i as u32 + 1, text, &grant).await;
                    run.status_marker_ends = true;
                    turn?;
                }
            }
            ItemBody::Prevalidation { .. } => {
                let Some(schema) = gate_schema(run.step, item) else {
                    return Ok(());
                };
                let access = TurnAccess::for_item(&run.configs, item);
                self.gate(run, &item.id, schema, access).await?;
            }
        }
        Ok(())
    }
}

/// How an item's entry (or a turn) ends for `result`: completed with `done` as its summary,
/// stopped, or failed with the reason.
fn entry_outcome<T>(result: &Result<T, TurnEnd>, done: Option<String>) -> (Status, Option<String>) {
    match result {
        Ok(_) => (Status::Completed, done),
        Err(TurnEnd::Stopped) => (Status::Stopped, None),
        Err(TurnEnd::Failed(reason)) => (Status::Failed, Some(reason.clone())),
    }
}

fn failed(e: anyhow::Error) -> TurnEnd {
    TurnEnd::Failed(format!("{e:#}"))
}

/// `system` with, when the agent is offered tools of external MCP servers, a paragraph
/// naming them as running outside the sandbox.
fn unsandboxed_note(mut system: String, tools: &[ToolDefinition]) -> String {
    let names: Vec<&str> = tools
        .iter()
        .filter(|t| t.description.starts_with(UNSANDBOXED_MARK))
        .map(|t| t.name.as_str())
        .collect();
    if !names.is_empty() {
        system.push_str(&format!(
            "\n\nUnsandboxed tools (external MCP servers the operator configured; they run \
             outside the sandbox, with no grant of this step): {}",
            names.join(", ")
        ));
    }
    system
}
