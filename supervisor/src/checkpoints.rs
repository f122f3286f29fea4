//! The checkpoints the supervisor serves: found where the configuration says (a directory or the
//! Hugging Face cache; an extra checkpoint's directory, Hub repo or `[repo, subfolder]` as upstream's
//! `LAYA_EXTRA_MODELS` reads them) and opened at start-up, and again by a reload that adds or
//! removes extra checkpoints, for their tokenizers, limits, temperatures and the routing registry.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use laya::checkpoint::{
    Checkpoint, CheckpointError, Location, find_in_hf_cache, find_repo_in_hf_cache, hf_hub_cache_dir,
};
use laya::routing::{CheckpointName, Registry};
use layad_config::{CheckpointSource, Config, ExtraSource};

/// Finds a checkpoint where the configuration says it is.
pub fn locate(name: CheckpointName, source: &CheckpointSource) -> Result<Location, CheckpointError> {
    match source {
        CheckpointSource::Directory(dir) => Ok(Location::from_path(dir)),
        CheckpointSource::HfCache => {
            let cache = hf_hub_cache_dir().ok_or_else(|| CheckpointError::NotFound {
                name: name.as_str().to_owned(),
                searched: "no Hugging Face cache: set HF_HUB_CACHE or HF_HOME (or HOME)".to_owned(),
            })?;
            find_in_hf_cache(&cache, name)
        }
        CheckpointSource::Off => Err(CheckpointError::NotFound {
            name: name.as_str().to_owned(),
            searched: "nowhere: it is \"off\" in [checkpoints]".to_owned(),
        }),
        CheckpointSource::Registered(extra) => locate_registered(name, extra),
    }
}

/// `~` and `~/…` as the user's home (upstream's `os.path.expanduser` on a string source).
fn expand_home(source: &str) -> PathBuf {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
    match (source.strip_prefix('~'), home) {
        (Some(""), Some(home)) => PathBuf::from(home),
        (Some(rest), Some(home)) if rest.starts_with('/') => PathBuf::from(home).join(&rest[1..]),
        _ => PathBuf::from(source),
    }
}

/// Upstream `Agent`'s reading of a source: a path that exists is a checkpoint directory, and so is
/// one written as a path (`/…`, `./…`, `../…`, `~…`), which is then missing; anything else is a Hub
/// repo id, found in the Hugging Face cache (`refs/main`), the same cache the built-ins come from.
/// A subfolder is then joined to either.
fn locate_registered(name: CheckpointName, extra: &ExtraSource) -> Result<Location, CheckpointError> {
    let path = expand_home(&extra.source);
    let written_as_path = ["/", "./", "../", "~"].iter().any(|p| extra.source.starts_with(p)) || path.is_absolute();
    if path.exists() || written_as_path {
        if !path.exists() {
            return Err(CheckpointError::Missing { path });
        }
        let dir = extra.subfolder.as_deref().map_or(path.clone(), |sub| path.join(sub));
        return Ok(Location::from_path(dir));
    }
    let cache = hf_hub_cache_dir().ok_or_else(|| CheckpointError::NotFound {
        name: name.as_str().to_owned(),
        searched: "no Hugging Face cache: set HF_HUB_CACHE or HF_HOME (or HOME)".to_owned(),
    })?;
    find_repo_in_hf_cache(&cache, &extra.source, extra.subfolder.as_deref()).map_err(|e| match e {
        CheckpointError::NotFound { searched, .. } => CheckpointError::NotFound {
            name: name.as_str().to_owned(),
            searched: format!(
                "{searched} (a Hub repo id: download it into this cache first, e.g. `huggingface-cli download {}`)",
                extra.source
            ),
        },
        other => other,
    })
}

/// A served checkpoint that could not be found or opened.
#[derive(Debug, thiserror::Error)]
#[error("checkpoint '{}': {source}", name.as_str())]
pub struct OpenError {
    /// The checkpoint.
    pub name: CheckpointName,
    /// What went wrong, naming the file.
    pub source: CheckpointError,
}

