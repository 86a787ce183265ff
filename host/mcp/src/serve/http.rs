//! The HTTP front of `trellis mcp serve`: the listener, its connection slots, the guard
//! of every request (token, `Host`), bodies read within their bounds, and answers held
//! within what the server may hold at once (see the parent module's header).

use super::*;

/// How the HTTP transport admits requests.
#[derive(Debug, Clone)]
pub struct HttpAccess {
    /// The bearer token every request must carry; `None` admits any (loopback only).
    pub token: Option<String>,
    /// Names and addresses a request's `Host` may give, besides the loopback ones.
    pub extra_hosts: Vec<String>,
}

/// What one HTTP server holds at most at once.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Live sessions; an `initialize` past it gets `503`. A session ends when its client
    /// deletes it or after 5 minutes idle. Requests without a session in progress at once
    /// (each a session of one request) have the same cap, counted apart.
    pub max_sessions: usize,
    /// Open connections; one past it gets `503` and is closed.
    pub max_connections: usize,
    /// Bytes of answers being sent at once (an answer waits in memory until its client
    /// reads it): one past it gets `503`, a stream past it ends.
    pub answer_bytes: u64,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            answer_bytes: trellis_sandbox::answers::DEFAULT_ANSWER_BYTES,
        }
    }
}

/// The loopback names every HTTP server accepts in `Host`.
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// A bound HTTP server, not yet serving.
#[derive(Debug)]
pub struct HttpServer {
    listener: tokio::net::TcpListener,
    server: ToolServer,
    access: HttpAccess,
    limits: HttpLimits,
}

impl HttpServer {
    /// Binds `addr`. Off loopback a token is required, and the address itself joins the
    /// hosts a request may name.
    pub async fn bind(
        server: ToolServer,
        addr: SocketAddr,
        mut access: HttpAccess,
        limits: HttpLimits,
    ) -> Result<Self> {
        if access.token.as_deref().is_some_and(str::is_empty) {
            access.token = None;
        }
        if !addr.ip().is_loopback() {
            anyhow::ensure!(
                access.token.is_some(),
                "{addr} is not a loopback address: set TRELLIS_TOKEN to the bearer token \
                 clients must send"
            );
            if !addr.ip().is_unspecified() {
                access.extra_hosts.push(addr.ip().to_string());
            }
        }
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        Ok(HttpServer {
            listener,
            server,
            access,
            limits,
        })
    }

