//! Steps and whole workflows run in the background on the [`Runtime`]: started (at most once
//! per step at a time), watched, steered and stopped; their ends announced to the session.
//!
//! The tools are thin clients of the runtime. What they answer about an execution comes
//! from its [`trellis_runner::runtime::ExecutionEvent`]s, which a thread per execution reads as they
//! come ([`tracked`]): it keeps the execution's state (item, turn, tool calls, result) for
//! `query_step` and `list_executions`, reports a line per event to the session's observer,
//! and records the end for [`Executions::take_finished`]. The builder always works in
//! `iteration-0` (`iteration-0/<group>` with groups): a step runs there without rotating it,
//! a full run rotates it first, as `trellis run` does.
//!
//! Poll guard: `query_step` and `list_executions` share a 60 s budget; the third of them
//! in that window with nothing changed since (no event of any execution, no start) answers
//! only that nothing changed and that the turn should end: the session announces every end.

mod debug;
mod specs;
mod tracked;

pub use tracked::line as event_line;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::tool::{opt_str_arg, str_arg};
use super::{ToolContext, ToolFailure, ToolResult, ToolSpec};
use tracked::{Shared, Tracked};
use trellis_runner::runtime::{ExecutionKind, ExecutionStatus, Runtime, StartOptions};
use trellis_runner::workflow_run::{RunOptions, input_key, missing_inputs, select_groups};
use trellis_workflow::{StepKind, Workspace};

/// The time as the poll guard reads it; a test may move it on.
pub type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// The window the poll guard counts calls in.
pub const POLL_WINDOW: Duration = Duration::from_secs(60);

/// Polls with nothing changed a window allows before the guard answers instead.
const UNCHANGED_POLLS: usize = 2;

/// Tool-call arguments `query_step` shows, at most, in its list of calls (characters).
pub const ARGUMENTS_SHOWN: usize = 200;

/// An execution of the session that ended, for the synthetic turn announcing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The builder's id (`exec-<step>-<n>`, `workflow-full-<n>`).
    pub id: String,
    /// `done`, `failed` or `cancelled`.
    pub status: ExecutionStatus,
    /// What it did or why it failed, in a line.
    pub summary: String,
}

/// An execution of the session still running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    /// The builder's id.
    pub id: String,
    /// The step it runs, or `workflow` for a full run.
    pub target: String,
}

/// The executions of one builder session.
pub struct Executions {
    runtime: Runtime,
    template: StartOptions,
    shared: Arc<Shared>,
    clock: Clock,
    /// Executions running at once on the workspace a start may join (the server's
    /// `--max-executions`).
    max_running: usize,
}

impl std::fmt::Debug for Executions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executions")
            .field("runtime", &self.runtime)
            .finish_non_exhaustive()
    }
}

impl Executions {
    /// Executions started on `runtime` with what `trellis run` would use (`template`: the
    /// models, limits, retries and tool rounds; its selection is replaced per start). Each
    /// step runs on its own models, as in `trellis run`.
    pub fn new(runtime: Runtime, template: StartOptions) -> Self {
        Executions {
            runtime,
            template,
            shared: Arc::default(),
            clock: Arc::new(Instant::now),
            max_running: trellis_runner::runtime::DEFAULT_MAX_RUNNING,
        }
    }

    /// At most `n` executions running at once on the workspace for a start to join.
    pub fn with_max_running(mut self, n: usize) -> Self {
        self.max_running = n;
        self
    }

    /// Starts `kind` through the runtime's admission ([`Runtime::start_admitted`]): a refusal
    /// is the tool's failure, saying what runs and what to do.
    fn start_admitted(
        &self,
        root: &std::path::Path,
        kind: ExecutionKind,
        options: StartOptions,
    ) -> Result<trellis_runner::runtime::ExecutionId, ToolFailure> {
        use trellis_runner::runtime::Refused;
        self.runtime
            .start_admitted(root, kind, options, self.max_running)
            .map_err(|refused| match refused {
                Refused::Busy(why) => ToolFailure::new(format!("nothing started: {why}")),
                Refused::Full { running } => ToolFailure::new(format!(
                    "nothing started: {running} executions run on this workspace, the most at \
                     once ({}); end your turn and start more when they end",
                    self.max_running
                )),
            })
    }

