//! The guest's filesystem: wasmtime-wasi's `wasi:filesystem/types`, with Trellis' own fences
//! in front of it.
//!
//! wasmtime-wasi already confines every path to a preopened folder and enforces read-only
//! grants. What it does not do, and this layer adds:
//!
//! - **No special files.** Opening a FIFO, socket or device is refused before the open: with
//!   `allow_blocking_current_thread` a blocking open of a FIFO would hold the runtime thread
//!   past every deadline. (Guests cannot create such files; a workspace may contain them.)
//!   The open itself never waits and is checked again through its descriptor, so a FIFO or a
//!   hard link put at the path after the check is refused too.
//! - **No links made by guests.** `symlink-at` and `link-at` are refused: a link inside a
//!   writable folder that points elsewhere only ever misleads a later reader, and no workflow
//!   needs one.
//! - **No reads or writes through hard links.** A file that has other hard links is not
//!   opened: one planted in a granted folder may be a file of a read-only folder or from
//!   outside every grant, which reading would disclose and writing would change. (In a
//!   writable folder it can still be replaced, by renaming a new file over it.)
//! - **A disk budget per call** ([`FsBudget`]): bytes written and files or folders created in
//!   read-write folders, and descriptors open at once. Going over it fails the operation with
//!   `quota` and is recorded, so the host reports the call as over its limit. A call of an
//!   agent turn also takes its bytes and files out of the turn's budget, shared by every call
//!   of the turn (and its database growth), so many calls cannot multiply the per-call one.
//! - **A depth limit** ([`FsLimits::folder_depth`]): no folder is made, or moved, more than
//!   that many levels below the granted folder it is in ([`depth`]), so a guest cannot grow
//!   a chain of folders deeper than the host's walks go, not even over many calls. Going past
//!   it is recorded and reported like the budget.
//!
//! Everything else is passed through unchanged.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use cap_primitives::fs::FollowSymlinks;
use wasmtime::component::{HasData, Linker, Resource};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemCtxView, WasiFilesystemView};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self, ErrorCode, HostDescriptor, HostDirectoryEntryStream,
};
use wasmtime_wasi::p2::{
    DynInputStream, DynOutputStream, FsError, FsResult, OutputStream, Pollable, ReaddirIterator,
    StreamError, StreamResult,
};

mod depth;
#[cfg(any(test, feature = "test-hooks"))]
pub(crate) mod hook;
mod open;

use depth::{FolderId, deeper_than, depth_below};
use open::open_unblocking;

/// How much one call may add to its read-write folders, and how many descriptors it may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsLimits {
    /// Bytes written (every write counts, overwrites included).
    pub write_bytes: u64,
    /// Files and folders created.
    pub created_entries: u64,
    /// Files and folders open at once.
    pub open_descriptors: u64,
    /// How many levels below its granted folder a folder may be (a folder made directly in
    /// it is one level below). Not per call: it bounds the tree, whoever made the rest.
    pub folder_depth: u64,
}

impl FsLimits {
    /// 1 GiB written, 10,000 files and folders created, 256 open at once, folders at most
    /// 256 levels below their granted folder.
    pub const DEFAULT: FsLimits = FsLimits {
        write_bytes: 1 << 30,
        created_entries: 10_000,
        open_descriptors: 256,
        folder_depth: 256,
    };
}

impl Default for FsLimits {
    fn default() -> Self {
        FsLimits::DEFAULT
    }
}

