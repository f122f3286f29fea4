//! Which checkpoint answers a request, and why: upstream's `laya.router.Router._route` as the
//! server of each release drives it (the `model` field; 0.4.15's `task`, `lang` and `lang_guess`
//! controls; `LAYA_AUTO_TASK`; `LAYA_DEFAULT_MODEL`), and the `routing` response object.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::language::{Detection, analyse};
use crate::python_text::py_char;
use crate::python_text::{number_as_f64, printf_0f, py_prefix, py_repr, py_repr_str, py_strip};
use crate::upstream::Upstream;

/// The Hugging Face repo that bundles all three checkpoints (`BUNDLE_REPO`).
pub const BUNDLE_REPO: &str = "convaiinnovations/laya";

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

/// A checkpoint's canonical name: one of the three built-ins, or one the operator registered beside
/// them (upstream's `Router.register` / `LAYA_EXTRA_MODELS`; see [`Registry`]).
///
/// A name is a `&'static str` so that it stays `Copy` everywhere a job, a pool or a metric carries
/// it. Built-in names are literals; a registered name is interned once by [`CheckpointName::register`]
/// (leaked, one allocation per distinct name ever configured, so memory is bounded by the
/// configuration, not by traffic). Request handling never interns: it looks names up in a
/// [`Registry`], which only holds names already interned.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CheckpointName(&'static str);

/// Upstream's `_NAME_RE` (`^[a-z0-9][a-z0-9._-]*$`) on a canonical key, and never `auto`.
fn valid_registered_name(key: &str) -> Result<(), String> {
    let mut chars = key.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
    if !(first_ok && rest_ok) {
        return Err("use lowercase letters, digits, '.', '_' or '-', starting with a letter or digit".to_owned());
    }
    if key == "auto" {
        return Err("'auto' means automatic routing in every model= argument".to_owned());
    }
    Ok(())
}

/// Every registered name, each once (see [`CheckpointName`] for why they are leaked).
static NAMES: std::sync::Mutex<BTreeSet<&'static str>> = std::sync::Mutex::new(BTreeSet::new());

/// The one copy of each registered name.
fn intern(key: &str) -> &'static str {
    let mut names = NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(name) = names.get(key) {
        return name;
    }
    let name: &'static str = Box::leak(key.to_owned().into_boxed_str());
    names.insert(name);
    name
}

#[allow(non_upper_case_globals)]
impl CheckpointName {
    /// ModernBERT-large, English only: the bundle repo's root.
    pub const English: CheckpointName = CheckpointName("english");
    /// mmBERT-base, 100+ languages: the bundle's `multilingual` subfolder.
    pub const Multilingual: CheckpointName = CheckpointName("multilingual");
    /// Fine-tuned on the typed-decisions workflows: the bundle's `typed-decisions` subfolder.
    pub const TypedDecisions: CheckpointName = CheckpointName("typed-decisions");

    /// Every built-in checkpoint, in upstream's order.
    pub const ALL: [CheckpointName; 3] = [
        CheckpointName::English,
        CheckpointName::Multilingual,
        CheckpointName::TypedDecisions,
    ];

