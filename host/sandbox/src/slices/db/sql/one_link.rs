//! Every file SQLite opens is a regular file with one name, whichever connection opens it.
//!
//! SQLite's unix VFS opens a database, its `-journal` and its `-wal` by path, and the `-shm`
//! of WAL mode from its shared-memory code; every one of those opens (and its own opens of
//! the database's folder, to flush it, and of `/dev/urandom`) goes through the `open` entry
//! of the VFS's system-call table. [`install`] replaces that entry, once for the process and
//! before the first connection, through the VFS's `xSetSystemCall`. The replacement opens as
//! SQLite asked, without waiting (`O_NONBLOCK` until the check is done: a FIFO found at a
//! name is not waited on), and looks at what it got through the descriptor, before SQLite
//! reads, writes, truncates or `fchmod`s a byte of it:
//!
//! - a regular file must have one link: one with other hard links may be a name planted for
//!   a file outside the workspace, which writing the journal or the WAL would change;
//! - a folder or a character device is opened only for reading (the folder flush,
//!   `/dev/urandom`, `/dev/null`);
//! - anything else (a FIFO, a socket, a block device) is refused.
//!
//! A refused file is closed again and the open fails (`EMLINK` or `ENXIO`, which SQLite turns
//! into `SQLITE_CANTOPEN`); why is kept for the thread, and [`take_refusal`] turns it into the
//! message naming the file. The check is of the descriptor SQLite then uses, so nothing put at
//! the name between a check and the open can slip past it. A symbolic link at any of the
//! names is already refused by SQLite itself (`O_NOFOLLOW` on every file it opens).
//!
//! The same table's `write`, `pwrite` and `pwrite64` count what SQLite writes to those files
//! (pages of the database, the journal or the WAL), for the statements run inside
//! [`counting_writes`]: an `UPDATE` that rewrites every page of a planted database leaves
//! the file's size as it was, and is bounded by what it writes, not by what it grows.

