//! Which shape an answer leaves the server in (`[compat] output`): upstream's full payload
//! (`"laya"`, the default) or upstream 0.4.15's strict Jev projection (`"jev-strict"`, what
//! `LAYA_JEV_STRICT` turns on), applied to each finished answer exactly as upstream's
//! `_project_jev_strict` does.

use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value};

/// The output profile of a server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OutputProfile {
    /// Upstream's keys as the chosen release writes them (`routing`, `action`, the extended
    /// `usage`, 0.4.x's `x_jev_confidence`).
    #[default]
    Laya,
    /// Upstream 0.4.15's `LAYA_JEV_STRICT`: only the keys the Jev wire contract defines.
    JevStrict,
}

impl OutputProfile {
    /// Every profile.
    pub const ALL: [OutputProfile; 2] = [OutputProfile::Laya, OutputProfile::JevStrict];

    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputProfile::Laya => "laya",
            OutputProfile::JevStrict => "jev-strict",
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
    "unknown output profile {0:?}; use \"laya\" (upstream's keys, the default) or \"jev-strict\" (LAYA_JEV_STRICT)"
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
        assert!("jev".parse::<OutputProfile>().is_err());
        assert_eq!(OutputProfile::default(), OutputProfile::Laya);
    }
}
