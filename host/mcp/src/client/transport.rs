//! How the client reaches a server: a stdio server's pipes, read a line (one message) at a
//! time within [`MAX_MESSAGE_BYTES`], its stderr logged within caps, and the HTTP client of
//! a streamable HTTP server.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context as TaskContext, Poll};

use anyhow::{Context, Result, anyhow};
use rmcp::RoleClient;
use rmcp::ServiceExt;
use rmcp::service::RunningService;
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::io::{AsyncRead, ReadBuf};

use super::{Limited, MAX_MESSAGE_BYTES};

/// reqwest is built without a TLS provider of its own: rustls's ring provider, the one the
/// rest of the host links, serves HTTPS servers.
pub(super) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A stdio server's output, refused (an error, and `oversized` set) once a line grows past
/// `max` bytes or [`MAX_MESSAGE_VALUES`] JSON values: nothing past the cap is kept, and no
/// line that would cost far more parsed than its bytes is parsed.
struct LineCap<R> {
    inner: R,
    max: usize,
    line: usize,
    values: trellis_sandbox::json_values::ValueCounter,
    oversized: Arc<AtomicBool>,
}

/// The JSON values one message of an external server may hold.
pub const MAX_MESSAGE_VALUES: usize = trellis_sandbox::json_values::MAX_FILE_VALUES;

/// How deep one message of an external server may nest arrays and objects: the most the
/// JSON parser of the MCP client reads (it refuses the 128th level).
pub const MAX_MESSAGE_DEPTH: usize = 127;

/// What a message refused by [`LineCap`] was over, as the errors name it.
pub(super) fn message_limits() -> String {
    format!(
        "a message longer than the limit of {MAX_MESSAGE_BYTES} bytes, of more than \
         {MAX_MESSAGE_VALUES} JSON values or nested more than {MAX_MESSAGE_DEPTH} levels deep"
    )
}

