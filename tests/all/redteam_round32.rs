//! Red team round 32 and this round's review: each a test that failed before its fix.

use crate::support;

use serde_json::json;

/// A call of an external MCP server's tool was stopped after a plugin call's 30 s deadline,
/// where the docs give it 300 s, and the error blamed the turn's call time
/// (`--max-turn-call-seconds`) it had not reached. It may take its 300 s.
#[test]
fn an_external_servers_call_may_take_longer_than_a_plugin_call() {
    use support::mcp_servers::{asking_for, fixture_entry, server_file, with_servers};
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let config = server_file(
        &dir.path().join("servers.json"),
        json!({"fx": fixture_entry(&started)}),
    );
    let llm = asking_for(vec![("fx__hang", json!({"seconds": 32}))]);
    let ws = dir.path().join("ws");
    support::mcp_servers::workspace(&ws, json!({"selected_tools": ["fx:hang"]}), &llm);
    let out = with_servers(&["run", ws.to_str().unwrap()], &config)
        .output()
        .unwrap();
    let said = support::plugin_build::all_output(&out);
    assert!(out.status.success(), "{said}");
    let results = llm.last_tool_results();
    assert_eq!(results.len(), 1, "{said}");
    assert!(results[0].1.contains("woke"), "{}", results[0].1);
}

/// A failed script's traceback was printed by `trellis run` as one line with every newline
/// shown as `\x0a` (LOW): its lines are printed under the step's line, each marked as its
/// continuation, so the error reads as written and none reads as a line of the run's.
#[test]
fn a_failed_scripts_error_keeps_its_lines_and_forges_none() {
    const FORGED: &str = "step s: completed (0 turn(s))";
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    support::workspace::write_files(
        root,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "s", "type": "regular", "title": "S", "description": "d"}]})
                .to_string(),
            ),
            (
                "planning/step_config.json",
                json!({"steps": [{"id": "s", "agent_configs":
                    {"declared_execution_mode": "scripted", "lock_code": true}}]})
                .to_string(),
            ),
            (
                "code/s/main.py",
                format!("raise ValueError('bad\\n{FORGED}\\x1b[2J')\n"),
            ),
        ],
    );
    let out = support::trellis(&["run", root.to_str().unwrap()]);
    let stdout = support::plugin_build::text(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("step s: failed (") && !l.contains("\\x0a")),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l == format!("    | {FORGED}\\x1b[2J")),
        "{stdout}"
    );
    assert!(!stdout.lines().any(|l| l.starts_with(FORGED)), "{stdout}");
}
