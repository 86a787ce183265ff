//! The `apply_patch` tool: unified diffs, several files at once, all or nothing.
//!
//! Parsing and applying work on strings so they are unit-tested on the host; only
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

/// One file's part of a patch. A `None` side is `/dev/null`: the file is created
/// (old side) or deleted (new side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePatch {
    pub old: Option<String>,
    pub new: Option<String>,
    pub hunks: Vec<Hunk>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    /// The `@@ ... @@` line, quoted in errors so the agent can find the hunk.
    pub header: String,
    pub old_start: usize,
    pub old_len: usize,
    pub lines: Vec<Line>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Context,
    Remove,
    Add,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub op: Op,
    pub text: String,
    /// Followed by `\ No newline at end of file`.
    pub no_newline: bool,
}

/// Parses a unified diff. Lines outside file sections (`diff --git`, `index`,
/// `new file mode`, prose around the diff) are ignored; inside a hunk the line
/// counts of its header decide where it ends.
pub fn parse(patch: &str) -> Result<Vec<FilePatch>, String> {
    // Without this, the final newline would yield an empty last line that a hunk
    // short of lines would take for an empty context line.
    let patch = patch.strip_suffix('\n').unwrap_or(patch);
    let lines: Vec<&str> = patch
        .split('\n')
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
        .collect();
    let mut files = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let is_header = lines[i].starts_with("--- ")
            && lines
                .get(i + 1)
                .is_some_and(|next| next.starts_with("+++ "));
        if !is_header {
            i += 1;
            continue;
        }
        let (old, new) = header_paths(&lines[i][4..], &lines[i + 1][4..]);
        let name = new.clone().or_else(|| old.clone()).unwrap_or_default();
        if old.is_none() && new.is_none() {
            return Err(format!(
                "line {}: both sides of a file header are /dev/null",
                i + 1
            ));
        }
        i += 2;
        let mut hunks = Vec::new();
        while i < lines.len() && lines[i].starts_with("@@") {
            let (hunk, next) = parse_hunk(&lines, i).map_err(|e| format!("`{name}`: {e}"))?;
            hunks.push(hunk);
            i = next;
        }
        if hunks.is_empty() && old.is_some() && new.is_some() {
            return Err(format!(
                "`{name}`: the file header is not followed by any `@@` hunk"
            ));
        }
        files.push(FilePatch { old, new, hunks });
    }
    if files.is_empty() {
        return Err(
            "no file found in the patch: each file needs a `--- a/path` line, a `+++ b/path` \
                    line and `@@ -start,count +start,count @@` hunks"
                .to_owned(),
        );
    }
    Ok(files)
}

/// Paths of a `---`/`+++` pair. Git's `a/` and `b/` prefixes are dropped when both
/// sides use them (or the other side is /dev/null), so hand-written headers
/// without prefixes work too.
fn header_paths(old: &str, new: &str) -> (Option<String>, Option<String>) {
    let (old, new) = (header_path(old), header_path(new));
    let prefixed = old.as_deref().is_none_or(|p| p.starts_with("a/"))
        && new.as_deref().is_none_or(|p| p.starts_with("b/"));
    if prefixed {
        (
            old.map(|p| p[2..].to_owned()),
            new.map(|p| p[2..].to_owned()),
        )
    } else {
        (old, new)
    }
}

fn header_path(raw: &str) -> Option<String> {
    // `diff -u` appends a tab and a timestamp.
    let path = raw.split('\t').next().unwrap_or(raw).trim();
    let path = path
        .strip_prefix('"')
        .and_then(|p| p.strip_suffix('"'))
        .unwrap_or(path);
    (path != "/dev/null").then(|| path.to_owned())
}