    /// The canonical name: `english`, `multilingual`, `typed-decisions`, or a registered name.
    pub fn as_str(self) -> &'static str {
        self.0
    }

    /// Whether this is one of the three checkpoints upstream ships.
    pub fn is_builtin(self) -> bool {
        CheckpointName::ALL.contains(&self)
    }

    /// `normalise_name`: a built-in name or alias after Python's `strip()` and `lower()`.
    pub fn from_name_or_alias(name: &str) -> Option<Self> {
        let key = python_key(name);
        Self::from_key(&key)
    }

    /// `Router._add`'s reading of a name to register (configuration only, never a request): trimmed
    /// and lower-cased, an alias or built-in name is that built-in (registering it re-points it);
    /// anything else must match upstream's name rule and is interned.
    pub fn register(name: &str) -> Result<Self, String> {
        let key = python_key(name);
        if let Some(builtin) = Self::from_key(&key) {
            return Ok(builtin);
        }
        valid_registered_name(&key).map_err(|why| format!("invalid checkpoint name {}: {why}", py_repr_str(name)))?;
        Ok(CheckpointName(intern(&key)))
    }

    /// A canonical name this process knows: a built-in, or one registered before (what a worker
    /// reports back; never interns, so text from outside cannot grow the table).
    pub fn known(name: &str) -> Option<Self> {
        if let Some(builtin) = CheckpointName::ALL.into_iter().find(|c| c.as_str() == name) {
            return Some(builtin);
        }
        let names = NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        names.get(name).map(|n| CheckpointName(n))
    }

    /// A built-in name or alias already stripped and lower-cased.
    fn from_key(key: &str) -> Option<Self> {
        CheckpointName::ALL
            .into_iter()
            .find(|c| c.as_str() == key)
            .or_else(|| ALIASES.iter().find(|(alias, _)| *alias == key).map(|&(_, c)| c))
    }

    /// The `routing.repo` string of a built-in: the bundle repo, plus `/<subfolder>` off its root;
    /// a registered checkpoint's is its source ([`Registry::repo`]), here its name.
    pub fn repo(self) -> &'static str {
        match self {
            CheckpointName::English => "convaiinnovations/laya",
            CheckpointName::Multilingual => "convaiinnovations/laya/multilingual",
            CheckpointName::TypedDecisions => "convaiinnovations/laya/typed-decisions",
            other => other.0,
        }
    }

    /// `Router.default`: where a state with no language evidence goes unless the operator says
    /// otherwise (`LAYA_DEFAULT_MODEL`): `english` in 0.3.20, `multilingual` since 0.4.0.
    pub fn default_for(upstream: Upstream) -> Self {
        match upstream {
            Upstream::V0_3_20 => CheckpointName::English,
            Upstream::V0_4_15 => CheckpointName::Multilingual,
        }
    }

    /// The checkpoint's folder inside [`BUNDLE_REPO`]; `None` for english, which sits at its root,
    /// and for a registered checkpoint, which is not in the bundle.
    pub fn subfolder(self) -> Option<&'static str> {
        match self {
            CheckpointName::Multilingual => Some("multilingual"),
            CheckpointName::TypedDecisions => Some("typed-decisions"),
            _ => None,
        }
    }
}

impl std::fmt::Debug for CheckpointName {
    /// The built-ins as the enum variants they once were (`English`), others as `Registered("name")`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            CheckpointName::English => f.write_str("English"),
            CheckpointName::Multilingual => f.write_str("Multilingual"),
            CheckpointName::TypedDecisions => f.write_str("TypedDecisions"),
            other => write!(f, "Registered({:?})", other.0),
        }
    }
}

/// The checkpoints a server registered beside the built-ins, and built-ins re-pointed at another
/// source (upstream's `Router.models` beyond `DEFAULT_MODELS`): what `model=` and `task=` may name
/// besides the built-ins, the `routing.repo` each answers with, and the names an unknown-model
/// error lists. The empty registry is upstream's plain `Router()`.
///
/// It also holds the operator's own aliases (`[checkpoints.aliases]`, a layad addition): names that
/// resolve like a checkpoint's name wherever one is read from a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registry {
    /// Registered (or re-pointed) checkpoints with their `routing.repo` string, in registration order.
    entries: Vec<(CheckpointName, String)>,
    /// The operator's aliases, each a canonical key ([`check_alias`]) and the checkpoint it names.
    aliases: Vec<(String, CheckpointName)>,
}

/// The registry of a server with no checkpoints of its own.
static BUILTIN_ONLY: Registry = Registry {
    entries: Vec::new(),
    aliases: Vec::new(),
};

/// Why an operator's alias cannot be used, for the configuration's error message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AliasError {
    /// Not a name a request could send as is.
    #[error("invalid alias {0}: use lowercase letters, digits, '.', '_', '-' or '/', starting with a letter or digit")]
    Invalid(String),
    /// The name already means something: a checkpoint, one of upstream's aliases, `auto`, the
    /// bundle repo or a published Hub id.
    #[error("alias {alias} is already {meaning}; an alias must be a new name")]
    Taken {
        /// The alias, as its Python repr.
        alias: String,
        /// What the name means already.
        meaning: String,
    },
}

/// The canonical key of an operator's alias (trimmed and lower-cased, as every name in a request
/// is read), or why it cannot be one: it must be a name a request can send (upstream's name rule,
/// plus `/` for ids written `org/model`), and must not already mean something — a built-in
/// checkpoint or upstream alias, a registered checkpoint in `taken`, `auto`, the bundle repo or a
/// published Hub id — since the alias would then either shadow it or never be read.
pub fn check_alias(alias: &str, taken: &[CheckpointName]) -> Result<String, AliasError> {
    let key = python_key(alias);
    let mut chars = key.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !first_ok || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-' | '/')) {
        return Err(AliasError::Invalid(py_repr_str(alias)));
    }
    let taken_as = |meaning: String| AliasError::Taken {
        alias: py_repr_str(alias),
        meaning,
    };
    if let Some(builtin) = CheckpointName::ALL.into_iter().find(|c| c.as_str() == key) {
        return Err(taken_as(format!("the checkpoint {}", py_repr_str(builtin.as_str()))));
    }
    if let Some((_, target)) = ALIASES.iter().find(|(a, _)| *a == key) {
        return Err(taken_as(format!(
            "upstream's alias of {}",
            py_repr_str(target.as_str())
        )));
    }
    if let Some(registered) = taken.iter().find(|c| c.as_str() == key) {
        return Err(taken_as(format!(
            "the checkpoint {} of [checkpoints.extra]",
            py_repr_str(registered.as_str())
        )));
    }
    if key == "auto" || key == BUNDLE_REPO {
        return Err(taken_as("a request for automatic routing".to_owned()));
    }
    if let Some((_, target)) = PUBLISHED_MODEL_IDS.iter().find(|(id, _)| *id == key) {
        return Err(taken_as(format!(
            "the published Hub id of {}",
            py_repr_str(target.as_str())
        )));
    }
    Ok(key)
}

