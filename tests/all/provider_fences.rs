//! What a workspace may not make an LLM provider do, through `trellis run`: reach a
//! service on this machine or its network without the operator's approval, rewrite the
//! fields the host writes in a request, or carry a piece of the operator's key into an
//! output. Each test is a row of docs/security.md ("LLM providers: secrets, origins and
//! requests").

use crate::run_cli::agent_workspace;
use crate::support;

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};

use crate::support::plugin_build::text;

/// A one-step agent workspace at `root` whose model is `openai:m` at `base_url`, with an
/// old run folder and a seed: a refusal before anything runs leaves both as they are.
fn workspace(root: &Path, base_url: &str, key_env: &str, options: Option<Value>) {
    let mut llm = json!({"provider": "openai", "model_id": "m"});
    if let Some(options) = options {
        llm["options"] = options;
    }
    agent_workspace(
        root,
        &[("answer", "Answer.")],
        json!([{"id": "answer", "agent_configs": {"selected_tools": ["workspace:write_file"]}}]),
        json!({"llm": llm,
               "providers": {"openai": {"base_url": base_url, "api_key_env": key_env}}}),
    );
    support::workspace::write_files(
        root,
        &[
            ("runs/iteration-0/old.txt", "from before"),
            ("db/seed.sql", "CREATE TABLE t (x INTEGER);"),
        ],
    );
}

fn assert_untouched(root: &Path) {
    assert!(root.join("runs/iteration-0/old.txt").is_file(), "rotated");
    assert!(!root.join("runs/iteration-1").exists(), "rotated");
    assert!(!root.join("db/db.sqlite").exists(), "database created");
}

/// `trellis run ROOT ARGS` with `vars` in its environment.
fn run(root: &Path, args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut all = vec!["run", root.to_str().unwrap(), "--llm-retries", "0"];
    all.extend_from_slice(args);
    let mut command = support::trellis_command(&all);
    for (k, v) in vars {
        command.env(k, v);
    }
    command.output().unwrap()
}

/// The refusal of a workspace's `base_url` at `url`, whose host is `what`, up to the
/// config file's path (which depends on the test's environment).
fn refusal(url: &str, what: &str, flag: &str) -> String {
    format!(
        "workflow.json: providers.openai.base_url: {url} is {what}, off the public internet, \
         which a workspace cannot choose alone; the operator approves it with --allow-host \
         {flag} (or allow_host in "
    )
}

#[test]
fn a_workspace_base_url_on_this_machine_needs_the_operators_allow_host() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let port = server.allow_host().rsplit(':').next().unwrap().to_string();
    // No key is sent, yet the provider would post the conversation to whatever listens.
    workspace(&ws, &server.base_url(), "TRELLIS_TEST_NO_KEY", None);
    let expected = refusal(
        &server.base_url(),
        "127.0.0.1 (loopback, RFC 1122)",
        &server.allow_host(),
    );
    for args in [&[][..], &["--allow-host", "127.0.0.1:1"][..]] {
        let out = run(&ws, args, &[]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(&expected), "{args:?}: {stderr}");
        assert_eq!(server.connections(), 0, "a request went out");
        assert_untouched(&ws);
    }
    // Other names of this machine are refused the same way.
    for (url, what, flag) in [
        (
            format!("http://localhost:{port}/v1"),
            "this machine",
            format!("localhost:{port}"),
        ),
        (
            format!("http://127.0.0.2:{port}/v1"),
            "127.0.0.2 (loopback, RFC 1122)",
            format!("127.0.0.2:{port}"),
        ),
    ] {
        workspace(&ws, &url, "TRELLIS_TEST_NO_KEY", None);
        let out = run(&ws, &["--allow-host", &server.allow_host()], &[]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(&refusal(&url, what, &flag)), "{stderr}");
    }
    assert_eq!(server.connections(), 0);

    // Approved on the command line, then in the user config file.
    workspace(&ws, &server.base_url(), "TRELLIS_TEST_NO_KEY", None);
    let out = run(&ws, &["--allow-host", &server.allow_host()], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.seen().len(), 1);
    let config = dir.path().join("config");
    support::workspace::write_file(
        &config,
        "trellis/config.toml",
        format!("allow_host = [\"{}\"]\n", server.allow_host()),
    );
    let out = run(&ws, &[], &[("XDG_CONFIG_HOME", config.to_str().unwrap())]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.seen().len(), 2);
}

