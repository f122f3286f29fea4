//! Questions as clients send them: validation with upstream's exact messages (spec §2.1), then the
//! internal form (spec §3.1) and the option texts the model reads (spec §3.2).
//!
//! Validation runs over every question before any is rendered, in request order, like upstream.

use serde_json::{Map, Value};

use crate::python_text::{Separators, py_json, py_lower, py_repr, py_repr_str, py_strip, py_type_name};

/// The three question types, with upstream's `qtype` index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuestionType {
    /// Pick one label (`qtype` 0).
    Choice = 0,
    /// Expected level on a scale (`qtype` 1).
    Score = 1,
    /// Yes/no probability (`qtype` 2).
    Noul = 2,
}

impl QuestionType {
    /// The type's name as written in requests and answers.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Choice => "choice",
            Self::Score => "score",
            Self::Noul => "noul",
        }
    }

    fn parse(value: Option<&Value>) -> Option<Self> {
        match value?.as_str()? {
            "choice" => Some(Self::Choice),
            "score" => Some(Self::Score),
            "noul" => Some(Self::Noul),
            _ => None,
        }
    }
}

/// What an answer is keyed by.
#[derive(Clone, Debug, PartialEq)]
pub enum AnswerKeys {
    /// Choice labels in criteria order (duplicates of the list form collapsed).
    Choice(Vec<String>),
    /// Score levels exactly as sent; 0.3.20 echoes them raw as the `legend`.
    Score(Vec<Value>),
    /// Noul answers are always P(true).
    Noul,
}

/// One validated question in internal form.
#[derive(Clone, Debug, PartialEq)]
pub struct Question {
    /// The question id (the request's object key).
    pub id: String,
    /// Its type.
    pub qtype: QuestionType,
    /// Instruction text: the string as sent, or `py_json` of any other value.
    pub instructions: String,
    /// Option texts in option order (mask token not yet removed).
    pub options: Vec<String>,
    /// What the answer is keyed by.
    pub keys: AnswerKeys,
}

/// A question upstream rejects with 422, with its message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct QuestionError(pub String);

fn check(qid: &str, def: &Value) -> Result<(), QuestionError> {
    let q = py_repr_str(qid);
    let fail = |text: String| Err(QuestionError(format!("question {q}: {text}")));
    let Some(def) = def.as_object() else {
        return fail(format!("definition must be a dict, got {}", py_type_name(def)));
    };
    let Some(qtype) = QuestionType::parse(def.get("type")) else {
        let shown = def.get("type").map_or_else(|| "None".to_owned(), py_repr);
        return fail(format!("unknown type {shown}; use one of ['choice', 'noul', 'score']"));
    };
    if !def.contains_key("instructions") {
        return fail("no 'instructions'; add the text the model should answer".to_owned());
    }
    let criteria = def.get("criteria").filter(|c| !c.is_null());
    match qtype {
        QuestionType::Choice => match criteria {
            Some(Value::Object(m)) if m.is_empty() => {
                return fail("a choice question needs at least one criterion".to_owned());
            }
            Some(Value::Array(a)) if a.is_empty() => {
                return fail("a choice question needs at least one criterion".to_owned());
            }
            Some(Value::Array(labels)) => {
                // Upstream turns non-string list labels into a 500 `inference failed` (a TypeError
                // while rendering); a client mistake deserves a 422 that says what to fix.
                if let Some((i, label)) = labels.iter().enumerate().find(|(_, l)| !l.is_string()) {
                    return fail(format!(
                        "choice label {i} is a {}; list-form labels are the answer keys and must be strings, got {}",
                        py_type_name(label),
                        py_repr(label)
                    ));
                }
            }
            Some(Value::Object(_)) => {}
            _ => {
                return fail(
                    "a choice question takes 'criteria' as a dict of label -> description, or a list of labels"
                        .to_owned(),
                );
            }
        },
        QuestionType::Score => match criteria {
            Some(Value::Array(a)) if a.is_empty() => {
                return fail("a score question needs at least one level".to_owned());
            }
            Some(Value::Array(_)) => {}
            _ => {
                return fail(
                    "a score question takes 'criteria' as a list of level descriptions, index 0 first".to_owned(),
                );
            }
        },
        QuestionType::Noul => {
            match criteria {
                None => {}
                Some(Value::Object(m)) => {
                    let mut keys: Vec<String> = m.keys().map(|k| py_lower(k)).collect();
                    keys.sort();
                    keys.dedup();
                    if keys.iter().any(|k| k != "true" && k != "false") {
                        let shown = keys.iter().map(|k| py_repr_str(k)).collect::<Vec<_>>().join(", ");
                        return fail(format!(
                            "a noul question takes 'criteria' keyed only 'true'/'false' (either or both, and omitted is fine), got [{shown}]. \
                         Those keys are the option texts the model reads; any other key was silently dropped and replaced with the defaults. \
                         If you want the answer worded differently, keep 'criteria' keyed 'true'/'false' and set 'labels' instead."
                        ));
                    }
                }
                Some(_) => return fail(
                    "a noul question takes 'criteria' as a dict with optional 'true'/'false' descriptions, or omits it"
                        .to_owned(),
                ),
            }
        }
    }
    if let Some(labels) = def.get("labels") {
        if qtype != QuestionType::Noul {
            return fail("'labels' is only supported for noul questions".to_owned());
        }
        // `labels: null` means the default pair, as upstream's `_resolve_noul_labels(None)`.
        if !labels.is_null() && noul_labels(labels).is_none() {
            return fail("noul labels must map exactly 'false' and 'true' to distinct non-empty strings".to_owned());
        }
    }
    Ok(())
}

