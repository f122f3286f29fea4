//! Placement as a pure function of what the pools report: shape routing, spill by expected finish,
//! fallback, admission by deadline, and the route of a job another pool took over.

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
        // The service estimate is 10 ms: idle when its expected completion is that alone.
        start: expected_ms.map(|ms| Duration::from_millis(ms.saturating_sub(10))),
        idle: expected_ms == Some(10),
        expected: expected_ms.map(Duration::from_millis),
        service: Duration::from_millis(10),
        measured: true,
        probe: false,
        speed: 1.0,
        slowed: false,
    }
}

/// A pool that would start the job at once and finish it in `service_ms`.
fn idle(view: &mut PoolView, service_ms: u64) {
    let service = Duration::from_millis(service_ms);
    (view.start, view.expected, view.service, view.idle) = (Some(Duration::ZERO), Some(service), service, true);
    view.ready = 1;
}

fn short_and_general(shape: JobShape, short_ms: Option<u64>, general_ms: Option<u64>) -> Vec<PoolView> {
    // The general pool comes first in the configuration: order must not matter.
    vec![
        view("general", caps(64, None), shape, general_ms),
        view("short", caps(1, Some(128)), shape, short_ms),
    ]
}

/// Time left before the deadline, when it does not matter.
const HOUR: Duration = Duration::from_secs(3600);

const SHORT: JobShape = JobShape {
    questions: 1,
    longest: 60,
};

#[test]
fn a_short_single_question_prefers_the_short_pool() {
    let placement = place(&short_and_general(SHORT, Some(10), Some(10)), SHORT, true, HOUR).expect("placed");
    assert_eq!((placement.pool, placement.route), (1, Route::Preferred));
    assert!(placement.reason.contains("most specialised"), "{}", placement.reason);
    // Idle, it keeps the job when the other pool would finish it sooner by less than TIE.
    let mut views = short_and_general(SHORT, Some(10), None);
    idle(&mut views[0], 9);
    let placement = place(&views, SHORT, true, HOUR).expect("placed");
    assert_eq!((placement.pool, placement.route), (1, Route::Preferred));
}

#[test]
fn an_idle_slowed_pool_loses_to_a_busy_one_that_finishes_first() {
    // The short pool's device at a quarter of its speed: 140 ms, idle. The general pool is busy
    // but would finish the job in 60 ms.
    let mut views = short_and_general(SHORT, None, Some(60));
    idle(&mut views[1], 140);
    (views[1].speed, views[1].slowed) = (4.0, true);
    let placement = place(&views, SHORT, true, HOUR).expect("placed");
    assert_eq!(
        (placement.pool, placement.route, placement.spilled_from),
        (0, Route::Spilled, Some(1))
    );
    assert!(
        placement.reason.contains("its device at 4.0× its normal time"),
        "{}",
        placement.reason
    );
    assert_eq!(placement.alternatives, vec![1]);
    // Finishing later than 140 ms / TIE there, it stays.
    views[0].expected = Some(Duration::from_millis(115));
    assert_eq!(place(&views, SHORT, true, HOUR).expect("placed").pool, 1);
    views[0].expected = Some(Duration::from_millis(110));
    assert_eq!(place(&views, SHORT, true, HOUR).expect("placed").pool, 0);
    // A slowdown is measured: the other pool's estimate may still be a warm-up guess...
    views[0].measured = false;
    assert_eq!(place(&views, SHORT, true, HOUR).expect("placed").pool, 0);
    // ...but a guess never moves a job off an idle pool at its normal speed.
    (views[1].speed, views[1].slowed) = (1.0, false);
    assert_eq!(place(&views, SHORT, true, HOUR).expect("placed").pool, 1);
    views[0].measured = true;
    assert_eq!(place(&views, SHORT, true, HOUR).expect("placed").pool, 0);
    // Spill off keeps it where it belongs.
    assert_eq!(place(&views, SHORT, false, HOUR).expect("placed").pool, 1);
}

