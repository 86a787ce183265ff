//! The SQL pre-check (`sql::refuse_unseen`), which refuses `VACUUM` because SQLite's
//! authorizer never sees it, against SQLite itself: the text is prepared by SQLite (past any
//! empty statements, as a batch runs them) and the first statement's program is read in
//! EXPLAIN mode. A statement SQLite compiles to a `Vacuum` instruction must be refused; one
//! it compiles to anything else must not be. Text SQLite does not compile may go either way
//! (it never runs).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rusqlite::ffi;
use trellis_sandbox::capabilities::sql;

/// Whether the first statement SQLite compiles from `sql` is a VACUUM; `None` when it
/// compiles none.
fn sqlite_sees_vacuum(conn: &rusqlite::Connection, sql: &str) -> Option<bool> {
    let bytes = sql.as_bytes();
    let mut offset = 0;
    // SAFETY: `handle` is the live connection's; every statement prepared is finalized
    // before the next is prepared, and pointers stay within `bytes`.
    unsafe {
        let db = conn.handle();
        while offset < bytes.len() {
            let start = bytes.as_ptr().add(offset).cast::<std::ffi::c_char>();
            let mut stmt = std::ptr::null_mut();
            let mut tail = std::ptr::null();
            let len = i32::try_from(bytes.len() - offset).ok()?;
            if ffi::sqlite3_prepare_v2(db, start, len, &mut stmt, &mut tail) != ffi::SQLITE_OK {
                ffi::sqlite3_finalize(stmt);
                return None;
            }
            let used = usize::try_from(tail.offset_from(start)).ok()?;
            if stmt.is_null() {
                if used == 0 {
                    return None;
                }
                offset += used;
                continue;
            }
            // `EXPLAIN VACUUM` lists a VACUUM's program without running it.
            if ffi::sqlite3_stmt_isexplain(stmt) != 0 {
                ffi::sqlite3_finalize(stmt);
                return Some(false);
            }
            let mut vacuum = false;
            if ffi::sqlite3_stmt_explain(stmt, 1) == ffi::SQLITE_OK {
                while ffi::sqlite3_step(stmt) == ffi::SQLITE_ROW {
                    let opcode = ffi::sqlite3_column_text(stmt, 1);
                    if !opcode.is_null()
                        && std::ffi::CStr::from_ptr(opcode.cast()).to_bytes() == b"Vacuum"
                    {
                        vacuum = true;
                    }
                }
            }
            ffi::sqlite3_finalize(stmt);
            return Some(vacuum);
        }
    }
    None
}

thread_local! {
    static CONN: rusqlite::Connection = {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t(x); ATTACH ':memory:' AS other;").unwrap();
        conn
    };
}

fuzz_target!(|text: &str| {
    let refused = sql::refuse_unseen(text).is_err();
    CONN.with(|conn| match sqlite_sees_vacuum(conn, text) {
        Some(true) => assert!(
            refused,
            "SQLite compiles a VACUUM from {text:?}, not refused"
        ),
        Some(false) => assert!(
            !refused,
            "refused {text:?}, which SQLite compiles to no VACUUM"
        ),
        None => {}
    });
});
