//! The runtime facade: start, watch, steer and stop runs in the background.
//!
//! Every front end (`trellis run`, and later the builder, a server, MCP) starts work here and
//! follows it through an [`ExecutionId`]: [`Runtime::start_workflow`] and
//! [`Runtime::start_step`] return at once; [`Runtime::status`], [`Runtime::events`],
//! [`Runtime::send_message`], [`Runtime::stop`] and [`Runtime::list`] work on what runs.
//!
//! An execution runs on a thread of its own with a single-threaded async runtime, so a run
//! needs nothing `Send` from the code it drives, and a slow event reader never slows another
//! execution. Its events are kept for the execution's lifetime, so a reader that comes late
//! sees them from the start.
//!
//! One process per workspace ([`crate::workspace_lock`]), but many executions in it: the
//! executions of one runtime on one workspace share one OS lock, taken by the first and let
//! go by the last (or by the last [`WorkspaceHold`], which a front end such as the builder
//! keeps for a whole session). Another process still finds the workspace busy.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use crate::events::{Observer, RunEvent};
use crate::llm_choice::LlmSetup;
use crate::steering::{Delivery, DeliveryStatus, Phase, Steering};
use crate::workflow_run::{RunOptions, WorkflowRun};
use crate::workspace_lock::WorkspaceLock;
use trellis_sandbox::Limits;
use trellis_sandbox::llm::RetryPolicy;
use trellis_sandbox::plugins::PluginRegistry;

mod admission;
mod execute;
mod types;

pub use admission::{DEFAULT_MAX_RUNNING, Refused};
pub use execute::panic_message;
use execute::{finish, run_in_thread};
pub use types::{ExecutionEvent, ExecutionId, ExecutionInfo, ExecutionKind, ExecutionStatus};

/// How to run: the run's selection and inputs, its models, and the bounds of every call.
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// Steps, group and inputs (the step of [`Runtime::start_step`] is set by it).
    pub run: RunOptions,
    /// The models of the steps.
    pub llm: LlmSetup,
    /// Bounds of every plugin call.
    pub limits: Limits,
    /// Retries of LLM calls.
    pub retry: RetryPolicy,
    /// Tool rounds a turn may take before it must answer.
    pub max_tool_rounds: usize,
    /// The budgets of every turn (tool calls per answer, calls at once, result bytes).
    pub turn_budgets: crate::driver::TurnBudgets,
    /// Sees the run's events too, as they happen (after the execution's own event stream).
    pub observer: Observer,
    /// When another process holds the workspace (see [`crate::workspace_lock`]): wait for
    /// it to let go, rather than fail at once.
    pub wait_for_workspace: bool,
    /// A message for the step's agent, read with the user message of its first turn (the
    /// builder's `execute_step` instructions). A step without an agent (a script, a routing
    /// or human_input step) never reads it.
    pub instructions: Option<String>,
    /// The external MCP servers the operator configured.
    pub mcp_config: Arc<crate::mcp_servers::McpConfig>,
    /// Starts the servers a run names: the front end's MCP client (`trellis_mcp::client`);
    /// by default none, and a run naming a server fails in its preflight.
    pub tool_servers: Arc<dyn crate::mcp_servers::ServerStarter>,
    /// A `human_input` step whose answer is not in `run.inputs` asks for it and waits
    /// ([`Runtime::answer_input`]), rather than the run being refused up front.
    pub ask_for_inputs: bool,
    /// The count of model calls the run takes from, when it shares one (a builder session
    /// counts its executions' calls with its own, up to `turn_budgets.run_model_calls`);
    /// else the run counts its own.
    pub model_calls: Option<Arc<crate::driver::ModelCalls>>,
    /// Runs the agent steps elsewhere (`trellis worker`s), when set.
    pub dispatch: Option<Arc<dyn crate::dispatch::StepDispatch>>,
}

impl StartOptions {
    /// Default limits, retries and tool rounds.
    pub fn new(run: RunOptions, llm: LlmSetup) -> Self {
        StartOptions {
            run,
            llm,
            limits: Limits::default(),
            retry: RetryPolicy::default(),
            max_tool_rounds: crate::driver::DEFAULT_MAX_TOOL_ROUNDS,
            turn_budgets: crate::driver::TurnBudgets::default(),
            observer: Observer::default(),
            wait_for_workspace: false,
            instructions: None,
            mcp_config: Arc::new(crate::mcp_servers::McpConfig::empty()),
            tool_servers: Arc::new(crate::mcp_servers::NoServers),
            ask_for_inputs: false,
            model_calls: None,
            dispatch: None,
        }
    }
}

