//! The agent loop of one step (spec sections 4, 8 and 10): runs the items of a
//! `message_sequence` (or the single turn of a `regular`) step of a loaded [`Workspace`].
//!
//! Per turn: LLM call -> the tool calls it asked for (only tools passing the step's
//! [`ToolPolicy`], under the turn's grant) -> results -> again, until a reply without tool
//! calls. Tool errors go back to the model as `error: ...` results. Items, gates with repair
//! turns, `STATUS: FAILED`, `CONCERNS:`, cancellation and persistence (`session.json`, turn
//! logs, final summary) are handled here. Not here yet: the reflection turn, routes
//! (`call_sub_agent`), whole-workflow stepping.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

use crate::Limits;
use crate::capabilities::turn::{
    TurnAccess, TurnContext, TurnGrant, TurnPurpose, grant_for_access, turn_grant,
};
use crate::llm::{
    Message, Options, Recorder, ReplayCursor, Request, RetryPolicy, Target, ToolCall,
    ToolDefinition, complete_with_options,
};
use crate::plugins::{PluginRegistry, PluginValidators};
use crate::sequence::events::{Observer, RunEvent};
use crate::sequence::filters::ToolPolicy;
use crate::sequence::session::{
    FinalSummary, LlmCallRecord, RequestedToolCall, Session, Status, ToolCallRecord,
    TurnConversation, TurnSummary, logs_dir, now_rfc3339, write_turn_logs,
};
use crate::sequence::{foreach, template};
use crate::validation::{Report, ValidationSchema, run_gate, write_report};
use crate::workflow::plan::{Item, ItemBody, Step, StepKind};
use crate::workflow::{AgentConfigs, Workspace};

/// Default cap on tool rounds (LLM calls answered with tool calls) per turn.
pub const DEFAULT_MAX_TOOL_ROUNDS: usize = 20;
/// Repair turns a failing gate gets before the step fails.
pub const MAX_REPAIR_TURNS: u32 = 3;
/// The item id of the automatic final gate.
pub const FINAL_GATE_ID: &str = "__automatic_final_validation__";
/// The short tool policy note closing the system prompt.
pub const TOOL_POLICY_NOTE: &str = "Use the tools offered to read and write files; paths are \
workspace-relative. A tool error comes back as a result starting with `error:`: read it and \
adjust. When the task cannot be done, reply with a line `STATUS: FAILED <reason>`. Report \
doubts on lines starting with `CONCERNS:`.";

/// How a step ended.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutcome {
    /// `completed`, `failed` or `stopped`.
    pub status: Status,
    /// The `CONCERNS:` lines of the step's replies, in order.
    pub concerns: Vec<String>,
    /// Turns run (item turns, foreach rows and repair turns).
    pub turns: u64,
    /// The last reply of the agent.
    pub final_text: Option<String>,
    /// Why the step failed or stopped.
    pub error: Option<String>,
    /// The step output folder (`STEP_OUTPUT_DIR`), where `session.json` and the summary are.
    pub output_dir: PathBuf,
}

/// Runs steps: the plugins, the LLM targets and the bounds of every call.
#[derive(Debug)]
pub struct StepRunner<'a> {
    registry: &'a PluginRegistry,
    targets: Vec<Target>,
    retry: RetryPolicy,
    limits: Limits,
    max_tool_rounds: usize,
    cancel: Arc<AtomicBool>,
    replay: Option<ReplayCursor>,
    observer: Observer,
    target_options: Vec<Option<Options>>,
    recorder: Option<Arc<Recorder>>,
}

/// Why a turn ended without a final reply.
enum TurnEnd {
    Stopped,
    Failed(String),
}

struct TurnOk {
    text: String,
}

/// State of one step run.
struct Run<'w> {
    ws: &'w Workspace,
    step: &'w Step,
    configs: AgentConfigs,
    run_folder: String,
    output_dir: PathBuf,
    logs: PathBuf,
    session: Session,
    history: Vec<Message>,
    tools: Vec<ToolDefinition>,
    policy: ToolPolicy,
    concerns: Vec<String>,
    final_text: Option<String>,
    turns: u64,
}

