//! Building a Python tool plugin: its modules, the `trellis_plugin` module and the glue
//! that exports the `tool` interface are staged in a fresh folder, and componentize-py (at
//! the release the bundled Python script runner is built with) turns them into a component
//! of world `tool-plugin` of `wit/trellis-plugin@0.1.0`.
//!
//! componentize-py pre-initializes the component: `plugin.py` is imported at build time,
//! so its `@tool` decorators have run and the tool list is in the snapshot.
//!
//! Where componentize-py comes from, first found: `$TRELLIS_COMPONENTIZE_PY` (a command),
//! the virtual environment the `trellis` build made (when it is still there), or one this
//! command creates in the user cache folder (`~/.cache/trellis/python-tools/venv`) with
//! `python3 -m venv` and `pip install componentize-py==<version>`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use trellis_sandbox::script::{BUILD_PYTHON_VENV, COMPONENTIZE_PY_VERSION};

/// The module of a project that defines its tools.
pub const ENTRY_FILE: &str = "plugin.py";
/// The Python side of the plugin SDK.
pub const SDK_FILE: &str = "trellis_plugin.py";
/// The app module handed to componentize-py.
const APP_MODULE: &str = "trellis_plugin_app";

const SDK: &str = include_str!("../../../plugins/sdk-python/trellis_plugin.py");
const APP: &str = include_str!("../../../plugins/sdk-python/trellis_plugin_app.py");

/// The world a Python plugin implements.
const WORLD: &str = "tool-plugin";

/// The files of `wit/trellis-plugin@<version>/`, by path, with their text.
macro_rules! wit_files {
    ($version:literal: $($rel:literal),* $(,)?) => {
        &[$(($rel, include_str!(concat!("../../../wit/trellis-plugin@", $version, "/", $rel)))),*]
    };
}

/// The WIT package of the plugin API (0.1.0 is released and never edited), written to the
/// staging folder for componentize-py.
const WIT: &[(&str, &str)] = wit_files!("0.1.0":
    "worlds.wit", "types.wit", "host.wit", "tool.wit", "llm.wit", "script.wit",
    "validator.wit", "workflow-db.wit", "deps/cli.wit", "deps/clocks.wit",
    "deps/filesystem.wit", "deps/http.wit", "deps/io.wit", "deps/random.wit",
    "deps/sockets.wit",
);

/// The `trellis_plugin` module as `plugin new` writes it into a project: the same module,
/// with a note that it is there for the tests.
pub fn sdk_copy_for_tests() -> String {
    format!(
        "# A copy for running the tests with CPython (`python3 -m unittest`). `trellis plugin\n# build` puts the module of the trellis binary that builds the plugin in its place.\n{SDK}"
    )
}

/// Builds the Python tool plugin at `dir` into `component`.
pub fn build(dir: &Path, component: &Path) -> Result<()> {
    let tool = componentize_py()?;
    super::create_parent(component)?;
    let staging = std::env::temp_dir().join(format!("trellis-plugin-build-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let result = build_in(dir, component, &tool, &staging);
    let _ = std::fs::remove_dir_all(&staging);
    result
}

fn build_in(dir: &Path, component: &Path, tool: &PythonTool, staging: &Path) -> Result<()> {
    let app = staging.join("app");
    copy_sources(dir, &app)?;
    std::fs::write(app.join(SDK_FILE), SDK)?;
    std::fs::write(app.join(format!("{APP_MODULE}.py")), APP)?;
    let wit = staging.join("wit");
    for (rel, text) in WIT {
        let path = wit.join(rel);
        std::fs::create_dir_all(path.parent().unwrap())?;
        std::fs::write(&path, text)?;
    }
    let partial = component.with_extension("wasm.partial");
    let output = tool
        .command()
        .arg("-d")
        .arg(&wit)
        .args(["-w", WORLD, "componentize", "-p"])
        .arg(&app)
        .arg(APP_MODULE)
        .arg("-o")
        .arg(&partial)
        // The plugin must not pick up packages of whatever virtual environment is active.
        .env_remove("VIRTUAL_ENV")
        .env_remove("PYTHONPATH")
        // Its errors are about the plugin: no backtrace of componentize-py itself.
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .stdin(Stdio::null())
        .output()
        .context("cannot run componentize-py")?;
    if !output.status.success() {
        let _ = std::fs::remove_file(&partial);
        bail!(
            "componentize-py could not build {} (an error in plugin.py is raised at build time, when the module is imported):\n{}{}",
            dir.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr).trim_end()
        );
    }
    std::fs::rename(&partial, component)
        .with_context(|| format!("cannot write {}", component.display()))?;
    Ok(())
}

/// Copies the project's Python modules and packages to `to`, leaving out its tests and
/// its copy of the SDK module.
fn copy_sources(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    let entries =
        std::fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_package = path.join("__init__.py").is_file();
        if is_package && name != "dist" && !name.starts_with('.') {
            copy_sources(&path, &to.join(&name))?;
        } else if path.is_file()
            && name.ends_with(".py")
            && !name.starts_with("test_")
            && name != SDK_FILE
            && name != format!("{APP_MODULE}.py")
        {
            std::fs::copy(&path, to.join(&name))
                .with_context(|| format!("cannot copy {}", path.display()))?;
        }
    }
    Ok(())
}

