//! The sandboxed shell against the same commands run natively, per call, side by side.
//!
//! - **trellis**: `PluginRegistry::call_tool("shell:execute_shell_command")` with a
//!   read-only grant of the data folder: a fresh shell instance interprets the script, and
//!   each command that is not a builtin is a fresh instance of the bundled utilities.
//! - **native**: `bash -c SCRIPT` in the same folder, a process per call, with the system's
//!   coreutils, grep and jq.
//!
//! Scripts: `ls | wc -l` over 1,000 files, `grep -rn` over the same 1,000 files, a `jq`
//! filter over a 1 MB file, and two for the floor: `true` (a builtin: the shell instance
//! alone) and `basename x` (one command: one more instance). Both sides must print the same
//! (grep's lines compared sorted: GNU grep walks a folder in directory order). Besides
//! criterion's report, prints p50/p99 of each from an interleaved sample, their ratios, and
//! the sizes of the two components. `BENCHMARKS.md` records these figures. Under
//! `cargo test --benches` (quick mode) the samples are a few rounds: the checks run, the
//! figures mean nothing.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use criterion::{Criterion, criterion_group};
use serde_json::{Value, json};
use trellis_sandbox::{CacheSetting, Engine, Grant, Limits, PluginRegistry};

const CASES: &[(&str, &str)] = &[
    ("true", "true"),
    ("basename", "basename /data/x.txt"),
    ("ls_wc", "ls /data/files | wc -l"),
    ("grep_rn", "cd /data && grep -rn needle files"),
    (
        "jq",
        "cd /data && jq '[.items[] | select(.n % 7 == 0) | .name] | length' big.json",
    ),
];

/// 1,000 small files (one in ten holds `needle`) and a JSON file of about 1 MB.
fn data(root: &Path) {
    let files = root.join("files");
    std::fs::create_dir_all(&files).unwrap();
    for i in 0..1000 {
        let mut text = format!("file {i}\nsome text on line two\n");
        if i % 10 == 0 {
            text.push_str(&format!("the needle of file {i}\n"));
        }
        text.push_str("last line\n");
        std::fs::write(files.join(format!("f{i:04}.txt")), text).unwrap();
    }
    let items: Vec<Value> = (0..12_000)
        .map(|n| json!({"n": n, "name": format!("item-{n}"), "tags": ["a", "b", "c"], "score": n as f64 / 3.0}))
        .collect();
    std::fs::write(root.join("big.json"), json!({ "items": items }).to_string()).unwrap();
}

fn native(root: &Path, script: &str) -> String {
    // The guest sees the folder at `/data`; natively it is `root`.
    let script = script.replace("/data", &root.display().to_string());
    let out = Command::new("bash")
        .args(["-c", &script])
        .current_dir(root)
        .output()
        .expect("bash runs");
    String::from_utf8(out.stdout).unwrap()
}

fn sorted(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    lines
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn shell(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    data(&root);
    let engine = Engine::new(CacheSetting::Dir(support::component_cache())).unwrap();
    let registry = runtime
        .block_on(PluginRegistry::with_bundled(&engine))
        .unwrap();
    let grant = Grant::none().read(&root, "/data").unwrap();
    let limits = Limits::default();
    let trellis = |script: &str| -> String {
        let args = json!({ "command": script });
        let result = runtime
            .block_on(registry.call_tool("shell:execute_shell_command", &args, &grant, &limits))
            .unwrap();
        assert_eq!(result["exit_code"], 0, "{script}: {result}");
        result["stdout"].as_str().unwrap().to_string()
    };
    let has_jq = Command::new("jq").arg("--version").output().is_ok();

    // The same answer on both sides, or the comparison means nothing.
    let mut cases = Vec::new();
    for &(name, script) in CASES {
        if name == "jq" && !has_jq {
            println!("jq is not installed: the jq case is left out");
            continue;
        }
        let (inside, outside) = (trellis(script), native(&root, script));
        assert_eq!(sorted(&inside), sorted(&outside), "{name}");
        cases.push((name, script));
    }
    assert_eq!(trellis("ls /data/files | wc -l").trim(), "1000");

    let mut group = c.benchmark_group("shell");
    group.sample_size(10);
    for &(name, script) in &cases {
        group.bench_function(format!("trellis_{name}"), |b| b.iter(|| trellis(script)));
        group.bench_function(format!("native_{name}"), |b| {
            b.iter(|| native(&root, script))
        });
    }
    group.finish();

    // Interleaved samples for percentiles: drift in machine load hits both alike.
    let samples = support::rounds(200, 2);
    println!("\nshell: p50 / p99 of {samples} interleaved calls of each");
    for &(name, script) in &cases {
        let [inside, outside] = support::interleaved(
            samples,
            [
                &mut || {
                    trellis(script);
                },
                &mut || {
                    native(&root, script);
                },
            ],
        );
        let ((p50, p99), (n50, n99)) = (support::p50_p99(&inside), support::p50_p99(&outside));
        println!(
            "  {name:<9} trellis {:>9.0} us / {:>9.0} us   native {:>9.0} us / {:>9.0} us   ratio p50 {:.2}",
            micros(p50),
            micros(p99),
            micros(n50),
            micros(n99),
            p50.as_secs_f64() / n50.as_secs_f64()
        );
    }
    let shell = trellis_sandbox::bundled::PLUGINS
        .iter()
        .find(|p| p.id == "shell")
        .unwrap();
    println!(
        "  components: shell {} bytes, utilities {} bytes",
        shell.component.len(),
        trellis_sandbox::bundled::SHELL_UTILITIES.len()
    );
}

criterion_group!(benches, shell);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
