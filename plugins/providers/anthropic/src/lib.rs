//! The bundled `anthropic` LLM provider: the Anthropic Messages API.
//!
//! Speaks `POST {base_url}/v1/messages` (`{base_url}/messages` when the base URL already
//! ends in `/v1`) with tool use, and sends `anthropic-version: 2023-06-01`. The host lets it
//! reach only the base URL's origin and adds the API key itself as `x-api-key`; this plugin
//! never sees the key.
//!
//! Trellis's conversation is OpenAI-shaped; the Messages API differs in three ways handled
//! here: system messages go in the top-level `system` text; tool calls are `tool_use`
//! blocks of the assistant's message and their results `tool_result` blocks of the next
//! user message (the results of one turn in one message); and roles alternate, so messages
//! of the same role in a row are merged.
//!
//! Settings (`endpoint.settings`, all optional): `headers`, an object of extra request
//! headers (e.g. `anthropic-beta`, or another `anthropic-version`); `max_tokens`, the bound
//! on generated tokens when the model's options give none (the API requires one; 4096
//! otherwise).
//!
//! When the host wants the reply streamed it asks for `stream: true`, reads the events as
//! they arrive, reports each piece and returns the same answer the whole response would
//! have given ([`stream`]); a server that answers with a whole JSON body is read as usual.

use serde_json::{Map, Value, json};
use trellis_plugin_sdk::export_llm_provider;
use trellis_plugin_sdk::llm::http::{self, HttpError, HttpResponse};
use trellis_plugin_sdk::llm::names::NameMap;
use trellis_plugin_sdk::llm::reply::{self, Reporter};
use trellis_plugin_sdk::llm::sse;
use trellis_plugin_sdk::llm::{
    Endpoint, LlmError, LlmProvider, Request, Response, Role, StopReason, ToolCall, Usage,
};

mod stream;

/// The API version this plugin speaks.
const API_VERSION: &str = "2023-06-01";
/// `max_tokens` when neither the options nor the settings give one.
const DEFAULT_MAX_TOKENS: u64 = 4096;
/// How much of an error body goes into an error message.
const BODY_EXCERPT: usize = 300;

struct Anthropic;

impl LlmProvider for Anthropic {
    fn complete(endpoint: Endpoint, request: Request) -> Result<Response, LlmError> {
        let names = NameMap::new(request.tools.iter().map(|t| t.name.as_str()));
        let settings: Value = serde_json::from_str(&endpoint.settings).unwrap_or(Value::Null);
        let streaming = reply::streaming();
        let mut body = request_body(&request, &names, &settings)?;
        if streaming {
            body["stream"] = true.into();
        }
        let url = messages_url(&endpoint.base_url);
        let mut headers: Vec<(String, String)> = vec![
            ("content-type".into(), "application/json".into()),
            (
                "accept".into(),
                if streaming {
                    "text/event-stream, application/json"
                } else {
                    "application/json"
                }
                .into(),
            ),
            ("anthropic-version".into(), API_VERSION.into()),
        ];
        if let Some(extra) = settings.get("headers").and_then(Value::as_object) {
            for (name, value) in extra {
                if let Some(value) = value.as_str() {
                    headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
                    headers.push((name.clone(), value.to_string()));
                }
            }
        }
        let header_refs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let body = body.to_string();
        if !streaming {
            let response = http::post(&url, &header_refs, body.as_bytes()).map_err(http_error)?;
            return parse_response(&response, &names);
        }
        let mut parser = sse::Parser::new();
        let mut reply = stream::Reply::default();
        let mut reporter = Reporter::new();
        // Why the read stopped early, when the stream itself was at fault.
        let mut failed: Option<LlmError> = None;
        // The pieces of the events one read completed go to the host in one report.
        let mut take = |events: Vec<sse::Event>, failed: &mut Option<LlmError>| {
            let mut deltas = Vec::new();
            for event in events {
                match reply.event(event.event.as_deref(), &event.data, &names) {
                    Ok(more) => deltas.extend(more),
                    Err(e) => {
                        *failed = Some(e);
                        return;
                    }
                }
            }
            reporter.report(&deltas);
        };
        let read = http::post_streaming(&url, &header_refs, body.as_bytes(), &mut |bytes| {
            let events = parser.feed(bytes).map_err(|e| {
                failed = Some(LlmError::MalformedResponse(e));
                HttpError::Transport("stopped".into())
            })?;
            take(events, &mut failed);
            if failed.is_some() {
                return Err(HttpError::Transport("stopped".into()));
            }
            Ok(())
        });
        if let Some(error) = failed {
            return Err(error);
        }
        let response = read.map_err(http_error)?;
        if !response.streamed {
            // A server that does not stream answered as usual.
            return parse_response(&response, &names);
        }
        if let Some(event) = parser.finish() {
            take(vec![event], &mut failed);
            if let Some(error) = failed {
                return Err(error);
            }
        }
        reply.finish()
    }
}

