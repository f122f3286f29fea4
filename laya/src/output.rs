//! Which contract a server answers Jev clients with (`[compat] output`): upstream's full payload
//! (`"laya"`, the default), upstream 0.4.15's strict Jev projection (`"jev-strict"`, what
//! `LAYA_JEV_STRICT` turns on), applied to each finished answer exactly as upstream's
//! `_project_jev_strict` does, or the Jev wire contract itself (`"jev"`): the strict projection
//! with Jev's `confidence`, plus Jev's model ids, error shapes and limits (`crate::jev`).
//!
//! The profile is one value passed down to every rule that differs (request parsing, question
//! validation, the answer's shape, the error's shape), like `crate::upstream::Upstream`.

use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value};

use crate::jev::jev_confidence;
use crate::python_text::{Separators, float_value, py_json};

/// How an answer writes its probabilities, `score` and `noul`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// Upstream's: each `round4` of the float32 softmax (the `laya` and `jev-strict` profiles,
    /// byte for byte). Rounded values need not sum to one: 0.3632 + 0.2826 + 0.3543 = 1.0001.
    #[default]
    Upstream,
    /// The Jev API's (the `jev` profile): unrounded float64, the float32 softmax widened and divided
    /// by its float64 sum, so that the probabilities sum to one within a few ulps (Jev clients such
    /// as jevantic check 1e-6), and `score` is the expectation over exactly those probabilities.
    Exact,
}

/// The output profile of a server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OutputProfile {
    /// Upstream's keys as the chosen release writes them (`routing`, `action`, the extended
    /// `usage`, 0.4.x's `x_jev_confidence`).
    #[default]
    Laya,
    /// Upstream 0.4.15's `LAYA_JEV_STRICT`: only the keys the Jev wire contract defines.
    JevStrict,
    /// The Jev wire contract: the strict projection with Jev's `confidence` formula, Jev's model
    /// ids meaning "let the router choose" (other unknown names refused), Jev's error shapes,
    /// questions without `instructions`, an empty `questions` refused, choices of up to 255
    /// options. For Jev clients that rely on more than the keys.
    Jev,
}

impl OutputProfile {
    /// Every profile.
    pub const ALL: [OutputProfile; 3] = [OutputProfile::Laya, OutputProfile::JevStrict, OutputProfile::Jev];

    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputProfile::Laya => "laya",
            OutputProfile::JevStrict => "jev-strict",
            OutputProfile::Jev => "jev",
        }
    }

    /// Whether requests and errors follow the Jev contract rather than upstream's.
    pub fn is_jev(self) -> bool {
        self == OutputProfile::Jev
    }

    /// Whether answers carry upstream's keys beyond Jev's (`routing`, `action`, …) and layad's
    /// `x_layad`; the Jev profiles answer with the contract's keys only.
    pub fn keeps_extra_keys(self) -> bool {
        self == OutputProfile::Laya
    }

    /// How answers write their probabilities, `score` and `noul`: upstream's 4 decimals, except
    /// under `jev`, whose clients need a distribution that sums to one ([`Precision`]).
    pub fn precision(self) -> Precision {
        match self {
            OutputProfile::Jev => Precision::Exact,
            _ => Precision::Upstream,
        }
    }

    /// The tournament group a server plays with when `[compat] tournament_group` is `configured`
    /// (0 = off): that group, except that `jev`, whose contract accepts choices of up to 255
    /// options, plays in groups of `crate::jev::DEFAULT_TOURNAMENT_GROUP` when none is configured.
    pub fn tournament_group(self, configured: usize) -> usize {
        match self {
            OutputProfile::Jev if configured == 0 => crate::jev::DEFAULT_TOURNAMENT_GROUP,
            _ => configured,
        }
    }

    /// A finished answer body (upstream's keys, in upstream's order) in this profile's shape.
    pub fn project(self, body: Map<String, Value>) -> Map<String, Value> {
        match self {
            OutputProfile::Laya => body,
            OutputProfile::JevStrict => project_jev_strict(&body),
            OutputProfile::Jev => project_jev(&body),
        }
    }
}

impl fmt::Display for OutputProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A spelling that names no profile.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown output profile {0:?}; use \"laya\" (upstream's keys, the default), \"jev-strict\" (LAYA_JEV_STRICT) or \"jev\" (the Jev wire contract)"
)]
pub struct UnknownOutputProfile(pub String);

impl FromStr for OutputProfile {
    type Err = UnknownOutputProfile;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OutputProfile::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownOutputProfile(s.to_owned()))
    }
}

