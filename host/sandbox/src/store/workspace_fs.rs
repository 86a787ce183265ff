//! The one way the host touches files under a workspace.
//!
//! [`WorkspaceFs`] holds a cap-std handle on the workspace folder, opened once, and does every
//! read, write, listing, removal and rename of the host under it through that handle. Paths
//! are given either relative to the workspace or as host paths inside it (the run folders and
//! logs folders the driver carries); anything else is refused.
//!
//! Invariants, whoever planted what in the workspace (its author, or a guest with a
//! read-write grant):
//! - **No links.** Every component of a path the host uses is checked with `lstat` through the
//!   handle; a symbolic link anywhere on it is refused ("… is a symbolic link; Trellis does not
//!   read or write through links"), whether it points out of the workspace or not. A link
//!   swapped in between the check and the use still cannot lead out: the handle resolves
//!   every path beneath the workspace (cap-std), so a race at worst reaches another file of
//!   the same workspace.
//! - **Regular files only.** A read refuses a FIFO, socket or device before opening it, opens
//!   with `O_NONBLOCK` and checks the type of what it opened, so nothing can make the host
//!   block on a read; reads are capped ([`READ_CAP`]).
//! - **Atomic writes.** A write goes to a temp file beside its target, is flushed to disk and
//!   renamed over it, so a crash never leaves a truncated file and a link or FIFO at the
//!   target is never written through. The folder is flushed after every rename (of a write
//!   or of [`WorkspaceFs::rename`]), so a power loss does not undo it either.
//! - **Removals** never follow a link: removing a link removes the link.
//! - **Any depth.** Removals and walks keep the path they are on in a list, not on the call
//!   stack ([`tree`]): a chain of folders tens of thousands deep is removed like any other
//!   folder, and a walk stops [`MAX_WALK_DEPTH`] levels down.

use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cap_std::fs::{Dir, File, OpenOptions, OpenOptionsExt};
use serde::Serialize;

mod tree;

pub use super::host_work::HostWork;
pub use tree::MAX_WALK_DEPTH;
pub(crate) use tree::disk_use_at;

/// The largest file the host reads from a workspace (plans, configs, sessions, logs, seeds).
pub const READ_CAP: u64 = 64 << 20;

/// The largest workspace JSON file of settings the host parses whole (`planning/plan.json`,
/// the step config, `workflow.json`, `variables/variables.json`, the builder's state files):
/// parsed, a file of many small values costs many times its bytes in memory.
pub const JSON_READ_CAP: u64 = 16 << 20;

/// What is at a path, without following links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    File,
    Dir,
    Link,
    /// A FIFO, socket or device.
    Special,
}

impl Kind {
    fn of(ft: cap_std::fs::FileType) -> Kind {
        if ft.is_symlink() {
            Kind::Link
        } else if ft.is_dir() {
            Kind::Dir
        } else if ft.is_file() {
            Kind::File
        } else {
            Kind::Special
        }
    }
}

/// A workspace folder opened once; see the module header.
#[derive(Debug, Clone)]
pub struct WorkspaceFs {
    root: PathBuf,
    canonical: PathBuf,
    dir: Arc<Dir>,
    /// The budget and deadline this handle's reads, listings and walks are charged to.
    work: Option<Arc<HostWork>>,
}

