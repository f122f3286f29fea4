//! A stand-in for the Hugging Face Hub and its LFS CDN on 127.0.0.1, serving the bundle repo built
//! from `tests/fixtures/hf-cache` with the real Hub's headers, `Range` support and injected faults.
//!
//! The Hub answers `GET /api/models/{repo}/revision/{rev}` and `HEAD|GET /{repo}/resolve/{rev}/{path}`:
//! small files directly with `ETag: "<git blob id>"`, LFS files (`*.safetensors`, and the multilingual
//! tokenizer, which is over the Hub's 10 MB git limit in the real bundle) with a 302 to the CDN,
//! `X-Linked-Etag: "<sha256>"` and `X-Linked-Size`. The CDN listens on another port, as the real one
//! is another host, so tests can see which requests carried the token.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use bytes::Bytes;
use futures::StreamExt;
use sha1::Sha1;
use sha2::{Digest, Sha256};

/// The repo every test fetches.
pub const REPO: &str = "convaiinnovations/laya";

/// One file of the served repo.
#[derive(Clone, Debug)]
pub struct RepoFile {
    /// Path in the repo.
    pub path: String,
    /// Content.
    pub bytes: Bytes,
    /// Served through LFS and the CDN.
    pub lfs: bool,
    /// SHA-256 of the content.
    pub sha256: String,
    /// Git blob id of the content.
    pub git_sha1: String,
}

impl RepoFile {
    fn new(path: &str, bytes: Vec<u8>, lfs: bool) -> Self {
        let sha256 = hex(&Sha256::digest(&bytes));
        let git_sha1 = git_blob_id(&bytes);
        Self {
            path: path.to_owned(),
            bytes: Bytes::from(bytes),
            lfs,
            sha256,
            git_sha1,
        }
    }

    /// The name the real Hub gives this file's blob: the LFS SHA-256, else the git blob id.
    pub fn etag(&self) -> &str {
        if self.lfs { &self.sha256 } else { &self.git_sha1 }
    }
}

/// Something to go wrong, once or always, for one file.
#[derive(Clone, Debug)]
pub enum Fault {
    /// The first download of `path` stops after `after` bytes, the connection cut.
    CutOnce {
        /// Path in the repo.
        path: &'static str,
        /// Bytes sent before the cut.
        after: usize,
    },
    /// Every download of `path` has one byte changed (same length).
    Corrupt {
        /// Path in the repo.
        path: &'static str,
    },
    /// Downloads of `path` ignore `Range` and send the whole file with 200.
    IgnoreRange {
        /// Path in the repo.
        path: &'static str,
    },
}

/// How the mock is set up.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    /// The commit `main` points at; a fixed one when absent.
    pub commit: Option<String>,
    /// Faults to inject.
    pub faults: Vec<Fault>,
    /// Repo paths left out of the repo.
    pub omit: Vec<&'static str>,
    /// A token the Hub requires (`Authorization: Bearer <token>`); none = public repo.
    pub require_token: Option<String>,
}

/// Which listener saw a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    /// The Hub (API and resolve).
    Hub,
    /// The LFS CDN.
    Cdn,
}

/// One request as the mock saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Hub or CDN.
    pub server: Server,
    /// `GET`, `HEAD`.
    pub method: Method,
    /// The URL path.
    pub path: String,
    /// The `Authorization` header.
    pub authorization: Option<String>,
    /// The `Range` header.
    pub range: Option<String>,
}

struct Shared {
    commit: String,
    files: Vec<RepoFile>,
    faults: Vec<Fault>,
    cut_done: AtomicBool,
    require_token: Option<String>,
    cdn_base: String,
    seen: Mutex<Vec<Seen>>,
}

/// A running mock Hub and CDN.
pub struct MockHub {
    /// What `HF_ENDPOINT` would be.
    pub endpoint: String,
    /// The commit `main` points at.
    pub commit: String,
    shared: Arc<Shared>,
}

/// The commit `main` points at unless [`Setup::commit`] says otherwise.
pub const DEFAULT_COMMIT: &str = "5eed0f1c7ee5c0de5eed0f1c7ee5c0de0320abcd";

