//! The `tool-plugin` world: tools an agent can call.
//!
//! Declare each tool as a type implementing [`TypedTool`], with its arguments as a
//! struct deriving `Deserialize` and [`JsonSchema`]: the argument schema is derived
//! from that struct, so the arguments are declared once. Export the tools with
//! [`export_tools!`](crate::export_tools).
//!
//! The untyped API remains: implement [`ToolPlugin`] on a unit struct and pass it to
//! [`export_tool_plugin!`](crate::export_tool_plugin). Either way the SDK parses the
//! JSON arguments, answers `unknown-tool` for names that are not listed, and
//! serializes the result.

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
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

    /// Replaces the tool's hints.
    pub fn with_hints(mut self, hints: Hints) -> Self {
        self.hints = ToolHints {
            read_only: hints.read_only,
            destructive: hints.destructive,
            idempotent: hints.idempotent,
        };
        self
    }

    /// The tool's name within the plugin.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The JSON Schema of the tool's arguments.
    pub fn input_schema(&self) -> &Value {
        &self.input_schema
    }
}

/// What a tool does besides returning its result, told to the host and the model.
/// Build one in a `const` with the `const fn`s: `Hints::NONE.destructive().idempotent()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hints {
    /// Changes nothing outside its result.
    pub read_only: bool,
    /// Can delete or overwrite data.
    pub destructive: bool,
    /// Two calls with the same arguments have the effect of one.
    pub idempotent: bool,
}

impl Hints {
    /// No hint set: the tool may change things and is not idempotent.
    pub const NONE: Hints = Hints {
        read_only: false,
        destructive: false,
        idempotent: false,
    };
    /// Changes nothing outside its result (which also makes it idempotent).
    pub const READ_ONLY: Hints = Hints {
        read_only: true,
        destructive: false,
        idempotent: true,
    };

    /// These hints, and able to delete or overwrite data.
    pub const fn destructive(mut self) -> Hints {
        self.destructive = true;
        self
    }

    /// These hints, and idempotent.
    pub const fn idempotent(mut self) -> Hints {
        self.idempotent = true;
        self
    }
}

/// A tool declared as a type: its name, description and hints as constants, and its
/// arguments as a type whose JSON Schema is derived (with [`schemars`]) rather than
/// written by hand.
///
/// ```rust,ignore
/// /// Arguments of `echo`.
/// #[derive(Deserialize, JsonSchema)]
/// #[serde(deny_unknown_fields)]
/// struct EchoArgs {
///     /// The text to return.
///     text: String,
/// }
///
/// struct Echo;
///
/// impl TypedTool for Echo {
///     const NAME: &str = "echo";
///     const DESCRIPTION: &str = "Returns its input.";
///     const HINTS: Hints = Hints::READ_ONLY;
///     type Args = EchoArgs;
///     fn run(args: EchoArgs) -> Result<Value, ToolError> {
///         Ok(json!({ "text": args.text }))
///     }
/// }
///
/// export_tools!(Echo);
/// ```
///
/// Field doc comments (or `#[schemars(description = ...)]`) become the properties'
/// `description`s, `#[serde(deny_unknown_fields)]` becomes `"additionalProperties":
/// false`, a field with a serde default or of type `Option` is not required, and
/// `#[schemars(range(min = 1))]`, `length(...)` and `pattern(...)` add the matching
/// JSON Schema keywords. See [`args_schema`] for what the SDK adjusts.
pub trait TypedTool {
    /// The tool's name within the plugin, `snake_case`; the host offers it to the
    /// model as `plugin-id:NAME`.
    const NAME: &'static str;
    /// What the tool does, written for the model.
    const DESCRIPTION: &'static str;
    /// The tool's behaviour hints; none by default.
    const HINTS: Hints = Hints::NONE;
    /// The arguments object.
    type Args: DeserializeOwned + JsonSchema;

