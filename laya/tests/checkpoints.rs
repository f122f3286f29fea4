//! Checkpoint discovery and loading against the fixture Hugging Face cache, and what a user sees
//! when a file is missing or malformed: an error that names the file and the problem.

use std::path::{Path, PathBuf};

use laya::checkpoint::{Checkpoint, CheckpointError, Location, Origin, find_in_hf_cache};
use laya::routing::CheckpointName;

fn fixture_cache() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/hf-cache/hub"))
}

/// A writable copy of the fixture cache (symlinks resolved into plain files).
fn copy_cache() -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).expect("mkdir");
        for entry in std::fs::read_dir(from).expect("read_dir") {
            let entry = entry.expect("entry");
            let target = to.join(entry.file_name());
            if std::fs::metadata(entry.path()).expect("stat").is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).expect("copy");
            }
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    copy(&fixture_cache(), dir.path());
    dir
}

fn snapshot(cache: &Path) -> PathBuf {
    let repo = cache.join("models--convaiinnovations--laya");
    let rev = std::fs::read_to_string(repo.join("refs/main")).expect("refs/main");
    repo.join("snapshots").join(rev.trim())
}

#[test]
fn finds_the_bundle_and_its_subfolders_with_revision_and_hash() {
    let cache = fixture_cache();
    let english = Checkpoint::open(find_in_hf_cache(&cache, CheckpointName::English).expect("english")).expect("opens");
    let typed =
        Checkpoint::open(find_in_hf_cache(&cache, CheckpointName::TypedDecisions).expect("typed")).expect("opens");
    let multi = find_in_hf_cache(&cache, CheckpointName::Multilingual).expect("multilingual");
    assert_eq!(
        english.location.revision(),
        Some("7a1e5eed0f1c7ee5c0de5eed0f1c7ee5c0de0320")
    );
    assert_eq!(
        multi.origin,
        Origin::HfCache {
            repo: "convaiinnovations/laya".to_owned(),
            subfolder: Some("multilingual".to_owned()),
            revision: "7a1e5eed0f1c7ee5c0de5eed0f1c7ee5c0de0320".to_owned()
        }
    );
    // The blob name of an LFS file in the HF cache is its SHA-256: what we hashed must agree.
    let blob = std::fs::read_link(english.location.dir.join("model.safetensors")).expect("snapshot files are symlinks");
    assert_eq!(
        blob.file_name().and_then(|n| n.to_str()),
        Some(english.weights.sha256.as_str())
    );
    assert_eq!(
        english.weights.sha256, typed.weights.sha256,
        "typed-decisions reuses the english weights"
    );
    assert_eq!(english.n_act(), Some(2));
    assert_eq!((english.agent.max_len, english.agent.head_max_len), (96, 40));
    assert_eq!(english.tokenizer.special().mask_text, "[MASK]");
    // typed-decisions carries a transformers-4 style encoder config (flat thetas, `layer_norm_eps`)
    // with its own local theta; everything else reads the same as english's transformers-5 layout.
    assert_eq!(
        (typed.encoder.global_rope_theta, typed.encoder.local_rope_theta),
        (160_000.0, 20_000.0)
    );
    let mut same = typed.encoder.clone();
    same.local_rope_theta = english.encoder.local_rope_theta;
    assert_eq!(english.encoder, same);
}

#[test]
fn a_standalone_repo_is_used_when_the_bundle_lacks_the_subfolder() {
    let cache = copy_cache();
    let bundle = snapshot(cache.path());
    let standalone = cache.path().join("models--convaiinnovations--laya-multilingual");
    std::fs::create_dir_all(standalone.join("refs")).expect("mkdir");
    std::fs::write(standalone.join("refs/main"), "e4e9ddf21a7b1903b7acffd8814ad4307bf63a67").expect("write");
    std::fs::rename(
        bundle.join("multilingual"),
        standalone.join("snapshots/e4e9ddf21a7b1903b7acffd8814ad4307bf63a67"),
    )
    .or_else(|_| {
        std::fs::create_dir_all(standalone.join("snapshots"))?;
        std::fs::rename(
            bundle.join("multilingual"),
            standalone.join("snapshots/e4e9ddf21a7b1903b7acffd8814ad4307bf63a67"),
        )
    })
    .expect("move");
    let location = find_in_hf_cache(cache.path(), CheckpointName::Multilingual).expect("found standalone");
    assert_eq!(location.revision(), Some("e4e9ddf21a7b1903b7acffd8814ad4307bf63a67"));
    Checkpoint::open(location).expect("opens");
}

/// A safetensors file: `header`'s length, `header`, then `data_len` zero bytes.
fn safetensors_file(header: &str, data_len: usize) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + data_len, 0);
    bytes
}

fn open_error(mutate: impl FnOnce(&Path)) -> String {
    let cache = copy_cache();
    let dir = snapshot(cache.path());
    mutate(&dir);
    let err: CheckpointError = find_in_hf_cache(cache.path(), CheckpointName::English)
        .and_then(Checkpoint::open)
        .expect_err("must fail");
    err.to_string()
}

