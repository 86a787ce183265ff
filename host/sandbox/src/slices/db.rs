//! The db slice: `trellis:plugin/workflow-db`, the workflow database behind the SQL fences
//! of [`sql`].
//!
//! Per call it holds the database grant (none: every statement is refused), the connection
//! opened on first use (read-only unless the grant is writable), and the call's deadline,
//! at which a running statement is interrupted.

pub mod sql;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::{HasSelf, Linker};

use crate::capabilities::DbGrant;
use crate::plugins::bindings::tool::trellis::plugin::workflow_db;
use crate::slices::fs::guard::FsBudget;
use crate::state::CallState;
use sql::{GuardedDb, SqlAccess};

/// Rows a `workflow-db` query may return.
const DB_MAX_ROWS: usize = 10_000;
/// Bytes of JSON a `workflow-db` query may return.
const DB_MAX_BYTES: usize = 8 << 20;

/// Links `workflow-db`, once: at 0.1.0 (every world) and at 0.2.0 (the script runner's,
/// which adds `run`).
pub(crate) fn add_to_linker(linker: &mut Linker<CallState>) -> anyhow::Result<()> {
    workflow_db::add_to_linker::<CallState, HasSelf<DbState>>(linker, |s| &mut s.db)?;
    v2::add_to_linker::<CallState, HasSelf<DbState>>(linker, |s| &mut s.db)?;
    crate::plugins::bindings::script::trellis::plugin::types::add_to_linker::<
        CallState,
        HasSelf<DbState>,
    >(linker, |s| &mut s.db)?;
    Ok(())
}

use crate::plugins::bindings::script::trellis::plugin::workflow_db as v2;

impl crate::plugins::bindings::script::trellis::plugin::types::Host for DbState {}

/// The 0.2.0 interface: the same statements as 0.1.0, plus `run`.
impl v2::Host for DbState {
    async fn query(
        &mut self,
        sql: String,
        params: Vec<v2::SqlValue>,
    ) -> Result<String, v2::DbError> {
        let params = params.into_iter().map(v1_value).collect();
        workflow_db::Host::query(self, sql, params)
            .await
            .map_err(v2_error)
    }

    async fn execute(
        &mut self,
        sql: String,
        params: Vec<v2::SqlValue>,
    ) -> Result<u64, v2::DbError> {
        let params = params.into_iter().map(v1_value).collect();
        workflow_db::Host::execute(self, sql, params)
            .await
            .map_err(v2_error)
    }

    async fn run(&mut self, sql: String, params: Vec<v2::SqlValue>) -> Result<String, v2::DbError> {
        let params: Vec<workflow_db::SqlValue> = params.into_iter().map(v1_value).collect();
        let result = self.off_thread(move |db| db.run_any(&sql, &params)).await;
        self.note_deadline(&result);
        result.map_err(v2_error)
    }
}

fn v1_value(value: v2::SqlValue) -> workflow_db::SqlValue {
    match value {
        v2::SqlValue::Null => workflow_db::SqlValue::Null,
        v2::SqlValue::Integer(n) => workflow_db::SqlValue::Integer(n),
        v2::SqlValue::Real(f) => workflow_db::SqlValue::Real(f),
        v2::SqlValue::Text(t) => workflow_db::SqlValue::Text(t),
    }
}

fn v2_error(error: workflow_db::DbError) -> v2::DbError {
    match error {
        workflow_db::DbError::NotGranted => v2::DbError::NotGranted,
        workflow_db::DbError::ReadOnly(m) => v2::DbError::ReadOnly(m),
        workflow_db::DbError::Sql(m) => v2::DbError::Sql(m),
        workflow_db::DbError::TooLarge(m) => v2::DbError::TooLarge(m),
    }
}

/// How many rows a query may return.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RowCap {
    /// More rows than this fail the query.
    Refuse(usize),
    /// Rows past this many (and past the host's limit) are left out.
    Truncate(usize),
}

