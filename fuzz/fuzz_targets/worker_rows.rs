//! Fuzzes the worker's front: a `ForwardRequest` as it arrives on the worker socket (protobuf),
//! decoded into prompt rows (an unknown question type is refused there) and checked by
//! `ForwardLimits::check`, as the harness's `Forward` does before any engine sees it. The first two
//! bytes pick the worker's limits (max rows, length buckets); the rest is the message. An accepted forward must satisfy every documented rule
//! (checked here independently) and every row must fit a length bucket.
#![no_main]

use layad_proto::engine::{EngineFacts, EngineInfo, LoadedCheckpoint};
use layad_proto::pb::{ForwardRequest, decode_rows};
use layad_proto::rows::{ForwardLimits, bucket_for};
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// The fixture checkpoints (tests/fixtures/hf-cache): names and vocabulary sizes.
const CHECKPOINTS: [(&str, u32); 3] = [("english", 701), ("multilingual", 701), ("typed-decisions", 776)];
/// Longest row of the fixture checkpoints (typed-decisions' `max_len`).
const MAX_LEN: u32 = 128;

fn info(max_rows: u32, max_batch_tokens: u32, length_buckets: Vec<u32>) -> EngineInfo {
    EngineInfo {
        device: "cpu".to_owned(),
        dtype: "f32".to_owned(),
        checkpoints: CHECKPOINTS
            .iter()
            .map(|&(name, vocab_size)| LoadedCheckpoint {
                name: name.to_owned(),
                revision: None,
                weights_sha256: String::new(),
                vocab_size,
                max_len: MAX_LEN,
                warmup_len: MAX_LEN,
            })
            .collect(),
        max_rows,
        max_batch_tokens,
        length_buckets,
        parity: Vec::new(),
        facts: EngineFacts::default(),
    }
}

fuzz_target!(|data: &[u8]| {
    let [rows_limit, buckets_choice, message @ ..] = data else {
        return;
    };
    let max_rows = u32::from(rows_limit % 16) + 1;
    let max_batch_tokens = u32::from(*rows_limit) * 32;
    let buckets = match buckets_choice % 3 {
        0 => vec![],
        1 => vec![32, 64, 96],
        _ => vec![64, 256],
    };
    let Ok(request) = ForwardRequest::decode(message) else {
        return;
    };
    let limits = ForwardLimits::from_info(&info(max_rows, max_batch_tokens, buckets.clone()));
    let wire_qtypes: Vec<u32> = request.rows.iter().map(|r| r.qtype).collect();
    let Ok(rows) = decode_rows(request.rows) else {
        assert!(wire_qtypes.iter().any(|&q| q > 2), "refused rows whose types are all known");
        return;
    };
    if limits.check(&request.checkpoint, &rows).is_err() {
        return;
    }
    let Some(&(_, vocab_size)) = CHECKPOINTS.iter().find(|(name, _)| *name == request.checkpoint) else {
        panic!("accepted a forward for checkpoint {:?}", request.checkpoint);
    };
    assert!(!rows.is_empty() && rows.len() <= max_rows as usize);
    assert!(rows.iter().map(|r| r.ids.len()).sum::<usize>() <= max_batch_tokens as usize);
    for (row, &wire_qtype) in rows.iter().zip(&wire_qtypes) {
        let len = row.ids.len();
        assert!(len > 0 && len <= MAX_LEN as usize);
        assert!(row.ids.iter().all(|&id| id < vocab_size));
        assert!(!row.markers.is_empty());
        assert!(row.markers.windows(2).all(|pair| pair[0] < pair[1]));
        assert!(row.markers.iter().all(|&m| (m as usize) < len));
        assert_eq!(row.qtype.index(), wire_qtype);
        if !buckets.is_empty() {
            assert!(
                bucket_for(len, &buckets).is_some(),
                "an accepted row of {len} tokens fits no bucket"
            );
        }
    }
});
