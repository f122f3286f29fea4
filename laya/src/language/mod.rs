//! Script and language detection of a request's state, ported from upstream `laya.lang`: the
//! `detection` object of `routing`, and the evidence the router's reasons quote (spec §6.4).
//!
//! What both releases share lives here: reading the state, counting letters per script, the
//! non-Latin promotion, identifiers and words. Each release's Latin-language rules live in its own
//! file (`v0_3_20.rs`, `v0_4_15.rs`); the tables are data (`tables.rs`, `laya/data/*.txt`).
//!
//! Upstream runs on CPython 3.11, so every character test here is Python's on Unicode 14.0:
//! `str.isalpha` (general category L*), `re`'s `\w` and `\d`, `str.isupper`, `str.lower` and
//! `unicodedata.combining`. The Rust tables behind them know newer Unicode versions; characters
//! assigned since 14.0 are treated as unassigned, as CPython 3.11 sees them ([`crate::python_text::py_char`]).

mod tables;
mod v0_3_20;
mod v0_4_15;

use serde_json::{Map, Value};

use crate::python_text::py_char;
use crate::python_text::{float_value, py_len, py_prefix, round4};
use crate::upstream::Upstream;

/// The most characters of state text detection reads (`state_text(max_chars=4000)`).
const MAX_STATE_CHARS: usize = 4000;

/// Containers nested deeper than this below the root are not read (`_iter_text`: `_depth > 6`).
const MAX_DEPTH: usize = 6;

/// A diacritic rate at or above this is evidence the text is not English (`NON_EN_DIACRITIC_RATE`).
const NON_EN_DIACRITIC_RATE: f64 = 0.02;

/// Non-Latin share of the letters that makes Latin-majority text non-Latin (`NON_LATIN_FRACTION`).
const NON_LATIN_FRACTION: f64 = 0.2;

/// A smaller non-Latin share that also counts once it has [`NON_LATIN_MIN_LETTERS`] letters.
const NON_LATIN_MIN_FRACTION: f64 = 0.1;

/// The number of non-Latin letters that lets [`NON_LATIN_MIN_FRACTION`] count.
const NON_LATIN_MIN_LETTERS: f64 = 10.0;

/// What detection found in a state: the `routing.detection` object (`laya.lang.analyse`).
#[derive(Clone, Debug, PartialEq)]
pub struct Detection {
    /// The release whose rules produced this (and whose key set [`Detection::to_json`] writes).
    pub upstream: Upstream,
    /// Dominant script: `latin`, a named script (`han`, `cyrillic`, …), `other` or `unknown`.
    pub script: String,
    /// Share of the letters per script, `latin` first, then in first-seen order; empty without letters.
    pub script_profile: Vec<(String, f64)>,
    /// Best-effort language of Latin text (`en`, `fr`, …); `None` when undecided or not Latin.
    pub language: Option<&'static str>,
    /// Whether the English checkpoint can be expected to read the state.
    pub is_english: bool,
    /// Whether no language was named (`language` is `None`).
    pub language_undecided: bool,
    /// Share of non-English letters in the lower-cased text, `round(…, 4)`; 0.0 unless Latin.
    pub diacritic_rate: f64,
    /// `round(1 − latin share, 4)`; 0.0 without letters.
    pub non_latin_fraction: f64,
    /// 0.4.15: the stripped line or field the segment scan found in another language, which
    /// made otherwise English text non-English. Always `None` under 0.3.20.
    pub mixed_segment: Option<String>,
}

