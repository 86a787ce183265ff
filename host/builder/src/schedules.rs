//! Firing a schedule and its history. A firing is an ordinary builder session in run mode on
//! `iteration-0`: it sends the schedule's messages one by one, each after the session is
//! idle again (its executions and their completion turns done), and records how it went in
//! `schedule-runs.json` at the workspace root (newest first, [`MAX_RUNS`] kept, written
//! atomically; the conversation of a firing goes with its entry). A workspace that needs a contract migration is never migrated by a schedule:
//! the firing records `error` naming it.

use std::path::Path;

use anyhow::Result;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use trellis_runner::runtime::ExecutionStatus;
use trellis_sandbox::store::{Kind, WorkspaceFs, now_rfc3339};
use trellis_workflow::manifest::schedules::Schedule;

use crate::BuilderSession;

/// What queues a manual firing for the `trigger_schedule` tool, given by the front end that
/// fires schedules (`trellis serve`): called with the schedule's id during a turn, it queues
/// the firing for when the workspace is free and answers what it did. A session without one
/// refuses the tool, naming the commands that fire a schedule.
#[derive(Clone)]
pub struct TriggerHook(std::sync::Arc<QueueFiring>);

/// Queues a firing of the schedule of this id; what it did, or why not.
type QueueFiring = dyn Fn(&str) -> Result<Value, String> + Send + Sync;

impl TriggerHook {
    /// A hook calling `queue`.
    pub fn new(queue: impl Fn(&str) -> Result<Value, String> + Send + Sync + 'static) -> Self {
        TriggerHook(std::sync::Arc::new(queue))
    }

    /// Queues a firing of schedule `id`.
    pub fn queue(&self, id: &str) -> Result<Value, String> {
        (self.0)(id)
    }
}

impl std::fmt::Debug for TriggerHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TriggerHook")
    }
}

/// The history file, at the workspace root.
pub const RUNS_FILE: &str = "schedule-runs.json";

/// Entries the history keeps, newest first.
pub const MAX_RUNS: usize = 200;

/// One firing (or an occurrence that did not fire) of a schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleRun {
    /// Its id (`<schedule>-<UTC time of the firing>`).
    pub id: String,
    /// The schedule.
    pub schedule_id: String,
    /// `cron`, `calendar` or `manual`.
    pub trigger_source: String,
    /// The occurrence it is for (RFC 3339, UTC); none for a manual trigger.
    #[serde(default)]
    pub scheduled_for: Option<String>,
    /// The run folder it ran in.
    pub run_folder: String,
    /// The builder session that ran it.
    #[serde(default)]
    pub session_id: Option<String>,
    /// `running`, `success`, `error`, `stopped`, `partial`, `interrupted`, or for an
    /// occurrence that did not fire `skipped`, `missed`, `expired`.
    pub status: String,
    /// What went wrong.
    #[serde(default)]
    pub error: Option<String>,
    /// How long it took.
    #[serde(default)]
    pub duration_ms: Option<u64>,
    /// The groups it ran.
    #[serde(default)]
    pub group_names: Vec<String>,
    /// When it started.
    pub started_at: String,
    /// When it ended.
    #[serde(default)]
    pub completed_at: Option<String>,
    /// The process running it, while it runs: a server starting beside it leaves it be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
}

impl ScheduleRun {
    /// An entry of `schedule` starting now, `running`.
    pub fn start(schedule: &Schedule, trigger_source: &str, scheduled_for: Option<String>) -> Self {
        let started_at = now_rfc3339();
        ScheduleRun {
            id: format!(
                "{}-{}",
                schedule.id,
                started_at
                    .chars()
                    .filter(char::is_ascii_alphanumeric)
                    .collect::<String>()
            ),
            schedule_id: schedule.id.clone(),
            trigger_source: trigger_source.to_string(),
            scheduled_for,
            run_folder: "iteration-0".to_string(),
            session_id: None,
            status: "running".to_string(),
            error: None,
            duration_ms: None,
            group_names: schedule.group_names.clone(),
            started_at,
            completed_at: None,
            pid: Some(std::process::id()),
        }
    }

