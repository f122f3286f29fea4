//! Bounded tokenization gives exactly the tokens of whole-text tokenization: on generated long texts
//! of every awkward kind (whitespace runs, words with no spaces, CJK, emoji sequences, combining
//! marks, special-token text, digits and punctuation runs), and on the golden requests with their
//! texts made long, where the rows built both ways must be identical.

mod support;

use std::collections::HashMap;

use laya::checkpoint::Checkpoint;
use laya::decision::{DecisionOptions, prepare};
use laya::request::{RequestLimits, parse_body};
use laya::routing::CheckpointName;
use laya::tokenizer::{LayaTokenizer, LongText};
use laya::upstream::Upstream;
use layad_system_tests::goldens::fixture_json;
use serde_json::Value;

/// The fixture checkpoints, tokenizing long texts the given way.
fn open_checkpoints(long_text: LongText) -> HashMap<CheckpointName, Checkpoint> {
    let mut checkpoints = support::open_checkpoints();
    for checkpoint in checkpoints.values_mut() {
        checkpoint.tokenizer.set_long_text(long_text);
    }
    checkpoints
}

/// xorshift64*: the same texts on every run.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Pieces long texts are made of: each is a way tokenization can behave badly at a cut.
fn piece(draw: &mut Draw) -> String {
    const WORDS: [&str; 12] = [
        "refund",
        "invoice",
        "the",
        "customer's",
        "don't",
        "charged",
        "twice",
        "Überweisung",
        "naïve",
        "résumé",
        "ßtraße",
        "I'm",
    ];
    const SCRIPTS: [&str; 8] = [
        "漢字のテキスト",
        "한국어문장",
        "русский",
        "العربية",
        "क्षत्रिय",
        "ภาษาไทย",
        "ελληνικά",
        "עברית",
    ];
    const ODD: [&str; 10] = [
        "👩\u{200d}👩\u{200d}👧\u{200d}👦",
        "🇩🇪🇫🇷",
        "e\u{301}\u{302}",
        "[SEP]",
        "[CLS]",
        "<eos>",
        "<bos>",
        "\u{feff}",
        "\r\n",
        "\t",
    ];
    let repeat = |text: &str, times: usize| text.repeat(times.max(1));
    match draw.below(9) {
        0 | 1 => {
            let n = 1 + draw.below(40);
            (0..n)
                .map(|_| WORDS[draw.below(WORDS.len())])
                .collect::<Vec<_>>()
                .join(" ")
                + " "
        }
        2 => repeat(" ", draw.below(3000)),
        3 => repeat(["\n", "\t", " \n", "  "][draw.below(4)], draw.below(500)),
        4 => repeat(["a", "ab", "xyz", "0", "9"][draw.below(5)], draw.below(20_000)),
        5 => repeat(SCRIPTS[draw.below(SCRIPTS.len())], 1 + draw.below(400)),
        6 => repeat(ODD[draw.below(ODD.len())], 1 + draw.below(50)),
        7 => repeat(
            ["!", "?!", "...", "'s", "\"", "{\"a\": [1, 2]}"][draw.below(6)],
            1 + draw.below(2000),
        ),
        _ => format!("{} ", draw.next()),
    }
}

/// A text of at least `len` bytes.
fn long_text(draw: &mut Draw, len: usize) -> String {
    let mut text = String::new();
    while text.len() < len {
        text.push_str(&piece(draw));
    }
    text
}

fn whole_ends(tokenizer: &LayaTokenizer, text: &str, n: usize) -> (Vec<u32>, Vec<u32>) {
    let ids = tokenizer.encode(text).expect("encode");
    let first = ids[..n.min(ids.len())].to_vec();
    let last = ids[ids.len().saturating_sub(n)..].to_vec();
    (first, last)
}

