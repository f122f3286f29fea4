//! The scheduler: places each job on a pool by its shape, spills it to another capable pool when it
//! would finish strictly earlier there, and waits for the pool's answer. It alone decides a job's
//! route and the reason given for it.
//!
//! Placement is [`place`], a pure function of what each pool reports ([`PoolView`]), so every rule
//! is unit-tested without processes. The pool list can be swapped by a reload while jobs run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::future::BoxFuture;

use crate::backend::{Backend, BackendError, Job, JobOutput, Route};
use crate::pool::capabilities::{ForwardShape, JobShape};
use crate::pool::{Pool, PoolView};
use crate::status::BackendStatus;

/// Routes jobs to pools.
#[derive(Debug)]
pub struct Scheduler {
    pools: RwLock<Vec<Arc<Pool>>>,
    spill: AtomicBool,
}

/// Where a job goes and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Index into the views it was chosen from.
    pub pool: usize,
    /// The forward it needs there.
    pub forward: ForwardShape,
    /// How the pool was chosen.
    pub route: Route,
    /// Why, in words.
    pub reason: String,
    /// The preferred pool it spilled from, if it did.
    pub spilled_from: Option<usize>,
    /// Other capable pools, best first, to try when the chosen one's queue is full.
    pub alternatives: Vec<usize>,
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn describe_shape(shape: JobShape) -> String {
    let questions = if shape.questions == 1 {
        "1 question".to_owned()
    } else {
        format!("{} questions", shape.questions)
    };
    format!("{questions} of up to {} tokens", shape.longest)
}

/// Chooses a pool for a job of `shape` among `views` (the pools serving its checkpoint, in
/// configuration order). The preferred pool is the most specialised capable one with a ready
/// worker; with `spill`, when that pool cannot start the job at once, a capable pool where the job is
/// expected to finish strictly earlier wins.
pub fn place(views: &[PoolView], shape: JobShape, spill: bool) -> Result<Placement, BackendError> {
    let mut capable: Vec<usize> = (0..views.len()).filter(|&i| views[i].holds.is_ok()).collect();
    if capable.is_empty() {
        let why: Vec<String> = views
            .iter()
            .map(|v| format!("'{}' {}", v.name, v.holds.as_ref().err().map_or("", String::as_str)))
            .collect();
        return Err(BackendError::NoCapablePool(format!(
            "no pool can run {} in one forward pass: {}",
            describe_shape(shape),
            why.join("; ")
        )));
    }
    // Most specialised first; configuration order breaks ties.
    capable.sort_by_key(|&i| (views[i].capabilities.specialisation(), i));
    let most_specialised = capable[0];
    let Some(preferred) = capable.iter().copied().find(|&i| views[i].ready > 0) else {
        // Nothing can run it now: queue it where it belongs and let a (re)starting worker take it.
        let view = &views[most_specialised];
        return Ok(Placement {
            pool: most_specialised,
            forward: view.holds.clone().map_err(BackendError::NoCapablePool)?,
            route: Route::Fallback,
            reason: format!(
                "no capable pool has a ready worker; queued on '{}' ({})",
                view.name,
                view.unavailable.as_deref().unwrap_or("waiting for a worker")
            ),
            spilled_from: None,
            alternatives: Vec::new(),
        });
    };
    let expected = |i: usize| views[i].expected.unwrap_or(Duration::MAX);
    let mut others: Vec<usize> = capable
        .iter()
        .copied()
        .filter(|&i| i != preferred && views[i].ready > 0)
        .collect();
    others.sort_by_key(|&i| (expected(i), i));
    let forward = |i: usize| views[i].holds.clone().map_err(BackendError::NoCapablePool);

    if preferred != most_specialised {
        let skipped = &views[most_specialised];
        let why = match &skipped.unavailable {
            Some(reason) => format!("is unavailable ({reason})"),
            None => "has no ready worker".to_owned(),
        };
        return Ok(Placement {
            pool: preferred,
            forward: forward(preferred)?,
            route: Route::Fallback,
            reason: format!(
                "'{}' would take {} but {why}; ran on '{}'",
                skipped.name,
                describe_shape(shape),
                views[preferred].name
            ),
            spilled_from: None,
            alternatives: others,
        });
    }
    let view = &views[preferred];
    // An idle preferred pool starts the job at once. Comparing two idle pools' estimates would move
    // work on noise: warm-up timings taken while other workers warm differ by 2x on a busy machine.
    if spill
        && !view.idle
        && let Some(&best) = others.first()
        && expected(best) < expected(preferred)
    {
        {
            let mut alternatives: Vec<usize> = others.iter().copied().filter(|&i| i != best).collect();
            alternatives.push(preferred);
            return Ok(Placement {
                pool: best,
                forward: forward(best)?,
                route: Route::Spilled,
                reason: format!(
                    "spilled from '{}' (expected to finish in {}) to '{}' ({})",
                    view.name,
                    ms(expected(preferred)),
                    views[best].name,
                    ms(expected(best))
                ),
                spilled_from: Some(preferred),
                alternatives,
            });
        }
    }
    let reason = if capable.len() == 1 {
        format!("'{}' is the only pool that holds {}", view.name, describe_shape(shape))
    } else {
        format!(
            "{} fits '{}' ({}), the most specialised pool; expected in {}",
            describe_shape(shape),
            view.name,
            view.capabilities.describe(),
            ms(expected(preferred))
        )
    };
    Ok(Placement {
        pool: preferred,
        forward: forward(preferred)?,
        route: Route::Preferred,
        reason,
        spilled_from: None,
        alternatives: if spill { others } else { Vec::new() },
    })
}

