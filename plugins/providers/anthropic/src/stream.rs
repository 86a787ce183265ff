//! A Messages reply read from its stream of events (`stream: true`): `message_start` (the
//! model, the input's usage), per content block a `content_block_start` (text, or a
//! `tool_use` with its id and name), `content_block_delta`s (`text_delta`,
//! `input_json_delta`) and a `content_block_stop`, then `message_delta` (the stop reason,
//! the output's usage) and `message_stop`; `ping`s between, an `error` event when the
//! server fails mid-reply. The whole answer is the one the same exchange gives unstreamed.

use std::collections::HashMap;

use serde_json::{Map, Value};
use trellis_plugin_sdk::llm::names::NameMap;
use trellis_plugin_sdk::llm::reply::{Delta, TokenUsage, ToolCallPiece};
use trellis_plugin_sdk::llm::{LlmError, MAX_TOOL_CALLS, Response, ToolCall, too_many_tool_calls};

/// A content block as its pieces arrived.
#[derive(Debug)]
enum Block {
    Text,
    ToolUse {
        /// The call's number among the answer's tool calls.
        call: u32,
        id: String,
        name: String,
        input: String,
    },
    /// Thinking and the like: not part of the answer.
    Other,
}

/// What the events so far say.
#[derive(Debug, Default)]
pub(crate) struct Reply {
    text: String,
    /// Content blocks by the server's index.
    blocks: Vec<(u64, Block)>,
    /// Where each server `index` is in `blocks` (its first block, if one came twice): a
    /// delta finds its block at once, however many blocks came before it.
    positions: HashMap<u64, usize>,
    calls: u32,
    usage: Map<String, Value>,
    stop_reason: Option<String>,
    model: Option<String>,
    stopped: bool,
}

fn malformed(what: impl Into<String>) -> LlmError {
    LlmError::MalformedResponse(what.into())
}

