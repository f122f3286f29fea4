#!/usr/bin/env bash
# The soak of issue 12: a fresh release layad on the fixture checkpoints (one general pool of two
# single-threaded CPU workers, so killing one leaves one serving; everything else at its defaults),
# its own loopback port and socket directory under a temporary directory. Measures closed-loop
# capacity with `layad-load capacity` (the mixed workload: short, medium and long one-question
# requests and short four-question ones), then runs `layad-load run` open loop at LOAD_FRACTION of
# it for SOAK_SECONDS while soak_monitor.py SIGKILLs one worker every KILL_EVERY seconds (the slots
# in turn) and samples the supervisor's and the workers' RSS every SAMPLE_EVERY seconds. Prints and
# writes $OUT/soak.json: requests, failures, kills, restarts, RSS, the supervisor's RSS slope after
# WARMUP seconds (beside it: run.json.gz with every request's record, rss.csv, kills.csv, the log's
# events). Exits 1 when a request failed or the slope is >= SLOPE_LIMIT MB/min; the server's log is
# then kept (its path is printed).
#
#   flock -x /work/cpu.lock tools/reliability/soak.sh                 # the 10-minute soak
#   SOAK_SECONDS=60 KILL_EVERY=15 WARMUP=20 flock -s /work/cpu.lock tools/reliability/soak.sh   # a short try
#
# Knobs (environment): BIN_DIR (layad, layad-worker-gpu, layad-load; default target/release),
# SOAK_SECONDS (600), KILL_EVERY (30; 0 = no kills), SAMPLE_EVERY (5), WARMUP (120), SLOPE_LIMIT (1),
# LOAD_FRACTION (0.7), CAPACITY_SECONDS (30), CLIENTS (4), RATE (skip the capacity run), ARRIVALS
# (poisson | bursty), SEED (1), PORT (default: a free one), OUT (target/reliability/soak),
# CPU_LOCK (which lock the caller holds, recorded: e.g. "exclusive /work/cpu.lock"), EXTRA_CONFIG
# (TOML appended to the configuration, for diagnostic runs; recorded in soak.json and layad.toml).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
BIN_DIR=${BIN_DIR:-$root/target/release}
SOAK_SECONDS=${SOAK_SECONDS:-600}
KILL_EVERY=${KILL_EVERY:-30}
SAMPLE_EVERY=${SAMPLE_EVERY:-5}
WARMUP=${WARMUP:-120}
SLOPE_LIMIT=${SLOPE_LIMIT:-1}
LOAD_FRACTION=${LOAD_FRACTION:-0.7}
CAPACITY_SECONDS=${CAPACITY_SECONDS:-30}
CLIENTS=${CLIENTS:-4}
RATE=${RATE:-}
ARRIVALS=${ARRIVALS:-poisson}
SEED=${SEED:-1}
OUT=${OUT:-$root/target/reliability/soak}
CPU_LOCK=${CPU_LOCK:-not stated}
monitor_py=$root/tools/reliability/soak_monitor.py

for binary in layad layad-worker-gpu layad-load; do
    [ -x "$BIN_DIR/$binary" ] || {
        echo "no $BIN_DIR/$binary: build it first (cargo build --release -p layad -p layad-worker-gpu -p layad-system-tests --bins) or set BIN_DIR" >&2
        exit 2
    }
done
port=${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
url=http://127.0.0.1:$port
mkdir -p "$OUT"
# A fresh calibration per soak: the reference answers come from this run's server.
rm -f "$OUT/reference-$SEED.json" "$OUT"/{capacity,run,soak,health-after}.json "$OUT/run.json.gz" "$OUT"/{rss,kills}.csv "$OUT"/metrics-{before,after}.txt
work=$(mktemp -d "${TMPDIR:-/tmp}/layad-soak.XXXXXX")

server_pid=
monitor_pid=
load_pid=
keep_work=0
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    for pid in "$load_pid" "$monitor_pid"; do
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    if [ "$keep_work" = 1 ]; then
        echo "kept the server's log and configuration: $work/layad.log, $work/layad.toml" >&2
    else
        rm -rf "$work"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

config="# tools/reliability/soak.sh: one general pool of two single-threaded CPU workers (killing one
# leaves one serving); every other key at its default. The socket directory comes from
# LAYAD_WORKERS__SOCKET_DIR (a temporary directory), the address from --listen.
[[pool]]
name = \"general\"
device = \"cpu\"
workers = 2
threads = 1"
if [ -n "${EXTRA_CONFIG:-}" ]; then
    # A diagnostic run's extra keys (e.g. $'[workers]\nrestart_backoff_max = "1s"'), recorded with the results.
    config="$config
# EXTRA_CONFIG:
$EXTRA_CONFIG"
fi
printf '%s\n' "$config" > "$work/layad.toml"
cp "$work/layad.toml" "$OUT/layad.toml"

cpu_model=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
started_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)
command="$(printf '%q ' env SOAK_SECONDS="$SOAK_SECONDS" KILL_EVERY="$KILL_EVERY" WARMUP="$WARMUP" \
    LOAD_FRACTION="$LOAD_FRACTION" ARRIVALS="$ARRIVALS" SEED="$SEED" ${EXTRA_CONFIG:+EXTRA_CONFIG="$EXTRA_CONFIG"} "$0")"
