//! Property test of the served request path: generated bodies of every shape, sent whole or chunked
//! to a running server, are answered 200 with an answer per question or 4xx with a JSON `detail`;
//! never a 5xx, never a dropped connection, and the server still answers afterwards.

mod http_support;

use std::cell::Cell;
use std::time::Duration;

use http_support::TestServer;
use layad_system_tests::http::exchange;
use layad_system_tests::request_bodies::any_body;
use layad_system_tests::{Framing, Request};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRng, TestRunner};

#[test]
fn generated_bodies_get_200_or_a_4xx_with_a_detail_and_the_server_keeps_serving() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = runtime.block_on(TestServer::start(|_| {}));
    let config = Config {
        cases: 300,
        failure_persistence: None,
        ..Config::default()
    };
    // The same bodies on every run, so a failure in CI is one a developer can reproduce.
    let mut runner = TestRunner::new_with_rng(config.clone(), TestRng::deterministic_rng(config.rng_algorithm));
    let framing = prop_oneof![3 => Just(Framing::Length), 1 => (1usize..512).prop_map(Framing::Chunked)];
    let answered = Cell::new(0usize);
    let result = runner.run(&(any_body(), framing), |(body, framing)| {
        let request = Request::new("POST", "/v1/systemone")
            .headers(&[("Content-Type", "application/json")])
            .body(&body)
            .framing(framing);
        let answer = runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), exchange(server.addr, &request)).await })
            .map_err(|_| TestCaseError::fail("not answered within 30 s"))?
            .map_err(|e| TestCaseError::fail(format!("no HTTP answer: {e}")))?;
        let json: serde_json::Value = serde_json::from_slice(&answer.body)
            .map_err(|e| TestCaseError::fail(format!("{} with a body that is not JSON: {e}", answer.status)))?;
        if answer.status == 200 {
            answered.set(answered.get() + 1);
            prop_assert!(json["answers"].is_object(), "200 without answers: {json}");
        } else {
            prop_assert!((400..500).contains(&answer.status), "{}: {json}", answer.status);
            let detail = json["detail"].as_str().unwrap_or_default();
            prop_assert!(!detail.trim().is_empty(), "{} without a detail: {json}", answer.status);
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    assert!(
        answered.get() > 0,
        "no generated body was answered: the 200 branch went untested"
    );

    // Still serving: health and a plain decision.
    let health = runtime.block_on(server.get("/health", &[]));
    assert_eq!(health.status, 200, "{}", health.text());
    let decision = runtime.block_on(server.post(
        "/v1/systemone",
        &[("Content-Type", "application/json")],
        br#"{"state": "I was charged twice.", "questions": {"refund": {"type": "noul", "instructions": "Refund?"}}}"#,
    ));
    assert_eq!(decision.status, 200, "{}", decision.text());
}
