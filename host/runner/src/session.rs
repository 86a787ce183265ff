//! What a message sequence leaves behind (spec section 8): `session.json`, rewritten after
//! every item; `execution-final-summary.json`; and per turn
//! `logs/<step-id>/execution/execution-attempt-<A>-iteration-<I>.json` (summary) and
//! `...-conversation.json` (messages, LLM calls, tool calls).
//!
//! The field names and the places are the original system's: its readers (cost reviews, log
//! panes) list `logs/<step-id>/execution/` and find the final summary there too. A run
//! folder of the earlier Trellis layout kept the turn logs in `logs/<step-id>/` itself;
//! readers look in both ([`turn_log_dirs`]). Every
//! file is replaced atomically: the final summary at once ([`WorkspaceFs::write_json_atomic`]),
//! `session.json` and the turn logs on the writer thread of [`trellis_sandbox::store::write_behind`],
//! which the agent loop flushes at the end of each step; timestamps are RFC 3339 in UTC with
//! milliseconds (`2026-01-02T03:04:05.678Z`).

use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use trellis_sandbox::store::{WorkspaceFs, write_behind};

/// The file name of a session record.
pub const SESSION_FILE: &str = "session.json";
/// The file name of the final summary.
pub const FINAL_SUMMARY_FILE: &str = "execution-final-summary.json";
/// The schema version written in the final summary.
pub const FINAL_SUMMARY_SCHEMA_VERSION: u32 = 1;

pub use trellis_sandbox::store::{now_rfc3339, rfc3339};

/// How a session, an entry or a call ended (or that it has not yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Still going.
    Running,
    /// Done and accepted.
    Completed,
    /// Ended with an error, a failed gate or `STATUS: FAILED`.
    Failed,
    /// A stop request was honoured.
    Stopped,
    /// Not run (an entry skipped, say).
    Skipped,
}

impl Status {
    /// The word used in the files (`completed`) and in listings.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Stopped => "stopped",
            Status::Skipped => "skipped",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One item (or turn) of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionEntry {
    /// Unique in the session (`<item-id>`, `<item-id>-row-3`, `<item-id>-repair-1`, ...).
    pub entry_id: String,
    /// The item the entry belongs to.
    pub item_id: String,
    /// `user_message`, `foreach`, `prevalidation`, `reflection`.
    pub item_type: String,
    /// How it ended.
    pub status: Status,
    /// The agent's answer or the gate's verdict, short.
    pub summary: Option<String>,
    /// When it started.
    pub started_at: String,
    /// When it ended; `None` while running.
    pub ended_at: Option<String>,
}

/// `session.json`: one agent conversation of a step (or of a route's child).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    /// Unique per session.
    pub session_id: String,
    /// The step (or route) id.
    pub step_id: String,
    /// The run folder relative to `runs/` (`iteration-0`, `iteration-0/<group>`).
    pub run_folder: String,
    /// Where the session is.
    pub status: Status,
    /// When it was created.
    pub created_at: String,
    /// When it was last written.
    pub updated_at: String,
    /// The conversation so far, messages as the LLM layer writes them.
    pub conversation_history: Vec<Value>,
    /// How many turns ran.
    pub execution_turn_count: u64,
    /// The items and turns, in order.
    pub entries: Vec<SessionEntry>,
}

impl Session {
    /// A new running session with a fresh id.
    pub fn new(step_id: &str, run_folder: &str) -> Self {
        let now = now_rfc3339();
        Session {
            session_id: new_session_id(step_id),
            step_id: step_id.to_string(),
            run_folder: run_folder.to_string(),
            status: Status::Running,
            created_at: now.clone(),
            updated_at: now,
            conversation_history: Vec::new(),
            execution_turn_count: 0,
            entries: Vec::new(),
        }
    }