/// The workflow database of one call.
pub(crate) struct DbState {
    grant: Option<DbGrant>,
    conn: Option<GuardedDb>,
    /// When the call must end: database statements are stopped here too.
    deadline: Instant,
    /// A statement was stopped because the call's deadline passed.
    deadline_hit: bool,
    /// The call's write budget: what the database may grow by comes out of it.
    budget: Arc<FsBudget>,
}

impl DbState {
    /// The database of `grant`, if any, for a call ending in `timeout`.
    pub(crate) fn new(grant: Option<DbGrant>, timeout: Duration, budget: Arc<FsBudget>) -> Self {
        DbState {
            grant,
            conn: None,
            deadline: Instant::now() + timeout,
            deadline_hit: false,
            budget,
        }
    }

    /// Whether a statement ran into the call's deadline: the call timed out, even if the
    /// guest carried on after the error it got.
    pub(crate) fn deadline_hit(&self) -> bool {
        self.deadline_hit
    }

    fn connection(&mut self, sql: &str) -> Result<&GuardedDb, workflow_db::DbError> {
        let Some(grant) = &self.grant else {
            return Err(workflow_db::DbError::NotGranted);
        };
        sql::refuse_unseen(sql).map_err(workflow_db::DbError::Sql)?;
        if self.conn.is_none() {
            // A read-only grant opens the file read-only: even a statement that
            // slipped past the read-only check below could not write.
            let access = if grant.writable {
                SqlAccess::ReadWrite
            } else {
                SqlAccess::ReadOnly
            };
            // Whole milliseconds: the time shows in messages.
            let left = Duration::from_millis(
                self.deadline
                    .saturating_duration_since(Instant::now())
                    .as_millis() as u64,
            );
            // SQLITE_OPEN_NOFOLLOW refuses a link anywhere on the path: the folder is named
            // canonically (the host checked it holds no link), the file itself must not be one.
            let path = match (grant.path.parent(), grant.path.file_name()) {
                (Some(dir), Some(name)) => dir
                    .canonicalize()
                    .map(|d| d.join(name))
                    .unwrap_or_else(|_| grant.path.clone()),
                _ => grant.path.clone(),
            };
            // What the database may grow by comes out of the call's write budget.
            let growth = self.budget.write_bytes_left();
            let conn = sql::open_with_growth(&path, access, left, growth)
                .map_err(|e| workflow_db::DbError::Sql(format!("opening the workflow db: {e}")))?;
            self.conn = Some(conn);
        }
        Ok(self.conn.as_ref().expect("connection opened above"))
    }
}

/// Each statement runs on the blocking pool, the call's future waiting for it: a long
/// statement holds up its own call only, not the other calls polled on the same thread (the
/// tool calls of a turn run together in one task).
impl workflow_db::Host for DbState {
    async fn query(
        &mut self,
        sql: String,
        params: Vec<workflow_db::SqlValue>,
    ) -> Result<String, workflow_db::DbError> {
        let result = self.off_thread(move |db| db.run_query(&sql, &params)).await;
        self.note_deadline(&result);
        result
    }

    async fn execute(
        &mut self,
        sql: String,
        params: Vec<workflow_db::SqlValue>,
    ) -> Result<u64, workflow_db::DbError> {
        use workflow_db::DbError;
        if self.grant.as_ref().is_some_and(|db| !db.writable) {
            return Err(DbError::ReadOnly(
                "this turn has read-only access to the workflow db".into(),
            ));
        }
        let result = self
            .off_thread(move |db| db.run_execute(&sql, &params))
            .await;
        self.note_deadline(&result);
        result
    }
}

