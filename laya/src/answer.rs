//! From a row's logits and act probability to upstream's answer JSON (spec §5): temperature,
//! float32 softmax, `confidence`, `answer_confidence`, score expectation, `noul`, `action`.
//!
//! The arithmetic follows numpy's types step by step (float32 softmax and entropy with numpy's
//! pairwise summation, float64 for the expected score) so the fourth decimal agrees with upstream.

use std::ops::Add;

use serde_json::{Map, Value};

use crate::config::Temperatures;
use crate::python_text::{float_value, round4};
use crate::question::{AnswerKeys, Question};
use crate::upstream::Upstream;

/// numpy's pairwise summation of a contiguous array (`np.add.reduce`): sequential below eight
/// elements, eight interleaved accumulators up to 128, halves above.
fn numpy_sum<T: Copy + Default + Add<Output = T>>(a: &[T]) -> T {
    const BLOCK: usize = 128;
    let n = a.len();
    if n < 8 {
        a.iter().fold(T::default(), |acc, x| acc + *x)
    } else if n <= BLOCK {
        let mut r = [T::default(); 8];
        r.copy_from_slice(&a[..8]);
        let whole = n - n % 8;
        for chunk in a[8..whole].chunks_exact(8) {
            for (acc, x) in r.iter_mut().zip(chunk) {
                *acc = *acc + *x;
            }
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for x in &a[whole..] {
            res = res + *x;
        }
        res
    } else {
        let half = n / 2;
        let half = half - half % 8;
        numpy_sum(&a[..half]) + numpy_sum(&a[half..])
    }
}

/// Softmax in float32, max-subtracted (torch's and numpy's order of operations).
pub fn softmax_f32(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|z| (z - max).exp()).collect();
    let sum = numpy_sum(&exp);
    exp.iter().map(|e| e / sum).collect()
}

/// Calibrated option probabilities: `softmax(logits / T)` in float32 (the temperature is
/// rounded to float32 first, as numpy does when dividing a float32 array by a Python float).
pub fn calibrated_probabilities(logits: &[f32], temperature: f64) -> Vec<f32> {
    let t = temperature as f32;
    let scaled: Vec<f32> = logits.iter().map(|z| z / t).collect();
    softmax_f32(&scaled)
}

/// Normalised-entropy `confidence`: `1 - H(p)/ln(k)`, 1.0 below two options, clipped to [0, 1].
/// The entropy is a float32 numpy sum in both releases; 0.3.20 finishes in float32, 0.4.15 in
/// float64 (`ent = -float(...)`), which moves about 0.02% of values by 1e-4.
fn entropy_confidence(p: &[f32], upstream: Upstream) -> f64 {
    let k = p.len();
    if k < 2 {
        return 1.0;
    }
    let terms: Vec<f32> = p.iter().map(|&x| x * x.clamp(1e-12, 1.0).ln()).collect();
    let entropy = -numpy_sum(&terms);
    match upstream {
        Upstream::V0_3_20 => {
            let c = 1.0f32 - entropy / (k as f64).ln() as f32;
            f64::from(c.clamp(0.0, 1.0))
        }
        Upstream::V0_4_15 => (1.0 - f64::from(entropy) / (k as f64).ln()).clamp(0.0, 1.0),
    }
}

/// Upstream's `unpermute_probs`: the model answers in slot order (slot `s` showed option
/// `order[s]`); everything after indexes by option.
fn unpermute(p: Vec<f32>, order: Option<&[usize]>) -> Vec<f32> {
    match order {
        Some(order) if order.len() == p.len() => {
            let mut by_option = vec![0.0; p.len()];
            for (slot, &option) in order.iter().enumerate() {
                by_option[option] = p[slot];
            }
            by_option
        }
        _ => p,
    }
}

/// TypeSafe's Jev `confidence` of an answer (0.4.15's `x_jev_confidence`, spec §5.5), computed
/// from the answer's rounded `probabilities` exactly as upstream reads them back; `None` for noul
/// answers and for probabilities that are not usable numbers.
pub fn jev_confidence(answer: &Map<String, Value>) -> Option<f64> {
    let kind = answer.get("type")?.as_str()?;
    let probabilities = answer.get("probabilities")?.as_object().filter(|p| !p.is_empty())?;
    if kind != "choice" && kind != "score" {
        return None;
    }
    // Score keys are "0".."n-1" in order already; upstream sorts them by int, which is the same.
    let p: Vec<f64> = probabilities.values().map(Value::as_f64).collect::<Option<_>>()?;
    if !p.iter().all(|v| v.is_finite() && *v >= 0.0) {
        return None;
    }
    let n = p.len();
    if n == 1 {
        return Some(1.0);
    }
    let total: f64 = p.iter().sum();
    let p: Vec<f64> = if total != 0.0 {
        p.iter().map(|v| v / total).collect()
    } else {
        vec![1.0 / n as f64; n]
    };
    let nf = n as f64;
    if kind == "choice" {
        let max = p.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        return Some((max - 1.0 / nf) / (1.0 - 1.0 / nf));
    }
    let mode = p
        .iter()
        .enumerate()
        .fold(0, |best, (i, v)| if *v > p[best] { i } else { best });
    let spread: f64 = p
        .iter()
        .enumerate()
        .map(|(i, v)| v * (i as f64 - mode as f64).abs())
        .sum();
    let center = (nf - 1.0) / 2.0;
    let uniform_spread = (0..n).map(|i| (i as f64 - center).abs()).sum::<f64>() / nf;
    Some((1.0 - spread / uniform_spread).max(0.0))
}

