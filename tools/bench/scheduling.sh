#!/usr/bin/env bash
# Scheduling benchmarks, end to end on this machine, open loop (tools: layad-load run / compare).
#
#   EXPERIMENT=split         one general pool of two workers vs the same two cores split into a short
#                            pool + a general pool, with and without spill (issue "heterogeneous pools")
#   EXPERIMENT=added-device  one general pool of one worker (a) vs the same plus a short pool on a
#                            second core (b), each in shortest-first and in arrival order (issue 16)
#
# Steps: release build; a random-weight checkpoint from layad-bench (also timing one forward on one
# thread) behind a fake Hugging Face cache; then per seed, per configuration in
# config/examples/bench-*.toml (in alternating order from seed to seed: A B C D, D C B A, ...):
# start `layad serve`, wait until every worker is ready, (first run only) measure closed-loop capacity
# and fix the offered load at LOAD_FRACTION of it (saved in $OUT/rate, reused by later calls with the
# same OUT), run `layad-load run` for each arrival pattern, stop the server. Every configuration of a
# seed gets identical requests, judged against one reference ($OUT/reference-<seed>.json, answered
# by the first server of that seed). Finally `layad-load compare` over every result in $OUT.
#
# Run it in sections under the benchmark lock, one or two seeds at a time, e.g.
#   flock -x /work/cpu.lock env EXPERIMENT=added-device SEEDS=11 tools/bench/scheduling.sh
# then SEEDS=12, ...; each call adds its runs to $OUT and recomputes the comparison over all of them.
#
# Results: $OUT/*.json, $OUT/runs.log (commit, time, load average per run), $OUT/compare.md and
# compare.json, $PLOT; for added-device also $OUT/replay.md and replay.json (`layad-load replay`: the
# same arrivals on idealised servers, what the policy itself allows on this hardware). Knobs
# (environment): EXPERIMENT, SEEDS, ARRIVALS, RUN_SECONDS (default: long enough for about 600 short
# requests per run), CAPACITY_SECONDS, CLIENTS, LOAD_FRACTION, RATE (skip the capacity run), PORT,
# CHECKPOINT (a checkpoint directory instead of layad-bench's), CONFIGS, SKIP_BUILD=1, SKIP_RUNS=1
# (only compare), BIN, OUT, PLOT, PAIR (split only).
set -euo pipefail

cd "$(dirname "$0")/../.."
EXPERIMENT=${EXPERIMENT:-split}
case $EXPERIMENT in
    split)
        CONFIGS=${CONFIGS:-general short-spill short-nospill}
        ARRIVALS=${ARRIVALS:-poisson bursty}
        SEEDS=${SEEDS:-1}
        PLOT=${PLOT:-docs/scheduling.svg}
        # PAIR: the comparison to print, `candidate vs baseline` by label (tools/bench/suite runs
        # only the two short-pool configurations and compares spill on with spill off).
        PAIRS=("${PAIR:-short 1x1 + general 1x1, spill vs general 2x1}")
        ;;
    added-device)
        CONFIGS=${CONFIGS:-one-general added-short one-general-arrival added-short-arrival}
        ARRIVALS=${ARRIVALS:-bursty}
        SEEDS=${SEEDS:-11 12 13 14 15}
        PLOT=${PLOT:-docs/scheduling-added-device.svg}
        PAIRS=(
            "(b) general 1x1 + short 1x1 vs (a) general 1x1"
            "(b) general 1x1 + short 1x1 vs (a) general 1x1, arrival order"
            "(b) general 1x1 + short 1x1, arrival order vs (a) general 1x1, arrival order"
            "(a) general 1x1 vs (a) general 1x1, arrival order"
        )
        ;;
    *)
        echo "EXPERIMENT must be split or added-device, not '$EXPERIMENT'" >&2
        exit 2
        ;;
esac
OUT=${OUT:-target/bench/scheduling-$EXPERIMENT}
CAPACITY_SECONDS=${CAPACITY_SECONDS:-30}
CLIENTS=${CLIENTS:-4}
LOAD_FRACTION=${LOAD_FRACTION:-0.7}
RATE=${RATE:-}
PORT=${PORT:-18650}
CHECKPOINT=${CHECKPOINT:-}
# BIN=target/debug with SKIP_BUILD=1 checks the script itself on debug binaries.
BIN=${BIN:-target/release}
URL=http://127.0.0.1:$PORT

label_of() {
    case $1 in
        general) echo "general 2x1" ;;
        short-spill) echo "short 1x1 + general 1x1, spill" ;;
        short-nospill) echo "short 1x1 + general 1x1, no spill" ;;
        one-general) echo "(a) general 1x1" ;;
        one-general-arrival) echo "(a) general 1x1, arrival order" ;;
        added-short) echo "(b) general 1x1 + short 1x1" ;;
        added-short-arrival) echo "(b) general 1x1 + short 1x1, arrival order" ;;
        *) echo "$1" ;;
    esac
}

