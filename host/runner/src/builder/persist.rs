//! What a builder session keeps on disk (spec section 11): the conversation of each session,
//! rewritten atomically after every turn and never shrunk, and the index of sessions.
//!
//! `builder/conversation/<UTC date the session began>/session-<id>-conversation.json` holds
//! `{session_id, phase_id, workshop_mode, model, conversation_history, updated_at}` (plus the
//! session's cumulative token usage, which cost deltas are counted from);
//! `builder/conversation/chat-index.json` lists every session.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use trellis_sandbox::llm::{Message, Role, Usage};
use trellis_sandbox::store::WorkspaceFs;

/// The folder of conversation files, relative to the workspace.
pub const CONVERSATION_DIR: &str = "builder/conversation";
/// The index of sessions, relative to the workspace.
pub const INDEX_FILE: &str = "builder/conversation/chat-index.json";

/// One session's conversation file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConversationFile {
    /// The session's id.
    pub session_id: String,
    /// Always [`super::PHASE_ID`].
    pub phase_id: String,
    /// The mode the session is in.
    pub workshop_mode: String,
    /// The builder's model, `provider:model`.
    pub model: String,
    /// Every message but the system prompt, which is made afresh each turn.
    pub conversation_history: Vec<Message>,
    /// When the session began (RFC 3339, UTC).
    #[serde(default)]
    pub created_at: String,
    /// When the file was last written.
    pub updated_at: String,
    /// The session's token usage so far.
    #[serde(default)]
    pub cumulative_usage: Usage,
}

impl ConversationFile {
    /// How many user turns the history holds.
    pub fn user_turns(&self) -> usize {
        user_turns(&self.conversation_history)
    }

    /// The first user message, for the index.
    pub fn first_query(&self) -> Option<&str> {
        self.conversation_history
            .iter()
            .find(|m| m.role == Role::User)
            .map(|m| m.content.as_str())
    }
}

/// How many user messages `history` holds.
pub fn user_turns(history: &[Message]) -> usize {
    history.iter().filter(|m| m.role == Role::User).count()
}

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

/// `chat-index.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatIndex {
    /// Every session, oldest first.
    pub sessions: Vec<IndexEntry>,
}

/// The conversation file of session `id` begun on `date` (`YYYY-MM-DD`), relative to the
/// workspace.
pub fn conversation_path(date: &str, id: &str) -> PathBuf {
    Path::new(CONVERSATION_DIR)
        .join(date)
        .join(format!("session-{id}-conversation.json"))
}

/// Reads the index; empty when there is none yet.
pub fn read_index(fs: &WorkspaceFs) -> Result<ChatIndex> {
    if !fs.is_file(INDEX_FILE) {
        return Ok(ChatIndex::default());
    }
    let text = fs
        .read_json_text(INDEX_FILE)
        .with_context(|| format!("reading {INDEX_FILE}"))?;
    serde_json::from_str(&text).with_context(|| format!("{INDEX_FILE}: not a session index"))
}

/// Refuses a session id that is not a plain name (letters, digits, `-`, `_`): the id names
/// the conversation file, so a path in it (`../../x`) must never reach a file name.
pub fn check_session_id(id: &str) -> Result<()> {
    let plain = !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !plain {
        bail!("{id:?} is not a builder session id: letters, digits, '-' and '_' only");
    }
    Ok(())
}

/// A `YYYY-MM-DD` date, the only folder name under [`CONVERSATION_DIR`].
pub fn is_date(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() == 10
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            _ => c.is_ascii_digit(),
        })
}

/// Whether `file` (from the index, which a hostile workspace may have written) is the
/// conversation file of session `id`: `builder/conversation/<date>/session-<id>-conversation.json`.
fn is_conversation_file_of(file: &str, id: &str) -> bool {
    let parts: Vec<&str> = file.split('/').collect();
    let prefix: Vec<&str> = CONVERSATION_DIR.split('/').collect();
    parts.len() == prefix.len() + 2
        && parts[..prefix.len()] == prefix[..]
        && is_date(parts[prefix.len()])
        && parts[prefix.len() + 1] == format!("session-{id}-conversation.json")
}

/// Reads the conversation of session `id`, found through the index. The index is the
/// workspace's (possibly planted): the id must be a plain name and the file the index names
/// must be that session's conversation file under [`CONVERSATION_DIR`], else nothing is read.
pub fn load(fs: &WorkspaceFs, id: &str) -> Result<ConversationFile> {
    check_session_id(id)?;
    let index = read_index(fs)?;
    let Some(entry) = index.sessions.iter().find(|s| s.session_id == id) else {
        let known: Vec<&str> = index
            .sessions
            .iter()
            .map(|s| s.session_id.as_str())
            .collect();
        bail!(
            "no builder session {id:?} in {INDEX_FILE} (sessions: {})",
            if known.is_empty() {
                "none yet".to_string()
            } else {
                known.join(", ")
            }
        );
    };
    if !is_conversation_file_of(&entry.file, id) {
        bail!(
            "{INDEX_FILE}: session {id:?} names {:?}, which is not a conversation file \
             (builder/conversation/<date>/session-{id}-conversation.json); it is not read",
            entry.file
        );
    }
    let text = fs
        .read_to_string(&entry.file)
        .with_context(|| format!("reading {}", entry.file))?;
    let file: ConversationFile = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a builder conversation", entry.file))?;
    if file.session_id != id {
        bail!(
            "{}: holds session {:?}, not {id:?}",
            entry.file,
            file.session_id
        );
    }
    Ok(file)
}

/// Writes `file` at `rel` atomically and updates the index. Refuses (writing nothing) a
/// history with fewer user turns than the file already on disk: a restart must never shrink
/// a conversation.
pub fn save(fs: &WorkspaceFs, rel: &Path, file: &ConversationFile) -> Result<()> {
    if fs.is_file(rel)
        && let Ok(text) = fs.read_to_string(rel)
        && let Ok(on_disk) = serde_json::from_str::<ConversationFile>(&text)
        && on_disk.user_turns() > file.user_turns()
    {
        bail!(
            "{}: refusing to write a conversation with {} user turns over one with {}: a \
             builder history never shrinks",
            rel.display(),
            file.user_turns(),
            on_disk.user_turns()
        );
    }
    fs.write_json_atomic(rel, file)
        .with_context(|| format!("writing {}", rel.display()))?;
    let mut index = read_index(fs).unwrap_or_default();
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
    fs.write_json_atomic(INDEX_FILE, &index)
        .with_context(|| format!("writing {INDEX_FILE}"))
}
