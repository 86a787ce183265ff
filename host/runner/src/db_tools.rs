//! The database tools of every agent turn: `query_workflow_db` (read-only SQL, table
//! descriptions, a bounded number of rows) and `mutate_workflow_db` (statements with
//! parameters, all in one transaction), host tools of the category `workflow_db` on
//! `db/db.sqlite`. Both take the arguments of the original system's tools of the same
//! names as well: `action` (`query`, `describe`, `integrity_check`), `table`, `query` (an
//! alias of `sql`) for a query, one `sql` with `params` for a mutation.
//!
//! They run on the host, on the connection a guest's `workflow-db` calls get
//! ([`trellis_sandbox::capabilities::HostDb`]): the same fences (no `ATTACH`, only descriptive pragmas,
//! the call's deadline, row and byte caps, a ceiling on growth), opened read-only unless the
//! turn's grant lets it modify the database. Tool filters never remove them.

use serde_json::{Value, json};

use trellis_sandbox::Limits;
use trellis_sandbox::capabilities::{DbGrant, DbWriteBudget, HostDb, SqlParam as SqlValue};
use trellis_sandbox::llm::ToolDefinition;

/// The read-only query tool.
pub const QUERY_WORKFLOW_DB: &str = "query_workflow_db";
/// The tool running modifying statements.
pub const MUTATE_WORKFLOW_DB: &str = "mutate_workflow_db";
/// The host-tool category of both.
pub const WORKFLOW_DB_CATEGORY: &str = "workflow_db";
/// Rows a query returns unless it asks for fewer or more.
pub const DEFAULT_ROWS: usize = 200;
/// The most rows one query returns.
pub const MAX_ROWS: usize = 2_000;
/// The most statements one mutation runs.
pub const MAX_STATEMENTS: usize = 500;
/// The one statement `action: integrity_check` runs.
pub const INTEGRITY_CHECK_SQL: &str = "PRAGMA integrity_check";

/// Which database tool a (normalized) tool name is, if any.
pub fn db_tool(name: &str) -> Option<&'static str> {
    match trellis_sandbox::plugins::normalize_tool_name(name.trim()).as_str() {
        QUERY_WORKFLOW_DB => Some(QUERY_WORKFLOW_DB),
        MUTATE_WORKFLOW_DB => Some(MUTATE_WORKFLOW_DB),
        _ => None,
    }
}

/// The definitions of both tools, as the model is told about them.
pub fn definitions() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition {
            name: QUERY_WORKFLOW_DB.to_string(),
            description: format!(
                "Queries the workflow database (db/db.sqlite) with one read-only SQL \
                 statement (SELECT, WITH, or a table-describing PRAGMA) and returns its rows \
                 as JSON objects. Without `sql` it describes the tables (name and CREATE \
                 statement). At most `max_rows` rows come back (default {DEFAULT_ROWS}, at \
                 most {MAX_ROWS}); `truncated` says when more matched."
            ),
            // What agents are told stays as it was (recorded conversations match it); the
            // call still takes the original's arguments (`action`, `table`, `query`).
            parameters: json!({
                "type": "object",
                "properties": {
                    "sql": {"type": "string", "description": "One read-only SQL statement."},
                    "params": params_schema(),
                    "max_rows": {"type": "integer", "minimum": 1, "maximum": MAX_ROWS}
                },
                "additionalProperties": false
            }),
        },
        ToolDefinition {
            name: MUTATE_WORKFLOW_DB.to_string(),
            description: "Modifies the workflow database (db/db.sqlite): runs the statements \
                          (INSERT, UPDATE, DELETE, CREATE TABLE, ...) in order, in one \
                          transaction, so either all apply or none does. Returns the rows each \
                          changed. Refused when this turn's database access is read-only."
                .to_string(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "statements": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "properties": {
                                "sql": {"type": "string"},
                                "params": params_schema()
                            },
                            "required": ["sql"],
                            "additionalProperties": false
                        }
                    }
                },
                "required": ["statements"],
                "additionalProperties": false
            }),
        },
    ]
}

/// What `mutate_workflow_db` is, for the model.
pub const MUTATE_DESCRIPTION: &str = "Modifies the workflow database (db/db.sqlite): one \
     statement in `sql` (with `params`), or several in `statements`, run in order in one \
     transaction, so either all apply or none does (INSERT, UPDATE, DELETE, CREATE TABLE, \
     ...). Returns the rows each changed. Refused when this turn's database access is \
     read-only.";

