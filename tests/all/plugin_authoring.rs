//! `trellis plugin new` and `trellis plugin build`: a project of every kind and language the
//! command offers is scaffolded outside the repository, passes its own generated test,
//! builds with one command and loads; the pairs it does not offer are refused. Python tool
//! plugins (a scaffold, and the example in examples/plugins/csv-stats) are called through
//! `trellis tool call` and by an agent in a run, sandboxed like every other plugin.
//!
//! Rust builds share one target folder under the test target folder, so a rerun is
//! incremental; they run offline, from the crates the workspace build already fetched.

use crate::support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::plugin_build::{
    all_output, answer, bounded, build, for_builds, listed, new_python_tool, path_str, refused,
    text, tool_call, trellis,
};
use support::workspace::write_files;

fn sdk() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins/sdk")
}

// ------------------------------------------------------------------- plugin new, Rust

#[test]
fn rust_projects_of_every_kind_pass_their_tests_build_and_load() {
    let dir = tempfile::tempdir().unwrap();
    let sdk = sdk();
    for (kind, extra) in [
        ("tool", vec![]),
        ("validator", vec!["--sdk-path", path_str(&sdk)]),
        ("llm-provider", vec!["--lang", "rust"]),
    ] {
        let id = format!("my-{kind}");
        let project = dir.path().join(&id);
        let mut args = vec!["plugin", "new", path_str(&project), "--kind", kind];
        args.extend_from_slice(&extra);
        let out = trellis(&args);
        assert!(out.status.success(), "{kind}: {}", all_output(&out));
        assert!(
            text(&out.stdout).contains(&format!("created the Rust {kind} plugin `{id}`")),
            "{}",
            all_output(&out)
        );
        let manifest = std::fs::read_to_string(project.join("Cargo.toml")).unwrap();
        assert!(
            manifest.contains(&format!(
                "trellis-plugin-sdk = {{ path = {:?} }}",
                sdk.display().to_string()
            )),
            "{manifest}"
        );

        // Its own test, on this machine.
        let mut test = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        test.arg("test").current_dir(&project);
        let out = bounded(for_builds(test));
        assert!(
            out.status.success() && text(&out.stdout).contains("test result: ok"),
            "{kind}: cargo test: {}",
            all_output(&out)
        );

        // One command builds it; the result loads as the kind it says.
        let built = build(&project, &[]);
        assert!(built.contains(&format!("{kind} plugin `{id}`")), "{built}");
        let dist = project.join("dist");
        assert!(dist.join(format!("{id}.wasm")).is_file());
        let entry = listed(&dist, &id);
        assert_eq!(entry["kind"], kind, "{entry}");
        assert_eq!(entry["source"].as_str().map(|s| s != "bundled"), Some(true));

        if kind == "validator" {
            // Its rule in a step's gate: too few lines fail, enough pass.
            let ws = dir.path().join("ws");
            let plan = json!({"objective": "t", "steps": [
                {"id": "notes", "type": "regular", "title": "Notes", "description": "Write notes.",
                 "validation_schema": {"files": [{"file_name": "notes.md", "must_exist": true,
                                                  "validation_type": id, "min_lines": 3}]}}]});
            let notes = "runs/iteration-0/execution/notes/notes.md";
            write_files(
                &ws,
                &[
                    ("planning/plan.json", plan.to_string()),
                    ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
                    (notes, "one\n\ntwo\n".to_string()),
                ],
            );
            let check = || {
                trellis(&[
                    "check",
                    path_str(&ws),
                    "--step",
                    "notes",
                    "--plugins",
                    path_str(&dist),
                ])
            };
            let out = check();
            assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));
            assert!(
                text(&out.stdout).contains("FAIL notes.md"),
                "{}",
                all_output(&out)
            );
            std::fs::write(ws.join(notes), "one\ntwo\nthree\n").unwrap();
            let out = check();
            assert!(out.status.success(), "{}", all_output(&out));
        }
        if kind == "llm-provider" {
            // The model of a run: its requests reach the API at the workspace's base URL.
            let server = FakeServer::start(Box::new(|body| {
                (
                    200,
                    json!({"text": format!("{} read the notes", body["model"])}),
                )
            }));
            let ws = dir.path().join("ws-llm");
            write_files(
                &ws,
                &[
                    (
                        "planning/plan.json",
                        json!({"objective": "t", "steps": [
                            {"id": "answer", "type": "regular", "title": "Answer",
                             "description": "Answer."}]})
                        .to_string(),
                    ),
                    ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
                    (
                        "workflow.json",
                        json!({"llm": {"provider": id, "model_id": "m1"},
                               "providers": {id.as_str(): {"base_url": server.base_url(),
                                                           "api_key_env": "TRELLIS_TEST_NO_KEY"}}})
                        .to_string(),
                    ),
                ],
            );
            let out = trellis(&[
                "run",
                path_str(&ws),
                "--plugins",
                path_str(&dist),
                "--allow-host",
                &server.allow_host(),
            ]);
            assert!(out.status.success(), "{}", all_output(&out));
            let seen = server.seen();
            assert!(!seen.is_empty());
            assert_eq!(seen[0]["model"], "m1", "{}", seen[0]);
            assert!(
                seen[0]["messages"]
                    .as_array()
                    .is_some_and(|m| m.iter().any(|m| m["role"] == "user")),
                "{}",
                seen[0]
            );
        }
        if kind == "tool" {
            assert_eq!(entry["tools"], json!(["count_words"]));
            std::fs::write(project.join("words.txt"), "one two three\nfour\n").unwrap();
            let out = tool_call(
                &dist,
                "my-tool:count_words",
                &project,
                &["--read", "."],
                json!({"path": "words.txt"}),
            );
            assert_eq!(answer(&out), json!({"words": 4, "lines": 2}));

            // Built in place, the project folder is itself the plugin folder.
            let manifest = std::fs::read(project.join("plugin.json")).unwrap();
            build(&project, &["--out", path_str(&project)]);
            assert_eq!(
                std::fs::read(project.join("plugin.json")).unwrap(),
                manifest
            );
            assert_eq!(listed(&project, &id)["kind"], "tool");
        }
    }
}

