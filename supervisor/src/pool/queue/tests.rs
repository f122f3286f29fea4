//! The queue as plain data: service order, batches, the backlog and expected starts, refusals, and
//! what an idle worker of another pool may take.

use super::*;
use laya::prompt::Row;
use layad_config::{PoolConfig, QueueOrder};

use crate::pool::estimate::WarmupPoint;

const ENGLISH: CheckpointName = CheckpointName::English;
const MS: Duration = Duration::from_millis(1);

/// A job of one row per entry of `lengths`; its request id names the lengths.
fn job(checkpoint: CheckpointName, lengths: &[usize]) -> Job {
    Job {
        request_id: format!("{lengths:?}"),
        checkpoint,
        rows: lengths
            .iter()
            .map(|&len| Row {
                ids: vec![1; len],
                markers: vec![0],
                qtype: laya::question::QuestionType::Noul,
            })
            .collect(),
        deadline: Instant::now() + Duration::from_secs(3600),
    }
}

fn forward(job: &Job) -> ForwardShape {
    let shape = JobShape::of(&job.rows);
    ForwardShape {
        rows: shape.questions,
        padded_len: shape.longest,
    }
}

fn policy(order: QueueOrder) -> QueuePolicy {
    QueuePolicy { order, aging: 10.0 }
}

fn general() -> Capabilities {
    Capabilities::from_config(&PoolConfig::named("general"))
}

fn short_pool() -> Capabilities {
    let mut config = PoolConfig::named("short");
    config.max_questions = Some(1);
    config.max_tokens = Some(128);
    Capabilities::from_config(&config)
}

/// A pool state whose forwards are estimated at `ms_per_token` per token (English), with `ready`
/// idle workers: a CPU, where sharing a forward saves nothing.
fn state(ms_per_token: f64, ready: usize) -> State {
    state_with_overhead(0.0, ms_per_token, ready)
}

/// Like [`state`], with `overhead_ms` more per forward, however many rows it carries: a device where
/// sharing a forward saves time.
fn state_with_overhead(overhead_ms: f64, ms_per_token: f64, ready: usize) -> State {
    let point = |tokens: usize| WarmupPoint {
        checkpoint: ENGLISH,
        shape: ForwardShape {
            rows: 1,
            padded_len: tokens,
        },
        steady_ms: overhead_ms + tokens as f64 * ms_per_token,
    };
    let mut state = State::default();
    // Estimates interpolate linearly between these two: overhead + tokens × ms_per_token.
    state.model.seed(if overhead_ms == 0.0 {
        vec![point(64)]
    } else {
        vec![point(1), point(1_000_000)]
    });
    for index in 0..ready {
        state.ready.insert(
            index,
            ReadyWorker {
                checkpoints: CheckpointName::ALL.to_vec(),
                capabilities: general(),
            },
        );
    }
    state
}

/// Queues jobs of these lengths in `order`; the receivers keep the jobs wanted.
fn queue(state: &mut State, order: QueueOrder, jobs: &[(CheckpointName, &[usize])]) -> Vec<Answer> {
    jobs.iter()
        .map(|(checkpoint, lengths)| {
            let job = job(*checkpoint, lengths);
            let forward = forward(&job);
            state
                .push(job, forward, Some(Route::Preferred), 100, &policy(order))
                .expect("queued")
        })
        .collect()
}

/// A peer whose every estimate was measured.
fn measured(_: CheckpointName, _: ForwardShape) -> bool {
    true
}

/// Records one forward of `rows` rows of 64 tokens taking exactly what the model expects, so that
/// its band counts as measured.
fn measure(state: &mut State, rows: usize) {
    let shape = ForwardShape { rows, padded_len: 64 };
    let expected = state.model.estimate(ENGLISH, shape);
    state.model.observe(ENGLISH, shape, expected, Instant::now());
}

/// Forgets when the queued jobs arrived, as if they had waited longer than the load window: the
/// pool is not saturated, however many wait, and [`joins_batch`] decides its batches.
fn arrived_long_ago(state: &mut State) {
    state.arrivals.clear();
}

fn ids(entries: &[Entry]) -> Vec<&str> {
    entries.iter().map(|q| q.job.request_id.as_str()).collect()
}

fn queued(state: &State) -> Vec<&str> {
    state.queue.iter().map(|q| q.job.request_id.as_str()).collect()
}

