//! Building a cargo workspace of guests for `wasm32-wasip2`, shared by the build scripts
//! of trellis-sandbox (the bundled plugins) and trellis-test-programs (the test-only guests).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The guests' target.
pub const TARGET: &str = "wasm32-wasip2";

/// Installs the wasm target when missing (toolchain files alone do not when
/// `RUSTUP_AUTO_INSTALL=0`), or stops with one line saying what to run.
pub fn ensure_target() {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let installed = || {
        Command::new(&rustc)
            .args(["--print", "target-libdir", "--target", TARGET])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
            .is_some_and(|dir| dir.join("libstd.rlib").exists() || has_std(&dir))
    };
    if installed() {
        return;
    }
    let added = Command::new("rustup")
        .args(["target", "add", TARGET])
        .status()
        .is_ok_and(|s| s.success());
    if !added || !installed() {
        panic!(
            "trellis build: the {TARGET} Rust target is missing and could not be installed; run `rustup target add {TARGET}`"
        );
    }
}

fn has_std(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("libstd-"))
    })
}

/// `OUT_DIR` is `<target>/[<triple>/]<profile>/build/<pkg>-<hash>/out`.
pub fn target_dir(out_dir: &Path) -> PathBuf {
    if let Some(dir) = env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    let build = out_dir
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .expect("OUT_DIR has a build folder");
    let mut dir = build.parent().unwrap().parent().unwrap();
    let host_triple = env::var("TARGET").unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == host_triple.as_str()) {
        dir = dir.parent().unwrap();
    }
    dir.to_path_buf()
}

/// Builds every package of the guest cargo workspace at `workspace` for `wasm32-wasip2` in
/// release mode, into `target_dir`; stops the build with the output above when it fails.
pub fn build_workspace(workspace: &Path, target_dir: &Path) {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace)
        .args(["build", "--release", "--locked", "--target", TARGET])
        .env("CARGO_TARGET_DIR", target_dir);
    // The outer build's settings (flags, wrappers such as clippy's, profile
    // overrides) are for the host, not for the guests.
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy();
        let keep = [
            "CARGO_HOME",
            "CARGO_MAKEFLAGS",
            "CARGO_NET_",
            "CARGO_HTTP_",
            "CARGO_REGISTRIES_",
        ]
        .iter()
        .any(|k| key.starts_with(k));
        if (key.starts_with("CARGO_") && !keep && key != "CARGO_TARGET_DIR")
            || key.starts_with("RUSTC_")
            || key == "RUSTFLAGS"
            || key == "RUSTDOCFLAGS"
        {
            cmd.env_remove(key.as_ref());
        }
    }
    let status = cmd.status().unwrap_or_else(|e| {
        panic!(
            "trellis build: cannot run cargo for {}: {e}",
            workspace.display()
        )
    });
    if !status.success() {
        panic!(
            "trellis build: building the guests in {} failed (see the output above)",
            workspace.display()
        );
    }
}
