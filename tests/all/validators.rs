//! Custom validators: a `validation_type` other than `json` goes to the
//! validator plugin of that id, which sees only the file's folder, read-only.
//! A validator that loops, panics, floods or fails is a gate error naming the
//! plugin, never a crash, and the gate carries on serving.

use crate::support;

use std::time::Duration;

use serde_json::json;
use support::{engine, plugin_folder};
use trellis_sandbox::{Limits, PluginRegistry};
use trellis_workflow::validation::PluginValidators;
use trellis_workflow::validation::{GateError, run_gate_value};

async fn registry() -> PluginRegistry {
    let plugins = tempfile::tempdir().unwrap();
    let folder = plugin_folder(plugins.path(), "wrong_world", "unruly", "validator");
    let mut registry = PluginRegistry::with_bundled(engine()).await.unwrap();
    registry.load_dir(&folder).await.unwrap();
    registry
}

/// Short deadline: the `spin` validator must time out; the others end long before.
fn limits() -> Limits {
    Limits {
        memory_bytes: 64 << 20,
        timeout: Duration::from_millis(2000),
        ..Limits::default()
    }
}

struct Step {
    root: tempfile::TempDir,
}

impl Step {
    fn new() -> Step {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("runs/iteration-0/execution/s");
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("data.txt"), "hello").unwrap();
        Step { root }
    }

    async fn gate(
        &self,
        registry: &PluginRegistry,
        behave: &str,
    ) -> Result<trellis_workflow::validation::Report, GateError> {
        let schema = json!({"files": [{"file_name": "data.txt", "validation_type": "unruly", "behave": behave}]});
        let validators = PluginValidators::new(registry, limits());
        run_gate_value(
            self.root.path(),
            &self.root.path().join("runs/iteration-0/execution/s"),
            &schema,
            &validators,
        )
        .await
    }
}

fn validator_error(result: Result<trellis_workflow::validation::Report, GateError>) -> String {
    match result {
        Err(err @ GateError::Validator { .. }) => err.to_string(),
        other => panic!("expected a validator error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_validator_reports_checks_into_the_gate() {
    let registry = registry().await;
    let step = Step::new();
    let report = step.gate(&registry, "pass").await.unwrap();
    assert!(report.passed, "{report:?}");
    assert_eq!(report.checks.len(), 1);
    let check = &report.checks[0];
    assert_eq!(
        (check.file.as_str(), check.kind.as_str()),
        ("data.txt", "not_empty")
    );
    assert_eq!(check.actual, "5 bytes");
}

#[tokio::test(flavor = "multi_thread")]
async fn misbehaving_validators_are_gate_errors_naming_the_plugin() {
    let registry = registry().await;
    let step = Step::new();
    let cases = [
        (
            "spin",
            "validator `unruly`: timed out after 2s and was stopped",
        ),
        ("panic", "validator `unruly`: the plugin crashed"),
        (
            "flood",
            "validator `unruly`: returned 20000 checks, over the limit of 10000",
        ),
        (
            "fail",
            "validator `unruly`: option `columns` must be a list of strings",
        ),
        ("escape", "validator `unruly`: cannot read /etc/passwd"),
        ("fail_long", "… [cut: 1048594 bytes, limit 4096]"),
        (
            "huge_report",
            "validator `unruly`: report of 8388608 bytes is over the 4194304-byte output limit",
        ),
    ];
    for (behave, expected) in cases {
        let message = validator_error(step.gate(&registry, behave).await);
        assert!(
            message.contains("validator `unruly`: "),
            "{behave}: {message}"
        );
        assert!(
            message.contains(expected),
            "{behave}: expected {expected:?} in {message}"
        );
    }
    // Still serving.
    assert!(step.gate(&registry, "pass").await.unwrap().passed);
}

/// Long texts and many warnings (under the output limit) are cut, and the cuts marked:
/// what reaches the run's report and the next LLM turn stays small.
#[tokio::test(flavor = "multi_thread")]
async fn a_verbose_validator_is_cut_to_size() {
    let registry = registry().await;
    let step = Step::new();
    let report = step.gate(&registry, "verbose").await.unwrap();
    let check = &report.checks[0];
    for text in [&check.expected, &check.actual, &check.message] {
        // The validator's text is cut to 4 KiB where it is read, then to what a report
        // keeps of a record's text.
        assert!(text.len() < 512 + 100, "{}", text.len());
        assert!(
            text.ends_with("limit 512]"),
            "{}",
            &text[text.len().saturating_sub(100)..]
        );
    }
    assert_eq!(report.warnings.len(), 101, "{:?}", &report.warnings[..3]);
    assert!(
        report.warnings[100].contains("[900 more warnings dropped: limit 100]"),
        "{}",
        report.warnings[100]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_validation_type_fails_the_gate_clearly() {
    let registry = registry().await;
    let step = Step::new();
    let schema = json!({"files": [{"file_name": "data.txt", "validation_type": "yaml"}]});
    let validators = PluginValidators::new(&registry, limits());
    let err = run_gate_value(
        step.root.path(),
        &step.root.path().join("runs/iteration-0/execution/s"),
        &schema,
        &validators,
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("no validator handles validation_type \"yaml\""),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_bundled_csv_validator_checks_a_real_file() {
    let registry = registry().await;
    let step = Step::new();
    let out = step.root.path().join("runs/iteration-0/execution/s");
    std::fs::write(
        out.join("tickets.csv"),
        "id,priority\nT-1,P1\nT-2,P9\nT-2,P2\n",
    )
    .unwrap();
    let schema = json!({"files": [{
        "file_name": "tickets.csv", "validation_type": "csv",
        "columns": ["id", "priority"], "min_rows": 1,
        "column_patterns": {"priority": "^P[1-4]$"}, "unique_columns": ["id"]
    }]});
    let validators = PluginValidators::new(&registry, limits());
    let report = run_gate_value(step.root.path(), &out, &schema, &validators)
        .await
        .unwrap();
    assert!(!report.passed);
    let failed: Vec<(&str, &str)> = report
        .failures()
        .map(|c| (c.kind.as_str(), c.path.as_str()))
        .collect();
    assert_eq!(
        failed,
        [("pattern", "priority"), ("unique", "id")],
        "{report:?}"
    );
    assert!(report.checks.iter().all(|c| c.file == "tickets.csv"));
    let pattern = report.failures().next().unwrap();
    assert!(pattern.actual.contains("\"P9\""), "{pattern:?}");

    // Fixed file: every check passes.
    std::fs::write(out.join("tickets.csv"), "id,priority\nT-1,P1\nT-2,P2\n").unwrap();
    assert!(
        run_gate_value(step.root.path(), &out, &schema, &validators)
            .await
            .unwrap()
            .passed
    );

    // A malformed rule is a gate error naming the option.
    let bad =
        json!({"files": [{"file_name": "tickets.csv", "validation_type": "csv", "min_row": 1}]});
    let err = run_gate_value(step.root.path(), &out, &bad, &validators)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("min_rows"), "{err}");
}

/// The gate awaits a validator on the caller's runtime, whatever its flavor: no thread and
/// no runtime of its own per call. A validator that never ends is still stopped.
#[tokio::test(flavor = "current_thread")]
async fn validators_run_on_a_current_thread_runtime() {
    let registry = registry().await;
    let step = Step::new();
    assert!(step.gate(&registry, "pass").await.unwrap().passed);
    let message = validator_error(step.gate(&registry, "spin").await);
    assert!(
        message.contains("validator `unruly`: timed out after 2s and was stopped"),
        "{message}"
    );
}
