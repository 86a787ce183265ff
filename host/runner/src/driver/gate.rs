//! Validation gates: one gate run with its report and event, and the repair turns of a
//! failing gate.

use super::prompts::{failing_checks, repair_message};
use super::{Run, StepRunner, TurnEnd};
use crate::events::RunEvent;
use crate::grants::TurnAccess;
use crate::steering::Phase;
use trellis_workflow::plan::{Item, ItemBody, Step};
use trellis_workflow::validation::PluginValidators;
use trellis_workflow::validation::{Report, ValidationSchema, run_gate, write_report};

impl StepRunner<'_> {
    /// Runs gate `item_id` once on the output folder: writes its report (attempt `attempt`)
    /// and reports the result as an event. A gate that cannot run at all fails the step.
    pub(super) async fn check_gate(
        &self,
        run: &Run<'_>,
        item_id: &str,
        attempt: u32,
        schema: &ValidationSchema,
    ) -> Result<Report, TurnEnd> {
        self.steer_phase(run, Phase::Gate);
        let validators = PluginValidators::new(self.registry, self.limits);
        let report = run_gate(&run.ws.root, &run.output_dir, schema, &validators)
            .await
            .map_err(|e| TurnEnd::Failed(format!("gate {item_id}: {e}")))?;
        // The report is kept twice (the attempt's file and the latest): it counts in what
        // the run keeps, as a turn's messages do (2,000 prevalidation items, no model call,
        // wrote 247 MB of reports under a 1 MiB budget).
        let bytes = serde_json::to_vec(&report).map_or(0, |b| b.len());
        self.keep(
            &format!("gate {item_id}: its report"),
            bytes.saturating_mul(2),
        )?;
        if let Err(e) = write_gate_report(run, item_id, attempt, &report) {
            tracing::warn!("{}: gate {item_id}: writing the report: {e}", run.label);
        }
        self.observer.emit(RunEvent::Gate {
            step_id: run.label.clone(),
            item_id: item_id.to_string(),
            attempt,
            passed: report.passed,
            failures: report.failure_count(),
        });
        Ok(report)
    }

    /// Runs a gate; on failure up to `repairs` repair turns (`MAX_REPAIR_TURNS` for a
    /// sequence), each followed by the gate.
    pub(super) async fn gate(
        &self,
        run: &mut Run<'_>,
        item_id: &str,
        schema: &ValidationSchema,
        access: TurnAccess,
        repairs: u32,
    ) -> Result<(), TurnEnd> {
        let mut attempt = 1;
        loop {
            let report = self.check_gate(run, item_id, attempt, schema).await?;
            if report.passed {
                return Ok(());
            }
            if attempt > repairs {
                return Err(TurnEnd::Failed(format!(
                    "gate {item_id} still fails after {repairs} repair turn{}:\n{}",
                    if repairs == 1 { "" } else { "s" },
                    failing_checks(&report)
                )));
            }
            if self.cancelled() {
                return Err(TurnEnd::Stopped);
            }
            let grant = run.grant_for(access)?;
            let repair_id = format!("{item_id}-repair-{attempt}");
            run.status_marker_ends = false;
            let turn = self
                .turn(run, &repair_id, 1, repair_message(item_id, &report), &grant)
                .await;
            run.status_marker_ends = true;
            turn?;
            attempt += 1;
        }
    }
}

/// The schema a prevalidation item checks: its own, else the step's top-level one (spec
/// section 2); `None` for other items.
pub(super) fn gate_schema<'s>(step: &'s Step, item: &'s Item) -> Option<&'s ValidationSchema> {
    match item.body {
        ItemBody::Prevalidation { .. } => {
            item.body.own_schema().or(step.validation_schema.as_ref())
        }
        _ => None,
    }
}

/// Writes a gate report: a step's under `logs/<step-id>/`, a sub-agent's in its own log
/// folder (`logs/<step-id>/agents/<route-id>/`), labelled with the call.
fn write_gate_report(
    run: &Run<'_>,
    item_id: &str,
    attempt: u32,
    report: &Report,
) -> std::io::Result<()> {
    if run.depth == 0 {
        return write_report(
            &run.ws.fs,
            &run.ws.run_dir(),
            &run.step.id,
            item_id,
            attempt,
            report,
        )
        .map(|_| ());
    }
    let label = format!("{}{item_id}", run.entry_prefix).replace('/', "-");
    let record = serde_json::json!({
        "step_id": run.label,
        "label": label,
        "attempt": attempt,
        "report": report,
    });
    run.ws.fs.write_json_atomic(
        run.logs
            .join(format!("pre_validation_{label}_attempt_{attempt}.json")),
        &record,
    )?;
    run.ws
        .fs
        .write_json_atomic(run.logs.join("pre_validation.json"), &record)
}
