//! The builder's agent loop: one turn of model calls and tool calls until a plain reply
//! (`Agent::run_turn`), each tool call dispatched to its module with a guard against
//! panics, side agents started (`run_in_background`), and the specs of every tool.

use super::*;

impl Agent {
    /// Runs one turn on `history` (whose last message is the user's) in `mode`. Returns the
    /// report and the model, `provider:model`.
    pub(super) async fn run_turn(
        &self,
        mode: Mode,
        history: &mut Vec<Message>,
    ) -> Result<(TurnReport, String)> {
        let ws = workspace_for_model(&self.root)?;
        let llm: StepLlm = self.llm.builder_llm(&ws)?;
        let primary = llm
            .targets
            .first()
            .context("the builder's model has no target")?;
        let model = format!("{}:{}", primary.provider, primary.model);
        let mut specs = specs_of(mode);
        if self.is_side {
            specs.retain(|s| s.name != RUN_IN_BACKGROUND);
        }
        let tools: Vec<_> = specs.iter().map(ToolSpec::definition).collect();
        let mut usage = Usage::default();
        let mut tool_calls = 0;
        // Made once per turn, from the workspace as the turn finds it: what executions
        // started in this turn do meanwhile is not the state the turn began in.
        let system = system_prompt(&self.root, mode);
        // What the turn's tool results may add to the conversation, and what its calls may
        // write, all rounds together.
        let mut result_bytes_left = self.max_turn_result_bytes;
        // Within what the session and the executions it starts write together (their
        // `--max-run-write-mib`): a chain of completion turns cannot write a turn's budget
        // again and again.
        let writes = DbWriteBudget::within(
            trellis_sandbox::capabilities::FsLimits {
                write_bytes: self.max_turn_write_bytes,
                ..self.limits.fs
            },
            &self.model_calls.run_writes(
                &trellis_runner::driver::TurnBudgets::default(),
                self.limits.fs,
                &self.root,
            ),
        );
        let work = crate::TurnWork::default();
        for _ in 0..self.max_rounds {
            // The request carries the whole conversation: the oldest payloads are cut when
            // it outgrows what its file keeps, so it stays under the request cap too.
            crate::persist::fit(history, false);
            let mut messages = vec![Message::system(system.clone())];
            messages.extend(history.iter().cloned());
            let request = Request {
                model: primary.model.clone(),
                messages,
                tools: tools.clone(),
                options: llm.options.first().cloned().flatten().unwrap_or_default(),
            };
            let stopped = || TurnReport {
                text: String::new(),
                ended_normally: false,
                error: Some(crate::TURN_STOPPED.to_string()),
                tool_calls,
                usage,
            };
            if self.stop.is_stopped() {
                return Ok((stopped(), model));
            }
            let answer = tokio::select! {
                answer = self.call_llm(&llm, &request) => answer,
                () = self.stop.stopped() => return Ok((stopped(), model)),
            };
            let response = match answer {
                Ok(response) => response,
                Err(e) => {
                    let report = TurnReport {
                        text: String::new(),
                        ended_normally: false,
                        error: Some(format!("{model}: {e}")),
                        tool_calls,
                        usage,
                    };
                    return Ok((report, model));
                }
            };
            usage += response.usage;
            history.push(Message::assistant(&response));
            if !response.text.is_empty() {
                self.observer
                    .report(&BuilderEvent::AgentText(response.text.clone()));
            }
            if response.tool_calls.is_empty() {
                let report = TurnReport {
                    text: response.text,
                    ended_normally: true,
                    error: None,
                    tool_calls,
                    usage,
                };
                return Ok((report, model));
            }
            // One answer runs at most the per-answer budget of calls, as a step's agent does.
            let asked = response.tool_calls.len();
            for (i, call) in response.tool_calls.iter().enumerate() {
                let content = if self.stop.is_stopped() {
                    format!("error: not run: {}", crate::TURN_STOPPED)
                } else if i < DEFAULT_CALLS_PER_ANSWER {
                    tool_calls += 1;
                    let content = self.tool_call(mode, call, &writes, &work).await;
                    let len = u64::try_from(content.len()).unwrap_or(u64::MAX);
                    match result_bytes_left.checked_sub(len) {
                        Some(left) => {
                            result_bytes_left = left;
                            content
                        }
                        None => format!(
                            "error: result not kept: its {len} bytes would take this turn's \
                             tool results past their budget of {} MiB \
                             (--max-turn-result-mib); end this turn with what you have, or \
                             ask for smaller results (a line range, a narrower query)",
                            self.max_turn_result_bytes >> 20
                        ),
                    }
                } else {
                    format!("error: {}", not_run(asked, DEFAULT_CALLS_PER_ANSWER))
                };
                history.push(Message::tool_result(call.id.clone(), content));
            }
        }
        let report = TurnReport {
            text: String::new(),
            ended_normally: false,
            error: Some(format!(
                "the turn took {} tool rounds without answering",
                self.max_rounds
            )),
            tool_calls,
            usage,
        };
        Ok((report, model))
    }

