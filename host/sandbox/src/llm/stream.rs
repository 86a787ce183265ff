//! Replies as they arrive: the pieces a provider of the 0.3.0 world reports while it reads
//! its model's answer (`trellis:plugin/reply`), bounded and cleaned by the host before a
//! front end sees them.
//!
//! A caller that wants to show a reply early hands a [`ReplyStream`] to the completion. The
//! host passes on the answer's text and the names of the tool calls as they begin
//! ([`ReplyEvent`]); tool arguments and usage stay inside (the whole answer, which the
//! completion returns, has them). With a key set, text is held back by
//! [`MIN_SECRET_CHARS`](super::MIN_SECRET_CHARS)` - 1` bytes and redacted before it goes
//! out, so no piece of the key long enough to be hidden in the whole answer is shown across
//! two pieces either. A retry after pieces were shown says so ([`ReplyEvent::Restarted`]):
//! what was shown of the failed attempt is dropped. The same stream records where the
//! pieces fell ([`ReplyStream::chunks_of`]), for a cassette to replay them.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::{MIN_SECRET_CHARS, Response, Usage, redact_secrets};

/// Pieces one reply may report; the rest are dropped (the answer itself is whole).
pub const MAX_REPLY_PIECES: usize = 65_536;

/// One piece of a reply, as a provider reports it and a cassette keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delta {
    /// More text of the answer.
    Text(String),
    /// More of a tool call.
    ToolCall(ToolCallPiece),
    /// The usage so far.
    Usage(Usage),
}

/// A piece of a tool call the model is writing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallPiece {
    /// Which call of the answer, from 0.
    pub index: u32,
    /// The call's id, in its first piece.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The call's full name, in its first piece.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The next piece of its arguments' JSON text.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub arguments: String,
}

impl Delta {
    /// The bytes of text the piece carries, as counted against a reply's bound.
    fn size(&self) -> usize {
        match self {
            Delta::Text(text) => text.len(),
            Delta::ToolCall(piece) => piece
                .arguments
                .len()
                .saturating_add(piece.id.as_ref().map_or(0, String::len))
                .saturating_add(piece.name.as_ref().map_or(0, String::len)),
            Delta::Usage(_) => 0,
        }
    }
}

/// What a front end sees of a reply as it arrives.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ReplyEvent {
    /// More text of the answer.
    Text(String),
    /// The model began a tool call.
    ToolCall {
        /// Which call of the answer, from 0.
        index: u32,
        /// Its full name.
        name: String,
    },
    /// An attempt that had shown pieces failed and another one starts: what was shown of
    /// this reply is void.
    Restarted {
        /// Why the attempt failed.
        reason: String,
    },
}

/// Where the pieces of one attempt fell, by kind and length: what a recording needs to cut
/// the whole answer again at the same places.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    Text(usize),
    ToolCall { index: u32, arguments: usize },
    Usage,
}

type Sink = Arc<dyn Fn(ReplyEvent) + Send + Sync>;

/// A caller's view of the replies of one model call (its attempts, retries and fallbacks
/// included): whether to stream, who sees the pieces, and where they fell. Clones share it.
#[derive(Clone)]
pub struct ReplyStream {
    streaming: bool,
    sink: Option<Sink>,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for ReplyStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyStream")
            .field("streaming", &self.streaming)
            .field("sink", &self.sink.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    /// The pieces of the current attempt.
    marks: Vec<Mark>,
    /// Whether the current attempt showed anything.
    shown: bool,
    /// Text received and not yet shown (the hold-back while a key is set).
    pending: String,
    /// The current attempt's pieces and bytes, against the bounds.
    pieces: usize,
    bytes: usize,
    full: bool,
    /// Tool calls whose name was shown.
    named: Vec<u32>,
}

impl ReplyStream {
    /// Pieces go to `sink` as they arrive; `streaming` says whether providers are asked to
    /// stream at all (`false`: the workflow turned streaming off).
    pub fn new(streaming: bool, sink: impl Fn(ReplyEvent) + Send + Sync + 'static) -> Self {
        ReplyStream {
            streaming,
            sink: Some(Arc::new(sink)),
            state: Arc::default(),
        }
    }

    /// A stream nobody watches, for a recording's chunks alone.
    pub fn unwatched(streaming: bool) -> Self {
        ReplyStream {
            streaming,
            sink: None,
            state: Arc::default(),
        }
    }

