//! The per-call store state and the host interfaces every plugin imports.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::bindings::tool::trellis::plugin::{host, types, workflow_db};
use crate::capabilities::DbGrant;
use crate::capabilities::fs_guard::{FsBudget, GuardedFsView};
use crate::capabilities::sql::{self, GuardedDb, SqlAccess};
use crate::capabilities::{FsLimitExceeded, FsLimits};
use crate::llm::http::HttpPolicy;

/// Log lines longer than this are cut: a plugin cannot flood the host's log.
const LOG_LINE_BYTES: usize = 4 << 10;
/// Log lines per call after which the rest are dropped.
const LOG_LINES_PER_CALL: u32 = 1000;
/// Rows a `workflow-db` query may return.
const DB_MAX_ROWS: usize = 10_000;
/// Bytes of JSON a `workflow-db` query may return.
const DB_MAX_BYTES: usize = 8 << 20;

/// Store data of one plugin call. A fresh one is made for every call.
pub(crate) struct CallState {
    pub(crate) plugin: Arc<str>,
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) memory: MemoryLimit,
    db: Option<DbGrant>,
    db_conn: Option<GuardedDb>,
    /// When the call must end: database statements are stopped here too.
    deadline: Instant,
    fs_budget: Arc<FsBudget>,
    /// A database statement was stopped because the call's deadline passed.
    db_deadline_hit: bool,
    log_lines: u32,
    /// `wasi:http`, linked for LLM providers only; refuses everything unless
    /// [`CallState::allow_http`] set a policy.
    http_ctx: WasiHttpCtx,
    http_policy: HttpPolicy,
}

impl CallState {
    pub(crate) fn new(
        plugin: Arc<str>,
        wasi: WasiCtx,
        memory_bytes: usize,
        db: Option<DbGrant>,
    ) -> Self {
        CallState {
            plugin,
            wasi,
            table: ResourceTable::new(),
            memory: MemoryLimit {
                limit: memory_bytes,
                exceeded: None,
            },
            db,
            db_conn: None,
            deadline: Instant::now() + crate::capabilities::Limits::default().timeout,
            fs_budget: FsBudget::new(FsLimits::DEFAULT),
            db_deadline_hit: false,
            log_lines: 0,
            http_ctx: WasiHttpCtx::new(),
            http_policy: HttpPolicy::deny_all(),
        }
    }

    /// Lets the call send HTTP requests as `policy` allows.
    pub(crate) fn allow_http(&mut self, policy: HttpPolicy) {
        self.http_policy = policy;
    }

    /// Sets when the call must end; database statements are interrupted at that moment.
    pub(crate) fn set_deadline(&mut self, timeout: Duration) {
        self.deadline = Instant::now() + timeout;
    }

    /// Sets what the call may add to its read-write folders and hold open.
    pub(crate) fn set_fs_limits(&mut self, limits: FsLimits) {
        self.fs_budget = FsBudget::new(limits);
    }

    /// Whether a database statement ran into the call's deadline: the call timed out, even
    /// if the guest carried on after the error it got.
    pub(crate) fn db_deadline_hit(&self) -> bool {
        self.db_deadline_hit
    }

    /// The filesystem limit the call went over, if any.
    pub(crate) fn fs_limit_exceeded(&self) -> Option<FsLimitExceeded> {
        self.fs_budget.exceeded()
    }

    fn connection(&mut self, sql: &str) -> Result<&GuardedDb, workflow_db::DbError> {
        let Some(grant) = &self.db else {
            return Err(workflow_db::DbError::NotGranted);
        };
        sql::refuse_unseen(sql).map_err(workflow_db::DbError::Sql)?;
        if self.db_conn.is_none() {
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
            // What the database may grow by comes out of the call's write budget.
            let growth = self.fs_budget.write_bytes_left();
            let conn = sql::open_with_growth(&grant.path, access, left, growth)
                .map_err(|e| workflow_db::DbError::Sql(format!("opening the workflow db: {e}")))?;
            self.db_conn = Some(conn);
        }
        Ok(self.db_conn.as_ref().expect("connection opened above"))
    }
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl GuardedFsView for CallState {
    fn fs_budget(&self) -> &Arc<FsBudget> {
        &self.fs_budget
    }
}

impl WasiHttpView for CallState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http_ctx,
            table: &mut self.table,
            hooks: &mut self.http_policy,
        }
    }
}