impl<'w> Run<'w> {
    fn ctx(&self) -> TurnContext<'_> {
        TurnContext {
            root: &self.ws.root,
            run_folder: &self.run_folder,
            step: self.step,
            configs: &self.configs,
        }
    }

    fn save_session(&mut self) -> Result<()> {
        self.session.conversation_history = self
            .history
            .iter()
            .map(|m| serde_json::to_value(m).unwrap_or(Value::Null))
            .collect();
        self.session
            .write(&self.output_dir)
            .with_context(|| format!("writing session.json in {}", self.output_dir.display()))
    }
}

impl<'a> StepRunner<'a> {
    /// A runner calling `targets` in order (first the step's provider, then fallbacks).
    pub fn new(registry: &'a PluginRegistry, targets: Vec<Target>, limits: Limits) -> Self {
        StepRunner {
            registry,
            targets,
            retry: RetryPolicy::default(),
            limits,
            max_tool_rounds: DEFAULT_MAX_TOOL_ROUNDS,
            cancel: Arc::new(AtomicBool::new(false)),
            replay: None,
            observer: Observer::default(),
            target_options: Vec::new(),
            recorder: None,
        }
    }

    /// Sampling options of each target, by position (`execution_llm.options` of the
    /// primary, then of each fallback); `None` sends the request's defaults.
    pub fn with_target_options(mut self, options: Vec<Option<Options>>) -> Self {
        self.target_options = options;
        self
    }

    /// Appends every answered LLM call to `recorder`'s cassette (`trellis run --record`).
    pub fn with_recorder(mut self, recorder: Arc<Recorder>) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// Reports [`RunEvent`]s (items, turns, LLM and tool calls, gates) to `observer`.
    pub fn with_observer(mut self, observer: Observer) -> Self {
        self.observer = observer;
        self
    }

    /// Sets the retry policy of LLM calls.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the cap on tool rounds per turn.
    pub fn with_max_tool_rounds(mut self, rounds: usize) -> Self {
        self.max_tool_rounds = rounds.max(1);
        self
    }

    /// Shares a cancellation flag: once set, the step stops at the next boundary (before an
    /// item, between foreach rows, between tool rounds) and is recorded `stopped`.
    pub fn with_cancel(mut self, cancel: Arc<AtomicBool>) -> Self {
        self.cancel = cancel;
        self
    }

    /// Answers from a replay cassette: every LLM call takes the first target's provider and
    /// model with the cursor's next endpoint.
    pub fn with_replay(mut self, cursor: ReplayCursor) -> Self {
        self.replay = Some(cursor);
        self
    }

