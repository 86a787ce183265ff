//! The numbered events of one builder session, kept for clients that come late or come back:
//! a stream resumes after the last event it saw (`Last-Event-ID`, `?since=`), and the polling
//! form reads the same log.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::watch;

use trellis_builder::BuilderEvent;
use trellis_sandbox::llm::ReplyEvent;

/// Events a session keeps; older ones are dropped first, and a client asking for them is
/// told where the log now starts.
pub const KEPT_EVENTS: usize = 10_000;

/// Bytes of events (as JSON) a log keeps; older ones are dropped first past it.
pub const KEPT_BYTES: usize = 16 << 20;

/// Bytes of one string an event keeps (a model's reply, a query): the rest is cut, marked.
pub const EVENT_STRING_BYTES: usize = 64 << 10;

/// Bytes of events one read ([`EventLog::since`]) gives at most; at least one event.
pub const READ_BYTES: usize = 4 << 20;

/// The events of one session, numbered from 1.
#[derive(Debug)]
pub struct EventLog {
    inner: Mutex<Kept>,
    /// The number of the last event, for streams waiting on the next one.
    last: watch::Sender<u64>,
    /// The workspace folder as the host names it (given and canonical, longest first):
    /// events name its files relative to it, never by their host path.
    roots: Vec<String>,
}

#[derive(Debug, Default)]
struct Kept {
    /// The number of `events[0]`.
    first: u64,
    /// Each event and its bytes as JSON.
    events: std::collections::VecDeque<(Value, usize)>,
    /// The bytes of them all.
    bytes: usize,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog {
            inner: Mutex::new(Kept {
                first: 1,
                events: Default::default(),
                bytes: 0,
            }),
            last: watch::channel(0).0,
            roots: Vec::new(),
        }
    }
}

impl EventLog {
    /// The log of the events of workspace `root`: every host path under it in an event's
    /// strings is written relative to it (`/srv/ws/runs/x` as `runs/x`, the folder itself
    /// as `.`), so a client sees where things are in the workspace, not on the host.
    pub fn for_workspace(root: &std::path::Path) -> Self {
        let mut roots: Vec<String> = [Some(root.to_path_buf()), root.canonicalize().ok()]
            .into_iter()
            .flatten()
            .map(|p| p.display().to_string().trim_end_matches('/').to_string())
            .filter(|p| !p.is_empty())
            .collect();
        roots.sort_by_key(|r| std::cmp::Reverse(r.len()));
        roots.dedup();
        EventLog {
            roots,
            ..EventLog::default()
        }
    }

