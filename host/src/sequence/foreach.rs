//! The rows of a foreach item: its `source_sql`, run read-only against `db/db.sqlite`
//! (spec section 4).
//!
//! The database is opened with `SQLITE_OPEN_READ_ONLY` and `PRAGMA query_only`, and the
//! statement is asked `readonly()` before it runs, so a query that would write is refused
//! with a message rather than attempted. `max_iterations` caps the rows; how many were
//! dropped is returned so the caller logs it: capping is never silent.

use std::path::Path;

use anyhow::{Context, Result, bail};
use rusqlite::{Connection, OpenFlags};
use serde_json::{Map, Value};

/// The rows of one foreach item.
#[derive(Debug, Clone, PartialEq)]
pub struct ForeachRows {
    /// The rows to run, each a JSON object keyed by column name, at most `max_iterations`.
    pub rows: Vec<Map<String, Value>>,
    /// How many rows the query returned in all.
    pub total: usize,
    /// How many rows the cap dropped (`total - rows.len()`).
    pub dropped: usize,
}

impl ForeachRows {
    /// A line to log when rows were dropped; `None` when nothing was.
    pub fn cap_message(&self, item_id: &str) -> Option<String> {
        (self.dropped > 0).then(|| {
            format!(
                "foreach item {item_id:?}: max_iterations caps {} rows to {}; {} rows skipped",
                self.total,
                self.rows.len(),
                self.dropped
            )
        })
    }
}

/// Runs `source_sql` of foreach item `item_id` read-only against the database at `db_path`.
/// `max_iterations` of `None` or `0` means no cap (the plan parser rejects 0 already).
pub fn query_rows(
    db_path: &Path,
    item_id: &str,
    source_sql: &str,
    max_iterations: Option<u64>,
) -> Result<ForeachRows> {
    let ctx = || format!("foreach item {item_id:?}");
    if !db_path.is_file() {
        bail!(
            "foreach item {item_id:?}: the database {} does not exist",
            db_path.display()
        );
    }
    let conn = Connection::open_with_flags(
        db_path,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_NOFOLLOW,
    )
    .with_context(|| format!("{}: opening {}", ctx(), db_path.display()))?;
    conn.execute_batch("PRAGMA query_only = ON;")
        .with_context(ctx)?;
    let mut stmt = conn
        .prepare(source_sql)
        .with_context(|| format!("{}: source_sql cannot be used", ctx()))?;
    if !stmt.readonly() {
        bail!(
            "foreach item {item_id:?}: source_sql would modify the database; only read-only queries (SELECT) are allowed"
        );
    }
    let names: Vec<String> = stmt.column_names().map(|s| s.to_string()).collect();
    let cap = match max_iterations {
        None | Some(0) => usize::MAX,
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    };
    let mut rows = stmt
        .query([])
        .with_context(|| format!("{}: running source_sql", ctx()))?;
    let mut out = Vec::new();
    let mut total = 0usize;
    while let Some(row) = rows
        .next()
        .with_context(|| format!("{}: reading row {}", ctx(), total + 1))?
    {
        total += 1;
        if out.len() >= cap {
            // Rows past the cap are only counted.
            continue;
        }
        let mut obj = Map::new();
        for (i, name) in names.iter().enumerate() {
            let value = row.get_ref(i).with_context(ctx)?;
            // With duplicate column names the first one wins, as the caller reads `{{.name}}`.
            obj.entry(name.clone())
                .or_insert_with(|| crate::store::sql_to_json(value));
        }
        out.push(obj);
    }
    Ok(ForeachRows {
        dropped: total - out.len(),
        rows: out,
        total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn db() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE t (id INTEGER, title TEXT, score REAL, note TEXT, data BLOB);
             INSERT INTO t VALUES (1, 'a', 0.5, NULL, x'0102'), (2, 'b', 1.0, 'n', NULL),
                                  (3, 'c', 2.5, NULL, NULL);",
        )
        .unwrap();
        (dir, path)
    }

    #[test]
    fn rows_are_json_objects() {
        let (_d, path) = db();
        let rows = query_rows(&path, "it", "SELECT * FROM t ORDER BY id", None).unwrap();
        assert_eq!((rows.total, rows.dropped), (3, 0));
        assert_eq!(
            Value::Object(rows.rows[0].clone()),
            json!({"id": 1, "title": "a", "score": 0.5, "note": null, "data": "<blob of 2 bytes>"})
        );
        assert_eq!(rows.cap_message("it"), None);
    }

    #[test]
    fn the_cap_reports_what_it_dropped() {
        let (_d, path) = db();
        let rows = query_rows(&path, "it", "SELECT id FROM t ORDER BY id", Some(2)).unwrap();
        let ids: Vec<Value> = rows.rows.iter().map(|r| r["id"].clone()).collect();
        assert_eq!(ids, [json!(1), json!(2)]);
        assert_eq!((rows.total, rows.dropped), (3, 1));
        let msg = rows.cap_message("it").unwrap();
        assert!(
            msg.contains("\"it\"") && msg.contains("1 rows skipped"),
            "{msg}"
        );
    }

    #[test]
    fn writes_are_refused_and_nothing_changes() {
        let (dir, path) = db();
        let before = std::fs::read(&path).unwrap();
        for sql in [
            "DELETE FROM t",
            "INSERT INTO t (id) VALUES (9)",
            "DROP TABLE t",
            "UPDATE t SET id = 0",
        ] {
            let err = query_rows(&path, "it", sql, None).unwrap_err();
            let text = format!("{err:#}");
            assert!(text.contains("foreach item \"it\""), "{sql}: {text}");
            assert!(
                text.contains("read-only") || text.contains("readonly"),
                "{sql}: {text}"
            );
        }
        assert_eq!(std::fs::read(&path).unwrap(), before);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["db.sqlite"]);
    }

    #[test]
    fn bad_sql_and_missing_db_name_the_item() {
        let (dir, path) = db();
        let err = query_rows(&path, "it", "SELECT nope FROM t", None).unwrap_err();
        assert!(
            format!("{err:#}").contains("foreach item \"it\""),
            "{err:#}"
        );
        let missing = dir.path().join("none.sqlite");
        let err = query_rows(&missing, "it", "SELECT 1", None).unwrap_err();
        assert!(err.to_string().contains("does not exist"), "{err}");
        assert!(!missing.exists());
    }
}
