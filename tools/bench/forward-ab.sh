#!/usr/bin/env bash
# Paired check of two builds of the in-process forward (e.g. two profile settings): runs layad-bench
# from binary A and binary B interleaved A B B A A B B A on the full-size ModernBERT-large random
# checkpoint (f32, one row of 64 and of 512 tokens), and prints each run's p50 and the ratio of the
# medians B/A. Take the exclusive CPU lock so nothing else runs meanwhile.
#
#   flock -x /work/cpu.lock tools/bench/forward-ab.sh <layad-bench A> <layad-bench B> [out-dir]
set -euo pipefail
A=${1:?layad-bench binary A}; B=${2:?layad-bench binary B}; OUT=${3:-target/bench/forward-ab}
RUNS=${RUNS:-6}; THREADS=${THREADS:-2}
mkdir -p "$OUT"
grep -m1 "model name" /proc/cpuinfo; uptime
i=0
for side in A B B A A B B A; do
    i=$((i + 1)); bin=$A; [ "$side" = B ] && bin=$B
    "$bin" --out-dir "$OUT" --models modernbert-large --lengths 64,512 --rows 1 --precisions f32 --python none \
        --min-runs "$RUNS" --max-runs "$RUNS" --threads "$THREADS" --json "$OUT/run-$i-$side.json" >/dev/null 2>&1
done
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
p50 = {}
for path in glob.glob(f"{sys.argv[1]}/run-*-[AB].json"):
    side = path[-6]
    for cell in json.load(open(path))["cells"]:
        p50.setdefault((cell["length"], side), []).append(cell["p50_ms"])
for length in sorted({length for length, _ in p50}):
    a, b = statistics.median(p50[(length, "A")]), statistics.median(p50[(length, "B")])
    print(f"{length} tokens: A median p50 {a:.1f} ms, B {b:.1f} ms, B/A {b / a:.3f}")
PY
uptime