    /// The entry with its `error` cut to [`MAX_ERROR_BYTES`].
    fn cut(mut self) -> Self {
        if let Some(error) = &mut self.error
            && error.len() > MAX_ERROR_BYTES
        {
            *error = trellis_sandbox::cut::marked(error, MAX_ERROR_BYTES);
        }
        self
    }

    /// Ends the entry: `status`, `error`, and its end and duration from now.
    pub fn end(&mut self, status: &str, error: Option<String>) {
        let now = chrono::Utc::now();
        self.duration_ms = chrono::DateTime::parse_from_rfc3339(&self.started_at)
            .ok()
            .map(|s| {
                (now - s.with_timezone(&chrono::Utc))
                    .num_milliseconds()
                    .max(0) as u64
            });
        self.completed_at = Some(now_rfc3339());
        self.status = status.to_string();
        self.error = error;
        self.pid = None;
    }
}

/// Bytes of `schedule-runs.json` read at most: [`MAX_RUNS`] entries, each `error` cut to
/// [`MAX_ERROR_BYTES`] when it is written, fit many times over.
pub const MAX_RUNS_FILE_BYTES: u64 = 4 << 20;

/// Bytes of an entry's `error` kept (its start, marked as cut).
pub const MAX_ERROR_BYTES: usize = 4096;

/// The entries of the history as JSON values, newest first, [`MAX_RUNS`] at most; none when
/// there is no file. An error says why the file cannot be read (too big, not JSON, not an
/// array).
fn read_items(fs: &WorkspaceFs) -> std::result::Result<Vec<Value>, String> {
    match fs.kind(RUNS_FILE) {
        Ok(None) => return Ok(Vec::new()),
        Ok(Some(Kind::File)) => {}
        Ok(Some(Kind::Link)) => {
            return Err(format!(
                "{RUNS_FILE} is a symbolic link; Trellis does not read or write through links"
            ));
        }
        Ok(Some(Kind::Dir)) => return Err(format!("{RUNS_FILE} is a folder, not a file")),
        Ok(Some(Kind::Special)) => {
            return Err(format!(
                "{RUNS_FILE} is a FIFO, socket or device, not a regular file"
            ));
        }
        Err(e) => return Err(format!("{RUNS_FILE}: {e}")),
    }
    if let Some(len) = fs.metadata_len(RUNS_FILE)
        && len > MAX_RUNS_FILE_BYTES
    {
        return Err(format!(
            "{RUNS_FILE} is {len} bytes, more than the {MAX_RUNS_FILE_BYTES} its {MAX_RUNS} \
             entries take"
        ));
    }
    match fs.read_json_value(RUNS_FILE) {
        Ok(Value::Array(mut items)) => {
            items.truncate(MAX_RUNS);
            Ok(items)
        }
        Ok(other) => Err(format!(
            "{RUNS_FILE}: expected an array of schedule runs, found {}",
            trellis_workflow::diagnostics::kind_of(&other)
        )),
        Err(e) => Err(format!("{RUNS_FILE}: {e}")),
    }
}

/// Why the history file cannot be read, when it cannot: the next entry written sets it
/// aside and starts a new one.
pub fn history_problem(fs: &WorkspaceFs) -> Option<String> {
    read_items(fs).err()
}

/// The history as the file holds it, each `error` cut to [`MAX_ERROR_BYTES`]; entries that
/// do not read as runs are left out (and kept in the file). A file that cannot be read is
/// empty, a warning logged once for each new problem ([`history_problem`] says why): a
/// server's scheduler reads it each second.
pub fn read_runs(fs: &WorkspaceFs) -> Vec<ScheduleRun> {
    static WARNED: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    let read = read_items(fs);
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    match read {
        Ok(items) => {
            *warned = None;
            items
                .into_iter()
                .filter_map(|v| serde_json::from_value::<ScheduleRun>(v).ok())
                .map(ScheduleRun::cut)
                .collect()
        }
        Err(why) => {
            if warned.as_deref() != Some(why.as_str()) {
                tracing::warn!("{why}");
                *warned = Some(why);
            }
            Vec::new()
        }
    }
}

