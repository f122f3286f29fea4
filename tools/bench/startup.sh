#!/usr/bin/env bash
# Ready after start, paired (docs/benchmarks.md, "Start-up"): the full-size random ModernBERT-large
# checkpoint written by layad-bench, started RUNS times in turn by each side, order alternating
# A B B A:
#   A  layad-worker-gpu alone (each binary of WORKERS, e.g. a build before a change and after) (the process that loads, packs and warms the checkpoint; the supervisor
#      waits for it and adds its own few hundred milliseconds): start until its socket is bound,
#      which it does only once loaded and warm. Its log's phase timings are kept.
#   B  upstream `laya-serve` from PYTHON's venv on the same files (a fake HF home whose `english`
#      root is the checkpoint, as layad-http-bench builds it): start until /health answers 200.
#
#   C  the whole server, `layad serve` (SERVE, e.g. target/release/layad; the supervisor, its worker
#      and the same checkpoint as `english`, from a config file of this run's own port and socket
#      directory): start until its first decision answers 200.
# Upstream is also timed to its first answer (not only /health), so A/B/C sides compare the same
# moment: a client's first decision.
#
#   flock -x /work/cpu.lock tools/bench/startup.sh [checkpoint-dir]
# Knobs (environment): WORKERS (target/release/layad-worker-gpu; several, space-separated; empty =
# none), SERVE (a `layad` binary, or empty = no whole-server side), PYTHON
# (/work/venvs/laya-0.4.15/bin/python), THREADS (2), DTYPE (f32), RUNS (3), OUT (target/bench/startup),
# PORT (18931), COLD (1: drop the page cache before every start, so each side reads the weights
# from disk; needs root), GATE_CACHE (where layad's parity gate keeps its float32 reference between
# starts, a directory of this run's own: `first`, emptied before every layad start, so int8 and
# bf16 run the gate's float32 rows as a machine's first start does; `kept`, filled by one untimed
# start before the rounds, so each start reads them back as a restart does).
set -euo pipefail
cd "$(dirname "$0")/../.."
CHECKPOINT=$(realpath "${1:-target/bench/modernbert-large-v50368}")
read -r -a WORKERS <<<"${WORKERS-target/release/layad-worker-gpu}"
SERVE=${SERVE:-}
PYTHON=${PYTHON:-/work/venvs/laya-0.4.15/bin/python}
THREADS=${THREADS:-2}
DTYPE=${DTYPE:-f32}
RUNS=${RUNS:-3}
OUT=${OUT:-target/bench/startup}
PORT=${PORT:-18931}
COLD=${COLD:-0}
GATE_CACHE=${GATE_CACHE:-first}
case "$GATE_CACHE" in first | kept) ;; *) echo "GATE_CACHE must be first or kept, not '$GATE_CACHE'" >&2; exit 2 ;; esac
mkdir -p "$OUT"
grep -m1 "model name" /proc/cpuinfo
grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512bw|avx512_vnni|avx512_bf16|amx_int8|amx_bf16)$' | tr '\n' ' '
echo; uptime

# The fake HF home: hub/models--convaiinnovations--laya/snapshots/<rev>/ -> the checkpoint's files;
# layad's workers place their gate cache under XDG_CACHE_HOME (CACHE_DIRECTORY, a systemd unit's,
# would win: unset below). Both are removed however the script ends.
HF=$(mktemp -d)
XDG=$(mktemp -d)
trap 'rm -rf "$XDG" "$HF"' EXIT
REV=0000000000000000000000000000000000000bec
SNAP="$HF/hub/models--convaiinnovations--laya/snapshots/$REV"
for f in rl_agent_config.json model.safetensors encoder/config.json tokenizer/tokenizer.json tokenizer/tokenizer_config.json; do
    mkdir -p "$(dirname "$SNAP/$f")"
    ln -s "$CHECKPOINT/$f" "$SNAP/$f"
done
mkdir -p "$HF/hub/models--convaiinnovations--laya/refs"
printf %s "$REV" > "$HF/hub/models--convaiinnovations--laya/refs/main"

now() { date +%s.%N; }

gate_cache() { if [ "$GATE_CACHE" = first ]; then rm -rf "$XDG/layad"; fi; }

run_layad() {  # $1: worker binary, $2: log file; prints seconds to ready
    local dir; dir=$(mktemp -d); chmod 700 "$dir"
    gate_cache
    local t0; t0=$(now)
    env -u CACHE_DIRECTORY XDG_CACHE_HOME="$XDG" "$1" --socket "$dir/w.sock" --checkpoint "english=$CHECKPOINT" --threads "$THREADS" \
        --dtype "$DTYPE" --log-format json >"$2" 2>&1 &
    local pid=$!
    while [ ! -S "$dir/w.sock" ]; do
        kill -0 "$pid" 2>/dev/null || { echo "worker exited; see $2" >&2; exit 1; }
        sleep 0.05
    done
    local t1; t1=$(now)
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
    rm -rf "$dir"
    echo "$t1 - $t0" | bc -l
}

