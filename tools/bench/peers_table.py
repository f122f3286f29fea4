#!/usr/bin/env python3
"""Issue 26's peer table from one run of tools/bench/peers.sh (docs/benchmarks.md, "Peers").

    python3 tools/bench/peers_table.py target/bench/peers

Reads served-int8.json and served-f32.json (layad-http-bench: layad vs edgejev, upstream f32 as the
answers' reference), served-bf16.json (layad bf16 vs upstream with LAYA_CPU_AMP=bf16) and forward.json (layad-bench: candle, torch and ONNX Runtime in process), any
of them that exist, and prints markdown. Standard library only.
"""

import json
import os
import statistics
import sys


def load(out, name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def served(doc, ours, theirs):
    rows = []
    for r in doc.get("latency", []):
        rows.append(f"| served, {r['label']}: {ours} vs {theirs}, p50 (p90) ms, median of {len(r['ratios'])} pair ratios "
                    f"| {r['layad_p50_ms']:.1f} ({r['layad_p90_ms']:.1f}) | {r['peer_p50_ms']:.1f} ({r['peer_p90_ms']:.1f}) "
                    f"| **{r['median_ratio']:.2f}** |")
    for t in doc.get("throughput", []):
        rows.append(f"| answers/s, {t['clients']} clients (1 question), {ours} vs {theirs}; errors {t['layad_errors']}, "
                    f"{t['peer_errors']} | {t['layad_answers_per_s']:.2f} | {t['peer_answers_per_s']:.2f} "
                    f"| **{t['ratio']:.2f}×** |")
    return rows


def peer_name(doc):
    """The timed peer of a layad-http-bench run: edgejev in its precision, or upstream in its own
    (f32, or bf16 under LAYA_CPU_AMP)."""
    if doc.get("peer", "").startswith("edgejev"):
        precision = ((doc.get("edgejev") or {}).get("health") or {}).get("precision", "")
        return f"edgejev {precision}".strip()
    return f"upstream {(doc.get('upstream') or {}).get('amp') or 'f32'}"


def parity(doc, names):
    rows = []
    # The reference upstream ran in its own precision: f32, or bf16 under LAYA_CPU_AMP.
    reference = (doc.get("upstream") or {}).get("amp") or "f32"
    for p in doc.get("answer_parity", []):
        for q in p.get("probabilities", []):
            rows.append(f"| {p['shape']} ({q['input_tokens']} tokens) | {names[q['server']]} | {q['against']} {reference} "
                        f"| {q['max_abs_probability_diff']:.4f} | {q['hard_mismatches']} | {q.get('near_tie_flips', '–')} |")
    return rows


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "target/bench/peers"
    int8, f32, forward = load(out, "served-int8.json"), load(out, "served-f32.json"), load(out, "forward.json")
    bf16 = load(out, "served-bf16.json")
    machine = next((d["machine"] for d in (int8, f32, bf16, forward) if d), {})
    print(f"CPU: {machine.get('cpu')}; flags: {' '.join(machine.get('flags', []))}")
    print()
    print("| | layad | peer | layad / peer |")
    print("|---|---:|---:|---:|")
    for doc, ours in ((int8, "layad int8"), (f32, "layad f32"), (bf16, "layad bf16")):
        if doc:
            print("\n".join(served(doc, ours, peer_name(doc))))
    print()
    print("| request | server | against | max \\|Δp\\| | hard mismatches | near-tie flips |")
    print("|---|---|---|---:|---:|---:|")
    for doc, ours in ((int8, "layad int8"), (f32, "layad f32"), (bf16, "layad bf16")):
        if doc:
            names = {"layad": ours, "edgejev": peer_name(doc), "upstream": peer_name(doc)}
            print("\n".join(parity(doc, names)))
    if forward:
        print()
        cells = [c for c in forward["cells"] if c["length"] == 64 and c["rows"] == 1]
        engines = list(dict.fromkeys(c["engine"] for c in cells))
        rounds = sorted({c["round"] for c in cells})
        print("| in process, 64 tokens x 1 row | " + " | ".join(f"round {r + 1} p50 ms" for r in rounds)
              + " | median | / torch f32 | / candle (same precision) |")
        print("|---|" + "---:|" * (len(rounds) + 3))
        p50 = {(c["engine"], c["round"]): c["p50_ms"] for c in cells}
        medians = {e: statistics.median(p50[(e, r)] for r in rounds if (e, r) in p50) for e in engines}
        torch = medians.get("torch f32")
        for e in engines:
            same = "–"
            if e.startswith("onnxruntime"):
                precision = e.split()[-1]
                candle = [m for name, m in medians.items() if name.startswith(f"candle {precision} ")]
                same = f"{medians[e] / candle[0]:.2f}" if candle else "–"
            per_round = " | ".join(f"{p50[(e, r)]:.1f}" if (e, r) in p50 else "–" for r in rounds)
            vs_torch = f"{medians[e] / torch:.2f}" if torch else "–"
            print(f"| {e} | {per_round} | {medians[e]:.1f} | {vs_torch} | {same} |")
        for p in forward.get("parity_onnxruntime", []):
            print(f"\n{p['engine']} vs {p['against']} ({p['length']} x {p['rows']}): max |Δlogit| "
                  f"{p['max_abs_logit_diff']:.2e}, max |Δp| {p['max_abs_probability_diff']:.2e}, "
                  f"max |Δact p| {p['max_abs_act_probability_diff']:.2e}")
        for g in forward.get("parity_gates", []):
            print(f"\nlayad {g['precision']} gate (round {g['round'] + 1}): {g['rows']} rows, max |Δp| "
                  f"{g['max_probability_diff']:.5f}, max |Δact p| {g['max_act_probability_diff']:.5f}, "
                  f"hard mismatches {g['hard_mismatches']}")


if __name__ == "__main__":
    main()
