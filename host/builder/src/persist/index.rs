//! `builder/conversation/chat-index.json`, in either shape a workspace may hold.
//!
//! Trellis writes `{sessions: [{session_id, workshop_mode, created_at, updated_at,
//! message_count, first_query, file}]}`. The original system writes `{version, complete,
//! updated_at, entries: {<conversation path>: {session: {session_id, workshop_mode, query,
//! conversation_path, ...}, source_size, ...}}}`, a cache it checks against each
//! conversation file's size and time and rebuilds from the files. Such an index is read
//! (its sessions can be resumed) and never written: the original finds the files Trellis
//! writes by itself. An index that is neither shape is left as it is too.

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use trellis_sandbox::store::WorkspaceFs;

use super::{CONVERSATION_DIR, ConversationFile};

/// The index of sessions, relative to the workspace.
pub const INDEX_FILE: &str = "builder/conversation/chat-index.json";

/// One session in the index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IndexEntry {
    /// The session's id.
    pub session_id: String,
    /// Its mode.
    pub workshop_mode: String,
    /// When it began.
    pub created_at: String,
    /// When it was last written.
    pub updated_at: String,
    /// Messages in its history.
    pub message_count: usize,
    /// Its first user message, cut to 200 characters.
    pub first_query: Option<String>,
    /// Its conversation file, relative to the workspace.
    pub file: String,
}

/// The index as read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatIndex {
    /// Every session, oldest first (the original's in the order of its file).
    pub sessions: Vec<IndexEntry>,
    /// The file is the original's shape: it is never written.
    pub original: bool,
}

#[derive(Serialize, Deserialize)]
struct TrellisIndex {
    sessions: Vec<IndexEntry>,
}

/// Reads the index; empty when there is none yet.
pub fn read_index(fs: &WorkspaceFs) -> Result<ChatIndex> {
    if !fs.is_file(INDEX_FILE) {
        return Ok(ChatIndex::default());
    }
    let text = fs
        .read_json_text(INDEX_FILE)
        .with_context(|| format!("reading {INDEX_FILE}"))?;
    let value: Value = serde_json::from_str(&text)
        .with_context(|| format!("{INDEX_FILE}: not a session index"))?;
    if value.get("sessions").is_none() && value.get("entries").is_some() {
        return Ok(ChatIndex {
            sessions: original_sessions(&value["entries"]),
            original: true,
        });
    }
    let index: TrellisIndex = serde_json::from_value(value)
        .with_context(|| format!("{INDEX_FILE}: not a session index"))?;
    Ok(ChatIndex {
        sessions: index.sessions,
        original: false,
    })
}

/// The sessions of the original's `entries`; `file` is the part of `conversation_path` from
/// `builder/conversation/` on (its paths start at the folder above the workspace), empty
/// when it has none.
fn original_sessions(entries: &Value) -> Vec<IndexEntry> {
    let Some(entries) = entries.as_object() else {
        return Vec::new();
    };
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
    entries
        .iter()
        .filter_map(|(key, entry)| {
            let session = entry.get("session")?;
            let path = text(session, "conversation_path").unwrap_or_else(|| key.clone());
            let file = path
                .find(&format!("{CONVERSATION_DIR}/"))
                .map(|at| path[at..].to_string())
                .unwrap_or_default();
            Some(IndexEntry {
                session_id: text(session, "session_id")?,
                workshop_mode: text(session, "workshop_mode").unwrap_or_default(),
                created_at: text(session, "created_at").unwrap_or_default(),
                updated_at: text(session, "updated_at").unwrap_or_default(),
                message_count: session
                    .get("message_count")
                    .and_then(Value::as_u64)
                    .and_then(|n| usize::try_from(n).ok())
                    .unwrap_or(0),
                first_query: text(session, "query"),
                file,
            })
        })
        .collect()
}

/// Records `file`, written at `rel`, in the index: Trellis's index gains or updates its
/// entry; an index of the original's shape, or one that does not read, is left alone.
pub fn record(fs: &WorkspaceFs, rel: &Path, file: &ConversationFile) -> Result<()> {
    let mut index = match read_index(fs) {
        Ok(index) if index.original => return Ok(()),
        Ok(index) => index,
        Err(e) => {
            tracing::warn!("{e:#}: left as it is; sessions are found by their file names");
            return Ok(());
        }
    };
    let entry = IndexEntry {
        session_id: file.session_id.clone(),
        workshop_mode: file.workshop_mode.clone(),
        created_at: file.created_at.clone(),
        updated_at: file.updated_at.clone(),
        message_count: file.conversation_history.len(),
        first_query: file
            .first_query()
            .map(|q| q.chars().take(200).collect::<String>()),
        file: rel.to_string_lossy().replace('\\', "/"),
    };
    match index
        .sessions
        .iter_mut()
        .find(|s| s.session_id == file.session_id)
    {
        Some(existing) => *existing = entry,
        None => index.sessions.push(entry),
    }
    fs.write_json_atomic(
        INDEX_FILE,
        &TrellisIndex {
            sessions: index.sessions,
        },
    )
    .with_context(|| format!("writing {INDEX_FILE}"))
}

/// Takes the sessions `ids` out of Trellis's index; an index of the original's shape, or
/// none, is left alone.
pub fn forget(fs: &WorkspaceFs, ids: &[&str]) -> Result<()> {
    let index = read_index(fs)?;
    if index.original || index.sessions.is_empty() {
        return Ok(());
    }
    let before = index.sessions.len();
    let sessions: Vec<IndexEntry> = index
        .sessions
        .into_iter()
        .filter(|s| !ids.contains(&s.session_id.as_str()))
        .collect();
    if sessions.len() == before {
        return Ok(());
    }
    fs.write_json_atomic(INDEX_FILE, &TrellisIndex { sessions })
        .with_context(|| format!("writing {INDEX_FILE}"))
}
