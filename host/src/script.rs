//! Step scripts (spec section 7): `code/<step-id>/main.py` or `code/<step-id>/main.wasm`,
//! run in a fresh sandboxed instance with the grant of the step.
//!
//! A Python script runs inside the Python script runner, CPython packaged as a component of
//! world `script-runner` (`wit/trellis-plugin@0.2.0/script.wit`) by componentize-py and pre-initialized with the
//! standard library modules scripts commonly use. A `main.wasm` is any `wasi:cli` command
//! component, for scripts written in other languages; it runs the same way. When a step has
//! both, `main.wasm` wins.
//!
//! What a script sees:
//! - **Folders**: the grant of its step per spec section 6
//!   ([`crate::capabilities::turn`]), each at its workspace-relative guest path
//!   (`/runs/iteration-0/execution/<step-id>`), plus `/code/<step-id>` read-only, which is
//!   its working directory. Nothing else exists: not `/etc`, not `planning/`.
//! - **Environment**: `STEP_OUTPUT_DIR`, `STEP_EXECUTION_DIR`, `DB_PATH` (when the workspace
//!   has a `db/` folder) and `VAR_<NAME>` for each workflow variable, as guest paths and
//!   values; nothing from the host's environment.
//!   Each `SECRET_<NAME>` of the operator's environment is there too, holding a placeholder
//!   the host replaces by the secret in request headers for the origins the operator
//!   approved for it (`--allow-key SECRET_<NAME>=ORIGIN`): the script never holds it.
//! - **Arguments**: the script's file name (`main.py` or `main.wasm`), then the step's
//!   `context_dependencies` in plan order, as the guest paths the script opens them at
//!   (`/knowledge/x.md`), workflow variables substituted.
//! - **Database**: through the `workflow-db` interface (Python: the `trellis_db` module),
//!   read-only unless the step may modify the database.
//! - **Network**: `wasi:http` (Python: the `trellis_http` module) to the hosts of the step's
//!   `agent_configs.allowed_hosts` only, through the same gate as LLM providers
//!   ([`crate::llm::ScriptNet`]); no host listed, no network. Sockets exist as interfaces,
//!   but every address and name lookup is refused.
//! - **Where the script is**: `code/<step-id>/`; a step whose script is still where the
//!   original keeps them, `learnings/<step-id>/main.py`, runs it there (read-only, its
//!   working directory) with a warning naming the move.
//!
//! Limits: a memory limit per instance, a wall-clock deadline (epoch interruption, so a
//! loop that never calls the host is stopped too), and a cap on the stdout and stderr kept
//! (the head and the tail: a traceback at the end of a flood survives). The outcome goes to
//! the step's logs folder: `runs/<run>/logs/<step-id>/script-stdout.txt`,
//! `script-stderr.txt` and `script-result.json`, each written atomically.

mod outcome;
mod traceback;

#[cfg(test)]
use outcome::tail;
pub use outcome::{ScriptFailure, ScriptLocation, ScriptOutcome};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime_wasi::FsPerms;
use wasmtime_wasi::p2::bindings::CommandPre;

use crate::capabilities::turn::{DB_FILE, TurnAccess, TurnContext, grant_for_access};
use crate::capabilities::{FsLimits, Limits};
use crate::engine::Engine;
use crate::llm::http::HttpPolicy;
use crate::llm::{HostRule, KeyApprovals, ScriptNet, Secret, secret_placeholder};
use crate::sandbox::state::CallState;
use crate::sandbox::{self, CallFailure, slices};
use crate::sequence::session::rfc3339;
use crate::store::{self, Capped};
use crate::workflow::Workspace;

mod components {
    include!(concat!(env!("OUT_DIR"), "/python_runner.rs"));
}

/// The Python script runner component, built by the build script with componentize-py
/// from `plugins/runners/python`.
///
/// It is embedded in the binary like the bundled plugins rather than loaded from the build
/// output: the `trellis` binary then runs scripts wherever it is copied or installed, with
/// no path into a build tree and no Python on the machine. The price is ~25 MB of binary
/// size; the component is compiled (or read from the component cache) only when the first
/// Python script runs.
pub const PYTHON_RUNNER: &[u8] = components::PYTHON_RUNNER;

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

