//! Attacks of the seventh red team, through the `trellis` binary: a model answer of a
//! million values no longer leaves a builder conversation the next turn cannot open, a
//! schema refusal no longer echoes its megabytes, a day's changelog rolls over by values as
//! well as bytes and summarises huge changes, the builder tool calls of a turn share one host
//! budget, and the server's changelog answer parses within one budget.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::workspace::write_files;
use trellis_sandbox::json_values::json_values;

fn told(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A model that gives `answers` in order (each a list of tool calls), then answers `done`
/// to every later request; its workflow.json in `ws`.
fn scripted_model(ws: &Path, answers: Vec<Vec<(&'static str, Value)>>) -> FakeServer {
    let next = AtomicUsize::new(0);
    let llm = FakeServer::start(Box::new(move |_| {
        match answers.get(next.fetch_add(1, Ordering::SeqCst)) {
            Some(calls) => (200, completion("", calls)),
            None => (200, completion("done", &[])),
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
    llm
}

fn builder(ws: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["builder", ws.to_str().unwrap(), "--allow-host", "127.0.0.1"];
    args.extend_from_slice(extra);
    support::trellis(&args)
}

/// Every tool result the model was sent, in order, each once.
fn tool_results(llm: &FakeServer) -> Vec<String> {
    let seen = llm.seen();
    let last = seen.last().cloned().unwrap_or(Value::Null);
    last["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The one conversation file under `ws/builder/conversation/<date>/`.
fn conversation_file(ws: &Path) -> PathBuf {
    let mut files = Vec::new();
    for day in std::fs::read_dir(ws.join("builder/conversation")).unwrap() {
        let day = day.unwrap().path();
        if day.is_dir() {
            files.extend(std::fs::read_dir(day).unwrap().map(|f| f.unwrap().path()));
        }
    }
    assert_eq!(files.len(), 1, "{files:?}");
    files.remove(0)
}

fn minimal_plan(ws: &Path) {
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
        ],
    );
}

/// One answer of 3.9 MB, a tool call with an extra argument of 1.3 million zeros, was stored
/// pretty-printed in the conversation (22 MB, 1.3 million values): the next `--session`
/// turn refused to read it, and so did the server's restore (round 7). A refused
/// `validate_plan_change` of a 330,000-item list came back to the model whole in its error
/// (2.5x its size a turn). Now the refusal is cut, the conversation is fitted to what its
/// reader takes (oldest payloads cut, every message kept), and the session goes on.
#[test]
fn a_conversation_the_builder_writes_is_one_it_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    minimal_plan(ws);
    let zeros = vec![0; 1_300_000];
    let items: Vec<String> = (0..330_000).map(|i| format!("d{i}")).collect();
    let llm = scripted_model(
        ws,
        vec![
            vec![("get_cost_summary", json!({"pad": zeros.clone()}))],
            vec![(
                "validate_plan_change",
                json!({"expected_context_dependencies": {"s1": items}}),
            )],
            vec![("get_cost_summary", json!({"pad": zeros}))],
        ],
    );
    let out = builder(ws, &["-m", "go"]);
    let text = told(&out);
    assert!(out.status.success(), "{:.3000}", text);
    // The terminal shows a line per call, not the arguments or the refusal whole.
    assert!(text.len() < 64 << 10, "{} bytes printed", text.len());
    let results = tool_results(&llm);
    assert_eq!(results.len(), 3, "{results:.3000?}");
    assert!(
        results[0].contains("'pad' was unexpected"),
        "{:.3000}",
        results[0]
    );
    assert!(
        results[1].contains("invalid arguments for validate_plan_change")
            && results[1].len() < 8 << 10,
        "a refusal of {} bytes: {:.3000}",
        results[1].len(),
        results[1]
    );

    let file = conversation_file(ws);
    let bytes = std::fs::read(&file).unwrap();
    assert!(
        bytes.len() <= 24 << 20 && json_values(&bytes) <= 500_000,
        "{} bytes, {} values",
        bytes.len(),
        json_values(&bytes)
    );
    let saved = String::from_utf8_lossy(&bytes);
    assert!(
        saved.contains("cut from the conversation to keep it under its budget"),
        "the oldest arguments are cut"
    );

    // The next turn of the same session opens it and sends the whole conversation on.
    let name = file.file_name().unwrap().to_str().unwrap();
    let session = name
        .strip_prefix("session-")
        .and_then(|n| n.strip_suffix("-conversation.json"))
        .unwrap()
        .to_string();
    let out = builder(ws, &["--session", &session, "-m", "and now?"]);
    assert!(out.status.success(), "{:.3000}", told(&out));
    let last = llm.seen().last().cloned().unwrap();
    let messages = last["messages"].as_array().unwrap();
    let users: Vec<&str> = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(users, ["go", "and now?"], "{:.2000}", last);
    assert_eq!(
        messages.iter().filter(|m| m["role"] == "tool").count(),
        3,
        "every call keeps its answer"
    );
}

/// A day's changelog of 1.5 million values in 3 MB (under the 4 MiB roll-over) blocked every
/// builder edit for the day, and an edit of a huge value wrote an entry of its old and new
/// values whole (an 18 MB day file its reader refused). A day's file now rolls over by values
/// too, and an entry past 1 MiB keeps a summary of each huge value.
#[test]
fn the_changelog_rolls_over_by_values_and_summarises_huge_changes() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    minimal_plan(ws);
    let day: String = trellis_runner::session::now_rfc3339()
        .chars()
        .take(10)
        .collect();
    let planted = ws.join(format!("planning/changelog/changelog-{day}.json"));
    let entry = json!([{"timestamp": format!("{day}T00:00:00Z"), "tool": "planted",
                        "reason": "r", "step_ids": [], "changes": vec![0; 300_000]}]);
    write_files(
        ws,
        &[(
            planted.strip_prefix(ws).unwrap().to_str().unwrap(),
            entry.to_string(),
        )],
    );
    let before = std::fs::read(&planted).unwrap();
    assert!(before.len() < 1 << 20);
    let huge = "v".repeat(2 << 20);
    let llm = scripted_model(
        ws,
        vec![vec![(
            "update_variable",
            json!({"reason": "r", "action": "add", "name": "BIG", "value": huge}),
        )]],
    );
    let out = builder(ws, &["-m", "go"]);
    assert!(out.status.success(), "{:.3000}", told(&out));
    let results = tool_results(&llm);
    assert!(results[0].contains("\"ok\":true"), "{:.3000}", results[0]);
    assert_eq!(std::fs::read(&planted).unwrap(), before, "left as it was");
    let next = planted.with_file_name(format!("changelog-{day}-2.json"));
    let written = std::fs::read(&next).unwrap();
    assert!(written.len() < 64 << 10, "{} bytes", written.len());
    let entries: Value = serde_json::from_slice(&written).unwrap();
    let change = &entries[0]["changes"][0];
    assert_eq!(change["field"], "variables.BIG", "{entries}");
    let summary = change["new"]["summarised"].as_str().unwrap_or_default();
    assert!(
        summary.starts_with(&format!("{} bytes of JSON, sha256 ", huge.len() + 2)),
        "{entries}"
    );
}

/// 64 small calls an answer each walked a planted tree within their own 30 s: two answers
/// took 52 s of host CPU, and nothing bounded a turn of 500 rounds (round 7). The calls of
/// a turn now share one host budget (2 GiB of reads, 120 s): past it, calls are refused.
#[test]
fn the_builder_tool_calls_of_a_turn_share_one_host_budget() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    minimal_plan(ws);
    for n in 0..20 {
        let path = ws.join(format!("runs/iteration-{n}/planning/step_config.json"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::File::create(path)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
    }
    // Each call reads its 256 MiB; twelve of them pass the turn's 2 GiB.
    let calls: Vec<(&str, Value)> = (0..12)
        .map(|_| {
            (
                "validate_plan_change",
                json!({"forbidden_references": ["q1"]}),
            )
        })
        .collect();
    let llm = scripted_model(ws, vec![calls]);
    let out = builder(ws, &["-m", "go"]);
    assert!(out.status.success(), "{:.3000}", told(&out));
    let results = tool_results(&llm);
    assert_eq!(results.len(), 12);
    let refused = results
        .iter()
        .filter(|r| r.contains("this turn's builder tool calls have used their host budget"))
        .count();
    let read = results
        .iter()
        .filter(|r| r.contains("\"not_checked\""))
        .count();
    assert_eq!(read, 8, "{results:.2000?}");
    assert_eq!(refused, 4, "{results:.2000?}");
}

/// `GET /api/workflow/changelog` parsed 14 day files of up to a million values each at once
/// (924 MB for one answer from 28 MB on disk), outside the server's four reads at once
/// (round 7). The days of one answer now share half a million values, and a day past what
/// is left is named, not read.
#[test]
fn the_servers_changelog_answer_parses_within_one_budget() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::serve::demo(dir.path());
    for day in ["2026-01-01", "2026-01-02", "2026-01-03"] {
        let entry = json!([{"timestamp": format!("{day}T00:00:00Z"), "tool": "planted",
                            "reason": "r", "step_ids": [], "changes": vec![0; 300_000]}]);
        write_files(
            &ws,
            &[(
                format!("planning/changelog/changelog-{day}.json").as_str(),
                entry.to_string(),
            )],
        );
    }
    let serve = support::serve::Serve::start(&ws, None, &[]);
    let (status, answer) = serve.get("/api/workflow/changelog", &[]);
    assert_eq!(status, 200, "{answer:.2000}");
    let days = answer["days"].as_array().unwrap();
    assert_eq!(days.len(), 3);
    assert_eq!(
        days[0]["file"],
        "planning/changelog/changelog-2026-01-03.json"
    );
    assert_eq!(
        days[0]["entries"][0]["changes"].as_array().map(Vec::len),
        Some(300_000)
    );
    for day in &days[1..] {
        let error = day["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("holds about 300") && error.contains("left to parse"),
            "{:.500}",
            day
        );
    }
}
