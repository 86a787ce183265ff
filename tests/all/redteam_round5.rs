//! Attacks of the fifth red team, through the `trellis` binary: the JSONPaths of a gate's
//! `json_checks` are bounded before they are parsed (length, nesting, descendant segments,
//! regex functions) and in what they select; a route file of too many values is refused;
//! a Python plugin build reaches no site-packages of the operator's.

use crate::support;

use std::path::Path;

use serde_json::{Value, json};
use support::workspace::write_files;

/// A workspace whose step `s` has one JSON check `check` on `out.json`, and `out` as the
/// step's output in the active run.
fn gate_workspace(root: &Path, check: Value, out: &str) {
    let plan = json!({"objective": "o", "steps": [
        {"id": "s", "type": "regular", "title": "t", "description": "d",
         "context_output": ["out.json"],
         "validation_schema": {"files": [{"file_name": "out.json", "json_checks": [check]}]}}
    ]});
    write_files(
        root,
        &[
            ("planning/plan.json", plan.to_string()),
            ("runs/iteration-0/execution/s/out.json", out.to_string()),
        ],
    );
}

fn told(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A path of 10,000 nested parentheses overflowed the parser's stack and aborted
/// `validate`, `run` and `check` (and the builder, from one model tool call); two
/// descendant segments made `$..*..*` select depth x depth x nodes (4.5 GB from a 20 KB
/// output); `match()` compiled its pattern for every value (103 s for 4,000). Each is now
/// refused by `validate` with the reason.
#[test]
fn hostile_json_paths_are_refused_before_they_are_parsed() {
    let deep = format!("$[?{}@{}]", "(".repeat(10_000), ")".repeat(10_000));
    let nested = format!("$[?{}@]", "(".repeat(40));
    for (path, said) in [
        (
            deep.as_str(),
            "a JSONPath of 20005 bytes: a check's path may be 4096 bytes at most",
        ),
        (
            nested.as_str(),
            "brackets and parentheses nest 41 deep, more than the 32 a check's path may",
        ),
        (
            "$..*..*",
            "2 descendant segments (`..`); a check's path may have one",
        ),
        (
            "$[?match(@, \"\\\\w{60}\")]",
            "match() is not run in a check's path",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        gate_workspace(dir.path(), json!({"path": path, "must_exist": true}), "[1]");
        for command in ["validate", "check"] {
            let mut args = vec![command, dir.path().to_str().unwrap()];
            if command == "check" {
                args.extend(["--step", "s"]);
            }
            let out = support::trellis(&args);
            let text = told(&out);
            assert_eq!(out.status.code(), Some(1), "{command} {path:.40}: {text}");
            assert!(text.contains(said), "{command}: {said:?} in {text:.2000}");
        }
    }
    // A string holding brackets or dots is not counted.
    let dir = tempfile::tempdir().unwrap();
    gate_workspace(
        dir.path(),
        json!({"path": "$['..((((((((((((((((((((((((((((((((((']", "must_exist": false}),
        "{}",
    );
    let out = support::trellis(&["validate", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", told(&out));
}

/// A path selecting more than 10,000 values is a schema error of the gate, counted before
/// the values' locations are made; a consistency check looks its other value up once, not
/// once per value (160,000 values took 55 s).
#[test]
fn a_check_selecting_too_many_values_is_refused_and_comparisons_are_not_quadratic() {
    let dir = tempfile::tempdir().unwrap();
    let zeros = |n: usize| format!("[{}0]", "0,".repeat(n - 1));
    gate_workspace(
        dir.path(),
        json!({"path": "$[*]", "consistency_check":
               {"compare_with_path": "$[0]", "type": "equals"}}),
        &zeros(160_000),
    );
    let root = dir.path().to_str().unwrap();
    let out = support::trellis(&["check", root, "--step", "s"]);
    let text = told(&out);
    assert_eq!(out.status.code(), Some(1), "{text:.2000}");
    assert!(
        text.contains(
            "JSONPath \"$[*]\" selects 160000 values of out.json, more than the 10000 a check \
             examines; narrow the path"
        ),
        "{text:.2000}"
    );
    // Under the cap every value is compared with the one other value.
    write_files(
        dir.path(),
        &[("runs/iteration-0/execution/s/out.json", zeros(10_000))],
    );
    let out = support::trellis(&["check", root, "--step", "s"]);
    let text = told(&out);
    assert!(out.status.success(), "{text:.2000}");
    // Every value compared, the first 100 passes recorded (a report records 100 of each).
    assert!(
        text.contains("10000 checks, 0 failed"),
        "{}",
        &text[text.len().saturating_sub(500)..]
    );
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("PASS out.json $[") && l.ends_with("is equal to 0"))
            .count(),
        100,
        "{text:.2000}"
    );
}

/// The selection file a routing step reads is a guest's output: one of many small values
/// (64 MiB of them took 1.2 GB parsed) is refused unparsed, naming the file.
#[test]
fn a_route_file_of_too_many_values_is_refused_unparsed() {
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "o", "steps": [
        {"id": "pick", "type": "routing", "title": "Pick", "route_source_file": "route.json",
         "routes": [{"route_id": "a", "next_step_id": "end"}], "default_route_id": "a"}
    ]});
    let budget = trellis_sandbox::json_values::MAX_FILE_VALUES;
    let route = format!(
        r#"{{"select_route": "a", "pad": [{}0]}}"#,
        "0,".repeat(budget)
    );
    write_files(
        dir.path(),
        &[
            ("planning/plan.json", plan.to_string()),
            ("runs/iteration-0/execution/route.json", route),
        ],
    );
    let out = support::trellis(&["run", dir.path().to_str().unwrap(), "--step", "pick"]);
    let text = told(&out);
    assert_eq!(out.status.code(), Some(1), "{text:.2000}");
    assert!(
        text.contains("route.json: holds about")
            && text.contains(&format!(
                "more than the {budget} Trellis parses of one file"
            )),
        "{text:.2000}"
    );
}