impl Detection {
    /// The `detection` object upstream emits, keys in its order, floats at full double precision;
    /// `mixed_segment` (last) only under 0.4.x.
    pub fn to_json(&self) -> Value {
        let profile: Map<String, Value> = self
            .script_profile
            .iter()
            .map(|(script, share)| (script.clone(), float_value(*share)))
            .collect();
        let mut out = Map::new();
        out.insert("script".to_owned(), Value::String(self.script.clone()));
        out.insert("script_profile".to_owned(), Value::Object(profile));
        out.insert(
            "language".to_owned(),
            self.language.map_or(Value::Null, |lang| Value::String(lang.to_owned())),
        );
        out.insert("is_english".to_owned(), Value::Bool(self.is_english));
        out.insert("language_undecided".to_owned(), Value::Bool(self.language_undecided));
        out.insert("diacritic_rate".to_owned(), float_value(self.diacritic_rate));
        out.insert("non_latin_fraction".to_owned(), float_value(self.non_latin_fraction));
        if self.upstream.is_0_4() {
            out.insert(
                "mixed_segment".to_owned(),
                self.mixed_segment.clone().map_or(Value::Null, Value::String),
            );
        }
        Value::Object(out)
    }
}

/// Full detection of a state (`laya.lang.analyse`) by the rules of `upstream`; see spec §6.4.
pub fn analyse(state: Option<&Value>, upstream: Upstream) -> Detection {
    match upstream {
        Upstream::V0_3_20 => v0_3_20::analyse(state),
        Upstream::V0_4_15 => v0_4_15::analyse(state),
    }
}

/// The text detection reads (`laya.lang.state_text`): string leaves depth-first (keys, numbers,
/// booleans and null ignored; nothing below depth 6), joined by spaces, at most 4000 characters.
/// A missing state reads as null: the empty string.
pub fn state_text(state: Option<&Value>) -> String {
    let leaves = string_leaves(state);
    let mut parts: Vec<&str> = Vec::new();
    let mut budget = MAX_STATE_CHARS as i64;
    for leaf in leaves {
        if budget <= 0 {
            break;
        }
        let len = py_len(leaf) as i64;
        if len > budget {
            parts.push(py_prefix(leaf, budget as usize));
            break;
        }
        parts.push(leaf);
        budget -= len + 1;
    }
    let joined = parts.join(" ");
    py_prefix(&joined, MAX_STATE_CHARS).to_owned()
}

/// `_iter_text(state)`: the string leaves of a state, depth-first, in key order.
fn string_leaves(state: Option<&Value>) -> Vec<&str> {
    let mut leaves = Vec::new();
    if let Some(state) = state {
        collect_leaves(state, 0, &mut leaves);
    }
    leaves
}

