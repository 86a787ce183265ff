//! Running a whole workflow (spec section 2): the steps of the plan in order, honouring
//! `next_step_id` and `"end"`.
//!
//! `regular` and `message_sequence` steps run through [`StepRunner::run_step`]; `routing`
//! steps are deterministic switches; `human_input` steps take their answers from a map given
//! up front (a missing answer is an error before anything runs). A full run rotates
//! `runs/iteration-0` first ([`start_full_run`]); a single-step run reuses `iteration-0`.
//! Not here yet: `todo_task` steps, groups, live per-turn progress.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::llm::{Message, Role};
use crate::sequence::driver::{StepOutcome, StepRunner};
use crate::sequence::run_folder::{ACTIVE_RUN, start_full_run};
use crate::sequence::session::{Session, Status};
use crate::workflow::plan::{HumanInput, Routing};
use crate::workflow::{Step, StepKind, Workspace};

/// The file a routing step reads from its own output folder.
pub const ROUTE_SELECTION_FILE: &str = "route_selection.json";
/// The file a human_input step writes its answer to, in its output folder.
pub const HUMAN_INPUT_FILE: &str = "human_input.json";
/// The SQL a workspace may ship instead of a binary `db/db.sqlite`.
pub const SEED_SQL: &str = "db/seed.sql";
/// The database of a workspace.
pub const DB_FILE: &str = "db/db.sqlite";
/// A bound on steps run in one workflow run (a loop in `next_step_id` ends here).
pub const MAX_STEPS: usize = 1000;

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Run just this step, in the existing `iteration-0` (no rotation).
    pub step: Option<String>,
    /// Answers of `human_input` steps, by `variable_name` (or step id).
    pub inputs: BTreeMap<String, String>,
}

/// How one step of the workflow ended.
#[derive(Debug, Clone)]
pub struct StepReport {
    /// The step id.
    pub step_id: String,
    /// The step type.
    pub step_type: &'static str,
    /// `completed` or `failed` (or `stopped`).
    pub status: Status,
    /// One line: the route taken, the answer given, the agent's error.
    pub detail: String,
    /// The step output folder.
    pub output_dir: PathBuf,
    /// The agent loop's outcome, for agent steps.
    pub outcome: Option<StepOutcome>,
}

/// What a workflow run did.
#[derive(Debug, Clone)]
pub struct WorkflowRun {
    /// Where the previous `iteration-0` went, if a full run rotated one.
    pub archived: Option<String>,
    /// The run folder, `runs/iteration-0`.
    pub run_dir: PathBuf,
    /// The steps run, in order.
    pub steps: Vec<StepReport>,
}

impl WorkflowRun {
    /// Whether every step run completed.
    pub fn succeeded(&self) -> bool {
        self.steps.iter().all(|s| s.status == Status::Completed)
    }
}

/// The key a human_input step's answer is given under: its `variable_name`, else its id.
pub fn input_key<'s>(step: &'s Step, h: &'s HumanInput) -> &'s str {
    h.variable_name.as_deref().unwrap_or(&step.id)
}

/// The steps a run would visit from `start` if every branch were taken (routes, yes/no and
/// option routes, `next_step_id`, array order).
fn reachable<'w>(ws: &'w Workspace, start: Option<&str>) -> Vec<&'w Step> {
    let steps = &ws.plan.steps;
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut todo: Vec<String> = match start {
        Some(s) => vec![s.to_string()],
        None => steps.first().map(|s| s.id.clone()).into_iter().collect(),
    };
    while let Some(id) = todo.pop() {
        if id == "end" || !seen.insert(id.clone()) {
            continue;
        }
        let Some(step) = ws.plan.step(&id) else {
            continue;
        };
        out.push(step);
        if start.is_some() {
            break;
        }
        let mut next: Vec<String> = Vec::new();
        match &step.kind {
            StepKind::Routing(r) => next.extend(r.routes.iter().map(|r| r.next_step_id.clone())),
            StepKind::HumanInput(h) => {
                next.extend(h.if_yes_next_step_id.clone());
                next.extend(h.if_no_next_step_id.clone());
                next.extend(h.option_routes.iter().flat_map(|m| m.values().cloned()));
            }
            _ => {}
        }
        next.extend(default_next(ws, step));
        todo.extend(next);
    }
    out
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

