//! A trivial step script (`import json`, write one file) run sandboxed by Trellis against
//! `python3 main.py` as a native subprocess, measured side by side in one run.
//!
//! - **trellis**: the full `ScriptRunner::run` path of a scripted step: the step's grant
//!   (spec section 6, folders resolved and created), a fresh instance of the pre-initialized
//!   Python runner with memory limit and epoch deadline, the script, and its three log
//!   files written atomically.
//! - **trellis, no logs**: the same without the log files (`write_logs: false`).
//! - **warm interpreter**: one `python3` process kept running, asked over a pipe to run
//!   `main.py` again (`runpy.run_path`): what the script itself costs natively, with no
//!   interpreter start-up at all.
//! - **python3, cold start**: `python3 main.py`, a process per run, with the same working
//!   directory and environment, the interpreter's real path (not a version-manager shim) so
//!   only Python itself is timed.
//! - **python3 -S, cold start**: `python3 -S main.py`, the same without the `site` module
//!   (no site-packages, no `.pth` files): the fastest a native interpreter starts.
//!
//! Besides criterion's report, prints p50/p99 of each from an interleaved sample and the
//! ratios. The headline is the ratio to the warm interpreter: the sandboxed runner's
//! interpreter started and imported at build time (a pre-initialized snapshot), so the like
//! for like native run is one whose interpreter has started too. The cold start (`python3
//! main.py`, CPython starting and importing at every run) is its own row, with its ratios
//! after. `BENCHMARKS.md` records these figures. Under `cargo test --benches` (quick mode)
//! the sample is a few runs: the equality checks run, the figures mean nothing.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use criterion::{Criterion, criterion_group};
use serde_json::json;
use trellis_runner::step_script::{self, ScriptOptions};
use trellis_sandbox::script::ScriptRunner;
use trellis_sandbox::{CacheSetting, Engine};
use trellis_workflow::Workspace;

const STEP: &str = "bench";

const SCRIPT: &str = r#"import json
import os

with open(os.path.join(os.environ["STEP_OUTPUT_DIR"], "out.json"), "w") as f:
    json.dump({"ok": True, "items": [1, 2, 3]}, f)
"#;

fn workspace(root: &Path) {
    let write = |rel: &str, text: &str| {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "planning/plan.json",
        &json!({"steps": [{"id": STEP, "type": "regular", "title": "Bench", "description": "d"}]})
            .to_string(),
    );
    write(&format!("code/{STEP}/main.py"), SCRIPT);
    std::fs::create_dir_all(root.join("runs/iteration-0/execution").join(STEP)).unwrap();
}

/// The interpreter `python3` runs, resolved once: a version manager's shim in front of it
/// would add its own start-up to every native run.
fn python() -> PathBuf {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 is needed for the native baseline");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn native(python: &Path, root: &Path, output_dir: &Path, no_site: bool) {
    let mut command = Command::new(python);
    if no_site {
        command.arg("-S");
    }
    let status = command
        .arg("main.py")
        .current_dir(root.join("code").join(STEP))
        .env_clear()
        .env("STEP_OUTPUT_DIR", output_dir)
        .env("STEP_EXECUTION_DIR", output_dir.parent().unwrap())
        .status()
        .unwrap();
    assert!(status.success());
}

/// A `python3` kept running that runs `main.py` each time it is asked to.
struct WarmPython {
    child: Child,
    answers: BufReader<std::process::ChildStdout>,
}

/// Runs `main.py` (in the working directory) once per line read, answering each with a line.
const WARM_LOOP: &str = "import runpy, sys\n\
for line in sys.stdin:\n    \
runpy.run_path('main.py', run_name='__main__')\n    \
sys.stdout.write('done\\n')\n    \
sys.stdout.flush()\n";

impl WarmPython {
    fn start(python: &Path, root: &Path, output_dir: &Path) -> WarmPython {
        let mut child = Command::new(python)
            .args(["-c", WARM_LOOP])
            .current_dir(root.join("code").join(STEP))
            .env_clear()
            .env("STEP_OUTPUT_DIR", output_dir)
            .env("STEP_EXECUTION_DIR", output_dir.parent().unwrap())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let answers = BufReader::new(child.stdout.take().unwrap());
        WarmPython { child, answers }
    }