/// Memory limit of one instance. Exceeding it traps the call with
/// [`MemoryLimitExceeded`], which the host reports as such rather than as a crash.
pub(crate) struct MemoryLimit {
    limit: usize,
    pub(crate) exceeded: Option<usize>,
}

/// The trap raised when a guest asks for more memory than its limit.
#[derive(Debug, thiserror::Error)]
#[error("memory limit of {limit} bytes exceeded (asked for {desired} bytes)")]
pub(crate) struct MemoryLimitExceeded {
    pub(crate) limit: usize,
    pub(crate) desired: usize,
}

impl ResourceLimiter for MemoryLimit {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.exceeded = Some(desired);
            return Err(MemoryLimitExceeded {
                limit: self.limit,
                desired,
            }
            .into());
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

impl types::Host for CallState {}

impl host::Host for CallState {
    fn log(&mut self, level: host::LogLevel, message: String) {
        self.log_lines += 1;
        if self.log_lines > LOG_LINES_PER_CALL {
            return;
        }
        let message = truncate(&message, LOG_LINE_BYTES);
        let plugin = &*self.plugin;
        match level {
            host::LogLevel::Trace => tracing::trace!(plugin, "{message}"),
            host::LogLevel::Debug => tracing::debug!(plugin, "{message}"),
            host::LogLevel::Info => tracing::info!(plugin, "{message}"),
            host::LogLevel::Warn => tracing::warn!(plugin, "{message}"),
            host::LogLevel::Error => tracing::error!(plugin, "{message}"),
        }
    }
}

impl workflow_db::Host for CallState {
    fn query(
        &mut self,
        sql: String,
        params: Vec<workflow_db::SqlValue>,
    ) -> Result<String, workflow_db::DbError> {
        let result = self.run_query(&sql, &params);
        self.note_deadline(&result);
        result
    }

    fn execute(
        &mut self,
        sql: String,
        params: Vec<workflow_db::SqlValue>,
    ) -> Result<u64, workflow_db::DbError> {
        use workflow_db::DbError;
        if self.db.as_ref().is_some_and(|db| !db.writable) {
            return Err(DbError::ReadOnly(
                "this turn has read-only access to the workflow db".into(),
            ));
        }
        let result = self.run_execute(&sql, &params);
        self.note_deadline(&result);
        result
    }
}

impl CallState {
    fn note_deadline<T>(&mut self, result: &Result<T, workflow_db::DbError>) {
        if let Err(workflow_db::DbError::Sql(message)) = result
            && message.starts_with(sql::DEADLINE_MESSAGE)
        {
            self.db_deadline_hit = true;
        }
    }

    fn run_query(
        &mut self,
        sql: &str,
        params: &[workflow_db::SqlValue],
    ) -> Result<String, workflow_db::DbError> {
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
            if out.len() == DB_MAX_ROWS {
                return Err(DbError::TooLarge(format!("more than {DB_MAX_ROWS} rows")));
            }
            let mut object = serde_json::Map::new();
            for (i, name) in names.iter().enumerate() {
                let value = crate::store::sql_to_json(row.get_ref(i).map_err(failed)?);
                bytes += name.len() + value.to_string().len();
                // Checked per value: one row of many 16 MiB columns is a gigabyte.
                if bytes > DB_MAX_BYTES {
                    return Err(DbError::TooLarge(format!(
                        "result over {DB_MAX_BYTES} bytes"
                    )));
                }
                object.insert(name.clone(), value);
            }
            out.push(serde_json::Value::Object(object));
        }
        Ok(serde_json::Value::Array(out).to_string())
    }

    fn run_execute(
        &mut self,
        sql: &str,
        params: &[workflow_db::SqlValue],
    ) -> Result<u64, workflow_db::DbError> {
        let db = self.connection(sql)?;
        let changed = db
            .conn()
            .execute(sql, rusqlite::params_from_iter(params.iter().map(to_sql)));
        match changed {
            Ok(changed) => Ok(changed as u64),
            Err(e) => {
                let message = db.describe(&e);
                if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
                    // `max_page_count` of the connection: the call's write budget.
                    self.fs_budget.note_write_limit();
                }
                Err(workflow_db::DbError::Sql(message))
            }
        }
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

/// Cuts `text` to at most `max` bytes on a character boundary.
pub(crate) fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
