#!/usr/bin/env bash
# Ready after start, paired (docs/benchmarks.md, "Start-up"): the full-size random ModernBERT-large
# checkpoint written by layad-bench, started RUNS times in turn by each side, order alternating
# A B B A:
#   A  layad-worker-gpu alone (the process that loads, packs and warms the checkpoint; the supervisor
#      waits for it and adds its own few hundred milliseconds): start until its socket is bound,
#      which it does only once loaded and warm. Its log's phase timings are kept.
#   B  upstream `laya-serve` from PYTHON's venv on the same files (a fake HF home whose `english`
#      root is the checkpoint, as layad-http-bench builds it): start until /health answers 200.
#
#   flock -x /work/cpu.lock tools/bench/startup.sh [checkpoint-dir]
# Knobs (environment): WORKER (target/release/layad-worker-gpu), PYTHON
# (/work/venvs/laya-0.4.15/bin/python), THREADS (2), DTYPE (f32), RUNS (3), OUT (target/bench/startup),
# PORT (18931).
set -euo pipefail
cd "$(dirname "$0")/../.."
CHECKPOINT=$(realpath "${1:-target/bench/modernbert-large-v50368}")
WORKER=${WORKER:-target/release/layad-worker-gpu}
PYTHON=${PYTHON:-/work/venvs/laya-0.4.15/bin/python}
THREADS=${THREADS:-2}
DTYPE=${DTYPE:-f32}
RUNS=${RUNS:-3}
OUT=${OUT:-target/bench/startup}
PORT=${PORT:-18931}
mkdir -p "$OUT"
grep -m1 "model name" /proc/cpuinfo
grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512bw|avx512_vnni|avx512_bf16|amx_int8|amx_bf16)$' | tr '\n' ' '
echo; uptime

# The fake HF home: hub/models--convaiinnovations--laya/snapshots/<rev>/ -> the checkpoint's files.
HF=$(mktemp -d)
trap 'rm -rf "$HF"' EXIT
REV=0000000000000000000000000000000000000bec
SNAP="$HF/hub/models--convaiinnovations--laya/snapshots/$REV"
for f in rl_agent_config.json model.safetensors encoder/config.json tokenizer/tokenizer.json tokenizer/tokenizer_config.json; do
    mkdir -p "$(dirname "$SNAP/$f")"
    ln -s "$CHECKPOINT/$f" "$SNAP/$f"
done
mkdir -p "$HF/hub/models--convaiinnovations--laya/refs"
printf %s "$REV" > "$HF/hub/models--convaiinnovations--laya/refs/main"

now() { date +%s.%N; }

run_layad() {  # $1: log file; prints seconds to ready
    local dir; dir=$(mktemp -d); chmod 700 "$dir"
    local t0; t0=$(now)
    "$WORKER" --socket "$dir/w.sock" --checkpoint "english=$CHECKPOINT" --threads "$THREADS" \
        --dtype "$DTYPE" --log-format text >"$1" 2>&1 &
    local pid=$!
    while [ ! -S "$dir/w.sock" ]; do
        kill -0 "$pid" 2>/dev/null || { echo "worker exited; see $1" >&2; exit 1; }
        sleep 0.05
    done
    local t1; t1=$(now)
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
    rm -rf "$dir"
    echo "$t1 - $t0" | bc -l
}

run_upstream() {  # $1: log file
    local t0; t0=$(now)
    env HF_HOME="$HF" HF_HUB_OFFLINE=1 LAYA_DEVICE=cpu LAYA_HOST=127.0.0.1 LAYA_PORT="$PORT" \
        LAYA_MODELS=english LAYA_THREADS="$THREADS" LAYA_LOG_LEVEL=warning -u LAYA_API_KEY -u LAYA_CPU_AMP \
        "$(dirname "$PYTHON")/laya-serve" >"$1" 2>&1 &
    local pid=$!
    until curl -fs -o /dev/null "http://127.0.0.1:$PORT/health"; do
        kill -0 "$pid" 2>/dev/null || { echo "laya-serve exited; see $1" >&2; exit 1; }
        sleep 0.05
    done
    local t1; t1=$(now)
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
    echo "$t1 - $t0" | bc -l
}

i=0
for side in A B B A A B; do
    [ "$i" -ge $((2 * RUNS)) ] && break
    i=$((i + 1))
    if [ "$side" = A ]; then
        s=$(run_layad "$OUT/layad-$i.log")
        printf 'run %d layad-worker-gpu (%s) ready after %.2f s\n' "$i" "$DTYPE" "$s"
        grep -hoE '(weights loaded|int8 gate[^"]*|warm-up done).*' "$OUT/layad-$i.log" | sed 's/^/    /' || true
    else
        s=$(run_upstream "$OUT/upstream-$i.log")
        printf 'run %d laya-serve (%s) ready after %.2f s\n' "$i" "$("$PYTHON" -c 'import importlib.metadata as m; print("laya", m.version("laya"))')" "$s"
    fi
    echo "$side $s" >>"$OUT/times.txt"
done
uptime
