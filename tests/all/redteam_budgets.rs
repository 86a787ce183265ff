//! Attacks on the budgets of what a model answer, a guest's output or an external MCP server
//! makes the host do (docs/security.md, "Budgets of what a model, a guest or a workspace
//! makes the host do"), through the `trellis` binary against fakes on 127.0.0.1.

use crate::support;

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, tool_results_of};
use support::mcp_servers::{asking_for, fixture_entry, server_file, with_servers, workspace};

/// An external MCP server's error results count against the turn's result bytes as its
/// results do: three errors of 600 KB each (`isError`, the text the model gets) under a
/// 1 MiB budget are not all kept. They were not counted, so a hostile server answering every
/// call with a 4 MiB error filled the conversation past `--max-turn-result-mib` (64 calls x
/// 500 rounds x 4 MiB).
#[test]
fn an_mcp_servers_error_results_count_against_the_turns_result_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let config = server_file(
        &dir.path().join("servers.json"),
        json!({"fx": fixture_entry(&started)}),
    );
    let llm = asking_for(vec![("fx__huge_error", json!({"size": 600_000})); 3]);
    let ws = dir.path().join("ws");
    workspace(&ws, json!({"selected_tools": ["fx:huge_error"]}), &llm);
    let out = with_servers(
        &["run", ws.to_str().unwrap(), "--max-turn-result-mib", "1"],
        &config,
    )
    .output()
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let results = llm.last_tool_results();
    assert_eq!(results.len(), 3, "{text}");
    let kept: usize = results.iter().map(|(_, c)| c.len()).sum();
    assert!(
        kept <= (1 << 20) + 4096,
        "the model got {kept} bytes of tool results under a 1 MiB budget: {:?}",
        results
            .iter()
            .map(|(id, c)| (id, c.len(), c.chars().take(120).collect::<String>()))
            .collect::<Vec<_>>()
    );
    assert!(
        results
            .iter()
            .any(|(_, c)| c.contains("result not kept") && c.contains("--max-turn-result-mib")),
        "{results:?}"
    );
}

/// A model answering `answer` (an OpenAI chat completion) to every request.
fn answering(answer: Value) -> FakeServer {
    FakeServer::start(Box::new(move |_| (200, answer.clone())))
}

/// A one-step workspace reaching `llm`, run; the run's output.
fn run_against(llm: &FakeServer) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    crate::run_cli::agent_workspace(
        &ws,
        &[("work", "Work.")],
        json!([]),
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": llm.providers()}),
    );
    let out = support::trellis_command(&["run", ws.to_str().unwrap(), "--allow-host", "127.0.0.1"])
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// An answer whose tool calls are `calls` (id, name, arguments).
fn tool_answer(calls: Vec<(String, &str, &str)>) -> Value {
    let calls: Vec<Value> = calls
        .into_iter()
        .map(|(id, name, arguments)| {
            json!({"id": id, "type": "function",
                   "function": {"name": name, "arguments": arguments}})
        })
        .collect();
    json!({"id": "c", "object": "chat.completion", "model": "m",
           "choices": [{"index": 0,
                        "message": {"role": "assistant", "content": "", "tool_calls": calls},
                        "finish_reason": "tool_calls"}]})
}

/// The tool-call ids of an answer are part of its size: three calls with 2 MB ids are an
/// answer over the 4 MiB limit. Only names and arguments were counted, so an answer of up to
/// the provider's 32 MiB body went into the conversation (and every later request, the turn
/// log and the tool results echoing the ids), 8 times the limit, each round.
#[test]
fn tool_call_ids_count_in_the_size_of_an_answer() {
    let id = "i".repeat(2_000_000);
    let llm = answering(tool_answer(vec![
        (format!("{id}0"), "nope", "{}"),
        (format!("{id}1"), "nope", "{}"),
        (format!("{id}2"), "nope", "{}"),
    ]));
    let (ok, out) = run_against(&llm);
    assert!(!ok, "{out}");
    assert!(out.contains("over the limit of 4194304"), "{out}");
    let answered = llm.seen().iter().any(|r| !tool_results_of(r).is_empty());
    assert!(
        !answered,
        "the calls of an answer over the limit were answered"
    );
}

