//! The `llm-provider` world: a language model behind an API.
//!
//! A provider implements [`LlmProvider::complete`] and exports it with
//! [`export_llm_provider!`](crate::export_llm_provider). It reaches the model's API
//! with [`http::post`], a small blocking client over `wasi:http`: the host lets it
//! reach only the host of [`Endpoint::base_url`] and adds the credentials to each
//! request itself, so a provider never holds an API key.
//!
//! A provider that can stream asks its server to when [`reply::streaming`] says so, reads
//! the response as it arrives ([`http::post_streaming`], [`sse::Parser`]), reports each
//! piece with a [`reply::Reporter`], and returns the whole answer at the end as any
//! provider does.
//!
//! ```rust,ignore
//! use trellis_plugin_sdk::{export_llm_provider, llm::{Endpoint, LlmError, LlmProvider, Request, Response}};
//!
//! struct Echo;
//!
//! impl LlmProvider for Echo {
//!     fn complete(_endpoint: Endpoint, request: Request) -> Result<Response, LlmError> {
//!         let last = request.messages.last().map(|m| m.content.clone()).unwrap_or_default();
//!         Ok(Response::text(last))
//!     }
//! }
//!
//! export_llm_provider!(Echo);
//! ```

pub mod names;
pub mod reply;
pub mod sse;

/// The most tool calls (content blocks, for a server that answers in blocks) a provider
/// reads of one answer; past it the answer is malformed. The host refuses an answer over
/// 4 MiB counting 256 bytes a call, so no more than this many could be used anyway, and
/// each one costs the provider work and memory while it reads.
pub const MAX_TOOL_CALLS: usize = 16_384;

/// The error of an answer past [`MAX_TOOL_CALLS`].
pub fn too_many_tool_calls() -> LlmError {
    LlmError::MalformedResponse(format!(
        "the answer has more than {MAX_TOOL_CALLS} tool calls or content blocks, the most one \
         answer may hold"
    ))
}

use std::fmt;
use std::marker::PhantomData;

use crate::bindings::llm_world::exports::trellis::plugin::llm::Guest;

pub use crate::bindings::llm_world::exports::trellis::plugin::llm::{
    Endpoint, LlmError, Message, Options, Request, Response, Role, StopReason, ToolCall,
    ToolDefinition, Usage,
};

/// An LLM provider. `complete` is an associated function because every call runs
/// in a fresh instance: nothing is kept from one completion to the next.
pub trait LlmProvider {
    /// Sends one completion request to the model at `endpoint`.
    fn complete(endpoint: Endpoint, request: Request) -> Result<Response, LlmError>;
}

impl Response {
    /// A plain text answer with no tool calls, `stop` and zero usage.
    pub fn text(text: impl Into<String>) -> Self {
        Response {
            text: text.into(),
            tool_calls: Vec::new(),
            stop_reason: StopReason::Stop,
            usage: Usage {
                prompt_tokens: 0,
                completion_tokens: 0,
                total_tokens: 0,
            },
            model: None,
        }
    }
}

impl Role {
    /// The role as chat-completion APIs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// Parses a role as chat-completion APIs spell it.
    pub fn parse(text: &str) -> Option<Role> {
        Some(match text {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            _ => return None,
        })
    }
}

impl StopReason {
    /// The reason as the host's logs and cassettes spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Stop => "stop",
            StopReason::ToolCalls => "tool-calls",
            StopReason::Length => "length",
            StopReason::ContentFilter => "content-filter",
            StopReason::Other => "other",
        }
    }

    /// Parses `stop`, `tool-calls`/`tool_calls`, `length`, `content-filter`/`content_filter`;
    /// anything else is `other`.
    pub fn parse(text: &str) -> StopReason {
        match text {
            "stop" => StopReason::Stop,
            "tool-calls" | "tool_calls" => StopReason::ToolCalls,
            "length" => StopReason::Length,
            "content-filter" | "content_filter" => StopReason::ContentFilter,
            _ => StopReason::Other,
        }
    }

    /// The reason a provider reported, parsed; when it reported none, `tool-calls`
    /// if the answer calls tools, else `stop`.
    pub fn reported_or_inferred(reported: Option<&str>, calls_tools: bool) -> StopReason {
        match reported {
            Some(reason) => StopReason::parse(reason),
            None if calls_tools => StopReason::ToolCalls,
            None => StopReason::Stop,
        }
    }
}

