//! A builder session and its agent loop: one turn is rounds of LLM call and tool calls in the
//! session's mode until the model answers in plain text.
//!
//! The session holds the workspace for its whole life (one builder per workspace; its
//! executions run inside it), re-reads the workspace at every turn, and writes its
//! conversation, the index and the costs after every turn, synthetic ones included.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::costs::{self, Tally};
use super::executions::Executions;
use super::modes::{
    self, CONFIG_TOOLS, DB_READ_TOOLS, DB_WRITE_TOOLS, FILE_TOOLS, INSPECT_TOOLS, Mode, PLAN_TOOLS,
    READ_TOOLS,
};
use super::persist::{self, ConversationFile};
use super::prompt::system_prompt;
use super::side_agents::{RUN_IN_BACKGROUND, SideAgents, run_in_background_spec};
use super::{
    BuilderEvent, BuilderObserver, PHASE_ID, ToolContext, ToolFailure, ToolSpec, edits, files,
    reads,
};
use trellis_runner::driver::{DEFAULT_CALLS_PER_ANSWER, not_run};
pub use trellis_runner::driver::{DEFAULT_TURN_RESULT_BYTES, DEFAULT_TURN_WRITE_BYTES};
use trellis_runner::llm_choice::{LlmSetup, StepLlm};
use trellis_runner::runtime::{Runtime, WorkspaceHold, panic_message};
use trellis_sandbox::Limits;
use trellis_sandbox::capabilities::DbWriteBudget;
use trellis_sandbox::llm::{Message, Request, RetryPolicy, ToolCall, Usage};
use trellis_sandbox::plugins::PluginRegistry;
use trellis_sandbox::store::{WorkspaceFs, now_rfc3339};
use trellis_workflow::manifest::parse_manifest;
use trellis_workflow::{
    StepConfigFile, WORKFLOW_FILE, WorkflowManifest, Workspace, step_config_location,
};

/// Tool rounds a builder turn may take before it must answer.
pub const DEFAULT_MAX_ROUNDS: usize = 40;

/// The file naming the session that holds the workspace, relative to it.
pub const ACTIVE_SESSION_FILE: &str = "builder/active-session.json";

/// How to open a session.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// The workspace folder.
    pub root: PathBuf,
    /// Resume this session; a new one when `None`.
    pub session_id: Option<String>,
    /// The mode; a resumed session keeps its own when `None`, a new one starts in builder.
    pub mode: Option<Mode>,
    /// How the builder's own model is reached (`--llm`, `--record`, key approvals).
    pub llm: LlmSetup,
    /// Bounds of every plugin call.
    pub limits: Limits,
    /// Retries of the builder's LLM calls.
    pub retry: RetryPolicy,
    /// Tool rounds per turn.
    pub max_rounds: usize,
    /// Bytes of tool results one turn keeps in the conversation, as for a step's agent
    /// (`--max-turn-result-mib`; default [`DEFAULT_TURN_RESULT_BYTES`]).
    pub max_turn_result_bytes: u64,
    /// Bytes the tool calls of one turn write together, to the workspace's folders and its
    /// database (`--max-turn-write-mib`; default [`DEFAULT_TURN_WRITE_BYTES`], as for a run),
    /// each call also within its own limits.
    pub max_turn_write_bytes: u64,
    /// Model calls of the whole session, every turn, side agent and execution it started
    /// together (`--max-model-calls`; default [`trellis_runner::driver::DEFAULT_RUN_MODEL_CALLS`], as for a run).
    pub max_model_calls: u64,
    /// Where the turn's events go.
    pub observer: BuilderObserver,
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnReport {
    /// The agent's final text.
    pub text: String,
    /// Whether the model answered in plain text (not cut off by an error or the round cap).
    pub ended_normally: bool,
    /// Why not, when it did not.
    pub error: Option<String>,
    /// Tool calls made.
    pub tool_calls: usize,
    /// Tokens of the turn's LLM calls.
    pub usage: Usage,
}