#[test]
fn batches_take_same_checkpoint_jobs_of_similar_length_only() {
    let mut state = state_with_overhead(50.0, 0.1, 1);
    let _answers = queue(
        &mut state,
        QueueOrder::Arrival,
        &[
            (ENGLISH, &[60]),
            (CheckpointName::Multilingual, &[60]),
            (ENGLISH, &[384]),
            (ENGLISH, &[64, 50]),
            (ENGLISH, &[70]),
        ],
    );
    let batch = state
        .take_batch(0, &CheckpointName::ALL, &general(), Duration::ZERO)
        .expect("a batch");
    // 384 tokens would pad the others sixfold; 70 pads 4 rows of <= 64 by less than a quarter.
    assert_eq!(ids(&batch), ["[60]", "[64, 50]", "[70]"]);
    assert_eq!(queued(&state), ["[60]", "[384]"], "the rest keeps its order");
    assert_eq!(state.batches, (1, 3));
    assert!(state.running.contains_key(&0), "the worker is busy");
    // One row per forward: no batching.
    let mut one_row = general();
    one_row.max_rows = 1;
    let batch = state
        .take_batch(1, &CheckpointName::ALL, &one_row, Duration::ZERO)
        .expect("a batch");
    assert_eq!(batch.len(), 1);
    assert_eq!(state.in_flight, 4, "taken jobs count as in flight");
}

#[test]
fn shortest_first_serves_later_short_jobs_before_an_earlier_long_one() {
    let jobs: [(CheckpointName, &[usize]); 3] = [(ENGLISH, &[384]), (ENGLISH, &[120]), (ENGLISH, &[60])];
    let mut one_row = general();
    one_row.max_rows = 1;
    let mut served = Vec::new();
    for order in [QueueOrder::ShortestFirst, QueueOrder::Arrival] {
        let mut state = state(1.0, 1);
        let _answers = queue(&mut state, order, &jobs);
        let mut ids = Vec::new();
        while let Some(batch) = state.take_batch(0, &CheckpointName::ALL, &one_row, Duration::ZERO) {
            ids.push(batch[0].job.request_id.clone());
        }
        served.push(ids);
    }
    assert_eq!(served[0], ["[60]", "[120]", "[384]"]);
    assert_eq!(served[1], ["[384]", "[120]", "[60]"]);
}

#[test]
fn a_lone_job_waits_for_company_only_within_the_batch_wait() {
    let mut state = state(1.0, 1);
    let _answers = queue(&mut state, QueueOrder::ShortestFirst, &[(ENGLISH, &[20])]);
    let wait = Duration::from_secs(60);
    assert!(state.take_batch(0, &CheckpointName::ALL, &general(), wait).is_none());
    assert!(
        state
            .batch_wait_left(&CheckpointName::ALL, wait)
            .is_some_and(|d| d > Duration::from_secs(59))
    );
    // A worker that does not serve the checkpoint never takes it.
    assert!(
        state
            .take_batch(0, &[CheckpointName::Multilingual], &general(), Duration::ZERO)
            .is_none()
    );
    let batch = state.take_batch(0, &CheckpointName::ALL, &general(), Duration::ZERO);
    assert_eq!(batch.map(|b| b.len()), Some(1));
}

#[test]
fn a_full_queue_refuses_with_the_backlog_as_retry_after_and_withdrawn_jobs_leave_it() {
    // One token takes a second: each 10-token job is expected to take 10 s.
    let mut state = state(1000.0, 1);
    let job = job(ENGLISH, &[10]);
    let forward = forward(&job);
    let policy = policy(QueueOrder::ShortestFirst);
    let kept = state
        .push(job.clone(), forward, Some(Route::Preferred), 2, &policy)
        .expect("queued");
    let withdrawn = state.push(job.clone(), forward, None, 2, &policy).expect("queued");
    match state.push(job, forward, Some(Route::Fallback), 2, &policy) {
        Err(BackendError::Overloaded { retry_after }) => {
            assert!(retry_after > Duration::from_millis(19_900) && retry_after <= Duration::from_secs(20));
        }
        other => panic!("expected Overloaded, got {other:?}"),
    }
    // The second is a probe's copy: counted apart from the routes.
    assert_eq!(
        (
            state.routed.preferred,
            state.routed.spilled,
            state.routed.fallback,
            state.probes
        ),
        (1, 0, 0, 1)
    );
    drop(withdrawn);
    state.drop_abandoned();
    assert_eq!(state.queue.len(), 1);
    drop(kept);
    state.drop_abandoned();
    assert!(state.queue.is_empty());
}