/// How to run a step's script.
#[derive(Debug, Clone)]
pub struct ScriptOptions {
    /// Memory, deadline and output caps. `stdio_bytes` caps stdout and stderr each;
    /// `output_bytes` is not used (a script returns no result).
    pub limits: Limits,
    /// What the script may write; [`TurnAccess::for_step`] of the step's config when `None`.
    /// An item's `write_access` narrows it as for a turn ([`TurnAccess::narrowed`]).
    pub access: Option<TurnAccess>,
    /// The group (its id in `workflow.json`) whose variable values apply; the declared
    /// defaults alone when `None`.
    pub group: Option<String>,
    /// Variables over those of `workflow.json` and the group, such as the answers of
    /// `human_input` steps: each becomes `VAR_<NAME>`.
    pub variables: BTreeMap<String, String>,
    /// Write stdout, stderr and the result record into the step's logs folder.
    pub write_logs: bool,
    /// The operator's approvals: which origins receive which `SECRET_<NAME>`, which hosts
    /// may be loopback or private. None by default.
    pub approvals: Arc<KeyApprovals>,
}

impl ScriptOptions {
    /// The limits of a script run unless told otherwise: 512 MiB, 120 s, 1 MiB of stdout
    /// and of stderr each.
    pub const DEFAULT_LIMITS: Limits = Limits {
        memory_bytes: 512 << 20,
        timeout: Duration::from_secs(120),
        output_bytes: 0,
        stdio_bytes: 1 << 20,
        fs: FsLimits::DEFAULT,
    };
}

impl Default for ScriptOptions {
    fn default() -> Self {
        ScriptOptions {
            limits: Self::DEFAULT_LIMITS,
            access: None,
            group: None,
            variables: BTreeMap::new(),
            write_logs: true,
            approvals: Arc::new(KeyApprovals::none()),
        }
    }
}

/// Runs step scripts. Build one per process and share it: the linker is made once, and the
/// Python runner is compiled (or read from the component cache) once, on first use.
pub struct ScriptRunner {
    engine: Engine,
    linker: Linker<CallState>,
    python: tokio::sync::OnceCell<InstancePre<CallState>>,
}

impl std::fmt::Debug for ScriptRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptRunner")
            .field("python_loaded", &self.python.initialized())
            .finish_non_exhaustive()
    }
}

