//! What the Jev wire contract (TypeSafe's System One API, as the public `jevcompat` suite states it)
//! says where Laya's contract differs, for `[compat] output = "jev"`: which `model` values are Jev's
//! model ids (they mean "let the router choose"; other unknown names are refused as Jev refuses
//! them), how a refusal is written (`{"detail": {"error_type", "message"}}`, and FastAPI's 422
//! `{"detail": [{"loc", "msg", "type"}]}` for a body that fails validation), and the tournament
//! group that lets a choice of 255 options through, and Jev's `confidence` formula
//! ([`jev_confidence`]). The answer side (the strict projection with Jev's `confidence`) is
//! `output::project_jev`; what is accepted differently (a question without `instructions`, an empty
//! `questions`) sits where those rules live, in `request` and `question`.
//!
//! Everything here is reached only through an [`OutputProfile`](crate::output::OutputProfile)
//! whose `is_jev()` is true, except [`jev_confidence`], which 0.4.15 also sends as
//! `x_jev_confidence` under every profile; the `laya` and `jev-strict` profiles answer as upstream
//! does. The Jev `error_type` of a refusal's status is `error::error_type`.

use serde_json::{Map, Value};

use crate::error::{Problem, RequestError};
use crate::python_text::{py_repr, py_strip};
use crate::routing::{BUNDLE_REPO, CheckpointName, Registry, resolve_model_field_in, unknown_model_name_in};
use crate::upstream::Upstream;

/// The tournament group of the `jev` profile when `[compat] tournament_group` is 0 (off): the Jev
/// contract accepts choices of up to 255 options, which Laya reads in groups (16 is the group the
/// differential checker and upstream's documentation use).
pub const DEFAULT_TOURNAMENT_GROUP: usize = 16;

/// The `error_type` of a refused model name.
pub const UNKNOWN_MODEL_ERROR: &str = "api_usage_error";

/// The model ids the other Laya runtimes serve that name one checkpoint, read in the `jev` profile as
/// that checkpoint: `laya-421m` is the English checkpoint (ModernBERT-large with the decision head,
/// 421M parameters) as the Apple peer laya-mlx serves it and jevkit-runtime's `laya` provider (under
/// `jev-grep` and `jev-sort`) asks for it. The others' ids are upstream's names and aliases already:
/// laya-apple serves `laya`, `laya-multilingual` and `laya-typed-decisions`, edgejev answers as
/// `laya`. Under the `laya` profiles they are not read (upstream routes an unknown plain name
/// automatically, and so does layad there). An operator's `[checkpoints.aliases]` entry of the same
/// name wins.
pub const PEER_MODEL_IDS: [(&str, CheckpointName); 1] = [("laya-421m", CheckpointName::English)];

/// The ids the other Laya runtimes take for "let the router choose", which the `jev` profile reads
/// as Jev's model ids: `auto` (laya-apple's and laya-mlx's automatic routing) and `laya-rl-agent`
/// (the `model` every Laya server answers with, upstream's and layad's included, which a client
/// may send back).
pub const PEER_ROUTER_IDS: [&str; 2] = ["auto", "laya-rl-agent"];

/// Whether a `model` value (already stripped and lower-cased) is one of Jev's model ids:
/// `jev-latest`, `jev-preview`, a versioned `jev-1.13` / `jev-1.13.0`, each optionally behind the
/// `typesafe/` or `~typesafe/` namespace the Jev clients write (`typesafe/jev-1.13`,
/// `~typesafe/jev-latest`). The rest of the name is letters, digits, `.` and `-`.
pub fn is_jev_model_id(key: &str) -> bool {
    let bare = key
        .strip_prefix("~typesafe/")
        .or_else(|| key.strip_prefix("typesafe/"))
        .unwrap_or(key);
    bare.strip_prefix("jev-").is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    })
}

