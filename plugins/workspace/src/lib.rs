//! The bundled `workspace` tool plugin: read, write, list, search and patch files.
//!
//! The guest's filesystem is the workspace tree with only the folders granted to
//! the current call in it, each mounted at its workspace-relative path with a
//! leading `/`. Tools take workspace-relative paths (`knowledgebase/notes/a.md`,
//! a leading `/` is accepted), normalize them lexically and use `std::fs`. This
//! plugin does no access checks of its own: the host's preopens are the boundary,
//! and a refusal reaches the agent as `denied` naming the path.

mod files;
mod patch;
mod paths;
mod search;

use serde_json::Value;
use trellis_plugin_sdk::export_tool_plugin;
use trellis_plugin_sdk::tool::{Hints, ToolError, Tools, TypedTool};

/// The plugin: every tool below, listed in this order.
type Workspace = Tools<(
    ReadFile,
    WriteFile,
    ListDir,
    Search,
    ApplyPatch,
    DeleteFile,
    MoveFile,
)>;

struct ReadFile;

impl TypedTool for ReadFile {
    const NAME: &str = "read_file";
    const DESCRIPTION: &str = "Read a UTF-8 text file. Returns its content (with line endings), the total number of \
         lines and whether lines were left out. Files over 1 MiB are only read in windows: \
         pass offset_line and max_lines.";
    const HINTS: Hints = Hints::READ_ONLY;
    type Args = files::ReadArgs;

    fn run(args: Self::Args) -> Result<Value, ToolError> {
        files::read_file(args)
    }
}

struct WriteFile;

impl TypedTool for WriteFile {
    const NAME: &str = "write_file";
    const DESCRIPTION: &str = "Create a file or replace its whole content. The write is atomic: readers see the old \
         or the new file, never a mix. To change part of an existing file prefer apply_patch.";
    const HINTS: Hints = Hints::NONE.destructive().idempotent();
    type Args = files::WriteArgs;

    fn run(args: Self::Args) -> Result<Value, ToolError> {
        files::write_file(args)
    }
}

struct ListDir;

impl TypedTool for ListDir {
    const NAME: &str = "list_dir";
    const DESCRIPTION: &str = "List a folder. Each entry has its workspace-relative path, its type (file, dir or \
         symlink) and its size in bytes (0 for folders and links). Entries are sorted by path, \
         a folder's contents right after it; symbolic links are not followed.";
    const HINTS: Hints = Hints::READ_ONLY;
    type Args = files::ListArgs;

    fn run(args: Self::Args) -> Result<Value, ToolError> {
        files::list_dir(args)
    }
}

struct Search;

impl TypedTool for Search {
    const NAME: &str = "search";
    const DESCRIPTION: &str = "Search the text files under a folder for lines matching a regular expression (Rust \
         regex syntax, no look-around). Returns each matching line with its path and 1-based \
         line number. Files over 1 MiB and files that are not UTF-8 text are skipped and \
         counted in `files_skipped`; symbolic links are not followed.";
    const HINTS: Hints = Hints::READ_ONLY;
    type Args = search::SearchArgs;

    fn run(args: Self::Args) -> Result<Value, ToolError> {
        search::search(args)
    }
}

struct ApplyPatch;

impl TypedTool for ApplyPatch {
    const NAME: &str = "apply_patch";
    const DESCRIPTION: &str = "Apply a unified diff to one or more files, as produced by `git diff` or `diff -u`: for \
         each file a `--- a/path` and a `+++ b/path` line, then hunks `@@ -start,count \
         +start,count @@` whose lines start with a space (context), `-` (removed) or `+` \
         (added). Create a file with `--- /dev/null`, delete one with `+++ /dev/null`. The \
         counts in each hunk header must match its lines. Context must match the file \
         exactly; a hunk found a few lines away from its stated position is accepted. Either \
         every hunk applies or nothing is changed.";
    const HINTS: Hints = Hints::NONE.destructive();
    type Args = patch::PatchArgs;

    fn run(args: Self::Args) -> Result<Value, ToolError> {
        patch::apply_patch(args)
    }
}

struct DeleteFile;

impl TypedTool for DeleteFile {
    const NAME: &str = "delete_file";
    const DESCRIPTION: &str = "Delete a file (or a symbolic link). Folders are not deleted.";
    const HINTS: Hints = Hints::NONE.destructive().idempotent();
    type Args = files::DeleteArgs;

    fn run(args: Self::Args) -> Result<Value, ToolError> {
        files::delete_file(args)
    }
}

struct MoveFile;

impl TypedTool for MoveFile {
    const NAME: &str = "move_file";
    const DESCRIPTION: &str =
        "Move or rename a file, creating missing parent folders of the destination.";
    const HINTS: Hints = Hints::NONE.destructive();
    type Args = files::MoveArgs;

    fn run(args: Self::Args) -> Result<Value, ToolError> {
        files::move_file(args)
    }
}

export_tool_plugin!(Workspace);

#[cfg(test)]
mod tests {
    use serde_json::json;
    use trellis_plugin_sdk::tool::ToolPlugin;

    use super::*;

    #[test]
    fn every_tool_has_a_strict_object_schema_and_is_dispatched() {
        for tool in Workspace::tools() {
            let info =
                trellis_plugin_sdk::bindings::exports::trellis::plugin::tool::ToolInfo::from(tool);
            let schema: Value = serde_json::from_str(&info.input_schema).unwrap();
            assert_eq!(schema["additionalProperties"], false, "{}", info.name);
            for required in schema["required"].as_array().unwrap() {
                assert!(
                    schema["properties"]
                        .get(required.as_str().unwrap())
                        .is_some(),
                    "{}",
                    info.name
                );
            }
            // An empty object fails argument parsing, which proves the name is routed
            // to a tool rather than answered with `unknown-tool`.
            let err = Workspace::call(&info.name, json!({})).unwrap_err();
            assert!(
                matches!(err, ToolError::InvalidArguments(_)),
                "{}: {err:?}",
                info.name
            );
        }
    }
}
