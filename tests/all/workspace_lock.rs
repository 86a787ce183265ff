//! One process per workspace: `trellis run` holds an OS lock on the workspace folder while
//! it runs. A second run is refused at once naming the holder (or waits with `--wait`), a
//! killed run leaves no lock behind, and its `running` session shows as `interrupted`.

use crate::run_cli::agent_workspace;
use crate::support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use support::fake_llm::{FakeServer, completion};
use support::{tree_digest, trellis, trellis_command};

use crate::support::plugin_build::text;

/// A server whose answers ("done", no tool call) are held back until `release` is set.
fn held_server() -> (FakeServer, Arc<AtomicBool>) {
    let release = Arc::new(AtomicBool::new(false));
    let held = release.clone();
    let server = FakeServer::start(Box::new(move |_| {
        let waited = Instant::now();
        while !held.load(Ordering::SeqCst) && waited.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(20));
        }
        (200, completion("done", &[]))
    }));
    (server, release)
}

/// A one-step agent workspace (`only`) on `server`.
fn workspace(root: &Path, server: &FakeServer) {
    agent_workspace(
        root,
        &[("only", "Say done.")],
        json!([]),
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": server.providers()}),
    );
}

/// Starts `trellis run ROOT EXTRA...`, its output piped.
fn spawn_run(root: &Path, extra: &[&str]) -> Child {
    let mut args = vec!["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"];
    args.extend_from_slice(extra);
    trellis_command(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until the server has seen `n` requests.
fn wait_for_requests(server: &FakeServer, n: usize) {
    let waited = Instant::now();
    while server.seen().len() < n {
        assert!(
            waited.elapsed() < Duration::from_secs(120),
            "the run never reached the model"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The tree digest of `root` once the held run has written its session (it writes
/// `session.json` around its LLM call): two looks in a row alike, with the session there.
fn settled_tree(root: &Path) -> std::collections::BTreeMap<String, String> {
    let session = "runs/iteration-0/execution/only/session.json";
    let waited = Instant::now();
    let mut last = tree_digest(root);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = tree_digest(root);
        if now == last && now.contains_key(session) {
            return now;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(120),
            "the held run never settled: {now:?}"
        );
        last = now;
    }
}

#[test]
fn a_second_run_is_refused_at_once_naming_the_holder_and_changes_nothing() {
    let (server, release) = held_server();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, &server);
    let first = spawn_run(&ws, &[]);
    wait_for_requests(&server, 1);

    let before = settled_tree(&ws);
    let second = trellis(&["run", ws.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let stderr = text(&second.stderr);
    assert!(!second.status.success(), "{}", text(&second.stdout));
    assert!(stderr.contains("is in use by"), "{stderr}");
    assert!(
        stderr.contains(&format!("pid {}", first.id())),
        "names the holder's pid {}: {stderr}",
        first.id()
    );
    assert!(stderr.contains("running `"), "{stderr}");
    assert!(stderr.contains("--wait"), "{stderr}");
    assert_eq!(tree_digest(&ws), before, "the refused run changed nothing");
    assert_eq!(server.seen().len(), 1, "the refused run reached no model");

    release.store(true, Ordering::SeqCst);
    let out = first.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    // Free again once the first run ended.
    let again = trellis(&["run", ws.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
}

#[test]
fn with_wait_a_second_run_waits_for_the_first_then_runs() {
    let (server, release) = held_server();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, &server);
    let first = spawn_run(&ws, &[]);
    wait_for_requests(&server, 1);

    let mut second = spawn_run(&ws, &["--wait"]);
    let mut stderr = BufReader::new(second.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(line.contains("waiting for workspace"), "{line}");
    assert!(line.contains(&format!("pid {}", first.id())), "{line}");
    // Still waiting while the first holds the workspace: no second request came.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(server.seen().len(), 1, "the waiting run started early");
    assert!(second.try_wait().unwrap().is_none(), "still waiting");

    release.store(true, Ordering::SeqCst);
    let out = first.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = second.wait_with_output().unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("done: 1 turn"), "{stdout}");
    assert_eq!(server.seen().len(), 2);
}

#[test]
fn a_killed_run_leaves_no_lock_and_its_step_shows_interrupted() {
    let (server, release) = held_server();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, &server);
    let mut first = spawn_run(&ws, &[]);
    wait_for_requests(&server, 1);
    settled_tree(&ws);
    let session = ws.join("runs/iteration-0/execution/only/session.json");
    assert_eq!(support::workspace::read_json(&session)["status"], "running");
    // SAFETY: kill(2) on the child's pid, which is ours and still running (it is waiting
    // for the held answer).
    assert_eq!(unsafe { libc::kill(first.id() as i32, libc::SIGKILL) }, 0);
    first.wait().unwrap();
    release.store(true, Ordering::SeqCst);

    // session.json still says running; nobody holds the workspace, so it was interrupted.
    assert_eq!(support::workspace::read_json(&session)["status"], "running");
    let list = trellis(&["runs", "list", ws.to_str().unwrap()]);
    let listed = text(&list.stdout);
    assert!(list.status.success(), "{}", text(&list.stderr));
    assert!(listed.contains("only interrupted"), "{listed}");
    let show = trellis(&["runs", "show", ws.to_str().unwrap(), "only"]);
    let shown = text(&show.stdout);
    assert!(shown.contains("status: interrupted"), "{shown}");

    // The OS dropped the lock: the next run takes it and completes.
    let next = trellis(&["run", ws.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let stdout = text(&next.stdout);
    assert!(next.status.success(), "{stdout}\n{}", text(&next.stderr));
    assert!(
        stdout.contains("step only in runs/iteration-0 was interrupted (its process is gone)"),
        "{stdout}"
    );
    let list = trellis(&["runs", "list", ws.to_str().unwrap()]);
    let listed = text(&list.stdout);
    assert!(listed.contains("only completed"), "{listed}");
    assert!(
        listed.contains("only interrupted"),
        "the rotated run: {listed}"
    );
    // Said once: the run after that finds nothing interrupted in iteration-0.
    let after = trellis(&["run", ws.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let stdout = text(&after.stdout);
    assert!(after.status.success(), "{stdout}");
    assert!(!stdout.contains("was interrupted"), "{stdout}");
}