impl MockHub {
    /// Starts the Hub and the CDN on ephemeral ports of 127.0.0.1.
    pub async fn start(setup: Setup) -> Self {
        let commit = setup.commit.unwrap_or_else(|| DEFAULT_COMMIT.to_owned());
        let files = repo_files()
            .into_iter()
            .filter(|f| !setup.omit.contains(&f.path.as_str()))
            .collect();
        let hub_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind hub");
        let cdn_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind cdn");
        let hub_addr = hub_listener.local_addr().expect("hub addr");
        let cdn_addr = cdn_listener.local_addr().expect("cdn addr");
        let shared = Arc::new(Shared {
            commit: commit.clone(),
            files,
            faults: setup.faults,
            cut_done: AtomicBool::new(false),
            require_token: setup.require_token,
            cdn_base: format!("http://{cdn_addr}"),
            seen: Mutex::new(Vec::new()),
        });
        let hub = Router::new()
            .route("/api/models/{owner}/{name}/revision/{rev}", get(revision))
            .route("/{owner}/{name}/resolve/{rev}/{*path}", any(resolve))
            .with_state(shared.clone());
        let cdn = Router::new()
            .route("/lfs/{sha256}", any(lfs_object))
            .with_state(shared.clone());
        tokio::spawn(async move { axum::serve(hub_listener, hub).await.expect("hub server") });
        tokio::spawn(async move { axum::serve(cdn_listener, cdn).await.expect("cdn server") });
        Self {
            endpoint: format!("http://{hub_addr}"),
            commit,
            shared,
        }
    }

    /// Every request so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().expect("lock").clone()
    }

    /// Forgets the requests seen so far.
    pub fn forget(&self) {
        self.shared.seen.lock().expect("lock").clear();
    }

    /// The served file at `path`.
    pub fn file(&self, path: &str) -> RepoFile {
        self.shared
            .files
            .iter()
            .find(|f| f.path == path)
            .cloned()
            .unwrap_or_else(|| panic!("the mock repo has no {path}"))
    }
}

/// The fixture snapshot directory (the one `refs/main` names).
pub fn fixture_snapshot() -> PathBuf {
    let repo =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hf-cache/hub/models--convaiinnovations--laya");
    let commit = std::fs::read_to_string(repo.join("refs/main")).expect("fixture refs/main");
    repo.join("snapshots").join(commit.trim())
}

/// The fixture's files, plus two a checkpoint does not need (a real repo has them too).
fn repo_files() -> Vec<RepoFile> {
    let root = fixture_snapshot();
    let mut files = Vec::new();
    let mut pending = vec![root.clone()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read fixture dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(&root)
                .expect("under root")
                .to_string_lossy()
                .into_owned();
            let bytes = std::fs::read(&path).expect("read fixture file");
            let lfs = rel.ends_with(".safetensors") || rel == "multilingual/tokenizer/tokenizer.json";
            files.push(RepoFile::new(&rel, bytes, lfs));
        }
    }
    files.push(RepoFile::new("README.md", b"# Laya\n".to_vec(), false));
    files.push(RepoFile::new(
        ".gitattributes",
        b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n".to_vec(),
        false,
    ));
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

fn record(shared: &Shared, server: Server, method: &Method, path: String, headers: &HeaderMap) {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    shared.seen.lock().expect("lock").push(Seen {
        server,
        method: method.clone(),
        path,
        authorization: text(header::AUTHORIZATION),
        range: text(header::RANGE),
    });
}

fn authorized(shared: &Shared, headers: &HeaderMap) -> bool {
    match &shared.require_token {
        None => true,
        Some(token) => {
            headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {token}"))
        }
    }
}

fn hub_error(status: StatusCode, code: &str) -> Response {
    (status, [("x-error-code", code)], format!("{code}\n")).into_response()
}