/// The runtime: the plugins, and every execution started on them.
#[derive(Debug, Clone)]
pub struct Runtime {
    registry: Arc<PluginRegistry>,
    executions: Arc<Mutex<BTreeMap<ExecutionId, Arc<Execution>>>>,
    next: Arc<AtomicU64>,
    /// The last number given per step (`exec-<step>-<n>`), and to whole workflows (`""`).
    numbers: Arc<Mutex<BTreeMap<String, u64>>>,
    holds: Arc<Mutex<Holds>>,
    /// Held while an admitted start checks what runs and starts ([`Runtime::start_admitted`]).
    admit: Arc<Mutex<()>>,
}

/// The workspaces this runtime holds: the OS lock of each, and how many holders share it.
type Holds = BTreeMap<PathBuf, (usize, WorkspaceLock)>;

/// A share of this runtime's lock of one workspace: while any share lives, the runtime's
/// executions on that workspace reuse the lock and other processes are refused. The last
/// share dropped lets the OS lock go.
#[derive(Debug)]
pub struct WorkspaceHold {
    holds: Arc<Mutex<Holds>>,
    key: PathBuf,
}

impl Drop for WorkspaceHold {
    fn drop(&mut self) {
        // Counted and released under the map's lock: a holder arriving at the same moment
        // either shares the lock or takes it afresh, never meets a lock being let go.
        let mut holds = self.holds.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((count, _)) = holds.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                holds.remove(&self.key);
            }
        }
    }
}

/// How long a holder waiting for another process tries again.
const HOLD_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// A share of the lock of `workspace` in `holds`: the runtime's own when it has one, else
/// the OS lock taken now. With `wait`, waits for another process to let go until the flag
/// it carries is set; without, fails at once naming the holder.
fn share_workspace(
    holds: &Arc<Mutex<Holds>>,
    workspace: &Path,
    wait: Option<&AtomicBool>,
) -> anyhow::Result<WorkspaceHold> {
    let key = workspace
        .canonicalize()
        .unwrap_or_else(|_| workspace.to_path_buf());
    loop {
        {
            let mut map = holds.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((count, _)) = map.get_mut(&key) {
                *count += 1;
                return Ok(WorkspaceHold {
                    holds: holds.clone(),
                    key,
                });
            }
            match wait {
                None => {
                    let lock = WorkspaceLock::try_acquire(workspace)?;
                    map.insert(key.clone(), (1, lock));
                    return Ok(WorkspaceHold {
                        holds: holds.clone(),
                        key,
                    });
                }
                Some(_) => {
                    if let Some(lock) = WorkspaceLock::try_acquire_free(workspace)? {
                        map.insert(key.clone(), (1, lock));
                        return Ok(WorkspaceHold {
                            holds: holds.clone(),
                            key,
                        });
                    }
                }
            }
        }
        if wait.is_some_and(|cancel| cancel.load(Ordering::SeqCst)) {
            let holder = crate::workspace_lock::holder_of(workspace)
                .map(|h| h.to_string())
                .unwrap_or_else(|| "another process".to_string());
            anyhow::bail!(
                "stopped while waiting for workspace {} (in use by {holder})",
                workspace.display()
            );
        }
        std::thread::sleep(HOLD_POLL);
    }
}

/// Events kept per execution, at most: a run longer than this keeps its latest.
const KEPT_EVENTS: usize = 100_000;
/// Bytes of events kept per execution, at most (as JSON): a tool call's arguments, a
/// worker's events are as long as a model or a worker makes them.
const KEPT_EVENT_BYTES: usize = 64 << 20;

/// Bytes of a message sent to an execution its event keeps.
const EVENT_MESSAGE_BYTES: usize = 1024;

#[derive(Debug)]
struct Execution {
    /// Its place in the order executions started.
    seq: u64,
    info: Mutex<ExecutionInfo>,
    cancel: Arc<AtomicBool>,
    /// Cancelled with `cancel`: ends the tool calls in flight.
    cancel_calls: tokio_util::sync::CancellationToken,
    steering: Arc<Steering>,
    /// Where its `human_input` steps wait for answers, when it was started to ask.
    human: Option<Arc<crate::human_inputs::HumanInputs>>,
    log: Mutex<EventLog>,
    sender: broadcast::Sender<ExecutionEvent>,
    outcome: Mutex<Option<Result<WorkflowRun, String>>>,
    /// The steps started and not yet ended (kept from the events, which the log may drop).
    steps: Mutex<BTreeSet<String>>,
}

