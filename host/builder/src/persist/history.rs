//! A conversation history in either shape a workspace may hold: Trellis's messages
//! (`{role, content, tool_calls, tool_call_id}`) or the original system's langchain-style
//! ones (`{role: human|ai|tool|system, parts: [...]}`, field names in either case).
//!
//! A langchain-style history is turned into messages once, on reading: text parts joined,
//! tool calls and tool responses kept with their ids, system messages dropped (the system
//! prompt is made afresh each turn), and a tool call that no response answers given one
//! saying so, so the history is one a provider accepts. Written back, each message also
//! carries `parts` in the shape the original's readers take (`{type, content}`).

use serde_json::{Value, json};

use trellis_sandbox::llm::{Message, Role, ToolCall};

/// The answer given to a tool call of a resumed history that no tool response answered.
pub const NO_RESULT: &str = "[no result was recorded for this call]";

/// Whether `message` is langchain-style (has `parts` or `Parts`).
fn has_parts(message: &Value) -> bool {
    message
        .get("parts")
        .or_else(|| message.get("Parts"))
        .is_some()
}

/// `obj[key]`, else `obj[Key]` (the original wrote Go field names when it had no tags).
fn field<'a>(obj: &'a Value, lower: &str, upper: &str) -> Option<&'a Value> {
    obj.get(lower)
        .filter(|v| !v.is_null())
        .or_else(|| obj.get(upper).filter(|v| !v.is_null()))
}