/// Writes `run` into the history: replacing the entry of its id, else first; at most
/// [`MAX_RUNS`] kept.
pub fn record(fs: &WorkspaceFs, run: &ScheduleRun) -> Result<()> {
    record_all(fs, std::slice::from_ref(run))
}

/// The history's read-and-rewrite, one at a time in this process: the scheduler's tick and
/// the end of a firing record from different threads, and neither may lose the other's entry.
static REWRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The history's entries to rewrite: a file that cannot be read is renamed
/// `schedule-runs.unreadable-<UTC time>.json` first (kept for its owner, named in a
/// warning), and the history starts again.
fn items_to_rewrite(fs: &WorkspaceFs) -> Result<Vec<Value>> {
    match read_items(fs) {
        Ok(items) => Ok(items),
        Err(why) => {
            let stamp: String = now_rfc3339()
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .collect();
            let aside = format!("schedule-runs.unreadable-{stamp}.json");
            fs.set_aside(RUNS_FILE, &aside)?;
            tracing::warn!("{why}: kept as {aside}, and the history starts again");
            Ok(Vec::new())
        }
    }
}

/// [`record`] of several entries, the file read and written once.
pub fn record_all(fs: &WorkspaceFs, new: &[ScheduleRun]) -> Result<()> {
    if new.is_empty() {
        return Ok(());
    }
    let dropped = {
        let _one = REWRITING.lock().unwrap_or_else(|e| e.into_inner());
        let mut items = items_to_rewrite(fs)?;
        for run in new {
            items.retain(|v| v.get("id").and_then(Value::as_str) != Some(run.id.as_str()));
            items.insert(0, serde_json::to_value(run.clone().cut())?);
        }
        let dropped = items.split_off(items.len().min(MAX_RUNS));
        fs.write_json_atomic(RUNS_FILE, &items)?;
        ended_sessions(&dropped, &items)
    };
    crate::persist::forget_run_sessions(fs, &dropped);
    Ok(())
}

/// The sessions of the ended firings `dropped` that no entry of `kept` names, each with when
/// its firing ended: a firing's conversation is kept as long as its history entry.
fn ended_sessions(dropped: &[Value], kept: &[Value]) -> Vec<(String, String)> {
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
    dropped
        .iter()
        .filter_map(|v| Some((text(v, "session_id")?, text(v, "completed_at")?)))
        .filter(|(id, _)| {
            !kept
                .iter()
                .any(|k| text(k, "session_id").as_ref() == Some(id))
        })
        .collect()
}

/// Marks the entries a process left `running` as `interrupted`: called when a server starts,
/// when no firing of its own can be running. An entry whose `pid` is another process still
/// alive (a second server on the workspace) is left running. Returns how many.
pub fn mark_interrupted(fs: &WorkspaceFs) -> Result<usize> {
    let _one = REWRITING.lock().unwrap_or_else(|e| e.into_inner());
    let mut items = items_to_rewrite(fs)?;
    let mut marked = 0;
    for item in items
        .iter_mut()
        .filter(|v| v.get("status").and_then(Value::as_str) == Some("running"))
        .filter(|v| !runs_elsewhere(v))
    {
        item["status"] = "interrupted".into();
        item["error"] = "the process running it ended before it did".into();
        item["completed_at"] = now_rfc3339().into();
        if let Some(fields) = item.as_object_mut() {
            fields.remove("pid");
        }
        marked += 1;
    }
    if marked > 0 {
        fs.write_json_atomic(RUNS_FILE, &items)?;
    }
    Ok(marked)
}

/// Whether history entry `item` runs in another process that is alive.
fn runs_elsewhere(item: &Value) -> bool {
    item.get("pid")
        .and_then(Value::as_u64)
        .and_then(|pid| u32::try_from(pid).ok())
        .is_some_and(|pid| pid != std::process::id() && Path::new(&format!("/proc/{pid}")).exists())
}

