//! The parity gate's rule, shared by the Neural Engine worker (a converted graph against upstream's
//! PyTorch FP32 outputs) and int8 here (against our own float32 forward, see `gate`): outputs on
//! the same rows judged on what clients see (calibrated option probabilities, act probability, top option).
//!
//! The rule is laya-apple's, fixed before measuring: |Δ| ≤ 0.02 everywhere, no hard mismatch (top
//! option differs although upstream's top-1/top-2 margin is ≥ 0.04), near-tie flips listed, all finite.

use laya::answer::{calibrated_probabilities, first_argmax};
use layad_proto::RowOutput;

/// Largest allowed |difference| of a calibrated option probability or an act probability (FP16).
pub const TOLERANCE: f64 = 0.02;
/// Upstream's top-1/top-2 margin from which a different top option is a hard mismatch (2 × tolerance).
pub const HARD_MARGIN: f64 = 2.0 * TOLERANCE;

/// How one row compares.
#[derive(Clone, Debug, PartialEq)]
pub struct RowComparison {
    /// Largest |Δ| over the calibrated option probabilities.
    pub probability_diff: f64,
    /// Largest |Δ| over the act probabilities.
    pub act_diff: f64,
    /// Top option differs.
    pub flipped: bool,
    /// Upstream's top-1 minus top-2 calibrated probability (1 for a single option).
    pub upstream_margin: f64,
    /// Every output is finite and has the reference's length.
    pub finite: bool,
}

impl RowComparison {
    /// A different top option with a clear upstream margin.
    pub fn hard_mismatch(&self) -> bool {
        self.flipped && self.upstream_margin >= HARD_MARGIN
    }

    /// A different top option inside the near-tie margin.
    pub fn near_tie_flip(&self) -> bool {
        self.flipped && !self.hard_mismatch()
    }
}

/// Compares our output for one row with upstream's; `temperature` is the checkpoint's for this row.
pub fn compare(ours: &RowOutput, upstream_logits: &[f32], upstream_act: &[f32], temperature: f64) -> RowComparison {
    let finite = ours.logits.len() == upstream_logits.len()
        && ours.act_probabilities.len() == upstream_act.len()
        && ours.logits.iter().chain(&ours.act_probabilities).all(|v| v.is_finite());
    if !finite {
        return RowComparison {
            probability_diff: f64::INFINITY,
            act_diff: f64::INFINITY,
            flipped: false,
            upstream_margin: 0.0,
            finite,
        };
    }
    let p_ours = calibrated_probabilities(&ours.logits, temperature);
    let p_upstream = calibrated_probabilities(upstream_logits, temperature);
    let max_diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| f64::from((x - y).abs()))
            .fold(0.0, f64::max)
    };
    let mut sorted = p_upstream.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let upstream_margin = f64::from(sorted.first().copied().unwrap_or(0.0) - sorted.get(1).copied().unwrap_or(0.0));
    RowComparison {
        probability_diff: max_diff(&p_ours, &p_upstream),
        act_diff: max_diff(&ours.act_probabilities, upstream_act),
        flipped: first_argmax(&p_ours) != first_argmax(&p_upstream),
        upstream_margin,
        finite,
    }
}

/// The gate over every compared row of one checkpoint.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GateSummary {
    /// Rows compared.
    pub rows: u32,
    /// Rows no bucket holds.
    pub skipped_rows: u32,
    /// Largest probability |Δ|.
    pub max_probability_diff: f64,
    /// Largest act probability |Δ|.
    pub max_act_probability_diff: f64,
    /// Reference rows (indices) with a hard mismatch.
    pub hard_mismatches: Vec<u32>,
    /// Reference rows (indices) with a near-tie flip.
    pub near_tie_flips: Vec<u32>,
    /// Reference rows (indices) with a non-finite or misshapen output.
    pub non_finite: Vec<u32>,
}

impl GateSummary {
    /// Adds the comparison of reference row `index`.
    pub fn add(&mut self, index: u32, row: &RowComparison) {
        self.rows += 1;
        if !row.finite {
            self.non_finite.push(index);
            return;
        }
        self.max_probability_diff = self.max_probability_diff.max(row.probability_diff);
        self.max_act_probability_diff = self.max_act_probability_diff.max(row.act_diff);
        if row.hard_mismatch() {
            self.hard_mismatches.push(index);
        } else if row.near_tie_flip() {
            self.near_tie_flips.push(index);
        }
    }

    /// Why the gate fails, or `None` when it passes.
    pub fn failure(&self) -> Option<String> {
        self.failure_within(TOLERANCE)
    }

