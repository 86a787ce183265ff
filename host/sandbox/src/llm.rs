//! Language models behind provider plugins (world `llm-provider`).
//!
//! The types here mirror the WIT records of `trellis:plugin/llm` on the host
//! side, serializable so runs can log them and cassettes can store them.
//! [`PluginRegistry::complete`](crate::PluginRegistry::complete) makes one call
//! in a fresh instance whose only way out is `wasi:http` to the endpoint's
//! origin, with the API key added by the host ([`http`]);
//! [`complete_with_retries`] adds backoff and fallbacks; [`record`] writes and
//! describes cassettes for the `replay` provider.

pub mod approval;
pub(crate) mod http;
pub mod record;
pub mod redact;
mod retry;
pub mod stream;
pub(crate) mod wit;

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::capabilities::Grant;

pub use approval::{KeyApprovals, user_config_dir};
#[doc(hidden)]
pub use http::origin_parts;
pub use http::{
    HostRule, RequestLimits, ScriptNet, is_loopback_base_url, is_loopback_host, secret_placeholder,
};
pub use record::{
    Cassette, Interaction, MAX_CASSETTE_VALUES, MAX_REPLAY_VALUES, RECORD_CAP, RECORDING_FOOTER,
    RECORDING_HEADER, RecordedRequest, RecordedTool, Recorder, ReplayCursor,
};
pub use redact::{MIN_SECRET_CHARS, REDACTED, redact_secrets};
pub use retry::{
    Attempt, AttemptStatus, Completion, RetryPolicy, Target, complete_with_options,
    complete_with_reply, complete_with_retries,
};
pub use stream::{Delta, ReplyEvent, ReplyStream, ToolCallPiece};

/// The public OpenAI API, the default base URL as in the official SDKs.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// The environment variable holding the API key unless configured otherwise.
pub const DEFAULT_KEY_ENV: &str = "OPENAI_API_KEY";
/// The environment variable overriding the base URL, as in the official SDKs.
pub const BASE_URL_ENV: &str = "OPENAI_BASE_URL";

/// How the host reaches a provider's API when workflow.json does not say otherwise, and
/// how it hands over the key. `anthropic` has its own; every other provider (`openai`, and
/// plugins loaded with `--plugins`) speaks with OpenAI's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderDefaults {
    /// The base URL unless workflow.json or `base_url_env` sets one.
    pub base_url: &'static str,
    /// The environment variable overriding the base URL, as in the official SDKs.
    pub base_url_env: &'static str,
    /// The environment variable holding the key unless `api_key_env` names another.
    pub key_env: &'static str,
    /// The request header the host puts the key in.
    pub key_header: KeyHeader,
}

/// The request header carrying an API key, set by the host (a guest may set neither).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHeader {
    /// `Authorization: Bearer <key>` (OpenAI and compatible servers).
    Bearer,
    /// `x-api-key: <key>` (Anthropic).
    XApiKey,
}

/// OpenAI's public API, for `openai` and any provider without defaults of its own.
pub const OPENAI: ProviderDefaults = ProviderDefaults {
    base_url: DEFAULT_BASE_URL,
    base_url_env: BASE_URL_ENV,
    key_env: DEFAULT_KEY_ENV,
    key_header: KeyHeader::Bearer,
};

/// Anthropic's public API, for `anthropic`.
pub const ANTHROPIC: ProviderDefaults = ProviderDefaults {
    base_url: "https://api.anthropic.com",
    base_url_env: "ANTHROPIC_BASE_URL",
    key_env: "ANTHROPIC_API_KEY",
    key_header: KeyHeader::XApiKey,
};

impl ProviderDefaults {
    /// Every provider with defaults of its own, by plugin id.
    pub const ALL: [(&'static str, ProviderDefaults); 2] =
        [("openai", OPENAI), ("anthropic", ANTHROPIC)];

    /// The defaults of provider `provider`: its own, else OpenAI's.
    pub fn of(provider: &str) -> ProviderDefaults {
        ProviderDefaults::ALL
            .iter()
            .find(|(id, _)| *id == provider)
            .map_or(OPENAI, |(_, defaults)| *defaults)
    }

    /// `$base_url_env`, else `base_url`.
    pub fn endpoint_from_env(&self) -> Endpoint {
        Endpoint::new(std::env::var(self.base_url_env).unwrap_or_else(|_| self.base_url.into()))
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Instructions framing the conversation.
    System,
    /// The user, or the runtime speaking for the workflow.
    User,
    /// The model.
    Assistant,
    /// A tool result.
    Tool,
}

/// A tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Identifier chosen by the model; echoed in the tool result.
    pub id: String,
    /// Full tool name, `server:tool`.
    pub name: String,
    /// Arguments object as JSON text. Logged and recorded as the JSON value
    /// itself when it parses, so logs stay readable.
    #[serde(with = "json_text")]
    pub arguments: String,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// The text; may be empty for an assistant message that only calls tools.
    #[serde(default)]
    pub content: String,
    /// Tool calls of an assistant message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message of `role` with `content` only.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Message::new(Role::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Message::new(Role::User, content)
    }

    /// The assistant's answer, tool calls included.
    pub fn assistant(response: &Response) -> Self {
        Message {
            role: Role::Assistant,
            content: response.text.clone(),
            tool_calls: response.tool_calls.clone(),
            tool_call_id: None,
        }
    }

    /// The result of tool call `call_id`.
    pub fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: Role::Tool,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.into()),
        }
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// Full tool name, `server:tool`.
    pub name: String,
    /// What the tool does.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: serde_json::Value,
}