impl DbState {
    /// Runs `f` on the state on tokio's blocking pool, and takes the state back. A call
    /// dropped meanwhile (cancelled, past its deadline) leaves an empty state behind, which
    /// nothing reads: its store goes with it.
    async fn off_thread<T: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut DbState) -> T + Send + 'static,
    ) -> T {
        let empty = DbState {
            grant: None,
            conn: None,
            deadline: self.deadline,
            deadline_hit: self.deadline_hit,
            budget: self.budget.clone(),
        };
        let mut state = std::mem::replace(self, empty);
        let (state, out) = match tokio::task::spawn_blocking(move || {
            let out = f(&mut state);
            (state, out)
        })
        .await
        {
            Ok(done) => done,
            Err(err) => std::panic::resume_unwind(err.into_panic()),
        };
        *self = state;
        out
    }

    fn note_deadline<T>(&mut self, result: &Result<T, workflow_db::DbError>) {
        if let Err(workflow_db::DbError::Sql(message)) = result
            && message.starts_with(sql::DEADLINE_MESSAGE)
        {
            self.deadline_hit = true;
        }
    }

    fn run_query(
        &mut self,
        sql: &str,
        params: &[workflow_db::SqlValue],
    ) -> Result<String, workflow_db::DbError> {
        let (rows, _) = self.rows(sql, params, RowCap::Refuse(DB_MAX_ROWS))?;
        Ok(serde_json::Value::Array(rows).to_string())
    }

    /// Rows of a read-only statement as JSON objects, capped as `cap` says; also whether
    /// rows were left out. The byte cap of a query holds either way.
    pub(crate) fn rows(
        &mut self,
        sql: &str,
        params: &[workflow_db::SqlValue],
        cap: RowCap,
    ) -> Result<(Vec<serde_json::Value>, bool), workflow_db::DbError> {
        let (names, rows, truncated) = self.query_rows(sql, params, cap)?;
        let objects = rows
            .into_iter()
            .map(|row| serde_json::Value::Object(names.iter().cloned().zip(row).collect()))
            .collect();
        Ok((objects, truncated))
    }

    /// `run` of 0.2.0: a read-only statement's columns (in order) and rows, or what a
    /// statement that modifies the database changed.
    fn run_any(
        &mut self,
        sql: &str,
        params: &[workflow_db::SqlValue],
    ) -> Result<String, workflow_db::DbError> {
        use workflow_db::DbError;
        let readonly = {
            let db = self.connection(sql)?;
            let stmt = db
                .conn()
                .prepare(sql)
                .map_err(|e| DbError::Sql(db.describe(&e)))?;
            stmt.readonly()
        };
        if readonly {
            let (columns, rows, _) = self.query_rows(sql, params, RowCap::Refuse(DB_MAX_ROWS))?;
            return Ok(serde_json::json!({"columns": columns, "rows": rows}).to_string());
        }
        if self.grant.as_ref().is_some_and(|db| !db.writable) {
            return Err(DbError::ReadOnly(
                "this turn has read-only access to the workflow db".into(),
            ));
        }
        let changed = self.run_execute(sql, params)?;
        let rowid = self
            .conn
            .as_ref()
            .map(|db| db.conn().last_insert_rowid())
            .unwrap_or_default();
        Ok(serde_json::json!({
            "columns": [], "rows": [], "changed": changed, "last-insert-rowid": rowid
        })
        .to_string())
    }

    /// The column names and rows of a read-only statement, within the size limit and the
    /// row cap `cap`; also whether rows were left out.
    #[allow(clippy::type_complexity)]
    fn query_rows(
        &mut self,
        sql: &str,
        params: &[workflow_db::SqlValue],
        cap: RowCap,
    ) -> Result<(Vec<String>, Vec<Vec<serde_json::Value>>, bool), workflow_db::DbError> {
        use workflow_db::DbError;
        let db = self.connection(sql)?;
        let failed = |e: rusqlite::Error| DbError::Sql(db.describe(&e));
        let mut stmt = db.conn().prepare(sql).map_err(failed)?;
        if !stmt.readonly() {
            return Err(DbError::ReadOnly(
                "query runs read-only statements only; use execute to modify the database".into(),
            ));
        }
        let names: Vec<String> = stmt.column_names().map(|s| s.to_string()).collect();
        let mut rows = stmt
            .query(rusqlite::params_from_iter(params.iter().map(to_sql)))
            .map_err(failed)?;
        let mut out = Vec::new();
        let mut bytes = 0;
        while let Some(row) = rows.next().map_err(failed)? {
            match cap {
                RowCap::Refuse(most) if out.len() == most => {
                    return Err(DbError::TooLarge(format!("more than {most} rows")));
                }
                RowCap::Truncate(most) if out.len() == most.min(DB_MAX_ROWS) => {
                    return Ok((names, out, true));
                }
                _ => {}
            }
            let mut values = Vec::with_capacity(names.len());
            for (i, name) in names.iter().enumerate() {
                let value = sql::sql_to_json(row.get_ref(i).map_err(failed)?);
                bytes += name.len() + value.to_string().len();
                // Checked per value: one row of many 16 MiB columns is a gigabyte.
                if bytes > DB_MAX_BYTES {
                    return Err(DbError::TooLarge(format!(
                        "result over {DB_MAX_BYTES} bytes"
                    )));
                }
                values.push(value);
            }
            out.push(values);
        }
        Ok((names, out, false))
    }

    /// Runs `statements` in one transaction: all of them or, at the first error, none
    /// (rolled back). Returns the rows each changed. Refused on a read-only grant, and a
    /// statement that ends or opens a transaction itself is refused before anything runs.
    pub(crate) fn execute_all(
        &mut self,
        statements: &[(String, Vec<workflow_db::SqlValue>)],
    ) -> Result<Vec<u64>, (usize, workflow_db::DbError)> {
        use workflow_db::DbError;
        if self.grant.as_ref().is_some_and(|db| !db.writable) {
            return Err((
                0,
                DbError::ReadOnly("this turn has read-only access to the workflow db".into()),
            ));
        }
        for (i, (sql, _)) in statements.iter().enumerate() {
            if sql::controls_transaction(sql) {
                return Err((
                    i,
                    DbError::Sql(
                        "statements run in one transaction the host opens and ends: BEGIN, COMMIT, END, \
                         ROLLBACK, SAVEPOINT and RELEASE are not allowed"
                            .into(),
                    ),
                ));
            }
        }
        let first = statements.first().map_or("", |(sql, _)| sql.as_str());
        self.connection(first).map_err(|e| (0, e))?;
        let begin = self
            .conn
            .as_ref()
            .map(|db| db.conn().execute_batch("BEGIN IMMEDIATE"));
        if let Some(Err(e)) = begin {
            let message = self.conn.as_ref().map(|db| db.describe(&e));
            return Err((0, DbError::Sql(message.unwrap_or_default())));
        }
        let mut changed = Vec::with_capacity(statements.len());
        for (i, (sql, params)) in statements.iter().enumerate() {
            let result = sql::refuse_unseen(sql)
                .map_err(DbError::Sql)
                .and_then(|()| self.run_execute(sql, params));
            self.note_deadline(&result);
            match result {
                Ok(n) => changed.push(n),
                Err(e) => {
                    if let Some(db) = &self.conn {
                        let _ = db.conn().execute_batch("ROLLBACK");
                    }
                    return Err((i, e));
                }
            }
        }
        // The pages a commit writes (what the cache still held) are counted, not stopped.
        let commit = self.conn.as_ref().map(|db| {
            let (done, written) =
                sql::counting_writes(u64::MAX, || db.conn().execute_batch("COMMIT"));
            self.budget.charge_growth(written);
            (done, db)
        });
        if let Some((Err(e), db)) = commit {
            let message = db.describe(&e);
            let _ = db.conn().execute_batch("ROLLBACK");
            return Err((statements.len().saturating_sub(1), DbError::Sql(message)));
        }
        Ok(changed)
    }

    fn run_execute(
        &mut self,
        sql: &str,
        params: &[workflow_db::SqlValue],
    ) -> Result<u64, workflow_db::DbError> {
        let allowance = self.budget.write_bytes_left();
        let db = self.connection(sql)?;
        // What the statement writes to the database's files (its journal too) comes out of
        // the call's write budget, whether or not the file grows.
        let (changed, written) = sql::counting_writes(allowance, || {
            db.conn()
                .execute(sql, rusqlite::params_from_iter(params.iter().map(to_sql)))
        });
        let result = match changed {
            Ok(changed) => Ok(changed as u64),
            Err(e) => {
                let message = db.describe(&e);
                if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
                    || message.starts_with(sql::WRITES_MESSAGE)
                {
                    // `max_page_count` of the connection, or the bytes it wrote: the call's
                    // write budget.
                    self.budget.note_write_limit();
                }
                Err(workflow_db::DbError::Sql(message))
            }
        };
        self.budget.charge_growth(written);
        result
    }
}

