//! Db rules: read-only SQL on the workflow database.
//!
//! The database is opened through [`sql::open`] (read-only, no `ATTACH`, the db rules of one
//! gate bounded together by [`sql::PLAN_SQL_TIMEOUT`]), and every statement is asked
//! `readonly()` before it runs, so a rule that would write is refused with a message rather
//! than attempted.

use std::path::Path;

use rusqlite::ErrorCode;
use serde_json::{Map, Value};

use super::GateError;
use super::json_checks::{Sink, run_check};
use super::schema::DbRule;
use trellis_sandbox::capabilities::sql::{self, GuardedDb, SqlAccess};

/// The database file, relative to the workspace.
pub const DB_FILE: &str = "db/db.sqlite";

/// Rows read at most per rule; enough for any sensible `min_rows`, and a bound on a query that
/// would return the whole database.
const MAX_ROWS_READ: u64 = 100_000;

/// Opens the workflow database read-only. `workspace` must already be known to hold
/// `db/db.sqlite` as a regular file (not a symlink out of the workspace).
pub(crate) fn open_read_only(workspace: &Path) -> Result<GuardedDb, GateError> {
    // SQLITE_OPEN_NOFOLLOW refuses a link anywhere on the path, the workspace's own
    // ancestors included: name the file under the canonical folder.
    let path = workspace
        .canonicalize()
        .unwrap_or_else(|_| workspace.to_path_buf())
        .join(DB_FILE);
    sql::open(&path, SqlAccess::ReadOnly, sql::PLAN_SQL_TIMEOUT)
        .map_err(|e| GateError::Db(format!("{DB_FILE} cannot be opened: {e}")))
}

