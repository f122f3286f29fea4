//! The 0.4.15 detector (`laya.lang.analyse` of `laya[serve]==0.4.15`).
//!
//! Beyond 0.3.20 it counts letters newer Unicode knows (`_is_letter`), reads Swedish (with a rule
//! for two- and three-word fragments), keeps Nordic words that Danish shares from naming Swedish,
//! counts English-colliding foreign words once, lets plain English function words outvote one
//! accented loanword, and distrusts acronyms and all-caps lines. A state that reads English as a
//! whole is then scanned line by line and field by field (`_non_english_segment`, which names the
//! `mixed_segment`), and each field is also read on its own (`_leaf_non_english`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::reading::{
    Detection, LatinEvidence, MAX_STATE_CHARS, NON_EN_DIACRITIC_RATE, NON_LATIN_MIN_LETTERS, ScriptReading,
    alpha_count, diacritic_rate, has_non_latin_words, letter_words, lowered, non_latin_carries, prose_words,
    state_text, string_leaves,
};
use super::tables::{self, EN_ONLY_0_4_15, V0_4_15, contains, stop_lists};
use crate::python_text::{py_char, py_len, py_prefix, py_strip};
use crate::upstream::Upstream;

/// Above this diacritic rate English function words no longer rescue a text
/// (`ENGLISH_RESCUE_DIACRITIC_RATE`).
const ENGLISH_RESCUE_DIACRITIC_RATE: f64 = 0.06;

/// A matched stop word this long is more than an acronym (`_SHOUTED_MIN_STOPWORD`).
const SHOUTED_MIN_STOPWORD: usize = 4;

/// A letter run this long is a word, not an acronym (`_SHOUTED_MIN_WORD`).
const SHOUTED_MIN_WORD: usize = 5;

/// A line shorter than this cannot name a language or carry enough letters (`_leaf_non_english`).
const MIN_LEAF_LINE: usize = 7;

/// `analyse(state)` of 0.4.15.
pub(super) fn analyse(state: Option<&Value>) -> Detection {
    let mut result = analyse_text(&state_text(state));
    let leaves = string_leaves(state);
    // A single line has no other part to be outvoted by, and was just read whole.
    let has_parts = leaves.len() > 1 || leaves.iter().any(|leaf| leaf.contains('\n'));
    if result.script == "latin"
        && result.is_english
        && has_parts
        && let Some((language, segment)) = non_english_segment(&leaves)
    {
        result.language = Some(language);
        result.is_english = false;
        result.language_undecided = false;
        result.mixed_segment = Some(segment);
    }
    // A plain string was just read whole; a structured state can still hide a message past the
    // segment scan's budget, or in a script `latin_profile` does not name.
    if matches!(state, None | Some(Value::Null | Value::String(_))) || !result.is_english {
        return result;
    }
    let mut best: Option<(usize, Detection)> = None;
    for leaf in leaves {
        let Some(det) = leaf_non_english(leaf) else {
            continue;
        };
        let letters = alpha_count(py_prefix(leaf, MAX_STATE_CHARS));
        if best.as_ref().is_none_or(|(top, _)| letters > *top) {
            best = Some((letters, det));
        }
    }
    if let Some((_, det)) = best {
        // The value's own reading decides; `mixed_segment` stays unset, as upstream leaves it.
        result.language = det.language;
        result.is_english = false;
        result.language_undecided = det.language_undecided;
    }
    result
}

/// `_is_letter`: `str.isalpha`, or a letter assigned after CPython 3.11's Unicode 14.0.
fn is_letter(ch: char) -> bool {
    py_char::is_alpha(ch)
        || (py_char::is_unassigned(ch) && tables::in_ranges(&V0_4_15.post_database_letters, u32::from(ch)))
}