    /// Reads `dir/session.json`; `None` when there is none (a route called for the first time).
    /// Writes still queued are flushed first, so this reads what was last written.
    pub fn read(fs: &WorkspaceFs, dir: &Path) -> io::Result<Option<Self>> {
        write_behind::flush()?;
        match fs.read(dir.join(SESSION_FILE)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Stamps `updated_at` and writes `dir/session.json` atomically, off the caller's path
    /// ([`write_behind`]: [`write_behind::flush`] waits for it).
    pub fn write(&mut self, fs: &WorkspaceFs, dir: &Path) -> io::Result<()> {
        self.updated_at = now_rfc3339();
        write_behind::write_json(fs, &dir.join(SESSION_FILE), self)
    }

    /// Starts an entry (status running) and returns its index.
    pub fn start_entry(&mut self, entry_id: &str, item_id: &str, item_type: &str) -> usize {
        self.entries.push(SessionEntry {
            entry_id: entry_id.to_string(),
            item_id: item_id.to_string(),
            item_type: item_type.to_string(),
            status: Status::Running,
            summary: None,
            started_at: now_rfc3339(),
            ended_at: None,
        });
        self.entries.len() - 1
    }

    /// Ends entry `index` with a status and a summary.
    pub fn end_entry(&mut self, index: usize, status: Status, summary: Option<String>) {
        if let Some(entry) = self.entries.get_mut(index) {
            entry.status = status;
            entry.summary = summary;
            entry.ended_at = Some(now_rfc3339());
        }
    }
}

fn new_session_id(step_id: &str) -> String {
    use sha2::Digest;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let seed = format!("{step_id}/{nanos}/{}/{n}", std::process::id());
    let digest = hex::encode(sha2::Sha256::digest(seed.as_bytes()));
    format!("session-{}", &digest[..16])
}

/// `execution-final-summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinalSummary {
    /// [`FINAL_SUMMARY_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The step id.
    pub step_id: String,
    /// The run folder relative to `runs/`.
    pub run_folder: String,
    /// How the step ended.
    pub status: Status,
    /// The final answer of the agent, or the reason it failed.
    pub execution_result: Option<String>,
    /// The `CONCERNS:` lines of the step's replies.
    pub concerns: Vec<String>,
    /// When the step ended.
    pub completed_at: String,
}

impl FinalSummary {
    /// Writes `dir/execution-final-summary.json` atomically.
    pub fn write(&self, fs: &WorkspaceFs, dir: &Path) -> io::Result<()> {
        fs.write_json_atomic(dir.join(FINAL_SUMMARY_FILE), self)
    }

    /// Queues `dir/execution-final-summary.json` on the writer thread, after everything the
    /// step queued before it ([`write_behind`]: [`write_behind::flush`] waits for it).
    pub fn write_behind(&self, fs: &WorkspaceFs, dir: &Path) -> io::Result<()> {
        write_behind::write_json(fs, &dir.join(FINAL_SUMMARY_FILE), self)
    }
}

/// One tool call of a turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    /// The id the LLM gave the call.
    pub tool_call_id: String,
    /// `server:tool`, or a host tool's name.
    pub tool_name: String,
    /// The arguments as sent.
    pub args: Value,
    /// The result, when the call succeeded.
    pub result: Option<Value>,
    /// The error, when it failed.
    pub error: Option<String>,
    /// How long it took.
    pub duration_ms: u64,
    /// When it started.
    pub started_at: String,
    /// When it ended.
    pub completed_at: String,
    /// The tool is an external MCP server's, run outside the sandbox.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unsandboxed: bool,
}

/// A tool call the LLM asked for in one response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestedToolCall {
    /// The id the LLM gave the call.
    pub id: String,
    /// The tool name as the LLM wrote it.
    pub name: String,
    /// The arguments as the LLM wrote them.
    pub arguments: Value,
}

/// One LLM call of a turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmCallRecord {
    /// The turn number within the step (1-based).
    pub turn: u64,
    /// The provider plugin.
    pub provider: String,
    /// The model.
    pub model_id: String,
    /// `completed` or `failed`.
    pub status: Status,
    /// The error, when the call failed.
    pub error: Option<String>,
    /// When it started.
    pub started_at: String,
    /// When it ended.
    pub completed_at: String,
    /// How long it took.
    pub duration_ms: u64,
    /// Tokens of the prompt, as the provider counted them.
    pub prompt_tokens: u64,
    /// Tokens of the answer.
    pub completion_tokens: u64,
    /// Both.
    pub total_tokens: u64,
    /// The tool calls the answer asked for.
    pub tool_calls: Vec<RequestedToolCall>,
}

