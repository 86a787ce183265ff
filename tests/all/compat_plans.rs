//! Workflows written for the original run as they did there: regular and orphan sub-agent
//! routes, `todo_task` orchestrators, `array_length` and doubled regex escapes, the step
//! config's gate, emptied outputs on re-runs, routing sources, loop caps and archives,
//! `human_input` answers, the `STATUS: FAILED` marker, and follow-up calls to a route. Every
//! test runs the `trellis` binary; the agents are a fake OpenAI-compatible server on
//! 127.0.0.1 answering by the step's charter (the start of the system prompt).

use crate::support;

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::trellis;
use support::workspace::{create_db, read_json, write_file};

const EXEC: &str = "runs/iteration-0/execution";

use crate::support::plugin_build::text;

/// Writes plan.json (`steps`, `orphan_steps`), step_config.json and workflow.json (with the
/// fake server's provider and a default model when `server` is given).
fn workspace(root: &Path, plan: Value, configs: Value, server: Option<&FakeServer>) {
    write_file(root, "planning/plan.json", plan.to_string());
    write_file(
        root,
        "planning/step_config.json",
        json!({"steps": configs}).to_string(),
    );
    let manifest = match server {
        Some(s) => json!({"llm": {"provider": "openai", "model_id": "m"},
                          "providers": s.providers()}),
        None => json!({}),
    };
    write_file(root, "workflow.json", manifest.to_string());
}

/// `trellis run ROOT ARGS`; the operator approves loopback, where the fake LLM is.
fn run(root: &Path, args: &[&str]) -> Output {
    let root = root.to_str().unwrap();
    trellis(&[&["run", root, "--allow-host", "127.0.0.1"][..], args].concat())
}

fn ok(out: &Output) -> String {
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    stdout
}

fn failed(out: &Output) -> String {
    let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success(), "{all}");
    all
}