#[test]
fn a_base_url_at_loopback_mapped_into_ipv6_needs_the_operators_allow_host() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let port = server.allow_host().rsplit(':').next().unwrap().to_string();
    let url = format!("http://[::ffff:127.0.0.1]:{port}/v1");
    let flag = format!("[::ffff:127.0.0.1]:{port}");
    workspace(&ws, &url, "TRELLIS_TEST_NO_KEY", None);
    // Refused as this machine (not as plain http elsewhere), naming the flag; nothing sent.
    let out = run(&ws, &["--allow-host", &server.allow_host()], &[]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&refusal(
            &url,
            "::ffff:127.0.0.1 (loopback, RFC 1122)",
            &flag
        )),
        "{stderr}"
    );
    assert_eq!(server.connections(), 0, "a request went out");
    assert_untouched(&ws);
    // Approved in that spelling, the run reaches the server: loopback needs no key.
    if std::net::TcpStream::connect(format!("[::ffff:127.0.0.1]:{port}")).is_err() {
        support::skip("this machine cannot reach IPv4 loopback through an IPv6 socket");
        return;
    }
    let out = run(&ws, &["--allow-host", &flag], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.seen().len(), 1);
}

#[test]
fn a_scheme_in_capitals_is_checked_and_reaches_the_server_in_lower_case() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let url = format!("HTTP://{}/v1", server.allow_host());
    workspace(&ws, &url, "TRELLIS_TEST_NO_KEY", None);
    let out = run(&ws, &[], &[]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&refusal(
            &url,
            "127.0.0.1 (loopback, RFC 1122)",
            &server.allow_host()
        )),
        "{stderr}"
    );
    assert_untouched(&ws);
    // Approved, the provider gets the URL in lower case and its request arrives.
    let out = run(&ws, &["--allow-host", &server.allow_host()], &[]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(server.seen().len(), 1);
    // Plain http off this machine in capitals needs the approval of any other.
    let far = "Http://llm.example.invalid:8080/v1";
    workspace(&ws, far, "TRELLIS_TEST_NO_KEY", None);
    let out = run(&ws, &[], &[]);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("plain http to http://llm.example.invalid:8080"),
        "{stderr}"
    );
}