/// What the agent loop needs, shareable with side agents on other threads.
#[derive(Debug, Clone)]
struct Agent {
    root: PathBuf,
    registry: Arc<PluginRegistry>,
    executions: Arc<Executions>,
    llm: LlmSetup,
    limits: Limits,
    retry: RetryPolicy,
    max_rounds: usize,
    max_turn_result_bytes: u64,
    max_turn_write_bytes: u64,
    /// The model calls the session made, shared with its side agents.
    model_calls: Arc<trellis_runner::driver::ModelCalls>,
    max_model_calls: u64,
    observer: BuilderObserver,
    session_id: String,
    side: Arc<SideAgents>,
    /// This agent is a side agent: it cannot start side agents of its own.
    is_side: bool,
}

/// One builder session on one workspace.
#[derive(Debug)]
pub struct BuilderSession {
    agent: Agent,
    fs: WorkspaceFs,
    file: PathBuf,
    conversation: ConversationFile,
    mode: Mode,
    _hold: Hold,
}

/// The workspace held by a session: the OS lock, and the file naming the session for a
/// second builder's busy error (removed when the session ends).
#[derive(Debug)]
struct Hold {
    _hold: WorkspaceHold,
    fs: WorkspaceFs,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let _ = self.fs.remove_file(ACTIVE_SESSION_FILE);
    }
}

impl BuilderSession {
    /// Opens a session on `options.root`: takes the workspace (a second builder gets an
    /// error naming the session that has it), resumes `session_id` exactly where it was
    /// (history and mode) or starts a new one.
    pub fn open(
        runtime: &Runtime,
        executions: Executions,
        options: SessionOptions,
    ) -> Result<Self> {
        let root = options.root.clone();
        let fs = WorkspaceFs::open(&root)
            .with_context(|| format!("opening workspace {}", root.display()))?;
        let hold = hold(runtime, &root, &fs)?;
        let (conversation, file) = match &options.session_id {
            // A resumed conversation is written back where it was found. One whose file
            // keeps no usage (the original's) goes on from the figure its costs recorded,
            // so its next delta is this session's tokens, not zero.
            Some(id) => {
                let (mut conversation, path) = persist::load(&fs, id)?;
                if conversation.cumulative_usage == Usage::default()
                    && let Ok(usage) = costs::read(&fs)
                    && let Some(recorded) = usage.session_cumulative.get(id)
                {
                    let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
                    conversation.cumulative_usage = Usage {
                        prompt_tokens: clamp(recorded.tally.prompt_tokens),
                        completion_tokens: clamp(recorded.tally.completion_tokens),
                        total_tokens: clamp(recorded.tally.total_tokens),
                    };
                }
                (conversation, path)
            }
            None => {
                let id = new_session_id();
                let created_at = now_rfc3339();
                let date = date_of(&created_at);
                // A new session opens in the mode workflow.json's
                // `execution_defaults.workshop_mode` names (the original's), else builder.
                let mode = match read_manifest(&fs).and_then(|m| m.original.workshop_mode) {
                    Some(name) => name.parse::<Mode>().map_err(|e| {
                        anyhow::anyhow!("{WORKFLOW_FILE}: execution_defaults.workshop_mode: {e}")
                    })?,
                    None => Mode::Builder,
                };
                let path = persist::conversation_path(&date, &id);
                let conversation = ConversationFile::new(id, mode.as_str(), created_at);
                (conversation, path)
            }
        };
        let mode = match options.mode {
            Some(mode) => mode,
            None => conversation
                .workshop_mode
                .parse()
                .map_err(|e: String| anyhow::anyhow!("{}: workshop_mode: {e}", file.display()))?,
        };
        fs.write_json_atomic(
            ACTIVE_SESSION_FILE,
            &json!({
                "session_id": conversation.session_id,
                "pid": std::process::id(),
                "started_at": now_rfc3339(),
            }),
        )
        .with_context(|| format!("writing {ACTIVE_SESSION_FILE}"))?;
        // The session's model calls: its own turns', its side agents' and its executions'.
        let model_calls: Arc<trellis_runner::driver::ModelCalls> = Arc::default();
        let mut executions = executions;
        executions.share_model_calls(model_calls.clone(), options.max_model_calls);
        let agent = Agent {
            root,
            registry: runtime.shared_registry(),
            executions: Arc::new(executions),
            llm: options.llm,
            limits: options.limits,
            retry: options.retry,
            max_rounds: options.max_rounds,
            max_turn_result_bytes: options.max_turn_result_bytes,
            max_turn_write_bytes: options.max_turn_write_bytes,
            model_calls,
            max_model_calls: options.max_model_calls,
            observer: options.observer,
            session_id: conversation.session_id.clone(),
            side: Arc::default(),
            is_side: false,
        };
        Ok(BuilderSession {
            agent,
            fs,
            file,
            conversation,
            mode,
            _hold: hold,
        })
    }