/// componentize-py asks the `python3` on `PATH` for its site-packages and lets the plugin's
/// code write there while it builds: a hostile `plugin.py` planted a `.pth` in the
/// operator's Python, run natively at its next start. The build's `PATH` now answers with
/// an empty folder of the private staging area. (componentize-py is a stand-in that asks as
/// the real one does and writes where a hostile plugin would.)
#[test]
fn a_python_build_gives_the_plugin_no_site_packages_of_the_operator() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("hostile");
    write_files(
        &project,
        &[
            (
                "plugin.json",
                json!({"id": "hostile", "kind": "tool", "version": "0.1.0",
                       "description": "a planted project", "component": "hostile.wasm"})
                .to_string(),
            ),
            ("plugin.py", "VALUE = 1\n".to_string()),
        ],
    );
    // The operator's Python: the first `python3` on PATH, and its site-packages.
    let operator_site = dir.path().join("operator-site-packages");
    std::fs::create_dir(&operator_site).unwrap();
    let operator_bin = dir.path().join("operator-bin");
    std::fs::create_dir(&operator_bin).unwrap();
    let script = |path: &Path, body: String| {
        std::fs::write(path, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    script(
        &operator_bin.join("python3"),
        format!("printf '%s\\n' '{}'\n", operator_site.display()),
    );
    let record = dir.path().join("asked.txt");
    let component = trellis_test_programs::path("adversary");
    let tool = dir.path().join("componentize-py");
    script(
        &tool,
        format!(
            r#"if [ "$1" = "--version" ]; then echo "componentize-py {version}"; exit 0; fi
while [ $# -gt 0 ]; do
  case "$1" in -o) out="$2"; shift ;; esac
  shift
done
site=$(python3 -c 'import site; print(";".join(site.getsitepackages()))')
echo "$site" > '{record}'
ls -A "$site" >> '{record}'
echo 'import os' > "$site/zz_planted.pth"
cp '{component}' "$out"
"#,
            version = trellis_sandbox::script::COMPONENTIZE_PY_VERSION,
            record = record.display(),
            component = component.display(),
        ),
    );
    let path = format!(
        "{}:{}",
        operator_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = support::trellis_command(&["plugin", "build", project.to_str().unwrap()])
        .env("TRELLIS_COMPONENTIZE_PY", &tool)
        .env("PATH", &path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", told(&out));
    let asked = std::fs::read_to_string(&record).unwrap();
    let site = asked.lines().next().unwrap();
    assert_ne!(site, operator_site.to_str().unwrap(), "{asked}");
    assert!(
        Path::new(site)
            .parent()
            .and_then(|p| p.file_name())
            .is_some_and(|n| n.to_string_lossy().starts_with("trellis-plugin-build-")),
        "a folder of the staging area: {asked}"
    );
    assert_eq!(asked.lines().count(), 1, "it was empty: {asked}");
    assert!(
        std::fs::read_dir(&operator_site).unwrap().next().is_none(),
        "nothing was written to the operator's site-packages"
    );
    assert!(!Path::new(site).exists(), "removed with the staging area");
}

/// The executions a builder session starts take their model calls from the session's
/// `--max-model-calls`: each had 10,000 of its own, so a session capped at 2 calls made 63.
/// Here the builder's model starts the step and the step's agent asks for a tool call
/// forever; under a budget of 3 the model is called 3 times in all.
#[test]
fn the_builders_executions_take_their_model_calls_from_the_sessions_budget() {
    use support::fake_llm::{FakeServer, completion};
    let llm = FakeServer::start(Box::new(|body| {
        let system = body["messages"][0]["content"].as_str().unwrap_or_default();
        let answered = body["messages"]
            .as_array()
            .map_or(0, |m| m.iter().filter(|m| m["role"] == "tool").count());
        if system.contains("Say hello.") {
            // The step's agent: one more tool call, always.
            let args = json!({"path": "planning/plan.json"});
            (200, completion("", &[("workspace__read_file", args)]))
        } else if answered == 0 {
            (
                200,
                completion("", &[("execute_step", json!({"step_id": "greet"}))]),
            )
        } else {
            (200, completion("started", &[]))
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    write_files(
        ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "greet", "type": "regular", "title": "Greet",
                     "description": "Say hello."}
                ]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": llm.providers()})
                .to_string(),
            ),
        ],
    );
    let out = support::trellis(&[
        "builder",
        ws.to_str().unwrap(),
        "--max-model-calls",
        "3",
        "--allow-host",
        "127.0.0.1",
        "-m",
        "run greet",
    ]);
    let text = told(&out);
    let seen = llm.seen().len();
    assert_eq!(seen, 3, "model calls in all: {text:.3000}");
    assert!(
        text.contains("model calls"),
        "the limit is named: {text:.3000}"
    );
}

/// Runs `trellis builder WS -m go` against a model whose first answer is one call of `tool`
/// with `args` and whose second is plain text; answers what the tool answered and the
/// builder's output.
fn builder_tool_result(ws: &Path, tool: &str, args: Value) -> (String, String) {
    use support::fake_llm::{FakeServer, completion};
    let (tool, first) = (tool.to_string(), args);
    let llm = FakeServer::start(Box::new(move |body| {
        let answered = body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        if answered {
            (200, completion("done", &[]))
        } else {
            (200, completion("", &[(tool.as_str(), first.clone())]))
        }
    }));
    write_files(
        ws,
        &[(
            "workflow.json",
            json!({"llm": {"provider": "openai", "model_id": "m"},
                   "providers": llm.providers()})
            .to_string(),
        )],
    );
    let out = support::trellis(&[
        "builder",
        ws.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "-m",
        "go",
    ]);
    let text = told(&out);
    let result = llm
        .seen()
        .iter()
        .flat_map(|body| body["messages"].as_array().cloned().unwrap_or_default())
        .find(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .unwrap_or_else(|| panic!("the tool's result reached the model: {text:.3000}"));
    (result, text)
}

/// Files of `len` bytes that take no disk: NUL bytes, which are valid UTF-8.
fn sparse_file(path: &Path, len: u64) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

/// One `validate_plan_change` of 20 references over 20 run folders, each with a sparse
/// 64 MiB step config, spun 71 s of host CPU (each reference searched each file whole); one
/// answer could carry 400,000 references. Now the references are searched in one pass, a
/// call reads at most 256 MiB, and what it could not check is a failure naming the budget.
#[test]
fn a_builder_host_tool_reads_within_its_calls_budget() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    write_files(
        ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "a", "type": "regular", "title": "A", "description": "q3 here"}
                ]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
        ],
    );
    for n in 0..20 {
        sparse_file(
            &ws.join(format!("runs/iteration-{n}/planning/step_config.json")),
            64 << 20,
        );
    }
    let references: Vec<String> = (0..20).map(|n| format!("q{n}")).collect();
    let (result, text) = builder_tool_result(
        ws,
        "validate_plan_change",
        json!({"forbidden_references": references}),
    );
    let answer: Value = serde_json::from_str(&result).unwrap_or_else(|e| panic!("{e}: {result}"));
    assert_eq!(answer["passed"], false, "{result:.3000}");
    let failures = answer["failures"].as_array().unwrap();
    assert!(
        failures.iter().any(|f| f["check"] == "forbidden_reference"
            && f["reference"] == "q3"
            && f["file"] == "planning/plan.json"),
        "the plan's reference is still found: {result:.3000}"
    );
    let unchecked: Vec<&Value> = failures
        .iter()
        .filter(|f| f["check"] == "not_checked")
        .collect();
    assert_eq!(unchecked.len(), 1, "{result:.3000}");
    assert!(
        unchecked[0]["error"]
            .as_str()
            .unwrap()
            .contains("budget of 268435456 bytes of host reads"),
        "{result:.3000}"
    );
    assert!(text.contains("done"), "the turn went on: {text:.3000}");

    // More references than a call searches for are refused by the tool's schema.
    let many: Vec<String> = (0..257).map(|n| format!("r{n}")).collect();
    let (result, _) = builder_tool_result(
        ws,
        "validate_plan_change",
        json!({"forbidden_references": many}),
    );
    assert!(result.contains("forbidden_references"), "{result:.3000}");
    assert!(!result.contains("\"passed\""), "{result:.3000}");
}

