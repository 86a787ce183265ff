//! Reading what runs left behind, for `trellis runs list` and `trellis runs show`.
//!
//! Everything here only reads: the run folders under `runs/`, each step's
//! `execution-final-summary.json` (beside its turn logs in `logs/<step>/execution/`, else in
//! `execution/<step>/`) and `session.json` under `execution/<step>/`, and the turn logs under
//! `logs/<step>/execution/`, or `logs/<step>/` in a run folder of the earlier layout (see
//! [`super::session`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::dispatch::REMOTE_PROGRESS_FILE;
pub use super::dispatch::RemoteProgress;
use super::session::{
    FINAL_SUMMARY_FILE, FinalSummary, Session, SessionEntry, Status, TurnSummary, logs_dir,
    turn_log_dirs, turn_log_paths, turn_logs_dir,
};
use trellis_sandbox::store::{Kind, WorkspaceFs};

/// One run folder and the steps found in its `execution/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunListing {
    /// Relative to `runs/`: `iteration-N` or `iteration-N/<group>`.
    pub run_folder: String,
    /// The steps, by id.
    pub steps: Vec<StepState>,
}

/// How a step of a run ended, as far as its files tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepState {
    /// The step id (its folder under `execution/`).
    pub step_id: String,
    /// The final summary's status, else session.json's, else `no summary`.
    pub status: String,
    /// The final summary's `completed_at`.
    pub completed_at: Option<String>,
}

/// One turn, from its log files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnLog {
    /// The item the turn belongs to (a reflection or repair turn has an id of its own).
    pub item_id: String,
    /// The attempt of the step.
    pub attempt: u32,
    /// The turn within the attempt.
    pub iteration: u32,
    /// The summary file.
    pub path: PathBuf,
    /// `provider:model` of the last LLM call.
    pub model: String,
    /// How the turn ended.
    pub status: Status,
    /// LLM calls made.
    pub llm_calls: u64,
    /// Tool calls made.
    pub tool_calls: u64,
    /// Tool calls that failed.
    pub tool_errors: u64,
    /// The names of the tool calls, in order (from the conversation file, when there is one).
    pub tool_names: Vec<String>,
    /// Why the conversation file was not read (too large, not JSON): the turn is still
    /// shown from its summary.
    pub conversation_unread: Option<String>,
    /// Prompt tokens of all LLM calls.
    pub prompt_tokens: u64,
    /// Completion tokens of all LLM calls.
    pub completion_tokens: u64,
    /// How long the turn took.
    pub duration_ms: u64,
}

/// What `runs show` prints about one step of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// Relative to `runs/`.
    pub run_folder: String,
    /// The step id.
    pub step_id: String,
    /// As in [`StepState`].
    pub status: String,
    /// The final summary's `completed_at`.
    pub completed_at: Option<String>,
    /// The final summary's concerns.
    pub concerns: Vec<String>,
    /// The entries of session.json (none without one).
    pub entries: Vec<SessionEntry>,
    /// Why session.json, which is there, could not be read (its entries are then none).
    pub session_unreadable: Option<String>,
    /// The turns, by attempt and iteration.
    pub turns: Vec<TurnLog>,
    /// The logs of the step's last script run (`script-result.json`, `script-stdout.txt`,
    /// `script-stderr.txt`), those that exist.
    pub script_logs: Vec<PathBuf>,
    /// The files of the step's output folder (its sub-agents' included), workspace-relative,
    /// without the session and summary files.
    pub outputs: Vec<PathBuf>,
    /// The last attempt of each gate (`pre_validation_<label>_attempt_<n>.json`), in the
    /// order of the files' names.
    pub gates: Vec<GateResult>,
    /// The sub-agent calls the step made, in order.
    pub sub_agent_calls: Vec<SubAgentCall>,
    /// The turns of the step's sub-agents (their logs under `logs/<step>/agents/`).
    pub sub_agent_turns: usize,
    /// What the step did so far on the worker running it (`trellis run --dispatch`), while
    /// it runs there.
    pub remote: Option<RemoteProgress>,
}

