//! `planning/changelog/changelog-<UTC YYYY-MM-DD>.json`: a JSON array with one entry per
//! edit (`{timestamp, tool, reason, step_ids, changes[{step_id, field, old, new}],
//! before_sha256, after_sha256}`, the hashes of `planning/plan.json`), rewritten atomically.

use std::io;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use trellis_sandbox::store::WorkspaceFs;

/// The folder of the changelog files, workspace-relative.
pub const CHANGELOG_DIR: &str = "planning/changelog";

/// The changelog file of the UTC day of `timestamp` (RFC 3339), workspace-relative.
pub fn changelog_path(timestamp: &str) -> PathBuf {
    let day = timestamp.get(..10).unwrap_or(timestamp);
    Path::new(CHANGELOG_DIR).join(format!("changelog-{day}.json"))
}

/// The size past which a day's changelog goes on in a file of its own.
pub const CHANGELOG_FILE_BYTES: u64 = 4 << 20;

/// Files a day's changelog goes on in, at most.
const CHANGELOG_FILES_A_DAY: u32 = 100;

/// The file the next entry of the day of `timestamp` goes in: the day's file, or once it
/// holds [`CHANGELOG_FILE_BYTES`], `changelog-<day>-2.json`, `-3`, ...: an edit rereads and
/// rewrites its file whole, so a day of many edits does not make each cost the whole day.
pub fn changelog_file(fs: &WorkspaceFs, timestamp: &str) -> PathBuf {
    let first = changelog_path(timestamp);
    let day = timestamp.get(..10).unwrap_or(timestamp);
    let mut file = first.clone();
    for n in 2..=CHANGELOG_FILES_A_DAY {
        let full = fs
            .metadata_len(&file)
            .is_some_and(|len| len >= CHANGELOG_FILE_BYTES);
        if !full {
            break;
        }
        file = Path::new(CHANGELOG_DIR).join(format!("changelog-{day}-{n}.json"));
    }
    file
}

/// One change of an edit.
#[derive(Debug, Clone)]
pub(super) struct Change {
    pub step_id: Option<String>,
    pub field: String,
    pub old: Value,
    pub new: Value,
}

impl Change {
    pub fn new(step_id: Option<&str>, field: impl Into<String>, old: Value, new: Value) -> Self {
        Change {
            step_id: step_id.map(str::to_string),
            field: field.into(),
            old,
            new,
        }
    }

    pub fn to_json(&self) -> Value {
        json!({"step_id": self.step_id, "field": self.field, "old": self.old, "new": self.new})
    }
}

/// The sha256 of `bytes`, hex; `None` for a file that does not exist.
pub(super) fn sha256(bytes: Option<&[u8]>) -> Value {
    match bytes {
        Some(b) => Value::String(hex::encode(Sha256::digest(b))),
        None => Value::Null,
    }
}

/// The entries already in the changelog file `rel`; an error when it is not a JSON array
/// (checked before an edit writes anything, so a broken log never half-records an edit).
pub fn read_entries(fs: &WorkspaceFs, rel: &Path) -> io::Result<Vec<Value>> {
    if !fs.exists(rel) {
        return Ok(Vec::new());
    }
    match fs.read_json_value(rel) {
        Ok(Value::Array(entries)) => Ok(entries),
        Err(e) if e.kind() != io::ErrorKind::InvalidData => Err(e),
        Err(e) if !e.to_string().contains(": not JSON: ") => Err(e),
        _ => Err(io::Error::other(format!(
            "{} is not a JSON array of changelog entries: fix or move it, then retry",
            rel.display()
        ))),
    }
}

/// Appends `entry` to the changelog file `rel`.
pub(super) fn append(fs: &WorkspaceFs, rel: &Path, entry: Value) -> io::Result<()> {
    let mut entries = read_entries(fs, rel)?;
    entries.push(entry);
    fs.write_json_atomic(rel, &entries)
}