/// The `jev` profile's reading of the request's `model`: absent, null or blank, a Jev model id, the
/// Laya bundle's repo id or a peer's router id ([`PEER_ROUTER_IDS`]) → `None` (the router chooses
/// by the state); a checkpoint name, alias (upstream's or the operator's), published Hugging Face id
/// or a peer's checkpoint id ([`PEER_MODEL_IDS`]) → that checkpoint; anything else → 400
/// `api_usage_error` naming
/// what is accepted (Jev refuses a model it does not serve; answering it with a checkpoint the
/// caller did not name would be a silent substitution). A value that is not a string is a
/// validation failure of `model`.
pub fn resolve_model(model: Option<&Value>, registry: &Registry) -> Result<Option<CheckpointName>, RequestError> {
    let text = match model {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(text)) => text,
        Some(other) => {
            return Err(
                RequestError::new(422, format!("model must be a string, got {}", py_repr(other)))
                    .at(&["model"], "string_type"),
            );
        }
    };
    let key = py_strip(text).to_lowercase();
    if key.is_empty() || is_jev_model_id(&key) || key == BUNDLE_REPO || PEER_ROUTER_IDS.contains(&key.as_str()) {
        return Ok(None);
    }
    let named = resolve_model_field_in(model, Upstream::V0_4_15, registry)
        .ok()
        .flatten();
    let peer = || PEER_MODEL_IDS.iter().find(|(id, _)| *id == key).map(|&(_, c)| c);
    match named.or_else(peer) {
        Some(checkpoint) => Ok(Some(checkpoint)),
        None => Err(RequestError::new(
            400,
            format!(
                "{}, or a Jev model id such as 'jev-latest' to let the router choose",
                unknown_model_name_in(text, registry)
            ),
        )
        .refused(UNKNOWN_MODEL_ERROR)),
    }
}

/// TypeSafe's Jev `confidence` of an answer (0.4.15's `x_jev_confidence`, spec §5.5), computed
/// from the answer's rounded `probabilities` exactly as upstream reads them back; `None` for noul
/// answers and for probabilities that are not usable numbers.
pub fn jev_confidence(answer: &Map<String, Value>) -> Option<f64> {
    let kind = answer.get("type")?.as_str()?;
    let probabilities = answer.get("probabilities")?.as_object().filter(|p| !p.is_empty())?;
    if kind != "choice" && kind != "score" {
        return None;
    }
    // Score keys are "0".."n-1" in order already; upstream sorts them by int, which is the same.
    let p: Vec<f64> = probabilities.values().map(Value::as_f64).collect::<Option<_>>()?;
    if !p.iter().all(|v| v.is_finite() && *v >= 0.0) {
        return None;
    }
    let n = p.len();
    if n == 1 {
        return Some(1.0);
    }
    let total: f64 = p.iter().sum();
    let p: Vec<f64> = if total != 0.0 {
        p.iter().map(|v| v / total).collect()
    } else {
        vec![1.0 / n as f64; n]
    };
    let nf = n as f64;
    if kind == "choice" {
        let max = p.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        return Some((max - 1.0 / nf) / (1.0 - 1.0 / nf));
    }
    let mode = p
        .iter()
        .enumerate()
        .fold(0, |best, (i, v)| if *v > p[best] { i } else { best });
    let spread: f64 = p
        .iter()
        .enumerate()
        .map(|(i, v)| v * (i as f64 - mode as f64).abs())
        .sum();
    let center = (nf - 1.0) / 2.0;
    let uniform_spread = (0..n).map(|i| (i as f64 - center).abs()).sum::<f64>() / nf;
    Some((1.0 - spread / uniform_spread).max(0.0))
}

