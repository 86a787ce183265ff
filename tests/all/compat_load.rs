//! Workflows as the original writes them load and run: its `workflow.json` bookkeeping,
//! its `version` key, its models, its plan keys, `variables/variables.json`, empty
//! targets, bare dependency names, its group folder names, and the clear words where
//! Trellis differs on purpose. Each test runs the `trellis` binary; agents are a fake
//! OpenAI-compatible server on 127.0.0.1.

use crate::support;

use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::trellis;
use support::workspace::{read_json, write_file, write_files};

/// A server answering the n-th request with `replies[n]`, then `done`.
fn serve(replies: Vec<Value>) -> FakeServer {
    let n = Arc::new(AtomicUsize::new(0));
    FakeServer::start(Box::new(move |_| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        (
            200,
            replies
                .get(i)
                .cloned()
                .unwrap_or_else(|| completion("done", &[])),
        )
    }))
}

/// A reply writing `content` to `path` through the workspace tool.
fn write_call(path: &str, content: &str) -> Value {
    completion(
        "",
        &[(
            "workspace__write_file",
            json!({"path": path, "content": content}),
        )],
    )
}

use crate::support::plugin_build::text;

/// Writes plan.json (`plan`), step_config.json (`configs`) and workflow.json (`manifest`,
/// plus the fake server's provider when one is given).
fn workspace(
    root: &Path,
    plan: Value,
    configs: Value,
    mut manifest: Value,
    server: Option<&FakeServer>,
) {
    if let Some(s) = server {
        manifest["providers"] = s.providers();
    }
    write_files(
        root,
        &[
            ("planning/plan.json", plan.to_string()),
            (
                "planning/step_config.json",
                json!({"steps": configs}).to_string(),
            ),
            ("workflow.json", manifest.to_string()),
        ],
    );
}

fn validate(root: &Path) -> Output {
    trellis(&["validate", root.to_str().unwrap()])
}

fn run(root: &Path, server: Option<&FakeServer>, extra: &[&str]) -> Output {
    let allow = server
        .map(FakeServer::allow_host)
        .unwrap_or_else(|| "127.0.0.1".into());
    let mut args = vec![
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        allow.as_str(),
    ];
    args.extend_from_slice(extra);
    trellis(&args)
}

/// The lines of `validate`'s output that are warnings or errors about `file`.
fn lines_about<'o>(out: &'o str, file: &str) -> Vec<&'o str> {
    out.lines().filter(|l| l.starts_with(file)).collect()
}

/// The system prompt of request `n`.
fn system_of(server: &FakeServer, n: usize) -> String {
    server.seen()[n]["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

const ONE_STEP: &str = r#"{"steps": [{"id": "only", "type": "human_input",
    "question": "Go?", "variable_name": "go"}]}"#;

// ------------------------------------------------------------------ 1. workflow.json