use std::cell::{Cell, RefCell};
use std::ffi::{CStr, OsStr, c_char, c_int, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;

use rusqlite::ffi;

thread_local! {
    /// Why the last open on this thread was refused, as the message for the caller.
    static REFUSAL: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// The system call this module replaces.
const OPEN: &CStr = c"open";

/// What the statements on this thread wrote since [`counting_writes`] began, and may write.
#[derive(Debug, Clone, Copy)]
struct Writes {
    written: u64,
    allowance: u64,
}

thread_local! {
    /// Set while [`counting_writes`] runs on this thread.
    static WRITES: Cell<Option<Writes>> = const { Cell::new(None) };
    /// Set when the progress handler stopped a statement for writing past its allowance.
    static WRITE_STOP: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Runs `f` (statements of a connection opened through this module, on this thread),
/// counting the bytes SQLite writes to the database's files meanwhile: `f`'s result and
/// those bytes. A statement that takes them past `allowance` is stopped by its connection's
/// progress handler ([`over_allowance`]); what it wrote until then (at most a page cache
/// more) is counted too.
pub(crate) fn counting_writes<T>(allowance: u64, f: impl FnOnce() -> T) -> (T, u64) {
    let outer = WRITES.replace(Some(Writes {
        written: 0,
        allowance,
    }));
    let out = f();
    let written = WRITES.replace(outer).map_or(0, |w| w.written);
    // A count inside another one counts for both.
    if let Some(mut outer) = outer {
        outer.written = outer.written.saturating_add(written);
        WRITES.set(Some(outer));
    }
    (out, written)
}

/// Whether the statements counted on this thread wrote past their allowance; the first
/// time, the allowance is kept for [`take_write_stop`].
pub(crate) fn over_allowance() -> bool {
    let over = WRITES
        .get()
        .filter(|w| w.written > w.allowance)
        .map(|w| w.allowance);
    if let Some(allowance) = over {
        WRITE_STOP.set(Some(allowance));
    }
    over.is_some()
}

/// The allowance a statement on this thread was stopped for writing past, since the last
/// call.
pub(crate) fn take_write_stop() -> Option<u64> {
    WRITE_STOP.take()
}

fn note_written(n: libc::ssize_t) {
    if n > 0
        && let Some(mut w) = WRITES.get()
    {
        w.written = w.written.saturating_add(n as u64);
        WRITES.set(Some(w));
    }
}

/// `write(2)`, counted.
unsafe extern "C" fn write_counted(
    fd: c_int,
    buf: *const c_void,
    n: libc::size_t,
) -> libc::ssize_t {
    // SAFETY: SQLite's arguments of write(2), passed on as they are.
    let done = unsafe { libc::write(fd, buf, n) };
    note_written(done);
    done
}

/// `pwrite(2)`, counted.
unsafe extern "C" fn pwrite_counted(
    fd: c_int,
    buf: *const c_void,
    n: libc::size_t,
    offset: libc::off_t,
) -> libc::ssize_t {
    // SAFETY: SQLite's arguments of pwrite(2), passed on as they are.
    let done = unsafe { libc::pwrite(fd, buf, n, offset) };
    note_written(done);
    done
}

/// `pwrite64(2)`, counted.
#[cfg(target_os = "linux")]
unsafe extern "C" fn pwrite64_counted(
    fd: c_int,
    buf: *const c_void,
    n: libc::size_t,
    offset: libc::off64_t,
) -> libc::ssize_t {
    // SAFETY: SQLite's arguments of pwrite64(2), passed on as they are.
    let done = unsafe { libc::pwrite64(fd, buf, n, offset) };
    note_written(done);
    done
}

type Write = unsafe extern "C" fn(c_int, *const c_void, libc::size_t) -> libc::ssize_t;
type Pwrite =
    unsafe extern "C" fn(c_int, *const c_void, libc::size_t, libc::off_t) -> libc::ssize_t;
#[cfg(target_os = "linux")]
type Pwrite64 =
    unsafe extern "C" fn(c_int, *const c_void, libc::size_t, libc::off64_t) -> libc::ssize_t;

/// Puts the check in front of every open of SQLite's unix VFS, once. Fails (and every later
/// call with it) when the default VFS does not let its `open` be replaced, so a connection is
/// never opened without the check.
pub(crate) fn install() -> Result<(), String> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            // SAFETY: `sqlite3_vfs_find` initializes SQLite and returns the registered default
            // VFS, which lives as long as the process. The system-call table is written once,
            // here, before any connection of this module opens a file; the unix VFS reads
            // each entry as one pointer-sized load.
            unsafe {
                let vfs = ffi::sqlite3_vfs_find(std::ptr::null());
                if vfs.is_null() {
                    return Err("SQLite has no default VFS".to_string());
                }
                let name = CStr::from_ptr((*vfs).zName).to_string_lossy();
                let (true, Some(set), Some(get)) = (
                    (*vfs).iVersion >= 3 && name.starts_with("unix"),
                    (*vfs).xSetSystemCall,
                    (*vfs).xGetSystemCall,
                ) else {
                    return Err(format!(
                        "SQLite's default VFS ({name}) does not let its open be checked"
                    ));
                };
                let checked =
                    open_checked as unsafe extern "C" fn(*const c_char, c_int, c_int) -> c_int;
                // The table holds every entry as `void (*)(void)`, cast back at each use.
                let entry: ffi::sqlite3_syscall_ptr = Some(std::mem::transmute::<
                    unsafe extern "C" fn(*const c_char, c_int, c_int) -> c_int,
                    unsafe extern "C" fn(),
                >(checked));
                if set(vfs, OPEN.as_ptr(), entry) != ffi::SQLITE_OK
                    || get(vfs, OPEN.as_ptr()).map(|f| f as usize) != Some(checked as usize)
                {
                    return Err(format!(
                        "SQLite's default VFS ({name}) did not take the checked open"
                    ));
                }
                // Every write call the table has is counted; one it has that does not take
                // the counted one fails the install.
                #[allow(unused_mut)]
                let mut writers: Vec<(&CStr, usize)> = vec![
                    (c"write", write_counted as Write as usize),
                    (c"pwrite", pwrite_counted as Pwrite as usize),
                ];
                #[cfg(target_os = "linux")]
                writers.push((c"pwrite64", pwrite64_counted as Pwrite64 as usize));
                for (call, counted) in writers {
                    if get(vfs, call.as_ptr()).is_none() {
                        continue;
                    }
                    // The table holds every entry as `void (*)(void)`, cast back at each use.
                    let entry: ffi::sqlite3_syscall_ptr = Some(std::mem::transmute::<
                        usize,
                        unsafe extern "C" fn(),
                    >(counted));
                    if set(vfs, call.as_ptr(), entry) != ffi::SQLITE_OK
                        || get(vfs, call.as_ptr()).map(|f| f as usize) != Some(counted)
                    {
                        return Err(format!(
                            "SQLite's default VFS ({name}) did not take the counted {}",
                            call.to_string_lossy()
                        ));
                    }
                }
                Ok(())
            }
        })
        .clone()
}

