//! How deep a folder is below the granted folder it is in, for [`super::FsLimits::folder_depth`].
//!
//! The depth is counted on the folders themselves, not on the path the guest gave: from the
//! folder, up through `..` (the host's own lookups, outside the guest's reach) until a
//! granted folder is met, at most one level past the limit. A folder whose way up meets no
//! granted folder within that is as good as too deep. Renames are counted too: a folder
//! moved deeper than it was may not take folders under it past the limit, so chains made in
//! several pieces, or over several calls, cannot be joined into a deeper one.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// Device and inode of a folder.
pub(crate) type FolderId = (u64, u64);

pub(crate) fn id_of(fd: impl AsFd) -> io::Result<FolderId> {
    let stat = rustix::fs::fstat(fd)?;
    Ok((stat.st_dev, stat.st_ino))
}

fn open_dir_at(dir: impl AsFd, name: impl rustix::path::Arg) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Levels from `dir` up to the nearest of `roots` (0 when `dir` is one of them); `None` when
/// none is met within `limit` levels, or the way up cannot be followed.
pub(super) fn depth_below(dir: BorrowedFd<'_>, roots: &[FolderId], limit: u64) -> Option<u64> {
    let mut id = id_of(dir).ok()?;
    let mut up: Option<OwnedFd> = None;
    for depth in 0..=limit {
        if roots.contains(&id) {
            return Some(depth);
        }
        let next = open_dir_at(up.as_ref().map_or(dir, |fd| fd.as_fd()), c"..").ok()?;
        let next_id = id_of(&next).ok()?;
        if next_id == id {
            // The top of the file system: no granted folder above.
            return None;
        }
        id = next_id;
        up = Some(next);
    }
    None
}

/// Whether the tree under `dir` has a folder more than `allowed` levels below `dir` (its own
/// folders are one level below it). Reads at most `allowed + 1` levels down and holds one
/// open folder per level it is in.
pub(super) fn deeper_than(dir: BorrowedFd<'_>, allowed: u64) -> io::Result<bool> {
    // Opened again for reading: `dir` may be an `O_PATH` descriptor, which cannot be listed.
    let mut levels: Vec<rustix::fs::Dir> = vec![rustix::fs::Dir::new(open_dir_at(dir, c".")?)?];
    loop {
        let level = levels.len() as u64;
        let Some(current) = levels.last_mut() else {
            return Ok(false);
        };
        let Some(entry) = current.read() else {
            levels.pop();
            continue;
        };
        let entry = entry?;
        let name: CString = entry.file_name().to_owned();
        if name.as_bytes() == b"." || name.as_bytes() == b".." {
            continue;
        }
        let fd = current.fd()?;
        let kind = match entry.file_type() {
            FileType::Unknown => {
                match rustix::fs::statat(fd, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(stat) => FileType::from_raw_mode(stat.st_mode),
                    Err(_) => continue,
                }
            }
            kind => kind,
        };
        if kind != FileType::Directory {
            continue;
        }
        if level > allowed {
            return Ok(true);
        }
        let below = open_dir_at(fd, name.as_c_str())?;
        levels.push(rustix::fs::Dir::new(below)?);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_is_counted_up_to_the_nearest_granted_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b/c/d")).unwrap();
        let root = open_dir_at(rustix::fs::CWD, dir.path()).unwrap();
        let roots = [id_of(&root).unwrap()];
        let open = |rel: &str| open_dir_at(rustix::fs::CWD, dir.path().join(rel)).unwrap();
        assert_eq!(depth_below(root.as_fd(), &roots, 256), Some(0));
        assert_eq!(depth_below(open("a/b/c").as_fd(), &roots, 256), Some(3));
        assert_eq!(depth_below(open("a/b/c/d").as_fd(), &roots, 3), None);
        // Nothing granted above: as good as too deep.
        assert_eq!(depth_below(open("a").as_fd(), &[], 256), None);

        let a = open("a");
        assert!(!deeper_than(a.as_fd(), 3).unwrap());
        assert!(deeper_than(a.as_fd(), 2).unwrap());
        assert!(!deeper_than(open("a/b/c/d").as_fd(), 0).unwrap());
    }
}
