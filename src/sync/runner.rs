//! When to sync: kube-proxy's bounded-frequency runner as a pure state machine.
//!
//! Requests coalesce: any number of `request()` calls before the next run make one
//! run. Runs are at least `min_interval` apart, at most `max_interval` apart (the
//! periodic full resync), and a failed run is retried after `retry_interval`.
//! Time is passed in, so tests drive it without sleeping.

use std::time::Duration;

use tokio::time::Instant;

/// Why a run is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunReason {
    /// Something changed (or the first run).
    Requested,
    /// The previous run failed.
    Retry,
    /// `max_interval` passed without a run: periodic resync.
    Periodic,
}

/// The runner's state.
#[derive(Debug, Clone)]
pub struct BoundedFrequencyRunner {
    min_interval: Duration,
    max_interval: Duration,
    retry_interval: Duration,
    last_run: Option<Instant>,
    requested: bool,
    retry_at: Option<Instant>,
}

impl BoundedFrequencyRunner {
    /// A runner whose first run is due at once.
    pub fn new(min_interval: Duration, max_interval: Duration, retry_interval: Duration) -> Self {
        BoundedFrequencyRunner {
            min_interval,
            max_interval,
            retry_interval,
            last_run: None,
            requested: true,
            retry_at: None,
        }
    }

    /// Asks for a run (coalesced with any other pending request).
    pub fn request(&mut self) {
        self.requested = true;
    }

    /// Whether a request is waiting.
    pub fn pending(&self) -> bool {
        self.requested || self.retry_at.is_some()
    }

    /// Whether a run is due at `now`, and why.
    pub fn due(&self, now: Instant) -> Option<RunReason> {
        let Some(last) = self.last_run else {
            return Some(RunReason::Requested);
        };
        let since = now.saturating_duration_since(last);
        if self.requested && since >= self.min_interval {
            return Some(RunReason::Requested);
        }
        if let Some(at) = self.retry_at
            && now >= at
            && since >= self.min_interval
        {
            return Some(RunReason::Retry);
        }
        if since >= self.max_interval {
            return Some(RunReason::Periodic);
        }
        None
    }

    /// The next instant at which [`due`](Self::due) may turn true without a new
    /// request.
    pub fn next_deadline(&self, now: Instant) -> Instant {
        let Some(last) = self.last_run else {
            return now;
        };
        let mut next = last + self.max_interval;
        if self.requested {
            next = next.min(last + self.min_interval);
        }
        if let Some(at) = self.retry_at {
            next = next.min(at.max(last + self.min_interval));
        }
        next.max(now)
    }

    /// Records a run that started at `started`; `ok` says whether it succeeded.
    pub fn ran(&mut self, started: Instant, ok: bool) {
        self.last_run = Some(started);
        self.requested = false;
        self.retry_at = if ok {
            None
        } else {
            Some(started + self.retry_interval)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runner() -> (BoundedFrequencyRunner, Instant) {
        (
            BoundedFrequencyRunner::new(
                Duration::from_secs(1),
                Duration::from_secs(30),
                Duration::from_secs(5),
            ),
            Instant::now(),
        )
    }

    #[test]
    fn first_run_is_immediate_then_requests_coalesce_and_respect_min_interval() {
        let (mut r, t0) = runner();
        assert_eq!(r.due(t0), Some(RunReason::Requested));
        r.ran(t0, true);
        assert_eq!(r.due(t0), None);
        r.request();
        r.request();
        assert_eq!(r.due(t0 + Duration::from_millis(500)), None);
        assert_eq!(r.next_deadline(t0), t0 + Duration::from_secs(1));
        assert_eq!(
            r.due(t0 + Duration::from_secs(1)),
            Some(RunReason::Requested)
        );
        r.ran(t0 + Duration::from_secs(1), true);
        assert!(!r.pending());
    }

    #[test]
    fn periodic_resync_after_max_interval() {
        let (mut r, t0) = runner();
        r.ran(t0, true);
        assert_eq!(r.due(t0 + Duration::from_secs(29)), None);
        assert_eq!(r.next_deadline(t0), t0 + Duration::from_secs(30));
        assert_eq!(
            r.due(t0 + Duration::from_secs(30)),
            Some(RunReason::Periodic)
        );
    }

    #[test]
    fn failures_retry_after_retry_interval() {
        let (mut r, t0) = runner();
        r.ran(t0, false);
        assert!(r.pending());
        assert_eq!(r.due(t0 + Duration::from_secs(4)), None);
        assert_eq!(r.next_deadline(t0), t0 + Duration::from_secs(5));
        assert_eq!(r.due(t0 + Duration::from_secs(5)), Some(RunReason::Retry));
        r.ran(t0 + Duration::from_secs(5), true);
        assert!(!r.pending());
    }
}
