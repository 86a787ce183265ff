//! The budgets of one turn: what a single model answer can make the host do. A model answer
//! is untrusted input (one answer can ask for tens of thousands of tool calls), so the tool
//! calls an answer runs, the calls that run at once and the bytes of results the host keeps
//! for a turn (in the conversation, the turn log and `tool-results/`) are all bounded.
//! A call over a budget is not run or its result not kept: the model gets an error saying
//! which limit it met and how to go on, and the turn goes on.
//!
//! One budget is the whole run's: the model calls of every step, turn and sub-agent
//! together ([`ModelCalls`]), since sub-agents each with their own tool rounds would
//! otherwise multiply them without end. Past it no call is made and the run ends.

use std::sync::atomic::{AtomicU64, Ordering};

/// Tool calls of one model answer that run by default; the rest are answered with an error.
pub const DEFAULT_CALLS_PER_ANSWER: usize = 64;
/// Bytes of tool results one turn keeps by default (256 MiB).
pub const DEFAULT_TURN_RESULT_BYTES: u64 = 256 << 20;
/// Model calls one run makes by default, all its steps, turns and sub-agents together.
pub const DEFAULT_RUN_MODEL_CALLS: u64 = 10_000;
/// Bytes of model answers and tool results one run keeps by default (1 GiB), all its turns
/// together.
pub const DEFAULT_RUN_RESULT_BYTES: u64 = 1 << 30;

/// Bytes the calls of one turn write together by default (1 GiB): to their folders and the
/// database, each call also within its own per-call budget.
pub const DEFAULT_TURN_WRITE_BYTES: u64 = 1 << 30;
/// Files and folders the calls of one turn create together by default.
pub const DEFAULT_TURN_CREATED_ENTRIES: u64 = 10_000;
/// Bytes one run writes by default (4 GiB), all its turns, sub-agents and scripts together,
/// to their folders and the database: each turn within its own budget too, so a run of many
/// turns cannot write a turn's budget again and again.
pub const DEFAULT_RUN_WRITE_BYTES: u64 = 4 << 30;
/// Files and folders one run creates by default, everything of it together.
pub const DEFAULT_RUN_CREATED_ENTRIES: u64 = 100_000;
/// Bytes a workspace's folder may take on disk by default (16 GiB): a run writes no more
/// than what is left of it when it begins (see [`ModelCalls::run_writes`]).
pub const DEFAULT_WORKSPACE_BYTES: u64 = 16 << 30;
/// Seconds the tool calls of one turn take together by default, each call's time added
/// (calls at once each count): what one turn can make the host and its guests work.
pub const DEFAULT_TURN_CALL_SECONDS: u64 = 600;

/// The budgets of every turn of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnBudgets {
    /// Tool calls of one model answer that run (`--max-calls-per-answer`).
    pub calls_per_answer: usize,
    /// Tool calls of one turn running at once (`--max-concurrent-calls`).
    pub concurrent_calls: usize,
    /// Bytes of tool results one turn keeps, offloaded or in the conversation
    /// (`--max-turn-result-mib`).
    pub result_bytes: u64,
    /// Model calls of the whole run, every turn of every step and sub-agent counted in one
    /// [`ModelCalls`] (`--max-model-calls`).
    pub run_model_calls: u64,
    /// Bytes of model answers and tool results the whole run keeps, every turn of every
    /// step and sub-agent together (`--max-run-result-mib`).
    pub run_result_bytes: u64,
    /// Bytes the calls of one turn write together, to their folders and the database
    /// (`--max-turn-write-mib`).
    pub write_bytes: u64,
    /// Files and folders the calls of one turn create together.
    pub created_entries: u64,
    /// Bytes the whole run writes, every turn, sub-agent and script together, to their
    /// folders and the database (`--max-run-write-mib`).
    pub run_write_bytes: u64,
    /// Files and folders the whole run creates, everything of it together.
    pub run_created_entries: u64,
    /// Bytes the workspace's folder may take on disk: the run writes no more than what is
    /// left of it (`--max-workspace-mib`).
    pub workspace_bytes: u64,
    /// Seconds the tool calls of one turn take together, each call's time added
    /// (`--max-turn-call-seconds`).
    pub call_seconds: u64,
}

