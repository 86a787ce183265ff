//! The Trellis runtime.
//!
//! Trellis runs agent workflows whose every extension point (tools,
//! validators, LLM providers, step scripts) is a WebAssembly component. This
//! crate is the host: the only code with ambient authority.
//!
//! - [`engine`]: the one wasmtime engine, its limits and its compiled-component cache.
//! - [`capabilities`]: grants (folders a call may see, read-only or read-write) and limits.
//! - [`plugins`]: manifests, loading, the registry, and calling tools.
//! - [`bundled`]: plugins compiled into the binary.

pub mod bundled;
pub mod capabilities;
pub mod engine;
pub mod plugins;

pub use capabilities::{Access, Grant, Limits};
pub use engine::{CacheSetting, Engine};
pub use plugins::{PluginRegistry, ToolCallError};