impl Scheduler {
    /// A scheduler over `pools`.
    pub fn new(pools: Vec<Arc<Pool>>, spill: bool) -> Self {
        Self {
            pools: RwLock::new(pools),
            spill: AtomicBool::new(spill),
        }
    }

    /// The pools, in configuration order (retiring ones included until they are gone).
    pub fn pools(&self) -> Vec<Arc<Pool>> {
        self.pools.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the pool list (reload).
    pub fn set_pools(&self, pools: Vec<Arc<Pool>>) {
        *self.pools.write().unwrap_or_else(|p| p.into_inner()) = pools;
    }

    /// Turns spilling on or off (reload).
    pub fn set_spill(&self, spill: bool) {
        self.spill.store(spill, Ordering::Relaxed);
    }

    /// Queues `job` and waits for its answer. The caller bounds the wait: dropping this future
    /// withdraws the job.
    async fn submit(pools: Vec<Arc<Pool>>, spill: bool, job: Job) -> Result<JobOutput, BackendError> {
        let serving: Vec<Arc<Pool>> = pools
            .into_iter()
            .filter(|p| p.serves(job.checkpoint) && p.accepting())
            .collect();
        if serving.is_empty() {
            return Err(BackendError::CheckpointUnavailable(job.checkpoint));
        }
        let shape = JobShape::of(&job.rows);
        let views: Vec<PoolView> = serving.iter().map(|p| p.view(job.checkpoint, shape)).collect();
        let placement = place(&views, shape, spill)?;
        let mut answer = None;
        let mut last_error = None;
        for (attempt, i) in std::iter::once(placement.pool)
            .chain(placement.alternatives.iter().copied())
            .enumerate()
        {
            let Ok(forward) = views[i].holds.clone() else { continue };
            // A full queue sends the job on to the next capable pool, and says so.
            let route = if attempt == 0 { placement.route } else { Route::Spilled };
            match serving[i].enqueue(job.clone(), forward, route) {
                Ok(receiver) => {
                    answer = Some((i, attempt, receiver));
                    break;
                }
                Err(e) => last_error = Some(e),
            }
        }
        let Some((chosen, attempt, receiver)) = answer else {
            return Err(last_error.unwrap_or(BackendError::Overloaded {
                retry_after: Duration::from_secs(1),
            }));
        };
        let (route, reason) = if attempt == 0 {
            (placement.route, placement.reason)
        } else {
            let full = &views[placement.pool].name;
            (
                Route::Spilled,
                format!("'{full}' has a full queue; ran on '{}'", views[chosen].name),
            )
        };
        if route == Route::Spilled {
            let from = placement.spilled_from.unwrap_or(placement.pool);
            serving[from].count_spilled_out();
        }
        match receiver.await {
            Ok(answer) => answer.map(|answer| JobOutput { answer, route, reason }),
            // The pool dropped the job without answering: it is shutting down.
            Err(_) => Err(BackendError::Failed("the pool shut down before answering".to_owned())),
        }
    }
}

impl Backend for Scheduler {
    fn run(&self, job: Job) -> BoxFuture<'static, Result<JobOutput, BackendError>> {
        let (pools, spill) = (self.pools(), self.spill.load(Ordering::Relaxed));
        Box::pin(Self::submit(pools, spill, job))
    }

