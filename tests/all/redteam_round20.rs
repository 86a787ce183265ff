//! Red team round 20 (sub-agents and the turn budgets): each a test that failed before its
//! fix. Round 20's findings on the workers are in `workers.rs`.

use crate::support;

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::trellis;
use support::workspace::{regular_steps, write_file, write_files};

use crate::support::plugin_build::text;

/// A step with route `helper`, whose model answers the step's first turn with `calls`
/// `call_sub_agent` calls and every sub-agent turn with `each` tool calls `(tool, arguments)`
/// (the tool as the model names it, and as the step config selects it).
fn delegating_workspace(
    root: &std::path::Path,
    calls: usize,
    each: usize,
    tool: (&'static str, &'static str, Value),
) -> FakeServer {
    let (named, selected, arguments) = tool;
    let server = FakeServer::start(Box::new(move |body: &Value| {
        let tools: Vec<String> = body["tools"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|t| t["function"]["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let asked = body["messages"].to_string();
        if tools.iter().any(|t| t == "call_sub_agent") {
            if asked.contains("call_sub_agent") && asked.contains("\"tool\"") {
                return (200, completion("done", &[]));
            }
            let delegate = json!({"route_id": "helper", "instructions": "read"});
            let many: Vec<(&str, Value)> = (0..calls)
                .map(|_| ("call_sub_agent", delegate.clone()))
                .collect();
            return (200, completion("", &many));
        }
        if tools.is_empty()
            || body["messages"].as_array().unwrap().last().unwrap()["role"] == "tool"
        {
            return (200, completion("read it", &[]));
        }
        let each: Vec<(&str, Value)> = (0..each).map(|_| (named, arguments.clone())).collect();
        (200, completion("", &each))
    }));
    let helper = json!({"id": "helper", "type": "regular", "title": "Helper",
                        "description": "You read."});
    write_files(
        root,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "lead", "type": "message_sequence", "title": "Lead",
                     "description": "d",
                     "items": [{"id": "work", "type": "user_message", "message": "Delegate."}],
                     "predefined_routes": [{"route_id": "helper", "route_name": "Helper",
                        "condition": "always", "sub_agent_step": helper}]}]})
                .to_string(),
            ),
            (
                "planning/step_config.json",
                json!({"steps": [
                    {"id": "helper", "agent_configs": {"selected_tools": [selected]}}]})
                .to_string(),
            ),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": server.providers()})
                .to_string(),
            ),
            ("knowledgebase/big.txt", "y".repeat(200_000)),
        ],
    );
    server
}

/// One answer of `call_sub_agent` calls gave each sub-agent turn a result budget of its own:
/// 12 calls kept 373 MiB with `--max-turn-result-mib 8` (MEDIUM). A sub-agent's turns now
/// draw from the calling turn's budgets.
#[test]
fn sub_agents_keep_their_results_within_the_calling_turns_budget() {
    let dir = tempfile::tempdir().unwrap();
    let read = json!({"path": "knowledgebase/big.txt"});
    let read = ("workspace__read_file", "workspace:read_file", read);
    let _server = delegating_workspace(dir.path(), 3, 64, read);
    let out = trellis(&[
        "run",
        dir.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-turn-result-mib",
        "1",
        "--max-tool-rounds",
        "2",
    ]);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(said.contains("call_sub_agent"), "{said}");
    assert!(said.contains("--max-turn-result-mib"), "{said}");
    let agents = dir
        .path()
        .join("runs/iteration-0/execution/lead/agents/helper/calls");
    let kept: u64 = std::fs::read_dir(&agents)
        .unwrap()
        .flatten()
        .map(|call| support::bytes_under(&call.path().join("tool-results")))
        .sum();
    assert!(kept > 0, "the sub-agents kept none of their results");
    assert!(
        kept <= 1 << 20,
        "the sub-agents kept {kept} bytes of a 1 MiB turn budget"
    );
}

