//! The workflow database as guests and plans reach it.
//!
//! Every connection the host opens on behalf of a guest (`workflow-db`, a script's
//! `trellis_db`) or a plan (foreach `source_sql`, the gate's db rules) comes from [`open`], so
//! every one carries the same fences:
//!
//! - an authorizer that denies `ATTACH`, `DETACH`, `load_extension`, `fts3_tokenizer` (which
//!   hands out and takes raw pointers) and every pragma outside a short read-only list (a
//!   pragma could move temp files or change the journal), with
//!   `SQLITE_LIMIT_ATTACHED = 0` behind it so that no statement, `VACUUM INTO` included, can
//!   open a second file; `VACUUM` is refused before it is prepared;
//! - a progress handler that interrupts a statement once the deadline has passed, so a runaway
//!   query ends with its call instead of holding the thread;
//! - SQLite's defensive mode (no writes to the shadow tables of full-text and r-tree indexes,
//!   whose blobs SQLite parses, nor to the schema);
//! - bounded value and statement sizes, an in-memory temp store, and a process-wide heap ceiling
//!   for SQLite as a whole;
//! - a ceiling on how far a read-write connection may grow the file (`max_page_count`): bytes
//!   a guest puts in the database reach the disk as surely as bytes it writes to a folder;
//! - no file SQLite opens for the database (the database, `-journal`, `-wal`, `-shm`) may be
//!   a link: symbolic links are refused by `SQLITE_OPEN_NOFOLLOW` and SQLite's `O_NOFOLLOW`,
//!   hard links and special files by the checked open of [`one_link`], whose refusal
//!   [`describe`] turns into a message naming the file.
//!
//! The read-only open flag and the statement read-only check of the callers stay as a second
//! layer.

mod linear;
mod one_link;

use std::path::Path;
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::limits::Limit;
use rusqlite::{Connection, ErrorCode, OpenFlags};

/// How long one foreach `source_sql` or gate db rule may run.
pub const PLAN_SQL_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest string or blob a statement may build, in bytes.
const MAX_VALUE_BYTES: i32 = 16 << 20;
/// Longest `LIKE` or `GLOB` pattern: matching costs up to the pattern's length per character
/// of the value, inside one step the deadline cannot interrupt.
const MAX_LIKE_PATTERN_BYTES: i32 = 100;
/// Largest SQL text, in bytes.
const MAX_SQL_BYTES: i32 = 1 << 20;
/// Ceiling on the memory SQLite may hold across the whole process.
const HEAP_CEILING_BYTES: i64 = 1 << 30;
/// Virtual-machine steps between two deadline checks.
const PROGRESS_STEPS: i32 = 1_000;

/// Pragmas a statement may use: the ones that describe tables, and settings of this
/// connection or of the database's own header that touch no other file.
const ALLOWED_PRAGMAS: &[&str] = &[
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "foreign_keys",
    "defer_foreign_keys",
    "recursive_triggers",
    "user_version",
    "application_id",
    // Read-only; FTS5 runs it on every write to a full-text table.
    "data_version",
    // Read-only checks of the database's own file (the `integrity_check` action of
    // `query_workflow_db`); the call's deadline bounds them like any statement.
    "integrity_check",
    "quick_check",
];

/// Whether the connection may modify the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlAccess {
    /// Opened `SQLITE_OPEN_READ_ONLY` with `query_only` on.
    ReadOnly,
    /// Opened read-write, created when missing.
    ReadWrite,
}

/// A fenced connection and the deadline its statements run under.
#[derive(Debug)]
pub struct GuardedDb {
    /// Closed in `drop`, before the allocator is asked to give back what it freed.
    conn: std::mem::ManuallyDrop<Connection>,
    deadline: Arc<Mutex<Instant>>,
    timeout: Duration,
}

impl Drop for GuardedDb {
    fn drop(&mut self) {
        // SAFETY: the connection is dropped once, here, and not used after.
        unsafe {
            std::mem::ManuallyDrop::drop(&mut self.conn);
        }
        // What a statement took from the C heap (up to the ceiling) is freed with it, but the
        // allocator keeps the pages of each thread's arena: a server whose read slots each ran
        // a large query held 1.6 GB once idle. They go back to the system when the
        // connection ends.
        crate::heap::give_back();
    }
}

