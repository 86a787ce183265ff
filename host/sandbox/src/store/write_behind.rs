//! Atomic writes off the caller's path: the agent loop rewrites `session.json` and writes two
//! turn logs every turn, and each atomic write waits for the disk (`fsync`) before its rename.
//! Here a writer thread does that work while the loop goes on.
//!
//! Every write is still a whole-file atomic replace, flushed to disk before the rename, so a
//! crash leaves each file either as it was or as it was last submitted, never truncated.
//! Writes of the same file that queue up are coalesced (only the newest bytes are written).
//! [`flush`] waits until everything submitted so far is on disk and returns the first error
//! since the last flush; the agent loop flushes before it reads a file back and at the end
//! of every step.
//!
//! The writer thread is owned: a [`Writer`], which the [`Engine`](crate::Engine) holds for
//! as long as it lives (every engine of the process shares the one writer). When the last
//! holder drops it, it flushes what is queued and stops its thread, so a front end never has
//! to remember a flush before it exits. With no writer alive, writes are done on the
//! caller's thread, at once: nothing is ever left queued without an owner.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;

use serde::Serialize;

use super::WorkspaceFs;

#[derive(Default)]
struct State {
    /// Files waiting, oldest first; their newest bytes are in `latest`.
    queue: VecDeque<PathBuf>,
    latest: HashMap<PathBuf, (WorkspaceFs, Vec<u8>)>,
    /// A write is being done by the writer thread.
    busy: bool,
    /// Where the writes being done go, as host paths under their workspace's canonical folder.
    in_flight: Vec<PathBuf>,
    /// The first failure since the last flush.
    error: Option<(PathBuf, io::Error)>,
    /// The owner is gone: the thread ends once the queue is empty.
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

/// The writer of the process while one is alive. Its lock is also held while the last
/// [`Writer`] drains, so a write submitted meanwhile waits and cannot overtake queued bytes.
static CURRENT: Mutex<Weak<Writer>> = Mutex::new(Weak::new());

/// The owner of the writer thread and its queue; dropping the last handle flushes what is
/// queued (a failure is logged) and stops the thread.
pub struct Writer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

impl Writer {
    /// The writer of this process, started when none is alive; every handle shares it.
    pub fn start() -> io::Result<Arc<Writer>> {
        let mut current = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(writer) = current.upgrade() {
            return Ok(writer);
        }
        let writer = Arc::new(Writer::spawn()?);
        *current = Arc::downgrade(&writer);
        Ok(writer)
    }

    /// A new writer thread with an empty queue.
    fn spawn() -> io::Result<Writer> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("trellis-writer".into())
            .spawn(move || write_loop(&worker))?;
        Ok(Writer {
            shared,
            thread: Some(thread),
        })
    }

