//! The interactive builder (spec section 11): a persistent chat whose agent designs, runs
//! and repairs the workflow of one workspace through host tools.
//!
//! - [`agent`]: a session and its agent loop (one turn = LLM calls and the mode's tools
//!   until a plain reply), side agents, completion turns.
//! - [`side_agents`]: `run_in_background`, a side agent on a thread of its own.
//! - [`persist`]: the conversation file of each session and the index of sessions.
//! - [`costs`]: token usage and prices by phase, model, session and day.
//! - [`prompt`]: the system prompt, made from the workspace at each turn.
//! - [`modes`]: the workshop modes and the one table of the tools each has.
//! - [`tool`]: what a builder tool is (name, schema, JSON answer or failure).
//! - [`reads`]: the read set every mode has.
//! - [`db`]: `query_workflow_db` and `mutate_workflow_db`, the original's database tools.
//! - [`inspect`]: the original's read tools Trellis had no counterpart of
//!   (`get_llm_config`, `get_step_prompts`, `validate_plan_change`, ...).
//! - [`edits`]: plan, step config, workflow config, variables and groups, each edit
//!   validated before it is written and logged to `planning/changelog/`.
//! - [`files`]: script, knowledge, evaluation and report files, written through the
//!   sandboxed `workspace` plugin with the mode's grant.
//! - [`operator`]: the read tools for a front end without a session (the server).
//! - [`executions`]: steps and whole workflows run in the background on the
//!   [`trellis_runner::runtime::Runtime`], watched, steered and stopped.

pub mod agent;
pub mod costs;
pub mod db;
pub mod edits;
pub mod executions;
pub mod files;
pub mod inspect;
pub mod modes;
pub mod operator;
pub mod persist;
pub mod prompt;
pub mod reads;
pub mod schedules;
pub mod side_agents;
pub mod tool;

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use trellis_sandbox::Limits;
use trellis_sandbox::capabilities::DbWriteBudget;
use trellis_sandbox::plugins::PluginRegistry;
use trellis_sandbox::store::{HostWork, WorkspaceFs};

pub use agent::{
    BuilderSession, DEFAULT_TURN_RESULT_BYTES, DEFAULT_TURN_WRITE_BYTES, SessionOptions, TurnReport,
};
pub use modes::Mode;
pub use tool::{ToolFailure, ToolResult, ToolSpec};

/// The bytes of a builder tool's error message the model reads and the operator sees; the
/// rest is cut, marked (as a plugin tool's error message is).
pub const MAX_ERROR_BYTES: usize = 4 << 10;

/// Bytes of workspace files the host code of one builder tool call reads at most (a
/// `validate_plan_change` over many run folders, a `review_step_code` of every step).
pub const CALL_READ_BYTES: u64 = 256 << 20;

/// Seconds of host work one builder tool call may begin new work in; an execution it
/// starts runs on, under its own limits.
pub const CALL_SECONDS: u64 = 30;

/// Bytes of workspace files the host code of one turn's builder tool calls reads together at
/// most.
pub const TURN_READ_BYTES: u64 = 2 << 30;

/// Seconds the builder tool calls of one turn may work together (their host code, and the
/// plugin calls they make; not the model's answers, nor the executions they start).
pub const TURN_SECONDS: u64 = 120;

/// The host work of one builder tool call outside a turn (an operator's): [`CALL_READ_BYTES`]
/// and [`CALL_SECONDS`].
pub fn call_work() -> Arc<HostWork> {
    Arc::new(HostWork::new(
        "this builder tool call",
        CALL_READ_BYTES,
        std::time::Duration::from_secs(CALL_SECONDS),
    ))
}

/// What the builder tool calls of one turn may still do together: [`TURN_READ_BYTES`] read
/// and [`TURN_SECONDS`] of work. Each call gets the smaller of its own budget and what the
/// turn has left, and is charged what it used; once the turn has nothing left, calls are
/// refused. Many small calls of a looping model cost the host at most this much a turn.
#[derive(Debug)]
pub struct TurnWork {
    bytes_left: std::sync::atomic::AtomicU64,
    micros_left: std::sync::atomic::AtomicU64,
}

