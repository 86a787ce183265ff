//! The per-call store state and the host interfaces every plugin imports.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::capabilities::DbGrant;
use crate::capabilities::fs_guard::{FsBudget, GuardedFsView};
use crate::capabilities::sql::{self, GuardedDb, SqlAccess};
use crate::capabilities::{FsLimitExceeded, FsLimits};
use crate::llm::http::HttpPolicy;
use crate::plugins::bindings::tool::trellis::plugin::{host, types, workflow_db};

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
            memory: MemoryLimit::new(memory_bytes),
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
            // SQLITE_OPEN_NOFOLLOW refuses a link anywhere on the path: the folder is named
            // canonically (the host checked it holds no link), the file itself must not be one.
            let path = match (grant.path.parent(), grant.path.file_name()) {
                (Some(dir), Some(name)) => dir
                    .canonicalize()
                    .map(|d| d.join(name))
                    .unwrap_or_else(|_| grant.path.clone()),
                _ => grant.path.clone(),
            };
            let conn = sql::open(&path, access, left)
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

/// Memory budget of one instance: all its linear memories and tables together (a
/// table element counts as a pointer). Exceeding it traps the call with
/// [`MemoryLimitExceeded`], which the host reports as such rather than as a crash.
pub(crate) struct MemoryLimit {
    limit: usize,
    /// Bytes granted so far to the store's memories and tables.
    used: usize,
    pub(crate) exceeded: Option<usize>,
}

impl MemoryLimit {
    pub(crate) fn new(limit: usize) -> Self {
        MemoryLimit {
            limit,
            used: 0,
            exceeded: None,
        }
    }

    /// Grants growing one memory or table from `current` to `desired` bytes if the
    /// instance's total stays within the limit.
    fn grow(&mut self, current: usize, desired: usize) -> wasmtime::Result<bool> {
        let total = self.used.saturating_add(desired.saturating_sub(current));
        if total > self.limit {
            self.exceeded = Some(total);
            return Err(MemoryLimitExceeded {
                limit: self.limit,
                desired: total,
            }
            .into());
        }
        self.used = total;
        Ok(true)
    }
}

/// The trap raised when a guest asks for more memory than its limit.
#[derive(Debug, thiserror::Error)]
#[error(
    "memory limit of {limit} bytes exceeded (its memories and tables together asked for {desired} bytes)"
)]
pub(crate) struct MemoryLimitExceeded {
    pub(crate) limit: usize,
    pub(crate) desired: usize,
}

/// Elements one table may hold, whatever the memory budget.
const MAX_TABLE_ELEMENTS: usize = 100_000;

impl ResourceLimiter for MemoryLimit {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.grow(current, desired)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            return Ok(false);
        }
        let pointer = std::mem::size_of::<usize>();
        self.grow(current * pointer, desired * pointer)
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
                object.insert(name.clone(), value);
            }
            if bytes > DB_MAX_BYTES {
                return Err(DbError::TooLarge(format!(
                    "result over {DB_MAX_BYTES} bytes"
                )));
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
            .execute(sql, rusqlite::params_from_iter(params.iter().map(to_sql)))
            .map_err(|e| workflow_db::DbError::Sql(db.describe(&e)))?;
        Ok(changed as u64)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_covers_every_memory_and_table_of_an_instance() {
        let mut limit = MemoryLimit::new(100 << 20);
        // Eleven memories of 9 MiB each fit; a twelfth does not.
        for _ in 0..11 {
            assert!(limit.memory_growing(0, 9 << 20, None).unwrap());
        }
        let err = limit.memory_growing(0, 9 << 20, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "memory limit of 104857600 bytes exceeded (its memories and tables together asked for 113246208 bytes)"
        );
        assert_eq!(limit.exceeded, Some(108 << 20));
        // Growing counts only the difference, and tables count too.
        let mut limit = MemoryLimit::new(10 << 20);
        assert!(limit.memory_growing(0, 4 << 20, None).unwrap());
        assert!(limit.memory_growing(4 << 20, 8 << 20, None).unwrap());
        assert!(limit.table_growing(0, 1000, None).unwrap());
        assert!(limit.table_growing(1000, 300_000, None).is_ok_and(|ok| !ok));
        assert!(limit.memory_growing(0, 2 << 20, None).is_err());
    }
}
