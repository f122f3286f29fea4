//! Artifact admission: manifests are checked field by field against the loaded checkpoint, the
//! package's tree hash is recomputed from its files, and parity.json must belong to the same weights.

mod common;

use std::path::Path;

use serde_json::Value;
use worker_ane::artifact::{self, ArtifactError, Expected};

fn expected(weights: &str) -> Expected<'_> {
    Expected {
        checkpoint: "english",
        weights_sha256: weights,
        revision: Some(common::REVISION),
        hidden_size: 128,
    }
}

fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("manifest.json");
    let mut manifest: Value = serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
    edit(&mut manifest);
    common::write_json(&path, &manifest);
}

/// The field a refusal names, or a panic describing what came instead.
fn refused_field(result: Result<artifact::Artifact, ArtifactError>) -> String {
    match result {
        Err(ArtifactError::Mismatch { field, path, .. }) => {
            assert!(path.ends_with("manifest.json"), "{path:?}");
            field
        }
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("admitted"),
    }
}

#[test]
fn a_good_manifest_is_admitted_and_its_tree_hash_matches_a_hash_by_hand() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let dir = common::write_bucket(scratch.path(), "english", "", 128, 64);
    let weights = common::weights_sha256("");
    let admitted = artifact::admit(&dir, 64, &expected(&weights)).expect("admitted");
    assert_eq!(admitted.manifest.bucket, 64);
    let files = common::package_files("english", 64);
    let borrowed: Vec<(&str, &[u8])> = files.iter().map(|(p, b)| (p.as_str(), b.as_slice())).collect();
    assert_eq!(
        artifact::tree_sha256(&dir.join("model.mlpackage")).expect("tree"),
        common::tree_sha256_by_hand(&borrowed)
    );
    // The Error names the first field that differs, whatever else is wrong.
    let error = artifact::admit(&dir, 96, &expected(&weights))
        .map(|_| ())
        .expect_err("wrong bucket");
    assert!(
        error.to_string().contains("field `bucket` is 64, expected 96"),
        "{error}"
    );
}

#[test]
fn every_mismatch_is_refused_naming_the_file_and_field() {
    let weights = common::weights_sha256("");
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: [(&str, Edit); 9] = [
        (
            "weights_sha256",
            Box::new(|m| m["weights_sha256"] = "ab".repeat(32).into()),
        ),
        ("bucket", Box::new(|m| m["bucket"] = 96.into())),
        ("revision", Box::new(|m| m["revision"] = "0".repeat(40).into())),
        ("hidden_size", Box::new(|m| m["hidden_size"] = 256.into())),
        ("checkpoint", Box::new(|m| m["checkpoint"] = "multilingual".into())),
        ("graph", Box::new(|m| m["graph"] = "bc1s".into())),
        ("precision", Box::new(|m| m["precision"] = "float32".into())),
        (
            "inputs.embeddings.shape",
            Box::new(|m| m["inputs"][0]["shape"][3] = 96.into()),
        ),
        (
            "outputs.cls.dtype",
            Box::new(|m| m["outputs"][1]["dtype"] = "float32".into()),
        ),
    ];
    for (field, edit) in cases {
        let scratch = tempfile::tempdir().expect("tempdir");
        let dir = common::write_bucket(scratch.path(), "english", "", 128, 64);
        edit_manifest(&dir, edit);
        assert_eq!(refused_field(artifact::admit(&dir, 64, &expected(&weights))), field);
    }
    // A missing input is named as the set of inputs.
    let scratch = tempfile::tempdir().expect("tempdir");
    let dir = common::write_bucket(scratch.path(), "english", "", 128, 64);
    edit_manifest(&dir, |m| {
        m["inputs"].as_array_mut().expect("inputs").remove(4);
    });
    assert_eq!(refused_field(artifact::admit(&dir, 64, &expected(&weights))), "inputs");
    // A revision the converter did not know is not a mismatch.
    edit_manifest(&dir, |m| {
        m["inputs"] = common::manifest("english", "", 128, 64, "")["inputs"].clone();
        m["revision"] = Value::Null;
    });
    assert!(artifact::admit(&dir, 64, &expected(&weights)).is_ok());
}

