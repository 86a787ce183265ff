//! The `apply_patch` tool: unified diffs, several files at once, all or nothing.
//!
//! Parsing and applying work on strings (in [`unified`]) so they are unit-tested on the host; only
//! [`apply_patch`] touches the filesystem. Every hunk of every file is checked
//! against the current contents before anything is written, then all new
//! contents are staged as temporary files and renamed into place.
//!
//! Hand-written rather than `diffy` (0.4.2), on behaviour: tried on this module's
//! test cases, diffy parses one file per patch (a two-file patch is "Hunk header
//! does not match hunk"), refuses a hunk on a CRLF file patched with LF lines,
//! and reports a context mismatch or a wrong hunk count only as "error applying
//! hunk #1" / "Hunk header does not match hunk", where the agent needs the line
//! that differs and the counts to fix its patch. Keeping those would leave diffy
//! only the hunk search of [`apply`], which also differs (here the position
//! closest to the stated line wins, never before the previous hunk).

use std::collections::BTreeMap;
use std::fs;
use std::io;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use trellis_plugin_sdk::tool::ToolError;

use crate::files::{Staged, create_parent_dirs, stage, temp_path};
use crate::paths::WsPath;

mod unified;

use unified::{apply, parse};

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchArgs {
    /// The unified diff.
    #[schemars(length(min = 1))]
    patch: String,
}

pub fn apply_patch(args: PatchArgs) -> Result<Value, ToolError> {
    let files = parse(&args.patch).map_err(ToolError::InvalidArguments)?;

    // The state each touched file will have once the patch is applied; `None`
    // means deleted. A file patched twice is read from here the second time.
    let mut state: BTreeMap<WsPath, Option<String>> = BTreeMap::new();
    let mut report = Vec::new();
    for file in &files {
        let (path, action) = match (&file.old, &file.new) {
            (None, Some(new)) => (WsPath::parse(new), "created"),
            (Some(old), None) => (WsPath::parse(old), "deleted"),
            (Some(old), Some(new)) => {
                let (old, new) = (WsPath::parse(old), WsPath::parse(new));
                if old != new {
                    return Err(ToolError::InvalidArguments(format!(
                        "the patch renames `{old}` to `{new}`; apply_patch does not rename, \
                         use move_file and then patch `{new}`"
                    )));
                }
                (new, "modified")
            }
            (None, None) => unreachable!("parse rejects /dev/null on both sides"),
        };
        if path.is_root() {
            return Err(ToolError::InvalidArguments(
                "a file header in the patch names no file".to_owned(),
            ));
        }
        let current = match state.get(&path) {
            Some(current) => current.clone(),
            None => read_text(&path)?,
        };
        let next = match (action, current) {
            ("created", None) => apply("", &file.hunks).map(Some),
            ("created", Some(_)) => {
                return Err(ToolError::Failed(format!(
                    "the patch creates `{path}` (from /dev/null) but it already exists"
                )));
            }
            (_, None) => {
                return Err(ToolError::NotFound(format!(
                    "the patch changes `{path}`, which does not exist"
                )));
            }
            ("deleted", Some(text)) => match apply(&text, &file.hunks) {
                Ok(rest) if rest.is_empty() => Ok(None),
                Ok(_) => Err(
                    "the patch deletes the file but its removed lines are not the whole file"
                        .to_owned(),
                ),
                Err(e) => Err(e),
            },
            (_, Some(text)) => apply(&text, &file.hunks).map(Some),
        }
        .map_err(|e| ToolError::Failed(format!("`{path}`: {e}; nothing was changed")))?;
        state.insert(path.clone(), next);
        report.push(json!({ "path": path.display(), "action": action, "hunks": file.hunks.len() }));
    }

    commit(state)?;
    Ok(json!({ "files": report }))
}

