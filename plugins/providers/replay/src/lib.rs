//! The bundled `replay` LLM provider: answers from a recorded cassette.
//!
//! A cassette is a JSON file of interactions, each a request the provider
//! expects and the response to give (see `plugins/README.md`). Every call runs
//! in a fresh instance, so the host says which interaction is due:
//! `endpoint.settings` is `{"cassette": "/cassette/<file>", "index": N}`, with
//! the cassette's folder granted read-only at `/cassette`. A request that does
//! not match the recorded one is an `invalid-request` error naming the first
//! difference, expected against got.

use serde_json::{Value, json};
use trellis_plugin_sdk::export_llm_provider;
use trellis_plugin_sdk::llm::{
    Endpoint, LlmError, LlmProvider, Message, Request, Response, StopReason, ToolCall, Usage,
};

/// How much of a differing text an error message shows.
const SHOWN: usize = 160;

struct Replay;

impl LlmProvider for Replay {
    fn complete(endpoint: Endpoint, request: Request) -> Result<Response, LlmError> {
        let settings: Value = serde_json::from_str(&endpoint.settings)
            .map_err(|e| LlmError::InvalidRequest(format!("replay settings are not JSON: {e}")))?;
        let path = settings
            .get("cassette")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                LlmError::InvalidRequest("replay settings need `cassette`, a file path".into())
            })?;
        let index = settings.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        let text = std::fs::read_to_string(path)
            .map_err(|e| LlmError::InvalidRequest(format!("cassette {path}: cannot read: {e}")))?;
        let cassette: Value = serde_json::from_str(&text)
            .map_err(|e| LlmError::InvalidRequest(format!("cassette {path}: not JSON: {e}")))?;
        let interactions = cassette
            .get("interactions")
            .or(Some(&cassette))
            .and_then(Value::as_array)
            .ok_or_else(|| {
                LlmError::InvalidRequest(format!(
                    "cassette {path}: expected {{\"interactions\": [...]}} or a list of interactions"
                ))
            })?;
        let Some(interaction) = interactions.get(index) else {
            return Err(LlmError::InvalidRequest(format!(
                "cassette {path}: call {} was not recorded (the cassette has {} interaction(s)); \
                 the request was: {}",
                index + 1,
                interactions.len(),
                shorten(&last_message(&request)),
            )));
        };
        let at = |what: String| format!("cassette {path}, interaction {index}: {what}");
        let expected = interaction
            .get("request")
            .ok_or_else(|| LlmError::InvalidRequest(at("no `request`".into())))?;
        if let Some(difference) = first_difference(expected, &request) {
            return Err(LlmError::InvalidRequest(at(format!(
                "the request differs from the recording at {difference}"
            ))));
        }
        let recorded = interaction
            .get("response")
            .ok_or_else(|| LlmError::InvalidRequest(at("no `response`".into())))?;
        parse_response(recorded).map_err(|e| LlmError::InvalidRequest(at(e)))
    }
}

export_llm_provider!(Replay);

fn last_message(request: &Request) -> String {
    request
        .messages
        .last()
        .map(|m| format!("{} message {:?}", m.role.as_str(), m.content))
        .unwrap_or_else(|| "no messages".into())
}

/// The first place where `got` differs from the recorded request, as
/// `<path>: expected <x>, got <y>`.
fn first_difference(expected: &Value, got: &Request) -> Option<String> {
    let differ = |path: &str, e: &dyn std::fmt::Display, g: &dyn std::fmt::Display| {
        Some(format!("{path}: expected {e}, got {g}"))
    };
    if let Some(model) = expected.get("model").and_then(Value::as_str)
        && model != got.model
    {
        return differ("model", &quote(model), &quote(&got.model));
    }
    let messages = expected
        .get("messages")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (i, recorded) in messages.iter().enumerate() {
        let Some(actual) = got.messages.get(i) else {
            return differ(
                &format!("messages[{i}]"),
                &describe(recorded),
                &"no message (the request has fewer messages)",
            );
        };
        if let Some(d) = message_difference(recorded, actual) {
            return Some(format!("messages[{i}].{d}"));
        }
    }
    if got.messages.len() > messages.len() {
        let extra = &got.messages[messages.len()];
        return differ(
            &format!("messages[{}]", messages.len()),
            &"no message (the recording has fewer messages)",
            &format!("{} message {}", extra.role.as_str(), quote(&extra.content)),
        );
    }
    if let Some(tools) = expected.get("tools").and_then(Value::as_array) {
        let want: Vec<&str> = tools
            .iter()
            .filter_map(|t| t.as_str().or_else(|| t.get("name").and_then(Value::as_str)))
            .collect();
        let have: Vec<&str> = got.tools.iter().map(|t| t.name.as_str()).collect();
        if want != have {
            return differ("tools", &format!("{want:?}"), &format!("{have:?}"));
        }
    }
    None
}