impl Default for TurnWork {
    fn default() -> Self {
        TurnWork {
            bytes_left: TURN_READ_BYTES.into(),
            micros_left: (TURN_SECONDS * 1_000_000).into(),
        }
    }
}

impl TurnWork {
    /// The work the next call may do; a failure, the call not made, when the turn has none
    /// left.
    pub fn next_call(&self) -> Result<Arc<HostWork>, ToolFailure> {
        use std::sync::atomic::Ordering::Relaxed;
        let bytes = self.bytes_left.load(Relaxed);
        let micros = self.micros_left.load(Relaxed);
        if bytes == 0 || micros == 0 {
            return Err(ToolFailure::new(format!(
                "refused: this turn's builder tool calls have used their host budget \
                 ({TURN_SECONDS} s of work, {} MiB of reads, all calls together); end the \
                 turn with what you have and go on in the next",
                TURN_READ_BYTES >> 20
            )));
        }
        let call = std::time::Duration::from_secs(CALL_SECONDS);
        let left = std::time::Duration::from_micros(micros);
        let what = if left < call || bytes < CALL_READ_BYTES {
            "this turn's builder tool calls"
        } else {
            "this builder tool call"
        };
        Ok(Arc::new(HostWork::new(
            what,
            bytes.min(CALL_READ_BYTES),
            left.min(call),
        )))
    }

    /// Charges what a call did: the bytes `work` used ([`HostWork::bytes_used`]) and
    /// `elapsed`.
    pub fn charge(&self, work: &HostWork, elapsed: std::time::Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let take = |left: &std::sync::atomic::AtomicU64, used: u64| {
            let _ = left.fetch_update(Relaxed, Relaxed, |l| Some(l.saturating_sub(used)));
        };
        take(&self.bytes_left, work.bytes_used());
        take(&self.micros_left, micros.max(1));
    }
}

/// Stops the turn a builder session runs now, from outside it (the server's
/// `POST /api/session/stop`): the turn ends before its next model call, a model call in
/// flight is let go, and tool calls not begun answer that the turn was stopped. Cheap to
/// clone; the session clears it when its next turn starts.
#[derive(Debug, Clone, Default)]
pub struct TurnStop(Arc<(std::sync::atomic::AtomicBool, tokio::sync::Notify)>);

impl TurnStop {
    /// Stops the running turn (if any).
    pub fn stop(&self) {
        self.0.0.store(true, std::sync::atomic::Ordering::SeqCst);
        self.0.1.notify_waiters();
    }