    /// The cancellation flag.
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    /// Runs step `step_id` of `ws`. Errors are for a broken setup (unknown step, unwritable
    /// run folder); a step that fails on its own terms is an `Ok` outcome with status failed.
    #[tracing::instrument(skip(self, ws), fields(step = step_id))]
    pub async fn run_step(&self, ws: &Workspace, step_id: &str) -> Result<StepOutcome> {
        let step = ws
            .plan
            .step(step_id)
            .with_context(|| format!("no step {step_id:?} in the plan"))?;
        let items: Vec<Item> = match &step.kind {
            StepKind::MessageSequence(_) | StepKind::Regular => step.effective_items(),
            other => bail!(
                "step {step_id:?} is a {} step: the agent loop runs message_sequence and regular steps",
                other.name()
            ),
        };
        let configs = ws.agent_configs(step_id);
        let run_folder = ws
            .run_folder
            .clone()
            .unwrap_or_else(|| "iteration-0".to_string());
        let output_dir = ws.step_output_dir(step_id);
        std::fs::create_dir_all(&output_dir)
            .with_context(|| format!("creating {}", output_dir.display()))?;
        let logs = logs_dir(&ws.run_dir(), step_id);
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        let policy = ToolPolicy::from_configs(&configs, false);
        let tools = self.offered_tools(&policy);
        let mut run = Run {
            ws,
            step,
            session: Session::new(step_id, &run_folder),
            configs,
            run_folder,
            output_dir,
            logs,
            history: Vec::new(),
            tools,
            policy,
            concerns: Vec::new(),
            final_text: None,
            turns: 0,
        };
        let step_grant = grant_for_access(&run.ctx(), TurnAccess::for_step(&run.configs))?;
        run.history
            .push(Message::system(system_prompt(step, &step_grant)));
        run.save_session()?;

        let result = self.run_items(&mut run, &items).await;
        let (status, error) = match result {
            Ok(()) => (Status::Completed, None),
            Err(TurnEnd::Stopped) => (Status::Stopped, Some("stop requested".to_string())),
            Err(TurnEnd::Failed(reason)) => (Status::Failed, Some(reason)),
        };
        run.session.status = status;
        run.save_session()?;
        FinalSummary {
            schema_version: crate::sequence::session::FINAL_SUMMARY_SCHEMA_VERSION,
            step_id: step_id.to_string(),
            run_folder: run.run_folder.clone(),
            status,
            execution_result: error.clone().or_else(|| run.final_text.clone()),
            concerns: run.concerns.clone(),
            completed_at: now_rfc3339(),
        }
        .write(&run.output_dir)
        .context("writing execution-final-summary.json")?;
        Ok(StepOutcome {
            status,
            concerns: run.concerns,
            turns: run.turns,
            final_text: run.final_text,
            error,
            output_dir: run.output_dir,
        })
    }

    /// The plugin tools passing the policy, as the model is told about them.
    fn offered_tools(&self, policy: &ToolPolicy) -> Vec<ToolDefinition> {
        let mut tools = Vec::new();
        for plugin in self.registry.plugins() {
            for listing in plugin.tool_listings() {
                if policy.plugins.allows_full_name(&listing.name) {
                    tools.push(ToolDefinition {
                        name: listing.name.clone(),
                        description: listing.description.to_string(),
                        parameters: listing.input_schema.clone(),
                    });
                }
            }
        }
        tools
    }

    async fn run_items(&self, run: &mut Run<'_>, items: &[Item]) -> Result<(), TurnEnd> {
        for item in items {
            if self.cancelled() {
                return Err(TurnEnd::Stopped);
            }
            let entry = run
                .session
                .start_entry(&item.id, &item.id, item.body.name());
            let _ = run.save_session();
            self.observer.emit(RunEvent::ItemStarted {
                step_id: run.step.id.clone(),
                item_id: item.id.clone(),
                item_type: item.body.name().to_string(),
            });
            let result = self.run_item(run, item).await;
            let (status, summary) = match &result {
                Ok(()) => (Status::Completed, run.final_text.clone()),
                Err(TurnEnd::Stopped) => (Status::Stopped, None),
                Err(TurnEnd::Failed(reason)) => (Status::Failed, Some(reason.clone())),
            };
            self.observer.emit(RunEvent::ItemEnded {
                step_id: run.step.id.clone(),
                item_id: item.id.clone(),
                status,
            });
            run.session.end_entry(entry, status, summary);
            run.save_session()
                .map_err(|e| TurnEnd::Failed(format!("{e:#}")))?;
            result?;
        }
        // The automatic final gate, unless the last item was the same gate.
        if let Some(schema) = &run.step.validation_schema {
            let same = items
                .last()
                .and_then(|i| i.body.own_schema())
                .is_some_and(|s| s == schema);
            if !same {
                if self.cancelled() {
                    return Err(TurnEnd::Stopped);
                }
                let entry = run
                    .session
                    .start_entry(FINAL_GATE_ID, FINAL_GATE_ID, "prevalidation");
                self.observer.emit(RunEvent::ItemStarted {
                    step_id: run.step.id.clone(),
                    item_id: FINAL_GATE_ID.to_string(),
                    item_type: "prevalidation".to_string(),
                });
                let access = TurnAccess::for_step(&run.configs);
                let result = self.gate(run, FINAL_GATE_ID, schema, access).await;
                let (status, summary) = match &result {
                    Ok(()) => (Status::Completed, None),
                    Err(TurnEnd::Stopped) => (Status::Stopped, None),
                    Err(TurnEnd::Failed(reason)) => (Status::Failed, Some(reason.clone())),
                };
                self.observer.emit(RunEvent::ItemEnded {
                    step_id: run.step.id.clone(),
                    item_id: FINAL_GATE_ID.to_string(),
                    status,
                });
                run.session.end_entry(entry, status, summary);
                run.save_session()
                    .map_err(|e| TurnEnd::Failed(format!("{e:#}")))?;
                result?;
            }
        }
        Ok(())
    }