/// The system message of a request body.
fn system_of(body: &Value) -> String {
    body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The user messages of a request body, in order.
fn users_of(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn has_tool_result(body: &Value) -> bool {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["role"] == "tool")
}

fn regular(id: &str, description: &str) -> Value {
    json!({"id": id, "type": "regular", "title": id, "description": description})
}

// ------------------------------------------------------------------ the mixed plan, end to end

/// regular -> routing -> todo_task (two regular sub-agent routes: one inline, one an orphan
/// step by reference) -> message_sequence, against the fake server.
#[test]
fn a_mixed_plan_with_regular_sub_agents_runs_end_to_end() {
    let server = FakeServer::start(Box::new(|body| {
        let system = system_of(body);
        if system.starts_with("Gather the facts.") {
            (200, completion("gathered", &[]))
        } else if system.starts_with("You analyse numbers.") {
            (200, completion("ANALYST-ANSWER: the totals add up", &[]))
        } else if system.starts_with("You audit records.") {
            (200, completion("AUDITOR-ANSWER: no anomalies", &[]))
        } else if system.starts_with("Coordinate the review.") {
            if has_tool_result(body) {
                (200, completion("both specialists answered", &[]))
            } else {
                (
                    200,
                    completion(
                        "",
                        &[
                            (
                                "call_sub_agent",
                                json!({"route_id": "analyst", "instructions": "Check the totals."}),
                            ),
                            (
                                "call_sub_agent",
                                json!({"route_id": "auditor", "instructions": "Audit the records."}),
                            ),
                        ],
                    ),
                )
            }
        } else if system.starts_with("Write the closing note.") {
            (200, completion("closed", &[]))
        } else {
            (200, completion("STATUS: FAILED unexpected request", &[]))
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "review", "steps": [
        regular("gather", "Gather the facts."),
        {"id": "pick", "type": "routing", "title": "Pick",
         "routes": [{"route_id": "review", "route_name": "Review", "condition": "always",
                     "next_step_id": "coordinate"},
                    {"route_id": "skip", "next_step_id": "close"}],
         "default_route_id": "review"},
        {"id": "coordinate", "type": "todo_task", "title": "Coordinate",
         "description": "Coordinate the review.",
         "predefined_routes": [
            {"route_id": "analyst", "route_name": "Analyst", "condition": "numbers",
             "sub_agent_step": regular("analyst", "You analyse numbers.")},
            {"route_id": "auditor", "route_name": "Auditor", "condition": "records",
             "orphan_step_ref": "audit-records"}]},
        {"id": "close", "type": "message_sequence", "title": "Close",
         "description": "Write the closing note.",
         "items": [{"id": "note", "type": "user_message", "message": "Write it."}]}
    ], "orphan_steps": [regular("audit-records", "You audit records.")]});
    // The orphan step keeps its own id: its step config entry names its model.
    let configs = json!([{"id": "audit-records", "agent_configs": {"execution_llm":
        {"provider": "openai", "model_id": "auditor-model"}}}]);
    workspace(dir.path(), plan, configs, Some(&server));
    let stdout = ok(&run(dir.path(), &[]));
    for line in [
        "step gather: completed",
        "step pick: completed (route review (from default_route_id) -> coordinate)",
        "step coordinate: completed",
        "step close: completed",
    ] {
        assert!(stdout.contains(line), "{line:?} in {stdout}");
    }
    // The todo_task ran one turn whose task is its description, with call_sub_agent.
    let coordinate: Vec<Value> = server
        .seen()
        .into_iter()
        .filter(|b| system_of(b).starts_with("Coordinate the review."))
        .collect();
    assert_eq!(coordinate.len(), 2, "one turn, two LLM calls");
    assert_eq!(users_of(&coordinate[0]), ["Coordinate the review."]);
    assert!(
        coordinate[0]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["function"]["name"] == "call_sub_agent"),
        "{}",
        coordinate[0]["tools"]
    );
    // Each regular sub-agent: one turn from its description plus the caller's instructions.
    let analyst: Vec<Value> = server
        .seen()
        .into_iter()
        .filter(|b| system_of(b).starts_with("You analyse numbers."))
        .collect();
    assert_eq!(analyst.len(), 1);
    assert_eq!(analyst[0]["model"], "m");
    let auditor: Vec<Value> = server
        .seen()
        .into_iter()
        .filter(|b| system_of(b).starts_with("You audit records."))
        .collect();
    assert_eq!(auditor.len(), 1);
    assert_eq!(auditor[0]["model"], "auditor-model");
    let first = &users_of(&analyst[0])[0];
    assert!(
        first.contains("Check the totals.") && first.contains("You analyse numbers."),
        "{first}"
    );
    // Both answers are in the run's artifacts: each route's conversation, and the parent's
    // tool results.
    let exec = dir.path().join(EXEC);
    let parent = std::fs::read_to_string(exec.join("coordinate/session.json")).unwrap();
    for (route, answer) in [
        ("analyst", "ANALYST-ANSWER: the totals add up"),
        ("auditor", "AUDITOR-ANSWER: no anomalies"),
    ] {
        let session =
            std::fs::read_to_string(exec.join(format!("coordinate/agents/{route}/session.json")))
                .unwrap();
        assert!(session.contains(answer), "{route}: {session}");
        assert!(parent.contains(answer), "{answer} in the parent's session");
        assert!(
            exec.join(format!("coordinate/agents/{route}/calls"))
                .is_dir()
        );
    }
    let summary = read_json(&exec.join("coordinate/execution-final-summary.json"));
    assert_eq!(summary["status"], "completed");
    assert_eq!(summary["execution_result"], "both specialists answered");
}

/// A regular sub-agent step whose step config says scripted runs its script in the route's
/// call folder (no LLM call for it); an orphan step named by reference keeps its own id.
#[test]
fn a_scripted_regular_sub_agent_runs_its_script_in_the_call_folder() {
    let server = FakeServer::start(Box::new(|body| {
        if has_tool_result(body) {
            (200, completion("the script answered", &[]))
        } else {
            let args = json!({"route_id": "counter", "instructions": "Count."});
            (200, completion("", &[("call_sub_agent", args)]))
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "count", "steps": [
        {"id": "desk", "type": "message_sequence", "title": "Desk", "description": "Run the desk.",
         "items": [{"id": "work", "type": "user_message", "message": "Work."}],
         "predefined_routes": [{"route_id": "counter", "orphan_step_ref": "count-rows"}]}
    ], "orphan_steps": [{"id": "count-rows", "type": "regular", "title": "Count",
        "description": "Counts rows.", "context_output": ["count.json"],
        "validation_schema": {"files": [{"file_name": "count.json", "must_exist": true}]}}]});
    workspace(
        dir.path(),
        plan,
        json!([{"id": "count-rows", "agent_configs": {"declared_execution_mode": "scripted"}}]),
        Some(&server),
    );
    write_file(
        dir.path(),
        "code/count-rows/main.py",
        "import json, os\n\
         with open(os.path.join(os.environ['STEP_OUTPUT_DIR'], 'count.json'), 'w') as f:\n    \
         json.dump({'count': 3, 'dir': os.environ['STEP_OUTPUT_DIR']}, f)\n\
         print('counted')\n",
    );
    ok(&run(dir.path(), &[]));
    assert_eq!(server.seen().len(), 2, "the script called no model");
    let call = dir
        .path()
        .join(EXEC)
        .join("desk/agents/counter/calls/call-0001/count.json");
    let written = read_json(&call);
    assert_eq!(written["count"], 3);
    assert!(
        written["dir"]
            .as_str()
            .unwrap()
            .ends_with("desk/agents/counter/calls/call-0001"),
        "{written}"
    );
    assert!(!dir.path().join(EXEC).join("count-rows").exists());
    let tool = server.seen()[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()["content"]
        .to_string();
    assert!(tool.contains("count.json"), "{tool}");
}

#[test]
fn a_route_naming_no_orphan_step_is_an_error_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "x", "steps": [
        {"id": "desk", "type": "message_sequence", "title": "Desk", "description": "d",
         "items": [{"id": "work", "type": "user_message", "message": "Work."}],
         "predefined_routes": [{"route_id": "counter", "orphan_step_ref": "count-row"}]}
    ], "orphan_steps": [regular("count-rows", "d")]});
    workspace(dir.path(), plan, json!([]), None);
    let out = trellis(&["validate", dir.path().to_str().unwrap()]);
    let all = failed(&out);
    assert!(
        all.contains("steps[0].predefined_routes[0].orphan_step_ref")
            && all.contains("names no orphan step of the plan: \"count-row\"")
            && all.contains("did you mean \"count-rows\""),
        "{all}"
    );
}

// ------------------------------------------------------------------------------- todo_task

#[test]
fn a_todo_task_without_items_runs_one_turn_with_its_messages() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "x", "steps": [
        {"id": "bare", "type": "todo_task", "title": "Bare", "description": "Triage the inbox."},
        {"id": "todo", "type": "todo_task", "title": "Todo", "description": "Plan the release.",
         "messages": ["List the blockers."]}]});
    workspace(dir.path(), plan, json!([]), Some(&server));
    let stdout = ok(&run(dir.path(), &[]));
    assert!(
        stdout.contains("step bare: completed (1 turn(s))"),
        "{stdout}"
    );
    assert!(
        stdout.contains("step todo: completed (1 turn(s))"),
        "{stdout}"
    );
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(users_of(&seen[0]), ["Triage the inbox."]);
    assert_eq!(
        users_of(&seen[1]),
        ["Plan the release.\n\nList the blockers."]
    );
}

