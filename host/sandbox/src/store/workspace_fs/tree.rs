//! Removing and walking folder trees of any depth without recursion on the call stack.
//!
//! A workspace may hold a chain of folders tens of thousands deep (made outside the sandbox,
//! or by a guest over many calls): a recursive removal or walk would overflow the host's
//! stack, and every later run that rotates, prunes or empties that folder would abort. The
//! removal here keeps the path it is on as a list of names, not as stack frames or open
//! descriptors: it holds at most three descriptors at once, goes down one folder at a time
//! and comes back up through `..`, checking that the folder it reaches is the one it came
//! from (device and inode), so a folder moved meanwhile stops the removal instead of sending
//! it elsewhere. Links are never followed: a link is removed as a link.
//!
//! Walks ([`super::WorkspaceFs::walk`]: listings of what a run wrote) keep their pending
//! entries in a list too, and go at most [`MAX_WALK_DEPTH`] levels down: they name what they
//! list by path, and a path past that depth may be longer than the system takes.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// How many levels below its top a walk goes; folders deeper than that are not entered.
pub const MAX_WALK_DEPTH: usize = 256;

/// Non-folder entries removed per reading of a folder before it is read again: the names
/// waiting to be removed stay bounded however many files a folder has.
const BATCH: usize = 4096;

type Id = (u64, u64);

fn id_of(fd: impl AsFd) -> io::Result<Id> {
    let stat = rustix::fs::fstat(fd)?;
    Ok((stat.st_dev, stat.st_ino))
}

/// Opens the folder `name` in `dir` without following a link there.
fn open_dir_at(dir: impl AsFd, name: impl rustix::path::Arg) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

fn ignore_absent(result: rustix::io::Result<()>) -> io::Result<()> {
    match result {
        Err(rustix::io::Errno::NOENT) => Ok(()),
        other => Ok(other?),
    }
}

/// What one reading of a folder found ([`scan`]).
enum Scan {
    /// A folder in it, to go down into.
    Folder(CString),
    /// A full batch of other entries was removed: read it again.
    More,
    /// Nothing is left in it.
    Empty,
}

/// Reads `dir` once, up to its first folder: removes the entries before it that are not
/// folders (at most [`BATCH`]) and says what is left.
fn scan(dir: &OwnedFd) -> io::Result<Scan> {
    let mut entries = rustix::fs::Dir::read_from(dir)?;
    let mut files: Vec<CString> = Vec::new();
    let mut folder = None;
    while let Some(entry) = entries.read() {
        let entry = entry?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let kind = match entry.file_type() {
            FileType::Unknown => match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => FileType::from_raw_mode(stat.st_mode),
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            },
            kind => kind,
        };
        if kind == FileType::Directory {
            folder = Some(name.to_owned());
            break;
        }
        files.push(name.to_owned());
        if files.len() >= BATCH {
            break;
        }
    }
    drop(entries);
    let full = files.len() >= BATCH;
    for name in &files {
        ignore_absent(rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::empty()))?;
    }
    Ok(match folder {
        Some(name) => Scan::Folder(name),
        None if full => Scan::More,
        None => Scan::Empty,
    })
}

/// Removes the folder `name` of `parent` and everything in it, however deep, without
/// following links and without recursion (see the module header).
pub(crate) fn remove_dir_all(parent: impl AsFd, name: &OsStr) -> io::Result<()> {
    let top = open_dir_at(&parent, name)?;
    // The way down from `top`: each folder's name in its parent and that parent's identity.
    let mut way: Vec<(CString, Id)> = Vec::new();
    let mut current = top;
    loop {
        match scan(&current)? {
            Scan::More => {}
            Scan::Folder(child) => {
                let below = open_dir_at(&current, child.as_c_str())?;
                way.push((child, id_of(&current)?));
                current = below;
            }
            Scan::Empty => {
                let Some((child, parent_id)) = way.pop() else {
                    break;
                };
                let up = open_dir_at(&current, c"..")?;
                if id_of(&up)? != parent_id {
                    return Err(io::Error::other(
                        "a folder was moved while Trellis was removing the tree it was in; \
                         stopped",
                    ));
                }
                drop(current);
                ignore_absent(rustix::fs::unlinkat(
                    &up,
                    child.as_c_str(),
                    AtFlags::REMOVEDIR,
                ))?;
                current = up;
            }
        }
    }
    drop(current);
    Ok(rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)?)
}