    #[tracing::instrument(skip_all, fields(item = %item.id))]
    async fn run_item(&self, run: &mut Run<'_>, item: &Item) -> Result<(), TurnEnd> {
        match &item.body {
            ItemBody::UserMessage { message, .. } => {
                let grant = turn_grant(&run.ctx(), TurnPurpose::Item(item)).map_err(failed)?;
                self.turn(run, &item.id, 1, message.clone(), &grant).await?;
            }
            ItemBody::Foreach {
                source_sql,
                message,
                max_iterations,
                ..
            } => {
                let db = run.ws.root.join("db").join("db.sqlite");
                let rows = foreach::query_rows(&db, &item.id, source_sql, *max_iterations)
                    .map_err(failed)?;
                if let Some(note) = rows.cap_message(&item.id) {
                    tracing::warn!("{note}");
                }
                let tpl = template::MessageTemplate::parse(&item.id, message).map_err(failed)?;
                let grant = turn_grant(&run.ctx(), TurnPurpose::Item(item)).map_err(failed)?;
                for (i, row) in rows.rows.iter().enumerate() {
                    if self.cancelled() {
                        return Err(TurnEnd::Stopped);
                    }
                    let text = tpl.render(i + 1, row).map_err(failed)?;
                    self.turn(run, &item.id, i as u32 + 1, text, &grant).await?;
                }
            }
            ItemBody::Prevalidation { .. } => {
                let Some(schema) = item.body.own_schema() else {
                    return Ok(());
                };
                let access = TurnAccess::for_item(&run.configs, item);
                self.gate(run, &item.id, schema, access).await?;
            }
        }
        Ok(())
    }

    /// Runs a gate; on failure up to [`MAX_REPAIR_TURNS`] repair turns, each followed by the gate.
    async fn gate(
        &self,
        run: &mut Run<'_>,
        item_id: &str,
        schema: &ValidationSchema,
        access: TurnAccess,
    ) -> Result<(), TurnEnd> {
        let validators = PluginValidators::new(self.registry, self.limits);
        let mut attempt = 1;
        loop {
            let report = run_gate(&run.ws.root, &run.output_dir, schema, &validators)
                .map_err(|e| TurnEnd::Failed(format!("gate {item_id}: {e}")))?;
            if let Err(e) = write_report(&run.ws.run_dir(), &run.step.id, item_id, attempt, &report)
            {
                tracing::warn!("gate {item_id}: writing the report: {e}");
            }
            self.observer.emit(RunEvent::Gate {
                step_id: run.step.id.clone(),
                item_id: item_id.to_string(),
                attempt,
                passed: report.passed,
                failures: report.failures().count(),
            });
            if report.passed {
                return Ok(());
            }
            if attempt > MAX_REPAIR_TURNS {
                return Err(TurnEnd::Failed(format!(
                    "gate {item_id} still fails after {MAX_REPAIR_TURNS} repair turns:\n{}",
                    failing_checks(&report)
                )));
            }
            if self.cancelled() {
                return Err(TurnEnd::Stopped);
            }
            let grant = grant_for_access(&run.ctx(), access).map_err(failed)?;
            let repair_id = format!("{item_id}-repair-{attempt}");
            self.turn(run, &repair_id, 1, repair_message(item_id, &report), &grant)
                .await?;
            attempt += 1;
        }
    }

