//! `layad_hub::fetch` against a mock Hub on 127.0.0.1: the cache layout huggingface_hub writes, no
//! request for what is cached, resume after a cut, corrupt downloads refused, offline, tokens.

mod mock_hub;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use axum::http::Method;
use laya::checkpoint::{Checkpoint, find_in_hf_cache};
use laya::routing::CheckpointName;
use layad_hub::{FetchError, FetchOptions, FileState, ProgressStyle, fetch};
use mock_hub::{Fault, MockHub, Server, Setup};

const REPO_FOLDER: &str = "models--convaiinnovations--laya";

fn options(hub: &MockHub, cache: &Path) -> FetchOptions {
    FetchOptions {
        endpoint: hub.endpoint.clone(),
        token: None,
        offline: false,
        cache_dir: cache.to_path_buf(),
        progress: ProgressStyle::Silent,
        retries: 2,
        ca_bundle: None,
    }
}

fn repo_dir(cache: &Path) -> PathBuf {
    cache.join(REPO_FOLDER)
}

fn blob_names(cache: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(repo_dir(cache).join("blobs"))
        .map(|entries| {
            entries
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn state_of(fetched: &[layad_hub::FetchedCheckpoint], repo_path: &str) -> FileState {
    fetched
        .iter()
        .flat_map(|c| &c.files)
        .find(|f| f.repo_path == repo_path)
        .unwrap_or_else(|| panic!("{repo_path} not in the result"))
        .state
}

/// Requests for the LFS object of `repo_path` on the CDN.
fn cdn_gets(hub: &MockHub, repo_path: &str) -> Vec<mock_hub::Seen> {
    let path = format!("/lfs/{}", hub.file(repo_path).sha256);
    hub.seen()
        .into_iter()
        .filter(|s| s.server == Server::Cdn && s.method == Method::GET && s.path == path)
        .collect()
}

#[tokio::test]
async fn a_fresh_fetch_writes_the_layout_huggingface_hub_writes() {
    let hub = MockHub::start(Setup::default()).await;
    let cache = tempfile::tempdir().expect("tempdir");
    let fetched = fetch(&CheckpointName::ALL, &options(&hub, cache.path()))
        .await
        .expect("fetch");

    let refs = std::fs::read_to_string(repo_dir(cache.path()).join("refs/main")).expect("refs/main");
    assert_eq!(refs, hub.commit);
    assert_eq!(fetched.len(), 3);
    for checkpoint in &fetched {
        let found = find_in_hf_cache(cache.path(), checkpoint.name).expect("found in the cache");
        assert_eq!(found, checkpoint.location);
        assert_eq!(found.revision(), Some(hub.commit.as_str()));
        let opened = Checkpoint::open(found).expect("the fetched checkpoint opens");
        assert_eq!(opened.weights.size, checkpoint.files[1].size);
    }

    // Every needed file is a relative symlink into blobs/, named by the ETag the Hub sent: the LFS
    // SHA-256 for LFS files, the git blob id otherwise.
    let mut expected_blobs = Vec::new();
    for checkpoint in &fetched {
        for file in &checkpoint.files {
            let served = hub.file(&file.repo_path);
            let pointer = repo_dir(cache.path())
                .join("snapshots")
                .join(&hub.commit)
                .join(&file.repo_path);
            let target = std::fs::read_link(&pointer).expect("a symlink");
            let ups = "../".repeat(1 + file.repo_path.split('/').count());
            assert_eq!(
                target,
                PathBuf::from(format!("{ups}blobs/{}", served.etag())),
                "{}",
                file.repo_path
            );
            assert_eq!(
                std::fs::read(&pointer).expect("read"),
                served.bytes.as_ref(),
                "{}",
                file.repo_path
            );
            assert_eq!(file.size, served.bytes.len() as u64);
            expected_blobs.push(served.etag().to_owned());
        }
    }
    expected_blobs.sort();
    expected_blobs.dedup();
    assert_eq!(
        blob_names(cache.path()),
        expected_blobs,
        "no .incomplete left, nothing else kept"
    );
    assert_eq!(
        hub.file("model.safetensors").etag(),
        "c4ab9b72f820dd912fc8c40ac3ff7b4220a60093e418c8e21a33862e96169fc1",
        "LFS blobs carry the fixture cache's names"
    );

    // english and typed-decisions share weights and tokenizer in the fixture: fetched once.
    assert!(matches!(
        state_of(&fetched, "model.safetensors"),
        FileState::Downloaded { .. }
    ));
    assert_eq!(
        state_of(&fetched, "typed-decisions/model.safetensors"),
        FileState::BlobReused
    );
    assert_eq!(
        state_of(&fetched, "typed-decisions/tokenizer/tokenizer.json"),
        FileState::BlobReused
    );
    // Each blob crossed the network once; files a checkpoint does not need were never asked for.
    let resolve_prefix = format!("/convaiinnovations/laya/resolve/{}/", hub.commit);
    let mut downloads: HashMap<String, usize> = HashMap::new();
    for seen in hub.seen().iter().filter(|s| s.method == Method::GET) {
        let blob = match seen.server {
            Server::Cdn => seen.path.trim_start_matches("/lfs/").to_owned(),
            Server::Hub => match seen.path.strip_prefix(&resolve_prefix) {
                Some(path) if !hub.file(path).lfs => hub.file(path).etag().to_owned(),
                _ => continue,
            },
        };
        *downloads.entry(blob).or_default() += 1;
    }
    let mut downloaded: Vec<&String> = downloads.keys().collect();
    downloaded.sort();
    assert_eq!(downloaded, expected_blobs.iter().collect::<Vec<_>>());
    assert!(downloads.values().all(|&n| n == 1), "{downloads:?}");
    for unneeded in ["README.md", ".gitattributes"] {
        assert!(
            !hub.seen().iter().any(|s| s.path.ends_with(unneeded)),
            "{unneeded} was requested"
        );
    }
    let transferred: u64 = fetched.iter().map(|c| c.transferred_bytes()).sum();
    let unique_bytes: u64 = expected_blobs
        .iter()
        .map(|etag| {
            std::fs::metadata(repo_dir(cache.path()).join("blobs").join(etag))
                .expect("blob")
                .len()
        })
        .sum();
    assert_eq!(transferred, unique_bytes);
}

#[tokio::test]
async fn a_complete_cache_makes_no_file_request() {
    let hub = MockHub::start(Setup::default()).await;
    let cache = tempfile::tempdir().expect("tempdir");
    let options = options(&hub, cache.path());
    fetch(&[CheckpointName::English], &options).await.expect("first fetch");
    hub.forget();

    let again = fetch(&[CheckpointName::English, CheckpointName::English], &options)
        .await
        .expect("second fetch");
    assert_eq!(again.len(), 1, "duplicates are fetched once");
    assert!(again[0].files.iter().all(|f| f.state == FileState::InSnapshot));
    let seen = hub.seen();
    assert_eq!(seen.len(), 1, "only the revision lookup: {seen:?}");
    assert!(
        seen[0]
            .path
            .starts_with("/api/models/convaiinnovations/laya/revision/main")
    );
}

#[tokio::test]
async fn a_cut_download_resumes_with_range() {
    let cut_at = 700_000;
    let hub = MockHub::start(Setup {
        faults: vec![Fault::CutOnce {
            path: "model.safetensors",
            after: cut_at,
        }],
        ..Setup::default()
    })
    .await;
    let cache = tempfile::tempdir().expect("tempdir");
    let fetched = fetch(&[CheckpointName::English], &options(&hub, cache.path()))
        .await
        .expect("fetch survives the cut");

    let gets = cdn_gets(&hub, "model.safetensors");
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert_eq!(gets[0].range, None);
    assert_eq!(gets[1].range.as_deref(), Some(format!("bytes={cut_at}-").as_str()));
    let size = hub.file("model.safetensors").bytes.len() as u64;
    assert_eq!(
        state_of(&fetched, "model.safetensors"),
        FileState::Downloaded { transferred: size }
    );
    Checkpoint::open(fetched[0].location.clone()).expect("the resumed checkpoint opens");
}

#[tokio::test]
async fn a_partial_file_from_an_earlier_run_is_resumed() {
    let hub = MockHub::start(Setup::default()).await;
    let cache = tempfile::tempdir().expect("tempdir");
    let weights = hub.file("model.safetensors");
    let blobs = repo_dir(cache.path()).join("blobs");
    std::fs::create_dir_all(&blobs).expect("mkdir");
    let kept = 1_000_000;
    std::fs::write(
        blobs.join(format!("{}.incomplete", weights.sha256)),
        &weights.bytes[..kept],
    )
    .expect("write");

    let fetched = fetch(&[CheckpointName::English], &options(&hub, cache.path()))
        .await
        .expect("fetch");
    let gets = cdn_gets(&hub, "model.safetensors");
    assert_eq!(gets.len(), 1);
    assert_eq!(gets[0].range.as_deref(), Some("bytes=1000000-"));
    assert_eq!(
        state_of(&fetched, "model.safetensors"),
        FileState::Downloaded {
            transferred: (weights.bytes.len() - kept) as u64
        }
    );
    assert_eq!(
        std::fs::read(blobs.join(&weights.sha256)).expect("blob"),
        weights.bytes.as_ref()
    );
}

#[tokio::test]
async fn a_server_that_ignores_range_restarts_cleanly() {
    let hub = MockHub::start(Setup {
        faults: vec![Fault::IgnoreRange {
            path: "model.safetensors",
        }],
        ..Setup::default()
    })
    .await;
    let cache = tempfile::tempdir().expect("tempdir");
    let weights = hub.file("model.safetensors");
    let blobs = repo_dir(cache.path()).join("blobs");
    std::fs::create_dir_all(&blobs).expect("mkdir");
    // Garbage, so only a real restart from byte 0 can produce the right blob.
    std::fs::write(
        blobs.join(format!("{}.incomplete", weights.sha256)),
        vec![0xAA; 500_000],
    )
    .expect("write");

    let fetched = fetch(&[CheckpointName::English], &options(&hub, cache.path()))
        .await
        .expect("fetch");
    let gets = cdn_gets(&hub, "model.safetensors");
    assert_eq!(gets.len(), 1);
    assert_eq!(gets[0].range.as_deref(), Some("bytes=500000-"), "it asked to resume");
    assert_eq!(
        state_of(&fetched, "model.safetensors"),
        FileState::Downloaded {
            transferred: weights.bytes.len() as u64
        }
    );
    assert_eq!(
        std::fs::read(blobs.join(&weights.sha256)).expect("blob"),
        weights.bytes.as_ref()
    );
}

#[tokio::test]
async fn corrupt_weights_are_refused_named_and_deleted() {
    let hub = MockHub::start(Setup {
        faults: vec![Fault::Corrupt {
            path: "model.safetensors",
        }],
        ..Setup::default()
    })
    .await;
    let cache = tempfile::tempdir().expect("tempdir");
    let err = fetch(&[CheckpointName::English], &options(&hub, cache.path()))
        .await
        .expect_err("a corrupt download must fail");
    let message = err.to_string();
    assert!(matches!(err, FetchError::Checksum { .. }), "{err:?}");
    assert!(message.starts_with("model.safetensors: SHA-256"), "{message}");
    assert!(message.contains(&hub.file("model.safetensors").sha256), "{message}");

    let sha = hub.file("model.safetensors").sha256;
    let names = blob_names(cache.path());
    assert!(
        !names.iter().any(|n| n.starts_with(&sha)),
        "no blob or partial left: {names:?}"
    );
    let pointer = repo_dir(cache.path())
        .join("snapshots")
        .join(&hub.commit)
        .join("model.safetensors");
    assert!(
        std::fs::symlink_metadata(pointer).is_err(),
        "no snapshot entry for the bad file"
    );
    assert!(
        !repo_dir(cache.path()).join("refs/main").exists(),
        "refs/main only after success"
    );
    assert!(find_in_hf_cache(cache.path(), CheckpointName::English).is_err());
}

#[tokio::test]
async fn a_corrupt_small_file_fails_its_git_blob_id() {
    let hub = MockHub::start(Setup {
        faults: vec![Fault::Corrupt {
            path: "rl_agent_config.json",
        }],
        ..Setup::default()
    })
    .await;
    let cache = tempfile::tempdir().expect("tempdir");
    let err = fetch(&[CheckpointName::English], &options(&hub, cache.path()))
        .await
        .expect_err("a corrupt download must fail");
    assert!(
        err.to_string().starts_with("rl_agent_config.json: git blob SHA-1"),
        "{err}"
    );
    assert!(!blob_names(cache.path()).iter().any(|n| n.ends_with(".incomplete")));
}

#[tokio::test]
async fn offline_refuses_to_download_and_makes_no_request() {
    let hub = MockHub::start(Setup::default()).await;
    let cache = tempfile::tempdir().expect("tempdir");
    let mut offline = options(&hub, cache.path());
    offline.offline = true;
    let err = fetch(&[CheckpointName::English, CheckpointName::Multilingual], &offline)
        .await
        .expect_err("nothing is cached");
    let message = err.to_string();
    assert!(matches!(err, FetchError::Offline { .. }), "{err:?}");
    assert!(message.contains("HF_HUB_OFFLINE"), "{message}");
    assert!(message.contains("english multilingual"), "{message}");
    assert!(hub.seen().is_empty(), "offline made requests: {:?}", hub.seen());

    // Once cached, offline answers from the cache, still without a request.
    fetch(&[CheckpointName::English], &options(&hub, cache.path()))
        .await
        .expect("online fetch");
    hub.forget();
    let cached = fetch(&[CheckpointName::English], &offline).await.expect("cached");
    assert_eq!(cached[0].location.revision(), Some(hub.commit.as_str()));
    assert!(hub.seen().is_empty());
}

#[tokio::test]
async fn the_token_goes_to_the_hub_as_bearer_and_not_to_the_cdn() {
    let hub = MockHub::start(Setup {
        require_token: Some("hf_secret".to_owned()),
        ..Setup::default()
    })
    .await;
    let cache = tempfile::tempdir().expect("tempdir");
    let err = fetch(&[CheckpointName::English], &options(&hub, cache.path()))
        .await
        .expect_err("the repo needs a token");
    assert!(matches!(err, FetchError::Status { status: 401, .. }), "{err:?}");
    assert!(err.to_string().contains("HF_TOKEN"), "{err}");
    hub.forget();

    let mut with_token = options(&hub, cache.path());
    with_token.token = Some("hf_secret".to_owned());
    fetch(&[CheckpointName::English], &with_token)
        .await
        .expect("fetch with token");
    let seen = hub.seen();
    assert!(seen.iter().any(|s| s.server == Server::Cdn));
    for s in &seen {
        match s.server {
            Server::Hub => assert_eq!(s.authorization.as_deref(), Some("Bearer hf_secret"), "{s:?}"),
            Server::Cdn => assert_eq!(s.authorization, None, "the token leaked to the CDN: {s:?}"),
        }
    }
}

#[tokio::test]
async fn when_main_moves_unchanged_files_are_linked_not_downloaded() {
    let cache = tempfile::tempdir().expect("tempdir");
    let old = MockHub::start(Setup::default()).await;
    fetch(&[CheckpointName::English], &options(&old, cache.path()))
        .await
        .expect("first");
    let new_commit = "feedfacefeedfacefeedfacefeedfacefeedface";
    let new = MockHub::start(Setup {
        commit: Some(new_commit.to_owned()),
        ..Setup::default()
    })
    .await;
    let fetched = fetch(&[CheckpointName::English], &options(&new, cache.path()))
        .await
        .expect("second");
    assert!(fetched[0].files.iter().all(|f| f.state == FileState::BlobReused));
    assert!(
        new.seen()
            .iter()
            .all(|s| s.method != Method::GET || s.path.starts_with("/api/")),
        "only HEADs for the files: {:?}",
        new.seen()
    );
    let refs = std::fs::read_to_string(repo_dir(cache.path()).join("refs/main")).expect("refs");
    assert_eq!(refs, new_commit);
    assert_eq!(
        find_in_hf_cache(cache.path(), CheckpointName::English)
            .expect("found")
            .revision(),
        Some(new_commit)
    );
    assert!(
        repo_dir(cache.path()).join("snapshots").join(&old.commit).is_dir(),
        "old snapshot kept"
    );
}

#[tokio::test]
async fn a_file_missing_from_the_repo_is_named_before_any_download() {
    let hub = MockHub::start(Setup {
        omit: vec!["typed-decisions/tokenizer/tokenizer.json"],
        ..Setup::default()
    })
    .await;
    let cache = tempfile::tempdir().expect("tempdir");
    let err = fetch(&CheckpointName::ALL, &options(&hub, cache.path()))
        .await
        .expect_err("incomplete repo");
    assert!(
        err.to_string()
            .contains("has no typed-decisions/tokenizer/tokenizer.json"),
        "{err}"
    );
    assert!(
        hub.seen().iter().all(|s| s.path.starts_with("/api/")),
        "{:?}",
        hub.seen()
    );
}

#[tokio::test]
async fn two_concurrent_fetches_download_each_blob_once() {
    let hub = MockHub::start(Setup::default()).await;
    let cache = tempfile::tempdir().expect("tempdir");
    let options = options(&hub, cache.path());
    let (a, b) = tokio::join!(
        fetch(&[CheckpointName::English], &options),
        fetch(&[CheckpointName::English], &options)
    );
    let (a, b) = (a.expect("first"), b.expect("second"));
    assert_eq!(a[0].location, b[0].location);
    assert_eq!(cdn_gets(&hub, "model.safetensors").len(), 1);
    Checkpoint::open(a[0].location.clone()).expect("opens");
}

#[tokio::test]
async fn ensure_cached_fetches_only_what_is_missing() {
    let hub = MockHub::start(Setup::default()).await;
    let cache = tempfile::tempdir().expect("tempdir");
    let options = options(&hub, cache.path());
    fetch(&[CheckpointName::English], &options).await.expect("english");
    hub.forget();

    let both = layad_hub::ensure_cached(&[CheckpointName::Multilingual, CheckpointName::English], &options)
        .await
        .expect("ensure");
    let names: Vec<CheckpointName> = both.iter().map(|c| c.name).collect();
    assert_eq!(names, [CheckpointName::Multilingual, CheckpointName::English]);
    assert!(both[1].files.iter().all(|f| f.state == FileState::InSnapshot));
    assert!(matches!(both[0].files[1].state, FileState::Downloaded { .. }));
    let english_requests: Vec<_> = hub
        .seen()
        .into_iter()
        .filter(|s| s.path.contains("/resolve/") && !s.path.contains("/multilingual/"))
        .collect();
    assert!(english_requests.is_empty(), "{english_requests:?}");

    // Everything cached: not a single request, not even the revision lookup.
    hub.forget();
    layad_hub::ensure_cached(&CheckpointName::ALL[..2], &options)
        .await
        .expect("cached");
    assert!(hub.seen().is_empty(), "{:?}", hub.seen());

    // A snapshot missing one file counts as missing and is completed.
    let tokenizer = repo_dir(cache.path())
        .join("snapshots")
        .join(&hub.commit)
        .join("tokenizer/tokenizer_config.json");
    std::fs::remove_file(&tokenizer).expect("remove");
    let repaired = layad_hub::ensure_cached(&[CheckpointName::English], &options)
        .await
        .expect("repair");
    assert_eq!(
        state_of(&repaired, "tokenizer/tokenizer_config.json"),
        FileState::BlobReused
    );
    assert!(tokenizer.is_file());

    let mut offline = options.clone();
    offline.offline = true;
    let err = layad_hub::ensure_cached(&[CheckpointName::TypedDecisions], &offline)
        .await
        .expect_err("typed-decisions is not cached");
    assert!(err.to_string().contains("typed-decisions"), "{err}");
}