    /// Runs the tool with arguments the host has validated against the schema of
    /// [`Args`](Self::Args) and the SDK has deserialized.
    fn run(args: Self::Args) -> Result<Value, ToolError>;

    /// The tool as listed to the host.
    fn tool() -> Tool {
        Tool::new(Self::NAME, Self::DESCRIPTION, args_schema::<Self::Args>())
            .with_hints(Self::HINTS)
    }

    /// Deserializes `args` (a mismatch is [`ToolError::InvalidArguments`]) and runs
    /// the tool.
    fn call_json(args: Value) -> Result<Value, ToolError> {
        Self::run(from_args(args)?)
    }
}

/// The JSON Schema (draft 2020-12) of a tool's arguments type `T`, as [`TypedTool`]
/// lists it. Subschemas are inlined, so the schema has no `$defs` and no `$ref`
/// unless `T` is recursive (and then they are local). The root's `title` and
/// `description` (the Rust type's name and doc comment) are left out, since the tool
/// has its own description; so is schemars' `format` for integer widths (`uint`,
/// `int32`, ...), which is not a JSON Schema format, and a `"default": null`, which
/// schemars writes for a defaulted `Option` field given a non-null schema with
/// `#[schemars(with = "String")]` (the way to keep `null` out of the schema).
pub fn args_schema<T: JsonSchema>() -> Value {
    let mut settings = SchemaSettings::draft2020_12();
    settings.inline_subschemas = true;
    let mut schema = settings
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value();
    if let Some(root) = schema.as_object_mut() {
        root.remove("title");
        root.remove("description");
    }
    tidy(&mut schema);
    schema
}

fn tidy(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            let integer = map.get("type").and_then(Value::as_str) == Some("integer");
            let width = map.get("format").and_then(Value::as_str).is_some_and(|f| {
                f.strip_prefix('u')
                    .unwrap_or(f)
                    .strip_prefix("int")
                    .is_some_and(|bits| bits.chars().all(|c| c.is_ascii_digit()))
            });
            if integer && width {
                map.remove("format");
            }
            if map.get("default").is_some_and(Value::is_null) {
                map.remove("default");
            }
            // Values of these keywords are data, not schemas.
            map.iter_mut()
                .filter(|(key, _)| {
                    !matches!(key.as_str(), "enum" | "const" | "examples" | "default")
                })
                .for_each(|(_, value)| tidy(value));
        }
        Value::Array(items) => items.iter_mut().for_each(tidy),
        _ => {}
    }
}

/// A set of [`TypedTool`]s, as a tuple of up to 12 of them: `(ReadFile, WriteFile)`.
pub trait Toolbox {
    /// Every tool in the set, in order.
    fn tools() -> Vec<Tool>;
    /// Runs the tool named `name`; `unknown-tool` if none is.
    fn call(name: &str, args: Value) -> Result<Value, ToolError>;
    /// Whether a tool of the set is named `name` (no schema is built).
    fn has(name: &str) -> bool;
}

macro_rules! toolbox_for_tuples {
    ($($tool:ident)+) => {
        impl<$($tool: TypedTool),+> Toolbox for ($($tool,)+) {
            fn tools() -> Vec<Tool> {
                vec![$($tool::tool()),+]
            }

            fn call(name: &str, args: Value) -> Result<Value, ToolError> {
                $(if name == $tool::NAME {
                    return $tool::call_json(args);
                })+
                Err(ToolError::UnknownTool(name.to_owned()))
            }

            fn has(name: &str) -> bool {
                $(name == $tool::NAME)||+
            }
        }
    };
}

toolbox_for_tuples!(A);
toolbox_for_tuples!(A B);
toolbox_for_tuples!(A B C);
toolbox_for_tuples!(A B C D);
toolbox_for_tuples!(A B C D E);
toolbox_for_tuples!(A B C D E F);
toolbox_for_tuples!(A B C D E F G);
toolbox_for_tuples!(A B C D E F G H);
toolbox_for_tuples!(A B C D E F G H I);
toolbox_for_tuples!(A B C D E F G H I J);
toolbox_for_tuples!(A B C D E F G H I J K);
toolbox_for_tuples!(A B C D E F G H I J K L);

