//! The agent loop of one step (spec sections 4, 8 and 10): runs the items of a
//! `message_sequence` (or the single turn of a `regular`) step of a loaded [`Workspace`].
//!
//! Per turn: LLM call -> the tool calls it asked for (only tools passing the step's
//! [`ToolPolicy`], under the turn's grant) -> results -> again, until a reply without tool
//! calls. Tool errors go back to the model as `error: ...` results. Items, gates with repair
//! turns, `STATUS: FAILED`, `CONCERNS:`, cancellation and persistence (`session.json`, turn
//! logs, final summary) are handled here, and so are:
//!
//! - routes: a step with `predefined_routes` offers `call_sub_agent`; a call runs the route's
//!   sub-agent step as a child agent with its own conversation per route (kept across calls)
//!   and a fresh call folder per call as its output folder ([`crate::sequence::routes`]);
//!   the child's answer, status and files come back as the tool result. The child talks to
//!   the models its [`ModelResolver`] names for it (its own step config's), else to its
//!   parent's;
//! - the closing reflection turn (`<step-id>-reflection`) when learnings or a knowledgebase
//!   contribution are due, with write access only to those stores;
//! - `disable_validation` (gates are recorded `skipped`) and `enable_context_offloading`
//!   (large tool results go to `<output>/tool-results/<call-id>.json`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

use crate::Limits;
use crate::capabilities::turn::{
    AgentFolders, GrantedFolder, ReflectionDue, TurnAccess, TurnContext, TurnGrant, TurnPurpose,
    grant_for_access_in, reflection_due, turn_grant_in,
};
use crate::llm::{
    Message, Options, Recorder, ReplayCursor, Request, RetryPolicy, Target, ToolCall,
    ToolDefinition, complete_with_options,
};
use crate::plugins::{PluginRegistry, PluginValidators};
use crate::script::{ScriptKind, ScriptOptions, ScriptOutcome, ScriptRunner};
use crate::sequence::events::{Observer, RunEvent};
use crate::sequence::filters::{CALL_SUB_AGENT, DELEGATION_CATEGORY, ToolPolicy};
use crate::sequence::routes::{
    AgentHome, CallResult, MAX_ROUTE_DEPTH, TOOL_RESULTS_DIR, call_preamble, call_sub_agent_tool,
    delegation_note, files_written,
};
use crate::sequence::scripted;
use crate::sequence::session::{
    FinalSummary, LlmCallRecord, RequestedToolCall, Session, Status, ToolCallRecord,
    TurnConversation, TurnSummary, logs_dir, now_rfc3339, write_turn_logs,
};
use crate::sequence::steering::{Phase, Steering};
use crate::sequence::{foreach, template};
use crate::validation::{Report, ValidationSchema, run_gate, write_report};
use crate::workflow::plan::{Item, ItemBody, Step, StepKind};
use crate::workflow::step_config::LearningDetailLevel;
use crate::workflow::{AgentConfigs, Workspace};

/// Default cap on tool rounds (LLM calls answered with tool calls) per turn.
pub const DEFAULT_MAX_TOOL_ROUNDS: usize = 20;
/// Repair turns a failing gate gets before the step fails.
pub const MAX_REPAIR_TURNS: u32 = 3;
/// The item id of the automatic final gate.
pub const FINAL_GATE_ID: &str = "__automatic_final_validation__";
/// Tool results larger than this (bytes) are offloaded to a file when the step enables
/// context offloading.
pub const OFFLOAD_THRESHOLD: usize = 16 * 1024;
/// The summary of a gate entry skipped because of `disable_validation`.
pub const GATE_SKIPPED_SUMMARY: &str = "validation disabled by disable_validation";
/// The session item type of the reflection turn.
pub const REFLECTION_ITEM_TYPE: &str = "reflection";
/// The short tool policy note closing the system prompt.
pub const TOOL_POLICY_NOTE: &str = "Use the tools offered to read and write files; paths are \
workspace-relative. A tool error comes back as a result starting with `error:`: read it and \
adjust. When the task cannot be done, reply with a line `STATUS: FAILED <reason>`. Report \
doubts on lines starting with `CONCERNS:`.";

