//! The messages of a stdio client, one line each, checked before rmcp parses them: a line of
//! many small JSON values costs far more memory parsed than its bytes (16 MiB of digits is
//! eight million values), so a line over [`MAX_BODY_VALUES`] values or [`MAX_LINE_BYTES`]
//! bytes is never handed on whole.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream};

use super::MAX_BODY_VALUES;
use trellis_sandbox::json_values::ValueCounter;

/// The bytes of one stdio message, its newline included (rmcp's own line cap).
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// What a refused line becomes: well-formed JSON that is no JSON-RPC message, which rmcp
/// answers with an `Invalid Request` error, so the client hears that its message went nowhere.
const REFUSED_LINE: &[u8] = b"{\"refused\":\"message over the size cap of trellis mcp serve\"}\n";

/// Requests of the client whose answers it has not taken yet, at most: past it, its next
/// messages are not read until it reads (a client that never reads cannot make the server
/// queue answers without end).
pub const MAX_UNREAD_ANSWERS: u64 = 64;

/// The client's requests handed on and the lines written back to it, for pacing.
#[derive(Debug, Default)]
pub(super) struct Unread {
    requests: AtomicU64,
    answers: AtomicU64,
    changed: tokio::sync::Notify,
}

impl Unread {
    /// Waits while [`MAX_UNREAD_ANSWERS`] requests are answered but the answers not written.
    async fn room(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let waiting = self
                .requests
                .load(Ordering::SeqCst)
                .saturating_sub(self.answers.load(Ordering::SeqCst));
            if waiting < MAX_UNREAD_ANSWERS {
                return;
            }
            changed.await;
        }
    }
}

/// `writer`, counting the lines written through it into `unread`.
pub(super) struct CountingWriter<W> {
    inner: W,
    unread: Arc<Unread>,
}

