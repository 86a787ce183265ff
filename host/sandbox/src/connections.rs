//! The connections a server keeps open, and which of them go when they are all taken.
//!
//! A server holds at most so many connections. Counted alone, that cap is a lock anyone can
//! turn: a client without the token opens every slot, sends nothing (or trickles a header a
//! second), and opens each again as the server closes it; nobody else gets in. [`Slots`]
//! tells the connections apart: one that has sent a request its server accepts as its
//! client's (the token, when there is one) is *proven*; the others are not. When every slot
//! is taken, a new connection takes the place of the oldest connection not proven, which is
//! closed; with every connection proven, the one idle longest (no request in progress, none
//! of its answer still being sent). On a server without a token any request proves its
//! connection, so there a proven connection idle longest goes first while every connection
//! not proven came in less than [`GRACE`] ago (it may be a client about to send its
//! request): clients that keep connections open and send a request now and then cannot
//! hold them all either. Only when every open connection is busy is a new one refused.
//!
//! A client that connects and sends its request at once is thus never shut out by clients
//! that do not: to close it before its request is read, they would have to open as many
//! connections as the cap in that moment. Nor by clients that send a request now and then
//! on connections they keep open: those are idle between their requests.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// How long a connection not proven yet is let be while proven ones are idle: a client sends
/// its request as it connects.
pub const GRACE: Duration = Duration::from_secs(1);

/// The open connections of a server, at most `max`.
#[derive(Debug)]
pub struct Slots {
    max: usize,
    /// The server has a token: only a request with it proves a connection.
    token: bool,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    next: u64,
    /// Each open connection by the order it came in.
    by_arrival: BTreeMap<u64, Connection>,
    /// Counts what happens, for [`Connection::last`].
    clock: u64,
}

