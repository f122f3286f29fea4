//! The load-time parity gate of reduced precisions: built-in sample requests run through a
//! checkpoint's float32 forward and then its int8 (CPU) or f16/bf16 (any device) forward, compared
//! with the shared parity rule before the checkpoint may be served in that precision.
//!
//! The reference is our own float32 forward (it matches upstream's goldens within 1e-4), so the gate
//! needs no files beyond the checkpoint: the rows are built from the requests below exactly as the
//! supervisor builds rows, with the checkpoint's own tokenizer and row limits.
//!
//! int8 with the VNNI kernel may try several activation quantizations in turn (the configured one,
//! or [`DEFAULT_ACTIVATIONS`]): the first the gate passes is served, and the report's executor names
//! it and any refused before it.
//!
//! The float32 reference of a start is kept in a [`ReferenceCache`] when the engine has one, and
//! read back by the next start on the same executable, weights and rows: only the reduced
//! precision's rows run again.

use laya::checkpoint::Checkpoint;
use laya::prompt::{RowLimits, build_rows};
use laya::question::parse_questions;
use laya::request::{RequestLimits, parse_body};
use laya::upstream::Upstream;
use layad_cpu_kernels::CpuKernels;
use layad_cpu_kernels::int8::Int8Activations;
use layad_proto::{ParityReport, Row, RowOutput};

use crate::device::Precision;
use crate::error::LoadError;
use crate::model::{LayaModel, MatrixFormat};
use crate::parity::{self, GateSummary};
use crate::reference_cache::{ReferenceCache, ReferenceSetup};

/// What the gate runs: every question type, two to six options, states from a sentence to a few
/// hundred tokens (a JSON conversation, truncated from the left like upstream). Each request is one
/// forward, its rows padded together, as served.
const GATE_REQUESTS: [&str; 3] = [
    r#"{"state": "I was charged twice for invoice 4411, please refund it today.",
        "questions": {
          "queue": {"type": "choice", "instructions": "Which queue should handle this?",
                    "criteria": {"billing": "payment problems", "tech": "technical issue", "other": "anything else"}},
          "urgency": {"type": "score", "instructions": "How urgent is this?",
                      "criteria": ["not urgent", "somewhat urgent", "urgent", "critical"]},
          "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"}}}"#,
    r#"{"state": {"customer": "Dana Whitfield", "plan": "business", "tickets_open": 3,
                  "history": ["Login fails with error 502 since the update on Monday.",
                              "Reset the password twice, still cannot get in.",
                              "Our whole team of twelve people is blocked, we have a deadline on Friday.",
                              "Support chat closed without an answer yesterday evening."],
                  "last_message": "If this is not fixed today we will cancel the subscription and ask for the money back."},
        "questions": {
          "team": {"type": "choice", "instructions": "Which team should take this ticket?",
                   "criteria": ["billing", "authentication", "infrastructure", "sales", "retention", "spam"]},
          "churn": {"type": "noul", "instructions": "Is the customer likely to cancel?"}}}"#,
    r#"{"state": [{"role": "user", "content": "Hi, the parcel with order 88213 arrived damaged, the box was wet and the lamp inside is broken."},
                  {"role": "assistant", "content": "I am sorry to hear that. Could you send a photo of the damage and the label?"},
                  {"role": "user", "content": "Sent both. I would prefer a replacement rather than a refund, but it has to arrive before the 20th because it is a gift."},
                  {"role": "assistant", "content": "Thank you, the photos are attached to the case. Let me check the stock in the warehouse near you."},
                  {"role": "user", "content": "Ok. Also the courier left it outside in the rain, which is the second time this month."}],
        "questions": {
          "severity": {"type": "score", "instructions": "How severe is the customer's problem?",
                       "criteria": ["minor", "moderate", "serious"]},
          "action": {"type": "choice", "instructions": "Best next step?",
                     "criteria": {"replace": "ship a replacement", "refund": "refund the order", "ask": "ask for more details", "escalate": "escalate to the courier team"}},
          "complaint": {"type": "noul", "instructions": "Does the customer complain about the courier?"}}}"#,
];

