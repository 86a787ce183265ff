//! What a builder session keeps on disk (spec section 11): the conversation of each session,
//! rewritten atomically after every turn and never shrunk, and the index of sessions.
//!
//! `builder/conversation/<UTC date the session began>/session-<id>-conversation.json` holds
//! `{session_id, phase_id, workshop_mode, model, conversation_history, updated_at}` (plus the
//! session's cumulative token usage, which cost deltas are counted from);
//! `builder/conversation/chat-index.json` lists every session ([`index`]).
//!
//! A workspace the original system worked in holds its conversations at the same place:
//! their langchain-style histories are read ([`history`]), every key Trellis does not know
//! (`agent_mode`, `runtime`, `ui_events`, ...) is written back as it was, and its index is
//! left alone.

pub mod history;
pub mod index;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value};

use trellis_sandbox::llm::{Message, Role, Usage};
use trellis_sandbox::store::{Kind, WorkspaceFs};

pub use index::{ChatIndex, INDEX_FILE, IndexEntry, read_index};

/// The folder of conversation files, relative to the workspace.
pub const CONVERSATION_DIR: &str = "builder/conversation";

/// One session's conversation file.
#[derive(Debug, Clone, PartialEq)]
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
    pub created_at: String,
    /// When the file was last written.
    pub updated_at: String,
    /// The session's token usage so far.
    pub cumulative_usage: Usage,
    /// Keys of the file Trellis does not use, written back as they were (`ui_events`,
    /// `runtime`, `agent_mode` of the original's files).
    pub other: Map<String, Value>,
    /// The history was langchain-style when read: it is written with `parts` as well.
    pub langchain_parts: bool,
}

const KNOWN: [&str; 8] = [
    "session_id",
    "phase_id",
    "workshop_mode",
    "model",
    "conversation_history",
    "created_at",
    "updated_at",
    "cumulative_usage",
];

impl ConversationFile {
    /// A new, empty session.
    pub fn new(session_id: String, workshop_mode: &str, created_at: String) -> Self {
        ConversationFile {
            session_id,
            phase_id: super::PHASE_ID.to_string(),
            workshop_mode: workshop_mode.to_string(),
            model: String::new(),
            conversation_history: Vec::new(),
            updated_at: created_at.clone(),
            created_at,
            cumulative_usage: Usage::default(),
            other: Map::new(),
            langchain_parts: false,
        }
    }

    /// Reads a conversation file's JSON; `path` names it in errors.
    pub fn from_json(v: &Value, path: &str) -> Result<Self> {
        let Value::Object(map) = v else {
            bail!("{path}: not a builder conversation: expected a JSON object");
        };
        let text = |key: &str| -> Result<Option<String>> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => bail!("{path}: {key}: expected a string, found {other}"),
            }
        };
        let session_id = text("session_id")?
            .with_context(|| format!("{path}: not a builder conversation: no session_id"))?;
        let (conversation_history, langchain_parts) = history::read(
            map.get("conversation_history").unwrap_or(&Value::Null),
            path,
        )
        .map_err(anyhow::Error::msg)?;
        let cumulative_usage = match map.get("cumulative_usage") {
            None | Some(Value::Null) => Usage::default(),
            Some(v) => serde_json::from_value(v.clone())
                .with_context(|| format!("{path}: cumulative_usage"))?,
        };
        Ok(ConversationFile {
            session_id,
            phase_id: text("phase_id")?.unwrap_or_else(|| super::PHASE_ID.to_string()),
            // The original's files may have no mode: its builder is the workshop.
            workshop_mode: text("workshop_mode")?.unwrap_or_else(|| "builder".to_string()),
            model: text("model")?.unwrap_or_default(),
            conversation_history,
            created_at: text("created_at")?.unwrap_or_default(),
            updated_at: text("updated_at")?.unwrap_or_default(),
            cumulative_usage,
            other: map
                .iter()
                .filter(|(k, _)| !KNOWN.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            langchain_parts,
        })
    }

    /// The file's JSON: the keys it was read with, Trellis's own set afresh.
    pub fn to_json(&self) -> Value {
        let mut map = self.other.clone();
        let s = |v: &str| Value::String(v.to_string());
        map.insert("session_id".into(), s(&self.session_id));
        map.insert("phase_id".into(), s(&self.phase_id));
        map.insert("workshop_mode".into(), s(&self.workshop_mode));
        map.insert("model".into(), s(&self.model));
        map.insert(
            "conversation_history".into(),
            history::write(&self.conversation_history, self.langchain_parts),
        );
        map.insert("created_at".into(), s(&self.created_at));
        map.insert("updated_at".into(), s(&self.updated_at));
        map.insert(
            "cumulative_usage".into(),
            serde_json::to_value(self.cumulative_usage).unwrap_or(Value::Null),
        );
        Value::Object(map)
    }

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