fn text_of(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// Reads a history; returns the messages and whether any was langchain-style. `path` names
/// the file in the error of a history that is neither shape.
pub fn read(history: &Value, path: &str) -> Result<(Vec<Message>, bool), String> {
    let items = match history {
        Value::Null => return Ok((Vec::new(), false)),
        Value::Array(items) => items,
        other => {
            return Err(format!(
                "{path}: conversation_history: expected an array of messages, found {}",
                kind(other)
            ));
        }
    };
    let mut out = Vec::new();
    let mut langchain = false;
    for (i, item) in items.iter().enumerate() {
        if has_parts(item) {
            langchain = true;
            out.extend(from_parts(item));
        } else {
            let m: Message = serde_json::from_value(item.clone()).map_err(|e| {
                format!(
                    "{path}: conversation_history[{i}]: expected a message \
                     ({{role, content}} or {{role, parts}}): {e}"
                )
            })?;
            out.push(m);
        }
    }
    if langchain {
        answer_unanswered(&mut out);
    }
    Ok((out, langchain))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The messages of one langchain-style message: one for text and tool calls, one per
/// tool response.
fn from_parts(item: &Value) -> Vec<Message> {
    let role = text_of(field(item, "role", "Role"))
        .unwrap_or_default()
        .to_ascii_lowercase();
    let parts = field(item, "parts", "Parts")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut text = Vec::new();
    let mut calls = Vec::new();
    let mut responses = Vec::new();
    for part in &parts {
        let kind = text_of(field(part, "type", "Type")).unwrap_or_default();
        if let Some(call) = tool_call(part, &kind) {
            calls.push(call);
        } else if let Some(response) = tool_response(part, &kind) {
            responses.push(response);
        } else if let Some(t) = text_of(field(part, "text", "Text"))
            .or_else(|| text_of(field(part, "content", "Content")))
        {
            text.push(t);
        }
    }
    let role = match role.as_str() {
        "system" => return Vec::new(),
        "ai" | "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        _ => Role::User,
    };
    let mut out = Vec::new();
    if role == Role::Tool || (!responses.is_empty() && calls.is_empty()) {
        for (id, content) in responses {
            out.push(Message {
                role: Role::Tool,
                content,
                tool_calls: Vec::new(),
                tool_call_id: Some(id),
            });
        }
        if !text.is_empty() && out.is_empty() {
            out.push(Message::new(Role::User, text.join("\n\n")));
        }
        return out;
    }
    out.push(Message {
        role: if calls.is_empty() {
            role
        } else {
            Role::Assistant
        },
        content: text.join("\n\n"),
        tool_calls: calls,
        tool_call_id: None,
    });
    out
}

/// A tool call part: `{type: tool_call, tool_call: {id, function: {name, arguments}}}`,
/// `{type: tool_call, content: {id, function_name, function_args}}` or
/// `{ID, FunctionCall: {Name, Arguments}}`.
fn tool_call(part: &Value, kind: &str) -> Option<ToolCall> {
    let (id, name, arguments) = if let Some(call) = field(part, "tool_call", "ToolCall") {
        let function = field(call, "function", "FunctionCall")?;
        (
            text_of(field(call, "id", "ID")),
            text_of(field(function, "name", "Name")),
            field(function, "arguments", "Arguments").cloned(),
        )
    } else if kind == "tool_call"
        && let Some(content) = part.get("content").filter(|c| c.is_object())
    {
        (
            text_of(content.get("id")),
            text_of(content.get("function_name")),
            content.get("function_args").cloned(),
        )
    } else if let Some(function) = part.get("FunctionCall") {
        (
            text_of(part.get("ID")),
            text_of(field(function, "name", "Name")),
            field(function, "arguments", "Arguments").cloned(),
        )
    } else {
        return None;
    };
    let arguments = match arguments {
        Some(Value::String(s)) => s,
        Some(other) if !other.is_null() => other.to_string(),
        _ => "{}".to_string(),
    };
    Some(ToolCall {
        id: id.unwrap_or_default(),
        name: name?,
        arguments,
    })
}

/// A tool response part: `{type: tool_response, tool_response: {tool_call_id, content}}`,
/// `{type: tool_response, content: {tool_call_id, content}}` or `{ToolCallID, Content}`.
fn tool_response(part: &Value, kind: &str) -> Option<(String, String)> {
    let body = if let Some(r) = field(part, "tool_response", "ToolResponse") {
        r
    } else if kind == "tool_response" && part.get("content").is_some_and(Value::is_object) {
        &part["content"]
    } else if part.get("ToolCallID").is_some() {
        part
    } else {
        return None;
    };
    let id = text_of(field(body, "tool_call_id", "ToolCallID"))?;
    let content = match field(body, "content", "Content") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    Some((id, content))
}

/// Gives every tool call that no later tool message answers an answer of its own, right
/// after the assistant message that made it.
fn answer_unanswered(messages: &mut Vec<Message>) {
    let mut i = 0;
    while i < messages.len() {
        if messages[i].role == Role::Assistant && !messages[i].tool_calls.is_empty() {
            let answered: Vec<String> = messages[i + 1..]
                .iter()
                .take_while(|m| m.role == Role::Tool)
                .filter_map(|m| m.tool_call_id.clone())
                .collect();
            let missing: Vec<String> = messages[i]
                .tool_calls
                .iter()
                .map(|c| c.id.clone())
                .filter(|id| !answered.contains(id))
                .collect();
            let at = i + 1 + answered.len();
            for (n, id) in missing.into_iter().enumerate() {
                messages.insert(
                    at + n,
                    Message {
                        role: Role::Tool,
                        content: NO_RESULT.to_string(),
                        tool_calls: Vec::new(),
                        tool_call_id: Some(id),
                    },
                );
            }
        }
        i += 1;
    }
}

/// `message` as JSON with `parts` added in the shape the original's readers take.
pub fn with_parts(message: &Message) -> Value {
    let mut v = serde_json::to_value(message).unwrap_or(Value::Null);
    let mut parts = Vec::new();
    if !message.content.is_empty() && message.role != Role::Tool {
        parts.push(json!({"type": "text", "content": message.content}));
    }
    for call in &message.tool_calls {
        parts.push(json!({"type": "tool_call", "content": {
            "id": call.id, "function_name": call.name, "function_args": call.arguments,
        }}));
    }
    if let Some(id) = &message.tool_call_id {
        parts.push(json!({"type": "tool_response", "content": {
            "tool_call_id": id, "content": message.content,
        }}));
    }
    if let Value::Object(map) = &mut v {
        map.insert("parts".into(), Value::Array(parts));
    }
    v
}

/// The JSON of `messages`, with `parts` when `langchain`.
pub fn write(messages: &[Message], langchain: bool) -> Value {
    if !langchain {
        return serde_json::to_value(messages).unwrap_or(Value::Array(Vec::new()));
    }
    Value::Array(messages.iter().map(with_parts).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn langchain_parts_become_messages_with_their_tool_calls_answered() {
        let history = json!([
            {"role": "system", "parts": [{"type": "text", "text": "old prompt"}]},
            {"role": "human", "parts": [{"type": "text", "text": "add a step"}]},
            {"Role": "ai", "Parts": [{"Text": "on it"},
                {"ID": "c1", "Type": "function", "FunctionCall": {"Name": "read_plan", "Arguments": "{}"}},
                {"type": "tool_call", "tool_call": {"id": "c2", "type": "function",
                    "function": {"name": "list_executions", "arguments": "{}"}}}]},
            {"role": "tool", "parts": [{"type": "tool_response", "content": {"tool_call_id": "c1", "content": "{\"steps\":[]}"}}]},
            {"role": "ai", "parts": [{"type": "text", "content": "done"}]}
        ]);
        let (messages, langchain) = read(&history, "f.json").unwrap();
        assert!(langchain);
        let roles: Vec<Role> = messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Tool,
                Role::Assistant
            ]
        );
        assert_eq!(messages[0].content, "add a step");
        assert_eq!(messages[1].tool_calls[0].name, "read_plan");
        assert_eq!(messages[1].tool_calls[1].id, "c2");
        assert_eq!(messages[2].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(messages[3].tool_call_id.as_deref(), Some("c2"));
        assert_eq!(messages[3].content, NO_RESULT);
        assert_eq!(messages[4].content, "done");
    }

    #[test]
    fn a_history_of_neither_shape_is_named() {
        let err = read(&json!([{"role": 3}]), "f.json").unwrap_err();
        assert!(err.starts_with("f.json: conversation_history[0]: expected a message"));
        let err = read(&json!("x"), "f.json").unwrap_err();
        assert_eq!(
            err,
            "f.json: conversation_history: expected an array of messages, found a string"
        );
    }
}