/// The gate's rows, one batch per built-in request, built for `checkpoint`.
pub fn gate_batches(checkpoint: &Checkpoint) -> Result<Vec<Vec<Row>>, String> {
    let limits = RowLimits {
        max_len: checkpoint.agent.max_len,
        head_max_len: checkpoint.agent.head_max_len,
    };
    GATE_REQUESTS
        .iter()
        .map(|body| {
            // The rows of these requests are the same under every upstream release.
            let upstream = Upstream::default();
            let request = parse_body(body.as_bytes(), upstream, RequestLimits::default()).map_err(|e| e.body())?;
            let questions = parse_questions(&request.questions, upstream).map_err(|e| e.0)?;
            let built = build_rows(
                &checkpoint.tokenizer,
                limits,
                request.state.as_ref(),
                &questions,
                upstream,
            )
            .map_err(|e| e.to_string())?;
            Ok(built.rows)
        })
        .collect()
}

/// What the gate tries: the activations asked for alone, else [`DEFAULT_ACTIVATIONS`].
fn activation_choices(activations: Option<&Int8Activations>) -> &[Int8Activations] {
    match activations {
        Some(chosen) => std::slice::from_ref(chosen),
        None => &DEFAULT_ACTIVATIONS,
    }
}

/// Loads `checkpoint` on the CPU with its encoder and head-layer matrices in `format` (int8 or the
/// bf16 kernels'), behind the gate: served only if its outputs on the gate's rows pass the parity
/// rule against the float32 forward's; otherwise the checkpoint is refused with the numbers.
///
/// Every matrix is reduced as soon as it is read, so the float32 model never exists whole (it made
/// an int8 start of the full-size ModernBERT-large peak at 1.8 GB): where `cache` keeps the float32
/// reference of these weights, kernels, threads and rows, no float32 forward is needed
/// ([`LayaModel::load_reduced`]); otherwise the gate's rows run through each layer in float32
/// before it is reduced ([`LayaModel::load_reduced_with_reference`]) and the reference is kept for
/// the next start.
///
/// int8 with the VNNI kernel: `activations` says how activation rows are quantized; without it,
/// each of [`DEFAULT_ACTIVATIONS`] in turn until one passes ([`load_reduced_behind_gate_trying`]).
/// 8-bit activations pass this gate's 8 rows on some fixture checkpoints but not upstream's 169
/// golden rows (plain u8: max |Δp| 0.050; `u8o:4`: 0.025; `u8o:16`, 16 of 128 values per row held
/// apart: 0.029; 16 bits: 0.017; `u8o:32` keeps them but costs what 16 bits cost;
/// docs/benchmarks.md), so the gate's plain rule alone does not show that 8 bits are safe to serve:
/// by default they must stay within a third of it ([`FALLBACK_MARGIN`]), else 16 bits are served.
/// Asked for alone (`int8_activations`), a choice runs behind the plain rule.
pub fn load_reduced_behind_gate(
    name: &str,
    checkpoint: &Checkpoint,
    kernels: CpuKernels,
    format: MatrixFormat,
    activations: Option<Int8Activations>,
    cache: Option<&ReferenceCache>,
) -> Result<(LayaModel, ParityReport), LoadError> {
    let choices = activation_choices(activations.as_ref());
    load_reduced_behind_gate_trying(name, checkpoint, kernels, format, choices, cache)
}

