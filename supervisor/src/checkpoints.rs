//! The checkpoints the supervisor serves: found where the configuration says (a directory or the
//! Hugging Face cache) and opened once at start-up for their tokenizers, limits and temperatures.

use laya::checkpoint::{Checkpoint, CheckpointError, Location, find_in_hf_cache, hf_hub_cache_dir};
use laya::routing::CheckpointName;
use layad_config::{CheckpointSource, Config};

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
    }
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

/// The opened checkpoints the server answers with.
pub struct Checkpoints {
    opened: Vec<(CheckpointName, Checkpoint)>,
}

impl Checkpoints {
    /// Locates and opens every checkpoint `config` serves, reporting each one's outcome (for
    /// `layad check`, which shows them all rather than stopping at the first failure).
    pub fn open_each(config: &Config) -> Vec<(CheckpointName, Result<Checkpoint, CheckpointError>)> {
        config
            .served_checkpoints()
            .into_iter()
            .map(|(name, source)| (name, locate(name, source).and_then(Checkpoint::open)))
            .collect()
    }

    /// Opens every served checkpoint, failing on the first that does not open.
    pub fn open(config: &Config) -> Result<Self, OpenError> {
        let mut opened = Vec::new();
        for (name, result) in Self::open_each(config) {
            let checkpoint = result.map_err(|source| OpenError { name, source })?;
            opened.push((name, checkpoint));
        }
        Ok(Self { opened })
    }

    /// Already opened checkpoints (tests, tools).
    pub fn from_opened(opened: Vec<(CheckpointName, Checkpoint)>) -> Self {
        Self { opened }
    }

    /// The checkpoint with this name, if served.
    pub fn get(&self, name: CheckpointName) -> Option<&Checkpoint> {
        self.opened.iter().find(|(n, _)| *n == name).map(|(_, c)| c)
    }

    /// The served checkpoints, in upstream's order of configuration.
    pub fn iter(&self) -> impl Iterator<Item = (CheckpointName, &Checkpoint)> {
        self.opened.iter().map(|(n, c)| (*n, c))
    }
}
