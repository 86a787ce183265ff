//! The turn: LLM calls and tool rounds until a plain reply, tool dispatch (plugin tools
//! and `call_sub_agent`) and the steering hooks; what it keeps of the results is
//! [`super::results`].

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use tokio::sync::Semaphore;

use super::budget::{CallTime, ResultBytes, TurnShares, out_of_model_calls};
use super::prompts::out_of_tool_rounds;
use super::results::{event_arguments, kept};
use super::{AgentModels, Run, StepRunner, TurnEnd, TurnOk, entry_outcome};
use crate::db_tools;
use crate::events::RunEvent;
use crate::filters::{CALL_SUB_AGENT, DELEGATION_CATEGORY, ToolPolicy};
use crate::grants::TurnGrant;
use crate::routes::call_sub_agent_tool;
use crate::session::{
    LlmCallRecord, RequestedToolCall, Status, ToolCallRecord, TurnConversation, TurnSummary,
    now_rfc3339, write_turn_logs,
};
use crate::steering::Phase;
use trellis_sandbox::capabilities::{DbWriteBudget, Limits};
use trellis_sandbox::llm::{Message, Options, Request, ToolCall, ToolDefinition};
use trellis_workflow::plan::Step;
use trellis_workflow::{AgentConfigs, Workspace};