command=${command% }
echo "== layad soak, $started_utc"
echo "cpu: $cpu_model ($(nproc) cpus; load average $(cut -d' ' -f1-3 /proc/loadavg)); cpu lock: $CPU_LOCK"
binaries="$BIN_DIR ($("$BIN_DIR/layad" --version 2>/dev/null || echo "layad, version unknown"); built $(date -u -r "$BIN_DIR/layad" +%Y-%m-%dT%H:%M:%SZ))"
echo "binaries: $binaries"

HF_HOME="$root/tests/fixtures/hf-cache" HF_HUB_OFFLINE=1 LAYAD_WORKERS__SOCKET_DIR="$work/sockets" \
    "$BIN_DIR/layad" serve --config "$work/layad.toml" --listen "127.0.0.1:$port" > "$work/layad.log" 2>&1 &
server_pid=$!
# /readyz is 200 once one worker per checkpoint is up; the soak starts with every worker ready.
for _ in $(seq 300); do
    if ! kill -0 "$server_pid" 2>/dev/null; then
        keep_work=1
        echo "layad exited before it was ready:" >&2
        tail -20 "$work/layad.log" >&2
        exit 1
    fi
    if curl -sf "$url/health" | grep -q '"status":"ok"'; then
        break
    fi
    sleep 1
done
curl -sf "$url/health" | grep -q '"status":"ok"' || {
    keep_work=1
    echo "layad not ready after 300 s" >&2
    exit 1
}
echo "layad pid $server_pid on 127.0.0.1:$port; its children: $(pgrep -P "$server_pid" | tr '\n' ' ')"

reference=$OUT/reference-$SEED.json
if [ -z "$RATE" ]; then
    capacity=$("$BIN_DIR/layad-load" capacity --url "$url" --seconds "$CAPACITY_SECONDS" --clients "$CLIENTS" \
        --seed "$SEED" --reference "$reference" --out "$OUT/capacity.json" | tee /dev/stderr | awk '/^capacity_rps/ {print $2}')
    [ -n "$capacity" ] || { echo "layad-load capacity printed no capacity_rps line" >&2; exit 1; }
    RATE=$(awk -v c="$capacity" -v f="$LOAD_FRACTION" 'BEGIN {printf "%.3f", c * f}')
    echo "capacity $capacity req/s (closed loop, $CLIENTS clients, $CAPACITY_SECONDS s); offered load $RATE req/s"
fi

curl -sf "$url/metrics" > "$OUT/metrics-before.txt" || true
echo "== soak: $SOAK_SECONDS s, $ARRIVALS arrivals at $RATE req/s, a worker SIGKILLed every $KILL_EVERY s, RSS every $SAMPLE_EVERY s"
python3 "$monitor_py" monitor --addr "127.0.0.1:$port" --pid "$server_pid" --seconds "$SOAK_SECONDS" \
    --kill-every "$KILL_EVERY" --sample-every "$SAMPLE_EVERY" --samples "$OUT/rss.csv" --kills "$OUT/kills.csv" &
monitor_pid=$!
"$BIN_DIR/layad-load" run --url "$url" --rate "$RATE" --seconds "$SOAK_SECONDS" --arrivals "$ARRIVALS" \
    --seed "$SEED" --reference "$reference" --label soak --out "$OUT/run.json" &
load_pid=$!
load_status=0
wait "$load_pid" || load_status=$?
load_pid=
monitor_status=0
wait "$monitor_pid" || monitor_status=$?
monitor_pid=
# The last kill's restart and warm-up take a moment: /health is 'ok' again once every worker is back.
for _ in $(seq 60); do
    curl -s "$url/health" > "$OUT/health-after.json" && grep -q '"status":"ok"' "$OUT/health-after.json" && break
    sleep 1
done
curl -sf "$url/metrics" > "$OUT/metrics-after.txt" || true
# The log without its 200 request lines (those are in run.json): starts, kills, restarts, errors.
grep -v -E 'v1/systemone.*status.*200' "$work/layad.log" > "$OUT/layad-events.log" || true
if [ "$load_status" != 0 ] || [ ! -f "$OUT/run.json" ]; then
    keep_work=1
    echo "layad-load run failed (status $load_status)" >&2
    exit 1
fi

echo "== result"
report_status=0
capacity_args=()
[ -f "$OUT/capacity.json" ] && capacity_args=(--capacity "$OUT/capacity.json")
python3 "$monitor_py" report --load "$OUT/run.json" "${capacity_args[@]}" --fraction "$LOAD_FRACTION" \
    --samples "$OUT/rss.csv" --kills "$OUT/kills.csv" --kill-every "$KILL_EVERY" --sample-every "$SAMPLE_EVERY" \
    --metrics-before "$OUT/metrics-before.txt" --metrics-after "$OUT/metrics-after.txt" --log "$work/layad.log" \
    --health-after "$OUT/health-after.json" --warmup "$WARMUP" --slope-limit "$SLOPE_LIMIT" --command "$command" \
    --cpu-model "$cpu_model" --started-utc "$started_utc" --cpu-lock "$CPU_LOCK" --config-text "$config" \
    --binaries "$binaries" \
    --out "$OUT/soak.json" || report_status=$?
# Every request's record stays, compressed (tens of MB as text for a 10-minute run).
gzip -f "$OUT/run.json"
if [ "$monitor_status" != 0 ]; then
    echo "the monitor failed (status $monitor_status): see the lines above" >&2
    report_status=1
fi
if [ "$report_status" != 0 ]; then
    keep_work=1
    echo "results in $OUT; server log: $work/layad.log" >&2
    exit 1
fi
echo "results in $OUT"
