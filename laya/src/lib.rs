//! Laya host semantics, identical to upstream `laya[serve]==0.3.20`: everything between an HTTP body
//! and the tensors (checkpoints, configs, tokenizer, validation, prompt rows, routing, answers).
//!
//! No tensors live here: a worker turns [`prompt::Row`]s into logits, and [`answer`] turns logits
//! back into upstream's JSON. The spec this crate follows is `docs/spec/laya-serve-0.3.20.md`.

pub mod answer;
pub mod batch;
pub mod checkpoint;
pub mod config;
pub mod decision;
pub mod error;
pub mod jev;
pub mod language;
pub mod limits;
pub mod output;
pub mod prompt;
pub mod python_text;
pub mod question;
pub mod request;
pub mod routing;
pub mod tokenizer;
pub mod tournament;
pub mod upstream;
