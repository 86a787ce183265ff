//! Unified diffs as strings: parsing them and applying their hunks to a file's text.
//!
//! Pure (std only) so the fuzz targets of the host repository (`fuzz/`) include this file
//! too; [`super`] does the filesystem part of `apply_patch`.

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

pub(super) fn parse_range(range: &str) -> Option<(usize, usize)> {
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
        // A stated line past `isize::MAX` (any number fits a header) only makes the drift
        // large: saturate rather than overflow.
        let signed = |n: usize| isize::try_from(n).unwrap_or(isize::MAX);
        drift = signed(at).saturating_sub(signed(stated));
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
