//! The one sandboxed-call path: [`run`] builds the store of one call (the grant's WASI
//! context, the memory limiter, the epoch deadline, the filesystem budget, the stdout and
//! stderr sinks, each slice's state from the grant), runs the call under an outer grace timeout, and sorts every failure into
//! one [`CallFailure`]. Tools, validators, LLM providers and step scripts all go through it;
//! each then words a failure for its own callers.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use wasmtime::component::{InstancePre, ResourceTable};
use wasmtime::{Store, Trap, UpdateDeadline};
use wasmtime_wasi::WasiCtxBuilder;

use super::output::OutputSink;
use super::slices::commands::{CommandHost, CommandsState, RootView, Within};
use super::slices::{db::DbState, fs::FsState, http::HttpState, log::LogState, reply::ReplyState};
use super::state::{CallState, MemoryLimit, MemoryLimitExceeded};
use crate::capabilities::{FsLimitExceeded, Grant, Limits};
use crate::engine::Engine;
use crate::llm::http::HttpPolicy;

/// How long past its deadline a call may take before the outer timeout drops it: the
/// epoch deadline stops guest code, this also covers time spent in async host calls.
const GRACE: Duration = Duration::from_millis(250);

/// How often a call that can be cancelled looks at its token while guest code runs, in epoch
/// ticks: a guest busy in a loop stops within this many ticks of the cancellation. It also
/// yields to the executor then, so calls busy on every worker thread of a server cannot keep
/// it from accepting and answering other requests.
const CANCEL_CHECK_TICKS: u64 = 2;

/// The future of one call into an instance, as the caller's closure returns it.
pub(crate) type CallFuture<'a, T> = Pin<Box<dyn Future<Output = wasmtime::Result<T>> + Send + 'a>>;

/// What one call may reach and use.
pub(crate) struct Call<'a> {
    /// Who is called, for logs: a plugin id, `script:<step>`.
    pub(crate) label: &'a str,
    /// Folders and database.
    pub(crate) grant: &'a Grant,
    /// Memory, deadline, stdio and filesystem bounds.
    pub(crate) limits: &'a Limits,
    /// The HTTP policy of a call that may send requests; `None` refuses them all.
    pub(crate) http: Option<HttpPolicy>,
    /// Stops the call when cancelled (the guest's code and its host calls alike).
    pub(crate) cancel: Option<&'a CancellationToken>,
    /// The commands the call may run (the bundled shell's only).
    pub(crate) commands: Option<Arc<CommandHost>>,
    /// A command run for a shell call: it writes from the shell call's filesystem budget,
    /// sees the shell call's `/`, and its stdout and stderr keep their first bytes whole
    /// (the next command of a pipe reads them) rather than a head and a tail.
    pub(crate) within: Option<Within>,
}