/// The `llm-error` of a request that got no response.
fn http_error(err: HttpError) -> LlmError {
    match err {
        HttpError::Timeout => LlmError::Timeout,
        HttpError::Denied(m) | HttpError::Transport(m) => LlmError::Transport(m),
        HttpError::TooLarge(m) => LlmError::MalformedResponse(m),
    }
}

export_llm_provider!(Anthropic);

/// `{base_url}/v1/messages`, without doubling a `/v1` the base URL already has.
fn messages_url(base_url: &str) -> String {
    let base = base_url.trim_end_matches('/');
    if base.ends_with("/v1") {
        format!("{base}/messages")
    } else {
        format!("{base}/v1/messages")
    }
}

/// The Messages request body.
fn request_body(request: &Request, names: &NameMap, settings: &Value) -> Result<Value, LlmError> {
    let mut system: Vec<&str> = Vec::new();
    let mut messages: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in &request.messages {
        let (role, blocks) = match message.role {
            Role::System => {
                if !message.content.is_empty() {
                    system.push(&message.content);
                }
                continue;
            }
            Role::User => ("user", text_blocks(&message.content)),
            Role::Assistant => {
                let mut blocks = text_blocks(&message.content);
                for call in &message.tool_calls {
                    blocks.push(json!({
                        "type": "tool_use",
                        "id": call.id,
                        "name": names.api(&call.name),
                        "input": tool_input(&call.arguments),
                    }));
                }
                ("assistant", blocks)
            }
            Role::Tool => {
                let mut block = json!({
                    "type": "tool_result",
                    "tool_use_id": message.tool_call_id.clone().unwrap_or_default(),
                });
                // The API refuses empty text; a result without content is allowed.
                if !message.content.is_empty() {
                    block["content"] = message.content.clone().into();
                }
                ("user", vec![block])
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match messages.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ => messages.push((role, blocks)),
        }
    }
    let messages: Vec<Value> = messages
        .into_iter()
        .map(|(role, mut blocks)| {
            // Tool results must open the user message that carries them.
            blocks.sort_by_key(|b| b["type"] != "tool_result");
            json!({"role": role, "content": blocks})
        })
        .collect();

    let mut body = Map::new();
    body.insert("model".into(), request.model.clone().into());
    let max_tokens = request
        .options
        .max_tokens
        .map(u64::from)
        .or_else(|| settings.get("max_tokens").and_then(Value::as_u64))
        .unwrap_or(DEFAULT_MAX_TOKENS);
    body.insert("max_tokens".into(), max_tokens.into());
    if !system.is_empty() {
        body.insert("system".into(), system.join("\n\n").into());
    }
    body.insert("messages".into(), messages.into());
    if !request.tools.is_empty() {
        let mut tools = Vec::new();
        for tool in &request.tools {
            let schema: Value = serde_json::from_str(&tool.parameters).map_err(|e| {
                LlmError::InvalidRequest(format!(
                    "tool `{}`: parameters are not JSON: {e}",
                    tool.name
                ))
            })?;
            let mut entry = json!({"name": names.api(&tool.name), "input_schema": schema});
            if !tool.description.is_empty() {
                entry["description"] = tool.description.clone().into();
            }
            tools.push(entry);
        }
        body.insert("tools".into(), tools.into());
    }
    if let Some(t) = request.options.temperature {
        // f32 -> f64 widening prints 0.2 as 0.20000000298...; go through text.
        let t: f64 = t.to_string().parse().unwrap_or(f64::from(t));
        body.insert("temperature".into(), t.into());
    }
    if let Some(extra) = &request.options.extra {
        match serde_json::from_str::<Value>(extra) {
            Ok(Value::Object(extra)) => body.extend(extra),
            Ok(Value::Null) => {}
            _ => {
                return Err(LlmError::InvalidRequest(
                    "options.extra must be a JSON object".into(),
                ));
            }
        }
    }
    Ok(Value::Object(body))
}

/// One text block, or none for empty text (which the API refuses).
fn text_blocks(text: &str) -> Vec<Value> {
    if text.is_empty() {
        Vec::new()
    } else {
        vec![json!({"type": "text", "text": text})]
    }
}

/// A tool call's arguments as the object `tool_use.input` must be.
fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(input)) => Value::Object(input),
        _ => json!({}),
    }
}

