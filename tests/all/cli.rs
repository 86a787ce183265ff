//! The `trellis` binary as a user runs it.

use crate::support;

use std::path::PathBuf;

use support::trellis_in;

use crate::support::plugin_build::text;

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/ticket-triage")
}

#[test]
fn plugins_list_shows_the_bundled_workspace_plugin() {
    let out = trellis_in(&["plugins", "list"], &example());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("workspace ") && l.contains("tool")),
        "{stdout}"
    );

    let out = trellis_in(&["plugins", "list", "--json"], &example());
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let workspace = list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "workspace")
        .unwrap();
    assert_eq!(workspace["kind"], "tool");
    assert_eq!(workspace["tools"].as_array().unwrap().len(), 7, "{list}");
    let csv = list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "csv")
        .unwrap();
    assert_eq!(csv["kind"], "validator");
}

#[test]
fn plugins_inspect_prints_every_tool_with_its_schema() {
    let out = trellis_in(&["plugins", "inspect", "workspace", "--json"], &example());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = value["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for tool in [
        "read_file",
        "write_file",
        "list_dir",
        "search",
        "apply_patch",
        "delete_file",
        "move_file",
    ] {
        assert!(
            names.contains(&format!("workspace:{tool}").as_str()),
            "{names:?}"
        );
    }
    for tool in value["tools"].as_array().unwrap() {
        assert_eq!(tool["input_schema"]["type"], "object", "{tool}");
    }

    let out = trellis_in(&["plugins", "inspect", "nope"], &example());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no plugin `nope` (loaded: anthropic, csv, "),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn tool_call_prints_the_result_and_fails_with_the_error_on_stderr() {
    let out = trellis_in(
        &[
            "tool",
            "call",
            "workspace:read_file",
            "--read",
            "knowledgebase",
            "--args",
            r#"{"path": "knowledgebase/notes/escalation.md"}"#,
        ],
        &example(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(value["content"].as_str().unwrap().contains("P1"), "{value}");

    // Without a grant for it, the same file does not exist for the plugin.
    let out = trellis_in(
        &[
            "tool",
            "call",
            "workspace:read_file",
            "--args",
            r#"{"path": "knowledgebase/notes/escalation.md"}"#,
        ],
        &example(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(
        text(&out.stderr).contains("workspace:read_file: denied"),
        "{}",
        text(&out.stderr)
    );
}

/// The attack on the compile cache: a cache folder other users can write, holding
/// whatever they put there. Trellis says so, compiles in memory, and neither reads
/// nor writes the folder; the call works.
#[test]
fn a_cache_folder_others_can_write_is_refused_and_left_untouched() {
    use std::os::unix::fs::PermissionsExt;
    let cache = tempfile::tempdir().unwrap();
    std::fs::write(cache.path().join("planted.cwasm"), b"someone else's code").unwrap();
    std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let before = support::tree_digest(cache.path());
    let out = support::trellis_command(&[
        "tool",
        "call",
        "workspace:read_file",
        "--read",
        "knowledgebase",
        "--args",
        r#"{"path": "knowledgebase/notes/escalation.md"}"#,
    ])
    .current_dir(example())
    .env("TRELLIS_CACHE_DIR", cache.path())
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(value["content"].as_str().unwrap().contains("P1"), "{value}");
    let stderr = text(&out.stderr);
    let refusal = format!(
        "component cache: refusing folder {}: it is writable by group or others (mode 777); compiling components in memory, the cache left untouched",
        cache.path().display()
    );
    assert_eq!(stderr.matches(&refusal).count(), 1, "{stderr}");
    assert_eq!(support::tree_digest(cache.path()), before);
}

#[test]
fn tool_call_writes_only_into_write_grants() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("out")).unwrap();
    std::fs::create_dir_all(dir.path().join("in")).unwrap();
    let args = r#"{"path": "out/x.txt", "content": "hello"}"#;
    let out = trellis_in(
        &[
            "tool",
            "call",
            "workspace:write_file",
            "--read",
            "out",
            "--args",
            args,
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(!dir.path().join("out/x.txt").exists());
    let out = trellis_in(
        &[
            "tool",
            "call",
            "workspace:write_file",
            "--write",
            "out",
            "--args",
            args,
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out/x.txt")).unwrap(),
        "hello"
    );
}

#[test]
fn bad_command_lines_get_clear_errors() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["tool", "call", "workspace:read_file", "--args", "{oops"],
            "--args: expected a JSON object",
        ),
        (
            &["tool", "call", "workspace:read_file", "--args", "[1]"],
            "--args: expected a JSON object, found an array",
        ),
        (
            &["tool", "call", "workspace:read_file", "--read", "../"],
            "--read ../: \"../\" must not contain `..`",
        ),
        (
            &["tool", "call", "workspace:read_file", "--read", "missing"],
            "--read missing",
        ),
        (
            &["plugins", "list", "--plugins", "no-such-dir"],
            "reading plugin folder no-such-dir",
        ),
    ];
    for (args, expected) in cases {
        let out = trellis_in(args, &example());
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(expected),
            "{args:?}: expected {expected:?} in {stderr}"
        );
    }
}

#[test]
fn help_explains_the_sandbox() {
    let out = trellis_in(&["tool", "call", "--help"], &example());
    assert!(out.status.success());
    let help = text(&out.stdout);
    assert!(
        help.contains("only the folders given with --read and\n--write exist"),
        "{help}"
    );
    assert!(help.contains("--read <DIR>"), "{help}");
}

#[test]
fn a_cache_folder_inside_the_workspace_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("planning")).unwrap();
    let cache = ws.join("runs/cache");
    let out = support::trellis(&[
        "run",
        "--cache-dir",
        cache.to_str().unwrap(),
        ws.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "the compile cache folder {} is inside the workspace",
            cache.display()
        )),
        "{stderr}"
    );
    assert!(
        !ws.join("runs").exists(),
        "nothing was created in the workspace"
    );
}
