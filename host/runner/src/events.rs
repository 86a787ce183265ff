//! What a running step reports as it goes, for live progress (`trellis run` on a terminal)
//! and for anyone embedding the runtime. Events are advisory: the files of section 8 are the
//! record, and a slow observer only slows the run, never changes it. Events of a route's
//! sub-agent carry `<step>/<route>` as their step id.

use std::fmt;
use std::sync::Arc;

use crate::session::Status;

/// One thing that happened inside a step run.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEvent {
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
    /// One tool call ended.
    ToolCall {
        /// The step id.
        step_id: String,
        /// The full tool name (`server:tool`).
        tool: String,
        /// The error, when the tool failed.
        error: Option<String>,
        /// Milliseconds.
        duration_ms: u64,
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
