#!/usr/bin/env bash
# Paired in-process check of two layad-bench builds on the int8 (and f32) forward: A then B, B then
# A, ... (A B B A), one row of LENGTHS tokens, on the full-size random ModernBERT-large checkpoint,
# and the ratio of the medians of each engine's p50 (docs/benchmarks.md, "int8 with VNNI").
#   flock -x /work/cpu.lock tools/bench/int8-ab.sh <layad-bench A> <layad-bench B> [out-dir]
# Knobs: RUNS (4 timed forwards per engine and run), THREADS (2), LENGTHS (64), B_INT8 (the
# --int8-activations list B runs: u16,u8; A's is left at its default, which older builds lack),
# CHECKPOINTS (target/bench: where the random checkpoint is written or reused; the shared one is
# /work/bench), PRECISIONS (int8,f32).
set -euo pipefail
A=${1:?layad-bench binary A}; B=${2:?layad-bench binary B}; OUT=${3:-target/bench/int8-ab}
RUNS=${RUNS:-4}; THREADS=${THREADS:-2}; LENGTHS=${LENGTHS:-64}; B_INT8=${B_INT8:-u16,u8}
CHECKPOINTS=${CHECKPOINTS:-target/bench}; PRECISIONS=${PRECISIONS:-int8,f32}
mkdir -p "$OUT"
grep -m1 "model name" /proc/cpuinfo
grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512bw|avx512_vnni|avx512_bf16|avx_vnni|amx_int8)$' | tr '\n' ' '; echo
uptime
i=0
for side in A B B A; do
    i=$((i + 1)); bin=$A; extra=()
    if [ "$side" = B ]; then bin=$B; extra=(--int8-activations "$B_INT8"); fi
    "$bin" --out-dir "$CHECKPOINTS" --models modernbert-large --lengths "$LENGTHS" --rows 1 --precisions "$PRECISIONS" \
        --python none --min-runs "$RUNS" --max-runs "$RUNS" --threads "$THREADS" "${extra[@]}" \
        --json "$OUT/run-$i-$side.json" 2>&1 | grep -E "parity gate|p50" | sed "s/^/$side: /"
done
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
p50 = {}
for path in sorted(glob.glob(f"{sys.argv[1]}/run-*-[AB].json")):
    side = path[-6]
    for cell in json.load(open(path))["cells"]:
        p50.setdefault((side, cell["engine"], cell["length"]), []).append(cell["p50_ms"])
for (side, engine, length), values in sorted(p50.items()):
    print(f"{side} {engine} {length} tokens: median p50 {statistics.median(values):.1f} ms over {len(values)} runs {values}")
PY
uptime
