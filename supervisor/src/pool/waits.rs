//! How long jobs waited for a worker on one pool, per job class, for `/health`: a count of every
//! job and a window of the most recent waits to take percentiles from. Plain data.
//!
//! A window rather than a histogram since start: an operator looking at `/health` after changing
//! the scheduling wants what happens now, and `/metrics` keeps the full histograms.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use crate::status::{ClassWaits, JobClass};

/// Most recent waits kept per class.
pub const WINDOW: usize = 1000;

/// Waits per class on one pool.
#[derive(Clone, Debug, Default)]
pub struct WaitLog {
    classes: BTreeMap<JobClass, ClassLog>,
}

#[derive(Clone, Debug, Default)]
struct ClassLog {
    jobs: u64,
    recent: VecDeque<Duration>,
}

impl WaitLog {
    /// Records that a job of `class` waited `wait` before a worker started it.
    pub fn record(&mut self, class: JobClass, wait: Duration) {
        let log = self.classes.entry(class).or_default();
        log.jobs += 1;
        if log.recent.len() == WINDOW {
            log.recent.pop_front();
        }
        log.recent.push_back(wait);
    }

    /// Per class seen so far, in class order: jobs ever, and percentiles over the window.
    pub fn summary(&self) -> Vec<ClassWaits> {
        self.classes
            .iter()
            .map(|(&class, log)| {
                let mut sorted: Vec<Duration> = log.recent.iter().copied().collect();
                sorted.sort_unstable();
                // Nearest rank: the smallest wait at or above the share `q` of the window.
                let rank = |q: f64| {
                    let index = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
                    sorted.get(index).copied().unwrap_or_default()
                };
                ClassWaits {
                    class,
                    jobs: log.jobs,
                    recent: sorted.len(),
                    p50: rank(0.5),
                    p99: rank(0.99),
                    max: sorted.last().copied().unwrap_or_default(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_recent_window_of_each_class() {
        let mut log = WaitLog::default();
        let short = JobClass::of(1, 60);
        let multi = JobClass::of(4, 300);
        for ms in 1..=100 {
            log.record(short, Duration::from_millis(ms));
        }
        log.record(multi, Duration::from_secs(2));
        let summary = log.summary();
        assert_eq!(summary.len(), 2);
        assert_eq!((summary[0].class.name(), summary[0].jobs), ("single-64", 100));
        assert_eq!(summary[0].p50, Duration::from_millis(50));
        assert_eq!(summary[0].p99, Duration::from_millis(99));
        assert_eq!(summary[0].max, Duration::from_millis(100));
        assert_eq!(
            (summary[1].class.name(), summary[1].p99),
            ("multi-512", Duration::from_secs(2))
        );
        // Old waits leave the window; the count keeps every job.
        for _ in 0..WINDOW {
            log.record(short, Duration::from_millis(3));
        }
        let summary = log.summary();
        assert_eq!((summary[0].jobs, summary[0].recent), (100 + WINDOW as u64, WINDOW));
        assert_eq!(summary[0].max, Duration::from_millis(3));
    }
}
