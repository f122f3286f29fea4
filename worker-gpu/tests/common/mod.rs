//! What the worker-gpu tests share: upstream's golden forwards with their rows as the engine takes
//! them (`layad_system_tests::goldens` has no dependency on the worker protocol's types).

use layad_proto::Row;
use layad_system_tests::goldens::golden_forwards;

/// One golden row and upstream's outputs for it.
pub struct GoldenRow {
    /// The row as the engine takes it.
    pub row: Row,
    /// Upstream's fp32 logits, one per marker.
    pub logits: Vec<f32>,
    /// Softmax of upstream's act logits.
    pub act_probabilities: Vec<f32>,
}

/// One golden request that ran a forward, rows in request order.
pub struct Case {
    /// The case name.
    pub name: String,
    /// The checkpoint upstream routed it to.
    pub checkpoint: String,
    /// Its rows.
    pub rows: Vec<GoldenRow>,
}

/// The shared golden forwards, with rows as the engine takes them.
pub fn golden_cases() -> Vec<Case> {
    golden_forwards()
        .into_iter()
        .map(|f| Case {
            name: f.name,
            checkpoint: f.checkpoint,
            rows: f
                .rows
                .into_iter()
                .map(|r| GoldenRow {
                    row: Row {
                        ids: r.ids,
                        markers: r.markers,
                        qtype: r.qtype,
                    },
                    logits: r.logits,
                    act_probabilities: r.act_probabilities,
                })
                .collect(),
        })
        .collect()
}
