//! A chat-completions reply read from its stream of chunks (`stream: true`): each chunk's
//! `choices[0].delta` adds text or pieces of tool calls (numbered by `index`, id and name
//! in the first piece), `finish_reason` comes with the last, `usage` in a chunk of its own
//! (`stream_options.include_usage`), then `data: [DONE]`. The whole answer is the one the
//! same exchange gives unstreamed.

use std::collections::HashMap;

use serde_json::Value;
use trellis_plugin_sdk::llm::names::NameMap;
use trellis_plugin_sdk::llm::reply::{Delta, TokenUsage, ToolCallPiece};
use trellis_plugin_sdk::llm::{
    LlmError, MAX_TOOL_CALLS, Response, StopReason, ToolCall, Usage, too_many_tool_calls,
};

/// A tool call as its pieces arrived.
#[derive(Debug, Default)]
struct Call {
    id: Option<String>,
    name: Option<String>,
    arguments: String,
}

/// What the chunks so far say.
#[derive(Debug, Default)]
pub(crate) struct Reply {
    text: String,
    calls: Vec<Call>,
    /// Where each server `index` is in `calls`: a piece finds its call at once, however
    /// many calls came before it.
    positions: HashMap<u64, usize>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    model: Option<String>,
    done: bool,
}

fn malformed(what: impl Into<String>) -> LlmError {
    LlmError::MalformedResponse(what.into())
}

