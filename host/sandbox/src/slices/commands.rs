//! The commands slice: `trellis:shell/commands`, linked only for the bundled shell.
//!
//! A guest cannot start a process, so the shell hands each command that is not one of its
//! builtins to the host, which runs it as a fresh instance of the bundled utilities (a
//! `wasi:cli` command whose first argument picks the utility). That instance gets exactly
//! what the calling tool call has: the same folders with the same access, the time left
//! until the call's deadline, the call's memory limit, and the call's filesystem write
//! budget (shared, so many commands cannot write more than one call may). It has no
//! network, no environment but the one the shell exports, and its own memory: nothing of
//! one command outlives it. A call runs at most [`MAX_COMMANDS`] commands.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use wasmtime::component::{HasSelf, InstancePre, Linker};
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;

use crate::call::{self, CallFailure};
use crate::capabilities::{Grant, Limits};
use crate::engine::Engine;
use crate::plugins::bindings::shell::trellis::shell::commands;
use crate::slices::fs::guard::FsBudget;
use crate::state::CallState;

/// Commands one tool call of the shell may run.
pub const MAX_COMMANDS: u32 = 10_000;
/// The most bytes of stdout, and of stderr, one command may hand back (a pipe's worth).
pub const MAX_COMMAND_OUTPUT: usize = 16 << 20;

/// The part of the time left that a command leaves its shell, at most.
const DEADLINE_RESERVE: Duration = Duration::from_secs(2);

/// The commands the bundled Python runner runs: `python3` (and `python`) as the
/// interpreter, `sqlite3` as SQLite's command-line tool over the workflow database.
pub const PYTHON_COMMANDS: &[&str] = &["python", "python3", "sqlite3"];

/// The utilities the bundled `shell_utilities` component runs, sorted. The shell's builtins
/// (`echo`, `printf`, `cd`, `test`, `read`, ...) are the interpreter's own.
pub const UTILITIES: &[&str] = &[
    "base64",
    "basename",
    "cat",
    "comm",
    "cp",
    "cut",
    "date",
    "diff",
    "dirname",
    "expand",
    "find",
    "fold",
    "grep",
    "head",
    "jq",
    "join",
    "ln",
    "ls",
    "md5sum",
    "mkdir",
    "mv",
    "nl",
    "od",
    "paste",
    "readlink",
    "realpath",
    "rm",
    "rmdir",
    "sed",
    "seq",
    "sha256sum",
    "shuf",
    "sleep",
    "sort",
    "split",
    "tac",
    "tail",
    "tee",
    "touch",
    "tr",
    "truncate",
    "uniq",
    "wc",
    "yes",
];

/// Links `commands`, once, into the shell's linker.
pub(crate) fn add_to_linker(linker: &mut Linker<CallState>) -> anyhow::Result<()> {
    commands::add_to_linker::<CallState, HasSelf<CommandsState>>(linker, |s| &mut s.commands)?;
    Ok(())
}

/// The `/` of a shell call: a read-only folder with an empty folder for each level of each
/// granted folder's path (`runs/`, `runs/<run>/`, ...). The granted folders are preopened at
/// their own paths, which win over it, so `ls /` and `cd ..` show the grant's root and
/// nothing else, and an absolute path outside the grant is simply not there.
pub(crate) struct RootView {
    dir: tempfile::TempDir,
}

impl RootView {
    /// The view of `grant`'s folders, made in a private temporary folder removed with it.
    pub(crate) fn new(grant: &Grant) -> anyhow::Result<Arc<RootView>> {
        let dir = tempfile::Builder::new()
            .prefix("trellis-shell-root-")
            .tempdir()?;
        for folder in grant.folders() {
            let relative = folder.guest.trim_start_matches('/');
            if !relative.is_empty() {
                std::fs::create_dir_all(dir.path().join(relative))?;
            }
        }
        Ok(Arc::new(RootView { dir }))
    }

    /// Adds the view to a call's WASI context as `/`, read-only.
    pub(crate) fn preopen(
        &self,
        builder: &mut wasmtime_wasi::WasiCtxBuilder,
    ) -> anyhow::Result<()> {
        builder.preopened_dir(self.dir.path(), "/", wasmtime_wasi::FsPerms::ReadOnly)?;
        Ok(())
    }
}