/// Upstream's `_resolve_noul_labels`: the stripped (false, true) label pair, or `None` if invalid.
fn noul_labels(labels: &Value) -> Option<(String, String)> {
    let map = labels.as_object()?;
    if map.len() != 2 {
        return None;
    }
    let f = py_strip(map.get("false")?.as_str()?);
    let t = py_strip(map.get("true")?.as_str()?);
    (!f.is_empty() && !t.is_empty() && f != t).then(|| (f.to_owned(), t.to_owned()))
}

/// Upstream's `render_criterion`: strings as they are, anything else as `py_json`.
fn render_criterion(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => py_json(other, Separators::Spaced),
    }
}

/// Null or `""`: the "no description" values.
fn is_blank(value: Option<&Value>) -> bool {
    matches!(value, None | Some(Value::Null)) || value.and_then(Value::as_str) == Some("")
}

fn to_internal(id: &str, def: &Map<String, Value>) -> Question {
    // `check` has run, so the shapes below are the validated ones.
    let qtype = QuestionType::parse(def.get("type")).unwrap_or(QuestionType::Noul);
    let instructions = match def.get("instructions") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => py_json(other, Separators::Spaced),
        None => "null".to_owned(),
    };
    let criteria = def.get("criteria").filter(|c| !c.is_null());
    let (options, keys) = match (qtype, criteria) {
        (QuestionType::Choice, Some(Value::Object(m))) => {
            let options = m
                .iter()
                .map(|(label, desc)| {
                    if is_blank(Some(desc)) {
                        label.clone()
                    } else {
                        format!("{label}: {}", render_criterion(desc))
                    }
                })
                .collect();
            (options, AnswerKeys::Choice(m.keys().cloned().collect()))
        }
        (QuestionType::Choice, Some(Value::Array(items))) => {
            // `{label: None for label in criteria}`: duplicates collapse onto their first position.
            let mut labels: Vec<String> = Vec::with_capacity(items.len());
            for label in items.iter().filter_map(Value::as_str) {
                if !labels.iter().any(|l| l == label) {
                    labels.push(label.to_owned());
                }
            }
            (labels.clone(), AnswerKeys::Choice(labels))
        }
        (QuestionType::Score, Some(Value::Array(levels))) => {
            let options = levels
                .iter()
                .enumerate()
                .map(|(i, c)| format!("level {i}: {}", render_criterion(c)))
                .collect();
            (options, AnswerKeys::Score(levels.clone()))
        }
        _ => {
            let mut described: [Option<&Value>; 2] = [None, None];
            if let Some(Value::Object(m)) = criteria {
                // Keys are lower-cased; a later duplicate wins, as in upstream's dict comprehension.
                for (k, v) in m {
                    match py_lower(k).as_str() {
                        "false" => described[0] = Some(v),
                        "true" => described[1] = Some(v),
                        _ => {}
                    }
                }
            }
            let (false_label, true_label) = def
                .get("labels")
                .and_then(noul_labels)
                .unwrap_or_else(|| ("false".to_owned(), "true".to_owned()));
            let text = |label: &str, desc: Option<&Value>, default: &str| {
                let body = if is_blank(desc) {
                    default.to_owned()
                } else {
                    desc.map(render_criterion).unwrap_or_default()
                };
                format!("{label}: {body}")
            };
            let options = vec![
                text(&false_label, described[0], "no, the statement does not hold"),
                text(&true_label, described[1], "yes, the statement holds"),
            ];
            (options, AnswerKeys::Noul)
        }
    };
    Question {
        id: id.to_owned(),
        qtype,
        instructions,
        options,
        keys,
    }
}