#[test]
fn a_git_reference_to_the_sdk_is_written_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("from-git");
    let url = "https://example.invalid/trellis.git";
    let out = trellis(&[
        "plugin",
        "new",
        path_str(&project),
        "--kind",
        "validator",
        "--sdk-git",
        url,
    ]);
    assert!(out.status.success(), "{}", all_output(&out));
    let manifest = std::fs::read_to_string(project.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains(&format!("trellis-plugin-sdk = {{ git = \"{url}\" }}")),
        "{manifest}"
    );
    let plugin: Value =
        serde_json::from_str(&std::fs::read_to_string(project.join("plugin.json")).unwrap())
            .unwrap();
    assert_eq!(
        plugin,
        json!({"id": "from-git", "kind": "validator", "version": "0.1.0",
               "description": "Checks that a file has enough non-blank lines.",
               "component": "from-git.wasm"})
    );
}

#[test]
fn pairs_and_folders_plugin_new_does_not_take_are_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keep.txt"), "mine").unwrap();
    let taken = dir.path().join("taken");
    write_files(&taken, &[("notes.md", "do not touch".to_string())]);
    let before = support::tree_digest(dir.path());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["py-check", "--kind", "validator", "--lang", "python"],
            "--lang python offers --kind tool only: write validator plugins in Rust",
        ),
        (
            vec!["py-model", "--kind", "llm-provider", "--lang", "python"],
            "--lang python offers --kind tool only: write llm-provider plugins in Rust",
        ),
        (
            vec![
                "py-sdk",
                "--kind",
                "tool",
                "--lang",
                "python",
                "--sdk-git",
                "x",
            ],
            "--sdk-path and --sdk-git are for Rust projects",
        ),
        (
            vec!["taken", "--kind", "tool"],
            "the folder exists and is not empty",
        ),
        (
            vec!["MyTool", "--kind", "tool"],
            "the folder name is the plugin id, and it is not one",
        ),
        (
            vec!["no-sdk", "--kind", "tool", "--sdk-path", "nowhere"],
            "the plugin SDK is not at",
        ),
    ];
    for (args, expected) in cases {
        let project = dir.path().join(args[0]);
        let mut all = vec![
            "plugin".to_string(),
            "new".into(),
            path_str(&project).into(),
        ];
        all.extend(args[1..].iter().map(|s| s.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let mut command = support::trellis_command(&all);
        command.current_dir(dir.path());
        let out = bounded(command);
        refused(&out, expected);
        assert_eq!(support::tree_digest(dir.path()), before, "{args:?}");
    }
}

// ------------------------------------------------------------------- Python

/// A tool appended to a scaffolded plugin.py that tries to leave its sandbox: read and
/// write outside its grants, and open a socket.
const ESCAPE_TOOL: &str = r#"

@tool(schema={"type": "object", "properties": {
    "action": {"enum": ["read", "write", "connect"]},
    "path": {"type": "string"}, "port": {"type": "integer"}}, "required": ["action"]})
def escape(action, path="", port=0):
    """Tries to leave the sandbox."""
    if action == "read":
        with open(path) as file:
            return {"read": file.read()}
    if action == "write":
        with open(path, "w") as file:
            file.write("planted")
        return {"wrote": path}
    import socket
    socket.create_connection(("127.0.0.1", port), timeout=2).sendall(b"hello")
    return {"connected": port}
"#;

#[test]
fn a_python_project_passes_its_test_builds_and_cannot_leave_its_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("py-words");
    new_python_tool(&project);

    // Its own test, with CPython.
    let mut test = Command::new("python3");
    test.args(["-m", "unittest", "-v"]).current_dir(&project);
    let out = bounded(for_builds(test));
    assert!(
        out.status.success() && text(&out.stderr).contains("Ran 3 tests"),
        "{}",
        all_output(&out)
    );

    let plugin = project.join("plugin.py");
    let source = std::fs::read_to_string(&plugin).unwrap();
    std::fs::write(&plugin, source + ESCAPE_TOOL).unwrap();
    let built = build(&project, &[]);
    assert!(built.contains("tool plugin `py-words`"), "{built}");
    assert!(built.contains("tools: count_words, escape"), "{built}");
    let dist = project.join("dist");

    // A root with a granted folder, a read-only one and a secret beside them.
    let root = dir.path().join("root");
    write_files(
        &root,
        &[
            ("notes/a.txt", "alpha beta\ngamma\n".to_string()),
            ("docs/readme.md", "read only".to_string()),
            ("docs/linked.md", "read only too".to_string()),
            ("secret.txt", "the secret".to_string()),
        ],
    );
    // Planted in the writable folder: a second name for a read-only file.
    std::fs::hard_link(root.join("docs/linked.md"), root.join("notes/hard.md")).unwrap();
    let grants = ["--write", "notes", "--read", "docs"];
    let out = tool_call(
        &dist,
        "py-words:count_words",
        &root,
        &grants,
        json!({"path": "notes/a.txt"}),
    );
    assert_eq!(answer(&out), json!({"words": 3, "lines": 2}));
    let before = support::tree_digest(&root);

    let escape = |args: Value| tool_call(&dist, "py-words:escape", &root, &grants, args);
    for path in ["secret.txt", "/secret.txt", "notes/../secret.txt"] {
        refused(
            &escape(json!({"action": "read", "path": path})),
            "denied: `",
        );
    }
    refused(
        &escape(json!({"action": "write", "path": "docs/readme.md"})),
        "denied: `docs/readme.md` is in a read-only folder",
    );
    refused(
        &escape(json!({"action": "write", "path": "notes/hard.md"})),
        "denied: `notes/hard.md` has other hard links, so it cannot be written in place",
    );
    refused(
        &escape(json!({"action": "write", "path": "planted.txt"})),
        "denied: `planted.txt` is outside the folders granted to this call",
    );
    refused(
        &escape(json!({"action": "write", "path": "notes/../planted.txt"})),
        "denied: `notes/../planted.txt` is outside the folders granted to this call",
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    refused(
        &escape(json!({"action": "connect", "port": port})),
        "py-words:escape: failed:",
    );
    assert!(
        listener.accept().is_err(),
        "the plugin reached a socket on this machine"
    );
    assert_eq!(support::tree_digest(&root), before);
}

#[test]
fn an_error_in_plugin_py_fails_the_build_with_its_traceback_and_leaves_no_component() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("broken");
    new_python_tool(&project);
    let plugin = project.join("plugin.py");
    let source = std::fs::read_to_string(&plugin).unwrap();
    std::fs::write(&plugin, source + "\nraise RuntimeError('no config here')\n").unwrap();
    let out = trellis(&["plugin", "build", path_str(&project)]);
    refused(&out, "componentize-py could not build");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("plugin.py") && stderr.contains("RuntimeError: no config here"),
        "{stderr}"
    );
    let dist = project.join("dist");
    let left: Vec<_> = std::fs::read_dir(&dist)
        .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

