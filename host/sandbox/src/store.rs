//! Workspace files: atomic JSON writes and confined reads.
//!
//! Every host read, write, removal and rename under a workspace goes through
//! [`WorkspaceFs`] (a cap-std handle on the workspace opened once; links and special files
//! refused, writes atomic). Paths that come from plans and schemas are checked with
//! [`check_relative`]. Logs rewritten on the agent loop's path go through [`write_behind`],
//! which does the same atomic writes on a writer thread.

use std::io::{self, Read};
use std::path::{Component, Path};

mod host_work;
pub mod private_names;
pub mod workspace_fs;
pub mod write_behind;

pub use workspace_fs::{HostWork, Kind, WorkspaceFs, json_bytes, mark_process_start};

use cap_std::ambient_authority;
use cap_std::fs::Dir;

/// Replaces the file the user named on the command line (a cassette to record: anywhere, not
/// necessarily in a workspace) atomically: temp file beside it, flushed, renamed over it,
/// then the folder flushed.
/// Files under a workspace go through [`WorkspaceFs`] instead.
pub fn write_named_file_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    create_named_file_atomic(path, bytes).map(drop)
}

/// [`write_named_file_atomic`], returning the new file open for writing (a recording
/// appends to it).
pub fn create_named_file_atomic(path: &Path, bytes: &[u8]) -> io::Result<std::fs::File> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".trellis-")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    let file = tmp.persist(path).map_err(|e| e.error)?;
    // The rename survives a power loss once the folder's entries are on disk too.
    std::fs::File::open(dir)?.sync_all()?;
    Ok(file)
}

/// Checks that `name` is a relative path that stays inside the folder it is resolved in:
/// not empty, not absolute, no `..`, no drive or root prefix. Returns the message to show a
/// user otherwise.
pub fn check_relative(name: &str) -> Result<(), String> {
    let shown = serde_json::Value::String(name.to_string());
    if name.trim().is_empty() {
        return Err("must not be empty: expected a relative path".into());
    }
    if name.contains('\\') {
        return Err(format!(
            "expected a relative path with \"/\" separators, found {shown}"
        ));
    }
    let path = Path::new(name);
    for c in path.components() {
        match c {
            Component::ParentDir => {
                return Err(format!(
                    "must stay inside the workspace: \"..\" is not allowed, found {shown}"
                ));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "must be a relative path inside the workspace, found the absolute path {shown}"
                ));
            }
            Component::CurDir | Component::Normal(_) => {}
        }
    }
    Ok(())
}

/// Opens a host folder as a capability: everything read through it stays inside it.
pub fn open_dir(path: &Path) -> io::Result<Dir> {
    Dir::open_ambient_dir(path, ambient_authority())
}

/// What [`read_capped`] found.
#[derive(Debug)]
pub enum Capped {
    /// The file's bytes.
    Bytes(Vec<u8>),
    /// The file is larger than the cap; its size.
    TooLarge(u64),
}

/// Reads `rel` inside `dir` (a regular file with no other hard link), unless it is larger
/// than `cap` bytes. The size is checked both
/// from the metadata and while reading, so a file growing under us cannot blow the cap.
pub fn read_capped(dir: &Dir, rel: &str, cap: u64) -> io::Result<Capped> {
    use cap_std::fs::{OpenOptions, OpenOptionsExt};
    // Non-blocking, so a FIFO cannot hang the read; its type is refused right after.
    let file = dir.open_with(
        rel,
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW),
    )?;
    let meta = file.metadata()?;
    workspace_fs::check_single_link(Path::new(rel), &meta)?;
    if !meta.is_file() {
        return Err(workspace_fs::special_error(Path::new(rel)));
    }
    let len = meta.len();
    if len > cap {
        return Ok(Capped::TooLarge(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Ok(Capped::TooLarge(bytes.len() as u64));
    }
    Ok(Capped::Bytes(bytes))
}

pub use crate::capabilities::sql::sql_to_json;

/// Now, as RFC 3339 in UTC with milliseconds.
pub fn now_rfc3339() -> String {
    rfc3339(std::time::SystemTime::now())
}

/// A time as RFC 3339 in UTC with milliseconds.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Why a file or folder is not this user's alone: the rule for what decides where code or
/// keys go (the compile cache, the user config file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotOwnerOnly {
    /// Another user owns it.
    Foreign { uid: u32, me: u32 },
    /// Group or others may write it.
    Writable { mode: u32 },
}

impl std::fmt::Display for NotOwnerOnly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotOwnerOnly::Foreign { uid, me } => {
                write!(f, "owned by uid {uid}, not by this user (uid {me})")
            }
            NotOwnerOnly::Writable { mode } => {
                write!(f, "writable by group or others (mode {mode:o})")
            }
        }
    }
}

/// Whether `meta` is owned by this process's user and writable by nobody else.
pub fn check_owner_only(meta: &std::fs::Metadata) -> Result<(), NotOwnerOnly> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(NotOwnerOnly::Foreign {
            uid: meta.uid(),
            me,
        });
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(NotOwnerOnly::Writable { mode });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_cannot_escape() {
        assert!(check_relative("report.json").is_ok());
        assert!(check_relative("db/db.sqlite").is_ok());
        assert!(check_relative("./a/b").is_ok());
        assert!(check_relative("../x").is_err());
        assert!(check_relative("a/../../x").is_err());
        assert!(check_relative("/etc/passwd").is_err());
        assert!(check_relative("").is_err());
        assert!(check_relative("a\\..\\b").is_err());
    }

    #[test]
    fn capped_reads_stop_at_the_cap_and_symlinks_cannot_escape() {
        let outer = tempfile::tempdir().unwrap();
        let inner = outer.path().join("inner");
        std::fs::create_dir(&inner).unwrap();
        std::fs::write(inner.join("big"), vec![b'x'; 100]).unwrap();
        std::fs::write(outer.path().join("secret"), b"s").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(outer.path().join("secret"), inner.join("link")).unwrap();
        let dir = open_dir(&inner).unwrap();
        assert!(matches!(
            read_capped(&dir, "big", 10).unwrap(),
            Capped::TooLarge(100)
        ));
        assert!(
            matches!(read_capped(&dir, "big", 100).unwrap(), Capped::Bytes(b) if b.len() == 100)
        );
        #[cfg(unix)]
        assert!(read_capped(&dir, "link", 10).is_err());
        assert!(read_capped(&dir, "../secret", 10).is_err());
    }
}
