//! The rows of a foreach item: its `source_sql`, run read-only against `db/db.sqlite`
//! (spec section 4).
//!
//! The database is opened through [`sql::open`] (read-only, no `ATTACH`, a deadline of
//! [`sql::PLAN_SQL_TIMEOUT`]), and the statement is asked `readonly()` before it runs, so a
//! query that would write is refused with a message rather than attempted. `max_iterations`
//! caps the rows; how many were dropped is returned so the caller logs it: capping is never
//! silent. Without a cap, more than [`MAX_ROWS`] rows is an error, and so are kept rows of more
//! than [`MAX_BYTES`] in all (they stay in memory until their turns have run).

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value};

use trellis_sandbox::capabilities::sql::{self, SqlAccess};

/// Rows a foreach item may run without `max_iterations`: each is an agent turn.
pub const MAX_ROWS: usize = 100_000;
/// Bytes the kept rows of a foreach item may hold in all: their JSON text, and
/// [`ROW_BYTES`] for each row and [`FIELD_BYTES`] for each field besides.
pub const MAX_BYTES: usize = 64 << 20;
/// What holding one row costs beyond its fields: a kept row is a JSON object, whose
/// first entry allocates a whole map node, so a row of one short field takes hundreds of
/// bytes of memory for the few of its text.
pub const ROW_BYTES: usize = 512;
/// What holding one field of a row costs beyond its name and its value's JSON text.
pub const FIELD_BYTES: usize = 64;

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
    query_rows_within(
        db_path,
        item_id,
        source_sql,
        max_iterations,
        sql::PLAN_SQL_TIMEOUT,
    )
}

fn query_rows_within(
    db_path: &Path,
    item_id: &str,
    source_sql: &str,
    max_iterations: Option<u64>,
    timeout: std::time::Duration,
) -> Result<ForeachRows> {
    let ctx = || format!("foreach item {item_id:?}");
    if !db_path.is_file() {
        bail!(
            "foreach item {item_id:?}: the database {} does not exist",
            db_path.display()
        );
    }
    let db = sql::open(db_path, SqlAccess::ReadOnly, timeout)
        .with_context(|| format!("{}: opening {}", ctx(), db_path.display()))?;
    sql::refuse_unseen(source_sql)
        .map_err(|e| anyhow::anyhow!("{}: source_sql cannot be used: {e}", ctx()))?;
    let failed =
        |what: &str, e: rusqlite::Error| anyhow::anyhow!("{}: {what}: {}", ctx(), db.describe(&e));
    let mut stmt = db
        .conn()
        .prepare(source_sql)
        .map_err(|e| failed("source_sql cannot be used", e))?;
    if !stmt.readonly() {
        bail!(
            "foreach item {item_id:?}: source_sql would modify the database; only read-only queries (SELECT) are allowed"
        );
    }
    let names: Vec<String> = stmt.column_names().map(|s| s.to_string()).collect();
    let cap = match max_iterations {
        None | Some(0) => None,
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let mut rows = stmt
        .query([])
        .map_err(|e| failed("running source_sql", e))?;
    let mut out = Vec::new();
    let mut total = 0usize;
    let mut bytes = 0usize;
    while let Some(row) = rows
        .next()
        .map_err(|e| failed(&format!("reading row {}", total + 1), e))?
    {
        total += 1;
        if cap.is_none() && total > MAX_ROWS {
            bail!(
                "{}: source_sql returned more than {MAX_ROWS} rows; set max_iterations to cap them",
                ctx()
            );
        }
        if out.len() >= cap.unwrap_or(usize::MAX) {
            // Rows past the cap are only counted.
            continue;
        }
        let mut obj = Map::new();
        bytes += ROW_BYTES;
        for (i, name) in names.iter().enumerate() {
            let value = row.get_ref(i).with_context(ctx)?;
            // With duplicate column names the first one wins, as the caller reads `{{.name}}`.
            if obj.contains_key(name) {
                continue;
            }
            let value = trellis_sandbox::store::sql_to_json(value);
            bytes += FIELD_BYTES + name.len() + value.to_string().len();
            if bytes > MAX_BYTES {
                bail!(
                    "{}: source_sql returned more than {MAX_BYTES} bytes; select fewer or smaller columns, or set max_iterations",
                    ctx()
                );
            }
            obj.insert(name.clone(), value);
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
    use rusqlite::Connection;
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

    /// Rows are kept in memory until their turns have run: 100,000 rows of strings up to the
    /// 16 MiB value limit would be terabytes. What a query may hand over is bounded in bytes.
    #[test]
    fn rows_are_bounded_in_bytes_not_only_in_number() {
        let (_d, path) = db();
        let big = "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 100) \
                   SELECT n, printf('%.*c', 1000000, 'x') AS big FROM c";
        let err = query_rows(&path, "it", big, None).unwrap_err();
        assert_eq!(
            format!("{err:#}"),
            format!(
                "foreach item \"it\": source_sql returned more than {MAX_BYTES} bytes; \
                 select fewer or smaller columns, or set max_iterations"
            )
        );
        // Rows past max_iterations are only counted, so they cost nothing.
        let capped = query_rows(&path, "it", big, Some(3)).unwrap();
        assert_eq!((capped.rows.len(), capped.total), (3, 100));
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

    #[test]
    fn attach_and_runaway_queries_are_stopped() {
        let (dir, path) = db();
        let evil = dir.path().join("evil.db");
        let sql = format!("ATTACH DATABASE '{}' AS e", evil.display());
        let err = query_rows(&path, "it", &sql, None).unwrap_err();
        assert!(format!("{err:#}").contains("not authorized"), "{err:#}");
        assert!(!evil.exists());

        let endless = "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) \
                       SELECT n FROM c";
        let err = query_rows_within(
            &path,
            "it",
            endless,
            Some(1),
            std::time::Duration::from_millis(100),
        )
        .unwrap_err();
        assert!(
            format!("{err:#}").contains(sql::DEADLINE_MESSAGE),
            "{err:#}"
        );
        let err = query_rows(&path, "it", endless, None).unwrap_err();
        assert!(
            format!("{err:#}").contains("returned more than 100000 rows; set max_iterations"),
            "{err:#}"
        );
    }
}
