//! The scheduler's endpoints, in the original system's shape: `GET/PUT /api/scheduler/config`
//! (the global pause), `GET /api/scheduler/jobs` (each schedule with its next firing, its
//! last run and its history), `POST /api/scheduler/jobs` (a new schedule),
//! `GET/PUT/DELETE /api/scheduler/jobs/{id}` and `GET .../runs`, and `POST .../trigger`,
//! `.../stop`, `.../enable`, `.../disable`. Every edit of `workflow.json` is validated and
//! logged to the changelog as the builder's are.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use trellis_builder::schedules::{ScheduleRun, history_problem, read_runs};
use trellis_workflow::manifest::schedules::Schedule;

use crate::App;
use crate::api::{ApiError, ApiResult, body_object};
use crate::scheduler::{self, Occurrence};

/// Runs of a schedule a job answer carries in its list.
const RUNS_IN_LIST: usize = 10;

/// A schedule as the API gives it: its definition, its next firing (by the scheduler's
/// clock), whether it fires now, its last run and its latest `runs`.
fn job(app: &App, s: &Schedule, history: &[ScheduleRun], runs: usize) -> Value {
    let mut value = serde_json::to_value(s).unwrap_or(Value::Null);
    let mine: Vec<&ScheduleRun> = history.iter().filter(|r| r.schedule_id == s.id).collect();
    let next = s
        .enabled
        .then(|| s.next_after(app.scheduler.now()))
        .flatten();
    value["next_firing"] = json!(next.map(|t| t.to_rfc3339()));
    value["next_firing_local"] = json!(next.map(|t| t.with_timezone(&s.tz()).to_rfc3339()));
    value["firing"] = json!(app.scheduler.firing().as_deref() == Some(s.id.as_str()));
    value["queued"] = json!(app.scheduler.queued(&s.id));
    value["last_run"] = json!(mine.first());
    value["runs"] = json!(mine.iter().take(runs).collect::<Vec<_>>());
    value
}

/// The schedules of `workflow.json`; `422 workspace_errors` naming its problems when it
/// does not load.
fn schedules(app: &App) -> Result<Arc<Vec<Schedule>>, ApiError> {
    scheduler::loaded_schedules(app).map_err(|why| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "workspace_errors",
            format!("the schedules cannot be read, and none fires, until this is fixed: {why}"),
        )
    })
}

fn find(app: &App, id: &str) -> Result<Schedule, ApiError> {
    let schedules = schedules(app)?;
    let ids: Vec<String> = schedules.iter().map(|s| s.id.clone()).collect();
    schedules
        .iter()
        .find(|s| s.id == id)
        .cloned()
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "no schedule {id:?} in workflow.json (its schedules: {})",
                if ids.is_empty() {
                    "none".to_string()
                } else {
                    ids.join(", ")
                }
            ))
        })
}

/// The history, and why its file cannot be read when it cannot (the next entry written
/// sets it aside).
fn history(app: &App) -> Result<(Vec<ScheduleRun>, Option<String>), ApiError> {
    let fs = app.workspace_fs()?;
    Ok((read_runs(&fs), history_problem(&fs)))
}

/// Runs `read` off the server's threads, counted among the workspace's reads at once
/// (`503 too_many_reads` past them): the files it reads and the next firings it works out
/// take time.
async fn off_thread<T: Send + 'static>(
    app: &Arc<App>,
    read: impl FnOnce(&App) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let on = app.clone();
    crate::workspace::blocking_read(app, move || read(&on)).await?
}

/// Schedule `id`, read off the server's threads.
async fn find_off_thread(app: &Arc<App>, id: &str) -> Result<Schedule, ApiError> {
    let id = id.to_string();
    off_thread(app, move |app| find(app, &id)).await
}

/// `GET /api/scheduler/jobs`.
pub async fn jobs(State(app): State<Arc<App>>) -> ApiResult {
    off_thread(&app, |app| {
        let (history, problem) = history(app)?;
        let jobs: Vec<Value> = schedules(app)?
            .iter()
            .map(|s| job(app, s, &history, RUNS_IN_LIST))
            .collect();
        Ok(Json(json!({
            "jobs": jobs,
            "paused": scheduler::paused(),
            "now": app.scheduler.now().to_rfc3339(),
            "history_error": problem,
        })))
    })
    .await
}

/// `GET /api/scheduler/jobs/{id}`.
pub async fn one(State(app): State<Arc<App>>, Path(id): Path<String>) -> ApiResult {
    off_thread(&app, move |app| {
        let s = find(app, &id)?;
        let (history, problem) = history(app)?;
        let mut answer = job(app, &s, &history, usize::MAX);
        answer["history_error"] = json!(problem);
        Ok(Json(answer))
    })
    .await
}

/// `GET /api/scheduler/jobs/{id}/runs`.
pub async fn runs(State(app): State<Arc<App>>, Path(id): Path<String>) -> ApiResult {
    off_thread(&app, move |app| {
        let s = find(app, &id)?;
        let (history, problem) = history(app)?;
        let runs: Vec<ScheduleRun> = history
            .into_iter()
            .filter(|r| r.schedule_id == s.id)
            .collect();
        Ok(Json(
            json!({"schedule_id": s.id, "runs": runs, "history_error": problem}),
        ))
    })
    .await
}

/// `POST /api/scheduler/jobs/{id}/trigger`: fires the schedule now (enabled or not):
/// `202 {schedule_id, run_id}`, `409 workflow_busy` while a builder turn or a firing runs.
pub async fn trigger(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let _edit = app.scheduler.edits.lock().await;
    let s = find_off_thread(&app, &id).await?;
    let occ = Occurrence {
        schedule_id: s.id.clone(),
        at: None,
        source: "manual",
    };
    let run_id = scheduler::start_firing(&app, s, occ)
        .map_err(|why| ApiError::new(StatusCode::CONFLICT, "workflow_busy", why))?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"schedule_id": id, "run_id": run_id, "status": "running"})),
    ))
}

