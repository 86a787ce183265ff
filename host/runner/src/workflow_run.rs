//! Running a whole workflow (spec sections 1 and 2): the steps of the plan in order,
//! honouring `next_step_id` and `"end"`, in one run folder per run unit.
//!
//! `regular`, `message_sequence` and `todo_task` steps run through
//! [`StepRunner::run_step`], each with a runner of its own models ([`RunEnv::step_runner`], see [`llm_choice`]); `routing` steps
//! are deterministic switches; `human_input` steps take their answers from a map given up
//! front (a missing answer, or a step needing a model it does not have, is an error before
//! anything runs).
//!
//! Run units: `runs/iteration-0`, or with workflow.json `groups` one `iteration-0/<group>`
//! per group (the folder is the sanitized display name, else the id). A full run rotates
//! `iteration-0` first ([`start_full_run`]) and runs every unit; `--step` or `--group` runs
//! reuse `iteration-0` without rotating. The workflow variables (declared values, then the
//! group's) are part of every step's charter: a `Workflow variables` block appended to the
//! step description, which is the system prompt's first part.
//!
//! Re-runs and loops, as the original: `--step` empties the step's output folder first,
//! `--from` (and a `--group` run in the folder it keeps) that step's and every later
//! step's, before routes given with `--route` are pre-seeded. Going back to a step that
//! already ran is a jump, capped per (source, target) pair ([`MAX_JUMPS`],
//! [`MAX_HUMAN_JUMPS`] from a human_input step; a routing step's same route at most
//! [`MAX_SAME_ROUTE`] times), and each jump first moves the target's and every later step's
//! outputs to `execution/archived/run-<n>/`.
//!
//! Prerequisites (spec section 3): a step whose outcome asks to go back
//! ([`crate::prerequisites`], decided by the step runner before it writes the step's summary)
//! sends the run back to that step.
//!
//! This module runs the units in order; `env` holds what the steps share, `unit` one unit's
//! step loop, `report` what a run did, `preflight` the checks made before anything changes,
//! `routing`, `loops`, `variables` and `seed` the rest.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use crate::dispatch::{REMOTE_PROGRESS_FILE, RemoteProgress};
use crate::driver::{AgentModels, ModelResolver, StepOutcome, StepRunner};
use crate::events::{Observer, RunEvent};
use crate::llm_choice::{self, LlmSetup, check_models};
use crate::mcp_servers::{McpConfig, NoServers, ServerStarter, ToolServers};
use crate::run_folder::{ACTIVE_RUN, group_folder_name, open_group_run, start_full_run};
use crate::session::{Status, logs_dir};
use crate::steering::Steering;
use crate::step_script::ScriptOptions;
use trellis_sandbox::Limits;
use trellis_sandbox::capabilities::sql::{self, SqlAccess};
use trellis_sandbox::llm::RetryPolicy;
use trellis_sandbox::plugins::PluginRegistry;
use trellis_sandbox::script::ScriptRunner;
use trellis_sandbox::store::workspace_fs::link_error;
use trellis_sandbox::store::{Kind, WorkspaceFs};
use trellis_workflow::manifest::Group;
use trellis_workflow::plan::{HumanInput, Routing};
use trellis_workflow::{Step, StepKind, Workspace};

mod dependencies;
mod env;
mod loops;
mod preflight;
mod report;
mod routing;
mod seed;
mod unit;
mod variables;

pub use crate::prerequisites::{
    MAX_PREREQUISITE_RETURNS, PREREQUISITE_MISSING, matching_rule, prerequisite_missing,
};
use dependencies::resolve_bare_dependencies;
pub use env::RunEnv;
use loops::{archive_dir, archive_from, ordinal, steps_from};
use preflight::preflight;
pub use preflight::{check_inputs, check_step_models, missing_inputs, needs_llm};
pub use report::{DETAIL_BYTES, StepReport, UnitRun, WorkflowRun};
use routing::present;
pub use routing::{HumanAnswer, answer_human_input, human_input_file, input_key, select_route};
pub use seed::seed_database;
use unit::run_unit;
pub use variables::{
    existing_group_run_folder, give_variables_block, group_run_folder, select_groups,
    substitute_variables, take_variables_block, unit_variables, unit_variables_with_answers,
    variables_block,
};