/// [`load_reduced_behind_gate`] trying the VNNI kernel's int8 activation `choices` in turn: the
/// first the gate passes is served (every choice but the last within [`FALLBACK_MARGIN`] of the
/// bound), a refused one is logged and named in the executor of the report that passes; the last
/// one's refusal refuses the checkpoint. The AVX2 and portable kernels' activations are fixed (i16):
/// they run once, whatever `choices` holds; bf16 ignores them.
pub fn load_reduced_behind_gate_trying(
    name: &str,
    checkpoint: &Checkpoint,
    kernels: CpuKernels,
    format: MatrixFormat,
    choices: &[Int8Activations],
    cache: Option<&ReferenceCache>,
) -> Result<(LayaModel, ParityReport), LoadError> {
    let precision = match format {
        MatrixFormat::Int8 => Precision::Int8,
        MatrixFormat::Bf16 => Precision::Bf16,
        MatrixFormat::Float32 => {
            return Err(LoadError::Device(
                "float32 is not a reduced precision: it has no gate".to_owned(),
            ));
        }
    };
    let refuse = refusal(name, precision);
    let batches = gate_batches(checkpoint).map_err(|e| refuse(format!("building the gate's rows: {e}")))?;
    // Hashed here (not while loading) only to look the reference up before anything is built.
    let weights_sha256 = cache.and_then(|_| crate::weights::file_sha256(&checkpoint.weights.path).ok());
    let setup = weights_sha256.as_deref().map(|weights_sha256| ReferenceSetup {
        weights_sha256,
        kernels,
        threads: rayon::current_num_threads(),
    });
    let mut built = None;
    let reference = float32_reference(name, cache, setup, &batches, || {
        let started = std::time::Instant::now();
        let (model, reference) = LayaModel::load_reduced_with_reference(
            name,
            checkpoint,
            kernels,
            format,
            weights_sha256.clone(),
            &batches,
        )?;
        tracing::info!(
            checkpoint = name,
            load_ms = started.elapsed().as_secs_f64() * 1e3,
            "{precision} gate: float32 reference computed while loading, layer by layer"
        );
        built = Some(model);
        Ok(reference)
    })?;
    let mut model = match built {
        Some(model) => model,
        None => LayaModel::load_reduced(name, checkpoint, kernels, format, weights_sha256)?,
    };
    let report = match format {
        MatrixFormat::Int8 => judge_int8(name, checkpoint, &mut model, choices, &batches, &reference)?,
        _ => judge_bf16(name, checkpoint, &model, &batches, &reference)?,
    };
    Ok((model, report))
}

/// The gate's int8 side on a quantized `model`: each of `choices` in turn against `reference`
/// (see [`load_reduced_behind_gate_trying`]).
fn judge_int8(
    name: &str,
    checkpoint: &Checkpoint,
    model: &mut LayaModel,
    choices: &[Int8Activations],
    batches: &[Vec<Row>],
    reference: &[RowOutput],
) -> Result<ParityReport, LoadError> {
    let refuse = refusal(name, Precision::Int8);
    let choices = if model.int8_activations().is_some() {
        choices
    } else {
        &[]
    };
    let mut refused: Option<Int8Activations> = None;
    for (i, &choice) in choices.iter().enumerate() {
        model.set_int8_activations(choice);
        let ours = run(model, batches, "int8", &refuse)?;
        let kernel = model.int8_kernel().unwrap_or_default();
        let after = refused.map_or(String::new(), |r| format!(", after {r} failed the gate"));
        let executor = format!("candle cpu int8 {kernel}{after} (reference: candle cpu f32)");
        // A choice with another after it must keep the margin; the last one, the plain rule.
        let fallback = choices.get(i + 1);
        let tolerance = match fallback {
            Some(_) => parity::TOLERANCE / FALLBACK_MARGIN,
            None => parity::TOLERANCE,
        };
        match judge(
            name,
            checkpoint,
            (Precision::Int8, tolerance),
            executor,
            batches,
            reference,
            &ours,
        ) {
            Err(error) if fallback.is_some() => {
                tracing::warn!(
                    checkpoint = name,
                    refused = %choice,
                    next = ?fallback,
                    %error,
                    "int8 gate: activations refused, trying the next"
                );
                refused = Some(choice);
            }
            result => return result,
        }
    }
    let ours = run(model, batches, "int8", &refuse)?;
    let kernel = model.int8_kernel().unwrap_or_default();
    judge(
        name,
        checkpoint,
        (Precision::Int8, parity::TOLERANCE),
        format!("candle cpu int8 {kernel} (reference: candle cpu f32)"),
        batches,
        reference,
        &ours,
    )
}

/// The VNNI kernel's activations when none are configured, in the order the gate tries them: one
/// u8 plane (about 0.65 of 16 bits' CPU time) where the gate's rows show it well inside the bound,
/// else 16 bits (two u8 planes).
pub const DEFAULT_ACTIVATIONS: [Int8Activations; 2] = [Int8Activations::U8, Int8Activations::U16];