/// `_analyse_text`: the detection of one flattened text, without the segment scan.
fn analyse_text(text: &str) -> Detection {
    let reading = ScriptReading::of(text, is_letter);
    if let Some(settled) = reading.settled(Upstream::V0_4_15) {
        return settled;
    }
    let evidence = latin_profile(text);
    let mut language = evidence.language;
    // The caps bars take evidence away from the Latin letters, so they have nothing to say about
    // text carried by a caseless script.
    if let Some(named) = language.filter(|&l| l != "en")
        && !non_latin_carries(reading.non_latin, reading.n_non_latin)
    {
        if is_shouted(text) {
            if !shouted_evidence(&letter_words(text), named, evidence.diacritic_rate) {
                language = None;
            }
        } else {
            // Acronym-shaped capitals in mixed-case text do not vote; emphasis words (five
            // letters or more) do, so one of them keeps every run.
            let caps: Vec<&str> = letter_runs(text).filter(|run| py_char::str_is_upper(run)).collect();
            if !caps.is_empty() && !caps.iter().any(|run| py_len(run) >= SHOUTED_MIN_WORD) {
                let blanked = blank_upper_runs(text);
                if blanked != text {
                    language = latin_profile(&blanked).language;
                }
            }
        }
    }
    reading.latin(Upstream::V0_4_15, language, &evidence)
}

