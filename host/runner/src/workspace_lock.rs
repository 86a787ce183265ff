//! One process per workspace at a time: an exclusive OS lock (`flock`) taken on the
//! workspace folder itself, so that locking writes no file in the workspace.
//!
//! The lock belongs to the open file description: it is released when the
//! [`WorkspaceLock`] is dropped, and by the OS when its process dies (a killed run leaves
//! no stale lock behind). The holder is named from `/proc/locks` (the pid holding a FLOCK
//! on the folder's device and inode), `/proc/<pid>/cmdline` and `/proc/<pid>/stat`.

use std::fs::{File, TryLockError};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};

/// How often a waiting process tries the lock again.
const WAIT_POLL: Duration = Duration::from_millis(100);

/// The exclusive lock of one workspace, held until dropped.
#[derive(Debug)]
pub struct WorkspaceLock {
    _folder: File,
}

/// Another process holds the workspace's lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its pid, when `/proc/locks` names it.
    pub pid: Option<u32>,
    /// When it started (RFC 3339, UTC), when `/proc` tells.
    pub started: Option<String>,
    /// Its command line, when `/proc` tells.
    pub command: Option<String>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pid {
            Some(pid) => write!(f, "pid {pid}")?,
            None => f.write_str("another process")?,
        }
        if let Some(started) = &self.started {
            write!(f, ", started {started}")?;
        }
        if let Some(command) = &self.command {
            write!(f, ", running `{command}`")?;
        }
        Ok(())
    }
}

impl WorkspaceLock {
    /// Takes the lock of `workspace` if no other holder has it; otherwise an error naming
    /// the holder.
    pub fn try_acquire(workspace: &Path) -> Result<WorkspaceLock> {
        let folder = open_folder(workspace)?;
        match folder.try_lock() {
            Ok(()) => Ok(WorkspaceLock { _folder: folder }),
            Err(TryLockError::WouldBlock) => bail!(
                "workspace {} is in use by {}; wait for it with --wait",
                workspace.display(),
                holder(&folder)
            ),
            Err(TryLockError::Error(e)) => {
                Err(e).with_context(|| format!("locking workspace {}", workspace.display()))
            }
        }
    }

