//! What a fetch needs to know — Hub address, token, offline switch, cache directory, progress
//! style — and how it is read from `huggingface_hub`'s environment variables.

use std::path::PathBuf;

use crate::error::FetchError;

/// The public Hugging Face Hub, used when `HF_ENDPOINT` is unset.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// How download progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressStyle {
    /// An `indicatif` bar on stderr when stderr is a terminal, else [`ProgressStyle::Lines`].
    Auto,
    /// An `indicatif` bar on stderr (indicatif draws nothing where stderr is not a terminal).
    Bar,
    /// Plain lines on stderr: start, every 10 % (or 64 MiB when the size is unknown), end.
    Lines,
    /// The same lines as `tracing` events (for `serve`, whose stderr is the structured log).
    Log,
    /// Nothing.
    Silent,
}

/// Everything [`crate::fetch`] needs besides the checkpoint names.
#[derive(Clone, Debug)]
pub struct FetchOptions {
    /// Base URL of the Hub, without a trailing `/` (`HF_ENDPOINT`).
    pub endpoint: String,
    /// Sent as `Authorization: Bearer …` to the Hub (never to the CDN it redirects to).
    pub token: Option<String>,
    /// Refuse every network request (`HF_HUB_OFFLINE`, or `--offline`).
    pub offline: bool,
    /// The hub cache: the directory holding `models--convaiinnovations--laya`.
    pub cache_dir: PathBuf,
    /// How progress is shown.
    pub progress: ProgressStyle,
    /// How many times an interrupted download or a failed request is retried (resuming with
    /// `Range`) before the fetch gives up.
    pub retries: u32,
    /// A PEM file of root certificates trusted besides the built-in Mozilla roots (a proxy that
    /// inspects TLS): `REQUESTS_CA_BUNDLE`, else `CURL_CA_BUNDLE` (as huggingface_hub's `requests`
    /// reads them), else `SSL_CERT_FILE`.
    pub ca_bundle: Option<PathBuf>,
}

impl FetchOptions {
    /// Options from the process environment, read like `huggingface_hub` reads it: `HF_ENDPOINT`,
    /// `HF_TOKEN` (else the token file `huggingface-cli login` writes), `HF_HUB_OFFLINE`, and the
    /// cache from `HF_HUB_CACHE` / `HF_HOME` ([`laya::checkpoint::hf_hub_cache_dir`]).
    pub fn from_env() -> Result<Self, FetchError> {
        let lookup = |name: &str| std::env::var(name).ok();
        let cache_dir = laya::checkpoint::hf_hub_cache_dir().ok_or(FetchError::NoCacheDir)?;
        Self::from_lookup(lookup, cache_dir)
    }

