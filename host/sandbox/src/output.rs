//! The one stdout/stderr sink of a sandboxed call (tool, validator, provider, script): keeps
//! the head and the tail of what the guest writes.
//!
//! A guest that prints without end must neither grow host memory nor see a write error it
//! might turn into a panic; and when it fails after printing a lot, the panic message or
//! traceback it ends with is at the very end.
//! So the sink keeps the first bytes up to its capacity, then the last few kilobytes, and
//! counts what falls in between.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

/// Bytes of the tail kept, at most (a quarter of the capacity when that is smaller).
const TAIL_BYTES: usize = 16 << 10;

/// A capped stdout or stderr of one call; clones write to the same buffer.
#[derive(Debug, Clone)]
pub(crate) struct OutputSink {
    inner: Arc<Mutex<Buffer>>,
}

#[derive(Debug, Default)]
struct Buffer {
    head: Vec<u8>,
    head_capacity: usize,
    tail: VecDeque<u8>,
    tail_capacity: usize,
    dropped: u64,
    total: u64,
    /// A pipe's end: once the head is full, writes fail as on a closed pipe.
    closes_when_full: bool,
}

impl OutputSink {
    /// A sink keeping at most `capacity` bytes in all.
    pub(crate) fn new(capacity: usize) -> Self {
        let tail_capacity = TAIL_BYTES.min(capacity / 4);
        OutputSink {
            inner: Arc::new(Mutex::new(Buffer {
                head_capacity: capacity - tail_capacity,
                tail_capacity,
                ..Buffer::default()
            })),
        }
    }

    /// A sink keeping the first `capacity` bytes: a command's output, which the next
    /// command of a pipe reads as it was written. Once it is full, a write fails as one to
    /// a closed pipe does, so a command writing without end (`yes`) stops there rather
    /// than at its deadline.
    pub(crate) fn head_only(capacity: usize) -> Self {
        OutputSink {
            inner: Arc::new(Mutex::new(Buffer {
                head_capacity: capacity,
                tail_capacity: 0,
                closes_when_full: true,
                ..Buffer::default()
            })),
        }
    }

    /// The bytes kept (the head, then the tail), and how many were dropped.
    pub(crate) fn take_bytes(&self) -> (Vec<u8>, u64) {
        let mut buffer = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut bytes = std::mem::take(&mut buffer.head);
        bytes.extend(buffer.tail.drain(..));
        (bytes, buffer.dropped)
    }

    /// What was kept, as text, with a note where bytes were dropped.
    pub(crate) fn text(&self) -> String {
        let buffer = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut text = String::from_utf8_lossy(&buffer.head).into_owned();
        if buffer.dropped > 0 {
            text.push_str(&format!(
                "\n[... {} bytes dropped: output is capped at {} bytes ...]\n",
                buffer.dropped,
                buffer.head_capacity + buffer.tail_capacity
            ));
        }
        let (a, b) = buffer.tail.as_slices();
        text.push_str(&String::from_utf8_lossy(&[a, b].concat()));
        text
    }

    /// How many bytes were written in all, kept or not.
    pub(crate) fn total(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).total
    }

    fn push(&self, mut bytes: &[u8]) {
        let mut buffer = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        buffer.total += bytes.len() as u64;
        let room = buffer.head_capacity - buffer.head.len();
        let to_head = room.min(bytes.len());
        buffer.head.extend_from_slice(&bytes[..to_head]);
        bytes = &bytes[to_head..];
        if bytes.len() > buffer.tail_capacity {
            let skip = bytes.len() - buffer.tail_capacity;
            buffer.dropped += (skip + buffer.tail.len()) as u64;
            buffer.tail.clear();
            bytes = &bytes[skip..];
        }
        let overflow = (buffer.tail.len() + bytes.len()).saturating_sub(buffer.tail_capacity);
        buffer.tail.drain(..overflow);
        buffer.dropped += overflow as u64;
        buffer.tail.extend(bytes);
    }
}

impl IsTerminal for OutputSink {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for OutputSink {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl tokio::io::AsyncWrite for OutputSink {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        {
            let mut buffer = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            if buffer.closes_when_full {
                let room = buffer.head_capacity - buffer.head.len();
                if room == 0 && !buf.is_empty() {
                    buffer.dropped += buf.len() as u64;
                    buffer.total += buf.len() as u64;
                    return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
                }
                let kept = room.min(buf.len());
                buffer.head.extend_from_slice(&buf[..kept]);
                buffer.total += kept as u64;
                return Poll::Ready(Ok(kept));
            }
        }
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipes_end_keeps_its_head_and_then_refuses_writes() {
        use tokio::io::AsyncWriteExt;
        let out = OutputSink::head_only(8);
        let mut writer = out.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            assert_eq!(writer.write(b"abcdef").await.unwrap(), 6);
            assert_eq!(writer.write(b"ghijkl").await.unwrap(), 2);
            let err = writer.write(b"mn").await.unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
        });
        assert_eq!(out.take_bytes(), (b"abcdefgh".to_vec(), 2));
    }

    #[test]
    fn keeps_everything_under_the_cap() {
        let out = OutputSink::new(64);
        out.push(b"hello ");
        out.push(b"world");
        assert_eq!(out.text(), "hello world");
        assert_eq!(out.total(), 11);
    }

    #[test]
    fn keeps_the_head_and_the_tail_of_a_flood() {
        // capacity 40: head 30, tail 10.
        let out = OutputSink::new(40);
        out.push(&[b'a'; 25]);
        out.push(&[b'b'; 100]);
        out.push(b"0123456789");
        let text = out.text();
        assert!(text.starts_with(&"a".repeat(25)), "{text}");
        assert!(
            text.contains(&format!("{}\n[... 95 bytes dropped", "b".repeat(5))),
            "{text}"
        );
        assert!(text.ends_with("...]\n0123456789"), "{text}");
        assert_eq!(out.total(), 135);

        // Small writes into a full tail push the oldest bytes out one by one.
        let out = OutputSink::new(8);
        for b in b"abcdefghij" {
            out.push(&[*b]);
        }
        assert!(out.text().starts_with("abcdef"), "{}", out.text());
        assert!(out.text().ends_with("ij"), "{}", out.text());
        assert!(out.text().contains("2 bytes dropped"), "{}", out.text());
    }
}
