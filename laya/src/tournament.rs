//! Upstream 0.4.15's tournament choices (`LAYA_TOURNAMENT_GROUP`, serve.py's `_tournament_plan`
//! and `_predict_with_tournament` over shortlist.py's `predict_tournament`), as pure steps: which
//! choices are narrowed, each elimination round's group questions, the next round's candidates,
//! the final call's questions and the merged answer. The calls themselves (one forward per round,
//! then the final one) belong to whoever runs jobs; this module never sees a model.

use serde_json::{Map, Value};

use crate::error::RequestError;
use crate::jev::jev_confidence;
use crate::python_text::{float_value, py_repr, py_repr_str, round4};
use crate::request::MAX_CHOICE_OPTIONS;

/// Most options of one choice question when tournament mode is on (`MAX_TOURNAMENT_CHOICE_OPTIONS`).
pub const MAX_TOURNAMENT_CHOICE_OPTIONS: usize = 255;

/// Upstream's accepted group sizes: anything else leaves tournament mode off.
pub const GROUP_RANGE: std::ops::RangeInclusive<usize> = 2..=MAX_CHOICE_OPTIONS;

/// One narrowed choice: its candidates so far and how many rounds it played.
#[derive(Clone, Debug, PartialEq)]
struct Entry {
    qid: String,
    /// Every label of the caller's criteria, in criteria order.
    all: Vec<String>,
    /// The labels still in play (after the last round: the finalists).
    labels: Vec<String>,
    rounds: u32,
}

/// A request's tournament: the caller's questions and the choices that are narrowed.
#[derive(Clone, Debug, PartialEq)]
pub struct Tournament {
    group: usize,
    questions: Map<String, Value>,
    entries: Vec<Entry>,
}

/// One elimination round: its questions (`"0"`, `"1"`, … one per group) and which narrowed
/// choice each group belongs to.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    /// The group questions, numbered in order, sent to the model as one request.
    pub questions: Map<String, Value>,
    owners: Vec<usize>,
}

/// The labels of a dict or list criteria, or `None` for another shape (a list item that is not a
/// string stays a `Value`, so the caller can tell it cannot be mapped back).
fn criteria_labels(criteria: &Value) -> Option<Vec<Value>> {
    match criteria {
        Value::Object(map) => Some(map.keys().map(|k| Value::from(k.clone())).collect()),
        Value::Array(items) => Some(items.clone()),
        _ => None,
    }
}

fn is_choice(question: &Value) -> bool {
    question.get("type").and_then(Value::as_str) == Some("choice")
}

/// Which choices of `questions` are answered by elimination in groups of `group`, or `None` to
/// answer in one pass (`_tournament_plan`), then `predict_tournament`'s checks of every choice.
/// The errors are upstream's: 422 with its text for a `ValueError`, 500 for its `TypeError`.
pub fn plan(questions: &Map<String, Value>, group: usize) -> Result<Option<Tournament>, RequestError> {
    if !GROUP_RANGE.contains(&group) {
        return Ok(None);
    }
    let mut large: Vec<(&String, Vec<Value>)> = Vec::new();
    for (qid, question) in questions {
        if !(question.is_object() && is_choice(question)) {
            continue;
        }
        if let Some(labels) = question.get("criteria").and_then(criteria_labels)
            && labels.len() > group
        {
            // Upstream reads these labels with `_criteria_items`, which refuses repeats here.
            check_distinct(&labels)?;
            large.push((qid, labels));
        }
    }
    if large.is_empty() {
        return Ok(None);
    }
    let unmappable = large
        .iter()
        .find(|(_, labels)| !labels.iter().all(Value::is_string))
        .map(|(qid, _)| *qid);
    let ordered = large
        .iter()
        .any(|(qid, _)| questions[*qid].get("option_order").is_some_and(|o| !o.is_null()));
    if large.iter().any(|(_, labels)| labels.len() > MAX_CHOICE_OPTIONS) {
        if let Some(qid) = unmappable {
            return Err(RequestError::new(
                422,
                format!(
                    "question {}: a choice is narrowed by elimination once a request has one over \
                     {MAX_CHOICE_OPTIONS} options, and that needs every label to be a string",
                    py_repr_str(qid)
                ),
            ));
        }
    } else if unmappable.is_some() || ordered {
        return Ok(None);
    }
    // `predict_tournament` reads the labels of every choice before its first round.
    for (qid, question) in questions {
        if !(question.is_object() && is_choice(question)) {
            continue;
        }
        let Some(criteria) = question.get("criteria") else {
            return Err(RequestError::new(
                422,
                format!("question {} is a choice but has no criteria", py_repr_str(qid)),
            ));
        };
        let Some(labels) = criteria_labels(criteria) else {
            // A `TypeError` there: upstream's 500.
            return Err(RequestError::inference_failed());
        };
        if labels.is_empty() {
            return Err(RequestError::new(
                422,
                "choice criteria must contain at least one option",
            ));
        }
        check_distinct(&labels)?;
    }
    let entries = large
        .into_iter()
        .map(|(qid, labels)| {
            let all: Vec<String> = labels.iter().filter_map(|l| l.as_str().map(str::to_owned)).collect();
            Entry {
                qid: qid.clone(),
                labels: all.clone(),
                all,
                rounds: 0,
            }
        })
        .collect();
    Ok(Some(Tournament {
        group,
        questions: questions.clone(),
        entries,
    }))
}

