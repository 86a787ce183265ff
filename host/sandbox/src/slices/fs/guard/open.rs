//! The guard's own open of a path under a granted folder: what wasmtime-wasi's `open-at` does,
//! without waiting on what is found and checked again through the descriptor it got.

use std::path::Path;

use cap_primitives::fs::FollowSymlinks;
use wasmtime_wasi::filesystem::Descriptor;
use wasmtime_wasi::p2::bindings::filesystem::types::{self, ErrorCode};

/// Opens `path` under `dir` as wasmtime-wasi's `open-at` does, but closes the gap between the
/// check of the path in [`GuardedFs::open_at`] and the open (something else may be put at the
/// path in between): the open never waits (`O_NONBLOCK`: a FIFO found there now is opened at
/// once, not waited on, with the runtime thread held past every deadline), and what was
/// opened is checked again through its descriptor, before any truncation, with the same rules.
pub(super) fn open_unblocking(
    dir: &wasmtime_wasi::filesystem::Dir,
    path_flags: types::PathFlags,
    path: &str,
    oflags: types::OpenFlags,
    flags: types::DescriptorFlags,
) -> Result<Descriptor, ErrorCode> {
    use cap_primitives::fs::{OpenOptions, OpenOptionsExt};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    use types::{DescriptorFlags, OpenFlags};
    use wasmtime_wasi::OpenMode;

    let mut opts = OpenOptions::new();
    let mut mode = OpenMode::empty();
    let create = oflags.contains(OpenFlags::CREATE);
    let truncate = oflags.contains(OpenFlags::TRUNCATE);
    if create {
        if oflags.contains(OpenFlags::EXCLUSIVE) {
            opts.create_new(true);
        } else {
            opts.create(true);
        }
    }
    if create || truncate || flags.contains(DescriptorFlags::WRITE) {
        opts.write(true);
        mode |= OpenMode::WRITE;
    }
    if flags.contains(DescriptorFlags::READ) || !flags.contains(DescriptorFlags::WRITE) {
        // As wasmtime-wasi: opened for reading unless only for writing.
        opts.read(true);
        mode |= OpenMode::READ;
    }
    // The `follow` of cap-fs-ext's `OpenOptionsFollowExt`, without that crate.
    opts._cap_fs_ext_follow(if path_flags.contains(types::PathFlags::SYMLINK_FOLLOW) {
        FollowSymlinks::Yes
    } else {
        FollowSymlinks::No
    });
    if flags.intersects(
        DescriptorFlags::FILE_INTEGRITY_SYNC
            | DescriptorFlags::DATA_INTEGRITY_SYNC
            | DescriptorFlags::REQUESTED_WRITE_SYNC,
    ) {
        return Err(ErrorCode::Unsupported);
    }
    let directory = oflags.contains(OpenFlags::DIRECTORY);
    if directory && (create || oflags.contains(OpenFlags::EXCLUSIVE) || truncate) {
        return Err(ErrorCode::Invalid);
    }
    if dir.perms.write_not_permitted() && mode.contains(OpenMode::WRITE) {
        return Err(ErrorCode::NotPermitted);
    }
    opts.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    let file = cap_primitives::fs::open(&dir.dir, Path::new(path), &opts)?;
    let meta = file.metadata()?;
    let kind = meta.file_type();
    if !(kind.is_file() || kind.is_dir()) {
        return Err(ErrorCode::Access);
    }
    if directory && !kind.is_dir() {
        return Err(ErrorCode::NotDirectory);
    }
    // Created now or not, a file with other hard links is neither read nor written.
    if kind.is_file() && meta.nlink() > 1 {
        return Err(ErrorCode::Access);
    }
    // Back to blocking I/O. Of the flags F_SETFL can change, only O_NONBLOCK was set (the
    // open never asks for O_APPEND), so setting none clears it in one call.
    // SAFETY: F_SETFL on a descriptor this function owns.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, 0) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    if truncate && kind.is_file() {
        file.set_len(0)?;
    }
    // Every context this guard fronts lets filesystem calls block the calling thread
    // (`Grant::wasi_builder`), as the descriptors wasmtime-wasi opens itself do.
    Ok(if kind.is_dir() {
        Descriptor::Dir(wasmtime_wasi::filesystem::Dir::new(
            file, dir.perms, mode, true,
        ))
    } else {
        Descriptor::File(wasmtime_wasi::filesystem::File::new(
            file, dir.perms, mode, true,
        ))
    })
}