/// The last attempt of one gate of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct GateResult {
    /// The gate's label (the prevalidation item's id, `final`, or a sub-agent call's).
    pub label: String,
    /// Its attempt number.
    pub attempt: u64,
    /// Whether every check passed.
    pub passed: bool,
    /// How many checks ran.
    pub checks: usize,
    /// The checks that failed, in full.
    pub failed: Vec<FailedCheck>,
}

/// One failing check of a gate, as its report records it.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedCheck {
    /// The file checked.
    pub file: String,
    /// The JSON path, when the check has one.
    pub path: String,
    /// What the check wanted.
    pub expected: String,
    /// What it found.
    pub actual: String,
    /// The check's message.
    pub message: String,
}

/// One `call_sub_agent` of a step, from its result in the step's conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct SubAgentCall {
    /// The route called.
    pub route_id: String,
    /// The call's id (`call-0001`).
    pub call_id: String,
    /// How it ended.
    pub status: String,
    /// Its error, if it failed.
    pub error: Option<String>,
    /// The files it wrote.
    pub files: Vec<String>,
}

/// The first line of an entry's summary, or empty.
pub fn first_line(summary: Option<&str>) -> &str {
    summary.and_then(|s| s.lines().next()).unwrap_or("")
}

/// Every run folder under `root/runs/`: `iteration-0` first, then `iteration-N` descending,
/// then other folders by name; each followed by its group folders (sub-folders with an
/// `execution/`). Empty when there is no `runs/`.
pub fn list_runs(root: &Path) -> Result<Vec<RunListing>> {
    if !root.is_dir() {
        return Ok(Vec::new());
    }
    let fs = &reader(root)?;
    let runs = root.join("runs");
    if fs.kind(&runs)?.is_none() {
        return Ok(Vec::new());
    }
    let mut tops: Vec<(u64, String)> = Vec::new();
    for name in dir_names(fs, &runs)? {
        let key = name
            .strip_prefix("iteration-")
            .and_then(|n| n.parse::<u64>().ok())
            .map(|n| if n == 0 { 0 } else { u64::MAX - n })
            .unwrap_or(u64::MAX);
        tops.push((key, name));
    }
    tops.sort();
    let order = plan_order(fs, root);
    let held = crate::workspace_lock::is_held(root);
    let mut out = Vec::new();
    for (_, top) in tops {
        let dir = runs.join(&top);
        if fs.is_dir(dir.join("execution")) {
            out.push(listing(fs, held, &dir, top.clone(), &order)?);
        }
        for group in dir_names(fs, &dir)? {
            if group == "execution" || group == "logs" {
                continue;
            }
            let gdir = dir.join(&group);
            if fs.is_dir(gdir.join("execution")) {
                out.push(listing(fs, held, &gdir, format!("{top}/{group}"), &order)?);
            }
        }
    }
    Ok(out)
}