    /// The session's id.
    pub fn id(&self) -> &str {
        &self.conversation.session_id
    }

    /// The session's mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The conversation file, relative to the workspace.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The conversation so far (no system prompt).
    pub fn history(&self) -> &[Message] {
        &self.conversation.conversation_history
    }

    /// The session's token usage so far.
    pub fn usage(&self) -> Usage {
        self.conversation.cumulative_usage
    }

    /// The executions of the session.
    pub fn executions(&self) -> &Executions {
        &self.agent.executions
    }

    /// The side agents still running.
    pub fn side_agents_running(&self) -> Vec<String> {
        self.agent.side.running_ids()
    }

    /// Calls tool `name` in the operator's name (a slash command of the chat), in the
    /// session's mode: the answer, or the failure as JSON.
    pub async fn operator_call(&self, name: &str, args: &Value) -> Value {
        let writes = DbWriteBudget::new(self.agent.limits.fs);
        match self.agent.dispatch(self.mode, name, args, &writes).await {
            Ok(value) => value,
            Err(failure) => failure.to_json(),
        }
    }

    /// Changes the mode from the next turn on, and records it at once.
    pub fn set_mode(&mut self, mode: Mode) -> Result<()> {
        self.mode = mode;
        self.conversation.workshop_mode = mode.as_str().to_string();
        if !self.conversation.conversation_history.is_empty() {
            self.save()?;
        }
        Ok(())
    }

    /// One turn: `text` as the operator's message, then the agent loop until a plain reply.
    /// The conversation and the costs are written at its end, whatever happened.
    pub async fn turn(&mut self, text: &str) -> Result<TurnReport> {
        self.agent.observer.report(&BuilderEvent::TurnStarted {
            message: text.to_string(),
        });
        let mut history = std::mem::take(&mut self.conversation.conversation_history);
        history.push(Message::user(text));
        let outcome = self.agent.run_turn(self.mode, &mut history).await;
        self.conversation.conversation_history = history;
        let report = match outcome {
            Ok((report, model)) => {
                self.conversation.model = model;
                report
            }
            Err(e) => TurnReport {
                text: String::new(),
                ended_normally: false,
                error: Some(format!("{e:#}")),
                tool_calls: 0,
                usage: Usage::default(),
            },
        };
        self.conversation.cumulative_usage += report.usage;
        let saved = self.save();
        self.agent.observer.report(&BuilderEvent::TurnEnded {
            report: report.clone(),
        });
        saved?;
        Ok(report)
    }

    /// Announces each execution and side agent that ended since the last call in a
    /// synthetic turn of its own. Returns the reports of those turns.
    pub async fn completion_turns(&mut self) -> Result<Vec<TurnReport>> {
        let mut ended = self.agent.executions.take_finished();
        ended.extend(self.agent.side.take_finished());
        let mut reports = Vec::new();
        for finished in ended {
            let text = format!(
                "[execution {} finished: {}] {}\nTell the operator what it came to; do not \
                 start new work unless they asked for it.",
                finished.id, finished.status, finished.summary
            );
            reports.push(self.turn(&text).await?);
        }
        Ok(reports)
    }

    /// Waits for every execution and side agent the session started, running the completion
    /// turn of each as it ends, until nothing runs and nothing is left to announce. Returns
    /// the reports of the completion turns.
    pub async fn settle(&mut self) -> Result<Vec<TurnReport>> {
        let mut reports = Vec::new();
        loop {
            self.agent.executions.wait_all().await;
            self.agent.side.wait_all().await;
            let batch = self.completion_turns().await?;
            if batch.is_empty() {
                return Ok(reports);
            }
            reports.extend(batch);
        }
    }

