//! What every bench shares: its quick mode and the component cache it uses.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Whether the bench runs in its quick mode: a few rounds of each sample instead of the
/// thousands a figure needs, so `cargo test --benches` (which CI runs) checks that every path
/// works and gives the same answer as its baseline, in seconds.
///
/// Quick is criterion's test mode: the bench was run without `--bench` (`cargo test
/// --benches`, or the executable on its own) or with `--test`. `cargo bench` passes
/// `--bench`, and gets the full samples.
pub fn quick() -> bool {
    let args: Vec<String> = std::env::args().collect();
    !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test")
}

/// `full` rounds when measuring, `few` in the quick mode.
pub fn rounds(full: usize, few: usize) -> usize {
    if quick() { few } else { full }
}

/// The folder of compiled components: `$TRELLIS_CACHE_DIR` when set (CI points it at the
/// cache its tests filled), else one in the system's temp folder that every bench shares.
pub fn component_cache() -> PathBuf {
    match std::env::var_os("TRELLIS_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::temp_dir().join("trellis-bench-cache"),
    }
}

/// The `p` quantile (0 to 1) of `sorted`, the nearest sample.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// The 0.5 and 0.99 quantiles of `sorted`.
pub fn p50_p99(sorted: &[Duration]) -> (Duration, Duration) {
    (percentile(sorted, 0.5), percentile(sorted, 0.99))
}

/// Times `samples` rounds of `runs`, each round calling every one of them once in turn, so
/// drift in the machine's load hits them all alike: each one's times, sorted.
pub fn interleaved<const N: usize>(
    samples: usize,
    mut runs: [&mut dyn FnMut(); N],
) -> [Vec<Duration>; N] {
    let mut times = [(); N].map(|()| Vec::with_capacity(samples));
    for _ in 0..samples {
        for (run, taken) in runs.iter_mut().zip(&mut times) {
            let started = Instant::now();
            run();
            taken.push(started.elapsed());
        }
    }
    for taken in &mut times {
        taken.sort_unstable();
    }
    times
}