#[test]
fn an_agentic_step_that_ran_no_turn_completes_with_a_concern() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "x", "steps": [
        {"id": "each", "type": "message_sequence", "title": "Each", "description": "d",
         "items": [{"id": "rows", "type": "foreach", "source_sql": "SELECT id FROM t",
                    "message": "Row {{.id}}"}]}]});
    workspace(dir.path(), plan, json!([]), Some(&server));
    create_db(dir.path(), "CREATE TABLE t (id INTEGER);");
    ok(&run(dir.path(), &[]));
    assert!(server.seen().is_empty());
    let summary = read_json(
        &dir.path()
            .join(EXEC)
            .join("each/execution-final-summary.json"),
    );
    assert!(
        summary["concerns"][0]
            .as_str()
            .unwrap()
            .starts_with("the step ran no agent turn"),
        "{summary}"
    );
}

// --------------------------------------------------------------------- gates and consistency

/// A workspace whose step `s` has `out.json` = `doc` in its output folder and the given
/// json_checks in its step config's gate.
fn check_workspace(root: &Path, doc: Value, checks: Value) {
    let plan = json!({"objective": "x", "steps": [regular("s", "d")]});
    let configs = json!([{"id": "s", "validation_schema": {"files": [
        {"file_name": "out.json", "must_exist": true, "json_checks": checks}]}}]);
    workspace(root, plan, configs, None);
    write_file(root, &format!("{EXEC}/s/out.json"), doc.to_string());
}

fn check(root: &Path) -> Output {
    trellis(&["check", root.to_str().unwrap(), "--step", "s"])
}