/// The file a routing step reads from its own output folder.
pub const ROUTE_SELECTION_FILE: &str = "route_selection.json";
/// The folder of `execution/` where a loop's jump archives the outputs it would overwrite.
pub const ARCHIVED_DIR: &str = "archived";
/// Jumps back allowed per (source step, target step) pair from an agent or routing step.
pub const MAX_JUMPS: u32 = 5;
/// Jumps back allowed per pair from a `human_input` step (a review loop with a person).
pub const MAX_HUMAN_JUMPS: u32 = 25;
/// How often a routing step may select the same route in one run unit.
pub const MAX_SAME_ROUTE: u32 = 2;
/// The SQL a workspace may ship instead of a binary `db/db.sqlite`.
pub const SEED_SQL: &str = "db/seed.sql";
/// The database of a workspace.
pub const DB_FILE: &str = "db/db.sqlite";
/// A bound on steps run in one run unit, behind the per-pair jump caps.
pub const MAX_STEPS: usize = 1000;
/// A bound on steps run in one run, all its groups together: each writes a few files of
/// the host's (its session, summary, reports), so groups must not multiply them without end.
pub const MAX_RUN_STEPS: usize = 10_000;

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Run just this step, in the existing `iteration-0` (no rotation).
    pub step: Option<String>,
    /// Run just this group (id or display name), in `iteration-0/<group>` (no rotation).
    pub group: Option<String>,
    /// Answers of `human_input` steps, by `variable_name` (or step id).
    pub inputs: BTreeMap<String, String>,
    /// Routes pre-selected for routing steps (step id -> route id): written to the step's
    /// `route_selection.json` once its output folder is emptied, before it runs.
    pub route_selections: BTreeMap<String, String>,
    /// Resume from this step in the existing `iteration-0`: it and every later step (in
    /// plan order) start with empty output folders.
    pub from: Option<String>,
    /// High-priority context for the agents of these steps (step id -> text), read before
    /// the first user message of each.
    pub step_context: BTreeMap<String, String>,
    /// How often each step already sent this run back to a prerequisite (a step run on a
    /// worker carries its count from the dispatcher's run).
    pub prerequisite_returns: BTreeMap<String, u32>,
    /// With `step`: the run ends with that step even when it sends the run back to a
    /// prerequisite (a worker's run: the dispatcher's run follows the return).
    pub step_alone: bool,
}

/// `next_step_id`, else the next step in array order; `None` at the end.
fn default_next(ws: &Workspace, step: &Step) -> Option<String> {
    if let Some(n) = &step.next_step_id {
        return Some(n.clone());
    }
    let steps = &ws.plan.steps;
    let pos = steps.iter().position(|s| s.id == step.id)?;
    steps.get(pos + 1).map(|s| s.id.clone())
}

fn write_json(fs: &WorkspaceFs, path: &Path, value: &Value) -> Result<()> {
    fs.write_json_atomic(path, value)
        .with_context(|| format!("writing {}", path.display()))
}

/// The workspace at `root` with run folder `run`, or every problem its files have.
fn open_workspace(root: &Path, run: Option<&str>) -> Result<Workspace> {
    Workspace::open_run(root, run)
        .map_err(|d| anyhow::anyhow!("{}: the workspace has errors:\n{d}", root.display()))
}

/// One run unit: its group (none without groups) and its run folder under `runs/`.
type Unit<'w> = (Option<&'w Group>, String);

