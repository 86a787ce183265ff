//! Test-only guest components, built from `tests/programs/guests` by this crate's build
//! script: `adversary` (a tool plugin that attacks its sandbox), `hostile` (hostile at load:
//! huge schemas, endless lists), `old_provider` (an LLM provider of the 0.1.0 world, before
//! streaming), `script_probe` (a `main.wasm` script that reports what it
//! sees), `test_snoop` (an LLM provider that looks for secrets and other hosts) and
//! `wrong_world` (a component of no plugin world).

use std::path::PathBuf;

mod built {
    include!(concat!(env!("OUT_DIR"), "/programs.rs"));
}

/// The path of the built component `name` (one of [`names`]).
///
/// # Panics
/// When `name` is not a test program: a typo in a test should fail loudly.
pub fn path(name: &str) -> PathBuf {
    assert!(
        built::NAMES.contains(&name),
        "no test program {name:?}; the test programs are {:?}",
        built::NAMES
    );
    PathBuf::from(built::DIR).join(format!("{name}.wasm"))
}

/// Every test program's name.
pub fn names() -> &'static [&'static str] {
    built::NAMES
}