    /// The address it listens on (the port chosen when 0 was asked for).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until `stop` completes.
    pub async fn serve(self, stop: impl Future<Output = ()>) -> Result<()> {
        let shutdown = tokio_util::sync::CancellationToken::new();
        let _stop_all = shutdown.clone().drop_guard();
        let mut stop = std::pin::pin!(stop);
        use rmcp::transport::streamable_http_server::{
            StreamableHttpServerConfig, StreamableHttpService,
        };
        let hosts: Vec<String> = LOOPBACK_HOSTS
            .iter()
            .map(|h| h.to_string())
            .chain(self.access.extra_hosts.iter().cloned())
            .collect();
        // A browser page may call only from a loopback origin; other clients send no Origin.
        let origins = ["http", "https"].into_iter().flat_map(|scheme| {
            ["localhost", "127.0.0.1", "[::1]"]
                .into_iter()
                .map(move |host| format!("{scheme}://{host}:*"))
        });
        let config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(hosts)
            .with_allowed_origins(origins)
            .enforce_origin_validation()
            .with_max_request_body_bytes(MAX_BODY_BYTES)
            .with_cancellation_token(shutdown.child_token());
        let server = self.server.clone();
        let sessions = Arc::new(CappedSessions {
            inner: LocalSessionManager::default(),
            max: self.limits.max_sessions.max(1),
            creating: tokio::sync::Mutex::new(()),
        });
        let service =
            StreamableHttpService::new(move || Ok(server.clone()), sessions.clone(), config);
        let token = self.access.token.map(Arc::<str>::from);
        let max_connections = self.limits.max_connections.max(1);
        // A connection that has not sent a request with the token gives its place to a new
        // one when all are taken (clients without the token cannot hold them all).
        let connections =
            trellis_sandbox::connections::Slots::new(max_connections, token.is_some());
        let sessionless = Arc::new(tokio::sync::Semaphore::new(sessions.max));
        // What the answers being sent hold together (a client that does not read keeps its
        // answer in memory).
        let answers = trellis_sandbox::answers::AnswerBytes::new(self.limits.answer_bytes);
        loop {
            let (stream, _) = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        tracing::warn!("accepting a connection: {err}");
                        continue;
                    }
                },
                () = &mut stop => return Ok(()),
            };
            let Some((connection_slot, evicted)) = connections.admit() else {
                tokio::spawn(refuse_connection(stream, max_connections));
                continue;
            };
            let prover = connection_slot.prover();
            let service = service.clone();
            let token = token.clone();
            let shutdown = shutdown.clone();
            let sessions = sessions.clone();
            let sessionless = sessionless.clone();
            let answers = answers.clone();
            tokio::spawn(async move {
                let _slot = connection_slot;
                let handler = hyper::service::service_fn(move |request| {
                    let mut service = service.clone();
                    let token = token.clone();
                    let prover = prover.clone();
                    let sessions = sessions.clone();
                    let sessionless = sessionless.clone();
                    let answers = answers.clone();
                    let answer = async move {
                        if let Some(mut refused) = refuse(&request, token.as_deref()) {
                            // A refused request ends its connection: a client without the
                            // token cannot keep a place by sending request after request.
                            refused.headers_mut().insert(
                                hyper::header::CONNECTION,
                                hyper::header::HeaderValue::from_static("close"),
                            );
                            return Ok::<_, std::convert::Infallible>(refused);
                        }
                        prover.prove();
                        let (request, body) = match read_body(request).await {
                            Ok(read) => read,
                            Err(refused) => return Ok(refused),
                        };
                        // The connection is busy once its request is in whole, until the
                        // answer is sent: a body trickled in does not keep its place.
                        let busy = prover.busy();
                        // A request without a session holds a slot until its answer is sent
                        // (a tool call's stream included): rmcp serves such a request with
                        // an instance of its own, which the session cap does not count. An
                        // `initialize` is the session cap's.
                        let sessionless_slot = if request.headers().contains_key(SESSION_HEADER)
                            || opens_session(&body)
                        {
                            None
                        } else {
                            match sessionless.clone().try_acquire_owned() {
                                Ok(slot) => Some(slot),
                                Err(_) => return Ok(sessionless_full(sessions.max)),
                            }
                        };
                        let (response, refused) = SESSION_REFUSED
                            .scope(std::cell::Cell::new(false), async {
                                let response =
                                    tower_service::Service::call(&mut service, request).await;
                                (response, SESSION_REFUSED.with(std::cell::Cell::get))
                            })
                            .await;
                        if refused {
                            let mut response = plain_owned(
                                hyper::StatusCode::SERVICE_UNAVAILABLE,
                                sessions_full(sessions.max),
                            );
                            response.headers_mut().insert(
                                hyper::header::RETRY_AFTER,
                                hyper::header::HeaderValue::from_static("5"),
                            );
                            return Ok(response);
                        }
                        Ok(match response {
                            Ok(response) => response.map(|body| {
                                body.map_frame(move |frame| {
                                    let _held = (&sessionless_slot, &busy);
                                    frame
                                })
                                .boxed()
                            }),
                            Err(never) => match never {},
                        })
                    };
                    async move {
                        let Ok(answer) = answer.await;
                        Ok::<_, std::convert::Infallible>(within(&answers, answer))
                    }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), handler);
                tokio::select! {
                    result = connection => {
                        if let Err(err) = result {
                            tracing::debug!("HTTP connection: {err}");
                        }
                    }
                    () = shutdown.cancelled() => {}
                    () = evicted => tracing::debug!("HTTP connection closed for a newer one"),
                }
            });
        }
    }
}

pub(super) type Response =
    hyper::Response<http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>>;

/// An answer as sent: within the server's budget of answers being sent, or `503` when the
/// budget does not have room for it.
type Sent = hyper::Response<
    http_body_util::Either<
        trellis_sandbox::answers::Held<
            http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>,
        >,
        http_body_util::Full<bytes::Bytes>,
    >,
>;

/// `answer` within `answers` (see [`trellis_sandbox::answers`]).
fn within(
    answers: &std::sync::Arc<trellis_sandbox::answers::AnswerBytes>,
    answer: Response,
) -> Sent {
    let (parts, body) = answer.into_parts();
    match answers.hold(body) {
        Ok(held) => hyper::Response::from_parts(parts, http_body_util::Either::Left(held)),
        Err(busy) => {
            let mut refused = hyper::Response::new(http_body_util::Either::Right(
                http_body_util::Full::new(bytes::Bytes::from(format!("{busy}\n"))),
            ));
            *refused.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
            refused.headers_mut().insert(
                hyper::header::RETRY_AFTER,
                hyper::header::HeaderValue::from_static("5"),
            );
            refused
        }
    }
}