impl Default for TurnBudgets {
    fn default() -> Self {
        TurnBudgets {
            calls_per_answer: DEFAULT_CALLS_PER_ANSWER,
            concurrent_calls: default_concurrent_calls(),
            result_bytes: DEFAULT_TURN_RESULT_BYTES,
            run_model_calls: DEFAULT_RUN_MODEL_CALLS,
            run_result_bytes: DEFAULT_RUN_RESULT_BYTES,
            write_bytes: DEFAULT_TURN_WRITE_BYTES,
            created_entries: DEFAULT_TURN_CREATED_ENTRIES,
            run_write_bytes: DEFAULT_RUN_WRITE_BYTES,
            run_created_entries: DEFAULT_RUN_CREATED_ENTRIES,
            workspace_bytes: DEFAULT_WORKSPACE_BYTES,
            call_seconds: DEFAULT_TURN_CALL_SECONDS,
        }
    }
}

/// The default of calls at once: the CPUs this process may use (guest calls are CPU-bound).
pub fn default_concurrent_calls() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// What the tool calls of one turn share: the bytes they write and create, the result
/// bytes kept, the call time. A `call_sub_agent` call's sub-agent runs its turns on the
/// calling turn's shares: its tool calls draw from the caller's budgets, so sub-agents
/// cannot multiply them.
#[derive(Debug)]
pub(super) struct TurnShares {
    pub(super) db_budget: trellis_sandbox::capabilities::DbWriteBudget,
    pub(super) result_bytes: ResultBytes,
    pub(super) call_time: CallTime,
    /// While a `call_sub_agent` call runs: when the calling turn's call time runs out. The
    /// sub-agent's model calls end by then (its tool calls take their time from
    /// `call_time`), so the call does too.
    pub(super) sub_agent_deadline: std::sync::Mutex<Option<std::time::Instant>>,
}

impl TurnShares {
    /// When a running sub-agent's model calls must end, if one runs.
    pub(super) fn sub_agent_deadline(&self) -> Option<std::time::Instant> {
        *self
            .sub_agent_deadline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the deadline of a sub-agent call starting, and puts back its caller's (or
    /// `None`) once it ended.
    pub(super) fn set_sub_agent_deadline(&self, deadline: Option<std::time::Instant>) {
        *self
            .sub_agent_deadline
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = deadline;
    }
}

/// What is left of one turn's result bytes, shared by its calls as they end, and within
/// what the whole run may keep.
#[derive(Debug)]
pub(super) struct ResultBytes {
    left: AtomicU64,
    total: u64,
    /// The run's counter and its budget (`--max-run-result-mib`).
    run: Option<(std::sync::Arc<ModelCalls>, u64)>,
}

impl ResultBytes {
    pub(super) fn new(total: u64) -> Self {
        ResultBytes {
            left: AtomicU64::new(total),
            total,
            run: None,
        }
    }

    /// The same, also within the `max` bytes the run's results may take together, counted
    /// in `run`.
    pub(super) fn within_run(mut self, run: std::sync::Arc<ModelCalls>, max: u64) -> Self {
        self.run = Some((run, max));
        self
    }

    /// Takes `n` bytes; the error the result gets in its place (nothing taken) when the
    /// turn or the run has no room left for it.
    pub(super) fn take(&self, n: usize) -> Result<(), String> {
        let bytes = u64::try_from(n).unwrap_or(u64::MAX);
        if let Some((run, max)) = &self.run
            && !run.keep(bytes, *max)
        {
            return Err(format!(
                "result not kept: its {n} bytes would take this run's tool results past their \
                 budget of {} (--max-run-result-mib); end this turn with what you have",
                mib(*max)
            ));
        }
        let taken = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(bytes)
            })
            .is_ok();
        if taken {
            return Ok(());
        }
        if let Some((run, _)) = &self.run {
            run.unkeep(bytes);
        }
        Err(format!(
            "result not kept: its {n} bytes would take this turn's tool results past their \
             budget of {} (--max-turn-result-mib); end this turn with what you have, or ask \
             for smaller results (a line range, a narrower query)",
            mib(self.total)
        ))
    }
}