/// Which limit of [`FsLimits`] a call went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FsLimitExceeded {
    /// [`FsLimits::write_bytes`].
    #[error("wrote more than {0} bytes to its folders (the per-call limit)")]
    WriteBytes(u64),
    /// [`FsLimits::created_entries`].
    #[error("created more than {0} files and folders (the per-call limit)")]
    CreatedEntries(u64),
    /// [`FsLimits::open_descriptors`].
    #[error("held more than {0} files open at once (the per-call limit)")]
    OpenDescriptors(u64),
    /// [`FsLimits::folder_depth`].
    #[error("made a folder more than {0} levels below its granted folder (the depth limit)")]
    FolderDepth(u64),
    /// The write budget of the call's turn: its bytes written.
    #[error(
        "wrote more than {0} bytes to its folders together with the other calls of its turn \
         (the per-turn limit, --max-turn-write-mib)"
    )]
    TurnWriteBytes(u64),
    /// The write budget of the call's turn: its files and folders created.
    #[error(
        "created more than {0} files and folders together with the other calls of its turn \
         (the per-turn limit)"
    )]
    TurnCreatedEntries(u64),
    /// The write budget of the whole run: its bytes written.
    #[error(
        "wrote more than {0} bytes to its folders together with everything else of its run \
         (the per-run limit, --max-run-write-mib)"
    )]
    RunWriteBytes(u64),
    /// The write budget of the whole run: its files and folders created.
    #[error(
        "created more than {0} files and folders together with everything else of its run \
         (the per-run limit)"
    )]
    RunCreatedEntries(u64),
    /// The workspace's quota: what its folder may take on disk.
    #[error(
        "wrote more than what was left of the workspace's quota of {0} bytes on disk (its \
         folder as measured when the last run or call began, and what was written since; \
         --max-workspace-mib)"
    )]
    WorkspaceBytes(u64),
}

/// What a budget shared by several calls stands for: a turn's calls, or a whole run's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shared {
    /// The calls of one turn.
    Turn,
    /// Everything of one run: its turns, their sub-agents, its scripts.
    Run,
    /// Everything the runs of one workspace write, counted from what its folder took on
    /// disk when the last of them began ([`crate::slices::fs::quota`]).
    Workspace,
}

/// What one call has used of its [`FsLimits`]; shared with the output streams it opens.
#[derive(Debug)]
pub(crate) struct FsBudget {
    limits: FsLimits,
    written: AtomicU64,
    created: AtomicU64,
    /// The files and folders this call opened. A file stays open while anything holds it
    /// (its descriptor, or a stream that outlived the descriptor), so what counts is whether
    /// the handle is still alive, not which resources the guest has dropped.
    open: Mutex<Vec<Weak<std::fs::File>>>,
    exceeded: Mutex<Option<FsLimitExceeded>>,
    /// The granted folders, which [`FsLimits::folder_depth`] counts from.
    roots: Vec<FolderId>,
    /// The budget the call is part of (its turn's, whose own is the run's): what is written
    /// is taken out of it too.
    turn: Option<Arc<FsBudget>>,
    /// What this budget stands for when calls share it.
    shared: Shared,
}

impl FsBudget {
    /// A budget for a call that is granted no folder (its database writes, say).
    pub(crate) fn new(limits: FsLimits) -> Arc<Self> {
        FsBudget::for_folders(limits, Vec::new())
    }

    /// The budget of a call granted the folders `roots` (device and inode of each).
    pub(crate) fn for_folders(limits: FsLimits, roots: Vec<FolderId>) -> Arc<Self> {
        FsBudget::for_folders_in(limits, roots, None)
    }

    /// [`FsBudget::for_folders`], for a call whose writes also come out of `turn`.
    pub(crate) fn for_folders_in(
        limits: FsLimits,
        roots: Vec<FolderId>,
        turn: Option<Arc<FsBudget>>,
    ) -> Arc<Self> {
        FsBudget::build(limits, roots, turn, Shared::Turn)
    }

    fn build(
        limits: FsLimits,
        roots: Vec<FolderId>,
        turn: Option<Arc<FsBudget>>,
        shared: Shared,
    ) -> Arc<Self> {
        Arc::new(FsBudget {
            turn,
            shared,
            limits,
            written: AtomicU64::new(0),
            created: AtomicU64::new(0),
            open: Mutex::new(Vec::new()),
            exceeded: Mutex::new(None),
            roots,
        })
    }

    /// A budget shared by calls, standing for `shared`, within `parent` when it has one
    /// (a turn's within its run's).
    pub(crate) fn shared(
        limits: FsLimits,
        shared: Shared,
        parent: Option<Arc<FsBudget>>,
    ) -> Arc<Self> {
        FsBudget::build(limits, Vec::new(), parent, shared)
    }

