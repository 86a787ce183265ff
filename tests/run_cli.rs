//! `trellis run`: whole workflows through the binary. The example workspace runs offline
//! from its committed cassette; small temp workspaces cover human input and routing.
//!
//! The example's cassette is written by the ignored test `record_example_cassette`, built
//! the way tests/sequence_driver.rs builds its cassettes: the system prompt the driver sends
//! (`step_system_prompt`) and tool results from calling the same tool under the same grant.
//! Re-record after changing the example or the prompt:
//! `cargo test --test run_cli -- --ignored record_example_cassette`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};
use support::engine;
use trellis_host::capabilities::turn::{TurnContext, TurnPurpose, turn_grant};
use trellis_host::llm::{
    Cassette, Interaction, Message, RecordedRequest, Response, StopReason, ToolCall, Usage,
};
use trellis_host::sequence::driver::step_system_prompt;
use trellis_host::sequence::foreach::query_rows;
use trellis_host::sequence::template::MessageTemplate;
use trellis_host::sequence::workflow_run::seed_database;
use trellis_host::workflow::Workspace;
use trellis_host::workflow::plan::ItemBody;
use trellis_host::{Limits, PluginRegistry};

const EXAMPLE: &str = "examples/ticket-triage";
const MODEL: &str = "triage-demo";
const STEP: &str = "triage-tickets";

fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(EXAMPLE)
}

