//! Builds the test-only guests in `guests/` (a cargo workspace of their own) for
//! `wasm32-wasip2`, into `<target>/wasm-test-programs`, and tells the crate where they are.

#[path = "../../host/sandbox/build/guests.rs"]
mod guests;

use std::env;
use std::path::PathBuf;

use guests::{TARGET, build_workspace, ensure_target, target_dir};

/// The components `guests/` builds, by file name.
const PROGRAMS: &[&str] = &[
    "adversary",
    "hostile",
    "old_provider",
    "script_probe",
    "test_snoop",
    "wrong_world",
];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().and_then(|p| p.parent()).unwrap();
    let shared = root.join("host/sandbox/build/guests.rs");
    for watched in [
        manifest_dir.join("guests"),
        root.join("plugins/sdk"),
        root.join("wit"),
        shared,
    ] {
        println!("cargo:rerun-if-changed={}", watched.display());
    }

    ensure_target();
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let wasm_target_dir = target_dir(&out_dir).join("wasm-test-programs");
    build_workspace(&manifest_dir.join("guests"), &wasm_target_dir);

    let release = wasm_target_dir.join(TARGET).join("release");
    for name in PROGRAMS {
        let path = release.join(format!("{name}.wasm"));
        assert!(
            path.is_file(),
            "trellis-test-programs build: expected {} after building guests/",
            path.display()
        );
    }
    std::fs::write(
        out_dir.join("programs.rs"),
        format!(
            "/// The folder holding the built test programs.\npub const DIR: &str = {:?};\n/// Their names.\npub const NAMES: &[&str] = &{PROGRAMS:?};\n",
            release.display().to_string()
        ),
    )
    .unwrap();
}
