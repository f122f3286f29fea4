//! Shared by laya's integration tests: the three fixture checkpoints, opened from the committed
//! Hugging Face cache (tests/fixtures/hf-cache).

use std::collections::HashMap;

use laya::checkpoint::{Checkpoint, find_in_hf_cache};
use laya::routing::CheckpointName;
use layad_system_tests::goldens::fixtures_dir;

/// Every fixture checkpoint, by name.
pub fn open_checkpoints() -> HashMap<CheckpointName, Checkpoint> {
    let cache = fixtures_dir().join("hf-cache/hub");
    CheckpointName::ALL
        .into_iter()
        .map(|name| {
            let location = find_in_hf_cache(&cache, name).unwrap_or_else(|e| panic!("{e}"));
            (name, Checkpoint::open(location).unwrap_or_else(|e| panic!("{e}")))
        })
        .collect()
}
