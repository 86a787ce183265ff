//! The preflight of `trellis run` and the small checks every command makes on its
//! arguments: each refusal names what is wrong and how to fix it, and a refused run
//! leaves the workspace byte for byte as it was (its tree digest).

use crate::support;

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::trellis;
use support::workspace::write_files;

use crate::support::plugin_build::text;

/// A workspace at `root`: a `regular` step `answer` with `configs` as its agent_configs, a
/// `human_input` step asking for `mood`, `manifest` as workflow.json, an old run folder and
/// a seed.sql (so a run that got past its preflight would rotate one and create the other).
fn workspace(root: &Path, configs: Value, manifest: Value) {
    let plan = json!({"objective": "t", "steps": [
        {"id": "ask", "type": "human_input", "title": "Ask", "description": "How are you?",
         "variable_name": "mood"},
        {"id": "answer", "type": "regular", "title": "Answer", "description": "Answer."}
    ]});
    let config = json!({"steps": [{"id": "answer", "agent_configs": configs}]});
    write_files(
        root,
        &[
            ("planning/plan.json", plan.to_string()),
            ("planning/step_config.json", config.to_string()),
            ("workflow.json", manifest.to_string()),
            ("runs/iteration-0/old.txt", "from before".to_string()),
            ("db/seed.sql", "CREATE TABLE t (x INTEGER);".to_string()),
        ],
    );
}

/// `trellis run root --input mood=fine args...` with `vars` set.
fn run(root: &Path, args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut all = vec![
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--input",
        "mood=fine",
    ];
    all.extend_from_slice(args);
    let mut command = support::trellis_command(&all);
    for (k, v) in vars {
        command.env(k, v);
    }
    command.output().unwrap()
}

/// Runs `trellis run` and checks it is refused with every one of `expected` on stderr and
/// nothing in the workspace changed.
fn refused(root: &Path, args: &[&str], vars: &[(&str, &str)], expected: &[&str]) {
    let before = support::tree_digest(root);
    let out = run(root, args, vars);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    for e in expected {
        assert!(stderr.contains(e), "{args:?}: {e:?} in {stderr}");
    }
    assert_eq!(support::tree_digest(root), before, "{args:?} changed files");
}

#[test]
fn an_unknown_or_miscased_provider_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    workspace(ws, json!({}), json!({}));
    refused(
        ws,
        &["--llm", "foo:bar"],
        &[],
        &[
            "step \"answer\"",
            "no LLM provider \"foo\"",
            "loaded providers (anthropic, openai, replay)",
        ],
    );
    refused(
        ws,
        &["--llm", "OpenAI:gpt-4o"],
        &[],
        &["step \"answer\"", "lower case: write \"openai\""],
    );
    // A fallback's provider too, and the workflow's default model.
    workspace(
        ws,
        json!({"execution_llm": {"provider": "replay", "model_id": "tape",
               "fallbacks": [{"provider": "OPENAI", "model_id": "m"}]}}),
        json!({}),
    );
    write_files(ws, &[("cassettes/tape.json", r#"{"interactions": []}"#)]);
    refused(
        ws,
        &[],
        &[],
        &[
            "step \"answer\"",
            "OPENAI:m (execution_llm)",
            "write \"openai\"",
        ],
    );
}

#[test]
fn an_unset_key_is_refused_and_no_request_leaves_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    workspace(ws, json!({}), json!({}));
    refused(
        ws,
        &["--llm", "openai:gpt-4o"],
        &[],
        &[
            "step \"answer\"",
            "OPENAI_API_KEY is not set: set OPENAI_API_KEY",
        ],
    );
    // A variable the workspace names, for an origin the operator approved.
    workspace(
        ws,
        json!({}),
        json!({"llm": {"provider": "openai", "model_id": "m"},
               "providers": {"openai": {"base_url": "https://llm.example/v1",
                                        "api_key_env": "TRELLIS_TEST_UNSET_KEY"}}}),
    );
    refused(
        ws,
        &["--allow-key", "TRELLIS_TEST_UNSET_KEY=https://llm.example"],
        &[],
        &[
            "step \"answer\"",
            "providers.openai.api_key_env",
            "set TRELLIS_TEST_UNSET_KEY",
        ],
    );
    // A server on this machine may answer without a key.
    let server = FakeServer::start(Box::new(|_| (200, completion("fine", &[]))));
    workspace(
        ws,
        json!({}),
        json!({"llm": {"provider": "openai", "model_id": "m"},
               "providers": server.providers()}),
    );
    let out = run(ws, &[], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.seen().len(), 1);
}

#[test]
fn a_missing_cassette_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    workspace(ws, json!({}), json!({}));
    refused(
        ws,
        &["--llm", "replay:nosuch"],
        &[],
        &["step \"answer\"", "no cassette", "cassettes/nosuch.json"],
    );
}

