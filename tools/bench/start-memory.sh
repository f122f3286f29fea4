#!/usr/bin/env bash
# A worker's memory and time while it starts, paired (docs/benchmarks/notes.md, stop 56): each
# layad-worker-gpu binary given (e.g. a build before a change and after) started alone on the
# full-size random ModernBERT-large checkpoint that layad-bench writes, in the order A B B A for two,
# until its socket is bound (it binds once loaded, gated and warm). While it starts its RssAnon is
# sampled every 20 ms (the peak of what it allocated; the mapped weights file is page cache, not
# this); at ready, VmHWM (the peak resident set, the mapped file's pages included) and RssAnon.
#
#   flock -x /work/cpu.lock tools/bench/start-memory.sh <worker A> [<worker B>] [checkpoint-dir]
# Knobs (environment): DTYPE (int8), THREADS (2), GATE_CACHE (`kept`: each binary's parity-gate
# reference filled by one untimed start first, so every timed start is a restart that reads it
# back; `first`: emptied before every start, as a machine's first start).
set -euo pipefail
A=${1:?layad-worker-gpu binary A}
B=${2:-}
CHECKPOINT=$(realpath "${3:-target/bench/modernbert-large-v50368}")
DTYPE=${DTYPE:-int8}
THREADS=${THREADS:-2}
GATE_CACHE=${GATE_CACHE:-kept}
case "$GATE_CACHE" in first | kept) ;; *) echo "GATE_CACHE must be first or kept, not '$GATE_CACHE'" >&2; exit 2 ;; esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
grep -m1 "model name" /proc/cpuinfo

# start <side> <binary> <report: 1 prints a line>; the socket directory is owner-only, as the worker requires
start() {
    local side=$1 bin=$2 report=$3 dir="$work/run" cache="$work/gate-$1" peak=0 anon pid started ready
    rm -rf "$dir"; mkdir -p -m 700 "$dir"; mkdir -p "$cache"
    [ "$GATE_CACHE" = first ] && rm -rf "${cache:?}"/*
    started=$(date +%s.%N)
    "$bin" --socket "$dir/w.sock" --checkpoint "english=$CHECKPOINT" --threads "$THREADS" --dtype "$DTYPE" \
        --gate-cache "$cache" --log-format json >"$dir/log" 2>&1 &
    pid=$!
    while [ ! -S "$dir/w.sock" ]; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "$side: the worker exited before it was ready:" >&2; tail -5 "$dir/log" >&2; exit 1
        fi
        anon=$(awk '/^RssAnon/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
        if [ -n "$anon" ] && [ "$anon" -gt "$peak" ]; then peak=$anon; fi
        sleep 0.02
    done
    ready=$(date +%s.%N)
    if [ "$report" = 1 ]; then
        printf '%s %s: ready %.2f s, peak RssAnon %d MiB, VmHWM %d MiB, RssAnon ready %d MiB, gate reference read back: %s\n' \
            "$side" "$DTYPE" "$(echo "$ready - $started" | bc)" $((peak / 1024)) \
            $(($(awk '/^VmHWM/ {print $2}' "/proc/$pid/status") / 1024)) \
            $(($(awk '/^RssAnon/ {print $2}' "/proc/$pid/status") / 1024)) \
            "$(grep -q 'reference read back' "$dir/log" && echo yes || echo no)"
    fi
    kill "$pid"; wait "$pid" 2>/dev/null || true
}

sides=(A); [ -n "$B" ] && sides=(A B B A)
if [ "$GATE_CACHE" = kept ]; then
    start A "$A" 0
    [ -n "$B" ] && start B "$B" 0
fi
for side in "${sides[@]}"; do
    bin=$A; [ "$side" = B ] && bin=$B
    start "$side" "$bin" 1
done