fn params_schema() -> Value {
    json!({
        "type": "array",
        "description": "Values for the ? placeholders, in order (string, number or null).",
        "items": {"type": ["string", "number", "integer", "null"]}
    })
}

/// The arguments of `query_workflow_db`, with at most `max_rows` rows.
pub fn query_schema(max_rows: usize) -> Value {
    json!({
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["query", "describe", "integrity_check"],
                       "description": "query (the default with sql), describe (the default \
                                       without), or integrity_check."},
            "table": {"type": "string", "description": "With describe: this table's columns."},
            "sql": {"type": "string", "description": "One read-only SQL statement."},
            "query": {"type": "string", "description": "The same as sql."},
            "params": params_schema(),
            "max_rows": {"type": "integer", "minimum": 1, "maximum": max_rows}
        },
        "additionalProperties": false
    })
}

/// The arguments of `mutate_workflow_db`.
pub fn mutate_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "sql": {"type": "string", "description": "One statement (instead of statements)."},
            "params": params_schema(),
            "statements": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "sql": {"type": "string"},
                        "params": params_schema()
                    },
                    "required": ["sql"],
                    "additionalProperties": false
                }
            }
        },
        "additionalProperties": false
    })
}

/// Runs database tool `tool` with `args` under the turn's database grant (`None`: the
/// workspace has no database) within `limits` (its deadline); what the database grows by
/// comes out of `budget`, one per turn, so many calls cannot grow it past one call's limit.
/// Errors are the text the model gets.
pub async fn call(
    tool: &'static str,
    args: Value,
    grant: Option<DbGrant>,
    limits: &Limits,
    budget: &DbWriteBudget,
) -> Result<Value, String> {
    let Some(grant) = grant else {
        return Err("this workspace has no database (db/ does not exist)".to_string());
    };
    let limits = *limits;
    let budget = budget.clone();
    tokio::task::spawn_blocking(move || {
        let mut db = HostDb::with_budget(grant, &limits, &budget);
        match tool {
            QUERY_WORKFLOW_DB => query(&mut db, &args),
            _ => mutate(&mut db, &args),
        }
    })
    .await
    .map_err(|e| format!("the database call did not finish: {e}"))?
}

/// The string argument `key`, trimmed; `None` when absent, null or empty.
fn text_arg<'a>(
    obj: &'a serde_json::Map<String, Value>,
    key: &str,
) -> Result<Option<&'a str>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.trim()).filter(|s| !s.is_empty())),
        Some(other) => Err(format!("{key}: expected a string, found {other}")),
    }
}

/// A table name `describe` takes: letters, digits, `_`, `.`, `-`, at most 128.
fn plain_table_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn query(db: &mut HostDb, args: &Value) -> Result<Value, String> {
    let obj = object(
        args,
        &["action", "table", "sql", "query", "params", "max_rows"],
    )?;
    let max_rows = match obj.get("max_rows") {
        None | Some(Value::Null) => DEFAULT_ROWS,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_ROWS as u64).contains(&n) => n as usize,
            _ => return Err(format!("max_rows: expected 1 to {MAX_ROWS}, found {v}")),
        },
    };
    let sql = match (text_arg(obj, "sql")?, text_arg(obj, "query")?) {
        (Some(a), Some(b)) if a != b => {
            return Err(
                "sql and query were both given, with different statements: give only \
                        sql (query is its alias)"
                    .to_string(),
            );
        }
        (Some(s), _) | (None, Some(s)) => Some(s),
        (None, None) => None,
    };
    let table = text_arg(obj, "table")?;
    let action = match text_arg(obj, "action")? {
        Some(a) => a,
        None if sql.is_some() => "query",
        None => "describe",
    };
    match action {
        "describe" => {
            if sql.is_some() {
                return Err("action=describe takes no sql: give table, or nothing".to_string());
            }
            let Some(table) = table else {
                let (tables, _) = db.rows(
                    "SELECT name, type, sql FROM sqlite_schema \
                     WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%' ORDER BY name",
                    &[],
                    MAX_ROWS,
                )?;
                return Ok(json!({ "tables": tables }));
            };
            if !plain_table_name(table) {
                return Err(format!(
                    "table {table:?}: letters, digits, '_', '.' and '-' only (at most 128)"
                ));
            }
            let (columns, _) =
                db.rows(&format!("PRAGMA table_info(\"{table}\")"), &[], MAX_ROWS)?;
            if columns.is_empty() {
                return Err(format!(
                    "no table {table:?} in the database: action=describe without table lists \
                     them"
                ));
            }
            Ok(json!({ "table": table, "columns": columns }))
        }
        "integrity_check" => {
            if sql.is_some() || table.is_some() {
                return Err(format!(
                    "action=integrity_check takes no sql, query or table: it runs \
                     {INTEGRITY_CHECK_SQL:?}"
                ));
            }
            let (rows, _) = db.rows(INTEGRITY_CHECK_SQL, &[], max_rows)?;
            let ok = rows.len() == 1
                && rows[0].as_object().and_then(|r| r.values().next()) == Some(&json!("ok"));
            Ok(json!({ "ok": ok, "rows": rows }))
        }
        "query" => {
            let sql = sql.ok_or("action=query needs sql (or its alias query)")?;
            let params = sql_params(obj.get("params"), "params")?;
            let (rows, truncated) = db.rows(sql, &params, max_rows)?;
            Ok(json!({ "row_count": rows.len(), "truncated": truncated, "rows": rows }))
        }
        other => Err(format!(
            "action {other:?}: expected query, describe or integrity_check"
        )),
    }
}

