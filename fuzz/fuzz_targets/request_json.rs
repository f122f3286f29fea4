//! Fuzzes a request body through the host's whole preparation, as `decisions.rs` runs it:
//! `laya::request::parse_body_in` → `laya::decision::prepare` (routing, validation, tokenization,
//! rows) on the three fixture checkpoints. The first byte picks the upstream release, `auto_task`,
//! the output profile and tournament mode; the rest is the (decoded) JSON body. Errors must be HTTP
//! answers (4xx, or 503 for a checkpoint not served); prepared rows must be ones a worker accepts.
#![no_main]

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use laya::checkpoint::{Checkpoint, find_in_hf_cache};
use laya::decision::{DecisionOptions, prepare};
use laya::output::OutputProfile;
use laya::request::{RequestLimits, parse_body_in};
use laya::routing::{CheckpointName, Registry};
use laya::upstream::Upstream;
use libfuzzer_sys::fuzz_target;

/// The fixture checkpoints (tests/fixtures/hf-cache), opened once per process.
fn checkpoints() -> &'static HashMap<CheckpointName, Checkpoint> {
    static OPENED: OnceLock<HashMap<CheckpointName, Checkpoint>> = OnceLock::new();
    OPENED.get_or_init(|| {
        let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hf-cache/hub");
        CheckpointName::ALL
            .into_iter()
            .map(|name| {
                let location = find_in_hf_cache(&cache, name).unwrap_or_else(|e| panic!("fixture {name:?}: {e}"));
                let checkpoint = Checkpoint::open(location).unwrap_or_else(|e| panic!("fixture {name:?}: {e}"));
                (name, checkpoint)
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let [selector, body @ ..] = data else {
        return;
    };
    let options = DecisionOptions {
        upstream: if selector & 1 == 0 {
            Upstream::V0_3_20
        } else {
            Upstream::V0_4_15
        },
        auto_task: selector & 2 != 0,
        limits: RequestLimits::default(),
        output: OutputProfile::ALL[usize::from(selector >> 2) % OutputProfile::ALL.len()],
        tournament_group: if selector & 0x80 != 0 { 16 } else { 0 },
        default_checkpoint: None,
    };
    let checkpoints = checkpoints();
    let request = match parse_body_in(
        body,
        options.upstream,
        options.output,
        options.limits,
        Registry::builtin_only(),
    ) {
        Ok(request) => request,
        Err(error) => {
            assert!(
                (400..500).contains(&error.status),
                "parse refused with {}: {}",
                error.status,
                error.detail
            );
            return;
        }
    };
    let prepared = match prepare(&request, |name| checkpoints.get(&name), options) {
        Ok(prepared) => prepared,
        Err(error) => {
            assert!(
                (400..500).contains(&error.status) || error.status == 503,
                "prepare refused with {}: {}",
                error.status,
                error.detail
            );
            return;
        }
    };
    assert_eq!(prepared.rows.len(), prepared.questions.len(), "one row per question");
    let checkpoint = &checkpoints[&prepared.checkpoint()];
    let vocab_size = checkpoint.encoder.vocab_size;
    for (index, row) in prepared.rows.iter().enumerate() {
        assert!(!row.ids.is_empty(), "row {index} is empty");
        assert!(
            row.ids.iter().all(|&id| (id as usize) < vocab_size),
            "row {index} has an id outside the vocabulary of {vocab_size}"
        );
        assert!(!row.markers.is_empty(), "row {index} has no markers");
        assert!(
            row.markers.windows(2).all(|pair| pair[0] < pair[1]),
            "row {index}'s markers are not increasing: {:?}",
            row.markers
        );
        assert!(
            row.markers.iter().all(|&m| (m as usize) < row.ids.len()),
            "row {index} has a marker outside its {} tokens",
            row.ids.len()
        );
    }
});