    fn bytes_counter(&self) -> (&AtomicU64, u64) {
        (&self.written, self.limits.write_bytes)
    }

    fn entries_counter(&self) -> (&AtomicU64, u64) {
        (&self.created, self.limits.created_entries)
    }

    /// The error of this shared budget's bytes running out.
    fn bytes_exceeded(&self) -> FsLimitExceeded {
        match self.shared {
            Shared::Turn => FsLimitExceeded::TurnWriteBytes(self.limits.write_bytes),
            Shared::Run => FsLimitExceeded::RunWriteBytes(self.limits.write_bytes),
            Shared::Workspace => FsLimitExceeded::WorkspaceBytes(self.limits.write_bytes),
        }
    }

    /// The error of this shared budget's entries running out.
    fn entries_exceeded(&self) -> FsLimitExceeded {
        match self.shared {
            Shared::Turn => FsLimitExceeded::TurnCreatedEntries(self.limits.created_entries),
            Shared::Run | Shared::Workspace => {
                FsLimitExceeded::RunCreatedEntries(self.limits.created_entries)
            }
        }
    }

    /// Takes `n` from `counter` of each budget above this one (`which` picks the counter and
    /// its limit), all or none: the error of the first without room.
    fn take_above(
        &self,
        n: u64,
        which: fn(&FsBudget) -> (&AtomicU64, u64),
        exceeded: fn(&FsBudget) -> FsLimitExceeded,
    ) -> Result<(), FsLimitExceeded> {
        let Some(parent) = &self.turn else {
            return Ok(());
        };
        let (counter, limit) = which(parent);
        if !Self::take(counter, n, limit) {
            return Err(exceeded(parent));
        }
        parent.take_above(n, which, exceeded).inspect_err(|_| {
            counter.fetch_sub(n, Ordering::Relaxed);
        })
    }

    /// The first limit the call went over, if any.
    pub(crate) fn exceeded(&self) -> Option<FsLimitExceeded> {
        *self.exceeded.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn over(&self, which: FsLimitExceeded) -> ErrorCode {
        self.exceeded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(which);
        ErrorCode::Quota
    }

    /// Takes `n` from `counter` when that stays within `limit`; nothing is taken otherwise.
    fn take(counter: &AtomicU64, n: u64, limit: u64) -> bool {
        counter
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(n).filter(|total| *total <= limit)
            })
            .is_ok()
    }

    fn charge_bytes(&self, n: u64) -> Result<(), ErrorCode> {
        if !Self::take(&self.written, n, self.limits.write_bytes) {
            return Err(self.over(FsLimitExceeded::WriteBytes(self.limits.write_bytes)));
        }
        if let Err(which) = self.take_above(n, FsBudget::bytes_counter, FsBudget::bytes_exceeded) {
            self.written.fetch_sub(n, Ordering::Relaxed);
            return Err(self.over(which));
        }
        Ok(())
    }

    fn charge_entry(&self) -> Result<(), ErrorCode> {
        if !Self::take(&self.created, 1, self.limits.created_entries) {
            return Err(self.over(FsLimitExceeded::CreatedEntries(self.limits.created_entries)));
        }
        if let Err(which) =
            self.take_above(1, FsBudget::entries_counter, FsBudget::entries_exceeded)
        {
            self.created.fetch_sub(1, Ordering::Relaxed);
            return Err(self.over(which));
        }
        Ok(())
    }

    /// Counts `n` bytes as written, whatever was before: a workspace's budget when its folder
    /// was measured again.
    pub(crate) fn set_written(&self, n: u64) {
        self.written.store(n, Ordering::Relaxed);
    }

    /// Bytes this budget has left of its own, whatever the budgets above it have.
    pub(crate) fn own_bytes_left(&self) -> u64 {
        self.limits
            .write_bytes
            .saturating_sub(self.written.load(Ordering::Relaxed))
    }

    /// Bytes the call may still write (within its turn's budget too).
    pub(crate) fn write_bytes_left(&self) -> u64 {
        let own = self.own_bytes_left();
        self.turn
            .as_ref()
            .map_or(own, |turn| own.min(turn.write_bytes_left()))
    }

    /// Takes `n` bytes a write outside the filesystem made (the workflow database grew by
    /// them) out of the budget (and the turn's); whatever is left may still be written.
    pub(crate) fn charge_growth(&self, n: u64) {
        let _ = self.written.fetch_add(n, Ordering::Relaxed);
        if let Some(turn) = &self.turn {
            turn.charge_growth(n);
        }
    }

    /// A write outside the filesystem (the workflow database) ran into the write budget:
    /// the budget with the least left (the call's, its turn's or its run's) is the one named.
    pub(crate) fn note_write_limit(&self) {
        let mut which = FsLimitExceeded::WriteBytes(self.limits.write_bytes);
        let mut least = self.own_bytes_left();
        let mut above = self.turn.as_deref();
        while let Some(parent) = above {
            if parent.own_bytes_left() < least {
                least = parent.own_bytes_left();
                which = parent.bytes_exceeded();
            }
            above = parent.turn.as_deref();
        }
        let _ = self.over(which);
    }

    fn too_deep(&self) -> ErrorCode {
        self.over(FsLimitExceeded::FolderDepth(self.limits.folder_depth))
    }

    /// Whether one more file may be opened: the handles still alive are under the limit.
    fn check_open(&self) -> Result<(), ErrorCode> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|handle| handle.strong_count() > 0);
        if (open.len() as u64) < self.limits.open_descriptors {
            Ok(())
        } else {
            drop(open);
            Err(self.over(FsLimitExceeded::OpenDescriptors(
                self.limits.open_descriptors,
            )))
        }
    }

    fn track_open(&self, handle: &Arc<std::fs::File>) {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(handle));
    }
}

