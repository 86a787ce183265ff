//! The endpoints that show what the workspace holds beyond the plan: costs, the changelog,
//! the knowledge base and learnings, run artifacts and turn logs, any workspace file and the
//! database. Each reads through the builder's read tools (`trellis_builder::operator`), so
//! it refuses what the builder's model is refused (links, hard links, FIFOs, `..`, secret
//! files, SQL that writes) and reads within the same budgets.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use trellis_builder::edits::changelog::{CHANGELOG_DIR, read_entries_within};
use trellis_sandbox::store::Kind;

use crate::App;
use crate::api::{ApiError, ApiResult, Params, body_object};

/// Reads of the workspace (read tools) in progress at once on a server.
pub const READS_AT_ONCE: usize = 4;

/// Changelog files (one per day) `GET /api/workflow/changelog` reads, newest first.
const CHANGELOG_DAYS: usize = 14;

/// Runs `work`, a read of the workspace, off the server's threads: one of
/// [`READS_AT_ONCE`] at once, else `503 too_many_reads`. Every endpoint whose reads grow with
/// what the workspace holds (files, artifacts, costs, the changelog, the plan, the database)
/// goes through here.
pub(crate) async fn blocking_read<T: Send + 'static>(
    app: &App,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    let permit = app.reads.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_reads",
            format!(
                "{READS_AT_ONCE} reads of the workspace (files, artifacts, costs, the \
                 changelog, the plan, the database) are in progress, the limit; try again \
                 when one ends"
            ),
        )
    })?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work()
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "read", e.to_string()))
}

/// The answer of read tool `name`, or its failure as an error: `404` for what does not
/// exist, `422 refused` for the rest (a link, a secret file, SQL that writes, bad values).
async fn read_tool(app: &App, name: &str, args: Value) -> ApiResult {
    // The tools read files and run SQL on the calling thread (a statement may run its 30 s,
    // a read its 256 MiB).
    let (root, runtime, name) = (app.root.clone(), app.runtime.clone(), name.to_string());
    let done = blocking_read(app, move || {
        tokio::runtime::Handle::current().block_on(trellis_builder::operator::read(
            &root,
            runtime.registry(),
            &Default::default(),
            &name,
            &args,
        ))
    })
    .await?;
    done.map(Json).map_err(|failure| {
        let detail = match &failure.details {
            Some(details) => format!("{} ({details})", failure.message),
            None => failure.message.clone(),
        };
        if failure.message.contains("does not exist") || failure.message.contains("no such") {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", detail)
        } else {
            ApiError::refused(detail)
        }
    })
}

/// The string query parameters of an endpoint, each optional.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    max_depth: Option<u64>,
    #[serde(default)]
    offset_line: Option<u64>,
    #[serde(default)]
    max_lines: Option<u64>,
}

/// The arguments object of the parameters given.
fn args_of(pairs: &[(&str, Option<Value>)]) -> Value {
    Value::Object(
        pairs
            .iter()
            .filter_map(|(k, v)| v.clone().map(|v| (k.to_string(), v)))
            .collect::<Map<String, Value>>(),
    )
}

/// `GET /api/workflow/costs`: the builder's token usage (totals, by day) and the steps' from
/// their turn logs.
pub async fn costs(State(app): State<Arc<App>>) -> ApiResult {
    read_tool(&app, "get_cost_summary", json!({})).await
}

/// `GET /api/workflow/llm-config`: the models in force, the builder's and each step's.
pub async fn llm_config(State(app): State<Arc<App>>) -> ApiResult {
    read_tool(&app, "get_llm_config", json!({})).await
}

/// `GET /api/workflow/files?path=&max_depth=`: the files under a workspace folder.
pub async fn list_files(State(app): State<Arc<App>>, Params(q): Params<PathQuery>) -> ApiResult {
    let args = args_of(&[
        ("path", q.path.map(Value::from)),
        ("max_depth", q.max_depth.map(Value::from)),
    ]);
    read_tool(&app, "list_workspace_files", args).await
}

