//! The data behind detection: script ranges, diacritics, function words and the 0.4.15 word sets,
//! read once from `laya/data/*.txt` (written from upstream's `laya/lang.py` by
//! `tools/fixtures/dump_language_tables.py`) and shared by both releases where they agree.
//!
//! The files are embedded at compile time, so nothing here can fail at run time: a malformed
//! entry would be skipped, and the unit tests pin every table's size against upstream.

use std::sync::LazyLock;

use crate::upstream::Upstream;

const SCRIPTS: &str = include_str!("../../data/scripts.txt");
const DIACRITICS: &str = include_str!("../../data/diacritics.txt");
const STOPWORDS: &str = include_str!("../../data/stopwords.txt");
const LANG_0_4_15: &str = include_str!("../../data/lang-0.4.15.txt");

/// The lines of a data file that carry data (`#` starts a comment line).
fn data_lines(text: &'static str) -> impl Iterator<Item = &'static str> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
}

/// `"0370-03FF"` as an inclusive code-point range.
fn parse_range(token: &str) -> Option<(u32, u32)> {
    let (lo, hi) = token.split_once('-')?;
    Some((u32::from_str_radix(lo, 16).ok()?, u32::from_str_radix(hi, 16).ok()?))
}

/// Whether `cp` lies in one of `ranges`.
pub(super) fn in_ranges(ranges: &[(u32, u32)], cp: u32) -> bool {
    ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&cp))
}

/// A script's name and its inclusive code-point ranges.
pub(super) type ScriptRanges = (&'static str, Vec<(u32, u32)>);

/// Scripts the English checkpoint cannot read, in upstream's order (`_SCRIPT_RANGES`). The ranges
/// do not overlap, so upstream's bisect (0.4.15) and its first-match scan (0.3.20) agree.
pub(super) static SCRIPT_RANGES: LazyLock<Vec<ScriptRanges>> = LazyLock::new(|| {
    data_lines(SCRIPTS)
        .filter_map(|line| {
            let mut tokens = line.split_whitespace();
            let name = tokens.next()?;
            Some((name, tokens.filter_map(parse_range).collect()))
        })
        .collect()
});

/// Letters ordinary English does not use, sorted (`_NON_EN_DIACRITICS`; the same in both releases).
static NON_EN_DIACRITICS: LazyLock<Vec<char>> = LazyLock::new(|| {
    let mut letters: Vec<char> = data_lines(DIACRITICS).flat_map(str::chars).collect();
    letters.sort_unstable();
    letters.dedup();
    letters
});

/// Whether `ch` (already lower-cased) is one of [`NON_EN_DIACRITICS`].
pub(super) fn is_non_en_diacritic(ch: char) -> bool {
    NON_EN_DIACRITICS.binary_search(&ch).is_ok()
}

/// One release's function-word lists (`_STOP`) and the words more than one of them claims.
pub(super) struct StopLists {
    /// `(language, words sorted by code point)` in upstream's order, which breaks score ties.
    pub langs: Vec<(&'static str, Vec<&'static str>)>,
    /// `_SHARED_WORDS`, sorted: words of more than one list, plus (0.4.15) the Nordic overlap words.
    pub shared: Vec<&'static str>,
}

impl StopLists {
    fn of(upstream: Upstream) -> Self {
        let mut langs: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
        for line in data_lines(STOPWORDS) {
            let mut tokens = line.split_whitespace();
            let (Some(lang), Some(since)) = (tokens.next(), tokens.next()) else {
                continue;
            };
            if since
                .parse::<Upstream>()
                .map_or(true, |since| !upstream.has_rows_since(since))
            {
                continue;
            }
            let at = match langs.iter().position(|(l, _)| *l == lang) {
                Some(at) => at,
                None => {
                    langs.push((lang, Vec::new()));
                    langs.len() - 1
                }
            };
            langs[at].1.extend(tokens);
        }
        for (_, words) in &mut langs {
            words.sort_unstable();
            words.dedup();
        }
        let mut shared: Vec<&'static str> = langs
            .iter()
            .flat_map(|(_, words)| words.iter().copied())
            .filter(|w| langs.iter().filter(|(_, l)| l.binary_search(w).is_ok()).count() > 1)
            .collect();
        if upstream.differences().nordic_overlap {
            shared.extend(V0_4_15.nordic_overlap.iter().copied());
        }
        shared.sort_unstable();
        shared.dedup();
        StopLists { langs, shared }
    }

    /// The list of `lang`; empty for a language this release has none for.
    pub fn words(&self, lang: &str) -> &[&'static str] {
        self.langs
            .iter()
            .find(|(l, _)| *l == lang)
            .map_or(&[][..], |(_, words)| words.as_slice())
    }

    /// Whether `word` is in `_SHARED_WORDS`.
    pub fn is_shared(&self, word: &str) -> bool {
        self.shared.binary_search(&word).is_ok()
    }
}

static STOP_0_3_20: LazyLock<StopLists> = LazyLock::new(|| StopLists::of(Upstream::V0_3_20));
static STOP_0_4_15: LazyLock<StopLists> = LazyLock::new(|| StopLists::of(Upstream::V0_4_15));

/// The function-word lists of a release.
pub(super) fn stop_lists(upstream: Upstream) -> &'static StopLists {
    match upstream {
        Upstream::V0_3_20 => &STOP_0_3_20,
        Upstream::V0_4_15 => &STOP_0_4_15,
    }
}