/// What a project's `plugin.json` says (its version, its component's name) is printed by
/// `plugin build` with its control characters escaped, as `plugins list` prints them.
#[test]
fn plugin_build_prints_the_projects_text_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("shouty");
    new_python_tool(&project);
    let manifest = project.join("plugin.json");
    let mut json: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    json["version"] = Value::String("0.1.0\u{1b}[31m".into());
    std::fs::write(&manifest, json.to_string()).unwrap();
    let built = build(&project, &[]);
    assert!(built.contains("0.1.0\\x1b[31m"), "{built}");
    assert!(
        !built.contains('\u{1b}'),
        "an escape reached the terminal: {built:?}"
    );
}

#[test]
fn a_componentize_py_that_is_not_the_pinned_release_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("pinned");
    new_python_tool(&project);
    // `python3 --version` answers, but not as componentize-py 0.25.1.
    let mut command = for_builds(support::trellis_command(&[
        "plugin",
        "build",
        path_str(&project),
    ]));
    command.env("TRELLIS_COMPONENTIZE_PY", "python3");
    let out = bounded(command);
    refused(
        &out,
        "TRELLIS_COMPONENTIZE_PY=python3: expected a command answering `componentize-py 0.25.1` to --version",
    );
    assert!(!project.join("dist").exists());
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/plugins/csv-stats")
}

