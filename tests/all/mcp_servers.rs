//! External MCP servers as tool sources, through the `trellis` binary: the operator's
//! server file (`--mcp-config`, the user config folder and its `_user.json` overlay), a real
//! run whose step calls a tool of a stdio server and of a streamable HTTP server (the
//! Python fixture on the `mcp` package), the unsandboxed marks, `validate` starting
//! nothing, and a workspace that tries to define a server itself.

use crate::support;

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};
use support::fake_llm::result_of;
use support::mcp_fixture::{self, HttpFixture};
use support::mcp_servers::{asking_for, fixture_entry, server_file, with_servers, workspace};
use support::{tree_digest, trellis, trellis_command};

use crate::support::plugin_build::text;

fn both(out: &Output) -> String {
    format!("{}\n{}", text(&out.stdout), text(&out.stderr))
}

/// The stdio entry of the fixture, writing its pid to `started` when it starts.
fn stdio_entry(started: &Path, env: Value) -> Value {
    let mut entry = fixture_entry(started);
    entry["env"] = env;
    entry["description"] = json!("the fixture");
    entry
}

/// The files under `root` whose text contains `needle`.
fn files_containing(root: &Path, needle: &str) -> Vec<String> {
    tree_digest(root)
        .into_keys()
        .filter(|rel| {
            let path = root.join(rel);
            path.is_file() && text(&std::fs::read(&path).unwrap()).contains(needle)
        })
        .collect()
}

fn tool_named<'a>(request: &'a Value, name: &str) -> Option<&'a Value> {
    request["tools"]
        .as_array()?
        .iter()
        .find(|t| t["function"]["name"] == name)
}

#[test]
fn a_step_calls_a_stdio_servers_tool_in_a_real_run() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let mut fx = fixture_entry(&started);
    fx["env"] = json!({"FIXTURE_VAR": "1"});
    fx["oauth"] = json!({"client_id": "x"});
    let config = server_file(&dir.path().join("servers.json"), json!({"fx": fx}));
    let llm = asking_for(vec![
        ("fx__echo", json!({"text": "hello"})),
        ("fx__env_names", json!({})),
    ]);
    let ws = dir.path().join("ws");
    workspace(&ws, json!({"selected_servers": ["fx"]}), &llm);
    let out = with_servers(&["run", ws.to_str().unwrap()], &config)
        .env("TRELLIS_TEST_OPERATOR_SECRET", "s3cret")
        .output()
        .unwrap();
    let all = both(&out);
    assert!(out.status.success(), "{all}");
    // An unsupported key of the server file is warned about.
    assert!(
        all.contains("fx.oauth: not supported by Trellis, ignored"),
        "{all}"
    );

    // The step's agent was offered the server's tools, marked, and told about them.
    let first = &llm.seen()[0];
    let echo = tool_named(first, "fx__echo").expect("fx:echo offered");
    let description = echo["function"]["description"].as_str().unwrap();
    assert!(
        description.starts_with("[unsandboxed: external MCP server] Echoes the text back"),
        "{description}"
    );
    let system = first["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("Unsandboxed tools (external MCP servers") && system.contains("fx:echo"),
        "{system}"
    );
    // The calls reached the server and came back.
    let results = llm.last_tool_results();
    assert_eq!(result_of(&results, "call-0"), "echo: hello");
    // The server started with a cleared environment plus its own.
    let names: Vec<String> = serde_json::from_str(&result_of(&results, "call-1")).unwrap();
    assert!(names.contains(&"FIXTURE_VAR".to_string()), "{names:?}");
    for leaked in [
        "TRELLIS_TEST_OPERATOR_SECRET",
        "PATH",
        "HOME",
        "XDG_CONFIG_HOME",
    ] {
        assert!(
            !names.contains(&leaked.to_string()),
            "{leaked} in {names:?}"
        );
    }
    // Every record of those calls says they ran unsandboxed.
    let records = files_containing(&ws.join("runs"), "\"unsandboxed\"");
    assert!(!records.is_empty(), "no record marks the calls unsandboxed");
    let mut marked = 0;
    for rel in &records {
        let text = std::fs::read_to_string(ws.join("runs").join(rel)).unwrap();
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        for call in body["tool_calls"].as_array().into_iter().flatten() {
            assert_eq!(call["unsandboxed"], json!(true), "{rel}: {call}");
            marked += 1;
        }
    }
    assert!(marked >= 2, "{records:?}");
    // The server went with the run.
    let pid: u32 = std::fs::read_to_string(&started).unwrap().parse().unwrap();
    assert!(
        mcp_fixture::process_gone(pid),
        "server {pid} outlived the run"
    );
}