impl Registry {
    /// Registrations: each name with its `routing.repo` string (upstream's `_repo_str(source)`).
    pub fn new(entries: Vec<(CheckpointName, String)>) -> Self {
        Self {
            entries,
            aliases: Vec::new(),
        }
    }

    /// This registry with the operator's aliases, each a key from [`check_alias`] and its checkpoint.
    pub fn with_aliases(mut self, aliases: Vec<(String, CheckpointName)>) -> Self {
        self.aliases = aliases;
        self
    }

    /// The operator's aliases, in configuration order.
    pub fn aliases(&self) -> &[(String, CheckpointName)] {
        &self.aliases
    }

    /// No registrations: the three built-ins as shipped.
    pub fn builtin_only() -> &'static Registry {
        &BUILTIN_ONLY
    }

    /// `Router.resolve` on a key already stripped and lower-cased: a built-in or alias, else a
    /// registered name.
    fn resolve_key(&self, key: &str) -> Option<CheckpointName> {
        CheckpointName::from_key(key)
            .or_else(|| self.entries.iter().map(|(n, _)| *n).find(|n| n.as_str() == key))
            .or_else(|| self.aliases.iter().find(|(a, _)| a == key).map(|&(_, c)| c))
    }

    /// `Router.resolve(name)`: a built-in name or alias, or a registered name, after `strip().lower()`;
    /// then the operator's aliases.
    pub fn resolve(&self, name: &str) -> Option<CheckpointName> {
        self.resolve_key(&python_key(name))
    }

    /// The `routing.repo` of `name`: its registered source, else the built-in's bundle path.
    pub fn repo(&self, name: CheckpointName) -> &str {
        self.entries
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(name.repo(), |(_, repo)| repo.as_str())
    }

    /// The registrations of the names in `keep` only.
    pub fn retaining(&self, keep: &[CheckpointName]) -> Self {
        Self {
            entries: self.entries.iter().filter(|(n, _)| keep.contains(n)).cloned().collect(),
            aliases: self
                .aliases
                .iter()
                .filter(|(_, c)| c.is_builtin() || keep.contains(c))
                .cloned()
                .collect(),
        }
    }

    /// Checkpoints registered beyond the built-ins (not the re-pointed built-ins), in order.
    pub fn extras(&self) -> impl Iterator<Item = CheckpointName> + '_ {
        self.entries.iter().map(|(n, _)| *n).filter(|n| !n.is_builtin())
    }

    /// `sorted(self.models)`: every name the router knows.
    fn sorted_names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = CheckpointName::ALL.iter().map(|c| c.as_str()).collect();
        names.extend(self.extras().map(CheckpointName::as_str));
        names.sort_unstable();
        names.dedup();
        names
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

/// A request the router refuses (HTTP 422), with upstream's `detail` as its text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// 0.4.15: `model` looks like a path or an unpublished Hub repo id, a checkpoint this server
    /// cannot load (`serve._resolve_model`). Carries the whole detail (it lists the registry).
    #[error("{0}, or omit model to let the router choose")]
    UnservableModel(String),
    /// 0.4.15: `task` names no checkpoint (`Router.resolve`). Carries the whole detail.
    #[error("{0}")]
    UnknownTask(String),
}

impl RouteError {
    /// The HTTP status upstream answers with.
    pub fn status(&self) -> u16 {
        422
    }
}

/// `normalise_name`'s `ValueError` text for a name that is no checkpoint or alias (used for
/// `LAYA_DEFAULT_MODEL`, which upstream refuses at start-up with it).
pub fn unknown_model_name(name: &str) -> String {
    unknown_model_name_in(name, Registry::builtin_only())
}