    /// Counts the model calls of every execution in `calls`, up to `max` together: a builder
    /// session's own count, so that its executions cannot make more than the session may.
    pub fn share_model_calls(&mut self, calls: Arc<trellis_runner::driver::ModelCalls>, max: u64) {
        self.template.model_calls = Some(calls);
        self.template.turn_budgets.run_model_calls = max;
    }

    /// The same, with the poll guard reading `clock`.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The specs of the execution tools.
    pub fn specs() -> Vec<ToolSpec> {
        specs::specs()
    }

    /// Calls execution tool `name`.
    pub async fn call(&self, ctx: &ToolContext<'_>, name: &str, args: &Value) -> ToolResult {
        let spec = Self::specs()
            .into_iter()
            .find(|s| s.name == name)
            .ok_or_else(|| ToolFailure::new(format!("{name:?} is not an execution tool")))?;
        crate::reads::check_args(&spec, args)?;
        match name {
            "execute_step" => self.execute_step(ctx, args),
            "query_step" => self.query_step(args),
            "send_step_message" => self.send_step_message(args),
            "stop_step" => self.stop_step(args),
            "stop_all_executions" => Ok(self.stop_all()),
            "list_executions" => Ok(self.list_executions(args)),
            "run_full_workflow" => self.run_full_workflow(ctx, args),
            "debug_step" => debug::debug_step(ctx, &self.shared, args),
            _ => Err(ToolFailure::new(format!(
                "{name:?} is not an execution tool"
            ))),
        }
    }

    /// The executions that ended since the last call, oldest first.
    pub fn take_finished(&self) -> Vec<Finished> {
        self.shared.take_finished()
    }

    /// Waits until every execution this session started has ended.
    pub async fn wait_all(&self) {
        self.shared.wait_all().await
    }

    /// The executions still running, oldest first.
    pub fn running(&self) -> Vec<Running> {
        self.shared.running()
    }

    fn execute_step(&self, ctx: &ToolContext<'_>, args: &Value) -> ToolResult {
        let ws = open(ctx.root)?;
        let step = known_step(&ws, str_arg(args, "step_id")?)?;
        let step_id = step.id.as_str();
        let group = opt_str_arg(args, "group_name")?;
        check_group(&ws, group)?;
        let instructions = opt_str_arg(args, "instructions")?;
        let human_input = opt_str_arg(args, "human_input")?;
        let tier = match opt_str_arg(args, "tier")? {
            Some(name) => Some(tier_model(&ws, name)?),
            None => None,
        };
        let mut run = RunOptions {
            group: group.map(str::to_string),
            ..RunOptions::default()
        };
        match (&step.kind, human_input) {
            (StepKind::HumanInput(h), Some(answer)) => {
                run.inputs
                    .insert(input_key(step, h).to_string(), answer.to_string());
            }
            (StepKind::HumanInput(h), None) => {
                return Err(ToolFailure::new(format!(
                    "step {step_id:?} is a human_input step: give its answer in \
                     \"human_input\"{}",
                    h.question
                        .as_deref()
                        .map(|q| format!(" (it asks: {q})"))
                        .unwrap_or_default()
                )));
            }
            // Any other step takes it as high-priority context for its agent.
            (_, Some(text)) => {
                run.step_context
                    .insert(step_id.to_string(), text.to_string());
            }
            (_, None) => {}
        }
        if let Some(running) = self.shared.running_step(step_id) {
            return Ok(already_running(&running, instructions.is_some()));
        }
        // The step's output folder is the full run's now: a second run of it there would
        // empty and write it under the first.
        if self
            .runtime
            .workflow_running_step(ctx.root, step_id)
            .is_some()
        {
            return Err(ToolFailure::new(format!(
                "step {step_id:?} is running now in this workspace's full-workflow execution, \
                 in the same output folder: wait for that step to end (list_executions) or \
                 stop the execution first"
            )));
        }
        let mut options = self.template.clone();
        options.run = run;
        options.instructions = instructions.map(str::to_string);
        if let Some(model) = tier {
            options.llm = options.llm.with_tier_override(model);
        }
        let runtime_id =
            self.start_admitted(ctx.root, ExecutionKind::Step(step_id.to_string()), options)?;
        let target = ExecutionKind::Step(step_id.to_string());
        let (id, fresh) = self.shared.track(runtime_id, target, group);
        if !fresh {
            return Ok(already_running(&id, instructions.is_some()));
        }
        self.follow(ctx, &id);
        Ok(json!({"execution_id": id, "status": "running"}))
    }

