//! What every request must show before a handler sees it: the bearer token when the server
//! has one, a `Host` that names the server (a page on another name, reached by DNS
//! rebinding, is refused), no foreign `Origin` (no other site's page may use a local
//! server), and a JSON body on every write (a form post from another site cannot be one).

use std::net::SocketAddr;

use axum::http::{HeaderMap, Method, StatusCode, header};

use crate::api::ApiError;

/// The checks of one server.
#[derive(Debug, Clone)]
pub struct Guard {
    /// The bound address.
    pub addr: SocketAddr,
    /// The bearer token every request needs, when set.
    pub token: Option<String>,
}

impl Guard {
    /// `Err` with the answer to give when the request may not go on. The page at `/` holds
    /// no data and needs no token (its requests carry the one in its address's fragment).
    pub fn check(&self, method: &Method, path: &str, headers: &HeaderMap) -> Result<(), ApiError> {
        // One of each: a second Host, Origin or Authorization could be read by another
        // part than the one checked.
        for name in [header::HOST, header::ORIGIN, header::AUTHORIZATION] {
            if headers.get_all(&name).iter().count() > 1 {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    format!("the request has more than one {name} header"),
                ));
            }
        }
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !self.host_allowed(host) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "bad_host",
                format!(
                    "Host {host:?} is not this server's ({}, or localhost:{}): a page reached \
                     under another name is refused",
                    self.addr,
                    self.addr.port()
                ),
            ));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or_default();
            let own = origin
                .strip_prefix("http://")
                .is_some_and(|rest| rest == host);
            if !own {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "foreign_origin",
                    format!(
                        "requests from {origin:?} are refused: only this server's own page may call it"
                    ),
                ));
            }
        }
        let page = *method == Method::GET && path == "/";
        if let Some(token) = self.token.as_ref().filter(|_| !page)
            && !same_secret(bearer(headers).as_bytes(), token.as_bytes())
        {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this server needs `Authorization: Bearer <TRELLIS_TOKEN>`",
            ));
        }
        // Every method with a body that may change something (POST, PUT, PATCH) carries
        // JSON: a form a foreign page posts cannot be one.
        if matches!(*method, Method::POST | Method::PUT | Method::PATCH) {
            let json = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(';').next())
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
            if !json {
                return Err(ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "not_json",
                    "a write needs `Content-Type: application/json`",
                ));
            }
        }
        Ok(())
    }

    /// Whether a request shows its connection is a client's: it passed [`Guard::check`]
    /// (`passed`) and, when the server has a token, carries it (the page, which anyone may
    /// fetch, does not count). A connection shown so keeps its place when the connections
    /// are all taken.
    pub fn proves_its_client(&self, passed: bool, headers: &HeaderMap) -> bool {
        passed
            && self
                .token
                .as_ref()
                .is_none_or(|token| same_secret(bearer(headers).as_bytes(), token.as_bytes()))
    }

    /// The bound address and port, or `localhost` with the port; any name when the server
    /// listens on every address (it then has a token).
    fn host_allowed(&self, host: &str) -> bool {
        if self.addr.ip().is_unspecified() {
            return true;
        }
        let port = self.addr.port();
        host == self.addr.to_string()
            || host == format!("localhost:{port}")
            || (self.addr.ip().is_loopback() && host == format!("127.0.0.1:{port}"))
    }
}

/// The bearer token a request carries; empty without one.
fn bearer(headers: &HeaderMap) -> &str {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
}

/// `a == b`, in a time that does not depend on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, x) in b.iter().enumerate() {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ x);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abd", b"abc"));
        assert!(!same_secret(b"ab", b"abc"));
        assert!(!same_secret(b"abcd", b"abc"));
        assert!(!same_secret(b"", b"abc"));
    }
}