    /// Whether providers are asked to stream.
    pub fn streaming(&self) -> bool {
        self.streaming
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn emit(&self, event: ReplyEvent) {
        if let Some(sink) = &self.sink {
            sink(event);
        }
    }

    /// A new attempt starts: the pieces of the last one are dropped, and a front end that
    /// showed some is told why.
    pub(crate) fn restart(&self, reason: &str) {
        let shown = {
            let mut state = self.state();
            let shown = state.shown;
            *state = State::default();
            shown
        };
        if shown {
            self.emit(ReplyEvent::Restarted {
                reason: reason.to_string(),
            });
        }
    }

    /// Takes the pieces of one report, within the reply's bounds (`max_bytes` of text, at
    /// most [`MAX_REPLY_PIECES`]); `false` once the reply is over them. `secrets` are
    /// hidden from what is shown.
    pub(crate) fn report(&self, deltas: Vec<Delta>, max_bytes: usize, secrets: &[String]) -> bool {
        let mut events = Vec::new();
        let accepted = {
            let mut state = self.state();
            for delta in deltas {
                if state.full {
                    break;
                }
                let size = delta.size();
                if state.pieces >= MAX_REPLY_PIECES || state.bytes.saturating_add(size) > max_bytes
                {
                    state.full = true;
                    break;
                }
                state.pieces += 1;
                state.bytes += size;
                match delta {
                    Delta::Text(text) => {
                        state.marks.push(Mark::Text(text.len()));
                        state.pending.push_str(&text);
                        // Each piece goes out as it came (with a key, what the hold-back
                        // lets out of it).
                        if let Some(text) = release(&mut state.pending, secrets, false) {
                            events.push(ReplyEvent::Text(text));
                        }
                    }
                    Delta::ToolCall(piece) => {
                        state.marks.push(Mark::ToolCall {
                            index: piece.index,
                            arguments: piece.arguments.len(),
                        });
                        if let Some(name) = piece.name
                            && !state.named.contains(&piece.index)
                        {
                            state.named.push(piece.index);
                            events.push(ReplyEvent::ToolCall {
                                index: piece.index,
                                name: redact_secrets(&name, secrets),
                            });
                        }
                    }
                    Delta::Usage(_) => state.marks.push(Mark::Usage),
                }
            }
            state.shown |= !events.is_empty();
            !state.full
        };
        for event in events {
            self.emit(event);
        }
        accepted
    }

    /// The attempt ended: the text held back is shown.
    pub(crate) fn finish(&self, secrets: &[String]) {
        let text = release(&mut self.state().pending, secrets, true);
        if let Some(text) = text {
            self.state().shown = true;
            self.emit(ReplyEvent::Text(text));
        }
    }

    /// `response` cut where the last attempt's pieces fell: its text at the text pieces'
    /// lengths, each tool call's arguments at its pieces' (the call's id and name in its
    /// first piece), usage once where it came. Empty when nothing was reported. The pieces
    /// are cut from the answer the host keeps (redacted as a whole), not copied from what
    /// the provider sent, so a recording holds nothing the answer does not.
    pub fn chunks_of(&self, response: &Response) -> Vec<Delta> {
        let marks = self.state().marks.clone();
        let mut chunks = Vec::with_capacity(marks.len().min(1 << 16));
        let mut text_at = 0;
        let mut args_at = vec![0usize; response.tool_calls.len()];
        let mut begun = vec![false; response.tool_calls.len()];
        let mut usage_given = false;
        for mark in marks {
            match mark {
                Mark::Text(len) => {
                    let piece = cut(&response.text, &mut text_at, len);
                    if !piece.is_empty() {
                        chunks.push(Delta::Text(piece.to_string()));
                    }
                }
                Mark::ToolCall { index, arguments } => {
                    let i = index as usize;
                    let Some(call) = response.tool_calls.get(i) else {
                        continue;
                    };
                    let first = !begun[i];
                    begun[i] = true;
                    let piece = cut(&call.arguments, &mut args_at[i], arguments);
                    chunks.push(Delta::ToolCall(ToolCallPiece {
                        index,
                        id: first.then(|| call.id.clone()),
                        name: first.then(|| call.name.clone()),
                        arguments: piece.to_string(),
                    }));
                }
                Mark::Usage if !usage_given => {
                    usage_given = true;
                    chunks.push(Delta::Usage(response.usage));
                }
                Mark::Usage => {}
            }
        }
        if chunks.is_empty() {
            return chunks;
        }
        let mut chunks = join_to(chunks, super::record::MAX_RECORDED_CHUNKS - 2);
        // Whatever the pieces did not cover (a provider that reported less than it
        // returned) ends the recording, so the chunks always add up to the answer.
        if text_at < response.text.len() {
            chunks.push(Delta::Text(response.text[text_at..].to_string()));
        }
        for (i, call) in response.tool_calls.iter().enumerate() {
            if !begun[i] || args_at[i] < call.arguments.len() {
                chunks.push(Delta::ToolCall(ToolCallPiece {
                    index: i as u32,
                    id: (!begun[i]).then(|| call.id.clone()),
                    name: (!begun[i]).then(|| call.name.clone()),
                    arguments: call.arguments[args_at[i]..].to_string(),
                }));
            }
        }
        chunks
    }
}

/// `chunks` with neighbouring text pieces (and neighbouring pieces of one tool call)
/// joined, evenly, until at most about `max` are left: a recording keeps where a long reply's
/// pieces fell in coarser steps, never more than a replay takes.
fn join_to(chunks: Vec<Delta>, max: usize) -> Vec<Delta> {
    if chunks.len() <= max {
        return chunks;
    }
    let group = chunks.len().div_ceil(max);
    let mut out: Vec<Delta> = Vec::with_capacity(max + 1);
    let mut run = 0;
    for chunk in chunks {
        let joined = match (out.last_mut(), &chunk) {
            (Some(Delta::Text(last)), Delta::Text(next)) if run < group => {
                last.push_str(next);
                true
            }
            (Some(Delta::ToolCall(last)), Delta::ToolCall(next))
                if run < group && last.index == next.index && next.id.is_none() =>
            {
                last.arguments.push_str(&next.arguments);
                true
            }
            _ => false,
        };
        if joined {
            run += 1;
        } else {
            out.push(chunk);
            run = 1;
        }
    }
    out
}

/// The next `len` bytes of `text` from `*at` (to a character boundary), moving `*at`.
fn cut<'t>(text: &'t str, at: &mut usize, len: usize) -> &'t str {
    let start = (*at).min(text.len());
    let mut end = start.saturating_add(len).min(text.len());
    while !text.is_char_boundary(end) {
        end += 1;
    }
    *at = end;
    &text[start..end]
}

