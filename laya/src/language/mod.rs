//! Script and language detection of a request's state, ported from upstream `laya.lang` (0.3.20):
//! the `detection` object of `routing`, and the evidence the router's reasons quote (spec §6.4).
//!
//! Upstream runs on CPython 3.11, so every character test here is Python's on Unicode 14.0:
//! `str.isalpha` (general category L*), `re`'s `\w` and `\d`, `str.isupper`, `str.lower` and
//! `unicodedata.combining`. The Rust tables behind them know newer Unicode versions; characters
//! assigned since 14.0 are treated as unassigned, as CPython 3.11 sees them ([`crate::python_text::py_char`]).

use crate::python_text::py_char;
use serde_json::{Map, Value};

use crate::python_text::{float_value, py_len, round4};

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

/// Scripts the English checkpoint cannot read, by code-point range, checked in this order
/// (`_SCRIPT_RANGES`; spec Appendix A). A letter no range claims counts as `other`.
const SCRIPT_RANGES: [(&str, &[(u32, u32)]); 25] = [
    ("greek", &[(0x0370, 0x03FF), (0x1F00, 0x1FFF)]),
    ("cyrillic", &[(0x0400, 0x052F), (0x2DE0, 0x2DFF), (0xA640, 0xA69F)]),
    ("armenian", &[(0x0530, 0x058F)]),
    ("hebrew", &[(0x0590, 0x05FF)]),
    (
        "arabic",
        &[
            (0x0600, 0x06FF),
            (0x0750, 0x077F),
            (0x08A0, 0x08FF),
            (0xFB50, 0xFDFF),
            (0xFE70, 0xFEFF),
        ],
    ),
    ("devanagari", &[(0x0900, 0x097F), (0xA8E0, 0xA8FF)]),
    ("bengali", &[(0x0980, 0x09FF)]),
    ("gurmukhi", &[(0x0A00, 0x0A7F)]),
    ("gujarati", &[(0x0A80, 0x0AFF)]),
    ("oriya", &[(0x0B00, 0x0B7F)]),
    ("tamil", &[(0x0B80, 0x0BFF)]),
    ("telugu", &[(0x0C00, 0x0C7F)]),
    ("kannada", &[(0x0C80, 0x0CFF)]),
    ("malayalam", &[(0x0D00, 0x0D7F)]),
    ("sinhala", &[(0x0D80, 0x0DFF)]),
    ("thai", &[(0x0E00, 0x0E7F)]),
    ("lao", &[(0x0E80, 0x0EFF)]),
    ("tibetan", &[(0x0F00, 0x0FFF)]),
    ("myanmar", &[(0x1000, 0x109F)]),
    ("georgian", &[(0x10A0, 0x10FF)]),
    ("ethiopic", &[(0x1200, 0x137F)]),
    ("khmer", &[(0x1780, 0x17FF)]),
    ("hangul", &[(0x1100, 0x11FF), (0x3130, 0x318F), (0xAC00, 0xD7AF)]),
    ("kana", &[(0x3040, 0x309F), (0x30A0, 0x30FF), (0x31F0, 0x31FF)]),
    ("han", &[(0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF)]),
];

