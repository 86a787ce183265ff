//! Reading the Python traceback a failed script leaves at the end of its stderr.
//!
//! The runner prints uncaught exceptions with Python's own `traceback` module, so the
//! format is CPython's: an optional `Traceback (most recent call last):` header, frames
//! (`  File "/code/step/main.py", line 3, in <module>` followed by indented source and
//! caret lines), then the exception (`ZeroDivisionError: division by zero`). A syntax error
//! has a single frame line and no header.

use std::sync::LazyLock;

use regex::Regex;

/// An uncaught exception found in a script's stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Traceback {
    /// The whole traceback, header to exception.
    pub(crate) text: String,
    /// The exception line(s), e.g. `ZeroDivisionError: division by zero`.
    pub(crate) exception: String,
    /// The frame to blame: the innermost one in `prefer_dir`, else the innermost one.
    pub(crate) file: String,
    /// Its line number.
    pub(crate) line: u32,
}

const HEADER: &str = "Traceback (most recent call last):";

static FRAME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#"^  File "(.+)", line (\d+)"#).expect("valid regex"));

/// Finds the last traceback in `stderr`. `prefer_dir` is the guest folder of the script
/// (`/code/<step-id>/`): the innermost frame in it is the one reported, so an exception
/// raised inside the standard library is blamed on the script's line that called it.
pub(crate) fn parse(stderr: &str, prefer_dir: &str) -> Option<Traceback> {
    let lines: Vec<&str> = stderr.lines().collect();
    let last_frame = lines.iter().rposition(|l| FRAME.is_match(l))?;
    // The exception starts at the first unindented line after the last frame.
    let exception_at = (last_frame + 1..lines.len()).find(|&i| {
        let l = lines[i];
        !l.is_empty() && !l.starts_with(char::is_whitespace)
    })?;
    let exception = lines[exception_at..].join("\n").trim_end().to_string();
    if exception.is_empty() {
        return None;
    }
    let start = lines[..last_frame]
        .iter()
        .rposition(|l| *l == HEADER)
        .unwrap_or(last_frame);
    let frames: Vec<(String, u32)> = lines[start..=last_frame]
        .iter()
        .filter_map(|l| FRAME.captures(l))
        .filter_map(|c| Some((c[1].to_string(), c[2].parse().ok()?)))
        .collect();
    let (file, line) = frames
        .iter()
        .rev()
        .find(|(file, _)| file.starts_with(prefer_dir))
        .or(frames.last())?
        .clone();
    Some(Traceback {
        text: lines[start..].join("\n").trim_end().to_string(),
        exception,
        file,
        line,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_scripts_own_line() {
        let stderr = "some output\n\
Traceback (most recent call last):\n  \
  File \"/code/s/main.py\", line 4, in <module>\n    \
    load()\n  \
  File \"/code/s/main.py\", line 2, in load\n    \
    json.loads('{')\n  \
  File \"/lib/python3.14/json/__init__.py\", line 352, in loads\n    \
    return _default_decoder.decode(s)\n           \
           ^^^^^^^^^^^^^^^^^^^^^^^^^^\n\
json.decoder.JSONDecodeError: Expecting property name: line 1 column 2 (char 1)\n";
        let tb = parse(stderr, "/code/s/").unwrap();
        assert_eq!(tb.file, "/code/s/main.py");
        assert_eq!(tb.line, 2);
        assert_eq!(
            tb.exception,
            "json.decoder.JSONDecodeError: Expecting property name: line 1 column 2 (char 1)"
        );
        assert!(tb.text.starts_with(HEADER), "{}", tb.text);
        assert!(!tb.text.contains("some output"));

        // With no frame in the script's folder, the innermost frame is blamed.
        assert_eq!(parse(stderr, "/code/other/").unwrap().line, 352);
    }

    #[test]
    fn reads_syntax_errors_and_chained_exceptions() {
        let syntax = "  File \"/code/s/main.py\", line 3\n    x = (\n        ^\nSyntaxError: '(' was never closed\n";
        let tb = parse(syntax, "/code/s/").unwrap();
        assert_eq!((tb.file.as_str(), tb.line), ("/code/s/main.py", 3));
        assert_eq!(tb.exception, "SyntaxError: '(' was never closed");

        let chained = "Traceback (most recent call last):\n  File \"/code/s/main.py\", line 2, in <module>\n    1/0\nZeroDivisionError: division by zero\n\nDuring handling of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n  File \"/code/s/main.py\", line 4, in <module>\n    raise ValueError('bad\\nvalue')\nValueError: bad\nvalue\n";
        let tb = parse(chained, "/code/s/").unwrap();
        assert_eq!(tb.line, 4);
        assert_eq!(tb.exception, "ValueError: bad\nvalue");
        assert!(tb.text.starts_with(HEADER) && !tb.text.contains("ZeroDivision"));
    }

    #[test]
    fn plain_output_is_no_traceback() {
        assert_eq!(parse("", "/code/s/"), None);
        assert_eq!(parse("error: something failed\n", "/code/s/"), None);
    }
}