/// Why `root` cannot be fired on as it is: it needs a contract migration, which a schedule
/// never runs.
pub fn migration_needed(root: &Path) -> Option<String> {
    let ws = trellis_workflow::Workspace::open(root).ok()?;
    let version = ws.manifest.contract_version.as_deref()?;
    let current = trellis_workflow::ContractVersion::CURRENT;
    match trellis_workflow::ContractVersion::parse(version) {
        Some(v) if v < current => Some(format!(
            "the workspace is on contract {v}, older than {current}: it needs `trellis migrate` \
             (a schedule never runs a contract migration)"
        )),
        _ => None,
    }
}

/// Fires `messages` on `session` (a run-mode session on the workspace): each sent as a turn,
/// then the session settled (its executions and their completion turns done). Returns the
/// status and error of the firing: `success` when every turn ended normally and every
/// execution done; `partial` when some did not; `error` when none did or the session broke;
/// `stopped` when a turn or an execution was stopped.
pub async fn fire(session: &mut BuilderSession, messages: &[String]) -> (String, Option<String>) {
    let mut problems: Vec<String> = Vec::new();
    let mut good = 0usize;
    let mut stopped = false;
    for message in messages {
        let report = match session.turn(message).await {
            Ok(report) => report,
            Err(e) => return ("error".into(), Some(format!("{e:#}"))),
        };
        let mut reports = vec![report];
        match session.settle().await {
            Ok(more) => reports.extend(more),
            Err(e) => return ("error".into(), Some(format!("{e:#}"))),
        }
        for r in &reports {
            match (&r.error, r.ended_normally) {
                (_, true) => good += 1,
                (Some(e), false) => {
                    stopped |= e == crate::TURN_STOPPED;
                    problems.push(e.clone());
                }
                (None, false) => problems.push("a turn did not end normally".into()),
            }
        }
        for ended in session.take_ended() {
            match ended.status {
                ExecutionStatus::Done => good += 1,
                ExecutionStatus::Cancelled => {
                    stopped = true;
                    problems.push(format!("{} was stopped", ended.id));
                }
                _ => problems.push(format!("{} {}: {}", ended.id, ended.status, ended.summary)),
            }
        }
        // A stop ends the firing, not only its turn: the next messages are not sent.
        if stopped {
            break;
        }
    }
    let error = (!problems.is_empty()).then(|| problems.join("; "));
    let status = match (stopped, problems.is_empty(), good) {
        (true, _, _) => "stopped",
        (false, true, _) => "success",
        (false, false, 0) => "error",
        (false, false, _) => "partial",
    };
    (status.to_string(), error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule() -> Schedule {
        let text = serde_json::json!({"schedules": [
            {"id": "daily", "cron_expression": "0 9 * * *", "enabled": true}]});
        let (m, _) =
            trellis_workflow::manifest::parse_manifest(&text.to_string(), "workflow.json").unwrap();
        m.original.schedules[0].clone()
    }

    #[test]
    fn the_history_keeps_the_newest_and_marks_the_running_interrupted() {
        let dir = tempfile::tempdir().unwrap();
        let fs = WorkspaceFs::open(dir.path()).unwrap();
        let s = schedule();
        for n in 0..MAX_RUNS + 5 {
            let mut run = ScheduleRun::start(&s, "cron", None);
            run.id = format!("r{n}");
            if n != MAX_RUNS + 4 {
                run.end("success", None);
            }
            record(&fs, &run).unwrap();
        }
        let runs = read_runs(&fs);
        assert_eq!(runs.len(), MAX_RUNS);
        assert_eq!(runs[0].id, format!("r{}", MAX_RUNS + 4));
        assert_eq!(runs[0].status, "running");
        assert_eq!(mark_interrupted(&fs).unwrap(), 1);
        let runs = read_runs(&fs);
        assert_eq!(runs[0].status, "interrupted");
        assert_eq!(runs[1].status, "success");
    }
}
