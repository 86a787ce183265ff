//! The items of a step in order (`run_items`): user messages, `foreach` rows rendered from
//! the workspace database, `prevalidation` gates (recorded `skipped` under
//! `disable_validation`), then the automatic final gate; each item's entry in
//! `session.json` with its [`RunEvent::ItemStarted`] / [`RunEvent::ItemEnded`].

use super::gate::gate_schema;
use super::{
    FINAL_GATE_ID, GATE_SKIPPED_SUMMARY, MAX_REPAIR_TURNS, Run, StepRunner, TODO_TASK_CORRECTIONS,
    TurnEnd, entry_outcome, failed,
};
use crate::events::RunEvent;
use crate::grants::{TurnAccess, TurnPurpose};
use crate::session::Status;
use crate::{foreach, template};
use trellis_workflow::plan::{Item, ItemBody, StepKind};

impl StepRunner<'_> {
    pub(super) async fn run_items(&self, run: &mut Run<'_>, items: &[Item]) -> Result<(), TurnEnd> {
        let skip_gates = run.configs.disable_validation == Some(true);
        for item in items {
            if self.cancelled() {
                return Err(TurnEnd::Stopped);
            }
            let is_gate = matches!(item.body, ItemBody::Prevalidation { .. });
            if is_gate && skip_gates {
                self.skip_gate(run, &item.id)?;
                continue;
            }
            let entry = self.begin_item(run, &item.id, item.body.name());
            let result = self.run_item(run, item).await;
            let (status, summary) = entry_outcome(&result, run.final_text.clone());
            self.end_item(run, entry, &item.id, status, summary)?;
            result?;
        }
        // The automatic final gate, unless the last item was the same gate.
        if let Some(schema) = &run.step.validation_schema {
            let same = items
                .last()
                .and_then(|i| gate_schema(run.step, i))
                .is_some_and(|s| s == schema);
            if !same {
                if self.cancelled() {
                    return Err(TurnEnd::Stopped);
                }
                if skip_gates {
                    return self.skip_gate(run, FINAL_GATE_ID);
                }
                let entry = self.begin_item(run, FINAL_GATE_ID, "prevalidation");
                let access = TurnAccess::for_step(&run.configs);
                let result = self
                    .gate(run, FINAL_GATE_ID, schema, access, MAX_REPAIR_TURNS)
                    .await;
                let (status, summary) = entry_outcome(&result, None);
                self.end_item(run, entry, FINAL_GATE_ID, status, summary)?;
                result?;
            }
        }
        Ok(())
    }

    /// Records a gate not run because the step sets `disable_validation`.
    fn skip_gate(&self, run: &mut Run<'_>, item_id: &str) -> Result<(), TurnEnd> {
        tracing::info!(
            "{}: gate {item_id} skipped: disable_validation is set in the step config",
            run.label
        );
        let entry = run.start_entry(item_id, "prevalidation");
        self.end_item(
            run,
            entry,
            item_id,
            Status::Skipped,
            Some(GATE_SKIPPED_SUMMARY.to_string()),
        )
    }

    /// Starts item `item_id`: a running entry, written to `session.json`, and an
    /// [`RunEvent::ItemStarted`]. Returns the entry's index.
    pub(super) fn begin_item(&self, run: &mut Run<'_>, item_id: &str, item_type: &str) -> usize {
        let entry = run.start_entry(item_id, item_type);
        let _ = run.checkpoint_session();
        self.observer.emit(RunEvent::ItemStarted {
            step_id: run.label.clone(),
            item_id: item_id.to_string(),
            item_type: item_type.to_string(),
        });
        entry
    }

    /// Ends the entry of item `item_id` as `status` with `summary`: an
    /// [`RunEvent::ItemEnded`], then `session.json` rewritten.
    pub(super) fn end_item(
        &self,
        run: &mut Run<'_>,
        entry: usize,
        item_id: &str,
        status: Status,
        summary: Option<String>,
    ) -> Result<(), TurnEnd> {
        self.observer.emit(RunEvent::ItemEnded {
            step_id: run.label.clone(),
            item_id: item_id.to_string(),
            status,
        });
        run.session.end_entry(entry, status, summary);
        run.checkpoint_session()
            .map_err(|e| TurnEnd::Failed(format!("{e:#}")))
    }

    #[tracing::instrument(skip_all, fields(item = %item.id))]
    async fn run_item(&self, run: &mut Run<'_>, item: &Item) -> Result<(), TurnEnd> {
        match &item.body {
            ItemBody::UserMessage { message, .. } => {
                let grant = run.grant(TurnPurpose::Item(item))?;
                self.turn(run, &item.id, 1, message.clone(), &grant).await?;
            }
            ItemBody::Foreach {
                source_sql,
                message,
                max_iterations,
                ..
            } => {
                // SQLite opens by path: no link on the way (it refuses one at the file).
                let db = run
                    .ws
                    .fs
                    .check_file_path("db/db.sqlite")
                    .map_err(|e| failed(anyhow::anyhow!("foreach item {:?}: {e}", item.id)))?;
                let rows = foreach::query_rows(&db, &item.id, source_sql, *max_iterations)
                    .map_err(failed)?;
                if let Some(note) = rows.cap_message(&item.id) {
                    tracing::warn!("{note}");
                }
                let tpl = template::MessageTemplate::parse(&item.id, message).map_err(failed)?;
                let grant = run.grant(TurnPurpose::Item(item))?;
                for (i, row) in rows.rows.iter().enumerate() {
                    if self.cancelled() {
                        return Err(TurnEnd::Stopped);
                    }
                    let text = tpl.render(i + 1, row).map_err(failed)?;
                    run.status_marker_ends = false;
                    let turn = self.turn(run, &item.id, i as u32 + 1, text, &grant).await;
                    run.status_marker_ends = true;
                    turn?;
                }
            }
            ItemBody::Prevalidation {
                max_corrections, ..
            } => {
                let Some(schema) = gate_schema(run.step, item) else {
                    return Ok(());
                };
                let access = TurnAccess::for_item(&run.configs, item);
                // A todo_task's gate message gets its `max_corrections` corrective turns
                // (default 1), as in the original; a sequence's gates the fixed cap.
                let repairs = match run.step.kind {
                    StepKind::TodoTask(_) => max_corrections.map_or(TODO_TASK_CORRECTIONS, |n| {
                        u32::try_from(n).unwrap_or(u32::MAX)
                    }),
                    _ => MAX_REPAIR_TURNS,
                };
                self.gate(run, &item.id, schema, access, repairs).await?;
            }
        }
        Ok(())
    }
}