/// Sampling and size options; `None` uses the provider's default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Options {
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Upper bound on generated tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Provider-specific options, merged into the request body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<serde_json::Value>,
}

/// One completion request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Model identifier as the provider names it.
    pub model: String,
    /// The conversation so far, oldest first.
    pub messages: Vec<Message>,
    /// Tools the model may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolDefinition>,
    /// Sampling options.
    #[serde(default)]
    pub options: Options,
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It finished its answer.
    Stop,
    /// It asked for tool calls.
    ToolCalls,
    /// It hit the token limit.
    Length,
    /// The provider filtered the content.
    ContentFilter,
    /// Anything else.
    Other,
}

/// Tokens used by one completion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the request.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// Their sum, as reported by the provider.
    pub total_tokens: u32,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
        self.total_tokens = self.total_tokens.saturating_add(other.total_tokens);
    }
}

/// The model's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// The text; may be empty when it only calls tools.
    #[serde(default)]
    pub text: String,
    /// Tool calls, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// Token usage.
    #[serde(default)]
    pub usage: Usage,
    /// The model that answered, when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// A provider's own error, the WIT `llm-error`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum LlmError {
    /// HTTP 429, with the server's `Retry-After` in milliseconds if given.
    #[error("rate limited{}", .0.map(|ms| format!(" (retry after {ms} ms)")).unwrap_or_default())]
    RateLimited(Option<u64>),
    /// A 5xx status, with the status and the start of the body.
    #[error("server error: {0}")]
    Server(String),
    /// No answer in time.
    #[error("no answer in time")]
    Timeout,
    /// The request was refused as invalid.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The answer could not be understood.
    #[error("malformed response: {0}")]
    MalformedResponse(String),
    /// The connection failed or the host refused the destination.
    #[error("transport: {0}")]
    Transport(String),
}

impl LlmError {
    /// Whether trying again may help: rate limits, server errors, timeouts and
    /// transport failures (a connection refused, reset or cut mid-answer). A completion
    /// request changes nothing on the server, so sending it again is safe.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LlmError::RateLimited(_)
                | LlmError::Server(_)
                | LlmError::Timeout
                | LlmError::Transport(_)
        )
    }
}

/// Why [`PluginRegistry::complete`](crate::PluginRegistry::complete) gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum LlmCallError {
    /// No LLM provider plugin has this id.
    #[error("no LLM provider `{provider}` (loaded: {loaded})")]
    UnknownProvider {
        /// The id asked for.
        provider: String,
        /// The provider ids loaded.
        loaded: String,
    },
    /// The endpoint cannot be used (a base URL that does not parse).
    #[error("LLM provider `{provider}`: {message}")]
    BadEndpoint {
        /// Provider id.
        provider: String,
        /// What is wrong.
        message: String,
    },
    /// The provider answered with an error.
    #[error("LLM provider `{provider}`: {error}")]
    Provider {
        /// Provider id.
        provider: String,
        /// Its error.
        error: LlmError,
        /// The host refused the destination or stopped the call at a limit: another
        /// attempt would meet the same refusal, so it is not retried.
        stopped_by_host: bool,
    },
    /// The plugin crashed or hit a limit other than time.
    #[error("LLM provider `{provider}` failed: {message}")]
    Crashed {
        /// Provider id.
        provider: String,
        /// The trap or limit, for the user.
        message: String,
    },
}

impl LlmCallError {
    /// The provider's own error, if that is what this is.
    pub fn llm_error(&self) -> Option<&LlmError> {
        match self {
            LlmCallError::Provider { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Whether trying again may help.
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmCallError::Provider {
                error,
                stopped_by_host,
                ..
            } => !stopped_by_host && error.is_retryable(),
            _ => false,
        }
    }
}

/// Where and how to reach the model. Secrets are not here: see [`Secret`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Endpoint {
    /// Base URL of the API, e.g. `https://api.openai.com/v1`; the plugin may
    /// reach only its scheme, host and port. Empty: no network at all.
    pub base_url: String,
    /// Provider settings as a JSON object, passed to the plugin.
    #[serde(default)]
    pub settings: serde_json::Value,
    /// Folders the plugin may read (none for the bundled providers).
    #[serde(skip)]
    pub grant: Grant,
}

