//! `trellis run`: whole workflows through the binary. The example workspace runs offline
//! from its committed cassette; small temp workspaces cover human input and routing.
//!
//! The example's cassette is built in tests/routes.rs (its conversation delegates a refund
//! to a route's sub-agent and closes with a reflection turn), which also checks that the
//! committed file is current. Re-record after changing the example or a prompt:
//! `cargo test --test all -- --ignored routes::record_example_cassette`.

use crate::support;

use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::trellis;
use support::workspace::{copy_workspace, example_dir, read_json};

const STEP: &str = "triage-tickets";

/// A copy of the example at `root`, leaving out its database and run folders (outputs).
fn copy_example(root: &Path) {
    copy_workspace(&example_dir(), root, &["runs", "db.sqlite"]);
}

use crate::support::plugin_build::text;

#[test]
fn example_runs_offline_and_a_second_run_rotates() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    copy_example(&ws);
    let root = ws.to_str().unwrap();

    let out = trellis(&["run", root]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("created db/db.sqlite from db/seed.sql"),
        "{stdout}"
    );
    assert!(
        stdout.contains("step triage-tickets: completed"),
        "{stdout}"
    );
    assert!(stdout.contains("runs/iteration-0/execution"), "{stdout}");
    // Plain progress: one line per turn, LLM call and tool call, as they happen.
    for line in [
        "  item triage-each (foreach)",
        "  turn 2: triage-each row 2",
        "    llm replay:triage-demo: 400 + 60 tokens, 1 tool call,",
        "    tool workspace:write_file: ok,",
        "  gate check-report attempt 1: passed",
    ] {
        assert!(stdout.contains(line), "{line:?} in {stdout}");
    }
    // Three tickets and the reflection's learnings with their SKILL.md index; the refunds
    // specialist's decision is a sub-agent's, indented and labelled with its route.
    assert_eq!(
        stdout
            .matches("\n    tool workspace:write_file: ok")
            .count(),
        5,
        "{stdout}"
    );
    for line in [
        "\n    sub-agent refunds call-0001: started\n    [refunds] item decide (user_message)\n",
        "\n      [refunds] tool workspace:write_file: ok",
        "\n    sub-agent refunds call-0001: completed\n    tool call_sub_agent: ok",
    ] {
        assert!(stdout.contains(line), "{line:?} in {stdout}");
    }
    // --quiet: only the summary (one step again, in the same run folder).
    let quiet = trellis(&["run", root, "--quiet", "--step", STEP]);
    let quiet_out = text(&quiet.stdout);
    assert!(quiet.status.success(), "{quiet_out}");
    assert!(!quiet_out.contains("turn 1"), "{quiet_out}");
    assert!(
        quiet_out.contains("done: 5 turns, 13 LLM calls, 8 tool calls"),
        "{quiet_out}"
    );
    let report = read_json(&ws.join("runs/iteration-0/execution/triage-tickets/report.json"));
    assert_eq!(report["tickets"].as_array().unwrap().len(), 3, "{report}");
    assert_eq!(report["escalated"], json!([1]));
    // The final gate ran and passed.
    let check = trellis(&["check", root, "--step", STEP]);
    assert!(check.status.success(), "{}", text(&check.stdout));

    // `runs list` and `runs show` read what the run left behind.
    let list = trellis(&["runs", "list", root]);
    let listed = text(&list.stdout);
    assert!(list.status.success(), "{listed}\n{}", text(&list.stderr));
    let first = listed.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("iteration-0: triage-tickets completed"),
        "{listed}"
    );
    let show = trellis(&["runs", "show", root, STEP]);
    let shown = text(&show.stdout);
    assert!(show.status.success(), "{shown}\n{}", text(&show.stderr));
    assert!(shown.contains("status: completed"), "{shown}");
    assert!(shown.contains("turns: 4"), "{shown}");
    assert!(shown.contains("triage-each [foreach] completed"), "{shown}");
    // Tickets 1 and 3 write once; the reflection writes its topic file and SKILL.md.
    assert_eq!(
        shown.matches("tool calls 1 (workspace:write_file)").count(),
        2,
        "{shown}"
    );
    assert!(
        shown.contains("tool calls 2 (workspace:write_file"),
        "{shown}"
    );
    let missing = trellis(&["runs", "show", root, "no-such-step"]);
    assert_eq!(missing.status.code(), Some(1));
    let err = text(&missing.stderr);
    assert!(err.contains("execution/no-such-step"), "{err}");

    let again = trellis(&["run", root]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(text(&again.stdout).contains("previous run moved to runs/iteration-1"));
    assert!(
        ws.join("runs/iteration-1/execution/triage-tickets/report.json")
            .is_file()
    );
    assert!(
        ws.join("runs/iteration-0/execution/triage-tickets/report.json")
            .is_file()
    );
}

#[test]
fn a_step_that_fails_exits_1_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    copy_example(&ws);
    // A fourth open ticket: the cassette has no answer for its turn.
    let seed = ws.join("db/seed.sql");
    let sql = std::fs::read_to_string(&seed).unwrap();
    std::fs::write(&seed, sql.replace("'closed');", "'open');")).unwrap();
    let out = trellis(&["run", ws.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("step triage-tickets: failed"), "{stdout}");
    assert!(stdout.contains("differs from the recording"), "{stdout}");
}

/// A workspace of human_input and routing steps only: it needs no LLM.
fn switch_workspace(root: &Path) {
    let plan = json!({
        "objective": "routing tests",
        "steps": [
            {"id": "pick", "type": "routing", "title": "Pick a side",
             "routes": [
                {"route_id": "a", "next_step_id": "left"},
                {"route_id": "b", "next_step_id": "right"}
             ],
             "default_route_id": "a"},
            {"id": "left", "type": "human_input", "title": "Left",
             "question": "Left?", "variable_name": "left_answer", "response_type": "text",
             "next_step_id": "end"},
            {"id": "right", "type": "human_input", "title": "Right",
             "question": "Right?", "variable_name": "right_answer", "response_type": "text",
             "next_step_id": "end"}
        ]
    });
    std::fs::create_dir_all(root.join("planning")).unwrap();
    std::fs::write(root.join("planning/plan.json"), plan.to_string()).unwrap();
    std::fs::write(root.join("planning/step_config.json"), r#"{"steps": []}"#).unwrap();
}

#[test]
fn a_missing_human_input_is_an_error_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    switch_workspace(dir.path());
    let out = trellis(&[
        "run",
        dir.path().to_str().unwrap(),
        "--input",
        "left_answer=yes",
    ]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("--input right_answer=VALUE"), "{stderr}");
    assert!(!dir.path().join("runs").exists(), "nothing may run");
}

