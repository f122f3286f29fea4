//! Which checkpoint answers a request, and why: upstream's `laya.router.Router._route` as the
//! 0.3.20 server drives it (the `model` field, `LAYA_AUTO_TASK`), and the `routing` response object.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::language::{Detection, analyse};
use crate::python_text::py_char;
use crate::python_text::{number_as_f64, printf_0f, py_repr, py_repr_str};

/// The Hugging Face repo that bundles all three checkpoints (`BUNDLE_REPO`).
pub const BUNDLE_REPO: &str = "convaiinnovations/laya";

/// The checkpoint the 0.3.20 server falls back to when detection cannot decide (`Router.default`).
pub const DEFAULT_CHECKPOINT: CheckpointName = CheckpointName::English;

/// Question-id signatures of the typed-decisions workflows, in upstream's order
/// (`_TYPED_DECISION_WORKFLOWS`).
pub const TYPED_DECISION_WORKFLOWS: [(&str, [&str; 5]); 4] = [
    (
        "agent_trace_observability",
        ["action", "needs_review", "outcome", "risk", "urgency"],
    ),
    (
        "customer_service",
        ["action", "category", "churn_risk", "needs_human", "urgency"],
    ),
    (
        "invoice_processing",
        [
            "discrepancy_severity",
            "disposition",
            "duplicate",
            "matches_order",
            "urgency",
        ],
    ),
    (
        "security_incidents",
        [
            "credential_compromise",
            "disposition",
            "severity",
            "true_positive",
            "urgency",
        ],
    ),
];

/// Standalone Hugging Face ids the 0.3.20 server accepts in `model` (`_PUBLISHED_MODEL_IDS`).
/// The bundle id itself is absent on purpose: `convaiinnovations/laya` means "route for me".
const PUBLISHED_MODEL_IDS: [(&str, CheckpointName); 2] = [
    ("convaiinnovations/laya-multilingual", CheckpointName::Multilingual),
    ("convaiinnovations/laya-typed-decisions", CheckpointName::TypedDecisions),
];

/// Names people are likely to type, after trim and lower-case (`_ALIASES`).
const ALIASES: [(&str, CheckpointName); 10] = [
    ("en", CheckpointName::English),
    ("laya", CheckpointName::English),
    ("default", CheckpointName::English),
    ("multi", CheckpointName::Multilingual),
    ("ml", CheckpointName::Multilingual),
    ("laya-multilingual", CheckpointName::Multilingual),
    ("typed", CheckpointName::TypedDecisions),
    ("typed_decisions", CheckpointName::TypedDecisions),
    ("laya-typed-decisions", CheckpointName::TypedDecisions),
    ("decisions", CheckpointName::TypedDecisions),
];

/// One of the three Laya checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CheckpointName {
    /// ModernBERT-large, English only: the bundle repo's root.
    English,
    /// mmBERT-base, 100+ languages: the bundle's `multilingual` subfolder.
    Multilingual,
    /// Fine-tuned on the typed-decisions workflows: the bundle's `typed-decisions` subfolder.
    TypedDecisions,
}

impl CheckpointName {
    /// Every checkpoint, in upstream's order.
    pub const ALL: [CheckpointName; 3] = [
        CheckpointName::English,
        CheckpointName::Multilingual,
        CheckpointName::TypedDecisions,
    ];