/// `GET /api/workflow/file?path=&offset_line=&max_lines=`: a workspace file's text.
pub async fn read_file(State(app): State<Arc<App>>, Params(q): Params<PathQuery>) -> ApiResult {
    let Some(path) = q.path else {
        return Err(ApiError::bad_request(
            "path: give the workspace file to read",
        ));
    };
    let args = args_of(&[
        ("path", Some(Value::from(path))),
        ("offset_line", q.offset_line.map(Value::from)),
        ("max_lines", q.max_lines.map(Value::from)),
    ]);
    read_tool(&app, "read_workspace_file", args).await
}

/// `GET /api/workflow/knowledge`: the files of the knowledge base and of the learnings.
pub async fn knowledge(State(app): State<Arc<App>>) -> ApiResult {
    let mut answer = Map::new();
    for folder in ["knowledgebase", "learnings"] {
        let listing = match read_tool(&app, "list_workspace_files", json!({"path": folder})).await {
            Ok(Json(listing)) => listing,
            Err(e) if e.status() == StatusCode::NOT_FOUND => json!({"files": [], "note":
                format!("{folder}/ does not exist yet")}),
            Err(e) => return Err(e),
        };
        answer.insert(folder.to_string(), listing);
    }
    Ok(Json(Value::Object(answer)))
}

/// `GET /api/workflow/artifacts?step_id=&group_name=&path=`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactQuery {
    #[serde(default)]
    step_id: Option<String>,
    #[serde(default)]
    group_name: Option<String>,
    #[serde(default)]
    path: Option<String>,
}

/// `GET /api/workflow/artifacts`: the run folders, and each step's outputs, session, turn
/// logs and summary in the active run (of a group, or one step); with `path`, the artifact
/// under `runs/` itself.
pub async fn artifacts(State(app): State<Arc<App>>, Params(q): Params<ArtifactQuery>) -> ApiResult {
    let args = args_of(&[
        ("step_id", q.step_id.map(Value::from)),
        ("group_name", q.group_name.map(Value::from)),
        ("path", q.path.map(Value::from)),
    ]);
    read_tool(&app, "list_run_artifacts", args).await
}

/// `POST /api/workflow/db/query {sql, params?, max_rows?}`: one read-only statement on the
/// workflow database.
pub async fn db_query(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct DbQuery {
        sql: String,
        #[serde(default)]
        params: Option<Vec<Value>>,
        #[serde(default)]
        max_rows: Option<u64>,
    }
    let q: DbQuery = body_object(body)?;
    let args = args_of(&[
        ("sql", Some(Value::from(q.sql))),
        ("params", q.params.map(Value::from)),
        ("max_rows", q.max_rows.map(Value::from)),
    ]);
    read_tool(&app, "query_database", args).await
}

/// JSON values `GET /api/workflow/changelog` parses for one answer, all days together.
pub const CHANGELOG_VALUES: usize = trellis_sandbox::json_values::MAX_FILE_VALUES / 2;

/// Bytes of day files `GET /api/workflow/changelog` reads for one answer, all days together.
pub const CHANGELOG_BYTES: u64 = 16 << 20;

/// `GET /api/workflow/changelog`: the plan edits of the last days with changes, newest day
/// first (`planning/changelog/changelog-<day>.json`), within [`CHANGELOG_VALUES`] and
/// [`CHANGELOG_BYTES`]: a day past what is left is named, not read.
pub async fn changelog(State(app): State<Arc<App>>) -> ApiResult {
    let fs = app.workspace_fs()?.with_work(trellis_builder::call_work());
    blocking_read(&app, move || changelog_days(&fs)).await?
}