fn message_difference(recorded: &Value, actual: &Message) -> Option<String> {
    let role = recorded.get("role").and_then(Value::as_str).unwrap_or("");
    if role != actual.role.as_str() {
        return Some(format!(
            "role: expected {}, got {}",
            quote(role),
            quote(actual.role.as_str())
        ));
    }
    let content = recorded
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or("");
    if content != actual.content {
        return Some(format!(
            "content: {}",
            text_difference(content, &actual.content)
        ));
    }
    let calls = recorded
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if calls.len() != actual.tool_calls.len() {
        return Some(format!(
            "tool_calls: expected {} call(s), got {}",
            calls.len(),
            actual.tool_calls.len()
        ));
    }
    for (j, (call, got)) in calls.iter().zip(&actual.tool_calls).enumerate() {
        let name = call.get("name").and_then(Value::as_str).unwrap_or("");
        if name != got.name {
            return Some(format!(
                "tool_calls[{j}].name: expected {}, got {}",
                quote(name),
                quote(&got.name)
            ));
        }
        let want = arguments(call.get("arguments"));
        let have = serde_json::from_str::<Value>(&got.arguments)
            .unwrap_or_else(|_| Value::String(got.arguments.clone()));
        if want != have {
            return Some(format!(
                "tool_calls[{j}].arguments: expected {}, got {}",
                shorten(&want.to_string()),
                shorten(&have.to_string())
            ));
        }
        if let Some(id) = call.get("id").and_then(Value::as_str)
            && id != got.id
        {
            return Some(format!(
                "tool_calls[{j}].id: expected {}, got {}",
                quote(id),
                quote(&got.id)
            ));
        }
    }
    let want_id = recorded.get("tool_call_id").and_then(Value::as_str);
    if want_id != actual.tool_call_id.as_deref() {
        return Some(format!(
            "tool_call_id: expected {:?}, got {:?}",
            want_id, actual.tool_call_id
        ));
    }
    None
}

/// Recorded arguments may be the JSON text or the object itself.
fn arguments(value: Option<&Value>) -> Value {
    match value {
        None | Some(Value::Null) => json!({}),
        Some(Value::String(s)) => {
            serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
        }
        Some(other) => other.clone(),
    }
}

/// Both texts around their first differing character.
fn text_difference(expected: &str, got: &str) -> String {
    let at = expected
        .char_indices()
        .zip(got.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| expected.len().min(got.len()));
    let start = floor_boundary(expected, at.saturating_sub(40))
        .min(floor_boundary(got, at.saturating_sub(40)));
    let window = |s: &str| {
        let from = floor_boundary(s, start);
        let tail = &s[from..];
        let cut = floor_boundary(tail, SHOWN.min(tail.len()));
        format!(
            "{}{:?}{}",
            if from > 0 { "..." } else { "" },
            &tail[..cut],
            if cut < tail.len() { "..." } else { "" }
        )
    };
    format!(
        "first difference at character {}: expected {}, got {}",
        expected[..at].chars().count(),
        window(expected),
        window(got)
    )
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn quote(s: &str) -> String {
    shorten(&format!("{s:?}"))
}

fn shorten(s: &str) -> String {
    if s.len() <= SHOWN {
        return s.to_string();
    }
    format!("{}...", &s[..floor_boundary(s, SHOWN)])
}

fn describe(message: &Value) -> String {
    format!(
        "{} message {}",
        message.get("role").and_then(Value::as_str).unwrap_or("?"),
        quote(message.get("content").and_then(Value::as_str).unwrap_or(""))
    )
}

/// The recorded response: `text`, `tool_calls` (`id`, `name`, `arguments`),
/// `stop_reason`, `usage` and `model`, all optional.
fn parse_response(recorded: &Value) -> Result<Response, String> {
    let text = recorded
        .get("text")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mut tool_calls = Vec::new();
    if let Some(calls) = recorded.get("tool_calls").and_then(Value::as_array) {
        for (i, call) in calls.iter().enumerate() {
            let name = call
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("response.tool_calls[{i}] has no `name`"))?;
            tool_calls.push(ToolCall {
                id: call
                    .get("id")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("call_{i}")),
                name: name.to_string(),
                arguments: arguments(call.get("arguments")).to_string(),
            });
        }
    }
    let stop_reason = StopReason::reported_or_inferred(
        recorded.get("stop_reason").and_then(Value::as_str),
        !tool_calls.is_empty(),
    );
    Ok(Response {
        text,
        tool_calls,
        stop_reason,
        usage: Usage::from_json(recorded.get("usage")),
        model: recorded
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}