#[test]
fn array_length_compares_a_count_with_an_array_either_way_round() {
    let dir = tempfile::tempdir().unwrap();
    let doc = json!({"count": 2, "items": ["a", "b"], "other": ["x"], "n": 2});
    let consistency = |path: &str, with: &str| json!({"path": path, "consistency_check": {"type": "array_length", "compare_with_path": with}});
    // The original's form: a count at path, an array at compare_with_path.
    check_workspace(
        dir.path(),
        doc.clone(),
        json!([consistency("$.count", "$.items")]),
    );
    let stdout = ok(&check(dir.path()));
    assert!(
        stdout.contains("PASS out.json $.count [array_length]"),
        "{stdout}"
    );
    // Swapped: accepted.
    check_workspace(
        dir.path(),
        doc.clone(),
        json!([consistency("$.items", "$.count")]),
    );
    ok(&check(dir.path()));
    // A count that disagrees fails.
    check_workspace(
        dir.path(),
        doc.clone(),
        json!([consistency("$.count", "$.other")]),
    );
    let all = failed(&check(dir.path()));
    assert!(
        all.contains("the length of the array at $.other (1)"),
        "{all}"
    );
    // Two arrays, two numbers: fail, saying one must be a count and one an array.
    for (a, b, what) in [
        ("$.items", "$.other", "two arrays"),
        ("$.count", "$.n", "two numbers"),
    ] {
        check_workspace(dir.path(), doc.clone(), json!([consistency(a, b)]));
        let all = failed(&check(dir.path()));
        assert!(
            all.contains("array_length needs one of each") && all.contains(what),
            "{all}"
        );
    }
}

#[test]
fn doubled_regex_escapes_are_read_once_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    // In the JSON text: "^\\\\d+\\\\.\\\\d+$", the regex ^\\d+\\.\\d+$ (a model's doubling).
    let plan_text = r#"{"objective": "x", "steps": [{"id": "s", "type": "regular", "title": "s",
        "description": "d", "validation_schema": {"files": [{"file_name": "out.json",
        "json_checks": [{"path": "$.version", "pattern": "^\\\\d+\\\\.\\\\d+$"}]}]}}]}"#;
    workspace(dir.path(), json!({}), json!([]), None);
    write_file(dir.path(), "planning/plan.json", plan_text);
    write_file(
        dir.path(),
        &format!("{EXEC}/s/out.json"),
        r#"{"version": "12.5"}"#,
    );
    let stdout = ok(&check(dir.path()));
    assert!(
        stdout.contains("PASS out.json $.version [pattern]"),
        "{stdout}"
    );
    let out = trellis(&["validate", dir.path().to_str().unwrap()]);
    let stdout = ok(&out);
    assert!(
        stdout.contains("json_checks[0].pattern")
            && stdout.contains(r#"doubled backslashes read as single ones"#)
            && stdout.contains(r#"is used as "^\\d+\\.\\d+$""#),
        "{stdout}"
    );
}

#[test]
fn the_step_configs_validation_schema_is_the_gate_of_a_run() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "x", "steps": [{"id": "s", "type": "regular", "title": "s",
        "description": "Write out.json.",
        "validation_schema": {"files": [{"file_name": "other.json", "must_exist": false}]}}]});
    let configs = json!([{"id": "s", "validation_schema": {"files": [
        {"file_name": "out.json", "must_exist": true}]}}]);
    workspace(dir.path(), plan, configs, Some(&server));
    let all = failed(&run(dir.path(), &[]));
    assert!(all.contains("step s: failed"), "{all}");
    assert!(all.contains("out.json"), "{all}");
    // check agrees with the run.
    let all = failed(&check(dir.path()));
    assert!(all.contains("FAIL out.json"), "{all}");
    // The gate sent repair turns: the agent was told about out.json.
    assert!(server.seen().len() > 1);
}

#[test]
fn a_prevalidation_item_may_use_the_gate_the_step_config_holds() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "x", "steps": [
        {"id": "s", "type": "message_sequence", "title": "s", "description": "Write out.json.",
         "items": [{"id": "work", "type": "user_message", "message": "Work."},
                   {"id": "gate", "type": "prevalidation"}]}]});
    let configs = json!([{"id": "s", "validation_schema": {"files": [
        {"file_name": "out.json", "must_exist": true}]}}]);
    workspace(dir.path(), plan, configs, Some(&server));
    ok(&trellis(&["validate", dir.path().to_str().unwrap()]));
    let all = failed(&run(dir.path(), &[]));
    assert!(
        all.contains("step s: failed (gate gate still fails after 3 repair turns"),
        "{all}"
    );
}

// ------------------------------------------------------------------ re-runs and stale outputs

#[test]
fn a_single_step_run_empties_its_output_folder_first() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "x", "steps": [{"id": "s", "type": "regular", "title": "s",
        "description": "Write out.json.",
        "validation_schema": {"files": [{"file_name": "out.json", "must_exist": true}]}}]});
    workspace(dir.path(), plan, json!([]), Some(&server));
    // A stale output of an earlier run that would pass the gate.
    write_file(dir.path(), &format!("{EXEC}/s/out.json"), "{}");
    let all = failed(&run(dir.path(), &["--step", "s"]));
    assert!(all.contains("step s: failed"), "{all}");
    assert!(!dir.path().join(EXEC).join("s/out.json").exists());
}

