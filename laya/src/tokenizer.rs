//! The checkpoint's tokenizer (`tokenizer/tokenizer.json`) and the special tokens a Laya row is built
//! from (`tokenizer/tokenizer_config.json`): text in, token ids out, exactly as upstream's fast tokenizer.
//!
//! The `tokenizers` crate runs with its pure-Rust `fancy-regex` backend: the golden token rows from
//! upstream (tests/fixtures/goldens) match it id for id, so the C Oniguruma build is not needed.
//!
//! Only a text's first (or last) few hundred tokens can reach a row, so a long text is not tokenized
//! whole: [`LayaTokenizer::encode_first`] and [`LayaTokenizer::encode_last`] tokenize only the part
//! on one side of a word boundary where no token of this vocabulary can span (see their
//! documentation for why that gives exactly the whole text's tokens).

use std::path::Path;

use serde_json::Value;

use crate::config::read_json;
use crate::error::CheckpointError;

/// Ids and text of the special tokens a prompt row uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialTokens {
    /// `[CLS]` (ModernBERT) or `<bos>` (mmBERT): first token of every row.
    pub cls: u32,
    /// `[SEP]` / `<eos>`: closes the head, the options and the state.
    pub sep: u32,
    /// `[PAD]` / `<pad>`: right padding in batches.
    pub pad: u32,
    /// `[MASK]` / `<mask>`: one per option; its position is the option's marker.
    pub mask: u32,
    /// The mask token's text, removed from every text the model reads.
    pub mask_text: String,
}

/// A loaded tokenizer with its special tokens.
pub struct LayaTokenizer {
    inner: tokenizers::Tokenizer,
    special: SpecialTokens,
    long_text: LongText,
    /// When no token of the vocabulary can span a space that follows a non-space character: the
    /// added tokens' texts (a cut never goes right after one). `None`: such cuts are not exact.
    word_cuts: Option<Vec<String>>,
}

/// How [`LayaTokenizer::encode_first`] and [`LayaTokenizer::encode_last`] treat a long text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LongText {
    /// Tokenize only as much of it as the tokens asked for need (the default).
    #[default]
    Bounded,
    /// Tokenize it whole, then keep the tokens asked for, as upstream does: the reference the bounded
    /// way is tested against, at a cost that grows with the text.
    Whole,
}

/// Which end of a text's tokens is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    First,
    Last,
}

/// Tokens a cut without a word boundary must yield beyond the ones kept before it counts: the kept
/// tokens then lie at least this far from the cut, where a word cut in two tokenizes differently.
const CUT_GUARD_TOKENS: usize = 16;

/// Bytes per token the first cut allows for (English averages four to five; a cut that yields too
/// few tokens is simply followed by one twice as long).
const FIRST_CUT_BYTES_PER_TOKEN: usize = 8;

impl std::fmt::Debug for LayaTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayaTokenizer")
            .field("special", &self.special)
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

/// The tokenizer failed on a text (for example a pattern the regex backend cannot run).
#[derive(Debug, thiserror::Error)]
#[error("tokenizer failed: {0}")]
pub struct TokenizeError(String);

impl LayaTokenizer {
    /// Loads `tokenizer.json` and `tokenizer_config.json` (or `special_tokens_map.json`) from `dir`.
    pub fn load(dir: &Path) -> Result<Self, CheckpointError> {
        let json_path = dir.join("tokenizer.json");
        if !json_path.is_file() {
            return Err(CheckpointError::Missing { path: json_path });
        }
        let mut inner = tokenizers::Tokenizer::from_file(&json_path).map_err(|e| CheckpointError::Invalid {
            path: json_path.clone(),
            problem: format!("not a usable tokenizer: {e}"),
        })?;
        // Upstream passes its own truncation for options and none elsewhere; a padding or
        // truncation setting saved in the file must not leak into our ids.
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| CheckpointError::Invalid {
            path: json_path.clone(),
            problem: format!("cannot disable truncation: {e}"),
        })?;