/// A store whose guests get the fenced filesystem.
pub(crate) trait GuardedFsView: WasiFilesystemView {
    fn fs_budget(&self) -> &Arc<FsBudget>;
}

/// Adds the WASI interfaces (`wasi:cli/imports`) to `linker`, with `wasi:filesystem/types`
/// replaced by the fenced one of this module.
pub(crate) fn add_wasi_to_linker<T: GuardedFsView + wasmtime_wasi::WasiView + 'static>(
    linker: &mut Linker<T>,
) -> anyhow::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    linker.allow_shadowing(true);
    let added = types::add_to_linker::<T, GuardedFsData>(linker, |state| {
        let budget = state.fs_budget().clone();
        GuardedFs {
            fs: state.filesystem(),
            budget,
        }
    });
    linker.allow_shadowing(false);
    Ok(added?)
}

struct GuardedFsData;

impl HasData for GuardedFsData {
    type Data<'a> = GuardedFs<'a>;
}

/// The fenced view handed to `wasi:filesystem/types` calls.
pub(crate) struct GuardedFs<'a> {
    fs: WasiFilesystemCtxView<'a>,
    budget: Arc<FsBudget>,
}

impl GuardedFs<'_> {
    /// Whether `fd` is a file or folder the guest may write to.
    fn writable(&mut self, fd: &Resource<Descriptor>) -> bool {
        match self.fs.table.get(fd) {
            Ok(Descriptor::File(f)) => !f.perms.write_not_permitted(),
            Ok(Descriptor::Dir(d)) => !d.perms.write_not_permitted(),
            Err(_) => false,
        }
    }

    /// Wraps the output stream `stream` so that what goes through it is charged.
    fn counted(
        &mut self,
        stream: Resource<DynOutputStream>,
    ) -> FsResult<Resource<DynOutputStream>> {
        let inner = self.fs.table.delete(stream)?;
        let counted: DynOutputStream = Box::new(CountedStream {
            inner,
            budget: self.budget.clone(),
        });
        Ok(self.fs.table.push(counted)?)
    }

    /// Refuses a folder made at `path` under `fd` deeper than [`FsLimits::folder_depth`].
    fn check_new_folder(&mut self, fd: &Resource<Descriptor>, path: &str) -> FsResult<()> {
        let Descriptor::Dir(dir) = self.fs.table.get(fd)? else {
            return Ok(());
        };
        match folder_depth(&dir.dir, path, &self.budget) {
            Depth::Beyond => Err(self.budget.too_deep().into()),
            Depth::Within(_) | Depth::Unknown => Ok(()),
        }
    }

    /// Refuses a rename of the folder `old_path` under `fd` to `new_path` under `new_fd` that
    /// takes a folder in it deeper than [`FsLimits::folder_depth`].
    fn check_moved_folder(
        &mut self,
        fd: &Resource<Descriptor>,
        old_path: &str,
        new_fd: &Resource<Descriptor>,
        new_path: &str,
    ) -> FsResult<()> {
        let (Descriptor::Dir(from), Descriptor::Dir(to)) =
            (self.fs.table.get(fd)?, self.fs.table.get(new_fd)?)
        else {
            return Ok(());
        };
        // Not a folder (a file, a link) or not there: nothing gets deeper, or the rename
        // itself fails and says why.
        let Ok(moved) = cap_primitives::fs::open_dir_nofollow(&from.dir, Path::new(old_path))
        else {
            return Ok(());
        };
        let limit = self.budget.limits.folder_depth;
        let target = match folder_depth(&to.dir, new_path, &self.budget) {
            Depth::Unknown => return Ok(()),
            Depth::Beyond => return Err(self.budget.too_deep().into()),
            Depth::Within(target) => target,
        };
        use std::os::fd::AsFd;
        if depth_below(moved.as_fd(), &self.budget.roots, limit).is_some_and(|now| target <= now) {
            // No folder in it goes deeper than it already is.
            return Ok(());
        }
        match deeper_than(moved.as_fd(), limit - target) {
            Ok(true) => Err(self.budget.too_deep().into()),
            Ok(false) => Ok(()),
            // A tree that cannot be read through is not moved deeper.
            Err(_) => Err(ErrorCode::Access.into()),
        }
    }

    /// Growth of the file `fd` that writing at `offset` makes before the first byte lands
    /// (a write past the end leaves a gap the file's length covers all the same).
    fn gap_before(&mut self, fd: &Resource<Descriptor>, offset: u64) -> u64 {
        match self.fs.table.get(fd) {
            Ok(Descriptor::File(f)) if !f.perms.write_not_permitted() => {
                let len = f.file.metadata().map(|m| m.len()).unwrap_or(0);
                offset.saturating_sub(len)
            }
            _ => 0,
        }
    }
}

