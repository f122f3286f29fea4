//! Questions as clients send them: validation with upstream's exact messages (spec §2.1), then the
//! internal form (spec §3.1) and the option texts the model reads (spec §3.2).
//!
//! Validation runs over every question before any is rendered, in request order, like upstream.

use serde_json::{Map, Value};

use crate::output::OutputProfile;
use crate::python_text::{
    Separators, number_as_f64, number_is_int, py_json, py_lower, py_repr, py_repr_str, py_strip, py_type_name,
};
use crate::upstream::Upstream;

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

    /// The type's index in the model's type embedding (and `worker.proto`'s `Row.qtype`).
    pub fn index(self) -> u32 {
        self as u32
    }

    /// The type whose [`index`](Self::index) is `index`; `None` for any other number.
    pub fn from_index(index: u32) -> Option<Self> {
        match index {
            0 => Some(Self::Choice),
            1 => Some(Self::Score),
            2 => Some(Self::Noul),
            _ => None,
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
    Choice(Vec<ChoiceLabel>),
    /// The `legend` of a score answer: the levels exactly as sent (0.3.20 echoes them raw), or as
    /// the option text renders them (0.4.15, always strings).
    Score(Vec<Value>),
    /// Noul answers are always P(true).
    Noul,
}

/// One choice label: what the answer's `choice` holds and what keys its `probabilities`.
#[derive(Clone, Debug, PartialEq)]
pub struct ChoiceLabel {
    /// The label as sent: a string, or (0.4.15, list form) a number or bool, which upstream
    /// answers with as that JSON value.
    pub value: Value,
    /// The `probabilities` key: the string, or the JSON text Python writes for a non-string key
    /// (`1`, `1.5`, `true`).
    pub key: String,
}

impl ChoiceLabel {
    fn new(value: Value) -> Self {
        let key = match &value {
            Value::String(s) => s.clone(),
            other => py_json(other, Separators::Compact),
        };
        Self { value, key }
    }

    /// Python's `str(label)`: how the label reads in its option text.
    fn text(&self) -> String {
        match &self.value {
            Value::String(s) => s.clone(),
            other => py_repr(other),
        }
    }
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
    /// 0.4.15's `option_order`: slot `s` shows option `option_order[s]`; `None` is the identity.
    pub option_order: Option<Vec<usize>>,
}

/// A question upstream rejects with 422, with its message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct QuestionError(pub String);

fn check(qid: &str, def: &Value, upstream: Upstream, output: OutputProfile) -> Result<(), QuestionError> {
    let q = py_repr_str(qid);
    if upstream.differences().question_ids_nonblank && py_strip(qid).is_empty() {
        return Err(QuestionError(format!(
            "question id must be a non-empty string, got {q}"
        )));
    }
    let fail = |text: String| Err(QuestionError(format!("question {q}: {text}")));
    let Some(def) = def.as_object() else {
        return fail(format!("definition must be a dict, got {}", py_type_name(def)));
    };
    let Some(qtype) = QuestionType::parse(def.get("type")) else {
        let shown = def.get("type").map_or_else(|| "None".to_owned(), py_repr);
        return fail(format!("unknown type {shown}; use one of ['choice', 'noul', 'score']"));
    };
    let instructions = def.get("instructions");
    if output.is_jev() {
        // Jev's `instructions` are optional (absent, null or empty): the options carry the
        // question, as in a noul that only has criteria.
    } else if let Some(instructions) = instructions {
        if upstream.differences().instructions_required {
            let empty = match instructions {
                Value::Null => {
                    return fail("'instructions' must not be None; add the text the model should answer".to_owned());
                }
                Value::String(s) => py_strip(s).is_empty(),
                Value::Array(a) => a.is_empty(),
                Value::Object(m) => m.is_empty(),
                Value::Bool(_) | Value::Number(_) => false,
            };
            if empty {
                return fail("'instructions' must not be empty; add the text the model should answer".to_owned());
            }
        }
    } else {
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
            Some(Value::Array(labels)) => match upstream {
                Upstream::V0_3_20 => {
                    // 0.3.20 turns non-string list labels into a 500 `inference failed` (a TypeError
                    // while rendering); a client mistake deserves a 422 that says what to fix.
                    if let Some((i, label)) = labels.iter().enumerate().find(|(_, l)| !l.is_string()) {
                        return fail(format!(
                            "choice label {i} is a {}; list-form labels are the answer keys and must be strings, got {}",
                            py_type_name(label),
                            py_repr(label)
                        ));
                    }
                }
                Upstream::V0_4_15 => {
                    check_list_labels(labels).map_err(|text| QuestionError(format!("question {q}: {text}")))?
                }
            },
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
    if upstream.differences().option_order
        && let Some(order) = def.get("option_order")
        && option_order(order, option_count(qtype, criteria)).is_none()
    {
        return fail(format!(
            "'option_order' must be a permutation of range({}) -- one slot per option, each option once -- got {}",
            option_count(qtype, criteria),
            py_repr(order)
        ));
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

/// 0.4.15's rules for list-form choice labels: scalars only, no null, no label Python would
/// treat as the same dict key as an earlier one (`1`, `1.0` and `true` are one key).
fn check_list_labels(labels: &[Value]) -> Result<(), String> {
    for (i, label) in labels.iter().enumerate() {
        match label {
            Value::Array(_) | Value::Object(_) => {
                return Err(format!(
                    "choice label {i} is a {}; a label is rendered as option text and used as the answer key, \
                     so it must be a scalar (a string, number or bool), got {}",
                    py_type_name(label),
                    py_repr(label)
                ));
            }
            Value::Null => {
                return Err(format!(
                    "choice label {i} is null; a label is rendered as option text and used as the answer key, \
                     so it must be a string, number or bool -- a null label renders as the text \"None\" while \
                     its answer key is \"null\""
                ));
            }
            _ => {}
        }
        if let Some(first) = labels[..i].iter().position(|earlier| same_dict_key(earlier, label)) {
            return Err(format!(
                "choice label {i} ({}) repeats label {first}; the labels are the answer keys, so every option \
                 needs its own (1, 1.0 and True are one key)",
                py_repr(label)
            ));
        }
    }
    Ok(())
}

/// Deliberately stricter than upstream, and only once upstream would answer (every question
/// passed its checks): `[0, "0"]` are two Python keys that JSON writes as one, so upstream's
/// `probabilities` repeats a key, which a JSON reader collapses to one.
fn check_label_keys(labels: &[Value]) -> Result<(), String> {
    let keys: Vec<String> = labels.iter().map(|l| ChoiceLabel::new(l.clone()).key).collect();
    for (i, key) in keys.iter().enumerate() {
        if let Some(first) = keys[..i].iter().position(|earlier| earlier == key) {
            return Err(format!(
                "choice label {i} ({}) has the same answer key {} as label {first} ({}); a JSON object \
                 cannot hold both, so give every option a label of its own",
                py_repr(&labels[i]),
                py_repr_str(key),
                py_repr(&labels[first])
            ));
        }
    }
    Ok(())
}

/// Whether Python would read two scalar labels as one dict key (`==` on str, int, float, bool).
fn same_dict_key(a: &Value, b: &Value) -> bool {
    let numeric = |v: &Value| match v {
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        Value::Number(n) => Some(number_as_f64(n)),
        _ => None,
    };
    match (a, b) {
        (Value::String(x), Value::String(y)) => x == y,
        // Two integer literals compare exactly, whatever their size.
        (Value::Number(x), Value::Number(y)) if number_is_int(x) && number_is_int(y) => {
            let (x, y) = (x.to_string(), y.to_string());
            match (x.parse::<i128>(), y.parse::<i128>()) {
                (Ok(x), Ok(y)) => x == y,
                _ => x == y,
            }
        }
        _ => matches!((numeric(a), numeric(b)), (Some(x), Some(y)) if x == y),
    }
}

/// How many options a question renders to (upstream's `_option_count`): two for noul.
fn option_count(qtype: QuestionType, criteria: Option<&Value>) -> usize {
    match (qtype, criteria) {
        (QuestionType::Noul, _) => 2,
        (_, Some(Value::Array(a))) => a.len(),
        (_, Some(Value::Object(m))) => m.len(),
        _ => 0,
    }
}

/// A valid `option_order`: a list of `n` integers (not bools) that is a permutation of `0..n`.
fn option_order(value: &Value, n: usize) -> Option<Vec<usize>> {
    let items = value.as_array().filter(|a| a.len() == n)?;
    let order: Vec<usize> = items
        .iter()
        .map(|v| {
            v.as_number()
                .filter(|n| number_is_int(n))
                .and_then(|n| n.to_string().parse().ok())
        })
        .collect::<Option<_>>()?;
    let mut sorted = order.clone();
    sorted.sort_unstable();
    sorted.iter().enumerate().all(|(i, v)| i == *v).then_some(order)
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

fn to_internal(id: &str, def: &Map<String, Value>, upstream: Upstream, output: OutputProfile) -> Question {
    // `check` has run, so the shapes below are the validated ones.
    let qtype = QuestionType::parse(def.get("type")).unwrap_or(QuestionType::Noul);
    let instructions = match def.get("instructions") {
        Some(Value::String(s)) => s.clone(),
        // Jev's optional instructions, absent: the head reads `<type> question: ` and the options
        // carry the question.
        None | Some(Value::Null) if output.is_jev() => String::new(),
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
            let labels = m.keys().map(|k| ChoiceLabel::new(Value::String(k.clone()))).collect();
            (options, AnswerKeys::Choice(labels))
        }
        (QuestionType::Choice, Some(Value::Array(items))) => {
            // `{label: None for label in criteria}`: duplicates collapse onto their first position
            // (only strings reach here under 0.3.20; 0.4.15 refused repeats and non-scalars).
            let mut labels: Vec<ChoiceLabel> = Vec::with_capacity(items.len());
            for label in items {
                if !labels.iter().any(|l| same_dict_key(&l.value, label)) {
                    labels.push(ChoiceLabel::new(label.clone()));
                }
            }
            (
                labels.iter().map(ChoiceLabel::text).collect(),
                AnswerKeys::Choice(labels),
            )
        }
        (QuestionType::Score, Some(Value::Array(levels))) => {
            let options = levels
                .iter()
                .enumerate()
                .map(|(i, c)| format!("level {i}: {}", render_criterion(c)))
                .collect();
            let legend = match upstream {
                Upstream::V0_3_20 => levels.clone(),
                Upstream::V0_4_15 => levels.iter().map(|c| Value::String(render_criterion(c))).collect(),
            };
            (options, AnswerKeys::Score(legend))
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
    let option_order = match upstream {
        Upstream::V0_3_20 => None,
        Upstream::V0_4_15 => def.get("option_order").and_then(|o| option_order(o, options.len())),
    };
    Question {
        id: id.to_owned(),
        qtype,
        instructions,
        options,
        keys,
        option_order,
    }
}

/// Validates every question in request order (the first failure wins), then renders them all.
pub fn parse_questions(questions: &Map<String, Value>, upstream: Upstream) -> Result<Vec<Question>, QuestionError> {
    parse_questions_in(questions, upstream, OutputProfile::Laya)
}

/// [`parse_questions`] for a server in the `output` profile: under `jev`, `instructions` are
/// optional (absent, null or empty), as the Jev contract has them; every other rule is the release's.
pub fn parse_questions_in(
    questions: &Map<String, Value>,
    upstream: Upstream,
    output: OutputProfile,
) -> Result<Vec<Question>, QuestionError> {
    for (id, def) in questions {
        check(id, def, upstream, output)?;
    }
    if upstream.differences().label_keys_distinct {
        for (id, def) in questions {
            if def["type"] == "choice"
                && let Some(Value::Array(labels)) = def.get("criteria")
            {
                check_label_keys(labels)
                    .map_err(|text| QuestionError(format!("question {}: {text}", py_repr_str(id))))?;
            }
        }
    }
    Ok(questions
        .iter()
        .filter_map(|(id, def)| def.as_object().map(|def| to_internal(id, def, upstream, output)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<Vec<Question>, QuestionError> {
        parse_questions(v.as_object().expect("object"), Upstream::V0_3_20)
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

    fn newer(v: Value) -> Result<Vec<Question>, QuestionError> {
        parse_questions(v.as_object().expect("object"), Upstream::V0_4_15)
    }

    #[test]
    fn the_0_4_15_rules_and_their_texts() {
        let err = |v: Value| newer(v).expect_err("invalid").0;
        assert_eq!(err(json!({" ": {}})), "question id must be a non-empty string, got ' '");
        assert_eq!(
            err(json!({"q": {"type": "noul", "instructions": null}})),
            "question 'q': 'instructions' must not be None; add the text the model should answer"
        );
        assert_eq!(
            err(json!({"q": {"type": "noul", "instructions": []}})),
            "question 'q': 'instructions' must not be empty; add the text the model should answer"
        );
        assert!(
            err(json!({"q": {"type": "choice", "instructions": "x", "criteria": [1, true]}}))
                .contains("choice label 1 (True) repeats label 0")
        );
        assert!(
            err(json!({"q": {"type": "choice", "instructions": "x", "criteria": ["a", null]}}))
                .starts_with("question 'q': choice label 1 is null")
        );
        assert!(
            err(json!({"q": {"type": "choice", "instructions": "x", "criteria": [["a"]]}}))
                .starts_with("question 'q': choice label 0 is a list")
        );
        assert!(
            err(json!({"q": {"type": "choice", "instructions": "x", "criteria": [0, "0"]}}))
                .contains("same answer key '0' as label 0 (0)")
        );
        for order in [
            json!([0, 0]),
            json!([1]),
            json!([1.0, 0]),
            json!([true, 0]),
            json!(null),
        ] {
            let e = err(json!({"q": {"type": "noul", "instructions": "x", "option_order": order.clone()}}));
            assert_eq!(
                e,
                format!(
                    "question 'q': 'option_order' must be a permutation of range(2) -- one slot per option, each option once -- got {}",
                    py_repr(&order)
                )
            );
        }
        let qs = newer(json!({
            "c": {"type": "choice", "instructions": 0, "criteria": [1, 2.5, false], "option_order": [2, 0, 1]},
            "s": {"type": "score", "instructions": "x", "criteria": ["low", 1, {"a": 1}]}
        }))
        .expect("valid");
        assert_eq!(qs[0].options, ["1", "2.5", "False"]);
        assert_eq!(qs[0].option_order, Some(vec![2, 0, 1]));
        let AnswerKeys::Choice(labels) = &qs[0].keys else {
            panic!("a choice")
        };
        let keys: Vec<&str> = labels.iter().map(|l| l.key.as_str()).collect();
        assert_eq!(keys, ["1", "2.5", "false"]);
        assert_eq!(labels[0].value, json!(1));
        assert_eq!(
            qs[1].keys,
            AnswerKeys::Score(vec![json!("low"), json!("1"), json!("{\"a\": 1}")])
        );
    }

    #[test]
    fn jev_questions_need_no_instructions_and_keep_every_other_rule() {
        let bare = json!({
            "threat": {"type": "noul", "criteria": {"true": "a threat", "false": "no threat"}},
            "team": {"type": "choice", "instructions": null, "criteria": {"a": null, "b": null}},
            "mood": {"type": "score", "instructions": "", "criteria": ["calm", "angry"]},
        });
        let map = bare.as_object().expect("object");
        let refused = parse_questions(map, Upstream::V0_4_15).expect_err("upstream needs instructions");
        assert_eq!(
            refused.0,
            "question 'threat': no 'instructions'; add the text the model should answer"
        );
        let qs = parse_questions_in(map, Upstream::V0_4_15, OutputProfile::Jev).expect("jev takes them");
        assert_eq!(
            qs.iter().map(|q| q.instructions.as_str()).collect::<Vec<_>>(),
            ["", "", ""]
        );
        assert_eq!(qs[0].options, ["false: no threat", "true: a threat"]);
        assert!(parse_questions_in(map, Upstream::V0_4_15, OutputProfile::JevStrict).is_err());
        let unknown = json!({"q": {"type": "boolean"}});
        assert_eq!(
            parse_questions_in(
                unknown.as_object().expect("object"),
                Upstream::V0_4_15,
                OutputProfile::Jev
            )
            .expect_err("still a bad type")
            .0,
            "question 'q': unknown type 'boolean'; use one of ['choice', 'noul', 'score']"
        );
    }
}