fn parse_hunk(lines: &[&str], start: usize) -> Result<(Hunk, usize), String> {
    let header = lines[start];
    let ranges = header
        .strip_prefix("@@ ")
        .and_then(|rest| rest.split_once(" @@"))
        .map(|(ranges, _)| ranges)
        .ok_or_else(|| format!("line {}: malformed hunk header `{header}`", start + 1))?;
    let (old_range, new_range) = ranges
        .split_once(' ')
        .ok_or_else(|| format!("line {}: malformed hunk header `{header}`", start + 1))?;
    let bad = || {
        format!(
            "line {}: malformed hunk header `{header}`, expected `@@ -12,3 +12,4 @@`",
            start + 1
        )
    };
    let (old_start, old_len) =
        parse_range(old_range.strip_prefix('-').ok_or_else(bad)?).ok_or_else(bad)?;
    let (_, new_len) = parse_range(new_range.strip_prefix('+').ok_or_else(bad)?).ok_or_else(bad)?;

    let mut body = Vec::new();
    let (mut old_seen, mut new_seen) = (0, 0);
    let mut i = start + 1;
    while old_seen < old_len || new_seen < new_len {
        // A new hunk or file header means this hunk came up short.
        let next_section = lines.get(i).is_some_and(|line| {
            line.starts_with("@@")
                || (line.starts_with("--- ")
                    && lines.get(i + 1).is_some_and(|l| l.starts_with("+++ ")))
        });
        let Some(&line) = lines.get(i).filter(|_| !next_section) else {
            return Err(format!(
                "the hunk `{header}` ends after {old_seen} old and {new_seen} new lines, \
                 but its header promises {old_len} and {new_len}"
            ));
        };
        let (op, text) = match line.chars().next() {
            Some(' ') => (Op::Context, &line[1..]),
            Some('-') => (Op::Remove, &line[1..]),
            Some('+') => (Op::Add, &line[1..]),
            // Editors and chat interfaces often strip the lone space of an empty
            // context line.
            None => (Op::Context, ""),
            Some('\\') => {
                mark_no_newline(&mut body);
                i += 1;
                continue;
            }
            Some(_) => {
                return Err(format!(
                    "line {}: `{line}` inside the hunk `{header}` does not start with ` `, `-` or `+` \
                     (the hunk has {old_seen} of {old_len} old and {new_seen} of {new_len} new lines so far)",
                    i + 1
                ));
            }
        };
        if op != Op::Add {
            old_seen += 1;
        }
        if op != Op::Remove {
            new_seen += 1;
        }
        if old_seen > old_len || new_seen > new_len {
            return Err(format!(
                "line {}: the hunk `{header}` has more lines than its header promises ({old_len} old, {new_len} new)",
                i + 1
            ));
        }
        body.push(Line {
            op,
            text: text.to_owned(),
            no_newline: false,
        });
        i += 1;
    }
    if lines.get(i).is_some_and(|line| line.starts_with('\\')) {
        mark_no_newline(&mut body);
        i += 1;
    }
    Ok((
        Hunk {
            header: header.to_owned(),
            old_start,
            old_len,
            lines: body,
        },
        i,
    ))
}

fn mark_no_newline(body: &mut [Line]) {
    if let Some(last) = body.last_mut() {
        last.no_newline = true;
    }
}

fn parse_range(range: &str) -> Option<(usize, usize)> {
    match range.split_once(',') {
        Some((start, len)) => Some((start.parse().ok()?, len.parse().ok()?)),
        None => Some((range.parse().ok()?, 1)),
    }
}