#[test]
fn a_group_run_in_the_folder_it_keeps_empties_its_steps_first() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "x", "steps": [{"id": "s", "type": "regular", "title": "s",
        "description": "Write out.json.",
        "validation_schema": {"files": [{"file_name": "out.json", "must_exist": true}]}}]});
    workspace(dir.path(), plan, json!([]), Some(&server));
    write_file(
        dir.path(),
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": server.providers(),
               "groups": [{"id": "eu"}]})
        .to_string(),
    );
    write_file(dir.path(), "runs/iteration-0/eu/execution/s/out.json", "{}");
    let all = failed(&run(dir.path(), &["--group", "eu"]));
    assert!(all.contains("step s: failed"), "{all}");
    assert!(
        !dir.path()
            .join("runs/iteration-0/eu/execution/s/out.json")
            .exists()
    );
}

#[test]
fn a_resume_empties_that_step_and_every_later_one_and_keeps_earlier_ones() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "x", "steps": [
        regular("a", "First."), regular("b", "Second."), regular("c", "Third.")]});
    workspace(dir.path(), plan, json!([]), Some(&server));
    for step in ["a", "b", "c"] {
        write_file(dir.path(), &format!("{EXEC}/{step}/stale.json"), "{}");
    }
    let stdout = ok(&run(dir.path(), &["--from", "b"]));
    assert!(!stdout.contains("step a:"), "{stdout}");
    assert!(stdout.contains("step b: completed") && stdout.contains("step c: completed"));
    let exec = dir.path().join(EXEC);
    assert!(exec.join("a/stale.json").exists());
    assert!(!exec.join("b/stale.json").exists());
    assert!(!exec.join("c/stale.json").exists());
    assert_eq!(server.seen().len(), 2);
}

// --------------------------------------------------------------------------------- routing

/// A routing step `pick` after the step `prev` (an agent step writing nothing), routes `a`
/// (-> `left`) and `b` (-> `right`), both human_input steps.
fn routing_workspace(root: &Path, server: &FakeServer, pick: Value) {
    let ask = |id: &str| {
        json!({"id": id, "type": "human_input", "title": id, "question": "?",
               "variable_name": format!("{id}_answer"), "response_type": "text",
               "next_step_id": "end"})
    };
    let mut step = json!({"id": "pick", "type": "routing", "title": "Pick",
        "routes": [{"route_id": "a", "next_step_id": "left"},
                   {"route_id": "b", "next_step_id": "right"}]});
    for (k, v) in pick.as_object().unwrap() {
        step[k] = v.clone();
    }
    let plan = json!({"objective": "x", "steps": [
        regular("prev", "Decide."), step, ask("left"), ask("right")]});
    workspace(root, plan, json!([]), Some(server));
}

const INPUTS: [&str; 4] = ["--input", "left_answer=L", "--input", "right_answer=R"];

#[test]
fn a_declared_route_source_file_that_does_not_exist_fails_the_step() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    routing_workspace(
        dir.path(),
        &server,
        json!({"route_source_file": "choice.json", "default_route_id": "a"}),
    );
    let all = failed(&run(dir.path(), &INPUTS));
    assert!(
        all.contains("route_source_file \"choice.json\" does not exist"),
        "{all}"
    );
    assert!(!dir.path().join(EXEC).join("left").exists());
}

#[test]
fn routing_reads_context_dependencies_and_the_original_keys() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let dep = "runs/iteration-0/execution/prev/route_selection.json";
    routing_workspace(
        dir.path(),
        &server,
        json!({"context_dependencies": [dep], "default_route_id": "a"}),
    );
    // The agent step writes the selection; here it is put there by the test before a
    // --from pick resume (which leaves prev alone).
    for (body, route) in [
        (json!({"route_id": "b"}), "b"),
        (json!({"selected_route_id": "b"}), "b"),
        (json!({"select_route": "right"}), "b"),
    ] {
        write_file(dir.path(), dep, body.to_string());
        let stdout = ok(&run(
            dir.path(),
            &[&["--from", "pick"][..], &INPUTS].concat(),
        ));
        assert!(
            stdout.contains(&format!("route {route} (from {dep}) -> right")),
            "{body}: {stdout}"
        );
    }
    // Nothing there: the default.
    std::fs::remove_file(dir.path().join(dep)).unwrap();
    let stdout = ok(&run(
        dir.path(),
        &[&["--from", "pick"][..], &INPUTS].concat(),
    ));
    assert!(
        stdout.contains("route a (from default_route_id) -> left"),
        "{stdout}"
    );
    // A pre-selected route goes in after the folder is emptied.
    let stdout = ok(&run(
        dir.path(),
        &[&["--step", "pick", "--route", "pick=b"][..], &INPUTS].concat(),
    ));
    assert!(
        stdout.contains("route b (from route_selection.json) -> right"),
        "{stdout}"
    );
}