/// The time the tool calls of one turn have left, shared by its calls: a call starting takes
/// its deadline out of what is left (the smaller of its own and what is left), and gives back
/// what it did not use when it ends. Calls running at once so share the time rather than each
/// counting on all of it, and a model answer of many calls that each run to their deadline
/// (database queries that never end, guests that spin) is bounded as a whole, not only call
/// by call.
#[derive(Debug)]
pub(super) struct CallTime {
    total: std::time::Duration,
    /// Time taken by calls that ended, and time held by calls running.
    spent: std::sync::Mutex<(std::time::Duration, std::time::Duration)>,
}

impl CallTime {
    pub(super) fn new(seconds: u64) -> Self {
        CallTime {
            total: std::time::Duration::from_secs(seconds),
            spent: Default::default(),
        }
    }

    /// Holds at most `most`, and at most a `share`-th of the time left, for a call
    /// starting, when at least `least` is left (of the share); `None` (nothing held)
    /// otherwise.
    pub(super) fn hold(
        &self,
        most: std::time::Duration,
        least: std::time::Duration,
        share: usize,
    ) -> Option<std::time::Duration> {
        let mut spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
        let (used, held) = *spent;
        let left = self.total.saturating_sub(used.saturating_add(held));
        let fair = left / u32::try_from(share.max(1)).unwrap_or(u32::MAX);
        if fair < least {
            return None;
        }
        let taken = most.min(fair);
        spent.1 = held.saturating_add(taken);
        Some(taken)
    }

    /// The time taken by the calls that ended.
    pub(super) fn used(&self) -> std::time::Duration {
        self.spent.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// The time neither taken nor held.
    pub(super) fn left(&self) -> std::time::Duration {
        let (used, held) = *self.spent.lock().unwrap_or_else(|e| e.into_inner());
        self.total.saturating_sub(used.saturating_add(held))
    }

    /// The turn's call time in all.
    pub(super) fn total(&self) -> std::time::Duration {
        self.total
    }

    /// Whether less than `least` is left for a call starting.
    pub(super) fn spent_below(&self, least: std::time::Duration) -> bool {
        let (used, held) = *self.spent.lock().unwrap_or_else(|e| e.into_inner());
        self.total.saturating_sub(used.saturating_add(held)) < least
    }

    /// Ends a call that [`Self::hold`] gave `held`: it took `took`.
    pub(super) fn settle(&self, held: std::time::Duration, took: std::time::Duration) {
        let mut spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
        spent.0 = spent.0.saturating_add(took);
        spent.1 = spent.1.saturating_sub(held);
    }

    /// The error of a call not run because the turn's calls used their time.
    pub(super) fn spent(&self) -> String {
        format!(
            "not run: this turn's tool calls took their {} s together, the most one turn's \
             calls may (--max-turn-call-seconds); end this turn with what you have",
            self.total.as_secs()
        )
    }
}

/// The model calls a run made, the bytes of tool results it kept and what it wrote, shared
/// by the step runners of its steps (and so by their sub-agents).
#[derive(Debug, Default)]
pub struct ModelCalls {
    made: AtomicU64,
    kept: AtomicU64,
    /// A turn ended because what it would keep did not fit the run's budget: the run ends.
    kept_out: std::sync::atomic::AtomicBool,
    writes: std::sync::OnceLock<trellis_sandbox::capabilities::DbWriteBudget>,
}

impl ModelCalls {
    /// What the whole run may write and create (made with `budgets` the first time, when
    /// the workspace at `root` is measured: no more than what is left of its quota): the
    /// budget every turn's and script's writes also come out of. A builder session shares
    /// it with the executions it starts: its turns and theirs write within one budget.
    pub fn run_writes(
        &self,
        budgets: &TurnBudgets,
        limits: trellis_sandbox::capabilities::FsLimits,
        root: &std::path::Path,
    ) -> trellis_sandbox::capabilities::DbWriteBudget {
        self.writes
            .get_or_init(|| Self::measured(budgets, limits, root).0)
            .clone()
    }