/// Why a call into a guest did not return normally.
#[derive(Debug)]
pub(crate) enum CallFailure {
    /// The call ran past its deadline (guest code, a host call or a database statement).
    Timeout(Duration),
    /// The caller cancelled the call before it finished.
    Cancelled,
    /// The instance asked for more memory and tables than its limit.
    Memory {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The guest overflowed its stack.
    StackOverflow,
    /// The call went over a filesystem limit.
    FsLimit(FsLimitExceeded),
    /// The guest exited through `wasi:cli/exit` (status 0 included).
    Exit {
        /// The status.
        code: i32,
        /// The error as wasmtime words it.
        message: String,
        /// What the guest wrote on stderr (head and tail).
        stderr: String,
    },
    /// The guest trapped (a panic, an out-of-bounds access, a bad component).
    Trap {
        /// What happened.
        message: String,
        /// What the guest wrote on stderr (head and tail).
        stderr: String,
    },
    /// The host could not set the call up (a granted folder is gone).
    Host(anyhow::Error),
}

/// A finished call: its result, and what the guest wrote on stdout and stderr.
pub(crate) struct Finished<T> {
    pub(crate) result: Result<T, CallFailure>,
    pub(crate) stdout: OutputSink,
    pub(crate) stderr: OutputSink,
}

/// Runs one call in a fresh store of `pre`: `wasi` may add to the grant's WASI context (a
/// script's environment, arguments and working directory), `f` instantiates and calls.
/// One store is built per call; nothing carries over from one call to the next.
pub(crate) async fn run<T, F>(
    engine: &Engine,
    pre: &InstancePre<CallState>,
    call: Call<'_>,
    wasi: impl FnOnce(&mut WasiCtxBuilder) -> anyhow::Result<()>,
    f: F,
) -> Finished<T>
where
    F: for<'a> FnOnce(&'a InstancePre<CallState>, &'a mut Store<CallState>) -> CallFuture<'a, T>,
{
    let limits = call.limits;
    let sink = |bytes| match call.within {
        Some(_) => OutputSink::head_only(bytes),
        None => OutputSink::new(bytes),
    };
    let stdout = sink(limits.stdio_bytes);
    let stderr = sink(limits.stdio_bytes);
    let finished = |result| Finished {
        result,
        stdout: stdout.clone(),
        stderr: stderr.clone(),
    };
    // A shell call and its commands see the grant's root at `/`.
    let root = match (&call.within, &call.commands) {
        (Some(within), _) => Some(within.root.clone()),
        (None, Some(_)) => match RootView::new(call.grant) {
            Ok(root) => Some(root),
            Err(err) => return finished(Err(CallFailure::Host(err))),
        },
        (None, None) => None,
    };
    let fs = FsState::new(
        call.grant,
        limits,
        call.within.as_ref().map(|w| w.budget.clone()),
        stdout.clone(),
        stderr.clone(),
        |builder| {
            if let Some(root) = &root {
                root.preopen(builder)?;
            }
            wasi(builder)
        },
    );
    let fs = match fs {
        Ok(fs) => fs,
        Err(err) => return finished(Err(CallFailure::Host(err))),
    };
    // A provider may log what an approved server echoed back: the key is hidden there too.
    let secrets = call
        .http
        .as_ref()
        .map(|policy| policy.secret_values())
        .unwrap_or_default();
    let db = DbState::new(call.grant.db().cloned(), limits.timeout, fs.budget());
    let commands = match (call.commands, root) {
        (Some(host), Some(root)) => {
            let within = Within {
                budget: fs.budget(),
                root,
            };
            CommandsState::new(host, call.grant, limits, within, call.cancel)
        }
        _ => CommandsState::none(),
    };
    let state = CallState {
        commands,
        table: ResourceTable::new(),
        memory: MemoryLimit::new(limits.memory_bytes),
        fs,
        db,
        http: HttpState::new(call.http),
        log: LogState::new(Arc::from(call.label), secrets),
        reply: ReplyState::default(),
    };
    let mut store = Store::new(engine.wasmtime(), state);
    store.limiter(|s| &mut s.memory);
    let ticks = Engine::ticks_for(limits.timeout);
    match call.cancel {
        None => {
            store.set_epoch_deadline(ticks);
            store.epoch_deadline_trap();
        }
        // The deadline is reached in steps, the token looked at on each: the same trap at the
        // same deadline, and an earlier one once the token is cancelled. Each step yields, so
        // the thread runs the server's other tasks in between.
        Some(cancel) => {
            let cancel = cancel.clone();
            let first = ticks.min(CANCEL_CHECK_TICKS);
            let mut left = ticks - first;
            store.set_epoch_deadline(first);
            store.epoch_deadline_callback(move |_| {
                if cancel.is_cancelled() || left == 0 {
                    return Ok(UpdateDeadline::Interrupt);
                }
                let next = left.min(CANCEL_CHECK_TICKS);
                left -= next;
                Ok(UpdateDeadline::Yield(next))
            });
        }
    }

    let call_future = tokio::time::timeout(limits.timeout + GRACE, f(pre, &mut store));
    // A cancelled call waiting in a host call is dropped there.
    let outcome = match call.cancel {
        None => Some(call_future.await),
        Some(cancel) => tokio::select! {
            outcome = call_future => Some(outcome),
            () = cancel.cancelled() => None,
        },
    };
    // A call that returned its value before the token was looked at stands.
    let cancelled = outcome.is_none()
        || (call.cancel.is_some_and(|c| c.is_cancelled()) && !matches!(outcome, Some(Ok(Ok(_)))));
    // Going over a limit is what ended the call, whatever the guest did after the error it
    // got.
    let result = if cancelled {
        Err(CallFailure::Cancelled)
    } else if let Some(exceeded) = store.data().fs.exceeded() {
        Err(CallFailure::FsLimit(exceeded))
    } else if store.data().db.deadline_hit() {
        Err(CallFailure::Timeout(limits.timeout))
    } else {
        match outcome {
            None => Err(CallFailure::Cancelled),
            Some(Err(_)) => Err(CallFailure::Timeout(limits.timeout)),
            Some(Ok(Ok(value))) => Ok(value),
            Some(Ok(Err(err))) => Err(classify(err, limits, store.data(), &stderr)),
        }
    };
    finished(result)
}

/// Sorts the error a call ended with into a [`CallFailure`].
fn classify(
    err: wasmtime::Error,
    limits: &Limits,
    state: &CallState,
    stderr: &OutputSink,
) -> CallFailure {
    if let Some(exit) = err.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return CallFailure::Exit {
            code: exit.0,
            message: format!("{err:#}"),
            stderr: stderr.text(),
        };
    }
    // The limiter's error is usually the one that surfaces, but a guest may turn a failed
    // allocation into a trap of its own: the flag catches both.
    if err.downcast_ref::<MemoryLimitExceeded>().is_some() || state.memory.exceeded.is_some() {
        return CallFailure::Memory {
            limit: limits.memory_bytes,
        };
    }
    let message = match err.downcast_ref::<Trap>().copied() {
        Some(Trap::Interrupt) => return CallFailure::Timeout(limits.timeout),
        Some(Trap::StackOverflow) => return CallFailure::StackOverflow,
        // The wasm backtrace is for plugin authors (trace logs); the user gets the trap.
        Some(Trap::MemoryOutOfBounds) => "wasm trap: out of bounds memory access (a stack \
             overflow in the guest, such as recursion too deep, ends this way too)"
            .to_string(),
        Some(Trap::UnreachableCodeReached) => {
            "wasm trap: unreachable code reached (a panic in the guest ends this way)".to_string()
        }
        Some(trap) => format!("wasm trap: {trap}"),
        None => format!("{err:#}"),
    };
    tracing::debug!(guest = %state.log.label, "call trapped: {err:?}");
    CallFailure::Trap {
        message,
        stderr: stderr.text(),
    }
}