    /// The canonical name: `english`, `multilingual` or `typed-decisions`.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointName::English => "english",
            CheckpointName::Multilingual => "multilingual",
            CheckpointName::TypedDecisions => "typed-decisions",
        }
    }

    /// `normalise_name`: a canonical name or alias after Python's `strip()` and `lower()`.
    pub fn from_name_or_alias(name: &str) -> Option<Self> {
        let key = python_key(name);
        Self::from_key(&key)
    }

    /// A name or alias already stripped and lower-cased.
    fn from_key(key: &str) -> Option<Self> {
        CheckpointName::ALL
            .into_iter()
            .find(|c| c.as_str() == key)
            .or_else(|| ALIASES.iter().find(|(alias, _)| *alias == key).map(|&(_, c)| c))
    }

    /// The `routing.repo` string: the bundle repo, plus `/<subfolder>` off its root.
    pub fn repo(self) -> &'static str {
        match self {
            CheckpointName::English => "convaiinnovations/laya",
            CheckpointName::Multilingual => "convaiinnovations/laya/multilingual",
            CheckpointName::TypedDecisions => "convaiinnovations/laya/typed-decisions",
        }
    }

    /// The checkpoint's folder inside [`BUNDLE_REPO`]; `None` for english, which sits at its root.
    pub fn subfolder(self) -> Option<&'static str> {
        match self {
            CheckpointName::English => None,
            CheckpointName::Multilingual => Some("multilingual"),
            CheckpointName::TypedDecisions => Some("typed-decisions"),
        }
    }
}

/// Python's `str(name).strip().lower()`.
fn python_key(name: &str) -> String {
    let mut key = String::with_capacity(name.len());
    py_char::push_lower(name.trim_matches(py_char::is_space), &mut key);
    key
}

/// Whether a parsed JSON value is false in Python (`None`, `False`, `0`, `0.0`, `""`, `{}`, `[]`).
fn is_falsy(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => number_as_f64(n) == 0.0,
        Value::String(s) => s.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
    }
}

/// The 0.3.20 server's reading of the request's `model` field (`serve._resolve_model`): falsy →
/// `None` (route automatically); else `str(model).strip().lower()` as a standalone Hugging Face id,
/// then as a name or alias; anything else → `None` as well, never an error.
pub fn resolve_model_field(model: Option<&Value>) -> Option<CheckpointName> {
    let model = model.filter(|m| !is_falsy(m))?;
    // str() of every non-string JSON value is its repr (`5`, `True`, `{'a': 1}`).
    let text = match model {
        Value::String(s) => s.clone(),
        other => py_repr(other),
    };
    let key = python_key(&text);
    PUBLISHED_MODEL_IDS
        .iter()
        .find(|(id, _)| *id == key)
        .map(|&(_, c)| c)
        .or_else(|| CheckpointName::from_key(&key))
}

/// 0.4.15's refusal of a `model` that names a filesystem path or an unpublished Hub repo id
/// (spec §1.8 step 8): a value that is no checkpoint name, alias or published id, and starts with
/// `.` or `~` or contains `/` or `\\`, is a 422 with this text. Everything else unknown (a Jev id
/// such as `jev-latest`, the bundle id) still means "route for me".
pub fn check_model_field(model: Option<&Value>) -> Result<(), String> {
    let Some(model) = model.filter(|m| !is_falsy(m)) else {
        return Ok(());
    };
    if resolve_model_field(Some(model)).is_some() {
        return Ok(());
    }
    let text = match model {
        Value::String(s) => s.clone(),
        other => py_repr(other),
    };
    let text = text.trim_matches(py_char::is_space);
    if python_key(text) == BUNDLE_REPO {
        return Ok(());
    }
    let names_a_source = text.starts_with(['.', '~']) || text.contains(['/', '\\']);
    if !names_a_source {
        return Ok(());
    }
    let mut aliases: Vec<&str> = ALIASES.iter().map(|(alias, _)| *alias).collect();
    aliases.sort_unstable();
    let names: Vec<String> = CheckpointName::ALL.iter().map(|c| py_repr_str(c.as_str())).collect();
    let aliases: Vec<String> = aliases.iter().map(|a| py_repr_str(a)).collect();
    Err(format!(
        "unknown model {}; choose one of [{}] (or an alias: [{}]), or omit model to let the router choose",
        py_repr(model),
        names.join(", "),
        aliases.join(", ")
    ))
}

