//! Outgoing HTTP of an LLM provider call: one origin, the host's credentials,
//! a deadline.
//!
//! [`HttpPolicy`] is the `wasi:http` hook of every provider call. It refuses any
//! request whose scheme, host or port differ from the endpoint's base URL
//! (recording what it refused, so the error can name it), puts the host-side secret in
//! the provider's key header (`authorization` or `x-api-key`, neither of which a guest
//! may set), and bounds connect, first byte and the whole exchange by the call's timeout.
//! It also bounds what one call attempt may open ([`RequestLimits`]: requests live at
//! once, requests in all, bytes of a request body) and refuses an authority with userinfo
//! (`x@host`), whose host the check and the connection could read differently.
//!
//! The same hook gates a step script's requests ([`HttpPolicy::for_script`], a
//! [`ScriptNet`]): instead of one origin, the hosts of its step's `allowed_hosts`;
//! instead of one key, the operator's secrets put in place of their placeholders in
//! the request's headers, each only for the origins the operator approved for it;
//! and an address check: a host that is, or resolves to, a loopback, private or
//! link-local address needs the operator's `--allow-host` (plain `http://` then
//! connects to the address checked, so a second lookup cannot answer differently).
//! Responses are bounded too. A refusal reaches the script as `internal-error` with
//! the reason, before a byte is sent.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::uri::Scheme;
use http::{HeaderName, HeaderValue, Uri};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{
    DEFAULT_FORBIDDEN_HEADERS, Error as HttpError, ForbiddenHeaderFilter, RequestOptions, WasiBody,
    WasiHttpHooks,
};

use super::{KeyHeader, Secret};

mod hosts;
mod script_net;

use hosts::check_address;
pub use hosts::{HostRule, is_loopback_host};
use script_net::PLACEHOLDER_PREFIX;
pub(crate) use script_net::{SCRIPT_REQUEST_LIMITS, SCRIPT_RESPONSE_BYTES};
pub use script_net::{ScriptNet, secret_placeholder};

/// Whether `base_url` names this machine's loopback, in any spelling ([`is_loopback_host`]):
/// a local server may answer without a key; any other origin gets none sent without one.
pub fn is_loopback_base_url(base_url: &str) -> bool {
    Origin::parse(base_url).is_ok_and(|o| o.is_loopback())
}

/// The scheme (`true` for `https`), host and port a base URL is checked as, or why it is
/// refused: for the fuzz target that compares them with a URL parser's.
#[doc(hidden)]
pub fn origin_parts(base_url: &str) -> Result<(bool, String, u16), String> {
    Origin::parse(base_url).map(|o| (o.https, o.host, o.port))
}

/// Scheme, host and port: what a provider may reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    https: bool,
    host: String,
    port: u16,
}

impl Origin {
    /// The origin of a base URL such as `https://api.openai.com/v1`.
    pub fn parse(base_url: &str) -> Result<Origin, String> {
        let uri: Uri = base_url
            .parse()
            .map_err(|e| format!("base URL `{base_url}` is not a URL: {e}"))?;
        if has_userinfo(&uri) {
            return Err(format!(
                "base URL `{base_url}` holds a user name (`user@host`): give the host alone"
            ));
        }
        Origin::of(&uri).ok_or_else(|| {
            format!("base URL `{base_url}` must be an absolute http:// or https:// URL")
        })
    }

    /// Whether this is plain `http://`.
    pub fn is_plain_http(&self) -> bool {
        !self.https
    }

    /// Whether the host is this machine's loopback, in any spelling ([`is_loopback_host`]).
    pub fn is_loopback(&self) -> bool {
        is_loopback_host(&self.host)
    }

    fn of(uri: &Uri) -> Option<Origin> {
        let https = match uri.scheme() {
            Some(s) if *s == Scheme::HTTPS => true,
            Some(s) if *s == Scheme::HTTP => false,
            _ => return None,
        };
        let host = uri.host()?.to_ascii_lowercase();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        Some(Origin { https, host, port })
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)
    }
}

fn has_userinfo(uri: &Uri) -> bool {
    uri.authority().is_some_and(|a| a.as_str().contains('@'))
}

/// What one call attempt of a provider may open. Each retry is a new attempt
/// with fresh counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Requests whose response is not finished yet.
    pub live: usize,
    /// Requests in all.
    pub total: usize,
    /// Bytes of one request body.
    pub body_bytes: u64,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            live: 4,
            total: 16,
            body_bytes: 32 << 20,
        }
    }
}

