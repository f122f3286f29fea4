//! Prompt rows: the token ids, marker positions and question type of each question, laid out byte
//! for byte like upstream's `build_sequence` (spec §3.3–§3.5).
//!
//! Layout: `[CLS] <type> question: <instructions> [SEP] [MASK] opt0 [MASK] opt1 … [SEP] <state> [SEP]`,
//! cut to `max_len`; the state is tokenized once per request and shared by every row.

use serde_json::Value;

use crate::python_text::{Separators, py_json, py_repr_str};
use crate::question::{Question, QuestionType};
use crate::tokenizer::{LayaTokenizer, TokenizeError};
use crate::upstream::Upstream;

/// Tokens an option keeps at most (upstream truncates each option's encoding to 48 ids).
pub const OPTION_TOKEN_CAP: usize = 48;

/// One encoder input row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// Token ids, no padding; at most `max_len`.
    pub ids: Vec<u32>,
    /// Position of each option's `[MASK]`, in option order.
    pub markers: Vec<u32>,
    /// The question type (the head adds its type embedding).
    pub qtype: QuestionType,
}

/// The row-length budget of a checkpoint (`rl_agent_config.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowLimits {
    /// Longest row in tokens.
    pub max_len: usize,
    /// Budget for the question head and its options.
    pub head_max_len: usize,
}

/// What building one row did to its state and options (0.4.15 reports it in `usage`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowStats {
    /// Tokens of the whole state (the same for every row of a request).
    pub state_tokens: usize,
    /// State tokens this row had no room for.
    pub state_tokens_dropped: usize,
    /// Options the question defines.
    pub options: usize,
    /// Options whose (capped) token spans are still distinct.
    pub options_distinct: usize,
    /// The per-option cap, when the head budget forced one.
    pub tokens_per_option: Option<usize>,
}

/// A request's rows and what building them did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuiltRows {
    /// One row per question, in order.
    pub rows: Vec<Row>,
    /// The same order: what each row kept of its state and options.
    pub stats: Vec<RowStats>,
}

/// Why rows could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// A question's options do not fit (a 422 with the text of `upstream`'s release).
    #[error("{}", options_do_not_fit(qid, *kept, *options, *max_len, *head_max_len, *upstream))]
    OptionsDoNotFit {
        /// The question id.
        qid: String,
        /// Option markers that survived the cut to `max_len`.
        kept: usize,
        /// Options the question has.
        options: usize,
        /// The row budget used.
        max_len: usize,
        /// The head budget used.
        head_max_len: usize,
        /// Whose message to give.
        upstream: Upstream,
    },
    /// The tokenizer failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizeError),
}

fn options_do_not_fit(
    qid: &str,
    kept: usize,
    options: usize,
    max_len: usize,
    head_max_len: usize,
    upstream: Upstream,
) -> String {
    let qid = py_repr_str(qid);
    match upstream {
        Upstream::V0_3_20 => format!("question {qid} options exceed head_max_len={head_max_len}"),
        Upstream::V0_4_15 => format!(
            "question {qid}: only {kept} of its {options} option markers fit in max_len={max_len} with \
             head_max_len={head_max_len} spent on the question; lower head_max_len, raise max_len, or use fewer options"
        ),
    }
}

/// Upstream's `serialize_state`: a string as it is, anything else (a missing state is `null`) as `py_json`.
pub fn serialize_state(state: Option<&Value>) -> String {
    match state {
        Some(Value::String(s)) => s.clone(),
        Some(other) => py_json(other, Separators::Spaced),
        None => "null".to_owned(),
    }
}