/// [`unknown_model_name`] on a server that registered checkpoints of its own: they are listed too.
pub fn unknown_model_name_in(name: &str, registry: &Registry) -> String {
    unknown_model(&py_repr_str(python_key(name).as_str()), registry)
}

/// `ValueError("unknown model %r; choose one of %s (or an alias: %s)")` of `Router.resolve` and
/// `normalise_name`, for a name already written as its Python repr.
fn unknown_model(name_repr: &str, registry: &Registry) -> String {
    let list = |names: Vec<&str>| {
        let items: Vec<String> = names.into_iter().map(py_repr_str).collect();
        format!("[{}]", items.join(", "))
    };
    let mut aliases: Vec<&str> = ALIASES.iter().map(|(alias, _)| *alias).collect();
    // The operator's own are listed with upstream's (without any, the text is upstream's).
    aliases.extend(registry.aliases.iter().map(|(alias, _)| alias.as_str()));
    aliases.sort_unstable();
    format!(
        "unknown model {name_repr}; choose one of {} (or an alias: {})",
        list(registry.sorted_names()),
        list(aliases)
    )
}

/// Python's `str(value)` of a parsed JSON value: the text of a string, else its repr.
fn py_str(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => py_repr(other),
    }
}

/// `serve._names_unpublished_source`: a path (`./ckpt`, `~/ckpt`, `C:\ckpt`) or a Hub repo id.
fn names_unpublished_source(text: &str) -> bool {
    text.starts_with(['.', '~']) || text.contains(['/', '\\'])
}

/// The server's reading of the request's `model` field (`serve._resolve_model`): falsy → `None`
/// (route automatically); else `str(model).strip().lower()` as a standalone Hugging Face id, then
/// as a name or alias. Anything else is `None` too (a Jev id such as `jev-1`, the bundle id) —
/// except that 0.4.15 refuses a path or an unpublished Hub id, which 0.3.20 also ignores.
pub fn resolve_model_field(model: Option<&Value>, upstream: Upstream) -> Result<Option<CheckpointName>, RouteError> {
    resolve_model_field_in(model, upstream, Registry::builtin_only())
}

/// [`resolve_model_field`] on a server that registered checkpoints of its own: a registered name
/// pins like a built-in (upstream passes `Router.resolve`), and the refusal lists them too.
pub fn resolve_model_field_in(
    model: Option<&Value>,
    upstream: Upstream,
    registry: &Registry,
) -> Result<Option<CheckpointName>, RouteError> {
    let Some(model) = model.filter(|m| !is_falsy(m)) else {
        return Ok(None);
    };
    let text = py_str(model);
    let key = python_key(&text);
    let known = PUBLISHED_MODEL_IDS
        .iter()
        .find(|(id, _)| *id == key)
        .map(|&(_, c)| c)
        .or_else(|| registry.resolve_key(&key));
    if known.is_some() || !upstream.differences().unpublished_models_refused || key == BUNDLE_REPO {
        return Ok(known);
    }
    if names_unpublished_source(py_strip(&text)) {
        return Err(RouteError::UnservableModel(unknown_model(&py_repr(model), registry)));
    }
    Ok(None)
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
    /// `routing.repo`: where the checkpoint comes from (upstream's `_repo_str` of its source).
    pub repo: String,
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
        out.insert("repo".to_owned(), Value::String(self.repo.clone()));
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

/// The request's routing controls, as they reach upstream's `Router.route`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RouteRequest<'a> {
    /// The checkpoint named by `model`, already read by [`resolve_model_field`].
    pub model: Option<CheckpointName>,
    /// 0.4.15 `task`: any non-null JSON value, since the server forwards it unchecked.
    pub task: Option<&'a Value>,
    /// 0.4.15 `lang`: a language code (the server refuses anything but a string or null).
    pub lang: Option<&'a str>,
    /// 0.4.15 `lang_guess`: a language code, checked after `lang`.
    pub lang_guess: Option<&'a str>,
}

/// Server settings that change routing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteOptions<'a> {
    /// The release whose router and detector answer.
    pub upstream: Upstream,
    /// `LAYA_AUTO_TASK`: questions matching a typed-decisions workflow go to that checkpoint.
    pub auto_task: bool,
    /// `LAYA_DEFAULT_MODEL`: where states without language evidence go; `None` is the release's
    /// own default ([`CheckpointName::default_for`]).
    pub default_checkpoint: Option<CheckpointName>,
    /// The checkpoints registered beside the built-ins (`LAYA_EXTRA_MODELS`).
    pub registry: &'a Registry,
}

impl Default for RouteOptions<'_> {
    fn default() -> Self {
        Self {
            upstream: Upstream::default(),
            auto_task: false,
            default_checkpoint: None,
            registry: Registry::builtin_only(),
        }
    }
}

