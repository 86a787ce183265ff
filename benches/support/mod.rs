//! What every bench shares: its quick mode and the component cache it uses.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

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
