//! Conversions between the host's LLM types and the generated WIT bindings, for each
//! version of the provider world: [`v1`] (`trellis:plugin@0.1.0`) and [`v3`] (0.3.0, the
//! same records beside the `reply` import).

/// The conversions of one version, whose `llm` export bindings are `$w`.
macro_rules! conversions {
    ($($w:tt)+) => {
        use super::super::{
            Endpoint, LlmError, Message, Options, Request, Response, Role, StopReason,
            ToolCall, ToolDefinition, Usage,
        };
        use $($w)+ as w;

        pub(crate) fn endpoint(endpoint: &Endpoint) -> w::Endpoint {
            w::Endpoint {
                base_url: endpoint.base_url.clone(),
                settings: match &endpoint.settings {
                    serde_json::Value::Null => "{}".to_string(),
                    other => other.to_string(),
                },
            }
        }

        pub(crate) fn request(request: &Request) -> w::Request {
            w::Request {
                model: request.model.clone(),
                messages: request.messages.iter().map(message).collect(),
                tools: request.tools.iter().map(tool).collect(),
                options: options(&request.options),
            }
        }

        fn message(m: &Message) -> w::Message {
            w::Message {
                role: match m.role {
                    Role::System => w::Role::System,
                    Role::User => w::Role::User,
                    Role::Assistant => w::Role::Assistant,
                    Role::Tool => w::Role::Tool,
                },
                content: m.content.clone(),
                tool_calls: m.tool_calls.iter().map(tool_call).collect(),
                tool_call_id: m.tool_call_id.clone(),
            }
        }

        fn tool_call(c: &ToolCall) -> w::ToolCall {
            w::ToolCall {
                id: c.id.clone(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            }
        }

        fn tool(t: &ToolDefinition) -> w::ToolDefinition {
            w::ToolDefinition {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: t.parameters.to_string(),
            }
        }

        fn options(o: &Options) -> w::Options {
            w::Options {
                temperature: o.temperature,
                max_tokens: o.max_tokens,
                extra: o.extra.as_ref().map(|e| e.to_string()),
            }
        }

        pub(crate) fn response(r: w::Response) -> Response {
            Response {
                text: r.text,
                tool_calls: r
                    .tool_calls
                    .into_iter()
                    .map(|c| ToolCall {
                        id: c.id,
                        name: c.name,
                        arguments: c.arguments,
                    })
                    .collect(),
                stop_reason: match r.stop_reason {
                    w::StopReason::Stop => StopReason::Stop,
                    w::StopReason::ToolCalls => StopReason::ToolCalls,
                    w::StopReason::Length => StopReason::Length,
                    w::StopReason::ContentFilter => StopReason::ContentFilter,
                    w::StopReason::Other => StopReason::Other,
                },
                usage: Usage {
                    prompt_tokens: r.usage.prompt_tokens,
                    completion_tokens: r.usage.completion_tokens,
                    total_tokens: r.usage.total_tokens,
                },
                model: r.model,
            }
        }

        pub(crate) fn error(e: w::LlmError) -> LlmError {
            match e {
                w::LlmError::RateLimited(ms) => LlmError::RateLimited(ms),
                w::LlmError::Server(m) => LlmError::Server(m),
                w::LlmError::Timeout => LlmError::Timeout,
                w::LlmError::InvalidRequest(m) => LlmError::InvalidRequest(m),
                w::LlmError::MalformedResponse(m) => LlmError::MalformedResponse(m),
                w::LlmError::Transport(m) => LlmError::Transport(m),
            }
        }
    };
}

/// `trellis:plugin@0.1.0`.
pub(crate) mod v1 {
    conversions!(crate::plugins::bindings::llm::exports::trellis::plugin::llm);
}

/// `trellis:plugin@0.3.0`.
pub(crate) mod v3 {
    conversions!(crate::plugins::bindings::llm3::exports::trellis::plugin::llm);
}