#[derive(Debug, Default)]
struct EventLog {
    kept: VecDeque<ExecutionEvent>,
    /// The size of each event kept, and of all of them.
    sizes: VecDeque<usize>,
    bytes: usize,
    ended: bool,
}

impl Execution {
    fn publish(&self, event: ExecutionEvent) {
        match &event {
            ExecutionEvent::Run(RunEvent::StepStarted { step_id, .. }) => {
                let mut steps = self.steps.lock().unwrap_or_else(|e| e.into_inner());
                steps.insert(step_id.clone());
            }
            ExecutionEvent::Run(RunEvent::StepEnded { step_id, .. }) => {
                let mut steps = self.steps.lock().unwrap_or_else(|e| e.into_inner());
                steps.remove(step_id);
            }
            _ => {}
        }
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(event, ExecutionEvent::End { .. }) {
            log.ended = true;
        }
        // The pieces of a reply are for those watching now: a late reader gets the whole
        // answer from the `LlmCall` that follows, and the pieces would crowd out the rest.
        if !matches!(event, ExecutionEvent::Run(RunEvent::Reply { .. })) {
            let size = match &event {
                ExecutionEvent::Run(run) => serde_json::to_vec(run).map_or(0, |v| v.len()),
                _ => 0,
            };
            while log.kept.len() == KEPT_EVENTS
                || (!log.kept.is_empty() && log.bytes.saturating_add(size) > KEPT_EVENT_BYTES)
            {
                log.kept.pop_front();
                let dropped = log.sizes.pop_front().unwrap_or(0);
                log.bytes = log.bytes.saturating_sub(dropped);
            }
            log.kept.push_back(event.clone());
            log.sizes.push_back(size);
            log.bytes = log.bytes.saturating_add(size);
        }
        // No reader is fine: the log keeps the event for later ones.
        let _ = self.sender.send(event);
    }

    fn status(&self) -> ExecutionStatus {
        self.info.lock().unwrap_or_else(|e| e.into_inner()).status
    }
}

/// The events of one execution: those already reported, then the new ones as they come.
#[derive(Debug)]
pub struct EventStream {
    backlog: VecDeque<ExecutionEvent>,
    live: Option<broadcast::Receiver<ExecutionEvent>>,
}

impl EventStream {
    /// The next event; `None` after [`ExecutionEvent::End`].
    pub async fn next(&mut self) -> Option<ExecutionEvent> {
        if let Some(event) = self.backlog.pop_front() {
            if matches!(event, ExecutionEvent::End { .. }) {
                self.live = None;
            }
            return Some(event);
        }
        let live = self.live.as_mut()?;
        loop {
            match live.recv().await {
                Ok(event) => {
                    if matches!(event, ExecutionEvent::End { .. }) {
                        self.live = None;
                    }
                    return Some(event);
                }
                // A reader that fell this far behind misses the oldest; it still gets the end.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => {
                    self.live = None;
                    return None;
                }
            }
        }
    }
}

impl Runtime {
    /// A runtime running on `registry`'s plugins.
    pub fn new(registry: Arc<PluginRegistry>) -> Self {
        Runtime {
            registry,
            executions: Arc::default(),
            next: Arc::new(AtomicU64::new(1)),
            numbers: Arc::default(),
            holds: Arc::default(),
            admit: Arc::default(),
        }
    }

    /// Holds `workspace` for this runtime until the hold is dropped: its executions there
    /// share the lock, and another process is refused (an error naming the holder when
    /// another process has it now).
    pub fn hold_workspace(&self, workspace: &Path) -> anyhow::Result<WorkspaceHold> {
        share_workspace(&self.holds, workspace, None)
    }

    /// The plugins.
    pub fn registry(&self) -> &PluginRegistry {
        &self.registry
    }

    /// The plugins, shared.
    pub fn shared_registry(&self) -> Arc<PluginRegistry> {
        self.registry.clone()
    }

    /// Starts the workflow at `workspace` in the background (see [`run_workflow`]).
    pub fn start_workflow(&self, workspace: &Path, options: StartOptions) -> ExecutionId {
        self.start(workspace, ExecutionKind::Workflow, options)
    }