run_upstream() {  # $1: log file
    local t0; t0=$(now)
    env -u LAYA_API_KEY -u LAYA_CPU_AMP HF_HOME="$HF" HF_HUB_OFFLINE=1 LAYA_DEVICE=cpu LAYA_HOST=127.0.0.1 LAYA_PORT="$PORT" \
        LAYA_MODELS=english LAYA_THREADS="$THREADS" LAYA_LOG_LEVEL=warning \
        "$(dirname "$PYTHON")/laya-serve" >"$1" 2>&1 &
    local pid=$!
    until curl -fs -o /dev/null "http://127.0.0.1:$PORT/health"; do
        kill -0 "$pid" 2>/dev/null || { echo "laya-serve exited; see $1" >&2; exit 1; }
        sleep 0.05
    done
    local t1; t1=$(now)
    first_answer "$pid" "$1"
    local t2; t2=$(now)
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
    echo "$(echo "$t1 - $t0" | bc -l) $(echo "$t2 - $t0" | bc -l)"
}

# One decision of about 20 tokens, as a client's first request would be.
BODY='{"model": "english", "state": "I was charged twice for invoice 4411, please refund it today.",
  "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"}}}'

first_answer() {  # $1: server pid, $2: its log; returns once POST /v1/systemone answers 200
    until curl -fs -o /dev/null -H 'content-type: application/json' --data "$BODY" \
        "http://127.0.0.1:$PORT/v1/systemone"; do
        kill -0 "$1" 2>/dev/null || { echo "server exited; see $2" >&2; exit 1; }
        sleep 0.05
    done
}

run_serve() {  # $1: layad binary, $2: log file; prints seconds to its first answer
    local dir; dir=$(mktemp -d); chmod 700 "$dir"
    cat >"$dir/layad.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
[checkpoints]
english = "$CHECKPOINT"
multilingual = "off"
typed-decisions = "off"
[[pool]]
name = "cpu"
device = "cpu"
threads = $THREADS
dtype = "$DTYPE"
[workers]
socket_dir = "$dir/sockets"
[logging]
format = "json"
TOML
    gate_cache
    local t0; t0=$(now)
    env -u LAYA_MODELS -u LAYA_THREADS -u LAYA_PORT -u CACHE_DIRECTORY XDG_CACHE_HOME="$XDG" "$1" serve --offline --config "$dir/layad.toml" >"$2" 2>&1 &
    local pid=$!
    first_answer "$pid" "$2"
    local t1; t1=$(now)
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
    rm -rf "$dir"
    echo "$t1 - $t0" | bc -l
}

# `kept`: one untimed start of each layad side first, which computes and keeps the reference.
if [ "$GATE_CACHE" = kept ]; then
    for side in "${WORKERS[@]}" ${SERVE:+serve}; do
        if [ "$side" = serve ]; then run_serve "$SERVE" "$OUT/serve-fill.log" >/dev/null
        else run_layad "$side" "$OUT/layad-fill.log" >/dev/null; fi
    done
fi
LABEL=$DTYPE; [ "$GATE_CACHE" = kept ] && LABEL="$DTYPE, gate kept"

# Round r runs every worker, then upstream; every other round in the reverse order.
UPSTREAM_VERSION=$("$PYTHON" -c 'import importlib.metadata as m; print("laya", m.version("laya"))')
for r in $(seq 1 "$RUNS"); do
    sides=("${WORKERS[@]}" ${SERVE:+serve} upstream)
    if [ $((r % 2)) = 0 ]; then
        reversed=(); for ((j = ${#sides[@]} - 1; j >= 0; j--)); do reversed+=("${sides[j]}"); done; sides=("${reversed[@]}")
    fi
    for side in "${sides[@]}"; do
        if [ "$COLD" = 1 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi
        if [ "$side" = upstream ]; then
            read -r health s < <(run_upstream "$OUT/upstream-$r.log")
            printf 'round %d laya-serve (%s) /health after %.2f s, first answer after %.2f s\n' \
                "$r" "$UPSTREAM_VERSION" "$health" "$s"
        elif [ "$side" = serve ]; then
            s=$(run_serve "$SERVE" "$OUT/serve-$r.log")
            printf 'round %d %s serve (%s) first answer after %.2f s\n' "$r" "$SERVE" "$LABEL" "$s"
        else
            tag=$(basename "$(dirname "$side")")
            s=$(run_layad "$side" "$OUT/layad-$tag-$r.log")
            printf 'round %d %s (%s) ready after %.2f s\n' "$r" "$side" "$LABEL" "$s"
            grep -hE 'weights read|weights loaded|checkpoint loaded|engine loaded|int8 gate|gate: float32 reference|warm-up shape done|warm-up done|parity gate passed' "$OUT/layad-$tag-$r.log" | sed 's/^/    /' || true
        fi
        echo "$r $side $s" >>"$OUT/times.txt"
    done
done
uptime