/// Maps an HTTP response to the answer or to the matching `llm-error`.
fn parse_response(response: &HttpResponse, names: &NameMap) -> Result<Response, LlmError> {
    let status = response.status;
    if status == 429 {
        return Err(LlmError::RateLimited(retry_after_ms(response)));
    }
    // 5xx, and Anthropic's 529 "overloaded", are retried by the host.
    if status >= 500 {
        return Err(LlmError::Server(format!(
            "HTTP {status}: {}",
            error_message(&response.text())
        )));
    }
    if status >= 400 {
        return Err(LlmError::InvalidRequest(format!(
            "HTTP {status}: {}",
            error_message(&response.text())
        )));
    }
    if !(200..300).contains(&status) {
        return Err(LlmError::MalformedResponse(format!(
            "unexpected HTTP status {status}"
        )));
    }
    let malformed = |what: &str| LlmError::MalformedResponse(what.to_string());
    let body: Value = serde_json::from_slice(&response.body).map_err(|e| {
        LlmError::MalformedResponse(format!(
            "the body is not JSON ({e}): {}",
            excerpt(&response.text())
        ))
    })?;
    // An error event in a 200 (a proxy, or an overload after the status was sent) is the
    // server's failure, retried like a 5xx.
    if body.get("type").and_then(Value::as_str) == Some("error") {
        return Err(LlmError::Server(format!(
            "HTTP {status} with an error: {}",
            error_message(&body.to_string())
        )));
    }
    let content = body
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("no `content` list in the answer"))?;
    if content.len() > trellis_plugin_sdk::llm::MAX_TOOL_CALLS {
        return Err(trellis_plugin_sdk::llm::too_many_tool_calls());
    }
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for (i, block) in content.iter().enumerate() {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(
                block
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
            ),
            Some("tool_use") => {
                let name = block
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| malformed(&format!("`content[{i}].name` is missing")))?;
                let id = block
                    .get("id")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("toolu_{i}"));
                let arguments = match block.get("input") {
                    None | Some(Value::Null) => "{}".to_string(),
                    Some(input) => input.to_string(),
                };
                tool_calls.push(ToolCall {
                    id,
                    name: names.original(name),
                    arguments,
                });
            }
            // Thinking blocks and the like are not part of the answer.
            _ => {}
        }
    }
    let stop_reason = stop_reason(
        body.get("stop_reason").and_then(Value::as_str),
        !tool_calls.is_empty(),
    );
    Ok(Response {
        text,
        tool_calls,
        stop_reason,
        usage: usage(body.get("usage")),
        model: body
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// The answer's `stop_reason` as the host names it; none reported: inferred from the calls.
pub(crate) fn stop_reason(reported: Option<&str>, calls_tools: bool) -> StopReason {
    match reported {
        Some("end_turn" | "stop_sequence") => StopReason::Stop,
        Some("tool_use") => StopReason::ToolCalls,
        Some("max_tokens" | "model_context_window_exceeded") => StopReason::Length,
        Some("refusal") => StopReason::ContentFilter,
        Some(_) => StopReason::Other,
        None => StopReason::reported_or_inferred(None, calls_tools),
    }
}

/// The usage object's counts: prompt tokens include those written to and read from the
/// prompt cache, which the API counts apart from `input_tokens`.
pub(crate) fn usage(usage: Option<&Value>) -> Usage {
    let tokens = |key: &str| {
        usage
            .and_then(|u| u.get(key))
            .and_then(Value::as_u64)
            .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
    };
    let prompt_tokens = tokens("input_tokens")
        .saturating_add(tokens("cache_creation_input_tokens"))
        .saturating_add(tokens("cache_read_input_tokens"));
    let completion_tokens = tokens("output_tokens");
    Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens.saturating_add(completion_tokens),
    }
}

/// `Retry-After` in seconds (HTTP dates are not worth a date parser here), in milliseconds.
fn retry_after_ms(response: &HttpResponse) -> Option<u64> {
    response
        .header("retry-after")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|s| (s.max(0.0) * 1000.0) as u64)
}

