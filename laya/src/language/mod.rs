//! Script and language detection of a request's state, ported from upstream `laya.lang`: the
//! `detection` object of `routing`, and the evidence the router's reasons quote (spec §6.4).
//!
//! What both releases share lives in `reading.rs`: reading the state, counting letters per script, the
//! non-Latin promotion, identifiers and words. Each release's Latin-language rules live in its own
//! file (`v0_3_20.rs`, `v0_4_15.rs`); the tables are data (`tables.rs`, `laya/data/*.txt`).
//!
//! Upstream runs on CPython 3.11, so every character test here is Python's on Unicode 14.0:
//! `str.isalpha` (general category L*), `re`'s `\w` and `\d`, `str.isupper`, `str.lower` and
//! `unicodedata.combining`. The Rust tables behind them know newer Unicode versions; characters
//! assigned since 14.0 are treated as unassigned, as CPython 3.11 sees them ([`crate::python_text::py_char`]).

mod reading;
mod tables;
mod v0_3_20;
mod v0_4_15;

use serde_json::Value;

pub use reading::{Detection, state_text};

use crate::upstream::Upstream;

/// Full detection of a state (`laya.lang.analyse`) by the rules of `upstream`; see spec §6.4.
pub fn analyse(state: Option<&Value>, upstream: Upstream) -> Detection {
    match upstream {
        Upstream::V0_3_20 => v0_3_20::analyse(state),
        Upstream::V0_4_15 => v0_4_15::analyse(state),
    }
}

#[cfg(test)]
mod tests {
    use super::reading::*;
    use super::*;
    use crate::python_text::{py_char, py_len};
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