impl types::Host for GuardedFs<'_> {
    fn convert_error_code(&mut self, err: FsError) -> wasmtime::Result<ErrorCode> {
        types::Host::convert_error_code(&mut self.fs, err)
    }

    fn filesystem_error_code(
        &mut self,
        err: Resource<wasmtime::Error>,
    ) -> wasmtime::Result<Option<ErrorCode>> {
        types::Host::filesystem_error_code(&mut self.fs, err)
    }
}

impl HostDirectoryEntryStream for GuardedFs<'_> {
    async fn read_directory_entry(
        &mut self,
        stream: Resource<ReaddirIterator>,
    ) -> FsResult<Option<types::DirectoryEntry>> {
        HostDirectoryEntryStream::read_directory_entry(&mut self.fs, stream).await
    }

    fn drop(&mut self, stream: Resource<ReaddirIterator>) -> wasmtime::Result<()> {
        HostDirectoryEntryStream::drop(&mut self.fs, stream)
    }
}

impl HostDescriptor for GuardedFs<'_> {
    async fn advise(
        &mut self,
        fd: Resource<Descriptor>,
        offset: types::Filesize,
        len: types::Filesize,
        advice: types::Advice,
    ) -> FsResult<()> {
        HostDescriptor::advise(&mut self.fs, fd, offset, len, advice).await
    }

    async fn sync_data(&mut self, fd: Resource<Descriptor>) -> FsResult<()> {
        HostDescriptor::sync_data(&mut self.fs, fd).await
    }

    async fn get_flags(&mut self, fd: Resource<Descriptor>) -> FsResult<types::DescriptorFlags> {
        HostDescriptor::get_flags(&mut self.fs, fd).await
    }

    async fn get_type(&mut self, fd: Resource<Descriptor>) -> FsResult<types::DescriptorType> {
        HostDescriptor::get_type(&mut self.fs, fd).await
    }

    async fn set_size(&mut self, fd: Resource<Descriptor>, size: types::Filesize) -> FsResult<()> {
        // Growing a file is writing to it, as far as the budget goes.
        if let Descriptor::File(f) = self.fs.table.get(&fd)?
            && !f.perms.write_not_permitted()
        {
            let current = f.file.metadata().map(|m| m.len()).unwrap_or(0);
            self.budget
                .charge_bytes(size.saturating_sub(current))
                .map_err(FsError::from)?;
        }
        HostDescriptor::set_size(&mut self.fs, fd, size).await
    }

    async fn set_times(
        &mut self,
        fd: Resource<Descriptor>,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        HostDescriptor::set_times(&mut self.fs, fd, atim, mtim).await
    }

    async fn read(
        &mut self,
        fd: Resource<Descriptor>,
        len: types::Filesize,
        offset: types::Filesize,
    ) -> FsResult<(Vec<u8>, bool)> {
        HostDescriptor::read(&mut self.fs, fd, len, offset).await
    }

    async fn write(
        &mut self,
        fd: Resource<Descriptor>,
        buf: Vec<u8>,
        offset: types::Filesize,
    ) -> FsResult<types::Filesize> {
        if self.writable(&fd) {
            let gap = self.gap_before(&fd, offset);
            self.budget
                .charge_bytes((buf.len() as u64).saturating_add(gap))?;
        }
        HostDescriptor::write(&mut self.fs, fd, buf, offset).await
    }

    async fn read_directory(
        &mut self,
        fd: Resource<Descriptor>,
    ) -> FsResult<Resource<types::DirectoryEntryStream>> {
        HostDescriptor::read_directory(&mut self.fs, fd).await
    }

    async fn sync(&mut self, fd: Resource<Descriptor>) -> FsResult<()> {
        HostDescriptor::sync(&mut self.fs, fd).await
    }

    async fn create_directory_at(
        &mut self,
        fd: Resource<Descriptor>,
        path: String,
    ) -> FsResult<()> {
        if self.writable(&fd) {
            self.check_new_folder(&fd, &path)?;
            self.budget.charge_entry()?;
        }
        HostDescriptor::create_directory_at(&mut self.fs, fd, path).await
    }

    async fn stat(&mut self, fd: Resource<Descriptor>) -> FsResult<types::DescriptorStat> {
        HostDescriptor::stat(&mut self.fs, fd).await
    }

    async fn stat_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: types::PathFlags,
        path: String,
    ) -> FsResult<types::DescriptorStat> {
        HostDescriptor::stat_at(&mut self.fs, fd, path_flags, path).await
    }

    async fn set_times_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        HostDescriptor::set_times_at(&mut self.fs, fd, path_flags, path, atim, mtim).await
    }

    async fn link_at(
        &mut self,
        _fd: Resource<Descriptor>,
        _old_path_flags: types::PathFlags,
        _old_path: String,
        _new_descriptor: Resource<Descriptor>,
        _new_path: String,
    ) -> FsResult<()> {
        Err(ErrorCode::NotPermitted.into())
    }

    async fn open_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        oflags: types::OpenFlags,
        flags: types::DescriptorFlags,
    ) -> FsResult<Resource<Descriptor>> {
        if let Descriptor::Dir(dir) = self.fs.table.get(&fd)? {
            let follow = if path_flags.contains(types::PathFlags::SYMLINK_FOLLOW) {
                FollowSymlinks::Yes
            } else {
                FollowSymlinks::No
            };
            // The stat goes through the same capability resolution as the open: it cannot
            // look outside the folder either. The last component is looked at without
            // following it first (one `statx`): only a link needs the second, following
            // look (an `O_PATH` open, a `statx` and a `close`).
            let path_ref = Path::new(&path);
            let stat = match cap_primitives::fs::stat(&dir.dir, path_ref, FollowSymlinks::No) {
                Ok(meta) if follow == FollowSymlinks::Yes && meta.file_type().is_symlink() => {
                    cap_primitives::fs::stat(&dir.dir, path_ref, follow)
                }
                other => other,
            };
            match stat {
                Ok(meta) => {
                    let kind = meta.file_type();
                    if !(kind.is_file() || kind.is_dir() || kind.is_symlink()) {
                        return Err(ErrorCode::Access.into());
                    }
                    // A file with other hard links may be one outside the folder or in a
                    // read-only one: reading it would disclose that file, writing it in
                    // place would change it.
                    if kind.is_file() && {
                        use cap_primitives::fs::MetadataExt;
                        meta.nlink() > 1
                    } {
                        return Err(ErrorCode::Access.into());
                    }
                }
                Err(err)
                    if err.kind() == std::io::ErrorKind::NotFound
                        && oflags.contains(types::OpenFlags::CREATE)
                        && !dir.perms.write_not_permitted() =>
                {
                    self.budget.charge_entry()?;
                }
                // Anything else is for the open itself to report.
                Err(_) => {}
            }
            #[cfg(any(test, feature = "test-hooks"))]
            hook::run(&dir.dir, &path);
        }
        self.budget.check_open()?;
        let opened = match self.fs.table.get(&fd)? {
            Descriptor::Dir(dir) => {
                let descriptor = open_unblocking(dir, path_flags, &path, oflags, flags)?;
                self.fs.table.push(descriptor)?
            }
            // Not a folder: wasmtime-wasi refuses it.
            Descriptor::File(_) => {
                HostDescriptor::open_at(&mut self.fs, fd, path_flags, path, oflags, flags).await?
            }
        };
        match self.fs.table.get(&opened)? {
            Descriptor::File(f) => self.budget.track_open(&f.file),
            Descriptor::Dir(d) => self.budget.track_open(&d.dir),
        }
        Ok(opened)
    }

    fn drop(&mut self, fd: Resource<Descriptor>) -> wasmtime::Result<()> {
        HostDescriptor::drop(&mut self.fs, fd)
    }

    async fn readlink_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<String> {
        HostDescriptor::readlink_at(&mut self.fs, fd, path).await
    }

    async fn remove_directory_at(
        &mut self,
        fd: Resource<Descriptor>,
        path: String,
    ) -> FsResult<()> {
        HostDescriptor::remove_directory_at(&mut self.fs, fd, path).await
    }

    async fn rename_at(
        &mut self,
        fd: Resource<Descriptor>,
        old_path: String,
        new_fd: Resource<Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        if self.writable(&new_fd) {
            self.check_moved_folder(&fd, &old_path, &new_fd, &new_path)?;
        }
        HostDescriptor::rename_at(&mut self.fs, fd, old_path, new_fd, new_path).await
    }

    async fn symlink_at(
        &mut self,
        _fd: Resource<Descriptor>,
        _src_path: String,
        _dest_path: String,
    ) -> FsResult<()> {
        Err(ErrorCode::NotPermitted.into())
    }

    async fn unlink_file_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<()> {
        HostDescriptor::unlink_file_at(&mut self.fs, fd, path).await
    }

    fn read_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<DynInputStream>> {
        HostDescriptor::read_via_stream(&mut self.fs, fd, offset)
    }

    fn write_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<DynOutputStream>> {
        let gap = self.gap_before(&fd, offset);
        self.budget.charge_bytes(gap).map_err(FsError::from)?;
        let stream = HostDescriptor::write_via_stream(&mut self.fs, fd, offset)?;
        self.counted(stream)
    }

    fn append_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
    ) -> FsResult<Resource<DynOutputStream>> {
        let stream = HostDescriptor::append_via_stream(&mut self.fs, fd)?;
        self.counted(stream)
    }

    async fn is_same_object(
        &mut self,
        a: Resource<Descriptor>,
        b: Resource<Descriptor>,
    ) -> wasmtime::Result<bool> {
        HostDescriptor::is_same_object(&mut self.fs, a, b).await
    }

    async fn metadata_hash(
        &mut self,
        fd: Resource<Descriptor>,
    ) -> FsResult<types::MetadataHashValue> {
        HostDescriptor::metadata_hash(&mut self.fs, fd).await
    }

    async fn metadata_hash_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: types::PathFlags,
        path: String,
    ) -> FsResult<types::MetadataHashValue> {
        HostDescriptor::metadata_hash_at(&mut self.fs, fd, path_flags, path).await
    }
}