/// What the message of an interrupted statement says, so callers can tell it from other errors.
pub const DEADLINE_MESSAGE: &str = "the statement ran past its deadline and was stopped";

/// What the message of a statement stopped for what it wrote begins with.
pub const WRITES_MESSAGE: &str = "the statement was stopped";

/// Runs `f` (statements of connections of this module), counting what SQLite writes to the
/// database's files meanwhile, and stopping a statement past `allowance` bytes: `f`'s
/// result and the bytes written.
pub fn counting_writes<T>(allowance: u64, f: impl FnOnce() -> T) -> (T, u64) {
    one_link::counting_writes(allowance, f)
}

impl GuardedDb {
    /// The connection.
    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// Moves the deadline to `timeout` from now (for a connection that serves several
    /// statements, each with a budget of its own).
    pub fn restart_deadline(&self) {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now() + self.timeout;
    }

    /// Turns an error of this connection into a message, naming the deadline when it fired.
    pub fn describe(&self, err: &rusqlite::Error) -> String {
        describe(err, self.timeout)
    }
}

/// The message of `err`; an interruption by the deadline says so, with the time allowed, and
/// a file SQLite was refused (a hard link at the `-journal`, say) is named with the reason.
pub fn describe(err: &rusqlite::Error, timeout: Duration) -> String {
    if let Some(refused) = one_link::take_refusal() {
        return refused;
    }
    if let Some(allowance) = one_link::take_write_stop()
        && err.sqlite_error_code() == Some(ErrorCode::OperationInterrupted)
    {
        return format!(
            "{WRITES_MESSAGE}: it wrote more than the {allowance} bytes left of the write \
             budget to the database's files (a page it changes is written to the journal \
             and to the database); change fewer rows at once"
        );
    }
    match err.sqlite_error_code() {
        Some(ErrorCode::OperationInterrupted) => {
            format!(
                "{DEADLINE_MESSAGE} ({})",
                humantime::format_duration(timeout)
            )
        }
        _ => err.to_string(),
    }
}

/// How much a read-write connection of [`open`] may grow the database: the default write budget
/// of a call.
pub const DEFAULT_MAX_GROWTH_BYTES: u64 = crate::capabilities::FsLimits::DEFAULT.write_bytes;

/// Opens the database at `path` with the fences of this module; statements must finish within
/// `timeout` of now (see [`GuardedDb::restart_deadline`]). A read-write connection may grow the
/// file by [`DEFAULT_MAX_GROWTH_BYTES`].
pub fn open(path: &Path, access: SqlAccess, timeout: Duration) -> rusqlite::Result<GuardedDb> {
    open_with_growth(path, access, timeout, DEFAULT_MAX_GROWTH_BYTES)
}

/// [`open`], with a read-write connection allowed to grow the file by `max_growth` bytes (give
/// or take a page); past it a statement fails with `SQLITE_FULL`.
pub fn open_with_growth(
    path: &Path,
    access: SqlAccess,
    timeout: Duration,
    max_growth: u64,
) -> rusqlite::Result<GuardedDb> {
    static HEAP_CEILING: Once = Once::new();
    HEAP_CEILING.call_once(|| {
        // SAFETY: a plain setter of a process-wide SQLite setting; any thread may call it.
        unsafe {
            rusqlite::ffi::sqlite3_hard_heap_limit64(HEAP_CEILING_BYTES);
        }
    });
    one_link::forget_refusal();
    one_link::install().map_err(|message| {
        rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
            Some(message),
        )
    })?;
    open_fenced(path, access, timeout, max_growth).map_err(|err| {
        // A file refused by the checked open (the database, or a hot journal or WAL file it
        // looked at) is named, instead of SQLite's "unable to open database file".
        match (one_link::take_refusal(), err) {
            (Some(refused), rusqlite::Error::SqliteFailure(code, _)) => {
                rusqlite::Error::SqliteFailure(code, Some(refused))
            }
            (Some(refused), _) => rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                Some(refused),
            ),
            (None, err) => err,
        }
    })
}

/// The longest a statement waits for a database another connection holds locked.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

