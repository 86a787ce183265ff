//! The state of one agent's run ([`Run`]): a step's own agent or one call of a route's
//! sub-agent. Here: its one constructor (`new_run`), the set-up of a step's own agent
//! (`start_step`: its folders, its session and its system prompt), its grants, its entries in
//! `session.json`, and how a turn ends ([`TurnEnd`], `entry_outcome`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde_json::Value;

use super::prompts::{inlined_dependencies, system_prompt, unsandboxed_note};
use super::{AgentModels, StepRunner};
use crate::filters::ToolPolicy;
use crate::grants::{
    AgentFolders, TurnAccess, TurnContext, TurnGrant, TurnPurpose, grant_for_access_in,
    turn_grant_in,
};
use crate::session::{Session, Status, logs_dir};
use trellis_sandbox::llm::{Message, ToolDefinition};
use trellis_workflow::plan::{Step, StepKind};
use trellis_workflow::{AgentConfigs, Workspace};

/// Why a turn ended without a final reply.
pub(super) enum TurnEnd {
    Stopped,
    Failed(String),
}

impl TurnEnd {
    /// Why the turn ended, as a call's error says it.
    pub(super) fn reason(self) -> String {
        match self {
            TurnEnd::Failed(r) => r,
            TurnEnd::Stopped => "stop requested".to_string(),
        }
    }
}

pub(super) struct TurnOk {
    pub(super) text: String,
}

/// State of one agent's run: a step's own agent, or one call of a route's sub-agent.
pub(super) struct Run<'w> {
    pub(super) ws: &'w Workspace,
    pub(super) step: &'w Step,
    pub(super) configs: AgentConfigs,
    pub(super) run_folder: String,
    /// The output folder (and shared folder) the agent's turns write to.
    pub(super) folders: AgentFolders,
    /// `folders.output` on the host.
    pub(super) output_dir: PathBuf,
    /// Where `session.json` goes: the output folder of a step, the home of a route.
    pub(super) session_dir: PathBuf,
    /// Workspace-relative folder under which this agent's own routes have their homes.
    pub(super) owner_rel: String,
    /// The models this agent talks to.
    pub(super) models: AgentModels,
    pub(super) logs: PathBuf,
    /// The name in events and messages: the step id, `<step>/<route>` for a sub-agent.
    pub(super) label: String,
    /// 0 for a step's agent, one more per level of sub-agents.
    pub(super) depth: usize,
    /// Prefix of session entry ids (`call-0001/` in a sub-agent's session).
    pub(super) entry_prefix: String,
    /// Text put before the next user message (a caller's instructions).
    pub(super) preamble: Option<String>,
    pub(super) session: Session,
    pub(super) history: Vec<Message>,
    pub(super) tools: Vec<ToolDefinition>,
    pub(super) policy: ToolPolicy,
    pub(super) concerns: Vec<String>,
    pub(super) final_text: Option<String>,
    pub(super) turns: u64,
    /// Whether a `STATUS: FAILED` line in the next reply ends the step (not in a foreach
    /// row or a gate's repair turn).
    pub(super) status_marker_ends: bool,
    /// What the writer thread had queued before this agent's first sandboxed call is on disk
    /// ([`Run::settle_earlier_writes`]).
    pub(super) earlier_writes_on_disk: bool,
    /// The file names under `tool-results/` this agent has offloaded to: a model chooses
    /// call ids, and two calls with one id must not share a file.
    pub(super) offloaded: std::sync::Mutex<std::collections::HashSet<String>>,
    /// How much of the conversation `session.json` holds ([`Run::checkpoint_session`]).
    pub(super) session_size: SessionSize,
    /// The budgets of the calling turn, for a sub-agent: its turns share them.
    pub(super) caller_shares: Option<std::sync::Arc<super::budget::TurnShares>>,
}

