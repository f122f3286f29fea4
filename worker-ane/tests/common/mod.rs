//! What the worker-ane tests share: the fixture checkpoints, and an artifacts directory for them —
//! the converter's fixture artifacts when they are in the tree, else one written here.
//!
//! A written one has real manifests (every field the worker checks), a small stand-in package
//! (the candle executor never opens it; its tree hash is real) and upstream's golden rows as parity.json.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use layad_system_tests::goldens::{fixtures_dir, golden_forwards};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub const REVISION: &str = "7a1e5eed0f1c7ee5c0de5eed0f1c7ee5c0de0320";
/// (name, subfolder, hidden size, max_len) of the three fixture checkpoints.
pub const CHECKPOINTS: [(&str, &str, usize, usize); 3] = [
    ("english", "", 128, 96),
    ("multilingual", "multilingual", 128, 128),
    ("typed-decisions", "typed-decisions", 128, 96),
];
pub const BUCKETS: [u32; 3] = [64, 96, 128];

pub fn checkpoint_dir(sub: &str) -> PathBuf {
    let snapshot = fixtures_dir()
        .join("hf-cache/hub/models--convaiinnovations--laya/snapshots")
        .join(REVISION);
    if sub.is_empty() { snapshot } else { snapshot.join(sub) }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

pub fn weights_sha256(sub: &str) -> String {
    sha256_hex(&std::fs::read(checkpoint_dir(sub).join("model.safetensors")).expect("weights"))
}

/// The converter's fixture artifacts of `name`, when they are in the tree and complete (the
/// fixtures keep english and multilingual only).
pub fn fixture_artifacts(name: &str) -> Option<PathBuf> {
    let dir = fixtures_dir().join("ane-artifacts").join(name);
    let complete = dir.join("parity.json").is_file()
        && BUCKETS
            .iter()
            .all(|b| dir.join(format!("L{b}/manifest.json")).is_file());
    complete.then_some(dir)
}

/// An artifacts directory for the three fixture checkpoints in `scratch`: a link to the converter's
/// fixture artifacts for each checkpoint that has them, written here for the others.
pub fn artifacts(scratch: &Path) -> PathBuf {
    for (name, sub, hidden, max_len) in CHECKPOINTS {
        if let Some(fixture) = fixture_artifacts(name) {
            std::os::unix::fs::symlink(fixture, scratch.join(name)).expect("link fixture artifacts");
            continue;
        }
        for bucket in BUCKETS {
            write_bucket(scratch, name, sub, hidden, bucket);
        }
        write_parity(scratch, name, sub, max_len);
    }
    scratch.to_path_buf()
}

/// The tree hash computed independently of the crate: the files, their hashes, sorted by path bytes.
pub fn tree_sha256_by_hand(files: &[(&str, &[u8])]) -> String {
    let mut lines: Vec<(String, String)> = files
        .iter()
        .map(|(path, bytes)| ((*path).to_owned(), sha256_hex(bytes)))
        .collect();
    lines.sort();
    let text: String = lines.iter().map(|(p, h)| format!("{p}\0{h}\n")).collect();
    sha256_hex(text.as_bytes())
}

/// The stand-in package files of a bucket (the layout of a real `.mlpackage`).
pub fn package_files(name: &str, bucket: u32) -> Vec<(String, Vec<u8>)> {
    vec![
        (
            "Manifest.json".into(),
            format!("{{\"stand-in\": \"{name} L{bucket}\"}}").into_bytes(),
        ),
        (
            "Data/com.apple.CoreML/model.mlmodel".into(),
            format!("program {name} {bucket}").into_bytes(),
        ),
        (
            "Data/com.apple.CoreML/weights/weight.bin".into(),
            vec![bucket as u8; 64],
        ),
    ]
}

pub fn manifest(name: &str, sub: &str, hidden: usize, bucket: u32, tree: &str) -> Value {
    let spec = |n: &str, shape: Vec<usize>| json!({"name": n, "shape": shape, "dtype": "float16"});
    let l = bucket as usize;
    json!({
        "format": "layad-ane-artifact", "format_version": 1,
        "graph": "bc1s-masked", "graph_version": 1,
        "checkpoint": name, "revision": REVISION, "weights_sha256": weights_sha256(sub),
        "bucket": bucket, "batch": 1, "precision": "float16", "max_options": 32,
        "hidden_size": hidden,
        "inputs": [
            spec("embeddings", vec![1, hidden, 1, l]), spec("full_mask", vec![1, l, 1, l]),
            spec("local_mask", vec![1, l, 1, l]), spec("type_vectors", vec![1, hidden, 1, 1]),
            spec("marker_map", vec![1, l, 1, 32]),
        ],
        "outputs": [spec("logits", vec![1, 1, 1, 32]), spec("cls", vec![1, hidden, 1, 1])],
        "package": "model.mlpackage",
        "tree_sha256": tree,
        "layout_check": {"rows": 0, "skipped_rows": 0, "max_abs_logit_diff": 0.0, "max_abs_act_probability_diff": 0.0},
        "converter": {"name": "worker-ane tests"},
        "deployment_target": "macOS15",
        "created_at": "2026-01-01T00:00:00Z",
    })
}

pub fn write_bucket(root: &Path, name: &str, sub: &str, hidden: usize, bucket: u32) -> PathBuf {
    let dir = root.join(name).join(format!("L{bucket}"));
    let files = package_files(name, bucket);
    for (path, bytes) in &files {
        let path = dir.join("model.mlpackage").join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, bytes).expect("write package file");
    }
    let borrowed: Vec<(&str, &[u8])> = files.iter().map(|(p, b)| (p.as_str(), b.as_slice())).collect();
    let tree = tree_sha256_by_hand(&borrowed);
    write_json(&dir.join("manifest.json"), &manifest(name, sub, hidden, bucket, &tree));
    dir
}

/// parity.json in the brief's layout: upstream's golden rows of `name` (act probabilities = softmax
/// of upstream's act logits), every row, including those no bucket holds.
pub fn write_parity(root: &Path, name: &str, sub: &str, _max_len: usize) {
    let rows: Vec<Value> = golden_forwards()
        .into_iter()
        .filter(|f| f.checkpoint == name)
        .flat_map(|f| f.rows)
        .map(|r| {
            json!({"ids": r.ids, "markers": r.markers, "qtype": r.qtype.index(),
                   "logits": r.logits, "act_probabilities": r.act_probabilities})
        })
        .collect();
    let doc = json!({"checkpoint": name, "revision": REVISION, "weights_sha256": weights_sha256(sub), "rows": rows});
    write_json(&root.join(name).join("parity.json"), &doc);
}

pub fn write_json(path: &Path, value: &Value) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, serde_json::to_vec_pretty(value).expect("json")).expect("write json");
}
