//! A builder session and its agent loop: one turn is rounds of LLM call and tool calls in the
//! session's mode until the model answers in plain text.
//!
//! The session holds the workspace for its whole life (one builder per workspace; its
//! executions run inside it), re-reads the workspace at every turn, and writes its
//! conversation, the index and the costs after every turn, synthetic ones included.

mod agent_loop;

pub use agent_loop::{all_specs, specs_of};
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
use trellis_sandbox::store::{HostWork, WorkspaceFs, now_rfc3339};
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
    /// Bytes the whole session writes, its turns and the executions it starts together
    /// (`--max-run-write-mib`; default [`trellis_runner::driver::DEFAULT_RUN_WRITE_BYTES`], as
    /// for a run).
    pub max_run_write_bytes: u64,
    /// Bytes the workspace's folder may take on disk: the session and its executions write
    /// no more than what is left of it when the session opens (`--max-workspace-mib`).
    pub max_workspace_bytes: u64,
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
    /// Stops the session's running turn from outside (its side agents' turns too).
    stop: crate::TurnStop,
    /// What queues a firing for `trigger_schedule`, when the front end fires schedules.
    trigger: Option<crate::schedules::TriggerHook>,
}

/// One builder session on one workspace.
#[derive(Debug)]
pub struct BuilderSession {
    agent: Agent,
    fs: WorkspaceFs,
    file: PathBuf,
    conversation: ConversationFile,
    mode: Mode,
    /// The executions and side agents that ended and were announced, for
    /// [`BuilderSession::take_ended`].
    ended: Vec<crate::executions::Finished>,
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
        // What the session writes, its turns and its executions together: made now, with
        // the session's limit, for every one of them to take from. A workspace at its quota
        // opens no session: its conversation file is written as the host's, not charged to
        // any budget.
        let model_calls: Arc<trellis_runner::driver::ModelCalls> = Arc::default();
        if let Err(why) = model_calls.begin_run(
            &trellis_runner::driver::TurnBudgets {
                run_write_bytes: options.max_run_write_bytes,
                workspace_bytes: options.max_workspace_bytes,
                ..Default::default()
            },
            options.limits.fs,
            &root,
        ) {
            anyhow::bail!("{why}");
        }
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
            stop: crate::TurnStop::default(),
            trigger: None,
        };
        Ok(BuilderSession {
            agent,
            fs,
            file,
            conversation,
            mode,
            ended: Vec::new(),
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

    /// Lets `trigger_schedule` queue firings through `hook` (the front end fires them).
    pub fn set_trigger_hook(&mut self, hook: crate::schedules::TriggerHook) {
        self.agent.trigger = Some(hook);
    }

    /// What stops the turn running now, for a front end to hold while the turn runs.
    pub fn turn_stop(&self) -> crate::TurnStop {
        self.agent.stop.clone()
    }

    /// Calls tool `name` in the operator's name (a slash command of the chat), in the
    /// session's mode: the answer, or the failure as JSON.
    pub async fn operator_call(&self, name: &str, args: &Value) -> Value {
        let writes = DbWriteBudget::new(self.agent.limits.fs);
        match self
            .agent
            .dispatch(self.mode, name, args, &writes, &crate::TurnWork::default())
            .await
        {
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
        self.agent.stop.reset();
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
        self.ended.extend(ended.iter().cloned());
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

    /// The executions and side agents that ended and were announced since the last call,
    /// with how each ended.
    pub fn take_ended(&mut self) -> Vec<crate::executions::Finished> {
        std::mem::take(&mut self.ended)
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
        let langchain = self.conversation.langchain_parts;
        persist::fit(&mut self.conversation.conversation_history, langchain);
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
                max_run_write_bytes: trellis_runner::driver::DEFAULT_RUN_WRITE_BYTES,
                max_workspace_bytes: trellis_runner::driver::DEFAULT_WORKSPACE_BYTES,
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
            .tool_call(
                Mode::Builder,
                &call(tool),
                &writes,
                &crate::TurnWork::default(),
            )
            .await;
        PANIC_IN.with(|t| t.set(None));
        let answer: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(
            answer,
            ToolFailure::new("the tool panicked: broken on purpose").to_json()
        );
        let next = session
            .agent
            .tool_call(
                Mode::Builder,
                &call(tool),
                &writes,
                &crate::TurnWork::default(),
            )
            .await;
        let next: Value = serde_json::from_str(&next).unwrap();
        assert!(next.get("error").is_none(), "{next}");
    }
}