/// Copies a workspace, leaving out its database and run folders (outputs).
fn copy_workspace(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == "runs" || name == "db.sqlite" {
            continue;
        }
        let target = to.join(&name);
        if entry.file_type().unwrap().is_dir() {
            copy_workspace(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn trellis(args: &[&str]) -> Output {
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("component-cache");
    Command::new(env!("CARGO_BIN_EXE_trellis"))
        .arg("--cache-dir")
        .arg(cache)
        .args(args)
        .output()
        .expect("the trellis binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn example_runs_offline_and_a_second_run_rotates() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    copy_workspace(&example_dir(), &ws);
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
    assert!(shown.contains("turns: 3"), "{shown}");
    assert!(shown.contains("triage-each [foreach] completed"), "{shown}");
    assert_eq!(
        shown.matches("tool calls 1 (workspace:write_file)").count(),
        3,
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
    copy_workspace(&example_dir(), &ws);
    // A fourth open ticket: the cassette has no answer for its turn.
    let seed = ws.join("db/seed.sql");
    let sql = std::fs::read_to_string(&seed).unwrap();
    std::fs::write(&seed, sql.replace("'closed');", "'open');")).unwrap();
    let out = trellis(&["run", ws.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("step triage-tickets: failed"), "{stdout}");
    assert!(stdout.contains("was not recorded"), "{stdout}");
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
    let answer = read_json(
        &dir.path()
            .join("runs/iteration-0/execution/left/human_input.json"),
    );
    assert_eq!(answer["answer"], "L");
    assert!(!dir.path().join("runs/iteration-0/execution/right").exists());

    let own = dir.path().join("runs/iteration-0/execution/pick");
    std::fs::create_dir_all(&own).unwrap();
    std::fs::write(own.join("route_selection.json"), r#"{"select_route": "b"}"#).unwrap();
    let out = trellis(&[&["run", root, "--step", "pick"][..], &inputs].concat());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("route b (from route_selection.json) -> right"),
        "{stdout}"
    );

    std::fs::write(
        own.join("route_selection.json"),
        r#"{"select_route": "zzz"}"#,
    )
    .unwrap();
    let out = trellis(&[&["run", root, "--step", "pick"][..], &inputs].concat());
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("\"zzz\""),
        "{}",
        text(&out.stderr)
    );
}

/// Builds a cassette as the conversation goes (as in tests/sequence_driver.rs).
struct Tape {
    messages: Vec<Message>,
    interactions: Vec<Interaction>,
}

impl Tape {
    fn reply(&mut self, text: &str, calls: &[(&str, &str, Value)]) {
        let response = Response {
            text: text.to_string(),
            tool_calls: calls
                .iter()
                .map(|(id, name, args)| ToolCall {
                    id: id.to_string(),
                    name: name.to_string(),
                    arguments: args.to_string(),
                })
                .collect(),
            stop_reason: if calls.is_empty() {
                StopReason::Stop
            } else {
                StopReason::ToolCalls
            },
            usage: Usage {
                prompt_tokens: 400,
                completion_tokens: 60,
                total_tokens: 460,
            },
            model: None,
        };
        self.interactions.push(Interaction {
            request: RecordedRequest {
                model: MODEL.to_string(),
                messages: self.messages.clone(),
                tools: Vec::new(),
            },
            response: response.clone(),
        });
        self.messages.push(Message::assistant(&response));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "re-records examples/ticket-triage/cassettes/triage-demo.json"]
async fn record_example_cassette() {
    let registry = PluginRegistry::with_bundled(engine()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    copy_workspace(&example_dir(), &root);
    assert!(seed_database(&root).unwrap());
    let ws = Workspace::open(&root).unwrap();
    let step = ws.plan.step(STEP).unwrap();
    let configs = ws.agent_configs(STEP);
    let items = step.effective_items();
    let item = items.iter().find(|i| i.id == "triage-each").unwrap();
    let ItemBody::Foreach {
        source_sql,
        message,
        max_iterations,
        ..
    } = &item.body
    else {
        panic!("triage-each is a foreach item");
    };
    let rows = query_rows(
        &root.join("db/db.sqlite"),
        &item.id,
        source_sql,
        *max_iterations,
    )
    .unwrap();
    let template = MessageTemplate::parse(&item.id, message).unwrap();
    let ctx = TurnContext {
        root: &ws.root,
        run_folder: "iteration-0",
        step,
        configs: &configs,
    };
    let grant = turn_grant(&ctx, TurnPurpose::Item(item)).unwrap();

    let decisions = [
        (1, "P1", "checkout outage for every customer: escalated"),
        (2, "P2", "duplicate charge: refund per the refund notes"),
        (3, "P4", "cosmetic typo"),
    ];
    let mut tape = Tape {
        messages: vec![Message::system(step_system_prompt(&ws, STEP).unwrap())],
        interactions: Vec::new(),
    };
    let path = format!("runs/iteration-0/execution/{STEP}/report.json");
    let mut triaged = Vec::new();
    for (i, row) in rows.rows.iter().enumerate() {
        let (id, priority, reason) = decisions[i];
        assert_eq!(row["id"], json!(id));
        tape.messages
            .push(Message::user(template.render(i + 1, row).unwrap()));
        triaged.push(
            json!({"id": id, "subject": row["subject"], "priority": priority,
            "reason": reason}),
        );
        let escalated: Vec<i64> = decisions[..=i]
            .iter()
            .filter(|d| d.1 == "P1")
            .map(|d| d.0)
            .collect();
        let report = json!({"tickets": triaged, "escalated": escalated});
        let args = json!({"path": path,
            "content": serde_json::to_string_pretty(&report).unwrap()});
        let call_id = format!("call-{id}");
        tape.reply("", &[(&call_id, "workspace:write_file", args.clone())]);
        let result = match registry
            .call_tool(
                "workspace:write_file",
                &args,
                &grant.grant,
                &Limits::default(),
            )
            .await
        {
            Ok(Value::String(s)) => s,
            Ok(v) => v.to_string(),
            Err(e) => format!("error: {e}"),
        };
        assert!(!result.starts_with("error:"), "{result}");
        tape.messages.push(Message::tool_result(&call_id, result));
        tape.reply(
            &format!("Ticket {id}: {priority} ({reason}). report.json updated."),
            &[],
        );
    }
    Cassette {
        interactions: tape.interactions,
    }
    .save(&example_dir().join(format!("cassettes/{MODEL}.json")))
    .unwrap();
}