/// 0.4.15's `_project_jev_strict`: the root keeps `model`, `answers` and a two-count `usage`
/// (no `routing`); a choice keeps `type, choice, confidence, probabilities`, a score also
/// `legend`, a noul `type, noul`, in that order; an answer of another shape passes unchanged.
/// Nothing is recomputed. A missing count is 0, as upstream's `usage.get(..., 0)`.
pub fn project_jev_strict(result: &Map<String, Value>) -> Map<String, Value> {
    let pick = |answer: &Map<String, Value>, keys: &[&str]| -> Value {
        Value::Object(
            keys.iter()
                .map(|&k| (k.to_owned(), answer.get(k).cloned().unwrap_or(Value::Null)))
                .collect(),
        )
    };
    let mut answers = Map::new();
    if let Some(Value::Object(given)) = result.get("answers") {
        for (qid, answer) in given {
            let projected = match answer {
                Value::Object(a) => match a.get("type").and_then(Value::as_str) {
                    Some("choice") => pick(a, &["type", "choice", "confidence", "probabilities"]),
                    Some("score") => pick(a, &["type", "score", "confidence", "probabilities", "legend"]),
                    Some("noul") => pick(a, &["type", "noul"]),
                    _ => answer.clone(),
                },
                other => other.clone(),
            };
            answers.insert(qid.clone(), projected);
        }
    }
    let count = |key: &str| {
        result
            .get("usage")
            .and_then(Value::as_object)
            .and_then(|u| u.get(key))
            .cloned()
            .unwrap_or(Value::from(0))
    };
    let mut usage = Map::new();
    usage.insert("input_tokens".to_owned(), count("input_tokens"));
    usage.insert("output_tokens".to_owned(), count("output_tokens"));
    let mut out = Map::new();
    out.insert("model".to_owned(), result.get("model").cloned().unwrap_or(Value::Null));
    out.insert("answers".to_owned(), Value::Object(answers));
    out.insert("usage".to_owned(), Value::Object(usage));
    out
}

