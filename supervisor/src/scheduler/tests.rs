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
    }
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
    // Idle, it keeps the job even when the other pool's estimate is lower.
    let mut views = short_and_general(SHORT, Some(10), Some(5));
    views[0].idle = true;
    let placement = place(&views, SHORT, true, HOUR).expect("placed");
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
