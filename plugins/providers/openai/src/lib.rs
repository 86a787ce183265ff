//! The bundled `openai` LLM provider: OpenAI-compatible chat completions.
//!
//! Speaks `POST {base_url}/chat/completions` as OpenAI, OpenRouter, Ollama, vLLM
//! and llama.cpp's server do, with tool calling. The host lets it reach only the
//! base URL's host and adds the API key itself; this plugin never sees the key.
//!
//! Settings (`endpoint.settings`, all optional): `headers`, an object of extra
//! request headers (e.g. OpenRouter's `HTTP-Referer`).
//!
//! When the host wants the reply streamed it asks for `stream: true` with
//! `stream_options.include_usage`, reads the server-sent chunks as they arrive, reports
//! each piece and returns the same answer the whole response would have given ([`stream`]);
//! a server that answers with a whole JSON body instead is read as usual.

use serde_json::{Map, Value, json};
use trellis_plugin_sdk::export_llm_provider;
use trellis_plugin_sdk::llm::http::{self, HttpError, HttpResponse};
use trellis_plugin_sdk::llm::names::NameMap;
use trellis_plugin_sdk::llm::reply::{self, Reporter};
use trellis_plugin_sdk::llm::sse;
use trellis_plugin_sdk::llm::{
    Endpoint, LlmError, LlmProvider, Message, Request, Response, Role, StopReason, ToolCall, Usage,
};

mod stream;

/// How much of an error body goes into an error message.
const BODY_EXCERPT: usize = 300;

struct OpenAi;