#[test]
fn the_first_and_last_tokens_of_long_texts_are_those_of_the_whole_text() {
    let checkpoints = open_checkpoints(LongText::Bounded);
    let tokenizers = [
        ("english", &checkpoints[&CheckpointName::English].tokenizer),
        ("multilingual", &checkpoints[&CheckpointName::Multilingual].tokenizer),
    ];
    for (name, tokenizer) in tokenizers {
        assert!(
            tokenizer.cuts_at_word_boundaries(),
            "{name}: no token spans a space after a word"
        );
    }
    // LAYAD_LONG_TEXT_ROUNDS=1000 (and LAYAD_LONG_TEXT_SEED) for a longer search than CI's.
    let rounds: usize = std::env::var("LAYAD_LONG_TEXT_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(48);
    let seed: u64 = std::env::var("LAYAD_LONG_TEXT_SEED")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0x9E37_79B9_7F4A_7C15);
    let mut draw = Draw(seed.max(1));
    let mut compared = 0;
    for round in 0..rounds {
        // Mostly a few kilobytes (several cuts before the whole text), some far longer.
        let len = if round % 6 == 0 {
            50_000 + draw.below(150_000)
        } else {
            1_000 + draw.below(20_000)
        };
        let text = long_text(&mut draw, len);
        for (name, tokenizer) in tokenizers {
            for n in [1, 8, 40, 48, 96, 128, 512] {
                let (first, last) = whole_ends(tokenizer, &text, n);
                let head: String = text.chars().take(60).collect();
                assert_eq!(
                    tokenizer.encode_first(&text, n).expect("first"),
                    first,
                    "{name}: first {n} tokens of a {}-byte text starting {head:?}",
                    text.len()
                );
                assert_eq!(
                    tokenizer.encode_last(&text, n).expect("last"),
                    last,
                    "{name}: last {n} tokens of a {}-byte text starting {head:?}",
                    text.len()
                );
                compared += 2;
            }
        }
    }
    println!("{compared} bounded encodings identical to whole-text encodings");
}

/// The golden body with its texts made about `len` bytes long (strings repeated, arrays
/// repeated), so that bounded tokenization cuts them.
fn inflate(value: &Value, len: usize) -> Value {
    match value {
        Value::String(s) if !s.is_empty() => {
            let times = len / s.len() + 1;
            Value::String(vec![s.as_str(); times].join(" "))
        }
        Value::Array(items) if !items.is_empty() => {
            let size = serde_json::to_string(value).map_or(1, |t| t.len().max(1));
            let times = len / size + 1;
            Value::Array(items.iter().cycle().take(items.len() * times).cloned().collect())
        }
        other => other.clone(),
    }
}

fn inflated_body(body: &Value, len: usize) -> Value {
    let mut body = body.clone();
    if let Some(state) = body.get_mut("state") {
        *state = inflate(state, len);
    }
    if let Some(questions) = body.get_mut("questions").and_then(Value::as_object_mut) {
        for question in questions.values_mut().filter_map(Value::as_object_mut) {
            if let Some(instructions) = question.get_mut("instructions") {
                *instructions = inflate(instructions, len);
            }
            match question.get_mut("criteria") {
                Some(Value::Object(criteria)) => criteria.values_mut().for_each(|c| *c = inflate(c, len / 4)),
                Some(Value::Array(criteria)) => criteria.iter_mut().for_each(|c| *c = inflate(c, len / 4)),
                _ => {}
            }
        }
    }
    body
}

#[test]
fn rows_are_unchanged_on_the_goldens_and_on_their_long_versions() {
    let bounded = open_checkpoints(LongText::Bounded);
    let whole = open_checkpoints(LongText::Whole);
    let golden = fixture_json("goldens/cases.json");
    let (mut requests, mut rows) = (0, 0);
    for case in golden["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let Ok(body) = serde_json::from_str::<Value>(case["body"].as_str().expect("body")) else {
            continue;
        };
        for len in [0, 3_000, 40_000] {
            let body = if len == 0 {
                body.clone()
            } else {
                inflated_body(&body, len)
            };
            let text = serde_json::to_string(&body).expect("render");
            let Ok(request) = parse_body(text.as_bytes(), Upstream::V0_3_20, RequestLimits::default()) else {
                continue;
            };
            let prepare_with = |checkpoints: &HashMap<CheckpointName, Checkpoint>| {
                prepare(
                    &request,
                    |name| checkpoints.get(&name),
                    DecisionOptions {
                        upstream: Upstream::V0_3_20,
                        ..DecisionOptions::default()
                    },
                )
                .map(|p| p.rows)
                .map_err(|e| (e.status, e.detail))
            };
            let ours = prepare_with(&bounded);
            assert_eq!(ours, prepare_with(&whole), "{name} with texts of {len} bytes");
            requests += 1;
            rows += ours.map_or(0, |r| r.len());
        }
    }
    assert!(requests > 300, "only {requests} requests compared");
    println!("{requests} requests ({rows} rows) built identically with bounded and whole tokenization");
}