fn changelog_days(fs: &trellis_sandbox::store::WorkspaceFs) -> ApiResult {
    let mut days: Vec<String> = match fs.kind(CHANGELOG_DIR) {
        Ok(Some(Kind::Dir)) => fs
            .list(CHANGELOG_DIR)
            .map_err(|e| ApiError::refused(e.to_string()))?
            .into_iter()
            .filter(|(name, kind)| {
                *kind == Kind::File && name.starts_with("changelog-") && name.ends_with(".json")
            })
            .map(|(name, _)| name)
            .collect(),
        _ => Vec::new(),
    };
    days.sort_unstable_by(|a, b| b.cmp(a));
    let mut files = Vec::new();
    let mut values_left = CHANGELOG_VALUES;
    let mut bytes_left = CHANGELOG_BYTES;
    for name in days.iter().take(CHANGELOG_DAYS) {
        let rel = format!("{CHANGELOG_DIR}/{name}");
        let path = std::path::Path::new(&rel);
        if trellis_builder::reads::has_other_links(fs, path) {
            files.push(json!({"file": rel, "error": "refused: it has other hard links"}));
            continue;
        }
        let len = fs.metadata_len(path).unwrap_or(0);
        if len > bytes_left {
            files.push(json!({"file": rel, "error": format!(
                "not read: {len} bytes, more than the {bytes_left} left of the {CHANGELOG_BYTES} \
                 one answer reads"
            )}));
            continue;
        }
        bytes_left -= len;
        let entry = match read_entries_within(fs, path, &mut values_left) {
            Ok(entries) => json!({"file": rel, "entries": entries}),
            Err(e) => json!({"file": rel, "error": e.to_string()}),
        };
        files.push(entry);
    }
    Ok(Json(
        json!({"days": files, "more_days": days.len().saturating_sub(CHANGELOG_DAYS)}),
    ))
}

/// `GET /api/workflow/steps/{id}/grant`: what each turn of the step may see, as the next run
/// of the active run (`iteration-0`) grants it: every folder with its access and role, the
/// database, and what the step declares that does not exist yet. Like a run, it creates the
/// step's empty output folders when missing; it writes nothing else.
pub async fn step_grant(
    State(app): State<Arc<App>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> ApiResult {
    let root = app.root.clone();
    blocking_read(&app, move || grant_of(&root, &id)).await?
}

fn grant_of(root: &std::path::Path, id: &str) -> ApiResult {
    use trellis_runner::grants::{TurnContext, TurnPurpose, turn_grant};
    use trellis_sandbox::capabilities::Access;
    let ws = trellis_workflow::Workspace::open(root).map_err(|diags| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "workspace_errors",
            diags.lines().join("\n"),
        )
    })?;
    let Some(step) = ws.plan.find_step(id) else {
        return Err(ApiError::not_found(format!("the plan has no step {id:?}")));
    };
    let configs = ws.agent_configs(&step.id);
    let ctx = TurnContext {
        root: &ws.root,
        run_folder: "iteration-0",
        step,
        configs: &configs,
    };
    let mut turns = Vec::new();
    for item in step.effective_items() {
        let grant = turn_grant(&ctx, TurnPurpose::Item(&item))
            .map_err(|e| ApiError::refused(format!("{e:#}")))?;
        let folders: Vec<Value> = grant
            .folders
            .iter()
            .map(|f| {
                json!({"path": f.path, "role": f.role, "access": match f.access {
                    Access::ReadOnly => "read-only",
                    Access::ReadWrite => "read-write",
                }})
            })
            .collect();
        let missing: Vec<Value> = grant
            .missing
            .iter()
            .map(|(field, path)| json!({"field": field, "path": path}))
            .collect();
        turns.push(json!({
            "item_id": item.id,
            "folders": folders,
            "database": grant.db_writable.map(|w| if w { "read-write" } else { "read-only" }),
            "missing": missing,
        }));
    }
    Ok(Json(json!({
        "step_id": step.id,
        "run_folder": "iteration-0",
        "turns": turns,
        "agent_configs": serde_json::to_value(&configs).unwrap_or(Value::Null),
    })))
}
