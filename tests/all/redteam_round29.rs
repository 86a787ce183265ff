//! Red team round 29 (the run's budgets over groups): each a test that failed before its
//! fix.

use crate::support;

use serde_json::json;
use support::fake_llm::{FakeServer, completion};
use support::trellis;
use support::workspace::{regular_steps, write_file};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

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
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("workflow.json")).unwrap()).unwrap();
    manifest["groups"] = (0..5)
        .map(|i| json!({"id": format!("g{i}"), "name": format!("g{i}")}))
        .collect();
    write_file(root, "workflow.json", manifest.to_string());
    let out = trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-run-result-mib",
        "1",
    ]);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert_eq!(said.matches("step s: failed (").count(), 1, "{said}");
    assert!(llm.seen().is_empty());
}
