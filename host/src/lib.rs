//! The Trellis runtime.
//!
//! Trellis runs agent workflows whose every extension point (tools,
//! validators, LLM providers, step scripts) is a WebAssembly component. This
//! crate is the host: the only code with ambient authority.
//!
//! - [`engine`]: the one wasmtime engine, its limits and its compiled-component cache.
//! - [`capabilities`]: grants (folders a call may see, read-only or read-write) and limits;
//!   [`capabilities::turn`] derives a turn's grant from `write_access`.
//! - [`plugins`]: manifests, loading, the registry, and calling tools, validators and providers.
//! - [`llm`]: LLM requests and responses, the HTTP gate of provider plugins, retries,
//!   fallbacks and cassettes.
//! - [`sequence`]: building blocks of the message-sequence driver: tool filters, foreach
//!   rows and templates, session and log files, run folders.
//! - `sandbox`: the one sandboxed-call path (store, limits, failures, output sink) that
//!   tools, validators, providers and scripts share; no workflow types inside.
//! - [`bundled`]: plugins compiled into the binary.
//! - [`script`]: step scripts (`code/<step-id>/main.py` or `main.wasm`) in a sandbox with the
//!   step's grant.
//! - [`workflow`]: `plan.json`, `step_config.json`, `workflow.json`, contracts and migrations.
//! - [`validation`]: the `validation_schema` gate and custom validator dispatch.
//! - [`store`]: workspace files through cap-std and atomic writes.

pub mod bundled;
pub mod capabilities;
pub mod engine;
pub mod llm;
pub mod plugins;
pub(crate) mod sandbox;
pub mod script;
pub mod sequence;
pub mod store;
pub mod validation;
pub mod workflow;

pub use capabilities::{Access, Grant, Limits};
pub use engine::{CacheSetting, Engine};
pub use plugins::{PluginRegistry, ToolCallError};
