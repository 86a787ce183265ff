//! Measuring a workspace for its quota, as a run does when it begins, against GNU `du`.
//!
//! - **trellis**: `DbWriteBudget::disk_use`, the walk a run's start makes: every entry
//!   `statat` without following links, a file of several links counted once, folders held one
//!   at a time (no recursion, `..` checked on the way up).
//! - **du**: `du -s -B1 ROOT` (GNU coreutils), a process per measurement: the same bytes
//!   allocated, the same rule for hard links.
//!
//! Trees: 1,000 files in 10 folders (a workspace after a few runs), and 20,000 files in 200
//! folders (one after many). Both sides must give the same byte count. Besides criterion's
//! report, prints p50/p99 of each from an interleaved sample and their ratio.
//! `BENCHMARKS.md` records these figures.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use criterion::{Criterion, criterion_group};
use trellis_sandbox::capabilities::DbWriteBudget;

fn tree(root: &Path, folders: usize, files: usize) {
    for f in 0..folders {
        let dir = root.join(format!("runs/iteration-{f}/execution"));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..files / folders {
            std::fs::write(
                dir.join(format!("out-{i}.json")),
                vec![b'x'; 100 + i % 5000],
            )
            .unwrap();
        }
    }
}

fn du(root: &Path) -> u64 {
    let out = Command::new("du")
        .args(["-s", "-B1"])
        .arg(root)
        .output()
        .expect("du runs");
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn quota(c: &mut Criterion) {
    let cases = [("1k_files", 10, 1_000), ("20k_files", 200, 20_000)];
    let dirs: Vec<_> = cases
        .iter()
        .map(|&(name, folders, files)| {
            let dir = tempfile::tempdir().unwrap();
            tree(dir.path(), folders, files);
            // The same answer on both sides, or the comparison means nothing.
            assert_eq!(
                DbWriteBudget::disk_use(dir.path()).unwrap(),
                du(dir.path()),
                "{name}"
            );
            (name, dir)
        })
        .collect();
    let mut group = c.benchmark_group("workspace_quota");
    group.sample_size(10);
    for (name, dir) in &dirs {
        group.bench_function(format!("trellis_{name}"), |b| {
            b.iter(|| DbWriteBudget::disk_use(dir.path()).unwrap())
        });
        group.bench_function(format!("du_{name}"), |b| b.iter(|| du(dir.path())));
    }
    group.finish();

    let samples = support::rounds(100, 2);
    println!("\nworkspace_quota: p50 / p99 of {samples} interleaved measurements of each");
    for (name, dir) in &dirs {
        let [inside, outside] = support::interleaved(
            samples,
            [
                &mut || {
                    DbWriteBudget::disk_use(dir.path()).unwrap();
                },
                &mut || {
                    du(dir.path());
                },
            ],
        );
        let ((p50, p99), (n50, n99)) = (support::p50_p99(&inside), support::p50_p99(&outside));
        println!(
            "  {name:<10} trellis {:>7.2} ms / {:>7.2} ms   du {:>7.2} ms / {:>7.2} ms   ratio p50 {:.2}",
            millis(p50),
            millis(p99),
            millis(n50),
            millis(n99),
            p50.as_secs_f64() / n50.as_secs_f64()
        );
    }
}

criterion_group!(benches, quota);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