/// How deep a folder at some path would be ([`folder_depth`]).
enum Depth {
    /// This many levels below its granted folder, within the limit.
    Within(u64),
    /// Past the limit.
    Beyond,
    /// The path names nothing that could be made (`.`, `..`) or its parent cannot be opened:
    /// the operation fails on its own and says why.
    Unknown,
}

/// The depth a folder at `path` under `dir` has: one more than its parent's, counted by
/// [`depth_below`] from the parent itself.
fn folder_depth(dir: &std::fs::File, path: &str, budget: &FsBudget) -> Depth {
    use std::os::fd::AsFd;
    let path = Path::new(path);
    if path.file_name().is_none() {
        return Depth::Unknown;
    }
    let parent = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => match cap_primitives::fs::open_dir(dir, parent) {
            Ok(opened) => Some(opened),
            Err(_) => return Depth::Unknown,
        },
        None => None,
    };
    let limit = budget.limits.folder_depth;
    match depth_below(parent.as_ref().unwrap_or(dir).as_fd(), &budget.roots, limit) {
        Some(depth) if depth < limit => Depth::Within(depth + 1),
        _ => Depth::Beyond,
    }
}

/// A file's output stream whose writes are charged to the call's budget.
struct CountedStream {
    inner: DynOutputStream,
    budget: Arc<FsBudget>,
}

