//! What both releases' detectors read from a state, and what they answer with: the state's text,
//! its letters counted per script, the non-Latin promotion, identifiers and words, the Latin
//! evidence, and the [`Detection`] itself. `mod.rs` picks a release's rules; the rules (in
//! `v0_3_20.rs`, `v0_4_15.rs`) take their shared steps from here, never from `mod.rs`, so that
//! neither side imports the other.

use serde_json::{Map, Value};

use super::tables;
use crate::python_text::py_char;
use crate::python_text::{float_value, py_len, py_prefix, round4};
use crate::upstream::Upstream;

/// The most characters of state text detection reads (`state_text(max_chars=4000)`).
pub(super) const MAX_STATE_CHARS: usize = 4000;

/// Containers nested deeper than this below the root are not read (`_iter_text`: `_depth > 6`).
const MAX_DEPTH: usize = 6;

/// A diacritic rate at or above this is evidence the text is not English (`NON_EN_DIACRITIC_RATE`).
pub(super) const NON_EN_DIACRITIC_RATE: f64 = 0.02;

/// Non-Latin share of the letters that makes Latin-majority text non-Latin (`NON_LATIN_FRACTION`).
const NON_LATIN_FRACTION: f64 = 0.2;

/// A smaller non-Latin share that also counts once it has [`NON_LATIN_MIN_LETTERS`] letters.
const NON_LATIN_MIN_FRACTION: f64 = 0.1;

/// The number of non-Latin letters that lets [`NON_LATIN_MIN_FRACTION`] count.
pub(super) const NON_LATIN_MIN_LETTERS: f64 = 10.0;

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
        if self.upstream.differences().mixed_segment {
            out.insert(
                "mixed_segment".to_owned(),
                self.mixed_segment.clone().map_or(Value::Null, Value::String),
            );
        }
        Value::Object(out)
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
pub(super) fn string_leaves(state: Option<&Value>) -> Vec<&str> {
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
pub(super) fn alpha_count(text: &str) -> usize {
    text.chars().filter(|&ch| py_char::is_alpha(ch)).count()
}

/// What the letters of a text say before any language is guessed: the dominant script (after the
/// non-Latin promotion), the profile and the non-Latin share.
pub(super) struct ScriptReading {
    /// `latin`, a named script, `other` or `unknown`.
    pub(super) script: &'static str,
    /// `script_profile`.
    pub(super) profile: Vec<(&'static str, f64)>,
    /// `round(1 − latin share, 4)`, 0.0 without letters.
    pub(super) non_latin: f64,
    /// `round(non_latin × isalpha letters)`: the non-Latin letters the promotion weighs.
    pub(super) n_non_latin: f64,
}

impl ScriptReading {
    /// Counts `text`'s letters (as `is_letter` decides them) and promotes a Latin plurality to the
    /// strongest other script when the non-Latin letters carry the text.
    pub(super) fn of(text: &str, is_letter: fn(char) -> bool) -> Self {
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
    pub(super) fn settled(&self, upstream: Upstream) -> Option<Detection> {
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
    pub(super) fn latin(
        &self,
        upstream: Upstream,
        language: Option<&'static str>,
        evidence: &LatinEvidence,
    ) -> Detection {
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

    pub(super) fn owned_profile(&self) -> Vec<(String, f64)> {
        self.profile
            .iter()
            .map(|(s, share)| ((*s).to_owned(), *share))
            .collect()
    }
}

/// What a release's `latin_profile` tells `analyse`.
pub(super) struct LatinEvidence {
    /// The named language, or `None` when undecided.
    pub(super) language: Option<&'static str>,
    /// Non-English letters over the length of the lower-cased text (not yet rounded).
    pub(super) diacritic_rate: f64,
    /// The text looks non-English without a named language: non-English diacritics (0.4.15 also:
    /// an undecided Nordic word with no English-only word beside it).
    pub(super) looks_non_english: bool,
}

/// `_non_latin_carries`: whether the non-Latin letters of a Latin-plurality text carry it.
pub(super) fn non_latin_carries(non_latin: f64, n_non_latin: f64) -> bool {
    non_latin >= NON_LATIN_FRACTION || (non_latin >= NON_LATIN_MIN_FRACTION && n_non_latin >= NON_LATIN_MIN_LETTERS)
}

/// Non-English letters over the length of `lowered` (the diacritic rate before rounding).
pub(super) fn diacritic_rate(lowered: &str) -> f64 {
    let diacritics = lowered.chars().filter(|&ch| tables::is_non_en_diacritic(ch)).count();
    diacritics as f64 / py_len(lowered).max(1) as f64
}

/// `_WORD.findall(_IDENTIFIER.sub(" ", text).replace("İ", "i").lower())`: the words the stop
/// lists are matched against. `İ` lowers to `i` plus a combining dot, which matches no list.
pub(super) fn prose_words(text: &str) -> Vec<String> {
    let mut prose = String::with_capacity(text.len());
    py_char::push_lower(&blank_identifiers(text).replace('İ', "i"), &mut prose);
    letter_words(&prose).into_iter().map(str::to_owned).collect()
}

/// `text.lower()`.
pub(super) fn lowered(text: &str) -> String {
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
pub(super) fn has_non_latin_words(text: &str) -> bool {
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
pub(super) fn blank_identifiers(text: &str) -> String {
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
pub(super) fn letter_words(text: &str) -> Vec<&str> {
    text.split(|ch: char| !(py_char::is_word(ch) && !py_char::is_decimal(ch) && ch != '_'))
        .filter(|word| !word.is_empty())
        .collect()
}