/// How a step ended.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutcome {
    /// `completed`, `failed` or `stopped`.
    pub status: Status,
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
        }
    }

    /// Takes messages sent to the step's agent from outside (see [`Steering`]): they join
    /// its conversation before its next LLM call.
    pub fn with_steering(mut self, steering: Arc<Steering>) -> Self {
        self.steering = Some(steering);
        self
    }

    /// Records what the step's own agent does next (sub-agents leave it alone: a message is
    /// for the agent the operator started).
    fn steer_phase(&self, run: &Run<'_>, phase: Phase) {
        if run.depth == 0
            && let Some(steering) = &self.steering
        {
            steering.set_phase(phase);
        }
    }

    /// Appends the messages sent to the step's agent since its last LLM call.
    fn take_steering(&self, run: &mut Run<'_>) {
        if run.depth == 0
            && let Some(steering) = &self.steering
        {
            for text in steering.take() {
                run.history.push(Message::user(text));
            }
        }
    }

    /// Runs the scripts of scripted steps (spec section 7) with `scripts`, under `options`
    /// (limits, group, variables). Without it a scripted step fails saying so.
    pub fn with_scripts(mut self, scripts: Arc<ScriptRunner>, options: ScriptOptions) -> Self {
        self.scripts = Some((scripts, options));
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

    /// Sets the cap on tool rounds per turn.
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
        let agents = output_dir.join(crate::sequence::routes::AGENTS_DIR);
        ws.fs
            .remove_all(&agents)
            .with_context(|| format!("clearing {} of an earlier run", agents.display()))?;
        let logs = logs_dir(&ws.run_dir(), step_id);
        ws.fs
            .remove_all(logs.join(crate::sequence::routes::AGENTS_DIR))
            .with_context(|| format!("clearing {} of an earlier run", logs.display()))?;
        ws.fs
            .create_dir_all(&logs)
            .with_context(|| format!("creating {}", logs.display()))?;
        let (policy, tools) = self.tools_of(step, &configs);
        let mut run = Run {
            ws,
            step,
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
            tools,
            policy,
            concerns: Vec::new(),
            final_text: None,
            turns: 0,
        };
        let step_grant =
            grant_for_access_in(&run.ctx(), TurnAccess::for_step(&run.configs), &run.folders)?;
        run.history
            .push(Message::system(system_prompt(step, &step_grant)));
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
        let (status, error) = match result {
            Ok(()) => (Status::Completed, None),
            Err(TurnEnd::Stopped) => (Status::Stopped, Some("stop requested".to_string())),
            Err(TurnEnd::Failed(reason)) => (Status::Failed, Some(reason)),
        };
        run.session.status = status;
        run.save_session()?;
        // The session and the turn logs are written behind the loop: all on disk before the
        // summary that says the step is over.
        crate::store::write_behind::flush().context("writing the step's session and turn logs")?;
        FinalSummary {
            schema_version: crate::sequence::session::FINAL_SUMMARY_SCHEMA_VERSION,
            step_id: step_id.to_string(),
            run_folder: run.run_folder.clone(),
            status,
            execution_result: error.clone().or_else(|| run.final_text.clone()),
            concerns: run.concerns.clone(),
            completed_at: now_rfc3339(),
        }
        .write(&ws.fs, &run.output_dir)
        .context("writing execution-final-summary.json")?;
        Ok(StepOutcome {
            status,
            concerns: run.concerns,
            turns: run.turns,
            final_text: run.final_text,
            error,
            output_dir: run.output_dir,
        })
    }

    /// A scripted step (spec section 7): the script, then the step's gate; on a failure a
    /// repair turn (unless `lock_code`) and the script again. No LLM is called when the
    /// script succeeds and its outputs pass.
    async fn run_scripted(&self, run: &mut Run<'_>) -> Result<(), TurnEnd> {
        let Some((scripts, options)) = &self.scripts else {
            return Err(TurnEnd::Failed(format!(
                "step {:?} is scripted (declared_execution_mode \"scripted\"), but this \
                 runner runs no scripts",
                run.step.id
            )));
        };
        let step_id = run.step.id.clone();
        let locked = run.configs.lock_code == Some(true);
        let skip_gate = run.configs.disable_validation == Some(true);
        let mut attempt = 1;
        loop {
            if self.cancelled() {
                return Err(TurnEnd::Stopped);
            }
            let item_id = scripted::script_item_id(attempt);
            let entry = self.begin_item(run, &item_id, scripted::SCRIPT_ITEM_TYPE);
            self.steer_phase(run, Phase::Script);
            let result = match scripts.run(run.ws, &step_id, options).await {
                Ok(outcome) => self.check_script(run, attempt, skip_gate, outcome).await,
                Err(e) => Err(TurnEnd::Failed(format!("{e:#}"))),
            };
            let (status, summary) = match &result {
                Ok(Ok(done)) => (Status::Completed, Some(done.clone())),
                Ok(Err((_, problem))) => (Status::Failed, Some(problem.clone())),
                Err(TurnEnd::Stopped) => (Status::Stopped, None),
                Err(TurnEnd::Failed(reason)) => (Status::Failed, Some(reason.clone())),
            };
            self.end_item(run, entry, &item_id, status, summary)?;
            let (kind, script, problem) = match result? {
                Ok(done) => {
                    run.final_text = Some(done);
                    return Ok(());
                }
                Err((outcome, problem)) => (outcome.kind, outcome.script, problem),
            };
            if locked {
                return Err(TurnEnd::Failed(format!(
                    "{problem}\n(lock_code is set for step {step_id:?}: the script is not repaired)"
                )));
            }
            if kind == ScriptKind::Wasm {
                return Err(TurnEnd::Failed(format!(
                    "{problem}\n({script} is a compiled component: the agent cannot repair it)"
                )));
            }
            if attempt > scripted::MAX_SCRIPT_REPAIRS {
                return Err(TurnEnd::Failed(format!(
                    "{script} still fails after {} repairs: {problem}",
                    scripted::MAX_SCRIPT_REPAIRS
                )));
            }
            if run.models.targets.is_empty() {
                return Err(TurnEnd::Failed(format!(
                    "{problem}\nRepairing the script needs an LLM, and step {step_id:?} has \
                     none: set its execution_llm, a default llm in workflow.json, or give \
                     --llm PROVIDER:MODEL (or set lock_code to fail without repair)"
                )));
            }
            if self.cancelled() {
                return Err(TurnEnd::Stopped);
            }
            let code_rel = format!("code/{step_id}");
            let code_host =
                crate::capabilities::resolve_in_root(&run.ws.root, &code_rel).map_err(failed)?;
            let mut grant = run.grant_for(TurnAccess::for_step(&run.configs))?;
            grant.grant = grant
                .grant
                .clone()
                .write(code_host, &format!("/{code_rel}"))
                .map_err(failed)?;
            grant.folders.push(GrantedFolder {
                path: code_rel,
                access: crate::Access::ReadWrite,
                role: "the step's script, writable for this repair".to_string(),
            });
            let source = run.ws.fs.read_to_string(&script).ok();
            let message = scripted::repair_message(
                &step_id,
                &script,
                kind,
                source.as_deref(),
                &problem,
                &run.step.outputs(),
            );
            let repair_id = scripted::repair_item_id(attempt);
            let entry = run.start_entry(&repair_id, "user_message");
            let turn = self.turn(run, &repair_id, 1, message, &grant).await;
            let (status, summary) = entry_outcome(&turn, run.final_text.clone());
            run.session.end_entry(entry, status, summary);
            run.save_session()
                .map_err(|e| TurnEnd::Failed(format!("{e:#}")))?;
            turn?;
            attempt += 1;
        }
    }

    /// What one script run means for the step: `Ok(summary)` when it succeeded and its
    /// outputs pass the gate (or the gate is disabled), `Err((outcome, problem))` when the
    /// script or the gate failed. A gate that cannot run at all fails the step.
    #[allow(clippy::type_complexity)]
    async fn check_script(
        &self,
        run: &mut Run<'_>,
        attempt: u32,
        skip_gate: bool,
        outcome: ScriptOutcome,
    ) -> Result<Result<String, (ScriptOutcome, String)>, TurnEnd> {
        if let Some(problem) = outcome.error_message() {
            return Ok(Err((outcome, problem)));
        }
        let Some(schema) = run.step.validation_schema.as_ref().filter(|_| !skip_gate) else {
            return Ok(Ok(scripted::success_summary(&outcome)));
        };
        let report = self.check_gate(run, FINAL_GATE_ID, attempt, schema).await?;
        if report.passed {
            return Ok(Ok(format!(
                "{}; the outputs pass the validation gate",
                scripted::success_summary(&outcome)
            )));
        }
        let problem = format!(
            "{} exited normally, but its outputs fail the validation gate:\n{}",
            outcome.script,
            failing_checks(&report)
        );
        Ok(Err((outcome, problem)))
    }

    /// The closing reflection turn (`<step-id>-reflection`, kind learning): the grant of
    /// [`TurnPurpose::Reflection`] writes only the stores due. The step's final answer stays
    /// the one of its work.
    async fn reflection(&self, run: &mut Run<'_>, due: ReflectionDue) -> Result<(), TurnEnd> {
        if self.cancelled() {
            return Err(TurnEnd::Stopped);
        }
        let item_id = reflection_item_id(&run.step.id);
        let entry = self.begin_item(run, &item_id, REFLECTION_ITEM_TYPE);
        let answer = run.final_text.clone();
        let message = reflection_message(&run.step.id, &run.configs, due);
        let result = match run.grant(TurnPurpose::Reflection) {
            Ok(grant) => self.turn(run, &item_id, 1, message, &grant).await,
            Err(e) => Err(e),
        };
        let (status, summary) = entry_outcome(&result, run.final_text.clone());
        if answer.is_some() {
            run.final_text = answer;
        }
        self.end_item(run, entry, &item_id, status, summary)?;
        result
    }

    /// The tool policy of a step and the tools offered: plugin tools passing the filters,
    /// then `call_sub_agent` when the step has routes.
    fn tools_of(&self, step: &Step, configs: &AgentConfigs) -> (ToolPolicy, Vec<ToolDefinition>) {
        let routes = step.predefined_routes();
        let policy = ToolPolicy::from_configs(configs, !routes.is_empty());
        let mut tools = self.offered_tools(&policy);
        if policy.host.allows(DELEGATION_CATEGORY, CALL_SUB_AGENT) {
            tools.push(call_sub_agent_tool(routes));
        }
        (policy, tools)
    }

    /// One `call_sub_agent` call of the agent of `parent`: checks the route and the depth,
    /// runs the route's sub-agent in a fresh call folder and returns what it did. Never
    /// fails: errors (an unknown route, too deep) land in the record as tool errors, and a
    /// sub-agent that fails is a result saying so.
    fn sub_agent_call<'s>(
        &'s self,
        parent: &'s Run<'_>,
        call: &'s ToolCall,
    ) -> futures::future::BoxFuture<'s, ToolCallRecord> {
        Box::pin(async move {
            let started_at = now_rfc3339();
            let t0 = Instant::now();
            let args = parse_arguments(&call.arguments);
            let outcome = match &args {
                Err(e) => Err(e.clone()),
                Ok(a) => self.run_call(parent, a).await,
            };
            tool_record(call, args, outcome, started_at, t0)
        })
    }

    async fn run_call(&self, parent: &Run<'_>, args: &Value) -> Result<Value, String> {
        let routes = parent.step.predefined_routes();
        let route_id = args
            .get("route_id")
            .and_then(Value::as_str)
            .ok_or("call_sub_agent needs a string \"route_id\"")?;
        let instructions = args
            .get("instructions")
            .and_then(Value::as_str)
            .ok_or("call_sub_agent needs a string \"instructions\"")?;
        if let Some(extra) = args
            .as_object()
            .and_then(|o| o.keys().find(|k| *k != "route_id" && *k != "instructions"))
        {
            return Err(format!(
                "call_sub_agent takes route_id and instructions only, not {extra:?}"
            ));
        }
        let route = routes
            .iter()
            .find(|r| r.route_id == route_id)
            .ok_or_else(|| {
                format!(
                    "unknown route_id {route_id:?}: the routes of {} are {}",
                    parent.label,
                    routes
                        .iter()
                        .map(|r| format!("{:?}", r.route_id))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
        if parent.depth >= self.max_route_depth {
            return Err(format!(
                "route {route_id:?} refused: sub-agents nest at most {} level(s) deep and {} is \
                 already at depth {}",
                self.max_route_depth, parent.label, parent.depth
            ));
        }
        if self.cancelled() {
            return Err("stop requested".to_string());
        }
        let ws = parent.ws;
        let own = match &self.resolver {
            Some(Resolver(resolve)) => resolve(ws, route_id)
                .map_err(|e| format!("route {route_id:?}: its model: {e:#}"))?,
            None => None,
        };
        let models = own.unwrap_or_else(|| parent.models.clone());
        let step: &Step = &route.sub_agent_step;
        let home =
            AgentHome::new(&ws.root, &parent.owner_rel, route_id).map_err(|e| format!("{e:#}"))?;
        let call_id = home.next_call(&ws.fs).map_err(|e| format!("{e:#}"))?;
        let output_rel = home.call_rel(&call_id);
        let label = format!("{}/{route_id}", parent.label);
        let folders = AgentFolders {
            output: output_rel.clone(),
            shared: parent.folders.shared.clone().or_else(|| {
                Some(format!(
                    "{}/{}",
                    parent.folders.output,
                    crate::sequence::routes::SHARED_DIR
                ))
            }),
            sub_agent: true,
        };
        let configs = ws.agent_configs(route_id);
        let (policy, tools) = self.tools_of(step, &configs);
        let logs = parent
            .logs
            .join(crate::sequence::routes::AGENTS_DIR)
            .join(route_id);
        ws.fs
            .create_dir_all(&logs)
            .map_err(|e| format!("creating {}: {e}", logs.display()))?;
        let (session, history) = match Session::read(&ws.fs, &home.dir) {
            Ok(Some(s)) => {
                let history = s
                    .conversation_history
                    .iter()
                    .map(|m| serde_json::from_value::<Message>(m.clone()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| {
                        format!("{}/session.json: unreadable conversation: {e}", home.rel)
                    })?;
                (s, history)
            }
            Ok(None) => (Session::new(route_id, &parent.run_folder), Vec::new()),
            Err(e) => return Err(format!("{}/session.json: {e}", home.rel)),
        };
        let mut run = Run {
            ws,
            step,
            configs,
            run_folder: parent.run_folder.clone(),
            output_dir: ws.root.join(&output_rel),
            folders,
            session_dir: home.dir.clone(),
            owner_rel: home.rel.clone(),
            models,
            logs,
            label: label.clone(),
            depth: parent.depth + 1,
            entry_prefix: format!("{call_id}/"),
            preamble: Some(call_preamble(&call_id, instructions)),
            session,
            history,
            tools,
            policy,
            concerns: Vec::new(),
            final_text: None,
            turns: 0,
        };
        // The system prompt names this call's folders: it is replaced on every call, the
        // rest of the conversation is kept.
        let grant = run
            .grant_for(TurnAccess::for_step(&run.configs))
            .map_err(|e| match e {
                TurnEnd::Failed(r) => r,
                TurnEnd::Stopped => "stop requested".to_string(),
            })?;
        let system = Message::system(system_prompt(step, &grant));
        match run.history.first_mut() {
            Some(first) if first.role == crate::llm::Role::System => *first = system,
            _ => run.history.insert(0, system),
        }
        run.session.status = Status::Running;
        run.save_session().map_err(|e| format!("{e:#}"))?;
        self.observer.emit(RunEvent::SubAgentStarted {
            step_id: parent.label.clone(),
            route_id: route_id.to_string(),
            call_id: call_id.clone(),
            depth: run.depth,
        });
        let items = step.effective_items();
        let result = self.run_items(&mut run, &items).await;
        let (status, error) = match result {
            Ok(()) => (Status::Completed, None),
            Err(TurnEnd::Stopped) => (Status::Stopped, Some("stop requested".to_string())),
            Err(TurnEnd::Failed(reason)) => (Status::Failed, Some(reason)),
        };
        run.session.status = status;
        if let Err(e) = run.save_session() {
            tracing::warn!("{label}: {e:#}");
        }
        self.observer.emit(RunEvent::SubAgentEnded {
            step_id: parent.label.clone(),
            route_id: route_id.to_string(),
            call_id: call_id.clone(),
            status,
        });
        Ok(CallResult {
            route_id: route_id.to_string(),
            call_id,
            status,
            answer: run.final_text,
            error,
            files: files_written(&ws.fs, &ws.root, &run.output_dir),
            output_folder: output_rel,
        }
        .to_value())
    }

    /// The plugin tools passing the policy, as the model is told about them.
    fn offered_tools(&self, policy: &ToolPolicy) -> Vec<ToolDefinition> {
        let mut tools = Vec::new();
        for plugin in self.registry.plugins() {
            for listing in plugin.tool_listings() {
                if policy.plugins.allows_full_name(&listing.name) {
                    tools.push(ToolDefinition {
                        name: listing.name.clone(),
                        description: listing.description.to_string(),
                        parameters: listing.input_schema.clone(),
                    });
                }
            }
        }
        tools
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
                    self.turn(run, &item.id, i as u32 + 1, text, &grant).await?;
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

    /// Runs gate `item_id` once on the output folder: writes its report (attempt `attempt`)
    /// and reports the result as an event. A gate that cannot run at all fails the step.
    async fn check_gate(
        &self,
        run: &Run<'_>,
        item_id: &str,
        attempt: u32,
        schema: &ValidationSchema,
    ) -> Result<Report, TurnEnd> {
        self.steer_phase(run, Phase::Gate);
        let validators = PluginValidators::new(self.registry, self.limits);
        let report = run_gate(&run.ws.root, &run.output_dir, schema, &validators)
            .await
            .map_err(|e| TurnEnd::Failed(format!("gate {item_id}: {e}")))?;
        if let Err(e) = write_gate_report(run, item_id, attempt, &report) {
            tracing::warn!("{}: gate {item_id}: writing the report: {e}", run.label);
        }
        self.observer.emit(RunEvent::Gate {
            step_id: run.label.clone(),
            item_id: item_id.to_string(),
            attempt,
            passed: report.passed,
            failures: report.failures().count(),
        });
        Ok(report)
    }

    /// Runs a gate; on failure up to [`MAX_REPAIR_TURNS`] repair turns, each followed by the gate.
    async fn gate(
        &self,
        run: &mut Run<'_>,
        item_id: &str,
        schema: &ValidationSchema,
        access: TurnAccess,
    ) -> Result<(), TurnEnd> {
        let mut attempt = 1;
        loop {
            let report = self.check_gate(run, item_id, attempt, schema).await?;
            if report.passed {
                return Ok(());
            }
            if attempt > MAX_REPAIR_TURNS {
                return Err(TurnEnd::Failed(format!(
                    "gate {item_id} still fails after {MAX_REPAIR_TURNS} repair turns:\n{}",
                    failing_checks(&report)
                )));
            }
            if self.cancelled() {
                return Err(TurnEnd::Stopped);
            }
            let grant = run.grant_for(access)?;
            let repair_id = format!("{item_id}-repair-{attempt}");
            self.turn(run, &repair_id, 1, repair_message(item_id, &report), &grant)
                .await?;
            attempt += 1;
        }
    }

    /// The LLM call of one round to `models`, with the cassette's next endpoint under replay.
    async fn call_llm(&self, models: &AgentModels, request: &Request) -> crate::llm::Completion {
        let targets = match &models.replay {
            Some(cursor) => match (models.targets.first(), cursor.next_endpoint()) {
                (Some(first), Ok(endpoint)) => vec![Target {
                    endpoint,
                    ..first.clone()
                }],
                _ => models.targets.clone(),
            },
            None => models.targets.clone(),
        };
        let completion = complete_with_options(
            self.registry,
            &targets,
            &models.options,
            request,
            &self.retry,
            &self.limits,
        )
        .await;
        if let (Some(recorder), Ok(response)) = (&self.recorder, &completion.result)
            && let Err(e) = recorder.record(request, response)
        {
            tracing::error!("{e:#}");
        }
        completion
    }

    /// One turn: user message, then rounds of LLM call and tool calls until a plain reply.
    #[tracing::instrument(skip_all, fields(item = item_id, iteration))]
    async fn turn(
        &self,
        run: &mut Run<'_>,
        item_id: &str,
        iteration: u32,
        message: String,
        grant: &TurnGrant,
    ) -> Result<(), TurnEnd> {
        run.turns += 1;
        run.session.execution_turn_count += 1;
        let turn_no = run.session.execution_turn_count;
        self.observer.emit(RunEvent::TurnStarted {
            step_id: run.label.clone(),
            item_id: item_id.to_string(),
            iteration,
            turn: turn_no,
        });
        let started_at = now_rfc3339();
        let started = Instant::now();
        let first_message = run.history.len();
        let message = match run.preamble.take() {
            Some(preamble) => format!("{preamble}\n\n{message}"),
            None => message,
        };
        run.history.push(Message::user(message));
        let mut conv = TurnConversation {
            step_id: run.step.id.clone(),
            item_id: item_id.to_string(),
            attempt: turn_no as u32,
            iteration,
            messages: Vec::new(),
            llm_calls: Vec::new(),
            tool_calls: Vec::new(),
        };
        let parallel = !run.configs.disable_parallel_tool_execution.unwrap_or(false);
        let mut result = Err(TurnEnd::Failed(format!(
            "turn {item_id}: more than {} tool rounds without a final reply",
            self.max_tool_rounds
        )));
        for round in 0..=self.max_tool_rounds {
            if self.cancelled() {
                result = Err(TurnEnd::Stopped);
                break;
            }
            self.steer_phase(run, Phase::LlmCall);
            let request = Request {
                model: run
                    .models
                    .targets
                    .first()
                    .map(|t| t.model.clone())
                    .unwrap_or_default(),
                messages: run.history.clone(),
                tools: run.tools.clone(),
                options: Options::default(),
            };
            let call_started = now_rfc3339();
            let t0 = Instant::now();
            let completion = self.call_llm(&run.models, &request).await;
            let answered = completion.answered_by().or(completion.attempts.last());
            let mut record = LlmCallRecord {
                turn: turn_no,
                provider: answered.map(|a| a.provider.clone()).unwrap_or_default(),
                model_id: answered.map(|a| a.model.clone()).unwrap_or_default(),
                status: Status::Completed,
                error: None,
                started_at: call_started,
                completed_at: now_rfc3339(),
                duration_ms: t0.elapsed().as_millis() as u64,
                prompt_tokens: 0,
                completion_tokens: 0,
                total_tokens: 0,
                tool_calls: Vec::new(),
            };
            let response = match completion.result {
                Ok(r) => r,
                Err(e) => {
                    record.status = Status::Failed;
                    record.error = Some(e.to_string());
                    self.emit_llm_call(&run.label, &record);
                    conv.llm_calls.push(record);
                    result = Err(TurnEnd::Failed(format!(
                        "turn {item_id}: LLM call failed: {e}"
                    )));
                    break;
                }
            };
            record.prompt_tokens = response.usage.prompt_tokens.into();
            record.completion_tokens = response.usage.completion_tokens.into();
            record.total_tokens = response.usage.total_tokens.into();
            record.tool_calls = response
                .tool_calls
                .iter()
                .map(|c| RequestedToolCall {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    arguments: parse_arguments(&c.arguments).unwrap_or(Value::Null),
                })
                .collect();
            self.emit_llm_call(&run.label, &record);
            conv.llm_calls.push(record);
            run.history.push(Message::assistant(&response));
            if response.tool_calls.is_empty() {
                // A message that arrived while the model answered keeps the turn going.
                let pending = match &self.steering {
                    Some(steering) if run.depth == 0 => steering.finish_turn(Phase::Preparing),
                    _ => Vec::new(),
                };
                if pending.is_empty() || round == self.max_tool_rounds {
                    result = Ok(TurnOk {
                        text: response.text.clone(),
                    });
                    break;
                }
                run.history.extend(pending.into_iter().map(Message::user));
                continue;
            }
            if round == self.max_tool_rounds {
                break;
            }
            self.steer_phase(run, Phase::ToolCalls);
            let records = self
                .tool_calls(run, &response.tool_calls, grant, parallel)
                .await;
            for r in records {
                self.observer.emit(RunEvent::ToolCall {
                    step_id: run.label.clone(),
                    tool: r.tool_name.clone(),
                    error: r.error.clone(),
                    duration_ms: r.duration_ms,
                });
                let content = match (&r.result, &r.error) {
                    (_, Some(e)) => format!("error: {e}"),
                    (Some(v), None) => match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    },
                    (None, None) => String::new(),
                };
                let content = if run.configs.enable_context_offloading == Some(true)
                    && r.error.is_none()
                    && content.len() > OFFLOAD_THRESHOLD
                {
                    offload(run, &r, content)
                } else {
                    content
                };
                run.history
                    .push(Message::tool_result(r.tool_call_id.clone(), content));
                conv.tool_calls.push(r);
            }
            self.take_steering(run);
        }
        self.steer_phase(run, Phase::Preparing);
        conv.messages = run.history[first_message..]
            .iter()
            .map(|m| serde_json::to_value(m).unwrap_or(Value::Null))
            .collect();
        let (status, error) = entry_outcome(&result, None);
        let summary = TurnSummary::from_calls(
            &conv,
            item_id,
            status,
            error,
            started_at,
            now_rfc3339(),
            started.elapsed().as_millis() as u64,
        );
        if let Err(e) = write_turn_logs(&run.ws.fs, &run.logs, &summary, &conv) {
            tracing::warn!("{}: turn {item_id}: writing the turn logs: {e}", run.label);
        }
        let _ = run.save_session();
        let ok = result?;
        let (failed_reason, concerns) = scan_reply(&ok.text);
        run.concerns.extend(concerns);
        run.final_text = Some(ok.text);
        if let Some(reason) = failed_reason {
            return Err(TurnEnd::Failed(reason));
        }
        Ok(())
    }

    fn emit_llm_call(&self, step_id: &str, record: &LlmCallRecord) {
        self.observer.emit(RunEvent::LlmCall {
            step_id: step_id.to_string(),
            provider: record.provider.clone(),
            model: record.model_id.clone(),
            prompt_tokens: record.prompt_tokens,
            completion_tokens: record.completion_tokens,
            tool_calls: record.tool_calls.len(),
            duration_ms: record.duration_ms,
            error: record.error.clone(),
        });
    }

    /// The tool calls of one LLM response, records in the order asked. Plugin tools run in
    /// parallel unless `parallel` is off; `call_sub_agent` calls run after them, one at a
    /// time (a route's conversation is one conversation).
    async fn tool_calls(
        &self,
        run: &Run<'_>,
        calls: &[ToolCall],
        grant: &TurnGrant,
        parallel: bool,
    ) -> Vec<ToolCallRecord> {
        let is_delegation = |c: &ToolCall| {
            crate::plugins::normalize_tool_name(c.name.trim()) == CALL_SUB_AGENT
                && run.policy.host.allows(DELEGATION_CATEGORY, CALL_SUB_AGENT)
        };
        let plugin_calls = calls
            .iter()
            .filter(|c| !is_delegation(c))
            .map(|c| self.tool_call(&run.policy, c, grant));
        let mut plugin_records = if parallel {
            futures::future::join_all(plugin_calls).await
        } else {
            let mut out = Vec::new();
            for c in plugin_calls {
                out.push(c.await);
            }
            out
        }
        .into_iter();
        let mut records = Vec::with_capacity(calls.len());
        for c in calls {
            if is_delegation(c) {
                records.push(self.sub_agent_call(run, c).await);
            } else if let Some(r) = plugin_records.next() {
                records.push(r);
            }
        }
        records
    }

    /// One tool call, never failing: errors land in the record.
    async fn tool_call(
        &self,
        policy: &ToolPolicy,
        call: &ToolCall,
        grant: &TurnGrant,
    ) -> ToolCallRecord {
        let started_at = now_rfc3339();
        let t0 = Instant::now();
        let args = parse_arguments(&call.arguments);
        let outcome: Result<Value, String> = match &args {
            Err(e) => Err(e.clone()),
            Ok(_) if !policy.plugins.allows_full_name(&call.name) => Err(format!(
                "tool {:?} is not available in this step",
                call.name
            )),
            Ok(a) => self
                .registry
                .call_tool(&call.name, a, &grant.grant, &self.limits)
                .await
                .map_err(|e| e.to_string()),
        };
        tool_record(call, args, outcome, started_at, t0)
    }
}

/// The schema a prevalidation item checks: its own, else the step's top-level one (spec
/// section 2); `None` for other items.
fn gate_schema<'s>(step: &'s Step, item: &'s Item) -> Option<&'s ValidationSchema> {
    match item.body {
        ItemBody::Prevalidation { .. } => {
            item.body.own_schema().or(step.validation_schema.as_ref())
        }
        _ => None,
    }
}

/// The record of a tool call that started at `started_at` (`t0`) and ended now.
fn tool_record(
    call: &ToolCall,
    args: Result<Value, String>,
    outcome: Result<Value, String>,
    started_at: String,
    t0: Instant,
) -> ToolCallRecord {
    ToolCallRecord {
        tool_call_id: call.id.clone(),
        tool_name: call.name.clone(),
        args: args.unwrap_or(Value::Null),
        result: outcome.as_ref().ok().cloned(),
        error: outcome.err(),
        duration_ms: t0.elapsed().as_millis() as u64,
        started_at,
        completed_at: now_rfc3339(),
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

/// Writes a gate report: a step's under `logs/<step-id>/`, a sub-agent's in its own log
/// folder (`logs/<step-id>/agents/<route-id>/`), labelled with the call.
fn write_gate_report(
    run: &Run<'_>,
    item_id: &str,
    attempt: u32,
    report: &Report,
) -> std::io::Result<()> {
    if run.depth == 0 {
        return write_report(
            &run.ws.fs,
            &run.ws.run_dir(),
            &run.step.id,
            item_id,
            attempt,
            report,
        )
        .map(|_| ());
    }
    let label = format!("{}{item_id}", run.entry_prefix).replace('/', "-");
    let record = serde_json::json!({
        "step_id": run.label,
        "label": label,
        "attempt": attempt,
        "report": report,
    });
    run.ws.fs.write_json_atomic(
        run.logs
            .join(format!("pre_validation_{label}_attempt_{attempt}.json")),
        &record,
    )?;
    run.ws
        .fs
        .write_json_atomic(run.logs.join("pre_validation.json"), &record)
}

/// Writes a large tool result to `<output>/tool-results/<tool-call-id>.json` and returns the
/// short reference that replaces it in the conversation. When the file cannot be written the
/// result stays in the conversation as it was.
fn offload(run: &Run<'_>, record: &ToolCallRecord, content: String) -> String {
    let name = format!("{}.json", file_safe(&record.tool_call_id));
    let path = run.output_dir.join(TOOL_RESULTS_DIR).join(&name);
    let value = record.result.clone().unwrap_or(Value::Null);
    match run.ws.fs.write_json_atomic(&path, &value) {
        Ok(()) => offload_reference(
            &format!("{}/{TOOL_RESULTS_DIR}/{name}", run.folders.output),
            content.len(),
        ),
        Err(e) => {
            tracing::warn!(
                "{}: offloading a tool result to {}: {e}",
                run.label,
                path.display()
            );
            content
        }
    }
}

/// The reference that replaces an offloaded tool result of `bytes` bytes written to `rel`
/// (workspace-relative).
pub fn offload_reference(rel: &str, bytes: usize) -> String {
    format!(
        "The result of this tool call ({bytes} bytes) is too large to show here. It was \
         written to {rel}: read it with your tools when you need it."
    )
}

/// A tool call id as a file name: characters other than letters, digits, `-`, `_` and `.`
/// become `_`; an empty or dot-only id becomes `call`.
fn file_safe(id: &str) -> String {
    let name: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.trim_matches('.').is_empty() {
        "call".to_string()
    } else {
        name
    }
}

/// The item id of a step's reflection turn: `<step-id>-reflection`.
pub fn reflection_item_id(step_id: &str) -> String {
    format!("{step_id}-reflection")
}

/// The message of the reflection turn: what to record and where, per store due.
pub fn reflection_message(step_id: &str, configs: &AgentConfigs, due: ReflectionDue) -> String {
    let mut text = String::from(
        "Reflection: the work of this step is done and accepted; its output folder is \
         read-only now.\n",
    );
    if due.learnings {
        let objective = configs.learning_objective.as_deref().unwrap_or("").trim();
        let detail = match configs.effective_learning_detail_level() {
            LearningDetailLevel::Exact => {
                "Be exact: name the values, queries, commands and file names that mattered."
            }
            LearningDetailLevel::General => {
                "Keep to general lessons that carry over to similar runs."
            }
            LearningDetailLevel::None => "State each lesson in one line, without detail.",
        };
        text.push_str(&format!(
            "- Record what this run taught you in learnings/_global/{step_id}.md (add to it if \
             it exists). Learning objective: {objective} {detail}\n"
        ));
    }
    if due.knowledgebase {
        let contribution = configs
            .knowledgebase_contribution
            .as_deref()
            .unwrap_or("")
            .trim();
        text.push_str(&format!(
            "- Contribute to the knowledgebase: write or update a markdown note in \
             knowledgebase/notes/. What to contribute: {contribution}\n"
        ));
    }
    text.push_str("Write nowhere else, then reply briefly with what you recorded.");
    text
}

fn parse_arguments(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_str(text).map_err(|e| format!("the arguments are not JSON: {e}"))
}

/// The system prompt of a step: its description, the grant and the tool policy note.
pub fn system_prompt(step: &Step, grant: &TurnGrant) -> String {
    let mut text = String::new();
    if let Some(d) = step.description.as_deref().filter(|d| !d.trim().is_empty()) {
        text.push_str(d.trim());
        text.push_str("\n\n");
    }
    text.push_str(&grant.describe());
    text.push('\n');
    text.push_str(TOOL_POLICY_NOTE);
    let note = delegation_note(step);
    if !note.is_empty() {
        text.push_str("\n\n");
        text.push_str(note.trim_end());
    }
    text
}

/// The system prompt `run_step` will use for step `step_id` of `ws` (for tests and cassettes).
pub fn step_system_prompt(ws: &Workspace, step_id: &str) -> Result<String> {
    let step = ws
        .plan
        .step(step_id)
        .ok_or_else(|| anyhow!("no step {step_id:?} in the plan"))?;
    let configs = ws.agent_configs(step_id);
    let run_folder = ws.run_folder.as_deref().unwrap_or("iteration-0");
    let ctx = TurnContext {
        root: &ws.root,
        run_folder,
        step,
        configs: &configs,
    };
    let folders = AgentFolders::for_step(run_folder, step);
    let grant = grant_for_access_in(&ctx, TurnAccess::for_step(&configs), &folders)?;
    Ok(system_prompt(step, &grant))
}

/// The system prompt of call `call_id` of the sub-agent reached from step `step_id` through
/// the routes `route_path` (one route id per level), for tests and cassettes. The folders
/// its grant would create are created, except the call folder itself, which is left to the
/// run (so the run's call numbering is unchanged).
pub fn sub_agent_system_prompt(
    ws: &Workspace,
    step_id: &str,
    route_path: &[&str],
    call_id: &str,
) -> Result<String> {
    let mut step = ws
        .plan
        .step(step_id)
        .ok_or_else(|| anyhow!("no step {step_id:?} in the plan"))?;
    let run_folder = ws.run_folder.as_deref().unwrap_or("iteration-0");
    let top = AgentFolders::for_step(run_folder, step);
    let shared = Some(format!(
        "{}/{}",
        top.output,
        crate::sequence::routes::SHARED_DIR
    ));
    let mut owner = top.output;
    for route_id in route_path {
        let route = step
            .predefined_routes()
            .iter()
            .find(|r| r.route_id == *route_id)
            .ok_or_else(|| anyhow!("step {:?} has no route {route_id:?}", step.id))?;
        step = &route.sub_agent_step;
        owner = AgentHome::new(&ws.root, &owner, route_id)?.rel;
    }
    let route_id = route_path.last().context("no route given")?;
    let configs = ws.agent_configs(route_id);
    let ctx = TurnContext {
        root: &ws.root,
        run_folder,
        step,
        configs: &configs,
    };
    let output = format!("{owner}/{}/{call_id}", crate::sequence::routes::CALLS_DIR);
    let existed = ws.fs.exists(&output);
    let folders = AgentFolders {
        output: output.clone(),
        shared,
        sub_agent: true,
    };
    let grant = grant_for_access_in(&ctx, TurnAccess::for_step(&configs), &folders);
    if !existed {
        let _ = ws.fs.remove_dir(&output);
    }
    Ok(system_prompt(step, &grant?))
}

/// The message of a repair turn: every failing check with file, path, expected and actual.
pub fn repair_message(item_id: &str, report: &Report) -> String {
    format!(
        "The validation gate {item_id} failed. Failing checks:\n{}\nRe-read the files named \
         above, fix them with your tools, then reply briefly.",
        failing_checks(report)
    )
}

fn failing_checks(report: &Report) -> String {
    let mut text = String::new();
    for c in report.failures() {
        let path = if c.path.is_empty() {
            "(whole file)"
        } else {
            &c.path
        };
        text.push_str(&format!(
            "- file {}, path {path}, check {}: expected {}, actual {}. {}\n",
            c.file, c.kind, c.expected, c.actual, c.message
        ));
    }
    text
}

/// The `STATUS: FAILED` reason and the `CONCERNS:` lines of a reply.
pub fn scan_reply(text: &str) -> (Option<String>, Vec<String>) {
    let mut failed = None;
    let mut concerns = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("STATUS: FAILED") {
            let reason = rest.trim_start_matches([':', ' ', '-']).trim();
            failed.get_or_insert_with(|| {
                if reason.is_empty() {
                    "the agent reported STATUS: FAILED".to_string()
                } else {
                    reason.to_string()
                }
            });
        } else if let Some(rest) = line.strip_prefix("CONCERNS:") {
            let rest = rest.trim();
            if !rest.is_empty() {
                concerns.push(rest.to_string());
            }
        }
    }
    (failed, concerns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_failed_and_concerns_are_scanned() {
        let (failed, concerns) =
            scan_reply("done\nCONCERNS: row 2 odd\nSTATUS: FAILED: no data\nCONCERNS: x");
        assert_eq!(failed.as_deref(), Some("no data"));
        assert_eq!(concerns, vec!["row 2 odd", "x"]);
        assert_eq!(scan_reply("all good"), (None, vec![]));
    }
}
