//! Talking to the Hub the way `huggingface_hub` does: the revision API for the commit and file list,
//! `HEAD …/resolve/<commit>/<path>` for a file's ETag and size, `GET` (with `Range`) for its bytes.
//!
//! Two clients: metadata requests follow same-origin redirects only (a renamed repo) and stop at the
//! CDN redirect of an LFS file, whose headers carry the LFS ETag; downloads follow every redirect, and
//! reqwest drops the `Authorization` header when a redirect leaves the Hub's origin.

use std::collections::HashSet;
use std::time::Duration;

use reqwest::header::{CONTENT_LENGTH, ETAG, HeaderMap, RANGE};
use reqwest::redirect::Policy;
use reqwest::{Certificate, Client, Response, Url};
use serde::Deserialize;

use crate::error::FetchError;
use crate::options::FetchOptions;

/// The header with the commit a resolved file belongs to.
const REPO_COMMIT: &str = "x-repo-commit";
/// The LFS object's ETag (its SHA-256), when the file is stored in LFS.
const LINKED_ETAG: &str = "x-linked-etag";
/// The LFS object's size, when the file is stored in LFS.
const LINKED_SIZE: &str = "x-linked-size";
/// Most redirects followed for one request.
const MAX_REDIRECTS: usize = 10;

/// What the revision API says about a repo at a revision.
#[derive(Debug)]
pub(crate) struct RepoInfo {
    /// The commit the revision points at.
    pub(crate) commit: String,
    /// Every file path in the repo at that commit.
    pub(crate) files: HashSet<String>,
}

/// What `HEAD …/resolve/…` says about one file.
#[derive(Debug)]
pub(crate) struct FileMeta {
    /// The blob name: the LFS SHA-256 for LFS files, the git blob SHA-1 otherwise.
    pub(crate) etag: String,
    /// The file's size, when announced.
    pub(crate) size: Option<u64>,
    /// Whether the file is stored in LFS (the Hub sent `X-Linked-Etag`).
    pub(crate) lfs: bool,
}

#[derive(Deserialize)]
struct RevisionJson {
    sha: String,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Deserialize)]
struct Sibling {
    rfilename: String,
}

/// A connection to one Hub endpoint.
#[derive(Debug)]
pub(crate) struct Hub {
    endpoint: Url,
    token: Option<String>,
    retries: u32,
    metadata: Client,
    download: Client,
}

impl Hub {
    /// Clients for `options.endpoint` with its token.
    pub(crate) fn new(options: &FetchOptions) -> Result<Self, FetchError> {
        let endpoint = Url::parse(&options.endpoint).map_err(|_| FetchError::BadEndpoint(options.endpoint.clone()))?;
        let user_agent = concat!("layad-hub/", env!("CARGO_PKG_VERSION"));
        let same_origin_only = Policy::custom(|attempt| {
            let first = attempt.previous().first();
            let same = first.is_some_and(|first| {
                first.host_str() == attempt.url().host_str()
                    && first.port_or_known_default() == attempt.url().port_or_known_default()
            });
            if attempt.previous().len() > MAX_REDIRECTS {
                attempt.error("too many redirects")
            } else if same {
                attempt.follow()
            } else {
                attempt.stop()
            }
        });
        let extra_roots = match &options.ca_bundle {
            Some(path) => read_roots(path)?,
            None => Vec::new(),
        };
        let build = |policy: Policy| {
            let mut builder = Client::builder()
                .user_agent(user_agent)
                .redirect(policy)
                .connect_timeout(Duration::from_secs(10))
                // Per read, not per request: a download of gigabytes may take long, a stall may not.
                .read_timeout(Duration::from_secs(60));
            for root in &extra_roots {
                builder = builder.add_root_certificate(root.clone());
            }
            builder.build().map_err(|e| FetchError::Client(e.to_string()))
        };
        Ok(Self {
            endpoint,
            token: options.token.clone(),
            retries: options.retries,
            metadata: build(same_origin_only)?,
            download: build(Policy::limited(MAX_REDIRECTS))?,
        })
    }