/// What a command of a shell call shares with the call: the write budget and the `/`.
#[derive(Clone)]
pub(crate) struct Within {
    pub(crate) budget: Arc<FsBudget>,
    pub(crate) root: Arc<RootView>,
}

/// Runs the shell's commands: the utilities component, compiled once per process on the
/// first command.
pub struct CommandHost {
    engine: Engine,
    utilities: OnceCell<InstancePre<CallState>>,
    python: OnceCell<InstancePre<CallState>>,
}

impl std::fmt::Debug for CommandHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandHost")
            .field("loaded", &self.utilities.initialized())
            .finish_non_exhaustive()
    }
}

impl CommandHost {
    /// A host for the commands of the shell on `engine`.
    pub fn new(engine: &Engine) -> Arc<Self> {
        Arc::new(CommandHost {
            engine: engine.clone(),
            utilities: OnceCell::new(),
            python: OnceCell::new(),
        })
    }

    async fn utilities(&self) -> anyhow::Result<&InstancePre<CallState>> {
        self.utilities
            .get_or_try_init(|| async {
                let component = self
                    .engine
                    .load_component(crate::bundled::SHELL_UTILITIES, "bundled:shell-utilities")?;
                let linker = super::linker(&self.engine, &[super::Slice::Fs])?;
                Ok(linker.instantiate_pre(&component)?)
            })
            .await
    }

    /// The Python script runner, linked as a step script is (its database through the
    /// `workflow-db` fences, with the call's database grant; no network: the call gives
    /// none).
    async fn python(&self) -> anyhow::Result<&InstancePre<CallState>> {
        self.python
            .get_or_try_init(|| async {
                let component = crate::script::python_runner(&self.engine)?;
                let linker = super::linker(&self.engine, super::SCRIPT)?;
                Ok(linker.instantiate_pre(&component)?)
            })
            .await
    }

    /// The instance a command runs in, and its arguments there: `python3 ARGS` runs the
    /// runner with `ARGS` (`-` when none: the code on stdin), `sqlite3 ARGS` with
    /// `sqlite3 ARGS`; a utility gets its own name first.
    async fn prepare(
        &self,
        argv: Vec<String>,
    ) -> anyhow::Result<(InstancePre<CallState>, Vec<String>)> {
        match argv[0].as_str() {
            "python" | "python3" => {
                let mut args: Vec<String> = argv[1..].to_vec();
                if args.is_empty() {
                    args.push("-".into());
                }
                Ok((self.python().await?.clone(), args))
            }
            "sqlite3" => Ok((self.python().await?.clone(), argv)),
            _ => Ok((self.utilities().await?.clone(), argv)),
        }
    }
}

/// What one call of the shell may give its commands.
pub(crate) struct CommandsState {
    context: Option<Context>,
}

struct Context {
    host: Arc<CommandHost>,
    grant: Grant,
    limits: Limits,
    deadline: Instant,
    within: Within,
    cancel: Option<CancellationToken>,
    ran: u32,
}

impl CommandsState {
    /// No commands: every `run` answers that the call may run none.
    pub(crate) fn none() -> Self {
        CommandsState { context: None }
    }

    /// The commands of one call under `grant` and `limits`, sharing its budget and `/`.
    pub(crate) fn new(
        host: Arc<CommandHost>,
        grant: &Grant,
        limits: &Limits,
        within: Within,
        cancel: Option<&CancellationToken>,
    ) -> Self {
        CommandsState {
            context: Some(Context {
                host,
                grant: grant.clone(),
                limits: *limits,
                deadline: Instant::now() + limits.timeout,
                within,
                cancel: cancel.cloned(),
                ran: 0,
            }),
        }
    }
}

fn failed(status: i32, message: String) -> commands::Output {
    commands::Output {
        status,
        stdout: Vec::new(),
        stderr: format!("{message}\n").into_bytes(),
    }
}

impl commands::Host for CommandsState {
    fn names(&mut self) -> Vec<String> {
        let mut names: Vec<String> = UTILITIES
            .iter()
            .chain(PYTHON_COMMANDS)
            .map(|n| n.to_string())
            .collect();
        names.sort_unstable();
        names
    }