#[test]
fn routing_takes_the_route_of_route_selection_else_the_default() {
    let dir = tempfile::tempdir().unwrap();
    switch_workspace(dir.path());
    let root = dir.path().to_str().unwrap();
    let inputs = ["--input", "left_answer=L", "--input", "right_answer=R"];

    let out = trellis(&[&["run", root][..], &inputs].concat());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("route a (from default_route_id) -> left"),
        "{stdout}"
    );
    // The answer file of the original: step-N.json (N the step's position in steps).
    let answer = read_json(
        &dir.path()
            .join("runs/iteration-0/execution/left/step-2.json"),
    );
    assert_eq!(answer["response"], "L");
    assert_eq!(answer["next_step_id"], "end");
    assert!(!dir.path().join("runs/iteration-0/execution/right").exists());

    // A single-step run empties the step's folder, then writes the pre-selected route.
    let own = dir.path().join("runs/iteration-0/execution/pick");
    std::fs::create_dir_all(&own).unwrap();
    std::fs::write(own.join("route_selection.json"), r#"{"select_route": "a"}"#).unwrap();
    let out = trellis(
        &[
            &["run", root, "--step", "pick", "--route", "pick=b"][..],
            &inputs,
        ]
        .concat(),
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("route b (from route_selection.json) -> right"),
        "{stdout}"
    );

    let out = trellis(
        &[
            &["run", root, "--step", "pick", "--route", "pick=zzz"][..],
            &inputs,
        ]
        .concat(),
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("\"zzz\""),
        "{}",
        text(&out.stderr)
    );
}

// ------------------------------------------------- models, recording, groups, prerequisites

