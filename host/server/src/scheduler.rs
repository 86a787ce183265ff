//! The scheduler of `trellis serve`: fires the schedules of each workspace's `workflow.json`
//! (spec section 12, the original system's rules). Once a second it asks each enabled
//! schedule for its occurrences since it last looked ([`decide`]): the ones missed while the
//! server was down or stalled are recorded `missed` and only the newest runs, if it is within
//! `max_start_delay_minutes`; an occurrence that finds the workspace busy (a firing, a builder
//! turn or an execution) follows its collision policy; one that waits for another schedule
//! (`after_schedule_id`) is released by that schedule's occurrence of the same local date, or
//! expires at its `dependency_deadline`. A firing is a builder session in run mode
//! ([`trellis_builder::schedules::fire`]), its history in `schedule-runs.json`.
//!
//! `TRELLIS_SCHEDULER=off` turns automatic firing off (a manual trigger still works), and so
//! does `globally_paused` in `scheduler.json` of the user config folder.
//! `TRELLIS_SCHEDULER_CLOCK` (RFC 3339) starts the scheduler's clock at that time, going on
//! at the real pace: for trying a schedule out without waiting for its hour.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use trellis_builder::schedules::{
    ScheduleRun, mark_interrupted, migration_needed, read_runs, record,
};
use trellis_builder::{Mode, TurnStop};
use trellis_workflow::manifest::schedules::{AfterStatus, CollisionPolicy, Schedule};

use crate::App;

/// An occurrence on its way to firing.
#[derive(Debug, Clone, PartialEq)]
pub struct Occurrence {
    /// Its schedule.
    pub schedule_id: String,
    /// Its time; `None` for a manual trigger.
    pub at: Option<DateTime<Utc>>,
    /// `cron`, `calendar` or `manual`.
    pub source: &'static str,
}

/// What a tick does.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Fire this occurrence now.
    Fire(Occurrence),
    /// Record that it did not fire: `missed`, `skipped` or `expired`, and why.
    Record(Occurrence, &'static str, String),
}

/// What the scheduler of one workspace remembers between ticks.
#[derive(Debug, Default)]
pub struct State {
    /// Up to when each schedule's occurrences were looked at.
    seen: BTreeMap<String, DateTime<Utc>>,
    /// Occurrences waiting for the workspace to be free (`queue_latest`, `retry`).
    queue: Vec<Occurrence>,
    /// Occurrences waiting for the schedule they come after.
    waiting: Vec<Occurrence>,
    /// How far the scheduler's clock is from the real one (`TRELLIS_SCHEDULER_CLOCK`): the
    /// history's `started_at` and `completed_at` are real times.
    offset: chrono::Duration,
}

/// The statuses that end a firing.
const TERMINAL: &[&str] = &["success", "error", "stopped", "partial", "interrupted"];