fn open_fenced(
    path: &Path,
    access: SqlAccess,
    timeout: Duration,
    max_growth: u64,
) -> rusqlite::Result<GuardedDb> {
    let flags = match access {
        SqlAccess::ReadOnly => OpenFlags::SQLITE_OPEN_READ_ONLY,
        SqlAccess::ReadWrite => OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
    } | OpenFlags::SQLITE_OPEN_NO_MUTEX
        // A symbolic link at the database's path (a dangling one a guest planted, say) is
        // refused rather than followed out of the workspace; a hard link at it or at a file
        // beside it, by the checked open of `one_link`.
        | OpenFlags::SQLITE_OPEN_NOFOLLOW;
    if access == SqlAccess::ReadWrite
        && let Some(message) = sparse(path)
    {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
            Some(message),
        ));
    }
    let mut conn = Connection::open_with_flags(path, flags)?;
    // A database another process holds locked is waited for, but never past the call's
    // deadline (SQLite's own wait does not look at the progress handler's).
    conn.busy_timeout(timeout.min(BUSY_TIMEOUT))?;
    conn.set_limit(Limit::SQLITE_LIMIT_ATTACHED, 0)?;
    conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)?;
    conn.set_limit(Limit::SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_BYTES)?;
    conn.set_limit(
        Limit::SQLITE_LIMIT_LIKE_PATTERN_LENGTH,
        MAX_LIKE_PATTERN_BYTES,
    )?;
    // One call of a built-in is one step for the progress handler: none may be quadratic.
    linear::register(&conn)?;
    conn.execute_batch("PRAGMA temp_store = MEMORY; PRAGMA trusted_schema = OFF;")?;
    // SQLite's hardening for untrusted SQL: no writes to the shadow tables of full-text or
    // r-tree indexes (crafted index blobs), to the schema or to `sqlite_dbpage`.
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
    if access == SqlAccess::ReadOnly {
        conn.execute_batch("PRAGMA query_only = ON;")?;
    } else {
        // Set before the authorizer, which refuses this pragma to the guest.
        let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
        let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
        let growth = i64::try_from(max_growth / page_size.max(1) as u64).unwrap_or(i64::MAX);
        let most = pages.saturating_add(growth).max(1);
        conn.query_row(&format!("PRAGMA max_page_count = {most}"), [], |_| Ok(()))?;
    }
    conn.authorizer(Some(authorize))?;
    let deadline = Arc::new(Mutex::new(Instant::now() + timeout));
    let watched = deadline.clone();
    conn.progress_handler(
        PROGRESS_STEPS,
        Some(move || {
            one_link::over_allowance()
                || Instant::now() >= *watched.lock().unwrap_or_else(|e| e.into_inner())
        }),
    )?;
    Ok(GuardedDb {
        conn: std::mem::ManuallyDrop::new(conn),
        deadline,
        timeout,
    })
}

/// Bytes of holes a database file written through [`open`] may have: SQLite leaves none.
const MAX_HOLE_BYTES: u64 = 1 << 20;

/// Why the database file at `path` is not written: it has holes, which SQLite fills with
/// pages without growing the file, so `max_page_count` would not bound what it takes on
/// disk (a file of 1 TiB with 8 KiB on disk grew to 1.15 GB under a budget of 16 MiB). A file
/// that is not there yet, or one the file system cannot say holes of, has none.
fn sparse(path: &Path) -> Option<String> {
    use rustix::fs::SeekFrom;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    let len = meta.len();
    let (mut at, mut holes, mut seen) = (0u64, 0u64, 0u32);
    while at < len && holes <= MAX_HOLE_BYTES {
        // A file with more pieces than this is no database SQLite wrote.
        seen += 1;
        if seen > 100_000 {
            holes = u64::MAX;
            break;
        }
        let Ok(hole) = rustix::fs::seek(&file, SeekFrom::Hole(at)) else {
            return None;
        };
        if hole >= len {
            break;
        }
        let end = match rustix::fs::seek(&file, SeekFrom::Data(hole)) {
            Ok(data) => data.min(len),
            Err(rustix::io::Errno::NXIO) => len,
            Err(_) => return None,
        };
        holes = holes.saturating_add(end - hole);
        at = end;
    }
    (holes > MAX_HOLE_BYTES).then(|| {
        let shown = match (path.parent().and_then(Path::file_name), path.file_name()) {
            (Some(dir), Some(name)) => Path::new(dir).join(name).display().to_string(),
            _ => path.display().to_string(),
        };
        format!(
            "{shown} is a sparse file ({len} bytes, with holes SQLite would fill without \
             growing it, past what the write budgets can count), so Trellis will not write \
             it: make it whole again (`sqlite3 {shown} VACUUM`, or copy it without \
             --sparse)"
        )
    })
}

