//! Step scripts: `main.py` or a `main.wasm`, run in a fresh sandboxed instance under a grant
//! the caller decides (the runner makes it from the step's turn policy).
//!
//! A Python script runs inside the Python script runner, CPython packaged as a component of
//! world `script-runner` (`wit/trellis-plugin@0.2.0/script.wit`) by componentize-py and
//! pre-initialized with the standard library modules scripts commonly use. A `main.wasm` is
//! any `wasi:cli` command component, for scripts written in other languages; it runs the same
//! way. When a folder has both, `main.wasm` wins ([`find_script`]).
//!
//! What a script sees is its [`ScriptInvocation`]: the folders of its grant, the code folder
//! read-only as its working directory, the environment given, the `workflow-db` interface
//! (Python: the `trellis_db` module) when the grant has the database, and the script's file
//! name followed by the invocation's arguments. **Network**: `wasi:http` (Python: the
//! `trellis_http` module) only as the invocation's [`ScriptNet`] allows (the hosts of its
//! step's `allowed_hosts`), through the same gate as LLM providers; none without one. Socket
//! interfaces exist, but every address and name lookup is refused.
//!
//! Limits: a memory limit per instance, a wall-clock deadline (epoch interruption, so a
//! loop that never calls the host is stopped too), and a cap on the stdout and stderr kept
//! (the head and the tail: a traceback at the end of a flood survives). [`write_logs`]
//! writes an outcome to a step's logs folder, each file atomically.

mod outcome;
mod traceback;

#[cfg(test)]
use outcome::tail;
pub use outcome::{ScriptFailure, ScriptLocation, ScriptOutcome};

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime_wasi::FsPerms;
use wasmtime_wasi::p2::bindings::CommandPre;

use crate::capabilities::{Grant, Limits};
use crate::engine::Engine;
use crate::llm::ScriptNet;
use crate::llm::http::HttpPolicy;
use crate::state::CallState;
use crate::store::{self, Capped, rfc3339};
use crate::{CallFailure, call, slices};

mod components {
    include!(concat!(env!("OUT_DIR"), "/python_runner.rs"));
}

/// The Python script runner component, built by the build script with componentize-py
/// from `plugins/runners/python`, zstd-compressed.
///
/// It is embedded in the binary like the bundled plugins rather than loaded from the build
/// output: the `trellis` binary then runs scripts wherever it is copied or installed, with
/// no path into a build tree and no Python on the machine. The price is ~7 MB of binary
/// size (26 MB uncompressed); the component is decompressed and compiled (or read from the
/// component cache, keyed by these bytes) only when the first Python script runs. It is a
/// `static`, stored once: a `const` would be copied into every place that uses it.
pub use components::PYTHON_RUNNER_ZSTD;

/// The componentize-py release the Python script runner was built with; `trellis plugin
/// build` builds Python tool plugins with the same one.
pub const COMPONENTIZE_PY_VERSION: &str = env!("TRELLIS_COMPONENTIZE_PY_VERSION");

/// The virtual environment the build installed componentize-py in (it may be gone since).
pub const BUILD_PYTHON_VENV: &str = env!("TRELLIS_BUILD_PYTHON_VENV");

/// The Python script of a step, in `code/<step-id>/`.
pub const PYTHON_SCRIPT: &str = "main.py";
/// The WebAssembly script of a step, in `code/<step-id>/`; wins over `main.py`.
pub const WASM_SCRIPT: &str = "main.wasm";
/// stdout of the last run, in the step's logs folder.
pub const STDOUT_LOG: &str = "script-stdout.txt";
/// stderr of the last run, in the step's logs folder.
pub const STDERR_LOG: &str = "script-stderr.txt";
/// The record of the last run (status, exit code, error, timings), in the step's logs folder.
pub const RESULT_LOG: &str = "script-result.json";

/// Largest `main.wasm` the host reads.
const MAX_WASM_BYTES: u64 = 256 << 20;

/// Which kind of script a step has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptKind {
    /// `main.py`, run by the Python script runner.
    Python,
    /// `main.wasm`, a `wasi:cli` command component.
    Wasm,
}

impl ScriptKind {
    /// The script's file name.
    pub fn file_name(self) -> &'static str {
        match self {
            ScriptKind::Python => PYTHON_SCRIPT,
            ScriptKind::Wasm => WASM_SCRIPT,
        }
    }

    fn label(self) -> &'static str {
        match self {
            ScriptKind::Python => "python",
            ScriptKind::Wasm => "wasm",
        }
    }
}

