//! What a pool can take: the shape of a job, the forward it needs, and the pool's limits (from its
//! configuration, narrowed by what its workers report). Pure; the scheduler places jobs by it.

use laya::prompt::Row;
use layad_config::PoolConfig;
use layad_proto::bucket_for;

use crate::worker_kind;

/// A job's own shape: what decides which pools can hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobShape {
    /// Questions, one row each.
    pub questions: usize,
    /// Tokens in the longest row.
    pub longest: usize,
}

impl JobShape {
    /// The shape of `rows`.
    pub fn of(rows: &[Row]) -> Self {
        Self {
            questions: rows.len(),
            longest: rows.iter().map(|r| r.ids.len()).max().unwrap_or(0),
        }
    }
}

/// A forward's shape: rows in the batch and the length every row is padded to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ForwardShape {
    /// Rows in the forward.
    pub rows: usize,
    /// Tokens per row after padding.
    pub padded_len: usize,
}

impl ForwardShape {
    /// Tokens the forward runs, padding included.
    pub fn tokens(self) -> usize {
        self.rows * self.padded_len
    }
}

/// What a pool takes: from its configuration, narrowed by what its workers report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Most questions (rows) of one request.
    pub max_questions: usize,
    /// Most rows in one forward pass.
    pub max_rows: usize,
    /// Longest row, when limited.
    pub max_len: Option<usize>,
    /// Fixed row lengths rows are padded to, ascending (empty: none).
    pub buckets: Vec<u32>,
    /// Most padded tokens in one forward pass.
    pub max_batch_tokens: usize,
}

impl Capabilities {
    /// What the configuration allows, before any worker reported its own limits; a worker kind
    /// may allow fewer rows per forward (a Neural Engine pool runs one, so it never takes more
    /// than one question).
    pub fn from_config(config: &PoolConfig) -> Self {
        let max_rows = worker_kind::spec(config.worker)
            .max_rows
            .map_or(config.max_rows, |own| own.min(config.max_rows)) as usize;
        Self {
            max_questions: config.max_questions.map_or(max_rows, |q| q as usize).min(max_rows),
            max_rows,
            max_len: config.max_tokens.map(|t| t as usize),
            buckets: config.buckets.clone(),
            max_batch_tokens: config.max_batch_tokens as usize,
        }
    }

    /// Narrowed by a worker's own limits (Describe). A worker with fixed buckets keeps only the
    /// configured ones it has (all of its own when none are configured).
    pub fn narrowed_by(&self, worker: &layad_proto::pb::Capabilities) -> Self {
        let max_rows = self.max_rows.min(worker.max_rows as usize).max(1);
        let max_len = match (self.max_len, worker.max_len as usize) {
            (limit, 0) => limit,
            (Some(limit), own) => Some(limit.min(own)),
            (None, own) => Some(own),
        };
        let own = &worker.length_buckets;
        let buckets = match (self.buckets.is_empty(), own.is_empty()) {
            (_, true) => self.buckets.clone(),
            (true, false) => own.clone(),
            (false, false) => self.buckets.iter().copied().filter(|b| own.contains(b)).collect(),
        };
        Self {
            max_questions: self.max_questions.min(max_rows),
            max_rows,
            max_len,
            buckets,
            max_batch_tokens: self.max_batch_tokens.min(worker.max_batch_tokens as usize),
        }
    }

    /// The length a row of `longest` tokens runs at: its bucket, or itself without buckets; `None`
    /// when it is too long for this pool.
    pub fn padded_len(&self, longest: usize) -> Option<usize> {
        let padded = if self.buckets.is_empty() {
            longest
        } else {
            bucket_for(longest, &self.buckets)? as usize
        };
        self.max_len.is_none_or(|max| longest <= max).then_some(padded)
    }

