#!/usr/bin/env python3
"""Upstream PyTorch side of layad's model benchmarks (run with the venv holding laya[serve]==0.3.20).

serve            Loads a checkpoint directory with laya's own `Agent` (so the files are proven
                 loadable upstream) and answers timing requests, one JSON object per line: stdin
                 {"length", "rows", "runs", "outputs"} -> stdout {"times_ms", and with outputs the
                 logits and act probabilities}. `layad-bench` drives it so that torch and candle
                 forwards alternate (both see the same machine load). First line out: {"ready"...}.
half-precision   How far upstream's own CPU autocast (bf16, fp16) is from its fp32 on the golden
                 rows of tests/fixtures/goldens/cases.json. Prints the worst differences.

Inputs of the serve mode, shared with the Rust bench (src/bin/layad-bench): row r, position t has
id (r*1009 + t*7919 + 17) % vocab; markers at L/4, L/2, 3L/4; question type r % 3; no padding.
"""

import argparse
import json
import os
import sys
import time


def bench_inputs(torch, length, rows, vocab):
    ids = torch.tensor([[(r * 1009 + t * 7919 + 17) % vocab for t in range(length)] for r in range(rows)])
    markers = torch.tensor([[length // 4, length // 2, 3 * length // 4]] * rows)
    return (
        ids,
        torch.ones(rows, length, dtype=torch.long),
        markers,
        torch.ones(rows, 3, dtype=torch.bool),
        torch.tensor([r % 3 for r in range(rows)]),
    )


def serve_mode(args):
    import torch

    torch.set_num_threads(args.threads)
    from laya.agent import Agent

    model = Agent(args.checkpoint, device="cpu").model.eval()
    vocab = model.encoder.config.vocab_size
    print(json.dumps({"ready": True, "torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        inputs = bench_inputs(torch, request["length"], request["rows"], vocab)
        reply = {"times_ms": []}
        with torch.inference_mode():
            for _ in range(request["runs"]):
                t0 = time.perf_counter()
                logits, act = model(*inputs)
                reply["times_ms"].append((time.perf_counter() - t0) * 1e3)
        if request.get("outputs"):
            reply["logits"] = logits.float().tolist()
            reply["act_probabilities"] = torch.softmax(act.float(), -1).tolist()
        print(json.dumps(reply), flush=True)


def half_precision_mode(args):
    import torch

    torch.set_num_threads(args.threads)
    from laya.agent import Agent

    root = os.path.join(args.hf_cache, "hub", "models--convaiinnovations--laya", "snapshots")
    snapshot = os.path.join(root, sorted(os.listdir(root))[0])
    dirs = {
        "english": snapshot,
        "multilingual": os.path.join(snapshot, "multilingual"),
        "typed-decisions": os.path.join(snapshot, "typed-decisions"),
    }
    models = {name: Agent(path, device="cpu").model.eval() for name, path in dirs.items()}
    with open(args.cases) as f:
        cases = [c for c in json.load(f)["cases"] if c["status"] == 200 and c["rows"]]

    def collate(rows):
        length = max(len(r["ids"]) for r in rows)
        kmax = max(len(r["markers"]) for r in rows)
        ids = torch.zeros(len(rows), length, dtype=torch.long)
        mask = torch.zeros(len(rows), length, dtype=torch.long)
        pos = torch.zeros(len(rows), kmax, dtype=torch.long)
        pos_mask = torch.zeros(len(rows), kmax, dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, : len(r["ids"])] = torch.tensor(r["ids"])
            mask[i, : len(r["ids"])] = 1
            pos[i, : len(r["markers"])] = torch.tensor(r["markers"])
            pos_mask[i, : len(r["markers"])] = True
        return ids, mask, pos, pos_mask, torch.tensor([r["qtype"] for r in rows])

    for name, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16)):
        worst_logit = worst_act = 0.0
        for case in cases:
            with torch.inference_mode(), torch.autocast("cpu", dtype=dtype):
                logits, act = models[case["checkpoint"]](*collate(case["rows"]))
            act = torch.softmax(act.float(), -1)
            for i, row in enumerate(case["rows"]):
                k = len(row["markers"])
                golden_act = torch.softmax(torch.tensor(row["action_logits"]), -1)
                worst_logit = max(worst_logit, (logits[i, :k].float() - torch.tensor(row["logits"])).abs().max().item())
                worst_act = max(worst_act, (act[i] - golden_act).abs().max().item())
        rows = sum(len(c["rows"]) for c in cases)
        print(f"{name}: {rows} golden rows, worst |dlogit| {worst_logit:.3e}, worst |d act p| {worst_act:.3e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    serve = sub.add_parser("serve", help="answer timing requests on stdin (JSON lines)")
    serve.add_argument("--checkpoint", required=True)
    serve.add_argument("--threads", type=int, default=2)
    half = sub.add_parser("half-precision", help="upstream autocast vs fp32 on the golden rows")
    half.add_argument("--hf-cache", default="tests/fixtures/hf-cache")
    half.add_argument("--cases", default="tests/fixtures/goldens/cases.json")
    half.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.mode == "serve":
        serve_mode(args)
    else:
        half_precision_mode(args)


if __name__ == "__main__":
    main()
