//! The database tools of every agent turn: `query_workflow_db` (read-only SQL, table
//! descriptions, a bounded number of rows) and `mutate_workflow_db` (statements with
//! parameters, all in one transaction), host tools of the category `workflow_db` on
//! `db/db.sqlite`.
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
    let params = json!({
        "type": "array",
        "description": "Values for the ? placeholders, in order (string, number or null).",
        "items": {"type": ["string", "number", "integer", "null"]}
    });
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
            parameters: json!({
                "type": "object",
                "properties": {
                    "sql": {"type": "string", "description": "One read-only SQL statement."},
                    "params": params,
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
                                "params": params
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

fn query(db: &mut HostDb, args: &Value) -> Result<Value, String> {
    let obj = object(args, &["sql", "params", "max_rows"])?;
    let max_rows = match obj.get("max_rows") {
        None | Some(Value::Null) => DEFAULT_ROWS,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_ROWS as u64).contains(&n) => n as usize,
            _ => return Err(format!("max_rows: expected 1 to {MAX_ROWS}, found {v}")),
        },
    };
    let Some(sql) = obj.get("sql").filter(|v| !v.is_null()) else {
        let (tables, _) = db.rows(
            "SELECT name, type, sql FROM sqlite_schema \
             WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%' ORDER BY name",
            &[],
            MAX_ROWS,
        )?;
        return Ok(json!({ "tables": tables }));
    };
    let sql = sql.as_str().ok_or("sql: expected a string")?;
    let params = sql_params(obj.get("params"), "params")?;
    let (rows, truncated) = db.rows(sql, &params, max_rows)?;
    Ok(json!({ "row_count": rows.len(), "truncated": truncated, "rows": rows }))
}

fn mutate(db: &mut HostDb, args: &Value) -> Result<Value, String> {
    let obj = object(args, &["statements"])?;
    let list = obj
        .get("statements")
        .and_then(Value::as_array)
        .filter(|l| !l.is_empty())
        .ok_or("statements: expected a non-empty list of {\"sql\", \"params\"}")?;
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