/// Each tool call of an answer costs the host a result message and records whatever its
/// name and arguments, so it counts in the answer's size: 16,384 calls with empty names and
/// arguments (the most a bundled provider reads of one answer; 0.8 MB of JSON) are over the
/// limit, with the answer's model name. They counted 0 bytes, so one answer of the
/// provider's 32 MiB could ask for ~500,000 calls, each answered with a ~230-byte `not run`
/// error (~115 MB of tool messages per answer, sent back in every later request).
#[test]
fn many_empty_tool_calls_count_in_the_size_of_an_answer() {
    let llm = answering(tool_answer(vec![(String::new(), "", ""); 16_384]));
    let (ok, out) = run_against(&llm);
    assert!(!ok, "{out}");
    assert!(out.contains("over the limit of 4194304"), "{out}");
    let answered = llm.seen().iter().any(|r| !tool_results_of(r).is_empty());
    assert!(
        !answered,
        "the calls of an answer over the limit were answered"
    );
}

/// `trellis runs show` prints what the model wrote (its `CONCERNS:` lines, its last reply)
/// escaped, as `trellis run` does: an escape sequence in a concern retitled or cleared the
/// terminal of whoever looked at the run later.
#[test]
fn runs_show_escapes_what_the_model_wrote() {
    let llm = FakeServer::start(Box::new(|_| {
        (
            200,
            support::fake_llm::completion(
                "\x1b]0;owned\x07done \x1b[2J\nCONCERNS: \x1b[31mred\x1b[0m \u{9b}2J",
                &[],
            ),
        )
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    crate::run_cli::agent_workspace(
        &ws,
        &[("work", "Work.")],
        json!([]),
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": llm.providers()}),
    );
    let run = support::trellis_command(&[
        "run",
        ws.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--quiet",
    ])
    .output()
    .unwrap();
    assert!(run.status.success(), "{run:?}");
    let out = support::trellis_command(&["runs", "show", ws.to_str().unwrap(), "work"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("\\x1b[31mred"), "{stdout:?}");
    assert!(
        !stdout.contains('\x1b') && !stdout.contains('\x07') && !stdout.contains('\u{9b}'),
        "{stdout:?}"
    );
}

/// A server writing millions of empty lines to stderr gets a bounded number of them logged:
/// the 1 MiB cap counted only the bytes of each line, so empty lines were logged one record
/// each without end (3,000,000 records here, at debug level).
#[test]
fn a_servers_flood_of_empty_stderr_lines_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let mut entry = fixture_entry(&started);
    entry["args"]
        .as_array_mut()
        .unwrap()
        .extend([json!("--stderr-newlines"), json!("3000000")]);
    let config = server_file(&dir.path().join("servers.json"), json!({"fx": entry}));
    let llm = asking_for(vec![("fx__echo", json!({"text": "still here"}))]);
    let ws = dir.path().join("ws");
    workspace(&ws, json!({"selected_tools": ["fx:echo"]}), &llm);
    let out = with_servers(&["run", ws.to_str().unwrap(), "--quiet"], &config)
        .env("RUST_LOG", "trellis_runner::mcp_servers=debug")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains("server=fx"))
        .count();
    assert!(
        records <= 20_000,
        "{records} log records of the server's stderr"
    );
}

/// The builder prints the tool name a model asked for escaped when the call ends, as it does
/// when it starts: the `FAILED <name>` line sent the model's escape sequence to the terminal.
#[test]
fn the_builder_prints_a_models_tool_name_escaped() {
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let llm = FakeServer::start(Box::new(move |_| {
        if answered.swap(true, std::sync::atomic::Ordering::SeqCst) {
            (200, support::fake_llm::completion("done", &[]))
        } else {
            (
                200,
                support::fake_llm::completion("", &[("\x1b]0;owned\x07x\x1b[2J", json!({}))]),
            )
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    support::workspace::write_file(
        ws,
        "planning/plan.json",
        json!({"objective": "o", "steps": [
            {"id": "greet", "type": "regular", "title": "Greet", "description": "Say hello."}
        ]})
        .to_string(),
    );
    support::workspace::write_file(ws, "planning/step_config.json", r#"{"steps": []}"#);
    support::workspace::write_file(
        ws,
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": llm.providers()})
            .to_string(),
    );
    let out = support::trellis(&[
        "builder",
        ws.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "-m",
        "hi",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("FAILED \\x1b]0;owned"), "{stdout:?}");
    assert!(
        !stdout.contains('\x1b') && !stdout.contains('\x07'),
        "{stdout:?}"
    );
}

/// Two calls of one answer with the same id (a model chooses ids) each get their own
/// offloaded result: both were written to `tool-results/<id>.json`, so one call's reference
/// pointed at the other call's result.
#[test]
fn offloaded_results_of_calls_with_the_same_id_do_not_overwrite_each_other() {
    let llm = FakeServer::start(Box::new(|body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if messages.iter().any(|m| m["role"] == "tool") {
            return (200, support::fake_llm::completion("done", &[]));
        }
        let read = body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str())
            .find(|n| n.contains("read_file"))
            .expect("a read_file tool is offered")
            .to_string();
        let calls: Vec<Value> = ["a", "b"]
            .iter()
            .map(|f| {
                json!({"id": "dup", "type": "function", "function": {"name": read,
                       "arguments": json!({"path": format!("knowledgebase/{f}.txt")}).to_string()}})
            })
            .collect();
        (
            200,
            json!({"id": "c", "object": "chat.completion",
                   "choices": [{"index": 0, "finish_reason": "tool_calls",
                                "message": {"role": "assistant", "content": "", "tool_calls": calls}}]}),
        )
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    crate::run_cli::agent_workspace(
        &ws,
        &[("work", "Read.")],
        json!([]),
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": llm.providers()}),
    );
    support::workspace::write_file(&ws, "knowledgebase/a.txt", "A".repeat(40_000));
    support::workspace::write_file(&ws, "knowledgebase/b.txt", "B".repeat(40_000));
    let out = support::trellis_command(&[
        "run",
        ws.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--quiet",
    ])
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results = llm.last_tool_results();
    assert_eq!(results.len(), 2, "{results:?}");
    for ((_, content), letter) in results.iter().zip(["AAAA", "BBBB"]) {
        let rel = content
            .split_whitespace()
            .find(|w| w.contains("tool-results/"))
            .unwrap_or_else(|| panic!("an offload reference: {content}"))
            .trim_end_matches([':', '.', ',']);
        let file = std::fs::read_to_string(ws.join(rel)).unwrap();
        assert!(
            file.contains(letter),
            "{rel} holds another call's result: {content}"
        );
    }
}

/// The builder's own turn keeps a bounded amount of tool results, as a step's turn does:
/// three reads of a 600 KB file under `--max-turn-result-mib 1` are not all kept. The
/// builder had no such budget: 40 rounds of 64 reads of 4 MiB went into its conversation
/// (and its conversation file, and every later request).
#[test]
fn the_builders_turn_keeps_a_bounded_amount_of_tool_results() {
    let llm = FakeServer::start(Box::new(|body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if messages.iter().any(|m| m["role"] == "tool") {
            return (200, support::fake_llm::completion("done", &[]));
        }
        let args = json!({"path": "knowledgebase/big.txt"});
        let calls = vec![("read_workspace_file", args); 3];
        (200, support::fake_llm::completion("", &calls))
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    support::workspace::write_file(
        ws,
        "planning/plan.json",
        json!({"objective": "o", "steps": [
            {"id": "greet", "type": "regular", "title": "Greet", "description": "Say hello."}
        ]})
        .to_string(),
    );
    support::workspace::write_file(ws, "planning/step_config.json", r#"{"steps": []}"#);
    support::workspace::write_file(
        ws,
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": llm.providers()})
            .to_string(),
    );
    let line = format!("{}\n", "x".repeat(999));
    support::workspace::write_file(ws, "knowledgebase/big.txt", line.repeat(600));
    let out = support::trellis(&[
        "builder",
        ws.to_str().unwrap(),
        "--mode",
        "debugger",
        "--max-turn-result-mib",
        "1",
        "--allow-host",
        "127.0.0.1",
        "-m",
        "read it",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results = llm.last_tool_results();
    assert_eq!(results.len(), 3, "{results:?}");
    let sizes: Vec<usize> = results.iter().map(|(_, c)| c.len()).collect();
    assert!(sizes[0] > 500_000, "the first read is kept: {sizes:?}");
    assert!(
        sizes.iter().sum::<usize>() <= (1 << 20) + 4096,
        "the model got {sizes:?} bytes of results under a 1 MiB budget"
    );
    assert!(
        results.iter().any(|(_, c)| c.contains("result not kept")),
        "{sizes:?}"
    );
}

/// The builder's file and database calls of one turn write out of one budget, as a step's
/// calls do: three writes of 600 KB under `--max-turn-write-mib 1` are not all made. Each
/// builder call had a budget of its own (1 GiB), so one answer of 64 calls could write
/// 64 GiB, and every round as much again.
#[test]
fn the_builders_turn_writes_out_of_one_budget() {
    let content = "x".repeat(600_000);
    let llm = FakeServer::start(Box::new(move |body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if messages.iter().any(|m| m["role"] == "tool") {
            return (200, support::fake_llm::completion("done", &[]));
        }
        let calls: Vec<(&str, Value)> = (0..3)
            .map(|i| {
                let args = json!({"path": format!("learnings/w{i}.txt"), "content": content});
                ("write_workspace_file", args)
            })
            .collect();
        (200, support::fake_llm::completion("", &calls))
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    support::workspace::write_files(
        ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "greet", "type": "regular", "title": "Greet", "description": "Hi."}
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
        "--max-turn-write-mib",
        "1",
        "--allow-host",
        "127.0.0.1",
        "-m",
        "write them",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results = llm.last_tool_results();
    assert_eq!(results.len(), 3, "{results:?}");
    let written: Vec<bool> = (0..3)
        .map(|i| ws.join(format!("learnings/w{i}.txt")).exists())
        .collect();
    assert_eq!(written, [true, false, false], "{results:?}");
    assert!(
        results[1].1.contains("turn"),
        "told why: {:?}",
        results[1].1
    );
    assert_eq!(
        std::fs::read(ws.join("learnings/w0.txt")).unwrap().len(),
        600_000
    );
}

/// Before, the builder's own agent loop was outside every model-call cap: a model that
/// always asks for one more tool made calls until the rounds ran out, turn after turn. Now
/// the session's calls come out of `--max-model-calls`, as a run's do.
#[test]
fn the_builders_model_calls_stop_at_the_sessions_budget() {
    let llm = FakeServer::start(Box::new(|_| {
        let args = json!({"path": "planning/plan.json"});
        (
            200,
            support::fake_llm::completion("", &[("read_workspace_file", args)]),
        )
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    support::workspace::write_file(
        ws,
        "planning/plan.json",
        json!({"objective": "o", "steps": [
            {"id": "greet", "type": "regular", "title": "Greet", "description": "Say hello."}
        ]})
        .to_string(),
    );
    support::workspace::write_file(ws, "planning/step_config.json", r#"{"steps": []}"#);
    support::workspace::write_file(
        ws,
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": llm.providers()})
            .to_string(),
    );
    let out = support::trellis(&[
        "builder",
        ws.to_str().unwrap(),
        "--mode",
        "debugger",
        "--max-model-calls",
        "3",
        "--allow-host",
        "127.0.0.1",
        "-m",
        "read it",
        "-m",
        "and again",
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    // Three calls in the first turn, none in the second.
    assert_eq!(llm.seen().len(), 3, "{text}");
    assert!(
        text.contains(
            "the builder session made its 3 model calls, the limit of one session \
             (`trellis builder --max-model-calls N` sets it); no more are made"
        ),
        "{text}"
    );
}

/// A plan of 30,000 `human_input` steps (and a step config entry for each) is walked once
/// by the preflight, not once per step: each step it reached looked the next one up by a
/// scan of the plan, some ten seconds of host time for this plan. The error lists the first
/// twenty missing answers and counts the rest, where it listed all 30,000.
#[test]
fn a_plan_of_thirty_thousand_steps_is_refused_with_a_short_list() {
    const STEPS: usize = 30_000;
    let dir = tempfile::tempdir().unwrap();
    let steps: Vec<Value> = (0..STEPS)
        .map(|i| {
            json!({"id": format!("s{i}"), "type": "human_input", "title": "S",
                   "description": "Q?", "question": "Ready?", "variable_name": format!("v{i}")})
        })
        .collect();
    let configs: Vec<Value> = (0..STEPS)
        .map(|i| json!({"id": format!("s{i}"), "agent_configs": {}}))
        .collect();
    support::workspace::write_files(
        dir.path(),
        &[
            (
                "planning/plan.json",
                json!({"objective": "t", "steps": steps}).to_string(),
            ),
            (
                "planning/step_config.json",
                json!({"steps": configs}).to_string(),
            ),
        ],
    );
    let before = support::tree_digest(dir.path());
    let out = support::trellis(&["run", dir.path().to_str().unwrap(), "--input", "v3=yes"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let listed: Vec<String> = (0..21)
        .filter(|i| *i != 3)
        .map(|i| format!("step \"s{i}\" needs --input v{i}=VALUE (Ready?)"))
        .collect();
    let expected = format!(
        "missing human input: {}; and {} more",
        listed[..20].join("; "),
        STEPS - 1 - 20
    );
    assert!(stderr.contains(&expected), "{expected:?} in {stderr}");
    assert!(stderr.len() < 4096, "{} bytes of error", stderr.len());
    assert_eq!(
        support::tree_digest(dir.path()),
        before,
        "the refused run changed files"
    );
}

/// `[0,0,...]` with more JSON values than a file the host parses whole may hold.
fn many_values() -> String {
    format!(
        "[{}0]",
        "0,".repeat(trellis_sandbox::json_values::MAX_FILE_VALUES)
    )
}

/// A workspace file, a cassette or a log `runs show` reads that holds more JSON values than
/// the host parses of a file is refused before it is parsed, naming the file: a 64 MiB
/// cassette or gate report of small values took over a gigabyte parsed (1.2 GB and 2.1 GB).
#[test]
fn files_of_too_many_json_values_are_refused_unparsed() {
    use trellis_sandbox::json_values::{MAX_FILE_VALUES, json_values};
    let budget = MAX_FILE_VALUES;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let root = ws.to_str().unwrap();
    let plan = json!({"objective": "t", "steps": [
        {"id": "alpha", "type": "regular", "title": "A", "description": "Answer."}
    ]});
    let replay = json!({"llm": {"provider": "replay", "model_id": "tape"}});
    // The plan itself.
    let big_plan = format!(
        r#"{{"objective": "t", "steps": [], "x": {}}}"#,
        many_values()
    );
    support::workspace::write_files(
        ws,
        &[
            ("planning/plan.json", big_plan.clone()),
            ("workflow.json", replay.to_string()),
        ],
    );
    let out = support::trellis(&["validate", root]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said = format!(
        "holds about {} JSON values, more than the {budget} Trellis parses of one file",
        json_values(big_plan.as_bytes())
    );
    let told = format!("{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(1), "{told}");
    assert!(
        told.lines()
            .any(|l| l.starts_with("planning/plan.json: ") && l.contains(&said)),
        "{said:?} in {told}"
    );
    // The cassette of the model the step replays.
    support::workspace::write_files(
        ws,
        &[
            ("planning/plan.json", plan.to_string()),
            ("cassettes/tape.json", many_values()),
        ],
    );
    let out = support::trellis(&["run", root]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let said = format!(
        "cassette cassettes/tape.json: holds about {} JSON values, more than the {budget}",
        budget + 2
    );
    assert!(stderr.contains(&said), "{said:?} in {stderr}");
    // A gate report in the run's logs.
    let report = format!(r#"{{"passed": false, "checks": {}}}"#, many_values());
    support::workspace::write_files(
        ws,
        &[
            ("runs/iteration-0/execution/alpha/out.txt", "x".to_string()),
            (
                "runs/iteration-0/logs/alpha/pre_validation_final_attempt_1.json",
                report.clone(),
            ),
        ],
    );
    let out = support::trellis(&["runs", "show", root, "alpha"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let said = format!(
        "pre_validation_final_attempt_1.json: holds about {} JSON values, more than the {budget}",
        json_values(report.as_bytes())
    );
    assert!(stderr.contains(&said), "{said:?} in {stderr}");
}