/// `review_step_code` read each script whole (up to 64 MiB) to show 12,000 characters of
/// it: 200 sparse scripts took 56 s, and a script past 64 MiB could not be shown at all.
/// Now it reads what it shows.
#[test]
fn review_step_code_reads_only_what_it_shows() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    write_files(
        ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "a", "type": "regular", "title": "A", "description": "d"}
                ]})
                .to_string(),
            ),
            (
                "planning/step_config.json",
                json!({"steps": [{"id": "a",
                        "agent_configs": {"declared_execution_mode": "scripted"}}]})
                .to_string(),
            ),
        ],
    );
    let script = ws.join("code/a/main.py");
    sparse_file(&script, 100 << 20);
    let (result, text) = builder_tool_result(ws, "review_step_code", json!({}));
    let answer: Value = serde_json::from_str(&result).unwrap_or_else(|e| panic!("{e}: {result}"));
    let shown = answer["steps"][0]["script"].as_str().unwrap_or_default();
    assert!(shown.ends_with("[... cut]"), "{result:.2000} {text:.2000}");
    assert_eq!(shown.chars().filter(|c| *c == '\0').count(), 12_000);
}

/// Every turn rewrote the step's whole conversation to `session.json` (three times a row of
/// a foreach): 1,000 rows of 16,000-character replies wrote 7.8 GB. Now the session is
/// rewritten when its conversation has grown by half, and at the step's end, and still holds
/// the whole conversation then.
#[test]
fn a_long_foreach_writes_its_session_a_bounded_number_of_times() {
    use support::fake_llm::{FakeServer, completion};
    const ROWS: usize = 200;
    let reply = "x".repeat(16_000);
    let llm = FakeServer::start(Box::new(move |_| (200, completion(&reply, &[]))));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let seed: String = (0..ROWS)
        .map(|n| format!("INSERT INTO t VALUES({n});\n"))
        .collect();
    write_files(
        ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "s", "type": "message_sequence", "title": "t", "description": "d",
                     "items": [{"id": "each", "type": "foreach", "max_iterations": ROWS,
                                "source_sql": "SELECT n FROM t ORDER BY n",
                                "message": "row {{.n}}"}]}
                ]})
                .to_string(),
            ),
            ("db/seed.sql", format!("CREATE TABLE t(n INTEGER);\n{seed}")),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": llm.providers()})
                .to_string(),
            ),
        ],
    );
    let mut child =
        support::trellis_command(&["run", ws.to_str().unwrap(), "--allow-host", "127.0.0.1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
    // What the process wrote, read from /proc while it runs (the last reading before it
    // ends misses at most its last moments).
    let io = format!("/proc/{}/io", child.id());
    let mut written = 0u64;
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(&io)
            && let Some(n) = text
                .lines()
                .find_map(|l| l.strip_prefix("wchar: "))
                .and_then(|n| n.parse().ok())
        {
            written = n;
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert!(status.success());
    let session: Value = serde_json::from_slice(
        &std::fs::read(ws.join("runs/iteration-0/execution/s/session.json")).unwrap(),
    )
    .unwrap();
    let messages = session["conversation_history"].as_array().unwrap();
    assert_eq!(
        messages.len(),
        1 + 2 * ROWS,
        "the whole conversation is kept"
    );
    // 3.2 MB of replies: the session (at most three times its size), the turn logs (each
    // turn's messages once) and the database. Every turn writing the whole session was 960 MB.
    assert!(
        written < 48 << 20,
        "{written} bytes written for {ROWS} rows"
    );
}

/// A planted changelog of the day `bytes` long (one entry with a long reason).
fn planted_changelog(ws: &Path, bytes: usize) -> std::path::PathBuf {
    let day: String = trellis_runner::session::now_rfc3339()
        .chars()
        .take(10)
        .collect();
    let rel = format!("planning/changelog/changelog-{day}.json");
    let entry = json!([{"timestamp": format!("{day}T00:00:00Z"), "tool": "planted",
                        "reason": "x".repeat(bytes), "step_ids": [], "changes": []}]);
    write_files(ws, &[(rel.as_str(), entry.to_string())]);
    ws.join(rel)
}

/// Each plan edit rereads and rewrites the day's changelog whole, and rewrites the plan:
/// 192 tiny edits against a planted 60 MiB changelog wrote 12 GB in one builder turn (round
/// 6). What an edit may rewrite now comes out of the turn's write budget, and a day's
/// changelog goes on in a new file past 4 MiB.
#[test]
fn plan_edits_write_within_the_turns_budget_and_the_changelog_rolls_over() {
    use support::fake_llm::{FakeServer, completion};
    let edits: Vec<(String, Value)> = (0..30)
        .map(|i| {
            (
                "update_variable".to_string(),
                json!({"reason": "r", "action": "add", "name": format!("V{i}"), "value": "x"}),
            )
        })
        .collect();
    let llm = FakeServer::start(Box::new(move |body| {
        let answered = body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        if answered {
            return (200, completion("done", &[]));
        }
        let calls: Vec<(&str, Value)> =
            edits.iter().map(|(n, a)| (n.as_str(), a.clone())).collect();
        (200, completion("", &calls))
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    write_files(
        ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "a", "type": "regular", "title": "A", "description": "d"}
                ]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": llm.providers()})
                .to_string(),
            ),
        ],
    );
    let changelog = planted_changelog(ws, 3 << 20);
    let out = support::trellis(&[
        "builder",
        ws.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-turn-write-mib",
        "16",
        "-m",
        "go",
    ]);
    let text = told(&out);
    let results: Vec<String> = llm
        .seen()
        .iter()
        .flat_map(|body| body["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(results.len(), 30, "{text:.3000}");
    let done = results.iter().filter(|r| r.contains("\"ok\":true")).count();
    let refused = results
        .iter()
        .filter(|r| r.contains("refused: this edit may rewrite"))
        .count();
    // Each edit may rewrite the 3 MiB changelog: a 16 MiB turn holds a few of them.
    assert!((2..=5).contains(&done), "{done} edits done: {results:?}");
    assert_eq!(done + refused, 30, "{results:?}");
    let entries: Value = serde_json::from_slice(&std::fs::read(&changelog).unwrap()).unwrap();
    assert_eq!(entries.as_array().unwrap().len(), 1 + done);

    // A day's changelog of 4 MiB and more goes on in the next file, and stays as it was.
    let full = planted_changelog(ws, 5 << 20);
    let before = std::fs::read(&full).unwrap();
    let out = support::trellis(&[
        "builder",
        ws.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "-m",
        "go",
    ]);
    assert!(out.status.success(), "{}", told(&out));
    assert_eq!(std::fs::read(&full).unwrap(), before);
    let next = full.with_file_name(
        full.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .replace(".json", "-2.json"),
    );
    let entries: Value = serde_json::from_slice(&std::fs::read(&next).unwrap()).unwrap();
    assert!(
        !entries.as_array().unwrap().is_empty(),
        "{}",
        next.display()
    );
}

/// Orphan step-config entries each got a search of the plan for a near id and a warning
/// line: 40,000 of them against a 3,000-step plan took `trellis validate` 82 s (round 6).
/// The first 20 get one; the rest are counted in one line.
#[test]
fn orphan_configs_are_listed_twenty_then_counted() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let steps: Vec<Value> = (0..200)
        .map(|i| json!({"id": format!("step-{i}"), "type": "regular", "title": "T", "description": "d"}))
        .collect();
    let configs: Vec<Value> = (0..2000)
        .map(|i| {
            json!({"id": format!("gone-{i}"), "agent_configs": {"prerequisite_rules": [
            {"depends_on_step": format!("nowhere-{i}")}]}})
        })
        .collect();
    write_files(
        ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": steps}).to_string(),
            ),
            (
                "planning/step_config.json",
                json!({"steps": configs}).to_string(),
            ),
        ],
    );
    let out = support::trellis(&["validate", ws.to_str().unwrap()]);
    let text = told(&out);
    let orphan_lines = text
        .lines()
        .filter(|l| l.contains("orphan config: \"gone-"))
        .count();
    assert_eq!(orphan_lines, 20, "{text:.3000}");
    assert!(
        text.contains("orphan config: and 1980 more entries match no step of the plan"),
        "{text:.3000}"
    );
    let hinted = text.matches("did you mean").count();
    assert!(hinted <= 40, "{hinted} searches for near ids");
}