/// Decides what happens at `now`: `busy` whether the workspace is taken, `paused` whether
/// automatic firing is off. A schedule seen for the first time is looked at from its newest
/// recorded occurrence (catch-up after a restart), else from now.
///
/// The delays are bounded when `workflow.json` is read ([`MAX_DELAY_MINUTES`]); here they
/// saturate besides, so no value can overflow a clock computation.
///
/// [`MAX_DELAY_MINUTES`]: trellis_workflow::manifest::schedules::MAX_DELAY_MINUTES
pub fn decide(
    state: &mut State,
    schedules: &[Schedule],
    history: &[ScheduleRun],
    now: DateTime<Utc>,
    mut busy: bool,
    paused: bool,
) -> Vec<Decision> {
    let mut out = Vec::new();
    let late = |s: &Schedule, at: DateTime<Utc>| {
        s.max_start_delay_minutes
            .is_some_and(|m| now - at > minutes(m))
    };
    let mut arrived: Vec<Occurrence> = Vec::new();
    for s in schedules {
        let from = *state.seen.entry(s.id.clone()).or_insert_with(|| {
            history
                .iter()
                .filter(|r| r.schedule_id == s.id && r.trigger_source != "manual")
                .filter_map(|r| r.scheduled_for.as_deref())
                .filter_map(|t| DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.with_timezone(&Utc))
                .max()
                .unwrap_or(now)
        });
        state.seen.insert(s.id.clone(), now);
        if !s.enabled || paused || from >= now {
            continue;
        }
        let mut due = s.occurrences(from, now, 1000);
        let Some(newest) = due.pop() else { continue };
        let source = if s.calendar_item_at(newest).is_some() {
            "calendar"
        } else {
            "cron"
        };
        let occ = |at| Occurrence {
            schedule_id: s.id.clone(),
            at: Some(at),
            source,
        };
        // The ones a later occurrence overtook: one entry for all of them.
        if let (Some(first), Some(last)) = (due.first(), due.last()) {
            out.push(Decision::Record(
                occ(*last),
                "missed",
                format!(
                    "{} occurrence(s) from {} to {} came before the newest could run; only \
                     the newest runs",
                    due.len(),
                    rfc3339(*first),
                    rfc3339(*last)
                ),
            ));
        }
        if late(s, newest) {
            out.push(Decision::Record(
                occ(newest),
                "missed",
                format!(
                    "more than max_start_delay_minutes ({}) late",
                    s.max_start_delay_minutes.unwrap_or(0)
                ),
            ));
        } else if s.after.is_some() {
            state.waiting.push(occ(newest));
        } else {
            arrived.push(occ(newest));
        }
    }
    // Dependencies released, or expired.
    let mut still = Vec::new();
    for w in std::mem::take(&mut state.waiting) {
        let Some(s) = schedules.iter().find(|s| s.id == w.schedule_id) else {
            continue;
        };
        match dependency(s, &w, history, now, state.offset) {
            Dependency::Released => arrived.push(w),
            Dependency::Waiting => still.push(w),
            Dependency::Expired(why) => out.push(Decision::Record(w, "expired", why)),
        }
    }
    state.waiting = still;
    // The queue first: it waited longer.
    let mut queue = std::mem::take(&mut state.queue);
    queue.retain(|q| {
        let Some(s) = schedules.iter().find(|s| s.id == q.schedule_id) else {
            return false;
        };
        match q.at {
            Some(at) if late(s, at) => {
                out.push(Decision::Record(
                    q.clone(),
                    "expired",
                    format!(
                        "waited for the workspace past max_start_delay_minutes ({})",
                        s.max_start_delay_minutes.unwrap_or(0)
                    ),
                ));
                false
            }
            _ => true,
        }
    });
    if !busy && !queue.is_empty() {
        out.push(Decision::Fire(queue.remove(0)));
        busy = true;
    }
    state.queue = queue;
    for occ in arrived {
        let Some(s) = schedules.iter().find(|s| s.id == occ.schedule_id) else {
            continue;
        };
        if !busy {
            out.push(Decision::Fire(occ));
            busy = true;
            continue;
        }
        match s.collision_policy {
            CollisionPolicy::Skip => out.push(Decision::Record(
                occ,
                "skipped",
                "the workspace was busy (collision_policy skip)".into(),
            )),
            CollisionPolicy::Coalesce => out.push(Decision::Record(
                occ,
                "skipped",
                "folded into the firing that runs (collision_policy coalesce)".into(),
            )),
            CollisionPolicy::QueueLatest => {
                for older in state
                    .queue
                    .iter()
                    .filter(|q| q.schedule_id == occ.schedule_id)
                {
                    out.push(Decision::Record(
                        older.clone(),
                        "skipped",
                        "a newer occurrence took its place (collision_policy queue_latest)".into(),
                    ));
                }
                state.queue.retain(|q| q.schedule_id != occ.schedule_id);
                state.queue.push(occ);
            }
            CollisionPolicy::Retry => state.queue.push(occ),
        }
    }
    // A workspace busy for long keeps a bounded queue: the oldest waiting go first.
    while state.queue.len() > MAX_QUEUED {
        let gone = state.queue.remove(0);
        out.push(Decision::Record(
            gone,
            "skipped",
            format!("more than {MAX_QUEUED} occurrences waited for the workspace"),
        ));
    }
    out
}