/// What a folder tree takes on disk ([`disk_use`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskUse {
    /// Bytes allocated to its files and folders (a file with several links counted once).
    pub bytes: u64,
    /// Files, folders and other entries in it.
    pub entries: u64,
    /// Whether every entry was counted: `false` when the walk stopped at its entry limit.
    pub complete: bool,
}

/// Adds what the entries of `dir` take to `used`, counting a file with other links once
/// (by `seen`), and returns the names of the folders in it.
fn count_entries(
    dir: &OwnedFd,
    used: &mut DiskUse,
    seen: &mut std::collections::HashSet<Id>,
) -> io::Result<Vec<CString>> {
    let mut folders = Vec::new();
    let mut entries = rustix::fs::Dir::read_from(dir)?;
    while let Some(entry) = entries.read() {
        let entry = entry?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let stat = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        used.entries += 1;
        let kind = FileType::from_raw_mode(stat.st_mode);
        if kind != FileType::Directory
            && stat.st_nlink > 1
            && !seen.insert((stat.st_dev, stat.st_ino))
        {
            continue;
        }
        let bytes = u64::try_from(stat.st_blocks)
            .unwrap_or(0)
            .saturating_mul(512);
        used.bytes = used.bytes.saturating_add(bytes);
        if kind == FileType::Directory {
            folders.push(name.to_owned());
        }
    }
    Ok(folders)
}

/// What the tree of the folder `top` takes on disk, however deep, without following links
/// and without recursion: like [`remove_dir_all`], it holds the folder it is in and the
/// names still to visit on the way down, and comes back up through `..`, checking the folder
/// it reaches. It stops after `max_entries` entries (`complete` is then `false`).
pub(crate) fn disk_use(top: OwnedFd, max_entries: u64) -> io::Result<DiskUse> {
    let mut used = DiskUse {
        bytes: u64::try_from(rustix::fs::fstat(&top)?.st_blocks)
            .unwrap_or(0)
            .saturating_mul(512),
        entries: 0,
        complete: true,
    };
    let mut seen = std::collections::HashSet::new();
    // The way down: each folder above the current one, with the folders of it still to visit.
    let mut way: Vec<(Vec<CString>, Id)> = Vec::new();
    let mut current = top;
    let mut pending = count_entries(&current, &mut used, &mut seen)?;
    loop {
        if used.entries > max_entries {
            used.complete = false;
            return Ok(used);
        }
        if let Some(child) = pending.pop() {
            let below = match open_dir_at(&current, child.as_c_str()) {
                Ok(below) => below,
                // Gone, or replaced by something that is not a folder, since it was listed.
                Err(e) if e.raw_os_error().is_some_and(gone_or_not_a_folder) => continue,
                Err(e) => return Err(e),
            };
            way.push((std::mem::take(&mut pending), id_of(&current)?));
            current = below;
            pending = count_entries(&current, &mut used, &mut seen)?;
        } else {
            let Some((rest, parent_id)) = way.pop() else {
                return Ok(used);
            };
            let up = open_dir_at(&current, c"..")?;
            if id_of(&up)? != parent_id {
                return Err(io::Error::other(
                    "a folder was moved while Trellis was measuring the tree it was in",
                ));
            }
            current = up;
            pending = rest;
        }
    }
}

/// [`disk_use`] of the folder at `path` (itself not a link).
pub(crate) fn disk_use_at(path: &std::path::Path, max_entries: u64) -> io::Result<DiskUse> {
    disk_use(open_dir_at(rustix::fs::CWD, path)?, max_entries)
}

