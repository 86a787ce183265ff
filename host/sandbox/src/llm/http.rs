//! Outgoing HTTP of an LLM provider call: one origin, the host's credentials,
//! a deadline.
//!
//! [`HttpPolicy`] is the `wasi:http` hook of every provider call. It refuses any
//! request whose scheme, host or port differ from the endpoint's base URL
//! (recording what it refused, so the error can name it), replaces whatever
//! `authorization` the request carries with the host-side secret, and bounds
//! connect, first byte and the whole exchange by the call's timeout. It also
//! bounds what one call attempt may open ([`RequestLimits`]: requests live at
//! once, requests in all, bytes of a request body) and refuses an authority
//! with userinfo (`x@host`), whose host the check and the connection could
//! read differently.

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

use super::Secret;

/// Whether `base_url` names this machine (`localhost`, 127.0.0.0/8, `::1`): a local server
/// may answer without a key; any other origin gets none sent without one.
pub fn is_loopback_base_url(base_url: &str) -> bool {
    Origin::parse(base_url).is_ok_and(|o| o.is_loopback())
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

    /// Whether the host is this machine (`localhost`, 127.0.0.0/8, `::1`).
    pub fn is_loopback(&self) -> bool {
        let host = self.host.trim_start_matches('[').trim_end_matches(']');
        host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
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

/// The `wasi:http` hooks of one provider call.
pub(crate) struct HttpPolicy {
    allowed: Option<Origin>,
    authorization: Option<HeaderValue>,
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
        self.authorization
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .filter(|key| !key.is_empty())
            .map(|key| vec![key.to_string()])
            .unwrap_or_default()
    }

    /// Refuses every request: the policy of calls that are not LLM calls.
    pub(crate) fn deny_all() -> Self {
        HttpPolicy {
            allowed: None,
            authorization: None,
            timeout: Duration::ZERO,
            limits: RequestLimits::default(),
            counts: Arc::default(),
            refused: Arc::default(),
            limited: Arc::default(),
        }
    }

    /// Allows `base_url`'s origin only (nothing when it is empty), adding
    /// `Authorization: Bearer <secret>` when the secret is set.
    pub(crate) fn for_endpoint(
        base_url: &str,
        secret: &Secret,
        timeout: Duration,
    ) -> Result<Self, String> {
        let allowed = if base_url.trim().is_empty() {
            None
        } else {
            Some(Origin::parse(base_url)?)
        };
        let authorization = match secret.value() {
            Some(key) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| "the API key holds characters a header cannot".to_string())?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        Ok(HttpPolicy {
            allowed,
            authorization,
            timeout,
            limits: RequestLimits::default(),
            counts: Arc::default(),
            refused: Arc::default(),
            limited: Arc::default(),
        })
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

    fn over_limit(&self, message: String) -> SendFuture {
        tracing::warn!("{message}");
        let mut limited = self.limited.lock().unwrap_or_else(|e| e.into_inner());
        if limited.is_none() {
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

fn forbidden(name: &HeaderName) -> bool {
    // The guest may not set credentials of its own, nor see ours echoed back.
    *name == http::header::AUTHORIZATION || DEFAULT_FORBIDDEN_HEADERS.contains(name)
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
        Arc::new(forbidden)
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> SendFuture {
        drop(fut);
        let target = Origin::of(request.uri()).filter(|_| !has_userinfo(request.uri()));
        let permitted = matches!((&self.allowed, &target), (Some(a), Some(t)) if a == t);
        if !permitted {
            let shown = target
                .map(|t| t.to_string())
                .unwrap_or_else(|| request.uri().to_string());
            tracing::warn!(destination = %shown, "refused an LLM provider's request");
            self.refused
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(shown);
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        let limits = self.limits;
        if self.counts.total.load(Ordering::SeqCst) >= limits.total {
            return self.over_limit(format!(
                "the provider opened more than {} requests in one call attempt (the limit of \
                 requests per attempt)",
                limits.total
            ));
        }
        if self.counts.live.load(Ordering::SeqCst) >= limits.live {
            return self.over_limit(format!(
                "the provider had more than {} requests open at once (the limit of live \
                 requests per attempt)",
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
                "the provider sent a request body of {} bytes, over the limit of {} bytes",
                declared.unwrap_or_default(),
                limits.body_bytes
            ));
        }
        self.counts.total.fetch_add(1, Ordering::SeqCst);
        self.counts.live.fetch_add(1, Ordering::SeqCst);
        let live: SharedGuard = Arc::new(Mutex::new(Some(LiveGuard(self.counts.clone()))));
        let body_limit = limits.body_bytes;
        let limited = self.limited.clone();
        let request = request.map(|body| {
            http_body_util::Limited::new(body, usize::try_from(body_limit).unwrap_or(usize::MAX))
                .map_err(move |e| match e.downcast::<HttpError>() {
                    Ok(e) => *e,
                    Err(_) => {
                        let mut first = limited.lock().unwrap_or_else(|e| e.into_inner());
                        first.get_or_insert_with(|| {
                            format!(
                                "the provider sent a request body over the limit of {body_limit} bytes"
                            )
                        });
                        HttpError::HttpRequestBodySize(Some(body_limit))
                    }
                })
                .boxed_unsync()
        });
        let mut request = request;
        let headers = request.headers_mut();
        headers.remove(http::header::AUTHORIZATION);
        if let Some(value) = &self.authorization {
            headers.insert(http::header::AUTHORIZATION, value.clone());
        }
        let timeout = self.timeout;
        let bound = |guest: Option<Duration>| Some(guest.map_or(timeout, |g| g.min(timeout)));
        let options = RequestOptions {
            connect_timeout: bound(options.and_then(|o| o.connect_timeout)),
            first_byte_timeout: bound(options.and_then(|o| o.first_byte_timeout)),
            between_bytes_timeout: bound(options.and_then(|o| o.between_bytes_timeout)),
        };
        Box::new(async move {
            let sent = tokio::time::timeout(
                timeout,
                wasmtime_wasi_http::default_send_request(request, Some(options)),
            )
            .await
            .map_err(|_| HttpError::HttpResponseTimeout)??;
            let (response, io) = sent;
            // The request stays live until its response body ends or its connection does.
            let body_live = live.clone();
            let io = async move {
                let result = io.await;
                end(&live);
                result
            };
            Ok((
                response.map(|inner| {
                    CountedBody {
                        inner: inner.boxed_unsync(),
                        live: body_live,
                    }
                    .boxed_unsync()
                }),
                Box::new(io) as Box<dyn Future<Output = Result<(), HttpError>> + Send>,
            ))
        })
    }
}

#[cfg(test)]
mod tests {
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
    fn the_guest_cannot_set_authorization() {
        assert!(forbidden(&http::header::AUTHORIZATION));
        assert!(forbidden(&http::header::HOST));
        assert!(!forbidden(&http::header::CONTENT_TYPE));
    }
}
