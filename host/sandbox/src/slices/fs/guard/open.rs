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

/// The open on its own, with no check before it: what it finds at the path is all it goes by.
#[cfg(test)]
mod tests {
    use super::*;
    use types::{DescriptorFlags, OpenFlags, PathFlags};
    use wasmtime_wasi::{FsPerms, OpenMode};

    struct World {
        dir: tempfile::TempDir,
    }

    impl World {
        fn new() -> World {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("granted")).unwrap();
            std::fs::create_dir_all(dir.path().join("outside")).unwrap();
            std::fs::write(dir.path().join("granted/file"), "regular").unwrap();
            std::fs::write(dir.path().join("outside/secret"), "outside secret").unwrap();
            World { dir }
        }

        fn path(&self, rel: &str) -> std::path::PathBuf {
            self.dir.path().join(rel)
        }

        fn granted(&self, perms: FsPerms) -> wasmtime_wasi::filesystem::Dir {
            let file = std::fs::File::open(self.path("granted")).unwrap();
            wasmtime_wasi::filesystem::Dir::new(file, perms, OpenMode::all(), true)
        }

        fn secret(&self) -> String {
            std::fs::read_to_string(self.path("outside/secret")).unwrap()
        }
    }

    fn truncate_for_writing() -> (OpenFlags, DescriptorFlags) {
        (
            OpenFlags::CREATE | OpenFlags::TRUNCATE,
            DescriptorFlags::WRITE,
        )
    }

    fn open(
        dir: &wasmtime_wasi::filesystem::Dir,
        path_flags: PathFlags,
        path: &str,
        (oflags, flags): (OpenFlags, DescriptorFlags),
    ) -> Result<Descriptor, ErrorCode> {
        open_unblocking(dir, path_flags, path, oflags, flags)
    }

    fn read() -> (OpenFlags, DescriptorFlags) {
        (OpenFlags::empty(), DescriptorFlags::READ)
    }

    #[test]
    fn a_fifo_is_opened_without_waiting_and_refused() {
        let world = World::new();
        let c_path = std::ffi::CString::new(world.path("granted/fifo").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
        let dir = world.granted(FsPerms::ReadWrite);
        // No writer ever opens it: a blocking open would never return. Opened for reading
        // without waiting, it is then refused as not a regular file; for writing, the kernel
        // itself refuses a FIFO no one reads (`ENXIO`, WASI's `io`).
        for (how, refusal) in [
            (read(), ErrorCode::Access),
            (truncate_for_writing(), ErrorCode::Io),
        ] {
            assert_eq!(
                open(&dir, PathFlags::empty(), "fifo", how).err(),
                Some(refusal)
            );
        }
    }

    #[test]
    fn a_file_with_another_hard_link_is_refused_before_it_is_truncated() {
        let world = World::new();
        std::fs::hard_link(world.path("outside/secret"), world.path("granted/twin")).unwrap();
        let dir = world.granted(FsPerms::ReadWrite);
        for how in [read(), truncate_for_writing()] {
            assert_eq!(
                open(&dir, PathFlags::empty(), "twin", how).err(),
                Some(ErrorCode::Access)
            );
        }
        assert_eq!(world.secret(), "outside secret");
    }

    #[test]
    fn a_link_out_of_the_folder_is_not_followed_out() {
        let world = World::new();
        std::os::unix::fs::symlink(world.path("outside/secret"), world.path("granted/abs"))
            .unwrap();
        std::os::unix::fs::symlink("../outside/secret", world.path("granted/rel")).unwrap();
        let dir = world.granted(FsPerms::ReadWrite);
        for name in ["abs", "rel"] {
            for how in [read(), truncate_for_writing()] {
                // Followed: cap-std's resolution stops at the folder's edge.
                assert_eq!(
                    open(&dir, PathFlags::SYMLINK_FOLLOW, name, how).err(),
                    Some(ErrorCode::NotPermitted),
                    "{name}"
                );
                // Not followed: the link itself is not opened.
                assert_eq!(
                    open(&dir, PathFlags::empty(), name, how).err(),
                    Some(ErrorCode::Loop),
                    "{name}"
                );
            }
        }
        assert_eq!(world.secret(), "outside secret");
    }

    #[test]
    fn a_regular_file_opens_and_truncates_and_a_read_only_folder_is_not_written() {
        let world = World::new();
        let dir = world.granted(FsPerms::ReadWrite);
        let Descriptor::File(file) =
            open(&dir, PathFlags::empty(), "file", truncate_for_writing()).unwrap()
        else {
            panic!("a file opens as a file");
        };
        assert_eq!(file.file.metadata().unwrap().len(), 0);
        // Back to blocking I/O once opened.
        use std::os::fd::AsRawFd;
        // SAFETY: F_GETFL on a descriptor the test holds.
        let fl = unsafe { libc::fcntl(file.file.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(fl & libc::O_NONBLOCK, 0);

        std::fs::write(world.path("granted/file"), "regular").unwrap();
        let read_only = world.granted(FsPerms::ReadOnly);
        assert_eq!(
            open(
                &read_only,
                PathFlags::empty(),
                "file",
                truncate_for_writing()
            )
            .err(),
            Some(ErrorCode::NotPermitted)
        );
        assert_eq!(
            std::fs::read_to_string(world.path("granted/file")).unwrap(),
            "regular"
        );
        assert_eq!(
            open(
                &dir,
                PathFlags::empty(),
                "file",
                (OpenFlags::DIRECTORY, DescriptorFlags::READ)
            )
            .err(),
            Some(ErrorCode::NotDirectory)
        );
    }
}