/// The [`ToolPlugin`] made of the typed tools `T`, a [`Toolbox`] tuple; what
/// [`export_tools!`](crate::export_tools) exports.
pub struct Tools<T>(PhantomData<T>);

impl<T> fmt::Debug for Tools<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tools")
    }
}

impl<T: Toolbox> ToolPlugin for Tools<T> {
    fn tools() -> Vec<Tool> {
        T::tools()
    }

    fn call(name: &str, args: Value) -> Result<Value, ToolError> {
        T::call(name, args)
    }

    fn has_tool(name: &str) -> bool {
        T::has(name)
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
    /// Every tool the plugin offers. Called when the plugin is loaded.
    fn tools() -> Vec<Tool>;

    /// Runs tool `name` with its arguments object, already validated by the host
    /// against the tool's schema. `name` is always one of [`tools`](Self::tools).
    fn call(name: &str, args: Value) -> Result<Value, ToolError>;

    /// Whether one of [`tools`](Self::tools) is named `name`: the SDK asks on each call,
    /// to reject other names before [`call`](Self::call). The default builds the whole
    /// list, schemas included, in every call (each call is a fresh instance); a plugin
    /// that knows its names without that should answer directly, as [`Tools`] does.
    fn has_tool(name: &str) -> bool {
        Self::tools().iter().any(|tool| tool.name == name)
    }
}

/// Deserializes a tool's arguments object into a typed struct; a mismatch becomes
/// [`ToolError::InvalidArguments`] naming the problem.
pub fn from_args<T: DeserializeOwned>(args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args).map_err(|e| ToolError::InvalidArguments(e.to_string()))
}

impl ToolError {
    /// Maps an error from `std::fs` on `path` to the tool error the agent should
    /// see: missing paths are `not-found`; paths outside the call's grants, paths
    /// that leave a grant through `..` or a symbolic link, and writes to a
    /// read-only folder are `denied`; anything else is `failed`.
    ///
    /// `path` is the guest path (`/knowledgebase/notes/a.md`) or the same path
    /// workspace-relative (`knowledgebase/notes/a.md`), which is what the message
    /// shows. On "not found" this looks at the path's folders to tell a missing file
    /// from a path outside every grant.
    ///
    /// WASI reports a write to a read-only grant and an escape through a link with
    /// the same code; this function names both. Use [`from_io_write`](Self::from_io_write)
    /// for operations that modify the path.
    pub fn from_io(path: &str, err: &io::Error) -> ToolError {
        Self::map_io(path, err, Access::Read)
    }

    /// Like [`from_io`](Self::from_io) for an operation that creates, changes or
    /// removes `path`, where a refusal inside the granted folders means the folder is
    /// read-only, or that `path` is a file with other hard links: the host never opens
    /// such a file (for reading either), since another of its links may be a file of a
    /// read-only folder or outside every grant.
    pub fn from_io_write(path: &str, err: &io::Error) -> ToolError {
        Self::map_io(path, err, Access::Write)
    }