fn refused(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn shown(rel: &Path) -> String {
    let s = rel.to_string_lossy().replace('\\', "/");
    if s.is_empty() { ".".into() } else { s }
}

/// The error of a path that goes through a symbolic link.
pub fn link_error(rel: &Path) -> io::Error {
    refused(format!(
        "{} is a symbolic link; Trellis does not read or write through links",
        shown(rel)
    ))
}

/// The error of a path that is a FIFO, socket or device.
/// The error of a regular file that has other names: a hard link made to a file outside
/// the workspace reads as a plain file here, and nothing in the workspace can tell.
pub fn hard_link_error(rel: &Path) -> io::Error {
    refused(format!(
        "{} has other hard links; a file linked from elsewhere (perhaps outside the \
         workspace) is never read",
        shown(rel)
    ))
}

/// Refuses `meta`, the metadata of the open file `rel`, when it has other hard links.
pub(crate) fn check_single_link(rel: &Path, meta: &cap_std::fs::Metadata) -> io::Result<()> {
    #[cfg(unix)]
    {
        use cap_primitives::fs::MetadataExt;
        if meta.is_file() && meta.nlink() > 1 {
            return Err(hard_link_error(rel));
        }
    }
    let _ = (rel, meta);
    Ok(())
}

pub fn special_error(rel: &Path) -> io::Error {
    refused(format!(
        "{} is not a regular file (a FIFO, socket or device); Trellis reads and writes only \
         regular files",
        shown(rel)
    ))
}

impl WorkspaceFs {
    /// Opens the workspace folder `root` (which may itself be reached through links).
    pub fn open(root: &Path) -> io::Result<Self> {
        let dir = Dir::open_ambient_dir(root, cap_std::ambient_authority()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("opening the workspace {}: {e}", root.display()),
            )
        })?;
        let canonical = root.canonicalize().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("resolving the workspace {}: {e}", root.display()),
            )
        })?;
        Ok(WorkspaceFs {
            root: root.to_path_buf(),
            canonical,
            dir: Arc::new(dir),
            work: None,
        })
    }

    /// This handle, its reads charged to `work` and its reads, listings and walks stopped by
    /// its deadline (see [`HostWork`]).
    pub fn with_work(&self, work: Arc<HostWork>) -> WorkspaceFs {
        WorkspaceFs {
            work: Some(work),
            ..self.clone()
        }
    }

    /// An error when the deadline of this handle's work has passed.
    fn check_time(&self) -> io::Result<()> {
        self.work.as_ref().map_or(Ok(()), |w| w.check_time())
    }

    /// Whether `other` writes through the same opened folder (a clone of this one).
    pub(crate) fn same_folder(&self, other: &WorkspaceFs) -> bool {
        Arc::ptr_eq(&self.dir, &other.dir)
    }

    /// The workspace folder, as it was given to [`WorkspaceFs::open`].
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The workspace-relative form of `path`: a relative path as it is (no `..`, not empty
    /// of meaning), a host path with the workspace's prefix removed. Anything else is refused.
    pub fn relative(&self, path: &Path) -> io::Result<PathBuf> {
        let rel = if path.is_absolute() || path.starts_with(&self.root) {
            path.strip_prefix(&self.root)
                .or_else(|_| path.strip_prefix(&self.canonical))
                .map_err(|_| {
                    refused(format!(
                        "{} is outside the workspace {}",
                        path.display(),
                        self.root.display()
                    ))
                })?
        } else {
            path
        };
        let mut out = PathBuf::new();
        for c in rel.components() {
            match c {
                Component::Normal(p) => out.push(p),
                Component::CurDir => {}
                Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                    return Err(refused(format!(
                        "{} leaves the workspace {}",
                        path.display(),
                        self.root.display()
                    )));
                }
            }
        }
        Ok(out)
    }

    /// The host path of a workspace-relative path (for messages and for handing to a
    /// sandbox grant after [`WorkspaceFs::check_dir`]).
    pub fn host_path(&self, rel: &Path) -> PathBuf {
        self.root.join(rel)
    }

    /// The host path of `rel` under the canonical workspace folder: free of links when `rel`
    /// was checked, which SQLite's `SQLITE_OPEN_NOFOLLOW` requires of the whole path.
    /// Waits for the writes queued on the writer thread ([`super::write_behind`]) that go to
    /// `rel` or below it before it is moved or removed: one would otherwise land after the
    /// move (recreating what was moved or removed) or fail.
    fn settle_queued_writes(&self, rel: &Path) -> io::Result<()> {
        super::write_behind::flush_if_pending_under(&self.canonical_path(rel))
    }

    /// Where `path` (relative to the workspace or a host path inside it) is under the
    /// workspace's canonical folder; `None` outside it.
    pub(crate) fn canonical_of(&self, path: &Path) -> Option<PathBuf> {
        self.relative(path)
            .ok()
            .map(|rel| self.canonical_path(&rel))
    }

    pub(crate) fn canonical_path(&self, rel: &Path) -> PathBuf {
        self.canonical.join(rel)
    }

    /// What is at `path` without following any link, `None` when nothing is. A link on the
    /// way to it (not at it) is an error.
    pub fn kind(&self, path: impl AsRef<Path>) -> io::Result<Option<Kind>> {
        let rel = self.relative(path.as_ref())?;
        self.kind_rel(&rel)
    }

    fn kind_rel(&self, rel: &Path) -> io::Result<Option<Kind>> {
        if let Some(kind) = self.kind_at_once(rel) {
            return Ok(Some(kind));
        }
        // Absent, or a link or a file on the way: the walk below says which, and where.
        let mut prefix = PathBuf::new();
        let mut comps = rel.components().peekable();
        if comps.peek().is_none() {
            return Ok(Some(Kind::Dir));
        }
        while let Some(c) = comps.next() {
            prefix.push(c);
            let kind = match self.dir.symlink_metadata(&prefix) {
                Ok(m) => Kind::of(m.file_type()),
                Err(e) if is_absent(&e) => return Ok(None),
                Err(e) => return Err(e),
            };
            if comps.peek().is_none() {
                return Ok(Some(kind));
            }
            match kind {
                Kind::Dir => {}
                Kind::Link => return Err(link_error(&prefix)),
                // A file where a folder should be: nothing is below it.
                _ => return Ok(None),
            }
        }
        Ok(None)
    }

    /// What is at `rel` when every folder on its way is a folder, found in one lookup: the
    /// kernel resolves the whole path beneath the workspace refusing every link on the way
    /// (`openat2` with `RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH`; the last component is not
    /// followed, so a link there is seen as one). `None` when that lookup fails for any
    /// reason (absent, a link or a file on the way, a kernel without `openat2`): the caller
    /// walks the path component by component instead.
    fn kind_at_once(&self, rel: &Path) -> Option<Kind> {
        use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
        if rel.as_os_str().is_empty() {
            return None;
        }
        let fd = rustix::fs::openat2(
            &*self.dir,
            rel,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH,
        )
        .ok()?;
        let stat = rustix::fs::fstat(&fd).ok()?;
        Some(match FileType::from_raw_mode(stat.st_mode) {
            FileType::Symlink => Kind::Link,
            FileType::Directory => Kind::Dir,
            FileType::RegularFile => Kind::File,
            _ => Kind::Special,
        })
    }

    /// Refuses `rel` when it or a folder on its way is a link, or when it is a FIFO, socket
    /// or device. `Ok(None)` when it does not exist.
    fn check(&self, rel: &Path) -> io::Result<Option<Kind>> {
        match self.kind_rel(rel)? {
            Some(Kind::Link) => Err(link_error(rel)),
            Some(Kind::Special) => Err(special_error(rel)),
            other => Ok(other),
        }
    }

    /// A regular file at `path`, reached without links.
    pub fn is_file(&self, path: impl AsRef<Path>) -> bool {
        matches!(self.kind(path), Ok(Some(Kind::File)))
    }

    /// A folder at `path`, reached without links.
    pub fn is_dir(&self, path: impl AsRef<Path>) -> bool {
        matches!(self.kind(path), Ok(Some(Kind::Dir)))
    }

    /// Something (of any kind, a link included) at `path`.
    pub fn exists(&self, path: impl AsRef<Path>) -> bool {
        matches!(self.kind(path), Ok(Some(_)))
    }

    /// Checks that `path` is a folder reached without links and returns its host path, for a
    /// grant.
    pub fn check_dir(&self, path: impl AsRef<Path>) -> io::Result<PathBuf> {
        let rel = self.relative(path.as_ref())?;
        match self.check(&rel)? {
            Some(Kind::Dir) => Ok(self.host_path(&rel)),
            Some(_) => Err(refused(format!("{} is not a folder", shown(&rel)))),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} does not exist", shown(&rel)),
            )),
        }
    }

    /// Reads the regular file at `path`, at most [`READ_CAP`] bytes.
    pub fn read(&self, path: impl AsRef<Path>) -> io::Result<Vec<u8>> {
        self.read_capped(path, READ_CAP)
    }

    /// [`WorkspaceFs::read`] as UTF-8.
    pub fn read_to_string(&self, path: impl AsRef<Path>) -> io::Result<String> {
        String::from_utf8(self.read(path)?)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Reads the workspace JSON file at `path` as UTF-8: at most [`JSON_READ_CAP`] bytes, a
    /// larger file refused naming itself, its size and the cap, and so is one of more than
    /// [`crate::json_values::MAX_FILE_VALUES`] JSON values. Every file of settings the host
    /// parses whole is read through it.
    pub fn read_json_text(&self, path: impl AsRef<Path>) -> io::Result<String> {
        let path = path.as_ref();
        let bytes = self.read_capped_as(path, JSON_READ_CAP, "of a JSON file")?;
        crate::json_values::check_values(
            &path.display().to_string(),
            &bytes,
            crate::json_values::MAX_FILE_VALUES,
        )
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// The JSON value in the file at `path` (a log, a session, a guest's file: at most
    /// [`READ_CAP`] bytes), counted before it is parsed: a file of more than
    /// [`crate::json_values::MAX_FILE_VALUES`] values is refused unparsed, naming it, and so
    /// is one that is not JSON.
    pub fn read_json_value(&self, path: impl AsRef<Path>) -> io::Result<serde_json::Value> {
        self.read_json_value_within(path, READ_CAP, crate::json_values::MAX_FILE_VALUES)
    }

    /// [`WorkspaceFs::read_json_value`] of a file of a kind Trellis writes smaller: one of
    /// more than `max_bytes` bytes or `max_values` values is refused unparsed.
    pub fn read_json_value_within(
        &self,
        path: impl AsRef<Path>,
        max_bytes: u64,
        max_values: usize,
    ) -> io::Result<serde_json::Value> {
        let path = path.as_ref();
        let bytes = self.read_capped(path, max_bytes)?;
        let name = path.display().to_string();
        crate::json_values::check_values(&name, &bytes, max_values)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidData, format!("{name}: not JSON: {e}"))
        })
    }

    /// `Ok(None)` when `path` does not exist, else [`WorkspaceFs::read_json_text`].
    pub fn read_json_optional(&self, path: impl AsRef<Path>) -> io::Result<Option<String>> {
        match self.read_json_text(path) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads the regular file at `path`; a file larger than `cap` is an error.
    pub fn read_capped(&self, path: impl AsRef<Path>, cap: u64) -> io::Result<Vec<u8>> {
        self.read_capped_as(path.as_ref(), cap, "")
    }

    /// [`WorkspaceFs::read_capped`], the cap named as the one Trellis reads `what` (`of a JSON
    /// file`) in the error.
    fn read_capped_as(&self, path: &Path, cap: u64, what: &str) -> io::Result<Vec<u8>> {
        let what = if what.is_empty() {
            String::new()
        } else {
            format!(" {what}")
        };
        let (rel, file, len) = self.open_regular(path)?;
        if len > cap {
            return Err(refused(format!(
                "{} is {len} bytes, more than the {cap} Trellis reads{what}",
                shown(&rel),
            )));
        }
        if let Some(work) = &self.work {
            work.charge_read(&rel, len)?;
        }
        let mut bytes = Vec::with_capacity(len as usize);
        file.take(cap + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > cap {
            return Err(refused(format!(
                "{} is more than the {cap} bytes Trellis reads{what}",
                shown(&rel)
            )));
        }
        Ok(bytes)
    }

    /// The length of the regular file at `path`; `None` when there is none (or it is a
    /// link, a folder or a special file).
    pub fn metadata_len(&self, path: impl AsRef<Path>) -> Option<u64> {
        let rel = self.relative(path.as_ref()).ok()?;
        match self.check(&rel).ok()? {
            Some(Kind::File) => self.dir.symlink_metadata(&rel).ok().map(|m| m.len()),
            _ => None,
        }
    }

    /// The length and modification time of the regular file at `path`, which change when
    /// it is written (an atomic write replaces it); `None` as for [`WorkspaceFs::metadata_len`].
    pub fn stamp(&self, path: impl AsRef<Path>) -> Option<(u64, std::time::SystemTime)> {
        let rel = self.relative(path.as_ref()).ok()?;
        match self.check(&rel).ok()? {
            Some(Kind::File) => {
                let meta = self.dir.symlink_metadata(&rel).ok()?;
                Some((meta.len(), meta.modified().ok()?.into_std()))
            }
            _ => None,
        }
    }

    /// The first `max` bytes at most of the regular file at `path`, and the file's length.
    pub fn read_head(&self, path: impl AsRef<Path>, max: u64) -> io::Result<(Vec<u8>, u64)> {
        let (rel, file, len) = self.open_regular(path.as_ref())?;
        let head = len.min(max);
        if let Some(work) = &self.work {
            work.charge_read(&rel, head)?;
        }
        let mut bytes = Vec::with_capacity(head as usize);
        file.take(head).read_to_end(&mut bytes)?;
        Ok((bytes, len))
    }

    /// Opens the regular file at `path` for reading, without following links or blocking:
    /// its path relative to the workspace, the file and its length.
    fn open_regular(&self, path: &Path) -> io::Result<(PathBuf, File, u64)> {
        self.check_time()?;
        let rel = self.relative(path)?;
        match self.check(&rel)? {
            Some(Kind::File) => {}
            Some(Kind::Dir) => return Err(refused(format!("{} is a folder", shown(&rel)))),
            Some(_) => unreachable!("check refuses links and special files"),
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{} does not exist", shown(&rel)),
                ));
            }
        }
        let file = self
            .dir
            .open_with(
                &rel,
                OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW),
            )
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => link_error(&rel),
                _ => e,
            })?;
        let meta = file.metadata()?;
        check_single_link(&rel, &meta)?;
        if !meta.is_file() {
            return Err(special_error(&rel));
        }
        Ok((rel, file, meta.len()))
    }

    /// `Ok(None)` when `path` does not exist, else [`WorkspaceFs::read_to_string`].
    pub fn read_optional(&self, path: impl AsRef<Path>) -> io::Result<Option<String>> {
        match self.read_to_string(path) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates the folder `path` and its parents, flushing each new entry to disk; refuses a
    /// link or a file on the way.
    pub fn create_dir_all(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let rel = self.relative(path.as_ref())?;
        match self.check(&rel)? {
            Some(Kind::Dir) => Ok(()),
            Some(_) => Err(refused(format!(
                "{} is a file where a folder is needed",
                shown(&rel)
            ))),
            None if rel.as_os_str().is_empty() => Ok(()),
            None => {
                // The folders made here must survive a power loss with what is written into
                // them: each new folder's entry is flushed in its parent, from the deepest
                // folder that was already there down.
                let mut base = rel.parent().unwrap_or(Path::new(""));
                while !base.as_os_str().is_empty() && self.kind_rel(base)?.is_none() {
                    base = base.parent().unwrap_or(Path::new(""));
                }
                self.dir.create_dir_all(&rel)?;
                let mut folder = base.to_path_buf();
                self.sync_dir(&folder)?;
                for c in rel.strip_prefix(base).unwrap_or(&rel).components() {
                    folder.push(c);
                    if folder != rel {
                        self.sync_dir(&folder)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Creates the folder `path`, whose parent must exist; `AlreadyExists` when it does.
    pub fn create_dir(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let rel = self.relative(path.as_ref())?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        self.check(parent)?;
        self.dir.create_dir(&rel)?;
        self.sync_dir(parent)
    }

    /// Removes `path`: a folder with everything in it, a file, or a link (the link itself,
    /// never what it points to). Nothing there is not an error.
    pub fn remove_all(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let rel = self.relative(path.as_ref())?;
        self.settle_queued_writes(&rel)?;
        if rel.as_os_str().is_empty() {
            return Err(refused(
                "the workspace folder itself cannot be removed".into(),
            ));
        }
        match self.kind_rel(&rel)? {
            None => Ok(()),
            Some(Kind::Dir) => {
                let name = rel.file_name().unwrap_or(rel.as_os_str());
                match rel.parent().filter(|p| !p.as_os_str().is_empty()) {
                    Some(parent) => tree::remove_dir_all(&self.dir.open_dir(parent)?, name),
                    None => tree::remove_dir_all(&*self.dir, name),
                }
            }
            Some(_) => self.dir.remove_file(&rel),
        }
    }

    /// Removes the empty folder `path`.
    pub fn remove_dir(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let rel = self.relative(path.as_ref())?;
        self.settle_queued_writes(&rel)?;
        match self.kind_rel(&rel)? {
            Some(Kind::Dir) => self.dir.remove_dir(&rel),
            Some(_) => Err(refused(format!("{} is not a folder", shown(&rel)))),
            None => Ok(()),
        }
    }

    /// Removes the file (or link) `path`; nothing there is not an error.
    pub fn remove_file(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let rel = self.relative(path.as_ref())?;
        self.settle_queued_writes(&rel)?;
        match self.kind_rel(&rel)? {
            None => Ok(()),
            Some(Kind::Dir) => Err(refused(format!("{} is a folder", shown(&rel)))),
            Some(_) => self.dir.remove_file(&rel),
        }
    }

    /// Moves `from` to `to`; neither may be (or go through) a link.
    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
        let from = self.relative(from.as_ref())?;
        let to = self.relative(to.as_ref())?;
        self.settle_queued_writes(&from)?;
        self.settle_queued_writes(&to)?;
        self.check(&from)?;
        self.check(&to)?;
        self.dir.rename(&from, &self.dir, &to)?;
        let from_parent = from.parent().unwrap_or(Path::new(""));
        let to_parent = to.parent().unwrap_or(Path::new(""));
        self.sync_dir(to_parent)?;
        if from_parent != to_parent {
            self.sync_dir(from_parent)?;
        }
        Ok(())
    }

    /// Renames whatever is at `from` (a link, a FIFO or a folder included: it is neither
    /// followed nor opened) to `to`, where nothing may be: to set an entry that cannot be
    /// read aside, keeping it for its owner.
    pub fn set_aside(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
        let from = self.relative(from.as_ref())?;
        let to = self.relative(to.as_ref())?;
        if self.kind_rel(&to)?.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists already", to.display()),
            ));
        }
        self.dir.rename(&from, &self.dir, &to)?;
        self.sync_dir(to.parent().unwrap_or(Path::new("")))
    }

    /// Flushes the entries of the folder `rel` to disk, so that a rename into it (or out of
    /// it) survives a power loss: `fsync` of the file only makes its bytes durable, not the
    /// name that points at them.
    fn sync_dir(&self, rel: &Path) -> io::Result<()> {
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        self.dir
            .open_with(
                rel,
                OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW),
            )?
            .sync_all()
    }

    /// The entries of the folder `path`: name and kind (links are reported as links).
    pub fn list(&self, path: impl AsRef<Path>) -> io::Result<Vec<(String, Kind)>> {
        self.check_time()?;
        let rel = self.relative(path.as_ref())?;
        match self.check(&rel)? {
            Some(Kind::Dir) => {}
            Some(_) => return Err(refused(format!("{} is not a folder", shown(&rel)))),
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{} does not exist", shown(&rel)),
                ));
            }
        }
        let entries = if rel.as_os_str().is_empty() {
            self.dir.entries()?
        } else {
            self.dir.read_dir(&rel)?
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            out.push((name, Kind::of(entry.file_type()?)));
        }
        out.sort();
        Ok(out)
    }

    /// Visits what is under the folder `path`, depth first in name order, without recursion:
    /// `visit` gets each entry's path (`path` joined with the names below it) and kind (a
    /// link as a link, never followed) and answers whether to go into it, when it is a
    /// folder. Folders more than [`MAX_WALK_DEPTH`] levels below `path` are not entered, nor
    /// one whose path is longer than the system takes. A folder that cannot be listed
    /// otherwise ends the walk with its error.
    pub fn walk(
        &self,
        path: impl AsRef<Path>,
        mut visit: impl FnMut(&Path, Kind) -> bool,
    ) -> io::Result<()> {
        // Entries still to visit, the next one last, with how deep each is.
        let mut pending: Vec<(PathBuf, Kind, usize)> = Vec::new();
        let enter = |pending: &mut Vec<(PathBuf, Kind, usize)>, dir: &Path, depth| {
            let entries = self.list(dir)?;
            pending.extend(
                entries
                    .into_iter()
                    .rev()
                    .map(|(name, kind)| (dir.join(name), kind, depth)),
            );
            io::Result::Ok(())
        };
        enter(&mut pending, path.as_ref(), 1)?;
        while let Some((entry, kind, depth)) = pending.pop() {
            self.check_time()?;
            if visit(&entry, kind) && kind == Kind::Dir && depth < MAX_WALK_DEPTH {
                match enter(&mut pending, &entry, depth + 1) {
                    // A chain of long names can pass the longest path the system takes well
                    // within the depth (17 folders of 255 bytes): what is below is not named
                    // by path, and not walked, rather than stopping the walk.
                    Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => {}
                    other => other?,
                }
            }
        }
        Ok(())
    }

    /// Removes the temp files that writes cut short (a killed process) left under `dir`, and
    /// returns their paths. Only regular files named as this store's writes name them are
    /// touched: `.trellis-<pid>-<n>.tmp` and `.trellis-<pid>-batch-<n>.tmp` whose process is
    /// gone or that are older than `started` (the process id was reused since), and the
    /// `workspace` plugin's `.<name>.<16 hex digits>.trellis-tmp` older than `started`
    /// ("older" by more than [`TEMP_CLOCK_SLACK`]). Links are neither followed nor removed;
    /// the walk stays inside `dir`.
    ///
    /// `started` is when the caller began, holding the workspace lock: no live writer of
    /// another run has a temp file in its run folder from before then.
    pub fn remove_stale_temp_files(
        &self,
        dir: impl AsRef<Path>,
        started: std::time::SystemTime,
    ) -> io::Result<Vec<PathBuf>> {
        let rel = self.relative(dir.as_ref())?;
        if self.check(&rel)? != Some(Kind::Dir) {
            return Ok(Vec::new());
        }
        let mut candidates = Vec::new();
        self.walk(&rel, |path, kind| {
            if kind == Kind::File
                && let Some(name) = path.file_name().and_then(|n| n.to_str())
                && let Some(owner) = temp_file_owner(name)
            {
                candidates.push((path.to_path_buf(), owner));
            }
            kind == Kind::Dir
        })?;
        let mut removed = Vec::new();
        for (path, owner) in candidates {
            // Checked again right before removal: still a regular file (not swapped for a link).
            let Ok(meta) = self.dir.symlink_metadata(&path) else {
                continue;
            };
            if !meta.file_type().is_file() {
                continue;
            }
            // File times come from the kernel's coarse clock, a tick behind the one
            // `started` was read from: a file made just after `started` can look older.
            let modified = meta.modified().map(|m| m.into_std());
            let older = modified
                .as_ref()
                .is_ok_and(|m| *m + TEMP_CLOCK_SLACK < started);
            // A file from before this process started is no write of its own: a run killed
            // a moment before this one started left it (the slack above kept it, when this
            // process started within it).
            let before_process = modified
                .as_ref()
                .is_ok_and(|m| PROCESS_START.get().is_some_and(|start| m < start));
            let stale = match owner {
                TempOwner::Process(pid) => older || !process_alive(pid),
                TempOwner::Unnamed => older || before_process,
            };
            if stale {
                match self.dir.remove_file(&path) {
                    Ok(()) => removed.push(path),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(removed)
    }

    /// Replaces `path` with `bytes` atomically: a temp file beside it, flushed to disk, then
    /// renamed over it, and the folder flushed so the rename survives a power loss. Parent
    /// folders are created; a link on the way or at `path` is refused.
    pub fn write_atomic(&self, path: impl AsRef<Path>, bytes: &[u8]) -> io::Result<()> {
        let rel = self.relative(path.as_ref())?;
        let Some(name) = rel.file_name() else {
            return Err(refused(format!(
                "{} names no file",
                path.as_ref().display()
            )));
        };
        let parent = rel.parent().unwrap_or(Path::new(""));
        if let Some(Kind::Dir) = self.check(&rel)? {
            return Err(refused(format!("{} is a folder", shown(&rel))));
        }
        self.create_dir_all(parent)?;
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let tmp = parent.join(format!(
            ".trellis-{}-{}.tmp",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut file = self.dir.open_with(
                &tmp,
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc::O_NOFOLLOW),
            )?;
            file.write_all(bytes)?;
            file.sync_all()?;
            self.dir.rename(&tmp, &self.dir, parent.join(name))?;
            self.sync_dir(parent)
        })();
        if result.is_err() {
            let _ = self.dir.remove_file(&tmp);
        }
        result
    }

    /// [`WorkspaceFs::write_atomic`] of several files, with one wait for the disk rather
    /// than two per file: every file is written to a temporary file first, then all are
    /// flushed (on a journaling file system the first flush commits the others' data with
    /// it), then each is renamed in place and each folder flushed once. A file that cannot
    /// be written leaves every one of them as it was; each file is always whole, old or new.
    pub fn write_all_atomic(&self, files: &[(&Path, &[u8])]) -> io::Result<()> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut staged: Vec<(PathBuf, PathBuf)> = Vec::with_capacity(files.len());
        let result = (|| {
            let mut written = Vec::with_capacity(files.len());
            for (path, bytes) in files {
                let rel = self.relative(path)?;
                let Some(name) = rel.file_name() else {
                    return Err(refused(format!("{} names no file", path.display())));
                };
                let parent = rel.parent().unwrap_or(Path::new("")).to_path_buf();
                if let Some(Kind::Dir) = self.check(&rel)? {
                    return Err(refused(format!("{} is a folder", shown(&rel))));
                }
                self.create_dir_all(&parent)?;
                let tmp = parent.join(format!(
                    ".trellis-{}-batch-{}.tmp",
                    std::process::id(),
                    COUNTER.fetch_add(1, Ordering::Relaxed)
                ));
                let mut file = self.dir.open_with(
                    &tmp,
                    OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .custom_flags(libc::O_NOFOLLOW),
                )?;
                staged.push((tmp, parent.join(name)));
                file.write_all(bytes)?;
                written.push(file);
            }
            for file in &written {
                file.sync_all()?;
            }
            let mut folders: Vec<PathBuf> = Vec::new();
            // Renamed in order; what is left in `staged` is removed below if one fails.
            staged.reverse();
            while let Some((tmp, target)) = staged.last() {
                self.dir.rename(tmp, &self.dir, target)?;
                let parent = target.parent().unwrap_or(Path::new("")).to_path_buf();
                staged.pop();
                if !folders.contains(&parent) {
                    folders.push(parent);
                }
            }
            for folder in &folders {
                self.sync_dir(folder)?;
            }
            Ok(())
        })();
        for (tmp, _) in &staged {
            let _ = self.dir.remove_file(tmp);
        }
        result
    }

    /// [`WorkspaceFs::write_atomic`] of `value` as 2-space indented JSON with a final newline.
    pub fn write_json_atomic<T: Serialize + ?Sized>(
        &self,
        path: impl AsRef<Path>,
        value: &T,
    ) -> io::Result<()> {
        self.write_atomic(path, &json_bytes(value)?)
    }

    /// Creates an empty regular file at `path` when nothing is there (for an SQLite database
    /// that a sandbox or SQLite will open by path), refusing links and special files; returns
    /// its host path, under the canonical workspace folder.
    pub fn ensure_regular_file(&self, path: impl AsRef<Path>) -> io::Result<PathBuf> {
        let rel = self.relative(path.as_ref())?;
        match self.check(&rel)? {
            Some(Kind::File) => {}
            Some(_) => return Err(refused(format!("{} is not a regular file", shown(&rel)))),
            None => {
                if let Some(parent) = rel.parent() {
                    self.create_dir_all(parent)?;
                }
                match self.dir.open_with(
                    &rel,
                    OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .custom_flags(libc::O_NOFOLLOW),
                ) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        return self.ensure_regular_file(&rel);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(self.canonical_path(&rel))
    }

    /// Checks that `path` is a regular file (or nothing) reached without links; returns its
    /// host path under the canonical workspace folder, for code that opens by path (SQLite).
    pub fn check_file_path(&self, path: impl AsRef<Path>) -> io::Result<PathBuf> {
        let rel = self.relative(path.as_ref())?;
        match self.check(&rel)? {
            Some(Kind::Dir) => Err(refused(format!("{} is a folder", shown(&rel)))),
            _ => Ok(self.canonical_path(&rel)),
        }
    }
}

/// 2-space indented JSON with a final newline: the format of every JSON file Trellis writes.
pub fn json_bytes<T: Serialize + ?Sized>(value: &T) -> io::Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    bytes.push(b'\n');
    Ok(bytes)
}

fn is_absent(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

/// When this process started, as [`mark_process_start`] recorded it: no temp file of its
/// own is older.
static PROCESS_START: std::sync::OnceLock<std::time::SystemTime> = std::sync::OnceLock::new();

/// Records now as the start of this process, for [`WorkspaceFs::remove_stale_temp_files`]:
/// called first thing by a program's `main` (the CLI), before any write. Without it, only
/// the age rule applies.
pub fn mark_process_start() {
    PROCESS_START.get_or_init(std::time::SystemTime::now);
}

/// How much older than the run's start a temp file must be to count as older
/// ([`WorkspaceFs::remove_stale_temp_files`]): more than a tick of the kernel's coarse clock.
const TEMP_CLOCK_SLACK: std::time::Duration = std::time::Duration::from_millis(50);

/// Who wrote a temp file, by its name ([`WorkspaceFs::remove_stale_temp_files`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TempOwner {
    /// The store's own writes: named by the writing process.
    Process(u32),
    /// The `workspace` plugin's writes: named at random.
    Unnamed,
}

/// The owner of a temp file named `name`, or `None` when the name is not one of the temp
/// files' names.
fn temp_file_owner(name: &str) -> Option<TempOwner> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if let Some(rest) = name
        .strip_prefix(".trellis-")
        .and_then(|r| r.strip_suffix(".tmp"))
    {
        let (pid, counter) = rest.split_once('-')?;
        let counter = counter.strip_prefix("batch-").unwrap_or(counter);
        if digits(pid) && digits(counter) {
            return pid.parse().ok().map(TempOwner::Process);
        }
        return None;
    }
    let rest = name.strip_prefix('.')?.strip_suffix(".trellis-tmp")?;
    let (target, unique) = rest.rsplit_once('.')?;
    (!target.is_empty() && unique.len() == 16 && unique.bytes().all(|b| b.is_ascii_hexdigit()))
        .then_some(TempOwner::Unnamed)
}