/// The original's bookkeeping loads, is named in one warning and is kept when Trellis
/// rewrites the file (`trellis migrate`); a mistyped key is still an error naming the key
/// meant.
#[test]
fn the_originals_manifest_keys_load_are_named_once_and_are_kept() {
    let ws = tempfile::tempdir().unwrap();
    let manifest = json!({
        "schema_version": 1, "version": "1.0.9", "id": "wf_x", "label": "X",
        "created_at": "2026-04-09T10:00:00Z", "updated_at": "2026-04-09T10:00:00Z",
        "schedules": [{"id": "s", "name": "Daily", "cron_expression": "0 9 * * *",
                       "timezone": "UTC", "enabled": true, "group_names": []}],
        "oversight_mode": "supervised", "pace_on_low_quota": true, "pace_threshold_percent": 80,
        "pulse": {"advisor_specialization": {"version": 1, "strategy_auditor": "a", "goal_advisor": "b"}},
        "backup": {"enabled": false}, "publish": {"enabled": false},
        "ownership": {"employee_id": null}, "objective": "o", "success_criteria": "c",
        "decision_log_mutability": "append_only", "run_retention_count": 7,
        "capabilities": {"selected_servers": ["github"], "llm_config": null},
        "execution_defaults": {"always_use_same_run": false, "workshop_mode": "workshop"}
    });
    write_files(
        ws.path(),
        &[
            ("planning/plan.json", ONE_STEP.to_string()),
            ("workflow.json", manifest.to_string()),
        ],
    );
    let out = validate(ws.path());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert_eq!(
        lines_about(&stdout, "workflow.json"),
        [
            "workflow.json: kept as written for the original, with no effect in Trellis: \
             \"backup\", \"capabilities.selected_servers\", \"created_at\", \
             \"decision_log_mutability\", \"id\", \"label\", \"objective\", \"oversight_mode\", \
             \"ownership\", \"pace_on_low_quota\", \"pace_threshold_percent\", \"publish\", \
             \"pulse\", \"schema_version\", \"success_criteria\", \"updated_at\"",
            "workflow.json: version: contract 1.0.9 is older than 1.0.11: run `trellis migrate` \
             (migrate_message_sequence_code_items) to upgrade",
        ],
        "{stdout}"
    );

    // Rewritten by Trellis: every key the original wrote is there as it was.
    let out = trellis(&["migrate", ws.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let mut after = read_json(&ws.path().join("workflow.json"));
    assert_eq!(after["version"], "1.0.11");
    after["version"] = json!("1.0.9");
    assert_eq!(after, manifest);

    // Strict still: a mistyped key is an error that names the key meant.
    write_file(ws.path(), "workflow.json", r#"{"lable": "X"}"#);
    let out = validate(ws.path());
    assert!(!out.status.success());
    assert_eq!(
        lines_about(&text(&out.stdout), "workflow.json"),
        ["workflow.json: unknown key \"lable\" (did you mean \"label\"?)"]
    );
}

// ------------------------------------------------------------------ 2. version

/// The contract version is the original's `version`; Trellis's earlier `contract_version`
/// is read (with a warning) and `trellis migrate` leaves `version` alone, which is what the
/// original reads.
#[test]
fn the_contract_version_is_the_originals_version_key() {
    let ws = tempfile::tempdir().unwrap();
    write_files(
        ws.path(),
        &[
            ("planning/plan.json", ONE_STEP),
            ("workflow.json", r#"{"contract_version": "1.0.11"}"#),
        ],
    );
    let out = validate(ws.path());
    assert!(out.status.success());
    assert_eq!(
        lines_about(&text(&out.stdout), "workflow.json"),
        [
            "workflow.json: contract_version: Trellis's earlier name of \"version\": read as the \
             version and written as \"version\" when the file is saved (`trellis migrate` \
             rewrites it)"
        ]
    );
    let out = trellis(&["migrate", ws.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(
        read_json(&ws.path().join("workflow.json")),
        json!({"version": "1.0.11"})
    );

    // Older, under Trellis's earlier key: stamped under the original's, the old key gone.
    write_file(
        ws.path(),
        "workflow.json",
        r#"{"contract_version": "1.0.9", "id": "wf"}"#,
    );
    let out = trellis(&["migrate", ws.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(
        read_json(&ws.path().join("workflow.json")),
        json!({"version": "1.0.11", "id": "wf"})
    );
    assert!(
        text(&out.stdout).contains("version: 1.0.9 -> 1.0.11"),
        "{}",
        text(&out.stdout)
    );

    // A newer contract of the original is kept as it is.
    write_file(ws.path(), "workflow.json", r#"{"version": "1.0.29"}"#);
    let out = trellis(&["migrate", ws.path().to_str().unwrap()]);
    assert!(out.status.success());
    assert_eq!(
        read_json(&ws.path().join("workflow.json")),
        json!({"version": "1.0.29"})
    );
}

// ------------------------------------------------------------------ 3. models and mode

/// Without Trellis's `llm` and `tiers`, a step's model comes from the original's
/// `capabilities.llm_config`: `tier_1` by default, `execution_tier` `low` its `tier_3`.
#[test]
fn models_come_from_the_originals_llm_config() {
    let ws = tempfile::tempdir().unwrap();
    let server = serve(vec![]);
    let model = |id: &str| json!({"provider": "openai", "model_id": id});
    workspace(
        ws.path(),
        json!({"steps": [
            {"id": "first", "type": "regular", "description": "Say one thing."},
            {"id": "second", "type": "regular", "description": "Say another."}
        ]}),
        json!([{"id": "second", "agent_configs": {"execution_tier": "low"}}]),
        json!({"capabilities": {"llm_config": {"schema_version": 2, "mode": "explicit",
            "builder_llm": model("builder-model"), "pulse_llm": model("pulse-model"),
            "tiered_config": {"tier_1": model("tier-one"), "tier_2": model("tier-two"),
                              "tier_3": model("tier-three")}}}}),
        Some(&server),
    );
    let out = run(ws.path(), Some(&server), &[]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(server.models(), ["tier-one", "tier-three"]);
}

/// `execution_defaults.workshop_mode` is the mode a new builder session opens in.
#[test]
fn the_builder_opens_in_the_originals_workshop_mode() {
    let ws = tempfile::tempdir().unwrap();
    let server = serve(vec![completion("Here to run.", &[])]);
    workspace(
        ws.path(),
        json!({"steps": [{"id": "greet", "type": "regular", "description": "Say hello."}]}),
        json!([]),
        json!({"llm": {"provider": "openai", "model_id": "m"},
               "execution_defaults": {"workshop_mode": "run"}}),
        Some(&server),
    );
    let out = trellis(&[
        "builder",
        ws.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "-m",
        "hi",
    ]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let index = read_json(&ws.path().join("builder/conversation/chat-index.json"));
    let file = index["sessions"][0]["file"].as_str().unwrap().to_string();
    assert_eq!(read_json(&ws.path().join(file))["workshop_mode"], "run");
}

// ------------------------------------------------------------------ 4. plan keys

/// `has_loop` (what the original's v1.0.10 migration writes on every step) loads silently;
/// a loop asked for is ignored with a warning.
#[test]
fn has_loop_on_regular_steps_loads_and_a_loop_asked_for_is_ignored() {
    let ws = tempfile::tempdir().unwrap();
    let plan = |has_loop: bool| {
        json!({"steps": [{"type": "regular", "id": "fetch", "title": "Fetch",
            "description": "d", "context_dependencies": [], "context_output": "a.json",
            "has_loop": has_loop}]})
        .to_string()
    };
    write_files(ws.path(), &[("planning/plan.json", plan(false))]);
    let out = validate(ws.path());
    assert!(out.status.success());
    assert_eq!(
        lines_about(&text(&out.stdout), "planning/plan.json"),
        Vec::<&str>::new()
    );
    write_files(ws.path(), &[("planning/plan.json", plan(true))]);
    let out = validate(ws.path());
    assert!(out.status.success());
    assert_eq!(
        lines_about(&text(&out.stdout), "planning/plan.json"),
        [
            "planning/plan.json: steps[0].has_loop (step \"fetch\"): retired: step loops are gone \
          (in the original too): has_loop ignored and dropped when the file is saved"
        ]
    );
}

/// A step's `success_criteria` goes into its agent's prompt; `context_output` as one
/// comma-separated string is the list of its names.
#[test]
fn step_success_criteria_and_comma_separated_outputs_reach_the_agent() {
    let ws = tempfile::tempdir().unwrap();
    let server = serve(vec![]);
    workspace(
        ws.path(),
        json!({"steps": [{"id": "report", "type": "regular", "description": "Report.",
            "success_criteria": "Every region is covered.",
            "context_output": "summary.json, details.csv"}]}),
        json!([]),
        json!({"llm": {"provider": "openai", "model_id": "m"}}),
        Some(&server),
    );
    let out = run(ws.path(), Some(&server), &[]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let system = system_of(&server, 0);
    assert!(
        system.contains("Success criteria of this step: Every region is covered.\n"),
        "{system}"
    );
    assert!(
        system.contains(
            "Expected outputs of this step, in its output folder: summary.json, details.csv\n"
        ),
        "{system}"
    );
}

/// `shared_with` on an orphan step: its ids must name todo_task steps, and a todo_task
/// route naming the orphan must be among them, as the original requires.
#[test]
fn shared_with_names_the_todo_tasks_an_orphan_serves() {
    let ws = tempfile::tempdir().unwrap();
    let plan = |ids: Value| {
        json!({"steps": [{"id": "boss", "type": "todo_task", "description": "Delegate.",
                "predefined_routes": [{"route_id": "h", "orphan_step_ref": "helper"}]}],
               "orphan_steps": [{"id": "helper", "type": "regular", "description": "Help.",
                "shared_with": {"orchestrator_ids": ids}}]})
        .to_string()
    };
    write_files(ws.path(), &[("planning/plan.json", plan(json!(["boss"])))]);
    let out = validate(ws.path());
    assert!(out.status.success(), "{}", text(&out.stdout));
    write_files(ws.path(), &[("planning/plan.json", plan(json!(["bos"])))]);
    let out = validate(ws.path());
    assert!(!out.status.success());
    assert_eq!(
        lines_about(&text(&out.stdout), "planning/plan.json"),
        [
            "planning/plan.json: steps[0].predefined_routes[0].orphan_step_ref (step \"boss\"): \
             names the orphan step \"helper\", which is not shared with this todo_task step: add \
             \"boss\" to its shared_with.orchestrator_ids",
            "planning/plan.json: orphan_steps[0].shared_with.orchestrator_ids[0] (step \
             \"helper\"): names no todo_task step of the plan: \"bos\" (did you mean \"boss\"?)",
        ]
    );
}

/// A todo_task's gate message gets `max_corrections` corrective turns (default 1); the
/// original's `message` type is a user message.
#[test]
fn a_todo_task_gate_gets_max_corrections_corrective_turns() {
    for (max_corrections, requests) in [(None, 2), (Some(3), 4)] {
        let ws = tempfile::tempdir().unwrap();
        let server = serve(vec![]);
        let mut gate = json!({"id": "gate", "type": "prevalidation", "write_access": {},
            "prevalidation": {"files": [{"file_name": "never.json", "must_exist": true}]}});
        if let Some(n) = max_corrections {
            gate["max_corrections"] = json!(n);
        }
        workspace(
            ws.path(),
            json!({"steps": [{"id": "boss", "type": "todo_task", "description": "Work.",
                "messages": [{"id": "ask", "type": "message", "message": "Write it."}, gate]}]}),
            json!([]),
            json!({"llm": {"provider": "openai", "model_id": "m"}}),
            Some(&server),
        );
        let out = run(ws.path(), Some(&server), &[]);
        assert!(!out.status.success());
        let turns = if requests == 2 {
            "1 repair turn"
        } else {
            "3 repair turns"
        };
        assert!(
            text(&out.stdout).contains(&format!("gate gate still fails after {turns}")),
            "{}",
            text(&out.stdout)
        );
        assert_eq!(
            server.seen().len(),
            requests,
            "max_corrections {max_corrections:?}"
        );
    }
}

// ------------------------------------------------------------------ 5. variables.json

/// `variables/variables.json` as the original's VariablesManifest writes it loads:
/// `extraction_date` included; a key it does not have is still an error.
#[test]
fn the_originals_variables_manifest_loads() {
    let ws = tempfile::tempdir().unwrap();
    let vars = json!({"variables": [{"name": "REGION", "value": "north", "description": "d"}],
        "groups": [{"name": "North Region", "values": {"REGION": "north"}, "enabled": true}],
        "extraction_date": "2026-04-09T10:00:00Z"});
    write_files(
        ws.path(),
        &[
            ("planning/plan.json", ONE_STEP.to_string()),
            ("variables/variables.json", vars.to_string()),
        ],
    );
    let out = validate(ws.path());
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert_eq!(
        lines_about(&text(&out.stdout), "variables/"),
        Vec::<&str>::new()
    );
    write_file(
        ws.path(),
        "variables/variables.json",
        r#"{"variables": [], "extraction_dat": ""}"#,
    );
    let out = validate(ws.path());
    assert!(!out.status.success());
    assert_eq!(
        lines_about(&text(&out.stdout), "variables/"),
        [
            "variables/variables.json: unknown key \"extraction_dat\" (did you mean \"extraction_date\"?)"
        ]
    );
}

// ------------------------------------------------------------------ 6. empty targets

/// Every target rule, walked: `""` (as the original writes it) is the next step in order
/// for validate and run alike; a name of no step is refused by both; an empty route target
/// of a routing step is an error in both systems.
#[test]
fn validate_and_run_agree_on_every_target_rule() {
    // (field set on step "first", its answer, what the field holds besides the target)
    let rules: [(&str, &str, Value); 5] = [
        ("next_step_id", "anything", json!({})),
        (
            "if_yes_next_step_id",
            "yes",
            json!({"response_type": "yesno", "if_no_next_step_id": "end"}),
        ),
        (
            "if_no_next_step_id",
            "no",
            json!({"response_type": "yesno", "if_yes_next_step_id": "end"}),
        ),
        (
            "option_routes",
            "a",
            json!({"response_type": "multiple_choice", "options": ["a", "b"]}),
        ),
        ("regular.next_step_id", "", json!({})),
    ];
    for (field, answer, extra) in rules {
        for target in ["", "nope"] {
            let ws = tempfile::tempdir().unwrap();
            let server = serve(vec![]);
            let mut first = json!({"id": "first", "type": "human_input", "question": "Q?",
                                   "variable_name": "answer"});
            for (k, v) in extra.as_object().unwrap() {
                first[k] = v.clone();
            }
            match field {
                "option_routes" => first["option_routes"] = json!({"a": target}),
                "regular.next_step_id" => {
                    first = json!({"id": "first", "type": "regular", "description": "Say hi.",
                                   "next_step_id": target})
                }
                _ => first[field] = json!(target),
            }
            workspace(
                ws.path(),
                json!({"steps": [first, {"id": "second", "type": "human_input",
                    "question": "Again?", "variable_name": "again", "next_step_id": "end"}]}),
                json!([]),
                json!({"llm": {"provider": "openai", "model_id": "m"}}),
                Some(&server),
            );
            let checked = validate(ws.path());
            let input = format!("answer={answer}");
            let mut inputs = vec!["--input", "again=x"];
            if field != "regular.next_step_id" {
                inputs.extend(["--input", input.as_str()]);
            }
            let ran = run(ws.path(), Some(&server), &inputs);
            let stdout = text(&ran.stdout);
            if target.is_empty() {
                assert!(
                    checked.status.success(),
                    "{field}: {}",
                    text(&checked.stdout)
                );
                assert!(
                    ran.status.success(),
                    "{field}: {stdout}{}",
                    text(&ran.stderr)
                );
                assert!(stdout.contains("second: completed"), "{field}: {stdout}");
            } else {
                let path = match field {
                    "option_routes" => "option_routes.a".to_string(),
                    "regular.next_step_id" => "next_step_id".to_string(),
                    f => f.to_string(),
                };
                let want = format!(
                    "planning/plan.json: steps[0].{path} (step \"first\"): names no step of the \
                     plan: \"nope\"; use a step id or \"end\""
                );
                assert!(!checked.status.success(), "{field}");
                assert!(
                    text(&checked.stdout).contains(&want),
                    "{field}: {}",
                    text(&checked.stdout)
                );
                assert!(!ran.status.success(), "{field}");
                assert!(
                    text(&ran.stderr).contains(&want),
                    "{field}: {}",
                    text(&ran.stderr)
                );
                assert!(
                    !ws.path().join("runs").exists(),
                    "{field}: the refused run started"
                );
            }
        }
    }

    // A routing step's route must name its target, in both systems.
    let ws = tempfile::tempdir().unwrap();
    write_files(
        ws.path(),
        &[(
            "planning/plan.json",
            json!({"steps": [{"id": "pick", "type": "routing", "default_route_id": "a",
                "routes": [{"route_id": "a", "next_step_id": ""}, {"route_id": "b", "next_step_id": "end"}]}]})
            .to_string(),
        )],
    );
    let want = "planning/plan.json: steps[0].routes[0].next_step_id (step \"pick\"): must not be \
                empty: expected the step the route goes to";
    let checked = validate(ws.path());
    assert!(
        text(&checked.stdout).contains(want),
        "{}",
        text(&checked.stdout)
    );
    let ran = run(ws.path(), None, &[]);
    assert!(!ran.status.success());
    assert!(text(&ran.stderr).contains(want), "{}", text(&ran.stderr));
}

// ------------------------------------------------------------------ 7. bare dependencies

/// A dependency without `/` is the output of the earlier step that lists it; a regular
/// step's agent gets its small text file inlined, as the original gives it.
#[test]
fn a_bare_dependency_is_the_earlier_steps_output_and_is_inlined() {
    let ws = tempfile::tempdir().unwrap();
    let server = serve(vec![
        write_call(
            "runs/iteration-0/execution/produce/data.json",
            r#"{"n": 1}"#,
        ),
        completion("Wrote it.", &[]),
        completion("Read it.", &[]),
    ]);
    workspace(
        ws.path(),
        json!({"steps": [
            {"id": "produce", "type": "regular", "description": "Write data.json.",
             "context_output": "data.json"},
            {"id": "consume", "type": "regular", "description": "Use it.",
             "context_dependencies": ["data.json"]}
        ]}),
        json!([]),
        json!({"llm": {"provider": "openai", "model_id": "m"}}),
        Some(&server),
    );
    let out = run(ws.path(), Some(&server), &[]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let system = system_of(&server, 2);
    assert!(
        system.contains(
            "Context files (context_dependencies):\nFile: runs/iteration-0/execution/produce/data.json \
             (inlined, 8 bytes)\n<content>\n{\"n\": 1}\n</content>\n"
        ),
        "{system}"
    );
}

// ------------------------------------------------------------------ 8. group folders

/// A group runs in the folder the original's sanitizer names; a folder an earlier Trellis
/// named for it is still found by a run that keeps the active run.
#[test]
fn group_folders_have_the_originals_names_and_old_folders_are_found() {
    let ws = tempfile::tempdir().unwrap();
    write_files(
        ws.path(),
        &[
            (
                "planning/plan.json",
                r#"{"steps": [{"id": "ask", "type": "human_input", "question": "Go?", "variable_name": "go"}]}"#,
            ),
            (
                "workflow.json",
                r#"{"groups": [{"id": "north", "name": "North Region"}]}"#,
            ),
            (
                "runs/iteration-0/North_Region/execution/earlier/keep.txt",
                "kept",
            ),
        ],
    );
    let out = run(
        ws.path(),
        None,
        &["--group", "north", "--step", "ask", "--input", "go=yes"],
    );
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        ws.path()
            .join("runs/iteration-0/North_Region/execution/ask")
            .is_dir()
    );
    assert!(!ws.path().join("runs/iteration-0/north-region").exists());

    // A full run archives it and makes the folder under the original's name.
    let out = run(ws.path(), None, &["--input", "go=yes"]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        ws.path()
            .join("runs/iteration-0/north-region/execution/ask")
            .is_dir()
    );
    assert!(
        ws.path()
            .join("runs/iteration-1/North_Region/execution/earlier/keep.txt")
            .is_file()
    );
}

/// `runs show` reads a step's run files as the original writes them: its final summary
/// (`step_id`, `run_folder`, `execution_result`), its turn summaries (`step_index`,
/// `retry_attempt`, `loop_iteration`, `execution_result`, `model`), its conversation files
/// (`conversation_history`) and its `-prompts.json` files, which are not turns.
#[test]
fn runs_show_reads_the_run_files_the_original_writes() {
    let ws = tempfile::tempdir().unwrap();
    let logs = "runs/iteration-0/logs/triage/execution";
    let turn = |attempt: u32, result: &str| {
        json!({"step_index": 1, "step_path": "step-1", "retry_attempt": attempt,
               "loop_iteration": 0, "execution_result": result, "model": "gpt-4.1",
               "timestamp": "2026-05-01T10:00:00Z"})
        .to_string()
    };
    write_files(
        ws.path(),
        &[
            (
                "planning/plan.json",
                ONE_STEP.replace("\"only\"", "\"triage\""),
            ),
            (
                "runs/iteration-0/execution/triage/triage.md",
                "# done".into(),
            ),
            (
                &format!("{logs}/execution-attempt-1-iteration-0.json"),
                turn(1, "STATUS: FAILED: the inbox was empty"),
            ),
            (
                &format!("{logs}/execution-attempt-2-iteration-0.json"),
                turn(2, "Triaged 3 tickets.\nCONCERNS: ticket 2 has no owner"),
            ),
            (
                &format!("{logs}/execution-attempt-2-iteration-0-conversation.json"),
                json!({"step_index": 1, "conversation_history": [
                    {"role": "human", "parts": [{"type": "text", "text": "go"}]}]})
                .to_string(),
            ),
            (
                &format!("{logs}/execution-attempt-2-iteration-0-prompts.json"),
                json!({"step_index": 1, "system_prompt": "You triage.",
                       "saved_at": "post_execution"})
                .to_string(),
            ),
            (
                &format!("{logs}/execution-final-summary.json"),
                json!({"step_id": "triage", "run_folder": "iteration-0",
                       "execution_result": "Triaged 3 tickets.\nCONCERNS: ticket 2 has no owner"})
                .to_string(),
            ),
        ],
    );
    let out = trellis(&["runs", "show", ws.path().to_str().unwrap(), "triage"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("status: completed\n"), "{stdout}");
    assert!(
        stdout.contains("concerns:\n  - ticket 2 has no owner\n"),
        "{stdout}"
    );
    assert!(stdout.contains("turns: 2\n"), "{stdout}");
    let turns: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("  turn "))
        .collect();
    assert_eq!(
        turns,
        [
            "  turn 1 (step-1 iteration 0): original:gpt-4.1 failed, LLM calls 0, tool calls 0, tokens 0 prompt / 0 completion, 0 ms",
            "  turn 2 (step-1 iteration 0): original:gpt-4.1 completed, LLM calls 0, tool calls 0, tokens 0 prompt / 0 completion, 0 ms",
        ],
        "{stdout}"
    );
    assert!(!stdout.contains("conversation log not read"), "{stdout}");
}

// ------------------------------------------------------------------ 9. clear words

/// The original's tool categories Trellis does not have get a warning naming what it
/// offers instead, in a step config and in workflow.json; `workspace_advanced` (the shell)
/// is one it has.
#[test]
fn the_originals_missing_tool_categories_say_what_to_use_instead() {
    let ws = tempfile::tempdir().unwrap();
    workspace(
        ws.path(),
        json!({"steps": [{"id": "browse", "type": "regular", "description": "d"}]}),
        json!([{"id": "browse", "agent_configs": {"enabled_custom_tools": ["workspace_browser:*"]}}]),
        json!({"execution_defaults": {"enabled_custom_tools": ["human_tools:*", "workspace_advanced:*"]}}),
        None,
    );
    let out = validate(ws.path());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let warnings: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("tool category"))
        .collect();
    assert_eq!(
        warnings,
        [
            "workflow.json: execution_defaults.enabled_custom_tools[0]: the original's tool \
             category \"human_tools\" is not offered: a Trellis turn cannot ask a person: put the \
             question in a human_input step (answered with --input NAME=VALUE)",
            "planning/step_config.json: steps[0].agent_configs.enabled_custom_tools[0] (step \
             \"browse\"): the original's tool category \"workspace_browser\" is not offered: \
             Trellis has no browser tools: use the tools of an MCP server (selected_servers), or \
             fetch pages in a scripted step with trellis_http (allowed_hosts)",
        ],
        "{stdout}"
    );
}

/// A Python step that imports a network module fails with a message naming `trellis_http`
/// and `allowed_hosts`.
#[test]
fn a_script_importing_a_network_module_is_told_about_trellis_http() {
    for module in ["requests", "socket", "ssl", "urllib.request"] {
        let ws = tempfile::tempdir().unwrap();
        workspace(
            ws.path(),
            json!({"steps": [{"id": "fetch", "type": "regular", "description": "Fetch.",
                              "context_output": "out.json"}]}),
            json!([{"id": "fetch", "agent_configs": {"declared_execution_mode": "scripted"}}]),
            json!({}),
            None,
        );
        write_file(
            ws.path(),
            "code/fetch/main.py",
            format!("import {module}\n"),
        );
        let out = run(ws.path(), None, &[]);
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(!out.status.success(), "{module}: {all}");
        assert!(
            all.contains(&format!(
                "Python steps have no network modules (\"{module}\" is not there): fetch with \
                 `import trellis_http` (get, post, get_json, post_json, request), to the hosts \
                 listed in the step's `allowed_hosts`."
            )),
            "{module}: {all}"
        );
    }
}

/// An output under `db/` outside `db/assets/` is an error; an item's `write_access` that
/// leaves the database out says so.
#[test]
fn db_outputs_and_narrowing_write_access_are_named() {
    let ws = tempfile::tempdir().unwrap();
    write_files(
        ws.path(),
        &[(
            "planning/plan.json",
            json!({"steps": [{"id": "s", "type": "message_sequence", "title": "S",
                "description": "d", "context_output": ["db/report.csv", "db/assets/chart.png"],
                "items": [{"id": "m", "type": "user_message", "message": "m",
                           "write_access": {"knowledgebase": true}}]}]})
            .to_string(),
        )],
    );
    let out = validate(ws.path());
    assert!(!out.status.success());
    assert_eq!(
        lines_about(&text(&out.stdout), "planning/plan.json"),
        [
            "planning/plan.json: steps[0].context_output[0] (step \"s\"): output \
             \"db/report.csv\" is under db/, which holds only db/db.sqlite (reached with the \
             database tools) and durable files under db/assets/: name the file \
             db/assets/<name>, or give a name in the step's output folder",
            "planning/plan.json: steps[0].items[0].write_access (step \"s\"): this turn cannot \
             modify the database (db/db.sqlite, db/assets/): a write_access names exactly the \
             stores the turn may write, and \"db\" is not true here (add \"db\": true to keep it)",
        ]
    );
}