/// `error.type: error.message` of an error body, else the start of the body.
pub(crate) fn error_message(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| {
            let error = v.get("error")?;
            let message = error.get("message").and_then(Value::as_str)?;
            Some(match error.get("type").and_then(Value::as_str) {
                Some(kind) => format!("{kind}: {message}"),
                None => message.to_string(),
            })
        })
        .unwrap_or_else(|| excerpt(text))
}

pub(crate) fn excerpt(text: &str) -> String {
    let text = text.trim();
    if text.len() <= BODY_EXCERPT {
        return text.to_string();
    }
    let mut end = BODY_EXCERPT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use trellis_plugin_sdk::llm::{Message, Options, ToolDefinition};

    fn reply(status: u16, body: &str) -> HttpResponse {
        HttpResponse {
            status,
            headers: vec![("retry-after".into(), "2".into())],
            body: body.as_bytes().to_vec(),
            streamed: false,
        }
    }

    fn message(role: Role, content: &str) -> Message {
        Message {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    fn result(id: &str, content: &str) -> Message {
        Message {
            tool_call_id: Some(id.into()),
            ..message(Role::Tool, content)
        }
    }

    #[test]
    fn the_conversation_maps_to_messages_blocks() {
        let names = NameMap::new(["workspace:read_file"]);
        let mut assistant = message(Role::Assistant, "Reading both.");
        assistant.tool_calls = ["a", "b"]
            .iter()
            .map(|id| ToolCall {
                id: format!("toolu_{id}"),
                name: "workspace:read_file".into(),
                arguments: format!("{{\"path\":\"{id}.md\"}}"),
            })
            .collect();
        let request = Request {
            model: "claude-test".into(),
            messages: vec![
                message(Role::System, "Be brief."),
                message(Role::System, "Use tools."),
                message(Role::User, "Read a and b."),
                assistant,
                result("toolu_a", "A"),
                result("toolu_b", ""),
                message(Role::User, "Now answer."),
            ],
            tools: vec![ToolDefinition {
                name: "workspace:read_file".into(),
                description: "Reads a file.".into(),
                parameters: r#"{"type":"object"}"#.into(),
            }],
            options: Options {
                temperature: Some(0.2),
                max_tokens: None,
                extra: Some(r#"{"top_k": 5}"#.into()),
            },
        };
        let body = request_body(&request, &names, &json!({"max_tokens": 99})).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "claude-test",
                "max_tokens": 99,
                "system": "Be brief.\n\nUse tools.",
                "temperature": 0.2,
                "top_k": 5,
                "tools": [{"name": "workspace__read_file", "description": "Reads a file.",
                           "input_schema": {"type": "object"}}],
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "Read a and b."}]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Reading both."},
                        {"type": "tool_use", "id": "toolu_a", "name": "workspace__read_file",
                         "input": {"path": "a.md"}},
                        {"type": "tool_use", "id": "toolu_b", "name": "workspace__read_file",
                         "input": {"path": "b.md"}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_a", "content": "A"},
                        {"type": "tool_result", "tool_use_id": "toolu_b"},
                        {"type": "text", "text": "Now answer."},
                    ]},
                ],
            })
        );
        assert_eq!(
            messages_url("https://api.anthropic.com/"),
            "https://api.anthropic.com/v1/messages"
        );
        assert_eq!(
            messages_url("http://127.0.0.1:9/v1"),
            "http://127.0.0.1:9/v1/messages"
        );
    }

    #[test]
    fn statuses_and_error_bodies_map_to_llm_errors() {
        let names = NameMap::default();
        let overloaded =
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert!(matches!(
            parse_response(&reply(429, ""), &names),
            Err(LlmError::RateLimited(Some(2000)))
        ));
        assert!(matches!(
            parse_response(&reply(529, overloaded), &names),
            Err(LlmError::Server(m)) if m == "HTTP 529: overloaded_error: Overloaded"
        ));
        assert!(matches!(
            parse_response(&reply(500, "down"), &names),
            Err(LlmError::Server(m)) if m == "HTTP 500: down"
        ));
        assert!(matches!(
            parse_response(&reply(200, overloaded), &names),
            Err(LlmError::Server(m)) if m.contains("Overloaded")
        ));
        assert!(matches!(
            parse_response(&reply(400, r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad model"}}"#), &names),
            Err(LlmError::InvalidRequest(m)) if m == "HTTP 400: invalid_request_error: bad model"
        ));
        assert!(matches!(
            parse_response(&reply(200, "{not json"), &names),
            Err(LlmError::MalformedResponse(_))
        ));
        assert!(matches!(
            parse_response(&reply(200, r#"{"type":"message"}"#), &names),
            Err(LlmError::MalformedResponse(m)) if m.contains("`content`")
        ));
    }

    #[test]
    fn text_tool_use_stop_reasons_and_usage_are_read() {
        let names = NameMap::new(["workspace:read_file"]);
        let body = json!({
            "type": "message", "model": "claude-x",
            "content": [
                {"type": "thinking", "thinking": "hmm"},
                {"type": "text", "text": "Let me "},
                {"type": "text", "text": "look."},
                {"type": "tool_use", "id": "toolu_1", "name": "workspace__read_file",
                 "input": {"path": "a"}},
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 7},
        });
        let r = parse_response(&reply(200, &body.to_string()), &names).unwrap();
        assert_eq!(r.text, "Let me look.");
        assert_eq!(r.tool_calls[0].id, "toolu_1");
        assert_eq!(r.tool_calls[0].name, "workspace:read_file");
        assert_eq!(r.tool_calls[0].arguments, r#"{"path":"a"}"#);
        assert!(matches!(r.stop_reason, StopReason::ToolCalls));
        assert_eq!(
            (
                r.usage.prompt_tokens,
                r.usage.completion_tokens,
                r.usage.total_tokens
            ),
            (15, 7, 22)
        );
        assert_eq!(r.model.as_deref(), Some("claude-x"));
        for (reported, expected) in [
            ("end_turn", StopReason::Stop),
            ("stop_sequence", StopReason::Stop),
            ("max_tokens", StopReason::Length),
            ("refusal", StopReason::ContentFilter),
            ("pause_turn", StopReason::Other),
        ] {
            let body = json!({"content": [], "stop_reason": reported});
            let r = parse_response(&reply(200, &body.to_string()), &names).unwrap();
            assert_eq!(r.stop_reason.as_str(), expected.as_str(), "{reported}");
        }
    }
}
