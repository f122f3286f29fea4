#!/usr/bin/env bash
# Scheduling benchmark (issue "heterogeneous pools"), end to end on this machine: one general pool
# vs a short pool + general pool with and without spill, under open-loop Poisson and bursty load.
#
# Steps: release build; a random-weight checkpoint from layad-bench (also timing one forward on one
# thread) behind a fake Hugging Face cache; per configuration in config/examples/bench-*.toml:
# start `layad serve`, wait until every worker is ready, (first configuration only) measure closed-loop capacity,
# run `layad-load run` at LOAD_FRACTION of it for both arrival patterns with one seed, stop the
# server; then plot. Every configuration gets identical requests, judged against one reference
# (bodies and answers saved by the first layad-load call in $OUT/reference.json).
#
# Results: $OUT/*.json (default target/bench/scheduling), $OUT/table.md, $PLOT (docs/scheduling.svg).
# Knobs (environment): RUN_SECONDS, CAPACITY_SECONDS, CLIENTS, SEED, LOAD_FRACTION, RATE (skip the
# capacity run), PORT, CHECKPOINT (a checkpoint directory instead of layad-bench's), CONFIGS,
# SKIP_BUILD=1, BIN, OUT, PLOT.
set -euo pipefail

cd "$(dirname "$0")/../.."
OUT=${OUT:-target/bench/scheduling}
PLOT=${PLOT:-docs/scheduling.svg}
RUN_SECONDS=${RUN_SECONDS:-120}
CAPACITY_SECONDS=${CAPACITY_SECONDS:-30}
CLIENTS=${CLIENTS:-4}
SEED=${SEED:-1}
LOAD_FRACTION=${LOAD_FRACTION:-0.7}
RATE=${RATE:-}
PORT=${PORT:-18650}
CHECKPOINT=${CHECKPOINT:-}
# The first configuration is the one whose capacity sets the offered load for all of them.
CONFIGS=${CONFIGS:-general short-spill short-nospill}
# BIN=target/debug with SKIP_BUILD=1 checks the script itself on debug binaries.
BIN=${BIN:-target/release}
URL=http://127.0.0.1:$PORT

label_of() {
    case $1 in
        general) echo "general 2x1" ;;
        short-spill) echo "short 1x1 + general 1x1, spill" ;;
        short-nospill) echo "short 1x1 + general 1x1, no spill" ;;
        *) echo "$1" ;;
    esac
}

mkdir -p "$OUT"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    cargo build --release -p layad -p layad-worker-gpu -p layad-system-tests --bins
fi

# The checkpoint: layad-bench's modernbert-mini (8 x 384 random weights, max_len 512), whose
# 64-token row takes tens of milliseconds on one core, so queueing dominates latency. The same call
# times one forward of 64, 128 and 384 tokens on one thread, recorded with the results.
if [ -z "$CHECKPOINT" ]; then
    "$BIN/layad-bench" --out-dir "$OUT" --models modernbert-mini --lengths 64,128,384 --rows 1 \
        --precisions f32 --threads 1 --python none --min-runs 5 --max-runs 20 \
        --json "$OUT/checkpoint-forward.json"
    CHECKPOINT=$OUT/modernbert-mini-v1024
fi
CHECKPOINT=$(cd "$CHECKPOINT" && pwd)

# A fake Hugging Face cache whose bundle root (`english`) is the checkpoint, so the configurations
# keep `checkpoints.english = "hf"` and carry no machine-specific path.
HF=$OUT/hf-home
REVISION=00000000000000000000000000000000005c4ed0
SNAPSHOT=$HF/hub/models--convaiinnovations--laya/snapshots/$REVISION
rm -rf "$HF"
mkdir -p "$SNAPSHOT/encoder" "$SNAPSHOT/tokenizer" "$HF/hub/models--convaiinnovations--laya/refs"
for file in rl_agent_config.json model.safetensors encoder/config.json tokenizer/tokenizer.json \
    tokenizer/tokenizer_config.json; do
    ln -s "$CHECKPOINT/$file" "$SNAPSHOT/$file"
done
printf %s "$REVISION" > "$HF/hub/models--convaiinnovations--laya/refs/main"

SERVER_PID=
stop_server() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID"
        wait "$SERVER_PID" || true
    fi
    SERVER_PID=
}
trap stop_server EXIT

start_server() { # config name
    HF_HOME=$HF HF_HUB_OFFLINE=1 LAYAD_WORKERS__SOCKET_DIR=$OUT/sockets \
        "$BIN/layad" serve --config "config/examples/bench-$1.toml" --listen "127.0.0.1:$PORT" \
        > "$OUT/layad-$1.log" 2>&1 &
    SERVER_PID=$!
    # Workers warm up on the longest row before joining: minutes on a slow checkpoint.
    for _ in $(seq 600); do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "layad exited before it was ready; see $OUT/layad-$1.log" >&2
            tail -20 "$OUT/layad-$1.log" >&2
            exit 1
        fi
        # /readyz is 200 once one worker per checkpoint is up; wait for every worker of every pool.
        if curl -sf "$URL/health" | grep -q '"status":"ok"'; then
            return
        fi
        sleep 1
    done
    echo "layad not ready after 600 s; see $OUT/layad-$1.log" >&2
    exit 1
}

REFERENCE=$OUT/reference.json
rm -f "$REFERENCE"
RESULTS_POISSON=()
RESULTS_BURSTY=()
for config in $CONFIGS; do
    echo "== $config" >&2
    start_server "$config"
    if [ -z "$RATE" ]; then
        CAPACITY=$("$BIN/layad-load" capacity --url "$URL" --seconds "$CAPACITY_SECONDS" --clients "$CLIENTS" \
            --seed "$SEED" --reference "$REFERENCE" --out "$OUT/capacity-$config.json" \
            | tee /dev/stderr | awk '/^capacity_rps/ {print $2}')
        if [ -z "$CAPACITY" ]; then
            echo "layad-load capacity printed no capacity_rps line" >&2
            exit 1
        fi
        RATE=$(awk -v c="$CAPACITY" -v f="$LOAD_FRACTION" 'BEGIN {printf "%.3f", c * f}')
        echo "capacity of $config: $CAPACITY req/s; offered load: $RATE req/s" >&2
    fi
    for arrivals in poisson bursty; do
        "$BIN/layad-load" run --url "$URL" --rate "$RATE" --seconds "$RUN_SECONDS" --arrivals "$arrivals" \
            --seed "$SEED" --reference "$REFERENCE" --label "$(label_of "$config")" \
            --out "$OUT/$config-$arrivals.json"
    done
    RESULTS_POISSON+=("$OUT/$config-poisson.json")
    RESULTS_BURSTY+=("$OUT/$config-bursty.json")
    stop_server
done

"$BIN/layad-load" plot --out "$PLOT" "${RESULTS_POISSON[@]}" "${RESULTS_BURSTY[@]}" | tee "$OUT/table.md"
echo "results in $OUT; plot in $PLOT" >&2
