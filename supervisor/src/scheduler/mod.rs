//! The scheduler: places each job on a pool by its shape, spills it to another capable pool when it
//! would finish earlier there (expected start from its place in that pool's service order, plus its
//! service estimate at the device's current speed) even when its preferred pool is idle, probes a
//! slowed pool with a trickle of copies of jobs (answers not used) so that its recovery is seen, refuses at once what no pool
//! would finish before its deadline for its backlog, and waits for the pool's answer. It alone decides a job's route and the reason given for it,
//! including for a job an idle pool took over from another pool's queue.
//!
//! Placement is [`place`], a pure function of what each pool reports ([`PoolView`]), so every rule
//! is unit-tested without processes. The pool list can be swapped by a reload while jobs run.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use layad_config::SchedulingConfig;

use crate::backend::{Backend, BackendError, Job, JobOutput, PoolAnswer, Route};
use crate::pool::capabilities::{ForwardShape, JobShape};
use crate::pool::order::QueuePolicy;
use crate::pool::{Pool, PoolView};
use crate::status::BackendStatus;

/// Routes jobs to pools.
#[derive(Debug)]
pub struct Scheduler {
    pools: RwLock<Vec<Arc<Pool>>>,
    settings: RwLock<SchedulingConfig>,
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
    /// A slowed pool to run a copy of the job on as a probe (its answer is not used).
    pub probe: Option<usize>,
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

/// How much sooner another pool must be expected to finish a job than an idle preferred pool to take
/// it: estimates of identical devices differ by a few percent from forward to forward, and a job
/// should not move on that. A device at half its speed or slower is well past it.
const TIE: f64 = 1.25;

/// Whether `other` is expected to finish the job sooner than `preferred`, the pool it prefers.
/// Against a busy preferred pool any earlier finish counts (it cannot start the job now). Against an
/// idle one the other must finish it sooner by more than [`TIE`], and on estimates measured on both
/// pools unless the preferred pool's device was measured slowed: warm-up timings taken while other
/// workers warm up differ by 2× on a busy machine, and work would move on them.
fn finishes_first(other: &PoolView, preferred: &PoolView) -> bool {
    let (Some(theirs), Some(ours)) = (other.expected, preferred.expected) else {
        return false;
    };
    if !preferred.idle {
        return theirs < ours;
    }
    (preferred.slowed || (other.measured && preferred.measured)) && theirs.mul_f64(TIE) < ours
}

/// Chooses a pool for a job of `shape` among `views` (the pools serving its checkpoint, in
/// configuration order), `time_left` before its deadline. The preferred pool is the most specialised
/// capable one with a ready worker. With `spill`, every job goes where it is expected to finish
/// first ([`finishes_first`]: its start from its place in each pool's service order, plus its
/// service estimate at the device's current speed), the preferred pool winning ties; and a pool
/// whose device slowed runs a copy of a job now and then as a probe ([`PoolView::probe`],
/// [`Placement::probe`]), since a pool that gets no work would never be measured recovering. When no pool it may go to is expected to
/// finish it within `time_left`, it is refused ([`BackendError::TooLate`]), unless the pool where it
/// would finish soonest is idle (then the estimate alone would refuse it, and nothing would correct it).
pub fn place(views: &[PoolView], shape: JobShape, spill: bool, time_left: Duration) -> Result<Placement, BackendError> {
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
            probe: None,
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

    // Admission by deadline: the soonest it could finish where it may go. (Without a ready worker
    // anywhere there is no estimate, and the job waits for one.) Only a backlog refuses: where that
    // pool is idle, the estimate alone says it would be late, and a refused job runs nowhere, so
    // an estimate that is wrong would never be corrected. A reload storm beside builds
    // (load average 6-8) once left an idle pool's estimate at 60.6 s against a 60 s timeout, and
    // every request for nine minutes was refused while its forwards took milliseconds.
    let may_go: &[usize] = if spill || preferred != most_specialised {
        &others
    } else {
        &[]
    };
    let soonest_pool = may_go
        .first()
        .copied()
        .filter(|&best| expected(best) < expected(preferred))
        .unwrap_or(preferred);
    let soonest = expected(soonest_pool);
    if soonest > time_left && !views[soonest_pool].idle {
        return Err(BackendError::TooLate {
            expected: soonest,
            late: soonest - time_left,
        });
    }

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
            probe: None,
        });
    }
    let view = &views[preferred];
    // A slowed pool due a probe runs a copy of the job, whose answer is not used: the job itself goes
    // where it finishes first, so the probe costs the request nothing.
    let probe = if spill {
        capable
            .iter()
            .copied()
            .find(|&i| views[i].probe && views[i].ready > 0 && expected(i) <= time_left)
    } else {
        None
    };
    let probe_note = |chosen: usize| match probe.filter(|&p| p != chosen) {
        Some(p) => format!(
            "; a copy probes '{}', whose device runs at {:.1}× its normal time",
            views[p].name, views[p].speed
        ),
        None => String::new(),
    };
    if spill
        && let Some(&best) = others.first()
        && finishes_first(&views[best], view)
    {
        let mut alternatives: Vec<usize> = others.iter().copied().filter(|&i| i != best).collect();
        alternatives.push(preferred);
        let slowed = if view.speed > 1.0 {
            format!(", its device at {:.1}× its normal time", view.speed)
        } else {
            String::new()
        };
        return Ok(Placement {
            pool: best,
            forward: forward(best)?,
            route: Route::Spilled,
            reason: format!(
                "spilled from '{}' (expected to start in {} and finish in {}{slowed}) to '{}' (finish in {}){}",
                view.name,
                ms(view.start.unwrap_or_default()),
                ms(expected(preferred)),
                views[best].name,
                ms(expected(best)),
                probe_note(best)
            ),
            spilled_from: Some(preferred),
            alternatives,
            probe: probe.filter(|&p| p != best),
        });
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
        reason: reason + &probe_note(preferred),
        spilled_from: None,
        alternatives: if spill { others } else { Vec::new() },
        probe: probe.filter(|&p| p != preferred),
    })
}

