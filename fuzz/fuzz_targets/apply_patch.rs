//! The unified-diff parser and hunk applier of the `workspace` plugin's `apply_patch` tool.
//!
//! The parser lives in the guest crate (`plugins/workspace`, built for wasm32-wasip2); its
//! pure part, `patch/unified.rs` (std only), is included here as it stands. The input is a
//! file's text, a NUL byte, then the patch.
#![no_main]

#[allow(dead_code)]
#[path = "../../plugins/workspace/src/patch/unified.rs"]
mod unified;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &str| {
    let (original, patch) = data.split_once('\0').unwrap_or(("", data));
    let Ok(files) = unified::parse(patch) else {
        return;
    };
    for file in &files {
        let _ = unified::apply(original, &file.hunks);
    }
});