/// `POST /api/scheduler/jobs/{id}/stop`: stops the schedule's firing, if it runs.
pub async fn stop(State(app): State<Arc<App>>, Path(id): Path<String>) -> ApiResult {
    let s = find_off_thread(&app, &id).await?;
    let stopping = app.scheduler.stop(&app, &s.id);
    Ok(Json(json!({"schedule_id": s.id, "stopping": stopping})))
}

/// `POST /api/scheduler/jobs/{id}/enable` and `.../disable`: edits `workflow.json`,
/// validated and logged to the changelog like the builder's edits.
pub async fn enable(State(app): State<Arc<App>>, Path(id): Path<String>) -> ApiResult {
    set_enabled(&app, &id, true).await
}

/// See [`enable`].
pub async fn disable(State(app): State<Arc<App>>, Path(id): Path<String>) -> ApiResult {
    set_enabled(&app, &id, false).await
}

async fn set_enabled(app: &Arc<App>, id: &str, enabled: bool) -> ApiResult {
    let _edit = app.scheduler.edits.lock().await;
    let s = find_off_thread(app, id).await?;
    let reason = format!(
        "{} from the server's scheduler API",
        if enabled { "enabled" } else { "disabled" }
    );
    edit(app, move |root| {
        trellis_builder::edits::set_schedule_enabled(root, &s.id, enabled, &reason)
    })
    .await
    .map(Json)
}

/// Runs an edit of `workflow.json` off the server's threads: its answer, or `422 refused`
/// with what the validation said.
async fn edit(
    app: &Arc<App>,
    change: impl FnOnce(&std::path::Path) -> trellis_builder::ToolResult + Send + 'static,
) -> Result<Value, ApiError> {
    let root = app.root.clone();
    crate::workspace::blocking_read(app, move || change(&root))
        .await?
        .map_err(|f| ApiError::refused(f.message))
}

/// `POST /api/scheduler/jobs`: the body is a new schedule (as `workflow.json` holds one):
/// `201` with its job, `409 exists` for an id taken, `422 refused` naming what does not
/// validate.
pub async fn create(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let schedule: Value = body_object(body)?;
    let Some(id) = schedule
        .get("id")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return Err(ApiError::bad_request(
            "the body is a schedule: a JSON object with a string `id` (and `cron_expression`, \
             or `schedule_type` calendar with `calendar_items`)",
        ));
    };
    let _edit = app.scheduler.edits.lock().await;
    if find_off_thread(&app, &id).await.is_ok() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "exists",
            format!(
                "workflow.json has a schedule {id:?} already: PUT /api/scheduler/jobs/{id} replaces it"
            ),
        ));
    }
    edit(&app, move |root| {
        trellis_builder::edits::add_schedule(
            root,
            schedule,
            "added from the server's scheduler API",
        )
    })
    .await?;
    let answer = off_thread(&app, move |app| {
        let s = find(app, &id)?;
        Ok(job(app, &s, &history(app)?.0, 0))
    })
    .await?;
    Ok((StatusCode::CREATED, Json(answer)))
}

/// `PUT /api/scheduler/jobs/{id}`: the body replaces the schedule whole (its `id` may be
/// left out); the job as it is now.
pub async fn replace(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let schedule: Value = body_object(body)?;
    let _edit = app.scheduler.edits.lock().await;
    let s = find_off_thread(&app, &id).await?;
    edit(&app, move |root| {
        trellis_builder::edits::replace_schedule(
            root,
            &s.id,
            schedule,
            "replaced from the server's scheduler API",
        )
    })
    .await?;
    off_thread(&app, move |app| {
        let s = find(app, &id)?;
        Ok(Json(job(app, &s, &history(app)?.0, RUNS_IN_LIST)))
    })
    .await
}

/// `DELETE /api/scheduler/jobs/{id}`: removes the schedule (its history stays); `409
/// firing` while it fires (stop it first: a firing of a schedule gone would have no handle).
pub async fn remove(State(app): State<Arc<App>>, Path(id): Path<String>) -> ApiResult {
    let _edit = app.scheduler.edits.lock().await;
    let s = find_off_thread(&app, &id).await?;
    if app.scheduler.firing().as_deref() == Some(s.id.as_str()) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "firing",
            format!(
                "schedule {:?} is firing: POST /api/scheduler/jobs/{}/stop ends the firing, \
                 then it can be deleted",
                s.id, s.id
            ),
        ));
    }
    edit(&app, move |root| {
        trellis_builder::edits::delete_schedule(
            root,
            &s.id,
            "deleted from the server's scheduler API",
        )
    })
    .await
    .map(Json)
}

/// `GET /api/scheduler/config`: the global pause.
pub async fn config(State(_app): State<Arc<App>>) -> ApiResult {
    let mut config = scheduler::pause_config();
    if !config.is_object() {
        config = json!({});
    }
    config["disabled_by_environment"] =
        json!(std::env::var("TRELLIS_SCHEDULER").is_ok_and(|v| v.eq_ignore_ascii_case("off")));
    config["paused"] = json!(scheduler::paused());
    Ok(Json(config))
}

/// `PUT /api/scheduler/config {globally_paused}`.
pub async fn set_config(
    State(_app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Config {
        globally_paused: bool,
    }
    let request: Config = body_object(body)?;
    scheduler::write_pause_config(request.globally_paused)
        .map(Json)
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "config",
                format!("{e:#}"),
            )
        })
}
