#!/usr/bin/env bash
# Slow-device benchmark (issue 40): does layad leave a device that slows down, and come back to it?
#
# Two single-thread CPU pools on one checkpoint (config/examples/bench-slow-device.toml): `a` takes
# short single questions only, `b` anything. Open-loop Poisson short requests (`layad-load run
# --only short-1q`) at RATE per second for RUN_SECONDS.
#
#   CASES=slow  from SLOW_FROM to SLOW_FROM + SLOW_FOR seconds, pool a's worker runs only DUTY of
#               every PERIOD_MS (SIGSTOP/SIGCONT from outside, tools/bench/slow_device.py throttle):
#               a device suddenly at a quarter of its speed. Per 3-second window: P50, P99, requests
#               to a / b, probes, errors; and the verdicts over the slow windows (slow_device.py
#               windows).
#   CASES=one   the floor: pool b alone (bench-slow-device-one.toml), nothing slowed, the same
#               arrivals. While a runs at a quarter of its speed, b taking all the traffic is about
#               the best any placement can do, so the slow run's windows are read against these.
#   CASES=hog   the competing process: pool a's worker pinned to CPU 0 and b's to CPU 1 (taskset),
#               then three runs: alone; with a busy loop pinned to CPU 0 beside a's worker from the
#               first arrival on (the CPU version of a GPU shared with a local LLM); the same with
#               spill off (bench-slow-device-nospill.toml).
#
# Steps: release build; the checkpoint and fake Hugging Face cache as tools/bench/scheduling.sh makes
# them (layad-bench's random modernbert-mini, 8 x 384: a 64-token row takes ~35 ms on one core);
# per seed and case, start `layad serve`, wait until every worker is ready, run, stop.
#
# Run it under the benchmark lock:
#   flock -x /work/cpu.lock tools/bench/slow-device.sh
# Knobs (environment): CASES, SEEDS, RATE, RUN_SECONDS, SLOW_FROM, SLOW_FOR, DUTY, PERIOD_MS,
# HOG_CPU, LAYAD (the supervisor binary, e.g. another build's, run with this build's workers; its
# results get LABEL_SUFFIX), LABEL_SUFFIX, PORT, CHECKPOINT, SKIP_BUILD=1, BIN, WORKER_BIN (the
# workers' directory; default BIN), SLOW_CONFIG (the slow case's configuration, pools `a` and `b`;
# default config/examples/bench-slow-device.toml: tools/device/cuda-check.sh puts `a` on the GPU),
# OUT.
# Results: $OUT/<case>-<config>-s<seed>.json (layad-load), throttle-*.json, windows-*.md/.json,
# hog.md, runs.log (commit, time, load average per run).
set -euo pipefail

cd "$(dirname "$0")/../.."
CASES=${CASES:-slow hog}
SEEDS=${SEEDS:-1}
RATE=${RATE:-20}
RUN_SECONDS=${RUN_SECONDS:-36}
SLOW_FROM=${SLOW_FROM:-12}
SLOW_FOR=${SLOW_FOR:-12}
DUTY=${DUTY:-0.25}
PERIOD_MS=${PERIOD_MS:-20}
HOG_CPU=${HOG_CPU:-0}
PORT=${PORT:-18660}
CHECKPOINT=${CHECKPOINT:-}
BIN=${BIN:-target/release}
WORKER_BIN=${WORKER_BIN:-$BIN}
SLOW_CONFIG=${SLOW_CONFIG:-config/examples/bench-slow-device.toml}
LAYAD=${LAYAD:-$BIN/layad}
LABEL_SUFFIX=${LABEL_SUFFIX:-}
OUT=${OUT:-target/bench/slow-device}
URL=http://127.0.0.1:$PORT
TOOL=tools/bench/slow_device.py

mkdir -p "$OUT"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    cargo build --release -p layad -p layad-worker-gpu -p layad-system-tests -p layad-engine-bench --bins
fi

if [ -z "$CHECKPOINT" ]; then
    if [ ! -f "$OUT/modernbert-mini-v1024/model.safetensors" ]; then
        "$BIN/layad-bench" --out-dir "$OUT" --models modernbert-mini --lengths 64,128,384 --rows 1 \
            --precisions f32 --threads 1 --python none --min-runs 5 --max-runs 20 \
            --json "$OUT/checkpoint-forward.json"
    fi
    CHECKPOINT=$OUT/modernbert-mini-v1024
fi
CHECKPOINT=$(cd "$CHECKPOINT" && pwd)

# A fake Hugging Face cache whose bundle root (`english`) is the checkpoint (as scheduling.sh).
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
HOG_PID=
stop_all() {
    if [ -n "$HOG_PID" ] && kill -0 "$HOG_PID" 2>/dev/null; then
        kill "$HOG_PID"
        wait "$HOG_PID" 2>/dev/null || true
    fi
    HOG_PID=
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID"
        wait "$SERVER_PID" || true
    fi
    SERVER_PID=
}
trap stop_all EXIT

start_server() { # configuration file
    local log
    log=$OUT/layad-$(basename "$1" .toml)$LABEL_SUFFIX.log
    HF_HOME=$HF HF_HUB_OFFLINE=1 LAYAD_WORKERS__SOCKET_DIR=$OUT/sockets LAYAD_WORKERS__BINARY_DIR=$WORKER_BIN \
        "$LAYAD" serve --config "$1" --listen "127.0.0.1:$PORT" > "$log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 600); do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "layad exited before it was ready; see $log" >&2
            tail -20 "$log" >&2
            exit 1
        fi
        if curl -sf "$URL/health" | grep -q '"status":"ok"'; then
            return
        fi
        sleep 1
    done
    echo "layad not ready after 600 s" >&2
    exit 1
}