/// A label as a Python set member: `None`, a number (`True` is `1`, `1.0` is `1`) or a string;
/// `None` for a list or object, which Python cannot hash.
#[derive(PartialEq)]
enum SetKey<'a> {
    Null,
    Number(f64),
    Text(&'a str),
}

fn set_key(label: &Value) -> Option<SetKey<'_>> {
    match label {
        Value::Null => Some(SetKey::Null),
        Value::Bool(b) => Some(SetKey::Number(f64::from(u8::from(*b)))),
        Value::Number(n) => n.as_f64().map(SetKey::Number),
        Value::String(s) => Some(SetKey::Text(s)),
        Value::Array(_) | Value::Object(_) => None,
    }
}

/// `_criteria_items`' scan: the first label equal (as Python compares set members) to an earlier
/// one is 422 `choice criteria label … is duplicated`; an unhashable label is its `TypeError`, 500.
fn check_distinct(labels: &[Value]) -> Result<(), RequestError> {
    let mut seen: Vec<SetKey<'_>> = Vec::with_capacity(labels.len());
    for label in labels {
        let key = set_key(label).ok_or_else(RequestError::inference_failed)?;
        if seen.contains(&key) {
            return Err(RequestError::new(
                422,
                format!("choice criteria label {} is duplicated", py_repr(label)),
            ));
        }
        seen.push(key);
    }
    Ok(())
}

impl Tournament {
    /// The caller's question `qid` cut to `labels` (`cut`): criteria narrowed in place, any
    /// `option_order` dropped, since it no longer fits the kept options.
    fn cut(&self, qid: &str, labels: &[String]) -> Value {
        let mut question = self.questions.get(qid).cloned().unwrap_or(Value::Null);
        if let Value::Object(fields) = &mut question {
            let narrowed = match fields.get("criteria") {
                Some(Value::Object(criteria)) => Value::Object(
                    labels
                        .iter()
                        .map(|l| (l.clone(), criteria.get(l).cloned().unwrap_or(Value::Null)))
                        .collect(),
                ),
                _ => Value::Array(labels.iter().cloned().map(Value::from).collect()),
            };
            fields.insert("criteria".to_owned(), narrowed);
            fields.shift_remove("option_order");
        }
        question
    }

    /// The next elimination round, or `None` when no narrowed choice has more than a group's
    /// labels left: each such choice cut in criteria order into near-equal groups.
    pub fn next_round(&self) -> Option<Round> {
        let mut questions = Map::new();
        let mut owners = Vec::new();
        for (index, entry) in self.entries.iter().enumerate() {
            let n = entry.labels.len();
            let parts = n.div_ceil(self.group);
            if parts < 2 {
                continue;
            }
            for i in 0..parts {
                let group = &entry.labels[i * n / parts..(i + 1) * n / parts];
                questions.insert(owners.len().to_string(), self.cut(&entry.qid, group));
                owners.push(index);
            }
        }
        (!owners.is_empty()).then_some(Round { questions, owners })
    }

    /// Takes each group's winner (`answers[i]["choice"]`) through to the next round. A missing
    /// or unusable answer is a 500: the model answered a question it was asked.
    pub fn advance(&mut self, round: &Round, answers: &Map<String, Value>) -> Result<(), RequestError> {
        let mut winners: Vec<Option<Vec<String>>> = vec![None; self.entries.len()];
        for (i, &owner) in round.owners.iter().enumerate() {
            let choice = answers
                .get(&i.to_string())
                .and_then(|a| a.get("choice"))
                .and_then(Value::as_str)
                .ok_or_else(RequestError::inference_failed)?;
            winners[owner].get_or_insert_with(Vec::new).push(choice.to_owned());
        }
        for (entry, won) in self.entries.iter_mut().zip(winners) {
            if let Some(won) = won {
                entry.labels = won;
                entry.rounds += 1;
            }
        }
        Ok(())
    }

    /// The final call's questions: the caller's, with each narrowed choice cut to its finalists.
    pub fn final_questions(&self) -> Map<String, Value> {
        let mut questions = self.questions.clone();
        for entry in self.entries.iter().filter(|e| e.rounds > 0) {
            let cut = self.cut(&entry.qid, &entry.labels);
            questions.insert(entry.qid.clone(), cut);
        }
        questions
    }