    /// Takes the lock of `workspace` when it is free; `None` while another holder (this
    /// process included, through another open of the folder) has it.
    pub fn try_acquire_free(workspace: &Path) -> Result<Option<WorkspaceLock>> {
        let folder = open_folder(workspace)?;
        match folder.try_lock() {
            Ok(()) => Ok(Some(WorkspaceLock { _folder: folder })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => {
                Err(e).with_context(|| format!("locking workspace {}", workspace.display()))
            }
        }
    }

    /// Takes the lock of `workspace`, waiting for its holder to let go; gives up (with an
    /// error) once `cancel` is set.
    pub fn acquire_waiting(workspace: &Path, cancel: &AtomicBool) -> Result<WorkspaceLock> {
        let folder = open_folder(workspace)?;
        loop {
            match folder.try_lock() {
                Ok(()) => return Ok(WorkspaceLock { _folder: folder }),
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => {
                    return Err(e)
                        .with_context(|| format!("locking workspace {}", workspace.display()));
                }
            }
            if cancel.load(Ordering::SeqCst) {
                bail!(
                    "stopped while waiting for workspace {} (in use by {})",
                    workspace.display(),
                    holder(&folder)
                );
            }
            std::thread::sleep(WAIT_POLL);
        }
    }
}

/// Whether some process (this one included) holds the lock of `workspace`; `false` for a
/// folder that cannot be opened. Takes and at once drops the lock when it is free.
pub fn is_held(workspace: &Path) -> bool {
    let Ok(folder) = open_folder(workspace) else {
        return false;
    };
    match folder.try_lock() {
        Ok(()) => {
            let _ = folder.unlock();
            false
        }
        Err(TryLockError::WouldBlock) => true,
        Err(TryLockError::Error(_)) => false,
    }
}

/// Takes the lock of `workspace` for `command` (`trellis script`, `trellis check`), which
/// writes into the current run folder; when another holder has it, an error naming the
/// holder: such a command does not wait.
pub fn acquire_for(workspace: &Path, command: &str) -> Result<WorkspaceLock> {
    match WorkspaceLock::try_acquire_free(workspace)? {
        Some(lock) => Ok(lock),
        None => bail!(
            "workspace {} is in use by {}: `{command}` writes into the run folder, so it runs \
             only when no run, builder or server holds the workspace",
            workspace.display(),
            holder_of(workspace).map_or_else(|| "another process".to_string(), |h| h.to_string())
        ),
    }
}

/// Who holds the lock of `workspace`, when another process does (`None` when it is free
/// or the folder cannot be opened). Takes and at once drops the lock when it is free.
pub fn holder_of(workspace: &Path) -> Option<Holder> {
    let folder = open_folder(workspace).ok()?;
    match folder.try_lock() {
        Ok(()) => {
            let _ = folder.unlock();
            None
        }
        Err(TryLockError::WouldBlock) => Some(holder(&folder)),
        Err(TryLockError::Error(_)) => None,
    }
}

/// The folder, opened read-only (a directory opens without writing anything).
fn open_folder(workspace: &Path) -> Result<File> {
    let folder = File::open(workspace)
        .with_context(|| format!("opening workspace {}", workspace.display()))?;
    let meta = folder
        .metadata()
        .with_context(|| format!("reading workspace {}", workspace.display()))?;
    if !meta.is_dir() {
        bail!("workspace {} is not a folder", workspace.display());
    }
    Ok(folder)
}

/// Who holds the FLOCK on `folder`, as far as `/proc` tells.
fn holder(folder: &File) -> Holder {
    let pid = folder.metadata().ok().and_then(|m| {
        let locks = std::fs::read_to_string("/proc/locks").ok()?;
        flock_holder(&locks, m.dev(), m.ino())
    });
    let proc_dir = pid.map(|pid| PathBuf::from(format!("/proc/{pid}")));
    let command = proc_dir.as_ref().and_then(|dir| {
        let raw = std::fs::read(dir.join("cmdline")).ok()?;
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        (!args.is_empty()).then(|| args.join(" "))
    });
    let started = proc_dir.as_ref().and_then(|dir| start_time(dir));
    Holder {
        pid,
        started,
        command,
    }
}

/// The pid of the FLOCK on `dev`:`ino` in `/proc/locks` text (lines such as
/// `1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF`; waiters, `->` lines, skipped).
fn flock_holder(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let mut inode_only = None;
    for line in locks.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) != Some(&"FLOCK") || fields.len() < 6 {
            continue;
        }
        let (Ok(pid), Some(id)) = (fields[4].parse::<u32>(), fields.get(5)) else {
            continue;
        };
        let parts: Vec<&str> = id.split(':').collect();
        let [maj, min, inode] = parts[..] else {
            continue;
        };
        if inode.parse::<u64>().ok() != Some(ino) {
            continue;
        }
        let same_dev = u64::from_str_radix(maj, 16).ok() == Some(major)
            && u64::from_str_radix(min, 16).ok() == Some(minor);
        if same_dev {
            return Some(pid);
        }
        inode_only.get_or_insert(pid);
    }
    inode_only
}

/// When the process of `/proc/<pid>` started: boot time plus its start in clock ticks
/// (USER_HZ, 100 on Linux).
fn start_time(proc_dir: &Path) -> Option<String> {
    let stat = std::fs::read_to_string(proc_dir.join("stat")).ok()?;
    // The command name is in parentheses and may hold spaces: count fields after it.
    let after = &stat[stat.rfind(')')? + 1..];
    let ticks: u64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(boot) + Duration::from_millis(ticks * 10);
    Some(humantime::format_rfc3339_seconds(at).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_found_by_device_and_inode() {
        let dev = (253u64 << 8) | 1;
        let locks = "1: FLOCK  ADVISORY  WRITE 77 fd:01:99 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 42 fd:01:1234 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 43 fd:01:1234 0 EOF\n";
        assert_eq!(flock_holder(locks, dev, 1234), Some(42));
        assert_eq!(flock_holder(locks, dev, 5), None);
    }
}