/// `match_typed_decisions_workflow`: the workflow whose signature is exactly this set of ids.
pub fn typed_decisions_workflow(question_ids: &[&str]) -> Option<&'static str> {
    let ids: BTreeSet<&str> = question_ids.iter().copied().collect();
    TYPED_DECISION_WORKFLOWS
        .iter()
        .find(|(_, signature)| ids.len() == signature.len() && signature.iter().all(|id| ids.contains(id)))
        .map(|(name, _)| *name)
}

/// Where a request goes and why: the response's `routing` object (`RouteDecision`).
#[derive(Clone, Debug, PartialEq)]
pub struct RoutingDecision {
    /// The checkpoint that answers.
    pub checkpoint: CheckpointName,
    /// Upstream's sentence explaining the choice.
    pub reason: String,
    /// Detection of the state; `None` when an explicit model or a workflow decided first.
    pub detection: Option<Detection>,
    /// The typed-decisions workflow the question ids match, if any (`None` for an explicit model).
    pub workflow: Option<&'static str>,
}

impl RoutingDecision {
    /// The `routing` object: `model`, `repo`, `reason`, `detection`, `workflow`, in that order.
    pub fn to_json(&self) -> Value {
        let mut out = Map::new();
        out.insert("model".to_owned(), Value::String(self.checkpoint.as_str().to_owned()));
        out.insert("repo".to_owned(), Value::String(self.checkpoint.repo().to_owned()));
        out.insert("reason".to_owned(), Value::String(self.reason.clone()));
        out.insert(
            "detection".to_owned(),
            self.detection.as_ref().map_or(Value::Null, Detection::to_json),
        );
        out.insert(
            "workflow".to_owned(),
            self.workflow.map_or(Value::Null, |w| Value::String(w.to_owned())),
        );
        Value::Object(out)
    }
}