/// Function words per language, in upstream's order (which breaks score ties), each list sorted
/// by code point for binary search (`_STOP`; spec Appendix A).
const STOP: [(&str, &[&str]); 10] = [
    (
        "en",
        &[
            "and", "are", "as", "at", "be", "but", "can", "for", "from", "has", "have", "i", "in", "is", "it", "not",
            "of", "on", "please", "that", "the", "their", "there", "this", "to", "was", "we", "were", "what", "which",
            "will", "with", "would", "you",
        ],
    ),
    (
        "fr",
        &[
            "alors", "au", "aux", "avec", "bien", "bonjour", "ce", "ces", "cette", "comment", "dans", "des", "deux",
            "dois", "doit", "donc", "du", "elle", "elles", "est", "et", "fait", "fois", "il", "ils", "je", "jour",
            "jours", "la", "le", "les", "ma", "mais", "merci", "mes", "mois", "mon", "nous", "ont", "ou", "pas",
            "peut", "peux", "plus", "pour", "pourquoi", "quand", "que", "qui", "sa", "ses", "sont", "sur", "ta", "tes",
            "ton", "tous", "tout", "toute", "trois", "très", "tu", "une", "veut", "veux", "vous", "être",
        ],
    ),
    (
        "de",
        &[
            "aber", "auch", "auf", "aus", "bei", "bitte", "das", "dem", "den", "der", "dich", "die", "diese", "diesen",
            "dieser", "dieses", "dir", "ein", "eine", "einem", "einen", "einer", "für", "gibt", "habe", "haben",
            "heute", "ich", "im", "in", "ist", "jetzt", "kann", "kannst", "mein", "meine", "meinem", "meinen",
            "meiner", "mich", "mir", "mit", "nach", "nicht", "noch", "oder", "sich", "sind", "und", "uns", "von",
            "wann", "was", "welche", "werden", "wie", "wir", "wird", "wo", "wurde", "zu", "zum", "zur",
        ],
    ),
    (
        "es",
        &[
            "al", "algo", "aquí", "aunque", "como", "con", "cuando", "del", "donde", "dos", "el", "entre", "es", "esa",
            "ese", "eso", "esta", "este", "esto", "está", "fue", "fueron", "gracias", "han", "hay", "hemos", "hoy",
            "la", "las", "le", "les", "lo", "los", "mi", "muy", "más", "nada", "necesito", "ni", "nos", "para", "pero",
            "por", "porque", "puede", "pueden", "que", "quiero", "se", "ser", "sobre", "son", "su", "sus", "también",
            "tengo", "tiene", "tienen", "todo", "tres", "tu", "un", "una", "y", "ya",
        ],
    ),
    (
        "pt",
        &[
            "agora", "ainda", "alguem", "alguém", "ali", "antes", "ao", "aos", "aqui", "as", "até", "boa", "cadê",
            "com", "como", "consigo", "da", "das", "depois", "deu", "do", "dois", "dos", "e", "em", "entao", "então",
            "era", "esta", "estamos", "estava", "este", "estou", "está", "eu", "ficou", "fiz", "foi", "gostaria",
            "hoje", "isso", "isto", "ja", "já", "mais", "mas", "meu", "meus", "minha", "minhas", "muito", "na", "nada",
            "nao", "nas", "nenhum", "nenhuma", "ninguem", "ninguém", "noite", "nos", "nossa", "nosso", "não", "o",
            "obrigada", "obrigado", "olá", "onde", "ontem", "os", "para", "pela", "pelo", "pode", "podem", "por",
            "porque", "pra", "preciso", "quando", "que", "quero", "sao", "se", "ser", "seu", "sou", "sua", "são",
            "tambem", "também", "tarde", "tem", "tenho", "três", "tudo", "tá", "um", "uma", "vc", "vcs", "voce",
            "voces", "você", "vocês", "é",
        ],
    ),
    (
        "it",
        &[
            "abbiamo", "adesso", "agli", "alla", "alle", "anche", "ancora", "avete", "che", "ci", "ciao", "col",
            "come", "con", "da", "dagli", "dal", "dalla", "dallo", "degli", "dei", "del", "della", "delle", "dello",
            "deve", "devo", "devono", "di", "dove", "e", "ed", "era", "fra", "già", "gli", "grazie", "ha", "hai",
            "hanno", "ho", "ieri", "il", "la", "le", "lo", "mai", "mi", "mia", "mio", "molto", "ne", "negli", "nel",
            "nell", "nella", "non", "o", "oggi", "per", "perche", "più", "poco", "quando", "questa", "questo", "scusa",
            "sempre", "si", "sono", "stata", "stato", "su", "sua", "sul", "sulla", "sulle", "tra", "tuo", "un", "una",
            "uno", "voglio", "vorrei", "è",
        ],
    ),
    (
        "nl",
        &[
            "aan", "dat", "deze", "door", "een", "het", "is", "maar", "met", "naar", "niet", "ook", "op", "te", "van",
            "voor", "worden", "wordt", "zijn",
        ],
    ),
    (
        "ro",
        &[
            "aceasta", "această", "acest", "acesta", "acum", "ale", "care", "dar", "din", "după", "este", "foarte",
            "fost", "fără", "lui", "mi", "nu", "pentru", "până", "sunt", "să", "trebuie", "vreau", "vă", "în", "și",
            "ți",
        ],
    ),
    (
        "bn",
        &[
            "abar",
            "ajke",
            "akhon",
            "amader",
            "amake",
            "amar",
            "ami",
            "amra",
            "apnake",
            "apnar",
            "apnara",
            "apni",
            "ar",
            "asbe",
            "bhai",
            "bhalo",
            "bolte",
            "bolun",
            "chai",
            "chaina",
            "dhonnobad",
            "dilam",
            "dite",
            "diye",
            "diyechi",
            "dorkar",
            "duibar",
            "ei",
            "eita",
            "ekbar",
            "ekhon",
            "ekhono",
            "ekta",
            "ferot",
            "geche",
            "gese",
            "hobe",
            "hocche",
            "hoise",
            "hoye",
            "hoyeche",
            "hoyni",
            "jabe",
            "jodi",
            "jonno",
            "kalke",
            "keno",
            "keu",
            "kharap",
            "khub",
            "ki",
            "kibhabe",
            "kichu",
            "kintu",
            "kivabe",
            "kobe",
            "kokhon",
            "korbo",
            "korchi",
            "kore",
            "koreche",
            "korechi",
            "koren",
            "korlam",
            "korsi",
            "korte",
            "korun",
            "kothay",
            "koto",
            "lagbe",
            "moddhe",
            "nai",
            "niye",
            "oi",
            "oita",
            "onek",
            "ota",
            "pabo",
            "paini",
            "parben",
            "parbo",
            "parchi",
            "parchina",
            "peyechi",
            "sathe",
            "shathe",
            "shob",
            "shomossa",
            "somossa",
            "tader",
            "tahole",
            "taka",
            "theke",
            "tomake",
            "tomar",
            "tomra",
            "tumi",
            "valo",
        ],
    ),
    (
        "az",
        &[
            "amma", "ancaq", "artiq", "artıq", "bir", "biz", "bu", "cox", "daha", "deyil", "də", "eger", "görə", "həm",
            "hər", "ile", "ilə", "isə", "kimi", "lakin", "mən", "nə", "olan", "olmasa", "olub", "onlar", "siz",
            "sonra", "sən", "ucun", "var", "ve", "və", "yalniz", "yalnız", "yox", "yoxdur", "çox", "üçün", "əgər",
        ],
    ),
];