/// A way to run componentize-py.
#[derive(Debug)]
struct PythonTool {
    program: OsString,
    args: Vec<OsString>,
}

impl PythonTool {
    /// componentize-py through a virtual environment's interpreter rather than its
    /// `bin/componentize-py` script, whose `#!` line breaks when the folder is moved.
    fn in_venv(venv: &Path) -> PythonTool {
        PythonTool {
            program: venv.join("bin").join("python3").into(),
            args: vec![
                "-c".into(),
                "import sys, componentize_py; sys.argv[0] = 'componentize-py'; sys.exit(componentize_py.script())".into(),
            ],
        }
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        command
    }

    /// Whether it runs and is the pinned release.
    fn is_pinned(&self) -> bool {
        self.command()
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .is_ok_and(|o| {
                o.status.success()
                    && String::from_utf8_lossy(&o.stdout).trim()
                        == format!("componentize-py {COMPONENTIZE_PY_VERSION}")
            })
    }
}

/// Finds componentize-py, or installs it in the user cache folder.
fn componentize_py() -> Result<PythonTool> {
    if let Some(command) = std::env::var_os("TRELLIS_COMPONENTIZE_PY").filter(|c| !c.is_empty()) {
        let tool = PythonTool {
            program: command.clone(),
            args: Vec::new(),
        };
        if !tool.is_pinned() {
            bail!(
                "TRELLIS_COMPONENTIZE_PY={}: expected a command answering `componentize-py {COMPONENTIZE_PY_VERSION}` to --version",
                command.to_string_lossy()
            );
        }
        return Ok(tool);
    }
    let build = PythonTool::in_venv(Path::new(BUILD_PYTHON_VENV));
    if build.is_pinned() {
        return Ok(build);
    }
    let venv = user_venv()?;
    let tool = PythonTool::in_venv(&venv);
    if tool.is_pinned() {
        return Ok(tool);
    }
    install(&venv)?;
    if !tool.is_pinned() {
        bail!(
            "componentize-py {COMPONENTIZE_PY_VERSION} was installed in {} but does not run",
            venv.display()
        );
    }
    Ok(tool)
}

/// `~/.cache/trellis/python-tools/venv` (the platform's user cache folder).
fn user_venv() -> Result<PathBuf> {
    let dirs = directories::ProjectDirs::from("", "", "trellis")
        .context("no home folder to keep componentize-py in: set TRELLIS_COMPONENTIZE_PY")?;
    Ok(dirs.cache_dir().join("python-tools").join("venv"))
}

fn install(venv: &Path) -> Result<()> {
    let python = std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    eprintln!(
        "installing componentize-py {COMPONENTIZE_PY_VERSION} in {} (once)",
        venv.display()
    );
    let hint = || {
        format!(
            "could not install componentize-py {COMPONENTIZE_PY_VERSION}: it needs Python 3.10+ with venv and pip (on Debian or Ubuntu: `apt-get install python3-venv`) and PyPI; or install it yourself and set TRELLIS_COMPONENTIZE_PY to its command"
        )
    };
    let status = Command::new(&python)
        .args(["-m", "venv"])
        .arg(venv)
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("cannot run {}: {}", python.to_string_lossy(), hint()))?;
    if !status.success() {
        bail!("{}", hint());
    }
    let status = Command::new(venv.join("bin").join("python3"))
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg(format!("componentize-py=={COMPONENTIZE_PY_VERSION}"))
        .stdin(Stdio::null())
        .status()
        .with_context(hint)?;
    if !status.success() {
        bail!("{}", hint());
    }
    Ok(())
}