/// Checks up front that every reachable `human_input` step has its answer.
pub fn check_inputs(ws: &Workspace, opts: &RunOptions) -> Result<()> {
    let mut missing = Vec::new();
    for step in reachable(ws, opts.step.as_deref()) {
        if let StepKind::HumanInput(h) = &step.kind {
            let key = input_key(step, h);
            if !opts.inputs.contains_key(key) {
                missing.push(format!(
                    "step {:?} needs --input {key}=VALUE{}",
                    step.id,
                    h.question
                        .as_deref()
                        .map(|q| format!(" ({q})"))
                        .unwrap_or_default()
                ));
            }
        }
    }
    if !missing.is_empty() {
        bail!("missing human input: {}", missing.join("; "));
    }
    Ok(())
}

/// Whether any reachable step runs the agent loop (and so needs an LLM).
pub fn needs_llm(ws: &Workspace, step: Option<&str>) -> bool {
    reachable(ws, step).iter().any(|s| {
        matches!(
            s.kind,
            StepKind::MessageSequence(_) | StepKind::Regular | StepKind::TodoTask(_)
        )
    })
}

/// Creates `db/db.sqlite` from `db/seed.sql` when the database is missing and the seed
/// exists: a workspace may ship SQL instead of a binary database. Returns whether it did.
pub fn seed_database(root: &Path) -> Result<bool> {
    let db = root.join(DB_FILE);
    let seed = root.join(SEED_SQL);
    if db.exists() || !seed.is_file() {
        return Ok(false);
    }
    let sql =
        std::fs::read_to_string(&seed).with_context(|| format!("reading {}", seed.display()))?;
    let tmp = root.join("db/.db.sqlite.seeding");
    let _ = std::fs::remove_file(&tmp);
    let conn =
        rusqlite::Connection::open(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    conn.execute_batch(&sql)
        .with_context(|| format!("running {}", seed.display()))?;
    drop(conn);
    std::fs::rename(&tmp, &db).with_context(|| format!("creating {}", db.display()))?;
    Ok(true)
}

fn read_selection(path: &Path) -> Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value: Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    value
        .get("select_route")
        .and_then(Value::as_str)
        .map(str::to_string)
        .with_context(|| format!("{}: no string \"select_route\"", path.display()))
}