impl<W> CountingWriter<W> {
    pub(super) fn new(inner: W, unread: Arc<Unread>) -> Self {
        CountingWriter { inner, unread }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for CountingWriter<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &written {
            let lines = buf[..*n].iter().filter(|&&b| b == b'\n').count() as u64;
            if lines > 0 {
                self.unread.answers.fetch_add(lines, Ordering::SeqCst);
                self.unread.changed.notify_waiters();
            }
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The client's messages as read from `reader`, a refused line replaced by one rmcp answers
/// with an error. The lines are copied by a task of their own, one at a time.
#[cfg(test)]
pub(super) fn bounded_lines<R>(reader: R) -> DuplexStream
where
    R: AsyncRead + Send + Unpin + 'static,
{
    paced_lines(reader, Arc::default())
}

/// [`bounded_lines`], and a request (a line with an `"id"`) is handed on only while fewer
/// than [`MAX_UNREAD_ANSWERS`] answers wait to be written ([`CountingWriter`] counts them).
pub(super) fn paced_lines<R>(reader: R, unread: Arc<Unread>) -> DuplexStream
where
    R: AsyncRead + Send + Unpin + 'static,
{
    let (mut to_rmcp, from_client) = tokio::io::duplex(64 << 10);
    tokio::spawn(async move {
        let mut reader = BufReader::with_capacity(64 << 10, reader);
        let mut line = Vec::new();
        loop {
            match read_line(&mut reader, &mut line).await {
                Ok(Line::Whole) => {
                    if line.windows(4).any(|w| w == b"\"id\"") {
                        unread.room().await;
                        unread.requests.fetch_add(1, Ordering::SeqCst);
                    }
                    if to_rmcp.write_all(&line).await.is_err() {
                        return;
                    }
                }
                Ok(Line::Refused(why)) => {
                    tracing::warn!("refused a message from the MCP client: {why}");
                    eprintln!("trellis mcp serve: refused a message from the client: {why}");
                    if to_rmcp.write_all(REFUSED_LINE).await.is_err() {
                        return;
                    }
                }
                Ok(Line::End) | Err(_) => return,
            }
        }
    });
    from_client
}

/// One line read by [`read_line`].
enum Line {
    /// A line within the caps is in the buffer (the last one may lack its newline).
    Whole,
    /// The line was over a cap and has been read to its end and dropped: why.
    Refused(String),
    /// The client closed its side.
    End,
}

/// How deep a message may nest: the most rmcp's JSON parser reads (it refuses the 128th
/// level, and then drops the line without an answer).
pub const MAX_LINE_DEPTH: usize = 127;

/// Why rmcp could not parse `line` (which it would drop without an answer): not JSON, or a
/// number past what a JSON number may be here. The line is parsed as rmcp parses it; its
/// size and values are already bounded.
fn unparsable(line: &[u8]) -> Option<String> {
    let text = line.trim_ascii();
    if text.is_empty() {
        return None;
    }
    serde_json::from_slice::<serde_json::Value>(text)
        .err()
        .map(|e| format!("the message is not JSON that can be read: {e}"))
}

/// Reads the next line into `line`, never holding more than [`MAX_LINE_BYTES`] of it and
/// counting its values as it comes.
async fn read_line<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    line: &mut Vec<u8>,
) -> std::io::Result<Line> {
    line.clear();
    let mut counter = ValueCounter::default();
    let (mut bytes, mut refused) = (0usize, None);
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(match refused {
                Some(why) => Line::Refused(why),
                None if line.is_empty() => Line::End,
                None => Line::Whole,
            });
        }
        let newline = available.iter().position(|&b| b == b'\n');
        let take = newline.map_or(available.len(), |at| at + 1);
        let piece = &available[..take];
        bytes = bytes.saturating_add(take);
        if refused.is_none() {
            counter.feed(piece);
            if bytes > MAX_LINE_BYTES {
                refused = Some(format!(
                    "a message may have {MAX_LINE_BYTES} bytes, this one has more"
                ));
            } else if counter.values() > MAX_BODY_VALUES {
                refused = Some(format!(
                    "a message may hold {MAX_BODY_VALUES} JSON values, this one holds more"
                ));
            } else if counter.deepest() > MAX_LINE_DEPTH {
                refused = Some(format!(
                    "a message may nest arrays and objects {MAX_LINE_DEPTH} levels deep, this \
                     one nests deeper"
                ));
            } else {
                line.extend_from_slice(piece);
            }
            if refused.is_some() {
                line.clear();
                line.shrink_to(64 << 10);
            }
        }
        reader.consume(take);
        if newline.is_some() {
            return Ok(match refused {
                Some(why) => Line::Refused(why),
                None => unparsable(line).map_or(Line::Whole, Line::Refused),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn through(input: Vec<u8>) -> Vec<u8> {
        let mut out = Vec::new();
        bounded_lines(std::io::Cursor::new(input))
            .read_to_end(&mut out)
            .await
            .unwrap();
        out
    }

    #[tokio::test]
    async fn lines_within_the_caps_pass_unchanged_and_one_over_is_replaced() {
        let small = b"{\"a\":[1,2]}\n".to_vec();
        let many = format!("[{}1]\n", "1,".repeat(MAX_BODY_VALUES)).into_bytes();
        let mut input = small.clone();
        input.extend_from_slice(&many);
        input.extend_from_slice(b"{\"b\":1}");
        let mut expected = small;
        expected.extend_from_slice(REFUSED_LINE);
        expected.extend_from_slice(b"{\"b\":1}");
        assert_eq!(through(input).await, expected);
    }

    #[tokio::test]
    async fn a_line_over_the_byte_cap_is_replaced() {
        let mut input = format!("\"{}\"\n", "x".repeat(MAX_LINE_BYTES)).into_bytes();
        input.extend_from_slice(b"2\n");
        let mut expected = REFUSED_LINE.to_vec();
        expected.extend_from_slice(b"2\n");
        assert_eq!(through(input).await, expected);
    }
}
