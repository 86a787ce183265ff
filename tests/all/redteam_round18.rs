//! Red team round 18 (variables: long names, many paths, many groups): each a test that
//! failed before its fix. Round 18's findings on the workers are in `workers.rs`, the
//! shell's in `shell.rs`.

use crate::support;

use serde_json::{Value, json};
use support::trellis;
use support::workspace::write_files;

use crate::support::plugin_build::text;

fn workspace(root: &std::path::Path, steps: Value, workflow: Value) {
    write_files(
        root,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": steps}).to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            ("workflow.json", workflow.to_string()),
        ],
    );
}

fn validate(root: &std::path::Path) -> String {
    let out = trellis(&["validate", root.to_str().unwrap()]);
    assert!(!out.status.success(), "validate passed");
    text(&out.stdout) + &text(&out.stderr)
}

/// A variable named with 2,000,000 characters and a question of 500,000 `{` made
/// substitution quadratic: `validate`, `run` and `serve` ran for minutes (HIGH). Names are
/// at most 128 bytes, and no longer name is ever looked for.
#[test]
fn a_long_variable_name_is_refused_and_never_looked_for() {
    let dir = tempfile::tempdir().unwrap();
    let name = "A".repeat(200_000);
    workspace(
        dir.path(),
        json!([{"id": "h", "type": "human_input", "title": "H",
                "question": "{".repeat(500_000), "variable_name": "x"}]),
        json!({"variables": {name.clone(): "v"}}),
    );
    let said = validate(dir.path());
    assert!(
        said.contains("1 to 128 letters"),
        "{}",
        &said[..said.len().min(2000)]
    );
    assert!(
        said.len() < 10_000,
        "the name is cut in the message: {}",
        said.len()
    );
    let var_name = "v".repeat(129);
    workspace(
        dir.path(),
        json!([{"id": "h", "type": "human_input", "title": "H", "question": "q",
                "variable_name": var_name}]),
        json!({}),
    );
    let said = validate(dir.path());
    assert!(said.contains("steps[0].variable_name"), "{said}");
}

/// 900,000 `context_dependencies` of one step took 618 MB and 75 s (MEDIUM): a step lists
/// at most 1,000, and names at most 1,000 outputs.
#[test]
fn a_step_lists_at_most_a_thousand_paths() {
    let dir = tempfile::tempdir().unwrap();
    workspace(
        dir.path(),
        json!([{"id": "s", "type": "regular", "title": "S", "description": "d",
                "context_dependencies": vec!["knowledgebase/f"; 1001],
                "context_output": vec!["o.md"; 1001]}]),
        json!({}),
    );
    let said = validate(dir.path());
    assert!(
        said.contains("steps[0].context_dependencies")
            && said.contains("1001 entries, more than the 1000"),
        "{said}"
    );
    assert!(said.contains("steps[0].context_output"), "{said}");
}

/// The 4 MiB a plan's substitution may add held per group, and groups were unbounded: 300
/// groups wrote 1.2 GB (MEDIUM). What a whole run's substitutions add is bounded (16 MiB),
/// and a workflow has at most 1,000 groups.
#[test]
fn what_substitution_adds_over_a_run_of_many_groups_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let steps: Vec<Value> = (0..4)
        .map(|i| {
            json!({"id": format!("h{i}"), "type": "human_input", "title": "H",
                   "question": "{{A}}", "variable_name": format!("v{i}")})
        })
        .collect();
    let groups: Vec<Value> = (0..5).map(|i| json!({"id": format!("g{i}")})).collect();
    workspace(
        dir.path(),
        json!(steps),
        json!({"variables": {"A": "a".repeat(1_000_000)}, "groups": groups}),
    );
    let said = validate(dir.path());
    assert!(said.contains("16 MiB"), "{said}");
    let out = trellis(&[
        "run",
        dir.path().to_str().unwrap(),
        "--input",
        "v0=x",
        "--input",
        "v1=x",
        "--input",
        "v2=x",
        "--input",
        "v3=x",
    ]);
    assert!(!out.status.success());

    let groups: Vec<Value> = (0..1001).map(|i| json!({"id": format!("g{i}")})).collect();
    workspace(dir.path(), json!(steps), json!({"groups": groups}));
    let said = validate(dir.path());
    assert!(said.contains("1001 groups, more than the 1000"), "{said}");
}

/// A review loop of four `human_input` steps each asking a 1 MB substituted question, the
/// last answering "no" back to the first: each pass wrote the questions again, 104 MB by
/// the loop's 25th jump (round 19, LOW). A jump counts what substitution added to the plan
/// again, so the run stops at the 16 MiB over a run.
#[test]
fn a_loop_counts_its_substituted_texts_each_time_it_runs_them_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut steps: Vec<Value> = (0..4)
        .map(|i| {
            json!({"id": format!("h{i}"), "type": "human_input", "title": "H",
                   "question": "{{A}}", "variable_name": "ans"})
        })
        .collect();
    steps[3] = json!({"id": "h3", "type": "human_input", "title": "H", "question": "{{A}}",
                      "variable_name": "ans", "response_type": "yesno",
                      "if_yes_next_step_id": "end", "if_no_next_step_id": "h0"});
    workspace(
        dir.path(),
        json!(steps),
        json!({"variables": {"A": "a".repeat(1_000_000)}}),
    );
    let out = trellis(&["run", dir.path().to_str().unwrap(), "--input", "ans=no"]);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("each time a loop runs its steps again"),
        "{said}"
    );
    let written = support::bytes_under(&dir.path().join("runs"));
    assert!(written < 20 << 20, "the run wrote {written} bytes");
}
