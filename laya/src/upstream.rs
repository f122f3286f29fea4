//! Which upstream `laya[serve]` release layad answers like. One value, chosen once per server
//! (`[compat] upstream`), passed down to every rule that differs between releases: validation order
//! and texts, routing and language detection, answer rendering, `usage`, `/health`.
//!
//! Where the releases differ by a yes or no, the answer is a field of [`Differences`], which
//! [`Upstream::differences`] fills per release with one exhaustive `match`: adding a release is
//! adding a variant and a whole `Differences` value for it, so the compiler stops until every
//! difference is decided for it. Differences that are more than a yes or no (the detector, texts,
//! how the state is counted) are `match`es on [`Upstream`] where they happen, without a wildcard arm.

use std::fmt;
use std::str::FromStr;

/// An upstream release whose wire contract layad reproduces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Upstream {
    /// `laya[serve]==0.3.20`.
    V0_3_20,
    /// `laya[serve]==0.4.15`: what `pip install "laya[serve]"` installs today; the default.
    #[default]
    V0_4_15,
}

impl Upstream {
    /// Every supported release, oldest first.
    pub const ALL: [Upstream; 2] = [Upstream::V0_3_20, Upstream::V0_4_15];

    /// The version as upstream writes it (`"0.4.15"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Upstream::V0_3_20 => "0.3.20",
            Upstream::V0_4_15 => "0.4.15",
        }
    }

    /// Whether this release has the data rows release `first` introduced (a table's `since`
    /// column, as in `laya/data/stopwords.txt`): each release keeps the rows of those before it.
    pub const fn has_rows_since(self, first: Upstream) -> bool {
        self.place() >= first.place()
    }

    /// This release's place among the releases, oldest first.
    const fn place(self) -> u8 {
        match self {
            Upstream::V0_3_20 => 0,
            Upstream::V0_4_15 => 1,
        }
    }

    /// What this release does where the releases differ by a yes or no.
    pub const fn differences(self) -> Differences {
        match self {
            Upstream::V0_3_20 => Differences {
                state_required: false,
                option_counts_checked: false,
                question_ids_nonblank: false,
                instructions_required: false,
                option_order: false,
                label_keys_distinct: false,
                state_tokenized_whole: false,
                task_field: false,
                language_hints: false,
                unpublished_models_refused: false,
                mixed_segment: false,
                nordic_overlap: false,
                x_jev_confidence: false,
                usage_details: false,
                tournaments: false,
                jev_profiles: false,
                batch_route: false,
                health_brief_without_key: false,
                inference_timing: false,
            },
            Upstream::V0_4_15 => Differences {
                state_required: true,
                option_counts_checked: true,
                question_ids_nonblank: true,
                instructions_required: true,
                option_order: true,
                label_keys_distinct: true,
                state_tokenized_whole: true,
                task_field: true,
                language_hints: true,
                unpublished_models_refused: true,
                mixed_segment: true,
                nordic_overlap: true,
                x_jev_confidence: true,
                usage_details: true,
                tournaments: true,
                jev_profiles: true,
                batch_route: true,
                health_brief_without_key: true,
                inference_timing: true,
            },
        }
    }
}

/// What one release does where the releases differ by a yes or no (spec: `docs/spec/`, each
/// release's file). One field per difference, named for what the release does when it is `true`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Differences {
    /// A request without `state` (or with `null`) is refused with 400 (0.3.20 renders it as `null`).
    pub state_required: bool,
    /// A choice's option count is checked against the cap before any model work.
    pub option_counts_checked: bool,
    /// A question id that is empty after stripping is refused.
    pub question_ids_nonblank: bool,
    /// `instructions` must be a non-empty string (not `None`, not blank).
    pub instructions_required: bool,
    /// A question's `option_order` is read (and refused when it is not a permutation).
    pub option_order: bool,
    /// Choice labels whose answer keys JSON writes alike are refused.
    pub label_keys_distinct: bool,
    /// The state is tokenized whole and cut to the row afterwards (0.3.20 tokenizes only the end
    /// of it that can reach the row).
    pub state_tokenized_whole: bool,
    /// The request's `task` names a checkpoint.
    pub task_field: bool,
    /// The request's `lang`/`lang_guess` steer routing.
    pub language_hints: bool,
    /// A `model` naming a source no one publishes is refused instead of routed automatically.
    pub unpublished_models_refused: bool,
    /// The detection object has `mixed_segment`.
    pub mixed_segment: bool,
    /// The Nordic stop words shared between languages count as shared.
    pub nordic_overlap: bool,
    /// Each answer carries `x_jev_confidence`.
    pub x_jev_confidence: bool,
    /// `usage` reports the state's tokens, dropped tokens and truncation.
    pub usage_details: bool,
    /// A choice wider than the cap is read in groups (`LAYA_TOURNAMENT_GROUP`).
    pub tournaments: bool,
    /// The `jev-strict` and `jev` output profiles exist.
    pub jev_profiles: bool,
    /// `POST /v1/systemone/batch` exists.
    pub batch_route: bool,
    /// `/health` tells a caller without the key only `{"status":"ok"}` when a key is required.
    pub health_brief_without_key: bool,
    /// The answer reports its inference time (`Server-Timing: inference`, `X-Inference-Time-Ms`).
    pub inference_timing: bool,
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A version string that names no supported release.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unsupported upstream version {0:?}; layad reproduces \"0.4.15\" (the default) and \"0.3.20\"")]
pub struct UnknownUpstream(pub String);

impl FromStr for Upstream {
    type Err = UnknownUpstream;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Upstream::ALL
            .into_iter()
            .find(|v| v.as_str() == s.trim())
            .ok_or_else(|| UnknownUpstream(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_supported_releases_only() {
        assert_eq!("0.4.15".parse(), Ok(Upstream::V0_4_15));
        assert_eq!(" 0.3.20".parse(), Ok(Upstream::V0_3_20));
        assert_eq!(Upstream::default(), Upstream::V0_4_15);
        let err = "0.4.14"
            .parse::<Upstream>()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("\"0.4.14\""), "{err}");
        assert!(Upstream::V0_4_15.differences().batch_route && !Upstream::V0_3_20.differences().batch_route);
    }
}
