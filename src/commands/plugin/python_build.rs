//! Building a Python tool plugin: its modules, the `trellis_plugin` module and the glue
//! that exports the `tool` interface are staged in a fresh folder, and componentize-py (at
//! the release the bundled Python script runner is built with) turns them into a component
//! of world `tool-plugin` of `wit/trellis-plugin@0.1.0`.
//!
//! The modules are read through the project's handle, so a link among them (to a file
//! anywhere on the machine) is refused, naming it, rather than built into the plugin; the
//! staging folder is private to the user (`0700`, an unpredictable name under the temporary
//! folder), so nobody else can plant or read anything in it; the component is written there
//! and handed back, never into `dist/` by componentize-py.
//!
//! componentize-py pre-initializes the component: `plugin.py` is imported at build time,
//! so its `@tool` decorators have run and the tool list is in the snapshot.
//!
//! Where componentize-py comes from, first found: `$TRELLIS_COMPONENTIZE_PY` (a command),
//! the virtual environment the `trellis` build made (when it is still there), or one this
//! command creates in the user cache folder (`~/.cache/trellis/python-tools/venv`) with
//! `python3 -m venv` and `pip install componentize-py==<version>`.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use trellis_sandbox::script::{BUILD_PYTHON_VENV, COMPONENTIZE_PY_VERSION};
use trellis_sandbox::store::workspace_fs::link_error;
use trellis_sandbox::store::{Kind, WorkspaceFs};

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

/// Builds the Python tool plugin at `dir` (opened as `project`) and returns its component.
pub fn build(project: &WorkspaceFs, dir: &Path, deadline: std::time::Duration) -> Result<Vec<u8>> {
    let sources = find_sources(project)?;
    let tool = componentize_py()?;
    // Removed when it goes out of scope, whichever way the build ends.
    let staging = tempfile::Builder::new()
        .prefix("trellis-plugin-build-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .context("cannot create a staging folder for the build")?;
    build_in(project, &sources, dir, &tool, staging.path(), deadline)
}

fn build_in(
    project: &WorkspaceFs,
    sources: &[PathBuf],
    dir: &Path,
    tool: &PythonTool,
    staging: &Path,
    deadline: std::time::Duration,
) -> Result<Vec<u8>> {
    let app = staging.join("app");
    std::fs::create_dir(&app)?;
    if sources.len() > MAX_STAGED_FILES {
        bail!(
            "{} has {} Python modules, more than the {MAX_STAGED_FILES} a plugin build copies",
            dir.display(),
            sources.len()
        );
    }
    let mut staged: u64 = 0;
    for rel in sources {
        let to = app.join(rel);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let bytes = project
            .read(rel)
            .with_context(|| format!("cannot read {}", dir.join(rel).display()))?;
        staged = staged.saturating_add(bytes.len() as u64);
        if staged > MAX_STAGED_BYTES {
            bail!(
                "the Python modules of {} are more than the {MAX_STAGED_BYTES} bytes a plugin \
                 build copies together (a plugin's component is at most that size)",
                dir.display()
            );
        }
        std::fs::write(&to, bytes)?;
    }
    std::fs::write(app.join(SDK_FILE), SDK)?;
    std::fs::write(app.join(format!("{APP_MODULE}.py")), APP)?;
    let wit = staging.join("wit");
    for (rel, text) in WIT {
        let path = wit.join(rel);
        std::fs::create_dir_all(path.parent().unwrap())?;
        std::fs::write(&path, text)?;
    }
    let built = staging.join("plugin.wasm");
    let path = site_packages_shim(staging)?;
    let mut command = tool.command();
    command
        .arg("-d")
        .arg(&wit)
        .args(["-w", WORLD, "componentize", "-p"])
        .arg(&app)
        .arg(APP_MODULE)
        .arg("-o")
        .arg(&built)
        // The plugin must not pick up packages of whatever virtual environment is active.
        .env_remove("VIRTUAL_ENV")
        .env_remove("PYTHONPATH")
        .env("PATH", path)
        // Its errors are about the plugin: no backtrace of componentize-py itself.
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0");
    let output = run_bounded(command, deadline)?;
    if !output.status.success() {
        bail!(
            "componentize-py could not build {} ({}; an error in plugin.py is raised at build time, when the module is imported):\n{}{}",
            dir.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr).trim_end()
        );
    }
    std::fs::read(&built).context("cannot read the component componentize-py built")
}