impl Reply {
    /// Takes the data of one event; the pieces to report.
    pub(crate) fn event(&mut self, data: &str, names: &NameMap) -> Result<Vec<Delta>, LlmError> {
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(Vec::new());
        }
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| {
            malformed(format!(
                "a streamed chunk is not JSON ({e}): {}",
                super::excerpt(data)
            ))
        })?;
        // A server that fails mid-reply sends an error object in place of a chunk.
        if chunk.get("choices").is_none()
            && let Some(error) = chunk.get("error").filter(|e| !e.is_null())
        {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| super::excerpt(&error.to_string()));
            return Err(LlmError::Server(format!(
                "the stream sent an error: {message}"
            )));
        }
        if self.model.is_none() {
            self.model = chunk
                .get("model")
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        let mut deltas = Vec::new();
        if let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) {
            let delta = choice.get("delta").unwrap_or(&Value::Null);
            match delta.get("content") {
                None | Some(Value::Null) => {}
                Some(Value::String(text)) => {
                    if !text.is_empty() {
                        self.text.push_str(text);
                        deltas.push(Delta::Text(text.clone()));
                    }
                }
                Some(_) => return Err(malformed("`choices[0].delta.content` is not a string")),
            }
            if let Some(calls) = delta.get("tool_calls").filter(|c| !c.is_null()) {
                let calls = calls
                    .as_array()
                    .ok_or_else(|| malformed("`choices[0].delta.tool_calls` is not a list"))?;
                for call in calls {
                    deltas.push(Delta::ToolCall(self.call_piece(call, names)?));
                }
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish_reason = Some(reason.to_string());
            }
        }
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(usage.clone());
            let u = Usage::from_json(Some(usage));
            deltas.push(Delta::Usage(TokenUsage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
                total_tokens: u.total_tokens,
            }));
        }
        Ok(deltas)
    }

    /// One piece of a tool call: added to its call (a new one for an index not seen).
    fn call_piece(&mut self, piece: &Value, names: &NameMap) -> Result<ToolCallPiece, LlmError> {
        let index = match piece.get("index") {
            Some(i) => i
                .as_u64()
                .ok_or_else(|| malformed("a tool call piece's `index` is not a whole number"))?,
            None => self.calls.len().saturating_sub(1) as u64,
        };
        let position = match self.positions.get(&index) {
            Some(&p) => p,
            None => {
                if self.calls.len() >= MAX_TOOL_CALLS {
                    return Err(too_many_tool_calls());
                }
                self.calls.push(Call::default());
                self.positions.insert(index, self.calls.len() - 1);
                self.calls.len() - 1
            }
        };
        let call = &mut self.calls[position];
        let function = piece.get("function").unwrap_or(&Value::Null);
        let id = piece.get("id").and_then(Value::as_str).map(str::to_string);
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .map(|n| names.original(n));
        let arguments = match function.get("arguments") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        };
        if call.id.is_none() {
            call.id.clone_from(&id);
        }
        if call.name.is_none() {
            call.name.clone_from(&name);
        }
        call.arguments.push_str(&arguments);
        Ok(ToolCallPiece {
            index: position as u32,
            id,
            name,
            arguments,
        })
    }

    /// The stream ended: the whole answer, or why it is not whole.
    pub(crate) fn finish(self) -> Result<Response, LlmError> {
        if !self.done && self.finish_reason.is_none() {
            // Retried like a body cut short: nothing of a partial reply is kept.
            return Err(LlmError::Transport(
                "the stream ended before the reply was complete (no finish_reason, no [DONE])"
                    .into(),
            ));
        }
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (i, call) in self.calls.into_iter().enumerate() {
            let name = call
                .name
                .ok_or_else(|| malformed(format!("streamed tool call {i} has no name")))?;
            tool_calls.push(ToolCall {
                id: call.id.unwrap_or_else(|| format!("call_{i}")),
                name,
                arguments: if call.arguments.is_empty() {
                    "{}".to_string()
                } else {
                    call.arguments
                },
            });
        }
        let stop_reason =
            StopReason::reported_or_inferred(self.finish_reason.as_deref(), !tool_calls.is_empty());
        Ok(Response {
            text: self.text,
            tool_calls,
            stop_reason,
            usage: Usage::from_json(self.usage.as_ref()),
            model: self.model,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chunks_add_up_to_the_answer() {
        let names = NameMap::new(["workspace:read_file"]);
        let mut reply = Reply::default();
        let chunks = [
            json!({"model": "m-1", "choices": [{"delta": {"role": "assistant", "content": "Hel"}}]}),
            json!({"choices": [{"delta": {"content": "lo"}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "workspace__read_file", "arguments": "{\"pa"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "th\":\"a\"}"}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}),
        ];
        let mut pieces = 0;
        for chunk in &chunks {
            pieces += reply.event(&chunk.to_string(), &names).unwrap().len();
        }
        reply.event("[DONE]", &names).unwrap();
        assert_eq!(pieces, 5);
        let r = reply.finish().unwrap();
        assert_eq!(r.text, "Hello");
        assert_eq!(r.tool_calls[0].name, "workspace:read_file");
        assert_eq!(r.tool_calls[0].arguments, "{\"path\":\"a\"}");
        assert_eq!(r.usage.total_tokens, 15);
        assert_eq!(r.model.as_deref(), Some("m-1"));
        assert!(matches!(r.stop_reason, StopReason::ToolCalls));
    }

    #[test]
    fn pieces_of_many_calls_find_their_call_and_calls_past_the_cap_are_refused() {
        let names = NameMap::default();
        let mut reply = Reply::default();
        let piece = |index: usize, arguments: &str| {
            json!({"choices": [{"delta": {"tool_calls": [
                {"index": index, "id": format!("c{index}"), "function": {"name": "t", "arguments": arguments}}
            ]}}]})
            .to_string()
        };
        // Calls in reverse order of their indexes, then a second piece of the first one.
        for index in (0..MAX_TOOL_CALLS).rev() {
            reply.event(&piece(index, "{"), &names).unwrap();
        }
        let deltas = reply
            .event(&piece(MAX_TOOL_CALLS - 1, "}"), &names)
            .unwrap();
        let [Delta::ToolCall(p)] = deltas.as_slice() else {
            panic!("{deltas:?}")
        };
        assert_eq!(p.index, 0, "the first call to arrive is call 0");
        match reply.event(&piece(MAX_TOOL_CALLS, "{}"), &names) {
            Err(LlmError::MalformedResponse(m)) => assert_eq!(
                m,
                "the answer has more than 16384 tool calls or content blocks, the most one \
                 answer may hold"
            ),
            other => panic!("{other:?}"),
        }
        reply
            .event(
                &json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}).to_string(),
                &names,
            )
            .unwrap();
        let answer = reply.finish().unwrap();
        assert_eq!(answer.tool_calls.len(), MAX_TOOL_CALLS);
        assert_eq!(answer.tool_calls[0].id, format!("c{}", MAX_TOOL_CALLS - 1));
        assert_eq!(answer.tool_calls[0].arguments, "{}");
    }

    #[test]
    fn a_stream_without_its_end_is_a_cut_reply() {
        let names = NameMap::default();
        let mut reply = Reply::default();
        reply
            .event(
                &json!({"choices": [{"delta": {"content": "Hel"}}]}).to_string(),
                &names,
            )
            .unwrap();
        assert!(
            matches!(reply.finish(), Err(LlmError::Transport(m)) if m.contains("ended before"))
        );
        let mut reply = Reply::default();
        assert!(matches!(
            reply.event("{not json", &names),
            Err(LlmError::MalformedResponse(_))
        ));
        assert!(matches!(
            reply.event(&json!({"error": {"message": "overloaded"}}).to_string(), &names),
            Err(LlmError::Server(m)) if m.contains("overloaded")
        ));
    }
}