        let config_path = dir.join("tokenizer_config.json");
        let map_path = dir.join("special_tokens_map.json");
        let (names_path, names) = if config_path.is_file() {
            (config_path.clone(), read_json(&config_path)?)
        } else if map_path.is_file() {
            (map_path.clone(), read_json(&map_path)?)
        } else {
            return Err(CheckpointError::Missing { path: config_path });
        };
        let id_of = |key: &str| -> Result<(u32, String), CheckpointError> {
            let text = special_token_text(&names, key).ok_or_else(|| CheckpointError::Invalid {
                path: names_path.clone(),
                problem: format!("no '{key}' (a Laya tokenizer needs cls, sep, pad and mask tokens)"),
            })?;
            let id = inner.token_to_id(&text).ok_or_else(|| CheckpointError::Invalid {
                path: names_path.clone(),
                problem: format!(
                    "'{key}' is {text:?}, which is not in the vocabulary of {}",
                    json_path.display()
                ),
            })?;
            Ok((id, text))
        };
        let (cls, _) = id_of("cls_token")?;
        let (sep, _) = id_of("sep_token")?;
        let (pad, _) = id_of("pad_token")?;
        let (mask, mask_text) = id_of("mask_token")?;
        Ok(Self {
            special: SpecialTokens {
                cls,
                sep,
                pad,
                mask,
                mask_text,
            },
            word_cuts: word_cuts(&inner),
            inner,
            long_text: LongText::default(),
        })
    }

    /// Sets how long texts are tokenized ([`LongText::Whole`] is the reference for tests).
    pub fn set_long_text(&mut self, long_text: LongText) {
        self.long_text = long_text;
    }

    /// Whether long texts are cut at word boundaries, which is exact for this vocabulary (see
    /// [`LayaTokenizer::encode_first`]).
    pub fn cuts_at_word_boundaries(&self) -> bool {
        self.word_cuts.is_some()
    }

    /// The special tokens.
    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }

    /// Number of ids the tokenizer can produce, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// `tok(text, add_special_tokens=False)["input_ids"]`: special tokens written in the text are
    /// still matched as such, none are added around it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizeError(e.to_string()))
    }

    /// The first `n` ids of [`LayaTokenizer::encode`]`(text)` (all of them when there are fewer),
    /// at a cost that does not grow with the rest of a long text.
    ///
    /// The text is cut at a word boundary: a space right after a character that is not whitespace
    /// (and not right after an added token's text). Where no token of the vocabulary holds a space
    /// after a non-space character (checked when the tokenizer is loaded), no token spans such a
    /// space: pre-tokenizers split there (GPT-style patterns attach a space to the word after it),
    /// and without one no BPE merge can cross it, so merges on either side never interact. The part
    /// before it therefore tokenizes exactly as the same part of the whole text. The cut is moved
    /// twice as far until the part yields `n` tokens.
    ///
    /// A text with no word boundary near the cut (a run without spaces, CJK) is cut anywhere: two
    /// cuts, the second twice as long, must then each yield [`CUT_GUARD_TOKENS`] more than `n` tokens
    /// and agree on the first `n` (BPE merges from the left, so only tokens near a cut change).
    /// Failing everything, the whole text is tokenized. tests/long_texts.rs compares both ways with
    /// whole-text tokenization on the goldens and on long generated texts.
    pub fn encode_first(&self, text: &str, n: usize) -> Result<Vec<u32>, TokenizeError> {
        self.encode_end(text, n, End::First)
    }

    /// The last `n` ids of [`LayaTokenizer::encode`]`(text)`, bounded like
    /// [`LayaTokenizer::encode_first`] from the other end, with one difference: without a word
    /// boundary the whole text is tokenized, because BPE breaks ties from the left, so cutting a
    /// long run of one character shifts every token of the run after the cut.
    pub fn encode_last(&self, text: &str, n: usize) -> Result<Vec<u32>, TokenizeError> {
        self.encode_end(text, n, End::Last)
    }

    fn encode_end(&self, text: &str, n: usize, end: End) -> Result<Vec<u32>, TokenizeError> {
        let keep = |mut ids: Vec<u32>| -> Vec<u32> {
            match end {
                End::First => ids.truncate(n),
                End::Last => {
                    ids.drain(..ids.len().saturating_sub(n));
                }
            }
            ids
        };
        let need = n.saturating_add(CUT_GUARD_TOKENS);
        let mut cut = need.saturating_mul(FIRST_CUT_BYTES_PER_TOKEN);
        // Two cuts of a text this short cost about as much as the whole.
        if self.long_text == LongText::Whole || text.len() <= cut.saturating_mul(2) {
            return self.encode(text).map(keep);
        }
        let mut earlier: Option<Vec<u32>> = None;
        while cut < text.len() {
            if let Some(at) = self.word_boundary(text, cut, end) {
                let part = match end {
                    End::First => &text[..at],
                    End::Last => &text[at..],
                };
                let ids = self.encode(part)?;
                if ids.len() >= n {
                    return Ok(keep(ids));
                }
            } else if end == End::First {
                let ids = self.encode(&text[..floor_char_boundary(text, cut)])?;
                let kept = (ids.len() >= need).then(|| keep(ids));
                match (kept, &earlier) {
                    (Some(now), Some(before)) if now == *before => return Ok(now),
                    (now, _) => earlier = now,
                }
            }
            cut = cut.saturating_mul(2);
        }
        self.encode(text).map(keep)
    }

    /// A word boundary (see [`LayaTokenizer::encode_first`]) that leaves between half of `cut` and
    /// `cut` bytes on the `end` side, nearest to `cut`; `None` when the vocabulary allows none or
    /// there is none there.
    fn word_boundary(&self, text: &str, cut: usize, end: End) -> Option<usize> {
        let added = self.word_cuts.as_ref()?;
        let bytes = text.as_bytes();
        let is_boundary = |at: usize| {
            bytes.get(at) == Some(&b' ')
                && text[..at].chars().next_back().is_some_and(|c| !c.is_whitespace())
                && !added.iter().any(|a| text[..at].ends_with(a.as_str()))
        };
        match end {
            End::First => (cut / 2..=cut.min(text.len().saturating_sub(1)))
                .rev()
                .find(|&at| is_boundary(at)),
            End::Last => {
                let from = text.len().saturating_sub(cut).max(1);
                (from..=text.len() - cut / 2).find(|&at| is_boundary(at))
            }
        }
    }
}

