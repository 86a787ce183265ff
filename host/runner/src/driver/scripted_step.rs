//! The loop of a scripted step (spec section 7): script, gate, repair turn, script again.
//! Its texts are in [`crate::scripted`].

use super::prompts::failing_checks;
use super::{FINAL_GATE_ID, Run, StepRunner, TurnEnd, entry_outcome, failed};
use crate::grants::{GrantedFolder, TurnAccess};
use crate::scripted;
use crate::session::Status;
use crate::steering::Phase;
use crate::step_script::ScriptOptions;
use trellis_sandbox::script::{ScriptFailure, ScriptKind, ScriptOutcome};

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
        if !trellis_sandbox::script::has_script(&run.ws.fs, &step_id) {
            if locked {
                let why = format!(
                    "step {step_id:?} has no script (code/{step_id}/main.py) and lock_code is set"
                );
                return self.agentic_fallback(run, &why).await;
            }
            self.write_script(run).await?;
        }
        let mut attempt = 1;
        loop {
            if self.cancelled() {
                return Err(TurnEnd::Stopped);
            }
            let item_id = scripted::script_item_id(attempt);
            let entry = self.begin_item(run, &item_id, scripted::SCRIPT_ITEM_TYPE);
            self.steer_phase(run, Phase::Script);
            // A sub-agent's script writes to its call folder.
            // A sub-agent's script writes to its call folder; every script ends when the
            // run's tool calls are cancelled.
            let options = ScriptOptions {
                folders: if run.depth > 0 {
                    Some(run.folders.clone())
                } else {
                    options.folders.clone()
                },
                cancel: Some(self.cancel_calls.clone()),
                run_writes: Some(self.model_calls.run_writes(
                    &self.budgets,
                    self.limits.fs,
                    &run.ws.root,
                )),
                ..options.clone()
            };
            let options = &options;
            let result = match run.settle_earlier_writes() {
                Err(end) => Err(end),
                Ok(()) => match crate::step_script::run(scripts, run.ws, &step_id, options).await {
                    // Stopped while it ran (a script cut off by the second stop fails as
                    // cancelled): no gate, no repair.
                    Ok(_) if self.cancelled() => Err(TurnEnd::Stopped),
                    Ok(outcome) => self.check_script(run, attempt, skip_gate, outcome).await,
                    Err(e) => Err(TurnEnd::Failed(format!("{e:#}"))),
                },
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
                let why = format!(
                    "{problem}\n(lock_code is set for step {step_id:?}: the script is not repaired)"
                );
                return self.agentic_fallback(run, &why).await;
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
            // The script's own folder: `code/<step-id>`, or `learnings/<step-id>` where it
            // was found (it is repaired there, never moved).
            let code_rel = script
                .rsplit_once('/')
                .map_or_else(|| format!("code/{step_id}"), |(dir, _)| dir.to_string());
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
            run.checkpoint_session()
                .map_err(|e| TurnEnd::Failed(format!("{e:#}")))?;
            turn?;
            attempt += 1;
        }
    }

    /// The agent turn that writes the script of a scripted step that has none yet (as the
    /// original does): `code/<step-id>/` is created and writable for this turn only.
    async fn write_script(&self, run: &mut Run<'_>) -> Result<(), TurnEnd> {
        let step_id = run.step.id.clone();
        if run.models.targets.is_empty() {
            return Err(TurnEnd::Failed(format!(
                "step {step_id:?} is scripted and has no script yet (code/{step_id}/main.py): \
                 writing it needs an LLM, and the step has none: set its execution_llm, a \
                 default llm in workflow.json, or give --llm PROVIDER:MODEL"
            )));
        }
        let code_rel = format!("code/{step_id}");
        run.ws
            .fs
            .create_dir_all(run.ws.root.join(&code_rel))
            .map_err(|e| TurnEnd::Failed(format!("creating {code_rel}/: {e:#}")))?;
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
            role: "the step's script, writable while it is written".to_string(),
        });
        let message = scripted::write_message(
            &step_id,
            run.step
                .description
                .as_deref()
                .or(run.step.title.as_deref())
                .unwrap_or_default(),
            &run.step.outputs(),
            run.step.context_dependencies.as_deref().unwrap_or_default(),
        );
        let item_id = scripted::WRITE_ITEM_ID;
        let entry = run.start_entry(item_id, "user_message");
        let turn = self.turn(run, item_id, 1, message, &grant).await;
        let (status, summary) = entry_outcome(&turn, run.final_text.clone());
        run.session.end_entry(entry, status, summary);
        run.checkpoint_session()
            .map_err(|e| TurnEnd::Failed(format!("{e:#}")))?;
        turn
    }

    /// A scripted step whose script may not be repaired (`lock_code`) runs as an agentic
    /// step instead: its items (the one built from its description) and its gate, after an
    /// entry saying why.
    async fn agentic_fallback(&self, run: &mut Run<'_>, why: &str) -> Result<(), TurnEnd> {
        let step_id = run.step.id.clone();
        if run.models.targets.is_empty() {
            return Err(TurnEnd::Failed(format!(
                "{why}\nRunning step {step_id:?} agentically instead needs an LLM, and it has \
                 none: set its execution_llm, a default llm in workflow.json, or give --llm \
                 PROVIDER:MODEL"
            )));
        }
        let note = format!("{why}\nRunning step {step_id:?} agentically instead.");
        tracing::warn!("{note}");
        let entry = self.begin_item(run, scripted::FALLBACK_ITEM_ID, scripted::SCRIPT_ITEM_TYPE);
        self.end_item(
            run,
            entry,
            scripted::FALLBACK_ITEM_ID,
            Status::Completed,
            Some(note),
        )?;
        let items = run.step.effective_items();
        self.run_items(run, &items).await
    }

    /// What one script run means for the step: `Ok(summary)` when it succeeded and its
    /// outputs pass the gate (or the gate is disabled), `Err((outcome, problem))` when the
    /// script or the gate failed. A gate that cannot run at all fails the step. A script
    /// that ended with a non-zero status (an exception included) counts as a success when
    /// the step has a gate and its outputs pass it, as in the original; the status is
    /// recorded in the summary.
    #[allow(clippy::type_complexity)]
    pub(super) async fn check_script(
        &self,
        run: &mut Run<'_>,
        attempt: u32,
        skip_gate: bool,
        outcome: ScriptOutcome,
    ) -> Result<Result<String, (ScriptOutcome, String)>, TurnEnd> {
        let schema = run.step.validation_schema.as_ref().filter(|_| !skip_gate);
        let exited = matches!(
            outcome.failure,
            Some(ScriptFailure::Exit { .. } | ScriptFailure::Exception { .. })
        );
        if let Some(problem) = outcome.error_message()
            && !(exited && schema.is_some())
        {
            return Ok(Err((outcome, problem)));
        }
        let Some(schema) = schema else {
            return Ok(Ok(scripted::success_summary(&outcome)));
        };
        let report = self.check_gate(run, FINAL_GATE_ID, attempt, schema).await?;
        if report.passed {
            let summary = match &outcome.failure {
                Some(failure) => format!(
                    "{}, but its outputs pass the validation gate: counted as a success",
                    failure.describe(&outcome.script)
                ),
                None => format!(
                    "{}; the outputs pass the validation gate",
                    scripted::success_summary(&outcome)
                ),
            };
            return Ok(Ok(summary));
        }
        if let Some(problem) = outcome.error_message() {
            let problem = format!(
                "{problem}\n\nIts outputs fail the validation gate too:\n{}",
                failing_checks(&report)
            );
            return Ok(Err((outcome, problem)));
        }
        let problem = format!(
            "{} exited normally, but its outputs fail the validation gate:\n{}",
            outcome.script,
            failing_checks(&report)
        );
        Ok(Err((outcome, problem)))
    }
}