/// The opened checkpoints the server answers with, and the routing registry of those it serves
/// beside the built-ins.
pub struct Checkpoints {
    /// Shared with the set a reload replaces, so a kept checkpoint is not read and hashed again.
    opened: Vec<(CheckpointName, Arc<Checkpoint>)>,
    registry: Registry,
}

/// The registry of `config`'s extra and re-pointed checkpoints (their `routing.repo` strings) and
/// of its `[checkpoints.aliases]`.
pub fn registry(config: &Config) -> Registry {
    Registry::new(
        config
            .served_checkpoints()
            .into_iter()
            .filter_map(|(name, source)| match source {
                CheckpointSource::Registered(extra) => Some((name, repo_string(&extra))),
                _ => None,
            })
            .collect(),
    )
    .with_aliases(config.checkpoints.alias_table())
}

/// `_repo_str` of the source as upstream's `Router._add` stored it (a leading `~` expanded).
fn repo_string(extra: &ExtraSource) -> String {
    if extra.source.starts_with('~') {
        let expanded = ExtraSource {
            source: expand_home(&extra.source).display().to_string(),
            subfolder: extra.subfolder.clone(),
        };
        return expanded.repo_string();
    }
    extra.repo_string()
}

impl Checkpoints {
    /// Locates and opens every checkpoint `config` serves, reporting each one's outcome (for
    /// `layad check`, which shows them all rather than stopping at the first failure).
    pub fn open_each(config: &Config) -> Vec<(CheckpointName, Result<Checkpoint, CheckpointError>)> {
        config
            .served_checkpoints()
            .into_iter()
            .map(|(name, source)| (name, locate(name, &source).and_then(Checkpoint::open)))
            .collect()
    }

    /// Opens every served checkpoint, failing on the first that does not open.
    pub fn open(config: &Config) -> Result<Self, OpenError> {
        let mut checkpoints = Self::open_unhashed(config)?;
        checkpoints.hash_weights()?;
        Ok(checkpoints)
    }

    /// [`Checkpoints::open`] without hashing the weights (every `weights.sha256` empty): enough to
    /// start the workers, which read the files themselves; [`Checkpoints::hash_weights`] must run
    /// before the set answers anything.
    pub fn open_unhashed(config: &Config) -> Result<Self, OpenError> {
        let mut opened = Vec::new();
        for (name, source) in config.served_checkpoints() {
            let checkpoint = locate(name, &source)
                .and_then(Checkpoint::open_unhashed)
                .map_err(|source| OpenError { name, source })?;
            opened.push((name, Arc::new(checkpoint)));
        }
        Ok(Self {
            opened,
            registry: registry(config),
        })
    }

    /// Hashes the weights of a set from [`Checkpoints::open_unhashed`], each checkpoint on a
    /// thread of its own (a full-size checkpoint takes seconds).
    pub fn hash_weights(&mut self) -> Result<(), OpenError> {
        let failed = |name, path: PathBuf, problem: &str| OpenError {
            name,
            source: CheckpointError::Invalid {
                path,
                problem: problem.to_owned(),
            },
        };
        std::thread::scope(|scope| {
            let hashing: Vec<_> = self
                .opened
                .iter_mut()
                .map(|(name, checkpoint)| {
                    let (name, path) = (*name, checkpoint.weights.path.clone());
                    // Not yet shared: the set was opened just now and nothing kept a clone.
                    let only = Arc::get_mut(checkpoint);
                    let shared_path = path.clone();
                    let thread = scope.spawn(move || match only {
                        Some(checkpoint) => checkpoint.hash_weights().map_err(|source| OpenError { name, source }),
                        None => Err(failed(name, shared_path, "shared before it was hashed")),
                    });
                    (name, path, thread)
                })
                .collect();
            hashing.into_iter().try_for_each(|(name, path, thread)| {
                thread
                    .join()
                    .unwrap_or_else(|_| Err(failed(name, path, "hashing the weights panicked")))
            })
        })
    }