    /// `value` with the workspace's host paths made relative, and each string cut to
    /// [`EVENT_STRING_BYTES`].
    fn relative(&self, value: &mut Value) {
        match value {
            Value::String(text) => {
                if text.len() > EVENT_STRING_BYTES {
                    *text = trellis_sandbox::cut::marked(text, EVENT_STRING_BYTES);
                }
                for root in &self.roots {
                    if text.contains(root.as_str()) {
                        *text = text
                            .replace(&format!("{root}/"), "")
                            .replace(root.as_str(), ".");
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.relative(v)),
            Value::Object(map) => map.values_mut().for_each(|v| self.relative(v)),
            _ => {}
        }
    }

    /// Appends `event` (an object with a `type`), numbering it and stamping it with the time
    /// (`at_us`: microseconds since the Unix epoch); returns its number.
    pub fn push(&self, mut event: Value) -> u64 {
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        self.relative(&mut event);
        let mut kept = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let id = kept.first + kept.events.len() as u64;
        event["id"] = json!(id);
        event["at_us"] = json!(at);
        let bytes = serde_json::to_vec(&event).map_or(0, |b| b.len());
        kept.events.push_back((event, bytes));
        kept.bytes += bytes;
        while kept.events.len() > 1 && (kept.events.len() > KEPT_EVENTS || kept.bytes > KEPT_BYTES)
        {
            if let Some((_, gone)) = kept.events.pop_front() {
                kept.bytes -= gone;
            }
            kept.first += 1;
        }
        drop(kept);
        self.last.send_replace(id);
        id
    }

    /// The events numbered after `since`, at most `max` of them and [`READ_BYTES`] (at
    /// least one).
    pub fn since(&self, since: u64, max: usize) -> Vec<Value> {
        let kept = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let skip = since.saturating_add(1).saturating_sub(kept.first);
        let mut bytes = 0;
        kept.events
            .iter()
            .skip(usize::try_from(skip).unwrap_or(usize::MAX))
            .take(max)
            .take_while(|(_, b)| {
                let first = bytes == 0;
                bytes += b;
                first || bytes <= READ_BYTES
            })
            .map(|(v, _)| v.clone())
            .collect()
    }

    /// A log whose events are numbered from `first` (a session restored after events of
    /// its own were given out: a client resuming after them must not miss new ones).
    pub fn numbered_from(mut self, first: u64) -> Self {
        self.inner
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .first = first.max(1);
        self.last.send_replace(first.max(1) - 1);
        self
    }

    /// The number of the last event (0 before the first).
    pub fn last(&self) -> u64 {
        *self.last.borrow()
    }

    /// A receiver told of each new event's number.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.last.subscribe()
    }
}

/// The shortest time between two text events of one reply in a log: a fast model's pieces
/// are joined, so a browser gets at most one such event per this long from each reply.
pub const PIECE_INTERVAL: Duration = Duration::from_millis(50);

/// Puts the text pieces of one reply source (a session's agent, an execution) into a log,
/// joined to at most one event per [`PIECE_INTERVAL`]; every other event of the source goes
/// through [`Joiner::push`], after the text waiting, so nothing overtakes it. The last
/// pieces are given at most [`PIECE_INTERVAL`] after they came (a task on the current tokio
/// runtime waits for them; without one they go at once).
#[derive(Clone)]
pub struct Joiner {
    log: Arc<EventLog>,
    event: Arc<MakeEvent>,
    pending: Arc<Mutex<Pending>>,
}

/// How a [`Joiner`] makes the event of joined text: from its source and the text.
type MakeEvent = dyn Fn(&str, String) -> Value + Send + Sync;

#[derive(Default)]
struct Pending {
    /// The source of the text waiting (a step id), and the text.
    text: Option<(String, String)>,
    last: Option<Instant>,
    scheduled: bool,
}

impl Joiner {
    /// A joiner into `log`, making each text event with `event(source, text)`.
    pub fn new(
        log: Arc<EventLog>,
        event: impl Fn(&str, String) -> Value + Send + Sync + 'static,
    ) -> Self {
        Joiner {
            log,
            event: Arc::new(event),
            pending: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A piece of text from `source`.
    pub fn piece(&self, source: &str, text: &str) {
        let mut pending = self.lock();
        if pending.text.as_ref().is_some_and(|(s, _)| s != source) {
            self.flush_locked(&mut pending);
        }
        match &mut pending.text {
            Some((_, waiting)) => waiting.push_str(text),
            None => pending.text = Some((source.to_string(), text.to_string())),
        }
        if pending.scheduled {
            return;
        }
        let since = pending.last.map(|last| last.elapsed());
        match since {
            Some(since) if since < PIECE_INTERVAL => {
                if let Ok(handle) = tokio::runtime::Handle::try_current() {
                    pending.scheduled = true;
                    let this = self.clone();
                    handle.spawn(async move {
                        tokio::time::sleep(PIECE_INTERVAL - since).await;
                        let mut pending = this.lock();
                        pending.scheduled = false;
                        this.flush_locked(&mut pending);
                    });
                } else {
                    self.flush_locked(&mut pending);
                }
            }
            _ => self.flush_locked(&mut pending),
        }
    }

    /// Another event of the source, after the text waiting.
    pub fn push(&self, event: Value) {
        let mut pending = self.lock();
        self.flush_locked(&mut pending);
        self.log.push(event);
    }

    /// The text waiting goes into the log now (under the lock: events keep their order).
    fn flush_locked(&self, pending: &mut Pending) {
        if let Some((source, text)) = pending.text.take() {
            pending.last = Some(Instant::now());
            self.log.push((self.event)(&source, text));
        }
    }
}

impl std::fmt::Debug for Joiner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Joiner").finish_non_exhaustive()
    }
}

/// A builder event as the API gives it (a text piece alone, as `text_delta`: a session's
/// log gets them joined, through [`Joiner`]).
pub fn builder_event(event: &BuilderEvent) -> Value {
    match event {
        BuilderEvent::TurnStarted { message } => {
            json!({"type": "turn_started", "message": message})
        }
        BuilderEvent::TurnEnded { report } => json!({
            "type": "turn_ended",
            "text": report.text,
            "ended_normally": report.ended_normally,
            "error": report.error,
            "tool_calls": report.tool_calls,
            "usage": report.usage,
        }),
        BuilderEvent::AgentText(text) => json!({"type": "text", "text": text}),
        BuilderEvent::ToolStarted {
            id,
            name,
            arguments,
        } => json!({"type": "tool_started", "call_id": id, "name": name, "arguments": arguments}),
        BuilderEvent::ToolEnded {
            id,
            name,
            ok,
            summary,
        } => json!({"type": "tool_ended", "call_id": id, "name": name, "ok": ok,
                    "summary": summary}),
        BuilderEvent::Execution { id, line } => {
            json!({"type": "execution", "execution_id": id, "line": line})
        }
        BuilderEvent::Reply(ReplyEvent::Text(text)) => text_delta(text.clone()),
        BuilderEvent::Reply(ReplyEvent::ToolCall { index, name }) => {
            json!({"type": "reply_tool_call", "index": index, "name": name})
        }
        BuilderEvent::Reply(ReplyEvent::Restarted { reason }) => {
            json!({"type": "reply_restarted", "reason": reason})
        }
    }
}

/// The event of text of the agent's reply as it arrives.
pub fn text_delta(text: String) -> Value {
    json!({"type": "text_delta", "text": text})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_keeps_a_bounded_number_of_bytes_and_a_read_gives_a_bounded_answer() {
        let log = EventLog::default();
        let reply = "x".repeat(4 << 20);
        for _ in 0..40 {
            log.push(json!({"type": "text", "text": reply}));
        }
        let kept = log.since(0, usize::MAX);
        let text = kept[0]["text"].as_str().unwrap();
        assert!(text.len() < EVENT_STRING_BYTES + 64, "{}", text.len());
        assert!(text.ends_with(&format!(
            "[cut: {} bytes, limit {EVENT_STRING_BYTES}]",
            4 << 20
        )));
        assert_eq!(kept.last().unwrap()["id"], 40);
        let all: usize = kept.iter().map(|e| e.to_string().len()).sum();
        assert!(all <= READ_BYTES + EVENT_STRING_BYTES, "{all}");
        let log = EventLog::default().numbered_from(41);
        assert_eq!(log.push(json!({"type": "text", "text": "again"})), 41);
    }

    #[test]
    fn events_name_the_workspaces_files_relative_to_it() {
        let log = EventLog::for_workspace(std::path::Path::new("/srv/ws/"));
        let root = "/srv/ws";
        log.push(
            json!({"type": "execution", "line": format!("reading {root}/runs/a.json"),
                        "more": [format!("{root}")]}),
        );
        let event = &log.since(0, 1)[0];
        assert_eq!(event["line"], "reading runs/a.json");
        assert_eq!(event["more"][0], ".");
    }

    #[test]
    fn events_are_numbered_and_read_after_a_number() {
        let log = EventLog::default();
        for i in 0..5 {
            assert_eq!(log.push(json!({"type": "text", "text": i})), i + 1);
        }
        let after: Vec<u64> = log
            .since(2, 10)
            .iter()
            .map(|e| e["id"].as_u64().unwrap())
            .collect();
        assert_eq!(after, [3, 4, 5]);
        assert_eq!(log.since(2, 1).len(), 1);
        assert!(log.since(5, 10).is_empty());
        assert_eq!(log.last(), 5);
    }

    #[test]
    fn the_oldest_events_go_first_and_numbers_go_on() {
        let log = EventLog::default();
        for _ in 0..KEPT_EVENTS + 3 {
            log.push(json!({"type": "text"}));
        }
        let all = log.since(0, usize::MAX);
        assert_eq!(all.len(), KEPT_EVENTS);
        assert_eq!(all[0]["id"], 4);
        assert_eq!(all.last().unwrap()["id"], (KEPT_EVENTS + 3) as u64);
    }
}