/// Where one script runs: everything decided before the instance starts.
struct Prepared {
    kind: ScriptKind,
    script: String,
    pre: InstancePre<CallState>,
    grant: crate::capabilities::Grant,
    env: Vec<(String, String)>,
    cwd: String,
    /// The code folder on the host, also preopened as `.` for a `main.wasm` (see
    /// [`ScriptRunner::execute`]).
    code_host: PathBuf,
    log_dir: PathBuf,
    /// The arguments after the script's name: the step's dependencies.
    args: Vec<String>,
    /// What the script may reach over HTTP; nothing when `None`.
    net: Option<ScriptNet>,
    /// Said about where the script was found.
    warning: Option<String>,
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
        })
    }

    /// Compiles the Python runner (or reads it from the component cache) now rather than
    /// on the first Python script.
    pub async fn load_python(&self) -> Result<()> {
        self.python_pre().await.map(|_| ())
    }

    async fn python_pre(&self) -> Result<&InstancePre<CallState>> {
        self.python
            .get_or_try_init(|| async {
                let component = self
                    .engine
                    .load_component(PYTHON_RUNNER, "bundled:python-runner")?;
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

    /// Runs the script of step `step_id` of `ws` in the run folder `ws.run_folder`
    /// (`iteration-0` when none is selected): `code/<step-id>/main.wasm` if it exists, else
    /// `code/<step-id>/main.py`.
    ///
    /// A script that fails (exception, non-zero exit, timeout, memory limit, trap) is an
    /// `Ok` outcome with a [`ScriptFailure`]; an `Err` means the script could not be run at
    /// all: no such step, no script, a grant that cannot be made, a `main.wasm` that is not
    /// a command component, logs that cannot be written.
    #[tracing::instrument(skip(self, ws, options), fields(step = step_id))]
    pub async fn run(
        &self,
        ws: &Workspace,
        step_id: &str,
        options: &ScriptOptions,
    ) -> Result<ScriptOutcome> {
        let prepared = self
            .prepare(ws, step_id, options)
            .await
            .with_context(|| format!("running the script of step {step_id:?}"))?;
        let outcome = self.execute(step_id, &prepared, &options.limits).await?;
        if options.write_logs {
            write_logs(&ws.fs, &prepared.log_dir, &outcome).with_context(|| {
                format!(
                    "step {step_id:?}: writing the script's logs in {}",
                    prepared.log_dir.display()
                )
            })?;
            return Ok(ScriptOutcome {
                log_dir: Some(prepared.log_dir),
                ..outcome
            });
        }
        Ok(outcome)
    }

    async fn prepare(
        &self,
        ws: &Workspace,
        step_id: &str,
        options: &ScriptOptions,
    ) -> Result<Prepared> {
        let step = ws
            .plan
            .step(step_id)
            .ok_or_else(|| anyhow!("planning/plan.json has no step {step_id:?}"))?;
        let run_folder = ws.run_folder.as_deref().unwrap_or("iteration-0");
        let configs = ws.agent_configs(step_id);
        let access = options
            .access
            .unwrap_or_else(|| TurnAccess::for_step(&configs));
        let ctx = TurnContext {
            root: &ws.root,
            run_folder,
            step,
            configs: &configs,
        };
        // Checks the step id and the run folder (single components, inside the workspace).
        let turn = grant_for_access(&ctx, access)?;

        let ScriptFile {
            kind,
            path: script,
            code_dir: code_host,
            dir: code_rel,
            warning,
        } = find_script(&ws.fs, step_id)?;
        if let Some(warning) = &warning {
            tracing::warn!("{warning}");
        }
        let code_dir =
            store::open_dir(&code_host).with_context(|| format!("opening {code_rel}/"))?;
        let pre = match kind {
            ScriptKind::Python => self.python_pre().await?.clone(),
            ScriptKind::Wasm => {
                let bytes = match store::read_capped(&code_dir, WASM_SCRIPT, MAX_WASM_BYTES)
                    .with_context(|| format!("reading {script}"))?
                {
                    Capped::Bytes(bytes) => bytes,
                    Capped::TooLarge(size) => {
                        bail!("{script} is {size} bytes, over the limit of {MAX_WASM_BYTES}")
                    }
                };
                // Cached only once it proved to be a runnable script.
                let loaded = self.engine.open_component(&bytes, &script, None)?;
                let pre = self.instance_pre(loaded.component(), &script)?;
                self.engine.keep(&loaded);
                pre
            }
        };

        let cwd = format!("/{code_rel}");
        let grant = turn.grant.clone().read(code_host.clone(), &cwd)?;
        let execution = format!("/runs/{}/execution", run_folder.trim_matches('/'));
        let mut env = vec![
            (
                "STEP_OUTPUT_DIR".to_string(),
                format!("{execution}/{step_id}"),
            ),
            ("STEP_EXECUTION_DIR".to_string(), execution),
        ];
        if grant.db().is_some() {
            env.push(("DB_PATH".to_string(), format!("/{DB_FILE}")));
        }
        let mut variables = ws.manifest.resolved_variables(options.group.as_deref());
        variables.extend(options.variables.clone());
        let args: Vec<String> = step
            .context_dependencies
            .iter()
            .flatten()
            .map(|dep| {
                let dep = substitute(dep, &variables);
                format!("/{}", dep.trim_start_matches("./").trim_start_matches('/'))
            })
            .collect();
        env.extend(
            variables
                .into_iter()
                .map(|(name, value)| (variable_env_name(&name), value)),
        );
        // The operator's secrets, as placeholders: the host puts the value in their place
        // in request headers, for approved origins only.
        let secrets: Vec<(String, Secret)> = std::env::vars()
            .filter(|(name, value)| name.starts_with(SECRET_PREFIX) && !value.is_empty())
            .map(|(name, value)| (name, Secret::new(value)))
            .collect();
        env.extend(
            secrets
                .iter()
                .map(|(name, _)| (name.clone(), secret_placeholder(name))),
        );
        let hosts = configs
            .allowed_hosts
            .iter()
            .flatten()
            .map(|h| {
                HostRule::parse(h).map_err(|e| {
                    anyhow!("planning/step_config.json: step {step_id:?}: allowed_hosts: {e}")
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let net = (!hosts.is_empty()).then(|| ScriptNet {
            hosts,
            approvals: options.approvals.clone(),
            secrets,
        });
        let log_dir = ws
            .root
            .join("runs")
            .join(run_folder.trim_matches('/'))
            .join("logs")
            .join(step_id);
        // Refused up front, before the script runs: logs are never written through a link.
        if options.write_logs && ws.fs.kind(&log_dir)? == Some(store::Kind::Link) {
            let rel = ws.fs.relative(&log_dir)?;
            return Err(store::workspace_fs::link_error(&rel).into());
        }
        Ok(Prepared {
            kind,
            script,
            pre,
            grant,
            env,
            cwd,
            code_host,
            log_dir,
            args,
            net,
            warning,
        })
    }

    async fn execute(
        &self,
        step_id: &str,
        prepared: &Prepared,
        limits: &Limits,
    ) -> Result<ScriptOutcome> {
        let started = std::time::SystemTime::now();
        let clock = Instant::now();
        let label = format!("script:{step_id}");
        let call = sandbox::Call {
            label: &label,
            grant: &prepared.grant,
            limits,
            http: prepared
                .net
                .clone()
                .map(|net| HttpPolicy::for_script(net, limits.timeout)),
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
        let finished = sandbox::run(&self.engine, &prepared.pre, call, wasi, |pre, store| {
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
        let hide = |text: String| {
            secrets.iter().fold(text, |text, secret| {
                text.replace(secret.as_str(), "[REDACTED]")
            })
        };
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

/// The prefix of the operator's environment variables a script sees as placeholders.
pub const SECRET_PREFIX: &str = "SECRET_";

/// `text` with each workflow variable's `{{name}}`, `${name}` and `{name}` replaced by its
/// value.
fn substitute(text: &str, variables: &BTreeMap<String, String>) -> String {
    let mut out = text.to_string();
    for (name, value) in variables {
        for pattern in [
            format!("{{{{{name}}}}}"),
            format!("${{{name}}}"),
            format!("{{{name}}}"),
        ] {
            out = out.replace(&pattern, value);
        }
    }
    out
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

/// Whether step `step_id` has a script [`find_script`] would run.
pub fn has_script(fs: &store::WorkspaceFs, step_id: &str) -> bool {
    find_script(fs, step_id).is_ok()
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
    }
}

/// `VAR_<NAME>`: the name upper-cased, every character other than a letter, digit or `_`
/// replaced by `_`.
fn variable_env_name(name: &str) -> String {
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("VAR_{name}")
}

/// A guest path (`/code/step/main.py`) as the workspace-relative path it stands for.
fn workspace_relative(guest: &str) -> String {
    guest.strip_prefix('/').unwrap_or(guest).to_string()
}

fn write_logs(fs: &store::WorkspaceFs, dir: &Path, outcome: &ScriptOutcome) -> Result<()> {
    fs.write_atomic(dir.join(STDOUT_LOG), outcome.stdout.as_bytes())?;
    fs.write_atomic(dir.join(STDERR_LOG), outcome.stderr.as_bytes())?;
    let completed = rfc3339(std::time::SystemTime::now());
    fs.write_json_atomic(dir.join(RESULT_LOG), &outcome.record(&completed))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        std::fs::create_dir_all(dir.path().join("planning")).unwrap();
        std::fs::write(
            dir.path().join("planning/plan.json"),
            r#"{"steps": [{"id": "s", "type": "regular", "title": "S", "description": "d"}]}"#,
        )
        .unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let options = ScriptOptions::default();
        send(&runner.run(&ws, "s", &options));
    }

    #[test]
    fn dependencies_get_workflow_variables_substituted() {
        let vars = BTreeMap::from([("region".to_string(), "emea".to_string())]);
        assert_eq!(
            substitute("knowledge/{region}.md", &vars),
            "knowledge/emea.md"
        );
        assert_eq!(substitute("k/{{region}}/${region}", &vars), "k/emea/emea");
        assert_eq!(substitute("k/{other}.md", &vars), "k/{other}.md");
    }

    #[test]
    fn variable_names_become_env_names() {
        assert_eq!(variable_env_name("region"), "VAR_REGION");
        assert_eq!(variable_env_name("max-items.v2"), "VAR_MAX_ITEMS_V2");
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