    fn run_full_workflow(&self, ctx: &ToolContext<'_>, args: &Value) -> ToolResult {
        let ws = open(ctx.root)?;
        let group = opt_str_arg(args, "group_name")?;
        check_group(&ws, group)?;
        let mut run = RunOptions {
            group: group.map(str::to_string),
            ..RunOptions::default()
        };
        // Keyed by any step: a human_input step's answer, or high-priority context for the
        // agent of any other step (as the original system's run_full_workflow takes them).
        for (step_id, answer) in string_map(args, "human_inputs") {
            match ws.plan.find_step(&step_id).map(|s| (s, &s.kind)) {
                Some((step, StepKind::HumanInput(h))) => {
                    run.inputs
                        .insert(input_key(step, h).to_string(), answer.clone());
                }
                Some(_) => {
                    run.step_context.insert(step_id, answer);
                }
                None => {
                    let ids = all_step_ids(&ws);
                    return Err(ToolFailure::with_details(
                        format!(
                            "human_inputs: no step {step_id:?} in the plan; key each value by \
                             a step id (they are: {})",
                            ids.join(", ")
                        ),
                        json!({"valid_step_ids": ids}),
                    ));
                }
            }
        }
        for (step_id, route) in string_map(args, "route_selections") {
            let routes: Vec<&str> = match ws.plan.step(&step_id).map(|s| &s.kind) {
                Some(StepKind::Routing(r)) => {
                    r.routes.iter().map(|r| r.route_id.as_str()).collect()
                }
                _ => {
                    let routing: Vec<&str> = ws
                        .plan
                        .steps
                        .iter()
                        .filter(|s| matches!(s.kind, StepKind::Routing(_)))
                        .map(|s| s.id.as_str())
                        .collect();
                    return Err(ToolFailure::with_details(
                        format!(
                            "route_selections: {step_id:?} is not a routing step of the plan \
                             (they are: {})",
                            list_or_none(&routing)
                        ),
                        json!({"routing_step_ids": routing}),
                    ));
                }
            };
            // A route may be named by its id or by the step it goes to, when only one goes
            // there.
            let route = match ws.plan.step(&step_id).map(|s| &s.kind) {
                Some(StepKind::Routing(r)) if !routes.contains(&route.as_str()) => {
                    let going: Vec<&str> = r
                        .routes
                        .iter()
                        .filter(|x| x.next_step_id == route)
                        .map(|x| x.route_id.as_str())
                        .collect();
                    match going.as_slice() {
                        [one] => one.to_string(),
                        _ => route,
                    }
                }
                _ => route,
            };
            if !routes.contains(&route.as_str()) {
                return Err(ToolFailure::with_details(
                    format!(
                        "route_selections: step {step_id:?} has no route {route:?} (its routes: \
                         {})",
                        list_or_none(&routes)
                    ),
                    json!({"route_ids": routes}),
                ));
            }
            run.route_selections.insert(step_id, route);
        }
        let missing: Vec<Value> = missing_inputs(&ws, &run)
            .into_iter()
            .map(|(step, h)| json!({"step_id": step.id, "question": h.question}))
            .collect();
        if !missing.is_empty() {
            let ids: Vec<&str> = missing
                .iter()
                .filter_map(|m| m["step_id"].as_str())
                .collect();
            return Err(ToolFailure::with_details(
                format!(
                    "nothing started: human_input steps without an answer: {}; ask the \
                     operator, then give every answer in \"human_inputs\" (step id -> answer)",
                    ids.join(", ")
                ),
                json!({"missing_human_inputs": missing}),
            ));
        }
        if let Some(running) = self.shared.running_workflow() {
            return Ok(json!({
                "execution_id": running,
                "status": "running",
                "already_running": true,
                "message": "a full run of this session is already running: this is its id",
            }));
        }
        let mut options = self.template.clone();
        options.run = run;
        options.instructions = None;
        let runtime_id = self.start_admitted(ctx.root, ExecutionKind::Workflow, options)?;
        let (id, _) = self
            .shared
            .track(runtime_id, ExecutionKind::Workflow, group);
        self.follow(ctx, &id);
        let mut answer = json!({"execution_id": id, "status": "running"});
        if args.get("disable_eval").is_some() {
            answer["evaluation"] = json!(
                "no evaluation pass follows a run here; run the evaluation plan in eval mode"
            );
        }
        Ok(answer)
    }