// ------------------------------------------------------------------------------------ loops

#[test]
fn a_loop_between_agent_steps_stops_after_five_jumps_and_archives_each_pass() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "x", "steps": [
        regular("draft", "Draft."),
        {"id": "review", "type": "regular", "title": "review", "description": "Review.",
         "next_step_id": "draft"}]});
    workspace(dir.path(), plan, json!([]), Some(&server));
    let all = failed(&run(dir.path(), &[]));
    assert!(
        all.contains(
            "infinite loop: step \"review\" jumped back to step \"draft\" more than 5 times"
        ),
        "{all}"
    );
    // Six passes: five archived, the last in place.
    assert_eq!(server.seen().len(), 12);
    let archived = dir.path().join(EXEC).join("archived");
    for n in 1..=5 {
        for step in ["draft", "review"] {
            assert!(
                archived
                    .join(format!("run-{n}/{step}/session.json"))
                    .is_file(),
                "run-{n}/{step}"
            );
        }
    }
    assert!(!archived.join("run-6").exists());
    assert!(dir.path().join(EXEC).join("draft/session.json").is_file());
    // A resume in the same run folder loops again: earlier archives are kept and its own
    // take the next numbers (its first jump, draft -> review, moves review alone).
    failed(&run(dir.path(), &["--from", "review"]));
    assert!(archived.join("run-5/draft/session.json").is_file());
    assert!(archived.join("run-6/review/session.json").is_file());
    assert!(!archived.join("run-6/draft").exists());
    assert!(archived.join("run-11/draft/session.json").is_file());
    assert!(!archived.join("run-12").exists());
    // The archive is not a step of the run.
    let listed = ok(&trellis(&["runs", "list", dir.path().to_str().unwrap()]));
    assert!(
        listed.contains("draft") && !listed.contains("archived"),
        "{listed}"
    );
}

#[test]
fn a_routing_step_selecting_the_same_route_a_third_time_fails() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "x", "steps": [
        regular("work", "Work."),
        {"id": "again", "type": "routing", "title": "Again",
         "routes": [{"route_id": "retry", "next_step_id": "work"},
                    {"route_id": "done", "next_step_id": "end"}],
         "default_route_id": "retry"}]});
    workspace(dir.path(), plan, json!([]), Some(&server));
    let all = failed(&run(dir.path(), &[]));
    assert!(
        all.contains("step again: failed (infinite loop: routing step \"again\" selected route \"retry\" (-> work) a 3rd time"),
        "{all}"
    );
    assert_eq!(server.seen().len(), 3);
}

#[test]
fn a_human_input_loop_may_jump_back_twenty_five_times() {
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "x", "steps": [
        {"id": "ask", "type": "human_input", "title": "Ask", "question": "Done?",
         "variable_name": "done", "response_type": "yesno",
         "if_yes_next_step_id": "end", "if_no_next_step_id": "ask"}]});
    workspace(dir.path(), plan, json!([]), None);
    let all = failed(&run(dir.path(), &["--input", "done=no"]));
    assert!(
        all.contains("infinite loop: step \"ask\" jumped back to step \"ask\" more than 25 times"),
        "{all}"
    );
    assert_eq!(all.matches("step ask: completed").count(), 26, "{all}");
    assert!(
        dir.path()
            .join(EXEC)
            .join("archived/run-25/ask/step-1.json")
            .is_file()
    );
}

// ------------------------------------------------------------------------------ human_input

fn human_workspace(root: &Path, ask: Value) {
    let mut step = json!({"id": "ask", "type": "human_input", "title": "Ask",
                          "question": "Ship it?", "variable_name": "ship"});
    for (k, v) in ask.as_object().unwrap() {
        step[k] = v.clone();
    }
    let end = |id: &str| {
        json!({"id": id, "type": "human_input", "title": id, "question": "?",
               "variable_name": format!("{id}_note"), "response_type": "text",
               "next_step_id": "end"})
    };
    let plan = json!({"objective": "x", "steps": [
        regular("prepare", "Prepare."), step, end("shipped"), end("held"), end("red"), end("blue")]});
    workspace(root, plan, json!([]), None);
}

