# Artifact writing: trace + coremltools conversion per bucket, manifest.json, the mlpackage tree
# hash, and parity.json (upstream FP32 reference rows for the parity gate on the Mac).
"""OUTDIR/<name>/L<bucket>/{model.mlpackage, manifest.json} and OUTDIR/<name>/parity.json."""
import hashlib
import json
import os
import shutil
import tempfile
from datetime import datetime, timezone

import numpy as np
import torch

from . import NAME, __version__, bc1s, host, upstream

FORMAT = "layad-ane-artifact"
FORMAT_VERSION = 1
PACKAGE = "model.mlpackage"
DEPLOYMENT_TARGET = "macOS15"


def tree_sha256(root: str) -> str:
    """SHA-256 of one line per regular file under `root`, sorted bytewise by relative path with '/'
    separators: `<relative path>\\0<sha256 hex of the file>\\n`. Links and other non-regular files
    are refused (the Rust worker does the same)."""
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            if os.path.islink(os.path.join(dirpath, d)):
                raise ValueError("symlink in package: %s" % os.path.join(dirpath, d))
        for fn in filenames:
            full = os.path.join(dirpath, fn)
            if os.path.islink(full) or not os.path.isfile(full):
                raise ValueError("not a regular file in package: %s" % full)
            rel = os.path.relpath(full, root).replace(os.sep, "/").encode("utf-8")
            entries.append((rel, upstream.sha256_file(full)))
    entries.sort(key=lambda e: e[0])
    h = hashlib.sha256()
    for rel, digest in entries:
        h.update(rel + b"\0" + digest.encode("ascii") + b"\n")
    return h.hexdigest()


def io_spec(hidden: int, length: int):
    """Contract inputs and outputs, in order: [(name, shape)]."""
    s = bc1s.MAX_OPTIONS
    inputs = [("embeddings", [1, hidden, 1, length]), ("full_mask", [1, length, 1, length]),
              ("local_mask", [1, length, 1, length]), ("type_vectors", [1, hidden, 1, 1]),
              ("marker_map", [1, length, 1, s])]
    outputs = [("logits", [1, 1, 1, s]), ("cls", [1, hidden, 1, 1])]
    return inputs, outputs


def convert_bucket(model, length: int, meta: dict):
    """Trace the FP32 BC1S module for one bucket and convert it to an FP16 ML Program."""
    import coremltools as ct

    module = bc1s.build(model, length)
    hidden = module.hidden
    example = host.graph_inputs(model, [0] * min(8, length), [1], 0, length)
    with torch.no_grad():
        traced = torch.jit.trace(module, example)
    inputs, outputs = io_spec(hidden, length)
    mlmodel = ct.convert(
        traced,
        convert_to="mlprogram",
        inputs=[ct.TensorType(name=n, shape=tuple(s), dtype=np.float16) for n, s in inputs],
        outputs=[ct.TensorType(name=n, dtype=np.float16) for n, _ in outputs],
        compute_precision=ct.precision.FLOAT16,
        minimum_deployment_target=ct.target.macOS15,
        skip_model_load=True,   # Linux cannot load/predict; the Mac side compiles and checks it
    )
    _verify_io(mlmodel.get_spec(), inputs, outputs)
    mlmodel.short_description = "Laya %s decision model, graph %s v%d, L=%d, batch 1, FP16" % (
        meta["checkpoint"], bc1s.GRAPH, bc1s.GRAPH_VERSION, length)
    mlmodel.version = __version__
    for k, v in (("layad.graph", bc1s.GRAPH), ("layad.graph_version", str(bc1s.GRAPH_VERSION)),
                 ("layad.checkpoint", meta["checkpoint"]), ("layad.revision", meta["revision"] or ""),
                 ("layad.weights_sha256", meta["weights_sha256"]), ("layad.bucket", str(length))):
        mlmodel.user_defined_metadata[k] = v
    return mlmodel


def _verify_io(spec, inputs, outputs):
    from coremltools.proto import FeatureTypes_pb2 as ft

    fp16 = ft.ArrayFeatureType.ArrayDataType.Value("FLOAT16")
    for want, got, what in ((inputs, spec.description.input, "input"),
                            (outputs, spec.description.output, "output")):
        names = [g.name for g in got]
        if names != [n for n, _ in want]:
            raise RuntimeError("converted %ss are %s, expected %s" % (what, names, [n for n, _ in want]))
        for (n, shape), g in zip(want, got):
            arr = g.type.multiArrayType
            if arr.dataType != fp16:
                raise RuntimeError("%s %s is not float16" % (what, n))
            if list(arr.shape) and list(arr.shape) != shape:
                raise RuntimeError("%s %s has shape %s, expected %s" % (what, n, list(arr.shape), shape))