#[test]
fn opened_unhashed_it_is_the_same_checkpoint_and_the_bytes_hash_to_the_same_sha256() {
    let cache = fixture_cache();
    let location = find_in_hf_cache(&cache, CheckpointName::English).expect("english");
    let opened = Checkpoint::open(location.clone()).expect("opens");
    let unhashed = Checkpoint::open_unhashed(location).expect("opens");
    assert_eq!(unhashed.weights.sha256, "");
    assert_eq!(
        (&unhashed.weights.tensors, unhashed.weights.size, &unhashed.weights.path),
        (&opened.weights.tensors, opened.weights.size, &opened.weights.path)
    );
    assert_eq!(unhashed.agent.max_len, opened.agent.max_len);
    let bytes = std::fs::read(&unhashed.weights.path).expect("read");
    assert_eq!(laya::checkpoint::sha256_hex(&bytes), opened.weights.sha256);
    assert_ne!(laya::checkpoint::sha256_hex(&bytes[1..]), opened.weights.sha256);
    // A missing weights file is refused, as by `open`.
    let dir = copy_cache();
    let location = find_in_hf_cache(dir.path(), CheckpointName::English).expect("english");
    std::fs::remove_file(location.dir.join("model.safetensors")).expect("rm");
    let err = Checkpoint::open_unhashed(location).expect_err("no weights").to_string();
    assert!(err.contains("model.safetensors: missing"), "{err}");
}

#[test]
fn missing_or_malformed_files_are_named() {
    let err = open_error(|d| std::fs::remove_file(d.join("model.safetensors")).expect("rm"));
    assert!(err.contains("model.safetensors: missing"), "{err}");
    let err = open_error(|d| std::fs::write(d.join("rl_agent_config.json"), "{\"encoder\": ").expect("write"));
    assert!(err.contains("rl_agent_config.json: not valid JSON"), "{err}");
    let err =
        open_error(|d| std::fs::write(d.join("encoder/config.json"), "{\"hidden_size\": \"big\"}").expect("write"));
    assert!(
        err.contains("encoder/config.json: 'hidden_size' must be a positive integer, got 'big'"),
        "{err}"
    );
    let err = open_error(|d| std::fs::write(d.join("model.safetensors"), b"\x10\0\0\0\0\0\0\0{}").expect("write"));
    assert!(
        err.contains("model.safetensors: header length 16 does not fit in the file"),
        "{err}"
    );
    let err = open_error(|d| std::fs::write(d.join("model.safetensors"), b"\x02\0\0\0\0\0\0\0{}").expect("write"));
    assert!(
        err.contains("model.safetensors: missing 'encoder.' parameters"),
        "{err}"
    );
    let err = open_error(|d| std::fs::write(d.join("model.safetensors"), b"\x04\0\0\0\0\0\0\0{no}").expect("write"));
    assert!(err.contains("model.safetensors: header is not valid JSON"), "{err}");
    // Valid JSON that the safetensors crate refuses: an unknown dtype, and a byte length that is
    // not the shape times the dtype's size.
    for header in [
        r#"{"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}}"#,
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
    ] {
        let err =
            open_error(|d| std::fs::write(d.join("model.safetensors"), safetensors_file(header, 4)).expect("write"));
        assert!(
            err.contains("model.safetensors: header does not describe safetensors tensors"),
            "{header}: {err}"
        );
    }
    // A download cut short: the header promises more data than the file holds.
    let err = open_error(|d| {
        let path = d.join("model.safetensors");
        let bytes = std::fs::read(&path).expect("read");
        std::fs::write(&path, &bytes[..bytes.len() - 1]).expect("write");
    });
    assert!(err.contains("model.safetensors: the header's tensors need"), "{err}");
    assert!(err.ends_with("(truncated)"), "{err}");
    let err = open_error(|d| {
        std::fs::write(d.join("tokenizer/tokenizer_config.json"), "{\"cls_token\": \"[CLS]\"}").expect("write")
    });
    assert!(err.contains("tokenizer_config.json: no 'sep_token'"), "{err}");
    let err = open_error(|d| std::fs::write(d.join("tokenizer/tokenizer.json"), "not json").expect("write"));
    assert!(err.contains("tokenizer.json: not a usable tokenizer"), "{err}");
}

#[test]
fn a_bad_cache_says_where_it_looked() {
    let empty = tempfile::tempdir().expect("tempdir");
    let err = find_in_hf_cache(empty.path(), CheckpointName::Multilingual).expect_err("empty cache");
    let text = err.to_string();
    assert!(
        text.starts_with("checkpoint 'multilingual' not found; looked in "),
        "{text}"
    );
    assert!(
        text.contains("models--convaiinnovations--laya-multilingual/refs/main"),
        "{text}"
    );

    let cache = copy_cache();
    std::fs::write(
        cache.path().join("models--convaiinnovations--laya/refs/main"),
        "deadbeef",
    )
    .expect("write");
    let err = find_in_hf_cache(cache.path(), CheckpointName::English)
        .expect_err("dangling ref")
        .to_string();
    assert!(err.contains("refs/main: points at revision deadbeef, but"), "{err}");
}

#[test]
fn a_plain_directory_has_no_revision() {
    let dir = snapshot(&fixture_cache()).join("multilingual");
    let checkpoint = Checkpoint::open(Location::directory(&dir)).expect("opens");
    assert_eq!(checkpoint.location.revision(), None);
    assert_eq!(checkpoint.tokenizer.special().mask_text, "<mask>");
    let err = Checkpoint::open(Location::directory(dir.join("nope")))
        .expect_err("absent")
        .to_string();
    assert!(err.ends_with("missing (a Laya checkpoint needs rl_agent_config.json, model.safetensors, encoder/config.json and tokenizer/)"), "{err}");
}

#[test]
fn a_snapshot_path_tells_its_revision() {
    let dir = snapshot(&fixture_cache()).join("typed-decisions");
    let location = Location::from_path(&dir);
    assert_eq!(
        location.origin,
        Origin::HfCache {
            repo: "convaiinnovations/laya".to_owned(),
            subfolder: Some("typed-decisions".to_owned()),
            revision: "7a1e5eed0f1c7ee5c0de5eed0f1c7ee5c0de0320".to_owned()
        }
    );
    assert_eq!(Location::from_path("/srv/laya/english").origin, Origin::Directory);
}
