//! Generated `POST /v1/systemone` bodies for the property tests of the request path (laya's
//! preparation and the HTTP front): request-shaped JSON whose every field may have any type.
//!
//! Bodies are built as JSON *text*, not `serde_json::Value`, so they can hold what a value cannot:
//! lone surrogate escapes, numbers past f64 and u64, `NaN`/`Infinity`, duplicate keys.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

/// Text pieces that have tripped tokenizers, prompt layouts or JSON decoders.
const AWKWARD: [&str; 20] = [
    "\\ud83d\\ude00",
    "\\u0000",
    "\\n\\t\\r",
    "\\\"",
    "\\\\",
    "\\/",
    "[MASK]",
    "[SEP]",
    "[CLS]",
    "<eos>",
    "👩\u{200d}👩\u{200d}👧",
    "e\u{301}\u{302}",
    "\u{feff}",
    "\u{202e}",
    "漢字のテキスト",
    "русский",
    "العربية",
    "\u{10ffff}",
    "İstanbul ß ﬁ",
    "    ",
];

/// Question ids: the typed-decisions workflows' (so automatic routing is exercised) and others.
const IDS: [&str; 10] = [
    "action",
    "urgency",
    "category",
    "churn_risk",
    "needs_human",
    "refund",
    "q",
    "",
    "Ünïcode id",
    "[MASK]",
];

/// `model` values: every checkpoint name and alias form, and near misses.
const MODELS: [&str; 9] = [
    "english",
    " EN ",
    "multilingual",
    "ml",
    "typed-decisions",
    "convaiinnovations/laya",
    "convaiinnovations/laya-multilingual",
    "laya-big",
    "",
];

const QUESTION_TYPES: [&str; 3] = ["choice", "score", "noul"];
const NOT_QUESTION_TYPES: [&str; 4] = ["Choice", "yes", "", "noul "];

/// `text` as a JSON string literal.
fn quoted(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

fn object(fields: Vec<(String, String)>) -> String {
    let fields: Vec<String> = fields.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
    format!("{{{}}}", fields.join(","))
}

fn array(items: Vec<String>) -> String {
    format!("[{}]", items.join(","))
}

/// A JSON string literal: any unicode text, or awkward pieces written with escapes by hand.
fn string_literal() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => any::<String>().prop_map(|s| quoted(&s)),
        3 => vec(prop_oneof![select(&AWKWARD[..]).prop_map(String::from), "[a-zA-Z0-9 ,.?']{0,16}"], 0..8)
            .prop_map(|parts| format!("\"{}\"", parts.concat())),
        1 => (1usize..3000).prop_map(|n| quoted(&"refund please ".repeat(n))),
    ]
}

/// A JSON number literal, including ones no f64 or u64 holds and Python's non-standard ones.
fn number_literal() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>()
            .prop_filter("finite", |x| x.is_finite())
            .prop_map(|x| format!("{x:?}")),
        "-?[1-9][0-9]{19,60}",
        "-?[0-9]\\.[0-9]{1,30}[eE][+-]?[0-9]{1,4}",
        select(&["-0", "0.0", "1E400", "-1e-400", "1e-999999"][..]).prop_map(String::from),
    ]
}

/// Values Python's `json.loads` takes or nearly takes and strict JSON does not: non-standard
/// numbers and lone surrogate escapes.
const NOT_QUITE_JSON: [&str; 8] = [
    "NaN",
    "Infinity",
    "-Infinity",
    "01",
    "1.",
    "\"\\ud800\"",
    "\"a\\udfffb\"",
    "\"\\x41\"",
];

/// Any JSON value, nested a few levels.
fn json_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        select(&["null", "true", "false"][..]).prop_map(String::from),
        number_literal(),
        string_literal(),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(array),
            vec((string_literal(), inner), 0..6).prop_map(object),
        ]
    })
}