impl Usage {
    /// Reads an OpenAI-style usage object (`prompt_tokens`, `completion_tokens`,
    /// `total_tokens`); missing counts are 0, a missing total is the sum, and
    /// counts beyond `u32` saturate.
    pub fn from_json(usage: Option<&serde_json::Value>) -> Usage {
        let tokens = |key: &str| {
            usage
                .and_then(|u| u.get(key))
                .and_then(serde_json::Value::as_u64)
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
        };
        let prompt_tokens = tokens("prompt_tokens").unwrap_or(0);
        let completion_tokens = tokens("completion_tokens").unwrap_or(0);
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: tokens("total_tokens")
                .unwrap_or(prompt_tokens.saturating_add(completion_tokens)),
        }
    }
}

/// Bridges an [`LlmProvider`] to the generated `Guest` trait; named by
/// [`export_llm_provider!`](crate::export_llm_provider) only.
#[doc(hidden)]
pub struct Adapter<P>(PhantomData<P>);

impl<P> fmt::Debug for Adapter<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Adapter")
    }
}

impl<P: LlmProvider> Guest for Adapter<P> {
    fn complete(endpoint: Endpoint, request: Request) -> Result<Response, LlmError> {
        P::complete(endpoint, request)
    }
}

/// Exports an [`LlmProvider`] as the plugin's `llm` interface. Use it once, at the
/// top level of a `cdylib` crate.
///
/// ```rust,ignore
/// trellis_plugin_sdk::export_llm_provider!(Echo);
/// ```
#[macro_export]
macro_rules! export_llm_provider {
    ($plugin:ty) => {
        // The generated export macro takes an identifier, not a generic type.
        #[doc(hidden)]
        type __TrellisLlmProviderExport = $crate::llm::Adapter<$plugin>;
        $crate::bindings::llm_world::__export_llm_world!(
            __TrellisLlmProviderExport with_types_in $crate::bindings::llm_world
        );
    };
}

/// A blocking HTTP client over `wasi:http/outgoing-handler`, enough for JSON APIs.
pub mod http {
    use std::fmt;

    use crate::bindings::llm_world::wasi::http::outgoing_handler;
    use crate::bindings::llm_world::wasi::http::types::{
        ErrorCode, Fields, IncomingBody, Method, OutgoingBody, OutgoingRequest, Scheme,
    };
    use crate::bindings::llm_world::wasi::io::streams::StreamError;

    /// Largest response body read; a longer one is an error, not a host OOM.
    pub const MAX_BODY_BYTES: usize = 32 << 20;

    /// An HTTP response read to its end.
    #[derive(Debug, Clone)]
    pub struct HttpResponse {
        /// Status code.
        pub status: u16,
        /// Headers, names in lower case.
        pub headers: Vec<(String, String)>,
        /// The whole body (empty when it was streamed to a reader).
        pub body: Vec<u8>,
        /// Whether the body went to the reader of [`post_streaming`] as it arrived.
        pub streamed: bool,
    }

    impl HttpResponse {
        /// The first value of header `name` (case-insensitive).
        pub fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }

