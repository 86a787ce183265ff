//! The workspace's quota: the most its folder may take on disk.
//!
//! A run's write budget bounds one run; what outlives it (the workflow database, the
//! shared folders a step may write, the run folders kept) adds up over runs, builder
//! sessions and schedule firings. So the runs of a workspace also write within one budget
//! of the workspace's, whose limit is the quota and whose count starts from what the folder
//! takes on disk (its files and folders, a file of several links once, links not
//! followed), measured again whenever a run begins: the runs of the same workspace going on
//! at once in this process take from one count, and what runs in other processes wrote is
//! seen at the next measurement. Between two measurements a write counts whether or not it
//! grew the folder (a rewritten file counts again): the count only errs high.

use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

use super::guard::{FsBudget, FsLimits, Shared};
use crate::store::workspace_fs::disk_use_at;

/// Files and folders a measurement counts at most: a workspace holding more counts as
/// full (its quota used).
pub const MAX_MEASURED_ENTRIES: u64 = 2_000_000;

/// A folder's identity: its device and inode.
type Id = (u64, u64);

/// The workspaces' budgets alive in this process (while a run of theirs is).
static LIVE: Mutex<Vec<(Id, u64, Weak<FsBudget>)>> = Mutex::new(Vec::new());

/// The budget of the workspace at `root` with a quota of `quota` bytes, its folder measured
/// now: the one its runs going on already write within, or a new one; and why a run may
/// not begin ([`over_quota`]), from the same measurement.
pub(crate) fn workspace_budget(root: &Path, quota: u64) -> (Arc<FsBudget>, Option<String>) {
    let (taken, refused) = match measure(root) {
        Ok(taken) => (taken, past_quota(taken, quota)),
        Err(why) => {
            tracing::warn!("{}: {why}", root.display());
            (quota, Some(why))
        }
    };
    let id = std::fs::metadata(root).map_or((0, 0), |m| {
        use std::os::unix::fs::MetadataExt;
        (m.dev(), m.ino())
    });
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.retain(|(_, _, budget)| budget.strong_count() > 0);
    let found = live
        .iter()
        .filter(|(of, limit, _)| *of == id && *limit == quota)
        .find_map(|(_, _, budget)| budget.upgrade());
    let budget = found.unwrap_or_else(|| {
        let budget = FsBudget::shared(
            FsLimits {
                write_bytes: quota,
                created_entries: u64::MAX,
                ..FsLimits::DEFAULT
            },
            Shared::Workspace,
            None,
        );
        live.push((id, quota, Arc::downgrade(&budget)));
        budget
    });
    budget.set_written(taken);
    (budget, refused)
}

/// Why a run of the workspace at `root` may not begin: its folder takes `quota` bytes or
/// more on disk, or cannot be measured. Files the host writes for a run (its logs, sessions,
/// offloaded results, a builder's conversation) are not charged as they are written, so a
/// workspace past its quota begins nothing more.
pub(crate) fn over_quota(root: &Path, quota: u64) -> Option<String> {
    match measure(root) {
        Ok(taken) => past_quota(taken, quota),
        Err(why) => Some(why),
    }
}

/// What [`over_quota`] says of a folder that takes `taken` bytes.
fn past_quota(taken: u64, quota: u64) -> Option<String> {
    (taken >= quota).then(|| {
        format!(
            "the workspace takes {taken} bytes on disk, its quota of {quota} or more \
             (--max-workspace-mib): remove what it no longer needs (old runs under runs/, \
             builder conversations under builder/conversation/, rows of db/db.sqlite), or \
             give it a larger quota"
        )
    })
}

/// Bytes the folder `root` takes on disk, or why it counts as full: it holds more than
/// [`MAX_MEASURED_ENTRIES`] files and folders, or cannot be measured (a folder moved while
/// it was walked, twice).
pub(crate) fn measure(root: &Path) -> Result<u64, String> {
    // Links are refused inside a workspace, not above it: a workspace reached through one
    // is measured where it is.
    let canonical = root.canonicalize();
    let root = canonical.as_deref().unwrap_or(root);
    let mut tries = 0;
    loop {
        tries += 1;
        match disk_use_at(root, MAX_MEASURED_ENTRIES) {
            Ok(used) if used.complete => return Ok(used.bytes),
            Ok(_) => {
                return Err(format!(
                    "the workspace holds more than {MAX_MEASURED_ENTRIES} files and folders, \
                     the most its quota measures: it counts as full (--max-workspace-mib); \
                     remove what it no longer needs (old runs under runs/, say)"
                ));
            }
            Err(e) if tries >= 2 => {
                return Err(format!(
                    "the workspace's folder could not be measured for its quota ({e}): it \
                     counts as full (--max-workspace-mib)"
                ));
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(workspace: &Arc<FsBudget>, bytes: u64) -> Arc<FsBudget> {
        FsBudget::shared(
            FsLimits {
                write_bytes: bytes,
                ..FsLimits::DEFAULT
            },
            Shared::Run,
            Some(workspace.clone()),
        )
    }

    #[test]
    fn runs_at_once_share_what_is_left_of_the_quota_measured_when_each_begins() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("data"), vec![1u8; 4 << 20]).unwrap();
        let quota = 16 << 20;
        let first = run(&workspace_budget(dir.path(), quota).0, 64 << 20);
        let left = first.write_bytes_left();
        assert!(left < 12 << 20 && left > 11 << 20, "{left}");
        // The first run writes 6 MiB to the folder (and counts them).
        std::fs::write(dir.path().join("written"), vec![1u8; 6 << 20]).unwrap();
        first.charge_growth(6 << 20);
        // A second run begins: the folder is measured again, and both take from one count.
        let second = run(&workspace_budget(dir.path(), quota).0, 64 << 20);
        let left = second.write_bytes_left();
        assert!(left < 6 << 20 && left > 5 << 20, "{left}");
        assert_eq!(first.write_bytes_left(), left);
        second.charge_growth(4 << 20);
        assert_eq!(first.write_bytes_left(), left - (4 << 20));
        drop((first, second));
        // With no run going on, the folder as it is.
        std::fs::remove_file(dir.path().join("written")).unwrap();
        let third = run(&workspace_budget(dir.path(), quota).0, 64 << 20);
        let left = third.write_bytes_left();
        assert!(left < 12 << 20 && left > 11 << 20, "{left}");
    }

    #[test]
    fn a_workspace_at_its_quota_begins_no_run() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("data"), vec![1u8; 4 << 20]).unwrap();
        assert_eq!(over_quota(dir.path(), 16 << 20), None);
        let why = over_quota(dir.path(), 4 << 20).unwrap();
        assert!(why.contains("its quota of 4194304 or more"), "{why}");
        // The run's budget, made from the same measurement, says the same.
        assert_eq!(workspace_budget(dir.path(), 16 << 20).1, None);
        let (budget, refused) = workspace_budget(dir.path(), 4 << 20);
        assert_eq!(refused.as_deref(), Some(why.as_str()));
        assert_eq!(budget.write_bytes_left(), 0);
    }
}
