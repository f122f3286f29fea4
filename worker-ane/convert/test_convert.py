# Linux checks for layad-ane-convert (needs the converter venv with torch; NOT part of cargo test).
# Run: cd worker-ane/convert && python -m pytest test_convert.py   (or: python test_convert.py)
"""Layout check on the fixture checkpoints, tree hash definition, committed artifacts, one conversion."""
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from layad_ane_convert import artifact, check, host, upstream  # noqa: E402

ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
REPO = os.path.join(ROOT, "tests", "fixtures", "hf-cache", "hub", "models--convaiinnovations--laya")
GOLDENS = os.path.join(ROOT, "tests", "fixtures", "goldens", "cases.json")
ARTIFACTS = os.path.join(ROOT, "tests", "fixtures", "ane-artifacts")
BUCKETS = [64, 96, 128]
MANIFEST_KEYS = ["format", "format_version", "graph", "graph_version", "checkpoint", "revision", "weights_sha256",
                 "bucket", "batch", "precision", "max_options", "hidden_size", "inputs", "outputs", "package",
                 "tree_sha256", "layout_check", "converter", "deployment_target", "created_at"]
_AGENTS = {}


def checkpoint_dir(name):
    with open(os.path.join(REPO, "refs", "main")) as f:
        snap = os.path.join(REPO, "snapshots", f.read().strip())
    return snap if name == "english" else os.path.join(snap, name)


def agent(name):
    if name not in _AGENTS:
        _AGENTS[name] = upstream.load_agent(checkpoint_dir(name))
    return _AGENTS[name]


def test_layout_check_passes_on_fixture_checkpoints():
    for name in ("english", "multilingual", "typed-decisions"):
        rows = check.golden_rows(GOLDENS, name)
        rep = check.layout_check(agent(name), rows, BUCKETS)
        print(check.format_report(name, rep))
        assert rep["passed"], name
        assert rep["rows"] == len(rows) and rep["skipped_rows"] == 0, name
        assert rep["max_abs_logit_diff"] < 1e-3 and rep["max_abs_act_probability_diff"] < 1e-3, name


def test_layout_check_catches_a_wrong_mask():
    """Sliding layers fed the full mask must fail the gate (the check is not vacuous)."""
    real = host.graph_inputs

    def no_window(model, ids, markers, qtype, length):
        emb, full, _local, tv, mm = real(model, ids, markers, qtype, length)
        return emb, full, full, tv, mm

    host.graph_inputs = no_window
    try:
        rep = check.layout_check(agent("english"), check.golden_rows(GOLDENS, "english")[:5], [128])
    finally:
        host.graph_inputs = real
    assert not rep["passed"] and rep["max_abs_logit_diff"] > 1e-2


def test_tree_hash_definition():
    """Fixed vector, shared with the Rust worker's tests (README: tree hash)."""
    with tempfile.TemporaryDirectory() as d:
        files = {"Data/x": b"hello\n", "Data/a-b": b"b\n", "Manifest.json": b"{}\n", "weights/weight.bin": b"\x00\x01"}
        for rel, data in files.items():
            os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
            with open(os.path.join(d, rel), "wb") as f:
                f.write(data)
        assert artifact.tree_sha256(d) == "d473b8012fbc8fbd15f2d76b2f4fb9ea01030546dbc3c7a161576256387de3f2"
        os.symlink("x", os.path.join(d, "Data", "link"))
        try:
            artifact.tree_sha256(d)
            raise AssertionError("a symlink must be refused")
        except ValueError:
            pass


def _check_artifact_dir(out, name, buckets):
    weights = upstream.weights_sha256(checkpoint_dir(name))
    for b in buckets:
        bdir = os.path.join(out, name, "L%d" % b)
        with open(os.path.join(bdir, "manifest.json")) as f:
            man = json.load(f)
        assert list(man) == MANIFEST_KEYS
        assert man["bucket"] == b and man["checkpoint"] == name and man["weights_sha256"] == weights
        with open(os.path.join(REPO, "refs", "main")) as f:
            assert man["revision"] == f.read().strip()
        assert [i["name"] for i in man["inputs"]] == ["embeddings", "full_mask", "local_mask", "type_vectors",
                                                      "marker_map"]
        assert man["inputs"][0]["shape"] == [1, man["hidden_size"], 1, b]
        assert man["tree_sha256"] == artifact.tree_sha256(os.path.join(bdir, man["package"]))
        assert man["layout_check"]["max_abs_logit_diff"] < 1e-3
    with open(os.path.join(out, name, "parity.json")) as f:
        parity = json.load(f)
    rows = [r for c in parity["cases"] for r in c["rows"]]
    assert parity["weights_sha256"] == weights and len(rows) == parity["rows"] == len(check.golden_rows(GOLDENS, name))
    assert all(len(r["logits"]) == len(r["markers"]) and abs(sum(r["act_probabilities"]) - 1) < 1e-5 for r in rows)


def test_committed_fixture_artifacts_match_their_manifests():
    for name in ("english", "multilingual"):
        _check_artifact_dir(ARTIFACTS, name, BUCKETS)


def test_convert_one_bucket():
    from layad_ane_convert.__main__ import main

    with tempfile.TemporaryDirectory() as out:
        rc = main(["convert", "--checkpoint", checkpoint_dir("typed-decisions"), "--name", "typed-decisions",
                   "--out", out, "--buckets", "64", "--goldens", GOLDENS])
        assert rc == 0
        _check_artifact_dir(out, "typed-decisions", [64])


if __name__ == "__main__":
    tests = [(k, v) for k, v in sorted(globals().items()) if k.startswith("test_") and callable(v)]
    for k, fn in tests:
        fn()
        print("ok", k)
    print("%d passed" % len(tests))
