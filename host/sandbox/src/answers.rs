//! What the answers a server is sending may hold in memory together. An answer waits in
//! memory until its client reads it, and a client may never read: without a bound, a few
//! hundred connections that ask for large answers and stall would hold gigabytes. An
//! [`AnswerBytes`] budget is shared by every connection of a server ([`AnswerBytes::hold`]
//! wraps each answer's body): an answer whose size is known takes its share before it is
//! sent, or is refused (the server says it is busy); a streamed one takes each piece's
//! share as the piece comes, or ends. An answer of known size is given to the connection in
//! slices of [`SLICE`], the connection asking for the next only once it has room, so it
//! holds its share until its client has taken all but its last slice; a streamed piece is
//! given whole and holds its share until the connection asks for the next.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The bytes a permit stands for.
const UNIT: u64 = 1024;
/// The most one frame of a body gives the connection at once.
pub const SLICE: usize = 64 << 10;
/// The default budget of a server: 256 MiB of answers being sent.
pub const DEFAULT_ANSWER_BYTES: u64 = 256 << 20;

/// A budget of bytes of answers being sent, shared by a server's connections.
#[derive(Debug)]
pub struct AnswerBytes {
    permits: Arc<Semaphore>,
    total: u64,
}

/// An answer refused because the answers being sent hold the whole budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busy {
    /// The answer's size.
    pub bytes: u64,
    /// The budget.
    pub total: u64,
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the server is busy: the answers it is sending hold {} MiB, the most they may \
             together, and this one is {} bytes; try again once its clients have read them",
            self.total >> 20,
            self.bytes
        )
    }
}

impl std::error::Error for Busy {}

impl AnswerBytes {
    /// A budget of `bytes`.
    pub fn new(bytes: u64) -> Arc<AnswerBytes> {
        let permits = usize::try_from(bytes / UNIT)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Arc::new(AnswerBytes {
            permits: Arc::new(Semaphore::new(permits)),
            total: bytes,
        })
    }

    /// Takes the share of `bytes` bytes, if the budget has it.
    fn take(&self, bytes: u64) -> Result<Option<OwnedSemaphorePermit>, Busy> {
        let units = u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX);
        if units == 0 {
            return Ok(None);
        }
        self.permits
            .clone()
            .try_acquire_many_owned(units)
            .map(Some)
            .map_err(|_| Busy {
                bytes,
                total: self.total,
            })
    }

    /// `body` within the budget: a body of known size takes its share now (`Err` when the
    /// budget does not have it), another as its frames come.
    pub fn hold<B>(self: &Arc<Self>, body: B) -> Result<Held<B>, Busy>
    where
        B: Body<Data = Bytes> + Unpin,
    {
        let (held, prepaid) = match body.size_hint().exact() {
            Some(size) => (self.take(size)?, true),
            None => (None, false),
        };
        Ok(Held {
            inner: body,
            budget: self.clone(),
            held,
            prepaid,
            rest: Bytes::new(),
        })
    }
}

/// A body within an [`AnswerBytes`] budget (see the module).
#[derive(Debug)]
pub struct Held<B> {
    inner: B,
    budget: Arc<AnswerBytes>,
    /// The share held: the whole body's when `prepaid`, else the current frame's.
    held: Option<OwnedSemaphorePermit>,
    prepaid: bool,
    /// What is left of the current frame to give.
    rest: Bytes,
}

impl<B> Body for Held<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if !this.rest.is_empty() {
            let slice = this.rest.split_to(this.rest.len().min(SLICE));
            return Poll::Ready(Some(Ok(Frame::data(slice))));
        }
        if !this.prepaid {
            // The frame before is given whole: its share goes back.
            this.held = None;
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(mut data) => {
                    if !this.prepaid {
                        match this.budget.take(data.len() as u64) {
                            Ok(held) => this.held = held,
                            Err(busy) => {
                                tracing::warn!("an answer stream ended: {busy}");
                                return Poll::Ready(Some(Err(busy.into())));
                            }
                        }
                    }
                    if !this.prepaid {
                        // A frame of a stream goes whole (an event is not cut): the
                        // connection asks for the next once it has room, and the share
                        // goes back then.
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    let slice = data.split_to(data.len().min(SLICE));
                    this.rest = data;
                    Poll::Ready(Some(Ok(Frame::data(slice))))
                }
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        hint.set_lower(hint.lower().saturating_add(rest));
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    #[tokio::test]
    async fn an_answer_holds_its_share_until_it_is_given_whole() {
        let budget = AnswerBytes::new(300 << 10);
        let mut first = budget
            .hold(Full::new(Bytes::from(vec![1u8; 200 << 10])))
            .unwrap();
        let refused = budget
            .hold(Full::new(Bytes::from(vec![2u8; 200 << 10])))
            .unwrap_err();
        assert_eq!(refused.bytes, 200 << 10);
        assert!(refused.to_string().contains("the server is busy"));
        // Given in slices: a connection takes one at a time.
        let mut given = Vec::new();
        while let Some(frame) = first.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            assert!(data.len() <= SLICE);
            given.extend_from_slice(&data);
        }
        assert_eq!(given, vec![1u8; 200 << 10]);
        drop(first);
        assert!(
            budget
                .hold(Full::new(Bytes::from(vec![3u8; 200 << 10])))
                .is_ok()
        );
    }

    #[tokio::test]
    async fn a_streamed_answer_takes_each_frames_share_as_it_comes() {
        let budget = AnswerBytes::new(100 << 10);
        let frames = futures::stream::iter([
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(vec![0u8; 80 << 10]))),
            Ok(Frame::data(Bytes::from(vec![0u8; 80 << 10]))),
        ]);
        let stream = http_body_util::StreamBody::new(frames);
        let mut held = budget.hold(stream).unwrap();
        let mut total = 0;
        while let Some(frame) = held.frame().await {
            total += frame.unwrap().into_data().unwrap().len();
        }
        assert_eq!(
            total,
            160 << 10,
            "each frame's share went back before the next"
        );
        let big = futures::stream::iter([Ok::<_, std::convert::Infallible>(Frame::data(
            Bytes::from(vec![0u8; 200 << 10]),
        ))]);
        let mut held = budget.hold(http_body_util::StreamBody::new(big)).unwrap();
        assert!(
            held.frame().await.unwrap().is_err(),
            "past the budget, it ends"
        );
    }
}