/// Builds one row per question, in order, for one state. Under 0.4.x the whole state is
/// tokenized (its length is reported); 0.3.20 reports nothing, so only what a row can hold is.
pub fn build_rows(
    tokenizer: &LayaTokenizer,
    limits: RowLimits,
    state: Option<&Value>,
    questions: &[Question],
    upstream: Upstream,
) -> Result<BuiltRows, PromptError> {
    let special = tokenizer.special();
    let unmask = |text: &str| text.replace(special.mask_text.as_str(), " ");
    // A conversation (JSON array) keeps its newest end; everything else keeps its start.
    let truncate_left = matches!(state, Some(Value::Array(_)));
    let RowLimits { max_len, head_max_len } = limits;
    // Only a row's worth of each text can reach a row: the state's first (or last) `max_len` tokens,
    // the head's first `head_max_len` (at least 8, see below), an option's first 48.
    let state_text = unmask(&serialize_state(state));
    let state_ids = if upstream.differences().state_tokenized_whole {
        tokenizer.encode(&state_text)?
    } else if truncate_left {
        tokenizer.encode_last(&state_text, max_len)?
    } else {
        tokenizer.encode_first(&state_text, max_len)?
    };
    drop(state_text);

    let mut built = BuiltRows {
        rows: Vec::with_capacity(questions.len()),
        stats: Vec::with_capacity(questions.len()),
    };
    for q in questions {
        let head_text = format!("{} question: {}", q.qtype.as_str(), unmask(&q.instructions));
        let mut head_ids = tokenizer.encode_first(&head_text, head_max_len.max(8))?;
        let identity: Vec<usize>;
        let order = match &q.option_order {
            Some(order) => order.as_slice(),
            None => {
                identity = (0..q.options.len()).collect();
                identity.as_slice()
            }
        };
        // One entry per slot: slot `s` shows option `order[s]`.
        let mut options = Vec::with_capacity(order.len());
        for &option in order {
            let mut ids = Vec::with_capacity(OPTION_TOKEN_CAP + 1);
            ids.push(special.mask);
            let tokens = tokenizer.encode_first(&format!(" {}", unmask(&q.options[option])), OPTION_TOKEN_CAP)?;
            ids.extend(tokens);
            options.push(ids);
        }
        let option_len = |options: &[Vec<u32>]| options.iter().map(Vec::len).sum::<usize>();
        // Signed: the options may already exceed the whole head budget.
        let mut budget = head_max_len as i64 - option_len(&options) as i64;
        let mut tokens_per_option = None;
        if budget < 16 {
            let per = ((head_max_len as i64 - 16).div_euclid(options.len().max(1) as i64)).max(4) as usize;
            for o in &mut options {
                o.truncate(per);
            }
            tokens_per_option = Some(per);
            budget = head_max_len as i64 - option_len(&options) as i64;
        }
        head_ids.truncate(budget.max(8) as usize);

        let mut ids = Vec::with_capacity(max_len + 1);
        ids.push(special.cls);
        ids.extend_from_slice(&head_ids);
        ids.push(special.sep);
        let mut markers = Vec::with_capacity(options.len());
        for o in &options {
            markers.push(ids.len());
            ids.extend_from_slice(o);
        }
        ids.push(special.sep);
        let room = max_len.saturating_sub(ids.len() + 1);
        let state_part = if truncate_left {
            &state_ids[state_ids.len().saturating_sub(room)..]
        } else {
            &state_ids[..room.min(state_ids.len())]
        };
        ids.extend_from_slice(state_part);
        ids.push(special.sep);
        ids.truncate(max_len);
        let markers: Vec<u32> = markers.into_iter().filter(|m| *m < max_len).map(|m| m as u32).collect();
        if markers.len() != q.options.len() {
            return Err(PromptError::OptionsDoNotFit {
                qid: q.id.clone(),
                kept: markers.len(),
                options: q.options.len(),
                max_len,
                head_max_len,
                upstream,
            });
        }
        let mut distinct: Vec<&Vec<u32>> = options.iter().collect();
        distinct.sort_unstable();
        distinct.dedup();
        built.stats.push(RowStats {
            state_tokens: state_ids.len(),
            state_tokens_dropped: state_ids.len() - state_part.len(),
            options: options.len(),
            options_distinct: distinct.len(),
            tokens_per_option,
        });
        built.rows.push(Row {
            ids,
            markers,
            qtype: q.qtype,
        });
    }
    Ok(built)
}

/// `usage.input_tokens`: the real (unpadded) tokens of a request's rows.
pub fn input_tokens(rows: &[Row]) -> usize {
    rows.iter().map(|r| r.ids.len()).sum()
}