/// `_iter_text`: the string leaves of `value`, which sits `depth` levels below the root.
fn collect_leaves<'a>(value: &'a Value, depth: usize, out: &mut Vec<&'a str>) {
    if depth > MAX_DEPTH {
        return;
    }
    match value {
        Value::String(s) => out.push(s),
        Value::Object(map) => map.values().for_each(|v| collect_leaves(v, depth + 1, out)),
        Value::Array(items) => items.iter().for_each(|v| collect_leaves(v, depth + 1, out)),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// `sum(ch.isalpha() for ch in text)`.
fn alpha_count(text: &str) -> usize {
    text.chars().filter(|&ch| py_char::is_alpha(ch)).count()
}

/// What the letters of a text say before any language is guessed: the dominant script (after the
/// non-Latin promotion), the profile and the non-Latin share.
struct ScriptReading {
    /// `latin`, a named script, `other` or `unknown`.
    script: &'static str,
    /// `script_profile`.
    profile: Vec<(&'static str, f64)>,
    /// `round(1 − latin share, 4)`, 0.0 without letters.
    non_latin: f64,
    /// `round(non_latin × isalpha letters)`: the non-Latin letters the promotion weighs.
    n_non_latin: f64,
}

impl ScriptReading {
    /// Counts `text`'s letters (as `is_letter` decides them) and promotes a Latin plurality to the
    /// strongest other script when the non-Latin letters carry the text.
    fn of(text: &str, is_letter: fn(char) -> bool) -> Self {
        let letters = LetterCounts::of(text, is_letter);
        let profile = letters.profile();
        let mut script = letters.dominant().unwrap_or("unknown");
        let non_latin = if profile.is_empty() {
            0.0
        } else {
            let latin = profile
                .iter()
                .find(|(s, _)| *s == "latin")
                .map_or(0.0, |(_, share)| *share);
            round4(1.0 - latin)
        };
        // Python's round(): half to even on the binary value. Upstream counts `isalpha` here
        // even where it counts scripts with a wider letter test (0.4.15's `_is_letter`).
        let n_non_latin = (non_latin * alpha_count(text) as f64).round_ties_even();
        if script == "latin" && has_non_latin_words(text) && non_latin_carries(non_latin, n_non_latin) {
            // max() keeps the first of equal shares.
            let mut best: Option<(&'static str, f64)> = None;
            for &(name, share) in profile.iter().filter(|(s, _)| *s != "latin") {
                if best.is_none_or(|(_, top)| share > top) {
                    best = Some((name, share));
                }
            }
            if let Some((name, _)) = best {
                script = name;
            }
        }
        ScriptReading {
            script,
            profile,
            non_latin,
            n_non_latin,
        }
    }

    /// The detection of text with no letters or of a non-Latin script; `None` for Latin text.
    fn settled(&self, upstream: Upstream) -> Option<Detection> {
        let (is_english, non_latin_fraction) = match self.script {
            "latin" => return None,
            "unknown" => (true, 0.0),
            _ => (false, self.non_latin),
        };
        Some(Detection {
            upstream,
            script: self.script.to_owned(),
            script_profile: self.owned_profile(),
            language: None,
            is_english,
            language_undecided: true,
            diacritic_rate: 0.0,
            non_latin_fraction,
            mixed_segment: None,
        })
    }

    /// The detection of Latin text, from a release's Latin evidence and the language it settled on
    /// (0.4.15 may veto the one the stop words named).
    fn latin(&self, upstream: Upstream, language: Option<&'static str>, evidence: &LatinEvidence) -> Detection {
        let undecided = language.is_none();
        Detection {
            upstream,
            script: self.script.to_owned(),
            script_profile: self.owned_profile(),
            language,
            is_english: language == Some("en") || (undecided && !evidence.looks_non_english),
            language_undecided: undecided,
            diacritic_rate: round4(evidence.diacritic_rate),
            non_latin_fraction: self.non_latin,
            mixed_segment: None,
        }
    }

    fn owned_profile(&self) -> Vec<(String, f64)> {
        self.profile
            .iter()
            .map(|(s, share)| ((*s).to_owned(), *share))
            .collect()
    }
}

/// What a release's `latin_profile` tells `analyse`.
struct LatinEvidence {
    /// The named language, or `None` when undecided.
    language: Option<&'static str>,
    /// Non-English letters over the length of the lower-cased text (not yet rounded).
    diacritic_rate: f64,
    /// The text looks non-English without a named language: non-English diacritics (0.4.15 also:
    /// an undecided Nordic word with no English-only word beside it).
    looks_non_english: bool,
}

/// `_non_latin_carries`: whether the non-Latin letters of a Latin-plurality text carry it.
fn non_latin_carries(non_latin: f64, n_non_latin: f64) -> bool {
    non_latin >= NON_LATIN_FRACTION || (non_latin >= NON_LATIN_MIN_FRACTION && n_non_latin >= NON_LATIN_MIN_LETTERS)
}

/// Non-English letters over the length of `lowered` (the diacritic rate before rounding).
fn diacritic_rate(lowered: &str) -> f64 {
    let diacritics = lowered.chars().filter(|&ch| tables::is_non_en_diacritic(ch)).count();
    diacritics as f64 / py_len(lowered).max(1) as f64
}

/// `_WORD.findall(_IDENTIFIER.sub(" ", text).replace("İ", "i").lower())`: the words the stop
/// lists are matched against. `İ` lowers to `i` plus a combining dot, which matches no list.
fn prose_words(text: &str) -> Vec<String> {
    let mut prose = String::with_capacity(text.len());
    py_char::push_lower(&blank_identifiers(text).replace('İ', "i"), &mut prose);
    letter_words(&prose).into_iter().map(str::to_owned).collect()
}

/// `text.lower()`.
fn lowered(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    py_char::push_lower(text, &mut out);
    out
}

/// Letters of a text per script, as `script_profile` and `detect_script` count them.
struct LetterCounts {
    /// Latin letters (Latin, IPA extensions, Latin Extended Additional, fullwidth Latin).
    latin: usize,
    /// Every other script with at least one letter, in first-seen order (`other` included).
    others: Vec<(&'static str, usize)>,
}

impl LetterCounts {
    fn of(text: &str, is_letter: fn(char) -> bool) -> Self {
        let mut counts = LetterCounts {
            latin: 0,
            others: Vec::new(),
        };
        for ch in text.chars().filter(|&ch| is_letter(ch)) {
            let cp = u32::from(ch);
            if cp < 0x02B0 || is_latin_block(cp) {
                counts.latin += 1;
                continue;
            }
            let name = named_script(cp).unwrap_or("other");
            match counts.others.iter_mut().find(|(s, _)| *s == name) {
                Some((_, n)) => *n += 1,
                None => counts.others.push((name, 1)),
            }
        }
        counts
    }

    fn total(&self) -> usize {
        self.latin + self.others.iter().map(|(_, n)| n).sum::<usize>()
    }

    /// `script_profile`: `latin` first, then the others; scripts with no letters left out.
    fn profile(&self) -> Vec<(&'static str, f64)> {
        let total = self.total();
        if total == 0 {
            return Vec::new();
        }
        std::iter::once(("latin", self.latin))
            .chain(self.others.iter().copied())
            .filter(|(_, n)| *n > 0)
            .map(|(s, n)| (s, n as f64 / total as f64))
            .collect()
    }

    /// `detect_script`: the script with the most letters, `latin` counted last so a named script
    /// wins a tie; `None` without letters.
    fn dominant(&self) -> Option<&'static str> {
        if self.total() == 0 {
            return None;
        }
        let mut best: Option<(&'static str, usize)> = None;
        for (name, n) in self
            .others
            .iter()
            .copied()
            .chain(std::iter::once(("latin", self.latin)))
        {
            if best.is_none_or(|(_, top)| n > top) {
                best = Some((name, n));
            }
        }
        best.map(|(name, _)| name)
    }
}

/// Latin Extended Additional and the fullwidth Latin letters (below U+02B0 is checked apart).
fn is_latin_block(cp: u32) -> bool {
    (0x1E00..=0x1EFF).contains(&cp) || (0xFF21..=0xFF3A).contains(&cp) || (0xFF41..=0xFF5A).contains(&cp)
}

/// The first script range of [`tables::SCRIPT_RANGES`] that holds `cp`.
fn named_script(cp: u32) -> Option<&'static str> {
    tables::SCRIPT_RANGES
        .iter()
        .find(|(_, ranges)| tables::in_ranges(ranges, cp))
        .map(|(name, _)| *name)
}

/// `_script_of`: the named non-Latin script of a character; `None` for Latin (below U+0250 here)
/// and for characters no range claims.
fn script_of(ch: char) -> Option<&'static str> {
    let cp = u32::from(ch);
    if cp < 0x0250 || is_latin_block(cp) {
        return None;
    }
    named_script(cp)
}

/// Whether `_non_latin_words(text)` is non-empty: a maximal run of two or more characters of one
/// named script (combining marks skipped, never splitting a run) that does not start upper-case.
fn has_non_latin_words(text: &str) -> bool {
    let mut run_script: Option<&'static str> = None;
    let mut run_len = 0usize;
    let mut run_upper = false;
    let is_word = |len: usize, upper: bool| len >= 2 && !upper;
    for ch in text.chars() {
        if py_char::is_combining(ch) {
            continue;
        }
        let script = script_of(ch);
        if script.is_some() && script == run_script {
            run_len += 1;
            continue;
        }
        if is_word(run_len, run_upper) {
            return true;
        }
        match script {
            Some(_) => {
                run_script = script;
                run_len = 1;
                run_upper = py_char::is_upper(ch);
            }
            None => {
                run_script = None;
                run_len = 0;
                run_upper = false;
            }
        }
    }
    is_word(run_len, run_upper)
}

/// `_IDENTIFIER.sub(" ", text)`: every match of `[\w-]*(?:[.@][\w-]+)+` (`github.com`,
/// `a@b.c`, `v1.2.3`) replaced by one space, leftmost-first and greedy like Python's `re`.
fn blank_identifiers(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let is_part = |ch: char| py_char::is_word(ch) || ch == '-';
    let is_joint =
        |at: usize| matches!(chars.get(at), Some('.' | '@')) && chars.get(at + 1).is_some_and(|&ch| is_part(ch));
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while at < chars.len() {
        let mut end = at;
        while end < chars.len() && is_part(chars[end]) {
            end += 1;
        }
        if !is_joint(end) {
            // No match starts anywhere in at..=end: each would reach the same `end`.
            let stop = (end + 1).min(chars.len());
            out.extend(&chars[at..stop]);
            at = stop;
            continue;
        }
        while is_joint(end) {
            end += 2;
            while end < chars.len() && is_part(chars[end]) {
                end += 1;
            }
        }
        out.push(' ');
        at = end;
    }
    out
}

/// `_WORD.findall(text)`: maximal runs of `[^\W\d_]` (letters and non-decimal numerics).
fn letter_words(text: &str) -> Vec<&str> {
    text.split(|ch: char| !(py_char::is_word(ch) && !py_char::is_decimal(ch) && ch != '_'))
        .filter(|word| !word.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn detect(state: Value) -> Detection {
        analyse(Some(&state), Upstream::V0_3_20)
    }

    fn profile(d: &Detection) -> Vec<(&str, f64)> {
        d.script_profile.iter().map(|(s, share)| (s.as_str(), *share)).collect()
    }

    #[test]
    fn english_sentence_is_english() {
        let d = detect(json!("I was charged twice for invoice 4411, please refund it today."));
        assert_eq!(
            (d.script.as_str(), d.language, d.is_english),
            ("latin", Some("en"), true)
        );
        assert_eq!(profile(&d), [("latin", 1.0)]);
        assert!(!d.language_undecided);
    }

    #[test]
    fn german_message_reads_as_german() {
        let d = detect(json!({"message": "Mein Konto wurde zweimal belastet, bitte erstatten Sie den Betrag"}));
        assert_eq!(
            (d.language, d.is_english, d.language_undecided),
            (Some("de"), false, false)
        );
    }

    #[test]
    fn unaccented_french_reads_as_french() {
        let d = detect(json!(
            "Le client a ete facture deux fois et il demande un remboursement pour la facture"
        ));
        assert_eq!((d.language, d.is_english), (Some("fr"), false));
    }

    #[test]
    fn hindi_is_devanagari() {
        let d = detect(json!("मेरे खाते से दो बार पैसे कट गए हैं, कृपया रिफंड करें"));
        assert_eq!(d.script, "devanagari");
        assert_eq!(profile(&d), [("devanagari", 1.0)]);
        assert_eq!((d.language, d.is_english, d.language_undecided), (None, false, true));
        assert_eq!(d.non_latin_fraction, 1.0);
    }

    #[test]
    fn japanese_is_kana_with_full_precision_shares() {
        let d = detect(json!("請求書4411で二重に請求されました。本日中に返金してください。"));
        assert_eq!(d.script, "kana");
        assert_eq!(
            profile(&d),
            [("han", 0.46153846153846156), ("kana", 0.5384615384615384)]
        );
        let text = serde_json::to_string(&d.to_json()).unwrap_or_default();
        assert!(text.contains(r#""script_profile":{"han":0.46153846153846156,"kana":0.5384615384615384}"#));
    }

    #[test]
    fn short_portuguese_is_undecided_but_english() {
        let d = detect(json!("Quero cancelar"));
        assert_eq!((d.language, d.is_english, d.language_undecided), (None, true, true));
    }

    #[test]
    fn polish_is_caught_by_its_diacritics() {
        let d = detect(json!("Zamówienie nie dotarło, proszę o zwrot pieniędzy za przesyłkę"));
        assert_eq!((d.language, d.is_english, d.language_undecided), (None, false, true));
        assert_eq!(d.diacritic_rate, 0.0984);
    }

    #[test]
    fn a_greek_symbol_in_english_stays_english() {
        let d = detect(json!("Set α to 0.05 and rerun the job please"));
        assert_eq!((d.script.as_str(), d.language), ("latin", Some("en")));
        assert_eq!(
            profile(&d),
            [("latin", 0.9615384615384616), ("greek", 0.038461538461538464)]
        );
        assert_eq!(d.non_latin_fraction, 0.0385);
    }

    #[test]
    fn a_russian_greeting_promotes_cyrillic() {
        let d = detect(json!("Привет, как дела? I need help with my order number 5521"));
        assert_eq!((d.script.as_str(), d.is_english), ("cyrillic", false));
        assert_eq!(
            profile(&d),
            [("latin", 0.6666666666666666), ("cyrillic", 0.3333333333333333)]
        );
        assert_eq!(d.non_latin_fraction, 0.3333);
        assert_eq!(d.diacritic_rate, 0.0);
    }

    #[test]
    fn no_letters_is_unknown() {
        for state in [json!("12345"), Value::Null, json!("")] {
            let d = detect(state);
            assert_eq!(d.script, "unknown");
            assert!(d.script_profile.is_empty());
            assert_eq!((d.language, d.is_english, d.language_undecided), (None, true, true));
        }
        assert_eq!(analyse(None, Upstream::V0_3_20).script, "unknown");
        let unknown = r#"{"script":"unknown","script_profile":{},"language":null,"is_english":true,"language_undecided":true,"diacritic_rate":0.0,"non_latin_fraction":0.0}"#;
        assert_eq!(
            serde_json::to_string(&analyse(None, Upstream::V0_3_20).to_json()).unwrap_or_default(),
            unknown
        );
    }

    #[test]
    fn one_english_word_is_undecided() {
        let d = detect(json!("Hello"));
        assert_eq!((d.language, d.is_english, d.language_undecided), (None, true, true));
    }

    #[test]
    fn identifiers_are_not_prose() {
        assert_eq!(
            blank_identifiers("see github.com and a@b.c or v1.2.3."),
            "see   and   or  ."
        );
        assert_eq!(blank_identifiers("a.@b x.- y. .z"), "a.    y.  ");
        assert_eq!(blank_identifiers("arrivato. fine"), "arrivato. fine");
        // `o`, `e`, `com` and `da` survive outside identifiers and name Portuguese.
        let d = detect(json!("see github.com and user@acme.com or v1.2.3 for o e com da"));
        assert_eq!(d.language, Some("pt"));
    }

    #[test]
    fn words_are_runs_of_letters_and_non_decimal_numerics() {
        assert_eq!(
            letter_words("x² a_b c3d é\u{301}t Ⅷ"),
            ["x²", "a", "b", "c", "d", "é", "t", "Ⅷ"]
        );
    }

    #[test]
    fn dotted_capital_i_lowers_to_plain_i_for_words_only() {
        let d = detect(json!("İstanbul'da İzmir'de İnternet çalışmıyor lütfen yardım edin"));
        assert_eq!((d.language, d.is_english), (None, false));
        assert_eq!(d.diacritic_rate, 0.0968);
    }

    #[test]
    fn state_text_reads_leaves_depth_first_up_to_depth_six() {
        let state = json!({"a": "one", "b": [1, true, null, "two", {"k": "three"}], "n": 4.5});
        assert_eq!(state_text(Some(&state)), "one two three");
        let deep6 = json!([[[[[["six"]]]]]]);
        let deep7 = json!([[[[[[["seven"]]]]]]]);
        assert_eq!(state_text(Some(&deep6)), "six");
        assert_eq!(state_text(Some(&deep7)), "");
        assert_eq!(state_text(None), "");
        assert_eq!(state_text(Some(&json!(12))), "");
    }

    #[test]
    fn state_text_budget_counts_code_points_and_the_joining_space() {
        let long = "é".repeat(3998);
        let state = json!([long, "abc", "z"]);
        // 3998 + 1 leaves a budget of 1: "abc" is cut to "a" and reading stops.
        let text = state_text(Some(&state));
        assert_eq!(py_len(&text), 4000);
        assert!(text.ends_with("é a"));
        let state = json!(["x".repeat(3999), "y"]);
        assert!(state_text(Some(&state)).ends_with('x'));
    }

    #[test]
    fn python_character_predicates() {
        use py_char::*;
        assert!(is_alpha('a') && is_alpha('ª') && is_alpha('ʰ') && is_alpha('中'));
        assert!(!is_alpha('\u{301}') && !is_alpha('Ⅷ') && !is_alpha('_') && !is_alpha('\u{93e}'));
        assert!(is_word('²') && is_word('Ⅷ') && is_word('_') && is_word('٣'));
        assert!(!is_word('\u{301}') && !is_word('-') && !is_word('.'));
        assert!(is_decimal('٣') && is_decimal('7') && !is_decimal('²') && !is_decimal('Ⅷ'));
        assert!(is_upper('Д') && is_upper('Ⅷ') && !is_upper('д') && !is_upper('ǅ'));
        assert!(is_combining('\u{301}') && is_combining('\u{94d}') && !is_combining('\u{93e}'));
        assert!(is_space('\u{1c}') && is_space('\u{a0}') && is_space('\u{3000}') && !is_space('\u{200b}'));
        let mut lowered = String::new();
        push_lower("İSTANBUL ÆØ ΣΑΣ", &mut lowered);
        assert_eq!(lowered, "i\u{307}stanbul æø σασ");
    }

    #[test]
    fn letters_newer_than_unicode_14_are_unassigned() {
        use py_char::*;
        // U+1C89 CYRILLIC CAPITAL LETTER TJE (Unicode 16), U+31350 (CJK Extension H, 15.0),
        // U+A7CB LATIN CAPITAL LETTER RAMS HORN (16.0), U+0897 ARABIC PEPET (16.0).
        for ch in ['\u{1c89}', '\u{31350}', '\u{a7cb}'] {
            assert!(!is_alpha(ch) && !is_word(ch) && !is_upper(ch), "{ch:?}");
            let mut lowered = String::new();
            push_lower(&ch.to_string(), &mut lowered);
            assert_eq!(lowered, ch.to_string());
        }
        assert!(!is_combining('\u{897}'));
        assert!(is_alpha('\u{1c88}') && is_alpha('\u{2b738}') && is_alpha('\u{a7ca}'));
    }

    #[test]
    fn unicode_tables_are_the_versions_checked() {
        // py_char::NEWER_THAN_UNICODE_14 was built for these; a newer table needs a new comparison.
        assert!(unicode_general_category::UNICODE_VERSION <= (16, 0, 0));
        assert!(unicode_normalization::UNICODE_VERSION <= (18, 0, 0));
        assert!(char::UNICODE_VERSION <= (17, 0, 0));
    }

    #[test]
    fn to_json_keeps_upstream_key_order() {
        let d = detect(json!("Set α to 0.05 and rerun the job please"));
        assert_eq!(
            serde_json::to_string(&d.to_json()).unwrap_or_default(),
            r#"{"script":"latin","script_profile":{"latin":0.9615384615384616,"greek":0.038461538461538464},"language":"en","is_english":true,"language_undecided":false,"diacritic_rate":0.0,"non_latin_fraction":0.0385}"#
        );
    }
}
