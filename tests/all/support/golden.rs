//! Golden files: expectations written once, reviewed, and committed under `tests/data/`, so a
//! test compares what the code produces with text the code did not make. A difference fails
//! with the first line that differs; `TRELLIS_BLESS=1` rewrites the files instead (then
//! review the diff before committing it).

use std::path::{Path, PathBuf};

/// The environment variable that makes [`assert_golden`] write the files it compares.
pub const BLESS: &str = "TRELLIS_BLESS";

/// The golden file `rel` under `tests/data/`.
pub fn golden_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

/// Asserts that `actual` is byte for byte the golden file `rel` (under `tests/data/`);
/// with `TRELLIS_BLESS=1`, writes `actual` there instead.
pub fn assert_golden(rel: &str, actual: &str) {
    let path = golden_path(rel);
    if std::env::var(BLESS).is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        eprintln!("blessed {}", path.display());
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "golden file {} cannot be read ({e}); {BLESS}=1 writes it",
            path.display()
        )
    });
    if expected == actual {
        return;
    }
    panic!(
        "{} differs from what the test produced ({BLESS}=1 rewrites it; review the diff \
         before committing it):\n{}",
        path.display(),
        first_difference(&expected, actual)
    );
}

/// Where `expected` and `actual` first differ, by line, with two lines before it.
fn first_difference(expected: &str, actual: &str) -> String {
    let want: Vec<&str> = expected.split_inclusive('\n').collect();
    let got: Vec<&str> = actual.split_inclusive('\n').collect();
    let at = want
        .iter()
        .zip(&got)
        .position(|(w, g)| w != g)
        .unwrap_or(want.len().min(got.len()));
    let mut out = String::new();
    for line in &want[at.saturating_sub(2)..at] {
        out.push_str(&format!("  {line:?}\n"));
    }
    out.push_str(&format!(
        "line {}:\n- {:?} (golden)\n+ {:?} (produced)\n",
        at + 1,
        want.get(at).copied().unwrap_or("<end of file>"),
        got.get(at).copied().unwrap_or("<end of file>"),
    ));
    out.push_str(&format!(
        "golden: {} lines, {} bytes; produced: {} lines, {} bytes",
        want.len(),
        expected.len(),
        got.len(),
        actual.len()
    ));
    out
}

#[test]
fn the_first_difference_names_its_line_and_both_texts() {
    let report = first_difference("a\nb\nc\nd\n", "a\nb\nX\nd\n");
    assert_eq!(
        report,
        "  \"a\\n\"\n  \"b\\n\"\nline 3:\n- \"c\\n\" (golden)\n+ \"X\\n\" (produced)\n\
         golden: 4 lines, 8 bytes; produced: 4 lines, 8 bytes"
    );
    let shorter = first_difference("a\nb\n", "a\n");
    assert!(
        shorter.contains("line 2:\n- \"b\\n\" (golden)\n+ \"<end of file>\" (produced)"),
        "{shorter}"
    );
}