#[derive(Debug)]
struct Connection {
    arrived: Instant,
    proven: bool,
    /// Its requests in progress (answers still being sent included).
    busy: u32,
    /// When it was last busy (the clock of [`Open`]).
    last: u64,
    close: Option<oneshot::Sender<()>>,
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
    /// Room for `max` connections (at least one), on a server with a `token` or without.
    pub fn new(max: usize, token: bool) -> Arc<Slots> {
        Arc::new(Slots {
            max: max.max(1),
            token,
            open: Mutex::new(Open::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a new connection, and what says when it must close. When every place is
    /// taken, the oldest connection not proven is told to close and its place is this one's;
    /// with every connection proven, the one idle longest. `None` when every open
    /// connection is proven and busy.
    pub fn admit(self: &Arc<Self>) -> Option<(Slot, Evicted)> {
        let mut open = self.lock();
        if open.by_arrival.len() >= self.max {
            let oldest_unproven = open
                .by_arrival
                .iter()
                .find(|(_, c)| !c.proven)
                .map(|(id, c)| (*id, c.arrived.elapsed() >= GRACE));
            let idle_proven = || {
                open.by_arrival
                    .iter()
                    .filter(|(_, c)| c.proven && c.busy == 0)
                    .min_by_key(|(_, c)| c.last)
                    .map(|(id, _)| *id)
            };
            let gone = match oldest_unproven {
                Some((id, old)) if old || self.token => Some(id),
                Some((id, _)) => idle_proven().or(Some(id)),
                None => idle_proven(),
            }?;
            if let Some(Connection {
                close: Some(close), ..
            }) = open.by_arrival.remove(&gone)
            {
                let _ = close.send(());
            }
        }
        let id = open.next;
        open.next += 1;
        open.clock += 1;
        let last = open.clock;
        let (close, evicted) = oneshot::channel();
        open.by_arrival.insert(
            id,
            Connection {
                arrived: Instant::now(),
                proven: false,
                busy: 0,
                last,
                close: Some(close),
            },
        );
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
    /// What marks the connection proven and busy, for its requests to hold.
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

/// Marks one connection proven (it sent a request its server accepts as its client's) or
/// busy.
#[derive(Debug, Clone)]
pub struct Prover {
    slots: Arc<Slots>,
    id: u64,
}

impl Prover {
    /// The connection is proven: it keeps its place when the slots are all taken by others.
    pub fn prove(&self) {
        if let Some(connection) = self.slots.lock().by_arrival.get_mut(&self.id) {
            connection.proven = true;
        }
    }

    /// Marks a request of the connection in progress until the guard is dropped (hold it
    /// until its answer is sent): a busy connection keeps its place.
    pub fn busy(&self) -> Busy {
        if let Some(connection) = self.slots.lock().by_arrival.get_mut(&self.id) {
            connection.busy += 1;
        }
        Busy(self.clone())
    }
}

/// A request of a connection in progress ([`Prover::busy`]).
#[derive(Debug)]
pub struct Busy(Prover);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut open = self.0.slots.lock();
        open.clock += 1;
        let now = open.clock;
        if let Some(connection) = open.by_arrival.get_mut(&self.0.id) {
            connection.busy = connection.busy.saturating_sub(1);
            connection.last = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;

    fn poll(evicted: &mut Evicted) -> std::task::Poll<()> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        std::pin::Pin::new(evicted).poll(&mut cx)
    }

    #[test]
    fn a_new_connection_takes_the_place_of_an_unproven_or_idle_one() {
        let slots = Slots::new(3, false);
        let (first, mut first_closed) = slots.admit().unwrap();
        let (second, mut second_closed) = slots.admit().unwrap();
        let (third, mut third_closed) = slots.admit().unwrap();
        first.prover().prove();
        let first_busy = first.prover().busy();
        // Full, the first proven and busy: the oldest not proven (the second) goes.
        let (fourth, _) = slots.admit().unwrap();
        assert_eq!(slots.open(), 3);
        assert!(poll(&mut second_closed).is_ready(), "the second stayed");
        assert!(poll(&mut first_closed).is_pending());
        assert!(poll(&mut third_closed).is_pending());
        // The first idle again: a new one takes its place before that of the third, which
        // is not proven but came in just now (its request may be on its way).
        drop(first_busy);
        let (fifth, _) = slots.admit().unwrap();
        assert!(
            poll(&mut first_closed).is_ready(),
            "the idle proven one stayed"
        );
        assert!(poll(&mut third_closed).is_pending());
        // Every connection proven and busy: a new one is refused.
        for slot in [&third, &fourth, &fifth] {
            slot.prover().prove();
        }
        let busy = [
            third.prover().busy(),
            fourth.prover().busy(),
            fifth.prover().busy(),
        ];
        assert!(slots.admit().is_none());
        // Idle again, first the third, then the fourth, then the fifth: the third goes.
        drop(busy);
        let (_sixth, _) = slots.admit().unwrap();
        assert!(
            poll(&mut third_closed).is_ready(),
            "the one idle longest stayed"
        );
        drop((first, second, third));
        assert_eq!(slots.open(), 3);
        drop(fourth);
        assert_eq!(slots.open(), 2);
        assert!(slots.admit().is_some());
    }

    #[test]
    fn a_place_given_back_does_not_read_as_being_told_to_close() {
        let slots = Slots::new(1, false);
        let (slot, mut closed) = slots.admit().unwrap();
        drop(slot);
        assert!(poll(&mut closed).is_pending());
        assert!(poll(&mut closed).is_pending());
        assert_eq!(slots.open(), 0);
    }

    #[test]
    fn with_a_token_a_connection_not_proven_goes_before_an_idle_proven_one() {
        let slots = Slots::new(2, true);
        let (client, mut client_closed) = slots.admit().unwrap();
        client.prover().prove();
        let (_other, mut other_closed) = slots.admit().unwrap();
        let (_new, _) = slots.admit().unwrap();
        assert!(poll(&mut other_closed).is_ready());
        assert!(poll(&mut client_closed).is_pending());
    }
}
