//! Capability grants: what one plugin call may see and how much it may use.
//!
//! A [`Grant`] lists folders, each read-only or read-write, and maps each into
//! the guest as a preopened directory at a workspace-relative guest path. The
//! guest gets no environment variables, no arguments, no sockets and no other
//! files: what is not granted does not exist for it. [`Limits`] bound memory,
//! time and output of one call.

use std::path::{Component as PathComponent, Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

use anyhow::{Context, Result, bail};
use wasmtime_wasi::cli::StdoutStream;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

pub use crate::slices::db::sql;
pub use crate::slices::db::{DbWriteBudget, HostDb, SqlParam};
pub use crate::slices::fs::guard::{FsLimitExceeded, FsLimits};

/// Whether a granted folder can be changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Files can be read and listed, nothing can be created, changed or removed.
    ReadOnly,
    /// Files can be read, created, changed and removed.
    ReadWrite,
}

/// One folder of a grant.
#[derive(Debug, Clone)]
pub struct FolderGrant {
    /// The folder on the host.
    pub host: PathBuf,
    /// Where the guest sees it: an absolute, normalized guest path such as
    /// `/runs/iteration-0/execution/step-1`.
    pub guest: String,
    /// What the guest may do there.
    pub access: Access,
    /// Device and inode of the folder when it was granted: the folder preopened for a call
    /// must be this one, not something swapped in at its path since.
    identity: Option<(u64, u64)>,
    /// The folder, opened and checked by the first call under this grant (or a clone of it):
    /// the later calls of a turn preopen the same directory without opening and checking its
    /// path again, and a folder put in its place since is never seen by them.
    opened: Arc<OnceLock<std::fs::File>>,
}

impl PartialEq for FolderGrant {
    fn eq(&self, other: &Self) -> bool {
        (&self.host, &self.guest, self.access, self.identity)
            == (&other.host, &other.guest, other.access, other.identity)
    }
}

impl Eq for FolderGrant {}

/// Access to the workflow database through the `workflow-db` host interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbGrant {
    /// The SQLite file.
    pub path: PathBuf,
    /// Whether statements that modify the database may run.
    pub writable: bool,
}

/// Everything one plugin call may reach. The default grant reaches nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    folders: Vec<FolderGrant>,
    db: Option<DbGrant>,
    /// Each call checks that each folder is still at its path ([`Grant::rechecked_every_call`]).
    recheck: bool,
    /// The write budget of the turn the call is part of ([`Grant::with_turn_writes`]).
    turn_writes: Option<DbWriteBudget>,
    /// The folder a call starts in, a guest path ([`Grant::with_home`]).
    home: Option<String>,
}

impl Grant {
    /// A grant with no folders and no database.
    pub fn none() -> Self {
        Grant::default()
    }

    /// Adds `host` as a read-only folder seen at `guest`.
    pub fn read(self, host: impl Into<PathBuf>, guest: &str) -> Result<Self> {
        self.folder(host.into(), guest, Access::ReadOnly)
    }

    /// Adds `host` as a read-write folder seen at `guest`.
    pub fn write(self, host: impl Into<PathBuf>, guest: &str) -> Result<Self> {
        self.folder(host.into(), guest, Access::ReadWrite)
    }

    /// Adds a folder. A guest path that is already granted is replaced, so a
    /// later, narrower decision about the same folder wins.
    pub fn folder(mut self, host: PathBuf, guest: &str, access: Access) -> Result<Self> {
        let guest = normalize_guest_path(guest)?;
        self.folders.retain(|f| f.guest != guest);
        let identity = std::fs::metadata(&host)
            .ok()
            .filter(|m| m.is_dir())
            .map(|m| (m.dev(), m.ino()));
        self.folders.push(FolderGrant {
            host,
            guest,
            access,
            identity,
            opened: Arc::default(),
        });
        Ok(self)
    }

    /// Makes `guest` (a granted folder, such as a step's output folder) the folder the
    /// call starts in: the bundled shell's working folder.
    pub fn with_home(mut self, guest: &str) -> Result<Self> {
        self.home = Some(normalize_guest_path(guest)?);
        Ok(self)
    }

    /// The folder a call starts in: the one [`Grant::with_home`] named, else the first
    /// read-write folder, else the first folder, else `/`.
    pub fn home(&self) -> &str {
        self.home
            .as_deref()
            .or_else(|| {
                let writable = self.folders.iter().find(|f| f.access == Access::ReadWrite);
                writable.or(self.folders.first()).map(|f| f.guest.as_str())
            })
            .unwrap_or("/")
    }

    /// Gives the call the workflow database.
    pub fn with_db(mut self, path: impl Into<PathBuf>, writable: bool) -> Self {
        self.db = Some(DbGrant {
            path: path.into(),
            writable,
        });
        self
    }

    /// A grant whose every call also checks that each folder is still at its path (one
    /// `lstat` per folder): for a long-lived grant, such as a server's, where a folder renamed
    /// away and another made at its path must be refused rather than served from where it went.
    pub fn rechecked_every_call(mut self) -> Grant {
        self.recheck = true;
        self
    }

