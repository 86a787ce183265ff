//! Red team round 31: each a test that failed before its fix.

use crate::support;

use serde_json::json;
use support::fake_llm::{FakeServer, completion};
use support::workspace::{regular_steps, write_file};

/// Calls of one route rewrote its whole `session.json` at each call's start and end, so
/// the bytes written grew with the square of the calls (5,000 calls of one turn wrote
/// 15 GB for a 241 KB session, MEDIUM). A call checkpoints it (written when it grew by half),
/// and the calling step's end writes it whole.
#[test]
fn a_routes_calls_write_its_session_a_bounded_number_of_times() {
    const ANSWERS: usize = 3;
    let llm = FakeServer::start(Box::new(|body| {
        let results = support::fake_llm::tool_results_of(body).len();
        if results >= 64 * ANSWERS {
            return (200, completion("done", &[]));
        }
        let args = json!({"route_id": "counter", "instructions": "Count."});
        let calls: Vec<(&str, serde_json::Value)> =
            (0..64).map(|_| ("call_sub_agent", args.clone())).collect();
        (200, completion("", &calls))
    }));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    regular_steps(root, llm.providers(), &[]);
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "count", "steps": [
            {"id": "desk", "type": "message_sequence", "title": "Desk", "description": "d",
             "items": [{"id": "work", "type": "user_message", "message": "Work."}],
             "predefined_routes": [{"route_id": "counter", "orphan_step_ref": "count-rows"}]}
        ], "orphan_steps": [{"id": "count-rows", "type": "regular", "title": "Count",
            "description": "Counts rows."}]})
        .to_string(),
    );
    write_file(
        root,
        "planning/step_config.json",
        json!({"steps": [{"id": "count-rows",
                          "agent_configs": {"declared_execution_mode": "scripted"}}]})
        .to_string(),
    );
    write_file(root, "code/count-rows/main.py", "print('counted')\n");
    #[allow(
        clippy::zombie_processes,
        reason = "reaped by wait4 below, which also gives its resource use"
    )]
    let child =
        support::trellis_command(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
    // The child's own accounting of what it wrote (as `time -v` reads it).
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: plain POSIX calls on zeroed, owned out-parameters.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::wait4(pid, &mut status, 0, &mut usage), pid);
        usage
    };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status}"
    );
    let written = usage.ru_oublock as u64 * 512;
    let session = support::workspace::read_json(
        &root.join("runs/iteration-0/execution/desk/agents/counter/session.json"),
    );
    let calls = session["entries"].as_array().unwrap().len();
    assert_eq!(
        calls,
        64 * ANSWERS,
        "every call is in the session at the end"
    );
    let final_size =
        std::fs::metadata(root.join("runs/iteration-0/execution/desk/agents/counter/session.json"))
            .unwrap()
            .len();
    assert!(
        written < 16 << 20,
        "{written} bytes written for a session of {final_size} bytes"
    );
}
