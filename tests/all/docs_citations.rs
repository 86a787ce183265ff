//! Every test and function that `docs/*.md` and `README.md` cite by name exists in the
//! sources, so a renamed or deleted test cannot stay cited as the proof of a limit.
//!
//! Two forms are checked, each in inline code outside fenced blocks:
//!
//! - a lowercase path `module::name` (`plugin_loading::a_nested_ref_schema_is_refused_at_load`,
//!   `sandbox::slices::db::sql::tests::shadow_tables_…`, `scripts::*`): some source file
//!   whose module path holds the path's modules (`tests` modules aside) defines `name`;
//! - a bare name right after a cited source file (`host/sandbox/src/engine.rs`
//!   `a_compile_past_its_deadline_gives_up`, or `… tests: name, name`), or before
//!   `in` and a cited folder: that file or folder defines it.
//!
//! Paths into other crates (`std::fs`) and the table legend's `file::function` are not
//! citations of ours.

use std::path::{Path, PathBuf};

/// Where cited items are looked for.
const SOURCE_ROOTS: &[&str] = &["tests", "host", "src", "plugins"];
/// First segments of paths that name no module of ours.
const FOREIGN_ROOTS: &[&str] = &["std", "core", "alloc"];
/// Inline code that only describes the form of a citation.
const LEGEND: &[&str] = &["file::function"];

struct Source {
    /// Relative to the repository, with `/`.
    path: String,
    /// Module paths the file is reached by (`tests` segments left out): under its package
    /// name, under that name less `trellis_`, and, in `tests/all`, from that crate's root.
    modules: Vec<Vec<String>>,
    text: String,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            rust_files(&path, out);
        } else if kind.is_file() && path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The `name` of the package whose `Cargo.toml` is nearest above `file`.
fn package_of(file: &Path) -> Option<(PathBuf, String)> {
    let mut dir = file.parent();
    while let Some(d) = dir {
        if let Ok(manifest) = std::fs::read_to_string(d.join("Cargo.toml"))
            && let Some(name) = manifest
                .lines()
                .skip_while(|l| l.trim() != "[package]")
                .find_map(|l| l.trim().strip_prefix("name = "))
        {
            return Some((d.to_path_buf(), name.trim_matches('"').replace('-', "_")));
        }
        dir = d.parent();
    }
    None
}

fn without_tests(segments: &[&str]) -> Vec<String> {
    segments
        .iter()
        .filter(|s| **s != "tests")
        .map(|s| s.to_string())
        .collect()
}