#[test]
fn expected_starts_book_running_and_earlier_queued_work_on_the_first_free_worker() {
    let mut state = state(1.0, 2);
    assert_eq!(State::default().backlog(), None, "no ready worker");
    assert_eq!(state.backlog(), Some(Duration::ZERO), "idle");
    // A forward expected to take an hour, just started, on worker 0; worker 1 is free.
    state.running.insert(0, (Instant::now(), Duration::from_secs(3600)));
    let _answers = queue(
        &mut state,
        QueueOrder::ShortestFirst,
        &[(ENGLISH, &[30]), (ENGLISH, &[50])],
    );
    // Both queued jobs go to worker 1, one after the other.
    assert_eq!(state.backlog(), Some(80 * MS));
    let now = Instant::now();
    assert_eq!(state.start_for(now), Some(Duration::ZERO), "served before both");
    assert_eq!(state.start_for(state.queue[0].priority), Some(30 * MS));
    assert_eq!(state.start_for(now + Duration::from_secs(60)), Some(80 * MS));
}

#[test]
fn starting_a_batch_records_its_expected_time_and_the_waits_per_class() {
    let mut state = state_with_overhead(100.0, 1.0, 1);
    let _answers = queue(
        &mut state,
        QueueOrder::ShortestFirst,
        &[(ENGLISH, &[60]), (ENGLISH, &[64])],
    );
    let batch = state
        .take_batch(0, &CheckpointName::ALL, &general(), Duration::ZERO)
        .expect("batch");
    assert_eq!(
        forward_of(&batch),
        ForwardShape {
            rows: 2,
            padded_len: 64
        }
    );
    let expected = state.running[&0].1.as_secs_f64() * 1000.0;
    assert!(
        (expected - 228.0).abs() < 1e-6,
        "100 ms + 2 rows of 64 tokens at 1 ms: {expected}"
    );
    let waits = state.waits.summary();
    assert_eq!((waits.len(), waits[0].class.name(), waits[0].jobs), (1, "single-64", 2));
    // A lost batch goes back in service order.
    state.requeue(batch);
    assert_eq!(queued(&state), ["[60]", "[64]"]);
    let batch = state
        .take_batch(0, &CheckpointName::ALL, &general(), Duration::ZERO)
        .expect("batch");
    assert_eq!(batch.len(), 2);
}

#[test]
fn an_idle_peer_takes_the_first_job_it_holds_and_would_finish_earlier() {
    // The general pool's one worker has a forward with 200 ms left; a long job and two short ones
    // wait, in arrival order.
    let mut general_state = state(1.0, 1);
    general_state.running.insert(0, (Instant::now(), 200 * MS));
    let _answers = queue(
        &mut general_state,
        QueueOrder::Arrival,
        &[(ENGLISH, &[384]), (ENGLISH, &[60]), (ENGLISH, &[64])],
    );
    // 100 ms per forward there, plus 1 ms per token: sharing a forward saves time.
    let peer_ms = |_: CheckpointName, f: ForwardShape| MS * (100 + f.tokens() as u32);
    let taken = general_state
        .take_for_peer("general", &CheckpointName::ALL, &short_pool(), peer_ms, measured)
        .expect("taken");
    // The long job does not fit the short pool; both short ones share the peer's forward.
    assert_eq!(ids(&taken), ["[60]", "[64]"]);
    let over = taken[0].taken_over.as_ref().expect("marked");
    assert_eq!(over.from, "general");
    let would_start = over.would_start.expect("a ready worker");
    assert!(would_start > 580 * MS && would_start <= 584 * MS, "{would_start:?}");
    assert_eq!(taken[1].estimate, 164 * MS, "estimated on the peer");
    assert_eq!(queued(&general_state), ["[384]"]);
    assert_eq!(general_state.taken, (0, 2));
    // Only one checkpoint served by the peer's worker: none of the others.
    let _more = queue(
        &mut general_state,
        QueueOrder::Arrival,
        &[(CheckpointName::Multilingual, &[60])],
    );
    assert!(
        general_state
            .take_for_peer("general", &[ENGLISH], &short_pool(), peer_ms, measured)
            .is_none()
    );
}

#[test]
fn a_peer_takes_nothing_a_free_worker_here_starts_at_once_or_it_would_finish_later() {
    let peer_ms = |_: CheckpointName, f: ForwardShape| MS * f.tokens() as u32;
    let mut idle = state(1.0, 1);
    let _answers = queue(&mut idle, QueueOrder::Arrival, &[(ENGLISH, &[60])]);
    assert!(
        idle.take_for_peer("general", &CheckpointName::ALL, &short_pool(), peer_ms, measured)
            .is_none(),
        "the free worker here takes it"
    );
    let mut busy = state(1.0, 1);
    busy.running.insert(0, (Instant::now(), 20 * MS));
    let _answers = queue(&mut busy, QueueOrder::Arrival, &[(ENGLISH, &[60])]);
    let slow_peer = |_: CheckpointName, f: ForwardShape| 10 * MS * f.tokens() as u32;
    assert!(
        busy.take_for_peer("general", &CheckpointName::ALL, &short_pool(), slow_peer, measured)
            .is_none(),
        "600 ms there against 80 ms here"
    );
    // Without a ready worker here, any capable peer is sooner.
    let mut stalled = state(1.0, 0);
    let _answers = queue(&mut stalled, QueueOrder::Arrival, &[(ENGLISH, &[60])]);
    let taken = stalled
        .take_for_peer("general", &CheckpointName::ALL, &short_pool(), slow_peer, measured)
        .expect("taken");
    assert_eq!(taken[0].taken_over.as_ref().map(|t| t.would_start), Some(None));
}