    /// Options from variables given by `lookup`, with the cache directory already resolved.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>, cache_dir: PathBuf) -> Result<Self, FetchError> {
        let set = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let endpoint = match set("HF_ENDPOINT") {
            Some(url) => {
                let url = url.trim().trim_end_matches('/').to_owned();
                if !(url.starts_with("https://") || url.starts_with("http://")) {
                    return Err(FetchError::BadEndpoint(url));
                }
                url
            }
            None => DEFAULT_ENDPOINT.to_owned(),
        };
        let token = match set("HF_TOKEN") {
            Some(token) => Some(token.trim().to_owned()),
            None => stored_token(&set)?,
        };
        // huggingface_hub's `_is_true`: 1, ON, YES, TRUE in any case.
        let offline = set("HF_HUB_OFFLINE")
            .is_some_and(|v| matches!(v.trim().to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE"));
        let ca_bundle = ["REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"]
            .into_iter()
            .find_map(&set)
            .map(PathBuf::from);
        Ok(Self {
            endpoint,
            token,
            offline,
            cache_dir,
            progress: ProgressStyle::Auto,
            retries: 5,
            ca_bundle,
        })
    }
}

/// The token `huggingface-cli login` stored: `HF_TOKEN_PATH`, else `$HF_HOME/token`, else
/// `$XDG_CACHE_HOME/huggingface/token`, else `~/.cache/huggingface/token`. Absent file = no token.
fn stored_token(set: &impl Fn(&str) -> Option<String>) -> Result<Option<String>, FetchError> {
    let path = set("HF_TOKEN_PATH").map(PathBuf::from).or_else(|| {
        let home = set("HF_HOME").map(PathBuf::from).or_else(|| {
            set("XDG_CACHE_HOME")
                .map(|xdg| PathBuf::from(xdg).join("huggingface"))
                .or_else(|| set("HOME").map(|home| PathBuf::from(home).join(".cache").join("huggingface")))
        });
        home.map(|home| home.join("token"))
    });
    let Some(path) = path else {
        return Ok(None);
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text.trim().to_owned()).filter(|t| !t.is_empty())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(FetchError::Io { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(vars: &[(&str, &str)]) -> Result<FetchOptions, FetchError> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let lookup = move |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        FetchOptions::from_lookup(lookup, PathBuf::from("/cache"))
    }

    #[test]
    fn defaults_to_the_public_hub_online_without_token() {
        let o = options(&[]).expect("options");
        assert_eq!(o.endpoint, "https://huggingface.co");
        assert_eq!(o.token, None);
        assert!(!o.offline);
        assert_eq!(o.cache_dir, PathBuf::from("/cache"));
    }

    #[test]
    fn endpoint_loses_its_trailing_slash_and_must_be_http() {
        let o = options(&[("HF_ENDPOINT", "https://hf-mirror.example/ ")]).expect("options");
        assert_eq!(o.endpoint, "https://hf-mirror.example");
        let err = options(&[("HF_ENDPOINT", "hf-mirror.example")]).expect_err("no scheme");
        assert!(err.to_string().contains("HF_ENDPOINT"), "{err}");
    }

    #[test]
    fn offline_accepts_huggingface_hub_truthy_values_only() {
        for value in ["1", "on", "YES", "True"] {
            assert!(
                options(&[("HF_HUB_OFFLINE", value)]).expect("options").offline,
                "{value}"
            );
        }
        for value in ["0", "off", "no", "", "2"] {
            assert!(
                !options(&[("HF_HUB_OFFLINE", value)]).expect("options").offline,
                "{value}"
            );
        }
    }

    #[test]
    fn extra_roots_come_from_the_ca_bundle_variables_in_requests_order() {
        assert_eq!(options(&[]).expect("options").ca_bundle, None);
        let o = options(&[("SSL_CERT_FILE", "/ssl.pem"), ("CURL_CA_BUNDLE", "/curl.pem")]).expect("options");
        assert_eq!(o.ca_bundle, Some(PathBuf::from("/curl.pem")));
        let o = options(&[("SSL_CERT_FILE", "/ssl.pem"), ("REQUESTS_CA_BUNDLE", "/requests.pem")]).expect("options");
        assert_eq!(o.ca_bundle, Some(PathBuf::from("/requests.pem")));
        let o = options(&[("SSL_CERT_FILE", "/ssl.pem")]).expect("options");
        assert_eq!(o.ca_bundle, Some(PathBuf::from("/ssl.pem")));
    }

    #[test]
    fn token_comes_from_hf_token_then_the_login_token_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("token"), "hf_stored\n").expect("write token");
        let home = dir.path().to_str().expect("utf-8 path");
        let o = options(&[("HF_HOME", home)]).expect("options");
        assert_eq!(o.token.as_deref(), Some("hf_stored"));
        let o = options(&[("HF_HOME", home), ("HF_TOKEN", "hf_env")]).expect("options");
        assert_eq!(o.token.as_deref(), Some("hf_env"));
        let o = options(&[("HF_HOME", &format!("{home}/absent"))]).expect("options");
        assert_eq!(o.token, None);
    }
}