/// Why SQLite was refused a file on this thread since the last open or [`describe`] (a hard
/// link at the database or a file beside it), naming the file: for callers that tell some
/// errors of a statement apart before describing them.
pub fn take_refusal() -> Option<String> {
    one_link::take_refusal()
}

/// Refuses statements the authorizer never sees: `VACUUM` (whose `INTO` form writes a new
/// file). Returns the message to give the caller.
pub fn refuse_unseen(sql: &str) -> Result<(), String> {
    let first = first_keyword(sql);
    if first.eq_ignore_ascii_case("vacuum") {
        return Err("VACUUM is not allowed on the workflow database".into());
    }
    Ok(())
}

/// Whether `sql` starts with a statement that opens or ends a transaction (`BEGIN`,
/// `COMMIT`, `END`, `ROLLBACK`, `SAVEPOINT`, `RELEASE`).
pub fn controls_transaction(sql: &str) -> bool {
    let first = first_keyword(sql);
    ["begin", "commit", "end", "rollback", "savepoint", "release"]
        .iter()
        .any(|k| first.eq_ignore_ascii_case(k))
}

/// The first word of `sql`, past whitespace and comments.
fn first_keyword(sql: &str) -> &str {
    let mut rest = sql;
    loop {
        rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
        if let Some(after) = rest.strip_prefix("--") {
            rest = after.split_once('\n').map_or("", |(_, r)| r);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.split_once("*/").map_or("", |(_, r)| r);
        } else {
            break;
        }
    }
    let end = rest
        .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .unwrap_or(rest.len());
    &rest[..end]
}

fn authorize(ctx: AuthContext<'_>) -> Authorization {
    match ctx.action {
        AuthAction::Attach { .. } | AuthAction::Detach { .. } => Authorization::Deny,
        AuthAction::Pragma { pragma_name, .. } => {
            if ALLOWED_PRAGMAS
                .iter()
                .any(|p| p.eq_ignore_ascii_case(pragma_name))
            {
                Authorization::Allow
            } else {
                Authorization::Deny
            }
        }
        // `fts3_tokenizer` reads and, with bound arguments, sets a tokenizer module's address:
        // a host pointer out, and a guest-chosen pointer SQLite later calls through.
        AuthAction::Function { function_name }
            if function_name.eq_ignore_ascii_case("load_extension")
                || function_name.eq_ignore_ascii_case("fts3_tokenizer") =>
        {
            Authorization::Deny
        }
        _ => Authorization::Allow,
    }
}