    /// The LLM call of one round, with the cassette's next endpoint under replay.
    async fn call_llm(&self, request: &Request) -> crate::llm::Completion {
        let targets = match &self.replay {
            Some(cursor) => match (self.targets.first(), cursor.next_endpoint()) {
                (Some(first), Ok(endpoint)) => vec![Target {
                    endpoint,
                    ..first.clone()
                }],
                _ => self.targets.clone(),
            },
            None => self.targets.clone(),
        };
        let completion = complete_with_options(
            self.registry,
            &targets,
            &self.target_options,
            request,
            &self.retry,
            &self.limits,
        )
        .await;
        if let (Some(recorder), Ok(response)) = (&self.recorder, &completion.result)
            && let Err(e) = recorder.record(request, response)
        {
            tracing::error!("{e:#}");
        }
        completion
    }

    /// One turn: user message, then rounds of LLM call and tool calls until a plain reply.
    #[tracing::instrument(skip_all, fields(item = item_id, iteration))]
    async fn turn(
        &self,
        run: &mut Run<'_>,
        item_id: &str,
        iteration: u32,
        message: String,
        grant: &TurnGrant,
    ) -> Result<(), TurnEnd> {
        run.turns += 1;
        run.session.execution_turn_count += 1;
        let turn_no = run.session.execution_turn_count;
        self.observer.emit(RunEvent::TurnStarted {
            step_id: run.step.id.clone(),
            item_id: item_id.to_string(),
            iteration,
            turn: turn_no,
        });
        let started_at = now_rfc3339();
        let started = Instant::now();
        let first_message = run.history.len();
        run.history.push(Message::user(message));
        let mut conv = TurnConversation {
            step_id: run.step.id.clone(),
            item_id: item_id.to_string(),
            attempt: turn_no as u32,
            iteration,
            messages: Vec::new(),
            llm_calls: Vec::new(),
            tool_calls: Vec::new(),
        };
        let parallel = !run.configs.disable_parallel_tool_execution.unwrap_or(false);
        let mut result = Err(TurnEnd::Failed(format!(
            "turn {item_id}: more than {} tool rounds without a final reply",
            self.max_tool_rounds
        )));
        for round in 0..=self.max_tool_rounds {
            if self.cancelled() {
                result = Err(TurnEnd::Stopped);
                break;
            }
            let request = Request {
                model: self
                    .targets
                    .first()
                    .map(|t| t.model.clone())
                    .unwrap_or_default(),
                messages: run.history.clone(),
                tools: run.tools.clone(),
                options: Options::default(),
            };
            let call_started = now_rfc3339();
            let t0 = Instant::now();
            let completion = self.call_llm(&request).await;
            let answered = completion.answered_by().or(completion.attempts.last());
            let mut record = LlmCallRecord {
                turn: turn_no,
                provider: answered.map(|a| a.provider.clone()).unwrap_or_default(),
                model_id: answered.map(|a| a.model.clone()).unwrap_or_default(),
                status: Status::Completed,
                error: None,
                started_at: call_started,
                completed_at: now_rfc3339(),
                duration_ms: t0.elapsed().as_millis() as u64,
                prompt_tokens: 0,
                completion_tokens: 0,
                total_tokens: 0,
                tool_calls: Vec::new(),
            };
            let response = match completion.result {
                Ok(r) => r,
                Err(e) => {
                    record.status = Status::Failed;
                    record.error = Some(e.to_string());
                    self.emit_llm_call(&run.step.id, &record);
                    conv.llm_calls.push(record);
                    result = Err(TurnEnd::Failed(format!(
                        "turn {item_id}: LLM call failed: {e}"
                    )));
                    break;
                }
            };
            record.prompt_tokens = response.usage.prompt_tokens.into();
            record.completion_tokens = response.usage.completion_tokens.into();
            record.total_tokens = response.usage.total_tokens.into();
            record.tool_calls = response
                .tool_calls
                .iter()
                .map(|c| RequestedToolCall {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    arguments: parse_arguments(&c.arguments).unwrap_or(Value::Null),
                })
                .collect();
            self.emit_llm_call(&run.step.id, &record);
            conv.llm_calls.push(record);
            run.history.push(Message::assistant(&response));
            if response.tool_calls.is_empty() {
                result = Ok(TurnOk {
                    text: response.text.clone(),
                });
                break;
            }
            if round == self.max_tool_rounds {
                break;
            }
            let calls = response
                .tool_calls
                .iter()
                .map(|c| self.tool_call(&run.policy, c, grant));
            let records: Vec<ToolCallRecord> = if parallel {
                futures::future::join_all(calls).await
            } else {
                let mut out = Vec::new();
                for c in calls {
                    out.push(c.await);
                }
                out
            };
            for r in records {
                self.observer.emit(RunEvent::ToolCall {
                    step_id: run.step.id.clone(),
                    tool: r.tool_name.clone(),
                    error: r.error.clone(),
                    duration_ms: r.duration_ms,
                });
                let content = match (&r.result, &r.error) {
                    (_, Some(e)) => format!("error: {e}"),
                    (Some(v), None) => match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    },
                    (None, None) => String::new(),
                };
                run.history
                    .push(Message::tool_result(r.tool_call_id.clone(), content));
                conv.tool_calls.push(r);
            }
        }
        conv.messages = run.history[first_message..]
            .iter()
            .map(|m| serde_json::to_value(m).unwrap_or(Value::Null))
            .collect();
        let (status, error) = match &result {
            Ok(_) => (Status::Completed, None),
            Err(TurnEnd::Stopped) => (Status::Stopped, None),
            Err(TurnEnd::Failed(r)) => (Status::Failed, Some(r.clone())),
        };
        let summary = TurnSummary::from_calls(
            &conv,
            item_id,
            status,
            error,
            started_at,
            now_rfc3339(),
            started.elapsed().as_millis() as u64,
        );
        if let Err(e) = write_turn_logs(&run.logs, &summary, &conv) {
            tracing::warn!("turn {item_id}: writing the turn logs: {e}");
        }
        let _ = run.save_session();
        let ok = result?;
        let (failed_reason, concerns) = scan_reply(&ok.text);
        run.concerns.extend(concerns);
        run.final_text = Some(ok.text);
        if let Some(reason) = failed_reason {
            return Err(TurnEnd::Failed(reason));
        }
        Ok(())
    }

    fn emit_llm_call(&self, step_id: &str, record: &LlmCallRecord) {
        self.observer.emit(RunEvent::LlmCall {
            step_id: step_id.to_string(),
            provider: record.provider.clone(),
            model: record.model_id.clone(),
            prompt_tokens: record.prompt_tokens,
            completion_tokens: record.completion_tokens,
            tool_calls: record.tool_calls.len(),
            duration_ms: record.duration_ms,
            error: record.error.clone(),
        });
    }

    /// One tool call, never failing: errors land in the record.
    async fn tool_call(
        &self,
        policy: &ToolPolicy,
        call: &ToolCall,
        grant: &TurnGrant,
    ) -> ToolCallRecord {
        let started_at = now_rfc3339();
        let t0 = Instant::now();
        let args = parse_arguments(&call.arguments);
        let outcome: Result<Value, String> = match &args {
            Err(e) => Err(e.clone()),
            Ok(_) if !policy.plugins.allows_full_name(&call.name) => Err(format!(
                "tool {:?} is not available in this step",
                call.name
            )),
            Ok(a) => self
                .registry
                .call_tool(&call.name, a, &grant.grant, &self.limits)
                .await
                .map_err(|e| e.to_string()),
        };
        ToolCallRecord {
            tool_call_id: call.id.clone(),
            tool_name: call.name.clone(),
            args: args.unwrap_or(Value::Null),
            result: outcome.as_ref().ok().cloned(),
            error: outcome.err(),
            duration_ms: t0.elapsed().as_millis() as u64,
            started_at,
            completed_at: now_rfc3339(),
        }
    }
}