/// One question definition: mostly the right field types, any type sometimes, fields left out.
fn question() -> impl Strategy<Value = String> {
    let qtype = prop_oneof![
        12 => select(&QUESTION_TYPES[..]).prop_map(quoted),
        1 => select(&NOT_QUESTION_TYPES[..]).prop_map(quoted),
        1 => json_value(),
    ];
    let instructions = prop_oneof![6 => string_literal(), 1 => json_value()];
    let options = || {
        prop_oneof![
            3 => vec((string_literal(), prop_oneof![string_literal(), json_value()]), 0..6).prop_map(object),
            2 => vec(string_literal(), 0..6).prop_map(array),
            1 => json_value(),
        ]
    };
    // Which fields are present: type most of the time, labels seldom (most label shapes are refused).
    let present = (
        proptest::bool::weighted(0.9),
        proptest::bool::weighted(0.8),
        proptest::bool::weighted(0.7),
        proptest::bool::weighted(0.15),
    );
    (qtype, instructions, options(), options(), present).prop_map(|(qtype, instructions, criteria, labels, present)| {
        let mut fields = Vec::new();
        for (kept, key, value) in [
            (present.0, "type", qtype),
            (present.1, "instructions", instructions),
            (present.2, "criteria", criteria),
            (present.3, "labels", labels),
        ] {
            if kept {
                fields.push((quoted(key), value));
            }
        }
        object(fields)
    })
}

fn question_id() -> impl Strategy<Value = String> {
    prop_oneof![3 => select(&IDS[..]).prop_map(quoted), 1 => string_literal()]
}

/// A body shaped like a decision request; any field may have any type or be missing.
pub fn request_body() -> impl Strategy<Value = Vec<u8>> {
    let questions = prop_oneof![
        8 => vec((question_id(), question()), 1..5).prop_map(object),
        1 => Just("{}".to_owned()),
        1 => vec((question_id(), question()), 60..70).prop_map(object),
        1 => json_value(),
    ];
    let state = prop_oneof![3 => string_literal(), 2 => json_value()];
    let model = prop_oneof![2 => select(&MODELS[..]).prop_map(quoted), 1 => json_value()];
    let extra = (string_literal(), json_value());
    // Which fields are present: questions nearly always, a model seldom (most values are refused).
    let keep = [
        proptest::bool::weighted(0.95),
        proptest::bool::weighted(0.8),
        proptest::bool::weighted(0.25),
        proptest::bool::weighted(0.3),
    ];
    (questions, state, model, extra, keep).prop_map(|(questions, state, model, extra, keep)| {
        let mut fields = Vec::new();
        if keep[0] {
            fields.push((quoted("questions"), questions));
        }
        if keep[1] {
            fields.push((quoted("state"), state));
        }
        if keep[2] {
            fields.push((quoted("model"), model));
        }
        if keep[3] {
            fields.push(extra);
        }
        object(fields).into_bytes()
    })
}

/// Any body at all: request-shaped, any JSON value, or bytes (in UTF-8, UTF-16 or none).
pub fn any_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => request_body(),
        2 => json_value().prop_map(String::into_bytes),
        1 => vec(any::<u8>(), 0..256),
        1 => request_body().prop_map(|body| {
            // The same request as UTF-16 (little endian, BOM first): Python's json.loads accepts it.
            let text = String::from_utf8_lossy(&body).into_owned();
            let mut bytes = vec![0xff, 0xfe];
            bytes.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
            bytes
        }),
        1 => (request_body(), select(&NOT_QUITE_JSON[..])).prop_map(|(body, value)| {
            // A request with one value strict JSON refuses.
            let rest = body.strip_prefix(b"{").unwrap_or(&body);
            let separator = if rest == b"}" { "" } else { "," };
            [format!("{{\"extra\":{value}{separator}").as_bytes(), rest].concat()
        }),
        1 => (request_body(), any::<usize>()).prop_map(|(mut body, at)| {
            // Cut short: a body that ends mid-token.
            body.truncate(at % body.len().max(1));
            body
        }),
    ]
}