/// Letters ordinary English does not use, matched after lower-casing (`_NON_EN_DIACRITICS`).
const NON_EN_DIACRITICS: &str = "ßàáâãäåæçèéêëìíîïñòóôõöøùúûüýÿāăąćčďđēęěğģīıķļłńņňőœřśşšţťūůűźżžșțə";

/// What detection found in a state: the `routing.detection` object (`laya.lang.analyse`).
#[derive(Clone, Debug, PartialEq)]
pub struct Detection {
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
}

impl Detection {
    /// The `detection` object upstream emits, keys in its order, floats at full double precision.
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
        Value::Object(out)
    }
}

/// The text detection reads (`laya.lang.state_text`): string leaves depth-first (keys, numbers,
/// booleans and null ignored; nothing below depth 6), joined by spaces, at most 4000 characters.
/// A missing state reads as null: the empty string.
pub fn state_text(state: Option<&Value>) -> String {
    let mut leaves = Vec::new();
    if let Some(state) = state {
        collect_leaves(state, 0, &mut leaves);
    }
    let mut parts: Vec<&str> = Vec::new();
    let mut budget = MAX_STATE_CHARS as i64;
    for leaf in leaves {
        if budget <= 0 {
            break;
        }
        let len = py_len(leaf) as i64;
        if len > budget {
            parts.push(char_prefix(leaf, budget as usize));
            break;
        }
        parts.push(leaf);
        budget -= len + 1;
    }
    let joined = parts.join(" ");
    char_prefix(&joined, MAX_STATE_CHARS).to_owned()
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

/// Python's `s[:n]`: the first `n` code points.
fn char_prefix(s: &str, n: usize) -> &str {
    s.char_indices().nth(n).map_or(s, |(at, _)| &s[..at])
}

/// Full detection of a state (`laya.lang.analyse`); see spec §6.4.
pub fn analyse(state: Option<&Value>) -> Detection {
    let text = state_text(state);
    let letters = LetterCounts::of(&text);
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
    // Python's round(): half to even on the binary value.
    let n_non_latin = (non_latin * letters.total() as f64).round_ties_even();
    if script == "latin"
        && has_non_latin_words(&text)
        && (non_latin >= NON_LATIN_FRACTION
            || (non_latin >= NON_LATIN_MIN_FRACTION && n_non_latin >= NON_LATIN_MIN_LETTERS))
    {
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
    let script_profile = profile.iter().map(|(s, share)| ((*s).to_owned(), *share)).collect();
    if script == "unknown" {
        return Detection {
            script: script.to_owned(),
            script_profile,
            language: None,
            is_english: true,
            language_undecided: true,
            diacritic_rate: 0.0,
            non_latin_fraction: 0.0,
        };
    }
    if script != "latin" {
        return Detection {
            script: script.to_owned(),
            script_profile,
            language: None,
            is_english: false,
            language_undecided: true,
            diacritic_rate: 0.0,
            non_latin_fraction: non_latin,
        };
    }
    let evidence = latin_profile(&text);
    let undecided = evidence.language.is_none();
    Detection {
        script: script.to_owned(),
        script_profile,
        language: evidence.language,
        is_english: evidence.language == Some("en") || (undecided && !evidence.looks_non_english),
        language_undecided: undecided,
        diacritic_rate: round4(evidence.diacritic_rate),
        non_latin_fraction: non_latin,
    }
}

/// Letters of a text per script, as `script_profile` and `detect_script` count them.
struct LetterCounts {
    /// Latin letters (Latin, IPA extensions, Latin Extended Additional, fullwidth Latin).
    latin: usize,
    /// Every other script with at least one letter, in first-seen order (`other` included).
    others: Vec<(&'static str, usize)>,
}

impl LetterCounts {
    fn of(text: &str) -> Self {
        let mut counts = LetterCounts {
            latin: 0,
            others: Vec::new(),
        };
        for ch in text.chars().filter(|&ch| py_char::is_alpha(ch)) {
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

/// The first script range of [`SCRIPT_RANGES`] that holds `cp`.
fn named_script(cp: u32) -> Option<&'static str> {
    SCRIPT_RANGES
        .iter()
        .find(|(_, ranges)| ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&cp)))
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

/// What `latin_profile` tells `analyse`.
struct LatinEvidence {
    /// The named language, or `None` when undecided.
    language: Option<&'static str>,
    /// Non-English letters over the length of the lower-cased text (not yet rounded).
    diacritic_rate: f64,
    /// `diacritic_rate ≥ 0.02`.
    looks_non_english: bool,
}

/// `latin_profile`: stop-word scores and the diacritic rate behind the Latin language guess.
fn latin_profile(text: &str) -> LatinEvidence {
    let mut prose = String::with_capacity(text.len());
    py_char::push_lower(&blank_identifiers(text).replace('İ', "i"), &mut prose);
    let words = letter_words(&prose);

    let mut lowered = String::with_capacity(text.len());
    py_char::push_lower(text, &mut lowered);
    let diacritics = lowered.chars().filter(|ch| NON_EN_DIACRITICS.contains(*ch)).count();
    let diacritic_rate = diacritics as f64 / py_len(&lowered).max(1) as f64;
    let non_english = diacritic_rate >= NON_EN_DIACRITIC_RATE;
    if words.len() < 4 {
        return LatinEvidence {
            language: None,
            diacritic_rate,
            looks_non_english: non_english,
        };
    }

    let mut scores = [0usize; STOP.len()];
    let mut evidenced = [false; STOP.len()];
    for word in &words {
        let lists: Vec<usize> = (0..STOP.len())
            .filter(|&i| STOP[i].1.binary_search(word).is_ok())
            .collect();
        for &i in &lists {
            scores[i] += 1;
            // A word of one list only is evidence for that language (not in `_SHARED_WORDS`).
            evidenced[i] |= lists.len() == 1;
        }
    }
    let en = scores[0];
    let mut best: Option<(usize, usize)> = None;
    for i in (1..STOP.len()).filter(|&i| evidenced[i]) {
        if best.is_none_or(|(_, top)| scores[i] > top) {
            best = Some((i, scores[i]));
        }
    }
    let language = match best {
        Some((i, score)) if score >= (en + 2).max(2) => Some(STOP[i].0),
        Some((i, score)) if non_english && score >= en.max(2) => Some(STOP[i].0),
        _ if en > 0 && !non_english => Some("en"),
        _ => None,
    };
    LatinEvidence {
        language,
        diacritic_rate,
        looks_non_english: non_english,
    }
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
        analyse(Some(&state))
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
        assert_eq!(analyse(None).script, "unknown");
        let unknown = r#"{"script":"unknown","script_profile":{},"language":null,"is_english":true,"language_undecided":true,"diacritic_rate":0.0,"non_latin_fraction":0.0}"#;
        assert_eq!(
            serde_json::to_string(&analyse(None).to_json()).unwrap_or_default(),
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
    fn data_matches_upstream() {
        let counts: Vec<(&str, usize)> = STOP.iter().map(|(lg, words)| (*lg, words.len())).collect();
        let want = [
            ("en", 34),
            ("fr", 67),
            ("de", 63),
            ("es", 65),
            ("pt", 107),
            ("it", 85),
            ("nl", 19),
            ("ro", 27),
            ("bn", 98),
            ("az", 40),
        ];
        assert_eq!(counts, want);
        for (lg, words) in STOP {
            assert!(
                words.windows(2).all(|w| w[0] < w[1]),
                "{lg} must be sorted for binary search"
            );
        }
        let mut shared: Vec<&str> = STOP
            .iter()
            .flat_map(|(_, words)| words.iter().copied())
            .filter(|w| STOP.iter().filter(|(_, l)| l.binary_search(w).is_ok()).count() > 1)
            .collect();
        shared.sort_unstable();
        shared.dedup();
        assert_eq!(shared.len(), 38);
        let diacritics: Vec<u32> = NON_EN_DIACRITICS.chars().map(u32::from).collect();
        let mut want: Vec<u32> = vec![0xDF];
        want.extend((0xE0..=0xFF).filter(|cp| ![0xF0, 0xF7, 0xFE].contains(cp)));
        want.extend([
            0x101, 0x103, 0x105, 0x107, 0x10D, 0x10F, 0x111, 0x113, 0x119, 0x11B, 0x11F, 0x123, 0x12B, 0x131, 0x137,
            0x13C, 0x142, 0x144, 0x146, 0x148, 0x151, 0x153, 0x159, 0x15B, 0x15F, 0x161, 0x163, 0x165, 0x16B, 0x16F,
            0x171, 0x17A, 0x17C, 0x17E, 0x219, 0x21B, 0x259,
        ]);
        assert_eq!(diacritics, want);
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
