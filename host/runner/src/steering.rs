//! Messages sent to a running step's agent from outside (`Runtime::send_message`).
//!
//! A message is accepted only while the step's own agent is inside a turn (waiting for its
//! model or running the tools it asked for); it then joins the conversation after the current
//! tool results and before the next LLM call, and a final answer that arrives with a message
//! pending does not end the turn. Outside a turn (a script, a gate, between steps) there is
//! no agent to tell, and the message is refused, never held for later: steering never starts
//! or resumes work. The one exception is given at the start ([`Steering::with_instructions`]):
//! instructions for the step's first turn, read with its user message.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Mutex;

use serde::Serialize;

/// What an execution is doing, as far as steering goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Set up, between steps, or in a step outside any turn (items starting, the database).
    Preparing,
    /// The step's agent waits for its model.
    LlmCall,
    /// The step's agent runs the tools its model asked for (a sub-agent call included).
    ToolCalls,
    /// A scripted step's script runs.
    Script,
    /// A validation gate runs.
    Gate,
    /// The step runs on a worker (`--dispatch`): messages do not reach its agent.
    OnWorker,
    /// The execution has ended.
    Finished,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Preparing => "preparing",
            Phase::LlmCall => "llm_call",
            Phase::ToolCalls => "tool_calls",
            Phase::Script => "script",
            Phase::OnWorker => "on_worker",
            Phase::Gate => "gate",
            Phase::Finished => "finished",
        })
    }
}

/// What became of a message sent to an execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// Queued: the agent reads it before its next LLM call.
    QueuedForInjection,
    /// The execution has ended (or there is no such execution).
    NotRunning,
    /// The execution runs, but no agent is inside a turn to read it.
    NoActiveAgent,
    /// The execution cannot take messages.
    Unsupported,
    /// [`MAX_QUEUED`] messages wait already: it is not queued; one may be sent once the
    /// agent has read them.
    QueueFull,
    /// The message is longer than [`MAX_MESSAGE_BYTES`]: it is never queued, whatever waits.
    TooLong,
}

/// Messages that may wait for the agent at once.
pub const MAX_QUEUED: usize = 16;

/// The longest message taken.
pub const MAX_MESSAGE_BYTES: usize = 16 << 10;

impl fmt::Display for DeliveryStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeliveryStatus::QueuedForInjection => "queued_for_injection",
            DeliveryStatus::NotRunning => "not_running",
            DeliveryStatus::NoActiveAgent => "no_active_agent",
            DeliveryStatus::Unsupported => "unsupported",
            DeliveryStatus::QueueFull => "queue_full",
            DeliveryStatus::TooLong => "too_long",
        })
    }
}

/// The answer to a message: its status and the phase the execution was in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Delivery {
    /// What became of the message.
    pub status: DeliveryStatus,
    /// What the execution was doing when the message arrived.
    pub phase: Phase,
}

/// The steering inbox of one execution, shared by the runtime and the step runner.
#[derive(Debug)]
pub struct Steering {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    phase: Phase,
    queue: VecDeque<String>,
}

impl Default for Steering {
    fn default() -> Self {
        Steering {
            state: Mutex::new(State {
                phase: Phase::Preparing,
                queue: VecDeque::new(),
            }),
        }
    }
}

impl Steering {
    /// An inbox holding `instructions` from the start: the agent reads them right after
    /// the user message of its first turn, before its first LLM call.
    pub fn with_instructions(instructions: String) -> Self {
        let steering = Steering::default();
        steering.state().queue.push_back(instructions);
        steering
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Offers `text` to the agent: queued when one is inside a turn, refused otherwise.
    pub fn offer(&self, text: String) -> Delivery {
        let mut state = self.state();
        let status = match state.phase {
            // What waits is read into the agent's next prompt: a bounded number of bounded
            // messages.
            _ if text.len() > MAX_MESSAGE_BYTES => DeliveryStatus::TooLong,
            Phase::LlmCall | Phase::ToolCalls if state.queue.len() >= MAX_QUEUED => {
                DeliveryStatus::QueueFull
            }
            Phase::LlmCall | Phase::ToolCalls => {
                state.queue.push_back(text);
                DeliveryStatus::QueuedForInjection
            }
            Phase::Finished => DeliveryStatus::NotRunning,
            Phase::Preparing | Phase::Script | Phase::Gate => DeliveryStatus::NoActiveAgent,
            Phase::OnWorker => DeliveryStatus::Unsupported,
        };
        Delivery {
            status,
            phase: state.phase,
        }
    }

    /// What the execution is doing now.
    pub fn phase(&self) -> Phase {
        self.state().phase
    }

    /// Records what the execution does next. Leaving a turn drops nothing: a message queued
    /// at its very end was already taken by the turn (see [`Steering::take`]).
    pub(crate) fn set_phase(&self, phase: Phase) {
        self.state().phase = phase;
    }

    /// The queued messages, oldest first; the queue is empty afterwards.
    pub(crate) fn take(&self) -> Vec<String> {
        self.state().queue.drain(..).collect()
    }

    /// Ends the turn unless a message is pending: atomically, so a message offered at the
    /// same moment is either taken by the turn or refused, never lost.
    pub(crate) fn finish_turn(&self, next: Phase) -> Vec<String> {
        let mut state = self.state();
        let pending: Vec<String> = state.queue.drain(..).collect();
        if pending.is_empty() {
            state.phase = next;
        }
        pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_taken_only_inside_a_turn() {
        let steering = Steering::default();
        let refused = steering.offer("early".into());
        assert_eq!(refused.status, DeliveryStatus::NoActiveAgent);
        assert_eq!(refused.phase, Phase::Preparing);

        steering.set_phase(Phase::LlmCall);
        let queued = steering.offer("look at b.csv too".into());
        assert_eq!(queued.status, DeliveryStatus::QueuedForInjection);
        assert_eq!(queued.phase, Phase::LlmCall);
        // A final answer with a message pending keeps the turn going.
        assert_eq!(
            steering.finish_turn(Phase::Preparing),
            ["look at b.csv too"]
        );
        assert_eq!(steering.phase(), Phase::LlmCall);
        assert!(steering.finish_turn(Phase::Gate).is_empty());
        assert_eq!(steering.phase(), Phase::Gate);
        assert_eq!(
            steering.offer("late".into()).status,
            DeliveryStatus::NoActiveAgent
        );

        steering.set_phase(Phase::Finished);
        assert_eq!(
            steering.offer("after".into()).status,
            DeliveryStatus::NotRunning
        );
        assert!(steering.take().is_empty(), "refused messages are not kept");
    }
}