#[test]
fn a_changed_package_fails_the_tree_hash_and_links_are_refused() {
    let weights = common::weights_sha256("");
    let scratch = tempfile::tempdir().expect("tempdir");
    let dir = common::write_bucket(scratch.path(), "english", "", 128, 64);
    let weight = dir.join("model.mlpackage/Data/com.apple.CoreML/weights/weight.bin");
    std::fs::write(&weight, [1u8; 64]).expect("overwrite");
    assert_eq!(
        refused_field(artifact::admit(&dir, 64, &expected(&weights))),
        "tree_sha256"
    );
    // A file added to the package changes the hash too.
    let scratch = tempfile::tempdir().expect("tempdir");
    let dir = common::write_bucket(scratch.path(), "english", "", 128, 64);
    std::fs::write(dir.join("model.mlpackage/extra"), b"x").expect("add");
    assert_eq!(
        refused_field(artifact::admit(&dir, 64, &expected(&weights))),
        "tree_sha256"
    );
    // A link inside the package would bring in bytes the hash never saw.
    let scratch = tempfile::tempdir().expect("tempdir");
    let dir = common::write_bucket(scratch.path(), "english", "", 128, 64);
    std::os::unix::fs::symlink("/etc/hostname", dir.join("model.mlpackage/link")).expect("symlink");
    match artifact::admit(&dir, 64, &expected(&weights)) {
        Err(ArtifactError::Malformed { path, problem }) => {
            assert!(
                path.ends_with("model.mlpackage/link") && problem.contains("links"),
                "{path:?} {problem}"
            )
        }
        other => panic!("expected a refused link, got {:?}", other.map(|a| a.dir)),
    }
    // A package name that leaves the artifact directory is refused before anything is read.
    let scratch = tempfile::tempdir().expect("tempdir");
    let dir = common::write_bucket(scratch.path(), "english", "", 128, 64);
    edit_manifest(&dir, |m| m["package"] = "../../elsewhere".into());
    assert_eq!(refused_field(artifact::admit(&dir, 64, &expected(&weights))), "package");
}

#[test]
fn discovery_finds_buckets_and_names_what_is_missing() {
    let scratch = tempfile::tempdir().expect("tempdir");
    for bucket in [96, 64] {
        common::write_bucket(scratch.path(), "english", "", 128, bucket);
    }
    std::fs::create_dir_all(scratch.path().join("english/L128")).expect("empty bucket dir");
    std::fs::create_dir_all(scratch.path().join("english/Lx")).expect("not a bucket");
    let found = artifact::discover(scratch.path(), "english").expect("discover");
    assert_eq!(found.keys().copied().collect::<Vec<_>>(), [64, 96]);
    match artifact::discover(scratch.path(), "multilingual") {
        Err(ArtifactError::Missing { path }) => assert!(path.ends_with("multilingual"), "{path:?}"),
        other => panic!("expected missing, got {other:?}"),
    }
}

#[test]
fn parity_files_must_match_the_weights_and_both_row_layouts_are_read() {
    let weights = common::weights_sha256("");
    let scratch = tempfile::tempdir().expect("tempdir");
    common::write_parity(scratch.path(), "english", "", 96);
    let path = scratch.path().join("english/parity.json");
    let file = artifact::read_parity(&path, &expected(&weights)).expect("parity");
    assert_eq!(file.rows.len(), 137);
    // The converter groups rows by case under `cases`, with a count in `rows`.
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
    let rows = doc["rows"].take();
    doc["rows"] = 137.into();
    doc["format"] = "layad-ane-parity".into();
    doc["cases"] = serde_json::json!([{"name": "all", "rows": rows}]);
    common::write_json(&path, &doc);
    assert_eq!(
        artifact::read_parity(&path, &expected(&weights)).expect("parity").rows,
        file.rows
    );
    doc["weights_sha256"] = "cd".repeat(32).into();
    common::write_json(&path, &doc);
    let error = artifact::read_parity(&path, &expected(&weights))
        .map(|_| ())
        .expect_err("other weights");
    assert!(
        error.to_string().contains("parity.json: field `weights_sha256`"),
        "{error}"
    );
}

/// The converter's own output (when the fixture artifacts are in the tree): every manifest admitted
/// against the loaded checkpoint, tree hashes recomputed from the real packages, parity.json read.
#[test]
fn the_converters_fixture_artifacts_are_admitted() {
    let mut checked = 0;
    for (name, sub, ..) in common::CHECKPOINTS {
        let Some(dir) = common::fixture_artifacts(name) else {
            continue;
        };
        let weights = common::weights_sha256(sub);
        let expected = Expected {
            checkpoint: name,
            ..expected(&weights)
        };
        for bucket in common::BUCKETS {
            let admitted = artifact::admit(&dir.join(format!("L{bucket}")), bucket, &expected)
                .unwrap_or_else(|e| panic!("{name} L{bucket}: {e}"));
            assert_eq!(admitted.manifest.hidden_size, 128);
            checked += 1;
        }
        let parity = artifact::read_parity(&dir.join("parity.json"), &expected).expect("parity");
        eprintln!("{name}: {} reference rows", parity.rows.len());
        assert!(!parity.rows.is_empty());
    }
    eprintln!("fixture artifacts admitted: {checked} buckets");
}
