//! Answers of `human_input` steps given while the run waits for them. A run started with a
//! [`HumanInputs`] (the server's executions) does not need every answer up front: a
//! `human_input` step whose answer was not given asks, reports the question as a
//! [`crate::events::RunEvent::InputRequested`] event, and waits until someone answers
//! ([`HumanInputs::answer`]) or the run is stopped. A run without one (`trellis run`, the
//! builder's `run_full_workflow`) takes its answers up front, as the original does.

use std::sync::Mutex;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

/// The bytes of an answer at most (the size of a request's inputs).
pub const MAX_ANSWER_BYTES: usize = 64 << 10;

/// A question a run waits on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Question {
    /// The `human_input` step asking.
    pub step_id: String,
    /// The variable its answer sets (its `variable_name`, else its id).
    pub variable: String,
    /// The question, as the plan words it.
    pub question: Option<String>,
    /// `text`, `yesno` or `multiple_choice`.
    pub response_type: String,
    /// The options of a multiple-choice question.
    pub options: Vec<String>,
}

/// Why an answer was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnswerRefused {
    /// The run waits on no question now.
    NotWaiting,
    /// The run waits on another step's question.
    OtherStep {
        /// The step it waits on.
        waiting: String,
    },
    /// The answer is longer than [`MAX_ANSWER_BYTES`].
    TooLong {
        /// Its bytes.
        bytes: usize,
    },
}

impl std::fmt::Display for AnswerRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnswerRefused::NotWaiting => {
                f.write_str("the execution waits on no human_input step now")
            }
            AnswerRefused::OtherStep { waiting } => write!(
                f,
                "the execution waits on human_input step {waiting:?}, not this one"
            ),
            AnswerRefused::TooLong { bytes } => write!(
                f,
                "the answer is {bytes} bytes, more than the {MAX_ANSWER_BYTES} an answer may be"
            ),
        }
    }
}

/// The question a run waits on and the answer given to it.
#[derive(Debug, Default)]
pub struct HumanInputs {
    state: Mutex<State>,
    arrived: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct State {
    waiting: Option<Question>,
    answer: Option<String>,
}

impl HumanInputs {
    /// Waits for the answer of `question`; `None` when the run is stopped first (`cancel`
    /// fires, or `stopped` answers true: it is asked a few times a second). The question is
    /// [`HumanInputs::waiting`] until then.
    pub async fn ask(
        &self,
        question: Question,
        cancel: &CancellationToken,
        stopped: impl Fn() -> bool,
    ) -> Option<String> {
        {
            let mut state = self.lock();
            state.waiting = Some(question);
            state.answer = None;
        }
        loop {
            let notified = self.arrived.notified();
            {
                let mut state = self.lock();
                if state.answer.is_some() || stopped() {
                    state.waiting = None;
                    return state.answer.take();
                }
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
                _ = cancel.cancelled() => {
                    self.lock().waiting = None;
                    return None;
                }
            }
        }
    }

    /// Answers the question the run waits on (that of step `step_id`, when given). Returns
    /// the question answered.
    pub fn answer(&self, step_id: Option<&str>, answer: &str) -> Result<Question, AnswerRefused> {
        if answer.len() > MAX_ANSWER_BYTES {
            return Err(AnswerRefused::TooLong {
                bytes: answer.len(),
            });
        }
        let mut state = self.lock();
        let Some(waiting) = state.waiting.clone() else {
            return Err(AnswerRefused::NotWaiting);
        };
        if state.answer.is_some() {
            return Err(AnswerRefused::NotWaiting);
        }
        if step_id.is_some_and(|id| id != waiting.step_id) {
            return Err(AnswerRefused::OtherStep {
                waiting: waiting.step_id,
            });
        }
        state.answer = Some(answer.to_string());
        drop(state);
        self.arrived.notify_one();
        Ok(waiting)
    }

    /// The question the run waits on now, if any.
    pub fn waiting(&self) -> Option<Question> {
        let state = self.lock();
        state.waiting.clone().filter(|_| state.answer.is_none())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn question(step: &str) -> Question {
        Question {
            step_id: step.into(),
            variable: "v".into(),
            question: Some("go?".into()),
            response_type: "yesno".into(),
            options: Vec::new(),
        }
    }

    #[tokio::test]
    async fn an_answer_reaches_the_step_that_asks_and_no_other() {
        let inputs = Arc::new(HumanInputs::default());
        assert_eq!(inputs.answer(None, "yes"), Err(AnswerRefused::NotWaiting));
        let cancel = CancellationToken::new();
        let asking = tokio::spawn({
            let (inputs, cancel) = (inputs.clone(), cancel.clone());
            async move { inputs.ask(question("a"), &cancel, || false).await }
        });
        while inputs.waiting().is_none() {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            inputs.answer(Some("b"), "yes"),
            Err(AnswerRefused::OtherStep {
                waiting: "a".into()
            })
        );
        let long = "x".repeat(MAX_ANSWER_BYTES + 1);
        assert!(matches!(
            inputs.answer(Some("a"), &long),
            Err(AnswerRefused::TooLong { .. })
        ));
        assert_eq!(inputs.answer(Some("a"), "yes").unwrap().step_id, "a");
        assert_eq!(asking.await.unwrap().as_deref(), Some("yes"));
        assert_eq!(inputs.waiting(), None);
    }

    #[tokio::test]
    async fn a_stopped_run_stops_waiting() {
        let inputs = HumanInputs::default();
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert_eq!(inputs.ask(question("a"), &cancel, || false).await, None);
        let calm = CancellationToken::new();
        assert_eq!(inputs.ask(question("a"), &calm, || true).await, None);
        assert_eq!(inputs.waiting(), None);
    }
}
