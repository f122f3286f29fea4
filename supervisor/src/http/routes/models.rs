//! `GET /v1/models` in the Jev shape (`{"models": [{name, description, release_date}]}`), so Jev
//! SDKs' model listing works: the served checkpoints, their aliases, and the automatic choice.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use laya::checkpoint::Checkpoint;
use laya::routing::CheckpointName;
use serde_json::{Value, json};

use crate::http::app::App;
use crate::http::response::json_response;

/// The aliases upstream's router accepts (`laya.router._ALIASES`, spec §6.1), sorted.
/// `laya::routing` keeps its table private; the test below checks this copy against it.
const ALIASES: [(&str, CheckpointName); 10] = [
    ("decisions", CheckpointName::TypedDecisions),
    ("default", CheckpointName::English),
    ("en", CheckpointName::English),
    ("laya", CheckpointName::English),
    ("laya-multilingual", CheckpointName::Multilingual),
    ("laya-typed-decisions", CheckpointName::TypedDecisions),
    ("ml", CheckpointName::Multilingual),
    ("multi", CheckpointName::Multilingual),
    ("typed", CheckpointName::TypedDecisions),
    ("typed_decisions", CheckpointName::TypedDecisions),
];

/// The name the Jev SDKs send by default; like any unknown name it means "route for me".
const JEV_DEFAULT_MODEL: &str = "jev-latest";

/// Jev's model object. Laya publishes no release dates.
fn model(name: &str, description: String) -> Value {
    json!({"name": name, "description": description, "release_date": "unknown"})
}

fn describe(name: CheckpointName, repo: &str, checkpoint: &Checkpoint) -> String {
    let revision = checkpoint
        .location
        .revision()
        .map(|r| format!(" @ {}", &r[..r.len().min(12)]))
        .unwrap_or_default();
    let sha = &checkpoint.weights.sha256;
    let sha = &sha[..sha.len().min(12)];
    format!(
        "Laya {} checkpoint ({repo}{revision}, model.safetensors sha256 {sha}): {} encoder layers, hidden size {}, \
         up to {} tokens per question.",
        name.as_str(),
        checkpoint.encoder.num_hidden_layers,
        checkpoint.encoder.hidden_size,
        checkpoint.agent.max_len,
    )
}

/// `GET /v1/models`; needs the bearer key when one is configured, like `/v1/systemone`.
pub async fn list(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(e) = app.admission.authorize(&headers) {
        return e.into_response();
    }
    let served = app.checkpoints.current();
    let mut models: Vec<Value> = served
        .iter()
        .map(|(name, checkpoint)| model(name.as_str(), describe(name, served.registry().repo(name), checkpoint)))
        .collect();
    models.extend(
        ALIASES
            .iter()
            .filter(|(_, target)| served.get(*target).is_some())
            .map(|(alias, target)| model(alias, format!("Alias resolving to {}.", target.as_str()))),
    );
    models.push(model(
        JEV_DEFAULT_MODEL,
        "Automatic choice: the request's state decides the checkpoint (English text → english, \
         other languages → multilingual), as for any model name that is not a checkpoint or alias."
            .to_owned(),
    ));
    json_response(StatusCode::OK, &json!({"models": models}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_agree_with_laya_routing() {
        for (alias, target) in ALIASES {
            assert_eq!(CheckpointName::from_name_or_alias(alias), Some(target), "{alias}");
            assert!(
                CheckpointName::ALL.iter().all(|c| c.as_str() != alias),
                "{alias} is a name"
            );
        }
        assert!(ALIASES.windows(2).all(|w| w[0].0 < w[1].0), "sorted");
        assert_eq!(CheckpointName::from_name_or_alias(JEV_DEFAULT_MODEL), None);
    }
}