#[test]
fn a_step_calls_a_streamable_http_servers_tool_with_its_headers() {
    let fixture = HttpFixture::start();
    let dir = tempfile::tempdir().unwrap();
    let config = server_file(
        &dir.path().join("servers.json"),
        json!({"web": {"url": fixture.url(), "headers": {"X-Fixture-Token": "t-42"}}}),
    );
    let llm = asking_for(vec![
        ("web__echo", json!({"text": "over http"})),
        ("web__header", json!({"name": "x-fixture-token"})),
    ]);
    let ws = dir.path().join("ws");
    workspace(
        &ws,
        json!({"selected_tools": ["web:echo", "web:header"]}),
        &llm,
    );
    let out = with_servers(&["run", ws.to_str().unwrap()], &config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", both(&out));
    let first = &llm.seen()[0];
    assert!(tool_named(first, "web__echo").is_some());
    // Only the tools listed are offered.
    assert!(tool_named(first, "web__env_names").is_none());
    let results = llm.last_tool_results();
    assert_eq!(result_of(&results, "call-0"), "echo: over http");
    assert_eq!(result_of(&results, "call-1"), "t-42");
}

#[test]
fn a_tool_the_server_lacks_is_an_error_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let config = server_file(
        &dir.path().join("servers.json"),
        json!({"fx": stdio_entry(&started, json!({}))}),
    );
    let llm = asking_for(vec![]);
    let ws = dir.path().join("ws");
    workspace(&ws, json!({"selected_tools": ["fx:ecko"]}), &llm);
    let before = tree_digest(&ws);
    let out = with_servers(&["run", ws.to_str().unwrap()], &config)
        .output()
        .unwrap();
    let all = both(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("selected_tools names \"fx:ecko\"")
            && all.contains("did you mean \"fx:echo\"?"),
        "{all}"
    );
    assert!(llm.seen().is_empty());
    assert_eq!(tree_digest(&ws), before);
    let pid: u32 = std::fs::read_to_string(&started).unwrap().parse().unwrap();
    assert!(
        mcp_fixture::process_gone(pid),
        "server {pid} outlived the preflight"
    );
}

#[test]
fn validate_accepts_server_keys_without_starting_anything() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let config = server_file(
        &dir.path().join("servers.json"),
        json!({"fx": stdio_entry(&started, json!({}))}),
    );
    let llm = asking_for(vec![]);
    let ws = dir.path().join("ws");
    workspace(
        &ws,
        json!({"selected_servers": ["fx"], "selected_tools": ["fx:whatever"]}),
        &llm,
    );
    let out = with_servers(&["validate", ws.to_str().unwrap()], &config)
        .output()
        .unwrap();
    let all = both(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("0 errors, 0 warnings"), "{all}");
    assert!(!started.exists(), "validate started the server");
    // Without the server file the key names nothing loaded: a warning.
    let out = trellis(&["validate", ws.to_str().unwrap()]);
    assert!(
        both(&out).contains("server \"fx\" is not loaded"),
        "{}",
        both(&out)
    );
}

#[test]
fn a_server_key_that_is_a_plugin_id_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let config = server_file(
        &dir.path().join("servers.json"),
        json!({"Workspace": stdio_entry(&started, json!({}))}),
    );
    let llm = asking_for(vec![]);
    let ws = dir.path().join("ws");
    workspace(&ws, json!({"selected_servers": ["workspace"]}), &llm);
    for command in [
        &["validate", ws.to_str().unwrap()][..],
        &["run", ws.to_str().unwrap()],
        &["plugins", "list"],
    ] {
        let out = with_servers(command, &config).output().unwrap();
        let all = both(&out);
        assert!(!out.status.success(), "{command:?}: {all}");
        assert!(
            all.contains("MCP server \"Workspace\" has the id of a plugin or tool category"),
            "{command:?}: {all}"
        );
    }
    assert!(!started.exists());
    assert!(!ws.join("runs").exists());
}