impl<R: AsyncRead + Unpin> AsyncRead for LineCap<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let too_long = || std::io::Error::new(std::io::ErrorKind::InvalidData, message_limits());
        if this.oversized.load(Ordering::Relaxed) {
            return Poll::Ready(Err(too_long()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        let mut parts = buf.filled()[before..].split(|&b| b == b'\n').peekable();
        while let Some(part) = parts.next() {
            this.line += part.len();
            this.values.feed(part);
            if this.line > this.max
                || this.values.values() > MAX_MESSAGE_VALUES
                || this.values.deepest() > MAX_MESSAGE_DEPTH
            {
                this.oversized.store(true, Ordering::Relaxed);
                buf.set_filled(before);
                return Poll::Ready(Err(too_long()));
            }
            if parts.peek().is_some() {
                this.line = 0;
                this.values = Default::default();
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// What of a server's stderr is logged: each line up to `STDERR_LINE_BYTES` (the rest of it
/// counted), and `STDERR_TOTAL_BYTES` in all; past that the output is read and dropped, so
/// the server never blocks on a full pipe and never makes the host hold its output.
const STDERR_LINE_BYTES: usize = 4096;
/// What each logged line counts against `STDERR_TOTAL_BYTES` beyond its bytes, so a flood of
/// empty lines is not logged line by line without end.
const STDERR_LINE_COST: usize = 64;
const STDERR_TOTAL_BYTES: usize = 1 << 20;

/// Logs the stderr of server `key` (at debug level) within the caps above.
pub(super) async fn log_stderr(key: String, mut stderr: impl tokio::io::AsyncRead + Unpin) {
    use tokio::io::AsyncReadExt;
    let mut chunk = vec![0u8; 8192];
    let mut line: Vec<u8> = Vec::new();
    let (mut cut, mut logged) = (0usize, 0usize);
    let flush = |line: &mut Vec<u8>, cut: &mut usize, logged: &mut usize| {
        if *logged < STDERR_TOTAL_BYTES {
            // A line costs a log record whatever its length: empty lines count too.
            *logged += line.len() + STDERR_LINE_COST;
            let text = String::from_utf8_lossy(line);
            if *cut > 0 {
                tracing::debug!(server = %key, "{text} [cut: {cut} more bytes]");
            } else {
                tracing::debug!(server = %key, "{text}");
            }
            if *logged >= STDERR_TOTAL_BYTES {
                tracing::debug!(server = %key, "stderr: the rest is not logged");
            }
        }
        line.clear();
        *cut = 0;
    };
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for part in chunk[..n].split_inclusive(|b| *b == b'\n') {
            let (text, ends) = match part.strip_suffix(b"\n") {
                Some(text) => (text, true),
                None => (part, false),
            };
            let room = STDERR_LINE_BYTES.saturating_sub(line.len());
            line.extend_from_slice(&text[..text.len().min(room)]);
            cut += text.len().saturating_sub(room);
            if ends {
                flush(&mut line, &mut cut, &mut logged);
            }
        }
    }
    if !line.is_empty() || cut > 0 {
        flush(&mut line, &mut cut, &mut logged);
    }
}

/// The client side of a stdio server's pipes: what it sends read a line at a time, each at
/// most [`MAX_MESSAGE_BYTES`] (`oversized` set past that), and the session initialized.
pub(super) async fn over_lines<R, W>(
    reader: R,
    writer: W,
    oversized: &Arc<AtomicBool>,
    limited: Limited,
) -> Result<RunningService<RoleClient, Limited>>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let reader = LineCap {
        inner: reader,
        max: MAX_MESSAGE_BYTES,
        line: 0,
        values: Default::default(),
        oversized: oversized.clone(),
    };
    // The cap is LineCap's, which refuses a long line instead of skipping it.
    let transport =
        AsyncRwTransport::<RoleClient, _, _>::new(reader, writer).with_max_line_length(usize::MAX);
    limited
        .serve(transport)
        .await
        .map_err(|e| anyhow!("initializing: {e}"))
}

/// The HTTP client of a streamable HTTP server at `url`. A proxy from the environment
/// (`HTTP_PROXY`, ...) is never used for a loopback host (a proxy cannot reach this
/// machine's loopback, and would see what the operator meant to keep local) nor for a
/// plain `http://` URL (the proxy would read the headers, a bearer token among them, in
/// clear); an `https://` URL may go through one (a tunnel it cannot read). Redirects are
/// followed only to the same origin, 307 and 308 alone (which keep the body), at most 10.
pub(super) fn http_client(url: &str) -> Result<reqwest::Client> {
    let parsed = reqwest::Url::parse(url).with_context(|| format!("the url {url:?}"))?;
    let origin = parsed.origin();
    let mut builder = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .redirect(reqwest::redirect::Policy::custom(move |attempt| {
            let keeps_body = matches!(attempt.status().as_u16(), 307 | 308);
            if keeps_body && attempt.url().origin() == origin && attempt.previous().len() < 10 {
                attempt.follow()
            } else {
                attempt.stop()
            }
        }));
    if bypasses_proxy(&parsed) {
        builder = builder.no_proxy();
    }
    builder
        .build()
        .with_context(|| format!("making the HTTP client of {url}"))
}

/// Whether the client of `url` leaves out a proxy from the environment: a loopback host in
/// any spelling (`localhost.`, `127.1`, `[::ffff:127.0.0.1]`), or plain `http://`.
fn bypasses_proxy(url: &reqwest::Url) -> bool {
    url.scheme() == "http"
        || trellis_sandbox::llm::is_loopback_host(url.host_str().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_loopback_and_plain_http_bypass_the_environment_proxy() {
        for url in [
            "https://localhost/mcp",
            "https://localhost./mcp",
            "https://LOCALHOST:8443/mcp",
            "https://127.0.0.1/mcp",
            "https://127.1:8443/mcp",
            "https://0x7f.1/mcp",
            "https://[::1]:8443/mcp",
            "https://[::ffff:127.0.0.1]:8443/mcp",
            "http://mcp.example.com/mcp",
        ] {
            let parsed = reqwest::Url::parse(url).unwrap();
            assert!(bypasses_proxy(&parsed), "{url}");
        }
        for url in [
            "https://mcp.example.com/mcp",
            "https://10.0.0.1/mcp",
            "https://[::ffff:10.0.0.1]/mcp",
            "https://localhost.example.com/mcp",
        ] {
            let parsed = reqwest::Url::parse(url).unwrap();
            assert!(!bypasses_proxy(&parsed), "{url}");
        }
    }
}
