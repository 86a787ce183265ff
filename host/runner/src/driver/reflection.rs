//! The closing reflection turn of a step (`<step-id>-reflection`).

use super::prompts::reflection_message;
use super::{REFLECTION_ITEM_TYPE, Run, StepRunner, TurnEnd, entry_outcome};
use crate::grants::{ReflectionDue, TurnPurpose};

impl StepRunner<'_> {
    /// The closing reflection turn (`<step-id>-reflection`, kind learning): the grant of
    /// [`TurnPurpose::Reflection`] writes only the stores due. The step's final answer stays
    /// the one of its work.
    pub(super) async fn reflection(
        &self,
        run: &mut Run<'_>,
        due: ReflectionDue,
    ) -> Result<(), TurnEnd> {
        if self.cancelled() {
            return Err(TurnEnd::Stopped);
        }
        let item_id = reflection_item_id(&run.step.id);
        let entry = self.begin_item(run, &item_id, REFLECTION_ITEM_TYPE);
        let answer = run.final_text.clone();
        let message = reflection_message(&run.step.id, &run.configs, due);
        let result = match run.grant(TurnPurpose::Reflection) {
            Ok(grant) => self.turn(run, &item_id, 1, message, &grant).await,
            Err(e) => Err(e),
        };
        let (status, summary) = entry_outcome(&result, run.final_text.clone());
        if answer.is_some() {
            run.final_text = answer;
        }
        self.end_item(run, entry, &item_id, status, summary)?;
        result
    }
}

/// The item id of a step's reflection turn: `<step-id>-reflection`.
pub fn reflection_item_id(step_id: &str) -> String {
    format!("{step_id}-reflection")
}