/// Current text of `path`, or `None` if it does not exist.
fn read_text(path: &WsPath) -> Result<Option<String>, ToolError> {
    match fs::read(path.guest()) {
        Ok(bytes) => String::from_utf8(bytes).map(Some).map_err(|_| {
            ToolError::Failed(format!(
                "`{path}` is not UTF-8 text; apply_patch only edits text files"
            ))
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ToolError::from_io(path.display(), &e)),
    }
}

/// Stages every new content and moves every file to delete aside first, so a
/// refusal (a read-only grant, a path outside the grants) leaves every file as it
/// was; only then renames the new contents into place and drops the set-aside files.
fn commit(state: BTreeMap<WsPath, Option<String>>) -> Result<(), ToolError> {
    let mut staged: Vec<Staged> = Vec::new();
    let mut set_aside: Vec<(WsPath, WsPath)> = Vec::new();
    for (path, content) in state {
        let result = match content {
            Some(text) => create_parent_dirs(&path)
                .and_then(|()| stage(&path, text.as_bytes()))
                .map(|file| staged.push(file)),
            None => {
                let aside = temp_path(&path);
                fs::rename(path.guest(), aside.guest())
                    .map(|()| set_aside.push((path.clone(), aside)))
                    .map_err(|e| ToolError::from_io_write(path.display(), &e))
            }
        };
        if let Err(e) = result {
            staged.into_iter().for_each(Staged::discard);
            for (path, aside) in set_aside {
                let _ = fs::rename(aside.guest(), path.guest());
            }
            return Err(e);
        }
    }
    for file in staged {
        file.commit()?;
    }
    for (path, aside) in set_aside {
        fs::remove_file(aside.guest()).map_err(|e| ToolError::from_io_write(path.display(), &e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::unified::parse_range;
    use super::*;

    fn apply_one(original: &str, patch: &str) -> Result<String, String> {
        let files = parse(patch)?;
        assert_eq!(files.len(), 1);
        apply(original, &files[0].hunks)
    }

    const FILE: &str = "one\ntwo\nthree\nfour\nfive\nsix\nseven\n";

    #[test]
    fn parses_git_headers_and_several_files() {
        let patch = "diff --git a/x.md b/x.md\nindex 1..2 100644\n--- a/x.md\n+++ b/x.md\n@@ -1,2 +1,2 @@\n-a\n+b\n c\n\
                     diff --git a/new.md b/new.md\nnew file mode 100644\n--- /dev/null\n+++ b/new.md\n@@ -0,0 +1 @@\n+hi\n\
                     --- a/old.md\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n";
        let files = parse(patch).unwrap();
        assert_eq!(files.len(), 3);
        assert_eq!(
            (files[0].old.as_deref(), files[0].new.as_deref()),
            (Some("x.md"), Some("x.md"))
        );
        assert_eq!(
            (files[1].old.as_deref(), files[1].new.as_deref()),
            (None, Some("new.md"))
        );
        assert_eq!(
            (files[2].old.as_deref(), files[2].new.as_deref()),
            (Some("old.md"), None)
        );
        assert_eq!(files[0].hunks[0].lines.len(), 3);
    }

    #[test]
    fn keeps_paths_without_git_prefixes_and_drops_timestamps() {
        let files = parse("--- notes/a.md\t2024-01-01 10:00\n+++ notes/a.md\t2024-01-02 10:00\n@@ -1 +1 @@\n-x\n+y\n").unwrap();
        assert_eq!(files[0].new.as_deref(), Some("notes/a.md"));
    }

    #[test]
    fn modifies_with_context_and_keeps_untouched_lines() {
        let patch = "--- a/f\n+++ b/f\n@@ -2,3 +2,3 @@\n two\n-three\n+THREE\n four\n@@ -6,2 +6,3 @@\n six\n+six and a half\n seven\n";
        assert_eq!(
            apply_one(FILE, patch).unwrap(),
            "one\ntwo\nTHREE\nfour\nfive\nsix\nsix and a half\nseven\n"
        );
    }

    #[test]
    fn finds_a_hunk_whose_line_numbers_are_off() {
        let patch = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n five\n-six\n+6\n";
        assert_eq!(
            apply_one(FILE, patch).unwrap(),
            "one\ntwo\nthree\nfour\nfive\n6\nseven\n"
        );
        let patch = "--- a/f\n+++ b/f\n@@ -7,2 +7,2 @@\n-one\n+1\n two\n";
        assert_eq!(
            apply_one(FILE, patch).unwrap(),
            "1\ntwo\nthree\nfour\nfive\nsix\nseven\n"
        );
    }

    #[test]
    fn later_hunks_follow_the_drift_of_earlier_ones() {
        let original = "x\nx\nx\ny\n";
        // The second hunk's context `x` also occurs before the first hunk; it must
        // match after it.
        let patch = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-x\n+a\n@@ -3,2 +3,2 @@\n x\n-y\n+b\n";
        assert_eq!(apply_one(original, patch).unwrap(), "a\nx\nx\nb\n");
    }

    #[test]
    fn refuses_a_hunk_whose_context_differs() {
        let patch = "--- a/f\n+++ b/f\n@@ -2,2 +2,2 @@\n two\n-THREE\n+3\n";
        let err = apply_one(FILE, patch).unwrap_err();
        assert!(err.contains("hunk 1"), "{err}");
        assert!(err.contains("`three`"), "{err}");
    }

    #[test]
    fn refuses_counts_that_do_not_match_the_body() {
        let err = parse("--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n").unwrap_err();
        assert!(err.contains("promises 3 and 3"), "{err}");
        let err = parse("--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n@@ -9 +9 @@\n-x\n+y\n")
            .unwrap_err();
        assert!(err.contains("promises 3 and 3"), "{err}");
        let err = parse(
            "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n one\n--- a/g\n+++ b/g\n@@ -1 +1 @@\n-x\n+y\n",
        )
        .unwrap_err();
        assert!(err.contains("promises 2 and 2"), "{err}");
        let err = parse("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n one\nstray\n").unwrap_err();
        assert!(err.contains("`stray`"), "{err}");
    }

    #[test]
    fn rejects_text_without_file_headers() {
        assert!(
            parse("just some prose")
                .unwrap_err()
                .contains("no file found")
        );
        assert!(
            parse("--- a/f\n+++ b/f\nno hunks\n")
                .unwrap_err()
                .contains("not followed by any")
        );
    }

    #[test]
    fn accepts_context_lines_that_lost_their_space() {
        let patch = "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n\n-b\n+B\n";
        assert_eq!(apply_one("a\n\nb\n", patch).unwrap(), "a\n\nB\n");
    }

    #[test]
    fn creates_from_dev_null() {
        let patch = "--- /dev/null\n+++ b/new.md\n@@ -0,0 +1,2 @@\n+# Title\n+body\n";
        assert_eq!(apply_one("", patch).unwrap(), "# Title\nbody\n");
    }

    #[test]
    fn deletion_removes_every_line() {
        let patch = "--- a/f\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n";
        assert_eq!(apply_one("a\nb\n", patch).unwrap(), "");
        assert_eq!(apply_one("a\nb\nc\n", patch).unwrap(), "c\n");
    }

    #[test]
    fn honours_no_newline_markers() {
        let patch = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n";
        assert_eq!(apply_one("a\nb", patch).unwrap(), "a\nc");
        let patch = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-b\n\\ No newline at end of file\n+b\n";
        assert_eq!(apply_one("b", patch).unwrap(), "b\n");
        let patch = "--- /dev/null\n+++ b/f\n@@ -0,0 +1 @@\n+x\n\\ No newline at end of file\n";
        assert_eq!(apply_one("", patch).unwrap(), "x");
    }

    #[test]
    fn keeps_crlf_line_endings() {
        let patch = "--- a/f\n+++ b/f\n@@ -1,2 +1,3 @@\n a\n+new\n b\n";
        assert_eq!(apply_one("a\r\nb\r\n", patch).unwrap(), "a\r\nnew\r\nb\r\n");
    }

    #[test]
    fn pure_insertion_uses_the_stated_line() {
        let patch = "--- a/f\n+++ b/f\n@@ -2,0 +3 @@\n+between\n";
        assert_eq!(apply_one("a\nb\nc\n", patch).unwrap(), "a\nb\nbetween\nc\n");
    }

    #[test]
    fn a_start_line_past_isize_max_is_only_far_off() {
        // The drift of such a hunk overflowed (a panic in a debug build).
        for start in ["9223372036854775809", "18446744073709551615"] {
            let patch = format!(
                "--- a/x.md\n+++ b/x.md\n@@ -{start},1 +1,1 @@\n-one\n+ONE\n@@ -3,1 +3,1 @@\n-three\n+3\n"
            );
            assert_eq!(
                apply_one(FILE, &patch).unwrap(),
                "ONE\ntwo\n3\nfour\nfive\nsix\nseven\n"
            );
        }
    }

    #[test]
    fn short_range_defaults_to_one_line() {
        assert_eq!(parse_range("7"), Some((7, 1)));
        assert_eq!(parse_range("0,0"), Some((0, 0)));
        assert_eq!(parse_range("x"), None);
    }
}