impl CountedStream {
    fn charge(&self, n: usize) -> StreamResult<()> {
        self.budget.charge_bytes(n as u64).map_err(|_| {
            StreamError::LastOperationFailed(std::io::Error::from_raw_os_error(libc::EDQUOT).into())
        })
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CountedStream {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for CountedStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.charge(bytes.len())?;
        self.inner.write(bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.inner.check_write()
    }

    fn write_zeroes(&mut self, nelem: usize) -> StreamResult<()> {
        self.charge(nelem)?;
        self.inner.write_zeroes(nelem)
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_takes_nothing_past_a_limit_and_remembers_the_first() {
        let budget = FsBudget::new(FsLimits {
            write_bytes: 10,
            created_entries: 1,
            open_descriptors: 1,
            folder_depth: 1,
        });
        budget.charge_bytes(6).unwrap();
        assert_eq!(budget.charge_bytes(5), Err(ErrorCode::Quota));
        budget.charge_bytes(4).unwrap();
        assert_eq!(budget.exceeded(), Some(FsLimitExceeded::WriteBytes(10)));

        budget.charge_entry().unwrap();
        assert_eq!(budget.charge_entry(), Err(ErrorCode::Quota));

        // An open handle counts until the last holder lets it go.
        let file = Arc::new(tempfile::tempfile().unwrap());
        budget.check_open().unwrap();
        budget.track_open(&file);
        let stream_holder = file.clone();
        assert_eq!(budget.check_open(), Err(ErrorCode::Quota));
        drop(file);
        assert_eq!(budget.check_open(), Err(ErrorCode::Quota));
        drop(stream_holder);
        budget.check_open().unwrap();
        assert_eq!(
            budget.exceeded(),
            Some(FsLimitExceeded::WriteBytes(10)),
            "the first limit hit is the one reported"
        );
    }
}