/// Bytes of the conversation counted so far, and at the last write of `session.json`.
#[derive(Debug, Default, Clone)]
pub(super) struct SessionSize {
    /// Messages of the history counted.
    counted: usize,
    /// Entries of the session counted (a scripted route's calls add entries, no messages).
    entries: usize,
    /// Their bytes, serialized.
    bytes: u64,
    /// `bytes` when `session.json` was last written.
    written: u64,
}

/// A session whose conversation is at most this many bytes is written at every checkpoint.
const SMALL_SESSION_BYTES: u64 = 16 << 10;

/// What differs between a step's own agent and one call of a route's sub-agent; everything
/// else of a [`Run`] starts the same way ([`StepRunner::new_run`]).
pub(super) struct AgentSetup {
    pub(super) configs: AgentConfigs,
    pub(super) run_folder: String,
    pub(super) folders: AgentFolders,
    pub(super) output_dir: PathBuf,
    pub(super) session_dir: PathBuf,
    pub(super) owner_rel: String,
    pub(super) models: AgentModels,
    pub(super) logs: PathBuf,
    pub(super) label: String,
    pub(super) depth: usize,
    pub(super) entry_prefix: String,
    pub(super) preamble: Option<String>,
    /// The agent's session and conversation so far (empty for a fresh agent).
    pub(super) session: Session,
    pub(super) history: Vec<Message>,
}

impl StepRunner<'_> {
    /// The one constructor of a [`Run`], for steps and sub-agents alike: the tools its
    /// config offers, no turn yet, nothing concluded.
    pub(super) fn new_run<'w>(
        &self,
        ws: &'w Workspace,
        step: &'w Step,
        setup: AgentSetup,
    ) -> Run<'w> {
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
            earlier_writes_on_disk: false,
            offloaded: Default::default(),
            session_size: SessionSize::default(),
            caller_shares: None,
        }
    }

    /// The [`Run`] of `step`'s own agent: its output and logs folders made afresh (the
    /// routes' conversations and call folders of an earlier run of the step go), a new
    /// session, and the system prompt as the first message, saved in `session.json`. The
    /// second value is `Err` when the system prompt is past what the run keeps: the step
    /// fails without a turn.
    pub(super) fn start_step<'w>(
        &self,
        ws: &'w Workspace,
        step: &'w Step,
    ) -> Result<(Run<'w>, Result<(), TurnEnd>)> {
        let step_id = step.id.as_str();
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
                preamble: self.context.clone(),
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
        let mut system = system_prompt(&ws.plan, step, &step_grant);
        if matches!(step.kind, StepKind::Regular) {
            let missing: Vec<&str> = step_grant.missing.iter().map(|(_, p)| p.as_str()).collect();
            let deps: Vec<&str> = step
                .context_dependencies
                .iter()
                .flatten()
                .map(String::as_str)
                .filter(|d| !missing.contains(d))
                .collect();
            system.push_str(&inlined_dependencies(&ws.fs, &deps));
        }
        let system = unsandboxed_note(system, &run.tools);
        // The system prompt is kept in the step's session, once for each group that runs the
        // step: it counts in what the run keeps, as a turn's message does (a 2 MB description
        // and 100 groups wrote 204 MB of sessions under a 1 MiB budget).
        let kept = self.keep("the step's system prompt", system.len());
        if kept.is_ok() {
            run.history.push(Message::system(system));
        }
        run.save_session()?;
        Ok((run, kept))
    }

    /// Counts `bytes` of `what` the host keeps for the run (an answer, a message, a system
    /// prompt, a gate's report) in its `--max-run-result-mib`; past it the run ends, no later
    /// group starts.
    pub(super) fn keep(&self, what: &str, bytes: usize) -> Result<(), TurnEnd> {
        let max = self.budgets.run_result_bytes;
        if self
            .model_calls
            .keep(u64::try_from(bytes).unwrap_or(u64::MAX), max)
        {
            return Ok(());
        }
        self.model_calls.mark_kept_out();
        Err(TurnEnd::Failed(super::budget::past_kept_bytes(
            what, bytes, max,
        )))
    }
}

