//! An LLM provider of `trellis:plugin@0.1.0`, the world before replies could stream, for the
//! host's tests: a host that streams must keep loading it and get its whole answers. It
//! answers `old provider: <the last message>` without any network.

#[allow(
    missing_docs,
    reason = "generated from the WIT, which documents every item"
)]
mod bindings {
    wit_bindgen::generate!({
        path: "../../../../wit/trellis-plugin@0.1.0",
        world: "llm-provider",
        generate_all,
    });
}

use bindings::exports::trellis::plugin::llm::{
    Endpoint, Guest, LlmError, Request, Response, StopReason, Usage,
};

struct Old;

impl Guest for Old {
    fn complete(_endpoint: Endpoint, request: Request) -> Result<Response, LlmError> {
        let last = request
            .messages
            .last()
            .map(|m| m.content.clone())
            .unwrap_or_default();
        Ok(Response {
            text: format!("old provider: {last}"),
            tool_calls: Vec::new(),
            stop_reason: StopReason::Stop,
            usage: Usage {
                prompt_tokens: 1,
                completion_tokens: 1,
                total_tokens: 2,
            },
            model: None,
        })
    }
}

bindings::export!(Old with_types_in bindings);