    fn run(&mut self) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"run\n").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        self.answers.read_line(&mut line).unwrap();
        assert_eq!(line, "done\n");
    }
}

impl Drop for WarmPython {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn script(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    workspace(&root);
    let ws = Workspace::open(&root).unwrap();
    let output_dir = root.join("runs/iteration-0/execution").join(STEP);
    let out_file = output_dir.join("out.json");

    let engine = Engine::new(CacheSetting::Dir(support::component_cache())).unwrap();
    let runner = ScriptRunner::new(&engine).unwrap();
    // The runner is compiled (or read from the cache) once per process, not per run.
    runtime.block_on(runner.load_python()).unwrap();
    let with_logs = ScriptOptions::default();
    let no_logs = ScriptOptions {
        write_logs: false,
        ..ScriptOptions::default()
    };
    let sandboxed = |options: &ScriptOptions| {
        let outcome = runtime
            .block_on(step_script::run(&runner, &ws, STEP, options))
            .unwrap();
        assert!(outcome.succeeded(), "{:?}", outcome.error_message());
    };
    let python = python();

    // Same output from both, or the comparison means nothing.
    sandboxed(&with_logs);
    let from_trellis = std::fs::read_to_string(&out_file).unwrap();
    std::fs::remove_file(&out_file).unwrap();
    native(&python, &root, &output_dir, false);
    assert_eq!(std::fs::read_to_string(&out_file).unwrap(), from_trellis);
    std::fs::remove_file(&out_file).unwrap();
    let warm = std::cell::RefCell::new(WarmPython::start(&python, &root, &output_dir));
    warm.borrow_mut().run();
    assert_eq!(std::fs::read_to_string(&out_file).unwrap(), from_trellis);

    let mut group = c.benchmark_group("script");
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(10));
    group.bench_function("trellis", |b| b.iter(|| sandboxed(&with_logs)));
    group.bench_function("trellis_no_logs", |b| b.iter(|| sandboxed(&no_logs)));
    group.bench_function("warm_interpreter", |b| b.iter(|| warm.borrow_mut().run()));
    group.bench_function("python3_cold_start", |b| {
        b.iter(|| native(&python, &root, &output_dir, false))
    });
    group.bench_function("python3_no_site_cold_start", |b| {
        b.iter(|| native(&python, &root, &output_dir, true))
    });
    group.finish();

    // Interleaved sample for percentiles: drift in machine load hits all alike.
    let samples = support::rounds(300, 3);
    for _ in 0..support::rounds(20, 1) {
        sandboxed(&with_logs);
        native(&python, &root, &output_dir, false);
        warm.borrow_mut().run();
    }
    let times = support::interleaved(
        samples,
        [
            &mut || sandboxed(&with_logs),
            &mut || sandboxed(&no_logs),
            &mut || warm.borrow_mut().run(),
            &mut || native(&python, &root, &output_dir, false),
            &mut || native(&python, &root, &output_dir, true),
        ],
    );
    let p = |i: usize, q: f64| millis(support::percentile(&times[i], q));
    let names = [
        "trellis",
        "trellis, no logs",
        "warm interpreter",
        "python3, cold start",
        "python3 -S, cold start",
    ];
    let ratio = |i: usize, j: usize| {
        println!(
            "  {:<16} / {:<22} p50 {:>6.2}   p99 {:>6.2}",
            names[i],
            names[j],
            p(i, 0.5) / p(j, 0.5),
            p(i, 0.99) / p(j, 0.99)
        );
    };
    println!();
    println!(
        "script, {samples} interleaved runs each ({}):",
        python.display()
    );
    // The headline: against the native interpreter with its start-up done, as the sandboxed
    // runner's was at build time.
    ratio(0, 2);
    ratio(1, 2);
    for (i, name) in names.iter().enumerate() {
        println!(
            "  {name:<22} p50 {:>7.2} ms   p99 {:>7.2} ms",
            p(i, 0.5),
            p(i, 0.99)
        );
    }
    // A native process started per run: CPython's own start-up and imports in every run.
    for (i, j) in [(0, 3), (1, 3), (0, 4), (1, 4)] {
        ratio(i, j);
    }
}

criterion_group!(benches, script);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
