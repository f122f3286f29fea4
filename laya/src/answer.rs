//! From a row's logits and act probability to upstream's answer JSON (spec §5): temperature,
//! float32 softmax, `confidence`, `answer_confidence`, score expectation, `noul`, `action`.
//!
//! The arithmetic follows numpy's types step by step (float32 softmax and entropy with numpy's
//! pairwise summation, float64 for the expected score) so the fourth decimal agrees with upstream.

use std::ops::Add;

use serde_json::{Map, Value};

use crate::config::Temperatures;
use crate::output::Precision;
use crate::python_text::{float_value, round4};
use crate::question::{AnswerKeys, Question, QuestionType};
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

/// The temperature upstream divides the logits by for a question of this type with `k` options:
/// its bucket's entry in `temperature_by_options`, else its type's.
pub fn temperature(temperatures: &Temperatures, qtype: QuestionType, k: usize) -> f64 {
    let bucket = temperature_bucket(qtype, k);
    temperatures
        .by_options
        .iter()
        .find(|(key, _)| *key == bucket)
        .map_or(temperatures.by_type[qtype as usize], |(_, t)| *t)
}

/// Upstream's `temp_bucket`: `"choice:2"`, `"score:3-5"`, `"choice:6-10"`, `"choice:11+"`.
pub fn temperature_bucket(qtype: QuestionType, k: usize) -> String {
    let size = match k {
        0..=2 => "2",
        3..=5 => "3-5",
        6..=10 => "6-10",
        _ => "11+",
    };
    format!("{}:{size}", qtype.as_str())
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

/// The float32 probabilities widened to float64 and divided by their float64 sum: a distribution
/// whose sum is one within a few ulps (float32 rounding alone leaves it up to ~1e-7·k off).
pub fn normalised_f64(p: &[f32]) -> Vec<f64> {
    let wide: Vec<f64> = p.iter().map(|&x| f64::from(x)).collect();
    let total: f64 = wide.iter().sum();
    if !(total.is_finite() && total > 0.0) {
        return wide;
    }
    wide.iter().map(|x| x / total).collect()
}

/// One question's answer object, in upstream's key order, with upstream's rounding. `logits` holds
/// the row's real options only; `act_probability` is component 0 of the act head's softmax.
pub fn answer(
    question: &Question,
    logits: &[f32],
    act_probability: f32,
    temperatures: &Temperatures,
    upstream: Upstream,
) -> Value {
    answer_in(
        question,
        logits,
        act_probability,
        temperatures,
        upstream,
        Precision::Upstream,
    )
}

/// [`answer`] with the probabilities, `score` and `noul` written at `precision`; every other
/// number (`confidence`, `answer_confidence`, `action`) is upstream's either way.
pub fn answer_in(
    question: &Question,
    logits: &[f32],
    act_probability: f32,
    temperatures: &Temperatures,
    upstream: Upstream,
    precision: Precision,
) -> Value {
    let k = logits.len();
    let p = calibrated_probabilities(logits, temperature(temperatures, question.qtype, k));
    let p = unpermute(p, question.option_order.as_deref());
    let exact = (precision == Precision::Exact).then(|| normalised_f64(&p));
    let top = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let answer_confidence = float_value(round4(f64::from(top.clamp(0.0, 1.0))));
    let action = Value::Object(Map::from_iter([(
        "act_probability".to_owned(),
        float_value(round4(f64::from(act_probability))),
    )]));
    let probability = |i: usize| match &exact {
        Some(exact) => float_value(exact[i]),
        None => float_value(round4(f64::from(p[i]))),
    };
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
                        .enumerate()
                        .map(|(i, l)| (l.key.clone(), probability(i)))
                        .collect(),
                ),
            );
            out.insert(
                "confidence".to_owned(),
                float_value(round4(entropy_confidence(&p, upstream))),
            );
        }
        AnswerKeys::Score(levels) => {
            let score = match &exact {
                Some(exact) => exact.iter().enumerate().map(|(i, x)| i as f64 * x).sum::<f64>(),
                None => {
                    let weighted: Vec<f64> = p.iter().enumerate().map(|(i, x)| i as f64 * f64::from(*x)).collect();
                    round4(numpy_sum(&weighted))
                }
            };
            out.insert("score".to_owned(), float_value(score));
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
                Value::Object((0..p.len()).map(|i| (i.to_string(), probability(i))).collect()),
            );
            out.insert(
                "confidence".to_owned(),
                float_value(round4(entropy_confidence(&p, upstream))),
            );
        }
        AnswerKeys::Noul => {
            let p_true = f64::from(p[1]);
            let noul = exact.as_ref().map_or_else(|| round4(p_true), |exact| exact[1]);
            out.insert("noul".to_owned(), float_value(noul));
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
    fn a_bucket_entry_wins_over_the_type() {
        let t = Temperatures {
            by_type: [1.6369, 2.0, 1.0],
            by_options: vec![
                ("choice:11+".to_owned(), 0.5),
                ("score:6-10".to_owned(), 5.0),
                ("choice:2".to_owned(), 1.9064),
            ],
            clamped: Vec::new(),
        };
        assert_eq!(temperature(&t, QuestionType::Choice, 12), 0.5);
        assert_eq!(temperature(&t, QuestionType::Score, 7), 5.0);
        assert_eq!(temperature(&t, QuestionType::Noul, 2), 1.0);
        assert_eq!(temperature(&t, QuestionType::Choice, 1), 1.9064);
        assert_eq!(temperature(&t, QuestionType::Choice, 4), 1.6369);
        assert_eq!(temperature_bucket(QuestionType::Score, 5), "score:3-5");
    }

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

    #[test]
    fn exact_probabilities_sum_to_one_where_rounded_ones_need_not() {
        // Three options whose rounded probabilities sum to 1.0001 (0.3632 + 0.2826 + 0.3543, the
        // issue's case), searched for over a grid so the test does not hang on one float.
        let rounded_off = (0..400)
            .map(|i| [0.0f32, -0.25 + i as f32 * 0.001, -0.02])
            .find(|l| {
                let p = softmax_f32(l);
                (p.iter().map(|&x| round4(f64::from(x))).sum::<f64>() - 1.0).abs() > 5e-5
            })
            .expect("a case whose rounded probabilities miss one");
        let p = normalised_f64(&softmax_f32(&rounded_off));
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        // Many options: float32 alone drifts; the float64 division brings it back.
        let wide: Vec<f32> = (0..255).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let p = normalised_f64(&softmax_f32(&wide));
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert_eq!(normalised_f64(&[0.0, 0.0]), [0.0, 0.0]);
    }
}