    /// Starts the thread that reads the events of execution `id`.
    fn follow(&self, ctx: &ToolContext<'_>, id: &str) {
        tracked::follow(
            self.runtime.clone(),
            self.shared.clone(),
            id.to_string(),
            ctx.observer.clone(),
        );
    }

    fn query_step(&self, args: &Value) -> ToolResult {
        let execution_id = opt_str_arg(args, "execution_id")?;
        let step_id = opt_str_arg(args, "step_id")?;
        let tool_call_id = opt_str_arg(args, "tool_call_id")?;
        let tracked = match (execution_id, step_id) {
            (Some(id), _) => self.shared.get(id).ok_or_else(|| self.unknown(id))?,
            (None, Some(step)) => self.shared.latest_of_step(step).ok_or_else(|| {
                ToolFailure::with_details(
                    format!(
                        "no execution of step {step:?} in this session; start one with \
                         execute_step"
                    ),
                    json!({"execution_ids": self.shared.ids()}),
                )
            })?,
            (None, None) => {
                return Err(ToolFailure::new(
                    "give \"execution_id\" (from execute_step or list_executions) or \"step_id\"",
                ));
            }
        };
        if let Some(call) = tool_call_id {
            return tracked.tool_call(call);
        }
        if let Some(unchanged) = self.poll_guard() {
            return Ok(unchanged);
        }
        Ok(tracked.report())
    }

    fn list_executions(&self, args: &Value) -> Value {
        if let Some(unchanged) = self.poll_guard() {
            return unchanged;
        }
        let wanted = args
            .get("status")
            .or_else(|| args.get("status_filter"))
            .and_then(Value::as_str);
        let executions: Vec<Value> = self
            .shared
            .all()
            .iter()
            .filter(|t| wanted.is_none_or(|w| t.status.to_string() == w))
            .map(Tracked::listing)
            .collect();
        json!({"executions": executions})
    }

    fn send_step_message(&self, args: &Value) -> ToolResult {
        let id = str_arg(args, "execution_id")?;
        let message = str_arg(args, "message")?;
        let tracked = self.shared.get(id).ok_or_else(|| self.unknown(id))?;
        let delivery = self.runtime.send_message(&tracked.runtime_id, message);
        Ok(json!({
            "execution_id": id,
            "delivery_status": delivery.status.to_string(),
            "phase": delivery.phase.to_string(),
        }))
    }

    fn stop_step(&self, args: &Value) -> ToolResult {
        let id = str_arg(args, "execution_id")?;
        let tracked = self.shared.get(id).ok_or_else(|| self.unknown(id))?;
        if self.runtime.stop(&tracked.runtime_id) {
            Ok(json!({
                "execution_id": id,
                "status": "stopping",
                "message": "asked to stop at its next boundary (an LLM call in flight ends \
                            first); it ends as cancelled",
            }))
        } else {
            Ok(json!({
                "execution_id": id,
                "status": self.runtime.status(&tracked.runtime_id).map(|s| s.to_string()),
                "message": "it is not running: nothing to stop",
            }))
        }
    }

    /// Asks every running execution of the session to stop; answers `{stopping: [ids]}`.
    pub fn stop_all(&self) -> Value {
        let stopped: Vec<String> = self
            .shared
            .all()
            .into_iter()
            .filter(|t| self.runtime.stop(&t.runtime_id))
            .map(|t| t.id)
            .collect();
        json!({"stopping": stopped})
    }

    /// The guard's answer when this poll is the third in the window with nothing changed.
    fn poll_guard(&self) -> Option<Value> {
        let now = (self.clock)();
        self.shared.poll(now).then(|| {
            json!({
                "unchanged": true,
                "message": "nothing changed since your last checks. End your turn now: when \
                            an execution finishes, you get a message announcing it.",
            })
        })
    }

    fn unknown(&self, id: &str) -> ToolFailure {
        let ids = self.shared.ids();
        ToolFailure::with_details(
            format!(
                "no execution {id:?} in this session (its executions: {})",
                list_or_none(&ids.iter().map(String::as_str).collect::<Vec<_>>())
            ),
            json!({"execution_ids": ids}),
        )
    }
}