    fn map_io(path: &str, err: &io::Error, access: Access) -> ToolError {
        let outside = || {
            ToolError::Denied(format!(
                "`{path}` is outside the folders granted to this call"
            ))
        };
        if err.raw_os_error() == Some(ENOTCAPABLE) {
            return outside();
        }
        if err.kind() == io::ErrorKind::PermissionDenied {
            // The host refuses FIFOs, sockets and devices before opening them.
            if std::fs::symlink_metadata(path).is_ok_and(|m| {
                let kind = m.file_type();
                !(kind.is_file() || kind.is_dir() || kind.is_symlink())
            }) {
                return ToolError::Denied(format!(
                    "`{path}` is a FIFO, socket or device: only regular files and folders can be opened"
                ));
            }
            // `..` that climbs out of a grant, and a link that points out of it, are refused
            // with the code of a read-only folder.
            if path.split('/').any(|part| part == "..") || through_link(path) {
                return ToolError::Denied(format!(
                    "`{path}` is outside the folders granted to this call \
                     (a `..` or a link inside them points outside)"
                ));
            }
        }
        if err.kind() == io::ErrorKind::PermissionDenied && hard_links(path) > 1 {
            return ToolError::Denied(match access {
                Access::Write => format!(
                    "`{path}` has other hard links, so it cannot be written in place (another \
                     link may be a file of a read-only folder or outside the grants); in a \
                     writable folder, write a new file and rename it over `{path}` instead"
                ),
                Access::Read => format!(
                    "`{path}` has other hard links, so it is not read (another link may be a \
                     file outside the grants): a file linked from elsewhere is never opened"
                ),
            });
        }
        match (err.kind(), access) {
            (io::ErrorKind::NotFound, _) if outside_grants(path) => outside(),
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

/// Whether `path` or one of its folders is a symbolic link.
/// How many hard links the regular file at `path` has; 0 when it is not a regular file
/// or cannot be looked at. A path without a leading `/` is taken as workspace-relative.
fn hard_links(path: &str) -> u64 {
    let guest = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    if !std::fs::symlink_metadata(&guest).is_ok_and(|m| m.is_file()) {
        return 0;
    }
    link_count(&guest)
}

/// The link count of `path`. std keeps WASI's `link-count` behind an unstable API, so
/// this asks wasi-libc, which std itself is built on.
#[cfg(target_os = "wasi")]
fn link_count(path: &str) -> u64 {
    let Ok(path) = std::ffi::CString::new(path) else {
        return 0;
    };
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `path` is NUL-terminated and outlives the call; `stat` is only read after
    // `lstat` reported that it filled it.
    if unsafe { libc::lstat(path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return 0;
    }
    // SAFETY: filled by the successful `lstat` above.
    unsafe { stat.assume_init() }.st_nlink
}

#[cfg(unix)]
fn link_count(path: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).map_or(0, |m| m.nlink())
}

#[cfg(not(any(unix, target_os = "wasi")))]
fn link_count(_path: &str) -> u64 {
    0
}

fn through_link(path: &str) -> bool {
    let mut prefix = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        if !prefix.is_empty() || path.starts_with('/') {
            prefix.push('/');
        }
        prefix.push_str(part);
        if std::fs::symlink_metadata(&prefix).is_ok_and(|m| m.file_type().is_symlink()) {
            return true;
        }
    }
    false
}

/// Whether `path` lies under none of the granted folders. WASI answers "not
/// found" both for a missing file in a grant and for a path under no grant; only
/// granted folders and their contents exist for a plugin, so the path is outside
/// the grants exactly when none of its ancestors exists. A path without a leading
/// `/` is taken as workspace-relative.
fn outside_grants(path: &str) -> bool {
    let guest = if path.starts_with('/') {
        PathBuf::from(path)
    } else {
        Path::new("/").join(path)
    };
    !guest
        .ancestors()
        .skip(1)
        .any(|ancestor| std::fs::metadata(ancestor).is_ok())
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
        if !P::has_tool(&name) {
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

/// Exports [`TypedTool`]s as the plugin's `tool` interface: `export_tools!(ReadFile,
/// WriteFile)`. Use it once, at the top level of a `cdylib` crate.
#[macro_export]
macro_rules! export_tools {
    ($($tool:ty),+ $(,)?) => {
        $crate::export_tool_plugin!($crate::tool::Tools<($($tool,)+)>);
    };
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    struct Echo;

    impl ToolPlugin for Echo {
        fn tools() -> Vec<Tool> {
            vec![Tool::new("echo", "Returns its input.", json!({"type": "object"})).read_only()]
        }

        fn call(_name: &str, args: Value) -> Result<Value, ToolError> {
            Ok(json!({ "text": args["text"] }))
        }
    }

    #[test]
    fn adapter_parses_arguments_and_serializes_results() {
        let out = Adapter::<Echo>::call_tool("echo".into(), r#"{"text":"hi"}"#.into()).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&out).unwrap(),
            json!({ "text": "hi" })
        );
    }

    #[test]
    fn adapter_rejects_unknown_names_and_bad_json() {
        let err = Adapter::<Echo>::call_tool("nope".into(), "{}".into()).unwrap_err();
        assert!(matches!(err, ToolError::UnknownTool(name) if name == "nope"));
        let err = Adapter::<Echo>::call_tool("echo".into(), "{".into()).unwrap_err();
        assert!(matches!(err, ToolError::InvalidArguments(m) if m.contains("not valid JSON")));
    }

    #[test]
    fn adapter_lists_tools_with_hints() {
        let tools = Adapter::<Echo>::list_tools();
        assert_eq!(tools.len(), 1);
        assert!(
            tools[0].hints.read_only && tools[0].hints.idempotent && !tools[0].hints.destructive
        );
        assert_eq!(tools[0].input_schema, r#"{"type":"object"}"#);
    }

    /// Arguments of `greet`; this doc comment is not in the schema.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct GreetArgs {
        /// Who to greet.
        name: String,
        /// How many times. Default 1.
        #[serde(default = "one")]
        #[schemars(range(min = 1, max = 10))]
        times: u32,
        /// Greeting to use.
        #[serde(default)]
        #[schemars(with = "String")]
        greeting: Option<String>,
        #[serde(default)]
        nested: Vec<Pair>,
    }

    #[derive(Deserialize, JsonSchema)]
    struct Pair {
        key: String,
    }

    fn one() -> u32 {
        1
    }

    struct Greet;

    impl TypedTool for Greet {
        const NAME: &str = "greet";
        const DESCRIPTION: &str = "Greets someone.";
        const HINTS: Hints = Hints::READ_ONLY;
        type Args = GreetArgs;

        fn run(args: GreetArgs) -> Result<Value, ToolError> {
            let greeting = args.greeting.unwrap_or_else(|| "hello".to_owned());
            let greeted = format!("{greeting} {}", args.name).repeat(args.times as usize);
            Ok(json!({ "greeted": greeted, "pairs": args.nested.len() }))
        }
    }

    struct Forget;

    impl TypedTool for Forget {
        const NAME: &str = "forget";
        const DESCRIPTION: &str = "Forgets something.";
        const HINTS: Hints = Hints::NONE.destructive().idempotent();
        type Args = Pair;

        fn run(args: Pair) -> Result<Value, ToolError> {
            Ok(json!({ "forgot": args.key }))
        }
    }

    type Typed = Tools<(Greet, Forget)>;

    #[test]
    fn typed_tools_derive_their_schema_from_the_arguments_type() {
        let schema = Greet::tool().input_schema().clone();
        assert_eq!(
            schema,
            json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {
                    "name": { "type": "string", "description": "Who to greet." },
                    "times": {
                        "type": "integer", "minimum": 1, "maximum": 10, "default": 1,
                        "description": "How many times. Default 1."
                    },
                    "greeting": { "type": "string", "description": "Greeting to use." },
                    "nested": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": { "key": { "type": "string" } },
                            "required": ["key"]
                        }
                    }
                },
                "required": ["name"],
                "additionalProperties": false
            })
        );
        assert!(!schema.to_string().contains("$ref"));
    }