fn mutate(db: &mut HostDb, args: &Value) -> Result<Value, String> {
    let obj = object(args, &["statements", "sql", "params"])?;
    let single;
    let list = match (obj.get("statements"), obj.get("sql")) {
        (Some(_), Some(_)) => {
            return Err(
                "give one statement in sql (with params) or several in statements, not both"
                    .to_string(),
            );
        }
        (None, Some(sql)) => {
            single = vec![
                json!({"sql": sql, "params": obj.get("params").cloned().unwrap_or(Value::Null)}),
            ];
            &single
        }
        (statements, None) => {
            if obj.contains_key("params") {
                return Err("params go with sql; in statements each has its own".to_string());
            }
            statements
                .and_then(Value::as_array)
                .filter(|l| !l.is_empty())
                .ok_or(
                    "statements: expected a non-empty list of {\"sql\", \"params\"} (or one \
                     statement in sql)",
                )?
        }
    };
    if list.len() > MAX_STATEMENTS {
        return Err(format!(
            "statements: at most {MAX_STATEMENTS} in one call, found {}",
            list.len()
        ));
    }
    let mut statements = Vec::with_capacity(list.len());
    for (i, entry) in list.iter().enumerate() {
        let at = format!("statements[{i}]");
        let obj = object(entry, &["sql", "params"]).map_err(|e| format!("{at}: {e}"))?;
        let sql = obj
            .get("sql")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{at}.sql: expected a string"))?;
        let params = sql_params(obj.get("params"), &format!("{at}.params"))?;
        statements.push((sql.to_string(), params));
    }
    let changed = db.execute_all(&statements).map_err(|(i, e)| {
        format!("statements[{i}]: {e}; nothing was changed (the transaction was rolled back)")
    })?;
    Ok(json!({
        "committed": true,
        "rows_changed": changed,
        "total_rows_changed": changed.iter().sum::<u64>(),
    }))
}

fn object<'a>(
    value: &'a Value,
    keys: &[&str],
) -> Result<&'a serde_json::Map<String, Value>, String> {
    let obj = value
        .as_object()
        .ok_or_else(|| format!("expected an object, found {value}"))?;
    if let Some(k) = obj.keys().find(|k| !keys.contains(&k.as_str())) {
        return Err(format!(
            "unknown argument {k:?}; expected {}",
            keys.join(", ")
        ));
    }
    Ok(obj)
}

fn sql_params(value: Option<&Value>, at: &str) -> Result<Vec<SqlValue>, String> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let list = value
        .as_array()
        .ok_or_else(|| format!("{at}: expected a list of values"))?;
    list.iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::Null => Ok(SqlValue::Null),
            Value::Bool(b) => Ok(SqlValue::Integer(i64::from(*b))),
            Value::Number(n) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => Ok(SqlValue::Integer(i)),
                (None, Some(f)) => Ok(SqlValue::Real(f)),
                _ => Err(format!("{at}[{i}]: {n} does not fit")),
            },
            Value::String(s) => Ok(SqlValue::Text(s.clone())),
            other => Err(format!(
                "{at}[{i}]: expected a string, number or null, found {other}"
            )),
        })
        .collect()
}