async fn revision(
    State(shared): State<Arc<Shared>>,
    UrlPath((owner, name, rev)): UrlPath<(String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    record(
        &shared,
        Server::Hub,
        &method,
        format!("/api/models/{owner}/{name}/revision/{rev}"),
        &headers,
    );
    if !authorized(&shared, &headers) {
        return hub_error(StatusCode::UNAUTHORIZED, "RepoNotFound");
    }
    if format!("{owner}/{name}") != REPO {
        return hub_error(StatusCode::NOT_FOUND, "RepoNotFound");
    }
    if rev != "main" && rev != shared.commit {
        return hub_error(StatusCode::NOT_FOUND, "RevisionNotFound");
    }
    let siblings: Vec<serde_json::Value> = shared
        .files
        .iter()
        .map(|f| serde_json::json!({ "rfilename": f.path }))
        .collect();
    let body = serde_json::json!({
        "_id": "0123456789abcdef01234567",
        "id": REPO,
        "sha": shared.commit,
        "private": false,
        "siblings": siblings,
    });
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

async fn resolve(
    State(shared): State<Arc<Shared>>,
    UrlPath((owner, name, rev, path)): UrlPath<(String, String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    record(
        &shared,
        Server::Hub,
        &method,
        format!("/{owner}/{name}/resolve/{rev}/{path}"),
        &headers,
    );
    if !authorized(&shared, &headers) {
        return hub_error(StatusCode::UNAUTHORIZED, "RepoNotFound");
    }
    if format!("{owner}/{name}") != REPO || (rev != "main" && rev != shared.commit) {
        return hub_error(StatusCode::NOT_FOUND, "RevisionNotFound");
    }
    let Some(file) = shared.files.iter().find(|f| f.path == path) else {
        return hub_error(StatusCode::NOT_FOUND, "EntryNotFound");
    };
    if file.lfs {
        let pointer = format!(
            "version https://git-lfs.github.com/spec/v1\noid sha256:{}\nsize {}\n",
            file.sha256,
            file.bytes.len()
        );
        return Response::builder()
            .status(StatusCode::FOUND)
            .header(header::LOCATION, format!("{}/lfs/{}", shared.cdn_base, file.sha256))
            .header(header::ETAG, format!("\"{}\"", git_blob_id(pointer.as_bytes())))
            .header("x-linked-etag", format!("\"{}\"", file.sha256))
            .header("x-linked-size", file.bytes.len().to_string())
            .header("x-repo-commit", shared.commit.as_str())
            .body(Body::empty())
            .expect("redirect response");
    }
    serve_bytes(
        &shared,
        file,
        &method,
        &headers,
        vec![
            (header::ETAG.as_str(), format!("\"{}\"", file.git_sha1)),
            ("x-repo-commit", shared.commit.clone()),
        ],
    )
}

async fn lfs_object(
    State(shared): State<Arc<Shared>>,
    UrlPath(sha256): UrlPath<String>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    record(&shared, Server::Cdn, &method, format!("/lfs/{sha256}"), &headers);
    match shared.files.iter().find(|f| f.lfs && f.sha256 == sha256) {
        Some(file) => serve_bytes(
            &shared,
            file,
            &method,
            &headers,
            vec![(header::ETAG.as_str(), format!("\"{}\"", file.sha256))],
        ),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The file's bytes (or the range asked for), with the faults that apply to it.
fn serve_bytes(
    shared: &Shared,
    file: &RepoFile,
    method: &Method,
    headers: &HeaderMap,
    extra: Vec<(&str, String)>,
) -> Response {
    let applies = |fault: &Fault| match fault {
        Fault::CutOnce { path, .. } | Fault::Corrupt { path } | Fault::IgnoreRange { path } => *path == file.path,
    };
    let faults: Vec<&Fault> = shared.faults.iter().filter(|f| applies(f)).collect();
    let mut bytes = file.bytes.to_vec();
    if faults.iter().any(|f| matches!(f, Fault::Corrupt { .. })) {
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
    }
    let ignore_range = faults.iter().any(|f| matches!(f, Fault::IgnoreRange { .. }));
    let start = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|_| !ignore_range);
    let total = bytes.len();
    let mut builder = Response::builder();
    for (name, value) in extra {
        builder = builder.header(name, value);
    }
    let body = match start {
        Some(start) if start >= total => {
            return builder
                .status(StatusCode::RANGE_NOT_SATISFIABLE)
                .header(header::CONTENT_RANGE, format!("bytes */{total}"))
                .body(Body::empty())
                .expect("416 response");
        }
        Some(start) => {
            builder = builder
                .status(StatusCode::PARTIAL_CONTENT)
                .header(header::CONTENT_RANGE, format!("bytes {start}-{}/{total}", total - 1));
            bytes.split_off(start)
        }
        None => {
            builder = builder.status(StatusCode::OK);
            bytes
        }
    };
    builder = builder
        .header(header::CONTENT_LENGTH, body.len().to_string())
        .header(header::ACCEPT_RANGES, "bytes");
    if method == Method::HEAD {
        return builder.body(Body::empty()).expect("head response");
    }
    let cut = faults.iter().find_map(|f| match f {
        Fault::CutOnce { after, .. } => Some(*after),
        _ => None,
    });
    if let Some(after) = cut
        && !shared.cut_done.swap(true, Ordering::SeqCst)
    {
        let sent = Bytes::from(body).slice(..after);
        // Let the first part reach the client, then fail the body: hyper drops the connection
        // with fewer bytes than Content-Length announced.
        let stream = futures::stream::iter([Ok::<Bytes, std::io::Error>(sent)]).chain(futures::stream::once(async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "cut by the mock",
            ))
        }));
        return builder.body(Body::from_stream(stream)).expect("cut response");
    }
    builder.body(Body::from(body)).expect("response")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Git's blob id: SHA-1 of `blob <len>\0<bytes>`.
pub fn git_blob_id(bytes: &[u8]) -> String {
    let mut hasher = Sha1::new();
    hasher.update(format!("blob {}\0", bytes.len()).as_bytes());
    hasher.update(bytes);
    hex(&hasher.finalize())
}
