//! Builds the guest plugins in `plugins/` for `wasm32-wasip2` so the bundled
//! ones can be embedded in the binary and the test ones used by tests.
//!
//! The guests are a separate cargo workspace with its own target folder
//! (`<target>/wasm-plugins`), always built in release mode: they are small,
//! and an optimized guest keeps calls fast in every host profile.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";
/// Components embedded in the `trellis` binary.
const BUNDLED: &[&str] = &["workspace", "csv_validator", "openai", "replay"];
/// Components used only by tests.
const TEST_ONLY: &[&str] = &["adversary", "wrong_world", "test_snoop"];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    let plugins = root.join("plugins");
    for watched in [
        "Cargo.toml",
        "Cargo.lock",
        "sdk",
        "workspace",
        "validators",
        "providers",
        "tests",
    ] {
        println!("cargo:rerun-if-changed={}", plugins.join(watched).display());
    }
    println!("cargo:rerun-if-changed={}", root.join("wit").display());

    ensure_target();
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let wasm_target_dir = target_dir(&out_dir).join("wasm-plugins");
    build_plugins(&plugins, &wasm_target_dir);

    let release = wasm_target_dir.join(TARGET).join("release");
    let mut generated = String::new();
    for name in BUNDLED.iter().chain(TEST_ONLY) {
        let path = release.join(format!("{name}.wasm"));
        if !path.is_file() {
            panic!(
                "trellis build: expected {} after building plugins/",
                path.display()
            );
        }
    }
    for name in BUNDLED {
        let path = release.join(format!("{name}.wasm"));
        generated.push_str(&format!(
            "/// The `{name}` component, built from `plugins/`.\npub const {}: &[u8] = include_bytes!({:?});\n",
            name.to_uppercase(),
            path.display().to_string()
        ));
    }
    generated.push_str(&format!(
        "/// Folder holding the test-only components.\npub const TEST_COMPONENTS_DIR: &str = {:?};\n",
        release.display().to_string()
    ));
    std::fs::write(out_dir.join("components.rs"), generated).unwrap();
}

/// Installs the wasm target when missing (toolchain files alone do not when
/// `RUSTUP_AUTO_INSTALL=0`), or stops with one line saying what to run.
fn ensure_target() {
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
fn target_dir(out_dir: &Path) -> PathBuf {
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

fn build_plugins(plugins: &Path, target_dir: &Path) {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(plugins)
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
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("trellis build: cannot run cargo for plugins/: {e}"));
    if !status.success() {
        panic!(
            "trellis build: building the guest plugins in plugins/ failed (see the output above)"
        );
    }
}