compare() {
    # The headline pattern; every configuration of a seed saw the same bursty arrivals.
    local results=("$OUT"/*-bursty-s*.json)
    [ -e "${results[0]}" ] || return 0
    local args=()
    for pair in "${PAIRS[@]}"; do
        args+=(--pair "$pair")
    done
    "$BIN/layad-load" compare "${args[@]}" --json "$OUT/compare.json" --plot "$PLOT" "${results[@]}" \
        | tee "$OUT/compare.md"
    echo "results in $OUT; comparison in $OUT/compare.md; plot in $PLOT" >&2
    # What an ideal shortest-first scheduler would reach on the same arrivals and device times.
    local added=("$OUT"/added-short-bursty-s*.json)
    if [ "$EXPERIMENT" = added-device ] && [ -e "${added[0]}" ]; then
        "$BIN/layad-load" replay --json "$OUT/replay.json" "${added[@]}" | tee "$OUT/replay.md"
    fi
}

mkdir -p "$OUT"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    cargo build --release -p layad -p layad-worker-gpu -p layad-worker-ane -p layad-system-tests -p layad-engine-bench --bins
fi
if [ "${SKIP_RUNS:-0}" = 1 ]; then
    compare
    exit 0
fi

# The checkpoint: layad-bench's modernbert-mini (8 x 384 random weights, max_len 512), whose
# 64-token row takes tens of milliseconds on one core, so queueing dominates latency. The same call
# times one forward of 64, 128 and 384 tokens on one thread, recorded with the results.
if [ -z "$CHECKPOINT" ]; then
    if [ ! -f "$OUT/modernbert-mini-v1024/model.safetensors" ]; then
        "$BIN/layad-bench" --out-dir "$OUT" --models modernbert-mini --lengths 64,128,384 --rows 1 \
            --precisions f32 --threads 1 --python none --min-runs 5 --max-runs 20 \
            --json "$OUT/checkpoint-forward.json"
    fi
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

COMMIT=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- supervisor config proto worker-gpu tests || echo "+changes")
[ -z "$RATE" ] && [ -f "$OUT/rate" ] && RATE=$(cat "$OUT/rate")
read -r -a CONFIG_LIST <<< "$CONFIGS"
round=0
for seed in $SEEDS; do
    order=("${CONFIG_LIST[@]}")
    if [ $((round % 2)) = 1 ]; then
        # Every other seed in reverse order, so drifts of the machine's speed fall on all alike.
        order=()
        for ((i = ${#CONFIG_LIST[@]} - 1; i >= 0; i--)); do order+=("${CONFIG_LIST[$i]}"); done
    fi
    round=$((round + 1))
    for config in "${order[@]}"; do
        echo "== seed $seed: $config" >&2
        start_server "$config"
        if [ -z "$RATE" ]; then
            CAPACITY=$("$BIN/layad-load" capacity --url "$URL" --seconds "$CAPACITY_SECONDS" --clients "$CLIENTS" \
                --seed "$seed" --reference "$OUT/reference-$seed.json" --out "$OUT/capacity-$config.json" \
                | tee /dev/stderr | awk '/^capacity_rps/ {print $2}')
            if [ -z "$CAPACITY" ]; then
                echo "layad-load capacity printed no capacity_rps line" >&2
                exit 1
            fi
            RATE=$(awk -v c="$CAPACITY" -v f="$LOAD_FRACTION" 'BEGIN {printf "%.3f", c * f}')
            echo "$RATE" > "$OUT/rate"
            echo "capacity of $config: $CAPACITY req/s; offered load: $RATE req/s" >&2
        fi
        # About 600 short requests (60% of arrivals) per run, in whole 3-second burst cycles.
        SECONDS_PER_RUN=${RUN_SECONDS:-$(awk -v r="$RATE" 'BEGIN {s = 600 / (0.6 * r); s = 3 * int((s + 2.999) / 3); print (s < 60 ? 60 : s)}')}
        for arrivals in $ARRIVALS; do
            load_before=$(cut -d' ' -f1-3 /proc/loadavg)
            "$BIN/layad-load" run --url "$URL" --rate "$RATE" --seconds "$SECONDS_PER_RUN" --arrivals "$arrivals" \
                --seed "$seed" --reference "$OUT/reference-$seed.json" --label "$(label_of "$config")" \
                --out "$OUT/$config-$arrivals-s$seed.json"
            printf '%s commit=%s seed=%s config=%s arrivals=%s rate=%s seconds=%s load_before=[%s] load_after=[%s]\n' \
                "$(date -Is)" "$COMMIT" "$seed" "$config" "$arrivals" "$RATE" "$SECONDS_PER_RUN" "$load_before" \
                "$(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/runs.log"
        done
        stop_server
    done
done

compare