    /// [`Self::failure`] with probabilities and act probabilities held within `tolerance` instead
    /// of [`TOLERANCE`] (a stricter bound for a choice that has a safer one to fall back on).
    pub fn failure_within(&self, tolerance: f64) -> Option<String> {
        let mut problems = Vec::new();
        if self.rows == 0 {
            problems.push("no reference row fits the buckets".to_owned());
        }
        if !self.non_finite.is_empty() {
            problems.push(format!("non-finite or misshapen outputs on rows {:?}", self.non_finite));
        }
        if self.max_probability_diff > tolerance {
            problems.push(format!(
                "probability differs by {:.5} (> {tolerance:.5})",
                self.max_probability_diff
            ));
        }
        if self.max_act_probability_diff > tolerance {
            problems.push(format!(
                "act probability differs by {:.5} (> {tolerance:.5})",
                self.max_act_probability_diff
            ));
        }
        if !self.hard_mismatches.is_empty() {
            problems.push(format!(
                "{} hard mismatches (rows {:?})",
                self.hard_mismatches.len(),
                self.hard_mismatches
            ));
        }
        (!problems.is_empty()).then(|| problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(logits: Vec<f32>, act: Vec<f32>) -> RowOutput {
        RowOutput {
            logits,
            act_probabilities: act,
        }
    }

    #[test]
    fn a_stricter_tolerance_refuses_what_the_plain_rule_passes() {
        let mut summary = GateSummary::default();
        let row = RowComparison {
            probability_diff: 0.009,
            act_diff: 0.001,
            flipped: false,
            upstream_margin: 0.5,
            finite: true,
        };
        summary.add(0, &row);
        assert_eq!(summary.failure(), None);
        let stricter = summary.failure_within(TOLERANCE / 3.0).unwrap_or_default();
        assert!(
            stricter.contains("probability differs by 0.00900 (> 0.00667)"),
            "{stricter}"
        );
        assert_eq!(summary.failure_within(0.01), None);
    }

    #[test]
    fn a_flip_on_a_clear_margin_is_hard_and_inside_it_a_near_tie() {
        let act = [0.3, 0.7];
        // Upstream: p = softmax([1, 0]) ≈ [0.731, 0.269], margin 0.46; ours prefers option 1.
        let hard = compare(&output(vec![0.0, 1.0], act.to_vec()), &[1.0, 0.0], &act, 1.0);
        assert!(
            hard.flipped && hard.hard_mismatch() && !hard.near_tie_flip(),
            "{hard:?}"
        );
        // Upstream: softmax([0.05, 0]) margin ≈ 0.025 < 0.04; ours flips by as little.
        let tie = compare(&output(vec![0.0, 0.05], act.to_vec()), &[0.05, 0.0], &act, 1.0);
        assert!(tie.flipped && tie.near_tie_flip() && !tie.hard_mismatch(), "{tie:?}");
        assert!((tie.upstream_margin - 0.024_99).abs() < 1e-4, "{tie:?}");
        // The same top option: neither.
        let same = compare(&output(vec![1.01, 0.0], act.to_vec()), &[1.0, 0.0], &act, 1.0);
        assert!(!same.flipped && !same.hard_mismatch() && !same.near_tie_flip());
        // Exactly at the margin counts as hard: softmax([z, 0]) with top1 − top2 = 0.04.
        let z = (1.04f32 / 0.96).ln();
        let edge = compare(&output(vec![0.0, z], act.to_vec()), &[z, 0.0], &act, 1.0);
        assert!(edge.upstream_margin >= HARD_MARGIN - 1e-6 && edge.flipped);
    }

    #[test]
    fn temperature_scales_before_comparing() {
        // At T = 5 the logits [2, 0] give p ≈ [0.599, 0.401]; at T = 1, [0.881, 0.119].
        let act = [1.0];
        let ours = output(vec![2.2, 0.0], act.to_vec());
        let hot = compare(&ours, &[2.0, 0.0], &act, 5.0);
        let cold = compare(&ours, &[2.0, 0.0], &act, 1.0);
        assert!(hot.probability_diff < cold.probability_diff, "{hot:?} {cold:?}");
        let p = |z: f32, t: f32| 1.0 / (1.0 + (-z / t).exp());
        assert!((hot.probability_diff - f64::from(p(2.2, 5.0) - p(2.0, 5.0))).abs() < 1e-6);
    }

    #[test]
    fn the_summary_counts_and_fails_on_what_it_must() {
        let act = [0.5, 0.5];
        let mut summary = GateSummary::default();
        summary.add(
            0,
            &compare(&output(vec![1.0, 0.0], act.to_vec()), &[1.0, 0.0], &act, 1.0),
        );
        summary.add(
            1,
            &compare(&output(vec![0.0, 0.03], act.to_vec()), &[0.03, 0.0], &act, 1.0),
        );
        assert_eq!(summary.failure(), None, "{summary:?}");
        assert_eq!((summary.rows, summary.near_tie_flips.clone()), (2, vec![1]));
        summary.add(
            2,
            &compare(&output(vec![0.0, 1.0], act.to_vec()), &[1.0, 0.0], &act, 1.0),
        );
        assert_eq!(summary.hard_mismatches, vec![2]);
        let failure = summary.failure().unwrap_or_default();
        assert!(failure.contains("1 hard mismatches (rows [2])"), "{failure}");
        assert!(failure.contains("probability differs"), "{failure}");

        let mut act_only = GateSummary::default();
        act_only.add(
            0,
            &compare(&output(vec![1.0, 0.0], vec![0.47, 0.53]), &[1.0, 0.0], &act, 1.0),
        );
        assert!((act_only.max_act_probability_diff - 0.03).abs() < 1e-6);
        assert!(act_only.failure().is_some_and(|f| f.contains("act probability")));

        let mut nan = GateSummary::default();
        nan.add(
            7,
            &compare(&output(vec![f32::NAN, 0.0], act.to_vec()), &[1.0, 0.0], &act, 1.0),
        );
        assert_eq!(nan.non_finite, vec![7]);
        assert!(nan.failure().is_some_and(|f| f.contains("non-finite")));
        assert!(
            GateSummary::default()
                .failure()
                .is_some_and(|f| f.contains("no reference row"))
        );
    }
}