/// `execution-attempt-<A>-iteration-<I>.json`: the summary of one turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnSummary {
    /// The step id.
    pub step_id: String,
    /// The item id.
    pub item_id: String,
    /// The entry of `session.json` this turn belongs to.
    pub entry_id: String,
    /// The attempt of the step (1-based; a rerun after a prerequisite is a new attempt).
    pub attempt: u32,
    /// The turn within the attempt (1-based).
    pub iteration: u32,
    /// The provider of the last LLM call.
    pub provider: String,
    /// The model of the last LLM call.
    pub model_id: String,
    /// How the turn ended.
    pub status: Status,
    /// Why it failed, when it did.
    pub error: Option<String>,
    /// When it started.
    pub started_at: String,
    /// When it ended.
    pub completed_at: String,
    /// How long it took in all.
    pub duration_ms: u64,
    /// Time spent in LLM calls.
    pub llm_duration_ms: u64,
    /// Time spent in tool calls.
    pub tool_duration_ms: u64,
    /// LLM calls made.
    pub llm_call_count: u64,
    /// Tool calls made.
    pub tool_call_count: u64,
    /// Tool calls that failed.
    pub tool_error_count: u64,
    /// Prompt tokens of all LLM calls.
    pub prompt_tokens: u64,
    /// Completion tokens of all LLM calls.
    pub completion_tokens: u64,
    /// Both.
    pub total_tokens: u64,
}

/// `execution-attempt-<A>-iteration-<I>-conversation.json`: what one turn said and did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnConversation {
    /// The step id.
    pub step_id: String,
    /// The item id.
    pub item_id: String,
    /// The attempt (as in the summary).
    pub attempt: u32,
    /// The turn (as in the summary).
    pub iteration: u32,
    /// The messages of the turn, as the LLM layer writes them.
    pub messages: Vec<Value>,
    /// The LLM calls.
    pub llm_calls: Vec<LlmCallRecord>,
    /// The tool calls.
    pub tool_calls: Vec<ToolCallRecord>,
}

impl TurnSummary {
    /// Builds the summary of a turn from its calls: counts, timings and tokens add up.
    #[allow(clippy::too_many_arguments)]
    pub fn from_calls(
        conversation: &TurnConversation,
        entry_id: &str,
        status: Status,
        error: Option<String>,
        started_at: String,
        completed_at: String,
        duration_ms: u64,
    ) -> Self {
        let c = conversation;
        let last = c.llm_calls.last();
        let sum = |f: fn(&LlmCallRecord) -> u64| c.llm_calls.iter().map(f).sum::<u64>();
        TurnSummary {
            step_id: c.step_id.clone(),
            item_id: c.item_id.clone(),
            entry_id: entry_id.to_string(),
            attempt: c.attempt,
            iteration: c.iteration,
            provider: last.map(|l| l.provider.clone()).unwrap_or_default(),
            model_id: last.map(|l| l.model_id.clone()).unwrap_or_default(),
            status,
            error,
            started_at,
            completed_at,
            duration_ms,
            llm_duration_ms: sum(|l| l.duration_ms),
            tool_duration_ms: c.tool_calls.iter().map(|t| t.duration_ms).sum(),
            llm_call_count: c.llm_calls.len() as u64,
            tool_call_count: c.tool_calls.len() as u64,
            tool_error_count: c.tool_calls.iter().filter(|t| t.error.is_some()).count() as u64,
            prompt_tokens: sum(|l| l.prompt_tokens),
            completion_tokens: sum(|l| l.completion_tokens),
            total_tokens: sum(|l| l.total_tokens),
        }
    }
}

/// `runs/<run>/logs/<step-id>/`.
pub fn logs_dir(run_dir: &Path, step_id: &str) -> PathBuf {
    run_dir.join("logs").join(step_id)
}

/// The folder of the turn logs under a step's logs folder (the original's layout).
pub const TURN_LOGS_DIR: &str = "execution";