/// Picks the route of a routing step (spec section 2): `route_selection.json` in its own
/// output folder, else `route_source_file` (relative to the previous step's output folder,
/// else to `execution/`), else `default_route_id`. Returns `(route_id, next_step_id, how)`.
pub fn select_route(
    ws: &Workspace,
    step: &Step,
    routing: &Routing,
    previous: Option<&str>,
) -> Result<(String, String, String)> {
    let own = ws.step_output_dir(&step.id).join(ROUTE_SELECTION_FILE);
    let (route_id, how) = if own.is_file() {
        (read_selection(&own)?, ROUTE_SELECTION_FILE.to_string())
    } else if let Some(source) = routing.route_source_file.as_deref().and_then(|file| {
        let exec = ws.run_dir().join("execution");
        previous
            .map(|p| exec.join(p).join(file))
            .into_iter()
            .chain([exec.join(file)])
            .find(|p| p.is_file())
    }) {
        (read_selection(&source)?, source.display().to_string())
    } else if let Some(default) = &routing.default_route_id {
        (default.clone(), "default_route_id".to_string())
    } else {
        bail!(
            "routing step {:?}: no {ROUTE_SELECTION_FILE}, no route_source_file found and no default_route_id",
            step.id
        );
    };
    let route = routing
        .routes
        .iter()
        .find(|r| r.route_id == route_id)
        .with_context(|| {
            format!(
                "routing step {:?}: route {route_id:?} (from {how}) matches none of {:?}",
                step.id,
                routing
                    .routes
                    .iter()
                    .map(|r| r.route_id.as_str())
                    .collect::<Vec<_>>()
            )
        })?;
    Ok((route_id, route.next_step_id.clone(), how))
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    let parent = path.parent().context("no parent folder")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// Runs the workflow at `root`: checks the inputs, seeds the database, rotates the run
/// folder (unless `opts.step`), then runs the steps, calling `progress` with one line per
/// step. Stops at the first failed step (an `Ok` run whose last step failed); errors are for
/// a broken setup.
pub async fn run_workflow(
    runner: &StepRunner<'_>,
    root: &Path,
    opts: &RunOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<WorkflowRun> {
    let ws =
        Workspace::open(root).map_err(|d| anyhow::anyhow!("the workspace has errors:\n{d}"))?;
    if let Some(step) = &opts.step {
        ws.plan
            .step(step)
            .with_context(|| format!("no step {step:?} in the plan"))?;
    }
    check_inputs(&ws, opts)?;
    if seed_database(root)? {
        progress(&format!("created {DB_FILE} from {SEED_SQL}"));
    }
    let archived = if opts.step.is_none() {
        start_full_run(root, &[])?.archived
    } else {
        std::fs::create_dir_all(root.join("runs").join(ACTIVE_RUN).join("execution"))?;
        None
    };
    if let Some(a) = &archived {
        progress(&format!("previous run moved to runs/{a}"));
    }
    let ws = Workspace::open_run(root, Some(ACTIVE_RUN))
        .map_err(|d| anyhow::anyhow!("the workspace has errors:\n{d}"))?;
    let mut run = WorkflowRun {
        archived,
        run_dir: ws.run_dir(),
        steps: Vec::new(),
    };
    let mut current = match &opts.step {
        Some(s) => Some(s.clone()),
        None => ws.plan.steps.first().map(|s| s.id.clone()),
    };
    let mut previous: Option<String> = None;
    while let Some(id) = current.take() {
        if id == "end" {
            break;
        }
        if run.steps.len() >= MAX_STEPS {
            bail!("more than {MAX_STEPS} steps run: is there a loop in next_step_id?");
        }
        let step = ws
            .plan
            .step(&id)
            .with_context(|| format!("next step {id:?} is not in the plan"))?;
        progress(&format!("step {id} ({}): started", step.type_name()));
        let output_dir = ws.step_output_dir(&id);
        let (report, next) = match &step.kind {
            StepKind::MessageSequence(_) | StepKind::Regular => {
                let outcome = runner.run_step(&ws, &id).await?;
                for line in agent_step_lines(&outcome.output_dir) {
                    progress(&line);
                }
                let detail = match &outcome.error {
                    Some(e) => e.clone(),
                    None => format!("{} turn(s)", outcome.turns),
                };
                let report = StepReport {
                    step_id: id.clone(),
                    step_type: step.type_name(),
                    status: outcome.status,
                    detail,
                    output_dir: outcome.output_dir.clone(),
                    outcome: Some(outcome),
                };
                (report, default_next(&ws, step))
            }
            StepKind::Routing(routing) => {
                let (route, next, how) = select_route(&ws, step, routing, previous.as_deref())?;
                let report = StepReport {
                    step_id: id.clone(),
                    step_type: step.type_name(),
                    status: Status::Completed,
                    detail: format!("route {route} (from {how}) -> {next}"),
                    output_dir,
                    outcome: None,
                };
                (report, Some(next))
            }
            StepKind::HumanInput(h) => {
                let key = input_key(step, h);
                let answer = opts
                    .inputs
                    .get(key)
                    .with_context(|| format!("step {id:?}: no --input {key}=VALUE"))?;
                write_json(
                    &output_dir.join(HUMAN_INPUT_FILE),
                    &json!({"variable_name": key, "question": h.question, "answer": answer}),
                )?;
                let lower = answer.trim().to_ascii_lowercase();
                let next = if matches!(lower.as_str(), "yes" | "y" | "true")
                    && h.if_yes_next_step_id.is_some()
                {
                    h.if_yes_next_step_id.clone()
                } else if matches!(lower.as_str(), "no" | "n" | "false")
                    && h.if_no_next_step_id.is_some()
                {
                    h.if_no_next_step_id.clone()
                } else if let Some(n) = h.option_routes.as_ref().and_then(|m| m.get(answer)) {
                    Some(n.clone())
                } else {
                    default_next(&ws, step)
                };
                let report = StepReport {
                    step_id: id.clone(),
                    step_type: step.type_name(),
                    status: Status::Completed,
                    detail: format!("{key} = {answer:?}"),
                    output_dir,
                    outcome: None,
                };
                (report, next)
            }
            StepKind::TodoTask(_) => bail!("step {id:?}: todo_task steps are not supported yet"),
        };
        progress(&format!(
            "step {id}: {} ({})",
            status_name(report.status),
            report.detail
        ));
        let done = report.status != Status::Completed;
        run.steps.push(report);
        if done || opts.step.is_some() {
            break;
        }
        previous = Some(id);
        current = next;
    }
    Ok(run)
}

fn short(text: &str, max: usize) -> String {
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    if line.chars().count() > max {
        format!("{}...", line.chars().take(max).collect::<String>())
    } else {
        line.to_string()
    }
}

/// Plain progress lines of an agent step, from its `session.json`: one per turn (the user
/// message), one per tool call, then one per item or turn entry with its status.
pub fn agent_step_lines(output_dir: &Path) -> Vec<String> {
    let Ok(Some(session)) = Session::read(output_dir) else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    let mut turn = 0;
    for message in &session.conversation_history {
        let Ok(message) = serde_json::from_value::<Message>(message.clone()) else {
            continue;
        };
        match message.role {
            Role::User => {
                turn += 1;
                lines.push(format!("  turn {turn}: {}", short(&message.content, 70)));
            }
            Role::Assistant => {
                for call in &message.tool_calls {
                    let args = serde_json::from_str::<Value>(&call.arguments)
                        .ok()
                        .and_then(|v| v.get("path").and_then(Value::as_str).map(str::to_string))
                        .map(|p| format!("path={p}"))
                        .unwrap_or_else(|| short(&call.arguments, 60));
                    lines.push(format!("    tool {} {args}", call.name));
                }
            }
            _ => {}
        }
    }
    for entry in &session.entries {
        lines.push(format!(
            "  {} {} ({}): {}",
            entry.item_type,
            entry.entry_id,
            status_name(entry.status),
            entry
                .summary
                .as_deref()
                .map(|s| short(s, 60))
                .unwrap_or_default()
        ));
    }
    lines
}

/// The snake_case name of a status.
pub fn status_name(status: Status) -> &'static str {
    match status {
        Status::Running => "running",
        Status::Completed => "completed",
        Status::Failed => "failed",
        Status::Stopped => "stopped",
        Status::Skipped => "skipped",
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
        assert_eq!(select(&ws, Some("prev")).unwrap().0, "a", "the default");
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
    fn a_missing_database_is_created_from_seed_sql() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            !seed_database(dir.path()).unwrap(),
            "no seed: nothing to do"
        );
        std::fs::create_dir_all(dir.path().join("db")).unwrap();
        std::fs::write(
            dir.path().join(SEED_SQL),
            "CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (7);",
        )
        .unwrap();
        assert!(seed_database(dir.path()).unwrap());
        let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
        let x: i64 = conn.query_row("SELECT x FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(x, 7);
        assert!(
            !seed_database(dir.path()).unwrap(),
            "an existing db is kept"
        );
    }
}