fn failed(e: anyhow::Error) -> TurnEnd {
    TurnEnd::Failed(format!("{e:#}"))
}

fn parse_arguments(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_str(text).map_err(|e| format!("the arguments are not JSON: {e}"))
}

/// The system prompt of a step: its description, the grant and the tool policy note.
pub fn system_prompt(step: &Step, grant: &TurnGrant) -> String {
    let mut text = String::new();
    if let Some(d) = step.description.as_deref().filter(|d| !d.trim().is_empty()) {
        text.push_str(d.trim());
        text.push_str("\n\n");
    }
    text.push_str(&grant.describe());
    text.push('\n');
    text.push_str(TOOL_POLICY_NOTE);
    text
}

/// The system prompt `run_step` will use for step `step_id` of `ws` (for tests and cassettes).
pub fn step_system_prompt(ws: &Workspace, step_id: &str) -> Result<String> {
    let step = ws
        .plan
        .step(step_id)
        .ok_or_else(|| anyhow!("no step {step_id:?} in the plan"))?;
    let configs = ws.agent_configs(step_id);
    let run_folder = ws.run_folder.as_deref().unwrap_or("iteration-0");
    let ctx = TurnContext {
        root: &ws.root,
        run_folder,
        step,
        configs: &configs,
    };
    let grant = grant_for_access(&ctx, TurnAccess::for_step(&configs))?;
    Ok(system_prompt(step, &grant))
}