    async fn call_llm(
        &self,
        llm: &StepLlm,
        request: &Request,
    ) -> Result<trellis_sandbox::llm::Response, String> {
        if !self.model_calls.take(self.max_model_calls) {
            return Err(format!(
                "the builder session made its {} model calls, the limit of one session \
                 (`trellis builder --max-model-calls N` sets it); no more are made",
                self.max_model_calls
            ));
        }
        let observer = self.observer.clone();
        let reply = trellis_sandbox::llm::ReplyStream::new(true, move |event| {
            observer.report(&BuilderEvent::Reply(event))
        });
        trellis_runner::llm_choice::complete(
            &self.registry,
            &llm.targets,
            &llm.options,
            llm.replay.as_ref(),
            self.llm.recorder().map(|r| r.as_ref()),
            request,
            &self.retry,
            &self.limits,
            Some(&reply),
        )
        .await
        .result
        .map_err(|e| e.to_string())
    }

    /// One tool call, never failing: what the model reads back.
    pub(super) async fn tool_call(
        &self,
        mode: Mode,
        call: &ToolCall,
        writes: &DbWriteBudget,
        turn: &crate::TurnWork,
    ) -> String {
        let arguments: Result<Value, String> = if call.arguments.trim().is_empty() {
            Ok(json!({}))
        } else {
            serde_json::from_str(&call.arguments)
                .map_err(|e| format!("the arguments are not JSON: {e}"))
        };
        self.observer.report(&BuilderEvent::ToolStarted {
            id: call.id.clone(),
            name: call.name.clone(),
            arguments: arguments
                .as_ref()
                .map(trellis_sandbox::cut::json_value)
                .unwrap_or(Value::Null),
        });
        let outcome = match arguments {
            Err(e) => Err(ToolFailure::new(e)),
            Ok(_) if !mode.allows(&call.name) => {
                Err(ToolFailure::new(modes::refusal(mode, &call.name)))
            }
            Ok(args) => self.dispatch(mode, &call.name, &args, writes, turn).await,
        };
        let (ok, summary, content) = match outcome {
            Ok(value) => (true, summarize(&value), value),
            Err(mut failure) => {
                failure.message =
                    trellis_sandbox::cut::marked(&failure.message, crate::MAX_ERROR_BYTES);
                (false, failure.message.clone(), failure.to_json())
            }
        };
        self.observer.report(&BuilderEvent::ToolEnded {
            id: call.id.clone(),
            name: call.name.clone(),
            ok,
            summary,
        });
        content.to_string()
    }