/// A parameter of a statement run by [`HostDb`].
#[derive(Debug, Clone, PartialEq)]
pub enum SqlParam {
    /// `NULL`.
    Null,
    /// An integer.
    Integer(i64),
    /// A real number.
    Real(f64),
    /// Text.
    Text(String),
}

impl From<&SqlParam> for workflow_db::SqlValue {
    fn from(p: &SqlParam) -> Self {
        match p {
            SqlParam::Null => workflow_db::SqlValue::Null,
            SqlParam::Integer(n) => workflow_db::SqlValue::Integer(*n),
            SqlParam::Real(f) => workflow_db::SqlValue::Real(*f),
            SqlParam::Text(t) => workflow_db::SqlValue::Text(t.clone()),
        }
    }
}

/// The workflow database as the host's own tools reach it (the agents'
/// `query_workflow_db` and `mutate_workflow_db`): the connection, fences, row and byte caps,
/// deadline and growth ceiling of a guest's `workflow-db` calls, for one tool call. It runs
/// on the calling thread: call it from a blocking task.
pub struct HostDb(DbState);

impl std::fmt::Debug for HostDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostDb")
    }
}

/// What the calls of one agent turn may write together: what its database tool calls grow
/// the database by, and (given to the plugin calls of the turn with
/// [`crate::Grant::with_turn_writes`]) the bytes and files its plugin calls write, each
/// call's on top of its own per-call budget.
#[derive(Debug, Clone)]
pub struct DbWriteBudget(pub(crate) Arc<FsBudget>);

