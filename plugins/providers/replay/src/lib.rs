//! The bundled `replay` LLM provider: answers from a recorded cassette.
//!
//! A cassette is a JSON file of interactions, each a request the provider
//! expects and the response to give (see `plugins/README.md`). Every call runs
//! in a fresh instance with no folder and no network: the host reads the
//! cassette inside the workspace and passes the interaction due in
//! `endpoint.settings`, `{"cassette": <name>, "index": N, "count": <interactions>,
//! "interaction": {...}}` (no `interaction` when the cassette has no call N). A
//! request that does not match the recorded one is an `invalid-request` error
//! naming the first difference, expected against got. An interaction recorded from a
//! streamed reply keeps its pieces (`chunks`): to a caller that streams they are reported
//! one by one, as they came, before the answer is returned.

use serde_json::{Value, json};
use trellis_plugin_sdk::export_llm_provider;
use trellis_plugin_sdk::llm::reply::{self, Delta, Reporter, TokenUsage, ToolCallPiece};
use trellis_plugin_sdk::llm::{
    Endpoint, LlmError, LlmProvider, Message, Options, Request, Response, StopReason, ToolCall,
    ToolDefinition, Usage,
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
            .unwrap_or("(unnamed)");
        let index = settings.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        let count = settings.get("count").and_then(Value::as_u64).unwrap_or(0);
        let Some(interaction) = settings.get("interaction") else {
            return Err(LlmError::InvalidRequest(format!(
                "cassette {path}: call {} was not recorded (the cassette has {count} \
                 interaction(s)); the request was: {}",
                index + 1,
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
        let response = parse_response(recorded).map_err(|e| LlmError::InvalidRequest(at(e)))?;
        if reply::streaming()
            && let Some(chunks) = interaction.get("chunks").and_then(Value::as_array)
        {
            // Each recorded piece as it came, one report a piece.
            let mut reporter = Reporter::new();
            for (i, chunk) in chunks.iter().enumerate() {
                let delta = chunk_delta(chunk)
                    .map_err(|e| LlmError::InvalidRequest(at(format!("chunks[{i}]: {e}"))))?;
                reporter.report(&[delta]);
            }
        }
        Ok(response)
    }
}

/// A recorded piece: `{"text": "..."}`, `{"tool_call": {"index": 0, "id": "...",
/// "name": "...", "arguments": "..."}}` or `{"usage": {...}}`.
fn chunk_delta(chunk: &Value) -> Result<Delta, String> {
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    if let Some(t) = chunk.get("text") {
        return t
            .as_str()
            .map(|t| Delta::Text(t.to_string()))
            .ok_or_else(|| "`text` is not a string".to_string());
    }
    if let Some(call) = chunk.get("tool_call") {
        let index = call
            .get("index")
            .and_then(Value::as_u64)
            .and_then(|i| u32::try_from(i).ok())
            .ok_or("`tool_call.index` is not a whole number")?;
        return Ok(Delta::ToolCall(ToolCallPiece {
            index,
            id: text(call.get("id")),
            name: text(call.get("name")),
            arguments: text(call.get("arguments")).unwrap_or_default(),
        }));
    }
    if let Some(usage) = chunk.get("usage") {
        let count = |key: &str| {
            usage
                .get(key)
                .and_then(Value::as_u64)
                .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
        };
        return Ok(Delta::Usage(TokenUsage {
            prompt_tokens: count("prompt_tokens"),
            completion_tokens: count("completion_tokens"),
            total_tokens: count("total_tokens"),
        }));
    }
    Err("expected one of `text`, `tool_call`, `usage`".to_string())
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
    if let Some(d) = tools_difference(expected.get("tools"), &got.tools) {
        return Some(d);
    }
    options_difference(expected.get("options"), &got.options)
}

/// The tools offered, compared only when the recording lists them: names in order, then
/// for every recorded definition (not a bare name) its description and argument schema.
fn tools_difference(recorded: Option<&Value>, got: &[ToolDefinition]) -> Option<String> {
    let tools = recorded.and_then(Value::as_array)?;
    let want: Vec<&str> = tools
        .iter()
        .map(|t| {
            t.as_str()
                .or_else(|| t.get("name").and_then(Value::as_str))
                .unwrap_or("")
        })
        .collect();
    let have: Vec<&str> = got.iter().map(|t| t.name.as_str()).collect();
    if want != have {
        return Some(format!(
            "tools: expected {}, got {}",
            shorten(&format!("{want:?}")),
            shorten(&format!("{have:?}"))
        ));
    }
    for (i, (recorded, tool)) in tools.iter().zip(got).enumerate() {
        if recorded.is_string() {
            continue;
        }
        if let Some(description) = recorded.get("description").and_then(Value::as_str)
            && description != tool.description
        {
            return Some(format!(
                "tools[{i}].description: {}",
                text_difference(description, &tool.description)
            ));
        }
        if let Some(schema) = recorded.get("parameters") {
            let have = json_text(&tool.parameters);
            if let Some(d) = value_difference(&format!("tools[{i}].parameters"), schema, &have) {
                return Some(d);
            }
        }
    }
    None
}

/// The request options: absent in the recording means none. Temperatures compare as the
/// `f32` they travel as.
fn options_difference(recorded: Option<&Value>, got: &Options) -> Option<String> {
    let none = Value::Null;
    let recorded = recorded.unwrap_or(&none);
    let shown = |v: Option<String>| v.unwrap_or_else(|| "none".into());
    let temperature = recorded
        .get("temperature")
        .and_then(Value::as_f64)
        .map(|t| t as f32);
    if temperature != got.temperature {
        return Some(format!(
            "options.temperature: expected {}, got {}",
            shown(temperature.map(|t| t.to_string())),
            shown(got.temperature.map(|t| t.to_string()))
        ));
    }
    let max_tokens = recorded.get("max_tokens").and_then(Value::as_u64);
    if max_tokens != got.max_tokens.map(u64::from) {
        return Some(format!(
            "options.max_tokens: expected {}, got {}",
            shown(max_tokens.map(|t| t.to_string())),
            shown(got.max_tokens.map(|t| t.to_string()))
        ));
    }
    let empty = |v: Value| match v {
        Value::Object(m) if m.is_empty() => Value::Null,
        other => other,
    };
    let want = empty(recorded.get("extra").cloned().unwrap_or(Value::Null));
    let have = empty(got.extra.as_deref().map(json_text).unwrap_or(Value::Null));
    value_difference("options.extra", &want, &have)
}

/// JSON text as its value; text that does not parse stays a string.
fn json_text(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// The first place where JSON `got` differs from `want`, as `<path>: expected <x>, got
/// <y>`, with object keys in order and array items by index.
fn value_difference(path: &str, want: &Value, got: &Value) -> Option<String> {
    let show = |v: &Value| shorten(&v.to_string());
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            let keys: std::collections::BTreeSet<&String> = w.keys().chain(g.keys()).collect();
            keys.into_iter().find_map(|k| {
                let at = format!("{path}.{k}");
                match (w.get(k), g.get(k)) {
                    (Some(a), Some(b)) => value_difference(&at, a, b),
                    (Some(a), None) => Some(format!("{at}: expected {}, got nothing", show(a))),
                    (None, Some(b)) => Some(format!("{at}: expected nothing, got {}", show(b))),
                    (None, None) => None,
                }
            })
        }
        (Value::Array(w), Value::Array(g)) => w
            .iter()
            .zip(g)
            .enumerate()
            .find_map(|(i, (a, b))| value_difference(&format!("{path}[{i}]"), a, b))
            .or_else(|| {
                (w.len() != g.len())
                    .then(|| format!("{path}: expected {} item(s), got {}", w.len(), g.len()))
            }),
        (a, b) if a == b => None,
        (a, b) => Some(format!("{path}: expected {}, got {}", show(a), show(b))),
    }
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
    if !text_matches(content, &actual.content) {
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

/// What a recorded text holds where any text matches (an id, a time or a status that
/// changes from one replay to the next).
pub const ANY_TEXT: &str = "{{*}}";

/// Whether `got` is `recorded`, each [`ANY_TEXT`] of it standing for any run of characters
/// (none included). Without one, the texts must be equal.
fn text_matches(recorded: &str, got: &str) -> bool {
    if !recorded.contains(ANY_TEXT) {
        return recorded == got;
    }
    let mut pieces = recorded.split(ANY_TEXT);
    let first = pieces.next().unwrap_or_default();
    let Some(mut rest) = got.strip_prefix(first) else {
        return false;
    };
    let mut pieces: Vec<&str> = pieces.collect();
    let last = pieces.pop().unwrap_or_default();
    // Each middle piece at its first place: the earliest leaves the most room for the rest.
    for piece in pieces {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
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

#[cfg(test)]
mod tests {
    use super::*;
    use trellis_plugin_sdk::llm::Role;

    #[test]
    fn a_recorded_text_matches_any_text_where_it_says_so() {
        assert!(text_matches("exact", "exact"));
        assert!(!text_matches("exact", "exact."));
        assert!(text_matches("{{*}}", ""));
        assert!(text_matches("{{*}}", "anything at all"));
        assert!(text_matches(
            r#"{"execution_id":"workflow-full-{{*}}","status":"running"}"#,
            r#"{"execution_id":"workflow-full-12","status":"running"}"#
        ));
        assert!(!text_matches(
            r#"{"execution_id":"workflow-full-{{*}}","status":"running"}"#,
            r#"{"execution_id":"exec-a-1","status":"running"}"#
        ));
        assert!(text_matches(
            "[run {{*}} finished: {{*}}] ok",
            "[run 3 finished: done] ok"
        ));
        assert!(!text_matches(
            "[run {{*}} finished: {{*}}] ok",
            "[run 3 ended: done] ok"
        ));
        // The prefix and the suffix may not overlap.
        assert!(!text_matches("ab{{*}}ba", "aba"));
        assert!(text_matches("ab{{*}}ba", "abba"));
        assert!(!text_matches("start{{*}}", "stat"));
    }

    fn request(temperature: Option<f32>, schema: &str) -> Request {
        Request {
            model: "demo".into(),
            messages: vec![Message {
                role: Role::User,
                content: "hi".into(),
                tool_calls: Vec::new(),
                tool_call_id: None,
            }],
            tools: vec![ToolDefinition {
                name: "workspace:read_file".into(),
                description: "Reads a file.".into(),
                parameters: schema.into(),
            }],
            options: Options {
                temperature,
                max_tokens: Some(100),
                extra: Some(r#"{"top_p":0.5}"#.into()),
            },
        }
    }

    const SCHEMA: &str = r#"{"type":"object","properties":{"path":{"type":"string"}}}"#;

    fn recorded() -> Value {
        json!({
            "model": "demo",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "workspace:read_file", "description": "Reads a file.",
                       "parameters": serde_json::from_str::<Value>(SCHEMA).unwrap()}],
            "options": {"temperature": 0.7, "max_tokens": 100, "extra": {"top_p": 0.5}}
        })
    }

    #[test]
    fn the_same_request_has_no_difference() {
        assert_eq!(
            first_difference(&recorded(), &request(Some(0.7), SCHEMA)),
            None
        );
    }

    #[test]
    fn options_are_compared() {
        let d = first_difference(&recorded(), &request(Some(0.2), SCHEMA)).unwrap();
        assert_eq!(d, "options.temperature: expected 0.7, got 0.2");
        let d = first_difference(&recorded(), &request(None, SCHEMA)).unwrap();
        assert_eq!(d, "options.temperature: expected 0.7, got none");
        let mut other = request(Some(0.7), SCHEMA);
        other.options.extra = Some(r#"{"top_p":0.9}"#.into());
        let d = first_difference(&recorded(), &other).unwrap();
        assert_eq!(d, "options.extra.top_p: expected 0.5, got 0.9");
        other.options.max_tokens = None;
        let d = first_difference(&recorded(), &other).unwrap();
        assert_eq!(d, "options.max_tokens: expected 100, got none");
        // No options recorded: a request with some differs.
        let mut bare = recorded();
        bare.as_object_mut().unwrap().remove("options");
        let d = first_difference(&bare, &request(Some(0.7), SCHEMA)).unwrap();
        assert!(d.starts_with("options.temperature: expected none"), "{d}");
    }

    #[test]
    fn tool_schemas_and_descriptions_are_compared() {
        let changed = r#"{"type":"object","properties":{"path":{"type":"integer"}}}"#;
        let d = first_difference(&recorded(), &request(Some(0.7), changed)).unwrap();
        assert_eq!(
            d,
            r#"tools[0].parameters.properties.path.type: expected "string", got "integer""#
        );
        let extra = r#"{"type":"object","properties":{"path":{"type":"string"},"n":{}}}"#;
        let d = first_difference(&recorded(), &request(Some(0.7), extra)).unwrap();
        assert_eq!(
            d,
            "tools[0].parameters.properties.n: expected nothing, got {}"
        );
        let mut described = request(Some(0.7), SCHEMA);
        described.tools[0].description = "Reads any file.".into();
        let d = first_difference(&recorded(), &described).unwrap();
        assert!(
            d.starts_with("tools[0].description: first difference"),
            "{d}"
        );
        let mut renamed = request(Some(0.7), SCHEMA);
        renamed.tools[0].name = "workspace:write_file".into();
        let d = first_difference(&recorded(), &renamed).unwrap();
        assert!(d.starts_with("tools: expected"), "{d}");
    }

    #[test]
    fn a_tool_recorded_by_name_compares_its_name_only() {
        let mut names = recorded();
        names["tools"] = json!(["workspace:read_file"]);
        let changed = r#"{"type":"object"}"#;
        assert_eq!(first_difference(&names, &request(Some(0.7), changed)), None);
    }

    #[test]
    fn value_differences_name_the_path() {
        let d = value_difference("x", &json!({"a": [1, 2]}), &json!({"a": [1, 3]}));
        assert_eq!(d.unwrap(), "x.a[1]: expected 2, got 3");
        let d = value_difference("x", &json!([1]), &json!([1, 2]));
        assert_eq!(d.unwrap(), "x: expected 1 item(s), got 2");
        assert_eq!(
            value_difference("x", &json!({"a": 1}), &json!({"a": 1})),
            None
        );
    }
}
