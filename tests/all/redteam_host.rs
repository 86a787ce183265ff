//! Red-team tests of what a hostile workspace, model or guest can make the host itself do
//! (its memory, its process), through the real binary: files planted in a workspace the
//! builder reads, and plans whose queries the host runs. Each asserts the safe outcome and
//! that nothing outside the workspace changed.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion, result_of};
use support::tree_digest;
use support::workspace::{write_file, write_files};

use crate::support::plugin_build::text;

/// A fake model answering `replies` in order, then `done`.
fn scripted(replies: Vec<Value>) -> FakeServer {
    let next = Arc::new(AtomicUsize::new(0));
    FakeServer::start(Box::new(move |_| {
        let n = next.fetch_add(1, Ordering::SeqCst);
        (
            200,
            replies
                .get(n)
                .cloned()
                .unwrap_or_else(|| completion("done", &[])),
        )
    }))
}

/// A one-step workspace whose model is `providers`' fake server.
fn one_step_ws(root: &std::path::Path, providers: Value) {
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "Say hello", "steps": [
            {"id": "greet", "type": "regular", "title": "Greet", "description": "Say hello."}
        ]})
        .to_string(),
    );
    write_file(root, "planning/step_config.json", r#"{"steps": []}"#);
    write_file(
        root,
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": providers}).to_string(),
    );
}

/// A turn log summary as the host writes it, with `tokens` prompt and completion tokens.
fn turn_summary(iteration: u32, tokens: u64) -> String {
    json!({"step_id": "greet", "item_id": "i", "entry_id": "e", "attempt": 1,
           "iteration": iteration, "provider": "openai", "model_id": "m",
           "status": "completed", "error": null, "started_at": "2026-11-30T00:00:00Z",
           "completed_at": "2026-11-30T00:00:01Z", "duration_ms": 1, "llm_duration_ms": 1,
           "tool_duration_ms": 0, "llm_call_count": 1, "tool_call_count": 0,
           "tool_error_count": 0, "prompt_tokens": tokens, "completion_tokens": tokens,
           "total_tokens": tokens})
    .to_string()
}

/// Turn logs planted in a workspace with token counts near `u64::MAX`: the builder's
/// `get_cost_summary` adds them up without panicking (which ended the whole builder
/// process, its session with it) and answers the saturated total.
#[test]
fn planted_token_counts_do_not_crash_the_builders_cost_summary() {
    let server = scripted(vec![completion("", &[("get_cost_summary", json!({}))])]);
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    one_step_ws(&ws, server.providers());
    let huge = u64::MAX - 1;
    write_files(
        &ws,
        &[
            ("runs/iteration-0/execution/greet/out.txt", "hi".to_string()),
            (
                "runs/iteration-0/logs/greet/execution-attempt-1-iteration-1.json",
                turn_summary(1, huge),
            ),
            (
                "runs/iteration-0/logs/greet/execution-attempt-1-iteration-2.json",
                turn_summary(2, huge),
            ),
        ],
    );
    write_file(dir.path(), "outside/keep.txt", "keep");
    let outside_before = tree_digest(&dir.path().join("outside"));
    let out = support::trellis(&[
        "builder",
        ws.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--llm",
        "openai:m",
        "-m",
        "how much did the runs cost?",
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let answer: Value = serde_json::from_str(&result_of(&server.tool_results(1), "call-0"))
        .unwrap_or_else(|e| panic!("{e}: {:?}", server.tool_results(1)));
    assert_eq!(answer["runs"]["prompt_tokens"], json!(u64::MAX), "{answer}");
    assert_eq!(
        answer["runs"]["completion_tokens"],
        json!(u64::MAX),
        "{answer}"
    );
    assert_eq!(
        answer["runs"]["by_run_folder"][0]["steps"][0]["prompt_tokens"],
        json!(u64::MAX),
        "{answer}"
    );
    assert_eq!(tree_digest(&dir.path().join("outside")), outside_before);
}

/// A foreach whose `source_sql` yields millions of tiny rows (one two-byte field each, or a
/// few hundred one-byte fields), with a `max_iterations` high enough to keep them all:
/// the rows are held as JSON objects, several hundred bytes of memory for each byte the
/// limit of kept rows counted, so 64 MiB of "kept rows" took gigabytes of the host's
/// memory before the first turn. The limit now counts what a row and a field hold, so the
/// query is refused at it, the host stays small, and no turn runs.
#[test]
fn a_foreach_of_millions_of_tiny_rows_is_refused_within_the_row_limit() {
    let tiny_rows = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c \
                     LIMIT 30000000) SELECT 1 AS \"\" FROM c";
    let columns: Vec<String> = (0..300).map(|i| format!("0 AS c{i}")).collect();
    let wide_rows = format!(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 1000000) \
         SELECT {} FROM c",
        columns.join(", ")
    );
    for source_sql in [tiny_rows, wide_rows.as_str()] {
        let server = scripted(vec![]);
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        write_file(
            &ws,
            "planning/plan.json",
            json!({"objective": "rows", "steps": [
                {"id": "each", "type": "message_sequence", "title": "Each", "description": "d",
                 "items": [{"id": "rows", "type": "foreach", "max_iterations": 1_000_000_000u64,
                            "source_sql": source_sql, "message": "Row"}]}
            ]})
            .to_string(),
        );
        write_file(&ws, "planning/step_config.json", r#"{"steps": []}"#);
        write_file(
            &ws,
            "workflow.json",
            json!({"llm": {"provider": "openai", "model_id": "m"},
                   "providers": server.providers()})
            .to_string(),
        );
        support::workspace::create_db(&ws, "CREATE TABLE t (a INTEGER);");
        write_file(dir.path(), "outside/keep.txt", "keep");
        let outside_before = tree_digest(&dir.path().join("outside"));
        let log = dir.path().join("out.log");
        let (status, peak, out) = support::measure::peak_memory(
            support::trellis_command(&["run", ws.to_str().unwrap(), "--allow-host", "127.0.0.1"]),
            &log,
        );
        assert_eq!(status, 1, "{out}");
        assert!(
            out.contains("source_sql returned more than 67108864 bytes"),
            "{out}"
        );
        assert!(server.seen().is_empty(), "a turn ran");
        assert!(peak < 1 << 30, "peak resident memory {peak} bytes: {out}");
        assert_eq!(tree_digest(&dir.path().join("outside")), outside_before);
    }
}

/// A stdio MCP server speaking just enough JSON-RPC to start, then answering `tools/list`
/// with `PAGES` pages of `PER_PAGE` tools, each with a 1 KB description, every page but
/// the last with a cursor to the next (argv: PAGES PER_PAGE). It counts the pages it was
/// asked for in the file given as the third argument.
const FLOODING_SERVER: &str = r#"
import json, sys
pages, per_page, asked = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
n = 0
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    if msg["method"] == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"],
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "flood", "version": "1"}}
    elif msg["method"] == "tools/list":
        n += 1
        with open(asked, "w") as f:
            f.write(str(n))
        tools = [{"name": "t%d_%d" % (n, i), "description": "d" * 1000,
                  "inputSchema": {"type": "object"}} for i in range(per_page)]
        result = {"tools": tools}
        if n < pages:
            result["nextCursor"] = str(n)
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\n")
    sys.stdout.flush()
