//! When to restart a worker that stopped on its own: after a delay that doubles from
//! `workers.restart_backoff_initial` up to `workers.restart_backoff_max` (mini-redis' accept loop
//! has the same shape), back at the start once a worker served a while; and whether the slot is in
//! a crash loop (`workers.crash_loop_restarts` within `workers.crash_loop_window`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use layad_config::WorkersConfig;

/// A worker that served this long (ready, in its pool) before it stopped had started fine: its
/// restart waits only the initial delay. Measured from readiness, not from spawn, so a slow warm-up
/// does not count as a stable run; short, so a worker killed now and then (by the OOM killer, by an
/// operator) comes back at once instead of after a delay that grew over the day.
pub const STABLE_AFTER: Duration = Duration::from_secs(10);

/// The restart policy of one worker slot, and what it remembers of the slot's failures.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    loop_restarts: u32,
    window: Duration,
    /// When the slot's recent failures happened, oldest first (within `window`).
    failures: VecDeque<Instant>,
}

/// What to do after one failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restart {
    /// Wait this long, then start the worker again.
    pub delay: Duration,
    /// Failures within the crash-loop window, this one included.
    pub recent_failures: usize,
    /// Whether that many make a crash loop (the pool is then reported degraded).
    pub crash_loop: bool,
}

impl Backoff {
    /// The policy `[workers]` configures.
    pub fn new(workers: &WorkersConfig) -> Self {
        Self::with(
            workers.restart_backoff_initial,
            workers.restart_backoff_max,
            workers.crash_loop_restarts,
            workers.crash_loop_window,
        )
    }

    /// Delays from `initial` doubling up to `max`; `loop_restarts` failures within `window` are a
    /// crash loop.
    pub fn with(initial: Duration, max: Duration, loop_restarts: u32, window: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial,
            loop_restarts,
            window,
            failures: VecDeque::new(),
        }
    }

    /// The crash-loop window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// A worker that had served for `served_for` (zero if it never became ready) stopped at `now`.
    pub fn failed(&mut self, served_for: Duration, now: Instant) -> Restart {
        self.failures.push_back(now);
        while self
            .failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.window)
        {
            self.failures.pop_front();
        }
        if served_for >= STABLE_AFTER {
            self.next = self.initial;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        Restart {
            delay,
            recent_failures: self.failures.len(),
            crash_loop: self.failures.len() as u32 >= self.loop_restarts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff() -> Backoff {
        Backoff::with(
            Duration::from_millis(100),
            Duration::from_millis(500),
            3,
            Duration::from_secs(10),
        )
    }

    #[test]
    fn delays_double_up_to_the_cap_and_restart_after_a_stable_run() {
        let mut backoff = backoff();
        let start = Instant::now();
        let delays: Vec<u64> = (0..5)
            .map(|i| {
                let at = start + Duration::from_secs(100 * i);
                backoff.failed(Duration::from_secs(1), at).delay.as_millis() as u64
            })
            .collect();
        assert_eq!(delays, [100, 200, 400, 500, 500]);
        let after_stable = backoff.failed(STABLE_AFTER, start + Duration::from_secs(1000));
        assert_eq!(after_stable.delay, Duration::from_millis(100));
        assert_eq!(
            backoff.failed(Duration::ZERO, start + Duration::from_secs(1001)).delay,
            Duration::from_millis(200)
        );
    }

    #[test]
    fn a_crash_loop_is_enough_failures_within_the_window() {
        let mut backoff = backoff();
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        assert!(!backoff.failed(Duration::ZERO, at(0)).crash_loop);
        assert!(!backoff.failed(Duration::ZERO, at(5)).crash_loop);
        let third = backoff.failed(Duration::ZERO, at(9));
        assert_eq!((third.recent_failures, third.crash_loop), (3, true));
        // The first two fell out of the window: no loop any more.
        let later = backoff.failed(Duration::ZERO, at(18));
        assert_eq!((later.recent_failures, later.crash_loop), (2, false));
    }
}