impl StepRunner<'_> {
    /// Records what the step's own agent does next (sub-agents leave it alone: a message is
    /// for the agent the operator started).
    pub(super) fn steer_phase(&self, run: &Run<'_>, phase: Phase) {
        if run.depth == 0
            && let Some(steering) = &self.steering
        {
            steering.set_phase(phase);
        }
    }

    /// Appends the messages sent to the step's agent since its last LLM call.
    pub(super) fn take_steering(&self, run: &mut Run<'_>) {
        if run.depth == 0
            && let Some(steering) = &self.steering
        {
            for text in steering.take() {
                run.history.push(Message::user(text));
            }
        }
    }

    /// The tool policy of a step and the tools offered: plugin tools passing the filters,
    /// the database tools when the workspace has a `db/` folder (no filter removes them),
    /// then `call_sub_agent` when the step has routes.
    pub(super) fn tools_of(
        &self,
        ws: &Workspace,
        step: &Step,
        configs: &AgentConfigs,
    ) -> (ToolPolicy, Vec<ToolDefinition>) {
        let routes = step.predefined_routes();
        let policy = ToolPolicy::from_configs(configs, !routes.is_empty());
        let mut tools = self.offered_tools(&policy);
        if ws.fs.is_dir("db") {
            tools.extend(db_tools::definitions());
        }
        if policy.host.allows(DELEGATION_CATEGORY, CALL_SUB_AGENT) {
            tools.push(call_sub_agent_tool(routes));
        }
        (policy, tools)
    }

    /// The plugin tools passing the policy, as the model is told about them, then the tools
    /// of the external MCP servers the step names (marked unsandboxed).
    pub(super) fn offered_tools(&self, policy: &ToolPolicy) -> Vec<ToolDefinition> {
        let mut tools = Vec::new();
        if let Some(mcp) = &self.mcp {
            tools.extend(mcp.definitions(&|server, tool| {
                policy.plugins.names_server(server) && policy.plugins.allows(server, tool)
            }));
        }
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

    /// The LLM call of one round to `models`, with the cassette's next endpoint under replay;
    /// the reply's pieces go to the observers as they arrive ([`RunEvent::Reply`]), and the
    /// run's second stop ends the call at once.
    pub(super) async fn call_llm(
        &self,
        label: &str,
        models: &AgentModels,
        request: &Request,
    ) -> trellis_sandbox::llm::Completion {
        let observer = self.observer.clone();
        let step_id = label.to_string();
        let reply = trellis_sandbox::llm::ReplyStream::new(true, move |event| {
            observer.emit(RunEvent::Reply {
                step_id: step_id.clone(),
                event,
            })
        });
        let call = crate::llm_choice::complete(
            self.registry,
            &models.targets,
            &models.options,
            models.replay.as_ref(),
            self.recorder.as_deref(),
            request,
            &self.retry,
            &self.limits,
            Some(&reply),
        );
        // A stop ends a reply in flight at once (its connection closed with it); the turn then
        // ends `stopped`.
        let stopped = async {
            while !self.cancelled() && !self.cancel_calls.is_cancelled() {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        };
        tokio::select! {
            completion = call => completion,
            () = stopped => trellis_sandbox::llm::Completion {
                result: Err(trellis_sandbox::llm::LlmCallError::Provider {
                    provider: models.targets.first().map(|t| t.provider.clone()).unwrap_or_default(),
                    error: trellis_sandbox::llm::LlmError::Transport(
                        "the call was stopped".to_string(),
                    ),
                    stopped_by_host: true,
                }),
                attempts: Vec::new(),
            },
        }
    }

    /// One turn: user message, then rounds of LLM call and tool calls until a plain reply.
    #[tracing::instrument(skip_all, fields(item = item_id, iteration))]
    pub(super) async fn turn(
        &self,
        run: &mut Run<'_>,
        item_id: &str,
        iteration: u32,
        message: String,
        grant: &TurnGrant,
    ) -> Result<(), TurnEnd> {
        // The message is kept (the session, the turn log) and sent with every round, as an
        // answer is: it counts in what the run keeps. Foreach rows and repair turns build
        // them from the workspace and the files checked (100 MB of them under a 1 MiB budget).
        self.keep("the turn's message", message.len())?;
        run.turns += 1;
        run.session.execution_turn_count += 1;
        // What the calls of the turn may write together: its database tool calls grow the
        // database out of it, and its plugin calls write their files out of it too.
        // What one model answer can make the host do (see `budget`): calls at once, and the
        // bytes of results the turn keeps, shared by all its rounds. A sub-agent's turns
        // take them from the turn that called it.
        let shares = run.caller_shares.clone().unwrap_or_else(|| {
            Arc::new(TurnShares {
                db_budget: DbWriteBudget::within(
                    trellis_sandbox::capabilities::FsLimits {
                        write_bytes: self.budgets.write_bytes,
                        created_entries: self.budgets.created_entries,
                        ..self.limits.fs
                    },
                    &self
                        .model_calls
                        .run_writes(&self.budgets, self.limits.fs, &run.ws.root),
                ),
                result_bytes: ResultBytes::new(self.budgets.result_bytes)
                    .within_run(self.model_calls.clone(), self.budgets.run_result_bytes),
                call_time: CallTime::new(self.budgets.call_seconds),
                sub_agent_deadline: Default::default(),
            })
        });
        let slots = Semaphore::new(self.budgets.concurrent_calls.max(1));
        let turn_no = run.session.execution_turn_count;
        self.observer.emit(RunEvent::TurnStarted {
            step_id: run.label.clone(),
            item_id: item_id.to_string(),
            iteration,
            turn: turn_no,
        });
        let started_at = now_rfc3339();
        let started = Instant::now();
        let first_message = run.history.len();
        let message = match run.preamble.take() {
            Some(preamble) => format!("{preamble}\n\n{message}"),
            None => message,
        };
        run.history.push(Message::user(message));
        // Instructions given with the start wait in the inbox for the first turn.
        self.take_steering(run);
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
            // Out of tool rounds: one last call without tools, whose reply ends the turn.
            let last_call = round == self.max_tool_rounds;
            if last_call {
                tracing::warn!(
                    "{}: turn {item_id} used its {} tool rounds: asking for a final answer",
                    run.label,
                    self.max_tool_rounds
                );
                run.history
                    .push(Message::user(out_of_tool_rounds(self.max_tool_rounds)));
            }
            self.steer_phase(run, Phase::LlmCall);
            let request = Request {
                model: run
                    .models
                    .targets
                    .first()
                    .map(|t| t.model.clone())
                    .unwrap_or_default(),
                messages: run.history.clone(),
                tools: if last_call {
                    Vec::new()
                } else {
                    run.tools.clone()
                },
                options: Options::default(),
            };
            if !self.model_calls.take(self.budgets.run_model_calls) {
                let why = out_of_model_calls(self.budgets.run_model_calls);
                tracing::warn!("{}: turn {item_id}: {why}", run.label);
                result = Err(TurnEnd::Failed(format!("turn {item_id}: {why}")));
                break;
            }
            let call_started = now_rfc3339();
            let t0 = Instant::now();
            // A sub-agent's model call ends when its calling turn's call time does.
            let completion = match shares.sub_agent_deadline() {
                None => self.call_llm(&run.label, &run.models, &request).await,
                Some(deadline) => {
                    let call = self.call_llm(&run.label, &run.models, &request);
                    match tokio::time::timeout_at(deadline.into(), call).await {
                        Ok(completion) => completion,
                        Err(_) => {
                            let why = format!(
                                "turn {item_id}: stopped: the calling turn's tool calls took \
                                 their {} s together, the most one turn's calls may \
                                 (--max-turn-call-seconds)",
                                shares.call_time.total().as_secs()
                            );
                            tracing::warn!("{}: {why}", run.label);
                            result = Err(TurnEnd::Failed(why));
                            break;
                        }
                    }
                }
            };
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
                    self.emit_llm_call(&run.label, &record);
                    conv.llm_calls.push(record);
                    if self.cancelled() || self.cancel_calls.is_cancelled() {
                        result = Err(TurnEnd::Stopped);
                        break;
                    }
                    // The provider's error names the provider; the model and the attempts
                    // made say what was tried before giving up.
                    let tried = match completion.attempts.last() {
                        Some(last) => {
                            let n = completion.attempts.len();
                            format!(
                                " (model `{}`, {n} attempt{})",
                                last.model,
                                if n == 1 { "" } else { "s" }
                            )
                        }
                        None => String::new(),
                    };
                    result = Err(TurnEnd::Failed(format!(
                        "turn {item_id}: LLM call failed{tried}: {e}"
                    )));
                    break;
                }
            };
            // What the host keeps of an answer (in the conversation, the turn log and the
            // session, each a copy) counts toward the run's kept bytes, as tool results do;
            // so do the host's answers to its calls past the answer's limit (each a result
            // and a record kept, and sent back to the model every round).
            let past_limit = response
                .tool_calls
                .len()
                .saturating_sub(self.budgets.calls_per_answer.max(1));
            let answer_bytes = response
                .text
                .len()
                .saturating_add(
                    response
                        .tool_calls
                        .iter()
                        .map(|c| c.id.len() + c.name.len() + c.arguments.len())
                        .sum::<usize>(),
                )
                .saturating_add(past_limit.saturating_mul(super::budget::NOT_RUN_KEPT_BYTES));
            if let Err(end) = self.keep("the model's answer", answer_bytes) {
                let why = end.reason();
                record.status = Status::Failed;
                record.error = Some(why.clone());
                self.emit_llm_call(&run.label, &record);
                conv.llm_calls.push(record);
                result = Err(TurnEnd::Failed(format!("turn {item_id}: {why}")));
                break;
            }
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
            self.emit_llm_call(&run.label, &record);
            conv.llm_calls.push(record);
            let mut response = response;
            if last_call {
                // Tools were not offered: calls asked for anyway are not run, and not kept
                // in the conversation (no results would follow them).
                response.tool_calls.clear();
            }
            run.history.push(Message::assistant(&response));
            if response.tool_calls.is_empty() {
                // A message that arrived while the model answered keeps the turn going.
                let pending = match &self.steering {
                    Some(steering) if run.depth == 0 => steering.finish_turn(Phase::Preparing),
                    _ => Vec::new(),
                };
                if pending.is_empty() || last_call {
                    result = Ok(TurnOk {
                        text: response.text.clone(),
                    });
                    break;
                }
                run.history.extend(pending.into_iter().map(Message::user));
                continue;
            }
            self.steer_phase(run, Phase::ToolCalls);
            if let Err(end) = run.settle_earlier_writes() {
                result = Err(end);
                break;
            }
            let calls = TurnCalls {
                grant,
                parallel,
                slots: &slots,
                shares: &shares,
            };
            let (records, refused) = self.tool_calls(run, &response.tool_calls, &calls).await;
            let ran = records.len() - refused;
            for (n, (r, content)) in records.into_iter().enumerate() {
                // The calls not run are one event, so an answer of many cannot flood the
                // observers (and the lines printed for them).
                if n < ran {
                    self.observer.emit(RunEvent::ToolCall {
                        step_id: run.label.clone(),
                        call_id: r.tool_call_id.clone(),
                        tool: r.tool_name.clone(),
                        arguments: event_arguments(&r.args),
                        error: r.error.clone(),
                        duration_ms: r.duration_ms,
                    });
                }
                run.history
                    .push(Message::tool_result(r.tool_call_id.clone(), content));
                conv.tool_calls.push(r);
            }
            if refused > 0 {
                self.observer.emit(RunEvent::ToolCallsRefused {
                    step_id: run.label.clone(),
                    asked: response.tool_calls.len(),
                    refused,
                    budget: self.budgets.calls_per_answer.max(1),
                });
            }
            self.take_steering(run);
        }
        self.steer_phase(run, Phase::Preparing);
        conv.messages = run.history[first_message..]
            .iter()
            .map(|m| serde_json::to_value(m).unwrap_or(Value::Null))
            .collect();
        let (status, error) = entry_outcome(&result, None);
        let summary = TurnSummary::from_calls(
            &conv,
            item_id,
            status,
            error,
            started_at,
            now_rfc3339(),
            started.elapsed().as_millis() as u64,
        );
        if let Err(e) = write_turn_logs(&run.ws.fs, &run.logs, &summary, &conv) {
            tracing::warn!("{}: turn {item_id}: writing the turn logs: {e}", run.label);
        }
        let _ = run.checkpoint_session();
        let ok = result?;
        let (failed_reason, concerns) = scan_reply(&ok.text);
        run.concerns.extend(concerns);
        run.final_text = Some(ok.text);
        // A foreach row's or a gate repair's reply does not end the step (the original
        // ignores the marker there; the gate judges a repair).
        if let Some(reason) = failed_reason
            && run.status_marker_ends
        {
            return Err(TurnEnd::Failed(reason));
        }
        Ok(())
    }

    pub(super) fn emit_llm_call(&self, step_id: &str, record: &LlmCallRecord) {
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

    /// The tool calls of one LLM response, with the content each gives the model, in the
    /// order asked, and how many of them (the last ones) were not run. The first
    /// `calls_per_answer` run; the rest are answered with an error saying so. Plugin tools run in parallel (at most `concurrent_calls` at once) unless
    /// `parallel` is off; `call_sub_agent` calls run after them, one at a time (a route's
    /// conversation is one conversation). Each result is made the model's content as its
    /// call ends (offloaded, or refused past the turn's result bytes), so a large result is
    /// not held while the others run.
    pub(super) async fn tool_calls(
        &self,
        run: &Run<'_>,
        calls: &[ToolCall],
        turn: &TurnCalls<'_>,
    ) -> (Vec<(ToolCallRecord, String)>, usize) {
        let budget = self.budgets.calls_per_answer.max(1);
        let (to_run, refused) = calls.split_at(calls.len().min(budget));
        if !refused.is_empty() {
            tracing::warn!(
                "{}: one answer asked for {} tool calls: {} not run (--max-calls-per-answer {budget})",
                run.label,
                calls.len(),
                refused.len()
            );
        }
        let is_delegation = |c: &ToolCall| {
            trellis_sandbox::plugins::normalize_tool_name(c.name.trim()) == CALL_SUB_AGENT
                && run.policy.host.allows(DELEGATION_CATEGORY, CALL_SUB_AGENT)
        };
        // The calls of the round not started yet: one starting takes at most an equal
        // share of the time left among those that may run beside it.
        let pending = std::sync::atomic::AtomicUsize::new(
            to_run.iter().filter(|c| !is_delegation(c)).count(),
        );
        let at_once = if turn.parallel {
            self.budgets.concurrent_calls.max(1)
        } else {
            1
        };
        let plugin_calls = to_run.iter().filter(|c| !is_delegation(c)).map(|c| async {
            let record = {
                let _slot = turn.slots.acquire().await;
                let share = pending
                    .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
                    .clamp(1, at_once);
                self.tool_call_within(
                    &run.policy,
                    c,
                    turn.grant,
                    &turn.shares.db_budget,
                    &turn.shares.call_time,
                    share,
                )
                .await
            };
            kept(run, record, &turn.shares.result_bytes)
        });
        let mut plugin_records = if turn.parallel {
            futures::future::join_all(plugin_calls).await
        } else {
            let mut out = Vec::new();
            for c in plugin_calls {
                out.push(c.await);
            }
            out
        }
        .into_iter();
        let mut records = Vec::with_capacity(calls.len());
        for c in to_run {
            if is_delegation(c) {
                let record = self.sub_agent_call(run, c, turn.shares).await;
                records.push(kept(run, record, &turn.shares.result_bytes));
            } else if let Some(r) = plugin_records.next() {
                records.push(r);
            }
        }
        for (i, c) in refused.iter().enumerate() {
            // The first says why in full; the rest point to it.
            let error = match i {
                0 => super::budget::not_run(calls.len(), budget),
                _ => super::budget::not_run_either(budget),
            };
            let now = now_rfc3339();
            let record = ToolCallRecord {
                tool_call_id: c.id.clone(),
                tool_name: c.name.clone(),
                args: Value::Null,
                result: None,
                error: Some(error.clone()),
                duration_ms: 0,
                started_at: now.clone(),
                completed_at: now,
                unsandboxed: false,
            };
            records.push((record, format!("error: {error}")));
        }
        (records, refused.len())
    }

    /// How long `call` may take on its own: an external server's tool
    /// [`crate::mcp_servers::EXTERNAL_CALL_TIMEOUT`], the rest a plugin call's deadline.
    fn call_deadline(&self, call: &ToolCall) -> std::time::Duration {
        let external = self
            .mcp
            .as_deref()
            .is_some_and(|m| m.server_of(&call.name).is_some());
        if external {
            crate::mcp_servers::EXTERNAL_CALL_TIMEOUT
        } else {
            self.limits.timeout
        }
    }

    /// [`Self::tool_call`] within what is left of the turn's call time: its deadline is no
    /// later than its `share` of it (the calls that may run beside it share what is left),
    /// and its time is taken from it; not run when less than a second is left.
    async fn tool_call_within(
        &self,
        policy: &ToolPolicy,
        call: &ToolCall,
        grant: &TurnGrant,
        db_budget: &DbWriteBudget,
        time: &CallTime,
        share: usize,
    ) -> ToolCallRecord {
        // A call with less than a second left would only fail at its deadline: not run.
        let deadline = self.call_deadline(call);
        let Some(held) = time.hold(deadline, MIN_CALL_TIME.min(deadline), share) else {
            let args = parse_arguments(&call.arguments);
            return tool_record(call, args, Err(time.spent()), now_rfc3339(), Instant::now());
        };
        let limits = Limits {
            timeout: held,
            ..self.limits
        };
        let t0 = Instant::now();
        let record = self
            .tool_call_limited(policy, call, grant, db_budget, &limits)
            .await;
        time.settle(held, t0.elapsed());
        record
    }

    /// One tool call under `limits`, never failing: errors land in the record.
    async fn tool_call_limited(
        &self,
        policy: &ToolPolicy,
        call: &ToolCall,
        grant: &TurnGrant,
        db_budget: &DbWriteBudget,
        limits: &Limits,
    ) -> ToolCallRecord {
        let started_at = now_rfc3339();
        let t0 = Instant::now();
        let args = parse_arguments(&call.arguments);
        let external = self
            .mcp
            .as_deref()
            .and_then(|m| m.server_of(&call.name).map(|key| (m, key)));
        let outcome: Result<Value, String> = match &args {
            Err(e) => Err(e.clone()),
            Ok(a) if let Some((mcp, key)) = external => {
                let tool = call.name.split_once(':').map_or("", |(_, t)| t);
                if policy.plugins.names_server(key) && policy.plugins.allows(key, tool) {
                    // The run's second stop ends the call at once (the server's answer, if
                    // any comes, is dropped).
                    tokio::select! {
                        answer = mcp.call(&call.name, a.clone(), limits.output_bytes) => answer,
                        () = self.cancel_calls.cancelled() => {
                            Err("the call was cancelled".to_string())
                        }
                        () = tokio::time::sleep(limits.timeout) => Err(format!(
                            "the call was stopped after {} s, {}",
                            limits.timeout.as_secs(),
                            if limits.timeout < self.call_deadline(call) {
                                "what this turn's tool calls had left (--max-turn-call-seconds)"
                            } else {
                                "an external server's call's deadline"
                            }
                        )),
                    }
                } else {
                    Err(format!(
                        "tool {:?} is not available in this step",
                        call.name
                    ))
                }
            }
            Ok(a) if let Some(tool) = db_tools::db_tool(&call.name) => {
                db_tools::call(
                    tool,
                    a.clone(),
                    grant.grant.db().cloned(),
                    limits,
                    db_budget,
                )
                .await
            }
            Ok(_) if !policy.plugins.allows_full_name(&call.name) => Err(format!(
                "tool {:?} is not available in this step",
                call.name
            )),
            Ok(a) => self
                .registry
                .call_tool_cancellable(
                    &call.name,
                    a,
                    &grant.grant.clone().with_turn_writes(db_budget),
                    limits,
                    &self.cancel_calls,
                )
                .await
                .map_err(|e| e.to_string()),
        };
        let mut record = tool_record(call, args, outcome, started_at, t0);
        record.unsandboxed = external.is_some();
        record
    }
}