    /// Starts step `step` of the workspace in the background, in the current run folder. When
    /// that step of that workspace is already running, returns the running execution's id.
    pub fn start_step(
        &self,
        workspace: &Path,
        step: &str,
        mut options: StartOptions,
    ) -> ExecutionId {
        let kind = ExecutionKind::Step(step.to_string());
        if let Some(running) = self.list().into_iter().find(|e| {
            e.status == ExecutionStatus::Running
                && e.kind == kind
                && same_folder(&e.workspace, workspace)
        }) {
            return running.id;
        }
        options.run.step = Some(step.to_string());
        self.start(workspace, kind, options)
    }

    fn start(&self, workspace: &Path, kind: ExecutionKind, options: StartOptions) -> ExecutionId {
        self.start_holding(workspace, kind, options, None)
    }

    /// [`Self::start`] with a hold of the workspace taken already, kept until the execution
    /// ends.
    fn start_holding(
        &self,
        workspace: &Path,
        kind: ExecutionKind,
        options: StartOptions,
        early: Option<WorkspaceHold>,
    ) -> ExecutionId {
        let key = match &kind {
            ExecutionKind::Step(step) => step.as_str(),
            ExecutionKind::Workflow => "",
        };
        let n = {
            let mut numbers = self.numbers.lock().unwrap_or_else(|e| e.into_inner());
            let n = numbers.entry(key.to_string()).or_insert(0);
            *n += 1;
            *n
        };
        let id = ExecutionId(match &kind {
            ExecutionKind::Step(step) => format!("exec-{step}-{n}"),
            ExecutionKind::Workflow => format!("workflow-full-{n}"),
        });
        let seq = self.next.fetch_add(1, Ordering::SeqCst);
        let (sender, _) = broadcast::channel(1024);
        let execution = Arc::new(Execution {
            seq,
            info: Mutex::new(ExecutionInfo {
                id: id.clone(),
                workspace: workspace.to_path_buf(),
                kind,
                status: ExecutionStatus::Running,
                waiting_for: None,
            }),
            human: options
                .ask_for_inputs
                .then(|| Arc::new(crate::human_inputs::HumanInputs::default())),
            cancel: Arc::new(AtomicBool::new(false)),
            cancel_calls: tokio_util::sync::CancellationToken::new(),
            steering: Arc::new(match &options.instructions {
                Some(text) => Steering::with_instructions(text.clone()),
                None => Steering::default(),
            }),
            log: Mutex::default(),
            sender,
            outcome: Mutex::new(None),
            steps: Mutex::default(),
        });
        self.executions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), execution.clone());
        let registry = self.registry.clone();
        let holds = self.holds.clone();
        let workspace = workspace.to_path_buf();
        let spawned = std::thread::Builder::new()
            .name(format!("trellis-{id}"))
            .spawn({
                let execution = execution.clone();
                move || run_in_thread(registry, holds, execution, workspace, options, early)
            });
        if let Err(e) = spawned {
            finish(
                &execution,
                Err(format!("starting the execution's thread: {e}")),
            );
        }
        id
    }

    /// The running whole-workflow execution of `workspace` that is running step `step` now.
    pub fn workflow_running_step(&self, workspace: &Path, step: &str) -> Option<ExecutionId> {
        let executions = self.executions.lock().unwrap_or_else(|e| e.into_inner());
        executions
            .values()
            .find(|e| {
                let info = e.info.lock().unwrap_or_else(|p| p.into_inner());
                info.status == ExecutionStatus::Running
                    && info.kind == ExecutionKind::Workflow
                    && same_folder(&info.workspace, workspace)
                    && e.steps
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .contains(step)
            })
            .map(|e| e.info.lock().unwrap_or_else(|p| p.into_inner()).id.clone())
    }

    /// Where execution `id` is; `None` for an id this runtime never gave.
    pub fn status(&self, id: &ExecutionId) -> Option<ExecutionStatus> {
        self.get(id).map(|e| e.status())
    }

    /// The events of execution `id`, from its first.
    pub fn events(&self, id: &ExecutionId) -> Option<EventStream> {
        let execution = self.get(id)?;
        let log = execution.log.lock().unwrap_or_else(|e| e.into_inner());
        // Subscribed under the log's lock: no event falls between the backlog and the feed.
        let live = (!log.ended).then(|| execution.sender.subscribe());
        Some(EventStream {
            backlog: log.kept.clone(),
            live,
        })
    }

    /// Sends `text` to the agent of execution `id` (see [`Steering`]): queued for its next
    /// LLM call when one is inside a turn, refused otherwise. Never starts or resumes work.
    pub fn send_message(&self, id: &ExecutionId, text: &str) -> Delivery {
        let Some(execution) = self.get(id) else {
            return Delivery {
                status: DeliveryStatus::NotRunning,
                phase: Phase::Finished,
            };
        };
        let delivery = if execution.status() == ExecutionStatus::Running {
            execution.steering.offer(text.to_string())
        } else {
            Delivery {
                status: DeliveryStatus::NotRunning,
                phase: Phase::Finished,
            }
        };
        // The event keeps the head of the message: it stays as long as the execution.
        let mut end = text.len().min(EVENT_MESSAGE_BYTES);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        execution.publish(ExecutionEvent::Delivery {
            text: text[..end].to_string(),
            delivery,
        });
        delivery
    }

    /// Forgets the executions that ended, but the newest `keep` of them: their events and
    /// outcome. A server that starts executions all day keeps a bounded number.
    pub fn forget_ended(&self, keep: usize) {
        let mut executions = self.executions.lock().unwrap_or_else(|e| e.into_inner());
        let mut ended: Vec<(u64, ExecutionId)> = executions
            .values()
            .filter(|e| e.status() != ExecutionStatus::Running)
            .map(|e| {
                (
                    e.seq,
                    e.info.lock().unwrap_or_else(|p| p.into_inner()).id.clone(),
                )
            })
            .collect();
        if ended.len() <= keep {
            return;
        }
        ended.sort_unstable();
        for (_, id) in &ended[..ended.len() - keep] {
            executions.remove(id);
        }
    }

    /// Asks execution `id` to stop at its next boundary (before an item, between foreach
    /// rows and tool rounds): a model reply in flight is dropped at once, a tool round in
    /// flight ends first. Returns whether it was running.
    pub fn stop(&self, id: &ExecutionId) -> bool {
        match self.get(id) {
            Some(execution) if execution.status() == ExecutionStatus::Running => {
                execution.cancel.store(true, Ordering::SeqCst);
                true
            }
            _ => false,
        }
    }

    /// [`Runtime::stop`], and the tool calls in flight are cancelled too: guest code running
    /// is interrupted at its next epoch tick, and each such call ends `cancelled`. Returns
    /// whether it was running.
    pub fn stop_now(&self, id: &ExecutionId) -> bool {
        match self.get(id) {
            Some(execution) if execution.status() == ExecutionStatus::Running => {
                execution.cancel.store(true, Ordering::SeqCst);
                execution.cancel_calls.cancel();
                true
            }
            _ => false,
        }
    }

    /// Answers the question execution `id` waits on (that of step `step_id`, when given):
    /// the question answered, or why the answer was not taken. `None` for an id this
    /// runtime does not know.
    pub fn answer_input(
        &self,
        id: &ExecutionId,
        step_id: Option<&str>,
        answer: &str,
    ) -> Option<Result<crate::human_inputs::Question, crate::human_inputs::AnswerRefused>> {
        let execution = self.get(id)?;
        Some(match &execution.human {
            Some(human) if execution.status() == ExecutionStatus::Running => {
                human.answer(step_id, answer)
            }
            _ => Err(crate::human_inputs::AnswerRefused::NotWaiting),
        })
    }

    /// Every execution this runtime started, oldest first.
    pub fn list(&self) -> Vec<ExecutionInfo> {
        let executions = self.executions.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<(u64, ExecutionInfo)> = executions
            .values()
            .map(|e| {
                let mut info = e.info.lock().unwrap_or_else(|p| p.into_inner()).clone();
                info.waiting_for = e.human.as_ref().and_then(|h| h.waiting());
                (e.seq, info)
            })
            .collect();
        all.sort_by_key(|(seq, _)| *seq);
        all.into_iter().map(|(_, info)| info).collect()
    }

    /// Waits for execution `id` to end and returns what it ran: the run, or the error of a
    /// broken setup. `None` for an unknown id.
    pub async fn wait(&self, id: &ExecutionId) -> Option<Result<WorkflowRun, String>> {
        let mut events = self.events(id)?;
        while events.next().await.is_some() {}
        let execution = self.get(id)?;
        let outcome = execution.outcome.lock().unwrap_or_else(|e| e.into_inner());
        outcome.clone()
    }

    fn get(&self, id: &ExecutionId) -> Option<Arc<Execution>> {
        self.executions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }
}

fn same_folder(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}
