//! The bundled `anthropic` provider through `trellis run`, against a fake Messages API on
//! 127.0.0.1: a tool-use round trip (system text, `tools` with `input_schema`, `tool_use`
//! and `tool_result` blocks), the key added by the host as `x-api-key` and kept out of every
//! file and output, usage in the run's logs, overloads and server errors retried, a bad
//! request not, and keys sent only where the operator approved. A plugin may not set
//! `x-api-key` itself.

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};
use trellis_sandbox::PluginRegistry;
use trellis_sandbox::llm::{Endpoint, LlmError, Message, Request, Secret};

use crate::support;
use crate::support::fake_anthropic::{FakeAnthropic, Seen, error, message};
use crate::support::workspace::{read_json, write_files};

const KEY_VAR: &str = "TRELLIS_TEST_ANTHROPIC_KEY";
const KEY: &str = "sk-ant-test-5e0b7d-only-the-host-holds-it";
const MODEL: &str = "claude-test-1";

/// A one-step agent workspace whose model is `anthropic:MODEL`, with `providers` as given
/// and `workspace:write_file` for the step.
fn workspace(root: &Path, providers: Value) {
    write_files(
        root,
        &[
            (
                "planning/plan.json",
                json!({"objective": "notes", "steps": [{"id": "notes", "type": "regular",
                       "title": "notes", "description": "Write the notes."}]})
                .to_string(),
            ),
            (
                "planning/step_config.json",
                json!({"steps": [{"id": "notes",
                       "agent_configs": {"selected_tools": ["workspace:write_file"]}}]})
                .to_string(),
            ),
            (
                "workflow.json",
                json!({"llm": {"provider": "anthropic", "model_id": MODEL},
                       "providers": providers})
                .to_string(),
            ),
        ],
    );
}

/// `trellis run root args...` with `vars` set and quick retries.
fn run(root: &Path, args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut all = vec![
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--llm-retries",
        "2",
        "--llm-retry-delay",
        "10",
    ];
    all.extend_from_slice(args);
    let mut command = support::trellis_command(&all);
    for (k, v) in vars {
        command.env(k, v);
    }
    command.output().unwrap()
}

use crate::support::plugin_build::text;

fn both(out: &Output) -> String {
    format!("{}\n{}", text(&out.stdout), text(&out.stderr))
}

/// Files under `root` holding `needle`.
fn files_containing(root: &Path, needle: &str) -> Vec<String> {
    support::tree_digest(root)
        .into_keys()
        .filter(|rel| {
            let path = root.join(rel);
            path.is_file() && text(&std::fs::read(&path).unwrap()).contains(needle)
        })
        .collect()
}

/// The first turn writes two files with two `tool_use` blocks; the next one answers.
fn two_writes(n: usize, _: &Seen) -> (u16, Value) {
    let write = |file: &str| {
        json!({"path": format!("runs/iteration-0/execution/notes/{file}"),
               "content": format!("{file} body")})
    };
    if n == 0 {
        let calls = [
            ("toolu_a", "workspace__write_file", write("a.txt")),
            ("toolu_b", "workspace__write_file", write("b.txt")),
        ];
        (200, message("Writing both.", &calls))
    } else {
        (200, message("Both notes are written.", &[]))
    }
}

/// The conversation log of step `notes`'s first turn.
fn conversation(root: &Path) -> Value {
    let logs = root.join("runs/iteration-0/logs/notes/execution");
    let name = std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.ends_with("-conversation.json"))
        .expect("a conversation log");
    read_json(&logs.join(name))
}