/// Occurrences waiting for the workspace at most (`queue_latest`, `retry`).
pub const MAX_QUEUED: usize = 100;

enum Dependency {
    Released,
    Waiting,
    Expired(String),
}

/// Whether `w` (of `s`, which comes after another schedule) may run at `now`: that
/// schedule's occurrence of the same local date ended as required, `after_delay_minutes`
/// ago; past the `dependency_deadline` of that date (or once the date is over) it expires.
/// `now` is the scheduler's time, `offset` how far it is from the real one, the history's.
fn dependency(
    s: &Schedule,
    w: &Occurrence,
    history: &[ScheduleRun],
    now: DateTime<Utc>,
    offset: chrono::Duration,
) -> Dependency {
    let (Some(after), Some(at)) = (&s.after, w.at) else {
        return Dependency::Released;
    };
    let tz = s.tz();
    let day = at.with_timezone(&tz).date_naive();
    let ended = history.iter().find(|r| {
        r.schedule_id == after.schedule_id
            && r.scheduled_for
                .as_deref()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .is_some_and(|t| t.with_timezone(&tz).date_naive() == day)
            && match after.status {
                AfterStatus::Completed => r.status == "success",
                AfterStatus::AnyTerminal => TERMINAL.contains(&r.status.as_str()),
            }
    });
    if let Some(done) = ended.and_then(|r| r.completed_at.as_deref())
        && let Ok(done) = DateTime::parse_from_rfc3339(done)
        && done
            .with_timezone(&Utc)
            .checked_add_signed(minutes(after.delay_minutes))
            .is_some_and(|released| now - offset >= released)
    {
        return Dependency::Released;
    }
    let deadline = after
        .deadline
        .and_then(|t| trellis_workflow::manifest::schedules::local_instant(&tz, day, t))
        .or_else(|| {
            let next = day.succ_opt()?;
            trellis_workflow::manifest::schedules::local_instant(&tz, next, chrono::NaiveTime::MIN)
        });
    match deadline {
        Some(deadline) if now >= deadline => Dependency::Expired(format!(
            "schedule {:?} had not ended as required by the dependency deadline",
            after.schedule_id
        )),
        _ => Dependency::Waiting,
    }
}

/// The scheduler of one workspace: its state, the firing that runs, and its clock.
#[derive(Debug)]
pub struct Scheduler {
    /// Shared with the `trigger_schedule` hook of each builder session ([`Scheduler::hook`]).
    state: Arc<std::sync::Mutex<State>>,
    /// The schedule firing now, and what stops its turn.
    firing: std::sync::Mutex<Option<(String, TurnStop, Arc<crate::LiveSession>)>>,
    /// The scheduler's clock is the real one shifted by this much (`TRELLIS_SCHEDULER_CLOCK`).
    offset: chrono::Duration,
    /// The schedules of `workflow.json` as last parsed, and the file's length and time then:
    /// the tick reads them each second, and the file seldom changes.
    parsed: std::sync::Mutex<Option<(Stamp, Loaded)>>,
    /// Held by each request of the scheduler API that changes `workflow.json` or starts a
    /// firing, from its first look at the schedules to its answer: one such request at a
    /// time, so none answers from a file another is rewriting or loses another's edit.
    pub(crate) edits: tokio::sync::Mutex<()>,
}

/// A file's length and modification time.
type Stamp = (u64, std::time::SystemTime);

/// The schedules of `workflow.json`, or its problems.
type Loaded = Result<Arc<Vec<Schedule>>, String>;

impl Default for Scheduler {
    fn default() -> Self {
        let offset = std::env::var("TRELLIS_SCHEDULER_CLOCK")
            .ok()
            .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
            .map(|t| t.with_timezone(&Utc) - Utc::now())
            .unwrap_or_else(chrono::Duration::zero);
        Scheduler {
            state: Arc::new(std::sync::Mutex::new(State {
                offset,
                ..State::default()
            })),
            firing: Default::default(),
            offset,
            parsed: Default::default(),
            edits: Default::default(),
        }
    }
}

