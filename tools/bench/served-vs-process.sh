#!/usr/bin/env bash
# The same forward served and in process, interleaved: whether the served path costs a forward time
# on this machine. On Zen 4 the served device time equalled the in-process forward (stop 51); on the
# AMX Xeon a served 66-token int8 forward took 80 ms of device time against 42 ms in process, measured
# minutes apart (stop 50, docs/benchmarks/notes.md) — the first thing to measure on an AMX machine.
#
#   flock -x /work/cpu.lock tools/bench/served-vs-process.sh
#
# Turns P S S P per round (P: `layad-bench`, one row of the shape's tokens; S: `layad-http-bench`
# against layad alone, one client, a gap before each request as the in-process forwards have), PAIRS
# forwards a turn, ROUNDS rounds. Prints each turn's p50 and, over the turns, the medians and the
# ratios served device / in process and served client / in process.
# Knobs (environment): DTYPE (int8), SHAPE (short: 66 tokens, medium: 258, long: 512), ROUNDS (2),
# PAIRS (10), GAP_MS (300), THREADS (2), CHECKPOINTS (/work/bench: layad-bench's checkpoint
# directory), BIN (target/release: layad-bench, layad-http-bench, layad and its workers),
# OUT (target/bench/served-vs-process).
set -euo pipefail
cd "$(dirname "$0")/../.."
DTYPE=${DTYPE:-int8}; SHAPE=${SHAPE:-short}; ROUNDS=${ROUNDS:-2}; PAIRS=${PAIRS:-10}; GAP_MS=${GAP_MS:-300}
THREADS=${THREADS:-2}; CHECKPOINTS=${CHECKPOINTS:-/work/bench}; BIN=${BIN:-target/release}
OUT=${OUT:-target/bench/served-vs-process}
case "$SHAPE" in
    short) LENGTH=66 ;;
    medium) LENGTH=258 ;;
    long) LENGTH=512 ;;
    *) echo "SHAPE must be short, medium or long, not '$SHAPE'" >&2; exit 2 ;;
esac
for tool in layad-bench layad-http-bench layad; do
    [ -x "$BIN/$tool" ] || { echo "$BIN/$tool is missing: build with cargo build --release --bins -p layad -p layad-worker-gpu -p layad-worker-ane -p layad-engine-bench -p layad-system-tests" >&2; exit 2; }
done
CHECKPOINT="$CHECKPOINTS/modernbert-large-v50368"
[ -d "$CHECKPOINT" ] || { echo "no checkpoint at $CHECKPOINT: run $BIN/layad-bench --out-dir $CHECKPOINTS once" >&2; exit 2; }
mkdir -p "$OUT"
rm -f "$OUT"/turn-*.json
grep -m1 "model name" /proc/cpuinfo
grep -m1 "^flags" /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512f|avx512_vnni|avx512_bf16|amx_tile|amx_int8|amx_bf16)$' | tr '\n' ' '; echo
uptime
turn=0
for round in $(seq "$ROUNDS"); do
    for side in P S S P; do
        turn=$((turn + 1))
        if [ "$side" = P ]; then
            "$BIN/layad-bench" --out-dir "$CHECKPOINTS" --models modernbert-large --lengths "$LENGTH" --rows 1 \
                --precisions "$DTYPE" --python none --min-runs "$PAIRS" --max-runs "$PAIRS" --threads "$THREADS" \
                --gap-ms "$GAP_MS" --json "$OUT/turn-$turn-P.json" > "$OUT/turn-$turn-P.log" 2>&1
        else
            "$BIN/layad-http-bench" --checkpoint "$CHECKPOINT" --upstream-python none --shapes "$SHAPE" \
                --concurrency none --pairs "$PAIRS" --gap-ms "$GAP_MS" --threads "$THREADS" --dtype "$DTYPE" \
                --out "$OUT/turn-$turn-S.json" > "$OUT/turn-$turn-S.log" 2>&1
        fi
    done
done
python3 - "$OUT" "$DTYPE" "$SHAPE" <<'PY'
import glob, json, statistics, sys
out, dtype, shape = sys.argv[1:4]
process, device, client = [], [], []
for path in sorted(glob.glob(f"{out}/turn-*.json"), key=lambda p: int(p.split("-")[-2])):
    data = json.load(open(path))
    if path.endswith("-P.json"):
        cell = data["cells"][0]
        process.append(cell["p50_ms"])
        print(f"{path}: in process ({cell['engine']}, {cell['length']} tokens) p50 {cell['p50_ms']:.1f} ms")
    else:
        row = data["latency"][0]
        device.append(statistics.median(row["layad_device_ms"]))
        client.append(row["layad_p50_ms"])
        print(f"{path}: served ({row['input_tokens']} tokens) device p50 {device[-1]:.1f} ms, client p50 {client[-1]:.1f} ms")
p, d, c = (statistics.median(v) for v in (process, device, client))
print(f"{dtype} {shape}: in process {p:.1f} ms, served device {d:.1f} ms ({d / p:.2f}×), served client {c:.1f} ms ({c / p:.2f}×)")
PY
uptime