/// Forgets a refusal of an earlier open on this thread.
pub(crate) fn forget_refusal() {
    let _ = REFUSAL.try_with(|r| r.borrow_mut().take());
}

/// Why an open on this thread was refused since the last call (or [`forget_refusal`]): the
/// message naming the file, which explains the error SQLite reported for it.
pub(crate) fn take_refusal() -> Option<String> {
    REFUSAL
        .try_with(|r| r.try_borrow_mut().ok().and_then(|mut r| r.take()))
        .ok()
        .flatten()
}

/// The file as a message names it: its folder and its name (`db/db.sqlite-journal`).
fn shown(path: &Path) -> String {
    match (path.parent().and_then(Path::file_name), path.file_name()) {
        (Some(dir), Some(name)) => Path::new(dir).join(name).display().to_string(),
        _ => path.display().to_string(),
    }
}

/// Why a file of this kind and link count, opened for writing or not, is refused.
fn refusal(path: &Path, mode: libc::mode_t, links: libc::nlink_t, writes: bool) -> Option<String> {
    let file = shown(path);
    match mode & libc::S_IFMT {
        libc::S_IFREG if links > 1 => Some(format!(
            "{file} has other hard links ({links} names for one file, one of them perhaps \
             outside the workspace), so Trellis will not open it: remove the link"
        )),
        libc::S_IFREG => None,
        libc::S_IFDIR | libc::S_IFCHR if !writes => None,
        _ => Some(format!(
            "{file} is not a regular file (a FIFO, socket or device), so Trellis will not \
             open it: remove it"
        )),
    }
}

/// The `open` SQLite's unix VFS calls: `open(2)`, and the check of the module header on the
/// descriptor it returns. A refusal is recorded for the thread and fails the open.
unsafe extern "C" fn open_checked(path: *const c_char, flags: c_int, mode: c_int) -> c_int {
    // SAFETY: SQLite passes a NUL-terminated path and the flags and mode of open(2).
    let fd = unsafe { libc::open(path, flags | libc::O_NONBLOCK, mode as libc::c_uint) };
    if fd < 0 {
        // errno as open(2) left it: SQLite retries on EINTR and tells EISDIR apart.
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        if errno == libc::ELOOP && flags & libc::O_NOFOLLOW != 0 {
            // SAFETY: as below, a NUL-terminated path.
            let name = Path::new(OsStr::from_bytes(
                unsafe { CStr::from_ptr(path) }.to_bytes(),
            ));
            record_refusal(format!(
                "{} is a symbolic link, so Trellis will not open it (nor what it points to): \
                 remove the link",
                shown(name)
            ));
            set_errno(errno);
        }
        return fd;
    }
    let fail = |errno: c_int| {
        // SAFETY: `fd` was opened above and is not handed out.
        unsafe { libc::close(fd) };
        set_errno(errno);
        -1
    };
    // SAFETY: `stat` is plain data that fstat fills in.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat of a descriptor this function owns into a local.
    if unsafe { libc::fstat(fd, &mut stat) } != 0 {
        return fail(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        );
    }
    let writes = flags & libc::O_ACCMODE != libc::O_RDONLY;
    // SAFETY: as above, a NUL-terminated path.
    let name = Path::new(OsStr::from_bytes(
        unsafe { CStr::from_ptr(path) }.to_bytes(),
    ));
    if let Some(message) = refusal(name, stat.st_mode, stat.st_nlink, writes) {
        let errno = if stat.st_mode & libc::S_IFMT == libc::S_IFREG {
            libc::EMLINK
        } else {
            libc::ENXIO
        };
        record_refusal(message);
        return fail(errno);
    }
    if flags & libc::O_NONBLOCK == 0 {
        // SAFETY: fcntl on a descriptor this function owns.
        let status = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if status < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, status & !libc::O_NONBLOCK) } != 0
        {
            return fail(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO),
            );
        }
    }
    fd
}