/// The added tokens' texts when a space after a non-space character is a boundary no token spans:
/// no token of the vocabulary holds the space's surface form (`Ġ`, `▁`, ` `) after a character
/// other than a whitespace's surface form, and no added token holds a space. `None` otherwise.
fn word_cuts(tokenizer: &tokenizers::Tokenizer) -> Option<Vec<String>> {
    let surface = |text: &str| -> Option<char> {
        let encoding = tokenizer.encode(text, false).ok()?;
        match encoding.get_tokens() {
            [one] => {
                let mut chars = one.chars();
                let first = chars.next()?;
                chars.next().is_none().then_some(first)
            }
            _ => None,
        }
    };
    let space = surface(" ")?;
    let whitespace: Vec<char> = [" ", "\n", "\t", "\r", "\u{b}", "\u{c}"]
        .into_iter()
        .filter_map(surface)
        .collect();
    let spans = tokenizer.get_vocab(true).keys().any(|token| {
        let chars: Vec<char> = token.chars().collect();
        chars
            .windows(2)
            .any(|pair| pair[1] == space && !whitespace.contains(&pair[0]))
    });
    let added: Vec<String> = tokenizer
        .get_added_tokens_decoder()
        .values()
        .map(|t| t.content.clone())
        .collect();
    (!spans && !added.iter().any(|a| a.contains(' '))).then_some(added)
}

/// The largest char boundary of `text` at or before byte `at`.
fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// A special token's text from `tokenizer_config.json`: a string, or `{"content": ...}`.
fn special_token_text(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(m) => m.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}