/// How far inside [`parity::TOLERANCE`] a choice with a fallback after it must stay on the gate's
/// rows: a third of it. The gate's 8 rows understate 8-bit activations' worst case: on the fixture
/// checkpoints plain u8's worst |Δp| over upstream's 169 golden rows was 2.4× the gate's worst
/// (0.050 against 0.021), 16 bits' 1.0× (0.0167 both; docs/benchmarks.md), so 8 bits are served
/// only where the gate's worst row is under a third of the bound, which no fixture checkpoint's is
/// (16 bits reach 0.007–0.017 there) and the full-size ModernBERT-large's is (u8: 0.0016 / 0.0055).
pub const FALLBACK_MARGIN: f64 = 3.0;

/// The gate's bf16 side on a `model` in the bf16 kernels' format, against `reference`.
fn judge_bf16(
    name: &str,
    checkpoint: &Checkpoint,
    model: &LayaModel,
    batches: &[Vec<Row>],
    reference: &[RowOutput],
) -> Result<ParityReport, LoadError> {
    let refuse = refusal(name, Precision::Bf16);
    let ours = run(model, batches, "bf16", &refuse)?;
    judge(
        name,
        checkpoint,
        (Precision::Bf16, parity::TOLERANCE),
        format!("candle cpu bf16 {} (reference: candle cpu f32)", model.bf16_kernel()),
        batches,
        reference,
        &ours,
    )
}

/// Runs the gate on `model`, loaded in f16 or bf16 on `device_label` (`cpu`, `cuda:0`, `metal`),
/// against the same checkpoint's float32 forward on the CPU (the forward that matches upstream's
/// goldens within 1e-4), run one layer at a time as the weights are read
/// ([`LayaModel::float32_outputs`]: one float32 layer in memory at a time), or read back where
/// `cache` holds it. On success the report says how close it came; otherwise the checkpoint is
/// refused with the numbers.
pub fn half_precision_behind_gate(
    name: &str,
    checkpoint: &Checkpoint,
    model: &LayaModel,
    precision: Precision,
    device_label: &str,
    cache: Option<&ReferenceCache>,
) -> Result<ParityReport, LoadError> {
    let refuse = refusal(name, precision);
    if !matches!(precision, Precision::F16 | Precision::Bf16) {
        return Err(refuse(format!("{precision} is not a half precision")));
    }
    let batches = gate_batches(checkpoint).map_err(|e| refuse(format!("building the gate's rows: {e}")))?;
    // The reference model is packed for the best kernels this CPU has, as `LayaModel::load` does.
    let setup = ReferenceSetup {
        weights_sha256: &model.weights_sha256,
        kernels: CpuKernels::detect(),
        threads: rayon::current_num_threads(),
    };
    let reference = float32_reference(name, cache, Some(setup), &batches, || {
        let weights_sha256 = Some(model.weights_sha256.clone());
        LayaModel::float32_outputs(name, checkpoint, setup.kernels, weights_sha256, &batches)
    })?;
    let ours = run(model, &batches, precision.as_str(), &refuse)?;
    judge(
        name,
        checkpoint,
        (precision, parity::TOLERANCE),
        format!("candle {device_label} {precision} (reference: candle cpu f32)"),
        &batches,
        &reference,
        &ours,
    )
}

/// The float32 outputs of `batches` run with `setup`: read from `cache` where it keeps them,
/// else computed by `compute` and kept there (a failed write is logged, the start goes on). Without
/// a `setup` (the weights' hash unknown) the cache is not used.
fn float32_reference(
    name: &str,
    cache: Option<&ReferenceCache>,
    setup: Option<ReferenceSetup<'_>>,
    batches: &[Vec<Row>],
    compute: impl FnOnce() -> Result<Vec<RowOutput>, LoadError>,
) -> Result<Vec<RowOutput>, LoadError> {
    let Some((cache, key)) = cache
        .zip(setup)
        .and_then(|(cache, setup)| Some((cache, ReferenceCache::key(setup, batches)?)))
    else {
        return compute();
    };
    if let Some(kept) = cache.load(&key, batches) {
        tracing::info!(checkpoint = name, dir = %cache.dir().display(), %key, "gate: float32 reference read back");
        return Ok(kept);
    }
    let outputs = compute()?;
    match cache.store(&key, &outputs) {
        Ok(()) => tracing::info!(checkpoint = name, dir = %cache.dir().display(), %key, "gate: float32 reference kept"),
        Err(error) => tracing::warn!(
            checkpoint = name,
            dir = %cache.dir().display(),
            %error,
            "gate: float32 reference not kept; the next start computes it again (XDG_CACHE_HOME or the worker's --gate-cache name another directory)"
        ),
    }
    Ok(outputs)
}