#[test]
fn a_slowed_pool_due_a_probe_runs_a_copy_while_the_job_goes_where_it_finishes_first() {
    let mut views = short_and_general(SHORT, None, Some(10));
    idle(&mut views[1], 140);
    (views[1].speed, views[1].slowed, views[1].probe) = (4.0, true, true);
    let placed = place(&views, SHORT, true, HOUR).expect("placed");
    assert_eq!((placed.pool, placed.route, placed.probe), (0, Route::Spilled, Some(1)));
    assert!(
        placed
            .reason
            .ends_with("; a copy probes 'short', whose device runs at 4.0× its normal time"),
        "{}",
        placed.reason
    );
    // A probe that would miss the deadline is not run.
    let placed = place(&views, SHORT, true, Duration::from_millis(100)).expect("placed");
    assert_eq!((placed.pool, placed.probe), (0, None));
    // The slowed pool need not be the preferred one: a general pool is probed by short jobs too.
    let mut views = short_and_general(SHORT, Some(10), None);
    idle(&mut views[0], 140);
    (views[0].speed, views[0].slowed, views[0].probe) = (4.0, true, true);
    let placed = place(&views, SHORT, true, HOUR).expect("placed");
    assert_eq!(
        (placed.pool, placed.route, placed.probe),
        (1, Route::Preferred, Some(0))
    );
    // Not due, or spill off: no copy.
    views[0].probe = false;
    assert_eq!(place(&views, SHORT, true, HOUR).expect("placed").probe, None);
    views[0].probe = true;
    assert_eq!(place(&views, SHORT, false, HOUR).expect("placed").probe, None);
    // A job the slowed pool alone can hold runs there, and is no probe.
    let multi = JobShape {
        questions: 4,
        longest: 60,
    };
    let mut views = short_and_general(multi, None, Some(10));
    idle(&mut views[0], 140);
    (views[0].speed, views[0].slowed, views[0].probe) = (4.0, true, true);
    let placed = place(&views, multi, true, HOUR).expect("placed");
    assert_eq!((placed.pool, placed.route, placed.probe), (0, Route::Preferred, None));
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
        let placement = place(&short_and_general(shape, Some(1), Some(500)), shape, true, HOUR).expect("placed");
        assert_eq!((placement.pool, placement.route), (0, Route::Preferred), "{shape:?}");
        assert!(placement.reason.contains("only pool"), "{}", placement.reason);
        assert!(placement.alternatives.is_empty());
    }
}

#[test]
fn a_backed_up_short_pool_spills_only_when_strictly_later() {
    let spilled = place(&short_and_general(SHORT, Some(80), Some(30)), SHORT, true, HOUR).expect("placed");
    assert_eq!((spilled.pool, spilled.route), (0, Route::Spilled));
    assert_eq!(spilled.spilled_from, Some(1));
    assert!(spilled.reason.starts_with("spilled from 'short'"), "{}", spilled.reason);
    let tie = place(&short_and_general(SHORT, Some(30), Some(30)), SHORT, true, HOUR).expect("placed");
    assert_eq!((tie.pool, tie.route), (1, Route::Preferred));
    let off = place(&short_and_general(SHORT, Some(80), Some(30)), SHORT, false, HOUR).expect("placed");
    assert_eq!((off.pool, off.route), (1, Route::Preferred));
    assert!(off.alternatives.is_empty(), "no spill: a full queue answers 503");
}

#[test]
fn an_unavailable_preferred_pool_falls_back_and_says_why() {
    let mut views = short_and_general(SHORT, None, Some(30));
    views[1].unavailable = Some("Core ML is not available on linux".to_owned());
    let placement = place(&views, SHORT, true, HOUR).expect("placed");
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
    let placement = place(&short_and_general(SHORT, None, None), SHORT, true, HOUR).expect("queued");
    assert_eq!((placement.pool, placement.route), (1, Route::Fallback));
    let huge = JobShape {
        questions: 65,
        longest: 60,
    };
    let error = place(&short_and_general(huge, Some(1), Some(1)), huge, true, HOUR).expect_err("nowhere");
    assert!(
        matches!(&error, BackendError::NoCapablePool(why) if why.contains("'general' takes at most 64 question(s)")),
        "{error:?}"
    );
}