/// Language subtags that mean "the English checkpoint can read this" (`_ENGLISH_SUBTAGS`).
const ENGLISH_SUBTAGS: [&str; 3] = ["en", "eng", "english"];

/// Codes that name no language and so abstain (`_LANGUAGE_AGNOSTIC_CODES`): `C`, `POSIX`, and the
/// ISO 639-2 `und`, `zxx` and `mul`.
const LANGUAGE_AGNOSTIC_CODES: [&str; 5] = ["c", "posix", "und", "zxx", "mul"];

/// `_english_from_code`: whether a language code names English, or `None` when it names no
/// language (blank, `C.UTF-8`, `und`, …). `en_US.UTF-8` → `en_US` → `en`.
fn english_from_code(code: &str) -> Option<bool> {
    let code = python_key(code);
    let code = code.split('.').next().unwrap_or_default();
    let code = code.replace('_', "-");
    let primary = code.split('-').next().unwrap_or_default();
    if primary.is_empty() || LANGUAGE_AGNOSTIC_CODES.contains(&primary) {
        return None;
    }
    Some(ENGLISH_SUBTAGS.contains(&primary))
}

/// `str(task).lower().replace("-", "_") == "typed_decisions"`, then `Router.resolve`.
fn resolve_task(task: &Value, registry: &Registry) -> Result<CheckpointName, RouteError> {
    let text = py_str(task);
    let mut lowered = String::with_capacity(text.len());
    py_char::push_lower(&text, &mut lowered);
    if lowered.replace('-', "_") == "typed_decisions" {
        return Ok(CheckpointName::TypedDecisions);
    }
    registry
        .resolve_key(&python_key(&text))
        .ok_or_else(|| RouteError::UnknownTask(unknown_model(&py_repr(task), registry)))
}

/// `Router._route` as the server calls it (spec §6.2). Precedence: explicit `model`, then (0.4.15)
/// `task`, then the typed-decisions workflow when `auto_task` is on, then (0.4.15) `lang` and
/// `lang_guess` where they name a language, then detection. 0.3.20's server forwards none of
/// `task`, `lang` or `lang_guess`, so under 0.3.20 they are not read.
pub fn route(
    state: Option<&Value>,
    question_ids: &[&str],
    request: &RouteRequest<'_>,
    options: &RouteOptions<'_>,
) -> Result<RoutingDecision, RouteError> {
    let upstream = options.upstream;
    let registry = options.registry;
    let decided = |checkpoint: CheckpointName, reason: String, workflow: Option<&'static str>| RoutingDecision {
        checkpoint,
        repo: registry.repo(checkpoint).to_owned(),
        reason,
        detection: None,
        workflow,
    };
    if let Some(checkpoint) = request.model {
        // The server passes the canonical name, so the repr is of that, not of what was sent.
        let reason = format!("explicit model={}", py_repr_str(checkpoint.as_str()));
        return Ok(decided(checkpoint, reason, None));
    }
    let task = request
        .task
        .filter(|t| upstream.differences().task_field && !t.is_null());
    if let Some(task) = task {
        let checkpoint = resolve_task(task, registry)?;
        return Ok(decided(checkpoint, format!("explicit task={}", py_repr(task)), None));
    }
    let workflow = typed_decisions_workflow(question_ids);
    if let Some(name) = workflow.filter(|_| options.auto_task) {
        let reason = format!("question ids match the {} typed-decisions workflow", py_repr_str(name));
        return Ok(decided(CheckpointName::TypedDecisions, reason, workflow));
    }
    if upstream.differences().language_hints {
        // A code that names no language falls through, as an abstaining hint does.
        if let Some(lang) = request.lang
            && let Some(english) = english_from_code(lang)
        {
            let reason = format!("explicit lang={}", py_repr_str(lang));
            return Ok(decided(english_or_not(english), reason, workflow));
        }
        if let Some(english) = request.lang_guess.and_then(english_from_code) {
            let reason = format!(
                "lang_guess: the caller identified this as {} text",
                if english { "English" } else { "non-English" }
            );
            return Ok(decided(english_or_not(english), reason, workflow));
        }
    }
    let fallback = options
        .default_checkpoint
        .unwrap_or_else(|| CheckpointName::default_for(upstream));
    let det = analyse(state, upstream);
    let (checkpoint, reason) = if det.script == "unknown" {
        let key = fallback.as_str();
        (fallback, format!("no letters detected in state; using default ({key})"))
    } else if det.script != "latin" {
        let share = printf_0f(100.0 * det.non_latin_fraction);
        let reason = format!(
            "non-Latin script ({}, {share}% of letters); the English checkpoint cannot read it",
            det.script
        );
        (CheckpointName::Multilingual, reason)
    } else if !det.is_english {
        let reason = match (&det.mixed_segment, det.language) {
            (Some(segment), Some(lang)) if !segment.is_empty() => format!(
                "Latin script, mostly English, but a line or field reads as {} ({}); \
                 the English checkpoint cannot read it",
                py_repr_str(lang),
                py_repr_str(py_prefix(segment, 60))
            ),
            (_, Some(lang)) => format!(
                "Latin script but language looks like {}, not English",
                py_repr_str(lang)
            ),
            (_, None) => format!(
                "Latin script, language not identified but {}% non-English letters; \
                 not safe for the English checkpoint",
                printf_0f(100.0 * det.diacritic_rate)
            ),
        };
        (CheckpointName::Multilingual, reason)
    } else if det.language_undecided {
        let key = fallback.as_str();
        let reason = format!("Latin script, language not identified and no non-English letters; using default ({key})");
        (fallback, reason)
    } else {
        (CheckpointName::English, "English Latin text".to_owned())
    };
    Ok(RoutingDecision {
        checkpoint,
        repo: registry.repo(checkpoint).to_owned(),
        reason,
        detection: Some(det),
        workflow,
    })
}

