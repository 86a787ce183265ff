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

use serde_json::{Value, json};
use trellis_plugin_sdk::export_tool_plugin;
use trellis_plugin_sdk::tool::{Tool, ToolError, ToolPlugin};

const SCHEMA: &str = "https://json-schema.org/draft/2020-12/schema";

const PATH_HELP: &str = "Workspace-relative path, e.g. `knowledgebase/notes/ideas.md`. \
                         Only folders granted to you in this step exist.";

struct Workspace;

impl ToolPlugin for Workspace {
    fn tools() -> Vec<Tool> {
        vec![
            Tool::new(
                "read_file",
                "Read a UTF-8 text file. Returns its content (with line endings), the total number of \
                 lines and whether lines were left out. Files over 1 MiB are only read in windows: \
                 pass offset_line and max_lines.",
                object(
                    json!({
                        "path": { "type": "string", "description": PATH_HELP },
                        "offset_line": {
                            "type": "integer", "minimum": 1,
                            "description": "First line to return, counting from 1. Default 1."
                        },
                        "max_lines": {
                            "type": "integer", "minimum": 1,
                            "description": "Most lines to return. Default: to the end of the file."
                        }
                    }),
                    &["path"],
                ),
            )
            .read_only(),
            Tool::new(
                "write_file",
                "Create a file or replace its whole content. The write is atomic: readers see the old \
                 or the new file, never a mix. To change part of an existing file prefer apply_patch.",
                object(
                    json!({
                        "path": { "type": "string", "description": PATH_HELP },
                        "content": { "type": "string", "description": "The complete new content of the file." },
                        "create_dirs": {
                            "type": "boolean", "default": true,
                            "description": "Create missing parent folders. Default true."
                        }
                    }),
                    &["path", "content"],
                ),
            )
            .destructive()
            .idempotent(),
            Tool::new(
                "list_dir",
                "List a folder. Each entry has its workspace-relative path, its type (file, dir or \
                 symlink) and its size in bytes (0 for folders and links). Entries are sorted by path, \
                 a folder's contents right after it; symbolic links are not followed.",
                object(
                    json!({
                        "path": { "type": "string", "description": "Workspace-relative folder, e.g. `knowledgebase/notes`." },
                        "recursive": {
                            "type": "boolean", "default": false,
                            "description": "Also list everything below subfolders. Default false."
                        },
                        "max_entries": {
                            "type": "integer", "minimum": 1, "maximum": 10000, "default": 500,
                            "description": "Stop after this many entries and set `truncated`. Default 500."
                        }
                    }),
                    &["path"],
                ),
            )
            .read_only(),
            Tool::new(
                "search",
                "Search the text files under a folder for lines matching a regular expression (Rust \
                 regex syntax, no look-around). Returns each matching line with its path and 1-based \
                 line number. Files over 1 MiB and files that are not UTF-8 text are skipped and \
                 counted in `files_skipped`; symbolic links are not followed.",
                object(
                    json!({
                        "pattern": { "type": "string", "minLength": 1, "description": "Regular expression matched against each line, e.g. `fn \\w+_test`." },
                        "path": {
                            "type": "string", "default": ".",
                            "description": "Workspace-relative folder or file to search. Default: the workspace root, which is usually not granted; pass one of your folders."
                        },
                        "glob": {
                            "type": "string", "pattern": "^[^/]*$",
                            "description": "Only search files whose name matches, e.g. `*.md`. `*` matches any characters, `?` one character."
                        },
                        "max_results": {
                            "type": "integer", "minimum": 1, "maximum": search::MAX_RESULTS_LIMIT, "default": 100,
                            "description": "Stop after this many matching lines and set `truncated`. Default 100."
                        },
                        "case_insensitive": {
                            "type": "boolean", "default": false,
                            "description": "Ignore letter case. Default false."
                        }
                    }),
                    &["pattern"],
                ),
            )
            .read_only(),
            Tool::new(
                "apply_patch",
                "Apply a unified diff to one or more files, as produced by `git diff` or `diff -u`: for \
                 each file a `--- a/path` and a `+++ b/path` line, then hunks `@@ -start,count \
                 +start,count @@` whose lines start with a space (context), `-` (removed) or `+` \
                 (added). Create a file with `--- /dev/null`, delete one with `+++ /dev/null`. The \
                 counts in each hunk header must match its lines. Context must match the file \
                 exactly; a hunk found a few lines away from its stated position is accepted. Either \
                 every hunk applies or nothing is changed.",
                object(
                    json!({
                        "patch": { "type": "string", "minLength": 1, "description": "The unified diff." }
                    }),
                    &["patch"],
                ),
            )
            .destructive(),
            Tool::new(
                "delete_file",
                "Delete a file (or a symbolic link). Folders are not deleted.",
                object(json!({ "path": { "type": "string", "description": PATH_HELP } }), &["path"]),
            )
            .destructive()
            .idempotent(),
            Tool::new(
                "move_file",
                "Move or rename a file, creating missing parent folders of the destination.",
                object(
                    json!({
                        "from": { "type": "string", "description": "Workspace-relative path of the file to move." },
                        "to": { "type": "string", "description": "Workspace-relative destination path, including the file name." },
                        "overwrite": {
                            "type": "boolean", "default": false,
                            "description": "Replace the destination if it exists. Default false."
                        }
                    }),
                    &["from", "to"],
                ),
            )
            .destructive(),
        ]
    }

    fn call(name: &str, args: Value) -> Result<Value, ToolError> {
        match name {
            "read_file" => files::read_file(args),
            "write_file" => files::write_file(args),
            "list_dir" => files::list_dir(args),
            "search" => search::search(args),
            "apply_patch" => patch::apply_patch(args),
            "delete_file" => files::delete_file(args),
            "move_file" => files::move_file(args),
            other => Err(ToolError::UnknownTool(other.to_owned())),
        }
    }
}

/// An arguments object schema that rejects properties it does not list.
fn object(properties: Value, required: &[&str]) -> Value {
    json!({
        "$schema": SCHEMA,
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

export_tool_plugin!(Workspace);

#[cfg(test)]
mod tests {
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
