//! An execution's thread: its run on a runtime of its own, holding its workspace, and its
//! end, published whatever happens.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::{
    Execution, ExecutionEvent, ExecutionStatus, Holds, StartOptions, WorkspaceHold, share_workspace,
};
use crate::events::{Observer, RunEvent};
use crate::steering::Phase;
use crate::workflow_run::{RunEnv, WorkflowRun, run_workflow};
use trellis_sandbox::plugins::PluginRegistry;

/// The body of an execution's thread: the run, then its end, which is published whatever
/// happens (a panic in the run ends the execution as failed with the panic's message, so
/// no one waiting for the end waits forever).
pub(super) fn run_in_thread(
    registry: Arc<PluginRegistry>,
    holds: Arc<Mutex<Holds>>,
    execution: Arc<Execution>,
    workspace: PathBuf,
    options: StartOptions,
    early: Option<WorkspaceHold>,
) {
    let run = std::panic::AssertUnwindSafe(|| {
        run_execution(&registry, &holds, &execution, &workspace, options, early)
    });
    let result = std::panic::catch_unwind(run).unwrap_or_else(|panic| {
        Err(format!(
            "the execution panicked: {}",
            panic_message(&*panic)
        ))
    });
    finish(&execution, result);
}

/// The message a panic was raised with (`panic!("...")`'s text).
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_string())
}

/// Runs the workflow of an execution, holding its workspace.
fn run_execution(
    registry: &Arc<PluginRegistry>,
    holds: &Arc<Mutex<Holds>>,
    execution: &Arc<Execution>,
    workspace: &Path,
    options: StartOptions,
    early: Option<WorkspaceHold>,
) -> Result<WorkflowRun, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the execution: {e}"))?;
    // One process per workspace: the lock is taken (or shared with this runtime's other
    // holders) before the run changes anything, and held until the run ends; this share is
    // let go before the end is published, so whoever waited for the end finds the workspace
    // free unless another holder of this runtime keeps it.
    let wait = options.wait_for_workspace.then_some(&*execution.cancel);
    let _lock = share_workspace(holds, workspace, wait).map_err(|e| format!("{e:#}"))?;
    // The hold its admission took is this execution's own share now.
    drop(early);
    runtime.block_on(async {
        let mut env = RunEnv::new(registry, options.llm);
        env.limits = options.limits;
        env.retry = options.retry;
        env.max_tool_rounds = options.max_tool_rounds;
        env.turn_budgets = options.turn_budgets;
        if let Some(calls) = &options.model_calls {
            env.share_model_calls(calls.clone());
        }
        env.mcp_config = options.mcp_config.clone();
        env.tool_servers = options.tool_servers.clone();
        env.dispatch = options.dispatch.clone();
        env.cancel = execution.cancel.clone();
        env.cancel_calls = execution.cancel_calls.clone();
        env.steering = Some(execution.steering.clone());
        env.human = execution.human.clone();
        env.observer = {
            let execution = execution.clone();
            let also = options.observer.clone();
            Observer::new(move |event: &RunEvent| {
                execution.publish(ExecutionEvent::Run(event.clone()));
                also.emit(event.clone());
            })
        };
        // A workspace at its quota begins nothing more: what the host writes for a run (its
        // logs, sessions, offloaded results) is not charged as it is written.
        env.begin_run(workspace)?;
        run_workflow(&env, workspace, &options.run)
            .await
            .map_err(|e| format!("{e:#}"))
    })
}

/// Records how an execution ended and publishes its last event.
pub(super) fn finish(execution: &Execution, result: Result<WorkflowRun, String>) {
    execution.steering.set_phase(Phase::Finished);
    let status = match &result {
        Ok(_) if execution.cancel.load(Ordering::SeqCst) => ExecutionStatus::Cancelled,
        Ok(run) if run.succeeded() => ExecutionStatus::Done,
        Ok(_) | Err(_) => ExecutionStatus::Failed,
    };
    // The end event is kept as long as the execution (a server keeps 200 ended ones).
    let error = match &result {
        Err(e) => Some(e.as_str()),
        Ok(run) => run.cut_short.as_deref(),
    }
    .map(|e| trellis_sandbox::cut::marked(e, crate::workflow_run::DETAIL_BYTES));
    let failure = match &result {
        Ok(run) if error.is_none() => run
            .failure()
            .map(|f| trellis_sandbox::cut::marked(&f, crate::workflow_run::DETAIL_BYTES)),
        _ => None,
    };
    *execution.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
    execution
        .info
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .status = status;
    execution.publish(ExecutionEvent::End {
        status,
        error,
        failure,
    });
}