/// The word sets and letter ranges only 0.4.15 has, each sorted.
pub(super) struct Sets0415 {
    /// `_SHORT_SWEDISH_WORDS`: enough to name Swedish in a fragment of two or three words.
    pub short_swedish: Vec<&'static str>,
    /// `_NORDIC_OVERLAP_WORDS`: Swedish words Danish shares, which name no language alone.
    pub nordic_overlap: Vec<&'static str>,
    /// `_EN_COLLISION_WORDS`: foreign function words that are also English, counted once.
    pub en_collision: Vec<&'static str>,
    /// `_POST_DATABASE_LETTER_RANGES`, in upstream's order: letters CPython 3.11's Unicode
    /// database does not know.
    pub post_database_letters: Vec<(u32, u32)>,
}

impl Sets0415 {
    fn load() -> Self {
        let members = |name: &str| -> Vec<&'static str> {
            data_lines(LANG_0_4_15)
                .filter_map(|line| line.split_once(' '))
                .filter(|(key, _)| *key == name)
                .flat_map(|(_, rest)| rest.split_whitespace())
                .collect()
        };
        let words = |name: &str| {
            let mut words = members(name);
            words.sort_unstable();
            words.dedup();
            words
        };
        Sets0415 {
            short_swedish: words("short_swedish"),
            nordic_overlap: words("nordic_overlap"),
            en_collision: words("en_collision"),
            post_database_letters: members("post_database_letters")
                .into_iter()
                .filter_map(parse_range)
                .collect(),
        }
    }
}

/// The 0.4.15 word sets and letter ranges.
pub(super) static V0_4_15: LazyLock<Sets0415> = LazyLock::new(Sets0415::load);

/// `_EN_ONLY_WORDS` of 0.4.15, sorted.
pub(super) static EN_ONLY_0_4_15: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    let stop = stop_lists(Upstream::V0_4_15);
    stop.words("en")
        .iter()
        .copied()
        .filter(|w| !stop.is_shared(w))
        .collect()
});

/// Whether `word` is in a sorted word list.
pub(super) fn contains(words: &[&str], word: &str) -> bool {
    words.binary_search(&word).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_lists_match_upstream() {
        let sizes = |upstream| -> Vec<(&str, usize)> {
            stop_lists(upstream).langs.iter().map(|(l, w)| (*l, w.len())).collect()
        };
        assert_eq!(
            sizes(Upstream::V0_3_20),
            [
                ("en", 34),
                ("fr", 67),
                ("de", 63),
                ("es", 65),
                ("pt", 107),
                ("it", 85),
                ("nl", 19),
                ("ro", 27),
                ("bn", 98),
                ("az", 40)
            ]
        );
        assert_eq!(
            sizes(Upstream::V0_4_15),
            [
                ("en", 116),
                ("fr", 67),
                ("de", 63),
                ("es", 65),
                ("pt", 107),
                ("it", 85),
                ("nl", 19),
                ("sv", 66),
                ("ro", 27),
                ("bn", 98),
                ("az", 40)
            ]
        );
        assert_eq!(stop_lists(Upstream::V0_3_20).shared.len(), 38);
        assert_eq!(stop_lists(Upstream::V0_4_15).shared.len(), 50);
        assert_eq!(EN_ONLY_0_4_15.len(), 112);
        assert!(
            stop_lists(Upstream::V0_4_15).is_shared("hej"),
            "Nordic overlap words are shared"
        );
        assert!(!stop_lists(Upstream::V0_3_20).is_shared("min"));
    }

    #[test]
    fn the_other_tables_match_upstream() {
        assert_eq!(SCRIPT_RANGES.len(), 25);
        assert_eq!(SCRIPT_RANGES.iter().map(|(_, r)| r.len()).sum::<usize>(), 39);
        assert_eq!(SCRIPT_RANGES[0], ("greek", vec![(0x0370, 0x03FF), (0x1F00, 0x1FFF)]));
        assert_eq!(NON_EN_DIACRITICS.len(), 67);
        assert!(is_non_en_diacritic('ə') && is_non_en_diacritic('ß') && !is_non_en_diacritic('e'));
        let sets = &*V0_4_15;
        assert_eq!(
            (
                sets.short_swedish.len(),
                sets.nordic_overlap.len(),
                sets.en_collision.len(),
                sets.post_database_letters.len()
            ),
            (21, 12, 8, 47)
        );
        assert_eq!(sets.post_database_letters[0], (0x1C89, 0x1C8A));
        assert_eq!(sets.post_database_letters[46], (0x31350, 0x323AF));
    }
}