    #[test]
    fn typed_tools_list_hints_and_dispatch_by_name() {
        let tools = Adapter::<Typed>::list_tools();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["greet", "forget"]);
        assert!(tools[0].hints.read_only && tools[0].hints.idempotent);
        assert!(tools[1].hints.destructive && tools[1].hints.idempotent);
        assert!(!tools[1].hints.read_only);
        let out = Adapter::<Typed>::call_tool("greet".into(), r#"{"name":"Ann"}"#.into());
        assert_eq!(out.unwrap(), r#"{"greeted":"hello Ann","pairs":0}"#);
        let out = Adapter::<Typed>::call_tool("forget".into(), r#"{"key":"k"}"#.into());
        assert_eq!(out.unwrap(), r#"{"forgot":"k"}"#);
    }

    #[test]
    fn typed_tools_report_bad_arguments_and_unknown_names() {
        let err = Adapter::<Typed>::call_tool("greet".into(), "{}".into()).unwrap_err();
        assert!(
            matches!(&err, ToolError::InvalidArguments(m) if m.contains("missing field `name`")),
            "{err:?}"
        );
        let err = Adapter::<Typed>::call_tool("greet".into(), r#"{"name":"a","x":1}"#.into())
            .unwrap_err();
        assert!(
            matches!(&err, ToolError::InvalidArguments(m) if m.contains("unknown field `x`")),
            "{err:?}"
        );
        let err = <Typed as ToolPlugin>::call("nope", json!({})).unwrap_err();
        assert!(matches!(err, ToolError::UnknownTool(name) if name == "nope"));
        // An unknown name is refused before its arguments are even parsed.
        let err = Adapter::<Typed>::call_tool("nope".into(), "not json".into()).unwrap_err();
        assert!(matches!(err, ToolError::UnknownTool(name) if name == "nope"));
        assert!(<Typed as ToolPlugin>::has_tool("greet"));
        assert!(!<Typed as ToolPlugin>::has_tool("gree"));
        assert!(Echo::has_tool("echo") && !Echo::has_tool("nope"));
    }

    #[test]
    fn io_errors_map_to_what_the_agent_can_act_on() {
        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        assert!(
            matches!(ToolError::from_io("a/b", &denied), ToolError::Denied(m) if m.contains("outside the folders"))
        );
        assert!(
            matches!(ToolError::from_io_write("a/b", &denied), ToolError::Denied(m) if m.contains("read-only"))
        );
        let read_only = io::Error::from(io::ErrorKind::ReadOnlyFilesystem);
        assert!(
            matches!(ToolError::from_io("a/b", &read_only), ToolError::Denied(m) if m.contains("read-only"))
        );
        // A read or a write refused on a file with other hard links says so.
        let dir = std::env::temp_dir().join(format!("trellis-sdk-links-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (file, link) = (dir.join("file"), dir.join("link"));
        std::fs::write(&file, "x").unwrap();
        let _ = std::fs::remove_file(&link);
        std::fs::hard_link(&file, &link).unwrap();
        let link = link.to_str().unwrap();
        assert!(
            matches!(ToolError::from_io_write(link, &denied), ToolError::Denied(m) if m.contains("has other hard links"))
        );
        assert!(
            matches!(ToolError::from_io(link, &denied), ToolError::Denied(m) if m.contains("has other hard links, so it is not read"))
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let not_capable = io::Error::from_raw_os_error(ENOTCAPABLE);
        assert!(matches!(
            ToolError::from_io("planning/plan.json", &not_capable),
            ToolError::Denied(m) if m == "`planning/plan.json` is outside the folders granted to this call"
        ));
        let other = io::Error::other("disk on fire");
        assert!(
            matches!(ToolError::from_io("a", &other), ToolError::Failed(m) if m.contains("disk on fire"))
        );
    }

    #[test]
    fn a_missing_file_in_an_existing_folder_is_not_found() {
        // On the build machine `/` exists, standing in for a granted folder.
        let missing = std::env::temp_dir().join("trellis-sdk-test-missing-file");
        let err = io::Error::from(io::ErrorKind::NotFound);
        assert!(matches!(
            ToolError::from_io(missing.to_str().unwrap(), &err),
            ToolError::NotFound(m) if m.contains("does not exist")
        ));
    }
}