#[test]
fn plugins_list_marks_servers_unsandboxed_and_the_user_overlay_wins() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("config");
    server_file(
        &home.join("trellis/mcp_servers.json"),
        json!({"fx": {"command": "/bin/false"}, "other": {"url": "https://mcp.example/mcp"}}),
    );
    server_file(
        &home.join("trellis/mcp_servers_user.json"),
        json!({"fx": {"command": "/usr/bin/env", "args": ["fixture"]}}),
    );
    let list = |json: bool| {
        let mut args = vec!["plugins", "list"];
        if json {
            args.push("--json");
        }
        trellis_command(&args)
            .env("XDG_CONFIG_HOME", &home)
            .output()
            .unwrap()
    };
    let out = list(false);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", both(&out));
    let fx = stdout
        .lines()
        .find(|l| l.starts_with("fx "))
        .expect("fx listed");
    assert!(
        fx.contains("mcp-server") && fx.contains("UNSANDBOXED"),
        "{fx}"
    );
    assert!(fx.contains("stdio: /usr/bin/env fixture"), "{fx}");
    let other = stdout.lines().find(|l| l.starts_with("other ")).unwrap();
    assert!(
        other.contains("streamable_http: https://mcp.example/mcp"),
        "{other}"
    );
    let out = list(true);
    let listed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let fx = listed.iter().find(|p| p["id"] == "fx").unwrap();
    assert_eq!(fx["kind"], "mcp_server");
    assert_eq!(fx["sandboxed"], false);

    // A server file others can write starts nothing: it is refused.
    let file = home.join("trellis/mcp_servers_user.json");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = list(false);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("refusing the MCP servers: others can write it"),
        "{}",
        both(&out)
    );
}

#[test]
fn an_sse_server_is_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let config = server_file(
        &dir.path().join("servers.json"),
        json!({"old": {"url": "http://127.0.0.1:9/sse", "protocol": "sse"}}),
    );
    let out = with_servers(&["plugins", "list"], &config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(
            "mcpServers.old.protocol: \"sse\" (the old HTTP+SSE transport) is not supported"
        ),
        "{}",
        both(&out)
    );
}

/// A step with no tool filters gets every tool, an external server's too (as in the original
/// system): the configured server is started and its tool is offered and called.
#[test]
fn a_step_with_no_tool_filters_gets_the_servers_tools_too() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let config = server_file(
        &dir.path().join("servers.json"),
        json!({"fx": fixture_entry(&started)}),
    );
    let llm = asking_for(vec![("fx__echo", json!({"text": "open"}))]);
    let ws = dir.path().join("ws");
    workspace(&ws, json!({}), &llm);
    let out = with_servers(&["run", ws.to_str().unwrap()], &config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", both(&out));
    assert!(tool_named(&llm.seen()[0], "fx__echo").is_some());
    let results = llm.last_tool_results();
    assert_eq!(result_of(&results, "call-0"), "echo: open");
}

/// `trellis builder` reads the same operator file for the executions it starts: a refused
/// server stops it before the session opens, with nothing written in the workspace.
#[test]
fn the_builder_reads_the_operators_servers_too() {
    let dir = tempfile::tempdir().unwrap();
    let config = server_file(
        &dir.path().join("servers.json"),
        json!({"old": {"url": "http://127.0.0.1:9/sse", "protocol": "sse"}}),
    );
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let out = with_servers(&["builder", ws.to_str().unwrap(), "-m", "hello"], &config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("mcpServers.old.protocol: \"sse\""),
        "{}",
        both(&out)
    );
    assert_eq!(std::fs::read_dir(&ws).unwrap().count(), 0, "{}", both(&out));
}

