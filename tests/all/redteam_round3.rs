//! Red-team tests of a foreach item's message template, which the workspace writes and the
//! host parses (whenever it loads `planning/plan.json`) and renders (once per row), through the
//! real binary. Each asserts the safe outcome: a clear error naming the item, within a bounded
//! time and bounded memory, and never a crash of the host process.

use crate::support;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::workspace::write_file;

/// How long a command may take before the test calls it hung.
const BOUND: Duration = Duration::from_secs(120);

/// Runs `trellis args`, killed (and the test failed) past [`BOUND`]. What it prints goes to
/// files, so a long output cannot block it on a full pipe.
fn bounded(args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = support::trellis_command(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("the trellis binary runs");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Output {
                status,
                stdout: std::fs::read(&out_path).unwrap(),
                stderr: std::fs::read(&err_path).unwrap(),
            };
        }
        if start.elapsed() > BOUND {
            let _ = child.kill();
            let _ = child.wait();
            panic!("trellis {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn both(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A fake model that answers every call with `done` and counts the calls.
fn counting_model() -> (FakeServer, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let server = FakeServer::start(Box::new(move |_| {
        seen.fetch_add(1, Ordering::SeqCst);
        (200, completion("done", &[]))
    }));
    (server, calls)
}

/// The bytes of the regular files under `dir` (0 when it does not exist).
fn bytes_under(dir: &Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

/// A one-step workspace whose only item is a foreach over `source_sql` with `message`.
fn foreach_ws(root: &Path, source_sql: &str, message: &str, providers: Value) {
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "rows", "steps": [
            {"id": "each", "type": "message_sequence", "title": "Each", "description": "d",
             "items": [{"id": "rows", "type": "foreach", "max_iterations": 10,
                        "source_sql": source_sql, "message": message}]}
        ]})
        .to_string(),
    );
    write_file(root, "planning/step_config.json", r#"{"steps": []}"#);
    write_file(
        root,
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": providers}).to_string(),
    );
    support::workspace::create_db(root, "CREATE TABLE t (a INTEGER);");
}

/// The process ended by itself with an exit code, not killed by a signal (SIGSEGV, SIGABRT
/// of a stack overflow or an abort).
fn exited_normally(out: &Output) -> bool {
    out.status.signal().is_none()
}

/// `{{if 0}}{{else if 0}}...{{end}}`: each `else if` is one more `if` inside the last one, which
/// gtmpl parses (and renders, and drops) by recursion. The nesting check of foreach messages
/// counts `if`, `range` and `with` but not `else if`, so 200,000 of them (2.6 MB, well within
/// the 16 MiB a plan may be) overflow the stack of the host while it merely loads the plan:
/// `trellis validate` dies of SIGABRT ("thread 'main' has overflowed its stack") instead of
/// naming `steps[0].items[0].message`.
#[test]
fn a_chain_of_else_ifs_in_a_foreach_message_does_not_overflow_the_hosts_stack() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let message = format!("{{{{if 0}}}}{}{{{{end}}}}", "{{else if 0}}".repeat(200_000));
    foreach_ws(&ws, "SELECT 1 AS a", &message, json!({}));
    let out = bounded(&["validate", ws.to_str().unwrap()]);
    let text = both(&out);
    assert!(
        exited_normally(&out),
        "validate was killed by signal {:?}: {}",
        out.status.signal(),
        &text[text.len().saturating_sub(2000)..]
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("message"), "{text}");
}

/// `{{.a.a.a....}}`: the host fills a field chain a template names, when the row lacks it, by
/// recursion over the chain (`fill_missing` in `host/runner/src/template.rs`), then converts
/// and drops the nested objects it made by recursion too. A chain of 300,000 links (600 KB
/// of message) passed `validate` and the parse, and the first row's render overflowed the
/// stack of the host in the middle of the run (SIGABRT, the step never ended as failed).
/// A message is now at most 64 KiB, and a chain within that is refused by its length.
#[test]
fn a_long_field_chain_in_a_foreach_message_does_not_overflow_the_hosts_stack() {
    let (server, calls) = counting_model();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    // 20,000 links (40 KB, within what a message may be): refused by the chain's length.
    let message = format!("{{{{.{}}}}}", vec!["a"; 20_000].join("."));
    foreach_ws(&ws, "SELECT 1 AS b", &message, server.providers());
    let out = bounded(&["run", ws.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let text = both(&out);
    assert!(
        exited_normally(&out),
        "run was killed by signal {:?}: {}",
        out.status.signal(),
        &text[text.len().saturating_sub(2000)..]
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(
            "steps[0].items[0].message (step \"each\"): not a valid Go template: an action \
             names a field chain of more than 32 links"
        ),
        "{text}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0, "a turn ran");
}

/// `{{printf "%70000d" 1}}`: gtmpl formats a printf width with Rust's `format!`, which panics
/// on a width over 65,535 ("Formatting argument out of range"). A format written in the
/// message is refused by `validate`, naming the message; one taken from the row is refused
/// as the row renders, and the run fails naming the item, without a panic or a turn.
#[test]
fn a_printf_width_past_what_rust_formats_does_not_panic_the_host() {
    let (server, calls) = counting_model();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    foreach_ws(
        &ws,
        "SELECT 1 AS a",
        r#"Row {{printf "%70000d" .a}}"#,
        server.providers(),
    );
    let validate = bounded(&["validate", ws.to_str().unwrap()]);
    let text = both(&validate);
    assert_eq!(validate.status.code(), Some(1), "{text}");
    assert!(
        text.contains("steps[0].items[0].message")
            && text.contains("`%70000`: a width or precision may be at most 1000"),
        "{text}"
    );

    let ws = dir.path().join("ws2");
    foreach_ws(
        &ws,
        "SELECT '%70000d' AS f, 1 AS a",
        r#"Row {{printf .f .a}}"#,
        server.providers(),
    );
    let validate = bounded(&["validate", ws.to_str().unwrap()]);
    assert_eq!(validate.status.code(), Some(0), "{}", both(&validate));
    let out = bounded(&["run", ws.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let text = both(&out);
    assert!(exited_normally(&out), "{text}");
    assert!(!text.contains("panicked"), "the host panicked: {text}");
    assert!(!text.contains("out of range"), "the host panicked: {text}");
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("foreach item \"rows\", row 1: the message cannot be rendered")
            && text.contains("at most 1000"),
        "{text}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0, "a turn ran");
}

/// `{{printf "%65535d" 1}}` 2,048 times: 45 KB of message that renders to 128 MiB for each
/// row, which the host builds whole (`MessageTemplate::render`, `host/runner/src/driver/items.rs`
/// has no limit on a rendered message), keeps in the conversation, writes to the turn log and
/// `session.json` and hands to the provider guest, which runs out of its own memory on it.
/// (8,192 of them, 180 KB: 2.1 GB peak resident memory, 1.07 GB written under `runs/`, three
/// minutes.) The budget asserted: a message over what one request may carry is refused as
/// it is rendered, so the run stays under 256 MiB of resident memory and writes under
/// 16 MiB under `runs/`.
#[test]
fn a_foreach_message_rendering_to_hundreds_of_mib_is_refused_within_a_bounded_memory() {
    let (server, calls) = counting_model();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let message = r#"{{printf "%65535d" 1}}"#.repeat(2048);
    foreach_ws(&ws, "SELECT 1 AS a", &message, server.providers());
    let log = dir.path().join("out.log");
    let (status, peak, out) = support::measure::peak_memory(
        support::trellis_command(&["run", ws.to_str().unwrap(), "--allow-host", "127.0.0.1"]),
        &log,
    );
    let tail = &out[out.len().saturating_sub(2000)..];
    assert!(
        peak < 256 << 20,
        "peak resident memory {peak} bytes: {tail}"
    );
    let written = bytes_under(&ws.join("runs"));
    assert!(
        written < 16 << 20,
        "{written} bytes written under runs/: {tail}"
    );
    assert_eq!(status, 1, "{tail}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "a 128 MiB message was sent"
    );
}

/// A workspace whose `workflow.json` declares `variables` and whose plan is `steps`.
fn variables_ws(root: &Path, variables: Value, steps: Value, providers: Value) {
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "vars", "steps": steps}).to_string(),
    );
    write_file(root, "planning/step_config.json", r#"{"steps": []}"#);
    write_file(
        root,
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": providers,
               "variables": variables})
        .to_string(),
    );
}

/// A human_input question of 2 MiB of `{`: the host substitutes workflow variables in it
/// (`substitute` in `host/runner/src/workflow_run/variables.rs`) by looking, at each `{`, for
/// the `}` that closes it through the whole rest of the text, and on a miss moves one brace on
/// and looks again: quadratic, 2.2 * 10^12 bytes scanned for this question (`trellis run` was
/// still at it, one core busy, when killed after 200 s; 8 MiB, within the plan's cap, is 16
/// times that) before the first step starts. The run must get past it within the bound.
#[test]
fn substituting_variables_in_a_text_of_unclosed_braces_ends() {
    let (server, _calls) = counting_model();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    variables_ws(
        &ws,
        json!({"A": "1"}),
        json!([{"id": "ask", "type": "human_input", "title": "Ask", "description": "d",
                "question": "{".repeat(2 << 20)}]),
        server.providers(),
    );
    let out = bounded(&[
        "run",
        ws.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--input",
        "ask=yes",
    ]);
    let text = both(&out);
    let head = &text[..text.len().min(2000)];
    assert!(exited_normally(&out), "{head}");
    assert_eq!(out.status.code(), Some(0), "{head}");
    assert!(
        text.contains("step ask: completed (ask = \"yes\")"),
        "{head}"
    );
}

/// One 4 MiB workflow variable and 200 steps: the host appends the block of variables to the
/// description of every step of the plan at the start of a run (`apply_variables`), a copy
/// each, 800 MiB held at once for 4 MiB of `workflow.json` and a 20 KB plan (a 16 MiB value
/// and 100,000 steps, both within the caps of their files, would be 1.6 TB). The budget
/// asserted: the run's peak resident memory stays under 256 MiB.
#[test]
fn a_large_variable_is_not_copied_into_every_step_of_the_plan() {
    let (server, _calls) = counting_model();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let steps: Vec<Value> = (0..200)
        .map(
            |i| json!({"id": format!("s{i}"), "type": "regular", "title": "T", "description": "d"}),
        )
        .collect();
    variables_ws(
        &ws,
        json!({"BIG": "v".repeat(4 << 20)}),
        Value::Array(steps),
        server.providers(),
    );
    let log = dir.path().join("out.log");
    let (_status, peak, out) = support::measure::peak_memory(
        support::trellis_command(&[
            "run",
            ws.to_str().unwrap(),
            "--allow-host",
            "127.0.0.1",
            "--step",
            "s0",
        ]),
        &log,
    );
    let tail = &out[out.len().saturating_sub(2000)..];
    assert!(
        peak < 256 << 20,
        "peak resident memory {peak} bytes: {tail}"
    );
}

/// `validate` warns about each field a foreach message names that the query does not return,
/// and each warning lists every column of the query. A message naming 20,000 fields (270 KB)
/// over a query of 1,000 columns of 24-byte names (30 KB) makes 20,000 warnings of 26 KB
/// each: 520 MB of diagnostics held and printed for 300 KB of plan (`row_fields` and the
/// warning in `host/workflow/src/foreach_sql.rs`; `row_fields` also looks each field up in
/// a list of those seen, quadratic in their number). The budget asserted: `validate` stays
/// under 256 MiB of resident memory and prints under 16 MiB.
#[test]
fn validate_of_a_message_naming_many_missing_fields_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let columns: Vec<String> = (0..1000)
        .map(|i| format!("1 AS column_with_a_long_name_{i:04}"))
        .collect();
    let source_sql = format!("SELECT {}", columns.join(", "));
    let message: String = (0..20_000).map(|i| format!("{{{{.f{i}}}}}")).collect();
    foreach_ws(&ws, &source_sql, &message, json!({}));
    let log = dir.path().join("out.log");
    let (_status, peak, out) = support::measure::peak_memory(
        support::trellis_command(&["validate", ws.to_str().unwrap()]),
        &log,
    );
    let printed = out.len();
    let head = &out[..out.len().min(2000)];
    assert!(
        peak < 256 << 20,
        "peak resident memory {peak} bytes: {head}"
    );
    assert!(
        printed < 16 << 20,
        "validate printed {printed} bytes: {head}"
    );
}
