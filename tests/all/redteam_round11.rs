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

/// A cassette of 300,000 `chunks` took a run past 1 GB (host finding F2, HIGH): an
/// interaction's pieces are bounded (`MAX_RECORDED_CHUNKS`), and a cassette past it is
/// refused before anything runs, naming the limit.
#[test]
fn a_cassette_of_too_many_pieces_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    crate::run_cli::agent_workspace(
        &ws,
        &[("work", "Say hi.")],
        json!([]),
        json!({"llm": {"provider": "replay", "model_id": "big"}}),
    );
    let chunks: Vec<_> = (0..5_000).map(|_| json!({"text": ""})).collect();
    support::workspace::write_file(
        &ws,
        "cassettes/big.json",
        json!({"interactions": [{"request": {"messages": []},
            "response": {"text": "hi"}, "chunks": chunks}]})
        .to_string(),
    );
    let out = support::trellis(&["run", ws.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "interactions[0].chunks holds 5000 pieces, more than the 4096 one interaction may replay"
        ),
        "{stderr}"
    );
    assert!(!ws.join("runs").exists(), "the run started");
}

/// A model that spells the key in JSON escapes in a tool call's arguments had the decoded
/// key written to a file, the session and the turn log (host finding F1, HIGH): arguments
/// are redacted once decoded too.
#[test]
fn a_key_in_json_escapes_of_tool_arguments_reaches_no_file() {
    use support::fake_llm::{FakeServer, completion};
    const VAR: &str = "TRELLIS_ROUND11_KEY";
    let key = "sk-round11-abcdefghijklmnopqrstuvwxyz0123";
    let escaped: String = key
        .chars()
        .map(|c| format!("\\u{:04x}", c as u32))
        .collect();
    let arguments = format!(
        r#"{{"path": "runs/iteration-0/execution/work/leak.txt", "content": "{escaped}"}}"#
    );
    let server = FakeServer::start(Box::new(move |body| {
        let answered = body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        let reply = if answered {
            completion("done", &[])
        } else {
            let mut reply = completion("", &[("workspace__write_file", json!({}))]);
            reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] =
                json!(arguments);
            reply
        };
        (200, reply)
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let mut providers = server.providers();
    providers["openai"]["api_key_env"] = json!(VAR);
    crate::run_cli::agent_workspace(
        &ws,
        &[("work", "Write the file.")],
        json!([{"id": "work", "agent_configs": {"selected_tools": ["workspace:write_file"]}}]),
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": providers}),
    );
    let origin = server.base_url().trim_end_matches("/v1").to_string();
    let out = support::trellis_command(&[
        "run",
        ws.to_str().unwrap(),
        "--allow-host",
        &server.allow_host(),
        "--allow-key",
        &format!("{VAR}={origin}"),
    ])
    .env(VAR, key)
    .output()
    .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    let written = std::fs::read_to_string(ws.join("runs/iteration-0/execution/work/leak.txt"))
        .unwrap_or_else(|e| panic!("the call did not write: {e}\n{said}"));
    assert_eq!(written, "[REDACTED]");
    for (file, _) in support::tree_digest(&ws) {
        let text = String::from_utf8_lossy(&std::fs::read(ws.join(&file)).unwrap_or_default())
            .into_owned();
        for window in key.as_bytes().windows(8) {
            let window = std::str::from_utf8(window).unwrap();
            assert!(!text.contains(window), "{window:?} in {file}");
        }
    }
    for window in key.as_bytes().windows(8) {
        assert!(
            !said.contains(std::str::from_utf8(window).unwrap()),
            "{said}"
        );
    }
}
