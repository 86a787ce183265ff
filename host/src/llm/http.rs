//! Outgoing HTTP of an LLM provider call: one origin, the host's credentials,
//! a deadline.
//!
//! [`HttpPolicy`] is the `wasi:http` hook of every provider call. It refuses any
//! request whose scheme, host or port differ from the endpoint's base URL
//! (recording what it refused, so the error can name it), replaces whatever
//! `authorization` the request carries with the host-side secret, and bounds
//! connect, first byte and the whole exchange by the call's timeout.

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

/// Scheme, host and port: what a provider may reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    https: bool,
    host: String,
    port: u16,
}

impl Origin {
    /// The origin of a base URL such as `https://api.openai.com/v1`.
    pub(crate) fn parse(base_url: &str) -> Result<Origin, String> {
        let uri: Uri = base_url
            .parse()
            .map_err(|e| format!("base URL `{base_url}` is not a URL: {e}"))?;
        Origin::of(&uri).ok_or_else(|| {
            format!("base URL `{base_url}` must be an absolute http:// or https:// URL")
        })
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

/// The `wasi:http` hooks of one provider call.
pub(crate) struct HttpPolicy {
    allowed: Option<Origin>,
    authorization: Option<HeaderValue>,
    timeout: Duration,
    refused: Arc<Mutex<Vec<String>>>,
}

impl HttpPolicy {
    /// Refuses every request: the policy of calls that are not LLM calls.
    pub(crate) fn deny_all() -> Self {
        HttpPolicy {
            allowed: None,
            authorization: None,
            timeout: Duration::ZERO,
            refused: Arc::default(),
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
            refused: Arc::default(),
        })
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
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> SendFuture {
        drop(fut);
        let target = Origin::of(request.uri());
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
            Ok((
                response.map(BodyExt::boxed_unsync),
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
    fn the_guest_cannot_set_authorization() {
        assert!(forbidden(&http::header::AUTHORIZATION));
        assert!(forbidden(&http::header::HOST));
        assert!(!forbidden(&http::header::CONTENT_TYPE));
    }
}