/// The step ids of `planning/plan.json` in plan order (empty when it cannot be read).
fn plan_order(fs: &WorkspaceFs, root: &Path) -> Vec<String> {
    fs.read_json_text(root.join(trellis_workflow::PLAN_FILE))
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|plan| {
            plan["steps"].as_array().map(|steps| {
                steps
                    .iter()
                    .filter_map(|s| s["id"].as_str().map(str::to_string))
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// The steps of one run folder, in plan order (steps the plan no longer has last, by name).
fn listing(
    fs: &WorkspaceFs,
    held: bool,
    run_dir: &Path,
    run_folder: String,
    order: &[String],
) -> Result<RunListing> {
    let exec = run_dir.join("execution");
    let mut steps = Vec::new();
    for step in dir_names(fs, &exec)? {
        // Not steps: the shared downloads, and the outputs a loop's jumps moved away.
        if step == "Downloads" || step == crate::workflow_run::ARCHIVED_DIR {
            continue;
        }
        let (status, completed_at, _) = step_state(fs, run_dir, &step, held)?;
        steps.push(StepState {
            step_id: step,
            status,
            completed_at,
        });
    }
    steps.sort_by_key(|s| {
        (
            order
                .iter()
                .position(|id| *id == s.step_id)
                .unwrap_or(usize::MAX),
            s.step_id.clone(),
        )
    });
    Ok(RunListing { run_folder, steps })
}

/// Bytes of run files one listing or one `show` reads at most (a file counted at its
/// length, every hard link of it again), and the seconds it may work.
pub const READ_BYTES: u64 = 1 << 30;
const READ_SECONDS: u64 = 60;

/// The workspace, its reads charged to one budget of [`READ_BYTES`].
fn reader(root: &Path) -> Result<WorkspaceFs> {
    Ok(WorkspaceFs::open(root)?.with_work(std::sync::Arc::new(
        trellis_sandbox::store::HostWork::new(
            "this command",
            READ_BYTES,
            std::time::Duration::from_secs(READ_SECONDS),
        ),
    )))
}

/// The status of a step whose final summary or session does not read (the text says which
/// and why).
pub const UNREADABLE: &str = "unreadable";

/// What a step whose session.json says `running` is when no process holds the workspace
/// lock: its run was killed (the OS dropped the lock), so the step never ends.
pub const INTERRUPTED: &str = "interrupted";

/// (status, completed_at, concerns) of step `step` of `run_dir`: its final summary in
/// `logs/<step>/execution/`, else in `execution/<step>/` (the earlier layout), else its
/// session; a `running` session while no process holds the workspace (`held` false) is
/// [`INTERRUPTED`].
fn step_state(
    fs: &WorkspaceFs,
    run_dir: &Path,
    step: &str,
    held: bool,
) -> Result<(String, Option<String>, Vec<String>)> {
    // A run of this process may still have the summary queued.
    trellis_sandbox::store::write_behind::flush()?;
    let step_dir = run_dir.join("execution").join(step);
    let candidates = [
        turn_logs_dir(&logs_dir(run_dir, step)).join(FINAL_SUMMARY_FILE),
        step_dir.join(FINAL_SUMMARY_FILE),
    ];
    // A step's folder is its guest's to write (a step script run by `trellis script` leaves
    // what it wrote there): a summary or session that does not read is this step's status,
    // said, not an error that hides every other step.
    for summary_path in candidates {
        // A summary is a file: anything else there (a folder an agent made) is not read as one.
        if fs.kind(&summary_path)? == Some(Kind::File) {
            let state =
                read_json::<serde_json::Value>(fs, &summary_path).and_then(final_summary_state);
            return Ok(state.unwrap_or_else(|e| {
                (
                    format!("{UNREADABLE} ({FINAL_SUMMARY_FILE}: {e:#})"),
                    None,
                    Vec::new(),
                )
            }));
        }
    }
    let step_dir = step_dir.as_path();
    let status = match Session::read(fs, step_dir) {
        Ok(Some(s)) if s.status == Status::Running && !held => INTERRUPTED.to_string(),
        Ok(Some(s)) => s.status.to_string(),
        Ok(None) => match remote_progress(fs, run_dir, step) {
            Some(_) if !held => INTERRUPTED.to_string(),
            Some(RemoteProgress {
                worker: Some(worker),
                ..
            }) => format!("running on worker {worker}"),
            Some(_) => "waiting for a worker".to_string(),
            None => "no summary".to_string(),
        },
        Err(e) => format!("{UNREADABLE} (session.json: {e:#})"),
    };
    Ok((status, None, Vec::new()))
}

/// What step `step` of `run_dir` did so far on a worker, from the file its dispatcher keeps
/// while it runs there ([`REMOTE_PROGRESS_FILE`]); `None` without one or when it does not
/// read (a view, never an error).
fn remote_progress(fs: &WorkspaceFs, run_dir: &Path, step: &str) -> Option<RemoteProgress> {
    let path = logs_dir(run_dir, step).join(REMOTE_PROGRESS_FILE);
    if fs.kind(&path).ok()? != Some(Kind::File) {
        return None;
    }
    read_json(fs, &path).ok()
}

/// Status, end time and concerns of a final summary: Trellis's own, or one the original
/// system wrote (`step_id`, `run_folder`, `execution_result`, with neither status nor
/// concerns: the original writes it when the step completed, and its concerns are the
/// `CONCERNS:` lines of the result, as its readers take them).
fn final_summary_state(
    summary: serde_json::Value,
) -> Result<(String, Option<String>, Vec<String>)> {
    if summary.get("schema_version").is_some() {
        let summary: FinalSummary = serde_json::from_value(summary)?;
        return Ok((
            summary.status.to_string(),
            Some(summary.completed_at),
            summary.concerns,
        ));
    }
    let Some(result) = summary.get("execution_result").and_then(|r| r.as_str()) else {
        bail!(
            "not a final summary: it has neither `schema_version` (Trellis's) nor an \
             `execution_result` string (the original system's)"
        );
    };
    let text = |key: &str| {
        summary
            .get(key)
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    let status = text("status").unwrap_or_else(|| Status::Completed.to_string());
    let at = text("completed_at").or_else(|| text("timestamp"));
    Ok((status, at, crate::driver::scan_reply(result).1))
}

/// One step of one run: its status, concerns, session entries and turns. `run` is relative
/// to `runs/` (e.g. `iteration-0`, `iteration-2/Team_A`).
pub fn show_step(root: &Path, run: &str, step: &str) -> Result<StepReport> {
    trellis_workflow::check_run_selection(run).map_err(|e| anyhow::anyhow!("--run: {e}"))?;
    trellis_sandbox::store::check_relative(step)
        .map_err(|e| anyhow::anyhow!("step {step:?}: {e}"))?;
    let fs = &reader(root)?;
    let run_dir = root.join("runs").join(run);
    if !fs.is_dir(&run_dir) {
        fs.kind(&run_dir)?;
        bail!("no run folder {}", run_dir.display());
    }
    let step_dir = run_dir.join("execution").join(step);
    if !fs.is_dir(&step_dir) {
        fs.kind(&step_dir)?;
        bail!(
            "no step {step:?} in this run: {} does not exist",
            step_dir.display()
        );
    }
    let held = crate::workspace_lock::is_held(root);
    let (status, completed_at, concerns) = step_state(fs, &run_dir, step, held)?;
    let (entries, session_unreadable) = match Session::read(fs, &step_dir) {
        Ok(session) => (session.map(|s| s.entries).unwrap_or_default(), None),
        Err(e) => (Vec::new(), Some(format!("{e:#}"))),
    };
    let logs = logs_dir(&run_dir, step);
    let turns = turn_logs(fs, &logs)?;
    let mut sub_agent_turns = 0;
    let agents = logs.join("agents");
    if fs.is_dir(&agents) {
        for route in dir_names(fs, &agents)? {
            sub_agent_turns += turn_logs(fs, &agents.join(route))?.len();
        }
    }
    let mut outputs = Vec::new();
    files_under(fs, root, &step_dir, &mut outputs)?;
    let gates = gate_results(fs, &logs)?;
    let sub_agent_calls = sub_agent_calls(fs, &step_dir)?;
    let script_logs = [
        trellis_sandbox::script::RESULT_LOG,
        trellis_sandbox::script::STDOUT_LOG,
        trellis_sandbox::script::STDERR_LOG,
    ]
    .iter()
    .map(|name| logs.join(name))
    .filter(|path| fs.is_file(path))
    .collect();
    Ok(StepReport {
        run_folder: run.to_string(),
        step_id: step.to_string(),
        status,
        completed_at,
        concerns,
        entries,
        session_unreadable,
        turns,
        script_logs,
        outputs,
        gates,
        sub_agent_calls,
        sub_agent_turns,
        remote: remote_progress(fs, &run_dir, step),
    })
}

/// The files under `dir`, workspace-relative, sorted; session and summary files left out,
/// links neither listed nor followed, at most [`MAX_WALK_DEPTH`] folders down.
///
/// [`MAX_WALK_DEPTH`]: trellis_sandbox::store::workspace_fs::MAX_WALK_DEPTH
fn files_under(fs: &WorkspaceFs, root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    fs.walk(dir, |path, kind| {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if kind == Kind::File && name != "session.json" && name != FINAL_SUMMARY_FILE {
            out.push(path.strip_prefix(root).unwrap_or(path).to_path_buf());
        }
        kind == Kind::Dir
    })
    .with_context(|| format!("reading {}", dir.display()))
}

/// The last attempt of each gate logged in `logs/<step>/`.
fn gate_results(fs: &WorkspaceFs, logs: &Path) -> Result<Vec<GateResult>> {
    if !fs.is_dir(logs) {
        return Ok(Vec::new());
    }
    let mut last: std::collections::BTreeMap<String, (u64, String)> = Default::default();
    for (name, kind) in fs
        .list(logs)
        .with_context(|| format!("reading {}", logs.display()))?
    {
        let Some((label, attempt)) = name
            .strip_prefix("pre_validation_")
            .and_then(|n| n.strip_suffix(".json"))
            .and_then(|n| n.rsplit_once("_attempt_"))
            .and_then(|(l, a)| Some((l.to_string(), a.parse::<u64>().ok()?)))
        else {
            continue;
        };
        if kind != Kind::File || last.get(&label).is_some_and(|(a, _)| *a >= attempt) {
            continue;
        }
        last.insert(label, (attempt, name));
    }
    let mut out = Vec::new();
    for (label, (attempt, name)) in last {
        let report: serde_json::Value = read_json(fs, &logs.join(&name))?;
        let checks = report["checks"].as_array().map_or(&[][..], Vec::as_slice);
        let text = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => String::new(),
            other => other.to_string(),
        };
        let failed = checks
            .iter()
            .filter(|c| c["passed"] == false)
            .map(|c| FailedCheck {
                file: text(&c["file"]),
                path: text(&c["path"]),
                expected: text(&c["expected"]),
                actual: text(&c["actual"]),
                message: text(&c["message"]),
            })
            .collect();
        out.push(GateResult {
            label,
            attempt,
            passed: report["passed"] == true,
            checks: checks.len(),
            failed,
        });
    }
    Ok(out)
}

/// The `call_sub_agent` results in the step's conversation (session.json).
fn sub_agent_calls(fs: &WorkspaceFs, step_dir: &Path) -> Result<Vec<SubAgentCall>> {
    let path = step_dir.join("session.json");
    if !fs.is_file(&path) {
        return Ok(Vec::new());
    }
    // Unreadable, it is said in the step's status (`step_state`).
    let Ok(session) = read_json::<serde_json::Value>(fs, &path) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for message in session["conversation_history"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if message["role"] != "tool" {
            continue;
        }
        let Some(result) = message["content"]
            .as_str()
            .and_then(|c| serde_json::from_str::<serde_json::Value>(c).ok())
        else {
            continue;
        };
        let (Some(route_id), Some(call_id)) =
            (result["route_id"].as_str(), result["call_id"].as_str())
        else {
            continue;
        };
        out.push(SubAgentCall {
            route_id: route_id.to_string(),
            call_id: call_id.to_string(),
            status: result["status"].as_str().unwrap_or("unknown").to_string(),
            error: result["error"].as_str().map(str::to_string),
            files: result["files"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect(),
        });
    }
    Ok(out)
}

/// The turns logged for `logs` (`logs/<step>/`), by attempt and iteration: those in
/// `logs/<step>/execution/`, and those of the earlier layout in `logs/<step>/` itself (a
/// turn in both is read from the first).
fn turn_logs(fs: &WorkspaceFs, logs: &Path) -> Result<Vec<TurnLog>> {
    let mut keys = std::collections::BTreeMap::new();
    for dir in turn_log_dirs(logs) {
        // Only a folder holds turn logs: a link or a file there is not read.
        if fs.kind(&dir)? != Some(Kind::Dir) {
            continue;
        }
        for (name, _) in fs
            .list(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
        {
            if let Some(key) = parse_turn_log_name(&name) {
                keys.entry(key).or_insert_with(|| dir.clone());
            }
        }
    }
    let mut turns = Vec::new();
    for ((attempt, iteration), dir) in keys {
        let (summary_path, conversation_path) = turn_log_paths(&dir, attempt, iteration);
        let s = match read_json::<serde_json::Value>(fs, &summary_path)? {
            v if v.get("step_index").is_some() && v.get("entry_id").is_none() => {
                original_turn_summary(&v)
            }
            v => serde_json::from_value::<TurnSummary>(v)
                .with_context(|| format!("reading {}", summary_path.display()))?,
        };
        // Only the tool names are read; a log that cannot be read (larger than the host
        // reads at once, not what Trellis writes) leaves the turn shown from its summary.
        let (tool_names, conversation_unread) = if fs.kind(&conversation_path)?.is_some() {
            match read_json::<ToolNames>(fs, &conversation_path) {
                Ok(c) => (
                    c.tool_calls.into_iter().map(|t| t.tool_name).collect(),
                    None,
                ),
                Err(e) => (Vec::new(), Some(format!("{e:#}"))),
            }
        } else {
            (Vec::new(), None)
        };
        turns.push(TurnLog {
            item_id: s.item_id,
            attempt,
            iteration,
            path: summary_path,
            model: format!("{}:{}", s.provider, s.model_id),
            status: s.status,
            llm_calls: s.llm_call_count,
            tool_calls: s.tool_call_count,
            tool_errors: s.tool_error_count,
            tool_names,
            conversation_unread,
            prompt_tokens: s.prompt_tokens,
            completion_tokens: s.completion_tokens,
            duration_ms: s.duration_ms,
        });
    }
    Ok(turns)
}

/// A turn summary as the original system writes it (`step_index`, `step_path`,
/// `retry_attempt`, `loop_iteration`, `execution_result`, `model`, `timestamp`), in
/// Trellis's shape: it records no status, counts or tokens, so the status is read from the
/// result (`STATUS: FAILED`, else completed), the counts as zero, the model as
/// `original:<model>`.
fn original_turn_summary(v: &serde_json::Value) -> TurnSummary {
    let text = |key: &str| v[key].as_str().unwrap_or_default().to_string();
    let number = |key: &str| {
        v[key]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0)
    };
    let failed = crate::driver::scan_reply(v["execution_result"].as_str().unwrap_or_default())
        .0
        .is_some();
    TurnSummary {
        step_id: text("step_path"),
        item_id: text("step_path"),
        entry_id: String::new(),
        attempt: number("retry_attempt"),
        iteration: number("loop_iteration"),
        provider: "original".to_string(),
        model_id: text("model"),
        status: if failed {
            Status::Failed
        } else {
            Status::Completed
        },
        error: None,
        started_at: text("timestamp"),
        completed_at: text("timestamp"),
        duration_ms: 0,
        llm_duration_ms: 0,
        tool_duration_ms: 0,
        llm_call_count: 0,
        tool_call_count: 0,
        tool_error_count: 0,
        prompt_tokens: 0,
        completion_tokens: 0,
        total_tokens: 0,
    }
}

/// What `runs show` reads of a conversation log: the names of its tool calls.
#[derive(serde::Deserialize)]
struct ToolNames {
    #[serde(default)]
    tool_calls: Vec<ToolName>,
}

#[derive(serde::Deserialize)]
struct ToolName {
    tool_name: String,
}

/// `execution-attempt-<A>-iteration-<I>.json` -> (A, I); `None` for anything else
/// (conversation files included).
fn parse_turn_log_name(name: &str) -> Option<(u32, u32)> {
    let rest = name
        .strip_prefix("execution-attempt-")?
        .strip_suffix(".json")?;
    let (a, i) = rest.split_once("-iteration-")?;
    Some((a.parse().ok()?, i.parse().ok()?))
}

/// The folders in `dir` (links are not folders: they are skipped, never followed).
fn dir_names(fs: &WorkspaceFs, dir: &Path) -> Result<Vec<String>> {
    Ok(fs
        .list(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .into_iter()
        .filter(|(_, kind)| *kind == Kind::Dir)
        .map(|(name, _)| name)
        .collect())
}

/// Reads a log as JSON, after this process's queued writes are on disk; one of more than
/// [`trellis_sandbox::json_values::MAX_FILE_VALUES`] JSON values is refused unparsed.
fn read_json<T: serde::de::DeserializeOwned>(fs: &WorkspaceFs, path: &Path) -> Result<T> {
    trellis_sandbox::store::write_behind::flush()?;
    let value = fs
        .read_json_value(path)
        .with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_value(value).with_context(|| format!("parsing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{
        LlmCallRecord, Status, ToolCallRecord, TurnConversation, now_rfc3339, write_turn_logs,
    };
    use serde_json::json;

    fn summary(step: &str, run: &str, status: Status) -> FinalSummary {
        FinalSummary {
            schema_version: 1,
            step_id: step.into(),
            run_folder: run.into(),
            status,
            execution_result: None,
            concerns: vec!["check ticket 2".into()],
            completed_at: "2026-01-02T03:04:05.678Z".into(),
        }
    }

    #[test]
    fn turn_log_names_parse_and_conversations_do_not() {
        assert_eq!(
            parse_turn_log_name("execution-attempt-2-iteration-10.json"),
            Some((2, 10))
        );
        assert_eq!(
            parse_turn_log_name("execution-attempt-1-iteration-1-conversation.json"),
            None
        );
        assert_eq!(parse_turn_log_name("pre_validation.json"), None);
    }

    #[test]
    fn lists_iteration_0_first_then_descending_with_groups() {
        let dir = tempfile::tempdir().unwrap();
        let runs = dir.path().join("runs");
        for run in [
            "iteration-1",
            "iteration-0",
            "iteration-10",
            "iteration-2/Team_A",
        ] {
            std::fs::create_dir_all(runs.join(run).join("execution/Downloads")).unwrap();
        }
        let step = runs.join("iteration-0/execution/a");
        std::fs::create_dir_all(&step).unwrap();
        summary("a", "iteration-0", Status::Completed)
            .write(
                &trellis_sandbox::store::WorkspaceFs::open(dir.path()).unwrap(),
                &step,
            )
            .unwrap();
        let step = runs.join("iteration-0/execution/b");
        std::fs::create_dir_all(&step).unwrap();
        let mut s = Session::new("b", "iteration-0");
        s.status = Status::Failed;
        s.write(
            &trellis_sandbox::store::WorkspaceFs::open(dir.path()).unwrap(),
            &step,
        )
        .unwrap();
        std::fs::create_dir_all(runs.join("iteration-0/execution/c")).unwrap();

        let list = list_runs(dir.path()).unwrap();
        let folders: Vec<&str> = list.iter().map(|r| r.run_folder.as_str()).collect();
        assert_eq!(
            folders,
            [
                "iteration-0",
                "iteration-10",
                "iteration-2/Team_A",
                "iteration-1"
            ]
        );
        let steps = &list[0].steps;
        assert_eq!(steps.len(), 3);
        assert_eq!(steps[0].status, "completed");
        assert_eq!(
            steps[0].completed_at.as_deref(),
            Some("2026-01-02T03:04:05.678Z")
        );
        assert_eq!(steps[1].status, "failed");
        assert_eq!(steps[1].completed_at, None);
        assert_eq!(steps[2].status, "no summary");
        assert!(list[1].steps.is_empty());
        assert!(list_runs(&dir.path().join("nowhere")).unwrap().is_empty());
    }

    #[test]
    fn shows_a_step_with_its_entries_and_turns() {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = dir.path().join("runs/iteration-0");
        let step = run_dir.join("execution/s");
        std::fs::create_dir_all(&step).unwrap();
        summary("s", "iteration-0", Status::Completed)
            .write(
                &trellis_sandbox::store::WorkspaceFs::open(dir.path()).unwrap(),
                &step,
            )
            .unwrap();
        let mut session = Session::new("s", "iteration-0");
        let i = session.start_entry("m", "m", "user_message");
        session.end_entry(i, Status::Completed, Some("line one\nline two".into()));
        session
            .write(
                &trellis_sandbox::store::WorkspaceFs::open(dir.path()).unwrap(),
                &step,
            )
            .unwrap();
        let logs = logs_dir(&run_dir, "s");
        for iteration in [2, 1] {
            let now = now_rfc3339();
            let conversation = TurnConversation {
                step_id: "s".into(),
                item_id: "m".into(),
                attempt: 1,
                iteration,
                messages: vec![],
                llm_calls: vec![LlmCallRecord {
                    turn: 1,
                    provider: "replay".into(),
                    model_id: "demo".into(),
                    status: Status::Completed,
                    error: None,
                    started_at: now.clone(),
                    completed_at: now.clone(),
                    duration_ms: 3,
                    prompt_tokens: 100,
                    completion_tokens: 20,
                    total_tokens: 120,
                    tool_calls: vec![],
                }],
                tool_calls: vec![ToolCallRecord {
                    tool_call_id: "c1".into(),
                    tool_name: "workspace:write_file".into(),
                    args: json!({}),
                    result: None,
                    error: None,
                    duration_ms: 1,
                    started_at: now.clone(),
                    completed_at: now.clone(),
                    unsandboxed: false,
                }],
            };
            let s = TurnSummary::from_calls(
                &conversation,
                "m",
                Status::Completed,
                None,
                now.clone(),
                now,
                7,
            );
            write_turn_logs(
                &trellis_sandbox::store::WorkspaceFs::open(dir.path()).unwrap(),
                &logs,
                &s,
                &conversation,
            )
            .unwrap();
        }

        let report = show_step(dir.path(), "iteration-0", "s").unwrap();
        assert_eq!(report.status, "completed");
        assert_eq!(report.concerns, ["check ticket 2"]);
        assert_eq!(report.entries.len(), 1);
        assert_eq!(first_line(report.entries[0].summary.as_deref()), "line one");
        assert_eq!(report.turns.len(), 2);
        let t = &report.turns[0];
        assert_eq!((t.attempt, t.iteration), (1, 1));
        assert_eq!(t.model, "replay:demo");
        assert_eq!((t.llm_calls, t.tool_calls), (1, 1));
        assert_eq!(t.tool_names, ["workspace:write_file"]);
        assert_eq!((t.prompt_tokens, t.completion_tokens), (100, 20));
        assert_eq!(t.duration_ms, 7);

        let err = show_step(dir.path(), "iteration-0", "nope").unwrap_err();
        assert!(err.to_string().contains("execution/nope"), "{err}");
        let err = show_step(dir.path(), "iteration-9", "s").unwrap_err();
        assert!(err.to_string().contains("runs/iteration-9"), "{err}");
    }
}