        /// The body as text, invalid UTF-8 replaced.
        pub fn text(&self) -> String {
            String::from_utf8_lossy(&self.body).into_owned()
        }
    }

    /// Why a request got no response.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum HttpError {
        /// The host refused the destination: only the endpoint's host is allowed.
        Denied(String),
        /// No answer in time.
        Timeout,
        /// Anything else: bad URL, connection failure, protocol error.
        Transport(String),
        /// The response body is longer than [`MAX_BODY_BYTES`]: asking again gets the
        /// same answer, so a provider should not report it as a transport failure.
        TooLarge(String),
    }

    impl fmt::Display for HttpError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                HttpError::Denied(m) | HttpError::Transport(m) | HttpError::TooLarge(m) => {
                    f.write_str(m)
                }
                HttpError::Timeout => f.write_str("no answer in time"),
            }
        }
    }

    /// The parts of an `http://` or `https://` URL a request needs.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Url {
        /// `true` for `https`.
        pub https: bool,
        /// `host[:port]`.
        pub authority: String,
        /// Path and query, starting with `/`.
        pub path_with_query: String,
    }

    impl Url {
        /// Parses `url`, which must start with `http://` or `https://`.
        pub fn parse(url: &str) -> Result<Url, HttpError> {
            let (https, rest) = if let Some(rest) = url.strip_prefix("https://") {
                (true, rest)
            } else if let Some(rest) = url.strip_prefix("http://") {
                (false, rest)
            } else {
                return Err(HttpError::Transport(format!(
                    "`{url}` is not an http:// or https:// URL"
                )));
            };
            let (authority, path) = match rest.find(['/', '?']) {
                Some(at) => (&rest[..at], &rest[at..]),
                None => (rest, "/"),
            };
            if authority.is_empty() {
                return Err(HttpError::Transport(format!("`{url}` has no host")));
            }
            let path_with_query = if path.starts_with('/') {
                path.to_string()
            } else {
                format!("/{path}")
            };
            Ok(Url {
                https,
                authority: authority.to_string(),
                path_with_query,
            })
        }
    }

    /// Sends a `POST` of `body` to `url` with `headers` and reads the whole response.
    ///
    /// Any status is a response; only failures to get one are errors. The host
    /// adds the credentials, so do not set `authorization` (it is refused).
    pub fn post(
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<HttpResponse, HttpError> {
        send(Method::Post, url, headers, Some(body), None)
    }

    /// [`post`], reading a streamed answer as it arrives: when the server answers 2xx with
    /// `content-type: text/event-stream`, each piece of the body goes to `each` as it is
    /// read (the response's `body` stays empty, [`HttpResponse::streamed`] is `true`); any
    /// other answer (an error status, a server that ignored the request to stream) is read
    /// whole as by [`post`]. An error `each` returns ends the read with it.
    pub fn post_streaming(
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        each: &mut dyn FnMut(&[u8]) -> Result<(), HttpError>,
    ) -> Result<HttpResponse, HttpError> {
        send(Method::Post, url, headers, Some(body), Some(each))
    }

    /// What reads a streamed body piece by piece ([`post_streaming`]).
    pub type Reader<'a> = dyn FnMut(&[u8]) -> Result<(), HttpError> + 'a;

    /// Sends a `GET` to `url` and reads the whole response.
    pub fn get(url: &str, headers: &[(&str, &str)]) -> Result<HttpResponse, HttpError> {
        send(Method::Get, url, headers, None, None)
    }

    fn send(
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        each: Option<&mut Reader<'_>>,
    ) -> Result<HttpResponse, HttpError> {
        let parsed = Url::parse(url)?;
        let mut entries: Vec<(String, Vec<u8>)> = headers
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v.as_bytes().to_vec()))
            .collect();
        if let Some(bytes) = body {
            // A known length lets the request go out without chunked encoding.
            entries.push((
                "content-length".into(),
                bytes.len().to_string().into_bytes(),
            ));
        }
        let fields = Fields::from_list(&entries)
            .map_err(|e| HttpError::Transport(format!("request headers refused: {e:?}")))?;
        let request = OutgoingRequest::new(fields);
        let bad = |what: &str| HttpError::Transport(format!("`{url}`: invalid {what}"));
        request.set_method(&method).map_err(|_| bad("method"))?;
        let scheme = if parsed.https {
            Scheme::Https
        } else {
            Scheme::Http
        };
        request
            .set_scheme(Some(&scheme))
            .map_err(|_| bad("scheme"))?;
        request
            .set_authority(Some(&parsed.authority))
            .map_err(|_| bad("host"))?;
        request
            .set_path_with_query(Some(&parsed.path_with_query))
            .map_err(|_| bad("path"))?;
        let outgoing = request
            .body()
            .map_err(|_| HttpError::Transport("request body already taken".into()))?;
        // Hand the request over first: the body is streamed while it is written,
        // and the host buffers only a little of it.
        let pending =
            outgoing_handler::handle(request, None).map_err(|e| error_code(e, &parsed))?;
        let written = write_body(&outgoing, body.unwrap_or_default(), &parsed).and_then(|()| {
            OutgoingBody::finish(outgoing, None).map_err(|e| error_code(e, &parsed))
        });
        pending.subscribe().block();
        let response = match pending.get() {
            Some(Ok(Ok(response))) => response,
            // A refused or failed request also breaks the body stream: its own
            // error says more than the stream's.
            Some(Ok(Err(code))) => return Err(error_code(code, &parsed)),
            Some(Err(())) | None => {
                return Err(HttpError::Transport("the response was lost".into()));
            }
        };
        // A server may answer before reading the whole body: the answer counts.
        let _ = written;
        let status = response.status();
        let headers: Vec<(String, String)> = response
            .headers()
            .entries()
            .into_iter()
            .map(|(n, v)| {
                (
                    n.to_ascii_lowercase(),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })
            .collect();
        let incoming = response
            .consume()
            .map_err(|_| HttpError::Transport("response body already taken".into()))?;
        let event_stream = (200..300).contains(&status)
            && headers.iter().any(|(n, v)| {
                n == "content-type" && v.trim_start().starts_with("text/event-stream")
            });
        let (body, streamed) = match each {
            Some(each) if event_stream => {
                read_stream(&incoming, &parsed, &mut |chunk| each(chunk))?;
                (Vec::new(), true)
            }
            _ => (read_body(&incoming, &parsed)?, false),
        };
        drop(IncomingBody::finish(incoming));
        Ok(HttpResponse {
            status,
            headers,
            body,
            streamed,
        })
    }

    fn write_body(outgoing: &OutgoingBody, bytes: &[u8], url: &Url) -> Result<(), HttpError> {
        if bytes.is_empty() {
            return Ok(());
        }
        let stream = outgoing
            .write()
            .map_err(|_| HttpError::Transport("request body stream unavailable".into()))?;
        for chunk in bytes.chunks(4096) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| stream_error(e, url))?;
        }
        Ok(())
    }

    fn read_body(incoming: &IncomingBody, url: &Url) -> Result<Vec<u8>, HttpError> {
        let mut body = Vec::new();
        read_stream(incoming, url, &mut |chunk| {
            body.extend_from_slice(chunk);
            if body.len() > MAX_BODY_BYTES {
                return Err(HttpError::TooLarge(format!(
                    "response body over {MAX_BODY_BYTES} bytes"
                )));
            }
            Ok(())
        })?;
        Ok(body)
    }

    /// Reads the body to its end, each piece to `each` as it arrives; at most
    /// [`MAX_BODY_BYTES`] in all.
    fn read_stream(
        incoming: &IncomingBody,
        url: &Url,
        each: &mut dyn FnMut(&[u8]) -> Result<(), HttpError>,
    ) -> Result<(), HttpError> {
        let stream = incoming
            .stream()
            .map_err(|_| HttpError::Transport("response body stream unavailable".into()))?;
        let mut read = 0usize;
        loop {
            match stream.blocking_read(64 << 10) {
                Ok(chunk) => {
                    read = read.saturating_add(chunk.len());
                    if read > MAX_BODY_BYTES {
                        return Err(HttpError::TooLarge(format!(
                            "response body over {MAX_BODY_BYTES} bytes"
                        )));
                    }
                    each(&chunk)?;
                }
                Err(StreamError::Closed) => break,
                // A connection cut mid-answer surfaces as a stream error without an
                // HTTP error code: say so, naming the server.
                Err(StreamError::LastOperationFailed(e))
                    if crate::bindings::llm_world::wasi::http::types::http_error_code(&e)
                        .is_none() =>
                {
                    // The host's between-bytes deadline arrives here too, as a plain
                    // stream error whose text names it.
                    let detail = e.to_debug_string();
                    if detail.contains("timeout") {
                        return Err(HttpError::Timeout);
                    }
                    return Err(HttpError::Transport(format!(
                        "the connection to `{}` broke before the answer was complete ({detail})",
                        url.authority,
                    )));
                }
                Err(e) => return Err(stream_error(e, url)),
            }
        }
        Ok(())
    }

    fn stream_error(err: StreamError, url: &Url) -> HttpError {
        match err {
            StreamError::Closed => HttpError::Transport("the connection closed early".into()),
            StreamError::LastOperationFailed(e) => {
                match crate::bindings::llm_world::wasi::http::types::http_error_code(&e) {
                    Some(code) => error_code(code, url),
                    None => HttpError::Transport(e.to_debug_string()),
                }
            }
        }
    }

    fn error_code(code: ErrorCode, url: &Url) -> HttpError {
        match code {
            ErrorCode::HttpRequestDenied => HttpError::Denied(format!(
                "the host refused the request to `{}`: a provider may reach only its endpoint's host",
                url.authority
            )),
            ErrorCode::ConnectionTimeout
            | ErrorCode::ConnectionReadTimeout
            | ErrorCode::ConnectionWriteTimeout
            | ErrorCode::HttpResponseTimeout
            | ErrorCode::DnsTimeout => HttpError::Timeout,
            ErrorCode::ConnectionRefused => {
                HttpError::Transport(format!("connection to `{}` refused", url.authority))
            }
            ErrorCode::InternalError(Some(message)) => HttpError::Transport(message),
            ErrorCode::DnsError(_) | ErrorCode::DestinationNotFound => {
                HttpError::Transport(format!(
                    "cannot resolve `{}`: no network, or a wrong base URL",
                    url.authority
                ))
            }
            ErrorCode::DestinationUnavailable
            | ErrorCode::DestinationIpUnroutable
            | ErrorCode::DestinationIpProhibited => HttpError::Transport(format!(
                "cannot reach `{}`: no network, or a wrong base URL",
                url.authority
            )),
            ErrorCode::ConnectionTerminated | ErrorCode::HttpResponseIncomplete => {
                HttpError::Transport(format!(
                    "the connection to `{}` closed before the answer was complete",
                    url.authority
                ))
            }
            ErrorCode::TlsProtocolError
            | ErrorCode::TlsCertificateError
            | ErrorCode::TlsAlertReceived(_) => HttpError::Transport(format!(
                "the TLS handshake with `{}` failed: check the base URL (https:// to a server \
                 that speaks TLS, with a valid certificate)",
                url.authority
            )),
            other => {
                HttpError::Transport(format!("request to `{}` failed: {other:?}", url.authority))
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn urls_split_into_scheme_authority_and_path() {
            let url = Url::parse("http://127.0.0.1:8080/v1/chat/completions?x=1").unwrap();
            assert!(!url.https);
            assert_eq!(url.authority, "127.0.0.1:8080");
            assert_eq!(url.path_with_query, "/v1/chat/completions?x=1");
            assert_eq!(Url::parse("https://api.x").unwrap().path_with_query, "/");
            assert!(Url::parse("ftp://x").is_err());
        }
    }
}