/// Runs the workflow at `root`: the [`preflight()`] (nothing in the workspace changes when it
/// fails), then seeds the database, rotates the run folder (a full run: no `opts.step`,
/// no `opts.group`), then runs each unit's steps, reporting each to `env.observer`
/// and unit. A unit stops at its first failed step (an `Ok` run that did not succeed);
/// errors are for a broken setup.
pub async fn run_workflow(env: &RunEnv<'_>, root: &Path, opts: &RunOptions) -> Result<WorkflowRun> {
    if !root.is_dir() {
        bail!("{}: no such workspace folder", root.display());
    }
    let started = std::time::SystemTime::now();
    let ws = open_workspace(root, None)?;
    for warning in ws.warnings.warnings() {
        env.observer.emit(RunEvent::Warning {
            message: warning.to_string(),
        });
    }
    let (groups, units, servers) = preflight(env, root, &ws, opts).await?;
    // The run's external MCP servers go with it: stopped when it ends, whichever way.
    let mut servers: Arc<dyn ToolServers> = Arc::from(servers);
    *env.mcp.lock().unwrap_or_else(|e| e.into_inner()) = Some(servers.clone());
    let mut result = run_prepared(env, root, &ws, opts, groups, units, started).await;
    // The steps' sessions, turn logs and final summaries are written behind the loop
    // (`StepRunner::with_step_ends_behind`): all on disk before the run is reported over and
    // its workspace lock let go.
    let flushed = trellis_sandbox::store::write_behind::flush()
        .context("writing the run's sessions, turn logs and step summaries");
    if let (Ok(_), Err(err)) = (&result, flushed) {
        result = Err(err);
    }
    env.mcp.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(servers) = Arc::get_mut(&mut servers) {
        servers.stop().await;
    }
    result
}

/// [`run_workflow`] once its preflight passed.
async fn run_prepared(
    env: &RunEnv<'_>,
    root: &Path,
    ws: &Workspace,
    opts: &RunOptions,
    groups: Vec<&Group>,
    units: Vec<Unit<'_>>,
    started: std::time::SystemTime,
) -> Result<WorkflowRun> {
    let full = opts.step.is_none() && opts.from.is_none() && opts.group.is_none();
    // A run killed half way leaves the temp files of the writes it cut short; they go
    // before the folder is archived or reused (the workspace lock is held: no other run
    // writes there).
    let stale = ws
        .fs
        .remove_stale_temp_files(format!("runs/{ACTIVE_RUN}"), started)
        .with_context(|| format!("removing stale temp files under runs/{ACTIVE_RUN}"))?;
    if !stale.is_empty() {
        tracing::info!(
            count = stale.len(),
            "removed the temp files of writes cut short under runs/{ACTIVE_RUN}"
        );
    }
    if seed_database(&ws.fs, &env.run_writes(root))? {
        env.observer.emit(RunEvent::DatabaseSeeded {
            database: DB_FILE.to_string(),
            seed: SEED_SQL.to_string(),
        });
    }
    let archived = if full {
        let group_folders: Vec<String> = groups
            .iter()
            .map(|g| group_folder_name(g.name.as_deref(), &g.id))
            .collect::<Result<_>>()?;
        start_full_run(root, &group_folders)?.archived
    } else {
        for (group, folder) in &units {
            match group {
                Some(_) => {
                    // The unit's folder: the group's, or the one an earlier Trellis named.
                    let group_folder = folder
                        .strip_prefix(&format!("{ACTIVE_RUN}/"))
                        .unwrap_or(folder);
                    open_group_run(root, group_folder)?;
                }
                None => ws
                    .fs
                    .create_dir_all(Path::new("runs").join(folder).join("execution"))
                    .with_context(|| format!("creating runs/{folder}/execution"))?,
            }
        }
        None
    };
    if let Some(a) = &archived {
        env.observer
            .emit(RunEvent::RunArchived { folder: a.clone() });
        let keep = ws.manifest.run_retention();
        let deleted = crate::run_folder::prune_archived_runs(root, keep)?;
        if !deleted.is_empty() {
            env.observer.emit(RunEvent::ArchivedRunsDeleted {
                folders: deleted,
                kept: keep,
            });
        }
    }
    let mut run = WorkflowRun {
        archived,
        units: Vec::new(),
        cut_short: None,
    };
    let count = units.len();
    for (n, (group, folder)) in units.into_iter().enumerate() {
        if env.cancelled() {
            break;
        }
        if let Some(why) = env.spent() {
            run.cut_short = Some(match group {
                Some(_) => format!("{why}: {} of its {count} groups did not run", count - n),
                None => why,
            });
            break;
        }
        if let Some(g) = group {
            env.observer.emit(RunEvent::GroupStarted {
                group_id: g.id.clone(),
                folder: folder.clone(),
            });
        }
        let unit = run_unit(env, root, group, &folder, opts).await?;
        run.units.push(unit);
    }
    Ok(run)
}