#[test]
fn a_forward_past_its_estimate_keeps_its_worker_busy_for_as_long_again() {
    let mut state = state(1.0, 1);
    // Expected to take 100 ms, running for 400 ms: 300 ms overrun, so 300 ms more.
    let started = Instant::now() - 400 * MS;
    state.running.insert(0, (started, 100 * MS));
    let backlog = state.backlog().expect("a ready worker");
    assert!(backlog >= 300 * MS && backlog < 400 * MS, "{backlog:?}");
    // Just at its estimate: busy for at least another millisecond, never "free now".
    state.running.insert(0, (Instant::now(), Duration::ZERO));
    assert!(state.backlog() >= Some(MS));
}

/// Queues `job` as `push` would had it arrived at `at` (a virtual clock), in `policy`'s order.
fn arrive(state: &mut State, job: Job, at: Instant, policy: &QueuePolicy) -> Answer {
    let forward = forward(&job);
    let estimate = state.model.estimate(job.checkpoint, forward);
    let (reply, receiver) = oneshot::channel();
    state.next_seq += 1;
    let entry = Entry {
        priority: policy.priority(at, estimate, job.deadline),
        job,
        forward,
        estimate,
        enqueued: at,
        seq: state.next_seq,
        attempts: 0,
        solo: false,
        taken_over: None,
        reply,
    };
    state.insert(entry);
    receiver
}

/// One worker (one job per forward, each taking its estimate) serving a 30 ms job every 25 ms from
/// 0 on and a 200 ms job arriving at 1 ms: more short work than the worker can do, so short jobs
/// alone would keep it busy forever. Returns when the long job started (`None`: not within
/// `horizon`) and the arrival times of the short jobs that started before it.
fn long_job_under_a_stream_of_short_ones(policy: &QueuePolicy, horizon: Duration) -> (Option<Duration>, Vec<Duration>) {
    let mut state = state(1.0, 1);
    let mut one_row = general();
    one_row.max_rows = 1;
    let t0 = Instant::now() + Duration::from_secs(1);
    let mut arrivals = std::iter::once((Duration::ZERO, 30))
        .chain(std::iter::once((MS, 200)))
        .chain((1..).map(|i| (i * 25 * MS, 30)))
        .peekable();
    let mut answers = Vec::new();
    let mut free = Duration::ZERO;
    let mut passed = Vec::new();
    while free < horizon {
        while let Some(&(at, len)) = arrivals.peek().filter(|(at, _)| *at <= free) {
            answers.push(arrive(&mut state, job(ENGLISH, &[len]), t0 + at, policy));
            arrivals.next();
        }
        let Some(batch) = state.take_batch(0, &CheckpointName::ALL, &one_row, Duration::ZERO) else {
            // Idle until the next arrival.
            free = arrivals.peek().map_or(horizon, |&(at, _)| at);
            continue;
        };
        let entry = &batch[0];
        if entry.job.rows[0].ids.len() == 200 {
            return (Some(free), passed);
        }
        passed.push(entry.enqueued.duration_since(t0));
        free += entry.estimate;
    }
    (None, passed)
}

#[test]
fn aging_bounds_how_long_a_long_job_waits_behind_a_stream_of_short_ones() {
    let horizon = Duration::from_secs(20);
    let aging = policy(QueueOrder::ShortestFirst);
    let (start, passed) = long_job_under_a_stream_of_short_ones(&aging, horizon);
    let start = start.expect("the long job starts");
    // Its priority: 10 × 200 ms after it arrived (at 2001 ms). Only short jobs whose own priority
    // (arrival + 10 × 30 ms) comes earlier pass it: the 69 that arrived by 1700 ms, 2.07 s of work;
    // none that arrived after it had waited 2 s. Unbounded short work delays it by at most that.
    let aged = 2001 * MS;
    assert!(passed.iter().all(|&at| at + 300 * MS < aged), "{passed:?}");
    assert_eq!(passed.len(), 69);
    assert_eq!(start, 69 * 30 * MS);
    assert!(start <= aged + aged, "started after {start:?}");
    // Without aging (a bound far beyond the horizon) it starves; in arrival order it goes first.
    let no_aging = QueuePolicy {
        order: QueueOrder::ShortestFirst,
        aging: 1000.0,
    };
    assert_eq!(long_job_under_a_stream_of_short_ones(&no_aging, horizon).0, None);
    let arrival = policy(QueueOrder::Arrival);
    assert_eq!(
        long_job_under_a_stream_of_short_ones(&arrival, horizon).0,
        Some(30 * MS)
    );
}