/// `Router._route` as the 0.3.20 server calls it (spec §6.2): an explicit checkpoint first, then
/// the typed-decisions workflow when `auto_task` (`LAYA_AUTO_TASK`) is on, then detection.
pub fn route(
    state: Option<&Value>,
    question_ids: &[&str],
    explicit: Option<CheckpointName>,
    auto_task: bool,
) -> RoutingDecision {
    if let Some(checkpoint) = explicit {
        // The server passes the canonical name, so the repr is of that, not of what was sent.
        return RoutingDecision {
            checkpoint,
            reason: format!("explicit model={}", py_repr_str(checkpoint.as_str())),
            detection: None,
            workflow: None,
        };
    }
    let workflow = typed_decisions_workflow(question_ids);
    if let Some(name) = workflow.filter(|_| auto_task) {
        return RoutingDecision {
            checkpoint: CheckpointName::TypedDecisions,
            reason: format!("question ids match the {} typed-decisions workflow", py_repr_str(name)),
            detection: None,
            workflow,
        };
    }
    let det = analyse(state);
    let (checkpoint, reason) = if det.script == "unknown" {
        let key = DEFAULT_CHECKPOINT.as_str();
        (
            DEFAULT_CHECKPOINT,
            format!("no letters detected in state; using default ({key})"),
        )
    } else if det.script != "latin" {
        let share = printf_0f(100.0 * det.non_latin_fraction);
        let reason = format!(
            "non-Latin script ({}, {share}% of letters); the English checkpoint cannot read it",
            det.script
        );
        (CheckpointName::Multilingual, reason)
    } else if !det.is_english {
        let reason = match det.language {
            Some(lang) => format!(
                "Latin script but language looks like {}, not English",
                py_repr_str(lang)
            ),
            None => format!(
                "Latin script, language not identified but {}% non-English letters; \
                 not safe for the English checkpoint",
                printf_0f(100.0 * det.diacritic_rate)
            ),
        };
        (CheckpointName::Multilingual, reason)
    } else if det.language_undecided {
        let key = DEFAULT_CHECKPOINT.as_str();
        let reason = format!("Latin script, language not identified and no non-English letters; using default ({key})");
        (DEFAULT_CHECKPOINT, reason)
    } else {
        (CheckpointName::English, "English Latin text".to_owned())
    };
    RoutingDecision {
        checkpoint,
        reason,
        detection: Some(det),
        workflow,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn auto(state: Value) -> RoutingDecision {
        route(Some(&state), &["q"], None, false)
    }

    #[test]
    fn names_and_aliases() {
        let english = ["english", " EN ", "laya", "Default"];
        let multilingual = ["multilingual", "multi", "ML", "laya-multilingual\n"];
        let typed = [
            "typed-decisions",
            "typed",
            "typed_decisions",
            "laya-typed-decisions",
            "decisions",
        ];
        for (names, want) in [
            (&english[..], CheckpointName::English),
            (&multilingual[..], CheckpointName::Multilingual),
            (&typed[..], CheckpointName::TypedDecisions),
        ] {
            for name in names {
                assert_eq!(CheckpointName::from_name_or_alias(name), Some(want), "{name:?}");
            }
        }
        for name in [
            "",
            "jev-latest",
            "convaiinnovations/laya",
            "typed decisions",
            "englisch",
        ] {
            assert_eq!(CheckpointName::from_name_or_alias(name), None, "{name:?}");
        }
        // Python's strip() also removes U+001C..U+001F.
        assert_eq!(
            CheckpointName::from_name_or_alias("\u{1f}ml\u{3000}"),
            Some(CheckpointName::Multilingual)
        );
    }

    #[test]
    fn repos_and_subfolders() {
        let rows: Vec<_> = CheckpointName::ALL
            .iter()
            .map(|c| (c.as_str(), c.repo(), c.subfolder()))
            .collect();
        assert_eq!(
            rows,
            [
                ("english", "convaiinnovations/laya", None),
                (
                    "multilingual",
                    "convaiinnovations/laya/multilingual",
                    Some("multilingual")
                ),
                (
                    "typed-decisions",
                    "convaiinnovations/laya/typed-decisions",
                    Some("typed-decisions")
                ),
            ]
        );
    }

    #[test]
    fn model_field_like_the_0_3_20_server() {
        let cases = [
            (json!("ML"), Some(CheckpointName::Multilingual)),
            (
                json!(" Convaiinnovations/Laya-Typed-Decisions "),
                Some(CheckpointName::TypedDecisions),
            ),
            (
                json!("convaiinnovations/laya-multilingual"),
                Some(CheckpointName::Multilingual),
            ),
            (json!("convaiinnovations/laya"), None),
            (json!("convaiinnovations/laya-english"), None),
            (json!("jev-latest"), None),
            (json!("english"), Some(CheckpointName::English)),
            (json!(""), None),
            (json!("   "), None),
            (json!(0), None),
            (json!(0.0), None),
            (json!(false), None),
            (json!(true), None),
            (json!(5), None),
            (json!({}), None),
            (json!([]), None),
            (json!(["ml"]), None),
            (json!({"ml": 1}), None),
            (Value::Null, None),
        ];
        for (model, want) in cases {
            assert_eq!(resolve_model_field(Some(&model)), want, "{model}");
        }
        assert_eq!(resolve_model_field(None), None);
    }

    #[test]
    fn explicit_model_skips_detection_and_workflow() {
        let ids = ["action", "category", "churn_risk", "needs_human", "urgency"];
        let d = route(Some(&json!("Bonjour")), &ids, Some(CheckpointName::Multilingual), true);
        assert_eq!(
            serde_json::to_string(&d.to_json()).unwrap_or_default(),
            r#"{"model":"multilingual","repo":"convaiinnovations/laya/multilingual","reason":"explicit model='multilingual'","detection":null,"workflow":null}"#
        );
    }

    #[test]
    fn workflow_is_an_exact_id_set() {
        let ids = ["urgency", "action", "category", "churn_risk", "needs_human"];
        assert_eq!(typed_decisions_workflow(&ids), Some("customer_service"));
        assert_eq!(
            typed_decisions_workflow(&[&ids[..], &["urgency"]].concat()),
            Some("customer_service")
        );
        assert_eq!(typed_decisions_workflow(&ids[..4]), None);
        assert_eq!(typed_decisions_workflow(&[&ids[..], &["extra"]].concat()), None);
        assert_eq!(typed_decisions_workflow(&[]), None);

        let state = json!("I was charged twice for invoice 4411, please refund it today.");
        let on = route(Some(&state), &ids, None, true);
        assert_eq!(on.checkpoint, CheckpointName::TypedDecisions);
        assert_eq!(
            on.reason,
            "question ids match the 'customer_service' typed-decisions workflow"
        );
        assert_eq!((on.detection, on.workflow), (None, Some("customer_service")));

        let off = route(Some(&state), &ids, None, false);
        assert_eq!(
            (off.checkpoint, off.reason.as_str()),
            (CheckpointName::English, "English Latin text")
        );
        assert_eq!(off.workflow, Some("customer_service"));
        assert!(off.detection.is_some());
    }

    #[test]
    fn detection_reasons() {
        let rows = [
            (
                json!("I was charged twice for invoice 4411, please refund it today."),
                "english",
                "English Latin text",
            ),
            (
                json!({"message": "Mein Konto wurde zweimal belastet, bitte erstatten Sie den Betrag"}),
                "multilingual",
                "Latin script but language looks like 'de', not English",
            ),
            (
                json!("मेरे खाते से दो बार पैसे कट गए हैं, कृपया रिफंड करें"),
                "multilingual",
                "non-Latin script (devanagari, 100% of letters); the English checkpoint cannot read it",
            ),
            (
                json!("Quero cancelar"),
                "english",
                "Latin script, language not identified and no non-English letters; using default (english)",
            ),
            (
                json!("Zamówienie nie dotarło, proszę o zwrot pieniędzy za przesyłkę"),
                "multilingual",
                "Latin script, language not identified but 10% non-English letters; not safe for the English checkpoint",
            ),
            (
                json!("Set α to 0.05 and rerun the job please"),
                "english",
                "English Latin text",
            ),
            (
                json!("Привет, как дела? I need help with my order number 5521"),
                "multilingual",
                "non-Latin script (cyrillic, 33% of letters); the English checkpoint cannot read it",
            ),
            (
                json!("12345"),
                "english",
                "no letters detected in state; using default (english)",
            ),
            (
                Value::Null,
                "english",
                "no letters detected in state; using default (english)",
            ),
            (
                json!("Hello"),
                "english",
                "Latin script, language not identified and no non-English letters; using default (english)",
            ),
        ];
        for (state, model, reason) in rows {
            let d = auto(state.clone());
            assert_eq!((d.checkpoint.as_str(), d.reason.as_str()), (model, reason), "{state}");
            assert_eq!(d.workflow, None);
        }
        let missing = route(None, &[], None, false);
        assert_eq!(missing.reason, "no letters detected in state; using default (english)");
    }

    #[test]
    fn routing_object_key_order() {
        let d = auto(json!("請求書4411で二重に請求されました。本日中に返金してください。"));
        assert_eq!(
            serde_json::to_string(&d.to_json()).unwrap_or_default(),
            r#"{"model":"multilingual","repo":"convaiinnovations/laya/multilingual","reason":"non-Latin script (kana, 100% of letters); the English checkpoint cannot read it","detection":{"script":"kana","script_profile":{"han":0.46153846153846156,"kana":0.5384615384615384},"language":null,"is_english":false,"language_undecided":true,"diacritic_rate":0.0,"non_latin_fraction":1.0},"workflow":null}"#
        );
    }
}