    /// The forward a job of `shape` needs here, or why this pool cannot hold it.
    pub fn holds(&self, shape: JobShape) -> Result<ForwardShape, String> {
        if shape.questions > self.max_questions {
            return Err(format!("takes at most {} question(s)", self.max_questions));
        }
        let Some(padded_len) = self.padded_len(shape.longest) else {
            let longest = self.longest_row().unwrap_or_default();
            return Err(format!("takes rows of at most {longest} tokens"));
        };
        let forward = ForwardShape {
            rows: shape.questions,
            padded_len,
        };
        if forward.rows * forward.padded_len > self.max_batch_tokens {
            return Err(format!(
                "runs at most {} padded tokens per forward",
                self.max_batch_tokens
            ));
        }
        Ok(forward)
    }

    /// The longest row the pool takes (its largest bucket or its `max_len`), when limited.
    fn longest_row(&self) -> Option<usize> {
        self.buckets
            .last()
            .map(|&b| b as usize)
            .into_iter()
            .chain(self.max_len)
            .min()
    }

    /// How specialised the pool is: fewer questions, then shorter rows, first.
    pub fn specialisation(&self) -> (usize, usize) {
        (self.max_questions, self.longest_row().unwrap_or(usize::MAX))
    }

    /// `1 question, 128 tokens` for reasons and `/health`.
    pub fn describe(&self) -> String {
        let questions = if self.max_questions == 1 {
            "1 question".to_owned()
        } else {
            format!("{} questions", self.max_questions)
        };
        match self.specialisation().1 {
            usize::MAX => questions,
            longest => format!("{questions} of {longest} tokens"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn general() -> Capabilities {
        Capabilities::from_config(&PoolConfig::named("general"))
    }

    fn short() -> Capabilities {
        let mut config = PoolConfig::named("short");
        config.max_questions = Some(1);
        config.max_tokens = Some(128);
        Capabilities::from_config(&config)
    }

    fn shape(questions: usize, longest: usize) -> JobShape {
        JobShape { questions, longest }
    }

    #[test]
    fn a_short_pool_holds_one_short_question_only() {
        assert!(short().holds(shape(1, 128)).is_ok());
        assert_eq!(
            short().holds(shape(2, 40)).expect_err("two questions"),
            "takes at most 1 question(s)"
        );
        assert_eq!(
            short().holds(shape(1, 129)).expect_err("129 tokens"),
            "takes rows of at most 128 tokens"
        );
        assert!(general().holds(shape(4, 500)).is_ok());
        assert!(short().specialisation() < general().specialisation());
    }

    #[test]
    fn buckets_pad_rows_and_bound_their_length() {
        let mut config = PoolConfig::named("bucketed");
        config.buckets = vec![64, 96, 128];
        let caps = Capabilities::from_config(&config);
        let padded = |longest| caps.holds(shape(1, longest)).map(|f| f.padded_len);
        assert_eq!(padded(1), Ok(64));
        assert_eq!(padded(64), Ok(64));
        assert_eq!(padded(65), Ok(96));
        assert_eq!(padded(128), Ok(128));
        assert!(padded(129).is_err());
        // Padded tokens count against the forward budget.
        config.max_batch_tokens = 200;
        let caps = Capabilities::from_config(&config);
        assert!(caps.holds(shape(3, 65)).is_err());
        assert!(caps.holds(shape(3, 64)).is_ok());
    }

    #[test]
    fn a_worker_narrows_what_the_configuration_allows() {
        let mut config = PoolConfig::named("ane");
        config.worker = layad_config::WorkerKind::Ane;
        config.buckets = vec![64, 128];
        let configured = Capabilities::from_config(&config);
        assert_eq!(
            configured.max_questions, 1,
            "a Neural Engine pool runs one row per forward"
        );
        let own = layad_proto::pb::Capabilities {
            max_rows: 1,
            max_batch_tokens: 128,
            max_len: 128,
            length_buckets: vec![64, 96, 128],
        };
        let narrowed = configured.narrowed_by(&own);
        assert_eq!(narrowed.buckets, [64, 128]);
        assert_eq!(narrowed.max_len, Some(128));
        assert_eq!(narrowed.max_batch_tokens, 128);
        // Without configured buckets the worker's own apply.
        assert_eq!(general().narrowed_by(&own).buckets, [64, 96, 128]);
        assert_eq!(general().narrowed_by(&own).max_questions, 1);
    }
}
