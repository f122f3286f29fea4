#!/usr/bin/env python3
"""ONNX Runtime in process, beside layad-bench's candle engines and torch (docs/benchmarks.md, issue 26).

export   Exports upstream's own model (laya's `Agent` on a checkpoint directory, torch f32) to ONNX with
         torch's dynamo exporter (dynamic rows, length and markers), then int8 with ONNX Runtime's
         dynamic quantization (s8 weights per tensor, u8/s8 activations quantized per call: what
         `edgejev build --precision int8` does). Writes `<out-dir>/model-f32.onnx`,
         `model-int8.onnx` and `export.json`, where each model's outputs on layad-bench's inputs
         (64 x 1, 58 x 3) are compared with torch's: max |d logit|, |d p| (softmax over the
         markers), |d act p|. Needs torch and laya (the upstream venv) *and* onnx, onnxscript,
         onnxruntime (the edgejev venv): run it with the edgejev venv's python and `--torch-site`
         naming the upstream venv's site-packages (appended to sys.path after the venv's own).
serve    Times forwards on request for layad-bench (`--onnx-python`), the protocol of
         torch_forward.py serve: stdin {"length", "rows", "runs", "outputs"} -> stdout {"times_ms",
         and with outputs "logits", "act_probabilities"}; first line {"ready", "runtime", "threads"}.
         Needs onnxruntime and numpy only (no torch).

Inputs, shared with layad-bench and torch_forward.py: row r, position t has id
(r*1009 + t*7919 + 17) % vocab; markers at L/4, L/2, 3L/4; question type r % 3; no padding.

    PY=/work/venvs/edgejev/bin/python
    $PY tools/bench/onnx_forward.py export --checkpoint /work/bench/modernbert-large-v50368 \
        --out-dir target/bench/onnx --torch-site /work/venvs/laya-0.4.15/lib/python3.11/site-packages
    target/release/layad-bench ... --onnx-python $PY --onnx-dir target/bench/onnx --onnx-precisions f32,int8
"""

import argparse
import json
import os
import sys
import time

INPUT_NAMES = ["input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype"]