/// The first index holding the maximum (numpy's `argmax`): the option upstream answers with.
pub fn first_argmax(p: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in p.iter().enumerate() {
        if *x > p[best] {
            best = i;
        }
    }
    best
}

/// One question's answer object, in upstream's key order. `logits` holds the row's real options
/// only; `act_probability` is component 0 of the act head's softmax.
pub fn answer(
    question: &Question,
    logits: &[f32],
    act_probability: f32,
    temperatures: &Temperatures,
    upstream: Upstream,
) -> Value {
    let k = logits.len();
    let p = calibrated_probabilities(logits, temperatures.for_question(question.qtype, k));
    let p = unpermute(p, question.option_order.as_deref());
    let top = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let answer_confidence = float_value(round4(f64::from(top.clamp(0.0, 1.0))));
    let action = Value::Object(Map::from_iter([(
        "act_probability".to_owned(),
        float_value(round4(f64::from(act_probability))),
    )]));
    let probability = |x: f32| float_value(round4(f64::from(x)));
    let mut out = Map::new();
    out.insert("type".to_owned(), Value::from(question.qtype.as_str()));
    match &question.keys {
        AnswerKeys::Choice(labels) => {
            out.insert("choice".to_owned(), labels[first_argmax(&p)].value.clone());
            out.insert(
                "probabilities".to_owned(),
                Value::Object(
                    labels
                        .iter()
                        .zip(&p)
                        .map(|(l, x)| (l.key.clone(), probability(*x)))
                        .collect(),
                ),
            );
            out.insert(
                "confidence".to_owned(),
                float_value(round4(entropy_confidence(&p, upstream))),
            );
        }
        AnswerKeys::Score(levels) => {
            let weighted: Vec<f64> = p.iter().enumerate().map(|(i, x)| i as f64 * f64::from(*x)).collect();
            out.insert("score".to_owned(), float_value(round4(numpy_sum(&weighted))));
            out.insert(
                "legend".to_owned(),
                Value::Object(
                    levels
                        .iter()
                        .enumerate()
                        .map(|(i, level)| (i.to_string(), level.clone()))
                        .collect(),
                ),
            );
            out.insert(
                "probabilities".to_owned(),
                Value::Object(
                    p.iter()
                        .enumerate()
                        .map(|(i, x)| (i.to_string(), probability(*x)))
                        .collect(),
                ),
            );
            out.insert(
                "confidence".to_owned(),
                float_value(round4(entropy_confidence(&p, upstream))),
            );
        }
        AnswerKeys::Noul => {
            let p_true = f64::from(p[1]);
            out.insert("noul".to_owned(), float_value(round4(p_true)));
            out.insert("confidence".to_owned(), float_value(round4(p_true.max(1.0 - p_true))));
        }
    }
    out.insert("answer_confidence".to_owned(), answer_confidence);
    out.insert("action".to_owned(), action);
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numpy_sum_uses_eight_accumulators_from_eight_elements() {
        let a: Vec<f32> = (0..20).map(|i| 1.0 / (i as f32 + 3.0)).collect();
        let sequential = a.iter().fold(0.0f32, |s, x| s + x);
        let r: Vec<f32> = (0..8).map(|j| a[j] + a[j + 8]).collect();
        let pairwise =
            ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7])) + a[16] + a[17] + a[18] + a[19];
        assert_eq!(numpy_sum(&a), pairwise);
        assert_eq!(numpy_sum(&a[..5]), a[..5].iter().fold(0.0f32, |s, x| s + x));
        assert!((numpy_sum(&a) - sequential).abs() < 1e-6);
    }

    #[test]
    fn softmax_and_confidence() {
        let p = calibrated_probabilities(&[2.0, 0.0], 1.0);
        assert!((p[0] - 0.880_797).abs() < 1e-6);
        for upstream in Upstream::ALL {
            assert_eq!(entropy_confidence(&[1.0], upstream), 1.0);
            assert_eq!(entropy_confidence(&[0.5, 0.5], upstream), 0.0);
        }
        assert_eq!(first_argmax(&[0.2, 0.4, 0.4]), 1);
    }
}