    /// Begins a run (an execution, a builder session, a script) of the workspace at `root`:
    /// makes [`Self::run_writes`] if it is not made yet, else measures the workspace again
    /// (the executions of a builder session share the session's), one measurement either
    /// way. `Err` says why the run may not begin: the workspace takes its quota or more
    /// (what the host writes for a run, its logs and sessions, is not charged as written).
    pub fn begin_run(
        &self,
        budgets: &TurnBudgets,
        limits: trellis_sandbox::capabilities::FsLimits,
        root: &std::path::Path,
    ) -> Result<(), String> {
        let mut refused = None;
        let mut measured = false;
        self.writes.get_or_init(|| {
            measured = true;
            let (budget, why) = Self::measured(budgets, limits, root);
            refused = why;
            budget
        });
        if !measured {
            refused = trellis_sandbox::capabilities::DbWriteBudget::over_quota(
                root,
                budgets.workspace_bytes,
            );
        }
        refused.map_or(Ok(()), Err)
    }

    /// The run's write budget, the workspace at `root` measured now, and why a run may not
    /// begin.
    fn measured(
        budgets: &TurnBudgets,
        limits: trellis_sandbox::capabilities::FsLimits,
        root: &std::path::Path,
    ) -> (trellis_sandbox::capabilities::DbWriteBudget, Option<String>) {
        trellis_sandbox::capabilities::DbWriteBudget::for_run(
            trellis_sandbox::capabilities::FsLimits {
                write_bytes: budgets.run_write_bytes,
                created_entries: budgets.run_created_entries,
                ..limits
            },
            root,
            budgets.workspace_bytes,
        )
    }

    /// Counts one more call; `false` (nothing counted) once `max` were made.
    pub fn take(&self, max: u64) -> bool {
        self.made
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |made| {
                (made < max).then_some(made + 1)
            })
            .is_ok()
    }

    /// Counts `bytes` more of results kept; `false` (nothing counted) when that would pass
    /// `max`.
    pub(super) fn keep(&self, bytes: u64, max: u64) -> bool {
        self.kept
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |kept| {
                kept.checked_add(bytes).filter(|total| *total <= max)
            })
            .is_ok()
    }

    /// Gives back `bytes` that [`Self::keep`] counted.
    pub(super) fn unkeep(&self, bytes: u64) {
        let _ = self
            .kept
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |kept| {
                Some(kept.saturating_sub(bytes))
            });
    }

    /// Marks that a turn ended for what the run keeps ([`Self::kept_out`]).
    pub(super) fn mark_kept_out(&self) {
        self.kept_out.store(true, Ordering::SeqCst);
    }

    /// Whether a turn ended because what it would keep (its message, an answer) did not fit
    /// the run's `--max-run-result-mib`: the run ends, no later group starts.
    pub fn kept_out(&self) -> bool {
        self.kept_out.load(Ordering::SeqCst)
    }

    /// Whether `max` calls were made: the run makes no more.
    pub fn spent(&self, max: u64) -> bool {
        self.made.load(Ordering::SeqCst) >= max
    }
}

/// Why a turn ends when its run made all the model calls it may.
pub(super) fn out_of_model_calls(max: u64) -> String {
    format!(
        "the run made its {max} model calls, the limit of one run (`trellis run \
         --max-model-calls N` sets it); no more are made, and the run ends here"
    )
}

/// Why the run ends when `what` (the model's answer, a turn's message, a step's system
/// prompt, a gate's report: each kept by the host) of `bytes` does not fit what the run may
/// still keep.
pub(super) fn past_kept_bytes(what: &str, bytes: usize, max: u64) -> String {
    format!(
        "{what} of {bytes} bytes is past what the run keeps: its model answers, tool results, \
         messages, system prompts and gate reports together reached the run's budget of {} \
         (--max-run-result-mib); the run ends here",
        mib(max)
    )
}

/// The error of a call an answer asked for past the per-answer budget.
pub fn not_run(asked: usize, budget: usize) -> String {
    format!(
        "not run: this answer asked for {asked} tool calls and at most {budget} run per \
         answer (--max-calls-per-answer); ask again for the calls you still need, at most \
         {budget} at a time"
    )
}

/// The answer to each call past the first not run of an answer (the first says why).
pub fn not_run_either(budget: usize) -> String {
    format!("not run: past this answer's {budget} calls, as the first call not run says")
}

