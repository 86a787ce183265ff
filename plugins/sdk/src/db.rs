//! The workflow database (`db/db.sqlite`), reached through the host.
//!
//! Plugins never open the SQLite file: the host runs each statement, read-only
//! unless the current turn grants writes, and answers [`DbError::NotGranted`] when
//! the call has no database at all.
//!
//! ```rust,ignore
//! use trellis_plugin_sdk::db;
//! let rows = db::query("SELECT id, title FROM tasks WHERE status = ?", &["open".into()])?;
//! let changed = db::execute("UPDATE tasks SET status = 'done' WHERE id = ?", &[42.into()])?;
//! ```

use serde_json::Value;

use crate::bindings::trellis::plugin::workflow_db;
use crate::tool::ToolError;

pub use crate::bindings::trellis::plugin::workflow_db::{DbError, SqlValue};

/// Runs a read-only statement with `?` parameters and returns its rows, each a
/// JSON object keyed by column name.
pub fn query(sql: &str, params: &[SqlValue]) -> Result<Vec<Value>, DbError> {
    let json = workflow_db::query(sql, params)?;
    // The host promises an array of objects; anything else is a host bug, reported
    // rather than hidden so it is noticed.
    serde_json::from_str(&json).map_err(|e| {
        DbError::Sql(format!(
            "the host returned rows that are not a JSON array: {e}"
        ))
    })
}

/// Runs a statement that may modify the database; returns the number of rows
/// changed. Fails with [`DbError::ReadOnly`] unless the turn grants writes.
pub fn execute(sql: &str, params: &[SqlValue]) -> Result<u64, DbError> {
    workflow_db::execute(sql, params)
}

impl From<i64> for SqlValue {
    fn from(value: i64) -> Self {
        SqlValue::Integer(value)
    }
}

impl From<f64> for SqlValue {
    fn from(value: f64) -> Self {
        SqlValue::Real(value)
    }
}

impl From<&str> for SqlValue {
    fn from(value: &str) -> Self {
        SqlValue::Text(value.to_owned())
    }
}

impl From<String> for SqlValue {
    fn from(value: String) -> Self {
        SqlValue::Text(value)
    }
}

impl<T: Into<SqlValue>> From<Option<T>> for SqlValue {
    fn from(value: Option<T>) -> Self {
        value.map_or(SqlValue::Null, Into::into)
    }
}

/// Lets a tool use `?` on database calls: a missing or read-only grant is
/// `denied`, the rest `failed`, each with a message the agent can act on.
impl From<DbError> for ToolError {
    fn from(err: DbError) -> Self {
        match err {
            DbError::NotGranted => {
                ToolError::Denied("this call has no access to the workflow database".to_owned())
            }
            DbError::ReadOnly(message) => ToolError::Denied(format!(
                "the workflow database is read-only for this call: {message}"
            )),
            DbError::Sql(message) => {
                ToolError::Failed(format!("the database rejected the statement: {message}"))
            }
            DbError::TooLarge(message) => {
                ToolError::Failed(format!("the result is too large: {message}"))
            }
        }
    }
}