fn gone_or_not_a_folder(errno: i32) -> bool {
    [
        rustix::io::Errno::NOENT,
        rustix::io::Errno::NOTDIR,
        rustix::io::Errno::LOOP,
    ]
    .iter()
    .any(|e| e.raw_os_error() == errno)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain of `depth` folders named `d` under `dir`, made with `mkdirat` one level at a
    /// time (the whole path would be longer than the system takes), with a file at the
    /// bottom and a link to `dir`'s parent on the way.
    fn chain(dir: &std::path::Path, depth: usize) {
        let mut current = open_dir_at(rustix::fs::CWD, dir).unwrap();
        for level in 0..depth {
            rustix::fs::mkdirat(&current, c"d", Mode::from_raw_mode(0o755)).unwrap();
            if level == depth / 2 {
                rustix::fs::symlinkat(c"../../../..", &current, c"up").unwrap();
                let file = rustix::fs::openat(
                    &current,
                    c"f",
                    OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                )
                .unwrap();
                drop(file);
            }
            current = open_dir_at(&current, c"d").unwrap();
        }
    }

    #[test]
    fn a_chain_deeper_than_any_stack_is_removed_and_links_are_not_followed() {
        let outer = tempfile::tempdir().unwrap();
        let keep = outer.path().join("keep.txt");
        std::fs::write(&keep, "kept").unwrap();
        let top = outer.path().join("tree");
        std::fs::create_dir(&top).unwrap();
        // Deep enough to overflow the small stack below with any recursion.
        chain(&top, 5_000);
        let parent = open_dir_at(rustix::fs::CWD, outer.path()).unwrap();
        // On a thread with a small stack: nothing of the depth is on it.
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || remove_dir_all(&parent, OsStr::new("tree")).unwrap())
            .unwrap()
            .join()
            .unwrap();
        assert!(!top.exists());
        assert_eq!(std::fs::read_to_string(&keep).unwrap(), "kept");
    }

    #[test]
    fn a_folder_of_more_files_than_a_batch_is_emptied() {
        let outer = tempfile::tempdir().unwrap();
        let top = outer.path().join("wide");
        std::fs::create_dir_all(top.join("sub")).unwrap();
        for i in 0..(BATCH + 10) {
            std::fs::write(top.join(format!("f{i}")), "").unwrap();
        }
        let parent = open_dir_at(rustix::fs::CWD, outer.path()).unwrap();
        remove_dir_all(&parent, OsStr::new("wide")).unwrap();
        assert!(!top.exists());
    }
    #[test]
    fn disk_use_measures_a_chain_deeper_than_any_stack() {
        let outer = tempfile::tempdir().unwrap();
        let top = outer.path().join("tree");
        std::fs::create_dir(&top).unwrap();
        chain(&top, 3_000);
        let measure =
            move || disk_use(open_dir_at(rustix::fs::CWD, &top).unwrap(), u64::MAX).unwrap();
        let used = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(measure)
            .unwrap()
            .join()
            .unwrap();
        assert!(used.complete);
        // 3,000 folders, and a file and a link halfway down.
        assert_eq!(used.entries, 3_002);
        let capped = disk_use(open_dir_at(rustix::fs::CWD, outer.path()).unwrap(), 100).unwrap();
        assert!(!capped.complete);
    }

    #[test]
    fn disk_use_counts_a_file_of_several_links_once_and_follows_no_link() {
        let outer = tempfile::tempdir().unwrap();
        let top = outer.path().join("tree");
        std::fs::create_dir(&top).unwrap();
        std::fs::write(outer.path().join("big"), vec![1u8; 4 << 20]).unwrap();
        std::fs::write(top.join("one"), vec![1u8; 1 << 20]).unwrap();
        let measure = || disk_use(open_dir_at(rustix::fs::CWD, &top).unwrap(), u64::MAX).unwrap();
        let alone = measure();
        assert!(alone.bytes >= 1 << 20, "{alone:?}");
        std::fs::hard_link(top.join("one"), top.join("two")).unwrap();
        std::os::unix::fs::symlink(outer.path(), top.join("out")).unwrap();
        let linked = measure();
        assert_eq!(linked.entries, 3);
        assert!(
            linked.bytes < alone.bytes + (1 << 20),
            "{alone:?} {linked:?}"
        );
    }
}
