//! What a run did: a report per step, the steps of each run unit, the units of the run.

use super::*;

/// The bytes of a step report's detail a run keeps (a gate's failures, an agent's error).
pub const DETAIL_BYTES: usize = 64 << 10;

/// How one step of the workflow ended.
#[derive(Debug, Clone)]
pub struct StepReport {
    /// The step id.
    pub step_id: String,
    /// The step type.
    pub step_type: &'static str,
    /// `completed` or `failed` (or `stopped`).
    pub status: Status,
    /// One line: the route taken, the answer given, the agent's error.
    pub detail: String,
    /// The step output folder.
    pub output_dir: PathBuf,
    /// The agent loop's outcome, for agent steps.
    pub outcome: Option<StepOutcome>,
}

/// One run unit: `iteration-0`, or `iteration-0/<group>`.
#[derive(Debug, Clone)]
pub struct UnitRun {
    /// The group id, when the workflow has groups.
    pub group: Option<String>,
    /// Relative to `runs/`: `iteration-0` or `iteration-0/<group folder>`.
    pub run_folder: String,
    /// `runs/<run_folder>` on the host.
    pub run_dir: PathBuf,
    /// The steps run, in order (a step sent back to by a prerequisite appears again).
    pub steps: Vec<StepReport>,
}

impl UnitRun {
    /// Whether the last run of every step completed.
    pub fn succeeded(&self) -> bool {
        let mut last: BTreeMap<&str, Status> = BTreeMap::new();
        for s in &self.steps {
            last.insert(&s.step_id, s.status);
        }
        last.values().all(|s| *s == Status::Completed)
    }
}

/// What a workflow run did.
#[derive(Debug, Clone)]
pub struct WorkflowRun {
    /// Where the previous `iteration-0` went, if a full run rotated one.
    pub archived: Option<String>,
    /// The run units, in order.
    pub units: Vec<UnitRun>,
    /// Why the run stopped before its last unit: it made all its model calls, or what it
    /// keeps reached its budget. Such a run did not succeed.
    pub cut_short: Option<String>,
}

impl WorkflowRun {
    /// Whether every unit ran and succeeded.
    pub fn succeeded(&self) -> bool {
        self.cut_short.is_none() && self.units.iter().all(UnitRun::succeeded)
    }

    /// Why the run did not succeed, when it did not: what cut it short, else its first step
    /// that did not complete (the first line of that step's detail, and its group's).
    pub fn failure(&self) -> Option<String> {
        if let Some(why) = &self.cut_short {
            return Some(why.clone());
        }
        self.units.iter().find(|u| !u.succeeded()).and_then(|unit| {
            let step = unit
                .steps
                .iter()
                .rev()
                .find(|s| s.status != Status::Completed)?;
            let group = unit
                .group
                .as_deref()
                .map_or(String::new(), |g| format!(" (group {g})"));
            Some(format!(
                "step {}{group}: {}: {}",
                step.step_id,
                step.status,
                step.detail.lines().next().unwrap_or_default()
            ))
        })
    }
}
