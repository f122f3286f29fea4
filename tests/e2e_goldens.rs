//! The real `layad` with a real worker process answers every golden request like upstream, in each
//! release's profile (0.4.15 by default, 0.3.20 when configured): same status and `detail`, answers
//! within 1e-4, everything else identical.

use laya::upstream::Upstream;
use layad_system_tests::goldens::goldens;
use layad_system_tests::{Server, deliberate_difference, json_differences, post_json};
use std::time::Duration;

const CONFIG: &str = r#"
[server]
diagnostics = false   # byte-for-byte upstream bodies

[[pool]]
name = "cpu"
device = "cpu"
workers = 1
threads = 1
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_0_4_15_golden_request_is_answered_like_upstream_by_default() {
    every_golden_request_is_answered_like(Upstream::V0_4_15, CONFIG.to_owned()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_0_3_20_golden_request_is_answered_like_upstream_in_its_profile() {
    let config = format!("{CONFIG}\n[compat]\nupstream = \"0.3.20\"\n");
    every_golden_request_is_answered_like(Upstream::V0_3_20, config).await;
}

async fn every_golden_request_is_answered_like(upstream_version: Upstream, config: String) {
    let mut server = Server::start(&config, &[]);
    server.wait_ready(Duration::from_secs(120)).await;
    let golden = goldens(upstream_version, "cases.json");
    let cases = golden["cases"].as_array().expect("cases");
    let (mut failures, mut identical) = (Vec::new(), 0);
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let body = case["body"].as_str().expect("body");
        let want_status = case["status"].as_u64().expect("status") as u16;
        let upstream = case["response"].as_str().expect("response");
        let response = post_json(server.addr, "/v1/systemone", body.as_bytes())
            .await
            .expect("request");
        if let Some((status, detail)) = deliberate_difference(name, upstream_version) {
            let ok = response.status == status && (detail.is_empty() || response.json()["detail"] == detail);
            if !ok {
                failures.push(format!(
                    "{name}: expected our {status} {detail:?}, got {} {}",
                    response.status,
                    response.text()
                ));
            }
            continue;
        }
        if response.status != want_status {
            failures.push(format!(
                "{name}: status {} vs upstream {want_status}: {}",
                response.status,
                response.text()
            ));
            continue;
        }
        if response.text() == upstream {
            identical += 1;
            continue;
        }
        let ours = response.json();
        let theirs: serde_json::Value = serde_json::from_str(upstream).unwrap_or(serde_json::Value::Null);
        let problems = json_differences(&ours, &theirs);
        if !problems.is_empty() {
            failures.push(format!("{name}: {}", problems.join("; ")));
        }
    }
    println!(
        "{upstream_version}: {} golden requests, {identical} byte-identical bodies",
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} differ:\n{}\n--- layad log ---\n{}",
        failures.len(),
        failures.join("\n"),
        server.log()
    );
    assert_eq!(
        server.terminate(Duration::from_secs(30)).code(),
        Some(0),
        "{}",
        server.log()
    );
}