/// Python modules a build copies into its staging folder at most.
pub const MAX_STAGED_FILES: usize = 10_000;

/// Bytes of Python modules a build copies into its staging folder at most, together: the
/// size of the largest component a plugin folder may hold.
pub const MAX_STAGED_BYTES: u64 = 64 << 20;

/// How long a build may take by default (`--timeout`): componentize-py imports `plugin.py` to pre-initialize the
/// component, so the plugin's top-level code runs at build time (about 20 s a build here).
pub const BUILD_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// The memory componentize-py may take (`RLIMIT_DATA`: what it writes to, the plugin's
/// Python heap included; a build takes under 500 MB here).
pub const BUILD_MEMORY_BYTES: u64 = 2 << 30;

/// The most of componentize-py's stdout and of its stderr kept for an error message.
const BUILD_OUTPUT_BYTES: u64 = 64 << 10;

/// Runs componentize-py within `deadline` and [`BUILD_MEMORY_BYTES`], its output
/// kept up to [`BUILD_OUTPUT_BYTES`] a stream (the rest read and dropped).
fn run_bounded(
    mut command: Command,
    deadline: std::time::Duration,
) -> Result<std::process::Output> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure calls setrlimit(2) alone, which is
    // async-signal-safe, with a pointer to an rlimit on its own stack.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: BUILD_MEMORY_BYTES as libc::rlim_t,
                rlim_max: BUILD_MEMORY_BYTES as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run componentize-py")?;
    let drain = |stream: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            if let Some(mut stream) = stream {
                let _ = (&mut stream)
                    .take(BUILD_OUTPUT_BYTES)
                    .read_to_end(&mut kept);
                let _ = std::io::copy(&mut stream, &mut std::io::sink());
            }
            kept
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "componentize-py did not finish within {} s and was stopped: plugin.py is \
                 imported at build time, so its top-level code runs then; a loop or a wait \
                 there never ends the build",
                deadline.as_secs()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    Ok(std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// The project's Python modules and packages, relative to it: its `.py` files but its tests
/// and its copy of the SDK module, at the top and in every package (a folder with an
/// `__init__.py`) not hidden and not `dist`. A link where these are looked for is refused.
fn find_sources(project: &WorkspaceFs) -> Result<Vec<PathBuf>> {
    let mut sources = Vec::new();
    let mut link = None;
    project
        .walk("", |rel, kind| {
            let name = rel.file_name().unwrap_or_default().to_string_lossy();
            let looked_at = !name.starts_with('.') && name != "dist";
            match kind {
                Kind::Link if looked_at => {
                    link.get_or_insert_with(|| rel.to_path_buf());
                    false
                }
                Kind::Dir => looked_at && project.exists(rel.join("__init__.py")),
                Kind::File
                    if name.ends_with(".py")
                        && !name.starts_with("test_")
                        && name != SDK_FILE
                        && name != format!("{APP_MODULE}.py") =>
                {
                    sources.push(rel.to_path_buf());
                    false
                }
                _ => false,
            }
        })
        .context("cannot read the plugin project")?;
    if let Some(link) = link {
        bail!(
            "{} (plugin sources are read without following links: put the file itself there)",
            link_error(&link)
        );
    }
    Ok(sources)
}

/// A way to run componentize-py.
#[derive(Debug)]
struct PythonTool {
    program: OsString,
    args: Vec<OsString>,
}

/// componentize-py asks the `python3` on `PATH` for its site-packages folders and grants them
/// to the plugin's code, read-write, while it pre-initializes the component: the operator's
/// own Python (a `.pth` planted there runs natively at its next start). A `python3` first on
/// the build's `PATH` answers with an empty folder of the staging area instead. Returns that
/// `PATH`.
fn site_packages_shim(staging: &Path) -> Result<std::ffi::OsString> {
    use std::os::unix::fs::PermissionsExt;
    let site = staging.join("site-packages");
    let bin = staging.join("bin");
    std::fs::create_dir(&site)?;
    std::fs::create_dir(&bin)?;
    let shown = site.to_str().filter(|s| !s.contains('\''));
    let Some(shown) = shown else {
        bail!(
            "the staging folder {} has a name the build cannot use",
            staging.display()
        );
    };
    let shim = bin.join("python3");
    std::fs::write(&shim, format!("#!/bin/sh\nprintf '%s\\n' '{shown}'\n"))?;
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o700))?;
    let mut paths = vec![bin];
    paths.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(paths).context("the build's PATH")
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
