//! The fs slice: WASI 0.2 (filesystem, clocks, random, io, cli, sockets that refuse every
//! address), with `wasi:filesystem/types` replaced by the fenced one of
//! [`guard`].
//!
//! Per call it builds the WASI context from the grant (its folders as preopens, the
//! stdout/stderr sinks, nothing else) and the call's filesystem budget.

pub(crate) mod guard;
pub(crate) mod quota;

use std::sync::Arc;

use wasmtime::component::Linker;
use wasmtime_wasi::cli::StdoutStream;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::capabilities::{FsLimitExceeded, Grant, Limits};
use crate::state::CallState;
use guard::{FsBudget, GuardedFsView};

/// Links WASI with the fenced filesystem, once.
pub(crate) fn add_to_linker(linker: &mut Linker<CallState>) -> anyhow::Result<()> {
    guard::add_wasi_to_linker(linker)
}

/// The WASI context and filesystem budget of one call.
pub(crate) struct FsState {
    wasi: WasiCtx,
    budget: Arc<FsBudget>,
}

impl FsState {
    /// The grant's folders and nothing else; `extra` may add to the context (a script's
    /// environment, arguments and working directory: the `cli` part of its world). The
    /// call writes from `budget` when given (a command of a shell call, from the shell
    /// call's), else from a budget of its own.
    pub(crate) fn new(
        grant: &Grant,
        limits: &Limits,
        budget: Option<Arc<FsBudget>>,
        stdout: impl StdoutStream + 'static,
        stderr: impl StdoutStream + 'static,
        extra: impl FnOnce(&mut WasiCtxBuilder) -> anyhow::Result<()>,
    ) -> anyhow::Result<Self> {
        let mut builder = grant.wasi_builder(stdout, stderr)?;
        extra(&mut builder)?;
        Ok(FsState {
            wasi: builder.build(),
            budget: budget.unwrap_or_else(|| {
                FsBudget::for_folders_in(
                    limits.fs,
                    grant.folder_identities(),
                    grant.turn_writes().map(|turn| turn.0.clone()),
                )
            }),
        })
    }

    /// The filesystem limit the call went over, if any.
    pub(crate) fn exceeded(&self) -> Option<FsLimitExceeded> {
        self.budget.exceeded()
    }

    /// The call's write budget, shared with the database it may grow.
    pub(crate) fn budget(&self) -> Arc<FsBudget> {
        self.budget.clone()
    }
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.fs.wasi,
            table: &mut self.table,
        }
    }
}

impl GuardedFsView for CallState {
    fn fs_budget(&self) -> &Arc<FsBudget> {
        &self.fs.budget
    }
}