/// Puts each step's `validation_schema` from the step config over the plan's (the original
/// lets the step config's win, and its builder writes gates there): steps, orphans and
/// routes' sub-agent steps alike.
pub fn apply_step_config_schemas(ws: &mut Workspace) {
    fn apply(configs: &trellis_workflow::StepConfigFile, step: &mut Step, depth: usize) {
        if let Some(schema) = configs
            .get(&step.id)
            .and_then(|c| c.validation_schema.clone())
        {
            step.validation_schema = Some(schema);
        }
        if depth >= 8 {
            return;
        }
        let routes = match &mut step.kind {
            StepKind::MessageSequence(s) => &mut s.predefined_routes,
            StepKind::TodoTask(t) => &mut t.predefined_routes,
            _ => return,
        };
        for r in routes {
            apply(configs, &mut r.sub_agent_step, depth + 1);
        }
    }
    let configs = ws.step_configs.clone();
    for step in ws
        .plan
        .steps
        .iter_mut()
        .chain(ws.plan.orphan_steps.iter_mut())
    {
        apply(&configs, step, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace(root: &Path, steps: Value) -> Workspace {
        let plan = json!({"objective": "t", "steps": steps});
        std::fs::create_dir_all(root.join("planning")).unwrap();
        std::fs::write(root.join("planning/plan.json"), plan.to_string()).unwrap();
        std::fs::write(root.join("planning/step_config.json"), r#"{"steps": []}"#).unwrap();
        Workspace::open(root).unwrap()
    }

    fn routing(source: Option<&str>, default: Option<&str>) -> Value {
        let mut step = json!({"id": "pick", "type": "routing", "title": "Pick",
            "routes": [{"route_id": "a", "next_step_id": "end"},
                       {"route_id": "b", "next_step_id": "other"}]});
        if let Some(s) = source {
            step["route_source_file"] = json!(s);
        }
        if let Some(d) = default {
            step["default_route_id"] = json!(d);
        }
        step
    }

    fn select(ws: &Workspace, previous: Option<&str>) -> Result<(String, String, String)> {
        let step = ws.plan.step("pick").unwrap();
        let StepKind::Routing(r) = &step.kind else {
            panic!("routing step")
        };
        select_route(ws, step, r, previous)
    }

    #[test]
    fn route_source_file_is_read_from_the_previous_step_output() {
        let dir = tempfile::tempdir().unwrap();
        let other = json!({"id": "other", "type": "human_input", "title": "O",
            "question": "?", "variable_name": "v", "response_type": "text"});
        let ws = workspace(
            dir.path(),
            json!([routing(Some("choice.json"), Some("a")), other]),
        );
        // A declared source that does not exist fails the step (no silent default).
        let err = select(&ws, Some("prev")).unwrap_err().to_string();
        assert!(err.contains("does not exist"), "{err}");
        let prev = ws.step_output_dir("prev");
        std::fs::create_dir_all(&prev).unwrap();
        std::fs::write(prev.join("choice.json"), r#"{"select_route": "b"}"#).unwrap();
        let (route, next, _) = select(&ws, Some("prev")).unwrap();
        assert_eq!((route.as_str(), next.as_str()), ("b", "other"));
        // Its own route_selection.json wins.
        let own = ws.step_output_dir("pick");
        std::fs::create_dir_all(&own).unwrap();
        std::fs::write(own.join(ROUTE_SELECTION_FILE), r#"{"select_route": "a"}"#).unwrap();
        assert_eq!(select(&ws, Some("prev")).unwrap().0, "a");
    }

    #[test]
    fn no_selection_and_no_default_is_a_hard_error() {
        let dir = tempfile::tempdir().unwrap();
        let other = json!({"id": "other", "type": "human_input", "title": "O",
            "question": "?", "variable_name": "v", "response_type": "text"});
        let ws = workspace(dir.path(), json!([routing(None, None), other]));
        let err = select(&ws, None).unwrap_err().to_string();
        assert!(err.contains("no default_route_id"), "{err}");
    }

    #[test]
    fn inputs_of_every_reachable_human_input_step_are_required() {
        let dir = tempfile::tempdir().unwrap();
        let ask = |id: &str, var: &str| {
            json!({"id": id, "type": "human_input", "title": id, "question": "?",
                "variable_name": var, "response_type": "text"})
        };
        let ws = workspace(
            dir.path(),
            json!([routing(None, Some("a")), ask("other", "x")]),
        );
        let mut opts = RunOptions::default();
        let err = check_inputs(&ws, &opts).unwrap_err().to_string();
        assert!(err.contains("--input x=VALUE"), "{err}");
        assert!(!needs_llm(&ws, None));
        opts.inputs.insert("x".into(), "1".into());
        check_inputs(&ws, &opts).unwrap();
    }

    #[test]
    fn variables_are_appended_to_the_charter_of_the_step_running() {
        let dir = tempfile::tempdir().unwrap();
        let ws = workspace(
            dir.path(),
            json!([{"id": "s", "type": "regular", "title": "S", "description": "Do it."}]),
        );
        let variables = unit_variables(&ws, None);
        assert_eq!(variables_block(&variables, None), None);
        std::fs::write(
            dir.path().join("workflow.json"),
            r#"{"variables": {"A": "1", "B": "2"}, "groups": [{"id": "g", "variables": {"B": "3"}}]}"#,
        )
        .unwrap();
        let mut ws = Workspace::open(dir.path()).unwrap();
        let group = ws.manifest.groups[0].clone();
        let variables = unit_variables(&ws, Some(&group));
        let block = variables_block(&variables, Some(&group));
        let given = give_variables_block(&mut ws, "s", block.as_deref());
        assert_eq!(
            ws.plan.steps[0].description.as_deref(),
            Some("Do it.\n\nWorkflow variables (group g):\n- A = 1\n- B = 3")
        );
        take_variables_block(&mut ws, given);
        assert_eq!(ws.plan.steps[0].description.as_deref(), Some("Do it."));
        assert_eq!(
            give_variables_block(&mut ws, "not-a-step", block.as_deref()),
            None
        );
    }

    #[test]
    fn a_missing_database_is_created_from_seed_sql() {
        let dir = tempfile::tempdir().unwrap();
        let fs = WorkspaceFs::open(dir.path()).unwrap();
        let budget = trellis_sandbox::capabilities::DbWriteBudget::new(
            trellis_sandbox::capabilities::FsLimits::DEFAULT,
        );
        assert!(
            !seed_database(&fs, &budget).unwrap(),
            "no seed: nothing to do"
        );
        std::fs::create_dir_all(dir.path().join("db")).unwrap();
        std::fs::write(
            dir.path().join(SEED_SQL),
            "CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (7);",
        )
        .unwrap();
        assert!(seed_database(&fs, &budget).unwrap());
        let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
        let x: i64 = conn.query_row("SELECT x FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(x, 7);
        assert!(
            !seed_database(&fs, &budget).unwrap(),
            "an existing db is kept"
        );

        // An empty file holds no data: it is seeded over, unless a write-ahead log beside it
        // may hold some.
        drop(conn);
        std::fs::write(dir.path().join(DB_FILE), "").unwrap();
        std::fs::write(dir.path().join("db/db.sqlite-wal"), "").unwrap();
        assert!(!seed_database(&fs, &budget).unwrap());
        std::fs::remove_file(dir.path().join("db/db.sqlite-wal")).unwrap();
        assert!(seed_database(&fs, &budget).unwrap());
        let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
        let x: i64 = conn.query_row("SELECT x FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(x, 7);
    }
}