impl Endpoint {
    /// An endpoint at `base_url` with no settings. The scheme is written in lower case
    /// (`HTTP://h` as `http://h`): a URL's scheme is case-insensitive, and the plugin's
    /// own URL handling need not be.
    pub fn new(base_url: impl Into<String>) -> Self {
        Endpoint {
            base_url: lower_scheme(base_url.into()),
            settings: serde_json::Value::Object(Default::default()),
            grant: Grant::none(),
        }
    }

    /// The same endpoint with `settings`.
    pub fn with_settings(mut self, settings: serde_json::Value) -> Self {
        self.settings = settings;
        self
    }

    /// The endpoint of the `replay` provider answering call `index` (from 0) of the
    /// cassette file `cassette`, read here (a path the caller trusts: a workspace's
    /// cassettes are opened by [`ReplayCursor::in_workspace`]).
    pub fn replay(cassette: &Path, index: usize) -> Result<Self> {
        let text = std::fs::read(cassette)
            .with_context(|| format!("cassette {}: cannot read", cassette.display()))?;
        let interactions = record::interactions(&cassette.display().to_string(), &text)?;
        Ok(Endpoint::replay_of(
            &cassette.display().to_string(),
            &interactions,
            index,
        ))
    }

    /// The endpoint of the `replay` provider answering call `index` of the cassette
    /// `name` holding `interactions`. The plugin is granted nothing, no network and no
    /// folder, not even the cassette's: the host has read the cassette (inside the
    /// workspace) and hands over only the interaction due, in
    /// `{"cassette": name, "index": index, "count": n, "interaction": {...}}` (no
    /// `interaction` past the end). Copying the file or its folder into a private grant
    /// would cost a copy per call and still show the plugin the whole cassette.
    pub fn replay_of(name: &str, interactions: &[serde_json::Value], index: usize) -> Self {
        let mut settings = serde_json::json!({
            "cassette": name,
            "index": index,
            "count": interactions.len(),
        });
        if let Some(interaction) = interactions.get(index) {
            settings["interaction"] = interaction.clone();
        }
        Endpoint {
            base_url: String::new(),
            settings,
            grant: Grant::none(),
        }
    }
}

/// `url` with its scheme (what comes before `://`, when that is letters only) in lower case.
fn lower_scheme(mut url: String) -> String {
    if let Some(end) = url.find("://")
        && url[..end].bytes().all(|b| b.is_ascii_alphabetic())
    {
        url[..end].make_ascii_lowercase();
    }
    url
}

/// An API key held by the host. The plugin never sees it: the host adds it to
/// the requests the plugin sends to its endpoint. Debug output hides it.
#[derive(Clone, Default)]
pub struct Secret {
    value: Option<String>,
    source: Option<String>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("source", &self.source)
            .field("set", &self.value.is_some())
            .finish()
    }
}

impl Secret {
    /// No key: requests go out without `Authorization` (local servers).
    pub fn none() -> Self {
        Secret::default()
    }

    /// A key given directly (tests, or a key read elsewhere).
    pub fn new(key: impl Into<String>) -> Self {
        Secret {
            value: Some(key.into()),
            source: None,
        }
    }

    /// The key in environment variable `var`; no key when it is unset or empty.
    pub fn from_env(var: &str) -> Self {
        Secret {
            value: std::env::var(var).ok().filter(|v| !v.is_empty()),
            source: Some(var.to_string()),
        }
    }

    /// Whether a key is present.
    pub fn is_set(&self) -> bool {
        self.value.is_some()
    }

    /// The environment variable it came from, if any.
    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    pub(crate) fn value(&self) -> Option<&str> {
        self.value.as_deref()
    }

    /// `text` with every piece of the key of [`MIN_SECRET_CHARS`] or more bytes replaced
    /// by [`REDACTED`] ([`redact_secrets`]): what a provider call returns may echo the
    /// request's credentials, whole or cut. A key shorter than that is left in.
    pub fn redact(&self, text: &str) -> String {
        match self.value() {
            Some(key) => redact_secrets(text, &[key]),
            None => text.to_string(),
        }
    }
}

impl Response {
    /// The answer with `secret` redacted from every text in it.
    pub fn redacted(mut self, secret: &Secret) -> Response {
        if !secret.is_set() {
            return self;
        }
        self.text = secret.redact(&self.text);
        for call in &mut self.tool_calls {
            call.id = secret.redact(&call.id);
            call.name = secret.redact(&call.name);
            call.arguments = redact_json_text(&secret.redact(&call.arguments), secret);
        }
        self.model = self.model.map(|m| secret.redact(&m));
        self
    }
}

