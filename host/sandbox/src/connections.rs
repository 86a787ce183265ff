//! The connections a server keeps open, and which of them go when they are all taken.
//!
//! A server holds at most so many connections. Counted alone, that cap is a lock anyone can
//! turn: a client without the token opens every slot, sends nothing (or trickles a header a
//! second), and opens each again as the server closes it; nobody else gets in. [`Slots`]
//! tells the connections apart: one that has sent a request its server accepts as its
//! client's (the token, when there is one) is *proven*; the others are not. When every slot
//! is taken, a new connection takes the place of the oldest connection not proven, which is
//! closed; only when every open connection is proven is a new one refused.
//!
//! A client that connects and sends its request at once is thus never shut out by clients
//! that do not: to close it before its request is read, they would have to open as many
//! connections as the cap in that moment.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The open connections of a server, at most `max`.
#[derive(Debug)]
pub struct Slots {
    max: usize,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    next: u64,
    /// Each open connection by the order it came in: whether it is proven, and how to
    /// close it.
    by_arrival: BTreeMap<u64, (bool, Option<oneshot::Sender<()>>)>,
}

/// One connection's place among the [`Slots`], given back when dropped.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    id: u64,
}

/// Resolves when the connection's place went to a newer one: the connection is to close.
#[derive(Debug)]
pub struct Evicted(Option<oneshot::Receiver<()>>);

impl std::future::Future for Evicted {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let Some(told) = self.0.as_mut() else {
            return std::task::Poll::Pending;
        };
        match std::pin::Pin::new(told).poll(cx) {
            std::task::Poll::Ready(Ok(())) => {
                self.0 = None;
                std::task::Poll::Ready(())
            }
            // The slot was given back: the connection ends on its own.
            std::task::Poll::Ready(Err(_)) => {
                self.0 = None;
                std::task::Poll::Pending
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl Slots {
    /// Room for `max` connections (at least one).
    pub fn new(max: usize) -> Arc<Slots> {
        Arc::new(Slots {
            max: max.max(1),
            open: Mutex::new(Open::default()),
        })
    }

    /// The most connections open at once.
    pub fn max(&self) -> usize {
        self.max
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a new connection, and what says when it must close: when every place is
    /// taken, the oldest connection not proven is told to close and its place is this one's.
    /// `None` when every open connection is proven.
    pub fn admit(self: &Arc<Self>) -> Option<(Slot, Evicted)> {
        let mut open = self.lock();
        if open.by_arrival.len() >= self.max {
            let oldest = open
                .by_arrival
                .iter()
                .find(|(_, (proven, _))| !proven)
                .map(|(id, _)| *id)?;
            if let Some((_, Some(close))) = open.by_arrival.remove(&oldest) {
                let _ = close.send(());
            }
        }
        let id = open.next;
        open.next += 1;
        let (close, evicted) = oneshot::channel();
        open.by_arrival.insert(id, (false, Some(close)));
        Some((
            Slot {
                slots: self.clone(),
                id,
            },
            Evicted(Some(evicted)),
        ))
    }

    /// How many connections are open.
    pub fn open(&self) -> usize {
        self.lock().by_arrival.len()
    }
}

impl Slot {
    /// What marks the connection proven, for its requests to hold.
    pub fn prover(&self) -> Prover {
        Prover {
            slots: self.slots.clone(),
            id: self.id,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.lock().by_arrival.remove(&self.id);
    }
}

/// Marks one connection proven: it sent a request its server accepts as its client's.
#[derive(Debug, Clone)]
pub struct Prover {
    slots: Arc<Slots>,
    id: u64,
}

impl Prover {
    /// The connection is proven: it keeps its place when the slots are all taken.
    pub fn prove(&self) {
        if let Some((proven, _)) = self.slots.lock().by_arrival.get_mut(&self.id) {
            *proven = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;

    #[test]
    fn a_new_connection_takes_the_place_of_the_oldest_not_proven() {
        let slots = Slots::new(3);
        let (first, mut first_closed) = slots.admit().unwrap();
        let (second, mut second_closed) = slots.admit().unwrap();
        let (third, mut third_closed) = slots.admit().unwrap();
        first.prover().prove();
        // Full: the oldest not proven (the second) goes, the proven first stays.
        let (fourth, _) = slots.admit().unwrap();
        assert_eq!(slots.open(), 3);
        assert!(
            poll(&mut second_closed).is_ready(),
            "the second was not told to close"
        );
        assert!(poll(&mut first_closed).is_pending());
        assert!(poll(&mut third_closed).is_pending());
        third.prover().prove();
        fourth.prover().prove();
        // Every connection proven: a new one is refused.
        assert!(slots.admit().is_none());
        drop(second);
        assert_eq!(slots.open(), 3);
        drop(first);
        assert_eq!(slots.open(), 2);
        // A place given back does not read as being told to close.
        assert!(poll(&mut first_closed).is_pending());
        assert!(slots.admit().is_some());
    }

    fn poll(evicted: &mut Evicted) -> std::task::Poll<()> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        std::pin::Pin::new(evicted).poll(&mut cx)
    }
}