/// The `jev` profile's answer: the strict projection, with each choice's and score's `confidence`
/// replaced by Jev's (`jev::jev_confidence` of the answer's probabilities — the formula 0.4.15
/// sends as `x_jev_confidence` — unrounded like them: the Jev API rounds none of its numbers; for
/// a tournament, over the merged probabilities).
/// Laya's own confidence is a normalised entropy, which a Jev client would misread. A choice whose
/// label is not a string (Laya's list-form criteria `[1, 2]`) answers with its `probabilities` key
/// (`"1"`): Jev's option names are strings, and the Jev SDKs refuse a numeric `choice`.
pub fn project_jev(result: &Map<String, Value>) -> Map<String, Value> {
    let mut out = project_jev_strict(result);
    if let Some(Value::Object(answers)) = out.get_mut("answers") {
        for answer in answers.values_mut() {
            let Value::Object(fields) = answer else {
                continue;
            };
            if fields.contains_key("confidence")
                && let Some(confidence) = jev_confidence(fields)
            {
                fields.insert("confidence".to_owned(), float_value(confidence));
            }
            if fields.get("type").and_then(Value::as_str) == Some("choice")
                && let Some(label) = fields.get("choice").filter(|c| !c.is_string() && !c.is_null())
            {
                let key = py_json(label, Separators::Compact);
                fields.insert("choice".to_owned(), Value::String(key));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python_text::{Separators, py_json};
    use serde_json::json;

    fn project(value: Value) -> String {
        let Value::Object(map) = value else {
            panic!("not an object")
        };
        py_json(&Value::Object(project_jev_strict(&map)), Separators::Compact)
    }

    #[test]
    fn the_strict_projection_keeps_only_the_jev_keys_in_upstreams_order() {
        let full = json!({
            "model": "laya-rl-agent",
            "answers": {
                "q": {"type": "choice", "choice": "a", "probabilities": {"a": 0.7, "b": 0.3},
                      "confidence": 0.1187, "answer_confidence": 0.7, "action": {"act_probability": 0.5},
                      "low_confidence": true, "abstention": "abstained", "abstention_threshold": 0.9,
                      "x_jev_confidence": 0.4},
                "s": {"type": "score", "score": 1.2, "probabilities": {"0": 0.2, "1": 0.4, "2": 0.4},
                      "legend": {"0": "low", "1": "mid", "2": "high"}, "confidence": 0.05,
                      "answer_confidence": 0.4, "action": {"act_probability": 0.5}},
                "n": {"type": "noul", "noul": 0.61, "confidence": 0.61, "answer_confidence": 0.61,
                      "action": {"act_probability": 0.5}},
            },
            "usage": {"input_tokens": 90, "output_tokens": 0, "state_tokens": 12,
                      "state_tokens_dropped": 0, "truncated": false, "truncated_questions": []},
            "routing": {"model": "english"},
        });
        assert_eq!(
            project(full),
            concat!(
                r#"{"model":"laya-rl-agent","answers":{"#,
                r#""q":{"type":"choice","choice":"a","confidence":0.1187,"probabilities":{"a":0.7,"b":0.3}},"#,
                r#""s":{"type":"score","score":1.2,"confidence":0.05,"probabilities":{"0":0.2,"1":0.4,"2":0.4},"legend":{"0":"low","1":"mid","2":"high"}},"#,
                r#""n":{"type":"noul","noul":0.61}},"#,
                r#""usage":{"input_tokens":90,"output_tokens":0}}"#
            )
        );
    }

    #[test]
    fn empty_answers_and_unknown_shapes_pass_and_missing_counts_are_zero() {
        let odd = json!({"model": "m", "answers": {"x": {"type": "other", "k": 1}, "y": 3}, "usage": {}});
        assert_eq!(
            project(odd),
            r#"{"model":"m","answers":{"x":{"type":"other","k":1},"y":3},"usage":{"input_tokens":0,"output_tokens":0}}"#
        );
    }

    #[test]
    fn profiles_parse_from_their_spellings_only() {
        assert_eq!("jev-strict".parse(), Ok(OutputProfile::JevStrict));
        assert_eq!("laya".parse(), Ok(OutputProfile::Laya));
        assert_eq!("jev".parse(), Ok(OutputProfile::Jev));
        assert!("Jev".parse::<OutputProfile>().is_err());
        assert!("jev-lax".parse::<OutputProfile>().is_err());
        assert_eq!(OutputProfile::default(), OutputProfile::Laya);
    }

    #[test]
    fn the_jev_projection_is_the_strict_one_with_jevs_confidence() {
        let full = json!({
            "model": "laya-rl-agent",
            "answers": {
                "q": {"type": "choice", "choice": "a", "probabilities": {"a": 0.7, "b": 0.2, "c": 0.1},
                      "confidence": 0.1187, "answer_confidence": 0.7, "x_jev_confidence": 0.55},
                "s": {"type": "score", "score": 1.0, "probabilities": {"0": 0.25, "1": 0.5, "2": 0.25},
                      "legend": {"0": "low", "1": "mid", "2": "high"}, "confidence": 0.05},
                "n": {"type": "noul", "noul": 0.61, "confidence": 0.61},
            },
            "usage": {"input_tokens": 90, "output_tokens": 0, "state_tokens": 12},
            "routing": {"model": "english"},
        });
        let Value::Object(map) = full else {
            panic!("not an object")
        };
        let text = py_json(&Value::Object(OutputProfile::Jev.project(map)), Separators::Compact);
        // choice: (0.7 - 1/3) / (1 - 1/3) = 0.55; score: mode 1, spread 0.5 against the uniform
        // spread 2/3 → 1 - 0.75 = 0.25.
        assert_eq!(
            text,
            concat!(
                r#"{"model":"laya-rl-agent","answers":{"#,
                r#""q":{"type":"choice","choice":"a","confidence":0.55,"probabilities":{"a":0.7,"b":0.2,"c":0.1}},"#,
                r#""s":{"type":"score","score":1.0,"confidence":0.25,"probabilities":{"0":0.25,"1":0.5,"2":0.25},"legend":{"0":"low","1":"mid","2":"high"}},"#,
                r#""n":{"type":"noul","noul":0.61}},"#,
                r#""usage":{"input_tokens":90,"output_tokens":0}}"#
            )
        );
    }

    #[test]
    fn only_jev_changes_requests_and_plays_wide_choices_without_a_configured_group() {
        assert!(OutputProfile::Jev.is_jev());
        assert!(!OutputProfile::JevStrict.is_jev() && !OutputProfile::Laya.is_jev());
        assert!(OutputProfile::Laya.keeps_extra_keys());
        assert!(!OutputProfile::JevStrict.keeps_extra_keys() && !OutputProfile::Jev.keeps_extra_keys());
        assert_eq!(OutputProfile::Jev.tournament_group(0), 16);
        assert_eq!(OutputProfile::Jev.tournament_group(8), 8);
        assert_eq!(OutputProfile::JevStrict.tournament_group(0), 0);
        assert_eq!(OutputProfile::Laya.tournament_group(12), 12);
    }

    #[test]
    fn a_jev_choice_is_always_a_string_its_probabilities_key() {
        let numeric = json!({"model": "m", "answers": {
            "n": {"type": "choice", "choice": 1, "probabilities": {"1": 0.6, "2": 0.4}, "confidence": 0.03},
            "b": {"type": "choice", "choice": true, "probabilities": {"true": 0.9, "false": 0.1}, "confidence": 0.5},
            "s": {"type": "choice", "choice": "x", "probabilities": {"x": 0.5, "y": 0.5}, "confidence": 0.0},
        }, "usage": {}});
        let Value::Object(map) = numeric else {
            panic!("not an object")
        };
        let out = OutputProfile::Jev.project(map.clone());
        assert_eq!(out["answers"]["n"]["choice"], json!("1"));
        assert_eq!(out["answers"]["b"]["choice"], json!("true"));
        assert_eq!(out["answers"]["s"]["choice"], json!("x"));
        // The strict projection keeps upstream's value.
        assert_eq!(
            OutputProfile::JevStrict.project(map)["answers"]["n"]["choice"],
            json!(1)
        );
    }
}