#[test]
fn a_job_near_its_deadline_goes_before_shorter_ones_that_can_wait() {
    let mut state = state(1.0, 1);
    let aging = policy(QueueOrder::ShortestFirst);
    let t0 = Instant::now() + Duration::from_secs(1);
    let mut urgent = job(ENGLISH, &[200]);
    // Due 300 ms after it arrives: it must start within 100 ms, before 10 × 200 ms of aging.
    urgent.deadline = t0 + 300 * MS;
    let _answers = [
        arrive(&mut state, job(ENGLISH, &[30]), t0, &aging),
        arrive(&mut state, urgent, t0 + MS, &aging),
        arrive(&mut state, job(ENGLISH, &[40]), t0 + 2 * MS, &aging),
    ];
    assert_eq!(queued(&state), ["[200]", "[30]", "[40]"]);
}

#[test]
fn a_short_pool_runs_single_questions_that_arrive_together_in_one_forward() {
    let mut state = state_with_overhead(100.0, 1.0, 1);
    let _answers = queue(
        &mut state,
        QueueOrder::ShortestFirst,
        &[(ENGLISH, &[40]), (ENGLISH, &[44]), (ENGLISH, &[36]), (ENGLISH, &[120])],
    );
    let batch = state
        .take_batch(0, &CheckpointName::ALL, &short_pool(), Duration::ZERO)
        .expect("a batch");
    // Shortest first, and the three of similar length share a forward; 120 tokens would triple it.
    assert_eq!(ids(&batch), ["[36]", "[40]", "[44]"]);
    assert_eq!(
        forward_of(&batch),
        ForwardShape {
            rows: 3,
            padded_len: 44
        }
    );
    assert_eq!(queued(&state), ["[120]"]);
}

#[test]
fn an_untried_batch_size_is_tried_once_then_its_measured_time_decides() {
    // A CPU: two rows cost twice one, so a batch only makes its first job wait for the others. The
    // 2-row size was never measured: the first batch tries it (one size at a time), and once it is
    // measured at twice one row, jobs run apart.
    let mut state = state(1.0, 1);
    let row: &[usize] = &[64];
    let _answers = queue(&mut state, QueueOrder::ShortestFirst, &[(ENGLISH, row); 20]);
    arrived_long_ago(&mut state);
    let batch = state
        .take_batch(0, &CheckpointName::ALL, &general(), Duration::ZERO)
        .expect("a batch");
    assert_eq!(batch.len(), 2, "the 2-row size is tried, not a third row besides");
    state
        .model
        .observe(ENGLISH, forward_of(&batch), 128 * MS, Instant::now());
    state.running.clear();
    let batch = state
        .take_batch(0, &CheckpointName::ALL, &general(), Duration::ZERO)
        .expect("a batch");
    assert_eq!(batch.len(), 1);
}

#[test]
fn a_small_saving_is_worth_a_batch_only_behind_a_deep_queue() {
    // 8 ms per forward + 1 ms per token: a second 64-token row adds 64 ms and saves 8. Joining costs
    // the jobs already in the batch what it adds, each, and saves the rest for itself and each job
    // behind it.
    let take = |queued: usize, workers: usize| {
        let mut state = state_with_overhead(8.0, 1.0, workers);
        for rows in [1, 2, 4] {
            measure(&mut state, rows);
        }
        let row: &[usize] = &[64];
        let _answers = queue(&mut state, QueueOrder::ShortestFirst, &vec![(ENGLISH, row); queued]);
        arrived_long_ago(&mut state);
        let batch = state
            .take_batch(0, &CheckpointName::ALL, &general(), Duration::ZERO)
            .expect("a batch");
        batch.len()
    };
    assert_eq!(take(5, 1), 1, "3 behind the second: 64 ms lost against 4 x 8 saved");
    // 20 queued: the second joins (64 < 8 x 19); the third adds 62 ms (3 rows cost three quarters
    // of the 4-row band's 264 ms) and saves 10 (2 x 62 < 10 x 18); a fourth adds 66 and saves 6.
    assert_eq!(take(20, 1), 3);
    // Shared among two workers, the same queue is half as deep for each.
    assert_eq!(take(20, 2), 2, "64 < 8 x (1 + 18 / 2), 2 x 62 > 10 x (1 + 17 / 2)");
}

