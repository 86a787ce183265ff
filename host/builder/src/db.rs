//! The database tools of the builder under the names and arguments of the original
//! system's builder: `query_workflow_db` (every mode, read-only) and `mutate_workflow_db`
//! (builder and optimizer modes), on `db/db.sqlite`.
//!
//! Both run through [`trellis_runner::db_tools`] on the connection a guest's `workflow-db` calls get:
//! the same authorizer (no `ATTACH`, only descriptive and checking pragmas, no
//! `load_extension`), the call's deadline, row caps, and a ceiling on what one call may grow
//! the database by, out of what the calls of the turn may write together. The folder `db/` must be a folder and the database a regular file (SQLite
//! opens by path and follows links): a link there is refused before anything opens.
//! `query_workflow_db` returns at most [`MAX_ROWS`] rows: a larger `max_rows` is cut to it,
//! as the original does.

use serde_json::Value;

use trellis_sandbox::capabilities::{DbGrant, resolve_in_root};
use trellis_sandbox::store::{Kind, WorkspaceFs};

use super::{ToolContext, ToolFailure, ToolResult, ToolSpec};
use trellis_runner::db_tools::{self, MUTATE_WORKFLOW_DB, QUERY_WORKFLOW_DB};
use trellis_runner::grants::DB_FILE;

/// The most rows a builder query returns.
pub const MAX_ROWS: usize = 1000;
/// Rows a builder query returns unless it asks for another number.
pub const DEFAULT_ROWS: usize = 500;

/// The specs of both tools.
pub fn specs() -> Vec<ToolSpec> {
    let mut query = db_tools::query_schema(MAX_ROWS);
    // Cut, not refused: the original's calls ask for more.
    query["properties"]["max_rows"] = serde_json::json!({"type": "integer", "minimum": 1});
    vec![
        ToolSpec {
            name: QUERY_WORKFLOW_DB,
            description: "Reads db/db.sqlite, opened read-only: sql (or its alias query) runs \
                          one SELECT, WITH or table-describing PRAGMA; action=describe lists \
                          the tables, or one table's columns with table; \
                          action=integrity_check runs PRAGMA integrity_check. At most \
                          max_rows rows (default 500, at most 1000).",
            parameters: query,
        },
        ToolSpec {
            name: MUTATE_WORKFLOW_DB,
            description: db_tools::MUTATE_DESCRIPTION,
            parameters: db_tools::mutate_schema(),
        },
    ]
}

/// Calls database tool `name`.
pub async fn call(ctx: &ToolContext<'_>, name: &str, args: &Value) -> ToolResult {
    let spec = specs()
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| ToolFailure::new(format!("{name:?} is not a database tool")))?;
    super::reads::check_args(&spec, args)?;
    let (tool, args, writable) = if name == QUERY_WORKFLOW_DB {
        let mut args = args.as_object().cloned().unwrap_or_default();
        let rows = args
            .get("max_rows")
            .and_then(Value::as_u64)
            .map_or(DEFAULT_ROWS, |n| n.min(MAX_ROWS as u64) as usize);
        args.insert("max_rows".into(), rows.into());
        (QUERY_WORKFLOW_DB, Value::Object(args), false)
    } else {
        (MUTATE_WORKFLOW_DB, args.clone(), true)
    };
    let grant = grant(ctx, writable)?;
    ctx.check_time()?;
    db_tools::call(
        tool,
        args,
        Some(grant),
        &ctx.limits_in_time(),
        ctx.turn_writes,
    )
    .await
    .map_err(|e| ToolFailure::new(format!("{name}: {e}")))
}

/// The grant on the workspace's database: `db/` a folder, `db/db.sqlite` a regular file.
pub fn grant(ctx: &ToolContext<'_>, writable: bool) -> Result<DbGrant, ToolFailure> {
    let fs = WorkspaceFs::open(ctx.root).map_err(|e| ToolFailure::new(e.to_string()))?;
    let no_db = || {
        ToolFailure::new(format!(
            "this workspace has no database: {DB_FILE} does not exist"
        ))
    };
    match fs.kind("db") {
        Ok(Some(Kind::Dir)) => {}
        Ok(None) => return Err(no_db()),
        Ok(Some(_)) => return Err(ToolFailure::new("db is not a folder (a link or a file)")),
        Err(e) => return Err(ToolFailure::new(e.to_string())),
    }
    match fs.kind(DB_FILE) {
        Ok(Some(Kind::File)) => {}
        Ok(None) => return Err(no_db()),
        Ok(Some(_)) => {
            return Err(ToolFailure::new(format!(
                "{DB_FILE} is not a regular file (a link or a special file); it is not opened"
            )));
        }
        Err(e) => return Err(ToolFailure::new(e.to_string())),
    }
    let db_dir = resolve_in_root(ctx.root, "db").map_err(|e| ToolFailure::new(e.to_string()))?;
    Ok(DbGrant {
        path: db_dir.join("db.sqlite"),
        writable,
    })
}
