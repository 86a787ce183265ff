//! Red team round 12, and the leftovers of earlier rounds fixed with it: each a test that
//! failed before its fix.

use crate::support;

use serde_json::json;

/// A stdio MCP server speaking just enough JSON-RPC to start, then listing one tool `t`
/// whose `inputSchema` nests arrays `DEPTH` deep, or (argv: DEPTH call) a plain `t` whose
/// calls answer with `structuredContent` that deep.
const DEEP_SCHEMA_SERVER: &str = r#"
import json, sys
depth = int(sys.argv[1])
deep_call = sys.argv[2:] == ["call"]
nested = "[" * depth + "]" * depth
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    if msg["method"] == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"],
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "deep", "version": "1"}}
        text = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result})
    elif msg["method"] == "tools/list":
        schema = "{}" if deep_call else nested
        text = ('{"jsonrpc": "2.0", "id": %s, "result": {"tools": [{"name": "t", '
                '"inputSchema": {"type": "object", "default": %s}}]}}') % (json.dumps(msg["id"]), schema)
    elif msg["method"] == "tools/call":
        text = ('{"jsonrpc": "2.0", "id": %s, "result": {"content": [], '
                '"structuredContent": {"a": %s}}}') % (json.dumps(msg["id"]), nested)
    else:
        text = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {}})
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
"#;

/// An external MCP server whose tool list nests 5,000 levels deep was refused with
/// "listing its tools: Transport closed", naming no limit (round 10 leftover, LOW): the
/// refusal names the depth limit, and a list within it still loads.
#[test]
fn a_server_whose_tools_nest_too_deep_is_refused_naming_the_depth() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("deep.py");
    std::fs::write(&script, DEEP_SCHEMA_SERVER).unwrap();
    for (depth, refused) in [("5000", true), ("100", false)] {
        let config = support::mcp_servers::server_file(
            &dir.path().join("servers.json"),
            json!({"deep": {"command": "python3", "args": [script, depth]}}),
        );
        let llm = support::mcp_servers::asking_for(vec![]);
        let ws = dir.path().join(format!("ws-{depth}"));
        support::mcp_servers::workspace(&ws, json!({"selected_servers": ["deep"]}), &llm);
        let out = support::mcp_servers::with_servers(&["run", ws.to_str().unwrap()], &config)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if refused {
            assert_eq!(out.status.code(), Some(1), "{said}");
            assert!(
                said.contains(r#"MCP server "deep""#)
                    && said.contains(
                        "listing its tools: it sent a message longer than the limit of \
                         16777216 bytes, of more than 1000000 JSON values or nested more than \
                         127 levels deep, which was not read"
                    ),
                "{said}"
            );
            assert!(llm.seen().is_empty(), "a turn ran: {said}");
        } else {
            assert!(out.status.success(), "{said}");
            assert!(!llm.seen().is_empty(), "no turn ran: {said}");
        }
    }
}

/// A stdio MCP server that answered a call with `structuredContent` 200 levels deep had its
/// answer dropped unparsed by the client, and the call waited for the 300 s timeout
/// (round 12, LOW): the answer is refused as it is read, and the call fails at once naming
/// the limit.
#[test]
fn a_call_answered_too_deep_fails_at_once_naming_the_depth() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("deep.py");
    std::fs::write(&script, DEEP_SCHEMA_SERVER).unwrap();
    let config = support::mcp_servers::server_file(
        &dir.path().join("servers.json"),
        json!({"deep": {"command": "python3", "args": [script, "200", "call"]}}),
    );
    let llm = support::mcp_servers::asking_for(vec![("deep__t", json!({}))]);
    let ws = dir.path().join("ws");
    support::mcp_servers::workspace(&ws, json!({"selected_servers": ["deep"]}), &llm);
    let out = support::mcp_servers::with_servers(&["run", ws.to_str().unwrap()], &config)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    let results = llm.last_tool_results();
    assert_eq!(results.len(), 1, "{said}");
    assert_eq!(
        results[0].1,
        "error: MCP server \"deep\" sent a message longer than the limit of 16777216 bytes, of \
         more than 1000000 JSON values or nested more than 127 levels deep: it was not read, \
         and the server is disconnected for the rest of the run"
    );
}

/// A streamed reply of tool-call pieces, each with an index not seen before, cost the
/// provider work that grew with the square of their number: 300,000 of them (17 MB, within
/// the body cap) kept a core busy for the whole timeout of every attempt (round 12, MEDIUM).
/// A piece finds its call at once now, and a reply of more calls than one answer may hold
/// is refused as malformed, once, not retried.
#[test]
fn a_stream_of_too_many_tool_calls_is_refused_once_naming_the_limit() {
    use support::fake_stream::{Answer, Step, StreamServer};
    let server = StreamServer::start(|_, _| {
        let mut body = String::new();
        for index in 0..20_000 {
            let chunk = json!({"model": "m-1", "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": index, "id": format!("c{index}"), "type": "function",
                 "function": {"name": "workspace__list_files", "arguments": ""}}]}}]});
            body.push_str(&format!("data: {chunk}\n\n"));
        }
        Answer::stream(vec![
            Step::Send(body),
            Step::Send("data: [DONE]\n\n".into()),
        ])
    });
    let ws = tempfile::tempdir().unwrap();
    crate::streaming::workspace(ws.path(), &server);
    let out = support::trellis_command(&[
        "run",
        ws.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
    ])
    .output()
    .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(
            "the answer has more than 16384 tool calls or content blocks, the most one answer \
             may hold"
        ),
        "{said}"
    );
    assert_eq!(server.seen().len(), 1, "the call was retried: {said}");
}