#[test]
fn joining_a_batch_weighs_the_members_delay_against_the_time_saved() {
    // A GPU row: 2 ms more in a batch, 20 ms alone; worth it for up to 8 members with nothing behind.
    assert!(joins_batch(2 * MS, 20 * MS, 8, 0.0));
    assert!(!joins_batch(2 * MS, 20 * MS, 9, 0.0));
    // Costing as much as it saves never is; costing more never is, however deep the queue.
    assert!(!joins_batch(20 * MS, 20 * MS, 1, 1000.0));
    assert!(!joins_batch(30 * MS, 20 * MS, 1, 1000.0));
    // Free rows always join.
    assert!(joins_batch(Duration::ZERO, 20 * MS, 63, 0.0));
}

#[test]
fn the_offered_load_is_the_recent_work_alone_per_ready_worker() {
    // 64-token jobs of 64 ms each: ten of them are 0.64 s of work for one worker.
    let mut state = state(1.0, 1);
    let row: &[usize] = &[64];
    let _answers = queue(&mut state, QueueOrder::ShortestFirst, &[(ENGLISH, row); 10]);
    let now = Instant::now();
    assert!(
        (state.offered_load(now) - 0.64).abs() < 1e-6,
        "{}",
        state.offered_load(now)
    );
    // Work already run counts as much as work queued: it is the rate at which work comes.
    state.queue.clear();
    assert!((state.offered_load(now) - 0.64).abs() < 1e-6);
    // A second worker halves each one's share; a window later nothing recent is left.
    state.ready.insert(1, state.ready[&0].clone());
    assert!((state.offered_load(now) - 0.32).abs() < 1e-6);
    assert_eq!(state.offered_load(now + LOAD_WINDOW), 0.0);
}

#[test]
fn a_saturated_pool_batches_for_the_most_work_per_second_even_with_nobody_behind() {
    // 20 ms per forward + 1 ms per token: a 64-token row alone 84 ms; 2 rows 148 ms, 4 rows 276:
    // 1.14 and 1.22 times the work a second of one row at a time.
    let measured_pool = || {
        let mut state = state_with_overhead(20.0, 1.0, 1);
        for rows in [1, 2, 4] {
            measure(&mut state, rows);
        }
        state
    };
    let mut state = measured_pool();
    let row: &[usize] = &[64];
    // Twelve arrived within the second (1.01 s of work alone); nine of them ran already.
    let _answers = queue(&mut state, QueueOrder::ShortestFirst, &[(ENGLISH, row); 12]);
    state.queue.truncate(3);
    let batch = state
        .take_batch(0, &CheckpointName::ALL, &general(), Duration::ZERO)
        .expect("a batch");
    assert_eq!(
        batch.len(),
        3,
        "3 rows cost 207 ms (the 4-row band's per token) for 252 ms of work"
    );
    // The same three jobs without the arrivals before them: the second would add 64 ms to the
    // first's 84 and save 20 for itself and the one behind it. Rows run apart.
    let mut state = measured_pool();
    let _answers = queue(&mut state, QueueOrder::ShortestFirst, &[(ENGLISH, row); 3]);
    let batch = state
        .take_batch(0, &CheckpointName::ALL, &general(), Duration::ZERO)
        .expect("a batch");
    assert_eq!(batch.len(), 1);
}

#[test]
fn throughput_batches_try_each_unmeasured_size_then_take_the_largest_near_the_best_rate() {
    let prefix = |jobs: usize, rate: f64, measured: bool| Prefix {
        jobs,
        alone: Duration::from_secs_f64(0.1 * jobs as f64),
        together: Duration::from_secs_f64(0.1 * jobs as f64 / rate),
        measured,
    };
    // The first size never measured is tried, whatever the measured ones say.
    let sizes = [
        prefix(1, 1.0, true),
        prefix(2, 1.3, true),
        prefix(3, 0.5, false),
        prefix(4, 1.0, false),
    ];
    assert_eq!(throughput_size(&sizes), Some(3));
    // The first job's own forward unmeasured: no rate to compare with.
    assert_eq!(throughput_size(&[prefix(1, 1.0, false), prefix(2, 1.5, true)]), None);
    // Under 5% more work a second: not worth a batch.
    assert_eq!(throughput_size(&[prefix(1, 1.0, true), prefix(2, 1.04, true)]), None);
    // The best rate is 1.30; 1.29 is within 2% of it and carries a job more; 1.20 is not.
    let sizes = [
        prefix(1, 1.0, true),
        prefix(2, 1.1, true),
        prefix(3, 1.3, true),
        prefix(4, 1.29, true),
        prefix(5, 1.2, true),
    ];
    assert_eq!(throughput_size(&sizes), Some(4));
}