impl Reply {
    /// Takes one event (its `event:` type, else the data's `type`); the pieces to report.
    pub(crate) fn event(
        &mut self,
        kind: Option<&str>,
        data: &str,
        names: &NameMap,
    ) -> Result<Vec<Delta>, LlmError> {
        if data.trim().is_empty() {
            return Ok(Vec::new());
        }
        let event: Value = serde_json::from_str(data).map_err(|e| {
            malformed(format!(
                "a streamed event is not JSON ({e}): {}",
                super::excerpt(data)
            ))
        })?;
        let kind = event
            .get("type")
            .and_then(Value::as_str)
            .or(kind)
            .unwrap_or_default()
            .to_string();
        let index = || {
            event
                .get("index")
                .and_then(Value::as_u64)
                .ok_or_else(|| malformed(format!("a `{kind}` event has no `index`")))
        };
        let mut deltas = Vec::new();
        match kind.as_str() {
            "message_start" => {
                let message = event.get("message").unwrap_or(&Value::Null);
                self.model = message
                    .get("model")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                self.add_usage(message.get("usage"), &mut deltas);
            }
            "content_block_start" => {
                let index = index()?;
                if self.blocks.len() >= MAX_TOOL_CALLS {
                    return Err(too_many_tool_calls());
                }
                let block = event.get("content_block").unwrap_or(&Value::Null);
                let block = match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let text = block.get("text").and_then(Value::as_str).unwrap_or("");
                        if !text.is_empty() {
                            self.text.push_str(text);
                            deltas.push(Delta::Text(text.to_string()));
                        }
                        Block::Text
                    }
                    Some("tool_use") => {
                        let name = block
                            .get("name")
                            .and_then(Value::as_str)
                            .ok_or_else(|| malformed("a `tool_use` block has no `name`"))?;
                        let call = self.calls;
                        self.calls += 1;
                        let id = block
                            .get("id")
                            .and_then(Value::as_str)
                            .map_or_else(|| format!("toolu_{index}"), str::to_string);
                        let name = names.original(name);
                        deltas.push(Delta::ToolCall(ToolCallPiece {
                            index: call,
                            id: Some(id.clone()),
                            name: Some(name.clone()),
                            arguments: String::new(),
                        }));
                        Block::ToolUse {
                            call,
                            id,
                            name,
                            input: String::new(),
                        }
                    }
                    _ => Block::Other,
                };
                self.positions.entry(index).or_insert(self.blocks.len());
                self.blocks.push((index, block));
            }
            "content_block_delta" => {
                let index = index()?;
                let delta = event.get("delta").unwrap_or(&Value::Null);
                let found = self.positions.get(&index).copied();
                let Some((_, block)) = found.and_then(|p| self.blocks.get_mut(p)) else {
                    return Err(malformed(format!(
                        "a delta of content block {index}, which did not start"
                    )));
                };
                match (block, delta.get("type").and_then(Value::as_str)) {
                    (Block::Text, Some("text_delta")) => {
                        let text = delta.get("text").and_then(Value::as_str).unwrap_or("");
                        self.text.push_str(text);
                        if !text.is_empty() {
                            deltas.push(Delta::Text(text.to_string()));
                        }
                    }
                    (Block::ToolUse { call, input, .. }, Some("input_json_delta")) => {
                        let piece = delta
                            .get("partial_json")
                            .and_then(Value::as_str)
                            .unwrap_or("");
                        input.push_str(piece);
                        if !piece.is_empty() {
                            deltas.push(Delta::ToolCall(ToolCallPiece {
                                index: *call,
                                id: None,
                                name: None,
                                arguments: piece.to_string(),
                            }));
                        }
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = event
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.stop_reason = Some(reason.to_string());
                }
                self.add_usage(event.get("usage"), &mut deltas);
            }
            "message_stop" => self.stopped = true,
            "error" => {
                return Err(LlmError::Server(format!(
                    "the stream sent an error: {}",
                    super::error_message(&event.to_string())
                )));
            }
            // `ping`, `content_block_stop`, and event types to come.
            _ => {}
        }
        Ok(deltas)
    }

    /// The counts of a usage object replace those given before (`message_delta`'s are
    /// cumulative).
    fn add_usage(&mut self, usage: Option<&Value>, deltas: &mut Vec<Delta>) {
        let Some(usage) = usage.and_then(Value::as_object) else {
            return;
        };
        for (key, value) in usage {
            if value.is_u64() {
                self.usage.insert(key.clone(), value.clone());
            }
        }
        let u = super::usage(Some(&Value::Object(self.usage.clone())));
        deltas.push(Delta::Usage(TokenUsage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.total_tokens,
        }));
    }

    /// The stream ended: the whole answer, or why it is not whole.
    pub(crate) fn finish(self) -> Result<Response, LlmError> {
        if !self.stopped && self.stop_reason.is_none() {
            // Retried like a body cut short: nothing of a partial reply is kept.
            return Err(LlmError::Transport(
                "the stream ended before the reply was complete (no message_stop)".into(),
            ));
        }
        let mut tool_calls = Vec::new();
        for (_, block) in self.blocks {
            if let Block::ToolUse {
                id, name, input, ..
            } = block
            {
                // The same text as an unstreamed answer's `input` object gives.
                let arguments = if input.trim().is_empty() {
                    "{}".to_string()
                } else {
                    serde_json::from_str::<Value>(&input)
                        .map_err(|e| {
                            malformed(format!("the streamed input of `{name}` is not JSON ({e})"))
                        })?
                        .to_string()
                };
                tool_calls.push(ToolCall {
                    id,
                    name,
                    arguments,
                });
            }
        }
        let stop_reason = super::stop_reason(self.stop_reason.as_deref(), !tool_calls.is_empty());
        Ok(Response {
            text: self.text,
            tool_calls,
            stop_reason,
            usage: super::usage(Some(&Value::Object(self.usage))),
            model: self.model,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use trellis_plugin_sdk::llm::StopReason;

    #[test]
    fn events_add_up_to_the_answer() {
        let names = NameMap::new(["workspace:read_file"]);
        let mut reply = Reply::default();
        let events = [
            json!({"type": "message_start", "message": {"model": "claude-x", "usage": {"input_tokens": 10, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "ping"}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "workspace__read_file", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"path\": "}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"a\"}"}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 7}}),
            json!({"type": "message_stop"}),
        ];
        for event in &events {
            reply.event(None, &event.to_string(), &names).unwrap();
        }
        let r = reply.finish().unwrap();
        assert_eq!(r.text, "Hello");
        assert_eq!(r.tool_calls[0].name, "workspace:read_file");
        assert_eq!(r.tool_calls[0].arguments, r#"{"path":"a"}"#);
        assert_eq!(r.usage.prompt_tokens, 10);
        assert_eq!(r.usage.completion_tokens, 7);
        assert_eq!(r.model.as_deref(), Some("claude-x"));
        assert!(matches!(r.stop_reason, StopReason::ToolCalls));
    }

    #[test]
    fn deltas_of_many_blocks_find_their_block_and_blocks_past_the_cap_are_refused() {
        let names = NameMap::default();
        let mut reply = Reply::default();
        let start = |index: usize| {
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": "tool_use", "id": format!("toolu_{index}"), "name": "t", "input": {}}})
            .to_string()
        };
        for index in 0..MAX_TOOL_CALLS {
            reply.event(None, &start(index), &names).unwrap();
        }
        let delta = json!({"type": "content_block_delta", "index": 7,
                           "delta": {"type": "input_json_delta", "partial_json": "{}"}});
        let deltas = reply.event(None, &delta.to_string(), &names).unwrap();
        let [Delta::ToolCall(p)] = deltas.as_slice() else {
            panic!("{deltas:?}")
        };
        assert_eq!((p.index, p.arguments.as_str()), (7, "{}"));
        match reply.event(None, &start(MAX_TOOL_CALLS), &names) {
            Err(LlmError::MalformedResponse(m)) => assert_eq!(
                m,
                "the answer has more than 16384 tool calls or content blocks, the most one \
                 answer may hold"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_error_event_and_a_cut_stream_fail() {
        let names = NameMap::default();
        let mut reply = Reply::default();
        let error = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
        assert!(matches!(
            reply.event(Some("error"), &error.to_string(), &names),
            Err(LlmError::Server(m)) if m.contains("Overloaded")
        ));
        let mut reply = Reply::default();
        reply
            .event(
                None,
                &json!({"type": "message_start", "message": {}}).to_string(),
                &names,
            )
            .unwrap();
        assert!(matches!(reply.finish(), Err(LlmError::Transport(_))));
    }
}
