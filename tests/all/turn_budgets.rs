//! The budgets of a turn through the `trellis` binary, against a fake model on 127.0.0.1
//! that answers with far more tool calls than a turn runs: the calls of one answer, the
//! bytes of results a turn keeps, and the host's own memory and disk while it does.

use crate::support;

use std::path::Path;

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion, tool_named, tool_results_of};
use support::workspace::write_file;

/// The calls the model asks for in its first answer.
const ASKED: usize = 10_000;

/// A model that, for the user message `FIRST`, asks for `ASKED` reads of the 1 MB file in
/// one answer; for any other user message, one read; after tool results, `done`.
fn flooding_model() -> FakeServer {
    FakeServer::start(Box::new(|body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or(Value::Null);
        if last["role"] == "tool" {
            return (200, completion("done", &[]));
        }
        let read = tool_named(body, "read_file");
        let args = json!({"path": "knowledgebase/big.txt"});
        let asked = if last["content"].as_str().unwrap_or("").contains("FIRST") {
            ASKED
        } else {
            1
        };
        let calls = vec![(read.as_str(), args); asked];
        (200, completion("", &calls))
    }))
}

/// A two-item message sequence reading `knowledgebase/big.txt` (1,000,000 bytes: 10,000
/// lines of 99 characters and a newline).
fn workspace(root: &Path, server: &FakeServer) {
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "t", "steps": [
            {"id": "desk", "type": "message_sequence", "title": "Desk",
             "description": "You read files.",
             "items": [
                {"id": "first", "type": "user_message", "message": "FIRST: read big.txt."},
                {"id": "second", "type": "user_message", "message": "Read it once more."}
             ]}
        ]})
        .to_string(),
    );
    write_file(root, "planning/step_config.json", r#"{"steps": []}"#);
    write_file(
        root,
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": server.providers()})
            .to_string(),
    );
    let line = format!("{}\n", "x".repeat(99));
    write_file(root, "knowledgebase/big.txt", line.repeat(10_000));
}

/// The bytes of the files under `dir`.
fn bytes_under(dir: &Path) -> u64 {
    let mut total = 0;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                todo.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

#[test]
fn one_answer_of_ten_thousand_reads_ends_within_the_turn_budgets() {
    let server = flooding_model();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, &server);
    let output = tempfile::NamedTempFile::new().unwrap();
    let (status, peak, out) = support::measure::peak_memory(
        support::trellis_command(&[
            "run",
            root.to_str().unwrap(),
            "--max-turn-result-mib",
            "16",
            "--allow-host",
            "127.0.0.1",
            "--quiet",
        ]),
        output.path(),
    );
    assert_eq!(status, 0, "wait status {status}: {out}");

    let seen = server.seen();
    // The first item's answer to the flood, then the second item's one read and answer.
    assert_eq!(seen.len(), 4, "{out}");
    let results = tool_results_of(&seen[1]);
    assert_eq!(results.len(), ASKED, "every call asked for is answered");
    // The first call not run says why; the others point to it.
    assert_eq!(
        results[64].1,
        "error: not run: this answer asked for 10000 tool calls and at most 64 run per \
         answer (--max-calls-per-answer); ask again for the calls you still need, at most 64 \
         at a time"
    );
    let not_run = results[65..]
        .iter()
        .filter(|(_, c)| {
            c == "error: not run: past this answer's 64 calls, as the first call not run says"
        })
        .count();
    assert_eq!(not_run, ASKED - 65);
    // One result is a little over 1,010,000 bytes (the content with its 10,000 newlines
    // escaped, and the path and counts): 16 fit in 16 MiB (16,777,216 bytes), 17 do not.
    let offloaded: Vec<_> = results
        .iter()
        .filter(|(_, c)| c.contains("tool-results/"))
        .collect();
    let not_kept = results
        .iter()
        .filter(|(_, c)| {
            c.starts_with("error: result not kept: its ")
                && c.contains("this turn's tool results past their budget of 16 MiB")
        })
        .count();
    assert_eq!(offloaded.len(), 16, "{:?}", &results[..3]);
    assert_eq!(not_kept, 64 - 16);

    // The next turn has a budget of its own: its one read is kept.
    let second = tool_results_of(&seen[3]);
    let last = &second.last().expect("a tool result").1;
    assert!(last.contains("tool-results/"), "{last}");

    // What the host wrote for the run: the kept results (16 of the first turn, 1 of the
    // second) and the logs, which hold the ten thousand calls of the answer (about 1 KiB
    // each over the turn log and session.json), not a copy of any result.
    let results = bytes_under(&root.join("runs/iteration-0/execution/desk/tool-results"));
    assert!(results < 17 * 1_020_000, "{results} bytes of kept results");
    let written = bytes_under(&root.join("runs"));
    assert!(
        written - results < 16 << 20,
        "{} bytes under runs/ besides the kept results",
        written - results
    );
    assert!(peak < 300 << 20, "peak resident memory {peak} bytes");
}