/// `text` (a tool call's arguments) with `secret` redacted from the strings it holds once
/// parsed too: JSON escapes (`\u0073k-...`) spell a key the text does not show, and the
/// tool gets the decoded strings. Rewritten only when a string changed; text that is not
/// JSON stays as it is.
fn redact_json_text(text: &str, secret: &Secret) -> String {
    fn walk(value: &mut serde_json::Value, secret: &Secret, changed: &mut bool) {
        match value {
            serde_json::Value::String(s) => {
                let redacted = secret.redact(s);
                if redacted != *s {
                    *s = redacted;
                    *changed = true;
                }
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    walk(item, secret, changed);
                }
            }
            serde_json::Value::Object(map) => {
                let keys: Vec<String> = map.keys().cloned().collect();
                for key in keys {
                    let redacted = secret.redact(&key);
                    if redacted != key
                        && let Some(v) = map.remove(&key)
                    {
                        map.insert(redacted, v);
                        *changed = true;
                    }
                }
                for item in map.values_mut() {
                    walk(item, secret, changed);
                }
            }
            _ => {}
        }
    }
    // Only what could hide an escape is parsed again.
    if !text.contains('\\') {
        return text.to_string();
    }
    let Ok(mut value) = serde_json::from_str::<serde_json::Value>(text) else {
        return text.to_string();
    };
    let mut changed = false;
    walk(&mut value, secret, &mut changed);
    if changed {
        value.to_string()
    } else {
        text.to_string()
    }
}

impl LlmError {
    /// The error with `secret` redacted from its text.
    pub fn redacted(self, secret: &Secret) -> LlmError {
        match self {
            LlmError::Server(m) => LlmError::Server(secret.redact(&m)),
            LlmError::InvalidRequest(m) => LlmError::InvalidRequest(secret.redact(&m)),
            LlmError::MalformedResponse(m) => LlmError::MalformedResponse(secret.redact(&m)),
            LlmError::Transport(m) => LlmError::Transport(secret.redact(&m)),
            other => other,
        }
    }
}

/// Serde for JSON text that is shown as the JSON value itself when it parses.
mod json_text {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(text: &str, s: S) -> Result<S::Ok, S::Error> {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(value) => value.serialize(s),
            Err(_) => text.serialize(s),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Ok(match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(text) => text,
            other => other.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_spelled_in_json_escapes_in_tool_arguments_is_redacted_once_decoded() {
        let key = "sk-TESTKEY-abcdefghijklmnopqrstuvwxyz0123456789";
        let escaped: String = key
            .chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect();
        let response = Response {
            text: String::new(),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "workspace:write_file".into(),
                arguments: format!(r#"{{"path": "leak.txt", "content": "{escaped}"}}"#),
            }],
            stop_reason: StopReason::ToolCalls,
            usage: Usage::default(),
            model: None,
        }
        .redacted(&Secret::new(key));
        let args: serde_json::Value =
            serde_json::from_str(&response.tool_calls[0].arguments).unwrap();
        assert_eq!(args["content"], REDACTED);
        assert_eq!(args["path"], "leak.txt");
        // Arguments with nothing to hide keep their exact text.
        let plain = r#"{"a": "\u0041"}"#;
        assert_eq!(redact_json_text(plain, &Secret::new(key)), plain);
    }

    #[test]
    fn tool_call_arguments_are_logged_as_json_values() {
        let call = ToolCall {
            id: "c1".into(),
            name: "workspace:read_file".into(),
            arguments: r#"{"path":"a.md"}"#.into(),
        };
        let value = serde_json::to_value(&call).unwrap();
        assert_eq!(value["arguments"]["path"], "a.md");
        let back: ToolCall = serde_json::from_value(value).unwrap();
        assert_eq!(back, call);
        let broken = ToolCall {
            arguments: "{not json".into(),
            ..call
        };
        let back: ToolCall =
            serde_json::from_value(serde_json::to_value(&broken).unwrap()).unwrap();
        assert_eq!(back, broken);
    }

    #[test]
    fn secrets_do_not_show_in_debug_output() {
        let secret = Secret::new("sk-very-secret");
        assert!(!format!("{secret:?}").contains("sk-very"));
    }

    #[test]
    fn errors_serialize_with_kind_and_detail() {
        let value = serde_json::to_value(LlmError::RateLimited(Some(1500))).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"kind": "rate_limited", "detail": 1500})
        );
        assert!(LlmError::Timeout.is_retryable());
        assert!(!LlmError::InvalidRequest("x".into()).is_retryable());
    }
}
