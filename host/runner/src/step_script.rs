//! A step's script (spec section 7) run with the step's grant: which file, which folders
//! (the turn policy of [`crate::grants`]), which environment, and where its logs go. The
//! sandbox ([`ScriptRunner`]) runs what this decides.
//!
//! What a script sees:
//! - **Folders**: the grant of its step per spec section 6, each at its workspace-relative
//!   guest path (`/runs/iteration-0/execution/<step-id>`), plus `/code/<step-id>` read-only,
//!   which is its working directory. Nothing else exists: not `/etc`, not `planning/`.
//! - **Environment**: `STEP_OUTPUT_DIR`, `STEP_EXECUTION_DIR`, `DB_PATH` (when the workspace
//!   has a `db/` folder) and `VAR_<NAME>` for each workflow variable, as guest paths and
//!   values; nothing from the host's environment. Each `SECRET_<NAME>` of the operator's
//!   environment is there too, holding a placeholder the host replaces by the secret in
//!   request headers for the origins the operator approved for it (`--allow-key
//!   SECRET_<NAME>=ORIGIN`): the script never holds it.
//! - **Arguments**: the script's file name (`main.py` or `main.wasm`), then the step's
//!   `context_dependencies` in plan order, as the guest paths the script opens them at
//!   (`/knowledge/x.md`), workflow variables substituted.
//! - **Network**: the hosts of the step's `agent_configs.allowed_hosts` only, through the
//!   provider gate ([`ScriptNet`]); no host listed, no network.
//! - **Where the script is**: `code/<step-id>/`; a step whose script is still where the
//!   original keeps them, `learnings/<step-id>/main.py`, runs it there (read-only, its
//!   working directory) with a warning naming the move.
//! - **Database**: through the `workflow-db` interface (Python: the `trellis_db` module),
//!   read-only unless the step may modify the database.
//!
//! The outcome goes to the step's logs folder: `runs/<run>/logs/<step-id>/script-stdout.txt`,
//! `script-stderr.txt` and `script-result.json`, each written atomically.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use trellis_sandbox::capabilities::{FsLimits, Limits};
use trellis_sandbox::llm::{HostRule, KeyApprovals, ScriptNet, Secret, secret_placeholder};
use trellis_sandbox::script::{
    ScriptFile, ScriptInvocation, ScriptOutcome, ScriptRunner, find_script, write_logs,
};
use trellis_sandbox::store;
use trellis_workflow::Workspace;

use crate::grants::{
    AgentFolders, DB_FILE, TurnAccess, TurnContext, grant_for_access, grant_for_access_in,
};
use trellis_workflow::substitution::{MAX_PATH_BYTES, MAX_STEP_GROWTH, substitute_within};

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
    /// The folders the script writes to instead of the step's own output folder: a route's
    /// call folder when a regular sub-agent step is scripted (its `STEP_OUTPUT_DIR`).
    pub folders: Option<AgentFolders>,
    /// Interrupts the script's guest code when cancelled (the run's second stop).
    pub cancel: Option<tokio_util::sync::CancellationToken>,
    /// The run's write budget, which what the script writes also comes out of.
    pub run_writes: Option<trellis_sandbox::capabilities::DbWriteBudget>,
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
            folders: None,
            cancel: None,
            run_writes: None,
        }
    }
}

/// Runs the script of step `step_id` of `ws` in the run folder `ws.run_folder`
/// (`iteration-0` when none is selected): `code/<step-id>/main.wasm` if it exists, else
/// `code/<step-id>/main.py`.
///
/// A script that fails (exception, non-zero exit, timeout, memory limit, trap) is an
/// `Ok` outcome with a failure; an `Err` means the script could not be run at all: no such
/// step, no script, a grant that cannot be made, a `main.wasm` that is not a command
/// component, logs that cannot be written.
#[tracing::instrument(skip(scripts, ws, options), fields(step = step_id))]
pub async fn run(
    scripts: &ScriptRunner,
    ws: &Workspace,
    step_id: &str,
    options: &ScriptOptions,
) -> Result<ScriptOutcome> {
    let (prepared, log_dir) = prepare(ws, step_id, options)
        .with_context(|| format!("running the script of step {step_id:?}"))?;
    let outcome = scripts
        .run_cancellable(step_id, &prepared, &options.limits, options.cancel.as_ref())
        .await?;
    if options.write_logs {
        // What the logs keep comes out of the run's write budget (a run of a thousand
        // scripts each printing a megabyte wrote 2 GB of logs under a 16 MiB quota): past
        // what is left, each keeps its head, the cut marked.
        let (stdout, stderr) = match &options.run_writes {
            Some(budget) => {
                let each = usize::try_from(budget.bytes_left() / 2).unwrap_or(usize::MAX);
                let cut = |text: &str| trellis_sandbox::cut::marked(text, each);
                let (stdout, stderr) = (cut(&outcome.stdout), cut(&outcome.stderr));
                budget.charge((stdout.len() + stderr.len()) as u64);
                (Some(stdout), Some(stderr))
            }
            None => (None, None),
        };
        write_logs(
            &ws.fs,
            &log_dir,
            &outcome,
            stdout.as_deref().unwrap_or(&outcome.stdout),
            stderr.as_deref().unwrap_or(&outcome.stderr),
        )
        .with_context(|| {
            format!(
                "step {step_id:?}: writing the script's logs in {}",
                log_dir.display()
            )
        })?;
        return Ok(ScriptOutcome {
            log_dir: Some(log_dir),
            ..outcome
        });
    }
    Ok(outcome)
}