#[test]
fn a_host_that_does_not_resolve_is_told_in_a_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    workspace(ws, json!({}), json!({}));
    // `.invalid` never resolves (RFC 6761): no request can leave.
    let out = run(
        ws,
        &["--llm", "openai:m"],
        &[
            ("OPENAI_API_KEY", "sk-test"),
            ("OPENAI_BASE_URL", "https://llm.trellis-test.invalid/v1"),
        ],
    );
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("cannot resolve `llm.trellis-test.invalid`: no network, or a wrong base URL"),
        "{all}"
    );
    assert!(all.contains("OPENAI_BASE_URL"), "{all}");
    assert!(
        !all.contains("ErrorCode") && !all.contains("Payload"),
        "{all}"
    );
}

#[test]
fn an_unknown_step_or_input_is_refused_naming_what_there_is() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    workspace(
        ws,
        json!({}),
        json!({"llm": {"provider": "replay", "model_id": "t"}}),
    );
    write_files(ws, &[("cassettes/t.json", r#"{"interactions": []}"#)]);
    refused(
        ws,
        &["--step", "nosuch"],
        &[],
        &["no step \"nosuch\" in the plan; its steps are: ask, answer"],
    );
    refused(
        ws,
        &["--input", "mod=typo"],
        &[],
        &["--input mod: no human_input step of the plan asks for it (it asks for: mood)"],
    );
}

#[test]
fn a_file_given_for_the_workspace_folder_names_its_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, json!({}), json!({}));
    let before = support::tree_digest(&ws);
    let plan = ws.join("planning/plan.json");
    let plan = plan.to_str().unwrap();
    let expected = format!(
        "{plan}: expected the workspace folder, got a file: did you mean {}?",
        ws.display()
    );
    for args in [
        vec!["run", plan, "--allow-host", "127.0.0.1"],
        vec!["validate", plan],
        vec!["check", plan, "--step", "answer"],
        vec!["script", plan, "--step", "answer"],
        vec!["migrate", plan],
        vec!["runs", "list", plan],
        vec!["runs", "show", plan, "answer"],
    ] {
        let out = trellis(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(&expected), "{args:?}: {stderr}");
    }
    assert_eq!(support::tree_digest(&ws), before);

    // A folder that is not a workspace, and one that does not exist.
    let out = trellis(&["runs", "list", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not a workspace (no planning/plan.json)"),
        "{}",
        text(&out.stderr)
    );
    let missing = dir.path().join("nonexistent");
    let missing = missing.to_str().unwrap();
    let out = trellis(&["tool", "call", "workspace:list_dir", "--root", missing]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(&format!("--root {missing}: the folder does not exist")),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn log_lines_carry_no_colour_codes_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    workspace(dir.path(), json!({}), json!({}));
    // -v logs at debug level; stderr is a pipe here.
    let out = trellis(&["-v", "plugins", "list"]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("DEBUG"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "{stderr}");
}

/// A workspace at `root` whose one step runs a foreach of `sql` with `message` over the
/// table `t (x)` of its seed, after the steps `before` (plan.json step objects).
fn foreach_workspace(root: &Path, before: &[Value], sql: &str, message: &str) {
    let mut steps = before.to_vec();
    steps.push(
        json!({"id": "each", "type": "message_sequence", "title": "Each",
        "description": "One turn a row.",
        "items": [{"id": "rows", "type": "foreach", "source_sql": sql, "message": message}]}),
    );
    write_files(
        root,
        &[
            (
                "planning/plan.json",
                json!({"objective": "t", "steps": steps}).to_string(),
            ),
            ("workflow.json", json!({}).to_string()),
            ("runs/iteration-0/old.txt", "from before".to_string()),
            ("db/seed.sql", "CREATE TABLE t (x INTEGER);".to_string()),
        ],
    );
}

fn validate(root: &Path) -> (Option<i32>, String) {
    let out = trellis(&["validate", root.to_str().unwrap()]);
    (out.status.code(), text(&out.stdout))
}

#[test]
fn validate_parses_foreach_templates_and_prepares_their_queries() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let at = "planning/plan.json: steps[0].items[0]";
    foreach_workspace(ws, &[], "SELECT x FROM t", "Row {{.x} and more");
    let (code, stdout) = validate(ws);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "{at}.message (step \"each\"): not a valid Go template: a `{{{{` is not closed"
        )),
        "{stdout}"
    );
    // A field the query does not return renders empty: a warning.
    foreach_workspace(ws, &[], "SELECT x FROM t", "Row {{.x}}: {{.y}}");
    let (code, stdout) = validate(ws);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "{at}.message (step \"each\"): names .y, which is not a column of the query \
             (columns: x)"
        )),
        "{stdout}"
    );
    assert!(stdout.contains("0 errors, 1 warning"), "{stdout}");
    // Inside `with` and `range` the dot is no longer the row.
    foreach_workspace(ws, &[], "SELECT x FROM t", "{{with .x}}{{.inner}}{{end}}");
    let (code, stdout) = validate(ws);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("0 errors, 0 warnings"), "{stdout}");
    // A missing table or column, checked against the database the seed makes.
    for sql in ["SELECT x FROM missing", "SELECT nope FROM t"] {
        foreach_workspace(ws, &[], sql, "Row {{.x}}");
        let (code, stdout) = validate(ws);
        assert_eq!(code, Some(1), "{stdout}");
        assert!(
            stdout.contains(&format!(
                "{at}.source_sql (step \"each\"): cannot be prepared"
            )),
            "{stdout}"
        );
    }
    // ... and against db/db.sqlite when there is one.
    support::workspace::create_db(ws, "CREATE TABLE missing (x INTEGER);");
    let (code, stdout) = validate(ws);
    assert_eq!(code, Some(1), "{stdout}");
    foreach_workspace(ws, &[], "SELECT x FROM missing", "Row {{.x}}");
    let (code, stdout) = validate(ws);
    assert_eq!(code, Some(0), "{stdout}");
    std::fs::remove_file(ws.join("db/db.sqlite")).unwrap();
    // A scripted step before it may create the table: a warning only.
    let script = json!({"id": "load", "type": "regular", "title": "Load",
                        "description": "Load rows."});
    foreach_workspace(ws, &[script], "SELECT x FROM missing", "Row {{.x}}");
    write_files(
        ws,
        &[(
            "planning/step_config.json",
            json!({"steps": [{"id": "load", "agent_configs":
                {"declared_execution_mode": "scripted"}}]})
            .to_string(),
        )],
    );
    let (code, stdout) = validate(ws);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("planning/plan.json: steps[1].items[0].source_sql (step \"each\")")
            && stdout.contains("an earlier step may create what it needs"),
        "{stdout}"
    );
}