    /// The granted folders, in the order they were added.
    pub fn folders(&self) -> &[FolderGrant] {
        &self.folders
    }

    /// Device and inode of each granted folder: of the folder preopened for the calls when
    /// one was, else of the folder the grant was made with.
    pub(crate) fn folder_identities(&self) -> Vec<(u64, u64)> {
        self.folders
            .iter()
            .filter_map(|f| {
                f.opened
                    .get()
                    .and_then(|file| file.metadata().ok())
                    .map(|m| (m.dev(), m.ino()))
                    .or(f.identity)
            })
            .collect()
    }

    /// The same grant for a call of a turn whose calls share `budget`: what the call writes
    /// to its folders (bytes, files and folders made) comes out of it too, on top of the
    /// call's own [`FsLimits`].
    pub fn with_turn_writes(mut self, budget: &DbWriteBudget) -> Self {
        self.turn_writes = Some(budget.clone());
        self
    }

    /// The turn's write budget the calls take from, if any.
    pub(crate) fn turn_writes(&self) -> Option<&DbWriteBudget> {
        self.turn_writes.as_ref()
    }

    /// The database grant, if any.
    pub fn db(&self) -> Option<&DbGrant> {
        self.db.as_ref()
    }

    /// The WASI context builder of one call: the granted folders as preopens, the given
    /// stdout/stderr sinks, and nothing else. Callers may add to it (a step script gets an
    /// environment, arguments and a working directory).
    pub(crate) fn wasi_builder(
        &self,
        stdout: impl StdoutStream + 'static,
        stderr: impl StdoutStream + 'static,
    ) -> Result<WasiCtxBuilder> {
        let mut builder = WasiCtxBuilder::new();
        builder
            .stdout(stdout)
            .stderr(stderr)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }))
            // Granted folders are local and tool calls short: doing each filesystem
            // operation on the calling thread instead of handing it to tokio's
            // blocking pool cuts a small read from ~390 us to tens of microseconds.
            // Must be set before the preopens, which capture it.
            .allow_blocking_current_thread(true);
        for folder in &self.folders {
            let perms = match folder.access {
                Access::ReadOnly => FsPerms::ReadOnly,
                Access::ReadWrite => FsPerms::ReadWrite,
            };
            let granting = || {
                format!(
                    "granting folder {} (seen as {})",
                    folder.host.display(),
                    folder.guest
                )
            };
            let opened = folder.opened(self.recheck).with_context(granting)?;
            // wasmtime-wasi opens preopens by path. Naming the folder through the descriptor
            // checked when it was opened, rather than by its path again, leaves no moment in
            // which another folder (or a link) could be put in its place.
            let path = descriptor_path(opened.as_raw_fd()).with_context(granting)?;
            builder
                .preopened_dir(&path, &folder.guest, perms)
                .map_err(anyhow::Error::from)
                .with_context(granting)?;
        }
        Ok(builder)
    }
}

/// Why a folder is refused when another is at its path now.
const REPLACED: &str = "the folder was replaced since it was granted (moved or deleted, and \
                        something else put at its path); refusing to open what is there now: \
                        grant it again (a new turn does; `trellis mcp serve` needs a restart)";

/// The path naming descriptor `fd` of this process: under `/proc/self/fd`, else `/dev/fd`
/// (which one exists is looked up once). Without either there is no way to preopen a folder
/// without naming it by its path again: refuse.
fn descriptor_path(fd: std::os::fd::RawFd) -> Result<PathBuf> {
    static FD_DIR: OnceLock<Option<&'static str>> = OnceLock::new();
    let dir = FD_DIR.get_or_init(|| {
        ["/proc/self/fd", "/dev/fd"]
            .into_iter()
            .find(|dir| Path::new(dir).is_dir())
    });
    match dir {
        Some(dir) => Ok(PathBuf::from(format!("{dir}/{fd}"))),
        None => bail!(
            "neither /proc/self/fd nor /dev/fd is available: Trellis opens granted folders \
             through them (mount /proc)"
        ),
    }
}

impl FolderGrant {
    /// The folder opened and checked, by this call or an earlier one under the same grant;
    /// with `recheck`, also still the folder at its path.
    fn opened(&self, recheck: bool) -> Result<&std::fs::File> {
        if let Some(file) = self.opened.get() {
            let meta = file.metadata()?;
            // A folder deleted since (one `fstat`): its calls would each fail on paths that
            // cannot exist, or be told nothing is there. Say what happened instead.
            if meta.nlink() == 0 {
                bail!(
                    "the folder was deleted since it was granted (a folder made at its path \
                     since is not the one granted); grant it again: a new turn does, a \
                     long-lived grant such as `trellis mcp serve`'s needs a restart"
                );
            }
            if recheck {
                let now = std::fs::symlink_metadata(&self.host).ok();
                if !now
                    .is_some_and(|m| m.is_dir() && (m.dev(), m.ino()) == (meta.dev(), meta.ino()))
                {
                    bail!(REPLACED);
                }
            }
            return Ok(file);
        }
        let file = self.open_checked()?;
        // Two calls may open it at once: one of the two checked descriptors is kept.
        Ok(self.opened.get_or_init(|| file))
    }