    /// Calls tool `name` within what the turn's calls may still do (`turn`), and charges it
    /// what the call did. A tool that panics answers a failure the model reads (`the tool
    /// panicked: ...`); the session goes on.
    pub(super) async fn dispatch(
        &self,
        mode: Mode,
        name: &str,
        args: &Value,
        writes: &DbWriteBudget,
        turn: &crate::TurnWork,
    ) -> crate::ToolResult {
        use futures::FutureExt;
        let work = turn.next_call()?;
        let started = std::time::Instant::now();
        let answer =
            std::panic::AssertUnwindSafe(self.dispatch_unguarded(mode, name, args, writes, &work))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    Err(ToolFailure::new(format!(
                        "the tool panicked: {}",
                        panic_message(&*panic)
                    )))
                });
        turn.charge(&work, started.elapsed());
        answer
    }

    async fn dispatch_unguarded(
        &self,
        mode: Mode,
        name: &str,
        args: &Value,
        writes: &DbWriteBudget,
        work: &Arc<HostWork>,
    ) -> crate::ToolResult {
        #[cfg(test)]
        if super::tests::PANIC_IN.with(|tool| tool.get()) == Some(name) {
            panic!("broken on purpose");
        }
        let ctx = ToolContext {
            root: &self.root,
            mode,
            registry: &self.registry,
            limits: &self.limits,
            turn_writes: writes,
            session_id: &self.session_id,
            observer: &self.observer,
            work,
        };
        if READ_TOOLS.contains(&name) {
            reads::call(&ctx, name, args).await
        } else if INSPECT_TOOLS.contains(&name) {
            crate::inspect::call(&ctx, name, args).await
        } else if DB_READ_TOOLS.contains(&name) || DB_WRITE_TOOLS.contains(&name) {
            crate::db::call(&ctx, name, args).await
        } else if name == "trigger_schedule" {
            crate::edits::trigger_schedule(&ctx, self.trigger.as_ref(), args)
        } else if PLAN_TOOLS.contains(&name)
            || CONFIG_TOOLS.contains(&name)
            || crate::modes::SCHEDULE_TOOLS.contains(&name)
        {
            edits::call(&ctx, name, args)
        } else if FILE_TOOLS.contains(&name) {
            files::call(&ctx, name, args).await
        } else if crate::modes::SHELL_TOOLS.contains(&name) {
            files::shell(&ctx, args).await
        } else if name == RUN_IN_BACKGROUND && self.is_side {
            Err(crate::ToolFailure::new(
                "a side agent cannot start side agents; do the work yourself",
            ))
        } else if name == RUN_IN_BACKGROUND {
            self.start_side_agent(mode, args)
        } else {
            self.executions.call(&ctx, name, args).await
        }
    }

    /// `run_in_background(name, instruction)`: a side agent with the mode's tools, on a
    /// thread of its own; its end is announced like an execution's.
    fn start_side_agent(&self, mode: Mode, args: &Value) -> crate::ToolResult {
        crate::reads::check_args(&run_in_background_spec(), args)?;
        let name = crate::tool::str_arg(args, "name")?;
        let instruction = crate::tool::str_arg(args, "instruction")?.to_string();
        // A side agent's turn keeps a share of a turn's tool results, so the session's turn
        // and its side agents at once hold at most twice a turn's (each keeping a whole
        // turn's, a turn and four side agents held 1.45 GB).
        let agent = Agent {
            is_side: true,
            max_turn_result_bytes: self.max_turn_result_bytes
                / crate::side_agents::MAX_RUNNING as u64,
            ..self.clone()
        };
        self.side.start(name, move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let mut history = vec![Message::user(instruction)];
                agent
                    .run_turn(mode, &mut history)
                    .await
                    .map(|(report, _)| report)
            })
        })
    }
}

/// Every builder tool's spec.
pub fn all_specs() -> Vec<ToolSpec> {
    let mut specs = reads::specs();
    specs.extend(crate::inspect::specs());
    specs.extend(crate::db::specs());
    specs.extend(edits::specs());
    specs.extend(files::specs());
    specs.push(files::shell_spec());
    specs.extend(Executions::specs());
    specs.push(run_in_background_spec());
    specs
}

/// The specs of the tools of `mode`, in the table's order.
pub fn specs_of(mode: Mode) -> Vec<ToolSpec> {
    let all = all_specs();
    mode.tools()
        .into_iter()
        .filter_map(|name| all.iter().find(|s| s.name == name).cloned())
        .collect()
}

/// A line saying what a tool answered.
fn summarize(value: &Value) -> String {
    let text = match value {
        Value::Object(map) => {
            let keys: Vec<String> = map
                .iter()
                .take(4)
                .map(|(k, v)| match v {
                    Value::String(s) => format!(
                        "{k}: {}",
                        s.lines()
                            .next()
                            .unwrap_or_default()
                            .chars()
                            .take(60)
                            .collect::<String>()
                    ),
                    Value::Bool(_) | Value::Number(_) => format!("{k}: {v}"),
                    Value::Array(a) => format!("{k}: [{} items]", a.len()),
                    _ => k.clone(),
                })
                .collect();
            keys.join(", ")
        }
        other => other.to_string(),
    };
    text.chars().take(160).collect()
}