    fn save(&mut self) -> Result<()> {
        self.conversation.workshop_mode = self.mode.as_str().to_string();
        self.conversation.updated_at = now_rfc3339();
        persist::save(&self.fs, &self.file, &self.conversation)?;
        if !self.conversation.model.is_empty() {
            let pricing = read_manifest(&self.fs).and_then(|m| {
                let model = &self.conversation.model;
                let bare = model.split_once(':').map(|(_, m)| m).unwrap_or(model);
                m.pricing
                    .get(model.as_str())
                    .or_else(|| m.pricing.get(bare))
                    .copied()
            });
            // Costs are bookkeeping: a totals file that cannot be read (another tool's,
            // damaged) is left as it is and never fails the turn.
            if let Err(e) = costs::record(
                &self.fs,
                PHASE_ID,
                &self.conversation.session_id,
                &self.conversation.model,
                self.conversation.cumulative_usage,
                pricing.as_ref(),
                &date_of(&now_rfc3339()),
            ) {
                tracing::warn!("the turn's token usage is not recorded: {e:#}");
            }
        }
        Ok(())
    }

    /// The session's cost as recorded.
    pub fn cost(&self) -> Result<Tally> {
        let usage = costs::read(&self.fs)?;
        Ok(usage
            .session_cumulative
            .get(self.id())
            .map(|s| s.tally.clone())
            .unwrap_or_default())
    }
}

impl Agent {
    /// Runs one turn on `history` (whose last message is the user's) in `mode`. Returns the
    /// report and the model, `provider:model`.
    async fn run_turn(
        &self,
        mode: Mode,
        history: &mut Vec<Message>,
    ) -> Result<(TurnReport, String)> {
        let ws = workspace_for_model(&self.root)?;
        let llm: StepLlm = self.llm.builder_llm(&ws)?;
        let primary = llm
            .targets
            .first()
            .context("the builder's model has no target")?;
        let model = format!("{}:{}", primary.provider, primary.model);
        let mut specs = specs_of(mode);
        if self.is_side {
            specs.retain(|s| s.name != RUN_IN_BACKGROUND);
        }
        let tools: Vec<_> = specs.iter().map(ToolSpec::definition).collect();
        let mut usage = Usage::default();
        let mut tool_calls = 0;
        // Made once per turn, from the workspace as the turn finds it: what executions
        // started in this turn do meanwhile is not the state the turn began in.
        let system = system_prompt(&self.root, mode);
        // What the turn's tool results may add to the conversation, and what its calls may
        // write, all rounds together.
        let mut result_bytes_left = self.max_turn_result_bytes;
        let writes = DbWriteBudget::new(trellis_sandbox::capabilities::FsLimits {
            write_bytes: self.max_turn_write_bytes,
            ..self.limits.fs
        });
        for _ in 0..self.max_rounds {
            let mut messages = vec![Message::system(system.clone())];
            messages.extend(history.iter().cloned());
            let request = Request {
                model: primary.model.clone(),
                messages,
                tools: tools.clone(),
                options: llm.options.first().cloned().flatten().unwrap_or_default(),
            };
            let response = match self.call_llm(&llm, &request).await {
                Ok(response) => response,
                Err(e) => {
                    let report = TurnReport {
                        text: String::new(),
                        ended_normally: false,
                        error: Some(format!("{model}: {e}")),
                        tool_calls,
                        usage,
                    };
                    return Ok((report, model));
                }
            };
            usage += response.usage;
            history.push(Message::assistant(&response));
            if !response.text.is_empty() {
                self.observer
                    .report(&BuilderEvent::AgentText(response.text.clone()));
            }
            if response.tool_calls.is_empty() {
                let report = TurnReport {
                    text: response.text,
                    ended_normally: true,
                    error: None,
                    tool_calls,
                    usage,
                };
                return Ok((report, model));
            }
            // One answer runs at most the per-answer budget of calls, as a step's agent does.
            let asked = response.tool_calls.len();
            for (i, call) in response.tool_calls.iter().enumerate() {
                let content = if i < DEFAULT_CALLS_PER_ANSWER {
                    tool_calls += 1;
                    let content = self.tool_call(mode, call, &writes).await;
                    let len = u64::try_from(content.len()).unwrap_or(u64::MAX);
                    match result_bytes_left.checked_sub(len) {
                        Some(left) => {
                            result_bytes_left = left;
                            content
                        }
                        None => format!(
                            "error: result not kept: it is {len} bytes and this turn's tool \
                             results already reached their budget of {} MiB \
                             (--max-turn-result-mib); end this turn with what you have, or \
                             ask for smaller results (a line range, a narrower query)",
                            self.max_turn_result_bytes >> 20
                        ),
                    }
                } else {
                    format!("error: {}", not_run(asked, DEFAULT_CALLS_PER_ANSWER))
                };
                history.push(Message::tool_result(call.id.clone(), content));
            }
        }
        let report = TurnReport {
            text: String::new(),
            ended_normally: false,
            error: Some(format!(
                "the turn took {} tool rounds without answering",
                self.max_rounds
            )),
            tool_calls,
            usage,
        };
        Ok((report, model))
    }