/// Keeps `message` as why the open on this thread was refused ([`take_refusal`]).
fn record_refusal(message: String) {
    let _ = REFUSAL.try_with(|r| {
        if let Ok(mut r) = r.try_borrow_mut() {
            *r = Some(message);
        }
    });
}

fn set_errno(errno: c_int) {
    // SAFETY: the calling thread's errno, which the C library keeps per thread.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    unsafe {
        *libc::__errno_location() = errno;
    }
    // SAFETY: as above.
    #[cfg(any(target_vendor = "apple", target_os = "freebsd"))]
    unsafe {
        *libc::__error() = errno;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slices::db::sql::{SqlAccess, open};
    use std::os::unix::fs::MetadataExt;
    use std::path::PathBuf;
    use std::time::Duration;

    /// `dir/db/db.sqlite` with a table `t`, in WAL mode when `wal` (its `-wal` and `-shm`
    /// gone again once the connection closes), beside `dir/outside`.
    fn database(dir: &Path, wal: bool) -> PathBuf {
        std::fs::create_dir_all(dir.join("db")).unwrap();
        std::fs::create_dir_all(dir.join("outside")).unwrap();
        let path = dir.join("db/db.sqlite");
        let conn = rusqlite::Connection::open(&path).unwrap();
        if wal {
            let mode: String = conn
                .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
                .unwrap();
            assert_eq!(mode, "wal");
        }
        conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
            .unwrap();
        drop(conn);
        path
    }

    /// Opens `path`, reads `t` and, read-write, adds a row: the first error's message.
    fn attempt(path: &Path, access: SqlAccess) -> Result<(), String> {
        let db = open(path, access, Duration::from_secs(5)).map_err(|e| e.to_string())?;
        db.conn()
            .query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
            .map_err(|e| db.describe(&e))?;
        if access == SqlAccess::ReadWrite {
            db.conn()
                .execute("INSERT INTO t VALUES (2)", [])
                .map_err(|e| db.describe(&e))?;
        }
        Ok(())
    }

    /// A hard link at the database, at its rollback journal (hot, or empty so that only the
    /// first write opens it), at its WAL file (in rollback mode too: SQLite opens a `-wal` it
    /// finds) and at the `-shm` of a WAL database, to a file outside: each connection is
    /// refused naming the file, and the file outside keeps every byte.
    #[test]
    fn a_hard_link_at_any_file_of_the_database_is_refused_and_what_it_names_is_unchanged() {
        let cases: [(&str, bool, Vec<u8>); 6] = [
            ("db.sqlite", false, Vec::new()),
            ("db.sqlite-journal", false, vec![7u8; 8192]),
            ("db.sqlite-journal", false, Vec::new()),
            ("db.sqlite-wal", false, vec![7u8; 8192]),
            ("db.sqlite-wal", true, vec![7u8; 8192]),
            ("db.sqlite-shm", true, vec![9u8; 32768]),
        ];
        for (name, wal, content) in cases {
            for access in [SqlAccess::ReadOnly, SqlAccess::ReadWrite] {
                let case = format!("{name} (wal: {wal}, {} bytes, {access:?})", content.len());
                let dir = tempfile::tempdir().unwrap();
                let path = database(dir.path(), wal);
                let outside = dir.path().join("outside/file");
                let content = if name == "db.sqlite" {
                    std::fs::read(&path).unwrap()
                } else {
                    content.clone()
                };
                std::fs::write(&outside, &content).unwrap();
                let at = dir.path().join("db").join(name);
                let _ = std::fs::remove_file(&at);
                std::fs::hard_link(&outside, &at).unwrap();
                let mode = std::fs::metadata(&outside).unwrap().mode();
                // SQLite takes an empty journal for none: a reader never opens it.
                if content.is_empty() && name != "db.sqlite" && access == SqlAccess::ReadOnly {
                    attempt(&path, access).unwrap();
                    assert_eq!(std::fs::read(&outside).unwrap(), content, "{case}");
                    continue;
                }
                let err = attempt(&path, access).expect_err(&case);
                assert_eq!(
                    err,
                    format!(
                        "db/{name} has other hard links (2 names for one file, one of them \
                         perhaps outside the workspace), so Trellis will not open it: remove \
                         the link"
                    ),
                    "{case}"
                );
                assert_eq!(std::fs::read(&outside).unwrap(), content, "{case}");
                let meta = std::fs::metadata(&outside).unwrap();
                assert_eq!((meta.nlink(), meta.mode()), (2, mode), "{case}");
            }
        }
    }

    /// A symbolic link at the rollback journal, the WAL file or the `-shm`, to a file
    /// outside: SQLite's `O_NOFOLLOW` refuses it, and the error names the file and the link
    /// (it was a bare "unable to open database file", round 26).
    #[test]
    fn a_symbolic_link_at_a_file_beside_the_database_is_refused_naming_it() {
        for (name, wal) in [
            ("db.sqlite-journal", false),
            ("db.sqlite-wal", true),
            ("db.sqlite-shm", true),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let path = database(dir.path(), wal);
            let outside = dir.path().join("outside/file");
            std::fs::write(&outside, vec![7u8; 32768]).unwrap();
            let at = dir.path().join("db").join(name);
            let _ = std::fs::remove_file(&at);
            std::os::unix::fs::symlink(&outside, &at).unwrap();
            let err = attempt(&path, SqlAccess::ReadWrite).expect_err(name);
            assert!(
                err.starts_with(&format!("db/{name} is a symbolic link")),
                "{name}: {err}"
            );
            assert_eq!(std::fs::read(&outside).unwrap(), vec![7u8; 32768], "{name}");
        }
    }

    /// A FIFO at the journal is refused at once: the hot-journal check opens it read-only,
    /// which would wait for a writer forever.
    #[test]
    fn a_fifo_at_the_journal_is_refused_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let path = database(dir.path(), false);
        let fifo =
            std::ffi::CString::new(dir.path().join("db/db.sqlite-journal").to_str().unwrap())
                .unwrap();
        // SAFETY: a plain libc call on a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        for access in [SqlAccess::ReadOnly, SqlAccess::ReadWrite] {
            assert_eq!(
                attempt(&path, access).unwrap_err(),
                "db/db.sqlite-journal is not a regular file (a FIFO, socket or device), so \
                 Trellis will not open it: remove it"
            );
        }
    }

    /// What SQLite opens itself beside the files of a database (the folder, to flush it after
    /// creating a journal; `-wal` and `-shm` of a WAL database it creates) passes the check:
    /// a rollback-mode and a WAL database both read and write.
    #[test]
    fn plain_databases_in_either_journal_mode_work() {
        for wal in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let path = database(dir.path(), wal);
            attempt(&path, SqlAccess::ReadWrite).unwrap();
            attempt(&path, SqlAccess::ReadOnly).unwrap();
            let db = open(&path, SqlAccess::ReadOnly, Duration::from_secs(5)).unwrap();
            let n: i64 = db
                .conn()
                .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
                .unwrap();
            assert_eq!(n, 2, "wal: {wal}");
        }
    }

    #[test]
    fn the_checked_open_is_the_one_sqlite_calls() {
        install().unwrap();
        // SAFETY: as in `install`.
        let current = unsafe {
            let vfs = ffi::sqlite3_vfs_find(std::ptr::null());
            ((*vfs).xGetSystemCall.unwrap())(vfs, OPEN.as_ptr())
        };
        assert_eq!(
            current.map(|f| f as usize),
            Some(
                open_checked as unsafe extern "C" fn(*const c_char, c_int, c_int) -> c_int as usize
            )
        );
    }

    #[test]
    fn kinds_and_links() {
        let p = Path::new("/w/db/db.sqlite-journal");
        assert_eq!(refusal(p, libc::S_IFREG | 0o644, 1, true), None);
        assert_eq!(refusal(p, libc::S_IFREG | 0o644, 0, true), None);
        assert_eq!(
            refusal(p, libc::S_IFREG | 0o644, 2, false).unwrap(),
            "db/db.sqlite-journal has other hard links (2 names for one file, one of them \
             perhaps outside the workspace), so Trellis will not open it: remove the link"
        );
        assert_eq!(refusal(p, libc::S_IFDIR | 0o755, 3, false), None);
        assert!(refusal(p, libc::S_IFDIR | 0o755, 3, true).is_some());
        assert_eq!(refusal(p, libc::S_IFCHR | 0o666, 1, false), None);
        assert_eq!(
            refusal(p, libc::S_IFIFO | 0o644, 1, false).unwrap(),
            "db/db.sqlite-journal is not a regular file (a FIFO, socket or device), so \
             Trellis will not open it: remove it"
        );
    }
}