/// What the host keeps for each call of an answer past its limit, counted in the run's kept
/// bytes with the answer: its answer in the conversation and the session, and its record in
/// the turn log.
pub const NOT_RUN_KEPT_BYTES: usize = 512;

fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_bytes_are_taken_until_none_is_left() {
        let bytes = ResultBytes::new(10);
        assert!(bytes.take(6).is_ok());
        assert!(bytes.take(5).is_err(), "6 + 5 is over 10");
        assert!(bytes.take(4).is_ok());
        assert!(bytes.take(1).is_err());
        assert!(bytes.take(0).is_ok());
        assert!(bytes.take(usize::MAX).is_err());
        // Two turns within a run of 12: the second has room for what the first left.
        let run = std::sync::Arc::new(ModelCalls::default());
        let first = ResultBytes::new(10).within_run(run.clone(), 12);
        let second = ResultBytes::new(10).within_run(run.clone(), 12);
        assert!(first.take(8).is_ok());
        let refused = second.take(5).unwrap_err();
        assert!(refused.contains("--max-run-result-mib"), "{refused}");
        assert!(second.take(4).is_ok());
        // A result the turn refuses is not counted against the run.
        let run = std::sync::Arc::new(ModelCalls::default());
        let turn = ResultBytes::new(10).within_run(run.clone(), 18);
        assert!(turn.take(8).is_ok());
        assert!(turn.take(3).unwrap_err().contains("--max-turn-result-mib"));
        assert!(ResultBytes::new(10).within_run(run, 18).take(10).is_ok());
    }

    #[test]
    fn calls_running_at_once_share_the_turns_call_time() {
        let s = std::time::Duration::from_secs;
        let time = CallTime::new(20);
        let first = time.hold(s(30), s(1), 1);
        assert_eq!(first, Some(s(20)), "a call gets no more than is left");
        assert_eq!(time.hold(s(30), s(1), 1), None, "the first holds it all");
        time.settle(s(20), s(5));
        let second = time.hold(s(10), s(1), 1);
        assert_eq!(second, Some(s(10)), "what the first left unused came back");
        assert_eq!(time.hold(s(30), s(1), 1), Some(s(5)));
        assert_eq!(time.hold(s(30), s(1), 1), None);
        time.settle(s(10), s(10));
        time.settle(s(5), s(5));
        assert_eq!(time.hold(s(30), s(0), 1), Some(s(0)), "all 20 s taken");
        // Four calls that may run at once share it: none starves the others.
        let time = CallTime::new(20);
        let shares: Vec<_> = (1..=4)
            .rev()
            .map(|share| time.hold(s(600), s(1), share))
            .collect();
        assert_eq!(shares, [Some(s(5)), Some(s(5)), Some(s(5)), Some(s(5))]);
    }

    #[test]
    fn model_calls_are_counted_until_the_runs_limit() {
        let calls = ModelCalls::default();
        assert!(calls.take(2));
        assert!(!calls.spent(2));
        assert!(calls.take(2));
        assert!(calls.spent(2));
        assert!(!calls.take(2), "a third of two");
        assert!(calls.take(3), "a higher limit lets one more through");
        assert!(!calls.take(0));
    }

    #[test]
    fn the_errors_name_the_budget_and_its_flag() {
        assert_eq!(
            not_run(100, 64),
            "not run: this answer asked for 100 tool calls and at most 64 run per answer \
             (--max-calls-per-answer); ask again for the calls you still need, at most 64 at \
             a time"
        );
        let bytes = ResultBytes::new(256 << 20);
        assert!(bytes.take(256 << 20).is_ok());
        let error = bytes.take(7).unwrap_err();
        assert!(
            error.starts_with("result not kept: its 7 bytes would take this turn's tool results past their budget of 256 MiB (--max-turn-result-mib)"),
            "{error}"
        );
        assert_eq!(
            past_kept_bytes("the turn's message", 9, 1 << 20),
            "the turn's message of 9 bytes is past what the run keeps: its model answers, tool \
             results, messages, system prompts and gate reports together reached the run's \
             budget of 1 MiB (--max-run-result-mib); the run ends here"
        );
    }
}
