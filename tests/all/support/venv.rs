//! Python packages the tests drive Trellis with (the MCP SDK, Selenium), each pinned, in a
//! virtual environment of its own beside the target folder, made when missing.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The python of `<target>/<folder>/venv` with `package` at `version` installed, made
/// there when missing; `None` when this machine has no `python3`. Fails the test when the
/// environment cannot be made (python3 without venv or pip, PyPI out of reach).
pub fn python_with(folder: &str, package: &str, version: &str) -> Option<PathBuf> {
    Command::new("python3").arg("--version").output().ok()?;
    let target = Path::new(env!("CARGO_BIN_EXE_trellis"))
        .parent()
        .and_then(Path::parent)
        .expect("the target folder");
    let venv = target.join(folder).join("venv");
    let python = venv.join("bin").join("python");
    let has = |python: &Path| {
        Command::new(python)
            .args([
                "-c",
                &format!("import importlib.metadata as m; print(m.version('{package}'))"),
            ])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == version)
    };
    if !has(&python) {
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success())
            && Command::new(venv.join("bin").join("pip"))
                .args(["install", "-q", &format!("{package}=={version}")])
                .status()
                .is_ok_and(|s| s.success());
        assert!(
            made && has(&python),
            "could not install {package} {version} in {} (python3 with venv and pip, and PyPI \
             reachable, are needed)",
            venv.display()
        );
    }
    Some(python)
}
