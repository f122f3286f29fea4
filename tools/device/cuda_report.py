#!/usr/bin/env python3
"""Step 6 of tools/device/cuda-check.sh: reads the JSON every earlier step wrote into OUTDIR and
writes OUTDIR/summary.json (the numbers that matter, with where they came from) and OUTDIR/table.md
(one markdown table). Standard library only: it runs on the H200 machine without installing anything.

    python3 tools/device/cuda_report.py OUTDIR MODE DEVICE     (MODE: cpu or gpu)

Exits 1 when a step's numbers fail its rule: f32 goldens beyond 1e-4, a half precision refused or
beyond the gate, any error in the served, spill or slow-device runs.
"""

import json
import os
import sys


def load(out, name):
    path = os.path.join(out, name)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def fmt(value, spec):
    return "–" if value is None else format(value, spec)


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    out, mode, device = sys.argv[1:]
    problems = []
    rows = []  # (step, what, result)
    summary = {"mode": mode, "device": device}

    notes_path = os.path.join(out, "notes.txt")
    notes = open(notes_path).read().splitlines() if os.path.exists(notes_path) else []
    summary["notes"] = notes

    goldens = load(out, "goldens.json")
    if goldens is None:
        problems.append("goldens: no goldens.json")
    else:
        summary["goldens"] = goldens["precisions"]
        for p in goldens["precisions"]:
            name = p["precision"]
            if not p.get("loaded"):
                problems.append(f"goldens: {name} refused at load: {p.get('error')}")
                rows.append(("1 goldens", f"{name} on {device}", f"refused at load: {p.get('error')}"))
                continue
            gates = p.get("load_time_gate", [])
            gate = max((g["max_probability_diff"] for g in gates), default=None)
            gpu = p.get("gpu") or {}
            where = p["device"] + (f" ({gpu.get('name')}, cc {gpu.get('compute_capability')}, tf32 {gpu.get('tf32')})" if gpu else "")
            result = (
                f"{p['rows']} rows, max |Δlogit| {p['worst_logit_diff']:.2e}, max |Δact p| {p['worst_act_diff']:.2e}, "
                f"vs upstream max |Δp| {p['vs_upstream']['max_probability_diff']:.4f}, "
                f"hard mismatches {p['vs_upstream']['hard_mismatches']}"
            )
            if name != "f32":
                result += f"; load-time gate vs f32 max |Δp| {fmt(gate, '.4f')} ({len(gates)} checkpoints)"
            rows.append(("1 goldens", f"{name} on {where}", result + ("" if p["passed"] else " **FAILED**")))
            if not p["passed"]:
                problems.append(f"goldens: {name} failed")

    forward = load(out, "forward.json")
    if forward is None:
        problems.append("forward: no forward.json")
    else:
        cells = forward.get("cells", [])
        summary["forward"] = [
            {k: c.get(k) for k in ("model", "engine", "length", "rows", "p50_ms", "p90_ms", "tokens_per_s")} for c in cells
        ]
        for c in cells:
            rows.append(
                ("2 forward", f"{c['model']} {c['engine']} {c['length']} tok × {c['rows']} rows",
                 f"p50 {c['p50_ms']:.2f} ms, p90 {c['p90_ms']:.2f} ms, {c['tokens_per_s']:.0f} tok/s")
            )

    # The served step against each peer: upstream laya-serve (served.json), laya-cuda behind
    # tools/device/laya_cuda_http.py (served-laya-cuda.json, only where it ran).
    summary["served"] = {}
    for name, peer, required in (("served.json", "upstream", True), ("served-laya-cuda.json", "laya-cuda", False)):
        served = load(out, name)
        if served is None:
            if required:
                problems.append(f"served: no {name}")
            continue
        summary["served"][peer] = {"latency": served.get("latency"), "throughput": served.get("throughput"),
                                   "answer_parity": served.get("answer_parity"), "worker": served.get("layad", {}).get("worker")}
        tag = "" if peer == "upstream" else f" (run beside {peer})"
        for parity in served.get("answer_parity") or []:
            if "max_abs_answer_diff" not in parity:
                continue
            rows.append(("3 served", f"answers vs {peer}, {parity['shape']}", f"max |Δ| {parity['max_abs_answer_diff']:.4f}"))
        for r in served.get("latency", []):
            theirs = r.get("peer_p50_ms", r.get("upstream_p50_ms"))  # older runs: upstream_*
            rows.append(
                ("3 served", f"{r['label']}{tag}",
                 f"layad p50 {r['layad_p50_ms']:.1f} ms, p90 {r['layad_p90_ms']:.1f} ms"
                 + (f"; {peer} p50 {theirs:.1f} ms, layad/{peer} {r['median_ratio']:.2f}" if theirs else f"; {peer} not run"))
            )
        for t in served.get("throughput", []):
            theirs = t.get("peer_answers_per_s", t.get("upstream_answers_per_s"))
            peer_errors = t.get("peer_errors", t.get("upstream_errors"))
            rows.append(
                ("3 served", f"{t['clients']} clients{tag}",
                 f"layad {t['layad_answers_per_s']:.1f} answers/s, {t['layad_errors']} errors"
                 + (f"; {peer} {theirs:.1f} answers/s ({t['ratio']:.2f}×), {peer_errors} errors"
                    if theirs else f"; {peer} not run"))
            )
            if t["layad_errors"]:
                problems.append(f"served: {t['layad_errors']} layad errors at {t['clients']} clients (vs {peer})")
            if theirs and peer_errors:
                problems.append(f"served: {peer_errors} {peer} errors at {t['clients']} clients")

    spill = {}
    for config in ("alone", "with-cpu"):
        run = load(out, f"spill-{config}.json")
        if run is None:
            problems.append(f"spill: no spill-{config}.json")
            continue
        classes = {c["class"]: c for c in run.get("classes", [])}
        errors = sum(c.get("errors", 0) for c in run.get("classes", []))
        short, long_ = classes.get("short-1q", {}), classes.get("long-1q", {})
        spill[config] = {
            "rate": run.get("rate"), "seconds": run.get("seconds"), "sent": run.get("sent"), "errors": errors,
            "short_p99_ms": short.get("p99_ms"), "long_p99_ms": long_.get("p99_ms"),
            "short_spill_share": short.get("spill_share"), "long_spill_share": long_.get("spill_share"),
        }
        label = "device pool alone" if config == "alone" else "device pool + CPU pool, spill on"
        rows.append(
            ("4 spill", f"{label}, bursty {run.get('rate')} req/s",
             f"{run.get('sent')} sent, {errors} errors; P99 short {fmt(short.get('p99_ms'), '.1f')} ms, "
             f"long {fmt(long_.get('p99_ms'), '.1f')} ms; spilled short {fmt(short.get('spill_share'), '.0%')}, "
             f"long {fmt(long_.get('spill_share'), '.0%')}")
        )
        if errors:
            problems.append(f"spill: {errors} errors ({config})")
    summary["spill"] = spill

    slow = load(out, os.path.join("slow-device", "windows-slow-s1.json"))
    if slow is None:
        problems.append("slow: no slow-device/windows-slow-s1.json")
    else:
        v = slow.get("verdict", {})
        summary["slow"] = v
        rows.append(
            ("5 slow", "pool a on the device at a quarter of its speed, pool b on the CPU, spill on",
             f"slow/normal median P50 {fmt(v.get('p50_ratio'), '.2f')}×, worst P99 {fmt(v.get('p99_ratio'), '.2f')}× "
             f"({fmt(v.get('slow_worst_p99_ms'), '.1f')} / {fmt(v.get('normal_median_p99_ms'), '.1f')} ms); "
             f"{v.get('errors')} errors; back on a {fmt(v.get('back_on_a_after_s'), '.2f')} s after")
        )
        if v.get("errors"):
            problems.append(f"slow: {v.get('errors')} errors")

    summary["problems"] = problems
    summary["passed"] = not problems
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(f"cuda-check ({'--cpu: a CPU pool stands in for the GPU' if mode == 'cpu' else 'GPU'}; device {device})\n\n")
        f.write("| step | what | result |\n|---|---|---|\n")
        for step, what, result in rows:
            f.write(f"| {step} | {what} | {result} |\n")
        for note in notes:
            f.write(f"\n- {note}")
        if problems:
            f.write("\n\nProblems:\n" + "".join(f"\n- {p}" for p in problems))
        f.write("\n")
    for p in problems:
        print(f"cuda_report: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