impl PartialEq for DbWriteBudget {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for DbWriteBudget {}

impl DbWriteBudget {
    /// A fresh budget of `limits` (its bytes-written cap is what the calls may write and the
    /// database grow by, together; its created-entries cap the files and folders they make).
    pub fn new(limits: crate::capabilities::FsLimits) -> Self {
        DbWriteBudget(FsBudget::new(limits))
    }

    /// The budget of a whole run of the workspace at `root` (`limits`: what everything of
    /// the run may write and create together), which its turns' budgets
    /// ([`DbWriteBudget::within`]) are part of; its writes also come out of the workspace's
    /// quota of `quota` bytes on disk, its folder measured now
    /// ([`crate::slices::fs::quota`]). The second value is why the run may not begin (as
    /// [`DbWriteBudget::over_quota`] says), from the same measurement.
    pub fn for_run(
        limits: crate::capabilities::FsLimits,
        root: &Path,
        quota: u64,
    ) -> (Self, Option<String>) {
        let (workspace, refused) = crate::slices::fs::quota::workspace_budget(root, quota);
        let budget = DbWriteBudget(FsBudget::shared(
            limits,
            crate::slices::fs::guard::Shared::Run,
            Some(workspace),
        ));
        (budget, refused)
    }

    /// Why a run of the workspace at `root` may not begin: its folder takes `quota` bytes
    /// or more on disk (or cannot be measured), the message saying so.
    pub fn over_quota(root: &Path, quota: u64) -> Option<String> {
        crate::slices::fs::quota::over_quota(root, quota)
    }

    /// The bytes the folder at `root` takes on disk, as the quota measures it (allocated,
    /// a file of several links once, links not followed), or why it counts as full.
    pub fn disk_use(root: &Path) -> Result<u64, String> {
        crate::slices::fs::quota::measure(root)
    }