const SALES: &str = "region,amount,note\nemea,10,ok\nus,30,\nemea,20,late\n";

#[test]
fn the_csv_stats_example_answers_tool_calls_and_an_agent_in_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let dist = dir.path().join("dist");
    let source_before = support::tree_digest(&example());
    // Its own tests, with CPython and the module of plugins/sdk-python.
    let mut test = Command::new("python3");
    test.args(["-m", "unittest", "-v"])
        .current_dir(example())
        .env(
            "PYTHONPATH",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins/sdk-python"),
        )
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let out = bounded(test);
    assert!(
        out.status.success() && text(&out.stderr).contains("Ran 3 tests"),
        "{}",
        all_output(&out)
    );
    let built = build(&example(), &["--out", path_str(&dist)]);
    assert!(built.contains("tools: csv_stats, write_stats"), "{built}");
    // Built from a copy: the example folder gains no dist/ or __pycache__/.
    assert_eq!(support::tree_digest(&example()), source_before);

    // Through `trellis tool call`.
    let root = dir.path().join("root");
    write_files(
        &root,
        &[
            ("knowledgebase/sales.csv", SALES.to_string()),
            ("private/salaries.csv", "name,pay\nann,1\n".to_string()),
        ],
    );
    std::fs::create_dir_all(root.join("out")).unwrap();
    let grants = ["--read", "knowledgebase", "--write", "out"];
    let stats = answer(&tool_call(
        &dist,
        "csv-stats:csv_stats",
        &root,
        &grants,
        json!({"path": "knowledgebase/sales.csv", "columns": ["amount"]}),
    ));
    assert_eq!(
        stats,
        json!({"rows": 3, "columns": {"amount": {"filled": 3, "min": 10.0, "max": 30.0, "mean": 20.0}}})
    );
    let written = answer(&tool_call(
        &dist,
        "csv-stats:write_stats",
        &root,
        &grants,
        json!({"path": "knowledgebase/sales.csv", "out": "out/sales.json"}),
    ));
    assert_eq!(written, json!({"written": "out/sales.json", "rows": 3}));
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("out/sales.json")).unwrap())
            .unwrap();
    assert_eq!(
        report["columns"]["region"],
        json!({"filled": 3, "distinct": 2})
    );
    // The schema is the host's to check; the tool's own errors reach the caller by kind.
    refused(
        &tool_call(
            &dist,
            "csv-stats:csv_stats",
            &root,
            &grants,
            json!({"path": "knowledgebase/sales.csv", "columns": ["price"]}),
        ),
        "invalid arguments: columns: no column 'price'",
    );

    // Outside its grants, it is refused and nothing changes.
    let before = support::tree_digest(&root);
    for (tool, args, expected) in [
        (
            "csv_stats",
            json!({"path": "private/salaries.csv"}),
            "denied: `private/salaries.csv` is outside the folders granted to this call",
        ),
        (
            "csv_stats",
            json!({"path": "knowledgebase/../private/salaries.csv"}),
            "denied: `knowledgebase/../private/salaries.csv` is outside the folders granted",
        ),
        (
            "write_stats",
            json!({"path": "knowledgebase/sales.csv", "out": "knowledgebase/planted.json"}),
            "denied: `knowledgebase/planted.json` is in a read-only folder",
        ),
        (
            "write_stats",
            json!({"path": "knowledgebase/sales.csv", "out": "private/planted.json"}),
            "denied: `private",
        ),
    ] {
        refused(
            &tool_call(&dist, &format!("csv-stats:{tool}"), &root, &grants, args),
            expected,
        );
    }
    assert_eq!(support::tree_digest(&root), before);

    // An agent in a run calls it: once on the knowledgebase, once on the plan it may not see.
    let server = FakeServer::start(Box::new(|body| {
        let answered = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "tool");
        if answered {
            (200, completion("The sales average 20.", &[]))
        } else {
            (
                200,
                completion(
                    "",
                    &[
                        (
                            "csv-stats__csv_stats",
                            json!({"path": "knowledgebase/sales.csv"}),
                        ),
                        (
                            "csv-stats__csv_stats",
                            json!({"path": "planning/plan.json"}),
                        ),
                    ],
                ),
            )
        }
    }));
    let ws = dir.path().join("ws");
    write_files(
        &ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "t", "steps": [
                    {"id": "report", "type": "regular", "title": "Report",
                     "description": "Summarize knowledgebase/sales.csv."}]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": server.providers()})
                .to_string(),
            ),
            ("knowledgebase/sales.csv", SALES.to_string()),
        ],
    );
    let kept = |ws: &Path| {
        let mut digest = support::tree_digest(&ws.join("knowledgebase"));
        digest.extend(support::tree_digest(&ws.join("planning")));
        digest
    };
    let before = kept(&ws);
    let out = trellis(&[
        "run",
        path_str(&ws),
        "--plugins",
        path_str(&dist),
        "--allow-host",
        &server.allow_host(),
    ]);
    assert!(out.status.success(), "{}", all_output(&out));
    let offered: Vec<String> = server.seen()[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        offered.contains(&"csv-stats__write_stats".to_string()),
        "{offered:?}"
    );
    let results = server.last_tool_results();
    assert_eq!(results.len(), 2, "{results:?}");
    let stats: Value = serde_json::from_str(&results[0].1)
        .unwrap_or_else(|_| panic!("a JSON result: {}", results[0].1));
    assert_eq!(stats["rows"], 3, "{stats}");
    assert_eq!(stats["columns"]["amount"]["mean"], 20.0, "{stats}");
    assert!(
        results[1]
            .1
            .contains("outside the folders granted to this call"),
        "{}",
        results[1].1
    );
    assert_eq!(kept(&ws), before);
}