#[test]
fn a_run_round_trips_tool_use_with_the_key_added_by_the_host() {
    let server = FakeAnthropic::start(Box::new(two_writes));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    workspace(
        ws,
        json!({"anthropic": {"base_url": server.base_url(), "api_key_env": KEY_VAR}}),
    );
    let approve = format!("{KEY_VAR}={}", server.base_url());
    let out = run(ws, &["--allow-key", &approve], &[(KEY_VAR, KEY)]);
    assert!(out.status.success(), "{}", both(&out));
    assert!(
        text(&out.stdout).contains("step notes: completed"),
        "{}",
        both(&out)
    );
    let notes = ws.join("runs/iteration-0/execution/notes");
    assert_eq!(
        std::fs::read_to_string(notes.join("a.txt")).unwrap(),
        "a.txt body"
    );
    assert_eq!(
        std::fs::read_to_string(notes.join("b.txt")).unwrap(),
        "b.txt body"
    );

    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    for request in &seen {
        assert_eq!(request.path, "/v1/messages");
        assert_eq!(
            request.headers.get("x-api-key").map(String::as_str),
            Some(KEY)
        );
        assert_eq!(
            request.headers.get("anthropic-version").map(String::as_str),
            Some("2023-06-01")
        );
        assert!(!request.headers.contains_key("authorization"));
        assert!(!request.body.to_string().contains(KEY));
        assert_eq!(request.body["model"], MODEL);
        assert!(request.body["max_tokens"].as_u64().is_some_and(|n| n > 0));
        // The system prompt is top-level text, never a message.
        assert!(
            request.body["system"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
        );
        let messages = request.body["messages"].as_array().unwrap();
        assert!(
            messages
                .iter()
                .all(|m| m["role"] == "user" || m["role"] == "assistant")
        );
        assert_eq!(messages[0]["role"], "user");
        let tools = request.body["tools"].as_array().unwrap();
        let write = tools
            .iter()
            .find(|t| t["name"] == "workspace__write_file")
            .unwrap_or_else(|| panic!("no write_file in {tools:?}"));
        assert_eq!(write["input_schema"]["type"], "object");
        assert!(
            write["input_schema"]["properties"]["path"].is_object(),
            "{write}"
        );
    }
    // The answer's tool calls go back as `tool_use` blocks, and both results in the one user
    // message after them, as `tool_result` blocks naming the calls.
    let messages = seen[1].body["messages"].as_array().unwrap();
    let (assistant, results) = (&messages[messages.len() - 2], &messages[messages.len() - 1]);
    assert_eq!(assistant["role"], "assistant");
    let uses: Vec<(&str, &str)> = assistant["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .map(|b| (b["id"].as_str().unwrap(), b["name"].as_str().unwrap()))
        .collect();
    assert_eq!(
        uses,
        [
            ("toolu_a", "workspace__write_file"),
            ("toolu_b", "workspace__write_file")
        ]
    );
    assert_eq!(assistant["content"][1]["input"]["content"], "a.txt body");
    assert_eq!(results["role"], "user");
    let blocks = results["content"].as_array().unwrap();
    let ids: Vec<&str> = blocks
        .iter()
        .filter(|b| b["type"] == "tool_result")
        .map(|b| b["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["toolu_a", "toolu_b"], "{results}");
    assert_eq!(blocks[0]["type"], "tool_result");

    // Usage as the API counted it, in the run's logs.
    let conv = conversation(ws);
    let calls = conv["llm_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    for call in calls {
        assert_eq!(call["provider"], "anthropic");
        assert_eq!(call["model_id"], MODEL);
        assert_eq!(
            (
                &call["prompt_tokens"],
                &call["completion_tokens"],
                &call["total_tokens"]
            ),
            (&json!(21), &json!(8), &json!(29))
        );
    }
    assert_eq!(calls[0]["tool_calls"][1]["id"], "toolu_b");

    // The key is in no file and no output.
    assert_eq!(files_containing(ws, KEY), Vec::<String>::new());
    assert!(!both(&out).contains(KEY));
}

#[test]
fn the_anthropic_key_goes_only_to_anthropics_approved_origins() {
    let server = FakeAnthropic::start(Box::new(|_, _| (200, message("done", &[]))));
    let origin = server.base_url();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();

    // A workspace cannot send ANTHROPIC_API_KEY to a base URL of its own choosing.
    workspace(ws, json!({"anthropic": {"base_url": server.base_url()}}));
    let out = run(ws, &[], &[("ANTHROPIC_API_KEY", KEY)]);
    assert!(!out.status.success(), "{}", both(&out));
    let expected = format!(
        "workflow.json: providers.anthropic.base_url: the key in ANTHROPIC_API_KEY is not \
         approved for {origin}; approve it with --allow-key ANTHROPIC_API_KEY={origin}"
    );
    assert!(text(&out.stderr).contains(&expected), "{}", both(&out));
    assert!(server.seen().is_empty(), "a request went out");

    // The operator's ANTHROPIC_BASE_URL is approved for it, and is the default base URL.
    workspace(ws, json!({}));
    let out = run(
        ws,
        &[],
        &[("ANTHROPIC_API_KEY", KEY), ("ANTHROPIC_BASE_URL", &origin)],
    );
    assert!(out.status.success(), "{}", both(&out));
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].headers.get("x-api-key").map(String::as_str),
        Some(KEY)
    );

    // OpenAI's key is not Anthropic's: a local server gets none.
    let out = run(
        ws,
        &[],
        &[("OPENAI_API_KEY", KEY), ("ANTHROPIC_BASE_URL", &origin)],
    );
    assert!(out.status.success(), "{}", both(&out));
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert!(!seen[1].headers.contains_key("x-api-key"));
    assert!(!seen[1].headers.contains_key("authorization"));
    assert_eq!(files_containing(ws, KEY), Vec::<String>::new());
}

#[test]
fn an_overload_and_a_server_error_are_retried_then_the_step_completes() {
    let server = FakeAnthropic::start(Box::new(|n, _| match n {
        0 => (529, error("overloaded_error", "Overloaded")),
        1 => (500, error("api_error", "Internal server error")),
        _ => (200, message("done", &[])),
    }));
    let dir = tempfile::tempdir().unwrap();
    workspace(
        dir.path(),
        json!({"anthropic": {"base_url": server.base_url(),
                             "api_key_env": "TRELLIS_TEST_NO_KEY"}}),
    );
    let out = run(dir.path(), &[], &[]);
    assert!(out.status.success(), "{}", both(&out));
    assert!(text(&out.stdout).contains("step notes: completed"));
    assert_eq!(server.seen().len(), 3);
}

#[test]
fn a_persistent_overload_fails_the_step_and_a_bad_request_is_not_retried() {
    let server = FakeAnthropic::start(Box::new(|_, _| {
        (529, error("overloaded_error", "Overloaded"))
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let providers =
        |url: String| json!({"anthropic": {"base_url": url, "api_key_env": "TRELLIS_TEST_NO_KEY"}});
    workspace(ws, providers(server.base_url()));
    let out = run(ws, &[], &[]);
    let all = both(&out);
    assert!(!out.status.success(), "{all}");
    for needle in [
        "LLM provider `anthropic`",
        &format!("model `{MODEL}`, 3 attempts"),
        "HTTP 529: overloaded_error: Overloaded",
    ] {
        assert!(all.contains(needle), "no {needle:?} in:\n{all}");
    }
    assert_eq!(server.seen().len(), 3);

    let bad = FakeAnthropic::start(Box::new(|_, _| {
        (400, error("invalid_request_error", "max_tokens: too large"))
    }));
    workspace(ws, providers(bad.base_url()));
    let out = run(ws, &[], &[]);
    let all = both(&out);
    assert!(!out.status.success(), "{all}");
    for needle in [
        &format!("model `{MODEL}`, 1 attempt"),
        "HTTP 400: invalid_request_error: max_tokens: too large",
    ] {
        assert!(all.contains(needle), "no {needle:?} in:\n{all}");
    }
    assert_eq!(bad.seen().len(), 1);
}

#[tokio::test]
async fn a_plugin_cannot_set_its_own_x_api_key() {
    let plugins = tempfile::tempdir().unwrap();
    let folder = support::plugin_folder(plugins.path(), "test_snoop", "snoop", "llm-provider");
    let mut registry = PluginRegistry::with_bundled(support::engine())
        .await
        .unwrap();
    registry.load_dir(&folder).await.unwrap();
    let server = FakeAnthropic::start(Box::new(|_, _| (200, message("never", &[]))));
    let request = Request {
        model: "fetch".into(),
        messages: vec![Message::user("hi")],
        tools: Vec::new(),
        options: Default::default(),
    };
    let endpoint = Endpoint::new(server.base_url()).with_settings(json!({
        "url": format!("{}/v1/messages", server.base_url()),
        "headers": {"x-api-key": "stolen", "anthropic-version": "2023-06-01"},
    }));
    let err = registry
        .complete("snoop", &endpoint, &Secret::new(KEY), &request, &limits())
        .await
        .unwrap_err();
    assert!(
        matches!(err.llm_error(), Some(LlmError::Transport(m)) if m.contains("headers refused")),
        "{err}"
    );
    assert!(server.seen().is_empty());
}

fn limits() -> trellis_sandbox::Limits {
    trellis_sandbox::Limits {
        memory_bytes: 64 << 20,
        timeout: std::time::Duration::from_secs(10),
        output_bytes: 1 << 20,
        stdio_bytes: 16 << 10,
        ..trellis_sandbox::Limits::default()
    }
}