/// Applies `hunks` in order to `original`. A hunk whose old lines are not at the
/// line its header names is looked for nearby (the closest position wins), but
/// never before the previous hunk, and its context must match exactly, apart from
/// a `\r` line ending that the patch left out.
pub fn apply(original: &str, hunks: &[Hunk]) -> Result<String, String> {
    let mut lines: Vec<&str> = Vec::new();
    if !original.is_empty() {
        lines = original
            .strip_suffix('\n')
            .unwrap_or(original)
            .split('\n')
            .collect();
    }
    let crlf = lines.first().is_some_and(|line| line.ends_with('\r'));
    let mut final_newline = original.ends_with('\n');

    let mut out: Vec<String> = Vec::with_capacity(lines.len());
    let mut cursor = 0;
    let mut drift: isize = 0;
    for (number, hunk) in hunks.iter().enumerate() {
        let old: Vec<&str> = hunk
            .lines
            .iter()
            .filter(|l| l.op != Op::Add)
            .map(|l| l.text.as_str())
            .collect();
        // A hunk without old lines inserts after line `old_start`; otherwise
        // `old_start` is its first old line.
        let stated = if hunk.old_len == 0 {
            hunk.old_start
        } else {
            hunk.old_start.saturating_sub(1)
        };
        let expected = stated.saturating_add_signed(drift).max(cursor);
        let at = find(&lines, &old, expected, cursor).ok_or_else(|| {
            format!(
                "hunk {} (`{}`) does not apply: {}",
                number + 1,
                hunk.header,
                mismatch(&lines, &old, expected.min(lines.len()))
            )
        })?;
        drift = at as isize - stated as isize;
        out.extend(lines[cursor..at].iter().map(|line| (*line).to_owned()));
        let mut index = at;
        for line in &hunk.lines {
            match line.op {
                Op::Context => {
                    out.push(lines[index].to_owned());
                    index += 1;
                }
                Op::Remove => index += 1,
                Op::Add => out.push(if crlf {
                    format!("{}\r", line.text)
                } else {
                    line.text.clone()
                }),
            }
        }
        cursor = index;
        if cursor == lines.len() {
            // This hunk ends the file, so its new side decides the final newline.
            if let Some(last) = hunk.lines.iter().rev().find(|l| l.op != Op::Remove) {
                final_newline = !last.no_newline;
            }
        }
    }
    out.extend(lines[cursor..].iter().map(|line| (*line).to_owned()));
    if out.is_empty() {
        return Ok(String::new());
    }
    let mut text = out.join("\n");
    if final_newline {
        text.push('\n');
    }
    Ok(text)
}

fn same(file_line: &str, patch_line: &str) -> bool {
    file_line == patch_line || file_line.strip_suffix('\r') == Some(patch_line)
}

fn matches_at(lines: &[&str], old: &[&str], at: usize) -> bool {
    at + old.len() <= lines.len()
        && old
            .iter()
            .zip(&lines[at..])
            .all(|(want, have)| same(have, want))
}

/// The position closest to `expected`, not before `floor`, where `old` matches.
fn find(lines: &[&str], old: &[&str], expected: usize, floor: usize) -> Option<usize> {
    if old.is_empty() {
        return Some(expected.min(lines.len()));
    }
    let last = lines.len().checked_sub(old.len())?;
    let expected = expected.min(last);
    (0..=lines.len()).find_map(|distance| {
        let after = expected + distance;
        let before = expected.checked_sub(distance).filter(|&b| b >= floor);
        [before, Some(after).filter(|&a| a <= last)]
            .into_iter()
            .flatten()
            .find(|&at| at >= floor && matches_at(lines, old, at))
    })
}

/// Describes the first difference at the hunk's stated position, which is what
/// the agent needs to fix its patch.
fn mismatch(lines: &[&str], old: &[&str], at: usize) -> String {
    for (k, want) in old.iter().enumerate() {
        match lines.get(at + k) {
            Some(have) if same(have, want) => {}
            Some(have) => {
                return format!(
                    "line {} is `{}` but the patch expects `{want}` there, and the hunk's lines \
                     were not found anywhere after the previous hunk either; re-read the file \
                     and make the patch again",
                    at + k + 1,
                    have.trim_end_matches('\r')
                );
            }
            None => {
                return format!(
                    "the file has {} lines, fewer than the hunk needs at line {}",
                    lines.len(),
                    at + 1
                );
            }
        }
    }
    "its lines were not found after the previous hunk".to_owned()
}

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
    fn short_range_defaults_to_one_line() {
        assert_eq!(parse_range("7"), Some((7, 1)));
        assert_eq!(parse_range("0,0"), Some((0, 0)));
        assert_eq!(parse_range("x"), None);
    }
}