/// `<logs_dir>/execution/`: where the turn logs and a copy of the final summary go.
pub fn turn_logs_dir(logs_dir: &Path) -> PathBuf {
    logs_dir.join(TURN_LOGS_DIR)
}

/// Where a reader looks for the turn logs of `logs_dir`, newest layout first:
/// `<logs_dir>/execution/`, then `<logs_dir>/` itself (run folders written before the turn
/// logs moved).
pub fn turn_log_dirs(logs_dir: &Path) -> [PathBuf; 2] {
    [turn_logs_dir(logs_dir), logs_dir.to_path_buf()]
}

/// The two log files of turn `iteration` of attempt `attempt` in `dir` (a folder of
/// [`turn_log_dirs`]): (summary, conversation).
pub fn turn_log_paths(logs_dir: &Path, attempt: u32, iteration: u32) -> (PathBuf, PathBuf) {
    let base = format!("execution-attempt-{attempt}-iteration-{iteration}");
    (
        logs_dir.join(format!("{base}.json")),
        logs_dir.join(format!("{base}-conversation.json")),
    )
}

/// Writes both log files of a turn to `<logs_dir>/execution/` atomically, off the caller's
/// path ([`write_behind`]: [`write_behind::flush`] waits for them); returns their paths.
pub fn write_turn_logs(
    fs: &WorkspaceFs,
    logs_dir: &Path,
    summary: &TurnSummary,
    conversation: &TurnConversation,
) -> io::Result<(PathBuf, PathBuf)> {
    let (s, c) = turn_log_paths(&turn_logs_dir(logs_dir), summary.attempt, summary.iteration);
    write_behind::write_json(fs, &c, conversation)?;
    write_behind::write_json(fs, &s, summary)?;
    Ok((s, c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys(v: &Value) -> Vec<String> {
        v.as_object().unwrap().keys().cloned().collect()
    }

    fn sorted(v: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_123);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20.123Z");
        let now = now_rfc3339();
        assert!(humantime::parse_rfc3339(&now).is_ok(), "{now}");
        assert!(now.ends_with('Z'), "{now}");
    }

    #[test]
    fn session_round_trips_with_the_spec_field_names() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Session::new("triage", "iteration-0");
        let other = Session::new("triage", "iteration-0");
        assert_ne!(s.session_id, other.session_id);
        let i = s.start_entry("tickets-row-1", "tickets", "foreach");
        s.conversation_history
            .push(json!({"role": "user", "content": "hi"}));
        s.execution_turn_count = 1;
        s.end_entry(i, Status::Completed, Some("done".into()));
        s.status = Status::Completed;
        s.write(
            &trellis_sandbox::store::WorkspaceFs::open(dir.path()).unwrap(),
            dir.path(),
        )
        .unwrap();
        write_behind::flush().unwrap();

        let raw: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join(SESSION_FILE)).unwrap())
                .unwrap();
        let mut got = keys(&raw);
        got.sort();
        assert_eq!(
            got,
            sorted(&[
                "session_id",
                "step_id",
                "run_folder",
                "status",
                "created_at",
                "updated_at",
                "conversation_history",
                "execution_turn_count",
                "entries"
            ])
        );
        let mut got = keys(&raw["entries"][0]);
        got.sort();
        assert_eq!(
            got,
            sorted(&[
                "entry_id",
                "item_id",
                "item_type",
                "status",
                "summary",
                "started_at",
                "ended_at"
            ])
        );
        assert_eq!(raw["status"], "completed");
        assert_eq!(raw["entries"][0]["status"], "completed");
        assert_eq!(
            Session::read(
                &trellis_sandbox::store::WorkspaceFs::open(dir.path()).unwrap(),
                dir.path()
            )
            .unwrap()
            .unwrap(),
            s
        );
        assert_eq!(
            Session::read(
                &trellis_sandbox::store::WorkspaceFs::open(dir.path()).unwrap(),
                &dir.path().join("none")
            )
            .unwrap(),
            None
        );
    }

    #[test]
    fn summary_and_turn_logs_are_written_atomically_with_the_spec_names() {
        let dir = tempfile::tempdir().unwrap();
        FinalSummary {
            schema_version: FINAL_SUMMARY_SCHEMA_VERSION,
            step_id: "triage".into(),
            run_folder: "iteration-0".into(),
            status: Status::Failed,
            execution_result: Some("STATUS: FAILED no data".into()),
            concerns: vec!["slow".into()],
            completed_at: now_rfc3339(),
        }
        .write(
            &trellis_sandbox::store::WorkspaceFs::open(dir.path()).unwrap(),
            dir.path(),
        )
        .unwrap();
        let raw: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(FINAL_SUMMARY_FILE)).unwrap())
                .unwrap();
        let mut got = keys(&raw);
        got.sort();
        assert_eq!(
            got,
            sorted(&[
                "schema_version",
                "step_id",
                "run_folder",
                "status",
                "execution_result",
                "concerns",
                "completed_at"
            ])
        );

        let llm = |tokens: u64, ms: u64| LlmCallRecord {
            turn: 1,
            provider: "replay".into(),
            model_id: "m".into(),
            status: Status::Completed,
            error: None,
            started_at: now_rfc3339(),
            completed_at: now_rfc3339(),
            duration_ms: ms,
            prompt_tokens: tokens,
            completion_tokens: 1,
            total_tokens: tokens + 1,
            tool_calls: vec![RequestedToolCall {
                id: "c1".into(),
                name: "workspace:read_file".into(),
                arguments: json!({"path": "x"}),
            }],
        };
        let conversation = TurnConversation {
            step_id: "triage".into(),
            item_id: "tickets".into(),
            attempt: 1,
            iteration: 2,
            messages: vec![json!({"role": "user", "content": "go"})],
            llm_calls: vec![llm(10, 5), llm(20, 7)],
            tool_calls: vec![ToolCallRecord {
                tool_call_id: "c1".into(),
                tool_name: "workspace:read_file".into(),
                args: json!({"path": "x"}),
                result: None,
                error: Some("not-found".into()),
                duration_ms: 3,
                started_at: now_rfc3339(),
                completed_at: now_rfc3339(),
                unsandboxed: false,
            }],
        };
        let summary = TurnSummary::from_calls(
            &conversation,
            "tickets-row-2",
            Status::Completed,
            None,
            now_rfc3339(),
            now_rfc3339(),
            20,
        );
        assert_eq!(
            (
                summary.prompt_tokens,
                summary.total_tokens,
                summary.llm_duration_ms,
                summary.tool_error_count
            ),
            (30, 32, 12, 1)
        );
        let logs = logs_dir(dir.path(), "triage");
        let (s, c) = write_turn_logs(
            &trellis_sandbox::store::WorkspaceFs::open(dir.path()).unwrap(),
            &logs,
            &summary,
            &conversation,
        )
        .unwrap();
        write_behind::flush().unwrap();
        assert!(s.ends_with("logs/triage/execution/execution-attempt-1-iteration-2.json"));
        assert!(
            c.ends_with("logs/triage/execution/execution-attempt-1-iteration-2-conversation.json")
        );
        let raw: Value = serde_json::from_slice(&std::fs::read(&c).unwrap()).unwrap();
        let mut got = keys(&raw["tool_calls"][0]);
        got.sort();
        assert_eq!(
            got,
            sorted(&[
                "tool_call_id",
                "tool_name",
                "args",
                "result",
                "error",
                "duration_ms",
                "started_at",
                "completed_at"
            ])
        );
        let mut got = keys(&raw["llm_calls"][0]);
        got.sort();
        assert_eq!(
            got,
            sorted(&[
                "turn",
                "provider",
                "model_id",
                "status",
                "error",
                "started_at",
                "completed_at",
                "duration_ms",
                "prompt_tokens",
                "completion_tokens",
                "total_tokens",
                "tool_calls"
            ])
        );
        let back: TurnConversation = serde_json::from_value(raw).unwrap();
        assert_eq!(back, conversation);
        let names: Vec<_> = std::fs::read_dir(&logs)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(".trellis-"))
            .collect();
        assert!(names.is_empty(), "temp files left: {names:?}");
    }
}
