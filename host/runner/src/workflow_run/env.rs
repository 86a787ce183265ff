//! What the steps of a run share ([`RunEnv`]): the plugins, the bounds and retries of every
//! call, the stop flag, the observer, the models, and the script runner and external MCP
//! servers a run starts, with the step runner made from them for each step.

use super::*;

/// What the steps of a run share: the plugins, the bounds of every call, the stop flag, the
/// observer of run events and how the models are reached.
#[derive(Debug)]
pub struct RunEnv<'a> {
    /// The plugins.
    pub registry: &'a PluginRegistry,
    /// Bounds of every plugin call.
    pub limits: Limits,
    /// Retries of LLM calls.
    pub retry: RetryPolicy,
    /// Set to stop at the next boundary (the session records `stopped`).
    pub cancel: Arc<AtomicBool>,
    /// Cancelled with `cancel` by whoever stops the run: ends the tool calls in flight.
    pub cancel_calls: tokio_util::sync::CancellationToken,
    /// Receives the events of every step.
    pub observer: Observer,
    /// The models of the steps.
    pub llm: LlmSetup,
    /// Messages sent to the running step's agent from outside, if anyone may send them.
    pub steering: Option<Arc<Steering>>,
    /// Where a `human_input` step without an answer asks for one and waits; without it,
    /// every answer is needed up front.
    pub human: Option<Arc<crate::human_inputs::HumanInputs>>,
    /// Tool rounds a turn may take before it must answer.
    pub max_tool_rounds: usize,
    /// The budgets of every turn (tool calls per answer, calls at once, result bytes) and
    /// the model calls of the whole run.
    pub turn_budgets: crate::driver::TurnBudgets,
    /// The model calls the run made, all its steps together.
    model_calls: Arc<crate::driver::ModelCalls>,
    /// The external MCP servers the operator configured (none by default).
    pub mcp_config: Arc<McpConfig>,
    /// Starts the servers a run names: the front end's MCP client (none by default).
    pub tool_servers: Arc<dyn ServerStarter>,
    /// The servers the run started, while it runs.
    pub(super) mcp: Mutex<Option<Arc<dyn ToolServers>>>,
    /// Runs the scripts of scripted steps; made on the first one.
    scripts: OnceLock<Arc<ScriptRunner>>,
    /// Runs the agent steps elsewhere (`trellis worker`s), when set.
    pub dispatch: Option<Arc<dyn crate::dispatch::StepDispatch>>,
    /// What substituting variables added to the plan's texts so far in this run.
    substituted: std::sync::atomic::AtomicUsize,
    /// Steps run so far in this run, all groups together ([`super::MAX_RUN_STEPS`]).
    steps_run: std::sync::atomic::AtomicUsize,
}

impl<'a> RunEnv<'a> {
    /// Default limits and retries, no observer, a fresh stop flag; models may name only
    /// the LLM providers of `registry`.
    pub fn new(registry: &'a PluginRegistry, llm: LlmSetup) -> Self {
        let llm = llm.with_providers(registry.llm_provider_ids());
        RunEnv {
            registry,
            limits: Limits::default(),
            retry: RetryPolicy::default(),
            cancel: Arc::new(AtomicBool::new(false)),
            cancel_calls: tokio_util::sync::CancellationToken::new(),
            observer: Observer::default(),
            llm,
            steering: None,
            human: None,
            max_tool_rounds: crate::driver::DEFAULT_MAX_TOOL_ROUNDS,
            turn_budgets: crate::driver::TurnBudgets::default(),
            model_calls: Arc::default(),
            mcp_config: Arc::new(McpConfig::empty()),
            tool_servers: Arc::new(NoServers),
            mcp: Mutex::new(None),
            scripts: OnceLock::new(),
            dispatch: None,
            substituted: Default::default(),
            steps_run: Default::default(),
        }
    }

    /// Counts `grown` bytes of substitution against the run's
    /// [`trellis_workflow::substitution::MAX_RUN_GROWTH`]; an error past it.
    pub fn take_substituted(&self, grown: usize) -> Result<()> {
        use trellis_workflow::substitution::{MAX_RUN_GROWTH, RunOversized};
        let before = self
            .substituted
            .fetch_add(grown, std::sync::atomic::Ordering::SeqCst);
        let total = before.saturating_add(grown);
        if total > MAX_RUN_GROWTH {
            return Err(RunOversized { grown: total }.into());
        }
        Ok(())
    }

    /// The script runner of the run's scripted steps (spec section 7).
    pub fn scripts(&self) -> Result<Arc<ScriptRunner>> {
        if let Some(scripts) = self.scripts.get() {
            return Ok(scripts.clone());
        }
        let scripts = Arc::new(ScriptRunner::new(self.registry.engine())?);
        Ok(self.scripts.get_or_init(|| scripts).clone())
    }

