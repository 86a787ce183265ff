//! Plugins compiled into the `trellis` binary, built from `plugins/` by the build script.

use crate::plugins::PluginKind;

mod components {
    include!(concat!(env!("OUT_DIR"), "/components.rs"));
}

/// A plugin shipped inside the binary.
#[derive(Debug)]
pub struct BundledPlugin {
    /// Plugin id.
    pub id: &'static str,
    /// Its world.
    pub kind: PluginKind,
    /// One line for listings.
    pub description: &'static str,
    /// The component.
    pub component: &'static [u8],
}

/// The id of the bundled shell, the one plugin whose calls may run commands.
pub const SHELL_ID: &str = "shell";

/// The utilities the shell's commands run as (a `wasi:cli` command whose first argument
/// names the utility), built from `plugins/shell/utilities`.
pub static SHELL_UTILITIES: &[u8] = components::SHELL_UTILITIES;

/// Every bundled plugin.
///
/// A `static`, like the components it points to: a `const` is copied into every place
/// that uses it, and the embedded components with it.
pub static PLUGINS: &[BundledPlugin] = &[
    BundledPlugin {
        id: "workspace",
        kind: PluginKind::Tool,
        description: "Read, write, list, search, patch, move and delete files in the folders granted to the turn.",
        component: components::WORKSPACE,
    },
    BundledPlugin {
        id: SHELL_ID,
        kind: PluginKind::Tool,
        description: "execute_shell_command: a bash-compatible shell with coreutils, grep, find, jq and diff, every command sandboxed under the turn's grant.",
        component: components::SHELL,
    },
    BundledPlugin {
        id: "csv",
        kind: PluginKind::Validator,
        description: "Checks CSV outputs (validation_type \"csv\"): header columns, row counts, per-column patterns, unique and non-empty columns.",
        component: components::CSV_VALIDATOR,
    },
    BundledPlugin {
        id: "openai",
        kind: PluginKind::LlmProvider,
        description: "OpenAI-compatible chat completions with tool calling (OpenAI, OpenRouter, Ollama, vLLM, llama.cpp).",
        component: components::OPENAI,
    },
    BundledPlugin {
        id: "anthropic",
        kind: PluginKind::LlmProvider,
        description: "The Anthropic Messages API with tool use (Claude models).",
        component: components::ANTHROPIC,
    },
    BundledPlugin {
        id: "replay",
        kind: PluginKind::LlmProvider,
        description: "Answers from a recorded cassette; shows the first difference when a request does not match.",
        component: components::REPLAY,
    },
];