fn human_run(root: &Path, answer: &str) -> String {
    let mut args = vec![
        "--from".to_string(),
        "ask".to_string(),
        "--input".to_string(),
        format!("ship={answer}"),
    ];
    for id in ["shipped", "held", "red", "blue"] {
        args.push("--input".into());
        args.push(format!("{id}_note=x"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(&run(root, &args))
}

#[test]
fn yes_no_answers_read_approve_as_yes_and_anything_else_as_no() {
    let dir = tempfile::tempdir().unwrap();
    human_workspace(
        dir.path(),
        json!({"response_type": "yesno", "if_yes_next_step_id": "shipped",
               "if_no_next_step_id": "held"}),
    );
    for (answer, next) in [
        ("approved", "shipped"),
        ("Approve", "shipped"),
        ("Y", "shipped"),
        ("true", "shipped"),
        ("nope", "held"),
        ("rejected", "held"),
    ] {
        let stdout = human_run(dir.path(), answer);
        assert!(
            stdout.contains(&format!(
                "step ask: completed (ship = \"{answer}\" -> {next})"
            )),
            "{answer}: {stdout}"
        );
    }
    // The answer file: step-N.json (N = 1-based position in steps).
    let file = read_json(&dir.path().join(EXEC).join("ask/step-2.json"));
    assert_eq!(
        file,
        json!({"question": "Ship it?", "response": "rejected", "response_type": "yesno",
               "next_step_id": "held"})
    );
}

#[test]
fn multiple_choice_answers_match_any_case_or_an_index_and_routes_may_be_keyed_by_index() {
    let dir = tempfile::tempdir().unwrap();
    human_workspace(
        dir.path(),
        json!({"response_type": "multiple_choice", "options": ["Red", "Blue"],
               "option_routes": {"0": "red", "Blue": "blue"}, "context_output": "choice.json"}),
    );
    for (answer, next) in [
        ("red", "red"),
        ("0", "red"),
        ("BLUE", "blue"),
        ("1", "blue"),
    ] {
        let stdout = human_run(dir.path(), answer);
        assert!(
            stdout.contains(&format!("-> {next})")),
            "{answer}: {stdout}"
        );
    }
    let file = read_json(&dir.path().join(EXEC).join("ask/choice.json"));
    assert_eq!(file["response"], "Blue");
    assert_eq!(file["response_type"], "multiple_choice");
    assert_eq!(file["next_step_id"], "blue");
}

// ------------------------------------------------------------------- STATUS: FAILED, CONCERNS

#[test]
fn status_failed_matches_any_case_and_spacing_but_not_in_a_foreach_row() {
    let server = FakeServer::start(Box::new(|body| {
        let users = users_of(body);
        let last = users.last().cloned().unwrap_or_default();
        if last.contains("Row 1") {
            (
                200,
                completion("status: failed row one is odd\nConcerns : row one", &[]),
            )
        } else if last.contains("Row 2") {
            (200, completion("fine", &[]))
        } else {
            (200, completion("Status : Failed - cannot go on", &[]))
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "x", "steps": [
        {"id": "each", "type": "message_sequence", "title": "Each", "description": "d",
         "items": [{"id": "rows", "type": "foreach", "source_sql": "SELECT id FROM t ORDER BY id",
                    "message": "Row {{.id}}"},
                   {"id": "wrap", "type": "user_message", "message": "Wrap up."}]}]});
    workspace(dir.path(), plan, json!([]), Some(&server));
    create_db(
        dir.path(),
        "CREATE TABLE t (id INTEGER); INSERT INTO t VALUES (1), (2);",
    );
    let all = failed(&run(dir.path(), &[]));
    // Both rows ran; the wrap-up's marker ended the step.
    assert_eq!(server.seen().len(), 3);
    assert!(all.contains("step each: failed (cannot go on)"), "{all}");
    let summary = read_json(
        &dir.path()
            .join(EXEC)
            .join("each/execution-final-summary.json"),
    );
    assert_eq!(summary["concerns"], json!(["row one"]));
}

#[test]
fn status_failed_in_a_gate_repair_turn_does_not_end_the_step() {
    let server = FakeServer::start(Box::new(|body| {
        let users = users_of(body);
        let repairs = users
            .iter()
            .filter(|u| u.starts_with("The validation gate"))
            .count();
        let last_is_tool = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .is_some_and(|m| m["role"] == "tool");
        match (repairs, last_is_tool) {
            (0, _) => (200, completion("done, I think", &[])),
            (1, _) => (200, completion("STATUS: FAILED cannot write it", &[])),
            (_, false) => {
                let args = json!({"path": "runs/iteration-0/execution/s/out.json",
                                  "content": "{}"});
                (200, completion("", &[("workspace__write_file", args)]))
            }
            (_, true) => (200, completion("written", &[])),
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "x", "steps": [{"id": "s", "type": "regular", "title": "s",
        "description": "Write out.json.",
        "validation_schema": {"files": [{"file_name": "out.json", "must_exist": true}]}}]});
    workspace(dir.path(), plan, json!([]), Some(&server));
    let stdout = ok(&run(dir.path(), &[]));
    assert!(stdout.contains("step s: completed"), "{stdout}");
    assert!(dir.path().join(EXEC).join("s/out.json").is_file());
}

// ------------------------------------------------------------- sub-agent follow-up calls

#[test]
fn a_second_call_to_a_route_continues_its_conversation_with_the_new_instructions() {
    let server = FakeServer::start(Box::new(|body| {
        let system = system_of(body);
        if system.starts_with("You check facts.") {
            let n = users_of(body).len();
            (200, completion(&format!("checker reply {n}"), &[]))
        } else {
            let calls = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "tool")
                .count();
            match calls {
                0 => (
                    200,
                    completion(
                        "",
                        &[(
                            "call_sub_agent",
                            json!({"route_id": "checker", "instructions": "FIRST task"}),
                        )],
                    ),
                ),
                1 => (
                    200,
                    completion(
                        "",
                        &[(
                            "call_sub_agent",
                            json!({"route_id": "checker", "instructions": "SECOND task"}),
                        )],
                    ),
                ),
                _ => (200, completion("all checked", &[])),
            }
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let checker = json!({"id": "checker", "type": "message_sequence", "title": "Checker",
        "description": "You check facts.",
        "items": [{"id": "look", "type": "user_message", "message": "Look at the sources."},
                  {"id": "verify", "type": "user_message", "message": "Verify twice."}]});
    let plan = json!({"objective": "x", "steps": [
        {"id": "desk", "type": "message_sequence", "title": "Desk", "description": "Run the desk.",
         "items": [{"id": "work", "type": "user_message", "message": "Work."}],
         "predefined_routes": [{"route_id": "checker", "sub_agent_step": checker}]}]});
    workspace(dir.path(), plan, json!([]), Some(&server));
    ok(&run(dir.path(), &[]));
    let checker: Vec<Value> = server
        .seen()
        .into_iter()
        .filter(|b| system_of(b).starts_with("You check facts."))
        .collect();
    // First call: its two items; second call: one turn with the new instructions alone.
    assert_eq!(checker.len(), 3, "{checker:#?}");
    let last = users_of(&checker[2]);
    assert_eq!(last.len(), 3);
    assert!(last[2].contains("SECOND task"), "{}", last[2]);
    assert!(!last[2].contains("Look at the sources."), "{}", last[2]);
    assert!(last[0].contains("FIRST task") && last[0].contains("Look at the sources."));
    let parent = std::fs::read_to_string(dir.path().join(EXEC).join("desk/session.json")).unwrap();
    assert!(
        parent.contains("checker reply 3"),
        "the second answer reached the caller"
    );
}

// ------------------------------------------------------------------------- attack tests

/// A plan naming a file or step outside the run folder cannot make the run write, empty or
/// archive anything there: an answer file with `..` is refused, the emptying and the archive
/// go through the workspace handle, which refuses `..`; nothing in the workspace but the run
/// folder changes.
#[test]
fn a_plan_cannot_aim_the_answer_file_or_the_emptying_outside_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"objective": "x", "steps": [
        {"id": "ask", "type": "human_input", "title": "Ask", "question": "?",
         "variable_name": "v", "response_type": "text",
         "context_output": "../../../../planning/plan.json", "next_step_id": "end"}]});
    workspace(dir.path(), plan, json!([]), None);
    write_file(dir.path(), "knowledgebase/notes/keep.md", "keep");
    let before = support::tree_digest(&dir.path().join("planning"));
    let all = failed(&run(dir.path(), &["--input", "v=x"]));
    assert!(
        all.contains("does not name a file in the step's output folder"),
        "{all}"
    );
    assert_eq!(support::tree_digest(&dir.path().join("planning")), before);

    // A step id that climbs out of execution/ is refused before anything is emptied.
    let plan = json!({"objective": "x", "steps": [
        {"id": "../../../knowledgebase", "type": "human_input", "title": "Ask", "question": "?",
         "variable_name": "v", "response_type": "text", "next_step_id": "end"}]});
    workspace(dir.path(), plan, json!([]), None);
    let kb = support::tree_digest(&dir.path().join("knowledgebase"));
    let out = run(
        dir.path(),
        &["--step", "../../../knowledgebase", "--input", "v=x"],
    );
    assert!(!out.status.success());
    assert_eq!(support::tree_digest(&dir.path().join("knowledgebase")), kb);
    assert!(dir.path().join("knowledgebase/notes/keep.md").is_file());
}
