//! Write Trellis plugins in Rust.
//!
//! A Trellis plugin is a WebAssembly component built for `wasm32-wasip2`. This crate
//! hides the component-model plumbing behind one trait per world and an export
//! macro, so a tool plugin is about a dozen lines (its crate also depends on
//! `serde` and `schemars`):
//!
//! ```rust,ignore
//! use trellis_plugin_sdk::{serde_json::{Value, json}, tool::{ToolError, TypedTool}};
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Echo {
//!     /// The text to return.
//!     text: String,
//! }
//!
//! impl TypedTool for Echo {
//!     const NAME: &str = "echo";
//!     const DESCRIPTION: &str = "Returns its input.";
//!     type Args = Self;
//!     fn run(args: Self) -> Result<Value, ToolError> {
//!         Ok(json!({ "text": args.text }))
//!     }
//! }
//!
//! trellis_plugin_sdk::export_tools!(Echo);
//! ```
//!
//! - [`tool`]: [`TypedTool`](tool::TypedTool) and [`export_tools!`] (the arguments'
//!   schema derived from their type), or the untyped [`ToolPlugin`](tool::ToolPlugin)
//!   and [`export_tool_plugin!`], for the `tool-plugin` world.
//! - [`validator`]: [`ValidatorPlugin`](validator::ValidatorPlugin) and
//!   [`export_validator_plugin!`] for the `validator-plugin` world.
//! - [`llm`]: [`LlmProvider`](llm::LlmProvider), [`export_llm_provider!`], a blocking
//!   HTTP client over `wasi:http` that can read a response as it arrives, a parser of
//!   server-sent events and [`llm::reply`] for the `llm-provider` world (at 0.3.0, where a
//!   provider may stream its reply).
//! - [`log`] and [`db`]: the services the host gives every plugin.
//!
//! A plugin's filesystem is exactly the folders granted to the current call, each
//! mounted at its workspace-relative path with a leading `/` (for example
//! `/knowledgebase/notes`), so plain `std::fs` works and anything else does not exist.

pub mod db;
pub mod llm;
pub mod log;
pub mod tool;
pub mod validator;

pub use schemars;
pub use serde;
pub use serde_json;

/// Generated bindings; public only because the export macros expand in the
/// plugin's crate and must name them.
#[doc(hidden)]
#[allow(
    missing_docs,
    reason = "generated from the WIT, which documents every item"
)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit/trellis-plugin@0.1.0",
        world: "tool-plugin",
        pub_export_macro: true,
        default_bindings_module: "trellis_plugin_sdk::bindings",
        export_macro_name: "__export_tool_world",
    });

    /// The validator world, sharing the host interface types with the tool world
    /// so `log` has one `LogLevel` for both.
    pub mod validator_world {
        wit_bindgen::generate!({
            path: "../../wit/trellis-plugin@0.1.0",
            world: "validator-plugin",
            pub_export_macro: true,
            default_bindings_module: "trellis_plugin_sdk::bindings::validator_world",
            export_macro_name: "__export_validator_world",
            with: {
                "trellis:plugin/host@0.1.0": crate::bindings::trellis::plugin::host,
                "trellis:plugin/types@0.1.0": crate::bindings::trellis::plugin::types,
            },
        });
    }

    /// The LLM provider world of `trellis:plugin@0.3.0`: `wasi:http` and `reply`, through
    /// which a provider shows its reply as it reads it. (Its `log` is the 0.1.0 one of the
    /// other worlds, which the host gives every plugin.)
    pub mod llm_world {
        wit_bindgen::generate!({
            path: "../../wit/trellis-plugin@0.3.0",
            world: "llm-provider",
            pub_export_macro: true,
            default_bindings_module: "trellis_plugin_sdk::bindings::llm_world",
            export_macro_name: "__export_llm_world",
            generate_all,
        });
    }
}