    /// A turn's budget of `limits` whose writes also come out of `run`'s.
    pub fn within(limits: crate::capabilities::FsLimits, run: &DbWriteBudget) -> Self {
        DbWriteBudget(FsBudget::shared(
            limits,
            crate::slices::fs::guard::Shared::Turn,
            Some(run.0.clone()),
        ))
    }

    /// The bytes the calls may still write.
    pub fn bytes_left(&self) -> u64 {
        self.0.write_bytes_left()
    }

    /// Takes `bytes` the host wrote for the calls (files it rewrote for them) out of the
    /// budget.
    pub fn charge(&self, bytes: u64) {
        self.0.charge_growth(bytes);
    }
}

impl HostDb {
    /// The database of `grant`, for one call within `limits` (its deadline, and its write
    /// budget for what the database may grow by).
    pub fn new(grant: DbGrant, limits: &crate::Limits) -> Self {
        Self::with_budget(grant, limits, &DbWriteBudget::new(limits.fs))
    }

    /// [`HostDb::new`] with the growth taken out of `budget`, shared with other calls.
    pub fn with_budget(grant: DbGrant, limits: &crate::Limits, budget: &DbWriteBudget) -> Self {
        HostDb(DbState::new(Some(grant), limits.timeout, budget.0.clone()))
    }

    /// The rows of one read-only statement as JSON objects, at most `max_rows` (and the
    /// host's limit); also whether rows were left out.
    pub fn rows(
        &mut self,
        sql: &str,
        params: &[SqlParam],
        max_rows: usize,
    ) -> Result<(Vec<serde_json::Value>, bool), String> {
        let params: Vec<workflow_db::SqlValue> = params.iter().map(Into::into).collect();
        self.0
            .rows(sql, &params, RowCap::Truncate(max_rows))
            .map_err(describe_error)
    }

    /// Runs `statements` in one transaction (see [`DbState::execute_all`]): the rows each
    /// changed, or the index of the statement that failed and why (nothing was changed).
    /// What the database grew by is charged to the budget, so the calls sharing it cannot
    /// together grow it past it.
    pub fn execute_all(
        &mut self,
        statements: &[(String, Vec<SqlParam>)],
    ) -> Result<Vec<u64>, (usize, String)> {
        let statements: Vec<(String, Vec<workflow_db::SqlValue>)> = statements
            .iter()
            .map(|(sql, params)| (sql.clone(), params.iter().map(Into::into).collect()))
            .collect();
        let limit = self.0.budget.write_bytes_left();
        // What the statements write is charged to the budget as they run.
        self.0.execute_all(&statements).map_err(|(i, e)| {
            let mut text = describe_error(e);
            if text.contains("database or disk is full") {
                text.push_str(&format!(
                    " (the database may grow by {limit} more bytes in this turn, within what \
                     its run may write (--max-turn-write-mib, --max-run-write-mib) and what is \
                     left of the workspace's quota (--max-workspace-mib); delete or shrink \
                     rows, or write less)"
                ));
            }
            (i, text)
        })
    }
}

fn describe_error(e: workflow_db::DbError) -> String {
    use workflow_db::DbError;
    match e {
        DbError::NotGranted => "this turn has no access to the workflow db".to_string(),
        DbError::ReadOnly(m) => format!("read-only: {m}"),
        DbError::Sql(m) => m,
        DbError::TooLarge(m) => format!("result too large: {m}"),
    }
}

fn to_sql(value: &workflow_db::SqlValue) -> rusqlite::types::Value {
    use rusqlite::types::Value;
    match value {
        workflow_db::SqlValue::Null => Value::Null,
        workflow_db::SqlValue::Integer(n) => Value::Integer(*n),
        workflow_db::SqlValue::Real(f) => Value::Real(*f),
        workflow_db::SqlValue::Text(t) => Value::Text(t.clone()),
    }
}