    async fn call_llm(
        &self,
        llm: &StepLlm,
        request: &Request,
    ) -> Result<trellis_sandbox::llm::Response, String> {
        if !self.model_calls.take(self.max_model_calls) {
            return Err(format!(
                "the builder session made its {} model calls, the limit of one session \
                 (`trellis builder --max-model-calls N` sets it); no more are made",
                self.max_model_calls
            ));
        }
        trellis_runner::llm_choice::complete(
            &self.registry,
            &llm.targets,
            &llm.options,
            llm.replay.as_ref(),
            self.llm.recorder().map(|r| r.as_ref()),
            request,
            &self.retry,
            &self.limits,
        )
        .await
        .result
        .map_err(|e| e.to_string())
    }

    /// One tool call, never failing: what the model reads back.
    async fn tool_call(&self, mode: Mode, call: &ToolCall, writes: &DbWriteBudget) -> String {
        let arguments: Result<Value, String> = if call.arguments.trim().is_empty() {
            Ok(json!({}))
        } else {
            serde_json::from_str(&call.arguments)
                .map_err(|e| format!("the arguments are not JSON: {e}"))
        };
        self.observer.report(&BuilderEvent::ToolStarted {
            id: call.id.clone(),
            name: call.name.clone(),
            arguments: arguments.clone().unwrap_or(Value::Null),
        });
        let outcome = match arguments {
            Err(e) => Err(ToolFailure::new(e)),
            Ok(_) if !mode.allows(&call.name) => {
                Err(ToolFailure::new(modes::refusal(mode, &call.name)))
            }
            Ok(args) => self.dispatch(mode, &call.name, &args, writes).await,
        };
        let (ok, summary, content) = match outcome {
            Ok(value) => (true, summarize(&value), value),
            Err(failure) => (false, failure.message.clone(), failure.to_json()),
        };
        self.observer.report(&BuilderEvent::ToolEnded {
            id: call.id.clone(),
            name: call.name.clone(),
            ok,
            summary,
        });
        content.to_string()
    }

    /// Calls tool `name`. A tool that panics answers a failure the model reads (`the tool
    /// panicked: ...`); the session goes on.
    async fn dispatch(
        &self,
        mode: Mode,
        name: &str,
        args: &Value,
        writes: &DbWriteBudget,
    ) -> super::ToolResult {
        use futures::FutureExt;
        std::panic::AssertUnwindSafe(self.dispatch_unguarded(mode, name, args, writes))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| {
                Err(ToolFailure::new(format!(
                    "the tool panicked: {}",
                    panic_message(&*panic)
                )))
            })
    }

    async fn dispatch_unguarded(
        &self,
        mode: Mode,
        name: &str,
        args: &Value,
        writes: &DbWriteBudget,
    ) -> super::ToolResult {
        #[cfg(test)]
        if tests::PANIC_IN.with(|tool| tool.get()) == Some(name) {
            panic!("broken on purpose");
        }
        let work = super::call_work();
        let ctx = ToolContext {
            root: &self.root,
            mode,
            registry: &self.registry,
            limits: &self.limits,
            turn_writes: writes,
            session_id: &self.session_id,
            observer: &self.observer,
            work: &work,
        };
        if READ_TOOLS.contains(&name) {
            reads::call(&ctx, name, args).await
        } else if INSPECT_TOOLS.contains(&name) {
            super::inspect::call(&ctx, name, args).await
        } else if DB_READ_TOOLS.contains(&name) || DB_WRITE_TOOLS.contains(&name) {
            super::db::call(&ctx, name, args).await
        } else if PLAN_TOOLS.contains(&name) || CONFIG_TOOLS.contains(&name) {
            edits::call(&ctx, name, args)
        } else if FILE_TOOLS.contains(&name) {
            files::call(&ctx, name, args).await
        } else if name == RUN_IN_BACKGROUND && self.is_side {
            Err(super::ToolFailure::new(
                "a side agent cannot start side agents; do the work yourself",
            ))
        } else if name == RUN_IN_BACKGROUND {
            self.start_side_agent(mode, args)
        } else {
            self.executions.call(&ctx, name, args).await
        }
    }

    /// `run_in_background(name, instruction)`: a side agent with the mode's tools, on a
    /// thread of its own; its end is announced like an execution's.
    fn start_side_agent(&self, mode: Mode, args: &Value) -> super::ToolResult {
        super::reads::check_args(&run_in_background_spec(), args)?;
        let name = super::tool::str_arg(args, "name")?;
        let instruction = super::tool::str_arg(args, "instruction")?.to_string();
        let agent = Agent {
            is_side: true,
            ..self.clone()
        };
        self.side.start(name, move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let mut history = vec![Message::user(instruction)];
                agent
                    .run_turn(mode, &mut history)
                    .await
                    .map(|(report, _)| report)
            })
        })
    }
}