/// `validate_plan_change` compared a step's `context_dependencies` with the expected ones
/// pairwise (150,000 each: 262 s) and echoed both lists whole. It compares sets now, and
/// answers counts and at most 100 of each difference.
#[test]
fn expected_context_dependencies_are_compared_as_sets() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    // As many as a step may list (1,000); the expected ones five times more.
    let deps: Vec<String> = (0..1000).map(|i| format!("a/{i}.json")).collect();
    write_files(
        ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "s1", "type": "regular", "title": "T", "description": "d",
                     "context_dependencies": deps}
                ]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
        ],
    );
    let want: Vec<String> = (0..5000).map(|i| format!("b/{i}.json")).collect();
    let (result, _) = builder_tool_result(
        ws,
        "validate_plan_change",
        json!({"expected_context_dependencies": {"s1": want}}),
    );
    let answer: Value =
        serde_json::from_str(&result).unwrap_or_else(|e| panic!("{e}: {result:.500}"));
    let failure = &answer["failures"][0];
    assert_eq!(failure["expected_count"], 5000, "{result:.2000}");
    assert_eq!(failure["missing"]["more"], 4900, "{result:.2000}");
    assert_eq!(failure["extra"]["first"].as_array().unwrap().len(), 100);
    assert!(result.len() < 64 << 10, "{} bytes", result.len());
}