/// Everything [`run`] decides before the instance starts, and the step's logs folder.
fn prepare(
    ws: &Workspace,
    step_id: &str,
    options: &ScriptOptions,
) -> Result<(ScriptInvocation, PathBuf)> {
    let step = ws
        .plan
        .find_step(step_id)
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
    let turn = match &options.folders {
        Some(folders) => grant_for_access_in(&ctx, access, folders)?,
        None => grant_for_access(&ctx, access)?,
    };

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
    let cwd = format!("/{code_rel}");
    let mut grant = turn.grant.clone().read(code_host.clone(), &cwd)?;
    if let Some(run_writes) = &options.run_writes {
        grant = grant.with_turn_writes(run_writes);
    }
    let execution = format!("/runs/{}/execution", run_folder.trim_matches('/'));
    let output = match &options.folders {
        Some(folders) => format!("/{}", folders.output.trim_matches('/')),
        None => format!("{execution}/{step_id}"),
    };
    let mut env = vec![
        ("STEP_OUTPUT_DIR".to_string(), output),
        ("STEP_EXECUTION_DIR".to_string(), execution),
    ];
    if grant.db().is_some() {
        env.push(("DB_PATH".to_string(), format!("/{DB_FILE}")));
    }
    let mut variables = ws.manifest.resolved_variables(options.group.as_deref());
    variables.extend(options.variables.clone());
    // Each path at most 4 KiB, and what substitution adds to them all at most 1 MiB.
    let mut growth = MAX_STEP_GROWTH;
    let args = step
        .context_dependencies
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, dep)| {
            let written = dep.len();
            let most = MAX_PATH_BYTES.max(written).min(written + growth);
            let dep = substitute_within(dep, &variables, most).with_context(|| {
                format!(
                    "step {}: context_dependencies[{i}] with its workflow variables \
                     substituted would be longer than {MAX_PATH_BYTES} bytes, or the step's \
                     paths would grow by more than {MAX_STEP_GROWTH} bytes together",
                    step.id
                )
            })?;
            growth -= dep.len().saturating_sub(written);
            Ok(format!(
                "/{}",
                dep.trim_start_matches("./").trim_start_matches('/')
            ))
        })
        .collect::<Result<Vec<String>>>()?;
    if let Some((name, _)) = variables.iter().find(|(_, v)| v.contains('\0')) {
        bail!(
            "step {}: variable {name} (an answer or a workflow variable) holds a NUL character, \
             which the script's environment variable {} cannot hold",
            step.id,
            variable_env_name(name)
        );
    }
    env.extend(
        variables
            .into_iter()
            .map(|(name, value)| (variable_env_name(&name), value)),
    );
    // The operator's secrets, as placeholders: the host puts the value in their place in
    // request headers, for approved origins only.
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
    let invocation = ScriptInvocation {
        kind,
        script,
        grant,
        env,
        cwd,
        code_host,
        args,
        net,
        warning,
    };
    Ok((invocation, log_dir))
}

/// The prefix of the operator's environment variables a script sees as placeholders.
pub const SECRET_PREFIX: &str = "SECRET_";

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variable_names_become_env_names() {
        assert_eq!(variable_env_name("region"), "VAR_REGION");
        assert_eq!(variable_env_name("max-items.v2"), "VAR_MAX_ITEMS_V2");
    }
}