/// Every builder tool's spec.
pub fn all_specs() -> Vec<ToolSpec> {
    let mut specs = reads::specs();
    specs.extend(super::inspect::specs());
    specs.extend(super::db::specs());
    specs.extend(edits::specs());
    specs.extend(files::specs());
    specs.extend(Executions::specs());
    specs.push(run_in_background_spec());
    specs
}

/// The specs of the tools of `mode`, in the table's order.
pub fn specs_of(mode: Mode) -> Vec<ToolSpec> {
    let all = all_specs();
    mode.tools()
        .into_iter()
        .filter_map(|name| all.iter().find(|s| s.name == name).cloned())
        .collect()
}

/// The workspace for choosing the builder's model: the loaded workspace, or (while the plan
/// does not load yet) one with an empty plan and what `workflow.json` says.
fn workspace_for_model(root: &Path) -> Result<Workspace> {
    if let Ok(ws) = Workspace::open(root) {
        return Ok(ws);
    }
    let fs = WorkspaceFs::open(root).with_context(|| format!("opening {}", root.display()))?;
    let manifest = match fs.read_json_optional(WORKFLOW_FILE)? {
        None => WorkflowManifest::default(),
        Some(text) => parse_manifest(&text, WORKFLOW_FILE)
            .map(|(m, _)| m)
            .map_err(|diags| {
                anyhow::anyhow!(
                    "{WORKFLOW_FILE} does not load: {}",
                    diags
                        .iter()
                        .next()
                        .map(|d| d.to_string())
                        .unwrap_or_default()
                )
            })?,
    };
    let step_config_file = step_config_location(&fs, None);
    Ok(Workspace {
        root: root.to_path_buf(),
        fs,
        run_folder: None,
        plan: Default::default(),
        step_configs: StepConfigFile::default(),
        step_config_file,
        manifest,
        warnings: Default::default(),
    })
}

fn read_manifest(fs: &WorkspaceFs) -> Option<WorkflowManifest> {
    let text = fs.read_json_optional(WORKFLOW_FILE).ok()??;
    parse_manifest(&text, WORKFLOW_FILE).ok().map(|(m, _)| m)
}

/// Takes the workspace for a session, or fails naming who has it.
fn hold(runtime: &Runtime, root: &Path, fs: &WorkspaceFs) -> Result<Hold> {
    match runtime.hold_workspace(root) {
        Ok(hold) => Ok(Hold {
            _hold: hold,
            fs: fs.clone(),
        }),
        Err(e) => {
            let holder = trellis_runner::workspace_lock::holder_of(root);
            let session = fs
                .read_json_optional(ACTIVE_SESSION_FILE)
                .ok()
                .flatten()
                .and_then(|text| serde_json::from_str::<Value>(&text).ok())
                .filter(|v| holder.as_ref().and_then(|h| h.pid).map(u64::from) == v["pid"].as_u64())
                .and_then(|v| v["session_id"].as_str().map(str::to_string));
            match session {
                Some(id) => bail!(
                    "workspace {} is busy: builder session {id} has it ({}); one builder per \
                     workspace at a time",
                    root.display(),
                    holder.map(|h| h.to_string()).unwrap_or_default()
                ),
                None => Err(e.context("the builder needs the workspace to itself")),
            }
        }
    }
}

