//! The numbered events of one builder session, kept for clients that come late or come back:
//! a stream resumes after the last event it saw (`Last-Event-ID`, `?since=`), and the polling
//! form reads the same log.

use std::sync::Mutex;

use serde_json::{Value, json};
use tokio::sync::watch;

use trellis_builder::BuilderEvent;

/// Events a session keeps; older ones are dropped first, and a client asking for them is
/// told where the log now starts.
pub const KEPT_EVENTS: usize = 10_000;

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
    events: std::collections::VecDeque<Value>,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog {
            inner: Mutex::new(Kept {
                first: 1,
                events: Default::default(),
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

    /// `value` with the workspace's host paths made relative, in every string.
    fn relative(&self, value: &mut Value) {
        match value {
            Value::String(text) => {
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
        if !self.roots.is_empty() {
            self.relative(&mut event);
        }
        let mut kept = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let id = kept.first + kept.events.len() as u64;
        event["id"] = json!(id);
        event["at_us"] = json!(at);
        kept.events.push_back(event);
        if kept.events.len() > KEPT_EVENTS {
            kept.events.pop_front();
            kept.first += 1;
        }
        drop(kept);
        self.last.send_replace(id);
        id
    }

    /// The events numbered after `since`, at most `max` of them.
    pub fn since(&self, since: u64, max: usize) -> Vec<Value> {
        let kept = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let skip = since.saturating_add(1).saturating_sub(kept.first);
        kept.events
            .iter()
            .skip(usize::try_from(skip).unwrap_or(usize::MAX))
            .take(max)
            .cloned()
            .collect()
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

/// A builder event as the API gives it.
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