/// Counts of one attempt, shared with the guards of its live requests.
#[derive(Debug, Default)]
struct Counts {
    live: AtomicUsize,
    total: AtomicUsize,
}

/// One live request: counted from `send_request` until its connection ends.
struct LiveGuard(Arc<Counts>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The live request of a response, ended by whichever comes first: the end of its body or
/// the end of its connection.
type SharedGuard = Arc<Mutex<Option<LiveGuard>>>;

fn end(live: &SharedGuard) {
    live.lock().unwrap_or_else(|e| e.into_inner()).take();
}

/// A response body that ends its request's live count when it ends.
struct CountedBody {
    inner: WasiBody,
    live: SharedGuard,
}

impl http_body::Body for CountedBody {
    type Data = <WasiBody as http_body::Body>::Data;
    type Error = HttpError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(
            polled,
            std::task::Poll::Ready(None) | std::task::Poll::Ready(Some(Err(_)))
        ) {
            end(&this.live);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The `wasi:http` hooks of one provider call (or step script run).
pub(crate) struct HttpPolicy {
    allowed: Option<Origin>,
    /// Set for a step script: its hosts and secrets instead of `allowed` and `credential`.
    script: Option<std::sync::Arc<ScriptNet>>,
    /// The key header the host adds, and the key in it.
    credential: Option<(HeaderName, HeaderValue, String)>,
    timeout: Duration,
    limits: RequestLimits,
    counts: Arc<Counts>,
    refused: Arc<Mutex<Vec<String>>>,
    limited: Arc<Mutex<Option<String>>>,
}

impl HttpPolicy {
    /// The key the host adds to requests, to be hidden wherever the guest could echo it
    /// (its log lines).
    pub(crate) fn secret_values(&self) -> Vec<String> {
        let mut values: Vec<String> = self
            .credential
            .iter()
            .map(|(_, _, key)| key.clone())
            .filter(|key| !key.is_empty())
            .collect();
        if let Some(net) = &self.script {
            values.extend(net.secret_values());
        }
        values
    }

    /// Refuses every request: the policy of calls that are not LLM calls.
    pub(crate) fn deny_all() -> Self {
        HttpPolicy {
            allowed: None,
            script: None,
            credential: None,
            timeout: Duration::ZERO,
            limits: RequestLimits::default(),
            counts: Arc::default(),
            refused: Arc::default(),
            limited: Arc::default(),
        }
    }

    /// Allows `base_url`'s origin only (nothing when it is empty), adding the secret in
    /// `key_header` when it is set.
    pub(crate) fn for_endpoint(
        base_url: &str,
        secret: &Secret,
        key_header: KeyHeader,
        timeout: Duration,
    ) -> Result<Self, String> {
        let allowed = if base_url.trim().is_empty() {
            None
        } else {
            Some(Origin::parse(base_url)?)
        };
        let credential = match secret.value() {
            Some(key) => {
                let (name, text) = match key_header {
                    KeyHeader::Bearer => (http::header::AUTHORIZATION, format!("Bearer {key}")),
                    KeyHeader::XApiKey => (X_API_KEY, key.to_string()),
                };
                let mut value = HeaderValue::from_str(&text)
                    .map_err(|_| "the API key holds characters a header cannot".to_string())?;
                value.set_sensitive(true);
                Some((name, value, key.to_string()))
            }
            None => None,
        };
        Ok(HttpPolicy {
            allowed,
            script: None,
            credential,
            timeout,
            limits: RequestLimits::default(),
            counts: Arc::default(),
            refused: Arc::default(),
            limited: Arc::default(),
        })
    }

    /// The requests of a step script: to `net`'s hosts only, each exchange bounded by
    /// `timeout`.
    pub(crate) fn for_script(net: ScriptNet, timeout: Duration) -> Self {
        HttpPolicy {
            allowed: None,
            script: Some(std::sync::Arc::new(net)),
            credential: None,
            timeout,
            limits: SCRIPT_REQUEST_LIMITS,
            counts: Arc::default(),
            refused: Arc::default(),
            limited: Arc::default(),
        }
    }

    fn who(&self) -> &'static str {
        if self.script.is_some() {
            "the script"
        } else {
            "the provider"
        }
    }

    /// Refuses a script's request, before anything is sent: the script gets `reason`.
    fn refuse_script(&self, reason: String) -> SendFuture {
        let reason = clipped(reason);
        tracing::warn!("refused a script's request: {reason}");
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(reason.clone());
        Box::new(async move { Err(HttpError::InternalError(Some(reason))) })
    }

    /// The first check of a script's request: an allowed host, and secrets only where
    /// approved (put in place of their placeholders in the headers). `Err` is the reason
    /// for refusing it.
    fn check_script(
        net: &ScriptNet,
        request: &mut http::Request<WasiBody>,
    ) -> Result<Origin, String> {
        let uri = request.uri();
        let Some(target) = Origin::of(uri).filter(|_| !has_userinfo(uri)) else {
            return Err(format!(
                "refused {uri}: not an absolute http:// or https:// URL without a user name"
            ));
        };
        if !net.hosts.iter().any(|rule| rule.matches(&target)) {
            return Err(format!(
                "refused {target}: host {} is not in this step's agent_configs.allowed_hosts",
                target.host
            ));
        }
        for value in request.headers_mut().values_mut() {
            let Ok(text) = value.to_str() else { continue };
            if !text.contains(PLACEHOLDER_PREFIX) {
                continue;
            }
            let text = Self::put_secrets(net, &target, text)?;
            let mut replaced = HeaderValue::from_str(&text).map_err(|_| {
                format!("refused {target}: a secret holds characters a header cannot")
            })?;
            replaced.set_sensitive(true);
            *value = replaced;
        }
        Ok(target)
    }

    /// `text` with each placeholder of a secret replaced by the secret's value, once, from
    /// left to right: a placeholder stands for the secret whose whole name follows the
    /// prefix (`SECRET_API_TOKEN`, never `SECRET_API` followed by `_TOKEN`), and a value put
    /// in is never read again. `Err` when a secret is not approved for `target`.
    fn put_secrets(net: &ScriptNet, target: &Origin, text: &str) -> Result<String, String> {
        let name_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find(PLACEHOLDER_PREFIX) {
            out.push_str(&rest[..at]);
            let after = &rest[at + PLACEHOLDER_PREFIX.len()..];
            let found = net
                .secrets
                .iter()
                .filter(|(var, _)| {
                    after
                        .strip_prefix(var.as_str())
                        .is_some_and(|next| !next.starts_with(name_char))
                })
                .max_by_key(|(var, _)| var.len());
            let Some((var, secret)) = found else {
                out.push_str(PLACEHOLDER_PREFIX);
                rest = after;
                continue;
            };
            if !net.approvals.is_approved(var, target) {
                return Err(format!(
                    "refused {target}: the secret in {var} is not approved for {target}; \
                     the operator approves it with --allow-key {var}={target}"
                ));
            }
            out.push_str(secret.value().unwrap_or_default());
            rest = &after[var.len()..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// The same policy with other request limits.
    #[cfg(test)]
    pub(crate) fn with_limits(mut self, limits: RequestLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The first request limit reached, shared with the caller.
    pub(crate) fn limited(&self) -> Arc<Mutex<Option<String>>> {
        self.limited.clone()
    }

    /// Refuses a request over a limit; the first one is logged and kept for the caller.
    fn over_limit(&self, message: String) -> SendFuture {
        let mut limited = self.limited.lock().unwrap_or_else(|e| e.into_inner());
        if limited.is_none() {
            tracing::warn!("{message}");
            *limited = Some(message.clone());
        }
        Box::new(async move { Err(HttpError::InternalError(Some(message))) })
    }

    /// Destinations refused so far, shared with the caller.
    pub(crate) fn refused(&self) -> Arc<Mutex<Vec<String>>> {
        self.refused.clone()
    }

    /// The origin allowed, for messages.
    pub(crate) fn allowed(&self) -> Option<&Origin> {
        self.allowed.as_ref()
    }
}

/// Anthropic's key header.
const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

fn forbidden(name: &HeaderName) -> bool {
    // The guest may not set credentials of its own, nor see ours echoed back.
    *name == http::header::AUTHORIZATION
        || *name == X_API_KEY
        || DEFAULT_FORBIDDEN_HEADERS.contains(name)
}

/// A script sets its own `Authorization` (with a secret's placeholder in it).
fn forbidden_to_scripts(name: &HeaderName) -> bool {
    DEFAULT_FORBIDDEN_HEADERS.contains(name)
}

type SendFuture = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
                ),
                HttpError,
            >,
        > + Send,
>;

impl WasiHttpHooks for HttpPolicy {
    fn forbidden_header_filter(&mut self) -> ForbiddenHeaderFilter {
        if self.script.is_some() {
            Arc::new(forbidden_to_scripts)
        } else {
            Arc::new(forbidden)
        }
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> SendFuture {
        drop(fut);
        let limits = self.limits;
        // Every request counts, refused ones too: a loop of refusals ends here, and with it
        // the host's log lines and records of what it refused.
        if self.counts.total.fetch_add(1, Ordering::SeqCst) >= limits.total {
            return self.over_limit(format!(
                "{} opened more than {} requests in one call attempt (the limit of \
                 requests per attempt)",
                self.who(),
                limits.total
            ));
        }
        let mut request = request;
        let script = self.script.clone();
        let script_target = match &script {
            Some(net) => match Self::check_script(net, &mut request) {
                Ok(target) => Some(target),
                Err(reason) => return self.refuse_script(reason),
            },
            None => None,
        };
        let target = Origin::of(request.uri()).filter(|_| !has_userinfo(request.uri()));
        let permitted = script_target.is_some()
            || matches!((&self.allowed, &target), (Some(a), Some(t)) if a == t);
        if !permitted {
            let shown = clipped(
                target
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| request.uri().to_string()),
            );
            tracing::warn!(destination = %shown, "refused an LLM provider's request");
            self.refused
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(shown);
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        if self.counts.live.load(Ordering::SeqCst) >= limits.live {
            return self.over_limit(format!(
                "{} had more than {} requests open at once (the limit of live \
                 requests per attempt)",
                self.who(),
                limits.live
            ));
        }
        let declared = request
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limits.body_bytes) {
            return self.over_limit(format!(
                "{} sent a request body of {} bytes, over the limit of {} bytes",
                self.who(),
                declared.unwrap_or_default(),
                limits.body_bytes
            ));
        }
        self.counts.live.fetch_add(1, Ordering::SeqCst);
        let live: SharedGuard = Arc::new(Mutex::new(Some(LiveGuard(self.counts.clone()))));
        let body_limit = limits.body_bytes;
        let limited = self.limited.clone();
        let who = self.who();
        let request = request.map(|body| {
            http_body_util::Limited::new(body, usize::try_from(body_limit).unwrap_or(usize::MAX))
                .map_err(move |e| match e.downcast::<HttpError>() {
                    Ok(e) => *e,
                    Err(_) => {
                        let mut first = limited.lock().unwrap_or_else(|e| e.into_inner());
                        first.get_or_insert_with(|| {
                            format!(
                                "{who} sent a request body over the limit of {body_limit} bytes"
                            )
                        });
                        HttpError::HttpRequestBodySize(Some(body_limit))
                    }
                })
                .boxed_unsync()
        });
        let mut request = request;
        if script.is_none() {
            let headers = request.headers_mut();
            headers.remove(http::header::AUTHORIZATION);
            headers.remove(X_API_KEY);
            if let Some((name, value, _)) = &self.credential {
                headers.insert(name.clone(), value.clone());
            }
        }
        let refused = self.refused.clone();
        let timeout = self.timeout;
        let bound = |guest: Option<Duration>| Some(guest.map_or(timeout, |g| g.min(timeout)));
        let options = RequestOptions {
            connect_timeout: bound(options.and_then(|o| o.connect_timeout)),
            first_byte_timeout: bound(options.and_then(|o| o.first_byte_timeout)),
            between_bytes_timeout: bound(options.and_then(|o| o.between_bytes_timeout)),
        };
        Box::new(async move {
            if let (Some(net), Some(target)) = (&script, &script_target) {
                match check_address(target, &net.approvals).await {
                    Ok(pinned) => {
                        if let Some(address) = pinned {
                            pin_to(&mut request, address);
                        }
                    }
                    Err(reason) => {
                        let reason = clipped(reason);
                        tracing::warn!("refused a script's request: {reason}");
                        refused
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(reason.clone());
                        return Err(HttpError::InternalError(Some(reason)));
                    }
                }
            }
            let response_limit = script.as_ref().map(|_| SCRIPT_RESPONSE_BYTES);
            let sent = tokio::time::timeout(
                timeout,
                wasmtime_wasi_http::default_send_request(request, Some(options)),
            )
            .await
            .map_err(|_| HttpError::HttpResponseTimeout)??;
            let (response, io) = sent;
            if let Some(limit) = response_limit {
                let declared = response
                    .headers()
                    .get(http::header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                if declared.is_some_and(|n| n > limit) {
                    return Err(HttpError::HttpResponseBodySize(declared));
                }
            }
            // The request stays live until its response body ends or its connection does.
            let body_live = live.clone();
            let io = async move {
                let result = io.await;
                end(&live);
                result
            };
            Ok((
                response.map(|inner| {
                    let inner = match response_limit {
                        Some(limit) => http_body_util::Limited::new(
                            inner,
                            usize::try_from(limit).unwrap_or(usize::MAX),
                        )
                        .map_err(move |e| match e.downcast::<HttpError>() {
                            Ok(e) => *e,
                            Err(_) => HttpError::HttpResponseBodySize(Some(limit)),
                        })
                        .boxed_unsync(),
                        None => inner.boxed_unsync(),
                    };
                    CountedBody {
                        inner,
                        live: body_live,
                    }
                    .boxed_unsync()
                }),
                Box::new(io) as Box<dyn Future<Output = Result<(), HttpError>> + Send>,
            ))
        })
    }
}

/// Longest refusal the host logs and keeps, in bytes: a URL may be 64 KiB long, and a
/// guest may be refused up to its request limit.
const REFUSAL_BYTES: usize = 512;

/// `text` cut to [`REFUSAL_BYTES`] (at a character boundary), marked with `…` when cut.
fn clipped(mut text: String) -> String {
    if text.len() > REFUSAL_BYTES {
        let mut end = REFUSAL_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// Sends a plain `http://` request to `address` (its `Host` header still names the host).
fn pin_to(request: &mut http::Request<WasiBody>, address: std::net::SocketAddr) {
    let path = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".to_string());
    if let Ok(uri) = Uri::builder()
        .scheme(Scheme::HTTP)
        .authority(address.to_string())
        .path_and_query(path)
        .build()
    {
        *request.uri_mut() = uri;
    }
}

#[cfg(test)]
mod tests {
    use super::hosts::is_public;
    use super::*;

    #[test]
    fn origins_compare_scheme_host_and_default_port() {
        let base = Origin::parse("https://API.openai.com/v1").unwrap();
        assert_eq!(base, Origin::parse("https://api.openai.com:443/x").unwrap());
        assert_ne!(base, Origin::parse("http://api.openai.com/v1").unwrap());
        assert_ne!(
            base,
            Origin::parse("https://api.openai.com:8443/v1").unwrap()
        );
        assert_ne!(base, Origin::parse("https://evil.com/v1").unwrap());
        assert!(Origin::parse("api.openai.com/v1").is_err());
    }

    #[test]
    fn a_base_url_with_userinfo_is_refused() {
        let err = Origin::parse("https://user@api.openai.com/v1").unwrap_err();
        assert!(err.contains("user name"), "{err}");
        assert!(Origin::parse("http://127.0.0.1:9").unwrap().is_loopback());
        assert!(Origin::parse("http://[::1]:9").unwrap().is_loopback());
        assert!(Origin::parse("http://localhost").unwrap().is_loopback());
        assert!(!Origin::parse("http://10.0.0.1").unwrap().is_loopback());
    }

    fn request(uri: &str, length: Option<u64>) -> http::Request<WasiBody> {
        let mut builder = http::Request::builder().method("POST").uri(uri);
        if let Some(n) = length {
            builder = builder.header(http::header::CONTENT_LENGTH, n.to_string());
        }
        builder
            .body(
                http_body_util::Empty::new()
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
            .unwrap()
    }

    fn policy(limits: RequestLimits) -> HttpPolicy {
        // A port nothing listens on: the requests counted here never need an answer.
        HttpPolicy::for_endpoint(
            "http://127.0.0.1:9/v1",
            &Secret::none(),
            KeyHeader::Bearer,
            Duration::from_secs(1),
        )
        .unwrap()
        .with_limits(limits)
    }

    fn send(policy: &mut HttpPolicy, uri: &str, length: Option<u64>) -> SendFuture {
        policy.send_request(request(uri, length), None, Box::new(async { Ok(()) }))
    }

    #[tokio::test]
    async fn an_authority_with_userinfo_is_refused_at_send() {
        let mut policy = policy(RequestLimits::default());
        let refused = policy.refused();
        let sent = Box::into_pin(send(&mut policy, "http://x@127.0.0.1:9/v1", None)).await;
        assert!(matches!(sent, Err(HttpError::HttpRequestDenied)));
        assert_eq!(refused.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn requests_per_attempt_are_bounded_live_in_total_and_in_size() {
        let url = "http://127.0.0.1:9/v1/chat";
        // Live: the futures are kept, not driven, so all four stay open.
        let mut live = policy(RequestLimits {
            live: 4,
            total: 100,
            body_bytes: 1 << 20,
        });
        let open: Vec<SendFuture> = (0..4).map(|_| send(&mut live, url, None)).collect();
        let fifth = Box::into_pin(send(&mut live, url, None)).await;
        assert!(
            matches!(fifth, Err(HttpError::InternalError(Some(m))) if m.contains("more than 4 requests open at once"))
        );
        assert!(live.limited().lock().unwrap().is_some());
        drop(open);
        // Dropped, they are no longer live.
        assert_eq!(live.counts.live.load(Ordering::SeqCst), 0);

        let mut total = policy(RequestLimits {
            live: 100,
            total: 3,
            body_bytes: 1 << 20,
        });
        for _ in 0..3 {
            drop(send(&mut total, url, None));
        }
        let fourth = Box::into_pin(send(&mut total, url, None)).await;
        assert!(
            matches!(fourth, Err(HttpError::InternalError(Some(m))) if m.contains("more than 3 requests in one call attempt"))
        );

        let mut size = policy(RequestLimits::default());
        let big = Box::into_pin(send(&mut size, url, Some(33 << 20))).await;
        assert!(
            matches!(big, Err(HttpError::InternalError(Some(m))) if m.contains("over the limit of 33554432 bytes"))
        );
    }

    #[test]
    fn host_rules_and_public_addresses() {
        let rule = HostRule::parse("API.example.com").unwrap();
        assert!(rule.matches(&Origin::parse("https://api.example.com:8443/x").unwrap()));
        assert!(rule.matches(&Origin::parse("http://api.example.com./x").unwrap()));
        assert!(!rule.matches(&Origin::parse("https://api.example.com.evil.net").unwrap()));
        let port = HostRule::parse("127.0.0.1:8080").unwrap();
        assert!(port.matches(&Origin::parse("http://127.0.0.1:8080").unwrap()));
        assert!(!port.matches(&Origin::parse("http://127.0.0.1:8081").unwrap()));
        assert!(HostRule::parse("[::1]:80").is_ok());
        for bad in ["https://h", "h/path", "u@h", "", "h:99999"] {
            assert!(HostRule::parse(bad).is_err(), "{bad}");
        }
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b::192.168.0.1",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in [
            "93.184.216.34",
            "2606:2800:220:1::1",
            "64:ff9b::93.184.216.34",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn placeholders_stand_for_whole_names_and_values_are_not_read_again() {
        let origin = "http://127.0.0.1:9";
        let mut approvals = super::super::KeyApprovals::none();
        approvals.allow("SECRET_API", origin).unwrap();
        approvals.allow("SECRET_API_TOKEN", origin).unwrap();
        let net = ScriptNet {
            hosts: vec![HostRule::parse("127.0.0.1").unwrap()],
            approvals: Arc::new(approvals),
            secrets: vec![
                ("SECRET_API".into(), Secret::new("short")),
                // A value that looks like a placeholder is put in as it is.
                (
                    "SECRET_API_TOKEN".into(),
                    Secret::new("trellis-secret:SECRET_API"),
                ),
                ("SECRET_OTHER".into(), Secret::new("other")),
            ],
        };
        let target = Origin::parse(origin).unwrap();
        let put = |text: &str| HttpPolicy::put_secrets(&net, &target, text);
        assert_eq!(
            put("a trellis-secret:SECRET_API_TOKEN b trellis-secret:SECRET_API.").unwrap(),
            "a trellis-secret:SECRET_API b short."
        );
        // An unknown name, or a known one followed by more of a name, is left as it is.
        assert_eq!(
            put("trellis-secret:SECRET_APIX trellis-secret:").unwrap(),
            "trellis-secret:SECRET_APIX trellis-secret:"
        );
        let refused = put("x trellis-secret:SECRET_OTHER").unwrap_err();
        assert!(
            refused.contains("SECRET_OTHER is not approved"),
            "{refused}"
        );
    }

    #[test]
    fn the_guest_cannot_set_authorization() {
        assert!(forbidden(&http::header::AUTHORIZATION));
        assert!(forbidden(&HeaderName::from_static("x-api-key")));
        assert!(forbidden(&http::header::HOST));
        assert!(!forbidden(&http::header::CONTENT_TYPE));
    }
}
