#!/usr/bin/env bash
# CPU time per forward of one layad-bench engine, from perf's cpu-clock samples: on a machine whose
# cores other work shares, wall time measures the scheduler more than the code; the CPU time the
# forward's threads spend does not (docs/benchmarks.md, "Profile after the kernels").
#   tools/bench/cpu-per-forward.sh <layad-bench> <name> <precision> <runs> [layad-bench args ...]
# ROWS (1) rows of LENGTH (64) tokens, THREADS (2) threads, the random ModernBERT-large under CHECKPOINTS
# (/work/bench). The timed forwards end where the pool's threads stop (the models are dropped after
# them), so the pool's samples of the sum(times_ms) seconds before are theirs: CPU ms per forward = samples / rate / runs, and the busiest thread's share.
# Writes OUT/<name>.{log,json,perf.data} (OUT: target/bench/cpu); `cpu_breakdown.py OUT <name>`
# splits the same samples by function.
set -euo pipefail
BIN=${1:?layad-bench}; NAME=${2:?name}; PREC=${3:?precision}; RUNS=${4:?timed forwards}; shift 4
OUT=${OUT:-target/bench/cpu}; RATE=${RATE:-999}; CHECKPOINTS=${CHECKPOINTS:-/work/bench}
LENGTH=${LENGTH:-64}; THREADS=${THREADS:-2}; ROWS=${ROWS:-1}
mkdir -p "$OUT"
perf record -q -e cpu-clock -F "$RATE" -o "$OUT/$NAME.perf.data" -- "$BIN" --out-dir "$CHECKPOINTS" \
    --models modernbert-large --lengths "$LENGTH" --rows "$ROWS" --precisions "$PREC" --python none \
    --min-runs "$RUNS" --max-runs "$RUNS" --threads "$THREADS" --json "$OUT/$NAME.json" "$@" > "$OUT/$NAME.log" 2>&1
perf script -i "$OUT/$NAME.perf.data" -F tid,time 2>/dev/null | tr -d ':' > "$OUT/$NAME.times"
python3 - "$OUT/$NAME.times" "$OUT/$NAME.json" "$RATE" "$NAME" "$THREADS" <<'PY'
import collections, json, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
rate, threads = int(sys.argv[3]), int(sys.argv[5])
cell = json.load(open(sys.argv[2]))["cells"][0]
timed = sum(cell["times_ms"]) / 1000
# The forwards end at the pool threads' last sample, not the process's: dropping the models after
# them took 0.15-0.25 s on other threads (munmap), which a window ending at the last sample counted
# as forwards. The pool: the `threads` busiest threads of the recording's last seconds.
tail = [r for r in rows if float(r[1]) >= float(rows[-1][1]) - timed - 1]
pool = {tid for tid, _ in collections.Counter(r[0] for r in tail).most_common(threads)}
end = max(float(r[1]) for r in rows if r[0] in pool); start = end - timed
window = [r for r in rows if start <= float(r[1]) <= end]
busiest = max(collections.Counter(r[0] for r in window).values())
n = len(cell["times_ms"])
print(f"{sys.argv[4]}: {cell['engine']}: CPU {len(window) / rate * 1000 / n:.1f} ms per forward "
      f"(busiest thread {busiest / rate * 1000 / n:.1f} ms), wall p50 {cell['p50_ms']:.1f} ms over {n}")
PY
