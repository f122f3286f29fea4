#!/usr/bin/env bash
# Paired check of two builds of the in-process forward (e.g. two profile settings): runs layad-bench
# from binary A and binary B interleaved A B B A A B B A on the full-size ModernBERT-large random
# checkpoint (ROWS rows, 1 unless set, of each of LENGTHS tokens, 64 and 512 unless set; f32 unless
# PRECISIONS says more, each with the kernel families in KERNELS; int8 with ACTIVATIONS, the
# engine's default unless set), and prints, per engine and length, the median p50 of each side and the ratio
# B/A, then the minimum and first quartile of every forward of each side (steadier when the machine
# drifts within the run). Engines are paired by their place in the run (the same PRECISIONS and KERNELS on both sides),
# so two builds that name a kernel differently still pair. Take the exclusive CPU lock so nothing
# else runs meanwhile.
#
#   flock -x /work/cpu.lock tools/bench/forward-ab.sh <layad-bench A> <layad-bench B> [out-dir]
#   PRECISIONS=f32,bf16,int8 KERNELS=auto,avx2 flock -x /work/cpu.lock tools/bench/forward-ab.sh A B
set -euo pipefail
A=${1:?layad-bench binary A}; B=${2:?layad-bench binary B}; OUT=${3:-target/bench/forward-ab}
RUNS=${RUNS:-6}; THREADS=${THREADS:-2}; LENGTHS=${LENGTHS:-64,512}; ROWS=${ROWS:-1}; PRECISIONS=${PRECISIONS:-f32}; KERNELS=${KERNELS:-auto}
ACTIVATIONS=${ACTIVATIONS:-auto}
mkdir -p "$OUT"
grep -m1 "model name" /proc/cpuinfo; uptime
i=0
for side in A B B A A B B A; do
    i=$((i + 1)); bin=$A; [ "$side" = B ] && bin=$B
    "$bin" --out-dir "$OUT" --models modernbert-large --lengths "$LENGTHS" --rows "$ROWS" --precisions "$PRECISIONS" --cpu-kernels "$KERNELS" --int8-activations "$ACTIVATIONS" --python none \
        --min-runs "$RUNS" --max-runs "$RUNS" --threads "$THREADS" --json "$OUT/run-$i-$side.json" >/dev/null 2>&1
done
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
p50, times, names = {}, {}, {}
for path in glob.glob(f"{sys.argv[1]}/run-*-[AB].json"):
    side = path[-6]
    engines = []
    for cell in json.load(open(path))["cells"]:
        if cell["engine"] not in engines:
            engines.append(cell["engine"])
        key = (engines.index(cell["engine"]), cell["length"])
        p50.setdefault((key, side), []).append(cell["p50_ms"])
        times.setdefault((key, side), []).extend(cell["times_ms"])
        names.setdefault((key[0], side), cell["engine"])
for key in sorted({key for key, _ in p50}):
    a, b = statistics.median(p50[(key, "A")]), statistics.median(p50[(key, "B")])
    label = names[(key[0], "A")] if names[(key[0], "A")] == names[(key[0], "B")] else f"{names[(key[0], 'A')]} / {names[(key[0], 'B')]}"
    print(f"{label}, {key[1]} tokens: A median p50 {a:.1f} ms, B {b:.1f} ms, B/A {b / a:.3f}")
    # When the machine drifts within the run, the fastest forwards of each side are the ones the
    # drift slowed least: the minimum and first quartile of every forward, side by side.
    ta, tb = sorted(times[(key, "A")]), sorted(times[(key, "B")])
    qa, qb = ta[(len(ta) - 1) // 4], tb[(len(tb) - 1) // 4]
    print(f"    every forward: A min {ta[0]:.1f} q25 {qa:.1f} ms, B min {tb[0]:.1f} q25 {qb:.1f} ms, B/A {tb[0] / ta[0]:.3f} and {qb / qa:.3f}")
PY
uptime