#[test]
fn the_calls_not_run_of_an_answer_are_one_event_not_one_each() {
    let server = flooding_model();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, &server);
    // Plain progress (stdout is not a terminal): a line per event.
    let out = support::trellis(&[
        "run",
        root.to_str().unwrap(),
        "--max-turn-result-mib",
        "16",
        "--allow-host",
        "127.0.0.1",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let not_run: Vec<&str> = stdout.lines().filter(|l| l.contains("not run")).collect();
    assert_eq!(
        not_run,
        [
            "    tools: 9936 of the 10000 calls of one answer not run (at most 64 run per \
          answer, --max-calls-per-answer)"
        ]
    );
    // The calls that ran have a line each: 64 of the first answer, one of the second.
    let ran = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("tool "))
        .count();
    assert_eq!(ran, 65, "{stdout}");
    // The model still got an answer to every call it asked for.
    assert_eq!(tool_results_of(&server.seen()[1]).len(), ASKED);
}

/// A desk whose every answer delegates eight times to the route `refunds`, whose sub-agent
/// answers every call with a call of a tool that is not there: each sub-agent call would
/// take its 500 tool rounds, eight per round of the desk.
fn fanning_out_model() -> FakeServer {
    FakeServer::start(Box::new(|body| {
        let system = body["messages"][0]["content"].as_str().unwrap_or_default();
        if system.starts_with("You decide refunds.") {
            return (200, completion("", &[("nothing_here", json!({}))]));
        }
        let args = json!({"route_id": "refunds", "instructions": "Refund order 1."});
        (200, completion("", &vec![("call_sub_agent", args); 8]))
    }))
}

#[test]
fn the_model_calls_of_a_run_and_its_sub_agents_stop_at_the_runs_budget() {
    let server = fanning_out_model();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let refunds = json!({"id": "refunds", "type": "message_sequence", "title": "Refunds",
        "description": "You decide refunds.",
        "items": [{"id": "decide", "type": "user_message", "message": "Decide."}]});
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "t", "steps": [
            {"id": "desk", "type": "message_sequence", "title": "Desk",
             "description": "You coordinate the desk.", "next_step_id": "after",
             "items": [{"id": "work", "type": "user_message", "message": "Handle it."}],
             "predefined_routes": [{"route_id": "refunds", "route_name": "Refunds",
                 "condition": "money back", "sub_agent_step": refunds}]},
            {"id": "after", "type": "message_sequence", "title": "After",
             "description": "You close.",
             "items": [{"id": "close", "type": "user_message", "message": "Close."}]}
        ]})
        .to_string(),
    );
    write_file(root, "planning/step_config.json", r#"{"steps": []}"#);
    write_file(
        root,
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": server.providers()})
            .to_string(),
    );
    let out = support::trellis(&[
        "run",
        root.to_str().unwrap(),
        "--max-model-calls",
        "20",
        "--allow-host",
        "127.0.0.1",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    // The desk's first answer, then the first sub-agent's nineteen rounds: no call more,
    // from the other sub-agents, the desk or the next step.
    assert_eq!(server.seen().len(), 20, "{stdout}");
    assert!(
        stdout.contains(
            "step desk: failed (turn work: the run made its 20 model calls, the limit of one \
             run (`trellis run --max-model-calls N` sets it); no more are made, and the run \
             ends here; 8 more by its sub-agents)"
        ),
        "{stdout}"
    );
    assert!(!stdout.contains("step after"), "{stdout}");
}

/// `runs show` on a step whose conversation log is larger than the host reads at once
/// shows the step (its turns from their summaries) instead of refusing it.
#[test]
fn runs_show_reads_a_step_with_a_huge_conversation_log() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, &server);
    let out = support::trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--quiet",
    ]);
    assert!(out.status.success(), "{out:?}");
    let logs = root.join("runs/iteration-0/logs/desk/execution");
    let conversation = std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("conversation"))
        .expect("a conversation log");
    // 65 MiB of padding in a valid JSON document.
    let mut huge = String::from("{\"pad\": \"");
    huge.push_str(&" ".repeat(65 << 20));
    huge.push_str("\"}");
    std::fs::write(&conversation, huge).unwrap();
    let out = support::trellis(&["runs", "show", root.to_str().unwrap(), "desk"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("first"), "the turns are listed: {text}");
    assert!(
        text.contains("conversation log not read: ")
            && text.contains("more than the 67108864 Trellis reads"),
        "the log left unread is named: {text}"
    );
}

