#!/usr/bin/env bash
# The served path against upstream, paired (docs/benchmarks.md, "Served path vs upstream"): release
# build; the full-size random ModernBERT-large checkpoint (layad-bench's writer); the in-process
# forward on the same shapes (engine time, no serving); then layad and upstream laya-serve up at once,
# requests interleaved A/B/B/A per shape, and answers/s at 1, 2, 4, 8 clients.
#
# Needs the upstream venv (tools/bench/upstream-venv.sh). Run it on a quiet machine; on a shared one
# take the exclusive CPU lock around it, e.g. `flock -x /work/cpu.lock tools/bench/served.sh`.
# Knobs (environment): OUT (target/bench), PYTHON (/work/upstream-venv/bin/python), THREADS (2),
# PAIRS (20), SECONDS_PER_LEVEL (10), CONCURRENCY (1,2,4,8), SHAPES (short,long,three), DTYPE (f32),
# BATCH_WAIT (unset: the config default), UPSTREAM_AMP (unset: upstream f32), SKIP_BUILD=1,
# SKIP_FORWARD=1 (no in-process forward table), TAG (suffix of the JSON files).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-target/bench}
PYTHON=${PYTHON:-/work/upstream-venv/bin/python}
THREADS=${THREADS:-2}
PAIRS=${PAIRS:-20}
SECONDS_PER_LEVEL=${SECONDS_PER_LEVEL:-10}
CONCURRENCY=${CONCURRENCY:-1,2,4,8}
SHAPES=${SHAPES:-short,long,three}
DTYPE=${DTYPE:-f32}
TAG=${TAG:-$DTYPE}

if [ "${SKIP_BUILD:-0}" != 1 ]; then
    cargo build --release --bins -p layad -p layad-worker-gpu -p layad-worker-ane -p layad-system-tests -p layad-engine-bench
fi
mkdir -p "$OUT"
# Writes the checkpoint once (reused while its spec is unchanged). With SKIP_FORWARD=1 only that.
if [ "${SKIP_FORWARD:-0}" != 1 ]; then
    target/release/layad-bench --out-dir "$OUT" --models modernbert-large --lengths 64,512 --rows 1 \
        --precisions "$DTYPE" --threads "$THREADS" --python none --json "$OUT/forward-$TAG-1row.json"
    target/release/layad-bench --out-dir "$OUT" --models modernbert-large --lengths 58 --rows 3 \
        --precisions "$DTYPE" --threads "$THREADS" --python none --json "$OUT/forward-$TAG-3rows.json"
else
    target/release/layad-bench --out-dir "$OUT" --models modernbert-large --lengths 8 --rows 1 \
        --precisions f32 --threads "$THREADS" --python none --max-runs 1 --min-runs 1 --json "$OUT/forward-write.json"
fi
EXTRA=()
if [ -n "${BATCH_WAIT:-}" ]; then EXTRA+=(--batch-wait "$BATCH_WAIT"); fi
if [ -n "${UPSTREAM_AMP:-}" ]; then EXTRA+=(--upstream-amp "$UPSTREAM_AMP"); fi
target/release/layad-http-bench --checkpoint "$OUT/modernbert-large-v50368" --upstream-python "$PYTHON" \
    --threads "$THREADS" --pairs "$PAIRS" --seconds "$SECONDS_PER_LEVEL" --concurrency "$CONCURRENCY" \
    --shapes "$SHAPES" --dtype "$DTYPE" --out "$OUT/served-$TAG.json" "${EXTRA[@]}"