/// Whether process `pid` is alive (a process of another user counts as alive).
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, tempfile::TempDir, WorkspaceFs) {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let fs = WorkspaceFs::open(ws.path()).unwrap();
        (ws, outside, fs)
    }

    #[test]
    fn writes_are_atomic_and_leave_no_temp_files() {
        let (ws, _o, fs) = setup();
        fs.write_json_atomic("a/b.json", &serde_json::json!({"x": 1}))
            .unwrap();
        fs.write_json_atomic(ws.path().join("a/b.json"), &serde_json::json!([]))
            .unwrap();
        assert_eq!(fs.read_to_string("a/b.json").unwrap(), "[]\n");
        let names: Vec<_> = fs.list("a").unwrap();
        assert_eq!(names, [("b.json".to_string(), Kind::File)]);
    }

    #[test]
    fn stale_temp_files_are_removed_and_nothing_else() {
        let (ws, outside, fs) = setup();
        let dir = ws.path().join("runs/iteration-0/execution/s");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(ws.path().join("knowledgebase")).unwrap();
        let started = std::time::SystemTime::now();
        let old = started - std::time::Duration::from_secs(3600);
        let own = std::process::id();
        // 4194304 is past the highest process id Linux gives (pid_max is at most 2^22).
        let dead = 4_194_304;
        let write = |rel: &str, modified: Option<std::time::SystemTime>| {
            let path = ws.path().join(rel);
            let file = std::fs::File::create(&path).unwrap();
            if let Some(t) = modified {
                file.set_modified(t).unwrap();
            }
        };
        let run = "runs/iteration-0/execution/s";
        let stale = [
            format!("{run}/.trellis-{dead}-3.tmp"),
            format!("{run}/.trellis-{dead}-batch-7.tmp"),
            format!("runs/iteration-0/.trellis-{own}-2.tmp"),
            format!("{run}/.note.md.0123456789abcdef.trellis-tmp"),
        ];
        write(&stale[0], None);
        write(&stale[1], None);
        write(&stale[2], Some(old));
        write(&stale[3], Some(old));
        let kept = [
            format!("{run}/.trellis-{own}-1.tmp"),
            format!("{run}/.trellis-{own}-batch-1.tmp"),
            format!("{run}/.note.md.fedcba9876543210.trellis-tmp"),
            format!("{run}/.trellis-{dead}-x.tmp"),
            format!("{run}/.trellis-{dead}-batch-.tmp"),
            format!("{run}/.note.md.0123.trellis-tmp"),
            format!("{run}/note.md"),
            format!("knowledgebase/.trellis-{dead}-1.tmp"),
        ];
        for rel in &kept {
            write(rel, None);
        }
        write(&kept[7], Some(old));
        std::fs::write(outside.path().join("target"), "outside\n").unwrap();
        let link = format!("{run}/.trellis-{dead}-9.tmp");
        symlink(outside.path().join("target"), ws.path().join(&link)).unwrap();
        let dir_link = format!("{run}/linked");
        std::fs::write(outside.path().join(format!(".trellis-{dead}-4.tmp")), "").unwrap();
        symlink(outside.path(), ws.path().join(&dir_link)).unwrap();

        let mut removed = fs
            .remove_stale_temp_files("runs/iteration-0", started)
            .unwrap();
        removed.sort();
        let mut expected: Vec<PathBuf> = stale.iter().map(PathBuf::from).collect();
        expected.sort();
        assert_eq!(removed, expected);
        for rel in &stale {
            assert!(!ws.path().join(rel).exists(), "{rel} is left");
        }
        for rel in kept.iter().chain([&link, &dir_link]) {
            assert!(
                ws.path().join(rel).symlink_metadata().is_ok(),
                "{rel} was removed"
            );
        }
        assert_eq!(
            std::fs::read_to_string(outside.path().join("target")).unwrap(),
            "outside\n"
        );
        assert!(
            outside
                .path()
                .join(format!(".trellis-{dead}-4.tmp"))
                .exists()
        );
        // A folder that is not there has nothing to clean.
        assert_eq!(
            fs.remove_stale_temp_files("runs/none", started).unwrap(),
            Vec::<PathBuf>::new()
        );
    }

    #[test]
    fn a_batch_is_written_whole_or_not_at_all() {
        let (ws, _o, fs) = setup();
        fs.write_atomic("logs/a.txt", b"old").unwrap();
        fs.write_all_atomic(&[
            (Path::new("logs/a.txt"), b"new a"),
            (&ws.path().join("logs/b.json"), b"{}"),
            (Path::new("other/c.txt"), b"c"),
        ])
        .unwrap();
        assert_eq!(fs.read_to_string("logs/a.txt").unwrap(), "new a");
        assert_eq!(fs.read_to_string("logs/b.json").unwrap(), "{}");
        assert_eq!(fs.read_to_string("other/c.txt").unwrap(), "c");
        let names: Vec<_> = fs.list("logs").unwrap();
        assert_eq!(
            names,
            [
                ("a.txt".to_string(), Kind::File),
                ("b.json".to_string(), Kind::File)
            ]
        );

        // A folder where the last file goes: nothing is replaced, no temporary file is left.
        std::fs::create_dir(ws.path().join("logs/d")).unwrap();
        let err = fs
            .write_all_atomic(&[
                (Path::new("logs/a.txt"), b"newer"),
                (Path::new("logs/d"), b"x"),
            ])
            .unwrap_err();
        assert!(err.to_string().contains("is a folder"), "{err}");
        assert_eq!(fs.read_to_string("logs/a.txt").unwrap(), "new a");
        assert_eq!(fs.list("logs").unwrap().len(), 3);
        // A path out of the workspace is refused like a single write.
        assert!(
            fs.write_all_atomic(&[(Path::new("../escape.txt"), b"x")])
                .is_err()
        );
        assert!(!ws.path().parent().unwrap().join("escape.txt").exists());
    }

    #[test]
    fn folders_are_flushed_at_the_root_and_below() {
        // The folder flushes after a rename and after creating folders open what they flush
        // by relative path: the workspace itself (`.`), new and existing folders.
        let (ws, _o, fs) = setup();
        fs.write_atomic("top.json", b"{}").unwrap();
        std::fs::create_dir(ws.path().join("old")).unwrap();
        fs.create_dir_all("old/new/deeper").unwrap();
        fs.write_atomic("old/new/deeper/x", b"x").unwrap();
        fs.rename("old/new/deeper/x", "y").unwrap();
        fs.rename("old", "moved").unwrap();
        fs.create_dir("moved/made").unwrap();
        assert_eq!(fs.read("y").unwrap(), b"x");
        assert!(fs.is_dir("moved/new/deeper") && fs.is_dir("moved/made"));
    }

    #[test]
    fn links_are_refused_wherever_they_are() {
        let (ws, outside, fs) = setup();
        symlink(outside.path(), ws.path().join("out")).unwrap();
        symlink("a", ws.path().join("inside")).unwrap();
        std::fs::create_dir(ws.path().join("a")).unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        for p in ["out/secret", "inside/x", "out"] {
            let err = fs.read(p).unwrap_err().to_string();
            assert!(err.contains("is a symbolic link"), "{p}: {err}");
        }
        assert!(fs.write_atomic("out/new", b"x").is_err());
        assert!(fs.write_atomic("out", b"x").is_err());
        assert!(fs.create_dir_all("out/a/b").is_err());
        assert!(fs.rename("a", "out/a").is_err());
        fs.remove_all("out").unwrap();
        assert!(outside.path().join("secret").is_file());
        assert!(fs.relative(Path::new("../x")).is_err());
        assert!(fs.relative(Path::new("/etc/passwd")).is_err());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    }

    #[test]
    fn fifos_are_refused_without_blocking() {
        let (ws, _o, fs) = setup();
        let fifo = ws.path().join("plan.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let err = fs.read("plan.json").unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        assert!(fs.ensure_regular_file("plan.json").is_err());
    }
}