    /// Waits until every write submitted so far is on disk; returns the first failure since
    /// the last flush.
    pub fn flush(&self) -> io::Result<()> {
        let shared = &self.shared;
        let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        while state.busy || !state.queue.is_empty() {
            state = shared
                .changed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
        take_error(&mut state)
    }

    /// Whether a write submitted and not yet done goes to `target` or below it (a host path
    /// under a workspace's canonical folder; a path that cannot be placed counts as pending).
    fn pending_under(&self, target: &Path) -> bool {
        let state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        let queued = state
            .latest
            .iter()
            .map(|(path, (fs, _))| fs.canonical_of(path));
        state
            .in_flight
            .iter()
            .cloned()
            .map(Some)
            .chain(queued)
            .any(|path| path.is_none_or(|p| p.starts_with(target)))
    }

    fn submit(&self, fs: &WorkspaceFs, path: &Path, bytes: Vec<u8>) -> io::Result<()> {
        let shared = &self.shared;
        let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if state
            .latest
            .insert(path.to_path_buf(), (fs.clone(), bytes))
            .is_none()
        {
            state.queue.push_back(path.to_path_buf());
        }
        shared.changed.notify_all();
        take_error(&mut state)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _current = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = self.flush() {
            tracing::error!("{e}");
        }
        {
            let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            state.stop = true;
            self.shared.changed.notify_all();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The live writer, if any.
fn current() -> Option<Arc<Writer>> {
    CURRENT.lock().unwrap_or_else(|e| e.into_inner()).upgrade()
}

fn write_loop(shared: &Shared) {
    let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if state.queue.is_empty() {
            if state.stop {
                return;
            }
            state = shared
                .changed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
            continue;
        }
        // Everything queued goes in one batch per workspace: one wait for the disk for the
        // lot (see `WorkspaceFs::write_all_atomic`) rather than two per file.
        let mut batch: Vec<(PathBuf, WorkspaceFs, Vec<u8>)> = Vec::new();
        while let Some(path) = state.queue.pop_front() {
            if let Some((fs, bytes)) = state.latest.remove(&path) {
                batch.push((path, fs, bytes));
            }
        }
        state.busy = true;
        state.in_flight = batch
            .iter()
            .filter_map(|(path, fs, _)| fs.canonical_of(path))
            .collect();
        drop(state);
        let failures = write_batch(batch);
        state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        state.busy = false;
        state.in_flight.clear();
        if let Some(failure) = failures
            && state.error.is_none()
        {
            state.error = Some(failure);
        }
        shared.changed.notify_all();
    }
}

/// Writes `batch` (oldest first), grouped by the workspace each file goes through; returns
/// the first failure. A group that fails is written again file by file, so one bad file
/// neither holds back the others nor goes unnamed.
fn write_batch(mut batch: Vec<(PathBuf, WorkspaceFs, Vec<u8>)>) -> Option<(PathBuf, io::Error)> {
    let mut first_failure = None;
    while !batch.is_empty() {
        let fs = batch[0].1.clone();
        let (group, rest): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .partition(|(_, other, _)| other.same_folder(&fs));
        batch = rest;
        let files: Vec<(&Path, &[u8])> = group
            .iter()
            .map(|(path, _, bytes)| (path.as_path(), bytes.as_slice()))
            .collect();
        if fs.write_all_atomic(&files).is_ok() {
            continue;
        }
        for (path, _, bytes) in &group {
            if let Err(e) = fs.write_atomic(path, bytes)
                && first_failure.is_none()
            {
                first_failure = Some((path.clone(), e));
            }
        }
    }
    first_failure
}

fn take_error(state: &mut State) -> io::Result<()> {
    match state.error.take() {
        Some((path, e)) => Err(io::Error::new(
            e.kind(),
            format!("writing {}: {e}", path.display()),
        )),
        None => Ok(()),
    }
}

/// Queues an atomic replace of `path` (inside the workspace of `fs`, written through it) with
/// `bytes` on the live [`Writer`]. Returns an earlier write's failure, if one happened since
/// the last [`flush`] (so a full disk shows up at the next write, not only at the end of the
/// step). With no writer alive, writes at once and returns its own failure.
pub fn write_bytes(fs: &WorkspaceFs, path: &Path, bytes: Vec<u8>) -> io::Result<()> {
    match current() {
        Some(writer) => writer.submit(fs, path, bytes),
        None => fs
            .write_atomic(path, &bytes)
            .map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", path.display()))),
    }
}

/// [`write_bytes`] of `value` as 2-space indented JSON with a final newline, the format of
/// [`WorkspaceFs::write_json_atomic`]. The value is serialized now, so later changes to it do
/// not reach the file.
pub fn write_json<T: Serialize + ?Sized>(
    fs: &WorkspaceFs,
    path: &Path,
    value: &T,
) -> io::Result<()> {
    write_bytes(fs, path, super::json_bytes(value)?)
}

/// [`flush`] when a write submitted and not yet done goes to `target` (a host path under a
/// workspace's canonical folder) or below it: what moves or removes `target` waits for them,
/// anything else goes on at once.
pub(crate) fn flush_if_pending_under(target: &Path) -> io::Result<()> {
    match current() {
        Some(writer) if writer.pending_under(target) => writer.flush(),
        _ => Ok(()),
    }
}

/// Waits until every write submitted so far to the live [`Writer`] is on disk; returns the
/// first failure since the last flush. Without a writer there is nothing queued.
pub fn flush() -> io::Result<()> {
    match current() {
        Some(writer) => writer.flush(),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_land_coalesced_after_a_flush_and_failures_are_reported() {
        let _writer = Writer::start().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let fs = WorkspaceFs::open(dir.path()).unwrap();
        let path = dir.path().join("logs/session.json");
        for n in 0..50 {
            write_json(&fs, &path, &serde_json::json!({"n": n})).unwrap();
        }
        flush().unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\n  \"n\": 49\n}\n"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path().join("logs"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["session.json"], "no temp file is left behind");

        // A folder where the file's parent should be: the write fails, the flush says so.
        std::fs::write(dir.path().join("blocked"), "a file").unwrap();
        let bad = dir.path().join("blocked/session.json");
        let _ = write_json(&fs, &bad, &serde_json::json!({}));
        let err = flush().unwrap_err().to_string();
        assert!(err.contains("blocked/session.json"), "{err}");
        flush().expect("the error is reported once");
    }

    #[test]
    fn a_batch_with_a_bad_file_still_writes_the_others_and_names_the_bad_one() {
        let dir = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let fs = WorkspaceFs::open(dir.path()).unwrap();
        let other_fs = WorkspaceFs::open(other.path()).unwrap();
        std::fs::write(dir.path().join("blocked"), "a file").unwrap();
        let batch = vec![
            (dir.path().join("a.json"), fs.clone(), b"a".to_vec()),
            (other.path().join("b.json"), other_fs, b"b".to_vec()),
            (dir.path().join("blocked/c.json"), fs.clone(), b"c".to_vec()),
            (dir.path().join("logs/d.json"), fs, b"d".to_vec()),
        ];
        let (path, _) = write_batch(batch).expect("the bad file fails");
        assert!(path.ends_with("blocked/c.json"), "{}", path.display());
        assert_eq!(std::fs::read(dir.path().join("a.json")).unwrap(), b"a");
        assert_eq!(std::fs::read(other.path().join("b.json")).unwrap(), b"b");
        assert_eq!(std::fs::read(dir.path().join("logs/d.json")).unwrap(), b"d");
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["a.json", "blocked", "logs"],
            "no temp file is left behind"
        );
    }

    #[test]
    fn dropping_a_writer_puts_what_it_queued_on_disk_and_stops_it() {
        let dir = tempfile::tempdir().unwrap();
        let fs = WorkspaceFs::open(dir.path()).unwrap();
        let path = dir.path().join("logs/turn.json");
        // A writer of its own, not the process's: no other test can hold it.
        let writer = Writer::spawn().unwrap();
        for n in 0..50 {
            writer
                .submit(&fs, &path, format!("{n}\n").into_bytes())
                .unwrap();
        }
        let shared = writer.shared.clone();
        drop(writer);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "49\n");
        assert_eq!(Arc::strong_count(&shared), 1, "the writer thread has ended");
    }
}