/// One worker that has measured a one-row 64-token forward: the state, that shape, its estimate.
fn one_row_measured() -> (State, ForwardShape, Duration) {
    let mut state = state(1.0, 1);
    let shape = ForwardShape {
        rows: 1,
        padded_len: 64,
    };
    measure(&mut state, 1);
    let normal = state.model.estimate(ENGLISH, shape);
    (state, shape, normal)
}

#[test]
fn a_slowed_pool_is_due_a_probe_only_while_idle_and_after_a_pause_or_to_confirm_a_recovery() {
    use crate::pool::estimate::CONFIRM;
    let (mut state, shape, normal) = one_row_measured();
    let (t0, every, now) = (Instant::now(), 250 * MS, Some(Duration::ZERO));
    assert!(
        !state.probe_due(now, normal, every, t0),
        "a pool at its normal speed is no probe"
    );
    // One slow forward: the next job's copy confirms it, the job itself expects the slow speed.
    state.model.observe(ENGLISH, shape, normal * 4, t0);
    assert!(state.probe_due(now, normal, every, t0) && !state.model.speed().slowed());
    assert_eq!(state.model.estimate(ENGLISH, shape), normal * 4);
    for _ in 1..CONFIRM {
        state.model.observe(ENGLISH, shape, normal * 4, t0);
    }
    assert!(state.model.speed().slowed());
    let slow = state.model.estimate(ENGLISH, shape);
    assert_eq!(slow, normal * 4);
    // Never started a forward: due at once.
    assert!(state.probe_due(now, slow, every, t0));
    // 256 ms a forward: the pause is twice that, longer than `every`.
    state.last_start = Some(t0);
    let pause = 2 * slow;
    assert!(!state.probe_due(now, slow, every, t0 + pause - MS));
    assert!(state.probe_due(now, slow, every, t0 + pause));
    assert!(
        !state.probe_due(Some(MS), slow, every, t0 + pause),
        "a busy pool is not probed"
    );
    // One forward at the normal speed again: the next job confirms it, whatever the pause.
    state.model.observe(ENGLISH, shape, normal, t0);
    assert!(state.probe_due(now, slow, every, t0));
}

#[test]
fn a_pool_whose_estimate_says_minutes_is_probed_every_few_seconds_and_recovers() {
    use crate::pool::estimate::CONFIRM;
    use crate::pool::queue::PROBE_MAX_GAP;
    let (mut state, shape, normal) = one_row_measured();
    let (t0, every, now) = (Instant::now(), 250 * MS, Some(Duration::ZERO));
    // Two forwards delayed by a busy machine, thousands of times their normal time.
    let factor = (60.0 / normal.as_secs_f64()).max(1000.0);
    for _ in 0..CONFIRM {
        state.model.observe(ENGLISH, shape, normal.mul_f64(factor), t0);
    }
    let inflated = state.model.estimate(ENGLISH, shape);
    assert!(inflated >= Duration::from_secs(60), "{inflated:?}");
    // Twice the estimate would be two minutes; the gap is capped.
    state.last_start = Some(t0);
    assert!(!state.probe_due(now, inflated, every, t0 + PROBE_MAX_GAP - MS));
    assert!(state.probe_due(now, inflated, every, t0 + PROBE_MAX_GAP));
    // The probes run at the normal speed: the first asks for the next at once, the next confirms.
    state.model.observe(ENGLISH, shape, normal, t0);
    assert!(state.probe_due(now, inflated, every, t0));
    for _ in 1..CONFIRM {
        state.model.observe(ENGLISH, shape, normal, t0);
    }
    assert!(!state.model.speed().slowed());
    assert_eq!(state.model.estimate(ENGLISH, shape), normal);
}

/// A pool of one worker, 20 ms a forward + 1 ms a token (a 64-token row alone 84 ms, so a hold is
/// at most 8.4 ms), every batch size measured, saturated (twelve 64-token jobs arrived within the
/// second: 1.01 s of work alone), one job still queued.
fn saturated_with_one_queued() -> (State, Vec<Answer>) {
    let mut state = state_with_overhead(20.0, 1.0, 1);
    for rows in [1, 2, 4, 8] {
        measure(&mut state, rows);
    }
    let answers = queue(&mut state, QueueOrder::Arrival, &[(ENGLISH, &[64][..]); 12]);
    state.queue.truncate(1);
    (state, answers)
}

/// Three saturated forwards of one whose clients each came back within the hold's reach: the pool
/// now counts on its clients returning.
fn clients_came_back(state: &mut State) {
    for _ in 0..3 {
        state.returns.answered(Instant::now(), 1);
        state.returns.arrived(Instant::now());
    }
}