/// `_latin_profile` of 0.4.15: stop-word scores, the diacritic rate, and the Swedish, Nordic,
/// collision and English-rescue rules.
fn latin_profile(text: &str) -> LatinEvidence {
    let stop = stop_lists(Upstream::V0_4_15);
    let sets = &*V0_4_15;
    let words = prose_words(text);
    let distinct: BTreeSet<&str> = words.iter().map(String::as_str).collect();
    let diacritic_rate = diacritic_rate(&lowered(text));
    let non_english = diacritic_rate >= NON_EN_DIACRITIC_RATE;
    let any_of = |set: &[&str]| distinct.iter().any(|w| contains(set, w));
    let nordic_overlap = any_of(&sets.nordic_overlap) && !any_of(&EN_ONLY_0_4_15);
    if words.len() > 1 && words.len() < 4 && any_of(&sets.short_swedish) {
        return LatinEvidence {
            language: Some("sv"),
            diacritic_rate,
            looks_non_english: non_english,
        };
    }
    if words.len() < 4 {
        return LatinEvidence {
            language: None,
            diacritic_rate,
            looks_non_english: non_english || nordic_overlap,
        };
    }

    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for word in &words {
        *counts.entry(word.as_str()).or_default() += 1;
    }
    // A collision word counts once however often it repeats; every other word counts its hits.
    let scores: Vec<usize> = stop
        .langs
        .iter()
        .map(|(_, list)| {
            counts
                .iter()
                .filter(|(w, _)| contains(list, w))
                .map(|(w, &n)| if contains(&sets.en_collision, w) { 1 } else { n })
                .sum()
        })
        .collect();
    let en = scores[0];
    // Only a language that matched a word no other list claims may be named.
    let mut best: Option<(&'static str, usize)> = None;
    for (i, (lang, list)) in stop.langs.iter().enumerate().skip(1) {
        let evidenced = distinct.iter().any(|w| contains(list, w) && !stop.is_shared(w));
        if evidenced && best.is_none_or(|(_, top)| scores[i] > top) {
            best = Some((lang, scores[i]));
        }
    }
    let has = |word: &str| distinct.contains(word);
    let language = match best {
        Some((lang, score)) if score >= (en + 2).max(2) => Some(lang),
        // "kan inte logga in": a distinctive Swedish phrase beside one English-shaped token.
        Some(("sv", _))
            if has("inte") && has("kan") && ["kan", "jag", "vi"].contains(&words[0].as_str()) && en <= 1 =>
        {
            Some("sv")
        }
        Some((lang, score)) if non_english && score >= en.max(2) => Some(lang),
        _ if en > 0 && (!non_english || english_rescued(&distinct, diacritic_rate)) => Some("en"),
        _ => None,
    };
    LatinEvidence {
        language,
        diacritic_rate,
        looks_non_english: non_english || (language.is_none() && nordic_overlap),
    }
}

/// `_english_rescued_by_words`: two distinct English-only function words and at most one word
/// carrying a non-English letter outvote a diacritic rate below 0.06.
fn english_rescued(distinct: &BTreeSet<&str>, diacritic_rate: f64) -> bool {
    if diacritic_rate >= ENGLISH_RESCUE_DIACRITIC_RATE {
        return false;
    }
    if distinct.iter().filter(|w| contains(&EN_ONLY_0_4_15, w)).count() < 2 {
        return false;
    }
    distinct
        .iter()
        .filter(|w| w.chars().any(tables::is_non_en_diacritic))
        .count()
        <= 1
}

/// `_shouted`: some upper-case letter and no lower-case one.
fn is_shouted(text: &str) -> bool {
    text.chars().any(py_char::is_upper) && !text.chars().any(py_char::is_lower)
}

/// `_shouted_evidence`: an all-caps text names `lang` only with a word of five letters and either
/// non-English diacritics or a matched stop word of four letters.
fn shouted_evidence(tokens: &[&str], lang: &str, diacritic_rate: f64) -> bool {
    if !tokens.iter().any(|t| py_len(t) >= SHOUTED_MIN_WORD) {
        return false;
    }
    if diacritic_rate >= NON_EN_DIACRITIC_RATE {
        return true;
    }
    let list = stop_lists(Upstream::V0_4_15).words(lang);
    tokens
        .iter()
        .map(|t| lowered(t))
        .any(|w| contains(list, &w) && py_len(&w) >= SHOUTED_MIN_STOPWORD)
}

/// Whether `ch` is in `[^\W\d_]`: a letter or a non-decimal numeric.
fn is_letter_word(ch: char) -> bool {
    py_char::is_word(ch) && !py_char::is_decimal(ch) && ch != '_'
}

/// `_LETTER_RUN.finditer(text)`: maximal runs of `[^\W\d_]` of two characters or more.
fn letter_runs(text: &str) -> impl Iterator<Item = &str> {
    text.split(|ch: char| !is_letter_word(ch))
        .filter(|run| py_len(run) >= 2)
}

/// `_LETTER_RUN.sub(…)`: every all-caps letter run of two or more replaced by one space.
fn blank_upper_runs(text: &str) -> String {
    fn flush(run: &mut String, out: &mut String) {
        if py_len(run) >= 2 && py_char::str_is_upper(run) {
            out.push(' ');
        } else {
            out.push_str(run);
        }
        run.clear();
    }
    let mut out = String::with_capacity(text.len());
    let mut run = String::new();
    for ch in text.chars() {
        if is_letter_word(ch) {
            run.push(ch);
        } else {
            flush(&mut run, &mut out);
            out.push(ch);
        }
    }
    flush(&mut run, &mut out);
    out
}

/// `_CODE_LINE.search(line)`: `=`, `;`, a brace or bracket, or a call `name(`.
fn is_code_line(line: &str) -> bool {
    let mut previous_is_word = false;
    for ch in line.chars() {
        if matches!(ch, '=' | ';' | '{' | '}' | '[' | ']') || (ch == '(' && previous_is_word) {
            return true;
        }
        previous_is_word = py_char::is_word(ch);
    }
    false
}

/// `_JOINED.search(token)`: a letter or digit, a joiner (`.`, `_`, `/`, `\`), a letter or digit.
fn is_joined(token: &str) -> bool {
    let alnum = |ch: char| py_char::is_word(ch) && ch != '_';
    let chars: Vec<char> = token.chars().collect();
    chars
        .windows(3)
        .any(|w| alnum(w[0]) && matches!(w[1], '.' | '_' | '/' | '\\') && alnum(w[2]))
}

/// `_named_prose_language`: the language one non-code line is written in, needing four words and
/// two different words of that language, with acronyms and slash compounds left out.
fn named_prose_language(segment: &str) -> Option<&'static str> {
    if py_strip(segment).is_empty() || is_code_line(segment) {
        return None;
    }
    let kept: Vec<&str> = segment
        .split(py_char::is_space)
        .filter(|token| !token.is_empty() && !is_joined(token))
        .collect();
    let mut prose = kept.join(" ");
    let shouted = is_shouted(&prose);
    if !shouted {
        prose = blank_upper_runs(&prose);
    }
    let tokens = letter_words(&prose);
    if tokens.len() < 4 {
        return None;
    }
    let evidence = latin_profile(&prose);
    let lang = evidence.language.filter(|&l| l != "en")?;
    if shouted && !shouted_evidence(&tokens, lang, evidence.diacritic_rate) {
        return None;
    }
    let list = stop_lists(Upstream::V0_4_15).words(lang);
    let matched: BTreeSet<String> = tokens
        .iter()
        .map(|t| lowered(t))
        .filter(|w| contains(list, w))
        .collect();
    (matched.len() >= 2).then_some(lang)
}

