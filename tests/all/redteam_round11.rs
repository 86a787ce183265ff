//! Red team round 11: what an attacker of the host found after round 10, each a test that
//! failed before its fix.

use crate::support;

use serde_json::json;

/// An external MCP server's process outlived `trellis run` after the third Ctrl-C, whose
/// exit runs no destructors (round 10 leftover, LOW): the servers' processes are killed
/// before that exit.
#[test]
fn the_third_ctrl_c_leaves_no_mcp_server_running() {
    use support::mcp_servers::{asking_for, fixture_entry, server_file, with_servers};
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    // A server that stays a minute after its input closes: only a kill ends it sooner.
    let mut entry = fixture_entry(&started);
    entry["args"]
        .as_array_mut()
        .unwrap()
        .extend([json!("--linger"), json!("60")]);
    let config = server_file(&dir.path().join("servers.json"), json!({"fx": entry}));
    let llm = asking_for(vec![("fx__hang", json!({"seconds": 600}))]);
    let ws = dir.path().join("ws");
    support::mcp_servers::workspace(&ws, json!({"selected_tools": ["fx:hang"]}), &llm);
    let child = with_servers(&["run", ws.to_str().unwrap()], &config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let waited = std::time::Instant::now();
    while llm.seen().is_empty() {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(120),
            "the run never reached the model"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    let pid: i32 = std::fs::read_to_string(&started)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: kill(2) with signal 0 only asks whether the process exists.
    assert_eq!(
        unsafe { libc::kill(pid, 0) },
        0,
        "the server is not running"
    );
    // Three at once: the third comes while the run still winds down.
    for _ in 0..3 {
        // SAFETY: kill(2) on the child's pid, ours and running.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
        std::thread::sleep(std::time::Duration::from_millis(15));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "not the hard exit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gone = std::time::Instant::now();
    // SAFETY: as above, signal 0.
    while unsafe { libc::kill(pid, 0) } == 0 {
        assert!(
            gone.elapsed() < std::time::Duration::from_secs(10),
            "the MCP server {pid} outlived trellis"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