/// Validates every question in request order (the first failure wins), then renders them all.
pub fn parse_questions(questions: &Map<String, Value>) -> Result<Vec<Question>, QuestionError> {
    for (id, def) in questions {
        check(id, def)?;
    }
    Ok(questions
        .iter()
        .filter_map(|(id, def)| def.as_object().map(|def| to_internal(id, def)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<Vec<Question>, QuestionError> {
        parse_questions(v.as_object().expect("object"))
    }

    #[test]
    fn options_render_like_upstream() {
        let qs = parse(json!({
            "c": {"type": "choice", "instructions": {"task": "route"}, "criteria": {"a": "", "b": null, "c": {"desc": "x"}, "d": 0}},
            "l": {"type": "choice", "instructions": "x", "criteria": ["yes", "no", "yes"]},
            "s": {"type": "score", "instructions": null, "criteria": ["low", 1, null]},
            "n": {"type": "noul", "instructions": 5, "criteria": {"TRUE": "it holds", "False": ""}, "labels": {"false": " B ", "true": "A"}}
        }))
        .expect("valid");
        assert_eq!(qs[0].instructions, r#"{"task": "route"}"#);
        assert_eq!(qs[0].options, ["a", "b", r#"c: {"desc": "x"}"#, "d: 0"]);
        assert_eq!(qs[1].options, ["yes", "no"]);
        assert_eq!(qs[2].instructions, "null");
        assert_eq!(qs[2].options, ["level 0: low", "level 1: 1", "level 2: null"]);
        assert_eq!(qs[3].instructions, "5");
        assert_eq!(qs[3].options, ["B: no, the statement does not hold", "A: it holds"]);
    }

    #[test]
    fn validation_messages_match_upstream() {
        let cases = [
            (json!({"q": 5}), "question 'q': definition must be a dict, got int"),
            (
                json!({"q": {"type": "yes"}}),
                "question 'q': unknown type 'yes'; use one of ['choice', 'noul', 'score']",
            ),
            (
                json!({"q": {}}),
                "question 'q': unknown type None; use one of ['choice', 'noul', 'score']",
            ),
            (
                json!({"q": {"type": "noul"}}),
                "question 'q': no 'instructions'; add the text the model should answer",
            ),
            (
                json!({"q": {"type": "choice", "instructions": "", "criteria": []}}),
                "question 'q': a choice question needs at least one criterion",
            ),
            (
                json!({"q": {"type": "score", "instructions": "", "criteria": {}}}),
                "question 'q': a score question takes 'criteria' as a list of level descriptions, index 0 first",
            ),
            (
                json!({"q": {"type": "choice", "instructions": "", "criteria": ["a"], "labels": {}}}),
                "question 'q': 'labels' is only supported for noul questions",
            ),
            (
                json!({"q": {"type": "noul", "instructions": "", "labels": {"false": "x", "true": " x "}}}),
                "question 'q': noul labels must map exactly 'false' and 'true' to distinct non-empty strings",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(parse(input).expect_err("invalid").0, want);
        }
        let err = parse(json!({"ok": {"type": "noul", "instructions": ""}, "bad": {"type": "noul", "instructions": "", "criteria": {"Yes": 1, "true": 2}}}))
            .expect_err("bad keys");
        assert!(err.0.starts_with("question 'bad': a noul question takes 'criteria' keyed only 'true'/'false' (either or both, and omitted is fine), got ['true', 'yes']."), "{}", err.0);
    }
}