/// What of `pending` may be shown now: all of it without secrets or at the end; else
/// all but the last `MIN_SECRET_CHARS - 1` bytes, redacted, the rest kept.
fn release(pending: &mut String, secrets: &[String], end: bool) -> Option<String> {
    if pending.is_empty() {
        return None;
    }
    let secrets: Vec<&String> = secrets
        .iter()
        .filter(|s| s.len() >= MIN_SECRET_CHARS)
        .collect();
    if secrets.is_empty() {
        return Some(std::mem::take(pending));
    }
    let redacted = redact_secrets(pending, &secrets);
    let hold = if end { 0 } else { MIN_SECRET_CHARS - 1 };
    let mut at = redacted.len().saturating_sub(hold);
    while !redacted.is_char_boundary(at) {
        at -= 1;
    }
    *pending = redacted[at..].to_string();
    (at > 0).then(|| redacted[..at].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::{StopReason, ToolCall};

    fn collect(streaming: bool) -> (ReplyStream, Arc<Mutex<Vec<ReplyEvent>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let stream = ReplyStream::new(streaming, move |e| log.lock().unwrap().push(e));
        (stream, seen)
    }

    fn text(seen: &Arc<Mutex<Vec<ReplyEvent>>>) -> String {
        seen.lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                ReplyEvent::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_key_split_over_pieces_is_never_shown_in_eight_bytes() {
        let key = "sk-live-0123456789abcdef".to_string();
        let (stream, seen) = collect(true);
        let pieces = [
            "the key is ",
            "sk-l",
            "ive-0123",
            "4567",
            "89abcdef",
            " done",
        ];
        for piece in pieces {
            assert!(stream.report(
                vec![Delta::Text(piece.to_string())],
                1 << 20,
                std::slice::from_ref(&key)
            ));
        }
        stream.finish(std::slice::from_ref(&key));
        let shown = text(&seen);
        assert!(shown.starts_with("the key is [REDACTED]"), "{shown}");
        assert!(shown.ends_with(" done"), "{shown}");
        for window in key.as_bytes().windows(MIN_SECRET_CHARS) {
            let window = std::str::from_utf8(window).unwrap();
            assert!(!shown.contains(window), "{window:?} shown in {shown:?}");
        }
    }

    #[test]
    fn without_a_key_text_goes_out_as_it_comes() {
        let (stream, seen) = collect(true);
        stream.report(vec![Delta::Text("Hel".into())], 100, &[]);
        assert_eq!(*seen.lock().unwrap(), [ReplyEvent::Text("Hel".into())]);
        stream.report(vec![Delta::Text("lo".into())], 100, &[]);
        assert_eq!(text(&seen), "Hello");
    }

    #[test]
    fn a_reply_over_its_bounds_is_refused_and_its_rest_dropped() {
        let (stream, seen) = collect(true);
        assert!(stream.report(vec![Delta::Text("12345".into())], 8, &[]));
        assert!(!stream.report(
            vec![Delta::Text("6789".into()), Delta::Text("x".into())],
            8,
            &[]
        ));
        assert!(!stream.report(vec![Delta::Text("y".into())], 8, &[]));
        assert_eq!(text(&seen), "12345");
        let many = vec![Delta::Usage(Usage::default()); MAX_REPLY_PIECES + 1];
        let (stream, _) = collect(true);
        assert!(!stream.report(many, 8, &[]));
    }

    #[test]
    fn a_restart_is_said_only_after_something_was_shown() {
        let (stream, seen) = collect(true);
        stream.restart("first");
        assert!(seen.lock().unwrap().is_empty());
        stream.report(vec![Delta::Text("partial".into())], 100, &[]);
        stream.restart("cut");
        assert_eq!(
            seen.lock().unwrap().last(),
            Some(&ReplyEvent::Restarted {
                reason: "cut".into()
            })
        );
    }

    #[test]
    fn chunks_cut_the_answer_where_the_pieces_fell_and_add_up_to_it() {
        let stream = ReplyStream::unwatched(true);
        let call = |index: u32, id: Option<&str>, name: Option<&str>, args: &str| {
            Delta::ToolCall(ToolCallPiece {
                index,
                id: id.map(str::to_string),
                name: name.map(str::to_string),
                arguments: args.to_string(),
            })
        };
        stream.report(
            vec![
                Delta::Text("Hé".into()),
                Delta::Text("llo".into()),
                call(0, Some("c1"), Some("fs:read"), "{\"pa"),
                call(0, None, None, "th\":1}"),
                Delta::Usage(Usage::default()),
            ],
            1 << 20,
            &[],
        );
        let response = Response {
            text: "Héllo".into(),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "fs:read".into(),
                arguments: "{\"path\":1}".into(),
            }],
            stop_reason: StopReason::ToolCalls,
            usage: Usage {
                prompt_tokens: 3,
                completion_tokens: 4,
                total_tokens: 7,
            },
            model: None,
        };
        let chunks = stream.chunks_of(&response);
        assert_eq!(
            chunks,
            vec![
                Delta::Text("Hé".into()),
                Delta::Text("llo".into()),
                call(0, Some("c1"), Some("fs:read"), "{\"pa"),
                call(0, None, None, "th\":1}"),
                Delta::Usage(response.usage),
            ]
        );
        // A long reply's pieces are joined to what a replay takes, and still add up.
        let many = ReplyStream::unwatched(true);
        let pieces: Vec<Delta> = (0..10_000).map(|_| Delta::Text("ab".into())).collect();
        many.report(pieces, 1 << 20, &[]);
        let long = Response {
            text: "ab".repeat(10_000),
            ..response.clone()
        };
        let joined = many.chunks_of(&long);
        assert!(
            joined.len() <= crate::llm::record::MAX_RECORDED_CHUNKS,
            "{}",
            joined.len()
        );
        let text: String = joined
            .iter()
            .filter_map(|c| match c {
                Delta::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(text, long.text);
        let json = serde_json::to_string(&chunks[0]).unwrap();
        assert_eq!(json, r#"{"text":"Hé"}"#);
    }
}