    fn status(&self) -> BackendStatus {
        BackendStatus {
            pools: self.pools().iter().map(|p| p.status()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::capabilities::Capabilities;

    fn caps(max_questions: usize, max_len: Option<usize>) -> Capabilities {
        Capabilities {
            max_questions,
            max_rows: 64,
            max_len,
            buckets: Vec::new(),
            max_batch_tokens: 32768,
        }
    }

    /// A pool view: `expected_ms` None means no ready worker.
    fn view(name: &str, capabilities: Capabilities, shape: JobShape, expected_ms: Option<u64>) -> PoolView {
        PoolView {
            name: name.to_owned(),
            holds: capabilities.holds(shape),
            capabilities,
            ready: usize::from(expected_ms.is_some()),
            unavailable: None,
            // Idle when its expected completion is its service time alone.
            idle: expected_ms == Some(10),
            expected: expected_ms.map(Duration::from_millis),
            service: Duration::from_millis(10),
        }
    }

    fn short_and_general(shape: JobShape, short_ms: Option<u64>, general_ms: Option<u64>) -> Vec<PoolView> {
        // The general pool comes first in the configuration: order must not matter.
        vec![
            view("general", caps(64, None), shape, general_ms),
            view("short", caps(1, Some(128)), shape, short_ms),
        ]
    }

    const SHORT: JobShape = JobShape {
        questions: 1,
        longest: 60,
    };

    #[test]
    fn a_short_single_question_prefers_the_short_pool() {
        let placement = place(&short_and_general(SHORT, Some(10), Some(10)), SHORT, true).expect("placed");
        assert_eq!((placement.pool, placement.route), (1, Route::Preferred));
        assert!(placement.reason.contains("most specialised"), "{}", placement.reason);
        // Idle, it keeps the job even when the other pool's estimate is lower.
        let mut views = short_and_general(SHORT, Some(10), Some(5));
        views[0].idle = true;
        let placement = place(&views, SHORT, true).expect("placed");
        assert_eq!((placement.pool, placement.route), (1, Route::Preferred));
    }

    #[test]
    fn multi_question_and_long_requests_go_to_the_general_pool() {
        for shape in [
            JobShape {
                questions: 4,
                longest: 60,
            },
            JobShape {
                questions: 1,
                longest: 300,
            },
        ] {
            // Even with the short pool idle and the general one busy: it cannot hold them.
            let placement = place(&short_and_general(shape, Some(1), Some(500)), shape, true).expect("placed");
            assert_eq!((placement.pool, placement.route), (0, Route::Preferred), "{shape:?}");
            assert!(placement.reason.contains("only pool"), "{}", placement.reason);
            assert!(placement.alternatives.is_empty());
        }
    }

    #[test]
    fn a_backed_up_short_pool_spills_only_when_strictly_later() {
        let spilled = place(&short_and_general(SHORT, Some(80), Some(30)), SHORT, true).expect("placed");
        assert_eq!((spilled.pool, spilled.route), (0, Route::Spilled));
        assert_eq!(spilled.spilled_from, Some(1));
        assert!(spilled.reason.starts_with("spilled from 'short'"), "{}", spilled.reason);
        let tie = place(&short_and_general(SHORT, Some(30), Some(30)), SHORT, true).expect("placed");
        assert_eq!((tie.pool, tie.route), (1, Route::Preferred));
        let off = place(&short_and_general(SHORT, Some(80), Some(30)), SHORT, false).expect("placed");
        assert_eq!((off.pool, off.route), (1, Route::Preferred));
        assert!(off.alternatives.is_empty(), "no spill: a full queue answers 503");
    }

    #[test]
    fn an_unavailable_preferred_pool_falls_back_and_says_why() {
        let mut views = short_and_general(SHORT, None, Some(30));
        views[1].unavailable = Some("Core ML is not available on linux".to_owned());
        let placement = place(&views, SHORT, true).expect("placed");
        assert_eq!((placement.pool, placement.route), (0, Route::Fallback));
        assert!(
            placement
                .reason
                .contains("'short' would take 1 question of up to 60 tokens but is unavailable (Core ML"),
            "{}",
            placement.reason
        );
    }

    #[test]
    fn no_ready_pool_queues_on_the_most_specialised_and_no_capable_pool_is_an_error() {
        let placement = place(&short_and_general(SHORT, None, None), SHORT, true).expect("queued");
        assert_eq!((placement.pool, placement.route), (1, Route::Fallback));
        let huge = JobShape {
            questions: 65,
            longest: 60,
        };
        let error = place(&short_and_general(huge, Some(1), Some(1)), huge, true).expect_err("nowhere");
        assert!(
            matches!(&error, BackendError::NoCapablePool(why) if why.contains("'general' takes at most 64 question(s)")),
            "{error:?}"
        );
    }
}