    async fn run(&mut self, command: commands::Command) -> commands::Output {
        let Some(context) = self.context.as_mut() else {
            return failed(126, "this call may run no commands".into());
        };
        let Some(name) = command.argv.first().cloned() else {
            return failed(127, "an empty command".into());
        };
        if !UTILITIES.contains(&name.as_str()) && !PYTHON_COMMANDS.contains(&name.as_str()) {
            return failed(127, format!("command not found: {name}"));
        }
        if context.ran >= MAX_COMMANDS {
            return failed(
                126,
                format!(
                    "{name}: not run: this call ran the {MAX_COMMANDS} commands one call may run"
                ),
            );
        }
        context.ran += 1;
        let left = context.deadline.saturating_duration_since(Instant::now());
        // A command stopped at the deadline leaves the shell a moment to say so: the agent
        // gets what the script printed, not only a timeout.
        let left = left.saturating_sub((left / 4).min(DEADLINE_RESERVE));
        if left.is_zero() {
            return failed(
                124,
                format!("{name}: not run: the call's deadline has passed"),
            );
        }
        let (pre, argv) = match context.host.prepare(command.argv).await {
            Ok(prepared) => prepared,
            Err(err) => return failed(126, format!("{name}: did not load: {err:#}")),
        };
        let output_bytes = usize::try_from(command.output_bytes)
            .unwrap_or(usize::MAX)
            .min(MAX_COMMAND_OUTPUT);
        let limits = Limits {
            timeout: left,
            stdio_bytes: output_bytes,
            ..context.limits
        };
        let label = format!("shell:{name}");
        let call = call::Call {
            label: &label,
            grant: &context.grant,
            limits: &limits,
            http: None,
            cancel: context.cancel.as_ref(),
            commands: None,
            within: Some(context.within.clone()),
        };
        let env = command.env;
        let cwd = command.cwd;
        let stdin = command.stdin;
        let wasi = move |builder: &mut wasmtime_wasi::WasiCtxBuilder| -> anyhow::Result<()> {
            builder
                .args(&argv)
                .envs(&env)
                .env("PWD", &cwd)
                .initial_cwd(&cwd)
                .stdin(MemoryInputPipe::new(stdin));
            Ok(())
        };
        let engine = context.host.engine.clone();
        let finished = Box::pin(call::run(&engine, &pre, call, wasi, |pre, store| {
            Box::pin(async move {
                let command = CommandPre::new(pre.clone())?
                    .instantiate_async(&mut *store)
                    .await?;
                command.wasi_cli_run().call_run(store).await
            })
        }))
        .await;
        let (status, why) = match finished.result {
            Ok(Ok(())) => (0, None),
            Ok(Err(())) => (1, None),
            Err(CallFailure::Exit { code, .. }) => (code, None),
            Err(CallFailure::Timeout(_)) => (124, Some("stopped at the call's deadline".into())),
            Err(CallFailure::Cancelled) => (130, Some("cancelled".into())),
            Err(CallFailure::Memory { limit }) => (
                126,
                Some(format!("stopped at the memory limit of {limit} bytes")),
            ),
            Err(CallFailure::StackOverflow) => (126, Some("overflowed its stack".into())),
            Err(CallFailure::FsLimit(exceeded)) => (126, Some(format!("stopped: {exceeded}"))),
            Err(CallFailure::Trap { message, .. }) => (134, Some(format!("crashed: {message}"))),
            Err(CallFailure::Host(err)) => (126, Some(format!("could not start: {err:#}"))),
        };
        let (stdout, stdout_dropped) = finished.stdout.take_bytes();
        let (mut stderr, _) = finished.stderr.take_bytes();
        if stdout_dropped > 0 {
            stderr.extend_from_slice(
                format!(
                    "{name}: its output was cut at the {output_bytes} bytes a command may give\n"
                )
                .as_bytes(),
            );
        }
        if let Some(why) = why {
            stderr.extend_from_slice(format!("{name}: {why}\n").as_bytes());
        }
        commands::Output {
            status,
            stdout,
            stderr,
        }
    }
}