/// Answers a connection past `--max-connections` with `503` and closes it.
async fn refuse_connection(mut stream: tokio::net::TcpStream, max: usize) {
    use tokio::io::AsyncWriteExt;
    let text = format!(
        "service unavailable: {max} connections are open, the limit \
         (`trellis mcp serve --max-connections`); try again later\n"
    );
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    // A client that does not read its answer does not hold the task.
    let _ = tokio::time::timeout(HEADER_READ_TIMEOUT, async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}

/// Reads the whole body of `request` (at most [`MAX_BODY_BYTES`], within
/// [`BODY_READ_TIMEOUT`]) before rmcp sees it: the request to hand on, and its body.
async fn read_body(
    request: hyper::Request<hyper::body::Incoming>,
) -> Result<
    (
        hyper::Request<http_body_util::Full<bytes::Bytes>>,
        bytes::Bytes,
    ),
    Response,
> {
    let (parts, body) = request.into_parts();
    let limited = http_body_util::Limited::new(body, MAX_BODY_BYTES);
    match tokio::time::timeout(BODY_READ_TIMEOUT, limited.collect()).await {
        Ok(Ok(collected)) => {
            let bytes = collected.to_bytes();
            // Parsed, a body of many small values costs far more than its bytes (a 4 MiB
            // array of digits is two million values): refused before anything parses it.
            let values = json_values(&bytes);
            if values > MAX_BODY_VALUES {
                return Err(plain_owned(
                    hyper::StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "payload too large: a request body may hold {MAX_BODY_VALUES} JSON \
                         values, this one holds about {values}"
                    ),
                ));
            }
            Ok((
                hyper::Request::from_parts(parts, http_body_util::Full::new(bytes.clone())),
                bytes,
            ))
        }
        Ok(Err(err)) if err.is::<http_body_util::LengthLimitError>() => Err(plain_owned(
            hyper::StatusCode::PAYLOAD_TOO_LARGE,
            format!("payload too large: a request body may have {MAX_BODY_BYTES} bytes"),
        )),
        Ok(Err(err)) => Err(plain_owned(
            hyper::StatusCode::BAD_REQUEST,
            format!("bad request: reading the body: {err}"),
        )),
        Err(_) => Err(plain_owned(
            hyper::StatusCode::REQUEST_TIMEOUT,
            format!(
                "request timeout: the body did not arrive within {} s of the headers",
                BODY_READ_TIMEOUT.as_secs()
            ),
        )),
    }
}

/// The answer to a request that does not reach the MCP service: a path other than
/// [`HTTP_PATH`] (404), a missing or wrong bearer token (401).
fn refuse<B>(request: &hyper::Request<B>, token: Option<&str>) -> Option<Response> {
    if request.uri().path() != HTTP_PATH {
        return Some(plain(
            hyper::StatusCode::NOT_FOUND,
            "not found: MCP is served at /mcp",
        ));
    }
    // A request names this server by its Host alone: an absolute target
    // (`POST http://other/mcp`) or a Host with userinfo (`other@127.0.0.1`) could pass the
    // Host check under another name.
    if request.uri().authority().is_some()
        || request
            .headers()
            .get_all(hyper::header::HOST)
            .iter()
            .any(|h| h.as_bytes().contains(&b'@'))
    {
        return Some(plain(
            hyper::StatusCode::BAD_REQUEST,
            "bad request: an absolute target or a Host with userinfo",
        ));
    }
    // One of each: the checks (rmcp's Host and Origin, the token here) read the first, and
    // another part could read a second one.
    for name in [
        hyper::header::HOST,
        hyper::header::ORIGIN,
        hyper::header::AUTHORIZATION,
    ] {
        if request.headers().get_all(&name).iter().count() > 1 {
            return Some(plain_owned(
                hyper::StatusCode::BAD_REQUEST,
                format!("bad request: more than one {name} header"),
            ));
        }
    }
    let token = token?;
    let given = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given.is_some_and(|given| same_secret(given.as_bytes(), token.as_bytes())) {
        return None;
    }
    let mut response = plain(
        hyper::StatusCode::UNAUTHORIZED,
        "unauthorized: send `Authorization: Bearer <token>`",
    );
    response.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        hyper::header::HeaderValue::from_static("Bearer"),
    );
    Some(response)
}

fn plain(status: hyper::StatusCode, text: &'static str) -> Response {
    plain_owned(status, text.to_string())
}

pub(super) fn plain_owned(status: hyper::StatusCode, text: String) -> Response {
    let body = http_body_util::Full::new(bytes::Bytes::from(text)).boxed();
    let mut response = hyper::Response::new(body);
    *response.status_mut() = status;
    response
}

/// Compares two secrets in time that depends on their lengths only.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
    }
}
