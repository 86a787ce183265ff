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

/// The JSON values past which a day's changelog goes on in a file of its own: a quarter of
/// what its reader parses of one file, so a file the builder appends to is always read back.
pub const CHANGELOG_FILE_VALUES: usize = trellis_sandbox::json_values::MAX_FILE_VALUES / 4;

/// What one entry's changes may hold whole: past either, each change keeps a summary of its
/// old and new values ([`entry_changes`]).
const ENTRY_BYTES: usize = 1 << 20;
const ENTRY_VALUES: usize = 100_000;

/// The bytes of an edit's reason an entry keeps; the rest is cut, the cut marked.
pub const REASON_BYTES: usize = 4096;

/// The changes an entry summarises at most; the rest are counted.
const ENTRY_CHANGES: usize = 5_000;

/// An old or new value a summarised change keeps whole: at most this much JSON.
const SUMMARY_VALUE_BYTES: usize = 256;

/// Files a day's changelog goes on in, at most: past them, edits are refused for the day.
pub const CHANGELOG_FILES_A_DAY: u32 = 100;

/// The file the next entry of the day of `timestamp` goes in: the day's file, or once it
/// holds [`CHANGELOG_FILE_BYTES`] or [`CHANGELOG_FILE_VALUES`], `changelog-<day>-2.json`,
/// `-3`, ...: an edit rereads and rewrites its file whole, so a day of many edits does not
/// make each cost the whole day, and a file (planted or written) stays one its reader takes.
pub fn changelog_file(fs: &WorkspaceFs, timestamp: &str) -> PathBuf {
    let first = changelog_path(timestamp);
    let day = timestamp.get(..10).unwrap_or(timestamp);
    let mut file = first.clone();
    for n in 2..=CHANGELOG_FILES_A_DAY {
        if !is_full(fs, &file) {
            break;
        }
        file = Path::new(CHANGELOG_DIR).join(format!("changelog-{day}-{n}.json"));
    }
    file
}

/// Whether the changelog file `rel` takes no more entries: [`CHANGELOG_FILE_BYTES`] long,
/// or holding [`CHANGELOG_FILE_VALUES`] values.
pub(super) fn is_full(fs: &WorkspaceFs, rel: &Path) -> bool {
    match fs.metadata_len(rel) {
        None => false,
        Some(len) if len >= CHANGELOG_FILE_BYTES => true,
        Some(_) => fs.read(rel).is_ok_and(|bytes| {
            trellis_sandbox::json_values::json_values(&bytes) >= CHANGELOG_FILE_VALUES
        }),
    }
}

/// The `changes` of an entry: each change whole, unless together they pass [`ENTRY_BYTES`]
/// or [`ENTRY_VALUES`]; then the first [`ENTRY_CHANGES`] with their old and new values
/// summarised (whole when small, else their size and sha256) and a count of the rest. The
/// files themselves hold the values; the entry records what changed.
pub(super) fn entry_changes(changes: &[Change]) -> Value {
    let whole: Vec<Value> = changes.iter().map(Change::to_json).collect();
    let text = serde_json::to_vec(&whole).unwrap_or_default();
    if text.len() <= ENTRY_BYTES && trellis_sandbox::json_values::json_values(&text) <= ENTRY_VALUES
    {
        return Value::Array(whole);
    }
    let summary = |v: &Value| -> Value {
        let text = v.to_string();
        if text.len() <= SUMMARY_VALUE_BYTES {
            v.clone()
        } else {
            json!({"summarised": format!(
                "{} bytes of JSON, sha256 {}",
                text.len(),
                hex::encode(Sha256::digest(text.as_bytes()))
            )})
        }
    };
    let mut out: Vec<Value> = changes
        .iter()
        .take(ENTRY_CHANGES)
        .map(|c| {
            json!({"step_id": c.step_id, "field": c.field, "old": summary(&c.old),
                   "new": summary(&c.new)})
        })
        .collect();
    if changes.len() > ENTRY_CHANGES {
        out.push(json!({"more_changes": changes.len() - ENTRY_CHANGES}));
    }
    Value::Array(out)
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
    let mut values = trellis_sandbox::json_values::MAX_FILE_VALUES;
    read_entries_within(fs, rel, &mut values)
}

/// [`read_entries`], the file's JSON values counted before it is parsed and taken from
/// `values_left`: an error, nothing parsed, when it holds more. Several files read for one
/// answer share one budget.
pub fn read_entries_within(
    fs: &WorkspaceFs,
    rel: &Path,
    values_left: &mut usize,
) -> io::Result<Vec<Value>> {
    if !fs.exists(rel) {
        return Ok(Vec::new());
    }
    let not_array = || {
        io::Error::other(format!(
            "{} is not a JSON array of changelog entries: fix or move it, then retry",
            rel.display()
        ))
    };
    let bytes = fs.read(rel)?;
    let values = trellis_sandbox::json_values::json_values(&bytes);
    if values > *values_left {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: holds about {values} JSON values, more than the {} left to parse",
                rel.display(),
                *values_left
            ),
        ));
    }
    *values_left -= values;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Array(entries)) => Ok(entries),
        _ => Err(not_array()),
    }
}

/// Appends `entry` to the changelog file `rel`.
pub(super) fn append(fs: &WorkspaceFs, rel: &Path, entry: Value) -> io::Result<()> {
    let mut entries = read_entries(fs, rel)?;
    entries.push(entry);
    fs.write_json_atomic(rel, &entries)
}