/// One SQLite value as JSON, the same way everywhere rows leave the database
/// (foreach rows, db rules of the gate, the `workflow-db` interface): a blob is
/// described, not dumped, and a non-finite real becomes `null`.
pub fn sql_to_json(value: rusqlite::types::ValueRef<'_>) -> serde_json::Value {
    use rusqlite::types::ValueRef;
    use serde_json::Value;
    match value {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::from(i),
        ValueRef::Real(f) => serde_json::Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or(Value::Null),
        ValueRef::Text(t) => Value::String(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::String(format!("<blob of {} bytes>", b.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("db.sqlite");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
            .unwrap();
        path
    }

    #[test]
    fn attach_is_refused_and_creates_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = db(dir.path());
        let evil = dir.path().join("evil.db");
        for access in [SqlAccess::ReadOnly, SqlAccess::ReadWrite] {
            let db = open(&path, access, Duration::from_secs(5)).unwrap();
            let sql = format!("ATTACH DATABASE '{}' AS e", evil.display());
            let err = db.conn().execute_batch(&sql).unwrap_err();
            assert!(err.to_string().contains("not authorized"), "{err}");
            assert!(!evil.exists());
        }
    }

    #[test]
    fn vacuum_into_cannot_write_a_file_even_past_the_text_check() {
        let dir = tempfile::tempdir().unwrap();
        let path = db(dir.path());
        let out = dir.path().join("copy.db");
        let sql = format!("VACUUM INTO '{}'", out.display());
        assert_eq!(
            refuse_unseen(&format!("  /* c */ -- x\n {sql}")).unwrap_err(),
            "VACUUM is not allowed on the workflow database"
        );
        let db = open(&path, SqlAccess::ReadWrite, Duration::from_secs(5)).unwrap();
        assert!(db.conn().execute_batch(&sql).is_err());
        assert!(!out.exists());
    }

    #[test]
    fn only_schema_pragmas_and_no_extensions() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(
            &db(dir.path()),
            SqlAccess::ReadWrite,
            Duration::from_secs(5),
        )
        .unwrap();
        let conn = db.conn();
        let n: i64 = conn
            .query_row("SELECT count(*) FROM pragma_table_info('t')", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(n, 1);
        conn.execute_batch("PRAGMA table_info(t)").unwrap();
        // The authorizer's own denials, told apart from SQLite's refusal of a disabled
        // feature (which says just "not authorized"): a pragma by its SQLITE_AUTH code, a
        // function by the message naming it.
        for sql in [
            "PRAGMA temp_store_directory = '/tmp'",
            "PRAGMA journal_mode = OFF",
            "PRAGMA query_only = OFF",
        ] {
            let err = conn.execute_batch(sql).unwrap_err();
            assert_eq!(
                err.sqlite_error_code(),
                Some(ErrorCode::AuthorizationForStatementDenied),
                "{sql}: {err}"
            );
        }
        let err = conn
            .execute_batch("SELECT load_extension('/tmp/x.so')")
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("not authorized to use function: load_extension"),
            "{err}"
        );
    }

    #[test]
    fn the_authorizer_denies_each_action_it_names_and_allows_the_rest() {
        let judged = |action| {
            authorize(AuthContext {
                action,
                database_name: None,
                accessor: None,
            })
        };
        for denied in [
            AuthAction::Attach { filename: "x.db" },
            AuthAction::Detach {
                database_name: "aux",
            },
            AuthAction::Function {
                function_name: "load_extension",
            },
            AuthAction::Function {
                function_name: "LOAD_EXTENSION",
            },
            AuthAction::Function {
                function_name: "fts3_tokenizer",
            },
            AuthAction::Pragma {
                pragma_name: "journal_mode",
                pragma_value: Some("OFF"),
            },
            AuthAction::Pragma {
                pragma_name: "writable_schema",
                pragma_value: Some("1"),
            },
        ] {
            assert_eq!(judged(denied), Authorization::Deny, "{denied:?}");
        }
        for allowed in [
            AuthAction::Function {
                function_name: "upper",
            },
            AuthAction::Pragma {
                pragma_name: "table_info",
                pragma_value: Some("t"),
            },
            AuthAction::Pragma {
                pragma_name: "FOREIGN_KEYS",
                pragma_value: None,
            },
        ] {
            assert_eq!(judged(allowed), Authorization::Allow, "{allowed:?}");
        }
    }

    #[test]
    fn a_runaway_query_is_stopped_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(
            &db(dir.path()),
            SqlAccess::ReadOnly,
            Duration::from_millis(200),
        )
        .unwrap();
        let err = db
            .conn()
            .query_row(
                "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) \
                 SELECT count(*) FROM c",
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap_err();
        assert_eq!(
            db.describe(&err),
            format!("{DEADLINE_MESSAGE} (200ms)"),
            "{err}"
        );
        // A fresh budget lets the next statement run.
        db.restart_deadline();
        let one: i64 = db.conn().query_row("SELECT 1", [], |r| r.get(0)).unwrap();
        assert_eq!(one, 1);
    }

    #[test]
    fn values_cannot_grow_past_the_length_limit() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(
            &db(dir.path()),
            SqlAccess::ReadOnly,
            Duration::from_secs(30),
        )
        .unwrap();
        let err = db
            .conn()
            .query_row("SELECT length(zeroblob(100000000))", [], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap_err();
        assert!(err.to_string().contains("too big"), "{err}");
    }

    /// One call of a built-in function is one step of SQLite's virtual machine: the progress
    /// handler never runs inside it. SQLite's `instr`, `replace` and `trim` are quadratic in
    /// their arguments (these calls took seconds each unfenced; at 16 MiB, hours), and `LIKE`
    /// backtracks over its pattern. On a fenced connection the three are linear (so each
    /// call below answers at once, with SQLite's answer), and a long `LIKE` pattern is
    /// refused. A regression here shows as a test that does not end.
    #[test]
    fn no_single_builtin_call_outlives_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let path = db(dir.path());
        let db = open(&path, SqlAccess::ReadOnly, Duration::from_secs(30)).unwrap();
        for (sql, expected) in [
            (
                "SELECT instr(printf('%.*c', 16777000, 'a'), printf('%.*c', 1048576, 'a') || 'b')",
                0,
            ),
            (
                "SELECT length(trim(printf('%.*c', 16777000, 'a'), printf('%.*c', 1048576, 'b') || 'a'))",
                0,
            ),
            (
                "SELECT length(replace(printf('%.*c', 16777000, 'a'), printf('%.*c', 1048576, 'a') || 'b', 'x'))",
                16777000,
            ),
        ] {
            db.restart_deadline();
            let got: i64 = db
                .conn()
                .query_row(sql, [], |r| r.get(0))
                .unwrap_or_else(|e| panic!("{sql}: {}", db.describe(&e)));
            assert_eq!(got, expected, "{sql}");
        }
        let err = db
            .conn()
            .query_row(
                "SELECT printf('%.*c', 1048576, 'a') LIKE '%' || printf('%.*c', 4096, 'a') || 'b'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap_err();
        assert_eq!(err.to_string(), "LIKE or GLOB pattern too complex");
    }

    /// The shadow tables of FTS3/FTS5 hold the index as blobs that SQLite parses on every
    /// match; writing crafted ones by hand is the classic path from SQL to memory corruption
    /// (CVE-2018-20346). Defensive mode makes them read-only to SQL.
    #[test]
    fn shadow_tables_of_full_text_indexes_cannot_be_written() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(
            &db(dir.path()),
            SqlAccess::ReadWrite,
            Duration::from_secs(5),
        )
        .unwrap();
        db.conn()
            .execute_batch("CREATE VIRTUAL TABLE f USING fts3(x); INSERT INTO f VALUES ('a b');")
            .unwrap();
        let err = db
            .conn()
            .execute("INSERT INTO f_segdir VALUES (0, 1, 0, 0, '0 0', x'00')", [])
            .unwrap_err();
        assert_eq!(err.to_string(), "table f_segdir may not be modified");
    }

    /// FTS5 reads `PRAGMA data_version` on every write to a full-text table: the fence lets
    /// that read-only pragma through, so full-text tables work on a fenced connection.
    #[test]
    fn fts5_tables_can_be_written_and_searched() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(
            &db(dir.path()),
            SqlAccess::ReadWrite,
            Duration::from_secs(5),
        )
        .unwrap();
        db.conn()
            .execute_batch("CREATE VIRTUAL TABLE f USING fts5(x); INSERT INTO f VALUES ('a b');")
            .unwrap();
        let n: i64 = db
            .conn()
            .query_row("SELECT count(*) FROM f WHERE f MATCH 'b'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
    }

    #[test]
    fn first_keyword_skips_comments() {
        assert_eq!(first_keyword("-- a\n/* b */ vacuum"), "vacuum");
        assert_eq!(first_keyword(";; SELECT 1"), "SELECT");
        assert_eq!(first_keyword(""), "");
    }

    /// A database file with holes (a 64 MiB file of one page on disk, as `truncate` or a
    /// sparse copy makes): SQLite fills them without growing the file, past every write
    /// budget (round 26), so it is not opened to write; it is read, and a whole file is
    /// written.
    #[test]
    fn a_sparse_database_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = db(dir.path());
        let whole = open(&path, SqlAccess::ReadWrite, Duration::from_secs(5)).unwrap();
        whole
            .conn()
            .execute("INSERT INTO t VALUES (1)", [])
            .unwrap();
        drop(whole);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        let Err(err) = open(&path, SqlAccess::ReadWrite, Duration::from_secs(5)) else {
            panic!("a sparse database was opened to write");
        };
        let err = err.to_string();
        assert!(err.contains("db.sqlite is a sparse file"), "{err}");
        open(&path, SqlAccess::ReadOnly, Duration::from_secs(5)).unwrap();
    }
}