impl<'w> Run<'w> {
    /// Before this agent's first sandboxed call (a tool call, its script): the files earlier
    /// steps left queued on the writer thread (sessions, turn logs, final summaries, which a
    /// guest may read under `execution/`) are put on disk, so a guest reads them as if they
    /// had been written at once. Later calls do not wait.
    pub(super) fn settle_earlier_writes(&mut self) -> Result<(), TurnEnd> {
        if !self.earlier_writes_on_disk {
            trellis_sandbox::store::write_behind::flush().map_err(|e| {
                TurnEnd::Failed(format!("writing the run's sessions and logs: {e}"))
            })?;
            self.earlier_writes_on_disk = true;
        }
        Ok(())
    }

    pub(super) fn ctx(&self) -> TurnContext<'_> {
        TurnContext {
            root: &self.ws.root,
            run_folder: &self.run_folder,
            step: self.step,
            configs: &self.configs,
        }
    }

    pub(super) fn grant(&self, purpose: TurnPurpose<'_>) -> Result<TurnGrant, TurnEnd> {
        turn_grant_in(&self.ctx(), purpose, &self.folders).map_err(failed)
    }

    pub(super) fn grant_for(&self, access: TurnAccess) -> Result<TurnGrant, TurnEnd> {
        grant_for_access_in(&self.ctx(), access, &self.folders).map_err(failed)
    }

    pub(super) fn start_entry(&mut self, item_id: &str, item_type: &str) -> usize {
        let entry_id = format!("{}{item_id}", self.entry_prefix);
        self.session.start_entry(&entry_id, item_id, item_type)
    }

    /// Writes `session.json` at a point where nothing depends on it being current (an item
    /// started or ended, a turn ended): only when the conversation has grown by half since
    /// the last write, or is small. Rewriting the whole conversation at every turn made a
    /// step's writes quadratic in its turns (7.8 GB for a foreach of 1,000 long replies);
    /// this way they are at most three times its last size, plus 16 KiB a checkpoint. The
    /// turn logs have each turn as it ends; the step's end writes the whole session.
    pub(super) fn checkpoint_session(&mut self) -> Result<()> {
        self.count_session();
        let size = &self.session_size;
        if size.bytes <= SMALL_SESSION_BYTES || (size.bytes - size.written) * 2 >= size.written {
            self.save_session()
        } else {
            Ok(())
        }
    }

    /// Counts the bytes of the messages and entries added since the last count (all of them
    /// again when the history was cut).
    fn count_session(&mut self) {
        let size = &mut self.session_size;
        if self.history.len() < size.counted || self.session.entries.len() < size.entries {
            *size = SessionSize::default();
        }
        for message in &self.history[size.counted..] {
            size.bytes += serde_json::to_vec(message).map_or(0, |b| b.len() as u64);
        }
        for entry in &self.session.entries[size.entries..] {
            size.bytes += serde_json::to_vec(entry).map_or(0, |b| b.len() as u64);
        }
        size.counted = self.history.len();
        size.entries = self.session.entries.len();
    }

    /// Whether `session.json` lacks part of the conversation (a checkpoint skipped it).
    pub(super) fn session_behind(&mut self) -> bool {
        self.count_session();
        self.session_size.bytes != self.session_size.written
    }

    /// Writes `session.json` with the whole conversation.
    pub(super) fn save_session(&mut self) -> Result<()> {
        self.count_session();
        self.session_size.written = self.session_size.bytes;
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

/// How an item's entry (or a turn) ends for `result`: completed with `done` as its summary,
/// stopped, or failed with the reason.
pub(super) fn entry_outcome<T>(
    result: &Result<T, TurnEnd>,
    done: Option<String>,
) -> (Status, Option<String>) {
    match result {
        Ok(_) => (Status::Completed, done),
        Err(TurnEnd::Stopped) => (Status::Stopped, None),
        Err(TurnEnd::Failed(reason)) => (Status::Failed, Some(reason.clone())),
    }
}

pub(super) fn failed(e: anyhow::Error) -> TurnEnd {
    TurnEnd::Failed(format!("{e:#}"))
}
