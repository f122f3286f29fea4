//! The order a pool serves its queue in, and when a queued job is expected to start. Pure:
//! [`QueuePolicy::priority`] gives each job the instant it should start by (the queue is served
//! earliest first); a [`Timeline`] books queued work onto the workers to tell when each job starts.
//!
//! Shortest-first with aging: a job's priority is `enqueued + aging × its service estimate`, so a
//! job of estimate `e` is passed only by jobs arriving less than `aging × e` after it, and once it has
//! waited `aging × e` nothing that arrives later starts before it. A deadline that comes sooner pulls
//! the priority forward to `deadline − e`, the latest start that still finishes in time.

use std::time::{Duration, Instant};

use layad_config::{QueueOrder, SchedulingConfig};

/// How a pool orders its queue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QueuePolicy {
    /// Shortest-first or arrival order.
    pub order: QueueOrder,
    /// Shortest-first: how many times its own estimate a job may be passed for.
    pub aging: f64,
}

impl Default for QueuePolicy {
    fn default() -> Self {
        Self::from_config(&SchedulingConfig::default())
    }
}

impl QueuePolicy {
    /// The policy `[scheduling]` asks for.
    pub fn from_config(config: &SchedulingConfig) -> Self {
        Self {
            order: config.order,
            aging: config.aging,
        }
    }

    /// The instant a job queued at `enqueued`, expected to take `estimate` and answered by
    /// `deadline`, should start by; the queue is served in increasing priority.
    pub fn priority(&self, enqueued: Instant, estimate: Duration, deadline: Instant) -> Instant {
        match self.order {
            QueueOrder::Arrival => enqueued,
            QueueOrder::ShortestFirst => {
                let aged = enqueued + estimate.mul_f64(self.aging);
                let latest_start = deadline.checked_sub(estimate).unwrap_or(enqueued);
                aged.min(latest_start).max(enqueued)
            }
        }
    }
}

/// The ready workers of a pool as times from now when each is free, with queued work booked onto
/// them in service order: each job goes to the worker that frees first, as the worker tasks take
/// them. Batching is not modelled, so starts are upper estimates where jobs share forwards.
#[derive(Clone, Debug)]
pub struct Timeline {
    free_after: Vec<Duration>,
}

impl Timeline {
    /// Workers free after `free_after` (zero: free now); `None` without a ready worker.
    pub fn new(free_after: Vec<Duration>) -> Option<Self> {
        (!free_after.is_empty()).then_some(Self { free_after })
    }

    /// When the next job could start.
    pub fn next_start(&self) -> Duration {
        self.free_after.iter().copied().min().unwrap_or_default()
    }

    /// Books a job of `estimate` on the worker that frees first; returns when it starts.
    pub fn book(&mut self, estimate: Duration) -> Duration {
        let Some(first) = self.free_after.iter_mut().min() else {
            return Duration::ZERO;
        };
        let start = *first;
        *first += estimate;
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn shortest_first(aging: f64) -> QueuePolicy {
        QueuePolicy {
            order: QueueOrder::ShortestFirst,
            aging,
        }
    }

    #[test]
    fn a_shorter_job_passes_a_longer_one_only_until_the_longer_has_waited_aging_times_its_estimate() {
        let policy = shortest_first(10.0);
        let t0 = Instant::now();
        let far = t0 + Duration::from_secs(3600);
        let long = policy.priority(t0, 200 * MS, far);
        assert_eq!(long, t0 + 2000 * MS);
        // A 30 ms job arriving 1.5 s later still goes first (its priority: 1.5 s + 300 ms)...
        assert!(policy.priority(t0 + 1500 * MS, 30 * MS, far) < long);
        // ...one arriving after the long job has waited 10 × 200 ms never does, however short.
        for after_ms in [2000, 2001, 5000] {
            let later = t0 + after_ms * MS;
            assert!(policy.priority(later, Duration::ZERO, far) >= long, "{after_ms} ms");
        }
        // Equal estimates keep arrival order.
        assert!(policy.priority(t0, 30 * MS, far) < policy.priority(t0 + MS, 30 * MS, far));
    }

    #[test]
    fn a_near_deadline_pulls_the_priority_forward_and_arrival_order_ignores_estimates() {
        let policy = shortest_first(10.0);
        let t0 = Instant::now();
        // 10 × 2 s would be 20 s, but the answer is due in 5 s: start by 3 s.
        assert_eq!(policy.priority(t0, 2000 * MS, t0 + 5000 * MS), t0 + 3000 * MS);
        // Already too late: as urgent as it can be, never before it was queued.
        assert_eq!(policy.priority(t0, 2000 * MS, t0 + 1000 * MS), t0);
        let arrival = QueuePolicy {
            order: QueueOrder::Arrival,
            aging: 10.0,
        };
        assert_eq!(arrival.priority(t0, 2000 * MS, t0 + 1000 * MS), t0);
        assert_eq!(arrival.priority(t0 + MS, Duration::ZERO, t0), t0 + MS);
    }

    #[test]
    fn the_timeline_books_each_job_on_the_worker_that_frees_first() {
        assert!(Timeline::new(Vec::new()).is_none(), "no ready worker");
        // One worker busy for 40 ms more, one free.
        let mut timeline = Timeline::new(vec![40 * MS, Duration::ZERO]).expect("workers");
        assert_eq!(timeline.next_start(), Duration::ZERO);
        assert_eq!(timeline.book(100 * MS), Duration::ZERO);
        assert_eq!(timeline.book(30 * MS), 40 * MS);
        assert_eq!(timeline.book(30 * MS), 70 * MS);
        assert_eq!(timeline.next_start(), 100 * MS);
    }
}