    /// The answer to the caller, from the final call's (unprojected) body and every call's
    /// `input_tokens` summed: each narrowed choice names all its labels in `probabilities` (the
    /// eliminated ones 0.0) and gains `x_tournament`, then `x_jev_confidence` over those
    /// probabilities when `jev_key` (0.4.15 adds it after the tournament keys).
    pub fn merge(&self, mut body: Map<String, Value>, input_tokens: u64, jev_key: bool) -> Map<String, Value> {
        if let Some(Value::Object(answers)) = body.get_mut("answers") {
            for entry in self.entries.iter().filter(|e| e.rounds > 0) {
                let Some(Value::Object(answer)) = answers.get_mut(&entry.qid) else {
                    continue;
                };
                let had_jev = answer.shift_remove("x_jev_confidence").is_some();
                let finals = answer
                    .get("probabilities")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                let probabilities: Map<String, Value> = entry
                    .all
                    .iter()
                    .map(|l| (l.clone(), finals.get(l).cloned().unwrap_or_else(|| float_value(0.0))))
                    .collect();
                answer.insert("probabilities".to_owned(), Value::Object(probabilities));
                let mut report = Map::new();
                report.insert(
                    "finalists".to_owned(),
                    Value::Array(entry.labels.iter().cloned().map(Value::from).collect()),
                );
                report.insert("rounds".to_owned(), Value::from(entry.rounds));
                if self.questions[&entry.qid]
                    .get("option_order")
                    .is_some_and(|o| !o.is_null())
                {
                    report.insert("option_order_dropped".to_owned(), Value::Bool(true));
                }
                answer.insert("x_tournament".to_owned(), Value::Object(report));
                if (had_jev || jev_key)
                    && let Some(jev) = jev_confidence(answer)
                {
                    answer.insert("x_jev_confidence".to_owned(), float_value(round4(jev)));
                }
            }
        }
        if let Some(Value::Object(usage)) = body.get_mut("usage") {
            usage.insert("input_tokens".to_owned(), Value::from(input_tokens));
        }
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("l{i}")).collect()
    }

    fn questions(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => panic!("not an object"),
        }
    }

    fn winners_of(round: &Round, pick: impl Fn(&[Value]) -> Value) -> Map<String, Value> {
        round
            .questions
            .iter()
            .map(|(id, q)| {
                let criteria = criteria_labels(&q["criteria"]).unwrap_or_default();
                (id.clone(), json!({"choice": pick(&criteria)}))
            })
            .collect()
    }

    #[test]
    fn a_choice_of_128_in_groups_of_16_plays_one_round_of_eight_groups() {
        let qs = questions(json!({"c": {"type": "choice", "criteria": labels(128)}, "n": {"type": "noul"}}));
        let mut t = plan(&qs, 16).expect("planned").expect("a tournament");
        let round = t.next_round().expect("a round");
        assert_eq!(round.questions.len(), 8);
        assert_eq!(round.questions["0"]["criteria"], json!(labels(16)));
        assert_eq!(round.questions["7"]["criteria"][15], json!("l127"));
        let answers = winners_of(&round, |c| c[3].clone());
        t.advance(&round, &answers).expect("ok");
        assert!(t.next_round().is_none());
        let finals = t.final_questions();
        assert_eq!(
            finals["c"]["criteria"],
            json!(["l3", "l19", "l35", "l51", "l67", "l83", "l99", "l115"])
        );
        assert_eq!(finals["n"], json!({"type": "noul"}));
    }

    #[test]
    fn groups_are_near_equal_like_upstreams_integer_slices() {
        // 255 labels, group 16: 16 parts, slices i*255//16 .. (i+1)*255//16.
        let qs = questions(json!({"c": {"type": "choice", "criteria": labels(255)}}));
        let t = plan(&qs, 16).expect("planned").expect("a tournament");
        let round = t.next_round().expect("a round");
        let sizes: Vec<usize> = round
            .questions
            .values()
            .map(|q| q["criteria"].as_array().expect("array").len())
            .collect();
        assert_eq!(sizes.len(), 16);
        assert_eq!(sizes[0], 15);
        assert_eq!(sizes.iter().sum::<usize>(), 255);
    }

    #[test]
    fn a_field_wider_than_a_group_squared_plays_more_rounds_and_the_merge_names_every_label() {
        let qs = questions(json!({"c": {"type": "choice", "criteria": labels(101)}}));
        let mut t = plan(&qs, 3).expect("planned").expect("a tournament");
        let mut rounds = 0;
        while let Some(round) = t.next_round() {
            let answers = winners_of(&round, |c| c[0].clone());
            t.advance(&round, &answers).expect("ok");
            rounds += 1;
        }
        assert_eq!(rounds, 4); // 101 → 34 → 12 → 4 → 2
        let body = questions(json!({
            "model": "m",
            "answers": {"c": {"type": "choice", "choice": "l0", "probabilities": {"l0": 0.75, "l51": 0.25},
                              "confidence": 0.2, "x_jev_confidence": 0.9}},
            "usage": {"input_tokens": 5, "output_tokens": 0},
        }));
        let merged = t.merge(body, 99, true);
        let answer = &merged["answers"]["c"];
        let p = answer["probabilities"].as_object().expect("ok");
        assert_eq!(p.len(), 101);
        assert_eq!(p["l0"], json!(0.75));
        assert_eq!(p["l1"], json!(0.0));
        assert_eq!(answer["x_tournament"]["rounds"], json!(4));
        let keys: Vec<&String> = answer.as_object().expect("object").keys().collect();
        assert_eq!(keys.last().map(|k| k.as_str()), Some("x_jev_confidence"));
        assert_eq!(merged["usage"]["input_tokens"], json!(99));
    }

    #[test]
    fn dict_criteria_keep_their_descriptions_and_option_order_is_dropped_and_reported() {
        let criteria: Map<String, Value> = labels(120)
            .into_iter()
            .map(|l| (l.clone(), json!(format!("about {l}"))))
            .collect();
        let qs = questions(json!({"c": {"type": "choice", "criteria": criteria, "option_order": [1]}}));
        let mut t = plan(&qs, 16).expect("planned").expect("a tournament");
        let round = t.next_round().expect("a round");
        assert_eq!(round.questions["0"]["criteria"]["l0"], json!("about l0"));
        assert!(round.questions["0"].get("option_order").is_none());
        let answers = winners_of(&round, |c| c[0].clone());
        t.advance(&round, &answers).expect("ok");
        let body = questions(json!({"answers": {"c": {"type": "choice", "probabilities": {}}}, "usage": {}}));
        let merged = t.merge(body, 1, false);
        assert_eq!(
            merged["answers"]["c"]["x_tournament"]["option_order_dropped"],
            json!(true)
        );
        assert!(merged["answers"]["c"].get("x_jev_confidence").is_none());
    }

    #[test]
    fn small_choices_ordered_or_unmappable_ones_stay_one_pass_below_the_one_pass_cap() {
        let small = questions(json!({"c": {"type": "choice", "criteria": labels(16)}}));
        assert_eq!(plan(&small, 16), Ok(None));
        let ordered = questions(json!({"c": {"type": "choice", "criteria": labels(50), "option_order": [0]}}));
        assert_eq!(plan(&ordered, 16), Ok(None));
        let numbers: Vec<u32> = (0..50).collect();
        let unmappable = questions(json!({"c": {"type": "choice", "criteria": numbers}}));
        assert_eq!(plan(&unmappable, 16), Ok(None));
        assert_eq!(
            plan(&questions(json!({"c": {"type": "choice", "criteria": labels(50)}})), 0),
            Ok(None)
        );
    }

    #[test]
    fn upstreams_refusals_once_a_plan_exists() {
        let numbers: Vec<u32> = (0..101).collect();
        let e = plan(&questions(json!({"c": {"type": "choice", "criteria": numbers}})), 16).expect_err("refused");
        assert_eq!(e.status, 422);
        assert!(
            e.detail
                .starts_with("question 'c': a choice is narrowed by elimination once a request has one over 100")
        );
        let no_criteria = questions(json!({"c": {"type": "choice", "criteria": labels(20)}, "d": {"type": "choice"}}));
        assert_eq!(
            plan(&no_criteria, 16).expect_err("refused").detail,
            "question 'd' is a choice but has no criteria"
        );
        let dup = questions(
            json!({"c": {"type": "choice", "criteria": labels(20)}, "d": {"type": "choice", "criteria": ["a", "a"]}}),
        );
        assert_eq!(
            plan(&dup, 16).expect_err("refused").detail,
            "choice criteria label 'a' is duplicated"
        );
        // Repeats in the wide choice itself come first, compared as Python's set does (1 == True).
        let mut wide: Vec<Value> = vec![Value::Null; 101];
        wide[0] = json!(1);
        wide[1] = json!(true);
        let e = plan(&questions(json!({"c": {"type": "choice", "criteria": wide}})), 16).expect_err("refused");
        assert_eq!(e.detail, "choice criteria label True is duplicated");
        let labels: Vec<Value> = (0..101)
            .map(|i| if i == 0 { json!([1]) } else { json!(format!("l{i}")) })
            .collect();
        let nested = questions(json!({"c": {"type": "choice", "criteria": labels}}));
        assert_eq!(plan(&nested, 16).expect_err("refused").status, 500);
    }
}