/// A model that asks for four `adversary:overlap` calls in one answer, each waiting for the
/// four to run at once (or two seconds), then ends the turn.
fn overlapping_model() -> FakeServer {
    FakeServer::start(Box::new(|body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if messages.last().is_some_and(|m| m["role"] == "tool") {
            return (200, completion("done", &[]));
        }
        let overlap = tool_named(body, "overlap");
        let args = json!({"dir": "/runs/iteration-0/execution/desk", "peers": 4, "ms": 2000});
        (200, completion("", &vec![(overlap.as_str(), args); 4]))
    }))
}

/// The most calls each of the four saw running at once, with `--max-concurrent-calls N`.
fn overlaps_with(limit: &str) -> Vec<String> {
    let server = overlapping_model();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    workspace(&root, &server);
    let plugins = support::plugin_folder(dir.path(), "adversary", "adversary", "tool");
    let out = support::trellis(&[
        "run",
        root.to_str().unwrap(),
        "--plugins",
        plugins.to_str().unwrap(),
        "--max-concurrent-calls",
        limit,
        "--allow-host",
        "127.0.0.1",
        "--quiet",
    ]);
    assert!(out.status.success(), "{out:?}");
    let seen = server.seen();
    tool_results_of(&seen[1])
        .into_iter()
        .map(|(_, content)| content)
        .collect()
}

#[test]
fn the_calls_of_a_turn_run_at_most_max_concurrent_calls_at_once() {
    assert_eq!(overlaps_with("1"), ["1", "1", "1", "1"]);
    // Without the cap in the way the four meet (each waits for the others).
    assert_eq!(overlaps_with("4"), ["4", "4", "4", "4"]);
}

/// Bytes each write of [`writing_model`] writes.
const WRITE: usize = 300_000;

/// A model that asks, in its first answer, for eight writes of [`WRITE`] bytes, each to a
/// file of its own; after tool results, `done`.
fn writing_model() -> FakeServer {
    FakeServer::start(Box::new(|body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if messages.last().is_some_and(|m| m["role"] == "tool") {
            return (200, completion("done", &[]));
        }
        let write = tool_named(body, "write_file");
        let calls: Vec<(&str, Value)> = (0..8)
            .map(|i| {
                (
                    write.as_str(),
                    json!({"path": format!("runs/iteration-0/execution/desk/out/w{i}.txt"), "content": "w".repeat(WRITE)}),
                )
            })
            .collect();
        (200, completion("", &calls))
    }))
}

#[test]
fn the_writes_of_a_turns_calls_stop_at_the_turns_write_budget() {
    // Before, the disk budget was per call: each of the 64 calls of one answer could write
    // 1 GiB. Now the calls of a turn write out of one budget: with 1 MiB, three writes of
    // 300,000 bytes fit (one at a time, so which three is fixed) and the other five fail,
    // the model told that the turn's budget stopped them.
    let server = writing_model();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, &server);
    let out = support::trellis(&[
        "run",
        root.to_str().unwrap(),
        "--max-turn-write-mib",
        "1",
        "--max-concurrent-calls",
        "1",
        "--allow-host",
        "127.0.0.1",
        "--quiet",
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = server.seen();
    let results = tool_results_of(&seen[1]);
    assert_eq!(results.len(), 8, "{text}");
    let refusal = "error: workspace:write_file: stopped: the plugin wrote more than 1048576 \
                   bytes to its folders together with the other calls of its turn (the \
                   per-turn limit, --max-turn-write-mib)";
    let refused = results.iter().filter(|(_, c)| c == refusal).count();
    let written = results
        .iter()
        .filter(|(_, c)| !c.starts_with("error"))
        .count();
    assert_eq!((written, refused), (3, 5), "{results:?}");
    let bytes = bytes_under(&root.join("runs/iteration-0/execution/desk/out"));
    assert_eq!(bytes, 3 * WRITE as u64, "{text}");
    assert!(out.status.success(), "{text}");
}