/// `"english" if resolved else "multilingual"`.
fn english_or_not(english: bool) -> CheckpointName {
    if english {
        CheckpointName::English
    } else {
        CheckpointName::Multilingual
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Routes like the 0.3.20 server: no controls but `model`, `auto_task` as given.
    fn route_0_3_20(
        state: Option<&Value>,
        ids: &[&str],
        model: Option<CheckpointName>,
        auto_task: bool,
    ) -> RoutingDecision {
        let request = RouteRequest {
            model,
            ..RouteRequest::default()
        };
        let options = RouteOptions {
            upstream: Upstream::V0_3_20,
            auto_task,
            ..RouteOptions::default()
        };
        route(state, ids, &request, &options).unwrap_or_else(|e| panic!("{e}"))
    }

    fn auto(state: Value) -> RoutingDecision {
        route_0_3_20(Some(&state), &["q"], None, false)
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
        for upstream in Upstream::ALL {
            for (model, want) in &cases {
                assert_eq!(resolve_model_field(Some(model), upstream), Ok(*want), "{model}");
            }
            assert_eq!(resolve_model_field(None, upstream), Ok(None));
        }
    }

    #[test]
    fn explicit_model_skips_detection_and_workflow() {
        let ids = ["action", "category", "churn_risk", "needs_human", "urgency"];
        let d = route_0_3_20(Some(&json!("Bonjour")), &ids, Some(CheckpointName::Multilingual), true);
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
        let on = route_0_3_20(Some(&state), &ids, None, true);
        assert_eq!(on.checkpoint, CheckpointName::TypedDecisions);
        assert_eq!(
            on.reason,
            "question ids match the 'customer_service' typed-decisions workflow"
        );
        assert_eq!((on.detection, on.workflow), (None, Some("customer_service")));

        let off = route_0_3_20(Some(&state), &ids, None, false);
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
        let missing = route_0_3_20(None, &[], None, false);
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

    fn route_0_4_15(state: Value, request: RouteRequest<'_>) -> Result<RoutingDecision, RouteError> {
        let options = RouteOptions {
            upstream: Upstream::V0_4_15,
            ..RouteOptions::default()
        };
        route(Some(&state), &["q"], &request, &options)
    }

    #[test]
    fn language_codes_like_upstream() {
        for code in [
            "en",
            "EN",
            "en-US",
            "en_US.UTF-8",
            "eng",
            " English ",
            "en.",
            "english-uk",
        ] {
            assert_eq!(english_from_code(code), Some(true), "{code:?}");
        }
        for code in [
            "de",
            "PT-br",
            "pt_BR.UTF-8",
            "zh-Hans-CN",
            "engl",
            "e",
            "x-klingon",
            "null",
        ] {
            assert_eq!(english_from_code(code), Some(false), "{code:?}");
        }
        for code in [
            "", "   ", "C", "c", "POSIX", "C.UTF-8", "und", "zxx", "MUL", ".", "_", "-", ".en", "_en",
        ] {
            assert_eq!(english_from_code(code), None, "{code:?}");
        }
    }

    #[test]
    fn controls_in_upstream_precedence() {
        let en = json!("I was charged twice for invoice 4411, please refund it today.");
        let lang = |code| RouteRequest {
            lang: Some(code),
            ..RouteRequest::default()
        };
        let d = route_0_4_15(en.clone(), lang("PT-br")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (d.checkpoint, d.reason.as_str(), d.detection),
            (CheckpointName::Multilingual, "explicit lang='PT-br'", None)
        );
        // An abstaining code falls through to lang_guess, then detection.
        let d = route_0_4_15(
            en.clone(),
            RouteRequest {
                lang: Some("C.UTF-8"),
                lang_guess: Some("de_DE"),
                ..RouteRequest::default()
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.reason, "lang_guess: the caller identified this as non-English text");
        let d = route_0_4_15(en.clone(), lang("und")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.reason, "English Latin text");

        let task = json!("TYPED-DECISIONS");
        let d = route_0_4_15(
            en.clone(),
            RouteRequest {
                task: Some(&task),
                lang: Some("de"),
                ..RouteRequest::default()
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (d.checkpoint, d.reason.as_str()),
            (CheckpointName::TypedDecisions, "explicit task='TYPED-DECISIONS'")
        );
        // 0.3.20's server forwards no controls.
        let options = RouteOptions {
            upstream: Upstream::V0_3_20,
            ..RouteOptions::default()
        };
        let d = route(Some(&en), &["q"], &lang("de"), &options).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.reason, "English Latin text");
    }

    #[test]
    fn refusals_carry_upstream_texts() {
        let aliases = "['decisions', 'default', 'en', 'laya', 'laya-multilingual', 'laya-typed-decisions', \
                       'ml', 'multi', 'typed', 'typed_decisions']";
        let task = json!(true);
        let err = route_0_4_15(
            json!("x"),
            RouteRequest {
                task: Some(&task),
                ..RouteRequest::default()
            },
        )
        .err()
        .map(|e| (e.status(), e.to_string()));
        let want = format!(
            "unknown model True; choose one of ['english', 'multilingual', 'typed-decisions'] (or an alias: {aliases})"
        );
        assert_eq!(err, Some((422, want)));

        let v4 = Upstream::V0_4_15;
        for model in ["./ckpt", "~/x", "org/repo", "C:\\ckpt", " .hidden "] {
            let err = resolve_model_field(Some(&json!(model)), v4)
                .err()
                .map(|e| e.to_string());
            let want = format!(
                "unknown model {}; choose one of ['english', 'multilingual', 'typed-decisions'] \
                 (or an alias: {aliases}), or omit model to let the router choose",
                py_repr_str(model)
            );
            assert_eq!(err, Some(want), "{model:?}");
            assert_eq!(resolve_model_field(Some(&json!(model)), Upstream::V0_3_20), Ok(None));
        }
        for model in [
            json!("jev-1"),
            json!("convaiinnovations/laya"),
            json!(" CONVAIINNOVATIONS/LAYA "),
        ] {
            assert_eq!(resolve_model_field(Some(&model), v4), Ok(None), "{model}");
        }
        let dict = json!({"a/b": 1});
        assert!(resolve_model_field(Some(&dict), v4).is_err());
    }

    #[test]
    fn the_default_checkpoint_per_release_and_overridden() {
        let short = json!("Quero cancelar");
        let mut options = RouteOptions::default();
        let d = route(Some(&short), &[], &RouteRequest::default(), &options).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.checkpoint, CheckpointName::Multilingual);
        assert!(d.reason.ends_with("using default (multilingual)"), "{}", d.reason);
        options.default_checkpoint = Some(CheckpointName::English);
        let d = route(None, &[], &RouteRequest::default(), &options).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.reason, "no letters detected in state; using default (english)");
        assert_eq!(CheckpointName::default_for(Upstream::V0_3_20), CheckpointName::English);
    }

    #[test]
    fn a_registered_checkpoint_pins_like_a_builtin_and_its_source_is_the_repo() {
        let mine = CheckpointName::register(" Mine-2.ft ").expect("valid");
        assert_eq!(mine.as_str(), "mine-2.ft");
        assert!(!mine.is_builtin());
        assert_eq!(CheckpointName::register("EN"), Ok(CheckpointName::English));
        for bad in ["auto", "-x", "a/b", "", "caf\u{e9}"] {
            let err = CheckpointName::register(bad).expect_err(bad);
            assert!(err.starts_with("invalid checkpoint name"), "{err}");
        }
        let registry = Registry::new(vec![
            (mine, "/srv/mine".to_owned()),
            (CheckpointName::English, "me/laya-ft".to_owned()),
        ]);
        let v4 = Upstream::V0_4_15;
        assert_eq!(
            resolve_model_field_in(Some(&json!(" MINE-2.FT")), v4, &registry),
            Ok(Some(mine))
        );
        assert_eq!(resolve_model_field(Some(&json!("mine-2.ft")), v4), Ok(None));
        let options = RouteOptions {
            upstream: v4,
            registry: &registry,
            ..RouteOptions::default()
        };
        let pinned = RouteRequest {
            model: Some(mine),
            ..RouteRequest::default()
        };
        let d = route(Some(&json!("hello there")), &["q"], &pinned, &options).expect("routes");
        assert_eq!(
            (d.checkpoint, d.repo.as_str(), d.reason.as_str()),
            (mine, "/srv/mine", "explicit model='mine-2.ft'")
        );
        let english = route(
            Some(&json!("Please refund invoice 4411 today.")),
            &["q"],
            &RouteRequest::default(),
            &options,
        )
        .expect("routes");
        assert_eq!(
            (english.checkpoint, english.repo.as_str()),
            (CheckpointName::English, "me/laya-ft")
        );
        let task = json!("Mine-2.ft");
        let by_task = RouteRequest {
            task: Some(&task),
            ..RouteRequest::default()
        };
        assert_eq!(route(None, &["q"], &by_task, &options).map(|d| d.checkpoint), Ok(mine));
        let unknown = json!("nope");
        let bad_task = RouteRequest {
            task: Some(&unknown),
            ..RouteRequest::default()
        };
        let err = route(None, &["q"], &bad_task, &options)
            .expect_err("unknown")
            .to_string();
        assert!(
            err.starts_with(
                "unknown model 'nope'; choose one of ['english', 'mine-2.ft', 'multilingual', 'typed-decisions']"
            ),
            "{err}"
        );
        let path = resolve_model_field_in(Some(&json!("./ckpt")), v4, &registry)
            .expect_err("path")
            .to_string();
        assert!(
            path.contains("'mine-2.ft'") && path.ends_with(", or omit model to let the router choose"),
            "{path}"
        );
    }

    #[test]
    fn operator_aliases_resolve_like_names_and_must_be_new_names() {
        let mine = CheckpointName::register("mine-aliased").expect("valid");
        assert_eq!(check_alias(" Laya-421M ", &[mine]), Ok("laya-421m".to_owned()));
        assert_eq!(check_alias("me/laya", &[]), Ok("me/laya".to_owned()));
        for (taken, meaning) in [
            ("english", "the checkpoint 'english'"),
            ("EN", "upstream's alias of 'english'"),
            ("mine-aliased", "the checkpoint 'mine-aliased' of [checkpoints.extra]"),
            ("auto", "a request for automatic routing"),
            ("convaiinnovations/laya", "a request for automatic routing"),
            (
                "convaiinnovations/laya-multilingual",
                "the published Hub id of 'multilingual'",
            ),
        ] {
            let err = check_alias(taken, &[mine]).expect_err(taken);
            assert!(
                matches!(&err, AliasError::Taken { meaning: m, .. } if m == meaning),
                "{err}"
            );
            assert!(err.to_string().ends_with("an alias must be a new name"), "{err}");
        }
        for invalid in ["", "-x", "./mine", "caf\u{e9}", "a b"] {
            assert!(
                matches!(check_alias(invalid, &[]), Err(AliasError::Invalid(_))),
                "{invalid:?}"
            );
        }

        let registry = Registry::new(vec![(mine, "/srv/mine".to_owned())]).with_aliases(vec![
            ("laya-421m".to_owned(), CheckpointName::English),
            ("me/laya".to_owned(), mine),
        ]);
        let v4 = Upstream::V0_4_15;
        assert_eq!(
            resolve_model_field_in(Some(&json!(" LAYA-421m")), v4, &registry),
            Ok(Some(CheckpointName::English))
        );
        // Path-like under 0.4.15, but a configured alias: it resolves before the refusal.
        assert_eq!(
            resolve_model_field_in(Some(&json!("me/laya")), v4, &registry),
            Ok(Some(mine))
        );
        // Without the alias, upstream's reading: a plain unknown name routes automatically.
        assert_eq!(resolve_model_field(Some(&json!("laya-421m")), v4), Ok(None));
        // The refusal lists the operator's aliases beside upstream's.
        let refused = unknown_model_name_in("nope", &registry);
        assert!(
            refused.contains("'laya-421m'") && refused.contains("'me/laya'"),
            "{refused}"
        );
        assert!(!unknown_model_name("nope").contains("laya-421m"));
        // A reload that drops the extra checkpoint drops the aliases naming it.
        let narrowed = registry.retaining(&[]);
        assert_eq!(narrowed.aliases(), [("laya-421m".to_owned(), CheckpointName::English)]);
    }
}