fn sources() -> Vec<Source> {
    let repo = repo();
    let mut files = Vec::new();
    for root in SOURCE_ROOTS {
        rust_files(&repo.join(root), &mut files);
    }
    let mut out = Vec::new();
    for file in files {
        let path = file
            .strip_prefix(&repo)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let stem_path = path.trim_end_matches(".rs");
        let mut modules = Vec::new();
        if let Some(rest) = stem_path.strip_prefix("tests/all/") {
            let segments: Vec<&str> = rest.split('/').filter(|s| *s != "main").collect();
            modules.push(without_tests(&segments));
        } else if let Some((dir, package)) = package_of(&file) {
            let in_package = file.strip_prefix(&dir).unwrap().to_string_lossy();
            if let Some(rest) = in_package.trim_end_matches(".rs").strip_prefix("src/") {
                let segments: Vec<&str> = rest
                    .split('/')
                    .filter(|s| *s != "lib" && *s != "main")
                    .collect();
                for name in [package.as_str(), package.trim_start_matches("trellis_")] {
                    let mut module = vec![name];
                    module.extend(&segments);
                    modules.push(without_tests(&module));
                }
            }
        }
        let text = std::fs::read_to_string(&file).unwrap();
        out.push(Source {
            path,
            modules,
            text,
        });
    }
    out
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether `text` defines `name`: an item of that name, or a `use` that re-exports it.
fn defines(text: &str, name: &str) -> bool {
    let is_word_at = |at: usize, len: usize| {
        !text[..at].ends_with(is_ident_char) && !text[at + len..].starts_with(is_ident_char)
    };
    for keyword in [
        "fn", "mod", "struct", "enum", "trait", "type", "const", "static",
    ] {
        let needle = format!("{keyword} {name}");
        if text
            .match_indices(&needle)
            .any(|(at, _)| is_word_at(at, needle.len()))
        {
            return true;
        }
    }
    text.lines().any(|line| {
        line.trim_start().starts_with("pub use ")
            && line
                .split(|c: char| !is_ident_char(c))
                .any(|word| word == name)
    })
}

fn contains_run(haystack: &[String], run: &[String]) -> bool {
    run.is_empty() || haystack.windows(run.len()).any(|w| w == run)
}

/// Why the path citation `cited` (`a::b::name`) names nothing, if it does not.
fn check_path(sources: &[Source], cited: &str) -> Option<String> {
    let segments: Vec<&str> = cited.split("::").collect();
    let (name, modules) = segments.split_last().unwrap();
    let modules = without_tests(modules);
    let candidates: Vec<&Source> = sources
        .iter()
        .filter(|s| s.modules.iter().any(|m| contains_run(m, &modules)))
        .collect();
    if candidates.is_empty() {
        return Some(format!("no source file is module {}", modules.join("::")));
    }
    if *name == "*" || candidates.iter().any(|s| defines(&s.text, name)) {
        return None;
    }
    Some(format!(
        "`{name}` is not defined in module {}",
        modules.join("::")
    ))
}

/// Why the bare name `name`, cited beside `place` (a file or folder), names nothing there.
fn check_in(sources: &[Source], place: &str, name: &str) -> Option<String> {
    let place = place.trim_end_matches('/');
    let folder = format!("{}/", place.trim_end_matches(".rs"));
    let candidates: Vec<&Source> = sources
        .iter()
        .filter(|s| s.path == place || s.path.starts_with(&folder))
        .collect();
    if candidates.is_empty() {
        return Some(format!("{place} holds no source file"));
    }
    if candidates.iter().any(|s| defines(&s.text, name)) {
        return None;
    }
    Some(format!("`{name}` is not defined in {place}"))
}

fn is_lower_ident(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_') && s.chars().all(is_ident_char)
}

/// `a::b` of lowercase identifiers, the last one possibly `*`, with an optional `()`.
fn as_path(code: &str) -> Option<&str> {
    let path = code.strip_suffix("()").unwrap_or(code);
    let segments: Vec<&str> = path.split("::").collect();
    let (last, modules) = segments.split_last()?;
    (!modules.is_empty()
        && modules.iter().all(|s| is_lower_ident(s))
        && (*last == "*" || is_lower_ident(last)))
    .then_some(path)
}

/// A bare snake_case name with at least one `_` (what a test or function is called).
fn as_bare_name(code: &str) -> Option<&str> {
    let name = code.strip_suffix("()").unwrap_or(code);
    (is_lower_ident(name) && name.trim_matches('_').contains('_')).then_some(name)
}

/// A repository path to a source file or folder that exists.
fn as_place(code: &str) -> Option<&str> {
    let top = code.split('/').next()?;
    (code.contains('/') && SOURCE_ROOTS.contains(&top) && repo().join(code).exists())
        .then_some(code)
}

/// The citations of one Markdown text that name nothing, as `line N: citation: why`, and
/// how many citations it has.
fn broken_citations(sources: &[Source], markdown: &str) -> (Vec<String>, usize) {
    let mut broken = Vec::new();
    let mut checked = 0;
    let mut fenced = false;
    for (number, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code and the text between: odd pieces are code.
        let pieces: Vec<&str> = line.split('`').collect();
        let mut place: Option<&str> = None;
        for (i, code) in pieces.iter().enumerate().skip(1).step_by(2) {
            let before = pieces[i - 1].trim_matches(|c: char| c == ',' || c.is_whitespace());
            let after = pieces.get(i + 1).copied().unwrap_or("");
            let mut report = |why: Option<String>| {
                checked += 1;
                if let Some(why) = why {
                    broken.push(format!("line {}: `{code}`: {why}", number + 1));
                }
            };
            if let Some(path) = as_path(code) {
                place = None;
                let root = path.split("::").next().unwrap();
                if !FOREIGN_ROOTS.contains(&root) && !LEGEND.contains(&path) {
                    report(check_path(sources, path));
                }
            } else if let Some(found) = as_place(code) {
                place = found.ends_with(".rs").then_some(found);
            } else if let Some(name) = as_bare_name(code) {
                // `name` right after a cited file, or `name` in `folder`.
                if let Some(file) = place.filter(|_| before.is_empty() || before == "tests:") {
                    report(check_in(sources, file, name));
                } else if after.trim() == "in"
                    && let Some(folder) = pieces.get(i + 2).and_then(|c| as_place(c))
                {
                    report(check_in(sources, folder, name));
                } else {
                    place = None;
                }
            } else {
                place = None;
            }
        }
    }
    (broken, checked)
}

fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    docs.push(repo().join("README.md"));
    docs
}

#[test]
fn every_test_and_function_the_docs_cite_exists() {
    let sources = sources();
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let (citations, count) = broken_citations(&sources, &text);
        checked += count;
        for citation in citations {
            broken.push(format!(
                "{}: {citation}",
                doc.strip_prefix(repo()).unwrap().display()
            ));
        }
    }
    // The security table alone cites over a hundred tests.
    assert!(
        checked > 100,
        "only {checked} citations found: the parsing is broken"
    );
    assert!(
        broken.is_empty(),
        "cited in the docs, but not in the sources:\n{}",
        broken.join("\n")
    );
}

#[test]
fn a_citation_of_a_missing_test_is_reported() {
    let sources = sources();
    let markdown = "\
| limit | test |
|---|---|
| schemas | `plugin_loading::a_nested_ref_schema_is_refused_at_load`, `plugin_loading::a_test_that_was_renamed` |
| unit | `sandbox::slices::db::sql::tests::no_such_unit_test`, `nomodule::a_test` |
| files | `host/sandbox/src/engine.rs` `rejected_components_are_not_cached`, `a_gone_case` |
| folder | `a_start_line_past_isize_max_is_only_far_off` in `plugins/workspace`, `not_here_either` in `plugins/workspace` |
| others | `std::fs`, `scripts::*`, `ToolSpec::new`, `plan::parse_plan` |
```sh
cargo +nightly fuzz run gone::inside_a_fence
```
";
    let (broken, checked) = broken_citations(&sources, markdown);
    assert_eq!(checked, 10);
    assert_eq!(
        broken,
        [
            "line 3: `plugin_loading::a_test_that_was_renamed`: `a_test_that_was_renamed` is \
             not defined in module plugin_loading",
            "line 4: `sandbox::slices::db::sql::tests::no_such_unit_test`: `no_such_unit_test` \
             is not defined in module sandbox::slices::db::sql",
            "line 4: `nomodule::a_test`: no source file is module nomodule",
            "line 5: `a_gone_case`: `a_gone_case` is not defined in host/sandbox/src/engine.rs",
            "line 6: `not_here_either`: `not_here_either` is not defined in plugins/workspace",
        ]
    );
}
