//! Property tests of the request path before the model: whatever the body — request-shaped JSON
//! with fields of every type, unicode of every plane, numbers of every size, or arbitrary bytes —
//! it is either prepared into rows that an answer can be rendered from, or refused with a 4xx whose
//! detail names the problem. Never a panic, never a 5xx while every checkpoint is served.

mod support;

use std::cell::Cell;
use std::collections::HashMap;

use laya::checkpoint::Checkpoint;
use laya::decision::{DecisionOptions, RowOutput, prepare, respond};
use laya::request::{RequestLimits, parse_body};
use laya::routing::CheckpointName;
use laya::upstream::Upstream;
use layad_system_tests::request_bodies::{any_body, request_body};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRng, TestRunner};
use serde_json::Value;
use support::open_checkpoints;

/// The whole host path for one body: parse, route, tokenize, then render an answer from neutral
/// model outputs. `Ok(true)` when it was answered, `Ok(false)` when rightly refused.
fn check(
    checkpoints: &HashMap<CheckpointName, Checkpoint>,
    body: &[u8],
    auto_task: bool,
    upstream: Upstream,
) -> Result<bool, TestCaseError> {
    let options = DecisionOptions {
        upstream,
        auto_task,
        limits: RequestLimits::default(),
        default_checkpoint: None,
        output: laya::output::OutputProfile::Laya,
        tournament_group: 0,
    };
    let prepared = parse_body(body, upstream, options.limits)
        .and_then(|request| prepare(&request, |name| checkpoints.get(&name), options));
    let prepared = match prepared {
        Ok(prepared) => prepared,
        Err(refused) => {
            prop_assert!(
                (400..500).contains(&refused.status),
                "refused with {} ({}): only 4xx may come from the request itself",
                refused.status,
                refused.detail
            );
            prop_assert!(
                !refused.detail.trim().is_empty(),
                "a {} without a detail",
                refused.status
            );
            return Ok(false);
        }
    };
    prop_assert_eq!(prepared.rows.len(), prepared.questions.len());
    for row in prepared.rows.iter() {
        prop_assert!(!row.ids.is_empty());
        prop_assert!(!row.markers.is_empty(), "a row with no option markers");
        prop_assert!(
            row.markers.iter().all(|&m| (m as usize) < row.ids.len()),
            "a marker past the row's end"
        );
    }
    let checkpoint = &checkpoints[&prepared.checkpoint()];
    let outputs: Vec<RowOutput> = prepared
        .rows
        .iter()
        .map(|row| RowOutput {
            logits: vec![0.0; row.markers.len()],
            act_probabilities: vec![0.5, 0.5],
        })
        .collect();
    let answer = respond(&prepared, checkpoint, &outputs).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let answers = answer.get("answers").and_then(Value::as_object);
    prop_assert_eq!(answers.map(|a| a.len()), Some(prepared.questions.len()));
    Ok(true)
}

/// Runs `cases` generated bodies through [`check`]; how many were answered.
fn run(cases: u32, strategy: impl Strategy<Value = Vec<u8>>) -> usize {
    let checkpoints = open_checkpoints();
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    // The same bodies on every run, so a failure in CI is one a developer can reproduce.
    let mut runner = TestRunner::new_with_rng(config.clone(), TestRng::deterministic_rng(config.rng_algorithm));
    let answered = Cell::new(0);
    let result = runner.run(&(strategy, any::<bool>(), any::<bool>()), |(body, auto_task, newer)| {
        let upstream = if newer { Upstream::V0_4_15 } else { Upstream::V0_3_20 };
        let was_answered = check(&checkpoints, &body, auto_task, upstream)?;
        answered.set(answered.get() + usize::from(was_answered));
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    answered.get()
}

#[test]
fn request_shaped_bodies_are_answered_or_refused_with_a_4xx() {
    let answered = run(600, request_body());
    println!("{answered} of 600 answered");
    // Both branches must be exercised: a generator that only makes refusals would prove little.
    assert!((30..570).contains(&answered), "{answered} of 600 answered");
}

#[test]
fn any_body_at_all_is_answered_or_refused_with_a_4xx() {
    let answered = run(600, any_body());
    assert!(answered > 0, "none of 600 answered");
}