/// Runs one db rule, recording its checks in `sink`.
pub(crate) fn run_rule(db: &GuardedDb, rule: &DbRule, sink: &mut Sink) -> Result<(), GateError> {
    let label = rule.label().to_string();
    sql::refuse_unseen(&rule.sql)
        .map_err(|e| GateError::Schema(vec![format!("db rule {label:?}: {e}")]))?;
    // No fresh deadline per rule: the rules of one gate share the connection's
    // [`sql::PLAN_SQL_TIMEOUT`], so a schema of many slow rules cannot hold the gate for
    // many times that.
    let mut stmt = match db.conn().prepare(&rule.sql) {
        Ok(s) => s,
        Err(e) => {
            // A file SQLite was refused (a hard link at the database or its journal) is no
            // fault of the rule or the step.
            if let Some(refused) = sql::take_refusal() {
                return Err(GateError::Db(format!("db rule {label:?}: {refused}")));
            }
            let msg = e.to_string();
            // A missing table or column is something the step may still have to create: a
            // failed check the agent can repair. Anything else is a broken schema.
            if msg.contains("no such table") || msg.contains("no such column") {
                sink.record(
                    "",
                    "sql",
                    false,
                    "the query runs".into(),
                    msg.clone(),
                    format!("db rule {label:?}: the query failed: {msg}"),
                );
                return Ok(());
            }
            return Err(GateError::Schema(vec![format!(
                "db rule {label:?}: the SQL cannot be used: {msg}"
            )]));
        }
    };
    if !stmt.readonly() {
        return Err(GateError::Schema(vec![format!(
            "db rule {label:?}: the statement would write to the database; only read-only queries (SELECT) are allowed in a validation schema"
        )]));
    }
    let names: Vec<String> = stmt.column_names().map(|s| s.to_string()).collect();
    let mut rows = stmt
        .query([])
        .map_err(|e| GateError::Db(format!("db rule {label:?}: {}", db.describe(&e))))?;
    let mut count: u64 = 0;
    let mut first: Option<Value> = None;
    let cap = rule
        .max_rows
        .map_or(MAX_ROWS_READ, |m| {
            m.saturating_add(1).max(rule.min_rows.unwrap_or(0))
        })
        .min(MAX_ROWS_READ);
    while count < cap {
        let row = match rows.next() {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(e)
                if e.sqlite_error_code() == Some(ErrorCode::OperationInterrupted)
                    || e.sqlite_error_code() == Some(ErrorCode::CannotOpen) =>
            {
                return Err(GateError::Db(format!(
                    "db rule {label:?}: {}",
                    db.describe(&e)
                )));
            }
            Err(e) => {
                sink.record(
                    "",
                    "sql",
                    false,
                    "the query runs".into(),
                    e.to_string(),
                    format!("db rule {label:?}: the query failed: {e}"),
                );
                return Ok(());
            }
        };
        if first.is_none() {
            let mut obj = Map::new();
            for (i, name) in names.iter().enumerate() {
                let v = row
                    .get_ref(i)
                    .map(trellis_sandbox::store::sql_to_json)
                    .unwrap_or(Value::Null);
                obj.insert(name.clone(), v);
            }
            first = Some(Value::Object(obj));
        }
        count += 1;
    }
    let capped = count >= cap;
    let shown = if capped {
        format!("at least {count} row(s)")
    } else {
        format!("{count} row(s)")
    };
    if let Some(min) = rule.min_rows {
        let ok = count >= min;
        sink.record(
            "",
            "min_rows",
            ok,
            format!("at least {min} row(s)"),
            shown.clone(),
            if ok {
                format!("db rule {label:?}: {shown}")
            } else {
                format!(
                    "db rule {label:?}: expected at least {min} row(s), the query returned {shown}"
                )
            },
        );
    }
    if let Some(max) = rule.max_rows {
        let ok = count <= max;
        sink.record(
            "",
            "max_rows",
            ok,
            format!("at most {max} row(s)"),
            shown.clone(),
            if ok {
                format!("db rule {label:?}: {shown}")
            } else {
                format!(
                    "db rule {label:?}: expected at most {max} row(s), the query returned {shown}"
                )
            },
        );
    }
    if rule.checks.is_empty() {
        return Ok(());
    }
    match first {
        Some(row) => {
            for check in &rule.checks {
                run_check(sink, &row, check)
                    .map_err(|e| GateError::Schema(vec![format!("db rule {label:?}: {e}")]))?;
            }
        }
        None => sink.record(
            "",
            "row",
            false,
            "a first row to check".into(),
            "no rows".into(),
            format!("db rule {label:?}: the query returned no row, so its checks cannot hold"),
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rule(name: &str, sql: &str) -> DbRule {
        DbRule {
            name: Some(name.into()),
            sql: sql.into(),
            min_rows: Some(1),
            max_rows: None,
            checks: Vec::new(),
        }
    }

    /// Each rule used to get a fresh 30 s: a schema of n runaway rules held `trellis check`
    /// (and a step's gate) for n × 30 s, with no bound on n. The rules of one gate share the
    /// deadline of its connection.
    #[test]
    fn the_db_rules_of_a_gate_share_one_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .unwrap();
        let db = sql::open(&path, SqlAccess::ReadOnly, Duration::from_millis(300)).unwrap();
        let (mut checks, mut warnings) = (super::super::report::Kept::default(), Vec::new());
        let mut sink = Sink {
            file: DB_FILE,
            checks: &mut checks,
            warnings: &mut warnings,
        };
        let endless = "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) \
                       SELECT count(*) FROM c";
        let first = run_rule(&db, &rule("first", endless), &mut sink).unwrap_err();
        assert_eq!(
            first.to_string(),
            GateError::Db(format!(
                "db rule \"first\": {} (300ms)",
                sql::DEADLINE_MESSAGE
            ))
            .to_string()
        );
        // The budget is spent: the next rule, a quick one, does not get a fresh one.
        let quick = "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c \
                     WHERE n < 100000) SELECT count(*) FROM c";
        let second = run_rule(&db, &rule("second", quick), &mut sink).unwrap_err();
        assert_eq!(
            second.to_string(),
            GateError::Db(format!(
                "db rule \"second\": {} (300ms)",
                sql::DEADLINE_MESSAGE
            ))
            .to_string()
        );
        assert!(sink.checks.checks.is_empty(), "{:?}", sink.checks);
    }
}