// ------------------------------------------------------------- plugin build, hostile projects

/// A tool manifest whose component is `<id>.wasm`.
fn tool_manifest(id: &str) -> String {
    json!({
        "id": id, "kind": "tool", "version": "0.1.0", "description": "a planted project",
        "component": format!("{id}.wasm"),
    })
    .to_string()
}

/// Writes the executable shell script `name` in `dir` and returns its path.
fn shell_script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// `trellis plugin build PROJECT` with `env` set.
fn build_with(project: &Path, env: &[(&str, &Path)]) -> std::process::Output {
    let mut command = for_builds(support::trellis_command(&[
        "plugin",
        "build",
        path_str(project),
    ]));
    for (name, value) in env {
        command.env(name, value);
    }
    bounded(command)
}

/// A Python project with a link among its modules, to a file elsewhere on the machine: the
/// build refuses it, naming it, before anything is staged. Without it the build stages the
/// project in a folder only its user can enter, which is gone afterwards. (componentize-py is
/// a stand-in that records what it was given and answers with a test component.)
#[test]
fn a_python_build_reads_no_linked_source_and_stages_in_a_private_folder() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("hostile");
    write_files(
        &project,
        &[
            ("plugin.json", tool_manifest("hostile")),
            ("plugin.py", "VALUE = 1\n".to_string()),
        ],
    );
    let secret = dir.path().join("secret.py");
    std::fs::write(&secret, "SECRET = 'the secret'\n").unwrap();
    std::os::unix::fs::symlink(&secret, project.join("secrets.py")).unwrap();
    let record = dir.path().join("record.txt");
    let component = trellis_test_programs::path("adversary");
    let tool = shell_script(
        dir.path(),
        "componentize-py",
        &format!(
            r#"if [ "$1" = "--version" ]; then echo "componentize-py {version}"; exit 0; fi
while [ $# -gt 0 ]; do
  case "$1" in
    -p) app="$2"; shift ;;
    -o) out="$2"; shift ;;
  esac
  shift
done
staging=$(dirname "$app")
stat -c '%a %n' "$staging" > '{record}'
LC_ALL=C ls "$app" >> '{record}'
cp '{component}' "$out"
"#,
            version = trellis_sandbox::script::COMPONENTIZE_PY_VERSION,
            record = record.display(),
            component = component.display(),
        ),
    );
    let env = [("TRELLIS_COMPONENTIZE_PY", tool.as_path())];

    let out = build_with(&project, &env);
    refused(
        &out,
        "secrets.py is a symbolic link; Trellis does not read or write through links",
    );
    assert!(!record.exists(), "nothing was staged");
    assert!(!project.join("dist").exists());

    std::fs::remove_file(project.join("secrets.py")).unwrap();
    let out = build_with(&project, &env);
    assert!(out.status.success(), "{}", all_output(&out));
    let recorded = std::fs::read_to_string(&record).unwrap();
    let (first, staged) = recorded.split_once('\n').unwrap();
    let (mode, staging) = first.split_once(' ').unwrap();
    assert_eq!(mode, "700", "{recorded}");
    let name = Path::new(staging).file_name().unwrap().to_string_lossy();
    assert!(name.starts_with("trellis-plugin-build-"), "{staging}");
    assert!(
        !Path::new(staging).exists(),
        "the staging folder is removed"
    );
    assert_eq!(
        staged.lines().collect::<Vec<_>>(),
        ["plugin.py", "trellis_plugin.py", "trellis_plugin_app.py"]
    );
    assert_eq!(
        std::fs::read(project.join("dist/hostile.wasm")).unwrap(),
        std::fs::read(&component).unwrap()
    );
}