    /// `{endpoint}/{segments…}`, each segment percent-encoded.
    fn url<'a>(&self, segments: impl IntoIterator<Item = &'a str>) -> Url {
        let mut url = self.endpoint.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// `{endpoint}/{repo}/resolve/{revision}/{path}`.
    pub(crate) fn resolve_url(&self, repo: &str, revision: &str, path: &str) -> Url {
        let segments = repo.split('/').chain(["resolve", revision]).chain(path.split('/'));
        self.url(segments)
    }

    fn authorize(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Runs `attempt` until it succeeds, fails for good, or the retries are used up.
    async fn with_retries<T, F, Fut>(&self, mut attempt: F) -> Result<T, FetchError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, FetchError>>,
    {
        let mut tries = 0;
        loop {
            match attempt().await {
                Err(e) if e.is_transient() && tries < self.retries => {
                    tokio::time::sleep(backoff(tries)).await;
                    tries += 1;
                }
                result => return result,
            }
        }
    }

    /// `GET {endpoint}/api/models/{repo}/revision/{revision}`: the commit and the file list.
    pub(crate) async fn repo_info(&self, repo: &str, revision: &str) -> Result<RepoInfo, FetchError> {
        let url = self.url(
            ["api", "models"]
                .into_iter()
                .chain(repo.split('/'))
                .chain(["revision", revision]),
        );
        let text = url.to_string();
        let body = self
            .with_retries(|| async {
                let response = self
                    .authorize(self.metadata.get(url.clone()))
                    .send()
                    .await
                    .map_err(|e| FetchError::transport(&text, e))?;
                let response = success(response, &text)?;
                response.bytes().await.map_err(|e| FetchError::transport(&text, e))
            })
            .await?;
        let json: RevisionJson = serde_json::from_slice(&body).map_err(|e| FetchError::BadResponse {
            url: text.clone(),
            problem: format!("not the Hub's revision JSON ({e})"),
        })?;
        if json.sha.is_empty() || !json.sha.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(FetchError::BadResponse {
                url: text,
                problem: format!("\"sha\" is {:?}, not a commit id", json.sha),
            });
        }
        Ok(RepoInfo {
            commit: json.sha,
            files: json.siblings.into_iter().map(|s| s.rfilename).collect(),
        })
    }

    /// `HEAD …/resolve/{commit}/{path}`: the file's ETag (blob name), size and LFS-ness.
    pub(crate) async fn file_meta(&self, repo: &str, commit: &str, path: &str) -> Result<FileMeta, FetchError> {
        let url = self.resolve_url(repo, commit, path);
        let text = url.to_string();
        let headers = self
            .with_retries(|| async {
                let response = self
                    .authorize(self.metadata.head(url.clone()))
                    .send()
                    .await
                    .map_err(|e| FetchError::transport(&text, e))?;
                // A redirect to the CDN is the answer for LFS files: its headers are what we need.
                if response.status().is_redirection() {
                    return Ok(response.headers().clone());
                }
                Ok(success(response, &text)?.headers().clone())
            })
            .await?;
        parse_file_meta(&headers, commit).map_err(|problem| FetchError::BadResponse { url: text, problem })
    }

    /// `GET` of a resolve URL from byte `from` on (a `Range` request when `from > 0`).
    pub(crate) async fn get(&self, url: &Url, from: u64) -> Result<Response, FetchError> {
        let mut request = self.authorize(self.download.get(url.clone()));
        if from > 0 {
            request = request.header(RANGE, format!("bytes={from}-"));
        }
        request.send().await.map_err(|e| FetchError::transport(url.as_str(), e))
    }
}

/// The certificates of a PEM bundle.
fn read_roots(path: &std::path::Path) -> Result<Vec<Certificate>, FetchError> {
    let pem = std::fs::read(path).map_err(FetchError::io(path))?;
    let roots = Certificate::from_pem_bundle(&pem).unwrap_or_default();
    if roots.is_empty() {
        return Err(FetchError::Client(format!(
            "{} (a CA bundle from REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE or SSL_CERT_FILE) holds no PEM certificate",
            path.display()
        )));
    }
    Ok(roots)
}

/// The response if its status is a success, else the status error.
fn success(response: Response, url: &str) -> Result<Response, FetchError> {
    if response.status().is_success() {
        Ok(response)
    } else {
        Err(FetchError::status(url, response.status()))
    }
}

/// The wait before retry number `tries` (0-based): 0.5 s doubling, at most 8 s.
pub(crate) fn backoff(tries: u32) -> Duration {
    Duration::from_millis(500u64.saturating_mul(1 << tries.min(4)))
}

