//! The end of a step (`end_step`): the concern of an agentic step that ran no turn, the
//! status from how the loop ended, prerequisite detection ([`crate::prerequisites`]), the
//! last `session.json`, the final summary (`execution-final-summary.json`, written behind
//! the session and turn logs, in the step's output folder and beside its turn logs in
//! `logs/<step>/execution/`, where the original system's readers look) and the
//! [`StepOutcome`].

use anyhow::{Context, Result};

use super::{NO_TURN_CONCERN, Run, StepOutcome, StepRunner, TurnEnd};
use crate::prerequisites;
use crate::session::{FinalSummary, Status, now_rfc3339, turn_logs_dir};

impl StepRunner<'_> {
    /// Ends the step of `run` after its loop ended with `result` (`scripted`: the step ran
    /// its script, not agent turns).
    pub(super) fn end_step(
        &self,
        mut run: Run<'_>,
        result: Result<(), TurnEnd>,
        scripted: bool,
    ) -> Result<StepOutcome> {
        let step_id = run.step.id.clone();
        // An agentic step that ran no turn (a foreach over no rows, say) is never a plain
        // success: it completes with a concern saying so.
        if result.is_ok() && !scripted && run.turns == 0 {
            let note = format!(
                "{NO_TURN_CONCERN} (step {step_id:?}: no user message was sent to the agent)"
            );
            tracing::warn!("{note}");
            run.concerns.push(note);
        }
        let (mut status, mut error) = match result {
            Ok(()) => (Status::Completed, None),
            Err(TurnEnd::Stopped) => (Status::Stopped, Some("stop requested".to_string())),
            Err(TurnEnd::Failed(reason)) => (Status::Failed, Some(reason)),
        };
        // Decided before the summary is written, so it is written once and says it all.
        let go_back = match prerequisites::verdict(
            &run.configs,
            status,
            run.final_text.as_deref(),
            self.prerequisite_returns,
        ) {
            Ok(go_back) => go_back,
            Err(reason) => {
                status = Status::Failed;
                error = Some(reason);
                None
            }
        };
        run.session.status = status;
        run.save_session()?;
        self.write_route_sessions(&run.ws.fs);
        let summary = FinalSummary {
            schema_version: crate::session::FINAL_SUMMARY_SCHEMA_VERSION,
            step_id,
            run_folder: run.run_folder.clone(),
            status,
            execution_result: error.clone().or_else(|| run.final_text.clone()),
            concerns: run.concerns.clone(),
            completed_at: now_rfc3339(),
        };
        // The session and the turn logs are written behind the loop: the summary that says
        // the step is over goes after them, queued behind them or once they are on disk.
        let beside_logs = turn_logs_dir(&run.logs);
        if self.ends_behind {
            summary
                .write_behind(&run.ws.fs, &beside_logs)
                .and_then(|()| summary.write_behind(&run.ws.fs, &run.output_dir))
        } else {
            trellis_sandbox::store::write_behind::flush()
                .context("writing the step's session and turn logs")?;
            summary
                .write(&run.ws.fs, &beside_logs)
                .and_then(|()| summary.write(&run.ws.fs, &run.output_dir))
        }
        .context("writing execution-final-summary.json")?;
        Ok(StepOutcome {
            status,
            go_back,
            concerns: run.concerns,
            turns: run.turns,
            final_text: run.final_text,
            error,
            output_dir: run.output_dir,
        })
    }
}
