//! A test that cannot run on this machine (no `python3`, not root, no private address for
//! its name) calls [`skip`] and returns, never returning early in silence. With
//! `TRELLIS_REQUIRE_ALL=1`, which `.ci/run` sets, a skip fails the test instead. Otherwise
//! the skip prints a `SKIPPED:` line that the test harness does not capture and, when
//! `TRELLIS_SKIP_LOG` names a file, appends the line there, so a run can count its skips.
//!
//! Std only: the unit tests of `trellis-sandbox` include this file by path.

use std::io::Write;

/// Reports that the calling test skips the rest of its checks for `reason` (what is
/// missing here); the caller returns right after. Panics under `TRELLIS_REQUIRE_ALL=1`.
pub fn skip(reason: &str) {
    let thread = std::thread::current();
    // The harness names each test's thread after the test.
    let test = thread.name().unwrap_or("a test");
    if std::env::var_os("TRELLIS_REQUIRE_ALL").is_some_and(|v| v == "1") {
        panic!("{test} cannot run here ({reason}) and TRELLIS_REQUIRE_ALL=1 allows no skip");
    }
    let line = format!("SKIPPED: {test}: {reason}\n");
    // Written to the standard error itself: the harness keeps what `eprintln!` prints in a
    // passing test to itself.
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(log) = std::env::var_os("TRELLIS_SKIP_LOG") {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|mut file| file.write_all(line.as_bytes()))
            .unwrap_or_else(|e| panic!("recording a skip in TRELLIS_SKIP_LOG={log:?}: {e}"));
    }
}
