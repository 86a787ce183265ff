//! Red team round 27 (a re-check of round 26's fixes: the workspace's quota, host writes):
//! each a test that failed before its fix.

use crate::support;

use serde_json::json;
use support::trellis;
use support::workspace::write_file;

use crate::support::plugin_build::text;

/// A plan of `steps` scripted steps, each printing `bytes` on stdout and on stderr, in one
/// line, and writing its output.
fn printing_steps(root: &std::path::Path, steps: usize, bytes: usize) {
    let ids: Vec<String> = (0..steps).map(|i| format!("s{i}")).collect();
    let plan: Vec<serde_json::Value> = ids
        .iter()
        .map(|id| {
            json!({"id": id, "type": "regular", "title": id, "description": "Print.",
                   "context_output": ["out.txt"]})
        })
        .collect();
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "print", "steps": plan}).to_string(),
    );
    let configs: Vec<serde_json::Value> = ids
        .iter()
        .map(|id| {
            json!({"id": id, "agent_configs": {"declared_execution_mode": "scripted",
                   "lock_code": true}})
        })
        .collect();
    write_file(
        root,
        "planning/step_config.json",
        json!({"steps": configs}).to_string(),
    );
    write_file(root, "workflow.json", "{}");
    let script = format!(
        "import os, sys\n\
         sys.stdout.write('o' * {bytes})\n\
         sys.stderr.write('e' * {bytes})\n\
         open(os.path.join(os.environ['STEP_OUTPUT_DIR'], 'out.txt'), 'w').write('ok')\n"
    );
    for id in &ids {
        write_file(root, &format!("code/{id}/main.py"), &script);
    }
}

/// The logs of what scripts print were written outside every budget: 1,000 scripted steps
/// each printing 1.1 MB on stdout and stderr wrote 2.17 GB under a 16 MiB quota and an 8 MiB
/// run budget (MEDIUM), and each step's success summary kept its last line whole, so a run
/// of many groups held it in memory many times (MEDIUM). What the logs keep comes out of
/// the run's write budget (past it, each keeps its head, the cut marked), and a summary
/// keeps 512 bytes of the line.
#[test]
fn what_scripts_print_is_logged_within_the_runs_write_budget() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    printing_steps(root, 6, 1 << 20);
    let out = trellis(&["run", root.to_str().unwrap(), "--max-run-write-mib", "3"]);
    let said = text(&out.stdout) + &text(&out.stderr);
    // The logs of the first steps take the budget; a later step's script is stopped writing
    // its output, naming it.
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("--max-run-write-mib"), "{said}");
    let mut logged = 0;
    for i in 0..6 {
        let logs = root.join(format!("runs/iteration-0/logs/s{i}"));
        for name in ["script-stdout.txt", "script-stderr.txt"] {
            logged += std::fs::metadata(logs.join(name)).map_or(0, |m| m.len());
        }
        let summary = root.join(format!(
            "runs/iteration-0/execution/s{i}/execution-final-summary.json"
        ));
        if let Ok(bytes) = std::fs::read(summary) {
            let summary: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            let result = summary["execution_result"].as_str().unwrap_or_default();
            assert!(result.len() < 2048, "{} bytes of summary", result.len());
        }
    }
    // 3 MiB of budget, and a cut mark for each log past it.
    assert!(logged > 2 << 20, "{logged} bytes logged: {said}");
    assert!(logged < (3 << 20) + 4096, "{logged} bytes logged: {said}");
}