/// The record of a tool call that started at `started_at` (`t0`) and ended now.
pub(super) fn tool_record(
    call: &ToolCall,
    args: Result<Value, String>,
    outcome: Result<Value, String>,
    started_at: String,
    t0: Instant,
) -> ToolCallRecord {
    ToolCallRecord {
        tool_call_id: call.id.clone(),
        tool_name: call.name.clone(),
        args: args.unwrap_or(Value::Null),
        result: outcome.as_ref().ok().cloned(),
        error: outcome.err(),
        duration_ms: t0.elapsed().as_millis() as u64,
        started_at,
        completed_at: now_rfc3339(),
        unsandboxed: false,
    }
}

/// The least time a call of a turn is started with ([`CallTime`]).
pub(super) const MIN_CALL_TIME: std::time::Duration = std::time::Duration::from_secs(1);

/// What the tool calls of one round share: the turn's grant and budgets.
pub(super) struct TurnCalls<'t> {
    pub(super) grant: &'t TurnGrant,
    pub(super) parallel: bool,
    pub(super) slots: &'t Semaphore,
    pub(super) shares: &'t Arc<TurnShares>,
}

pub(super) fn parse_arguments(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_str(text).map_err(|e| format!("the arguments are not JSON: {e}"))
}

/// The `STATUS: FAILED` reason and the `CONCERNS:` lines of a reply. Both markers match
/// at the start of a line without regard to case or spaces (`Status : failed`,
/// `concerns:`), as the original reads them.
pub fn scan_reply(text: &str) -> (Option<String>, Vec<String>) {
    let mut failed = None;
    let mut concerns = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = strip_marker(line, "STATUS:FAILED") {
            let reason = rest.trim_start_matches([':', ' ', '-']).trim();
            failed.get_or_insert_with(|| {
                if reason.is_empty() {
                    "the agent reported STATUS: FAILED".to_string()
                } else {
                    reason.to_string()
                }
            });
        } else if let Some(rest) = strip_marker(line, "CONCERNS:") {
            let rest = rest.trim();
            if !rest.is_empty() {
                concerns.push(rest.to_string());
            }
        }
    }
    (failed, concerns)
}

/// The rest of `line` after `marker` (written without spaces), matched without regard to
/// ASCII case and with any whitespace between its characters.
fn strip_marker<'l>(line: &'l str, marker: &str) -> Option<&'l str> {
    let mut want = marker.chars().peekable();
    for (i, c) in line.char_indices() {
        let Some(&m) = want.peek() else {
            return Some(&line[i..]);
        };
        if c.is_whitespace() {
            continue;
        }
        if !c.eq_ignore_ascii_case(&m) {
            return None;
        }
        want.next();
    }
    want.peek().is_none().then_some("")
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
        let (failed, concerns) =
            scan_reply("Status : failed - no rows\nconcerns: odd\nSTATUS:FAILED");
        assert_eq!(failed.as_deref(), Some("no rows"));
        assert_eq!(concerns, vec!["odd"]);
        assert_eq!(scan_reply("STATUS: FAILING tests fixed").0, None);
        assert_eq!(
            scan_reply("status:failed").0.as_deref(),
            Some("the agent reported STATUS: FAILED")
        );
    }
}
