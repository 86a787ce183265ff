//! Building a Rust plugin project: `cargo build --release --target wasm32-wasip2` in its
//! folder (cargo's own output on stderr, `CARGO_TARGET_DIR` honoured); the crate's `.wasm`
//! is read back for the caller to write where its plugin.json says.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The target plugins are built for.
const TARGET: &str = "wasm32-wasip2";

/// Builds the crate at `dir` and returns its component.
pub fn build(dir: &Path) -> Result<Vec<u8>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(&cargo)
        .current_dir(dir)
        .args([
            "build",
            "--release",
            "--target",
            TARGET,
            "--message-format=json-render-diagnostics",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", cargo.to_string_lossy()))?;
    if !output.status.success() {
        bail!(
            "cargo could not build {} (see its output above; the target is installed with `rustup target add {TARGET}`)",
            dir.display()
        );
    }
    let built = wasm_artifact(&String::from_utf8_lossy(&output.stdout)).with_context(|| {
        format!(
            "cargo built no .wasm in {}: is the crate's [lib] crate-type [\"cdylib\"]?",
            dir.display()
        )
    })?;
    std::fs::read(&built).with_context(|| format!("cannot read {}", built.display()))
}

/// The `.wasm` file of the last `cdylib` artifact in cargo's JSON messages.
fn wasm_artifact(messages: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == "cdylib"))
        })
        .filter_map(|m| {
            m["filenames"].as_array().and_then(|files| {
                files
                    .iter()
                    .filter_map(|f| f.as_str())
                    .find(|f| f.ends_with(".wasm"))
                    .map(PathBuf::from)
            })
        })
        .next_back()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cdylib_wasm_is_found_among_the_messages() {
        let messages = r#"{"reason":"compiler-artifact","target":{"kind":["lib"]},"filenames":["/t/libserde.rlib"]}
not json
{"reason":"compiler-artifact","target":{"kind":["cdylib"]},"filenames":["/t/wasm32-wasip2/release/echo.wasm"]}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            wasm_artifact(messages),
            Some(PathBuf::from("/t/wasm32-wasip2/release/echo.wasm"))
        );
        assert_eq!(wasm_artifact("{}"), None);
    }
}
