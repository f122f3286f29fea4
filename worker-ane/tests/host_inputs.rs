//! The host side on a real (tiny) checkpoint: graph inputs exact against the weights file read
//! independently (embedding rows, padding, type vector, marker map, masks), and the act head's input.

mod common;

use candle_core::{DType, Device};
use laya::checkpoint::{Checkpoint, Location};
use laya::question::QuestionType;
use layad_proto::{InvalidForward, Row};
use worker_ane::host::{GraphInputs, GraphOutputs, HostWeights, MASKED, RowError, SLOTS};

fn english() -> Checkpoint {
    Checkpoint::open(Location::from_path(common::checkpoint_dir(""))).expect("open english")
}

#[test]
fn inputs_are_exact_on_a_short_row() {
    let checkpoint = english();
    let host = HostWeights::load("english", &checkpoint).expect("host weights");
    let tensors = candle_core::safetensors::load(&checkpoint.weights.path, &Device::Cpu).expect("read weights");
    let table = tensors["encoder.embeddings.tok_embeddings.weight"]
        .to_dtype(DType::F32)
        .and_then(|t| t.to_vec2::<f32>())
        .expect("table");
    let type_emb = tensors["type_emb.weight"]
        .to_dtype(DType::F32)
        .and_then(|t| t.to_vec2::<f32>())
        .expect("type_emb");
    let row = Row {
        ids: vec![1, 57, 600, 3, 2],
        markers: vec![1, 3],
        qtype: QuestionType::Noul,
    };
    let (l, c) = (8usize, 128usize);
    let inputs = host.inputs(&row, l as u32).expect("inputs");
    assert_eq!((inputs.bucket, inputs.hidden), (8, c));
    for (name, shape) in GraphInputs::shapes(c, 8) {
        let len = inputs.named().iter().find(|(n, _)| *n == name).map(|(_, d)| d.len());
        assert_eq!(len, Some(shape.iter().product()), "{name}");
    }
    // (1, C, 1, L): channel c of token t at c·L + t; padding positions all zero.
    for (i, &got) in inputs.embeddings.iter().enumerate() {
        let (channel, t) = (i / l, i % l);
        let want = row.ids.get(t).map_or(0.0, |&id| table[id as usize][channel]);
        assert_eq!(got, want, "channel {channel} token {t}");
    }
    assert_eq!(inputs.embeddings.len(), c * l);
    assert_eq!(inputs.type_vector, type_emb[2]);
    // One-hot (1, L, 1, 32): slot 0 at position 1, slot 1 at position 3, nothing else.
    for position in 0..l {
        for slot in 0..SLOTS {
            let want = match (position, slot) {
                (1, 0) | (3, 1) => 1.0,
                _ => 0.0,
            };
            assert_eq!(
                inputs.marker_map[position * SLOTS + slot],
                want,
                "position {position} slot {slot}"
            );
        }
    }
    // local_attention 8: keys more than 4 from the query are masked in sliding layers.
    let at = |m: &[f32], key: usize, query: usize| m[key * l + query];
    assert_eq!(at(&inputs.full_mask, 4, 7), 0.0);
    assert_eq!(at(&inputs.full_mask, 5, 0), MASKED);
    assert_eq!(at(&inputs.local_mask, 4, 0), 0.0);
    assert_eq!(at(&inputs.local_mask, 0, 5), MASKED);
    assert_eq!(at(&inputs.local_mask, 7, 0), 2.0 * MASKED);
    assert_eq!(at(&inputs.local_mask, 6, 7), MASKED);
}

#[test]
fn rows_the_graph_cannot_take_are_refused_by_the_host() {
    let host = HostWeights::load("english", &english()).expect("host weights");
    let too_many = Row {
        ids: vec![1; 40],
        markers: (0..33).collect(),
        qtype: QuestionType::Choice,
    };
    assert_eq!(
        host.inputs(&too_many, 64),
        Err(RowError::TooManyMarkers { markers: 33 })
    );
    let long = Row {
        ids: vec![1; 65],
        markers: vec![1],
        qtype: QuestionType::Choice,
    };
    assert_eq!(
        host.inputs(&long, 64),
        Err(RowError::Contract(InvalidForward::RowLongerThanBuckets {
            row: 0,
            len: 65,
            bucket: 64
        }))
    );
    let bad_id = Row {
        ids: vec![1, 701],
        markers: vec![0],
        qtype: QuestionType::Choice,
    };
    assert!(matches!(
        host.inputs(&bad_id, 64),
        Err(RowError::Contract(InvalidForward::IdOutOfRange { id: 701, .. }))
    ));
}

#[test]
fn finish_keeps_k_logits_and_returns_a_distribution() {
    let host = HostWeights::load("english", &english()).expect("host weights");
    let mut logits = vec![0.0f32; SLOTS];
    logits[..3].copy_from_slice(&[0.5, -1.0, 2.0]);
    let outputs = GraphOutputs {
        logits,
        cls: vec![0.1; 128],
    };
    let out = host.finish(&outputs, 3).expect("finish");
    assert_eq!(out.logits, [0.5, -1.0, 2.0]);
    assert_eq!(out.act_probabilities.len(), 2);
    let sum: f32 = out.act_probabilities.iter().sum();
    assert!((sum - 1.0).abs() < 1e-6, "{:?}", out.act_probabilities);
    // The act features depend on the options kept: the unused slots (logit 0) must not count.
    let more = host.finish(&outputs, 5).expect("finish");
    assert_ne!(more.act_probabilities, out.act_probabilities);
}
