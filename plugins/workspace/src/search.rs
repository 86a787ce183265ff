//! The `search` tool: a regular expression over the text files under a folder.

use std::fs;

use globset::{Glob, GlobMatcher};
use regex::{Regex, RegexBuilder};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use trellis_plugin_sdk::tool::ToolError;

use crate::files::{Kind, MAX_TEXT_BYTES, root_hint, sorted_entries};
use crate::paths::WsPath;

/// Longest matched line returned, in characters; minified files have lines of
/// megabytes that would drown the agent's context.
const MAX_LINE_CHARS: usize = 400;

pub const MAX_RESULTS_LIMIT: usize = 1000;

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    /// Regular expression matched against each line, e.g. `fn \w+_test`.
    #[schemars(length(min = 1))]
    pattern: String,
    /// Workspace-relative folder or file to search. Default: the workspace root, which is usually not granted; pass one of your folders.
    #[serde(default = "default_path")]
    path: String,
    /// Only search files whose name matches, e.g. `*.md`. `*` matches any characters, `?` one character.
    #[serde(default)]
    #[schemars(with = "String", pattern("^[^/]*$"))]
    glob: Option<String>,
    /// Stop after this many matching lines and set `truncated`. Default 100.
    #[serde(default = "default_max_results")]
    #[schemars(range(min = 1, max = MAX_RESULTS_LIMIT))]
    max_results: usize,
    /// Ignore letter case. Default false.
    #[serde(default)]
    case_insensitive: bool,
}

fn default_path() -> String {
    ".".to_owned()
}

fn default_max_results() -> usize {
    100
}

struct Search {
    regex: Regex,
    glob: Option<GlobMatcher>,
    max_results: usize,
    matches: Vec<Value>,
    files_scanned: u64,
    files_skipped: u64,
    truncated: bool,
}

pub fn search(args: SearchArgs) -> Result<Value, ToolError> {
    let regex = RegexBuilder::new(&args.pattern)
        .case_insensitive(args.case_insensitive)
        .build()
        .map_err(|e| {
            ToolError::InvalidArguments(format!("`pattern` is not a valid regular expression: {e}"))
        })?;
    if args.glob.as_deref().is_some_and(|glob| glob.contains('/')) {
        return Err(ToolError::InvalidArguments(
            "`glob` matches file names only and cannot contain `/`; narrow the folder with `path`"
                .to_owned(),
        ));
    }
    let glob = args
        .glob
        .as_deref()
        .map(compile_glob)
        .transpose()
        .map_err(ToolError::InvalidArguments)?;
    let root = WsPath::parse(&args.path);
    let meta = fs::metadata(root.guest())
        .map_err(|e| root_hint(&root, ToolError::from_io(root.display(), &e)))?;
    let mut search = Search {
        regex,
        glob,
        max_results: args.max_results.clamp(1, MAX_RESULTS_LIMIT),
        matches: Vec::new(),
        files_scanned: 0,
        files_skipped: 0,
        truncated: false,
    };
    if meta.is_dir() {
        search.walk(&root, true)?;
    } else {
        // A file named directly is searched even if the glob would not pick it.
        search.scan(&root, meta.len());
    }
    Ok(json!({
        "matches": search.matches,
        "truncated": search.truncated,
        "files_scanned": search.files_scanned,
        "files_skipped": search.files_skipped,
    }))
}

impl Search {
    /// Symbolic links are not followed, as in `list_dir`. A subfolder that cannot be
    /// read is skipped rather than failing the whole search.
    fn walk(&mut self, dir: &WsPath, top: bool) -> Result<(), ToolError> {
        let entries = match sorted_entries(dir) {
            Ok(entries) => entries,
            Err(e) if top => return Err(e),
            Err(_) => return Ok(()),
        };
        for entry in entries {
            if self.truncated {
                break;
            }
            match entry.kind {
                Kind::Dir => self.walk(&entry.path, false)?,
                Kind::File
                    if self
                        .glob
                        .as_ref()
                        .is_none_or(|g| g.is_match(entry.path.file_name())) =>
                {
                    self.scan(&entry.path, entry.size)
                }
                Kind::File | Kind::Symlink => {}
            }
        }
        Ok(())
    }

    fn scan(&mut self, path: &WsPath, size: u64) {
        if size > MAX_TEXT_BYTES {
            self.files_skipped += 1;
            return;
        }
        let Some(text) = fs::read(path.guest())
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
        else {
            self.files_skipped += 1;
            return;
        };
        self.files_scanned += 1;
        for (index, line) in text.lines().enumerate() {
            if !self.regex.is_match(line) {
                continue;
            }
            if self.matches.len() == self.max_results {
                self.truncated = true;
                return;
            }
            self.matches
                .push(json!({ "path": path.display(), "line": index + 1, "text": clip(line) }));
        }
    }
}

fn clip(line: &str) -> String {
    match line.char_indices().nth(MAX_LINE_CHARS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_owned(),
    }
}

/// Compiles a file-name glob with `globset`: `*` is any run of characters, `?` one
/// character, and globset's `[abc]`, `{a,b}` and backslash escapes work too.
pub fn compile_glob(glob: &str) -> Result<GlobMatcher, String> {
    Glob::new(glob)
        .map(|glob| glob.compile_matcher())
        .map_err(|e| format!("`glob` is not a valid glob: {e}"))
}

/// Whether the file name `name` matches `glob`.
#[cfg(test)]
fn glob_match(glob: &str, name: &str) -> bool {
    compile_glob(glob).unwrap().is_match(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_literal_star_and_question_mark() {
        assert!(glob_match("*.md", "notes.md"));
        assert!(glob_match("*.md", ".md"));
        assert!(!glob_match("*.md", "notes.md.bak"));
        assert!(glob_match("plan-?.json", "plan-1.json"));
        assert!(!glob_match("plan-?.json", "plan-12.json"));
        assert!(glob_match("*", "anything"));
        assert!(glob_match("a*b*c", "aXXbYYbZc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
        assert!(glob_match("README", "README"));
        assert!(!glob_match("README", "readme"));
        assert!(glob_match("**", ""));
        assert!(glob_match("é*", "étude.txt"));
    }

    #[test]
    fn glob_classes_work_and_invalid_globs_are_refused() {
        assert!(glob_match("plan-[12].json", "plan-2.json"));
        assert!(!glob_match("plan-[12].json", "plan-3.json"));
        assert!(glob_match("*.{md,txt}", "a.txt"));
        assert!(compile_glob("[").unwrap_err().contains("not a valid glob"));
    }

    #[test]
    fn long_lines_are_clipped_on_a_char_boundary() {
        let line = "é".repeat(MAX_LINE_CHARS + 5);
        let clipped = clip(&line);
        assert_eq!(clipped.chars().count(), MAX_LINE_CHARS + 1);
        assert!(clipped.ends_with('…'));
        assert_eq!(clip("short"), "short");
    }
}
