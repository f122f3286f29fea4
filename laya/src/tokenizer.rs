//! The checkpoint's tokenizer (`tokenizer/tokenizer.json`) and the special tokens a Laya row is built
//! from (`tokenizer/tokenizer_config.json`): text in, token ids out, exactly as upstream's fast tokenizer.
//!
//! The `tokenizers` crate runs with its pure-Rust `fancy-regex` backend: the golden token rows from
//! upstream (tests/fixtures/goldens) match it id for id, so the C Oniguruma build is not needed.

use std::path::Path;

use serde_json::Value;

use crate::checkpoint::CheckpointError;
use crate::config::read_json;

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
}

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
            inner,
            special: SpecialTokens {
                cls,
                sep,
                pad,
                mask,
                mask_text,
            },
        })
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
}

/// A special token's text from `tokenizer_config.json`: a string, or `{"content": ...}`.
fn special_token_text(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(m) => m.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}