/// Reads ETag, size and LFS-ness from resolve headers, as `huggingface_hub` does.
fn parse_file_meta(headers: &HeaderMap, commit: &str) -> Result<FileMeta, String> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(announced) = text(REPO_COMMIT)
        && announced != commit
    {
        return Err(format!("the file belongs to commit {announced}, not {commit}"));
    }
    let linked = text(LINKED_ETAG);
    let raw = linked
        .or_else(|| text(ETAG.as_str()))
        .ok_or("no ETag; the file's content cannot be identified")?;
    let etag = normalize_etag(raw);
    // The ETag becomes a file name: refuse anything that could step outside blobs/.
    if etag.is_empty() || !etag.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(format!("ETag {raw:?} is not a content hash"));
    }
    let size_header = if linked.is_some() {
        text(LINKED_SIZE)
    } else {
        text(CONTENT_LENGTH.as_str())
    };
    let size = match size_header {
        Some(size) => Some(
            size.parse::<u64>()
                .map_err(|_| format!("size {size:?} is not a number"))?,
        ),
        None => None,
    };
    Ok(FileMeta {
        etag: etag.to_owned(),
        size,
        lfs: linked.is_some(),
    })
}

/// `W/"abc"` or `"abc"` → `abc`.
fn normalize_etag(raw: &str) -> &str {
    raw.strip_prefix("W/").unwrap_or(raw).trim_matches('"')
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).expect("header value"));
        }
        map
    }

    #[test]
    fn lfs_files_are_named_by_the_linked_etag_and_size() {
        let meta = parse_file_meta(
            &headers(&[
                ("etag", "\"1111111111111111111111111111111111111111\""),
                (
                    "x-linked-etag",
                    "\"c4ab9b72f820dd912fc8c40ac3ff7b4220a60093e418c8e21a33862e96169fc1\"",
                ),
                ("x-linked-size", "2198508"),
                ("content-length", "1093"),
                ("x-repo-commit", "abc"),
            ]),
            "abc",
        )
        .expect("meta");
        assert_eq!(
            meta.etag,
            "c4ab9b72f820dd912fc8c40ac3ff7b4220a60093e418c8e21a33862e96169fc1"
        );
        assert_eq!(meta.size, Some(2198508));
        assert!(meta.lfs);
    }

    #[test]
    fn small_files_are_named_by_their_etag_weak_or_not() {
        for etag in [
            "\"0123456789abcdef0123456789abcdef01234567\"",
            "W/\"0123456789abcdef0123456789abcdef01234567\"",
        ] {
            let meta = parse_file_meta(&headers(&[("etag", etag), ("content-length", "509")]), "abc").expect("meta");
            assert_eq!(meta.etag, "0123456789abcdef0123456789abcdef01234567");
            assert_eq!(meta.size, Some(509));
            assert!(!meta.lfs);
        }
    }

    #[test]
    fn refuses_missing_or_path_like_etags_and_other_commits() {
        assert!(parse_file_meta(&headers(&[]), "abc").is_err());
        let err = parse_file_meta(&headers(&[("etag", "\"../../x\"")]), "abc").expect_err("path-like");
        assert!(err.contains("not a content hash"), "{err}");
        let err =
            parse_file_meta(&headers(&[("etag", "\"ab\""), ("x-repo-commit", "def")]), "abc").expect_err("commit");
        assert!(err.contains("commit def"), "{err}");
    }

    #[test]
    fn urls_are_built_like_huggingface_hub() {
        let options = FetchOptions {
            endpoint: "https://hub.example/mirror".to_owned(),
            token: None,
            offline: false,
            cache_dir: "/c".into(),
            progress: crate::options::ProgressStyle::Silent,
            retries: 0,
            ca_bundle: None,
        };
        let hub = Hub::new(&options).expect("hub");
        assert_eq!(
            hub.resolve_url(
                "convaiinnovations/laya",
                "main",
                "multilingual/tokenizer/tokenizer.json"
            )
            .as_str(),
            "https://hub.example/mirror/convaiinnovations/laya/resolve/main/multilingual/tokenizer/tokenizer.json"
        );
        assert_eq!(
            hub.resolve_url("o/r", "refs/pr/1", "a b.json").as_str(),
            "https://hub.example/mirror/o/r/resolve/refs%2Fpr%2F1/a%20b.json"
        );
    }

    #[test]
    fn a_ca_bundle_without_certificates_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bundle = dir.path().join("ca.pem");
        std::fs::write(&bundle, "not a certificate\n").expect("write");
        let err = read_roots(&bundle).expect_err("no certificate");
        assert!(err.to_string().contains("ca.pem"), "{err}");
        let err = read_roots(&dir.path().join("absent.pem")).expect_err("no file");
        assert!(matches!(err, FetchError::Io { .. }), "{err:?}");
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(0), Duration::from_millis(500));
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(4), Duration::from_secs(8));
        assert_eq!(backoff(30), Duration::from_secs(8));
    }
}
