//! The `tool-plugin` world: tools an agent can call.
//!
//! Implement [`ToolPlugin`] on a unit struct and pass it to
//! [`export_tool_plugin!`](crate::export_tool_plugin). The SDK parses the JSON
//! arguments, answers `unknown-tool` for names that [`ToolPlugin::tools`] does not
//! list, and serializes the result.

use std::fmt;
use std::io;
use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::bindings::exports::trellis::plugin::tool::{Guest, ToolHints, ToolInfo};

/// Why a tool call did not produce a result; the agent sees it and can react.
pub use crate::bindings::exports::trellis::plugin::tool::ToolError;

/// WASI's `ENOTCAPABLE`: the path lies under none of the preopened folders, which in
/// Trellis means the call was not granted it. std has no `ErrorKind` for it.
const ENOTCAPABLE: i32 = 76;

/// One tool offered by a plugin: its name, a description written for the model,
/// the JSON Schema of its arguments and behaviour hints.
#[derive(Debug, Clone)]
pub struct Tool {
    name: String,
    description: String,
    input_schema: Value,
    hints: ToolHints,
}

impl Tool {
    /// A tool with no hints set. `name` is `snake_case`; the host offers it to the
    /// model as `plugin-id:name`. `input_schema` is a JSON Schema (draft 2020-12)
    /// for the arguments object; the host validates every call against it.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
    ) -> Self {
        Tool {
            name: name.into(),
            description: description.into(),
            input_schema,
            hints: ToolHints {
                read_only: false,
                destructive: false,
                idempotent: false,
            },
        }
    }

    /// Marks the tool as changing nothing outside its result (which also makes it
    /// idempotent).
    pub fn read_only(mut self) -> Self {
        self.hints.read_only = true;
        self.hints.idempotent = true;
        self
    }

    /// Marks the tool as able to delete or overwrite data.
    pub fn destructive(mut self) -> Self {
        self.hints.destructive = true;
        self
    }

    /// Marks the tool as having the effect of one call when called twice with the
    /// same arguments.
    pub fn idempotent(mut self) -> Self {
        self.hints.idempotent = true;
        self
    }

    /// The tool's name within the plugin.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl From<Tool> for ToolInfo {
    fn from(tool: Tool) -> Self {
        ToolInfo {
            name: tool.name,
            description: tool.description,
            input_schema: tool.input_schema.to_string(),
            hints: tool.hints,
        }
    }
}

/// A tool plugin. Both functions are associated functions because every call runs
/// in a fresh instance: there is no state to carry between calls.
pub trait ToolPlugin {
    /// Every tool the plugin offers. Called when the plugin is loaded, and by the
    /// SDK on each call to reject names not listed here.
    fn tools() -> Vec<Tool>;

    /// Runs tool `name` with its arguments object, already validated by the host
    /// against the tool's schema. `name` is always one of [`tools`](Self::tools).
    fn call(name: &str, args: Value) -> Result<Value, ToolError>;
}

/// Deserializes a tool's arguments object into a typed struct; a mismatch becomes
/// [`ToolError::InvalidArguments`] naming the problem.
pub fn from_args<T: DeserializeOwned>(args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args).map_err(|e| ToolError::InvalidArguments(e.to_string()))
}

impl ToolError {
    /// Maps an error from `std::fs` on `path` (as the agent wrote it) to the tool
    /// error the agent should see: missing paths are `not-found`; paths outside the
    /// call's grants, paths that leave a grant through `..` or a symbolic link, and
    /// writes to a read-only folder are `denied`; anything else is `failed`.
    ///
    /// WASI reports a write to a read-only grant and an escape through a link with
    /// the same code; this function names both. Use [`from_io_write`](Self::from_io_write)
    /// for operations that modify the path.
    pub fn from_io(path: &str, err: &io::Error) -> ToolError {
        Self::map_io(path, err, Access::Read)
    }

    /// Like [`from_io`](Self::from_io) for an operation that creates, changes or
    /// removes `path`, where a refusal inside the granted folders means the folder is
    /// read-only.
    pub fn from_io_write(path: &str, err: &io::Error) -> ToolError {
        Self::map_io(path, err, Access::Write)
    }

    fn map_io(path: &str, err: &io::Error, access: Access) -> ToolError {
        if err.raw_os_error() == Some(ENOTCAPABLE) {
            return ToolError::Denied(format!(
                "`{path}` is outside the folders granted to this call"
            ));
        }
        match (err.kind(), access) {
            (io::ErrorKind::NotFound, _) => ToolError::NotFound(format!("`{path}` does not exist")),
            (io::ErrorKind::ReadOnlyFilesystem, _)
            | (io::ErrorKind::PermissionDenied, Access::Write) => {
                ToolError::Denied(format!("`{path}` is in a read-only folder"))
            }
            (io::ErrorKind::PermissionDenied, Access::Read) => ToolError::Denied(format!(
                "`{path}` is outside the folders granted to this call \
                 (or a link inside them points outside)"
            )),
            (io::ErrorKind::IsADirectory, _) => {
                ToolError::Failed(format!("`{path}` is a folder, not a file"))
            }
            (io::ErrorKind::NotADirectory, _) => {
                ToolError::Failed(format!("a part of `{path}` is a file, not a folder"))
            }
            (io::ErrorKind::AlreadyExists, _) => {
                ToolError::Failed(format!("`{path}` already exists"))
            }
            (io::ErrorKind::DirectoryNotEmpty, _) => {
                ToolError::Failed(format!("`{path}` is a folder that is not empty"))
            }
            _ => ToolError::Failed(format!("`{path}`: {err}")),
        }
    }
}

#[derive(Clone, Copy)]
enum Access {
    Read,
    Write,
}

/// Bridges a [`ToolPlugin`] to the generated `Guest` trait; named by
/// [`export_tool_plugin!`](crate::export_tool_plugin) only.
#[doc(hidden)]
pub struct Adapter<P>(PhantomData<P>);

impl<P> fmt::Debug for Adapter<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Adapter")
    }
}

impl<P: ToolPlugin> Guest for Adapter<P> {
    fn list_tools() -> Vec<ToolInfo> {
        P::tools().into_iter().map(ToolInfo::from).collect()
    }

    fn call_tool(name: String, arguments: String) -> Result<String, ToolError> {
        if !P::tools().iter().any(|tool| tool.name == name) {
            return Err(ToolError::UnknownTool(name));
        }
        let args: Value = serde_json::from_str(&arguments).map_err(|e| {
            ToolError::InvalidArguments(format!("the arguments are not valid JSON: {e}"))
        })?;
        let result = P::call(&name, args)?;
        Ok(result.to_string())
    }
}

/// Exports a [`ToolPlugin`] as the plugin's `tool` interface. Use it once, at the
/// top level of a `cdylib` crate.
///
/// ```rust,ignore
/// trellis_plugin_sdk::export_tool_plugin!(Echo);
/// ```
#[macro_export]
macro_rules! export_tool_plugin {
    ($plugin:ty) => {
        // The generated export macro takes an identifier, not a generic type.
        #[doc(hidden)]
        type __TrellisToolPluginExport = $crate::tool::Adapter<$plugin>;
        $crate::bindings::__export_tool_world!(__TrellisToolPluginExport with_types_in $crate::bindings);
    };
}