impl Scheduler {
    /// The scheduler's time now.
    pub fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.offset
    }

    /// Occurrences of `schedule_id` waiting for the workspace.
    pub fn queued(&self, schedule_id: &str) -> usize {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .queue
            .iter()
            .filter(|q| q.schedule_id == schedule_id)
            .count()
    }

    /// What a builder session's `trigger_schedule` calls: a manual occurrence queued, to
    /// fire when the workspace is free (the turn that asked and its executions done). A
    /// schedule whose manual firing waits already is not queued again: one answer of many
    /// calls fires each schedule once.
    pub fn hook(&self) -> trellis_builder::schedules::TriggerHook {
        let state = self.state.clone();
        trellis_builder::schedules::TriggerHook::new(move |id| {
            let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
            if state
                .queue
                .iter()
                .any(|q| q.schedule_id == id && q.source == "manual")
            {
                return Ok(json!({"ok": true, "schedule_id": id, "queued": false,
                          "waiting": state.queue.len(),
                          "fires": "a manual firing of this schedule waits already: it \
                                    fires once the workspace is free"}));
            }
            if state.queue.len() >= MAX_QUEUED {
                return Err(format!(
                    "{MAX_QUEUED} firings wait for the workspace already: try again once \
                     they have run"
                ));
            }
            state.queue.push(Occurrence {
                schedule_id: id.to_string(),
                at: None,
                source: "manual",
            });
            Ok(json!({"ok": true, "schedule_id": id, "queued": true,
                      "waiting": state.queue.len(),
                      "fires": "once the workspace is free: after this turn and its executions"}))
        })
    }

    /// The schedule firing now, if any.
    pub fn firing(&self) -> Option<String> {
        self.firing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(id, _, _)| id.clone())
    }

    /// Stops the firing of `schedule_id`, if it runs: its turn and the executions its session
    /// started. Whether it ran.
    pub fn stop(&self, app: &App, schedule_id: &str) -> bool {
        let firing = self.firing.lock().unwrap_or_else(|e| e.into_inner());
        let Some((id, stop, live)) = firing.as_ref() else {
            return false;
        };
        if id != schedule_id {
            return false;
        }
        stop.stop();
        let ids: Vec<String> = live
            .executions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        for id in ids {
            app.runtime
                .stop(&trellis_runner::runtime::ExecutionId::from(id.as_str()));
        }
        true
    }
}

/// Whether automatic firing is off: `TRELLIS_SCHEDULER=off`, or `globally_paused` in the
/// user config folder's `scheduler.json`.
pub fn paused() -> bool {
    if std::env::var("TRELLIS_SCHEDULER").is_ok_and(|v| v.eq_ignore_ascii_case("off")) {
        return true;
    }
    pause_config()
        .get("globally_paused")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// `scheduler.json` of the user config folder: `{globally_paused, paused_at, updated_at}`
/// (`{}` when there is none).
pub fn pause_config() -> Value {
    let Some(path) =
        trellis_sandbox::llm::approval::user_config_dir().map(|d| d.join("scheduler.json"))
    else {
        return json!({});
    };
    std::fs::read(&path)
        .ok()
        .filter(|b| b.len() < 64 << 10)
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| json!({}))
}

