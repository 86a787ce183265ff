//! The `__ID__` LLM provider: models named `__ID__:<model>`.
//!
//! It sends the conversation to `<base_url>/complete` (the `base_url` of
//! `workflow.json` `providers.__ID__`) as `{"model", "messages": [{"role", "content"}]}`
//! and reads `{"text": ...}` back: change both to your API's format. The host adds the
//! API key to the request itself. Build with `trellis plugin build .`; test with
//! `cargo test`.

use trellis_plugin_sdk::export_llm_provider;
use trellis_plugin_sdk::llm::{Endpoint, LlmError, LlmProvider, Request, Response, http};
use trellis_plugin_sdk::serde_json::{self, Value, json};

struct Provider;

impl LlmProvider for Provider {
    fn complete(endpoint: Endpoint, request: Request) -> Result<Response, LlmError> {
        let url = format!("{}/complete", endpoint.base_url.trim_end_matches('/'));
        let body = request_body(&request).to_string();
        let answer = http::post(&url, &[("content-type", "application/json")], body.as_bytes())
            .map_err(|e| LlmError::Transport(e.to_string()))?;
        if let Some(err) = status_error(answer.status, &answer.text()) {
            return Err(err);
        }
        parse_answer(&answer.text())
    }
}

/// The body of the API request.
fn request_body(request: &Request) -> Value {
    let messages: Vec<Value> = request
        .messages
        .iter()
        .map(|m| json!({ "role": m.role.as_str(), "content": m.content }))
        .collect();
    json!({ "model": request.model, "messages": messages })
}

/// The error an HTTP status stands for, so the host retries the right ones
/// (`rate-limited`, `server` and `timeout` are retried with backoff).
fn status_error(status: u16, body: &str) -> Option<LlmError> {
    match status {
        200..=299 => None,
        429 => Some(LlmError::RateLimited(None)),
        500..=599 => Some(LlmError::Server(format!("HTTP {status}: {body}"))),
        _ => Some(LlmError::InvalidRequest(format!("HTTP {status}: {body}"))),
    }
}

fn parse_answer(body: &str) -> Result<Response, LlmError> {
    let value: Value =
        serde_json::from_str(body).map_err(|e| LlmError::MalformedResponse(e.to_string()))?;
    let text = value["text"]
        .as_str()
        .ok_or_else(|| LlmError::MalformedResponse("no `text` in the answer".into()))?;
    Ok(Response::text(text))
}

export_llm_provider!(Provider);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_retryable_errors() {
        assert!(status_error(200, "").is_none());
        assert!(matches!(status_error(429, ""), Some(LlmError::RateLimited(_))));
        assert!(matches!(status_error(503, ""), Some(LlmError::Server(_))));
        assert!(matches!(status_error(400, ""), Some(LlmError::InvalidRequest(_))));
    }

    #[test]
    fn the_answer_text_is_read() {
        assert_eq!(parse_answer(r#"{"text": "hi"}"#).unwrap().text, "hi");
        assert!(matches!(parse_answer("{}"), Err(LlmError::MalformedResponse(_))));
    }
}