/// The message of a repair turn: every failing check with file, path, expected and actual.
pub fn repair_message(item_id: &str, report: &Report) -> String {
    format!(
        "The validation gate {item_id} failed. Failing checks:\n{}\nRe-read the files named \
         above, fix them with your tools, then reply briefly.",
        failing_checks(report)
    )
}

fn failing_checks(report: &Report) -> String {
    let mut text = String::new();
    for c in report.failures() {
        let path = if c.path.is_empty() {
            "(whole file)"
        } else {
            &c.path
        };
        text.push_str(&format!(
            "- file {}, path {path}, check {}: expected {}, actual {}. {}\n",
            c.file, c.kind, c.expected, c.actual, c.message
        ));
    }
    text
}

/// The `STATUS: FAILED` reason and the `CONCERNS:` lines of a reply.
pub fn scan_reply(text: &str) -> (Option<String>, Vec<String>) {
    let mut failed = None;
    let mut concerns = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("STATUS: FAILED") {
            let reason = rest.trim_start_matches([':', ' ', '-']).trim();
            failed.get_or_insert_with(|| {
                if reason.is_empty() {
                    "the agent reported STATUS: FAILED".to_string()
                } else {
                    reason.to_string()
                }
            });
        } else if let Some(rest) = line.strip_prefix("CONCERNS:") {
            let rest = rest.trim();
            if !rest.is_empty() {
                concerns.push(rest.to_string());
            }
        }
    }
    (failed, concerns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_failed_and_concerns_are_scanned() {
        let (failed, concerns) =
            scan_reply("done\nCONCERNS: row 2 odd\nSTATUS: FAILED: no data\nCONCERNS: x");
        assert_eq!(failed.as_deref(), Some("no data"));
        assert_eq!(concerns, vec!["row 2 odd", "x"]);
        assert_eq!(scan_reply("all good"), (None, vec![]));
    }
}