    /// Whether the turn was stopped.
    pub fn is_stopped(&self) -> bool {
        self.0.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Clears a stop: a new turn starts.
    pub(crate) fn reset(&self) {
        self.0.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Resolves once the turn is stopped.
    pub(crate) async fn stopped(&self) {
        loop {
            let notified = self.0.1.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_stopped() {
                return;
            }
            notified.await;
        }
    }
}

/// What a stopped turn says, to the operator and in the conversation.
pub const TURN_STOPPED: &str = "the turn was stopped by the operator";

/// The phase id of builder sessions in costs and conversation files.
pub const PHASE_ID: &str = "workflow-builder";

/// Something a builder turn reports as it goes, for a front end to show.
#[derive(Debug, Clone, PartialEq)]
pub enum BuilderEvent {
    /// A turn starts on this message: the operator's, or the announcement of an execution
    /// that ended (a completion turn).
    TurnStarted {
        /// The message.
        message: String,
    },
    /// A turn ended.
    TurnEnded {
        /// How.
        report: TurnReport,
    },
    /// Text of the agent's reply, whole (after its pieces, when it streamed).
    AgentText(String),
    /// A piece of the agent's reply as it arrives (a provider that streams): text, a tool
    /// call beginning, or a retry voiding what was shown. `AgentText` follows with the
    /// whole text.
    Reply(trellis_sandbox::llm::ReplyEvent),
    /// A tool call starts.
    ToolStarted {
        /// The call id the model gave.
        id: String,
        /// The tool.
        name: String,
        /// Its arguments, as the model sent them.
        arguments: Value,
    },
    /// A tool call ended.
    ToolEnded {
        /// The call id.
        id: String,
        /// The tool.
        name: String,
        /// Whether it did what it was asked.
        ok: bool,
        /// A line saying what it did or why it failed.
        summary: String,
    },
    /// An execution the session started reports something (`step a: started`).
    Execution {
        /// The builder's id of the execution (`exec-<step>-<n>`).
        id: String,
        /// What happened, in a line.
        line: String,
    },
}

/// Reports [`BuilderEvent`]s; cheap to clone.
#[derive(Clone)]
pub struct BuilderObserver(Arc<dyn Fn(&BuilderEvent) + Send + Sync>);

impl BuilderObserver {
    /// An observer calling `f` for each event.
    pub fn new(f: impl Fn(&BuilderEvent) + Send + Sync + 'static) -> Self {
        BuilderObserver(Arc::new(f))
    }

    /// An observer that drops every event.
    pub fn none() -> Self {
        BuilderObserver::new(|_| {})
    }

    /// Reports `event`.
    pub fn report(&self, event: &BuilderEvent) {
        (self.0)(event)
    }
}

impl std::fmt::Debug for BuilderObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BuilderObserver")
    }
}

/// What a builder tool call may use.
#[derive(Debug, Clone, Copy)]
pub struct ToolContext<'a> {
    /// The workspace folder.
    pub root: &'a Path,
    /// The session's mode in this turn.
    pub mode: Mode,
    /// The loaded plugins (the `workspace` plugin for files, validators for checks).
    pub registry: &'a PluginRegistry,
    /// Bounds of every plugin call.
    pub limits: &'a Limits,
    /// What the calls of the turn write together (database growth, and the bytes, files and
    /// folders of the file tools), on top of each call's own limits; an operator's call
    /// outside a turn has one of its own.
    pub turn_writes: &'a DbWriteBudget,
    /// The session's id.
    pub session_id: &'a str,
    /// Where events go.
    pub observer: &'a BuilderObserver,
    /// What the call's host code may still read, and until when it may work.
    pub work: &'a Arc<HostWork>,
}

impl ToolContext<'_> {
    /// The workspace, its reads charged to the call's [`ToolContext::work`].
    pub fn fs(&self) -> Result<WorkspaceFs, ToolFailure> {
        WorkspaceFs::open(self.root)
            .map(|fs| fs.with_work(self.work.clone()))
            .map_err(|e| ToolFailure::new(e.to_string()))
    }

    /// The call's bounds, its timeout no later than its host-work deadline: a plugin or
    /// database call it makes ends by the deadline of the call (and of the turn).
    pub fn limits_in_time(&self) -> Limits {
        let mut limits = *self.limits;
        limits.timeout = limits.timeout.min(self.work.time_left());
        limits
    }

    /// A failure when the call's deadline has passed.
    pub fn check_time(&self) -> Result<(), ToolFailure> {
        self.work
            .check_time()
            .map_err(|e| ToolFailure::new(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turns_calls_get_what_is_left_and_are_refused_when_nothing_is() {
        let turn = TurnWork::default();
        let first = turn.next_call().unwrap();
        turn.charge(&first, std::time::Duration::from_secs(TURN_SECONDS - 10));
        // Ten seconds are left: the next call's deadline is those, named as the turn's.
        let second = turn.next_call().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert!(second.check_time().is_ok());
        turn.charge(&second, std::time::Duration::from_secs(10));
        let refused = turn.next_call().unwrap_err();
        assert!(
            refused
                .message
                .contains("used their host budget (120 s of work"),
            "{refused}"
        );
    }
}
