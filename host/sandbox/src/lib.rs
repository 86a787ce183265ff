//! The Trellis sandbox: runs one call into a WebAssembly component under a grant and limits.
//!
//! Trellis runs agent workflows whose every extension point (tools, validators, LLM
//! providers, step scripts) is a WebAssembly component. This crate is the part of the host
//! that loads and calls them; it knows nothing of workflows. A call takes an `InstancePre`,
//! a [`Grant`] (folders, database), an HTTP policy and [`Limits`], and returns a value or
//! one [`CallFailure`](call::CallFailure); tools, validators, LLM providers and step scripts
//! all run through [`call::run`].
//!
//! - [`engine`]: the one wasmtime engine, its limits and its compiled-component cache.
//! - [`capabilities`]: grants (folders a call may see, read-only or read-write) and limits.
//! - [`call`]: the one call path (store builder, deadline, failure sorting); [`output`]: the
//!   head-and-tail stdout/stderr sink; [`state`]: the store data of one call and its memory
//!   limiter.
//! - [`slices`]: the capabilities fs, db, http and log, each linked once; a world's linker
//!   is the list of its slices.
//! - [`plugins`]: manifests, loading, the registry, and calling tools, validators and providers.
//! - [`llm`]: LLM requests and responses, the HTTP gate of provider plugins, the operator's
//!   key approvals, retries, fallbacks and cassettes.
//! - [`script`]: step scripts (`main.py` in the Python script runner, or a `main.wasm`
//!   command component) under a grant made by the caller.
//! - [`bundled`]: plugins compiled into the binary.
//! - [`store`]: workspace files through cap-std, atomic writes, the write-behind writer.

pub mod answers;
pub mod bundled;
pub(crate) mod call;
pub mod capabilities;
pub mod connections;
pub mod cut;
pub mod engine;
pub mod heap;
pub mod json_values;
pub mod llm;
pub(crate) mod output;
pub mod plugins;
pub mod script;
pub(crate) mod slices;
pub(crate) mod state;
pub mod store;
/// Hooks for this workspace's tests, built only with the `test-hooks` feature.
#[cfg(any(test, feature = "test-hooks"))]
#[doc(hidden)]
pub mod test_hooks {
    pub use crate::slices::fs::guard::hook::{BetweenCheckAndOpen, between_check_and_open};
}
// The skip of the integration tests (`tests/all/support/skip.rs`), for unit tests that
// cannot run as another user.
#[cfg(test)]
#[path = "../../../tests/all/support/skip.rs"]
mod test_skip;

pub(crate) use call::{CallFailure, CallFuture};
pub use capabilities::{Access, Grant, Limits};
pub use engine::{CacheSetting, Engine};
pub use plugins::{PluginRegistry, ToolCallError};
