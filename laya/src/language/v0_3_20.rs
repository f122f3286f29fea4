//! The 0.3.20 detector (`laya.lang.analyse` of `laya[serve]==0.3.20`): one read of the joined
//! state text, `str.isalpha` letters, and the plain stop-word margin.

use serde_json::Value;

use super::reading::{
    Detection, LatinEvidence, NON_EN_DIACRITIC_RATE, ScriptReading, diacritic_rate, lowered, prose_words, state_text,
};
use super::tables::{self, StopLists};
use crate::python_text::py_char;
use crate::upstream::Upstream;

/// `analyse(state)` of 0.3.20.
pub(super) fn analyse(state: Option<&Value>) -> Detection {
    let text = state_text(state);
    let reading = ScriptReading::of(&text, py_char::is_alpha);
    if let Some(settled) = reading.settled(Upstream::V0_3_20) {
        return settled;
    }
    let evidence = latin_profile(&text);
    reading.latin(Upstream::V0_3_20, evidence.language, &evidence)
}

/// `latin_profile`: stop-word scores and the diacritic rate behind the Latin language guess.
fn latin_profile(text: &str) -> LatinEvidence {
    let stop: &StopLists = tables::stop_lists(Upstream::V0_3_20);
    let words = prose_words(text);
    let diacritic_rate = diacritic_rate(&lowered(text));
    let non_english = diacritic_rate >= NON_EN_DIACRITIC_RATE;
    if words.len() < 4 {
        return LatinEvidence {
            language: None,
            diacritic_rate,
            looks_non_english: non_english,
        };
    }

    let mut scores = vec![0usize; stop.langs.len()];
    let mut evidenced = vec![false; stop.langs.len()];
    for word in &words {
        for (i, (_, list)) in stop.langs.iter().enumerate() {
            if tables::contains(list, word) {
                scores[i] += 1;
                // A word of one list only is evidence for that language (not in `_SHARED_WORDS`).
                evidenced[i] |= !stop.is_shared(word);
            }
        }
    }
    let en = scores[0];
    let mut best: Option<(usize, usize)> = None;
    for i in (1..stop.langs.len()).filter(|&i| evidenced[i]) {
        if best.is_none_or(|(_, top)| scores[i] > top) {
            best = Some((i, scores[i]));
        }
    }
    let language = match best {
        Some((i, score)) if score >= (en + 2).max(2) => Some(stop.langs[i].0),
        Some((i, score)) if non_english && score >= en.max(2) => Some(stop.langs[i].0),
        _ if en > 0 && !non_english => Some("en"),
        _ => None,
    };
    LatinEvidence {
        language,
        diacritic_rate,
        looks_non_english: non_english,
    }
}