"#;

/// An external MCP server whose tool list never ends: page after page of tools (300 MB in
/// all here), or empty pages each with a cursor to the next. The run holds what a plugin may
/// list (256 tools, 1 MiB of them, in at most 256 pages) and no more, refuses the server
/// naming the limit, asks for no further page and starts nothing. Before, every page was
/// added to one list in memory until the server stopped sending them (2.9 GB of the host's
/// memory for these 300 pages).
#[test]
fn an_external_servers_endless_tool_list_is_cut_at_a_plugins_limits() {
    for (pages, per_page, refusal, asked_for) in [
        ("300", "1000", "listing its tools: more than 256 tools", "1"),
        (
            "100000",
            "0",
            "listing its tools: more than 256 pages of tools",
            "256",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("flood.py");
        std::fs::write(&script, FLOODING_SERVER).unwrap();
        let asked = dir.path().join("asked");
        let config = support::mcp_servers::server_file(
            &dir.path().join("servers.json"),
            json!({"flood": {"command": "python3", "args": [script, pages, per_page, asked]}}),
        );
        let llm = scripted(vec![]);
        let ws = dir.path().join("ws");
        support::mcp_servers::workspace(&ws, json!({"selected_servers": ["flood"]}), &llm);
        write_file(dir.path(), "outside/keep.txt", "keep");
        let outside_before = tree_digest(&dir.path().join("outside"));
        let log = dir.path().join("out.log");
        let (status, peak, out) = support::measure::peak_memory(
            support::mcp_servers::with_servers(&["run", ws.to_str().unwrap()], &config),
            &log,
        );
        assert_eq!(status, 1, "{out}");
        assert!(
            out.contains(r#"MCP server "flood""#) && out.contains(refusal),
            "{out}"
        );
        assert_eq!(std::fs::read_to_string(&asked).unwrap(), asked_for, "{out}");
        assert!(llm.seen().is_empty(), "a turn ran");
        assert!(!ws.join("runs").exists(), "the run started: {out}");
        assert!(peak < 512 << 20, "peak resident memory {peak} bytes: {out}");
        assert_eq!(tree_digest(&dir.path().join("outside")), outside_before);
    }
}
