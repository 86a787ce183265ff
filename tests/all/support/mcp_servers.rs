//! External MCP servers in a run, set up as the tests need them: the operator's server file,
//! the stdio fixture's entry in it, a one-step agent workspace and a model that asks for
//! the servers' tools.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::fake_llm::{FakeServer, completion};
use super::mcp_fixture;

/// A server file at `path` with `servers` as its `mcpServers`.
pub fn server_file(path: &Path, servers: Value) -> PathBuf {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, json!({"mcpServers": servers}).to_string()).unwrap();
    path.to_path_buf()
}

/// The stdio fixture as a server file entry: it writes its pid to `started` when it starts.
pub fn fixture_entry(started: &Path) -> Value {
    json!({
        "command": mcp_fixture::python(),
        "args": [mcp_fixture::script(), "--started", started],
    })
}

/// A one-step workspace (`work`) at `root` whose step config is `configs`, reaching `llm`.
pub fn workspace(root: &Path, configs: Value, llm: &FakeServer) {
    crate::run_cli::agent_workspace(
        root,
        &[("work", "Use the tools.")],
        json!([{"id": "work", "agent_configs": configs}]),
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": llm.providers()}),
    );
}

/// An LLM that asks for `calls` (API names, `server__tool`) in its first answer, then ends.
pub fn asking_for(calls: Vec<(&'static str, Value)>) -> FakeServer {
    FakeServer::start(Box::new(move |body| {
        let answered = body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        if answered {
            (200, completion("done", &[]))
        } else {
            let calls: Vec<(&str, Value)> = calls.iter().map(|(n, a)| (*n, a.clone())).collect();
            (200, completion("", &calls))
        }
    }))
}

/// `trellis ARGS --mcp-config CONFIG`, ready to run; `run` and `builder` with the
/// operator's approval of loopback, where the workspace's LLM is ([`workspace`]).
pub fn with_servers(args: &[&str], config: &Path) -> std::process::Command {
    let mut all = args.to_vec();
    all.extend(["--mcp-config", config.to_str().unwrap()]);
    if matches!(args.first(), Some(&"run" | &"builder")) {
        all.extend(["--allow-host", "127.0.0.1"]);
    }
    super::trellis_command(&all)
}