def bench_feed(np, length, rows, vocab):
    """layad-bench's rows as ONNX inputs (int64 ids, mask, markers; bool marker mask)."""
    ids = np.array([[(r * 1009 + t * 7919 + 17) % vocab for t in range(length)] for r in range(rows)], dtype=np.int64)
    return {
        "input_ids": ids,
        "attention_mask": np.ones((rows, length), dtype=np.int64),
        "marker_pos": np.array([[length // 4, length // 2, 3 * length // 4]] * rows, dtype=np.int64),
        "marker_mask": np.ones((rows, 3), dtype=bool),
        "qtype": np.array([r % 3 for r in range(rows)], dtype=np.int64),
    }


def softmax(np, x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def session(path, threads):
    import onnxruntime as ort

    options = ort.SessionOptions()
    # As edgejev serves it: intra-op threads only, every graph optimisation.
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def export_mode(args):
    import site

    if args.torch_site:
        site.addsitedir(args.torch_site)
    import numpy as np
    import onnx
    import onnxruntime
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from torch.export import Dim

    from laya.agent import Agent

    torch.set_num_threads(args.threads)
    # The decision head's nn.TransformerEncoderLayer takes torch's fused "fastpath" kernel in eval
    # mode, which the exporter cannot trace.
    torch.backends.mha.set_fastpath_enabled(False)
    model = Agent(args.checkpoint, device="cpu").model.eval().float()
    vocab = model.encoder.config.vocab_size
    os.makedirs(args.out_dir, exist_ok=True)
    f32 = os.path.join(args.out_dir, "model-f32.onnx")
    int8 = os.path.join(args.out_dir, "model-int8.onnx")

    sample = bench_feed(np, 64, 2, vocab)
    inputs = tuple(torch.from_numpy(sample[n]) for n in INPUT_NAMES)
    rows, length, markers = Dim("rows", min=1, max=64), Dim("length", min=8, max=1024), Dim("markers", min=2, max=255)
    started = time.perf_counter()
    with torch.inference_mode():
        torch.onnx.export(
            model, inputs, f32, input_names=INPUT_NAMES, output_names=["logits", "act_logits"],
            dynamic_shapes={"input_ids": {0: rows, 1: length}, "attention_mask": {0: rows, 1: length},
                            "marker_pos": {0: rows, 1: markers}, "marker_mask": {0: rows, 1: markers},
                            "qtype": {0: rows}},
            opset_version=20, dynamo=True, external_data=False)
    # The dynamo exporter's value_info annotations conflict with shape inference and stop the
    # quantizer (edgejev's build drops them for the same reason).
    graph = onnx.load(f32)
    del graph.graph.value_info[:]
    onnx.save(graph, f32)
    # The exporter leaves the weights it staged beside the model; the saved model holds them itself.
    if os.path.exists(f32 + ".data"):
        os.remove(f32 + ".data")
    exported = time.perf_counter()
    # Signed int8 weights, per tensor: edgejev's `int8` (ORT's VNNI path is for QInt8 weights).
    quantize_dynamic(f32, int8, weight_type=QuantType.QInt8, per_channel=False)
    quantized = time.perf_counter()

    checks = []
    for length_, rows_ in ((64, 1), (58, 3)):
        feed = bench_feed(np, length_, rows_, vocab)
        with torch.inference_mode():
            logits, act = model(*(torch.from_numpy(feed[n]) for n in INPUT_NAMES))
        logits = logits.float().numpy()
        act_p = torch.softmax(act.float(), -1).numpy()
        for name, path in (("f32", f32), ("int8", int8)):
            out_logits, out_act = session(path, args.threads).run(None, feed)
            checks.append({
                "model": name, "length": length_, "rows": rows_,
                "max_abs_logit_diff": float(np.abs(out_logits - logits).max()),
                "max_abs_probability_diff": float(np.abs(softmax(np, out_logits) - softmax(np, logits)).max()),
                "max_abs_act_probability_diff": float(np.abs(softmax(np, out_act) - act_p).max()),
            })
            print(json.dumps(checks[-1]), flush=True)
    report = {
        "checkpoint": os.path.abspath(args.checkpoint), "torch": torch.__version__,
        "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
        "export_s": exported - started, "quantize_s": quantized - exported,
        "files": {"f32": os.path.getsize(f32), "int8": os.path.getsize(int8)},
        "vs_torch": checks,
    }
    with open(os.path.join(args.out_dir, "export.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {f32} and {int8} (export {report['export_s']:.1f} s, quantization {report['quantize_s']:.1f} s)")


def serve_mode(args):
    import numpy as np
    import onnxruntime

    with open(os.path.join(args.checkpoint, "encoder", "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    sess = session(os.path.join(args.onnx_dir, f"model-{args.precision}.onnx"), args.threads)
    print(json.dumps({"ready": True, "runtime": f"onnxruntime {onnxruntime.__version__} {args.precision}",
                      "threads": args.threads}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        feed = bench_feed(np, request["length"], request["rows"], vocab)
        reply = {"times_ms": []}
        for _ in range(request["runs"]):
            t0 = time.perf_counter()
            logits, act = sess.run(None, feed)
            reply["times_ms"].append((time.perf_counter() - t0) * 1e3)
        if request.get("outputs"):
            reply["logits"] = logits.astype(np.float32).tolist()
            reply["act_probabilities"] = softmax(np, act.astype(np.float64)).tolist()
        print(json.dumps(reply), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    export = sub.add_parser("export", help="export upstream's model to ONNX f32 and int8 (needs torch)")
    export.add_argument("--checkpoint", required=True)
    export.add_argument("--out-dir", required=True)
    export.add_argument("--torch-site", help="site-packages holding torch and laya, appended to sys.path")
    export.add_argument("--threads", type=int, default=2)
    serve = sub.add_parser("serve", help="answer timing requests on stdin (JSON lines)")
    serve.add_argument("--checkpoint", required=True, help="the checkpoint directory (for its vocabulary)")
    serve.add_argument("--onnx-dir", required=True, help="where `export` wrote model-f32.onnx, model-int8.onnx")
    serve.add_argument("--precision", choices=("f32", "int8"), default="f32")
    serve.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.mode == "export":
        export_mode(args)
    else:
        serve_mode(args)


if __name__ == "__main__":
    main()