/// Writes `scheduler.json` of the user config folder.
pub fn write_pause_config(globally_paused: bool) -> anyhow::Result<Value> {
    let dir = trellis_sandbox::llm::approval::user_config_dir()
        .ok_or_else(|| anyhow::anyhow!("no user config folder (set HOME or XDG_CONFIG_HOME)"))?;
    std::fs::create_dir_all(&dir)?;
    let now = trellis_sandbox::store::now_rfc3339();
    let previous = pause_config();
    let paused_at = if globally_paused {
        previous
            .get("paused_at")
            .filter(|v| !v.is_null() && previous["globally_paused"] == true)
            .cloned()
            .unwrap_or_else(|| json!(now))
    } else {
        Value::Null
    };
    let config =
        json!({"globally_paused": globally_paused, "paused_at": paused_at, "updated_at": now});
    let tmp = dir.join(".scheduler.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&config)?)?;
    std::fs::rename(&tmp, dir.join("scheduler.json"))?;
    Ok(config)
}

/// The enabled and disabled schedules of the workspace as `workflow.json` holds them now
/// (none when there is no such file, or it does not load: the scheduler fires nothing then).
pub fn schedules_of(app: &App) -> Arc<Vec<Schedule>> {
    loaded_schedules(app).unwrap_or_default()
}

/// The schedules of `workflow.json`, or what makes it not load: its problems, each with its
/// JSON path. Parsed again only when the file's length or modification time changed, and
/// shared, not copied, by each reader (the tick reads them every second).
pub fn loaded_schedules(app: &App) -> Result<Arc<Vec<Schedule>>, String> {
    let Ok(fs) = app.workspace_fs() else {
        return Ok(Arc::default());
    };
    let Some(stamp) = fs.stamp(trellis_workflow::WORKFLOW_FILE) else {
        // Missing: no schedules. Anything else (a link, a FIFO, a folder) is refused, and
        // said: the workspace does not load.
        return match fs.kind(trellis_workflow::WORKFLOW_FILE) {
            Ok(None) => Ok(Arc::default()),
            Ok(Some(_)) => Err(format!(
                "{}: not a regular file (a link, a FIFO or a folder is never read)",
                trellis_workflow::WORKFLOW_FILE
            )),
            Err(e) => Err(format!("{}: {e}", trellis_workflow::WORKFLOW_FILE)),
        };
    };
    let mut parsed = app
        .scheduler
        .parsed
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some((seen, schedules)) = parsed.as_ref()
        && *seen == stamp
    {
        return schedules.clone();
    }
    let schedules = match fs.read_json_text(trellis_workflow::WORKFLOW_FILE) {
        Err(e) => Err(format!("{}: {e}", trellis_workflow::WORKFLOW_FILE)),
        Ok(text) => {
            trellis_workflow::manifest::parse_manifest(&text, trellis_workflow::WORKFLOW_FILE)
                .map(|(m, _)| Arc::new(m.original.schedules))
                .map_err(|diags| diags.lines().join("\n"))
        }
    };
    if let Err(why) = &schedules {
        tracing::warn!("the scheduler fires nothing while workflow.json does not load: {why}");
    }
    // Kept for a stamp read before the text: a write in between shows at the next call.
    *parsed = Some((stamp, schedules.clone()));
    schedules
}

/// `m` minutes, saturating at the longest duration chrono has.
fn minutes(m: u64) -> chrono::Duration {
    i64::try_from(m)
        .ok()
        .and_then(chrono::Duration::try_minutes)
        .unwrap_or(chrono::Duration::MAX)
}

/// Whether the workspace is taken: a firing, a builder turn, or an execution running.
fn busy(app: &App) -> bool {
    app.busy.load(Ordering::SeqCst)
        || app.runtime.list().iter().any(|e| {
            e.status == trellis_runner::runtime::ExecutionStatus::Running && e.workspace == app.root
        })
}

/// Runs the scheduler of `app` until the server ends: marks the firings a dead process left
/// `running` as `interrupted`, then ticks once a second.
pub fn spawn(app: Arc<App>) {
    if let Ok(fs) = app.workspace_fs()
        && let Ok(n) = mark_interrupted(&fs)
        && n > 0
    {
        tracing::info!("{n} schedule firing(s) of an earlier process marked interrupted");
    }
    tokio::spawn(async move {
        loop {
            // Reading and parsing the files is blocking work: off the server's threads.
            let app_now = app.clone();
            let _ = tokio::task::spawn_blocking(move || tick(&app_now)).await;
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    });
}

fn tick(app: &Arc<App>) {
    let schedules = schedules_of(app);
    if schedules.is_empty() {
        return;
    }
    let Ok(fs) = app.workspace_fs() else { return };
    let history = read_runs(&fs);
    let now = app.scheduler.now();
    let decisions = {
        let mut state = app
            .scheduler
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        decide(&mut state, &schedules, &history, now, busy(app), paused())
    };
    // What did not fire is written in one go: the history is read and rewritten once.
    let mut recorded = Vec::new();
    for decision in decisions {
        match decision {
            Decision::Fire(occ) => {
                if let Some(s) = schedules.iter().find(|s| s.id == occ.schedule_id) {
                    let _ = start_firing(app, s.clone(), occ);
                }
            }
            Decision::Record(occ, status, why) => {
                if let Some(s) = schedules.iter().find(|s| s.id == occ.schedule_id) {
                    let mut run = ScheduleRun::start(s, occ.source, occ.at.map(rfc3339));
                    run.id = format!("{}-{status}-{}", run.id, recorded.len());
                    run.end(status, Some(why));
                    recorded.push(run);
                }
            }
        }
    }
    if let Err(e) = trellis_builder::schedules::record_all(&fs, &recorded) {
        tracing::warn!("recording schedule occurrences: {e:#}");
    }
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Starts firing `occ` of `schedule` in the background: claims the workspace (an error when
/// it is taken), records the firing `running`, runs it in a run-mode builder session, and
/// records how it ended. Returns the history entry's id.
pub fn start_firing(app: &Arc<App>, schedule: Schedule, occ: Occurrence) -> Result<String, String> {
    if app.busy.swap(true, Ordering::SeqCst) {
        return Err("a builder turn or a firing runs on this workspace".into());
    }
    let fs = match app.workspace_fs() {
        Ok(fs) => fs,
        Err(e) => {
            app.busy.store(false, Ordering::SeqCst);
            return Err(e.detail().to_string());
        }
    };
    let mut run = ScheduleRun::start(&schedule, occ.source, occ.at.map(rfc3339));
    let run_id = run.id.clone();
    let app = app.clone();
    tokio::spawn(async move {
        let messages = occ
            .at
            .and_then(|at| schedule.calendar_item_at(at))
            .filter(|item| !item.messages.is_empty())
            .map(|item| item.messages.clone())
            .unwrap_or_else(|| schedule.firing_messages());
        // The session's log, told `idle` once the workspace is free.
        let mut idle = None;
        let (status, error) = match migration_needed(&app.root) {
            Some(why) => ("error".to_string(), Some(why)),
            None => match app.session(None, Some(Mode::Run)) {
                Err(e) => ("error".to_string(), Some(e.detail().to_string())),
                Ok(live) => {
                    run.session_id = Some(live.id.clone());
                    let _ = record(&fs, &run);
                    *app.last_session.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(live.clone());
                    *app.scheduler
                        .firing
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) =
                        Some((schedule.id.clone(), live.stop.clone(), live.clone()));
                    let mut session = live.session.lock().await;
                    let ended = trellis_builder::schedules::fire(&mut session, &messages).await;
                    drop(session);
                    idle = Some(live.log.clone());
                    ended
                }
            },
        };
        *app.scheduler
            .firing
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
        // Free before it says so: whoever sees the firing ended may use the workspace.
        app.busy.store(false, Ordering::SeqCst);
        run.end(&status, error);
        if let Err(e) = record(&fs, &run) {
            tracing::warn!("recording schedule run {}: {e:#}", run.id);
        }
        if let Some(log) = idle {
            log.push(json!({"type": "session_status", "status": "idle"}));
        }
    });
    Ok(run_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedules(value: Value) -> Vec<Schedule> {
        let text = json!({"schedules": value}).to_string();
        let (m, diags) =
            trellis_workflow::manifest::parse_manifest(&text, "workflow.json").unwrap();
        assert!(!diags.has_errors(), "{:?}", diags.lines());
        m.original.schedules
    }

    fn utc(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn statuses(decisions: &[Decision]) -> Vec<String> {
        decisions
            .iter()
            .map(|d| match d {
                Decision::Fire(o) => format!(
                    "fire {} {}",
                    o.schedule_id,
                    o.at.map(rfc3339).unwrap_or_default()
                ),
                Decision::Record(o, s, _) => format!(
                    "{s} {} {}",
                    o.schedule_id,
                    o.at.map(rfc3339).unwrap_or_default()
                ),
            })
            .collect()
    }

    fn ended(schedule: &str, at: &str, status: &str, completed: &str) -> ScheduleRun {
        ScheduleRun {
            id: format!("{schedule}-{at}"),
            schedule_id: schedule.into(),
            trigger_source: "cron".into(),
            scheduled_for: Some(at.into()),
            run_folder: "iteration-0".into(),
            session_id: None,
            status: status.into(),
            error: None,
            duration_ms: None,
            group_names: Vec::new(),
            started_at: at.into(),
            completed_at: Some(completed.into()),
            pid: None,
        }
    }

    #[test]
    fn missed_occurrences_catch_up_once_within_the_start_delay() {
        let s = schedules(json!([
            {"id": "hourly", "cron_expression": "0 * * * *", "enabled": true},
            {"id": "strict", "cron_expression": "0 * * * *", "enabled": true,
             "max_start_delay_minutes": 10}
        ]));
        // The server was down from 09:00 to 12:20: three occurrences each since its last.
        let history = [
            ended(
                "hourly",
                "2026-12-03T09:00:00Z",
                "success",
                "2026-12-03T09:05:00Z",
            ),
            ended(
                "strict",
                "2026-12-03T09:00:00Z",
                "success",
                "2026-12-03T09:05:00Z",
            ),
        ];
        let mut state = State::default();
        let d = decide(
            &mut state,
            &s,
            &history,
            utc("2026-12-03T12:20:00Z"),
            false,
            false,
        );
        assert_eq!(
            statuses(&d),
            [
                "missed hourly 2026-12-03T11:00:00Z",
                "missed strict 2026-12-03T11:00:00Z",
                "missed strict 2026-12-03T12:00:00Z",
                "fire hourly 2026-12-03T12:00:00Z",
            ]
        );
        // Looked at, nothing again until the next hour.
        let d = decide(
            &mut state,
            &s,
            &history,
            utc("2026-12-03T12:59:00Z"),
            false,
            false,
        );
        assert!(d.is_empty(), "{:?}", statuses(&d));
        // A schedule never seen before and without history starts from now.
        let mut fresh = State::default();
        assert!(
            decide(
                &mut fresh,
                &s,
                &[],
                utc("2026-12-03T12:20:00Z"),
                false,
                false
            )
            .is_empty()
        );
    }

    #[test]
    fn a_busy_workspace_meets_each_collision_policy() {
        let s = schedules(json!([
            {"id": "skip", "cron_expression": "*/5 * * * *", "enabled": true},
            {"id": "latest", "cron_expression": "*/5 * * * *", "enabled": true, "collision_policy": "queue_latest"},
            {"id": "retry", "cron_expression": "*/5 * * * *", "enabled": true, "collision_policy": "retry"},
            {"id": "fold", "cron_expression": "*/5 * * * *", "enabled": true, "collision_policy": "coalesce"}
        ]));
        let mut state = State::default();
        decide(
            &mut state,
            &s,
            &[],
            utc("2026-12-03T10:01:00Z"),
            true,
            false,
        );
        let d = decide(
            &mut state,
            &s,
            &[],
            utc("2026-12-03T10:05:30Z"),
            true,
            false,
        );
        assert_eq!(
            statuses(&d),
            [
                "skipped skip 2026-12-03T10:05:00Z",
                "skipped fold 2026-12-03T10:05:00Z"
            ]
        );
        let d = decide(
            &mut state,
            &s,
            &[],
            utc("2026-12-03T10:10:30Z"),
            true,
            false,
        );
        assert_eq!(
            statuses(&d),
            [
                "skipped skip 2026-12-03T10:10:00Z",
                "skipped latest 2026-12-03T10:05:00Z",
                "skipped fold 2026-12-03T10:10:00Z",
            ]
        );
        // Free again: the queue runs one at a time, oldest first.
        let d = decide(
            &mut state,
            &s,
            &[],
            utc("2026-12-03T10:11:00Z"),
            false,
            false,
        );
        assert_eq!(statuses(&d), ["fire retry 2026-12-03T10:05:00Z"]);
        let d = decide(
            &mut state,
            &s,
            &[],
            utc("2026-12-03T10:12:00Z"),
            false,
            false,
        );
        assert_eq!(statuses(&d), ["fire latest 2026-12-03T10:10:00Z"]);
        let d = decide(
            &mut state,
            &s,
            &[],
            utc("2026-12-03T10:13:00Z"),
            false,
            false,
        );
        assert_eq!(statuses(&d), ["fire retry 2026-12-03T10:10:00Z"]);
        // Paused, nothing fires.
        let d = decide(
            &mut state,
            &s,
            &[],
            utc("2026-12-03T10:16:00Z"),
            false,
            true,
        );
        assert!(d.is_empty(), "{:?}", statuses(&d));
    }

    #[test]
    fn a_dependency_is_released_by_the_same_dates_end_or_expires_at_its_deadline() {
        let s = schedules(json!([
            {"id": "load", "cron_expression": "0 6 * * *", "enabled": true, "timezone": "Europe/Paris"},
            {"id": "report", "cron_expression": "0 7 * * *", "enabled": true, "timezone": "Europe/Paris",
             "after_schedule_id": "load", "after_delay_minutes": 15, "dependency_deadline": "09:00"}
        ]));
        let mut state = State::default();
        decide(
            &mut state,
            &s,
            &[],
            utc("2026-12-03T05:59:00Z"),
            false,
            false,
        );
        // 07:00 Paris: load of the day has not ended; report waits.
        let d = decide(
            &mut state,
            &s,
            &[],
            utc("2026-12-03T06:00:30Z"),
            false,
            false,
        );
        assert!(d.is_empty(), "{:?}", statuses(&d));
        // Yesterday's load does not release it; today's, ended at 07:30 Paris, does at 07:45.
        let history = [
            ended(
                "load",
                "2026-12-02T05:00:00Z",
                "success",
                "2026-12-02T05:10:00Z",
            ),
            ended(
                "load",
                "2026-12-03T05:00:00Z",
                "success",
                "2026-12-03T06:30:00Z",
            ),
        ];
        let d = decide(
            &mut state,
            &s,
            &history[..1],
            utc("2026-12-03T06:40:00Z"),
            false,
            false,
        );
        assert!(d.is_empty(), "{:?}", statuses(&d));
        let d = decide(
            &mut state,
            &s,
            &history,
            utc("2026-12-03T06:40:00Z"),
            false,
            false,
        );
        assert!(d.is_empty(), "the delay: {:?}", statuses(&d));
        let d = decide(
            &mut state,
            &s,
            &history,
            utc("2026-12-03T06:45:00Z"),
            false,
            false,
        );
        assert_eq!(statuses(&d), ["fire report 2026-12-03T06:00:00Z"]);
        // The next day's load fails: report expires at 09:00 Paris.
        let failed = [ended(
            "load",
            "2026-12-04T05:00:00Z",
            "error",
            "2026-12-04T05:10:00Z",
        )];
        let d = decide(
            &mut state,
            &s,
            &failed,
            utc("2026-12-04T06:00:30Z"),
            false,
            false,
        );
        assert_eq!(statuses(&d), ["fire load 2026-12-04T05:00:00Z"]);
        let d = decide(
            &mut state,
            &s,
            &failed,
            utc("2026-12-04T07:59:00Z"),
            false,
            false,
        );
        assert!(d.is_empty(), "{:?}", statuses(&d));
        let d = decide(
            &mut state,
            &s,
            &failed,
            utc("2026-12-04T08:00:00Z"),
            false,
            false,
        );
        assert_eq!(statuses(&d), ["expired report 2026-12-04T06:00:00Z"]);
    }
}