/// A refusal as the Jev API writes it: `(status, body)`. A validation failure becomes FastAPI's
/// 422 `{"detail": [{"loc": ["body", …], "msg": <detail>, "type": <kind>}]}` whatever status Laya
/// gives it (400 for a body that is not JSON, 422 for a bad question); anything else keeps its
/// status with `{"detail": {"error_type", "message": <detail>}}`.
pub fn error_body(status: u16, detail: &str, problem: &Problem) -> (u16, Value) {
    match problem {
        Problem::Invalid { loc, kind } => {
            let mut path = vec![Value::from("body")];
            path.extend(loc.iter().cloned());
            let mut item = Map::new();
            item.insert("loc".to_owned(), Value::Array(path));
            item.insert("msg".to_owned(), Value::from(detail));
            item.insert("type".to_owned(), Value::from(*kind));
            let mut body = Map::new();
            body.insert("detail".to_owned(), Value::Array(vec![Value::Object(item)]));
            (422, Value::Object(body))
        }
        Problem::Refused { error_type } => {
            let mut inner = Map::new();
            inner.insert("error_type".to_owned(), Value::from(*error_type));
            inner.insert("message".to_owned(), Value::from(detail));
            let mut body = Map::new();
            body.insert("detail".to_owned(), Value::Object(inner));
            (status, Value::Object(body))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::error_type;
    use serde_json::json;

    #[test]
    fn jev_model_ids_are_the_jev_names_with_or_without_the_typesafe_namespace() {
        for id in [
            "jev-latest",
            "jev-preview",
            "jev-1",
            "jev-1.13",
            "jev-1.13.0",
            "typesafe/jev-1.13",
            "typesafe/jev-latest",
            "~typesafe/jev-latest",
        ] {
            assert!(is_jev_model_id(id), "{id}");
        }
        for other in [
            "jev",
            "jev-",
            "jev_latest",
            "typesafe/jev",
            "other/jev-latest",
            "~/jev-latest",
            "./jev-latest",
            "typesafe/jev-1/x",
            "english",
            "~typesafe/",
        ] {
            assert!(!is_jev_model_id(other), "{other}");
        }
    }

    #[test]
    fn jev_ids_let_the_router_choose_names_pick_a_checkpoint_and_the_rest_is_refused() {
        let resolve = |v: Value| resolve_model(Some(&v), Registry::builtin_only());
        for auto in [
            json!("auto"),
            json!(" Laya-RL-Agent"),
            json!("jev-latest"),
            json!(" TypeSafe/Jev-1.13 "),
            json!("~typesafe/jev-latest"),
            json!(""),
            json!("convaiinnovations/laya"),
            Value::Null,
        ] {
            assert_eq!(resolve(auto.clone()), Ok(None), "{auto}");
        }
        assert_eq!(resolve_model(None, Registry::builtin_only()), Ok(None));
        assert_eq!(resolve(json!("en")), Ok(Some(CheckpointName::English)));
        // laya-mlx's id of the English checkpoint (jevkit-runtime's `laya` provider sends it).
        assert_eq!(resolve(json!("laya-421m")), Ok(Some(CheckpointName::English)));
        assert_eq!(resolve(json!("LAYA-421M ")), Ok(Some(CheckpointName::English)));
        assert_eq!(resolve(json!("multilingual")), Ok(Some(CheckpointName::Multilingual)));
        assert_eq!(
            resolve(json!("convaiinnovations/laya-typed-decisions")),
            Ok(Some(CheckpointName::TypedDecisions))
        );
        // Upstream 0.4.15 routes an unknown plain name automatically and refuses a path-like one
        // with 422; Jev refuses both as a model it does not serve.
        for unknown in ["jevcompat-no-such-model", "gpt-4o", "./ckpt", "org/repo"] {
            let e = resolve(json!(unknown)).expect_err(unknown);
            assert_eq!(e.status, 400, "{unknown}");
            assert_eq!(
                e.problem,
                Problem::Refused {
                    error_type: "api_usage_error"
                }
            );
            assert!(
                e.detail
                    .starts_with(&format!("unknown model '{unknown}'; choose one of")),
                "{}",
                e.detail
            );
            assert!(
                e.detail
                    .ends_with("or a Jev model id such as 'jev-latest' to let the router choose")
            );
        }
        let e = resolve(json!(7)).expect_err("a number");
        assert_eq!((e.status, e.detail.as_str()), (422, "model must be a string, got 7"));
    }

    #[test]
    fn validation_failures_become_fastapis_list_and_the_rest_jevs_object() {
        let invalid = RequestError::new(400, "'state' is required").at(&["state"], "missing");
        assert_eq!(
            error_body(invalid.status, &invalid.detail, &invalid.problem),
            (
                422,
                json!({"detail": [{"loc": ["body", "state"], "msg": "'state' is required", "type": "missing"}]})
            )
        );
        let plain = RequestError::new(422, "question 'q': unknown type 'x'");
        assert_eq!(
            error_body(plain.status, &plain.detail, &plain.problem).1["detail"][0]["loc"],
            json!(["body"])
        );
        let large = RequestError::new(413, "too many questions (65 > 64)");
        assert_eq!(
            error_body(large.status, &large.detail, &large.problem),
            (
                413,
                json!({"detail": {"error_type": "request_too_large", "message": "too many questions (65 > 64)"}})
            )
        );
        assert_eq!(error_type(401), "authentication_error");
        assert_eq!(error_type(503), "overloaded_error");
        assert_eq!(error_type(500), "internal_error");
        assert_eq!(error_type(400), "invalid_request_error");
    }
}
