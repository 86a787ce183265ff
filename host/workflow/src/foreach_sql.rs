//! The queries and message templates of foreach items, checked against the workspace's
//! database before anything runs (`trellis validate`).
//!
//! Each `source_sql` is prepared (not run) on a read-only connection to `db/db.sqlite`, else
//! on a scratch database built from `db/seed.sql`; both come from the SQL fence
//! ([`sql::open`]). A query that cannot be prepared (a missing table or column, a syntax
//! error) or that would write is an error, unless an earlier step of the plan may create
//! what it lacks (a scripted step, or one offered a database tool): then a warning. A field
//! the `message` names that is not one of the query's columns is a warning: it renders as
//! the empty value.

use std::path::Path;

use trellis_sandbox::capabilities::sql::{self, SqlAccess};
use trellis_sandbox::store::Kind;

use crate::diagnostics::{Diagnostic, Diagnostics, Severity, listed};
use crate::plan::ItemBody;
use crate::template_fields::row_fields;
use crate::{PLAN_FILE, Step, StepKind, Workspace};

/// The database of the workspace, relative to it.
const DB_FILE: &str = "db/db.sqlite";
/// The SQL the database is made from when it is missing, relative to the workspace.
const SEED_SQL: &str = "db/seed.sql";

/// The diagnostics of every foreach query and message of `ws`'s plan (see the module docs).
/// Nothing is reported when the workspace has neither a database nor a seed.
pub fn check_foreach_queries(ws: &Workspace) -> Diagnostics {
    let mut diags = Diagnostics::new();
    let scratch = tempfile::tempdir();
    let (db, label) = match open_database(ws, scratch.as_ref().ok().map(|d| d.path())) {
        Ok(Some(found)) => found,
        Ok(None) => return diags,
        Err(message) => {
            diags.push(Diagnostic {
                file: SEED_SQL.to_string(),
                json_path: String::new(),
                step_id: None,
                message,
                severity: Severity::Warning,
            });
            return diags;
        }
    };
    let mut writer_before = false;
    for (i, step) in ws.plan.steps.iter().enumerate() {
        if let StepKind::MessageSequence(ms) = &step.kind {
            for (j, item) in ms.items.iter().enumerate() {
                let ItemBody::Foreach {
                    source_sql,
                    message,
                    ..
                } = &item.body
                else {
                    continue;
                };
                let at = format!("steps[{i}].items[{j}]");
                let mut report = |key: &str, message: String, severity: Severity| {
                    diags.push(Diagnostic {
                        file: PLAN_FILE.to_string(),
                        json_path: format!("{at}.{key}"),
                        step_id: Some(step.id.clone()),
                        message,
                        severity,
                    });
                };
                db.restart_deadline();
                match db.conn().prepare(source_sql) {
                    Ok(stmt) if !stmt.readonly() => report(
                        "source_sql",
                        "the query would change the database: a foreach query must only read"
                            .to_string(),
                        Severity::Error,
                    ),
                    Ok(stmt) => {
                        let columns: Vec<String> =
                            stmt.column_names().map(str::to_string).collect();
                        let known: std::collections::HashSet<&str> =
                            columns.iter().map(String::as_str).collect();
                        let missing: Vec<String> = row_fields(message)
                            .into_iter()
                            .filter(|f| !known.contains(f.as_str()))
                            .map(|f| format!(".{f}"))
                            .collect();
                        if !missing.is_empty() {
                            let (are, they) = match missing.len() {
                                1 => ("is not a column", "it renders"),
                                _ => ("are not columns", "they render"),
                            };
                            report(
                                "message",
                                format!(
                                    "names {}, which {are} of the query (columns: {}): \
                                     {they} empty",
                                    listed(&missing, ", "),
                                    listed(&columns, ", ")
                                ),
                                Severity::Warning,
                            );
                        }
                    }
                    Err(e) if writer_before => report(
                        "source_sql",
                        format!(
                            "cannot be prepared against {label}: {}; an earlier step may \
                             create what it needs",
                            db.describe(&e)
                        ),
                        Severity::Warning,
                    ),
                    Err(e) => report(
                        "source_sql",
                        format!(
                            "cannot be prepared against {label}: {} (no earlier step is \
                             scripted or has a database tool to create it)",
                            db.describe(&e)
                        ),
                        Severity::Error,
                    ),
                }
            }
        }
        writer_before |= may_write_database(ws, step);
    }
    diags
}

/// The most the scratch database `validate` seeds may take: past it the seed is not run to
/// its end and the queries are not checked (a warning says so).
pub const SCRATCH_SEED_BYTES: u64 = 256 << 20;

/// Opens `db/db.sqlite` read-only, else builds a scratch copy from `db/seed.sql` in
/// `scratch`; `None` when there is neither (or either is not a regular file: the run
/// refuses that itself). The label says which one the queries were checked against.
fn open_database(
    ws: &Workspace,
    scratch: Option<&Path>,
) -> Result<Option<(sql::GuardedDb, String)>, String> {
    if matches!(ws.fs.kind(DB_FILE), Ok(Some(Kind::File))) {
        return sql::open(
            &ws.root.join(DB_FILE),
            SqlAccess::ReadOnly,
            sql::PLAN_SQL_TIMEOUT,
        )
        .map(|db| Some((db, DB_FILE.to_string())))
        .map_err(|e| format!("{DB_FILE} cannot be opened: {e}"));
    }
    if !matches!(ws.fs.kind(SEED_SQL), Ok(Some(Kind::File))) {
        return Ok(None);
    }
    let Some(scratch) = scratch else {
        return Ok(None);
    };
    let seed = ws
        .fs
        .read_to_string(SEED_SQL)
        .map_err(|e| format!("cannot be read: {e}"))?;
    // In the system's temp folder: bounded well below a run's database.
    let db = sql::open_with_growth(
        &scratch.join("seed.sqlite"),
        SqlAccess::ReadWrite,
        sql::PLAN_SQL_TIMEOUT,
        SCRATCH_SEED_BYTES,
    )
    .map_err(|e| format!("a scratch database cannot be made: {e}"))?;
    db.conn()
        .execute_batch(&seed)
        .map_err(|e| format!("cannot be run: {}", db.describe(&e)))?;
    Ok(Some((db, format!("the database {SEED_SQL} makes"))))
}

/// Whether `step` may create tables or columns: a scripted step, or one offered a database
/// tool (a tool or server whose name mentions `db` or `sql`).
fn may_write_database(ws: &Workspace, step: &Step) -> bool {
    let configs = ws.agent_configs(&step.id);
    if configs.is_scripted() {
        return true;
    }
    configs
        .selected_tools
        .iter()
        .flatten()
        .chain(configs.selected_servers.iter().flatten())
        .any(|name| {
            let name = name.to_ascii_lowercase();
            name.contains("db") || name.contains("sql")
        })
}