    /// Opens the checkpoints of `loaded` for a reload of a server running `running` with
    /// `current`: a checkpoint served by both keeps its opened files (a reload may only add or
    /// remove extra checkpoints; changing where a served one comes from needs a restart, see
    /// `reload::plan`), the new ones are opened here, and any failure refuses the reload with the
    /// checkpoint and file it names.
    pub fn reopen(current: &Checkpoints, loaded: &Config) -> Result<Self, OpenError> {
        let mut opened = Vec::new();
        for (name, source) in loaded.served_checkpoints() {
            if let Some((_, kept)) = current.opened.iter().find(|(n, _)| *n == name) {
                opened.push((name, Arc::clone(kept)));
                continue;
            }
            let checkpoint = locate(name, &source)
                .and_then(Checkpoint::open)
                .map_err(|source| OpenError { name, source })?;
            opened.push((name, Arc::new(checkpoint)));
        }
        Ok(Self {
            opened,
            registry: registry(loaded),
        })
    }

    /// Already opened checkpoints (tests, tools), none of them registered beside the built-ins.
    pub fn from_opened(opened: Vec<(CheckpointName, Checkpoint)>) -> Self {
        Self {
            opened: opened.into_iter().map(|(n, c)| (n, Arc::new(c))).collect(),
            registry: Registry::default(),
        }
    }

    /// Already opened checkpoints with the registry they are served under (tests).
    pub fn from_opened_with(opened: Vec<(CheckpointName, Checkpoint)>, registry: Registry) -> Self {
        Self {
            registry,
            ..Self::from_opened(opened)
        }
    }

    /// This set without the checkpoints not in `keep` (a reload's removals, applied first).
    pub fn narrowed_to(&self, keep: &[CheckpointName]) -> Self {
        Self {
            opened: self
                .opened
                .iter()
                .filter(|(n, _)| keep.contains(n))
                .map(|(n, c)| (*n, Arc::clone(c)))
                .collect(),
            registry: self.registry.retaining(keep),
        }
    }

    /// What `model=` and `task=` may name besides the built-ins, and each one's `routing.repo`.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The checkpoint with this name, if served.
    pub fn get(&self, name: CheckpointName) -> Option<&Checkpoint> {
        self.opened.iter().find(|(n, _)| *n == name).map(|(_, c)| c.as_ref())
    }

    /// The served checkpoints, in upstream's order of configuration.
    pub fn iter(&self) -> impl Iterator<Item = (CheckpointName, &Checkpoint)> {
        self.opened.iter().map(|(n, c)| (*n, c.as_ref()))
    }
}

/// The checkpoint set being served: swapped as a whole by a reload that adds or removes extra
/// checkpoints, while each request keeps the set it was prepared with.
#[derive(Default)]
pub struct ServedCheckpoints {
    current: RwLock<Option<Arc<Checkpoints>>>,
}

impl ServedCheckpoints {
    /// Serving `checkpoints`.
    pub fn new(checkpoints: Arc<Checkpoints>) -> Self {
        Self {
            current: RwLock::new(Some(checkpoints)),
        }
    }

    /// The set requests are prepared with now.
    pub fn current(&self) -> Arc<Checkpoints> {
        let guard = self.current.read().unwrap_or_else(|p| p.into_inner());
        guard
            .as_ref()
            .map_or_else(|| Arc::new(Checkpoints::from_opened(Vec::new())), Arc::clone)
    }

    /// Serves `next` from now on; returns the set it replaces.
    pub fn replace(&self, next: Arc<Checkpoints>) -> Arc<Checkpoints> {
        let mut guard = self.current.write().unwrap_or_else(|p| p.into_inner());
        let previous = guard.replace(next);
        previous.unwrap_or_else(|| Arc::new(Checkpoints::from_opened(Vec::new())))
    }
}