/// Runs step scripts. Build one per process and share it: the linker is made once, and the
/// Python runner is compiled (or read from the component cache) once, on first use.
pub struct ScriptRunner {
    engine: Engine,
    linker: Linker<CallState>,
    python: tokio::sync::OnceCell<InstancePre<CallState>>,
    /// How long a `main.wasm` may take to compile ([`crate::plugins::COMPILE_DEADLINE`]).
    compile_deadline: std::time::Duration,
}

impl std::fmt::Debug for ScriptRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptRunner")
            .field("python_loaded", &self.python.initialized())
            .finish_non_exhaustive()
    }
}

/// One script to run, everything decided by the caller: which file, the folders it sees,
/// its environment and working directory.
#[derive(Debug, Clone)]
pub struct ScriptInvocation {
    /// Python or WebAssembly.
    pub kind: ScriptKind,
    /// The script, workspace-relative (`code/<step-id>/main.py`), as messages name it.
    pub script: String,
    /// Every folder the script sees, the code folder among them (read-only, at `cwd`).
    pub grant: Grant,
    /// The environment, as guest paths and values; nothing from the host's.
    pub env: Vec<(String, String)>,
    /// The working directory, a guest path (`/code/<step-id>`).
    pub cwd: String,
    /// The code folder on the host, also preopened as `.` for a `main.wasm` (see
    /// [`ScriptRunner::run`]).
    pub code_host: PathBuf,
    /// The arguments after the script's file name.
    pub args: Vec<String>,
    /// What the script may reach over HTTP; nothing when `None`.
    pub net: Option<ScriptNet>,
    /// Said about where the script was found, recorded with its outcome.
    pub warning: Option<String>,
}

impl ScriptRunner {
    /// A runner on `engine`: scripts get WASI (filesystem limited to their grant, no
    /// sockets), the `workflow-db` interface and the host's `log`.
    pub fn new(engine: &Engine) -> Result<Self> {
        let linker = slices::linker(engine, slices::SCRIPT).context("linking a script's slices")?;
        Ok(ScriptRunner {
            engine: engine.clone(),
            linker,
            python: tokio::sync::OnceCell::new(),
            compile_deadline: crate::plugins::COMPILE_DEADLINE,
        })
    }

    /// Gives a `main.wasm` `deadline` to compile instead of a third-party plugin's
    /// ([`crate::plugins::COMPILE_DEADLINE`]); past it the script is not run.
    pub fn with_compile_deadline(mut self, deadline: std::time::Duration) -> Self {
        self.compile_deadline = deadline;
        self
    }

    /// Compiles the Python runner (or reads it from the component cache) now rather than
    /// on the first Python script.
    pub async fn load_python(&self) -> Result<()> {
        self.python_pre().await.map(|_| ())
    }

    async fn python_pre(&self) -> Result<&InstancePre<CallState>> {
        self.python
            .get_or_try_init(|| async {
                let component = python_runner(&self.engine)?;
                self.instance_pre(&component, "the Python script runner")
            })
            .await
    }

    fn instance_pre(&self, component: &Component, what: &str) -> Result<InstancePre<CallState>> {
        let exports: Vec<String> = component
            .component_type()
            .exports(self.engine.wasmtime())
            .map(|(name, _)| name.to_string())
            .collect();
        if !exports.iter().any(|e| e.starts_with("wasi:cli/run@0.2")) {
            bail!(
                "{what} is not a wasi:cli command: it must export wasi:cli/run@0.2.x, but it exports {}",
                if exports.is_empty() {
                    "nothing".to_string()
                } else {
                    exports.join(", ")
                }
            );
        }
        self.linker.instantiate_pre(component).map_err(|err| {
            anyhow!("{what} needs an import a step script is not given (WASI 0.2, trellis:plugin/workflow-db): {err}")
        })
    }

    /// Runs `invocation` for step `step_id` in a fresh instance bounded by `limits`.
    ///
    /// A script that fails (exception, non-zero exit, timeout, memory limit, trap) is an
    /// `Ok` outcome with a [`ScriptFailure`]; an `Err` means the script could not be run at
    /// all: a `main.wasm` that cannot be read or is not a command component, a grant that
    /// cannot be made.
    #[tracing::instrument(skip_all, fields(step = step_id))]
    pub async fn run(
        &self,
        step_id: &str,
        invocation: &ScriptInvocation,
        limits: &Limits,
    ) -> Result<ScriptOutcome> {
        self.run_cancellable(step_id, invocation, limits, None)
            .await
    }