/// The system message of a request body.
fn system_of(body: &Value) -> String {
    body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A workspace of `regular` steps (id, description), with step configs and workflow.json.
pub(crate) fn agent_workspace(
    root: &Path,
    steps: &[(&str, &str)],
    configs: Value,
    manifest: Value,
) {
    let steps: Vec<Value> = steps
        .iter()
        .map(|(id, description)| {
            json!({"id": id, "type": "regular", "title": id, "description": description})
        })
        .collect();
    std::fs::create_dir_all(root.join("planning")).unwrap();
    std::fs::write(
        root.join("planning/plan.json"),
        json!({"objective": "tests", "steps": steps}).to_string(),
    )
    .unwrap();
    std::fs::write(
        root.join("planning/step_config.json"),
        json!({"steps": configs}).to_string(),
    )
    .unwrap();
    std::fs::write(root.join("workflow.json"), manifest.to_string()).unwrap();
}

#[test]
fn each_step_reaches_the_server_with_its_own_model_and_options() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    agent_workspace(
        dir.path(),
        &[
            ("first", "Do the first thing."),
            ("second", "Do the second thing."),
            ("third", "Do the third thing."),
        ],
        json!([
            {"id": "first", "agent_configs": {"execution_llm": {"provider": "openai",
                "model_id": "model-a", "options": {"temperature": 0.25, "top_p": 0.5}}}},
            {"id": "second", "agent_configs": {"execution_tier": "low"}}
        ]),
        json!({"llm": {"provider": "openai", "model_id": "model-default"},
               "tiers": {"low": {"provider": "openai", "model_id": "model-b"}},
               "providers": server.providers()}),
    );
    let out = trellis(&[
        "run",
        dir.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert_eq!(server.models(), ["model-a", "model-b", "model-default"]);
    let seen = server.seen();
    assert_eq!(seen[0]["temperature"], json!(0.25));
    assert_eq!(seen[0]["top_p"], json!(0.5));
    assert!(seen[1].get("temperature").is_none(), "{}", seen[1]);
    assert!(system_of(&seen[1]).starts_with("Do the second thing."));
    // Plain progress lines, one per event, and the totals.
    assert!(stdout.contains("  turn 1: execute-and-verify"), "{stdout}");
    assert!(
        stdout.contains("    llm openai:model-a: 11 + 7 tokens, 0 tool calls"),
        "{stdout}"
    );
    assert!(
        stdout
            .contains("done: 3 turns, 3 LLM calls, 0 tool calls (0 failed), tokens 33 in / 21 out"),
        "{stdout}"
    );

    // --llm overrides every step.
    let out = trellis(&[
        "run",
        dir.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--llm",
        "openai:forced",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.models()[3..], ["forced", "forced", "forced"]);
}

/// A workspace whose step `desk` may delegate to the route `refunds` (a sub-agent step of
/// its own), with the `agent_configs` of both in its step config.
fn route_workspace(root: &Path, desk_config: Value, refunds_config: Value, manifest: Value) {
    let refunds = json!({"id": "refunds", "type": "message_sequence", "title": "Refunds",
        "description": "You decide refunds.",
        "items": [{"id": "decide", "type": "user_message", "message": "Decide."}]});
    let plan = json!({"objective": "tests", "steps": [
        {"id": "desk", "type": "message_sequence", "title": "Desk",
         "description": "You coordinate the desk.",
         "items": [{"id": "work", "type": "user_message", "message": "Handle the requests."}],
         "predefined_routes": [{"route_id": "refunds", "route_name": "Refunds specialist",
             "condition": "money back", "sub_agent_step": refunds}]}
    ]});
    std::fs::create_dir_all(root.join("planning")).unwrap();
    std::fs::write(root.join("planning/plan.json"), plan.to_string()).unwrap();
    let configs = json!([{"id": "desk", "agent_configs": desk_config},
                         {"id": "refunds", "agent_configs": refunds_config}]);
    std::fs::write(
        root.join("planning/step_config.json"),
        json!({"steps": configs}).to_string(),
    )
    .unwrap();
    std::fs::write(root.join("workflow.json"), manifest.to_string()).unwrap();
}

/// The desk delegates once, the specialist decides, the desk closes.
fn desk_server() -> FakeServer {
    FakeServer::start(Box::new(|body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if system_of(body).starts_with("You decide refunds.") {
            (200, completion("refund granted", &[]))
        } else if messages.iter().any(|m| m["role"] == "tool") {
            (200, completion("all handled", &[]))
        } else {
            let args = json!({"route_id": "refunds", "instructions": "Refund order 1."});
            (200, completion("", &[("call_sub_agent", args)]))
        }
    }))
}

#[test]
fn a_sub_agent_uses_its_own_model_when_its_step_config_names_one() {
    let specialist = json!({"execution_llm": {"provider": "openai", "model_id": "specialist",
        "options": {"temperature": 0.1}}});
    let server = desk_server();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let manifest = json!({"llm": {"provider": "openai", "model_id": "generalist"},
                          "providers": server.providers()});
    route_workspace(dir.path(), json!({}), specialist, manifest);
    let out = trellis(&["run", root, "--allow-host", "127.0.0.1"]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}
{}",
        text(&out.stderr)
    );
    assert_eq!(server.models(), ["generalist", "specialist", "generalist"]);
    let seen = server.seen();
    assert_eq!(seen[1]["temperature"], json!(0.1), "the child's options");
    assert!(seen[0].get("temperature").is_none(), "{}", seen[0]);
    assert!(
        stdout.contains("[refunds] llm openai:specialist: 11 + 7 tokens"),
        "{stdout}"
    );
    assert!(stdout.contains("llm openai:generalist: 11 + 7"), "{stdout}");
    let summary = read_json(
        &dir.path()
            .join("runs/iteration-0/execution/desk/execution-final-summary.json"),
    );
    assert_eq!(summary["execution_result"], "all handled");

    // --llm overrides the sub-agent's model too.
    let out = trellis(&[
        "run",
        root,
        "--allow-host",
        "127.0.0.1",
        "--llm",
        "openai:forced",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.models()[3..], ["forced", "forced", "forced"]);

    // Without a model of its own the sub-agent talks to its parent's, not workflow.json's.
    let server = desk_server();
    let dir = tempfile::tempdir().unwrap();
    route_workspace(
        dir.path(),
        json!({"execution_tier": "high"}),
        json!({"selected_tools": ["workspace:write_file"]}),
        json!({"tiers": {"high": {"provider": "openai", "model_id": "generalist"}},
               "llm": {"provider": "openai", "model_id": "default"},
               "providers": server.providers()}),
    );
    let out = trellis(&[
        "run",
        dir.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.models(), ["generalist", "generalist", "generalist"]);
}

#[test]
fn a_sub_agent_with_an_unknown_tier_is_an_error_before_anything_runs() {
    let server = desk_server();
    let dir = tempfile::tempdir().unwrap();
    route_workspace(
        dir.path(),
        json!({}),
        json!({"execution_tier": "high"}),
        json!({"llm": {"provider": "openai", "model_id": "generalist"},
               "providers": server.providers()}),
    );
    let out = trellis(&[
        "run",
        dir.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("route \"refunds\" of step \"desk\""),
        "{stderr}"
    );
    assert!(stderr.contains("no tiers.high"), "{stderr}");
    assert!(server.seen().is_empty(), "nothing may run");
    assert!(!dir.path().join("runs").exists(), "nothing may run");
    // Under --llm the sub-agent's own setting is not used, so it is not an error.
    let out = trellis(&[
        "run",
        dir.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--llm",
        "openai:forced",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.models(), ["forced", "forced", "forced"]);
}

#[test]
fn a_failing_primary_falls_back_in_order() {
    let server = FakeServer::start(Box::new(|body| match body["model"].as_str() {
        Some("fallback-2") => (200, completion("answered by the second fallback", &[])),
        _ => (400, json!({"error": {"message": "no such model"}})),
    }));
    let dir = tempfile::tempdir().unwrap();
    agent_workspace(
        dir.path(),
        &[("only", "Answer.")],
        json!([{"id": "only", "agent_configs": {"execution_llm": {
            "provider": "openai", "model_id": "primary",
            "fallbacks": [{"provider": "openai", "model_id": "fallback-1"},
                          {"provider": "openai", "model_id": "fallback-2",
                           "options": {"max_tokens": 50}}]}}}]),
        json!({"providers": server.providers()}),
    );
    let out = trellis(&[
        "run",
        dir.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert_eq!(server.models(), ["primary", "fallback-1", "fallback-2"]);
    assert_eq!(server.seen()[2]["max_tokens"], json!(50));
    let summary = read_json(
        &dir.path()
            .join("runs/iteration-0/execution/only/execution-final-summary.json"),
    );
    assert_eq!(
        summary["execution_result"],
        "answered by the second fallback"
    );
    assert!(
        stdout.contains("llm openai:fallback-2: 11 + 7 tokens"),
        "{stdout}"
    );
}

#[test]
fn a_step_needing_a_model_without_one_is_an_error_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    agent_workspace(dir.path(), &[("lonely", "Think.")], json!([]), json!({}));
    let out = trellis(&[
        "run",
        dir.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("step \"lonely\""), "{stderr}");
    for way in [
        "--llm PROVIDER:MODEL",
        "execution_llm",
        "\"llm\" in workflow.json",
    ] {
        assert!(stderr.contains(way), "{way}: {stderr}");
    }
    assert!(!dir.path().join("runs").exists(), "nothing may run");
    // A workflow that never needs a model runs without one (switch_workspace has no
    // workflow.json and no llm at all).
    let switch = tempfile::tempdir().unwrap();
    switch_workspace(switch.path());
    let out = trellis(&[
        "run",
        switch.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--input",
        "left_answer=L",
        "--input",
        "right_answer=R",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn a_recorded_run_replays_offline_with_the_same_outputs() {
    // The model writes report.json with a tool call, then answers.
    let server = FakeServer::start(Box::new(|body| {
        let tool_results = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .count();
        if tool_results == 0 {
            let args = json!({"path": "runs/iteration-0/execution/write/report.json",
                              "content": "{\"answer\": 42}"});
            (200, completion("", &[("workspace__write_file", args)]))
        } else {
            (
                200,
                completion("report.json written.\nCONCERNS: none really", &[]),
            )
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    agent_workspace(
        &ws,
        &[("write", "Write report.json in your output folder.")],
        json!([{"id": "write", "agent_configs": {"selected_tools": ["workspace:write_file"]}}]),
        json!({"llm": {"provider": "openai", "model_id": "live"},
               "providers": server.providers()}),
    );
    let root = ws.to_str().unwrap();
    let cassette = ws.join("cassettes/taped.json");
    std::fs::create_dir_all(cassette.parent().unwrap()).unwrap();
    let out = trellis(&[
        "run",
        root,
        "--allow-host",
        "127.0.0.1",
        "--record",
        cassette.to_str().unwrap(),
    ]);
    let recorded_stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{recorded_stdout}\n{}",
        text(&out.stderr)
    );
    assert!(
        recorded_stdout.contains("recorded 2 LLM calls to"),
        "{recorded_stdout}"
    );
    assert_eq!(server.seen().len(), 2);
    let step = |run: &str, file: &str| {
        std::fs::read_to_string(ws.join(format!("runs/{run}/execution/write/{file}"))).unwrap()
    };
    let live_report = step("iteration-0", "report.json");
    assert_eq!(live_report, "{\"answer\": 42}");

    // Replay: no server involved (the override replaces the openai model everywhere).
    let out = trellis(&[
        "run",
        root,
        "--allow-host",
        "127.0.0.1",
        "--llm",
        "replay:taped",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert_eq!(server.seen().len(), 2, "the replay reached the server");
    assert_eq!(step("iteration-0", "report.json"), live_report);
    let summary = |run: &str| -> Value {
        let mut v: Value =
            serde_json::from_str(&step(run, "execution-final-summary.json")).unwrap();
        v.as_object_mut().unwrap().remove("completed_at");
        v
    };
    assert_eq!(summary("iteration-0"), summary("iteration-1"));
    assert!(stdout.contains("CONCERNS: none really"), "{stdout}");

    // Recording from replay makes no sense and is refused.
    let out = trellis(&[
        "run",
        root,
        "--allow-host",
        "127.0.0.1",
        "--llm",
        "replay:taped",
        "--record",
        "/tmp/x.json",
    ]);
    assert!(!out.status.success());
}

#[test]
fn groups_run_in_their_own_folders_with_their_variables() {
    let server = FakeServer::start(Box::new(|body| {
        let region = system_of(body)
            .lines()
            .find_map(|l| l.strip_prefix("- REGION = ").map(str::to_string))
            .unwrap_or_else(|| "none".into());
        (200, completion(&format!("region {region}"), &[]))
    }));
    let dir = tempfile::tempdir().unwrap();
    agent_workspace(
        dir.path(),
        &[("report", "Report on your region.")],
        json!([]),
        json!({"llm": {"provider": "openai", "model_id": "m"},
               "providers": server.providers(),
               "variables": {"REGION": "eu-west-1", "TEAM": {"value": "core"}},
               "groups": [{"id": "us", "name": "US market", "variables": {"REGION": "us-east-1"}},
                          {"id": "eu"}]}),
    );
    let root = dir.path().to_str().unwrap();
    let result = |group: &str| -> Value {
        read_json(&dir.path().join(format!(
            "runs/iteration-0/{group}/execution/report/execution-final-summary.json"
        )))["execution_result"]
            .clone()
    };
    let out = trellis(&["run", root, "--allow-host", "127.0.0.1"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert_eq!(result("us-market"), "region us-east-1");
    assert_eq!(result("eu"), "region eu-west-1");
    assert!(system_of(&server.seen()[0]).contains(
        "Workflow variables (group us, US market):\n- REGION = us-east-1\n- TEAM = core"
    ));
    assert!(stdout.contains("outputs of group us:"), "{stdout}");

    // One group again: iteration-0 is reused, the other group's outputs stay.
    let out = trellis(&[
        "run",
        root,
        "--allow-host",
        "127.0.0.1",
        "--group",
        "US market",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!dir.path().join("runs/iteration-1").exists(), "no rotation");
    assert_eq!(result("eu"), "region eu-west-1");
    let out = trellis(&[
        "run",
        root,
        "--allow-host",
        "127.0.0.1",
        "--group",
        "eu",
        "--step",
        "report",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.seen().len(), 4);

    let out = trellis(&["run", root, "--allow-host", "127.0.0.1", "--group", "apac"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("no group \"apac\""), "{stderr}");
    assert!(stderr.contains("us (US market), eu"), "{stderr}");
    let out = trellis(&["run", root, "--allow-host", "127.0.0.1", "--step", "report"]);
    assert!(!out.status.success(), "--step needs --group here");
    assert!(text(&out.stderr).contains("--group"));

    // A full run rotates the whole iteration-0.
    let out = trellis(&["run", root, "--allow-host", "127.0.0.1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        dir.path()
            .join("runs/iteration-1/us-market/execution/report")
            .is_dir()
    );
}

/// A two-step workflow whose second step reports its prerequisite missing the first
/// `misses` times it runs, run.
fn prerequisite_run(misses: usize) -> (tempfile::TempDir, Output, FakeServer) {
    let (dir, server) = prerequisite_workspace(misses);
    let out = trellis(&[
        "run",
        dir.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
    ]);
    (dir, out, server)
}

/// A two-step workflow whose second step reports its prerequisite missing the first
/// `misses` times it runs, and its model.
pub(crate) fn prerequisite_workspace(misses: usize) -> (tempfile::TempDir, FakeServer) {
    let analyzed = std::sync::atomic::AtomicUsize::new(0);
    let server = FakeServer::start(Box::new(move |body| {
        if system_of(body).starts_with("Fetch") {
            return (200, completion("fetched", &[]));
        }
        let n = analyzed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let reply = match n % 2 {
            _ if n >= misses => "analyzed",
            0 => "The input is not there.\nPREREQUISITE MISSING: fetch: no data file",
            _ => "Cannot start.\nPREREQUISITE MISSING: The fetched  data.",
        };
        (200, completion(reply, &[]))
    }));
    let dir = tempfile::tempdir().unwrap();
    agent_workspace(
        dir.path(),
        &[
            ("fetch", "Fetch the data."),
            ("analyze", "Analyze the data."),
        ],
        json!([{"id": "analyze", "agent_configs": {
            "enable_prerequisite_detection": true,
            "prerequisite_rules": [{"depends_on_step": "fetch", "description": "the fetched data"}]}}]),
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": server.providers()}),
    );
    (dir, server)
}

/// The steps a run reports ending, in order.
pub(crate) fn steps_ended(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("step "))
        .filter(|l| !l.ends_with(": started") && !l.contains(": running on worker "))
        .filter_map(|l| l.split_once(':').map(|(id, _)| id.to_string()))
        .collect()
}

#[test]
fn a_missing_prerequisite_sends_the_run_back_a_bounded_number_of_times() {
    // Twice missing (once by step id, once by the rule's description): back to fetch each
    // time, then it completes.
    let (_dir, out, _server) = prerequisite_run(2);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert_eq!(
        steps_ended(&stdout),
        ["fetch", "analyze", "fetch", "analyze", "fetch", "analyze"],
        "{stdout}"
    );
    assert!(
        stdout
            .contains("prerequisite missing: fetch: no data file -> back to fetch (return 1 of 2)"),
        "{stdout}"
    );

    // Always missing: after two returns the step fails with the reason.
    let (dir, out, _server) = prerequisite_run(usize::MAX);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert_eq!(steps_ended(&stdout).len(), 6, "{stdout}");
    let summary = read_json(
        &dir.path()
            .join("runs/iteration-0/execution/analyze/execution-final-summary.json"),
    );
    assert_eq!(summary["status"], "failed");
    let reason = summary["execution_result"].as_str().unwrap();
    assert!(
        reason.contains("prerequisite still missing after going back to fetch 2 times"),
        "{reason}"
    );
}

#[test]
fn ctrl_c_stops_at_the_next_boundary_and_the_session_records_stopped() {
    // The first answer asks for a tool and is held back until the run has taken the Ctrl-C
    // (it says so on stderr): the stop arrives while the LLM call is in flight, whatever the
    // machine's load, the tool round it asked for still runs, and the loop stops before the
    // next call.
    let release = Arc::new(AtomicBool::new(false));
    let held = release.clone();
    let server = FakeServer::start(Box::new(move |_| {
        let waited = std::time::Instant::now();
        while !held.load(Ordering::SeqCst) && waited.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let args = json!({"path": "runs/iteration-0/execution/only/note.md", "content": "x"});
        (200, completion("", &[("workspace__write_file", args)]))
    }));
    let dir = tempfile::tempdir().unwrap();
    agent_workspace(
        dir.path(),
        &[("only", "Write a note."), ("later", "Never reached.")],
        json!([]),
        json!({"llm": {"provider": "openai", "model_id": "slow"},
               "providers": server.providers()}),
    );
    let mut child = support::trellis_command(&[
        "run",
        dir.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
    ])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let waited = std::time::Instant::now();
    while server.seen().is_empty() {
        assert!(
            waited.elapsed() < Duration::from_secs(120),
            "the run never reached the model"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on the child's pid, which is ours and still running (it is waiting
    // for the held answer).
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let mut stderr = String::new();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap());
    while !stderr.contains("stopping at the next boundary") {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut lines, &mut line).unwrap() == 0 {
            break;
        }
        stderr.push_str(&line);
    }
    release.store(true, Ordering::SeqCst);
    std::io::Read::read_to_string(&mut lines, &mut stderr).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = text(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(stderr.contains("stopping at the next boundary"), "{stderr}");
    assert_eq!(
        server.seen().len(),
        1,
        "no LLM call after the stop request\n{stdout}\n{stderr}"
    );
    let step = dir.path().join("runs/iteration-0/execution/only");
    assert_eq!(read_json(&step.join("session.json"))["status"], "stopped");
    assert_eq!(
        read_json(&step.join("execution-final-summary.json"))["status"],
        "stopped"
    );
    assert_eq!(
        std::fs::read_to_string(step.join("note.md")).unwrap(),
        "x",
        "the tool round already asked for ran"
    );
    assert!(
        !dir.path().join("runs/iteration-0/execution/later").exists(),
        "no later step started"
    );
}

#[test]
fn a_missing_or_empty_workspace_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let out = trellis(&["run", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("{}: no such workspace folder", missing.display())),
        "{stderr}"
    );
    let out = trellis(&["run", dir.path().to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}: the workspace has errors",
            dir.path().display()
        )) && stderr.contains("planning/plan.json"),
        "{stderr}"
    );
    assert!(!dir.path().join("runs").exists(), "nothing was created");
}

// ------------------------------------------------ LLM providers: files, secrets, requests
// Each test below is an attack class of docs/security.md ("LLM providers: secrets, origins
// and requests").

/// Every file under `root` whose bytes contain `needle`.
fn files_containing(root: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (rel, _) in support::tree_digest(root) {
        let path = root.join(&rel);
        if path.is_file() && text(&std::fs::read(&path).unwrap()).contains(needle) {
            found.push(rel);
        }
    }
    found
}

/// A one-step agent workspace at `root` with `manifest`, an old run folder and a seed.sql:
/// a refusal before anything runs must leave `runs/` unrotated and create no database.
fn preflight_workspace(root: &Path, manifest: Value) {
    agent_workspace(root, &[("answer", "Answer.")], json!([]), manifest);
    support::workspace::write_files(
        root,
        &[
            ("runs/iteration-0/old.txt", "from before"),
            ("db/seed.sql", "CREATE TABLE t (x INTEGER);"),
        ],
    );
}

fn assert_untouched(root: &Path) {
    assert!(root.join("runs/iteration-0/old.txt").is_file(), "rotated");
    assert!(!root.join("runs/iteration-1").exists(), "rotated");
    assert!(!root.join("db/db.sqlite").exists(), "database created");
}

#[test]
fn a_replay_model_id_cannot_read_outside_the_cassettes_folder() {
    const MARKER: &str = "OUTSIDE-THE-WORKSPACE-7f3a";
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let outside = dir.path().join("elsewhere");
    // A file outside the workspace shaped like a cassette, so that reading it would show
    // its text in the first difference.
    let leak = json!({"interactions": [{"request": {
        "messages": [{"role": "system", "content": MARKER}]},
        "response": {"text": MARKER}}]});
    support::workspace::write_files(
        &outside,
        &[
            ("secret.json", leak.to_string()),
            ("demo.json", leak.to_string()),
        ],
    );
    preflight_workspace(&ws, json!({}));
    std::fs::create_dir_all(ws.join("cassettes")).unwrap();
    let root = ws.to_str().unwrap();
    let absolute = outside.join("secret");
    for id in [
        "../../elsewhere/secret".to_string(),
        "../elsewhere/secret".to_string(),
        absolute.display().to_string(),
        "..".to_string(),
    ] {
        let out = trellis(&["run", root, "--llm", &format!("replay:{id}")]);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(
            !stdout.contains(MARKER) && !stderr.contains(MARKER),
            "{stdout}{stderr}"
        );
        assert!(!out.status.success(), "replay:{id}: {stdout}");
        assert!(
            stderr.contains("not one plain name"),
            "replay:{id}: {stderr}"
        );
        assert_untouched(&ws);
    }

    // The same id in workflow.json: `validate` names it, `run` refuses it.
    let manifest = json!({"llm": {"provider": "replay", "model_id": "../elsewhere/secret"}});
    std::fs::write(ws.join("workflow.json"), manifest.to_string()).unwrap();
    let out = trellis(&["validate", root]);
    let stdout = text(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("workflow.json: llm.model_id") && stdout.contains("not one plain name"),
        "{stdout}"
    );
    let out = trellis(&["run", root]);
    assert!(!out.status.success());
    assert!(!text(&out.stdout).contains(MARKER) && !text(&out.stderr).contains(MARKER));
    assert_untouched(&ws);

    // A `cassettes` folder that is a symlink out of the workspace.
    std::fs::write(ws.join("workflow.json"), "{}").unwrap();
    std::fs::remove_dir(ws.join("cassettes")).unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("cassettes")).unwrap();
    let out = trellis(&["run", root, "--llm", "replay:demo"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success(), "{stdout}");
    assert!(stderr.contains("inside the workspace"), "{stderr}");
    assert!(
        !stdout.contains(MARKER) && !stderr.contains(MARKER),
        "{stdout}{stderr}"
    );
    assert_untouched(&ws);
    // A cassette file that is a symlink out of the workspace.
    std::fs::remove_file(ws.join("cassettes")).unwrap();
    std::fs::create_dir(ws.join("cassettes")).unwrap();
    std::os::unix::fs::symlink(outside.join("demo.json"), ws.join("cassettes/demo.json")).unwrap();
    let out = trellis(&["run", root, "--llm", "replay:demo"]);
    assert!(!out.status.success());
    assert!(!text(&out.stdout).contains(MARKER) && !text(&out.stderr).contains(MARKER));
    assert_untouched(&ws);
    assert!(files_containing(&ws.join("runs"), MARKER).is_empty());
}

const KEY: &str = "sk-operator-secret-4c1d9e";

/// `trellis run root args...` with `vars` set.
fn run_with(root: &Path, args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut all = vec!["run", root.to_str().unwrap()];
    all.extend_from_slice(args);
    let mut command = support::trellis_command(&all);
    for (k, v) in vars {
        command.env(k, v);
    }
    command.output().unwrap()
}

#[test]
fn a_workspace_cannot_send_the_operators_key_to_an_unapproved_origin() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let origin = server.base_url().trim_end_matches("/v1").to_string();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    preflight_workspace(
        &ws,
        json!({"llm": {"provider": "openai", "model_id": "m"},
               "providers": {"openai": {"base_url": server.base_url(),
                                        "api_key_env": "AWS_SECRET_ACCESS_KEY"}}}),
    );
    let key = [("AWS_SECRET_ACCESS_KEY", KEY)];
    let out = run_with(&ws, &[], &key);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let expected = format!(
        "workflow.json: providers.openai.api_key_env: the key in AWS_SECRET_ACCESS_KEY is not \
         approved for {origin}; approve it with --allow-key AWS_SECRET_ACCESS_KEY={origin}"
    );
    assert!(stderr.contains(&expected), "{stderr}");
    assert_eq!(server.seen().len(), 0, "a request went out");
    assert_untouched(&ws);

    // The default key cannot be redirected by base_url either.
    let mut manifest = read_json(&ws.join("workflow.json"));
    manifest["providers"]["openai"]
        .as_object_mut()
        .unwrap()
        .remove("api_key_env");
    std::fs::write(ws.join("workflow.json"), manifest.to_string()).unwrap();
    let out = run_with(&ws, &[], &[("OPENAI_API_KEY", KEY)]);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("providers.openai.base_url: the key in OPENAI_API_KEY is not approved"),
        "{stderr}"
    );
    assert_eq!(server.seen().len(), 0);
    // ... unless the operator points OPENAI_BASE_URL there.
    let out = run_with(
        &ws,
        &[],
        &[
            ("OPENAI_API_KEY", KEY),
            ("OPENAI_BASE_URL", &server.base_url()),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.seen().len(), 1);
    std::fs::write(
        ws.join("workflow.json"),
        json!({"llm": {"provider": "openai", "model_id": "m"},
               "providers": {"openai": {"base_url": server.base_url(),
                                        "api_key_env": "AWS_SECRET_ACCESS_KEY"}}})
        .to_string(),
    )
    .unwrap();

    // Approved on the command line, then in the user config file.
    let flag = format!("AWS_SECRET_ACCESS_KEY={origin}");
    let out = run_with(&ws, &["--allow-key", &flag], &key);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.seen().len(), 2);
    let config = dir.path().join("config");
    let xdg = [("XDG_CONFIG_HOME", config.to_str().unwrap()), key[0]];
    support::workspace::write_file(
        &config,
        "trellis/config.toml",
        format!("[[allow_key]]\nvar = \"AWS_SECRET_ACCESS_KEY\"\norigin = \"{origin}\"\n"),
    );
    let out = run_with(&ws, &[], &xdg);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.seen().len(), 3);
    // An unknown key in the config file is named with the file.
    support::workspace::write_file(
        &config,
        "trellis/config.toml",
        format!("[[allow_key]]\nvar = \"AWS_SECRET_ACCESS_KEY\"\nurl = \"{origin}\"\n"),
    );
    let out = run_with(&ws, &[], &xdg);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("trellis/config.toml") && stderr.contains("url"),
        "{stderr}"
    );
    assert_eq!(server.seen().len(), 3);

    // Plain http off this machine needs the same approval, key or not.
    std::fs::write(
        ws.join("workflow.json"),
        json!({"llm": {"provider": "openai", "model_id": "m"},
               "providers": {"openai": {"base_url": "http://llm.example.invalid:8080/v1",
                                        "api_key_env": "TRELLIS_TEST_NO_KEY"}}})
        .to_string(),
    )
    .unwrap();
    let out = run_with(&ws, &[], &[]);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("plain http to http://llm.example.invalid:8080")
            && stderr.contains("--allow-key TRELLIS_TEST_NO_KEY=http://llm.example.invalid:8080"),
        "{stderr}"
    );
}

#[test]
fn a_provider_call_opens_a_bounded_number_of_requests() {
    let server = FakeServer::start(Box::new(|_| (200, completion("again", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    support::plugin_folder(&plugins, "test_snoop", "snoop", "llm-provider");
    let ws = dir.path().join("ws");
    agent_workspace(
        &ws,
        &[("answer", "Answer.")],
        json!([]),
        json!({"llm": {"provider": "snoop", "model_id": "flood"},
               "providers": {"snoop": {"base_url": server.base_url(),
                                       "api_key_env": "TRELLIS_TEST_NO_KEY"}}}),
    );
    let out = run_with(
        &ws,
        &[
            "--plugins",
            plugins.to_str().unwrap(),
            "--allow-host",
            &server.allow_host(),
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        server.connections() <= 16,
        "{} connections in one call",
        server.connections()
    );
    assert_eq!(
        server.seen().len(),
        16,
        "the limit is 16 requests per attempt: {stdout}\n{}",
        text(&out.stderr)
    );
    let session =
        text(&std::fs::read(ws.join("runs/iteration-0/execution/answer/session.json")).unwrap());
    assert!(
        session.contains("more than 16 requests in one call attempt"),
        "{session}"
    );
}

#[test]
fn a_key_echoed_by_the_server_is_redacted_from_every_file_and_output() {
    // The first call is refused with the key in the 401 body; the next answers with it.
    let server = FakeServer::start_with_auth(Box::new(|body, auth| {
        let auth = auth.unwrap_or("none").to_string();
        if body["model"] == "refused" {
            (
                401,
                json!({"error": {"message": format!("bad credentials: {auth}")}}),
            )
        } else {
            let args = json!({"path": "runs/iteration-0/execution/echo/got.txt",
                              "content": format!("key was {auth}")});
            let tools = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["role"] == "tool");
            if tools {
                (200, completion(&format!("echo: {auth}"), &[]))
            } else {
                (200, completion("", &[("workspace__write_file", args)]))
            }
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    agent_workspace(
        &ws,
        &[("echo", "Echo."), ("refuse", "Refuse.")],
        json!([{"id": "echo", "agent_configs": {"selected_tools": ["workspace:write_file"]}},
               {"id": "refuse", "agent_configs": {"execution_llm":
                   {"provider": "openai", "model_id": "refused"}}}]),
        json!({"llm": {"provider": "openai", "model_id": "m"},
               "providers": {"openai": {"base_url": server.base_url(),
                                        "api_key_env": "TRELLIS_TEST_KEY"}}}),
    );
    let origin = server.base_url().trim_end_matches("/v1").to_string();
    let cassette = ws.join("cassettes/echo.json");
    std::fs::create_dir_all(cassette.parent().unwrap()).unwrap();
    // Approved in the user config file (outside the workspace).
    let config = dir.path().join("config");
    support::workspace::write_file(
        &config,
        "trellis/config.toml",
        format!("[[allow_key]]\nvar = \"TRELLIS_TEST_KEY\"\norigin = \"{origin}\"\n"),
    );
    let out = run_with(
        &ws,
        &["--record", cassette.to_str().unwrap()],
        &[
            ("TRELLIS_TEST_KEY", KEY),
            ("RUST_LOG", "debug"),
            ("XDG_CONFIG_HOME", config.to_str().unwrap()),
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(server.seen().len() >= 3, "{stdout}\n{stderr}");
    assert!(!stdout.contains(KEY), "{stdout}");
    assert!(!stderr.contains(KEY), "{stderr}");
    assert_eq!(files_containing(&ws, KEY), Vec::<String>::new());
    // The refused step's error names the 401 body, key redacted, in the report (stdout)
    // and in the warning of the failed call (stderr).
    let redacted = "HTTP 401: bad credentials: Bearer [REDACTED]";
    assert!(stdout.contains(redacted), "{stdout}");
    assert!(stderr.contains(redacted), "{stderr}");
    assert!(!files_containing(&ws, "[REDACTED]").is_empty());
}

#[test]
fn a_scripted_steps_repair_model_is_checked_in_the_preflight_too() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    preflight_workspace(
        &ws,
        json!({"llm": {"provider": "openai", "model_id": "m"},
               "providers": {"openai": {"base_url": server.base_url(),
                                        "api_key_env": "AWS_SECRET_ACCESS_KEY"}}}),
    );
    // The only step is scripted: the model is used only if its script needs a repair.
    std::fs::write(
        ws.join("planning/step_config.json"),
        json!({"steps": [{"id": "answer", "agent_configs": {"declared_execution_mode": "scripted"}}]})
            .to_string(),
    )
    .unwrap();
    support::workspace::write_file(&ws, "code/answer/main.py", "print('fine')\n");
    let out = run_with(&ws, &[], &[("AWS_SECRET_ACCESS_KEY", KEY)]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        stderr.contains("the key in AWS_SECRET_ACCESS_KEY is not approved"),
        "{stderr}"
    );
    assert_untouched(&ws);
    assert_eq!(server.seen().len(), 0);
}

#[test]
fn a_config_file_others_can_write_approves_no_key() {
    // Whoever can write ~/.config/trellis/config.toml decides which servers get the keys: a
    // file writable by group or others is refused (before, its approvals were used), and
    // nothing runs or is sent.
    use std::os::unix::fs::PermissionsExt;
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let origin = server.base_url().trim_end_matches("/v1").to_string();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    preflight_workspace(
        &ws,
        json!({"llm": {"provider": "openai", "model_id": "m"},
               "providers": {"openai": {"base_url": server.base_url(),
                                        "api_key_env": "AWS_SECRET_ACCESS_KEY"}}}),
    );
    let config = dir.path().join("config");
    support::workspace::write_file(
        &config,
        "trellis/config.toml",
        format!("[[allow_key]]\nvar = \"AWS_SECRET_ACCESS_KEY\"\norigin = \"{origin}\"\n"),
    );
    let file = config.join("trellis/config.toml");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
    let before = support::tree_digest(&ws);
    let vars = [
        ("XDG_CONFIG_HOME", config.to_str().unwrap()),
        ("AWS_SECRET_ACCESS_KEY", KEY),
    ];
    let out = run_with(&ws, &[], &vars);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let expected = format!(
        "{}: refusing the key approvals: the file is writable by group or others (mode 666); \
         make it yours alone (chmod go-w)",
        file.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    assert_eq!(server.seen().len(), 0, "a request went out");
    assert_eq!(support::tree_digest(&ws), before);
    // Owner-only again, the same file approves.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run_with(&ws, &[], &vars);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.seen().len(), 1);
}

#[test]
fn a_cassette_is_read_like_every_workspace_file() {
    // cassettes/<id>.json went through its own cap-std read: no size cap (a sparse file of
    // any size was read whole into memory) and links inside the workspace followed.
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    preflight_workspace(
        &ws,
        json!({"llm": {"provider": "replay", "model_id": "demo"}}),
    );
    std::fs::create_dir_all(ws.join("cassettes")).unwrap();
    let huge = std::fs::File::create(ws.join("cassettes/demo.json")).unwrap();
    huge.set_len((64 << 20) + 1).unwrap();
    drop(huge);
    let before = support::tree_digest(&ws);
    let out = trellis(&["run", ws.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        stderr.contains(&format!(
            "cassettes/demo.json is {} bytes, more than the {} Trellis reads",
            (64 << 20) + 1,
            64 << 20
        )),
        "{stderr}"
    );
    assert_eq!(support::tree_digest(&ws), before);
    assert_untouched(&ws);
    // A link that stays inside the workspace is refused as well.
    std::fs::remove_file(ws.join("cassettes/demo.json")).unwrap();
    std::fs::write(ws.join("cassettes/real.json"), "[]").unwrap();
    std::os::unix::fs::symlink("real.json", ws.join("cassettes/demo.json")).unwrap();
    let out = trellis(&["run", ws.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        stderr.contains(
            "cassettes/demo.json is a symbolic link; Trellis does not read or write through links"
        ),
        "{stderr}"
    );
    assert_untouched(&ws);
}

#[test]
fn a_key_echoed_to_a_provider_is_hidden_from_its_log_lines() {
    let server = FakeServer::start_with_auth(Box::new(|_, auth| {
        (200, json!({"echo": auth.unwrap_or("none")}))
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    agent_workspace(
        &ws,
        &[("echo", "Echo.")],
        json!([]),
        json!({"llm": {"provider": "snoop", "model_id": "echo_log"},
               "providers": {"snoop": {"base_url": server.base_url(),
                                       "api_key_env": "TRELLIS_TEST_KEY"}}}),
    );
    let plugins = support::plugin_folder(dir.path(), "test_snoop", "snoop", "llm-provider");
    let origin = server.base_url().trim_end_matches("/v1").to_string();
    let flag = format!("TRELLIS_TEST_KEY={origin}");
    let out = run_with(
        &ws,
        &["--allow-key", &flag, "--plugins", plugins.to_str().unwrap()],
        &[("TRELLIS_TEST_KEY", KEY), ("RUST_LOG", "debug")],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // The provider logged what the server echoed: the header arrived, the key did not.
    assert!(
        stderr.contains("endpoint said: {\"echo\":\"Bearer [REDACTED]\"}"),
        "{stderr}"
    );
    assert!(!stderr.contains(KEY) && !stdout.contains(KEY));
    assert_eq!(files_containing(&ws, KEY), Vec::<String>::new());
}

/// The step summary is written behind the loop: an agent that made a folder where it goes
/// (its output folder is writable) fails the run at its end, naming the file, with every other
/// file of the run whole.
#[test]
fn a_folder_an_agent_made_where_its_step_summary_goes_fails_the_run_naming_it() {
    let llm = support::mcp_servers::asking_for(vec![(
        "workspace__write_file",
        json!({"path": "runs/iteration-0/execution/work/execution-final-summary.json/x",
               "content": "x"}),
    )]);
    let dir = tempfile::tempdir().unwrap();
    agent_workspace(
        dir.path(),
        &[("work", "Write.")],
        json!([]),
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": llm.providers()}),
    );
    let out = trellis(&[
        "run",
        dir.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
    ]);
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("execution-final-summary.json") && all.contains("is a folder"),
        "{all}"
    );
    let exec = dir.path().join("runs/iteration-0/execution/work");
    assert!(exec.join("execution-final-summary.json/x").is_file());
    let session = read_json(&exec.join("session.json"));
    assert_eq!(session["status"], "completed", "{session}");
    let listed = trellis(&["runs", "list", dir.path().to_str().unwrap()]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
}

/// A step's session and final summary are written behind the loop, yet the next step's agent
/// reads them as if they had been written at once: its first tool call waits for them.
#[test]
fn a_later_step_reads_the_summary_of_the_step_before_it() {
    let server = FakeServer::start(Box::new(|body| {
        let answered = body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        if !answered && system_of(body).contains("Read the summary of the first step.") {
            let path = "runs/iteration-0/execution/first/execution-final-summary.json";
            (
                200,
                completion("", &[("workspace__read_file", json!({"path": path}))]),
            )
        } else {
            (200, completion("first answer", &[]))
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    agent_workspace(
        dir.path(),
        &[
            ("first", "Answer."),
            ("second", "Read the summary of the first step."),
        ],
        json!([]),
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": server.providers()}),
    );
    let out = trellis(&[
        "run",
        dir.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let read: Vec<String> = server
        .seen()
        .iter()
        .flat_map(support::fake_llm::tool_results_of)
        .map(|(_, result)| result)
        .collect();
    assert_eq!(read.len(), 1, "{read:?}");
    assert!(
        read[0].contains("first answer") && read[0].contains("completed"),
        "{}",
        read[0]
    );
}

/// A model's `CONCERNS:` line with terminal escape sequences (retitle the window, clear the
/// screen) is printed escaped: no control character of the model reaches the terminal.
#[test]
fn control_sequences_from_a_model_are_printed_escaped() {
    let server = FakeServer::start(Box::new(|_| {
        (
            200,
            completion("done\nCONCERNS: \u{1b}]0;pwned\u{7}\u{1b}[2J odd", &[]),
        )
    }));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    support::workspace::write_files(
        root,
        &[
            (
                "planning/plan.json",
                json!({"objective": "t", "steps": [
                    {"id": "answer", "type": "regular", "title": "A", "description": "Answer."}
                ]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": server.providers()})
                .to_string(),
            ),
        ],
    );
    let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("CONCERNS: \\x1b]0;pwned\\x07\\x1b[2J odd"),
        "{stdout}"
    );
    assert!(
        !out.stdout.contains(&0x1b) && !out.stderr.contains(&0x1b),
        "{stdout}"
    );
}