/// A Python build copied every module into its staging folder, with no bound on the total:
/// 30 sparse modules of 67 MB (nothing on disk in the project) wrote 2 GB to /tmp, and
/// 20,000 modules were all copied (round 26, MEDIUM). The copy stops at 64 MiB together
/// (the largest component a plugin folder may hold) and 10,000 modules, before
/// componentize-py is run. (componentize-py is a stand-in that records that it ran.)
#[test]
fn a_python_build_stages_a_bounded_amount() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("record.txt");
    let tool = shell_script(
        dir.path(),
        "componentize-py",
        &format!(
            r#"if [ "$1" = "--version" ]; then echo "componentize-py {version}"; exit 0; fi
echo ran > '{record}'
exit 3
"#,
            version = trellis_sandbox::script::COMPONENTIZE_PY_VERSION,
            record = record.display(),
        ),
    );
    let env = [("TRELLIS_COMPONENTIZE_PY", tool.as_path())];
    let project = |name: &str| {
        let project = dir.path().join(name);
        write_files(
            &project,
            &[
                ("plugin.json", tool_manifest(name)),
                ("plugin.py", "VALUE = 1\n".to_string()),
            ],
        );
        project
    };
    let sparse = project("sparse");
    for i in 0..30 {
        let file = std::fs::File::create(sparse.join(format!("m{i}.py"))).unwrap();
        file.set_len(67_000_000).unwrap();
    }
    let out = build_with(&sparse, &env);
    refused(
        &out,
        "more than the 67108864 bytes a plugin build copies together",
    );
    let many = project("many");
    for i in 0..10_001 {
        std::fs::write(many.join(format!("m{i}.py")), "").unwrap();
    }
    let out = build_with(&many, &env);
    refused(&out, "more than the 10000 a plugin build copies");
    assert!(!record.exists(), "componentize-py was run");
}