/// How many jobs worker 0's next forward takes, `None` while it is held.
fn take_next(state: &mut State) -> Option<usize> {
    state
        .take_batch(0, &CheckpointName::ALL[..], &general(), Duration::ZERO)
        .map(|b| b.len())
}

#[test]
fn a_saturated_pool_holds_its_next_forward_for_the_clients_it_just_answered() {
    let all = &CheckpointName::ALL[..];
    let (mut state, _answers) = saturated_with_one_queued();
    clients_came_back(&mut state);
    // Worker 0's forward of seven, taken while the pool was saturated, just answered: their clients
    // are about to send again.
    state.saturated_forwards.insert(0);
    state.answered(0, 7, Instant::now());
    assert_eq!(take_next(&mut state), None, "held for the seven");
    let left = state.batch_wait_left(all, Duration::ZERO).expect("a job waits");
    assert!(
        left > Duration::ZERO && left <= Duration::from_micros(8_400),
        "{left:?}"
    );
    // Six are back: seven wait, as many as were answered, but the seventh client is still coming
    // (starting now would leave it to a forward of its own, and 5 + 3 or 7 + 1 forever).
    let _six = queue(&mut state, QueueOrder::Arrival, &[(ENGLISH, &[64][..]); 6]);
    assert_eq!(take_next(&mut state), None, "held for the seventh");
    // It comes back: the held job starts with all seven.
    let _seventh = queue(&mut state, QueueOrder::Arrival, &[(ENGLISH, &[64][..]); 1]);
    assert_eq!(take_next(&mut state), Some(8));
    assert_eq!(
        state.batch_wait_left(all, Duration::ZERO),
        None,
        "nothing held after the forward"
    );
    assert!(state.saturated_forwards.contains(&0), "taken while saturated");

    // The hold is over (the answer was 9 ms ago): the lone job starts alone.
    let (mut state, _answers) = saturated_with_one_queued();
    clients_came_back(&mut state);
    state.saturated_forwards.insert(0);
    state.answered(0, 7, Instant::now().checked_sub(9 * MS).expect("9 ms after boot"));
    assert_eq!(take_next(&mut state), Some(1));
    // Two clients taking turns: a forward of one answered while the other's job waited. Held for
    // the one answered, then both start together.
    let (mut state, _answers) = saturated_with_one_queued();
    clients_came_back(&mut state);
    state.saturated_forwards.insert(0);
    state.answered(0, 1, Instant::now());
    assert_eq!(take_next(&mut state), None, "held for the one answered");
    let _back = queue(&mut state, QueueOrder::Arrival, &[(ENGLISH, &[64][..]); 1]);
    assert_eq!(take_next(&mut state), Some(2));
    // A forward taken while the pool was not saturated: its jobs' clients are not counted on.
    let (mut state, _answers) = saturated_with_one_queued();
    clients_came_back(&mut state);
    state.answered(0, 7, Instant::now());
    assert_eq!(take_next(&mut state), Some(1));
    arrived_long_ago(&mut state);
    let _again = queue(&mut state, QueueOrder::Arrival, &[(ENGLISH, &[64][..]); 1]);
    arrived_long_ago(&mut state);
    assert_eq!(take_next(&mut state), Some(1));
    assert!(!state.saturated_forwards.contains(&0), "taken while not saturated");
}

#[test]
fn a_pool_is_held_only_for_clients_that_have_been_coming_back() {
    let all = &CheckpointName::ALL[..];
    let (mut state, _answers) = saturated_with_one_queued();
    // A saturated forward answered, but nothing shows yet that clients come back (an open-loop
    // burst): the job waiting is not held.
    state.saturated_forwards.insert(0);
    state.answered(0, 4, Instant::now());
    assert_eq!(state.batch_wait_left(all, Duration::ZERO), Some(Duration::ZERO));
    // Closed-loop clients: each answer is followed by its clients' requests (the share of returning
    // clients 0 → 0.25 → 0.44 → 0.58); from a half on, the pool holds for them.
    for held in [false, false, false, true] {
        state.saturated_forwards.insert(0);
        state.answered(0, 2, Instant::now());
        assert_eq!(
            state.batch_wait_left(all, Duration::ZERO) > Some(Duration::ZERO),
            held,
            "{:?}",
            state.returns
        );
        let _back = queue(&mut state, QueueOrder::Arrival, &[(ENGLISH, &[64][..]); 2]);
        state.queue.truncate(1);
    }
    // Open-loop traffic again: forwards of four answered and nothing arrived after any of them
    // (0.68 → 0.51 → 0.38): the hold stops.
    for held in [true, true, false] {
        state.saturated_forwards.insert(0);
        state.answered(0, 4, Instant::now());
        assert_eq!(take_next(&mut state).is_none(), held, "{:?}", state.returns);
    }
}