    /// The runner of step `step_id` of `ws`: its models (primary, then fallbacks, with their
    /// options and the shared cassette position under replay), the models of its routes'
    /// sub-agents ([`LlmSetup::own_step_llm`]), the stop flag, the observer and the recorder
    /// of the run. A step with no model gets a runner with no target.
    pub fn step_runner(&self, ws: &Workspace, step_id: &str) -> Result<StepRunner<'a>> {
        let mut runner = match self.llm.step_llm(ws, step_id)? {
            Some(llm) => {
                let runner = StepRunner::new(self.registry, llm.targets, self.limits)
                    .with_target_options(llm.options);
                match llm.replay {
                    Some(cursor) => runner.with_replay(cursor),
                    None => runner,
                }
            }
            None => StepRunner::new(self.registry, Vec::new(), self.limits),
        }
        .with_model_resolver(self.sub_agent_models())
        .with_retry(self.retry)
        .with_max_tool_rounds(self.max_tool_rounds)
        .with_turn_budgets(self.turn_budgets)
        .with_model_calls(self.model_calls.clone())
        .with_cancel(self.cancel.clone())
        .with_cancel_calls(self.cancel_calls.clone())
        .with_observer(self.observer.clone())
        .with_step_ends_behind();
        if let Some(steering) = &self.steering {
            runner = runner.with_steering(steering.clone());
        }
        if let Some(recorder) = self.llm.recorder() {
            runner = runner.with_recorder(recorder.clone());
        }
        let mcp = self.mcp.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(servers) = mcp {
            runner = runner.with_mcp_servers(servers);
        }
        Ok(runner)
    }

    /// The models of a route's sub-agent step: its own when its step config chooses them,
    /// else (`None`) its parent's. Cassette positions are shared with the steps'.
    fn sub_agent_models(&self) -> ModelResolver {
        let llm = self.llm.clone();
        Arc::new(move |ws: &Workspace, step_id: &str| {
            Ok(llm.own_step_llm(ws, step_id)?.map(|own| AgentModels {
                targets: own.targets,
                options: own.options,
                replay: own.replay,
            }))
        })
    }

    /// Begins a run of the workspace at `root` within the run's budgets
    /// ([`crate::driver::ModelCalls::begin_run`]): `Err` says why it may not, its workspace at
    /// its quota.
    pub fn begin_run(&self, root: &std::path::Path) -> Result<(), String> {
        self.model_calls
            .begin_run(&self.turn_budgets, self.limits.fs, root)
    }

    /// What the whole run may write ([`crate::driver::ModelCalls::run_writes`]).
    pub(super) fn run_writes(
        &self,
        root: &std::path::Path,
    ) -> trellis_sandbox::capabilities::DbWriteBudget {
        self.model_calls
            .run_writes(&self.turn_budgets, self.limits.fs, root)
    }

    /// Counts one more step run; an error once the run ran [`super::MAX_RUN_STEPS`].
    pub(super) fn take_step_run(&self) -> Result<()> {
        take_step_run(&self.steps_run, super::MAX_RUN_STEPS)
    }

    pub(super) fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    /// Why no later group starts ([`Self::out_of_model_calls`], [`Self::out_of_kept_bytes`]).
    pub(super) fn spent(&self) -> Option<String> {
        if self.out_of_model_calls() {
            Some(format!(
                "the run made its {} model calls, the limit of one run (--max-model-calls)",
                self.turn_budgets.run_model_calls
            ))
        } else if self.out_of_kept_bytes() {
            Some("what the run keeps reached its budget (--max-run-result-mib)".to_string())
        } else {
            None
        }
    }

    /// Counts the run's model calls in `calls`, shared with whoever else holds it.
    pub fn share_model_calls(&mut self, calls: Arc<crate::driver::ModelCalls>) {
        self.model_calls = calls;
    }

    /// Whether the run made all the model calls it may: no later step or group starts.
    pub(super) fn out_of_model_calls(&self) -> bool {
        self.model_calls.spent(self.turn_budgets.run_model_calls)
    }

    /// Whether a turn ended the run for what it would keep (`--max-run-result-mib`).
    pub(super) fn out_of_kept_bytes(&self) -> bool {
        self.model_calls.kept_out()
    }
}

/// Counts one more step run in `runs`; an error once `max` were run.
fn take_step_run(runs: &std::sync::atomic::AtomicUsize, max: usize) -> Result<()> {
    if runs.fetch_add(1, Ordering::SeqCst) >= max {
        anyhow::bail!(
            "more than {max} steps run in this run, all its groups together: run fewer groups \
             at once (--group)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each group ran up to 1,000 steps, each writing a few files of the host's, and
    /// nothing bounded groups times steps (round 30): one count for the whole run.
    #[test]
    fn the_steps_of_a_run_are_bounded_over_its_groups() {
        let runs = std::sync::atomic::AtomicUsize::new(0);
        for _ in 0..3 {
            take_step_run(&runs, 3).unwrap();
        }
        let err = take_step_run(&runs, 3).unwrap_err().to_string();
        assert!(err.contains("more than 3 steps run in this run"), "{err}");
    }
}