/// Links planted in `dist/` to files outside the project: a symbolic link at the component
/// is refused, naming it; hard links at the component and at plugin.json are replaced by
/// the build, never written through. A project whose plugin.json is a link is refused. (cargo
/// is a stand-in that reports a test component as what it built.)
#[test]
fn a_build_replaces_links_planted_in_dist_and_reads_no_linked_manifest() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("planted");
    let outside = dir.path().join("outside");
    write_files(
        &project,
        &[
            ("plugin.json", tool_manifest("planted")),
            ("Cargo.toml", "[package]\nname = \"planted\"\n".to_string()),
        ],
    );
    write_files(
        &outside,
        &[
            ("victim.wasm", "precious bytes".to_string()),
            ("manifest.json", tool_manifest("planted")),
        ],
    );
    let dist = project.join("dist");
    std::fs::create_dir(&dist).unwrap();
    std::os::unix::fs::symlink(outside.join("victim.wasm"), dist.join("planted.wasm")).unwrap();
    let before = support::tree_digest(&outside);
    let component = trellis_test_programs::path("adversary");
    let artifact = json!({
        "reason": "compiler-artifact",
        "target": {"kind": ["cdylib"]},
        "filenames": [component],
    });
    let cargo = shell_script(dir.path(), "cargo", &format!("echo '{artifact}'\n"));
    let env = [("CARGO", cargo.as_path())];

    let out = build_with(&project, &env);
    refused(
        &out,
        "dist/planted.wasm is a symbolic link; Trellis does not read or write through links",
    );
    assert_eq!(support::tree_digest(&outside), before);

    std::fs::remove_file(dist.join("planted.wasm")).unwrap();
    std::fs::hard_link(outside.join("victim.wasm"), dist.join("planted.wasm")).unwrap();
    std::fs::hard_link(outside.join("manifest.json"), dist.join("plugin.json")).unwrap();
    let out = build_with(&project, &env);
    assert!(out.status.success(), "{}", all_output(&out));
    assert_eq!(support::tree_digest(&outside), before);
    for name in ["planted.wasm", "plugin.json"] {
        let meta = std::fs::symlink_metadata(dist.join(name)).unwrap();
        assert!(meta.is_file() && meta.nlink() == 1, "{name}");
    }
    assert_eq!(
        std::fs::read(dist.join("planted.wasm")).unwrap(),
        std::fs::read(&component).unwrap()
    );

    std::fs::remove_file(project.join("plugin.json")).unwrap();
    std::os::unix::fs::symlink(outside.join("manifest.json"), project.join("plugin.json")).unwrap();
    let out = build_with(&project, &env);
    refused(
        &out,
        "plugin.json is a symbolic link; Trellis does not read or write through links",
    );
    assert_eq!(support::tree_digest(&outside), before);
}

/// `plugin build` ran a Python plugin's top-level code (imported at build time) with no
/// deadline and no memory cap: a loop built forever, and 3.5 GiB allocated took 4 GB of the
/// machine (round 12, MEDIUM). The build stops at `--timeout` and at 2 GiB, saying which.
#[test]
fn plugin_build_stops_top_level_code_at_its_deadline_and_memory_cap() {
    let dir = tempfile::tempdir().unwrap();
    for (name, code, args, expected) in [
        (
            "spins",
            "\nwhile True:\n    pass\n",
            vec!["--timeout", "5"],
            "componentize-py did not finish within 5 s and was stopped: plugin.py is imported \
             at build time",
        ),
        (
            "hoards",
            "\nHOARD = [bytearray(256 << 20) for _ in range(10)]\n",
            vec![],
            "MemoryError",
        ),
    ] {
        let project = dir.path().join(name);
        new_python_tool(&project);
        let plugin = project.join("plugin.py");
        let source = std::fs::read_to_string(&plugin).unwrap();
        std::fs::write(&plugin, source + code).unwrap();
        let mut command = vec!["plugin", "build", path_str(&project)];
        command.extend(args);
        let out = trellis(&command);
        refused(&out, expected);
        assert!(!project.join("dist").join(format!("{name}.wasm")).exists());
    }
}
