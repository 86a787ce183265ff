//! A pause between the guard's check of a path and its open, for tests that put something
//! else at the path exactly there (a FIFO, a hard link, a link out of the grant) instead of
//! racing the two looks thousands of times. Built only with the `test-hooks` feature, which
//! only this workspace's tests turn on: a release build has neither the hook nor its lookup.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::depth::{FolderId, id_of};

type Hook = Arc<dyn Fn(&str) + Send + Sync>;

/// The hooks set, each with the folder whose opens it sees and its number.
static HOOKS: Mutex<Vec<(FolderId, u64, Hook)>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Runs `hook` with the path of every open the guard makes in `folder` (as the guest gave
/// it, relative to `folder`), after the guard checked the path and before it opens it, on
/// the thread of the call. Other folders' opens do not see it, so tests running side by
/// side each set their own. The hook stays until the returned value is dropped.
pub fn between_check_and_open(
    folder: &Path,
    hook: impl Fn(&str) + Send + Sync + 'static,
) -> io::Result<BetweenCheckAndOpen> {
    let id = id_of(std::fs::File::open(folder)?)?;
    let number = NEXT.fetch_add(1, Ordering::Relaxed);
    HOOKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((id, number, Arc::new(hook)));
    Ok(BetweenCheckAndOpen { number })
}

/// Removes its hook when dropped ([`between_check_and_open`]).
#[derive(Debug)]
#[must_use = "the hook is removed when this is dropped"]
pub struct BetweenCheckAndOpen {
    number: u64,
}

impl Drop for BetweenCheckAndOpen {
    fn drop(&mut self) {
        HOOKS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(_, number, _)| *number != self.number);
    }
}

/// Runs the hooks set on the folder `dir` with `path`.
pub(super) fn run(dir: &std::fs::File, path: &str) {
    let Ok(id) = id_of(dir) else { return };
    let hooks: Vec<Hook> = HOOKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(folder, _, _)| *folder == id)
        .map(|(_, _, hook)| hook.clone())
        .collect();
    for hook in hooks {
        hook(path);
    }
}