impl LlmProvider for OpenAi {
    fn complete(endpoint: Endpoint, request: Request) -> Result<Response, LlmError> {
        let names = NameMap::new(request.tools.iter().map(|t| t.name.as_str()));
        let streaming = reply::streaming();
        let mut body = request_body(&request, &names)?;
        if streaming {
            body["stream"] = true.into();
            body["stream_options"] = json!({"include_usage": true});
        }
        let url = format!(
            "{}/chat/completions",
            endpoint.base_url.trim_end_matches('/')
        );
        let settings: Value = serde_json::from_str(&endpoint.settings).unwrap_or(Value::Null);
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
        ];
        if let Some(extra) = settings.get("headers").and_then(Value::as_object) {
            for (name, value) in extra {
                if let Some(value) = value.as_str() {
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
                match reply.event(&event.data, &names) {
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

export_llm_provider!(OpenAi);

/// The chat-completions request body.
fn request_body(request: &Request, names: &NameMap) -> Result<Value, LlmError> {
    let messages: Vec<Value> = request
        .messages
        .iter()
        .map(|m| message_json(m, names))
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), request.model.clone().into());
    body.insert("messages".into(), messages.into());
    if !request.tools.is_empty() {
        let mut tools = Vec::new();
        for tool in &request.tools {
            let parameters: Value = serde_json::from_str(&tool.parameters).map_err(|e| {
                LlmError::InvalidRequest(format!(
                    "tool `{}`: parameters are not JSON: {e}",
                    tool.name
                ))
            })?;
            tools.push(json!({
                "type": "function",
                "function": {
                    "name": names.api(&tool.name),
                    "description": tool.description,
                    "parameters": parameters,
                },
            }));
        }
        body.insert("tools".into(), tools.into());
    }
    if let Some(t) = request.options.temperature {
        // f32 -> f64 widening prints 0.2 as 0.20000000298...; go through text.
        let t: f64 = t.to_string().parse().unwrap_or(f64::from(t));
        body.insert("temperature".into(), t.into());
    }
    if let Some(max) = request.options.max_tokens {
        body.insert("max_tokens".into(), max.into());
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

fn message_json(message: &Message, names: &NameMap) -> Value {
    let mut m = Map::new();
    m.insert("role".into(), message.role.as_str().into());
    match message.role {
        Role::Assistant if !message.tool_calls.is_empty() => {
            let content = if message.content.is_empty() {
                Value::Null
            } else {
                message.content.clone().into()
            };
            m.insert("content".into(), content);
            let calls: Vec<Value> = message
                .tool_calls
                .iter()
                .map(|c| {
                    json!({
                        "id": c.id,
                        "type": "function",
                        "function": {"name": names.api(&c.name), "arguments": c.arguments},
                    })
                })
                .collect();
            m.insert("tool_calls".into(), calls.into());
        }
        _ => {
            m.insert("content".into(), message.content.clone().into());
        }
    }
    if let Some(id) = &message.tool_call_id {
        m.insert("tool_call_id".into(), id.clone().into());
    }
    Value::Object(m)
}

/// Maps an HTTP response to the answer or to the matching `llm-error`.
fn parse_response(response: &HttpResponse, names: &NameMap) -> Result<Response, LlmError> {
    let status = response.status;
    if status == 429 {
        return Err(LlmError::RateLimited(retry_after_ms(response)));
    }
    if status >= 500 {
        return Err(LlmError::Server(format!(
            "HTTP {status}: {}",
            excerpt(&response.text())
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
    // Gateways in front of a model (proxies, routers) may answer 200 with an `error`
    // object when the model behind them failed: that is the server's failure, retried
    // like a 5xx, not an answer to take apart.
    if body.get("choices").is_none()
        && let Some(error) = body.get("error").filter(|e| !e.is_null())
    {
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| error.as_str().map(str::to_string))
            .unwrap_or_else(|| excerpt(&error.to_string()));
        return Err(LlmError::Server(format!(
            "HTTP {status} with an error: {message}"
        )));
    }
    let choice = body
        .get("choices")
        .and_then(|c| c.get(0))
        .ok_or_else(|| malformed("no `choices[0]` in the answer"))?;
    let message = choice
        .get("message")
        .ok_or_else(|| malformed("no `choices[0].message` in the answer"))?;
    let text = match message.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(malformed("`choices[0].message.content` is not a string")),
    };
    let mut tool_calls = Vec::new();
    if let Some(calls) = message.get("tool_calls").filter(|c| !c.is_null()) {
        let calls = calls
            .as_array()
            .ok_or_else(|| malformed("`tool_calls` is not a list"))?;
        if calls.len() > trellis_plugin_sdk::llm::MAX_TOOL_CALLS {
            return Err(trellis_plugin_sdk::llm::too_many_tool_calls());
        }
        for (i, call) in calls.iter().enumerate() {
            let function = call
                .get("function")
                .ok_or_else(|| malformed(&format!("`tool_calls[{i}]` has no `function`")))?;
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| malformed(&format!("`tool_calls[{i}].function.name` is missing")))?;
            let arguments = match function.get("arguments") {
                Some(Value::String(s)) => s.clone(),
                None | Some(Value::Null) => "{}".to_string(),
                // Some servers send the object itself rather than its text.
                Some(other) => other.to_string(),
            };
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| format!("call_{i}"));
            tool_calls.push(ToolCall {
                id,
                name: names.original(name),
                arguments,
            });
        }
    }
    let stop_reason = StopReason::reported_or_inferred(
        choice.get("finish_reason").and_then(Value::as_str),
        !tool_calls.is_empty(),
    );
    Ok(Response {
        text,
        tool_calls,
        stop_reason,
        usage: Usage::from_json(body.get("usage")),
        model: body
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// `Retry-After` (seconds; HTTP dates are not worth a date parser here) or
/// OpenAI's `retry-after-ms`, in milliseconds.
fn retry_after_ms(response: &HttpResponse) -> Option<u64> {
    if let Some(ms) = response
        .header("retry-after-ms")
        .and_then(|v| v.trim().parse::<f64>().ok())
    {
        return Some(ms.max(0.0) as u64);
    }
    response
        .header("retry-after")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|s| (s.max(0.0) * 1000.0) as u64)
}

/// `error.message` of an OpenAI-style error body, else the start of the body.
fn error_message(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| {
            v.get("error").and_then(|e| {
                e.get("message")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .or_else(|| e.as_str().map(str::to_string))
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

    fn reply(status: u16, body: &str) -> HttpResponse {
        HttpResponse {
            status,
            headers: vec![("retry-after".into(), "2".into())],
            body: body.as_bytes().to_vec(),
            streamed: false,
        }
    }

    #[test]
    fn statuses_map_to_llm_errors() {
        let names = NameMap::default();
        assert!(matches!(
            parse_response(&reply(429, ""), &names),
            Err(LlmError::RateLimited(Some(2000)))
        ));
        assert!(matches!(
            parse_response(&reply(503, "down"), &names),
            Err(LlmError::Server(m)) if m.contains("503") && m.contains("down")
        ));
        assert!(matches!(
            parse_response(&reply(400, r#"{"error":{"message":"bad model"}}"#), &names),
            Err(LlmError::InvalidRequest(m)) if m.contains("bad model")
        ));
        assert!(matches!(
            parse_response(&reply(200, "{not json"), &names),
            Err(LlmError::MalformedResponse(_))
        ));
        assert!(matches!(
            parse_response(&reply(200, r#"{"error":{"message":"overloaded"}}"#), &names),
            Err(LlmError::Server(m)) if m.contains("overloaded")
        ));
        assert!(matches!(
            parse_response(&reply(200, r#"{"choices":[]}"#), &names),
            Err(LlmError::MalformedResponse(_))
        ));
    }

    #[test]
    fn tool_calls_and_usage_are_parsed() {
        let names = NameMap::new(["workspace:read_file"]);
        let body = json!({
            "model": "m-1",
            "choices": [{"finish_reason": "tool_calls", "message": {"content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "workspace__read_file", "arguments": "{\"path\":\"a\"}"}}
            ]}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        });
        let r = parse_response(&reply(200, &body.to_string()), &names).unwrap();
        assert_eq!(r.tool_calls[0].name, "workspace:read_file");
        assert_eq!(r.usage.total_tokens, 15);
        assert!(matches!(r.stop_reason, StopReason::ToolCalls));
    }
}
