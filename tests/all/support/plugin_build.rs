//! `trellis` as the plugin-authoring tests run it: plugin builds sharing one Rust target
//! folder under the test target folder (a rerun is incremental), offline, none of the outer
//! build's flags, each bounded to 15 minutes; and the scaffold, build, list and tool-call
//! steps that must succeed before what a test checks.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn all_output(out: &Output) -> String {
    format!("{}{}", text(&out.stdout), text(&out.stderr))
}

pub fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The target folder every Rust plugin build of the tests shares.
fn plugin_target() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("plugin-authoring")
}

/// `command` with the settings of a plugin build: the shared target folder, offline, none
/// of the outer build's flags.
pub fn for_builds(mut command: Command) -> Command {
    command
        .env("CARGO_TARGET_DIR", plugin_target())
        .env("CARGO_NET_OFFLINE", "true")
        .env_remove("RUSTFLAGS")
        .env_remove("VIRTUAL_ENV")
        .env_remove("PYTHONPATH");
    command
}

/// Runs `command` to its end; a build that runs past 15 minutes fails the test.
pub fn bounded(mut command: Command) -> Output {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts");
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = send.send(child.wait_with_output());
    });
    receive
        .recv_timeout(Duration::from_secs(900))
        .expect("the command ran past 15 minutes")
        .expect("the command ran")
}

/// `trellis ARGS` with the settings of a plugin build.
pub fn trellis(args: &[&str]) -> Output {
    bounded(for_builds(super::trellis_command(args)))
}

/// `trellis plugin new PROJECT --kind tool --lang python`, which must succeed.
pub fn new_python_tool(project: &Path) {
    let out = trellis(&[
        "plugin",
        "new",
        path_str(project),
        "--kind",
        "tool",
        "--lang",
        "python",
    ]);
    assert!(out.status.success(), "{}", all_output(&out));
}

/// `trellis plugin build DIR` (into DIR/dist), which must succeed.
pub fn build(dir: &Path, extra: &[&str]) -> String {
    let mut args = vec!["plugin", "build", path_str(dir)];
    args.extend_from_slice(extra);
    let out = trellis(&args);
    let all = all_output(&out);
    assert!(
        out.status.success(),
        "plugin build {}: {all}",
        dir.display()
    );
    all
}

/// `trellis plugins list --plugins DIR --json`: the entry of `id`, which loaded.
pub fn listed(dist: &Path, id: &str) -> Value {
    let out = trellis(&["plugins", "list", "--plugins", path_str(dist), "--json"]);
    assert!(out.status.success(), "{}", all_output(&out));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let entry = list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == id)
        .unwrap_or_else(|| panic!("no plugin {id} in {list:#}"))
        .clone();
    assert!(
        !list
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.get("error").is_some()),
        "{list:#}"
    );
    entry
}

/// `trellis tool call NAME --plugins DIST --root ROOT grants... --args ARGS`.
pub fn tool_call(dist: &Path, name: &str, root: &Path, grants: &[&str], args: Value) -> Output {
    let args = args.to_string();
    let mut all = vec![
        "tool",
        "call",
        name,
        "--plugins",
        path_str(dist),
        "--root",
        path_str(root),
        "--args",
        &args,
    ];
    all.extend_from_slice(grants);
    trellis(&all)
}

/// The JSON answer of a call that succeeded.
pub fn answer(out: &Output) -> Value {
    assert!(out.status.success(), "{}", all_output(out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A refused call: exit status 1 and `expected` in its error.
pub fn refused(out: &Output, expected: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", all_output(out));
    assert!(stderr.contains(expected), "{expected:?} in {stderr}");
}