/// A new session id: the UTC time and a counter-backed suffix (`20261130-190512-3f2a`).
fn new_session_id() -> String {
    let now = now_rfc3339();
    let stamp: String = now
        .chars()
        .filter(|c| c.is_ascii_digit())
        .take(14)
        .collect();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let salt = (nanos ^ std::process::id().rotate_left(16)) & 0xffff;
    format!(
        "{}-{}-{salt:04x}",
        &stamp[..8.min(stamp.len())],
        &stamp[8.min(stamp.len())..]
    )
}

/// `YYYY-MM-DD` of an RFC 3339 time.
/// The `YYYY-MM-DD` of a timestamp; today's when it has none (a planted `created_at` must not
/// become a folder name).
fn date_of(rfc3339: &str) -> String {
    let date: String = rfc3339.chars().take(10).collect();
    if persist::is_date(&date) {
        date
    } else {
        now_rfc3339().chars().take(10).collect()
    }
}

/// A line saying what a tool answered.
fn summarize(value: &Value) -> String {
    let text = match value {
        Value::Object(map) => {
            let keys: Vec<String> = map
                .iter()
                .take(4)
                .map(|(k, v)| match v {
                    Value::String(s) => format!(
                        "{k}: {}",
                        s.lines()
                            .next()
                            .unwrap_or_default()
                            .chars()
                            .take(60)
                            .collect::<String>()
                    ),
                    Value::Bool(_) | Value::Number(_) => format!("{k}: {v}"),
                    Value::Array(a) => format!("{k}: [{} items]", a.len()),
                    _ => k.clone(),
                })
                .collect();
            keys.join(", ")
        }
        other => other.to_string(),
    };
    text.chars().take(160).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        /// The builder tool that panics when called on this thread (the seam of these tests).
        pub(super) static PANIC_IN: Cell<Option<&'static str>> = const { Cell::new(None) };
    }

    fn call(name: &str) -> ToolCall {
        ToolCall {
            id: "call-0".to_string(),
            name: name.to_string(),
            arguments: "{}".to_string(),
        }
    }

    #[tokio::test]
    async fn a_tool_that_panics_answers_a_failure_and_the_next_call_works() {
        let ws = tempfile::tempdir().unwrap();
        let engine = trellis_sandbox::Engine::new(trellis_sandbox::CacheSetting::Disabled).unwrap();
        let registry = PluginRegistry::empty(&engine).unwrap();
        let runtime = Runtime::new(Arc::new(registry));
        let executions = Executions::new(
            runtime.clone(),
            trellis_runner::runtime::StartOptions::new(Default::default(), LlmSetup::new(None)),
        );
        let session = BuilderSession::open(
            &runtime,
            executions,
            SessionOptions {
                root: ws.path().to_path_buf(),
                session_id: None,
                mode: Some(Mode::Builder),
                llm: LlmSetup::new(None),
                limits: Default::default(),
                retry: Default::default(),
                max_rounds: 5,
                max_turn_result_bytes: DEFAULT_TURN_RESULT_BYTES,
                max_turn_write_bytes: DEFAULT_TURN_WRITE_BYTES,
                max_model_calls: trellis_runner::driver::DEFAULT_RUN_MODEL_CALLS,
                observer: BuilderObserver::none(),
            },
        )
        .unwrap();
        let tool = "list_workspace_files";
        let writes = DbWriteBudget::new(Limits::default().fs);
        PANIC_IN.with(|t| t.set(Some(tool)));
        let answer = session
            .agent
            .tool_call(Mode::Builder, &call(tool), &writes)
            .await;
        PANIC_IN.with(|t| t.set(None));
        let answer: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(
            answer,
            ToolFailure::new("the tool panicked: broken on purpose").to_json()
        );
        let next = session
            .agent
            .tool_call(Mode::Builder, &call(tool), &writes)
            .await;
        let next: Value = serde_json::from_str(&next).unwrap();
        assert!(next.get("error").is_none(), "{next}");
    }
}