worker_pid() { # pool name
    curl -sf "$URL/health" | python3 -c "import json, sys
pools = json.load(sys.stdin)['pools']
print([p for p in pools if p['name'] == '$1'][0]['workers'][0]['pid'])"
}

COMMIT=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- supervisor config proto worker-gpu tests || echo "+changes")
log_run() { # name seed load_before
    printf '%s commit=%s layad=%s run=%s seed=%s rate=%s seconds=%s load_before=[%s] load_after=[%s]\n' \
        "$(date -Is)" "$COMMIT" "$LAYAD" "$1" "$2" "$RATE" "$RUN_SECONDS" "$3" "$(cut -d' ' -f1-3 /proc/loadavg)" \
        >> "$OUT/runs.log"
}

load_run() { # name seed label: layad-load in the background, stderr to $OUT/load-<name>.log
    rm -f "$OUT/load-$1.log"
    "$BIN/layad-load" run --url "$URL" --rate "$RATE" --seconds "$RUN_SECONDS" --arrivals poisson \
        --only short-1q --seed "$2" --reference "$OUT/reference-$2.json" --label "$3" \
        --out "$OUT/$1.json" 2> "$OUT/load-$1.log" &
    LOAD_PID=$!
}

for seed in $SEEDS; do
    for case in $CASES; do
        case $case in
            slow)
                name=slow-s$seed$LABEL_SUFFIX
                echo "== $name" >&2
                start_server "$SLOW_CONFIG"
                load_before=$(cut -d' ' -f1-3 /proc/loadavg)
                load_run "$name" "$seed" "slow device, spill$LABEL_SUFFIX"
                python3 "$TOOL" throttle --pid "$(worker_pid a)" --after "$SLOW_FROM" --for "$SLOW_FOR" \
                    --duty "$DUTY" --period-ms "$PERIOD_MS" --marker-file "$OUT/load-$name.log" --writer "$LOAD_PID" \
                    --out "$OUT/throttle-$name.json"
                wait "$LOAD_PID"
                log_run "$name" "$seed" "$load_before"
                stop_all
                python3 "$TOOL" windows "$OUT/$name.json" --throttle "$OUT/throttle-$name.json" \
                    --json "$OUT/windows-$name.json" | tee "$OUT/windows-$name.md"
                ;;
            one)
                name=one-s$seed$LABEL_SUFFIX
                echo "== $name" >&2
                start_server config/examples/bench-slow-device-one.toml
                load_before=$(cut -d' ' -f1-3 /proc/loadavg)
                load_run "$name" "$seed" "one device (b alone), nothing slowed$LABEL_SUFFIX"
                wait "$LOAD_PID"
                log_run "$name" "$seed" "$load_before"
                stop_all
                python3 "$TOOL" windows "$OUT/$name.json" --pool b --slow-from "$SLOW_FROM" \
                    --slow-to "$((SLOW_FROM + SLOW_FOR))" --json "$OUT/windows-$name.json" | tee "$OUT/windows-$name.md"
                ;;
            hog)
                for run in alone beside nospill; do
                    config=slow-device
                    [ "$run" = nospill ] && config=slow-device-nospill
                    name=hog-$run-s$seed$LABEL_SUFFIX
                    echo "== $name" >&2
                    start_server "config/examples/bench-$config.toml"
                    taskset -a -p -c "$HOG_CPU" "$(worker_pid a)" > /dev/null
                    taskset -a -p -c "$((1 - HOG_CPU))" "$(worker_pid b)" > /dev/null
                    load_before=$(cut -d' ' -f1-3 /proc/loadavg)
                    case $run in
                        alone) label="alone: a on CPU $HOG_CPU" ;;
                        beside) label="beside: a on CPU $HOG_CPU beside a busy loop" ;;
                        nospill) label="spill off: a on CPU $HOG_CPU beside a busy loop" ;;
                    esac
                    label=$label$LABEL_SUFFIX
                    load_run "$name" "$seed" "$label"
                    if [ "$run" != alone ]; then
                        # The competing process starts with the first arrival.
                        python3 - "$OUT/load-$name.log" <<'PY'
import sys, time
while "arrivals over" not in open(sys.argv[1], errors="replace").read():
    time.sleep(0.005)
time.sleep(0.2)
PY
                        taskset -c "$HOG_CPU" sh -c 'while :; do :; done' &
                        HOG_PID=$!
                    fi
                    wait "$LOAD_PID"
                    log_run "$name" "$seed" "$load_before"
                    stop_all
                done
                python3 "$TOOL" hog "$OUT"/hog-alone-s$seed$LABEL_SUFFIX.json "$OUT"/hog-beside-s$seed$LABEL_SUFFIX.json \
                    "$OUT"/hog-nospill-s$seed$LABEL_SUFFIX.json | tee "$OUT/hog-s$seed$LABEL_SUFFIX.md"
                ;;
            *)
                echo "CASES: slow, one or hog, not '$case'" >&2
                exit 2
                ;;
        esac
    done
done