#[test]
fn a_job_no_pool_would_finish_before_its_deadline_is_refused_with_how_late_it_would_be() {
    let ms = Duration::from_millis;
    // Short pool: done in 900 ms; general: in 400 ms. With 500 ms left, spilling makes it.
    let views = short_and_general(SHORT, Some(900), Some(400));
    let placed = place(&views, SHORT, true, ms(500)).expect("fits via the general pool");
    assert_eq!((placed.pool, placed.route), (0, Route::Spilled));
    // Without spill only the short pool counts: 400 ms too late.
    assert_eq!(
        place(&views, SHORT, false, ms(500)).err(),
        Some(BackendError::TooLate {
            expected: ms(900),
            late: ms(400)
        })
    );
    assert_eq!(
        place(&views, SHORT, true, ms(300)).err(),
        Some(BackendError::TooLate {
            expected: ms(400),
            late: ms(100)
        })
    );
    // No ready worker anywhere: no estimate, so it waits for one instead.
    let placed = place(&short_and_general(SHORT, None, None), SHORT, true, ms(1)).expect("queued");
    assert_eq!(placed.route, Route::Fallback);
}

#[test]
fn an_idle_pool_is_never_refused_on_its_estimate_alone() {
    let ms = Duration::from_millis;
    // One pool, idle, whose estimate says 60 s (a speed factor or a band learnt on a busy machine)
    // with 1 s left: it runs the job, since a refused job would never correct the estimate.
    let mut views = vec![view("cpu", caps(64, None), SHORT, Some(10))];
    idle(&mut views[0], 60_000);
    (views[0].speed, views[0].slowed) = (6000.0, true);
    let placed = place(&views, SHORT, false, ms(1000)).expect("an idle pool runs it");
    assert_eq!((placed.pool, placed.route), (0, Route::Preferred));
    // Busy, the same pool refuses: the backlog is what the refusal is for.
    (views[0].start, views[0].idle) = (Some(ms(5)), false);
    views[0].expected = Some(ms(60_005));
    assert!(matches!(
        place(&views, SHORT, false, ms(1000)),
        Err(BackendError::TooLate { .. })
    ));
    // The soonest finish decides: an idle pool it may spill to runs it; without spill the busy
    // short pool is the only one, and its backlog refuses it.
    let mut views = short_and_general(SHORT, Some(900), None);
    idle(&mut views[0], 300);
    let placed = place(&views, SHORT, true, ms(200)).expect("spills to the idle pool");
    assert_eq!((placed.pool, placed.route), (0, Route::Spilled));
    assert!(matches!(
        place(&views, SHORT, false, ms(200)),
        Err(BackendError::TooLate { .. })
    ));
}

#[test]
fn a_job_another_pool_took_over_says_so() {
    let mut answer = PoolAnswer {
        outputs: Vec::new(),
        pool: "short".into(),
        worker: "short/0".into(),
        device: "cpu".into(),
        queue_wait: Duration::ZERO,
        device_time: Duration::ZERO,
        batch_rows: 1,
        taken_over: None,
    };
    assert_eq!(taken_over_route(&answer), None);
    answer.taken_over = Some(crate::backend::TakenOver {
        from: "general".into(),
        would_start: Some(Duration::from_millis(212)),
    });
    assert_eq!(
        taken_over_route(&answer),
        Some((
            Route::Spilled,
            "taken over from 'general' (expected to start in 212.0 ms) by 'short', whose worker was idle".to_owned()
        ))
    );
}