fn already_running(id: &str, with_instructions: bool) -> Value {
    let mut answer = json!({
        "execution_id": id,
        "status": "running",
        "already_running": true,
        "message": "this step is already running: this is its execution (nothing new started)",
    });
    if with_instructions {
        answer["message"] = json!(
            "this step is already running: this is its execution (nothing new started); \
             the instructions were not delivered: send them with send_step_message"
        );
    }
    answer
}

/// The workspace at `root`, or a failure with its diagnostics.
pub(super) fn open(root: &Path) -> Result<Workspace, ToolFailure> {
    Workspace::open(root).map_err(|d| ToolFailure::new(format!("the workspace has errors:\n{d}")))
}

/// Step `id` of the plan (on the main path, an orphan, or a route's sub-agent step), or the
/// step at a 1-based position on the main path (`"2"`, `"step-2"`, `"step2"`, `"step 2"`),
/// or a failure listing the valid ids.
pub(super) fn known_step<'w>(
    ws: &'w Workspace,
    id: &str,
) -> Result<&'w trellis_workflow::Step, ToolFailure> {
    if let Some(step) = ws.plan.find_step(id) {
        return Ok(step);
    }
    let lower = id.trim().to_ascii_lowercase();
    let number = ["step-", "step ", "step"]
        .iter()
        .find_map(|p| lower.strip_prefix(p))
        .unwrap_or(&lower);
    number
        .trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| ws.plan.steps.get(i))
        .ok_or_else(|| unknown_step(ws, id))
}

/// Every step id: the main path, the orphans, then the routes' sub-agent steps.
fn all_step_ids(ws: &Workspace) -> Vec<String> {
    fn within(step: &trellis_workflow::Step, out: &mut Vec<String>, depth: usize) {
        if depth > 8 {
            return;
        }
        for r in step.predefined_routes() {
            out.push(r.sub_agent_step.id.clone());
            within(&r.sub_agent_step, out, depth + 1);
        }
    }
    let mut ids: Vec<String> = ws.plan.all_steps().map(|s| s.id.clone()).collect();
    for s in ws.plan.all_steps() {
        within(s, &mut ids, 0);
    }
    ids
}

/// The failure for a step id the plan does not have: lists the valid ones, the orphan
/// steps and the routes' sub-agent steps (which run alone too) apart.
pub(super) fn unknown_step(ws: &Workspace, id: &str) -> ToolFailure {
    let ids: Vec<&str> = ws.plan.steps.iter().map(|s| s.id.as_str()).collect();
    let orphans: Vec<&str> = ws.plan.orphan_steps.iter().map(|s| s.id.as_str()).collect();
    let main_and_orphans = ids.len() + orphans.len();
    let sub_agents: Vec<String> = all_step_ids(ws).split_off(main_and_orphans);
    let mut text = format!(
        "no step {id:?} in the plan; its steps are: {} (or a 1-based position: \"1\", \
         \"step-1\")",
        list_or_none(&ids)
    );
    if !orphans.is_empty() {
        text.push_str(&format!("; orphan steps: {}", orphans.join(", ")));
    }
    if !sub_agents.is_empty() {
        text.push_str(&format!(
            "; route sub-agent steps: {}",
            sub_agents.join(", ")
        ));
    }
    ToolFailure::with_details(
        text,
        json!({"valid_step_ids": ids, "orphan_step_ids": orphans, "sub_agent_step_ids": sub_agents}),
    )
}

/// The model of tier `name` (`high`, `medium`, `low`) in workflow.json `tiers`.
fn tier_model(
    ws: &Workspace,
    name: &str,
) -> Result<trellis_workflow::step_config::LlmRef, ToolFailure> {
    ws.manifest.tiers.get(name).cloned().ok_or_else(|| {
        let known: Vec<&str> = ws.manifest.tiers.keys().map(String::as_str).collect();
        ToolFailure::new(format!(
            "tier {name:?}: workflow.json has no tiers.{name} (tiers defined: {})",
            list_or_none(&known)
        ))
    })
}

/// A failure when `group` is given and workflow.json has no such group.
fn check_group(ws: &Workspace, group: Option<&str>) -> Result<(), ToolFailure> {
    select_groups(ws, group)
        .map(|_| ())
        .map_err(|e| ToolFailure::new(format!("group_name: {e:#}")))
}

fn string_map(args: &Value, key: &str) -> BTreeMap<String, String> {
    args.get(key)
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect()
}

fn list_or_none(items: &[&str]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}