/// A workspace tries to define a server, in every file it has and in files of its own:
/// nothing is started, and the run says why.
#[test]
fn a_workspace_cannot_make_trellis_start_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("pwned");
    let evil = json!({"evil": {
        "command": "/bin/sh",
        "args": ["-c", format!("touch {}", marker.display())],
        "url": "http://127.0.0.1:9/mcp",
        "headers": {"Authorization": "Bearer stolen"},
    }});
    let llm = asking_for(vec![("evil__anything", json!({}))]);

    // 1. Server definitions inside plan.json, step_config.json and workflow.json.
    let ws = dir.path().join("inline");
    workspace(
        &ws,
        json!({"selected_servers": ["evil"], "mcpServers": evil, "mcp_servers": evil}),
        &llm,
    );
    let mut plan: Value =
        serde_json::from_str(&std::fs::read_to_string(ws.join("planning/plan.json")).unwrap())
            .unwrap();
    plan["mcpServers"] = evil.clone();
    std::fs::write(ws.join("planning/plan.json"), plan.to_string()).unwrap();
    let mut manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(ws.join("workflow.json")).unwrap()).unwrap();
    manifest["mcpServers"] = evil.clone();
    std::fs::write(ws.join("workflow.json"), manifest.to_string()).unwrap();
    let before = tree_digest(&ws);
    for command in ["run", "validate"] {
        let out = trellis(&[command, ws.to_str().unwrap()]);
        let all = both(&out);
        assert!(!out.status.success(), "{command}: {all}");
        assert!(
            all.contains("unknown key \"mcpServers\""),
            "{command}: {all}"
        );
        assert!(!marker.exists(), "{command} started the workspace's server");
    }
    assert_eq!(tree_digest(&ws), before);

    // 2. Server files of its own, the names an operator's would have, in a workspace that
    //    is otherwise valid: ignored with a warning, the key selects nothing.
    let ws = dir.path().join("files");
    workspace(&ws, json!({"selected_servers": ["evil"]}), &llm);
    for name in [
        "mcp_servers.json",
        "mcp_servers_user.json",
        ".mcp.json",
        "mcp.json",
    ] {
        std::fs::write(ws.join(name), json!({"mcpServers": evil}).to_string()).unwrap();
    }
    let before = tree_digest(&ws);
    let out = trellis(&["run", ws.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let all = both(&out);
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("mcp_servers.json in the workspace is ignored: MCP servers are configured by the operator"),
        "{all}"
    );
    assert!(
        all.contains(".mcp.json in the workspace is ignored"),
        "{all}"
    );
    assert!(all.contains("server \"evil\" is not loaded"), "{all}");
    assert!(!marker.exists(), "the run started the workspace's server");
    // The model was offered no tool of it, and its call was refused.
    assert!(tool_named(&llm.seen()[0], "evil__anything").is_none());
    assert!(
        result_of(&llm.last_tool_results(), "call-0").starts_with("error:"),
        "{:?}",
        llm.last_tool_results()
    );
    // Nothing outside the run folder changed.
    let after = tree_digest(&ws);
    let outside = |t: &std::collections::BTreeMap<String, String>| {
        t.iter()
            .filter(|(k, _)| !k.starts_with("runs"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(outside(&after), outside(&before));
    let out = trellis(&["validate", ws.to_str().unwrap()]);
    assert!(
        both(&out).contains("mcp_servers.json in the workspace is ignored"),
        "{}",
        both(&out)
    );
}

/// A server that writes 400 MB to stderr in one line before it serves: the run works, and
/// the host keeps a bounded part of it (the rest read and dropped), not the line.
#[test]
fn a_servers_stderr_flood_is_capped_not_held() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let mut entry = fixture_entry(&started);
    entry["args"]
        .as_array_mut()
        .unwrap()
        .extend([json!("--stderr-flood"), json!("400000000")]);
    let config = server_file(&dir.path().join("servers.json"), json!({"fx": entry}));
    let llm = asking_for(vec![("fx__echo", json!({"text": "still here"}))]);
    let ws = dir.path().join("ws");
    workspace(&ws, json!({"selected_tools": ["fx:echo"]}), &llm);
    let log = dir.path().join("out.log");
    let (status, peak, out) =
        support::measure::peak_memory(with_servers(&["run", ws.to_str().unwrap()], &config), &log);
    assert_eq!(status, 0, "{out}");
    assert_eq!(
        result_of(&llm.last_tool_results(), "call-0"),
        "echo: still here"
    );
    assert!(peak < 300 << 20, "peak resident memory {peak} bytes");
}

/// An HTTP server on loopback is reached directly although the environment names a proxy
/// (which would see the server's headers, a token among them): the proxy gets no connection.
#[test]
fn an_http_server_on_loopback_is_not_reached_through_a_proxy() {
    let proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    proxy.set_nonblocking(true).unwrap();
    let fixture = HttpFixture::start();
    let dir = tempfile::tempdir().unwrap();
    let config = server_file(
        &dir.path().join("servers.json"),
        json!({"web": {"url": fixture.url(), "headers": {"Authorization": "Bearer t-42"}}}),
    );
    let llm = asking_for(vec![("web__echo", json!({"text": "direct"}))]);
    let ws = dir.path().join("ws");
    workspace(&ws, json!({"selected_tools": ["web:echo"]}), &llm);
    let out = with_servers(&["run", ws.to_str().unwrap()], &config)
        .env("HTTP_PROXY", &proxy_url)
        .env("http_proxy", &proxy_url)
        .env("ALL_PROXY", &proxy_url)
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", both(&out));
    assert_eq!(
        result_of(&llm.last_tool_results(), "call-0"),
        "echo: direct"
    );
    assert!(
        proxy.accept().is_err(),
        "the proxy was connected to: the request (and its bearer) went through it"
    );
}