/// The route and reason of a job an idle worker of `answer.pool` took from another pool's queue.
fn taken_over_route(answer: &PoolAnswer) -> Option<(Route, String)> {
    let over = answer.taken_over.as_ref()?;
    let there = over.would_start.map_or("no worker ready there".to_owned(), |start| {
        format!("expected to start in {}", ms(start))
    });
    Some((
        Route::Spilled,
        format!(
            "taken over from '{}' ({there}) by '{}', whose worker was idle",
            over.from, answer.pool
        ),
    ))
}

impl Scheduler {
    /// A scheduler over `pools`, spreading and ordering jobs as `settings` say.
    pub fn new(pools: Vec<Arc<Pool>>, settings: SchedulingConfig) -> Self {
        let scheduler = Self {
            pools: RwLock::new(Vec::new()),
            settings: RwLock::new(settings),
        };
        scheduler.set_pools(pools);
        scheduler
    }

    /// The pools, in configuration order (retiring ones included until they are gone).
    pub fn pools(&self) -> Vec<Arc<Pool>> {
        self.pools.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the pool list (reload).
    pub fn set_pools(&self, pools: Vec<Arc<Pool>>) {
        *self.pools.write().unwrap_or_else(|p| p.into_inner()) = pools;
        self.connect_peers();
    }

    /// Applies a new `[scheduling]` (reload).
    pub fn set_scheduling(&self, settings: SchedulingConfig) {
        *self.settings.write().unwrap_or_else(|p| p.into_inner()) = settings;
        self.connect_peers();
    }

    fn settings(&self) -> SchedulingConfig {
        self.settings.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// With spill on, every pool's idle workers may take jobs from the queues of the other pools
    /// sharing a checkpoint with it; with spill off, from none.
    fn connect_peers(&self) {
        let spill = self.settings().spill;
        let pools = self.pools();
        for pool in &pools {
            let peers = pools
                .iter()
                .filter(|other| {
                    spill && !Arc::ptr_eq(pool, other) && other.checkpoints().iter().any(|c| pool.serves(*c))
                })
                .map(Arc::downgrade)
                .collect();
            pool.set_peers(peers);
        }
    }

    /// Queues `job` and waits for its answer. The caller bounds the wait: dropping this future
    /// withdraws the job.
    async fn submit(pools: Vec<Arc<Pool>>, settings: SchedulingConfig, job: Job) -> Result<JobOutput, BackendError> {
        let serving: Vec<Arc<Pool>> = pools
            .into_iter()
            .filter(|p| p.serves(job.checkpoint) && p.accepting())
            .collect();
        if serving.is_empty() {
            return Err(BackendError::CheckpointUnavailable(job.checkpoint));
        }
        let shape = JobShape::of(&job.rows);
        let policy = QueuePolicy::from_config(&settings);
        let views: Vec<PoolView> = serving
            .iter()
            .map(|p| p.view(job.checkpoint, shape, &policy, job.deadline))
            .collect();
        // Waiting for a worker that will never start would end in a 503 telling the client to
        // retry, forever: refuse at once, naming why.
        if views.iter().all(|v| v.ready == 0 && v.unavailable.is_some()) {
            return Err(BackendError::CheckpointRefused {
                checkpoint: job.checkpoint,
                reasons: views
                    .iter()
                    .map(|v| {
                        format!(
                            "pool '{}' is unavailable ({})",
                            v.name,
                            v.unavailable.as_deref().unwrap_or("")
                        )
                    })
                    .collect(),
            });
        }
        let time_left = job.deadline.saturating_duration_since(Instant::now());
        let placement = place(&views, shape, settings.spill, time_left)?;
        let mut answer = None;
        let mut refusals: Vec<BackendError> = Vec::new();
        for (attempt, i) in std::iter::once(placement.pool)
            .chain(placement.alternatives.iter().copied())
            .enumerate()
        {
            let Ok(forward) = views[i].holds.clone() else { continue };
            // A full queue sends the job on to the next capable pool, and says so.
            let route = if attempt == 0 { placement.route } else { Route::Spilled };
            match serving[i].enqueue(job.clone(), forward, Some(route), &policy) {
                Ok(receiver) => {
                    answer = Some((i, attempt, receiver));
                    break;
                }
                Err(e) => refusals.push(e),
            }
        }
        let Some((chosen, attempt, receiver)) = answer else {
            // Every pool it may go to is full: retry when the first of them has room.
            let soonest = refusals
                .iter()
                .filter_map(|e| match e {
                    BackendError::Overloaded { retry_after } => Some(*retry_after),
                    _ => None,
                })
                .min();
            return Err(match soonest {
                Some(retry_after) => BackendError::Overloaded { retry_after },
                None => refusals.pop().unwrap_or(BackendError::Overloaded {
                    retry_after: Duration::from_secs(1),
                }),
            });
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
        if let Some(p) = placement.probe.filter(|&p| p != chosen)
            && let Ok(forward) = views[p].holds.clone()
            && let Ok(probe) = serving[p].enqueue(job.clone(), forward, None, &policy)
        {
            // Kept waiting for, so that the copy is not withdrawn as abandoned before it runs; the
            // pool learns its device time, the answer goes nowhere.
            tokio::spawn(async move {
                let _ = probe.await;
            });
        }
        match receiver.await {
            Ok(answer) => answer.map(|answer| {
                let (route, reason) = taken_over_route(&answer).unwrap_or((route, reason));
                JobOutput { answer, route, reason }
            }),
            // The pool dropped the job without answering: it is shutting down.
            Err(_) => Err(BackendError::Lost("the pool shut down before answering".to_owned())),
        }
    }
}

impl Backend for Scheduler {
    fn run(&self, job: Job) -> BoxFuture<'static, Result<JobOutput, BackendError>> {
        Box::pin(Self::submit(self.pools(), self.settings(), job))
    }

    fn status(&self) -> BackendStatus {
        BackendStatus {
            pools: self.pools().iter().map(|p| p.status()).collect(),
        }
    }
}

#[cfg(test)]
mod tests;