    /// Opens the folder, checking that it is still the one granted: a directory, not a
    /// symbolic link, with the device and inode it had when the grant was made.
    fn open_checked(&self) -> Result<std::fs::File> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&self.host)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP) => anyhow::anyhow!(
                    "it must be an existing directory, not a symbolic link or a file: {e}"
                ),
                // Out of descriptors, say: the folder is not to blame.
                _ => anyhow::anyhow!("opening it failed: {e}"),
            })?;
        let meta = file.metadata()?;
        if let Some(identity) = self.identity
            && identity != (meta.dev(), meta.ino())
        {
            bail!(REPLACED);
        }
        Ok(file)
    }
}

/// Normalizes a guest path to `/a/b`: absolute, no `.` or `..`, no trailing slash.
pub fn normalize_guest_path(guest: &str) -> Result<String> {
    let mut parts = Vec::new();
    for part in Path::new(guest).components() {
        match part {
            PathComponent::RootDir | PathComponent::CurDir => {}
            PathComponent::Normal(p) => parts.push(
                p.to_str()
                    .with_context(|| format!("guest path {guest:?} is not UTF-8"))?,
            ),
            PathComponent::ParentDir | PathComponent::Prefix(_) => {
                bail!("guest path {guest:?} must not contain `..`")
            }
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// Resolves `relative` (a workspace-relative folder, as written in a plan or on
/// the command line) inside `root`, refusing anything that would leave it or
/// hide where it is: absolute paths, `..`, and symbolic links anywhere on the way.
///
/// The check goes through [`crate::store::WorkspaceFs`]; the canonical host path
/// is returned for the grant.
pub fn resolve_in_root(root: &Path, relative: &str) -> Result<PathBuf> {
    let fs = crate::store::WorkspaceFs::open(root)?;
    resolve_in(&fs, relative)
}

/// [`resolve_in_root`] through a workspace already opened (a turn's grant resolves several
/// folders through one).
pub fn resolve_in(fs: &crate::store::WorkspaceFs, relative: &str) -> Result<PathBuf> {
    let root = fs.root();
    let rel = Path::new(relative);
    if rel.is_absolute() {
        bail!("{relative:?} must be a path relative to {}", root.display());
    }
    if rel
        .components()
        .any(|c| matches!(c, PathComponent::ParentDir))
    {
        bail!("{relative:?} must not contain `..`");
    }
    // No link anywhere on the way, whether it leads out or stays inside: a grant names the
    // folder it shows.
    match fs.kind(rel) {
        Ok(Some(crate::store::Kind::Dir)) => {}
        Ok(Some(crate::store::Kind::Link)) => bail!(
            "{relative:?}: {}",
            crate::store::workspace_fs::link_error(rel)
        ),
        Ok(Some(_)) => bail!("{relative:?} is not a folder"),
        Ok(None) => bail!("{relative:?} is not a folder inside {}", root.display()),
        Err(e) => bail!("{relative:?}: {e}"),
    }
    // With no link on the way, the folder's canonical path is the workspace's joined with it.
    Ok(fs.canonical_path(&fs.relative(rel)?))
}

/// Bounds on one plugin call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest total of the instance's linear memories and tables (all of them
    /// together, a table element counted as a pointer), in bytes.
    pub memory_bytes: usize,
    /// Wall-clock deadline for the call, guest code and host calls included.
    pub timeout: Duration,
    /// Largest result (JSON text) the call may return, in bytes.
    pub output_bytes: usize,
    /// How much of the guest's stdout and of its stderr is kept, each, in bytes;
    /// the rest is counted and dropped.
    pub stdio_bytes: usize,
    /// What the call may add to its read-write folders and hold open.
    pub fs: FsLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 256 << 20,
            timeout: Duration::from_secs(30),
            output_bytes: 4 << 20,
            stdio_bytes: 64 << 10,
            fs: FsLimits::DEFAULT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_paths_are_normalized() {
        assert_eq!(normalize_guest_path("a/./b/").unwrap(), "/a/b");
        assert_eq!(normalize_guest_path("/").unwrap(), "/");
        assert!(normalize_guest_path("a/../../b").is_err());
    }

    #[test]
    fn a_later_grant_of_the_same_folder_replaces_the_earlier() {
        let grant = Grant::none()
            .write("/tmp", "/x")
            .unwrap()
            .read("/tmp", "x/")
            .unwrap();
        assert_eq!(grant.folders().len(), 1);
        assert_eq!(grant.folders()[0].access, Access::ReadOnly);
    }

    #[test]
    fn resolving_refuses_to_leave_the_root() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("inside")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("escape")).unwrap();

        assert!(resolve_in_root(root.path(), "inside").is_ok());
        for bad in ["../", "/etc", "inside/../../x", "escape", "missing"] {
            assert!(resolve_in_root(root.path(), bad).is_err(), "{bad} accepted");
        }
    }
}