/// The tool calls of `call_sub_agent`'s sub-agents were not held to the calling turn's call
/// time: four calls took 52 s of a 10 s `--max-turn-call-seconds` (LOW). A sub-agent's tool
/// calls draw from the calling turn's call time, and a call is not started once it is spent.
#[test]
fn sub_agents_take_their_tool_calls_time_from_the_calling_turn() {
    let dir = tempfile::tempdir().unwrap();
    let sleep = json!({"command": "sleep 1"});
    let sleep = (
        "shell__execute_shell_command",
        "shell:execute_shell_command",
        sleep,
    );
    let _server = delegating_workspace(dir.path(), 4, 2, sleep);
    let out = trellis(&[
        "run",
        dir.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-turn-call-seconds",
        "3",
        "--max-tool-rounds",
        "2",
    ]);
    let said = text(&out.stdout) + &text(&out.stderr);
    let refused = said
        .lines()
        .filter(|l| l.contains("tool call_sub_agent") && l.contains("--max-turn-call-seconds"))
        .count();
    assert!(refused >= 1, "{said}");
    let slept = said
        .lines()
        .filter(|l| l.contains("tool shell:execute_shell_command: ok"))
        .count();
    assert!(
        slept <= 3,
        "{slept} sleeps of 1 s ran in a 3 s turn: {said}"
    );
}

/// Each turn kept up to its own budget, with nothing over a run: a plan's six turns kept
/// 1.6 GB (MEDIUM). The run's results together are bounded too (`--max-run-result-mib`).
#[test]
fn the_tool_results_a_run_keeps_are_bounded_over_its_turns() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(Box::new(|body: &Value| {
        let last = &body["messages"].as_array().unwrap().last().unwrap()["role"];
        if last == "tool" {
            return (200, completion("done", &[]));
        }
        let read = json!({"path": "knowledgebase/big.txt"});
        let reads: Vec<(&str, Value)> = (0..4)
            .map(|_| ("workspace__read_file", read.clone()))
            .collect();
        (200, completion("", &reads))
    }));
    regular_steps(dir.path(), server.providers(), &["s0", "s1", "s2"]);
    write_file(dir.path(), "knowledgebase/big.txt", "y".repeat(200_000));
    let out = trellis(&[
        "run",
        dir.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-run-result-mib",
        "1",
    ]);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(
        said.contains("this run's tool results past their budget of 1 MiB (--max-run-result-mib)"),
        "{said}"
    );
    let kept: u64 = (0..3)
        .map(|i| {
            support::bytes_under(
                &dir.path()
                    .join(format!("runs/iteration-0/execution/s{i}/tool-results")),
            )
        })
        .sum();
    assert!(kept > 0, "{said}");
    assert!(kept <= 1 << 20, "the run kept {kept} bytes of results");
}

/// A model's answers were kept (in the conversation, the turn log and the session) with no
/// budget but the run's model calls: 240 MB of answers made a 960 MB run folder (round 22,
/// MEDIUM). They count toward the run's kept bytes with its tool results.
#[test]
fn the_answers_a_run_keeps_count_toward_its_kept_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(Box::new(|body: &Value| {
        let turns = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "assistant")
            .count();
        if turns >= 6 {
            return (200, completion("done", &[]));
        }
        let write = json!({"path": "../outside.md", "content": "w".repeat(250_000)});
        let writes: Vec<(&str, Value)> = (0..4)
            .map(|_| ("workspace__write_file", write.clone()))
            .collect();
        (200, completion("", &writes))
    }));
    regular_steps(dir.path(), server.providers(), &["s0", "s1", "s2"]);
    let out = trellis(&[
        "run",
        dir.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-run-result-mib",
        "2",
    ]);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("(--max-run-result-mib)"), "{said}");
    let written = support::bytes_under(&dir.path().join("runs"));
    assert!(written < 20 << 20, "the run wrote {written} bytes");
}
