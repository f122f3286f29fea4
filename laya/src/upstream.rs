//! Which upstream `laya[serve]` release layad answers like. One value, chosen once per server
//! (`[compat] upstream`), passed down to every rule that differs between releases: validation order
//! and texts, routing and language detection, answer rendering, `usage`, `/health`.
//!
//! Adding a release is adding a variant and answering, in each `match` the compiler then points
//! at, what that release does.

use std::fmt;
use std::str::FromStr;

/// An upstream release whose wire contract layad reproduces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

    /// At least 0.4.x: the release line with request controls, the new detector and richer usage.
    pub fn is_0_4(self) -> bool {
        self >= Upstream::V0_4_15
    }
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
        assert!(Upstream::V0_4_15.is_0_4() && !Upstream::V0_3_20.is_0_4());
    }
}
