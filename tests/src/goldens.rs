//! The upstream goldens as tests read them: fixture paths, request bodies (base64 or described),
//! JSON comparison with a number tolerance, and the cases layad answers differently on purpose.
//!
//! Shared by the crate tests of `layad-laya` and `layad` and by the whole-system tests here.

use std::path::PathBuf;

use laya::question::QuestionType;
use laya::upstream::Upstream;
use serde_json::Value;

/// Where upstream's answers and ours may differ: the fourth decimal (spec §5.2; numpy's SIMD
/// `exp`/`log` are not correctly rounded, ours are).
pub const TOLERANCE: f64 = 1e-4;

/// `tests/fixtures/`.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures"))
}

/// Reads a JSON fixture under `tests/fixtures/`.
pub fn fixture_json(rel: &str) -> Value {
    let path = fixtures_dir().join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Structural equality, key order included; numbers must agree within `tolerance` (any two
/// numbers match with `None`, for answers computed from logits upstream did not record).
pub fn compare(path: &str, ours: &Value, theirs: &Value, tolerance: Option<f64>, problems: &mut Vec<String>) {
    match (ours, theirs) {
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (a.as_f64().unwrap_or(f64::NAN), b.as_f64().unwrap_or(f64::NAN));
            if tolerance.is_some_and(|t| (a - b).abs() > t + 1e-12) {
                problems.push(format!("{path}: {a} vs upstream {b}"));
            }
        }
        (Value::Object(a), Value::Object(b)) => {
            if !a.keys().eq(b.keys()) {
                let (ka, kb): (Vec<_>, Vec<_>) = (a.keys().collect(), b.keys().collect());
                problems.push(format!("{path}: keys {ka:?} vs upstream {kb:?}"));
                return;
            }
            for (k, v) in a {
                compare(&format!("{path}.{k}"), v, &b[k], tolerance, problems);
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                compare(&format!("{path}[{i}]"), x, y, tolerance, problems);
            }
        }
        _ if ours == theirs => {}
        _ => problems.push(format!("{path}: {ours} vs upstream {theirs}")),
    }
}

/// [`compare`] with [`TOLERANCE`], returning the differences.
pub fn json_differences(ours: &Value, theirs: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    compare("$", ours, theirs, Some(TOLERANCE), &mut problems);
    problems
}

/// The request body of the golden case `name` (one of `goldens/cases.json`).
pub fn golden_body(name: &str) -> String {
    fixture_json("goldens/cases.json")["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["name"] == name)
        .and_then(|c| c["body"].as_str())
        .unwrap_or_else(|| panic!("no golden case {name} with a body"))
        .to_owned()
}

/// Standard base64 (the fixtures' `body_base64`).
pub fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes().filter(|c| *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c).expect("base64 digit") as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// The exact bytes of a recorded bad request: base64, or a described repetition for big bodies.
pub fn request_body(request: &Value) -> Vec<u8> {
    if let Some(b64) = request["body_base64"].as_str() {
        return base64_decode(b64);
    }
    let d = &request["body_description"];
    let text = |k: &str| d[k].as_str().expect("described body");
    let times = d["times"].as_u64().expect("times") as usize;
    format!("{}{}{}", text("prefix"), text("repeat").repeat(times), text("suffix")).into_bytes()
}

/// Where the goldens recorded from `upstream` live, under `tests/fixtures/`.
pub fn goldens_dir(upstream: Upstream) -> &'static str {
    match upstream {
        Upstream::V0_3_20 => "goldens",
        Upstream::V0_4_15 => "goldens-0.4.15",
    }
}

/// One golden file of `upstream`'s (`cases.json`, `bad_requests.json`, `language.json`).
pub fn goldens(upstream: Upstream, file: &str) -> Value {
    fixture_json(&format!("{}/{file}", goldens_dir(upstream)))
}

/// Golden cases (of `cases.json` and `bad_requests.json`) where layad answers a client mistake
/// differently from `upstream` on purpose (README, "Deliberate differences"): our status, and
/// our `detail` when it is fixed text (`""` = any).
pub fn deliberate_difference(case: &str, upstream: Upstream) -> Option<(u16, &'static str)> {
    const INVALID_JSON: &str = "request body must be valid JSON";
    // NaN / Infinity literals are not JSON (RFC 8259): every release accepts them, layad does not.
    if matches!(
        case,
        "state_nan_infinity_accepted"
            | "ok_infinity_in_choice_description"
            | "e500_plain_text_nan_in_score_legend"
            | "nan_infinity_in_state_accepted"
            | "min_confidence_nan_literal"
            | "labels_nan_label"
            | "labels_infinity_label"
    ) {
        return Some((400, INVALID_JSON));
    }
    match upstream {
        // Labels whose answer keys JSON writes alike (`0` and `"0"`): upstream answers with a
        // repeated key, layad refuses them.
        Upstream::V0_4_15 => return (case == "labels_zero_and_string_zero").then_some((422, "")),
        // 0.3.20's deliberate differences follow.
        Upstream::V0_3_20 => {}
    }
    Some(match case {
        // Lone surrogate escapes and very deep nesting are not accepted JSON (0.4.15 refuses both
        // itself, with its own texts).
        "e500_lone_surrogate_state"
        | "e500_lone_surrogate_in_option"
        | "lone_surrogate_in_key_accepted"
        | "deeply_nested_json_recursion_500" => (400, INVALID_JSON),
        // A list or object as `type` is a 500 upstream (unhashable); ours names the problem.
        "e500_type_list_unhashable" => (
            422,
            "question 'q': unknown type ['choice']; use one of ['choice', 'noul', 'score']",
        ),
        "e500_type_object_unhashable" => (
            422,
            "question 'q': unknown type {'t': 'noul'}; use one of ['choice', 'noul', 'score']",
        ),
        // Non-string list-form labels are a 500 upstream (TypeError while rendering).
        "e500_numeric_list_labels"
        | "e500_null_list_label"
        | "e500_object_list_label"
        | "e500_list_list_label_unhashable"
        | "e500_bool_list_label" => (422, ""),
        _ => return None,
    })
}

/// One row upstream ran: its input and what upstream's model computed for it.
#[derive(Clone, Debug, PartialEq)]
pub struct GoldenRow {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Marker positions.
    pub markers: Vec<u32>,
    /// Question type.
    pub qtype: QuestionType,
    /// Upstream's fp32 logits, one per marker.
    pub logits: Vec<f32>,
    /// Softmax of upstream's act logits (float32).
    pub act_probabilities: Vec<f32>,
}

/// A golden request that ran a forward: its rows, batched as upstream batched them.
#[derive(Clone, Debug, PartialEq)]
pub struct GoldenForward {
    /// The case name.
    pub name: String,
    /// The checkpoint upstream routed it to.
    pub checkpoint: String,
    /// Its rows, in request order.
    pub rows: Vec<GoldenRow>,
}

/// Every case of `cases.json` that ran a forward (non-empty `rows`).
pub fn golden_forwards() -> Vec<GoldenForward> {
    let numbers = |v: &Value| -> Vec<f64> {
        v.as_array()
            .expect("array of numbers")
            .iter()
            .map(|x| x.as_f64().expect("number"))
            .collect()
    };
    let softmax = |x: &[f32]| -> Vec<f32> {
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = x.iter().map(|v| (v - max).exp()).collect();
        let sum: f32 = exps.iter().sum();
        exps.iter().map(|e| e / sum).collect()
    };
    let golden = fixture_json("goldens/cases.json");
    golden["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|case| case["rows"].as_array().is_some_and(|rows| !rows.is_empty()))
        .map(|case| GoldenForward {
            name: case["name"].as_str().expect("name").to_owned(),
            checkpoint: case["checkpoint"].as_str().expect("checkpoint").to_owned(),
            rows: case["rows"]
                .as_array()
                .expect("rows")
                .iter()
                .map(|row| {
                    let logits: Vec<f32> = numbers(&row["logits"]).into_iter().map(|x| x as f32).collect();
                    let act: Vec<f32> = numbers(&row["action_logits"]).into_iter().map(|x| x as f32).collect();
                    GoldenRow {
                        ids: numbers(&row["ids"]).into_iter().map(|x| x as u32).collect(),
                        markers: numbers(&row["markers"]).into_iter().map(|x| x as u32).collect(),
                        qtype: row["qtype"]
                            .as_u64()
                            .and_then(|q| QuestionType::from_index(u32::try_from(q).ok()?))
                            .expect("qtype 0, 1 or 2"),
                        logits,
                        act_probabilities: softmax(&act),
                    }
                })
                .collect(),
        })
        .collect()
}
