//! The loop of a scripted step (spec section 7): script, gate, repair turn, script again.
//! Its texts are in [`crate::scripted`].

use super::prompts::failing_checks;
use super::{FINAL_GATE_ID, Run, StepRunner, TurnEnd, entry_outcome, failed};
use crate::grants::{GrantedFolder, TurnAccess};
use crate::scripted;
use crate::session::Status;
use crate::steering::Phase;
use crate::step_script::ScriptOptions;
use trellis_sandbox::script::{ScriptKind, ScriptOutcome};

impl StepRunner<'_> {
    /// A scripted step (spec section 7): the script, then the step's gate; on a failure a
    /// repair turn (unless `lock_code`) and the script again. No LLM is called when the
    /// script succeeds and its outputs pass.
    pub(super) async fn run_scripted(&self, run: &mut Run<'_>) -> Result<(), TurnEnd> {
        let Some((scripts, options)) = &self.scripts else {
            return Err(TurnEnd::Failed(format!(
                "step {:?} is scripted (declared_execution_mode \"scripted\"), but this \
                 runner runs no scripts",
                run.step.id
            )));
        };
        let step_id = run.step.id.clone();
        let locked = run.configs.lock_code == Some(true);
        let skip_gate = run.configs.disable_validation == Some(true);
        let mut attempt = 1;
        loop {
            if self.cancelled() {
                return Err(TurnEnd::Stopped);
            }
            let item_id = scripted::script_item_id(attempt);
            let entry = self.begin_item(run, &item_id, scripted::SCRIPT_ITEM_TYPE);
            self.steer_phase(run, Phase::Script);
            // A sub-agent's script writes to its call folder.
            let call_options;
            let options = if run.depth > 0 {
                call_options = ScriptOptions {
                    folders: Some(run.folders.clone()),
                    ..options.clone()
                };
                &call_options
            } else {
                options
            };
            let result = match crate::step_script::run(scripts, run.ws, &step_id, options).await {
                Ok(outcome) => self.check_script(run, attempt, skip_gate, outcome).await,
                Err(e) => Err(TurnEnd::Failed(format!("{e:#}"))),
            };
            let (status, summary) = match &result {
                Ok(Ok(done)) => (Status::Completed, Some(done.clone())),
                Ok(Err((_, problem))) => (Status::Failed, Some(problem.clone())),
                Err(TurnEnd::Stopped) => (Status::Stopped, None),
                Err(TurnEnd::Failed(reason)) => (Status::Failed, Some(reason.clone())),
            };
            self.end_item(run, entry, &item_id, status, summary)?;
            let (kind, script, problem) = match result? {
                Ok(done) => {
                    run.final_text = Some(done);
                    return Ok(());
                }
                Err((outcome, problem)) => (outcome.kind, outcome.script, problem),
            };
            if locked {
                return Err(TurnEnd::Failed(format!(
                    "{problem}\n(lock_code is set for step {step_id:?}: the script is not repaired)"
                )));
            }
            if kind == ScriptKind::Wasm {
                return Err(TurnEnd::Failed(format!(
                    "{problem}\n({script} is a compiled component: the agent cannot repair it)"
                )));
            }
            if attempt > scripted::MAX_SCRIPT_REPAIRS {
                return Err(TurnEnd::Failed(format!(
                    "{script} still fails after {} repairs: {problem}",
                    scripted::MAX_SCRIPT_REPAIRS
                )));
            }
            if run.models.targets.is_empty() {
                return Err(TurnEnd::Failed(format!(
                    "{problem}\nRepairing the script needs an LLM, and step {step_id:?} has \
                     none: set its execution_llm, a default llm in workflow.json, or give \
                     --llm PROVIDER:MODEL (or set lock_code to fail without repair)"
                )));
            }
            if self.cancelled() {
                return Err(TurnEnd::Stopped);
            }
            let code_rel = format!("code/{step_id}");
            let code_host = trellis_sandbox::capabilities::resolve_in_root(&run.ws.root, &code_rel)
                .map_err(failed)?;
            let mut grant = run.grant_for(TurnAccess::for_step(&run.configs))?;
            grant.grant = grant
                .grant
                .clone()
                .write(code_host, &format!("/{code_rel}"))
                .map_err(failed)?;
            grant.folders.push(GrantedFolder {
                path: code_rel,
                access: trellis_sandbox::Access::ReadWrite,
                role: "the step's script, writable for this repair".to_string(),
            });
            let source = run.ws.fs.read_to_string(&script).ok();
            let message = scripted::repair_message(
                &step_id,
                &script,
                kind,
                source.as_deref(),
                &problem,
                &run.step.outputs(),
            );
            let repair_id = scripted::repair_item_id(attempt);
            let entry = run.start_entry(&repair_id, "user_message");
            let turn = self.turn(run, &repair_id, 1, message, &grant).await;
            let (status, summary) = entry_outcome(&turn, run.final_text.clone());
            run.session.end_entry(entry, status, summary);
            run.save_session()
                .map_err(|e| TurnEnd::Failed(format!("{e:#}")))?;
            turn?;
            attempt += 1;
        }
    }

    /// What one script run means for the step: `Ok(summary)` when it succeeded and its
    /// outputs pass the gate (or the gate is disabled), `Err((outcome, problem))` when the
    /// script or the gate failed. A gate that cannot run at all fails the step.
    #[allow(clippy::type_complexity)]
    pub(super) async fn check_script(
        &self,
        run: &mut Run<'_>,
        attempt: u32,
        skip_gate: bool,
        outcome: ScriptOutcome,
    ) -> Result<Result<String, (ScriptOutcome, String)>, TurnEnd> {
        if let Some(problem) = outcome.error_message() {
            return Ok(Err((outcome, problem)));
        }
        let Some(schema) = run.step.validation_schema.as_ref().filter(|_| !skip_gate) else {
            return Ok(Ok(scripted::success_summary(&outcome)));
        };
        let report = self.check_gate(run, FINAL_GATE_ID, attempt, schema).await?;
        if report.passed {
            return Ok(Ok(format!(
                "{}; the outputs pass the validation gate",
                scripted::success_summary(&outcome)
            )));
        }
        let problem = format!(
            "{} exited normally, but its outputs fail the validation gate:\n{}",
            outcome.script,
            failing_checks(&report)
        );
        Ok(Err((outcome, problem)))
    }
}