/// How a failed step of the gate refuses the checkpoint.
fn refusal(name: &str, precision: Precision) -> impl Fn(String) -> LoadError + '_ {
    move |problem| LoadError::Unsupported {
        name: name.to_owned(),
        problem: format!("{precision} parity gate: {problem}"),
    }
}

/// Every gate batch through `model`, outputs in row order.
fn run(
    model: &LayaModel,
    batches: &[Vec<Row>],
    precision: &str,
    refuse: &impl Fn(String) -> LoadError,
) -> Result<Vec<RowOutput>, LoadError> {
    let mut outputs = Vec::new();
    for rows in batches {
        outputs.extend(
            model
                .forward(rows)
                .map_err(|e| refuse(format!("{precision} forward failed: {e}")))?,
        );
    }
    Ok(outputs)
}

/// The shared parity rule over every gate row: the report when it passes, the refusal otherwise.
fn judge(
    name: &str,
    checkpoint: &Checkpoint,
    (precision, tolerance): (Precision, f64),
    executor: String,
    batches: &[Vec<Row>],
    reference: &[RowOutput],
    ours: &[RowOutput],
) -> Result<ParityReport, LoadError> {
    let mut summary = GateSummary::default();
    for (index, ((row, want), got)) in batches.iter().flatten().zip(reference).zip(ours).enumerate() {
        let temperature = laya::answer::temperature(&checkpoint.agent.temperatures, row.qtype, row.markers.len());
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        summary.add(
            index,
            &parity::compare(got, &want.logits, &want.act_probabilities, temperature),
        );
    }
    summary_to_report(name, (precision, tolerance), executor, &summary)
}

/// The report of a gate that passed, or the refusal of one that failed.
fn summary_to_report(
    name: &str,
    (precision, tolerance): (Precision, f64),
    executor: String,
    summary: &GateSummary,
) -> Result<ParityReport, LoadError> {
    if let Some(reason) = summary.failure_within(tolerance) {
        return Err(LoadError::ParityGate {
            name: name.to_owned(),
            precision: precision.as_str().to_owned(),
            rows: summary.rows,
            reason,
        });
    }
    Ok(ParityReport {
        checkpoint: name.to_owned(),
        executor,
        rows: summary.rows,
        skipped_rows: 0,
        tolerance,
        max_probability_diff: summary.max_probability_diff,
        max_act_probability_diff: summary.max_act_probability_diff,
        hard_mismatches: 0,
        near_tie_flips: summary.near_tie_flips.clone(),
        placement: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(index: u32, probability_diff: f64) -> (u32, parity::RowComparison) {
        (
            index,
            parity::RowComparison {
                probability_diff,
                act_diff: 0.001,
                flipped: false,
                upstream_margin: 0.5,
                finite: true,
            },
        )
    }

    #[test]
    fn a_failed_half_precision_gate_refuses_the_checkpoint_naming_the_precision() {
        let mut summary = GateSummary::default();
        for (index, comparison) in [row(0, 0.004), row(1, 0.031)] {
            summary.add(index, &comparison);
        }
        let error = summary_to_report(
            "english",
            (Precision::Bf16, parity::TOLERANCE),
            "candle cuda:0 bf16".into(),
            &summary,
        )
        .expect_err("0.031 > 0.02");
        let message = error.to_string();
        assert!(message.contains("refused in bf16"), "{message}");
        assert!(message.contains("probability differs by 0.03100"), "{message}");

        let mut passing = GateSummary::default();
        passing.add(0, &row(0, 0.004).1);
        let report = summary_to_report(
            "english",
            (Precision::F16, parity::TOLERANCE),
            "candle cuda:0 f16".into(),
            &passing,
        )
        .expect("0.004 passes");
        assert_eq!((report.rows, report.executor.as_str()), (1, "candle cuda:0 f16"));
        assert!((report.max_probability_diff - 0.004).abs() < 1e-12);
    }
}
