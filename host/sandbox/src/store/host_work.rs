//! What host code may still do on behalf of one untrusted request: bytes to read and a
//! deadline.
//!
//! A builder tool call runs host code, not a guest: no epoch stops it and no guest memory cap
//! bounds it. Its work is bounded by construction instead: every file it reads through a
//! [`crate::store::WorkspaceFs`] carrying a [`HostWork`] is charged against the bytes the
//! request may read, and every read, listing and walk step checks the deadline first. A
//! request past either gets an error naming the limit, which the model reads as the call's
//! answer; each unit of work between two checks is itself bounded (one capped file).

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The read budget and deadline of one request; shared by the handles it opens.
#[derive(Debug)]
pub struct HostWork {
    what: &'static str,
    read_cap: u64,
    read: AtomicU64,
    asked: AtomicU64,
    started: Instant,
    time: Duration,
}

impl HostWork {
    /// The work of `what` (`"this builder tool call"`, named in errors): at most `read_cap`
    /// bytes read, and nothing begun after `time` has passed.
    pub fn new(what: &'static str, read_cap: u64, time: Duration) -> Self {
        HostWork {
            what,
            read_cap,
            read: AtomicU64::new(0),
            asked: AtomicU64::new(0),
            started: Instant::now(),
            time,
        }
    }

    /// Bytes read so far.
    pub fn bytes_read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    /// What the request used of its budget: the bytes it read, or its whole budget once it
    /// asked for more than that (a request that ran into its cap has used it).
    pub fn bytes_used(&self) -> u64 {
        self.asked.load(Ordering::Relaxed).min(self.read_cap)
    }

    /// The time left before the deadline (zero past it).
    pub fn time_left(&self) -> Duration {
        self.time.saturating_sub(self.started.elapsed())
    }

    /// An error when the deadline has passed.
    pub fn check_time(&self) -> io::Result<()> {
        if self.started.elapsed() > self.time {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{} worked past its deadline of {} s of host work; ask for less at once \
                     (one step, one run)",
                    self.what,
                    self.time.as_secs()
                ),
            ));
        }
        Ok(())
    }

    /// Charges reading `len` bytes of `rel`: an error, nothing charged, when that would pass
    /// the read budget or the deadline has passed.
    pub fn charge_read(&self, rel: &Path, len: u64) -> io::Result<()> {
        self.check_time()?;
        let _ = self
            .asked
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| {
                Some(a.saturating_add(len))
            });
        self.read
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |read| {
                read.checked_add(len)
                    .filter(|total| *total <= self.read_cap)
            })
            .map(drop)
            .map_err(|read| {
                io::Error::new(
                    io::ErrorKind::QuotaExceeded,
                    format!(
                        "{} is {len} bytes: reading it would take {} past its budget of {} \
                         bytes of host reads ({read} read already); ask for less at once \
                         (one step, one run)",
                        rel.display(),
                        self.what,
                        self.read_cap
                    ),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_charged_up_to_the_budget_and_not_past_it() {
        let work = HostWork::new("this call", 100, Duration::from_secs(60));
        work.charge_read(Path::new("a"), 60).unwrap();
        let err = work.charge_read(Path::new("b"), 41).unwrap_err();
        assert!(err.to_string().contains("budget of 100 bytes"), "{err}");
        assert!(err.to_string().contains("(60 read already)"), "{err}");
        assert_eq!(work.bytes_used(), 100, "a refused read uses the budget up");
        work.charge_read(Path::new("c"), 40).unwrap();
        assert_eq!(work.bytes_read(), 100);
    }

    #[test]
    fn the_time_left_runs_down_to_zero() {
        let work = HostWork::new("this call", 100, Duration::from_secs(60));
        assert!(work.time_left() > Duration::from_secs(59));
        let done = HostWork::new("this call", 100, Duration::ZERO);
        assert_eq!(done.time_left(), Duration::ZERO);
    }

    #[test]
    fn nothing_is_begun_past_the_deadline() {
        let work = HostWork::new("this call", 100, Duration::ZERO);
        std::thread::sleep(Duration::from_millis(2));
        let err = work.charge_read(Path::new("a"), 1).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("deadline of 0 s"), "{err}");
        assert_eq!(work.bytes_read(), 0);
    }
}