    /// [`ScriptRunner::run`], the guest code interrupted when `cancel` is cancelled (the
    /// script then fails as cancelled).
    pub async fn run_cancellable(
        &self,
        step_id: &str,
        invocation: &ScriptInvocation,
        limits: &Limits,
        cancel: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<ScriptOutcome> {
        let pre = self.instance_pre_for(invocation).await?;
        self.execute(step_id, invocation, &pre, limits, cancel)
            .await
    }

    async fn instance_pre_for(
        &self,
        invocation: &ScriptInvocation,
    ) -> Result<InstancePre<CallState>> {
        match invocation.kind {
            ScriptKind::Python => Ok(self.python_pre().await?.clone()),
            ScriptKind::Wasm => {
                let script = &invocation.script;
                let code_dir = store::open_dir(&invocation.code_host)
                    .with_context(|| format!("opening the folder of {script}"))?;
                let bytes = match store::read_capped(&code_dir, WASM_SCRIPT, MAX_WASM_BYTES)
                    .with_context(|| format!("reading {script}"))?
                {
                    Capped::Bytes(bytes) => bytes,
                    Capped::TooLarge(size) => {
                        bail!("{script} is {size} bytes, over the limit of {MAX_WASM_BYTES}")
                    }
                };
                // A workspace's component: compiled under a third-party plugin's deadline, and
                // cached only once it proved to be a runnable script.
                let deadline = Some(self.compile_deadline);
                let loaded = self.engine.open_component(&bytes, script, deadline)?;
                let pre = self.instance_pre(loaded.component(), script)?;
                self.engine.keep(&loaded);
                Ok(pre)
            }
        }
    }

    async fn execute(
        &self,
        step_id: &str,
        prepared: &ScriptInvocation,
        pre: &InstancePre<CallState>,
        limits: &Limits,
        cancel: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<ScriptOutcome> {
        let started = std::time::SystemTime::now();
        let clock = Instant::now();
        let label = format!("script:{step_id}");
        let call = call::Call {
            label: &label,
            grant: &prepared.grant,
            limits,
            http: prepared
                .net
                .clone()
                .map(|net| HttpPolicy::for_script(net, limits.timeout)),
            cancel,
            commands: None,
            within: None,
        };
        let wasi = |builder: &mut wasmtime_wasi::WasiCtxBuilder| -> Result<()> {
            builder
                .envs(&prepared.env)
                .arg(prepared.kind.file_name())
                .args(&prepared.args)
                .initial_cwd(&prepared.cwd);
            if prepared.kind == ScriptKind::Wasm {
                // wasi-libc (Rust's std, C) resolves a relative path against the preopens,
                // not against `initial-cwd`: the WASI convention for a working directory is
                // a preopen named `.`. It is the same read-only code folder. (The Python
                // runner changes directory itself.)
                builder
                    .preopened_dir(&prepared.code_host, ".", FsPerms::ReadOnly)
                    .map_err(anyhow::Error::from)
                    .with_context(|| format!("granting {}", prepared.cwd))?;
            }
            Ok(())
        };
        let finished = call::run(&self.engine, pre, call, wasi, |pre, store| {
            Box::pin(async move {
                let command = CommandPre::new(pre.clone())?
                    .instantiate_async(&mut *store)
                    .await?;
                command.wasi_cli_run().call_run(store).await
            })
        })
        .await;
        let duration = clock.elapsed();
        let (stdout, stderr) = (finished.stdout, finished.stderr);
        let (exit_code, failure) = match finished.result {
            Ok(Ok(())) => (Some(0), None),
            Ok(Err(())) => (Some(1), Some(ScriptFailure::Exit { code: 1 })),
            Err(CallFailure::Host(err)) => return Err(err),
            Err(failure) => script_failure(failure),
        };
        // What an approved server echoed back never reaches the logs.
        let secrets = prepared
            .net
            .as_ref()
            .map(ScriptNet::secret_values)
            .unwrap_or_default();
        let hide = |text: String| crate::llm::redact_secrets(&text, &secrets);
        let stdout_text = hide(stdout.text());
        let stderr_text = hide(stderr.text());
        let failure = match failure {
            // A Python script that raised exits with status 1 and a traceback on stderr.
            Some(ScriptFailure::Exit { code: 1 }) if prepared.kind == ScriptKind::Python => {
                match traceback::parse(&stderr_text, &format!("{}/", prepared.cwd)) {
                    Some(tb) => Some(ScriptFailure::Exception {
                        exception: tb.exception,
                        location: ScriptLocation {
                            file: workspace_relative(&tb.file),
                            line: tb.line,
                        },
                        traceback: tb.text,
                    }),
                    None => Some(ScriptFailure::Exit { code: 1 }),
                }
            }
            other => other,
        };
        tracing::debug!(
            script = %prepared.script,
            ?exit_code,
            stdout_bytes = stdout.total(),
            stderr_bytes = stderr.total(),
            ?duration,
            "script finished"
        );
        Ok(ScriptOutcome {
            step_id: step_id.to_string(),
            kind: prepared.kind,
            script: prepared.script.clone(),
            exit_code,
            failure,
            stdout: stdout_text,
            stderr: stderr_text,
            duration,
            started_at: rfc3339(started),
            log_dir: None,
            warning: prepared.warning.clone(),
        })
    }
}

/// The Python script runner, compiled (or read from the component cache).
pub(crate) fn python_runner(engine: &Engine) -> Result<Component> {
    engine.load_compressed_component(PYTHON_RUNNER_ZSTD, "bundled:python-runner")
}

/// The script of a step, as [`find_script`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptFile {
    /// Python or WebAssembly.
    pub kind: ScriptKind,
    /// Workspace-relative: `code/<step-id>/main.py` or `code/<step-id>/main.wasm` (or
    /// `learnings/<step-id>/main.py`).
    pub path: String,
    /// The folder of the script on the host (canonical, inside the workspace).
    pub code_dir: PathBuf,
    /// That folder, workspace-relative: `code/<step-id>` or `learnings/<step-id>`.
    pub dir: String,
    /// Said when the script is not where Trellis keeps scripts (`learnings/<step-id>/`).
    pub warning: Option<String>,
}

/// Where the original keeps the scripts of scripted steps: `learnings/<step-id>/main.py`.
pub const LEARNINGS_SCRIPT_DIR: &str = "learnings";

/// Whether step `step_id` has a script at all: something at `code/<step-id>/main.wasm`,
/// `code/<step-id>/main.py` or `learnings/<step-id>/main.py` (what [`find_script`] then
/// makes of it, a link refused say, is its own error).
pub fn has_script(fs: &store::WorkspaceFs, step_id: &str) -> bool {
    [
        format!("code/{step_id}/{WASM_SCRIPT}"),
        format!("code/{step_id}/{PYTHON_SCRIPT}"),
        format!("{LEARNINGS_SCRIPT_DIR}/{step_id}/{PYTHON_SCRIPT}"),
    ]
    .iter()
    .any(|rel| fs.kind(rel).ok().flatten().is_some())
}

/// The script [`ScriptRunner::run`] would run for step `step_id` of the workspace at `root`:
/// `code/<step-id>/main.wasm` if it is a file, else `code/<step-id>/main.py`, else (where
/// the original keeps them, with a warning) `learnings/<step-id>/main.py`. An error names
/// what is missing. The folder is resolved inside the workspace: a `code/<step-id>` that is
/// a symbolic link leading out of it is refused, and so is a script file that does.
pub fn find_script(fs: &store::WorkspaceFs, step_id: &str) -> Result<ScriptFile> {
    if step_id.is_empty() || step_id.contains(['/', '\\']) || step_id == "." || step_id == ".." {
        bail!("step id {step_id:?} cannot name a folder under code/");
    }
    let code_rel = format!("code/{step_id}");
    match find_in(fs, &code_rel, true) {
        Ok(found) => Ok(found),
        Err(err) => {
            let learnings_rel = format!("{LEARNINGS_SCRIPT_DIR}/{step_id}");
            if fs.kind(format!("{code_rel}/{PYTHON_SCRIPT}"))?.is_none()
                && fs.kind(format!("{code_rel}/{WASM_SCRIPT}"))?.is_none()
                && fs
                    .kind(format!("{learnings_rel}/{PYTHON_SCRIPT}"))?
                    .is_some()
            {
                let mut found = find_in(fs, &learnings_rel, false)?;
                found.warning = Some(format!(
                    "{code_rel}/{PYTHON_SCRIPT} is absent: running {learnings_rel}/{PYTHON_SCRIPT} \
                     (where the original keeps scripted steps) in place; move it to \
                     {code_rel}/{PYTHON_SCRIPT}"
                ));
                return Ok(found);
            }
            Err(err)
        }
    }
}

/// The script in the folder `dir_rel` (`main.wasm` too when `wasm`).
fn find_in(fs: &store::WorkspaceFs, dir_rel: &str, wasm: bool) -> Result<ScriptFile> {
    let root = fs.root();
    let code_rel = dir_rel.to_string();
    let code_dir = crate::capabilities::resolve_in_root(root, &code_rel).map_err(|_| {
        anyhow!(
            "{code_rel}/ does not exist: a scripted step runs {code_rel}/{WASM_SCRIPT} or {code_rel}/{PYTHON_SCRIPT}"
        )
    })?;
    // A script that is a link is refused (it would show the sandbox another file than the
    // one named), not skipped.
    let is_file = |name: &str| -> Result<bool> {
        match fs.kind(format!("{code_rel}/{name}"))? {
            Some(store::Kind::File) => Ok(true),
            Some(store::Kind::Link) => Err(store::workspace_fs::link_error(Path::new(&format!(
                "{code_rel}/{name}"
            )))
            .into()),
            _ => Ok(false),
        }
    };
    let kind = if wasm && is_file(WASM_SCRIPT)? {
        ScriptKind::Wasm
    } else if is_file(PYTHON_SCRIPT)? {
        ScriptKind::Python
    } else {
        bail!(
            "{code_rel}/ has neither {WASM_SCRIPT} nor {PYTHON_SCRIPT}: a scripted step needs one of them"
        );
    };
    Ok(ScriptFile {
        kind,
        path: format!("{code_rel}/{}", kind.file_name()),
        code_dir,
        dir: code_rel,
        warning: None,
    })
}

/// A failed call as the exit code and failure of a script.
fn script_failure(failure: CallFailure) -> (Option<i32>, Option<ScriptFailure>) {
    let crashed = |message: String| (None, Some(ScriptFailure::Crashed { message }));
    match failure {
        CallFailure::Exit { code: 0, .. } => (Some(0), None),
        CallFailure::Exit { code, .. } => (Some(code), Some(ScriptFailure::Exit { code })),
        CallFailure::Timeout(after) => (None, Some(ScriptFailure::Timeout { after })),
        CallFailure::Memory { limit } => (None, Some(ScriptFailure::MemoryLimit { limit })),
        CallFailure::FsLimit(exceeded) => (None, Some(ScriptFailure::FsLimit { exceeded })),
        CallFailure::StackOverflow => crashed("wasm trap: stack overflow".to_string()),
        CallFailure::Trap { message, .. } => crashed(message),
        CallFailure::Host(err) => crashed(format!("{err:#}")),
        CallFailure::Cancelled => crashed("the call was cancelled".to_string()),
    }
}

/// A guest path (`/code/step/main.py`) as the workspace-relative path it stands for.
fn workspace_relative(guest: &str) -> String {
    guest.strip_prefix('/').unwrap_or(guest).to_string()
}

/// Writes `stdout`, `stderr` (the outcome's, or what a budget leaves of them) and the
/// result record of `outcome` into `dir` (a step's logs folder), each atomically, in one
/// batch (one wait for the disk, not six).
pub fn write_logs(
    fs: &store::WorkspaceFs,
    dir: &Path,
    outcome: &ScriptOutcome,
    stdout: &str,
    stderr: &str,
) -> Result<()> {
    let completed = rfc3339(std::time::SystemTime::now());
    let record = store::json_bytes(&outcome.record(&completed))?;
    fs.write_all_atomic(&[
        (&dir.join(STDOUT_LOG), stdout.as_bytes()),
        (&dir.join(STDERR_LOG), stderr.as_bytes()),
        (&dir.join(RESULT_LOG), &record),
    ])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A workflow runner spawns step runs on tokio tasks: the runner and its future must
    /// cross threads.
    #[test]
    fn the_runner_can_be_shared_and_its_runs_spawned() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>(_: &T) {}
        send_sync::<ScriptRunner>();
        let engine = Engine::new(crate::engine::CacheSetting::Disabled).unwrap();
        let runner = ScriptRunner::new(&engine).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let invocation = ScriptInvocation {
            kind: ScriptKind::Python,
            script: "code/s/main.py".into(),
            grant: Grant::none(),
            env: Vec::new(),
            cwd: "/code/s".into(),
            code_host: dir.path().to_path_buf(),
            args: Vec::new(),
            net: None,
            warning: None,
        };
        send(&runner.run("s", &invocation, &Limits::default()));
    }

    #[test]
    fn failures_name_the_script() {
        let exception = ScriptFailure::Exception {
            exception: "ZeroDivisionError: division by zero".into(),
            location: ScriptLocation {
                file: "code/s/main.py".into(),
                line: 3,
            },
            traceback: String::new(),
        };
        assert_eq!(
            exception.describe("code/s/main.py"),
            "code/s/main.py raised ZeroDivisionError: division by zero (code/s/main.py, line 3)"
        );
        let timeout = ScriptFailure::Timeout {
            after: Duration::from_secs(2),
        };
        assert_eq!(
            timeout.describe("code/s/main.py"),
            "code/s/main.py did not finish within 2s and was stopped (timeout)"
        );
        assert_eq!(tail("héllo", 4), "llo");
    }
}
