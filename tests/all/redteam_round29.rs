//! Red team round 29 (the run's budgets over groups): each a test that failed before its
//! fix.

use crate::support;

use serde_json::json;
use support::fake_llm::{FakeServer, completion};
use support::plugin_build::all_output;
use support::trellis;
use support::workspace::{regular_steps, tree_bytes, with_groups, write_file};

/// A turn whose message did not fit what the run keeps said "the run ends here", and the
/// run went on to its next group, which met the same refusal and wrote its session again:
/// ten groups wrote 20 MB after the run had said it ended (LOW). No later group starts.
#[test]
fn a_run_out_of_kept_bytes_starts_no_later_group() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let llm = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    regular_steps(root, llm.providers(), &[]);
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "o", "steps": [{"id": "s", "type": "regular", "title": "S",
               "description": "d".repeat(2 << 20)}]})
        .to_string(),
    );
    with_groups(root, 5);
    let out = trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-run-result-mib",
        "1",
    ]);
    let said = all_output(&out);
    assert!(!out.status.success(), "{said}");
    assert_eq!(said.matches("step s: failed (").count(), 1, "{said}");
    assert!(llm.seen().is_empty());
}

/// A step's `description` went into its system prompt, which its `session.json` keeps, once
/// for each group that runs the step, outside every budget: a 2 MB description and 100 groups
/// wrote 204 MB under a 1 MiB `--max-run-result-mib` (MEDIUM). The system prompt counts in
/// what the run keeps: the first group's step fails, naming the budget, and no later group
/// starts.
#[test]
fn a_long_description_counts_in_what_the_run_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let llm = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    regular_steps(root, llm.providers(), &[]);
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "o", "steps": [{"id": "s", "type": "message_sequence",
               "title": "S", "description": "d".repeat(2 << 20),
               "items": [{"id": "m", "type": "user_message", "message": "Go."}]}]})
        .to_string(),
    );
    with_groups(root, 20);
    let out = trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-run-result-mib",
        "1",
    ]);
    let said = all_output(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("--max-run-result-mib"), "{said}");
    assert_eq!(said.matches("step s: failed (").count(), 1, "{said}");
    let written = tree_bytes(&root.join("runs"));
    assert!(written < 4 << 20, "{written} bytes under runs/: {said}");
    assert!(llm.seen().is_empty());
}