def manifest(meta: dict, length: int, hidden: int, tree: str, layout: dict, versions: dict):
    inputs, outputs = io_spec(hidden, length)
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "graph": bc1s.GRAPH, "graph_version": bc1s.GRAPH_VERSION,
        "checkpoint": meta["checkpoint"], "revision": meta["revision"], "weights_sha256": meta["weights_sha256"],
        "bucket": length, "batch": 1, "precision": "float16", "max_options": bc1s.MAX_OPTIONS,
        "hidden_size": hidden,
        "inputs": [{"name": n, "shape": s, "dtype": "float16"} for n, s in inputs],
        "outputs": [{"name": n, "shape": s, "dtype": "float16"} for n, s in outputs],
        "package": PACKAGE,
        "tree_sha256": tree,
        "layout_check": {k: layout[k] for k in ("rows", "skipped_rows", "max_abs_logit_diff",
                                                "max_abs_act_probability_diff")},
        "converter": dict({"name": NAME, "version": __version__}, **versions),
        "deployment_target": DEPLOYMENT_TARGET,
        "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def write_json(path: str, obj=None, text: str = None):
    if text is None:
        text = json.dumps(obj, indent=1, ensure_ascii=False)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def parity_text(doc: dict) -> str:
    """parity.json as indented JSON with each row on one line (keeps the file small and diffable)."""
    one = lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    head = ["{"] + [" %s: %s," % (one(k), one(v)) for k, v in doc.items() if k != "cases"] + [' "cases": [']
    cases = []
    for c in doc["cases"]:
        meta = "".join("%s: %s, " % (one(k), one(v)) for k, v in c.items() if k != "rows")
        rows = ",\n".join("   " + one(r) for r in c["rows"])
        cases.append("  {%s\"rows\": [\n%s\n  ]}" % (meta, rows))
    return "\n".join(head) + "\n" + ",\n".join(cases) + "\n ]\n}"


def write_bucket(out_dir: str, model, length: int, meta: dict, layout_bucket: dict, versions: dict):
    """Converts and writes OUTDIR/<name>/L<bucket>/ via a staging dir renamed into place."""
    final = os.path.join(out_dir, meta["checkpoint"], "L%d" % length)
    os.makedirs(os.path.dirname(final), exist_ok=True)
    stage = tempfile.mkdtemp(prefix=".L%d-" % length, dir=os.path.dirname(final))
    try:
        mlmodel = convert_bucket(model, length, meta)
        pkg = os.path.join(stage, PACKAGE)
        mlmodel.save(pkg)
        for dirpath, _, filenames in os.walk(pkg):   # coremltools leaves model.mlmodel at 0600
            for fn in filenames:
                os.chmod(os.path.join(dirpath, fn), 0o644)
        man = manifest(meta, length, model.encoder.config.hidden_size, tree_sha256(pkg), layout_bucket, versions)
        write_json(os.path.join(stage, "manifest.json"), man)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.chmod(stage, 0o755)
        os.rename(stage, final)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return final, man


def parity_rows(agent, cases_path: str, name: str):
    """Reference rows for the parity gate: every golden case recorded for `name`, its rows rebuilt
    with upstream's prompt builder on this checkpoint's tokenizer when they differ from the recorded
    ids (they are identical on the fixture checkpoints), logits and act probabilities from upstream's
    FP32 forward, one row per forward."""
    from .check import golden_cases

    out, rebuilt_rows, recorded_rows = [], 0, 0
    for case in golden_cases(cases_path, name):
        recorded = [{"ids": r["ids"], "markers": r["markers"], "qtype": r["qtype"]} for r in case["rows"]]
        rebuilt = upstream.rows_from_request(agent, case["state"], case["questions"])
        if rebuilt and rebuilt != recorded:
            rows, source = rebuilt, "rebuilt"
            rebuilt_rows += len(rows)
        else:
            rows, source = recorded, "recorded"
            recorded_rows += len(rows)
        entries = []
        for r in rows:
            logits, _, act_p = upstream.forward_row(agent, r["ids"], r["markers"], r["qtype"])
            entries.append(dict(r, logits=[float(x) for x in logits.astype(np.float32)],
                                act_probabilities=[float(x) for x in act_p.astype(np.float32)]))
        out.append({"name": case["name"], "ids_source": source, "rows": entries})
    return out, recorded_rows, rebuilt_rows


def write_parity(out_dir: str, agent, cases_path: str, meta: dict, versions: dict):
    cases, n_recorded, n_rebuilt = parity_rows(agent, cases_path, meta["checkpoint"])
    doc = {
        "format": "layad-ane-parity", "format_version": 1,
        "checkpoint": meta["checkpoint"], "revision": meta["revision"], "weights_sha256": meta["weights_sha256"],
        "reference": "upstream laya %s DecisionModel.forward, torch %s CPU FP32, one row per forward; "
                     "act_probabilities = softmax(action logits)" % (versions["laya"], versions["torch"]),
        "cases_file": os.path.basename(cases_path),
        "rows": n_recorded + n_rebuilt, "rows_recorded_ids": n_recorded, "rows_rebuilt_ids": n_rebuilt,
        "cases": cases,
    }
    path = os.path.join(out_dir, meta["checkpoint"], "parity.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json(path, text=parity_text(doc))
    return path, doc