/// The conversation file of session `id` begun on `date` (`YYYY-MM-DD`), relative to the
/// workspace.
pub fn conversation_path(date: &str, id: &str) -> PathBuf {
    Path::new(CONVERSATION_DIR)
        .join(date)
        .join(conversation_file_name(id))
}

fn conversation_file_name(id: &str) -> String {
    format!("session-{id}-conversation.json")
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
pub(crate) fn is_conversation_file_of(file: &str, id: &str) -> bool {
    let parts: Vec<&str> = file.split('/').collect();
    let prefix: Vec<&str> = CONVERSATION_DIR.split('/').collect();
    parts.len() == prefix.len() + 2
        && parts[..prefix.len()] == prefix[..]
        && is_date(parts[prefix.len()])
        && parts[prefix.len() + 1] == conversation_file_name(id)
}

/// The conversation file of session `id` found by its name: the newest
/// `builder/conversation/<date>/session-<id>-conversation.json` that is a regular file.
/// Links and folders of other names are never entered.
fn find_by_name(fs: &WorkspaceFs, id: &str) -> Result<Option<String>> {
    if fs.kind(CONVERSATION_DIR)? != Some(Kind::Dir) {
        return Ok(None);
    }
    let mut dates: Vec<String> = fs
        .list(CONVERSATION_DIR)
        .with_context(|| format!("reading {CONVERSATION_DIR}"))?
        .into_iter()
        .filter(|(name, kind)| *kind == Kind::Dir && is_date(name))
        .map(|(name, _)| name)
        .collect();
    dates.sort();
    for date in dates.iter().rev() {
        let rel = format!("{CONVERSATION_DIR}/{date}/{}", conversation_file_name(id));
        if fs.kind(&rel)? == Some(Kind::File) {
            return Ok(Some(rel));
        }
    }
    Ok(None)
}

/// Reads the conversation of session `id` and returns it with its file (relative to the
/// workspace). The file is the one a Trellis index names, which must be that session's
/// conversation file under [`CONVERSATION_DIR`] (the index is the workspace's, possibly
/// planted: else nothing is read); a session the index does not list (the original's
/// sessions, whose index Trellis does not write) is found by its file name.
pub fn load(fs: &WorkspaceFs, id: &str) -> Result<(ConversationFile, PathBuf)> {
    check_session_id(id)?;
    let index = read_index(fs);
    let listed = index
        .as_ref()
        .ok()
        .and_then(|i| i.sessions.iter().find(|s| s.session_id == id).cloned());
    let rel = match listed {
        Some(entry) if !index.as_ref().is_ok_and(|i| i.original) => {
            if !is_conversation_file_of(&entry.file, id) {
                bail!(
                    "{INDEX_FILE}: session {id:?} names {:?}, which is not a conversation \
                     file (builder/conversation/<date>/session-{id}-conversation.json); it is \
                     not read",
                    entry.file
                );
            }
            entry.file
        }
        listed => {
            let named = listed
                .map(|e| e.file)
                .filter(|f| is_conversation_file_of(f, id) && fs.is_file(f));
            match named {
                Some(file) => file,
                None => match find_by_name(fs, id)? {
                    Some(file) => file,
                    None => {
                        let known: Vec<String> = index
                            .map(|i| i.sessions.into_iter().map(|s| s.session_id).collect())
                            .unwrap_or_default();
                        bail!(
                            "no builder session {id:?} in {INDEX_FILE} or under \
                             {CONVERSATION_DIR}/<date>/ (sessions: {})",
                            if known.is_empty() {
                                "none yet".to_string()
                            } else {
                                known.join(", ")
                            }
                        );
                    }
                },
            }
        }
    };
    let file = read_conversation(fs, Path::new(&rel))?;
    if file.session_id != id {
        bail!("{rel}: holds session {:?}, not {id:?}", file.session_id);
    }
    Ok((file, PathBuf::from(rel)))
}

/// Removes the conversations of the run-mode sessions of `firings` (each a session id and
/// when its schedule firing ended, RFC 3339 UTC; firings whose history entries were dropped):
/// each conversation file and its index entry. A session in another mode is an operator's
/// conversation and is kept, whatever names it; so is one written after its firing ended
/// (someone went on with it), and one that cannot be read. Returns how many were removed.
pub fn forget_run_sessions(fs: &WorkspaceFs, firings: &[(String, String)]) -> usize {
    let mut gone: Vec<&str> = Vec::new();
    for (id, ended) in firings {
        if check_session_id(id).is_err() {
            continue;
        }
        let Ok((file, rel)) = load(fs, id) else {
            continue;
        };
        if file.workshop_mode != "run" || file.updated_at.as_str() > ended.as_str() {
            continue;
        }
        match fs.remove_file(&rel) {
            Ok(()) => gone.push(id.as_str()),
            Err(e) => tracing::warn!("removing {}: {e}", rel.display()),
        }
    }
    if !gone.is_empty()
        && let Err(e) = index::forget(fs, &gone)
    {
        tracing::warn!("{e:#}");
    }
    gone.len()
}

/// The bytes of a conversation's history at most: under what a request to the model may
/// carry (32 MiB) and what a conversation file is read with ([`CONVERSATION_READ_BYTES`]).
pub const MAX_CONVERSATION_BYTES: usize = 24 << 20;

/// The JSON values of a conversation's history at most: under what a conversation file is
/// read with ([`CONVERSATION_READ_VALUES`]).
pub const MAX_CONVERSATION_VALUES: usize = 500_000;

/// The bytes of a conversation file Trellis reads, and writes, at most: its history
/// ([`MAX_CONVERSATION_BYTES`]) and the file's other keys. A larger file is refused unparsed:
/// the builder never writes one ([`save`] refuses it), and parsing a planted one whole would
/// cost the server memory many times its size at each read.
pub const CONVERSATION_READ_BYTES: u64 = 32 << 20;

/// The JSON values of a conversation file Trellis reads, and writes, at most (as
/// [`CONVERSATION_READ_BYTES`]).
pub const CONVERSATION_READ_VALUES: usize = 600_000;

/// One conversation file is parsed at a time in a process: a parse holds several times the
/// file's size until it ends, and many reads at once (a server's requests, sessions resumed
/// together) would multiply it.
static PARSING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The conversation file at `rel`, within [`CONVERSATION_READ_BYTES`] and
/// [`CONVERSATION_READ_VALUES`].
fn read_conversation(fs: &WorkspaceFs, rel: &Path) -> Result<ConversationFile> {
    let _parsing = PARSING.lock().unwrap_or_else(|e| e.into_inner());
    let file = parse_conversation(fs, rel);
    // The parse's tree is freed: its pages go back, whichever thread parses next.
    trellis_sandbox::heap::give_back();
    file
}

fn parse_conversation(fs: &WorkspaceFs, rel: &Path) -> Result<ConversationFile> {
    let shown = rel.display().to_string();
    let value = fs
        .read_json_value_within(rel, CONVERSATION_READ_BYTES, CONVERSATION_READ_VALUES)
        .map_err(|e| {
            anyhow::anyhow!(
                "{e} (a builder conversation is read within {CONVERSATION_READ_BYTES} bytes \
                 and {CONVERSATION_READ_VALUES} JSON values, the most the builder writes)"
            )
        })?;
    ConversationFile::from_json(&value, &shown)
}

/// The bytes of a message's text, and of a tool call's arguments, that a message cut to fit
/// the conversation's budget keeps.
pub const CUT_KEEP_BYTES: usize = 1 << 10;

/// Cuts the oldest messages' payloads (their text, their tool calls' arguments, to
/// [`CUT_KEEP_BYTES`] each, the cut marked) until the conversation fits
/// [`MAX_CONVERSATION_BYTES`] and [`MAX_CONVERSATION_VALUES`] as its file writes it; a model's
/// answer of a million values is kept as a line. When cutting is not enough (many small
/// messages), the oldest tool exchanges (an answer's tool calls with their results) go
/// whole, but the latest [`KEPT_RECENT`] messages: the operator's messages and the agent's
/// replies always stay, so no turn is lost. Returns how many messages were cut or dropped.
pub fn fit(history: &mut Vec<Message>, langchain_parts: bool) -> usize {
    let cut = fit_payloads(history, langchain_parts);
    cut + drop_old_exchanges(history, langchain_parts)
}

/// Messages at the end of a conversation [`fit`] never drops.
pub const KEPT_RECENT: usize = 64;

/// The bytes and values a message costs in its file.
fn message_cost(m: &Message, langchain_parts: bool) -> (usize, usize) {
    let factor = if langchain_parts { 2 } else { 1 };
    let bytes = serde_json::to_vec_pretty(m).map(|b| b.len()).unwrap_or(0);
    let text = serde_json::to_vec(m).unwrap_or_default();
    let values = trellis_sandbox::json_values::json_values(&text);
    (factor * (bytes + 4 * values), factor * values)
}

fn drop_old_exchanges(history: &mut Vec<Message>, langchain_parts: bool) -> usize {
    let costs: Vec<(usize, usize)> = history
        .iter()
        .map(|m| message_cost(m, langchain_parts))
        .collect();
    let mut bytes: usize = costs.iter().map(|c| c.0).sum();
    let mut values: usize = costs.iter().map(|c| c.1).sum();
    let fits = |b: usize, v: usize| b <= MAX_CONVERSATION_BYTES && v <= MAX_CONVERSATION_VALUES;
    if fits(bytes, values) {
        return 0;
    }
    let droppable = history.len().saturating_sub(KEPT_RECENT);
    let mut keep = vec![true; history.len()];
    for i in 0..droppable {
        if fits(bytes, values) {
            break;
        }
        let m = &history[i];
        let exchange =
            (m.role == Role::Assistant && !m.tool_calls.is_empty()) || m.role == Role::Tool;
        if exchange {
            keep[i] = false;
            bytes -= costs[i].0;
            values -= costs[i].1;
        }
    }
    // A tool result whose call went goes too, and a call whose results went: the
    // conversation a provider reads stays well formed.
    let mut dropped_calls = std::collections::HashSet::new();
    for (i, m) in history.iter().enumerate() {
        if !keep[i] {
            dropped_calls.extend(m.tool_calls.iter().map(|c| c.id.clone()));
        }
    }
    for (i, m) in history.iter().enumerate() {
        if m.role == Role::Tool
            && m.tool_call_id
                .as_ref()
                .is_some_and(|id| dropped_calls.contains(id))
        {
            keep[i] = false;
        }
    }
    let before = history.len();
    let mut flags = keep.into_iter();
    history.retain(|_| flags.next().unwrap_or(true));
    before - history.len()
}

fn fit_payloads(history: &mut [Message], langchain_parts: bool) -> usize {
    // A file with `parts` writes each message's payload twice; nested two levels deeper
    // in the file, each line takes four more bytes of indent.
    let cost = |m: &Message| message_cost(m, langchain_parts);
    let costs: Vec<(usize, usize)> = history.iter().map(cost).collect();
    let mut bytes: usize = costs.iter().map(|c| c.0).sum();
    let mut values: usize = costs.iter().map(|c| c.1).sum();
    let mut cut = 0;
    for (message, before) in history.iter_mut().zip(costs) {
        if bytes <= MAX_CONVERSATION_BYTES && values <= MAX_CONVERSATION_VALUES {
            break;
        }
        if cut_payload(message) {
            let after = cost(message);
            bytes = bytes - before.0 + after.0;
            values = values - before.1 + after.1;
            cut += 1;
        }
    }
    cut
}

/// Cuts `message`'s text and its tool calls' arguments to [`CUT_KEEP_BYTES`] each; whether
/// anything was cut.
fn cut_payload(message: &mut Message) -> bool {
    let mut cut = false;
    if message.content.len() > CUT_KEEP_BYTES {
        message.content = trellis_sandbox::cut::marked(&message.content, CUT_KEEP_BYTES);
        cut = true;
    }
    for call in &mut message.tool_calls {
        if call.arguments.len() > CUT_KEEP_BYTES {
            call.arguments = serde_json::json!({
                "cut": format!(
                    "{} bytes of arguments, cut from the conversation to keep it under its \
                     budget",
                    call.arguments.len()
                )
            })
            .to_string();
            cut = true;
        }
    }
    cut
}

/// Writes `file` at `rel` atomically and updates the index. Refuses (writing nothing) a
/// history with fewer user turns than the file already on disk: a restart must never shrink
/// a conversation.
pub fn save(fs: &WorkspaceFs, rel: &Path, file: &ConversationFile) -> Result<()> {
    let shown = rel.display().to_string();
    if fs.is_file(rel)
        && let Ok(on_disk) = read_conversation(fs, rel)
        && on_disk.user_turns() > file.user_turns()
    {
        bail!(
            "{shown}: refusing to write a conversation with {} user turns over one with {}: a \
             builder history never shrinks",
            file.user_turns(),
            on_disk.user_turns()
        );
    }
    let bytes = trellis_sandbox::store::json_bytes(&file.to_json())?;
    // What is written can be read back: a conversation is fitted ([`fit`]) before it is
    // saved, and one that still would not be read is not written.
    let values = trellis_sandbox::json_values::json_values(&bytes);
    if bytes.len() as u64 > CONVERSATION_READ_BYTES || values > CONVERSATION_READ_VALUES {
        bail!(
            "{shown}: not written: {} bytes and about {values} JSON values, more than a \
             builder conversation is read back with",
            bytes.len()
        );
    }
    fs.write_atomic(rel, &bytes)
        .with_context(|| format!("writing {shown}"))?;
    index::record(fs, rel, file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use trellis_sandbox::llm::ToolCall;

    #[test]
    fn a_conversation_of_many_small_exchanges_drops_the_oldest_and_keeps_every_turn() {
        let mut history = Vec::new();
        for turn in 0..300 {
            history.push(Message::user(format!("turn {turn}")));
            for call in 0..64 {
                let id = format!("c{turn}-{call}");
                history.push(Message {
                    role: Role::Assistant,
                    content: String::new(),
                    tool_calls: vec![ToolCall {
                        id: id.clone(),
                        name: "read_plan".into(),
                        arguments: r#"{"a":[1,2,3,4,5,6,7,8]}"#.into(),
                    }],
                    ..Message::user("")
                });
                history.push(Message::tool_result(id, r#"{"error":"no"}"#));
            }
        }
        let before = user_turns(&history);
        let values = |h: &[Message]| {
            trellis_sandbox::json_values::json_values(&serde_json::to_vec(h).unwrap())
        };
        assert!(
            values(&history) > MAX_CONVERSATION_VALUES,
            "{}",
            values(&history)
        );
        assert!(fit(&mut history, false) > 0);
        assert!(values(&history) <= MAX_CONVERSATION_VALUES);
        assert_eq!(user_turns(&history), before, "every turn stays");
        // Every tool result left answers a call left.
        let calls: std::collections::HashSet<&str> = history
            .iter()
            .flat_map(|m| m.tool_calls.iter().map(|c| c.id.as_str()))
            .collect();
        assert!(history.iter().filter(|m| m.role == Role::Tool).all(|m| {
            m.tool_call_id
                .as_deref()
                .is_some_and(|id| calls.contains(id))
        }));
        assert_eq!(history.last().unwrap().role, Role::Tool, "the latest stay");
    }

    /// The ids and files a removal of old firings' conversations goes by come from
    /// workspace files (`schedule-runs.json`, the index): ids by traversal, a date folder
    /// that is a link out of the workspace, an index naming a linked file, remove nothing
    /// outside `builder/conversation/` and follow no link.
    #[test]
    fn old_firings_conversations_are_removed_without_traversal_or_links() {
        let outer = tempfile::tempdir().unwrap();
        let root = outer.path().join("ws");
        let outside = outer.path().join("outside");
        std::fs::create_dir_all(root.join(CONVERSATION_DIR)).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let conversation = |id: &str| {
            let mut file = ConversationFile::new(id.into(), "run", "2026-01-01T00:00:00Z".into());
            file.updated_at = "2026-01-01T00:00:00Z".into();
            serde_json::to_string(&file.to_json()).unwrap()
        };
        for id in ["linked", "dirlinked", "relinked"] {
            let name = format!("session-{id}-conversation.json");
            std::fs::write(outside.join(&name), conversation(id)).unwrap();
        }
        let conv = root.join(CONVERSATION_DIR);
        std::os::unix::fs::symlink(&outside, conv.join("2026-01-02")).unwrap();
        std::os::unix::fs::symlink("../../../outside", conv.join("2026-01-03")).unwrap();
        std::fs::create_dir(conv.join("2026-01-04")).unwrap();
        std::os::unix::fs::symlink(
            outside.join("session-linked-conversation.json"),
            conv.join("2026-01-04/session-linked-conversation.json"),
        )
        .unwrap();
        let entry = |id: &str, file: String| {
            serde_json::json!({"session_id": id, "workshop_mode": "run",
                "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
                "message_count": 0, "first_query": null, "file": file})
        };
        let index = serde_json::json!({"sessions": [
            entry("dirlinked", format!("{CONVERSATION_DIR}/2026-01-02/session-dirlinked-conversation.json")),
            entry("relinked", format!("{CONVERSATION_DIR}/2026-01-03/session-relinked-conversation.json")),
        ]});
        std::fs::write(root.join(index::INDEX_FILE), index.to_string()).unwrap();
        let before: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(&outside)
            .unwrap()
            .map(|e| {
                let path = e.unwrap().path();
                let bytes = std::fs::read(&path).unwrap();
                (path, bytes)
            })
            .collect();
        let fs = WorkspaceFs::open(&root).unwrap();
        let ended = "9999-01-01T00:00:00Z".to_string();
        let firings: Vec<(String, String)> = [
            "../../outside/session-linked",
            "/etc/passwd",
            "linked",
            "dirlinked",
            "relinked",
        ]
        .iter()
        .map(|id| (id.to_string(), ended.clone()))
        .collect();
        assert_eq!(forget_run_sessions(&fs, &firings), 0);
        for (path, bytes) in before {
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "{}", path.display());
        }
        // The link itself is not followed, and stays for the operator to see.
        assert!(
            std::fs::symlink_metadata(conv.join("2026-01-04/session-linked-conversation.json"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }
}