/// `_non_english_segment`: the first line of a leaf, in leaf order, that names a non-English
/// language, as `(language, stripped line)`; at most 4000 characters are read in all.
fn non_english_segment(leaves: &[&str]) -> Option<(&'static str, String)> {
    let mut seen = 0usize;
    for leaf in leaves {
        for segment in leaf.split('\n') {
            if seen >= MAX_STATE_CHARS {
                return None;
            }
            let segment = py_prefix(segment, MAX_STATE_CHARS - seen);
            seen += py_len(segment);
            if let Some(lang) = named_prose_language(segment) {
                return Some((lang, py_strip(segment).to_owned()));
            }
        }
    }
    None
}

/// `_leaf_non_english`: the reading of the line of `leaf` with the most letters that is itself
/// not safe for the English checkpoint (each line capped at 4000 characters), else `None`.
fn leaf_non_english(leaf: &str) -> Option<Detection> {
    let mut best: Option<(usize, Detection)> = None;
    for line in leaf.split('\n') {
        if py_len(line) < MIN_LEAF_LINE {
            continue;
        }
        let sample = py_prefix(line, MAX_STATE_CHARS);
        if py_strip(sample).is_empty() || is_code_line(sample) {
            continue;
        }
        let det = analyse_text(sample);
        if det.is_english {
            continue;
        }
        let named = det.language.is_some_and(|l| l != "en") && named_prose_language(sample).is_some();
        if !named {
            let carried = if det.script != "latin" && det.script != "unknown" {
                has_non_latin_words(sample) && alpha_count(sample) as f64 >= NON_LATIN_MIN_LETTERS
            } else {
                det.diacritic_rate >= NON_EN_DIACRITIC_RATE && letter_words(sample).len() >= 4
            };
            if !carried {
                continue;
            }
        }
        let letters = alpha_count(sample);
        if best.as_ref().is_none_or(|(top, _)| letters > *top) {
            best = Some((letters, det));
        }
    }
    best.map(|(_, det)| det)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every expectation below is what upstream 0.4.15's `laya.lang.analyse` answers.
    fn detect(state: Value) -> Detection {
        analyse(Some(&state))
    }

    fn verdict(state: Value) -> (Option<&'static str>, bool, bool) {
        let d = detect(state);
        (d.language, d.is_english, d.language_undecided)
    }

    #[test]
    fn letters_newer_than_the_database_count_as_other() {
        let d = detect(json!("\u{1c89}\u{1c8a}\u{1c89} \u{1c89}\u{1c8a}"));
        assert_eq!(
            (d.script.as_str(), d.is_english, d.non_latin_fraction),
            ("other", false, 1.0)
        );
        assert!(is_letter('\u{1c89}') && is_letter('\u{31350}') && is_letter('a'));
        assert!(!is_letter('\u{1c8b}') && !is_letter('1') && !py_char::is_alpha('\u{1c89}'));
        // 0.3.20 does not see them at all.
        let old = super::super::v0_3_20::analyse(Some(&json!("\u{1c89}\u{1c8a}")));
        assert_eq!(old.script, "unknown");
    }

    #[test]
    fn swedish_fragments_and_nordic_overlap() {
        assert_eq!(verdict(json!("glömt lösenord")), (Some("sv"), false, false));
        assert_eq!(verdict(json!("kan inte logga in")), (Some("sv"), false, false));
        // Generic words are not enough for the fragment rule; the diacritics still speak.
        assert_eq!(verdict(json!("hjälp paket")), (None, false, true));
        // Danish shares `hej` and `min`: not Swedish, but not English either.
        assert_eq!(verdict(json!("hej min ven")), (None, false, true));
    }

    #[test]
    fn collision_words_count_once_and_english_rescues_a_loanword() {
        assert_eq!(verdict(json!("do more, do less, do it now")), (Some("en"), true, false));
        let d = detect(json!("I ordered a café latte and a croissant, but they never arrived."));
        assert_eq!((d.language, d.is_english, d.diacritic_rate), (Some("en"), true, 0.0159));
    }

    #[test]
    fn acronyms_and_shouting() {
        assert_eq!(verdict(json!("MON DES EST LA")), (None, true, true));
        assert_eq!(
            verdict(json!("The MON DES EST LA game is tonight")),
            (Some("en"), true, false)
        );
        // An emphasis word of five letters keeps every capital run in the vote.
        assert_eq!(verdict(json!("sag mir das HEUTIGE DATUM")), (Some("de"), false, false));
        // Vetoed for its short stop words, kept off English by its umlauts.
        assert_eq!(verdict(json!("WIE SPÄT IST ES IN KÖLN")), (None, false, true));
        // Text carried by a caseless script is not held to the caps bars.
        let d = detect(json!("ПРИВЕТ MON DES EST LA"));
        assert_eq!((d.script.as_str(), d.language), ("latin", Some("fr")));
        assert_eq!(blank_upper_runs("The MON x ǅA DES2 é"), "The   x ǅA  2 é");
    }

    #[test]
    fn a_foreign_line_in_english_text_is_the_mixed_segment() {
        let state = json!(
            "I was charged twice for invoice 4411, please refund it today. The app crashes when I \
             open the settings page on my phone. We have been waiting for the replacement part \
             since Monday.\nMeu pedido não chegou e preciso de ajuda urgente com isso, por favor"
        );
        let d = detect(state);
        assert_eq!(
            (d.language, d.is_english, d.language_undecided),
            (Some("pt"), false, false)
        );
        assert_eq!(
            d.mixed_segment.as_deref(),
            Some("Meu pedido não chegou e preciso de ajuda urgente com isso, por favor")
        );
        let text = serde_json::to_string(&d.to_json()).unwrap_or_default();
        assert!(text.ends_with(r#""non_latin_fraction":0.0,"mixed_segment":"Meu pedido não chegou e preciso de ajuda urgente com isso, por favor"}"#), "{text}");
    }

    #[test]
    fn a_short_foreign_field_beside_a_long_english_one_overrides_without_a_segment() {
        let log = "I was charged twice for invoice 4411, please refund it today. ".repeat(80);
        let d = detect(json!({"log": log, "message": "Mein Konto wurde gesperrt, bitte helfen Sie mir"}));
        assert_eq!(
            (d.language, d.is_english, d.mixed_segment.as_deref()),
            (Some("de"), false, None)
        );
        let d = detect(json!({"log": log, "message": "注文した商品がまだ届いていません"}));
        assert_eq!((d.script.as_str(), d.language, d.is_english), ("latin", None, false));
        assert!(d.language_undecided);
    }

    #[test]
    fn code_lines_and_compounds_are_not_prose() {
        assert!(is_code_line("x = 1") && is_code_line("round(el, 2)") && is_code_line("a[0]"));
        assert!(!is_code_line("Deu erro (500) no login") && !is_code_line("ok."));
        assert!(is_joined("Nav/Com") && is_joined("C:\\DOS\\mode") && is_joined("a_b") && is_joined("v1.2"));
        assert!(!is_joined("_a") && !is_joined("arrivato.") && !is_joined("a-b"));
        let state = json!("Please check this:\nx = os.path.join(dir, nome_do_arquivo)\nThanks");
        assert_eq!(verdict(state), (Some("en"), true, false));
    }
}