#[test]
fn options_cannot_replace_the_model_the_conversation_or_the_tools_and_stream_is_a_switch() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let approve = ["--allow-host", &server.allow_host()];
    for (key, value) in [
        ("model", json!("an-expensive-model")),
        (
            "messages",
            json!([{"role": "user", "content": "something else"}]),
        ),
        ("system", json!("other instructions")),
        ("tools", json!([])),
    ] {
        workspace(
            &ws,
            &server.base_url(),
            "TRELLIS_TEST_NO_KEY",
            Some(json!({key: value})),
        );
        let out = run(&ws, &approve, &[]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        let expected = format!(
            "workflow.json llm.options.{key}: the host writes \"{key}\" in the request body, \
             options cannot replace it; remove it"
        );
        assert!(stderr.contains(&expected), "{key}: {stderr}");
        assert_untouched(&ws);
    }
    assert_eq!(server.connections(), 0);
    // Any other option goes into the body beside what the host writes.
    workspace(
        &ws,
        &server.base_url(),
        "TRELLIS_TEST_NO_KEY",
        Some(json!({"top_p": 0.5})),
    );
    let out = run(&ws, &approve, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let seen = server.seen();
    assert_eq!(seen[0]["model"], "m");
    assert_eq!(seen[0]["top_p"], 0.5);
    // The host streams by default: the provider asks for it (this server answers whole).
    assert_eq!(seen[0]["stream"], true);
    // `stream` is the switch, not a field of the body: `false` turns streaming off, and
    // anything but a boolean is refused.
    workspace(
        &ws,
        &server.base_url(),
        "TRELLIS_TEST_NO_KEY",
        Some(json!({"stream": false})),
    );
    let out = run(&ws, &approve, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let seen = server.seen();
    assert_eq!(seen.last().unwrap().get("stream"), None, "{seen:?}");
    workspace(
        &ws,
        &server.base_url(),
        "TRELLIS_TEST_NO_KEY",
        Some(json!({"stream": "yes"})),
    );
    let before = server.seen().len();
    let out = run(&ws, &approve, &[]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "workflow.json llm.options.stream: expected true or false (whether the model's \
             replies stream), found \"yes\""
        ),
        "{stderr}"
    );
    assert_eq!(server.seen().len(), before);
}

/// Every file under `root` whose bytes contain `needle`.
fn files_containing(root: &Path, needle: &str) -> Vec<String> {
    support::tree_digest(root)
        .into_keys()
        .filter(|rel| {
            let path = root.join(rel);
            path.is_file() && text(&std::fs::read(&path).unwrap()).contains(needle)
        })
        .collect()
}

#[test]
fn no_piece_of_the_key_reaches_an_output_when_an_excerpt_cuts_it() {
    // 51 characters: the provider's excerpt of the error body (300 bytes) ends 50 of them
    // into the key it echoes.
    const KEY: &str = "sk-trellis-test-0123456789abcdefghijklmnopqrstuvwxy";
    assert_eq!(KEY.len(), 51);
    let server = FakeServer::start_with_auth(Box::new(|_, auth| {
        // A body that is a JSON string, not an error object: the excerpt is its start, the
        // opening quote included.
        let filler = "e".repeat(300 - 1 - "Bearer ".len() - 50);
        (401, json!(format!("{filler}{}", auth.unwrap_or_default())))
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, &server.base_url(), "TRELLIS_TEST_KEY", None);
    let origin = server.base_url().trim_end_matches("/v1").to_string();
    let out = run(
        &ws,
        &["--allow-key", &format!("TRELLIS_TEST_KEY={origin}")],
        &[("TRELLIS_TEST_KEY", KEY), ("RUST_LOG", "debug")],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(server.seen().len(), 1, "{stdout}\n{stderr}");
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    // The cut excerpt was there to leak, hidden.
    let all = format!("{stdout}{stderr}");
    assert!(all.contains("HTTP 401: \"eee"), "{all}");
    assert!(all.contains("Bearer [REDACTED]..."), "{all}");
    for start in 0..=KEY.len() - 8 {
        let piece = &KEY[start..start + 8];
        assert!(!stdout.contains(piece), "{piece:?} in stdout:\n{stdout}");
        assert!(!stderr.contains(piece), "{piece:?} in stderr:\n{stderr}");
        assert_eq!(
            files_containing(&ws, piece),
            Vec::<String>::new(),
            "{piece:?}"
        );
    }
    assert!(!files_containing(&ws, "Bearer [REDACTED]").is_empty());
}

#[test]
fn a_key_shorter_than_eight_characters_does_not_mangle_the_answers() {
    // Local servers' docs suggest any key, `x` say: it is sent, and never taken for a secret
    // to hide in what comes back.
    let server = FakeServer::start(Box::new(|body| {
        let answered = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "tool");
        if answered {
            (200, completion("six xylophones, boxed", &[]))
        } else {
            let args = json!({"path": "runs/iteration-0/execution/answer/box.txt",
                              "content": "six xylophones"});
            (200, completion("", &[("workspace__write_file", args)]))
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, &server.base_url(), "TRELLIS_TEST_KEY", None);
    let origin = server.base_url().trim_end_matches("/v1").to_string();
    let out = run(
        &ws,
        &["--allow-key", &format!("TRELLIS_TEST_KEY={origin}")],
        &[("TRELLIS_TEST_KEY", "x")],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let step = ws.join("runs/iteration-0/execution/answer");
    assert_eq!(
        std::fs::read_to_string(step.join("box.txt")).unwrap(),
        "six xylophones"
    );
    let summary = support::workspace::read_json(&step.join("execution-final-summary.json"));
    assert_eq!(summary["execution_result"], "six xylophones, boxed");
    assert!(!stdout.contains("[REDACTED]"), "{stdout}");
    assert_eq!(files_containing(&ws, "[REDACTED]"), Vec::<String>::new());
}