#[test]
fn a_bad_template_or_query_is_refused_before_the_run_folder_rotates() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    for (sql, message, expected) in [
        (
            "SELECT x FROM t",
            "Row {{.x",
            "steps[0].items[0].message (step \"each\"): not a valid Go template",
        ),
        (
            "SELECT x FROM missing",
            "Row {{.x}}",
            "steps[0].items[0].source_sql (step \"each\"): cannot be prepared",
        ),
    ] {
        foreach_workspace(ws, &[], sql, message);
        write_files(ws, &[("cassettes/t.json", r#"{"interactions": []}"#)]);
        let before = support::tree_digest(ws);
        let out = trellis(&[
            "run",
            ws.to_str().unwrap(),
            "--allow-host",
            "127.0.0.1",
            "--llm",
            "replay:t",
        ]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
        assert_eq!(support::tree_digest(ws), before, "{message}: files changed");
    }
}

// ------------------------------------------------------------------------------- runs

#[test]
fn runs_show_tells_gates_sub_agents_outputs_and_turns_by_item() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    support::workspace::copy_workspace(
        &support::workspace::example_dir(),
        &ws,
        &["runs", "db.sqlite"],
    );
    let root = ws.to_str().unwrap();
    let out = trellis(&["run", root, "--allow-host", "127.0.0.1"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The step line and the total count the same turns.
    assert!(
        stdout.contains("step triage-tickets: completed (4 turn(s); 1 more by its sub-agents)"),
        "{stdout}"
    );
    assert!(stdout.contains("done: 5 turns"), "{stdout}");
    let out = trellis(&["runs", "show", root, "triage-tickets"]);
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{shown}");
    for line in [
        // The gate's result, not the agent's last reply.
        "  check-report [prevalidation] completed: gate passed (9 checks, attempt 1)",
        "turns: 4 (and 1 of its sub-agents: 5 in all)",
        "sub-agent calls:\n  call-0001 route refunds: completed\n",
        "output files:\n",
        "  runs/iteration-0/execution/triage-tickets/report.json\n",
        "  turn 2 (triage-each row 2): replay:triage-demo completed",
        "  turn 4 (triage-tickets-reflection): replay:triage-demo completed",
    ] {
        assert!(shown.contains(line), "{line:?} in {shown}");
    }
    assert!(!shown.contains("attempt 4 iteration 1"), "{shown}");
}

#[test]
fn runs_show_gives_a_failed_gates_checks_in_full_and_list_keeps_plan_order() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let plan = json!({"objective": "t", "steps": [
        {"id": "zeta", "type": "regular", "title": "Z", "description": "First."},
        {"id": "alpha", "type": "regular", "title": "A", "description": "Write out.json.",
         "validation_schema": {"files": [{"file_name": "out.json", "must_exist": true}]}}
    ]});
    write_files(
        ws,
        &[
            ("planning/plan.json", plan.to_string()),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": server.providers()})
                .to_string(),
            ),
        ],
    );
    let root = ws.to_str().unwrap();
    let out = trellis(&["run", root, "--allow-host", "127.0.0.1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let out = trellis(&["runs", "list", root]);
    let listed = text(&out.stdout);
    let zeta = listed.find("zeta completed").expect(&listed);
    let alpha = listed.find("alpha failed").expect(&listed);
    assert!(zeta < alpha, "plan order: {listed}");
    let out = trellis(&["runs", "show", root, "alpha"]);
    let shown = text(&out.stdout);
    assert!(
        shown.contains("gate failed: 1 of 1 checks failed"),
        "{shown}"
    );
    assert!(
        shown.contains("      expected: the file exists\n"),
        "{shown}"
    );
    assert!(shown.contains("      actual:   "), "{shown}");
}

// ------------------------------------------------------------------------------- small things

#[test]
fn plugins_list_marks_bundled_and_third_party_plugins() {
    let dir = tempfile::tempdir().unwrap();
    support::plugin_folder(dir.path(), "adversary", "adversary", "tool");
    let out = trellis(&["plugins", "list", "--plugins", dir.path().to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let line = |id: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{id} ")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(line("workspace").contains(" bundled "), "{stdout}");
    assert!(line("adversary").contains(" third-party "), "{stdout}");
}

#[test]
fn a_regular_step_with_a_script_and_no_model_is_told_to_declare_it_scripted() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    workspace(ws, json!({}), json!({}));
    write_files(ws, &[("code/answer/main.py", "print('hi')\n")]);
    refused(
        ws,
        &[],
        &[],
        &[
            "step \"answer\" (regular) needs an LLM and has none",
            "since code/answer/main.py exists, run it as the step: set \
             \"declared_execution_mode\": \"scripted\"",
        ],
    );
}

#[test]
fn cache_options_are_offered_only_where_components_are_compiled() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, json!({}), json!({}));
    let root = ws.to_str().unwrap();
    for args in [
        vec!["runs", "list", "--no-cache", root],
        vec!["--no-cache", "validate", root],
        vec!["schema", "--no-cache", "plan"],
    ] {
        let out = trellis(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: usage error");
    }
    let help = text(&trellis(&["runs", "list", "--help"]).stdout);
    assert!(!help.contains("--cache-dir"), "{help}");
    // validate loads plugins to check the tool names step configs give.
    for command in ["run", "validate"] {
        let help = text(&trellis(&[command, "--help"]).stdout);
        assert!(
            help.contains("--cache-dir") && help.contains("--no-cache"),
            "{help}"
        );
    }
    let out = trellis(&["plugins", "list", "--no-cache"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

// ------------------------------------------------------------------- plugin authoring

/// The first fenced block of `lang` after the heading `heading` in `markdown`.
fn block_after(markdown: &str, heading: &str, lang: &str) -> String {
    let from = markdown.find(heading).expect(heading);
    let fence = format!("```{lang}\n");
    let start = markdown[from..].find(&fence).expect(&fence) + from + fence.len();
    let end = markdown[start..].find("```").unwrap() + start;
    markdown[start..end].to_string()
}

/// docs/plugins.md followed literally: its tool crate (Cargo.toml and src/lib.rs) in a
/// temporary folder outside the repository with the SDK by path, built offline for
/// wasm32-wasip2 as the page says, put in a folder with its plugin.json, then called.
#[test]
fn the_documented_tool_plugin_builds_outside_the_repository_and_answers() {
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/plugins.md"))
            .unwrap();
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins/sdk");
    let manifest = block_after(&docs, "## A tool plugin", "toml");
    let source = block_after(&docs, "## A tool plugin", "rust");
    let plugin_json = block_after(&docs, "<!-- example: plugin-manifest -->", "json");
    let documented = "path = \"../trellis/plugins/sdk\"";
    assert!(manifest.contains(documented), "{manifest}");
    let manifest = manifest.replace(
        documented,
        &format!("path = {:?}", sdk.display().to_string()),
    );

    let dir = tempfile::tempdir().unwrap();
    let krate = dir.path().join("echo");
    write_files(&krate, &[("Cargo.toml", manifest), ("src/lib.rs", source)]);
    // A build folder kept between test runs, so that a rerun is incremental.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("plugin-authoring");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = std::process::Command::new(cargo)
        .args([
            "build",
            "--offline",
            "--release",
            "--target",
            "wasm32-wasip2",
        ])
        .current_dir(&krate)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(900);
    let status = loop {
        if let Some(status) = build.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            build.kill().unwrap();
            panic!("the plugin build ran past 15 minutes");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(build.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");

    let plugins = dir.path().join("my-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(
        target.join("wasm32-wasip2/release/echo.wasm"),
        plugins.join("echo.wasm"),
    )
    .unwrap();
    std::fs::write(plugins.join("plugin.json"), plugin_json).unwrap();
    let out = trellis(&[
        "tool",
        "call",
        "echo:echo",
        "--plugins",
        plugins.to_str().unwrap(),
        "--args",
        r#"{"text": "hi"}"#,
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let answer: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(answer, json!({"text": "hi"}));
}

// ------------------------------------------------------------------- tool names

#[test]
fn a_tool_name_no_plugin_has_is_an_error_with_the_closest_name() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(
        &ws,
        json!({"selected_tools": ["workspace:reed_file"]}),
        json!({"llm": {"provider": "openai", "model_id": "m"}}),
    );
    let (code, out) = validate(&ws);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(
            "planning/step_config.json: steps[0].agent_configs.selected_tools[0] (step \"answer\"): \
             selected_tools names \"workspace:reed_file\", but plugin \"workspace\" has no tool \
             \"reed_file\" (did you mean \"workspace:read_file\"?)"
        ),
        "{out}"
    );
    // The run is refused before anything changes.
    refused(&ws, &[], &[], &["did you mean \"workspace:read_file\"?"]);

    // A database tool misspelled in enabled_custom_tools too.
    workspace(
        &ws,
        json!({"enabled_custom_tools": ["workflow_db:query_workflowdb"]}),
        json!({"llm": {"provider": "openai", "model_id": "m"}}),
    );
    let (code, out) = validate(&ws);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("did you mean \"workflow_db:query_workflow_db\"?"),
        "{out}"
    );
}

#[test]
fn a_third_party_tool_is_checked_against_the_plugins_validate_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let plugins = dir.path().join("plugins");
    support::plugin_folder(&plugins, "adversary", "adversary", "tool");
    workspace(
        &ws,
        json!({"selected_tools": ["adversary:eco"]}),
        json!({"llm": {"provider": "openai", "model_id": "m"}}),
    );
    // Without the plugin, its server is unknown: a warning saying how to load it.
    let (code, out) = validate(&ws);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("server \"adversary\" is not loaded") && out.contains("--plugins DIR"),
        "{out}"
    );
    // With it, the misspelled tool is an error naming the right one.
    let out = trellis(&[
        "validate",
        ws.to_str().unwrap(),
        "--plugins",
        plugins.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("did you mean \"adversary:echo\"?"),
        "{stdout}"
    );
}

#[test]
fn an_unloaded_server_is_a_warning_and_the_step_keeps_its_built_in_tools() {
    let server = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(
        &ws,
        json!({"selected_servers": ["aws"]}),
        json!({"llm": {"provider": "openai", "model_id": "m"},
               "providers": server.providers()}),
    );
    let out = run(&ws, &[], &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("warning: planning/step_config.json: steps[0].agent_configs.selected_servers[0] (step \"answer\"): server \"aws\" is not loaded"),
        "{stdout}"
    );
    let tools: Vec<String> = server.seen()[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        tools.contains(&"workspace__read_file".to_string()),
        "{tools:?}"
    );
}

#[test]
fn a_scripted_step_needs_a_model_only_while_it_has_no_script() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(
        &ws,
        json!({"declared_execution_mode": "scripted"}),
        json!({}),
    );
    // No script yet: an agent turn must write it, so the model is checked first.
    refused(
        &ws,
        &[],
        &[],
        &[
            "step \"answer\" (regular) needs an LLM and has none (it is scripted but has no script yet",
        ],
    );
    // With its script, it runs with no model at all.
    write_files(
        &ws,
        &[(
            "code/answer/main.py",
            "import os\nopen(os.environ['STEP_OUTPUT_DIR'] + '/done.txt', 'w').write('ok')\n",
        )],
    );
    let out = run(&ws, &[], &[]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        ws.join("runs/iteration-0/execution/answer/done.txt")
            .is_file()
    );
}
