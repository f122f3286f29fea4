#!/usr/bin/env bash
# layad against the fastest CPU peers on one full-size checkpoint (docs/benchmarks.md, issue 26,
# "Peers"): edgejev 0.3.2 served (ONNX Runtime int8 and fp32) and ONNX Runtime in process.
#
#   1. edgejev's model directories (`edgejev build --precision int8`, `fp32`) and the ONNX exports of
#      upstream's model (tools/bench/onnx_forward.py export), once per checkpoint, beside it; not
#      timed, so outside the lock (nice 19).
#   2. Under the exclusive CPU lock, one run:
#      a. served int8: layad (dtype int8) vs edgejev int8, upstream 0.4.15 f32 up as the answers'
#         reference (layad-http-bench: answers first, each server's max |Δp| against upstream's,
#         then latency pairs A/B/B/A per shape, then answers/s A/B/B/A per client count);
#      b. the same for f32: layad f32 vs edgejev fp32;
#      (served-bf16, where the CPU has bf16: layad bf16 vs upstream 0.4.15 with LAYA_CPU_AMP=bf16;)
#      c. in process, 64 tokens x 1 row: candle f32 and int8, torch f32, ONNX Runtime f32 and int8,
#         two rounds A B B A (layad-bench --rounds 2).
#   3. tools/bench/peers_table.py prints the table.
#
# Needs: target/release/{layad,layad-worker-gpu,layad-worker-ane,layad-http-bench,layad-bench}, the
# edgejev venv (tools/bench/edgejev-venv.sh), the upstream 0.4.15 venv (laya[serve]==0.4.15, torch).
# Knobs (environment): CHECKPOINT (/work/bench/modernbert-large-v50368; written with layad-bench if
# absent), MODELS (directory of the built peer models: the checkpoint's parent), EDGEJEV_VENV
# (/work/venvs/edgejev), UPSTREAM_PYTHON (/work/venvs/laya-0.4.15/bin/python), THREADS (2), PAIRS
# (10), SECONDS_PER_LEVEL (10), CONCURRENCY (8), SHAPES (short,long,three), OUT (target/bench/peers),
# LOCK (/work/cpu.lock; empty: no lock), STEPS (served-int8,served-f32,forward; add served-bf16 on a
# CPU with AVX512_BF16 or AMX).
set -euo pipefail
cd "$(dirname "$0")/../.."
CHECKPOINT=${CHECKPOINT:-/work/bench/modernbert-large-v50368}
MODELS=${MODELS:-$(dirname "$CHECKPOINT")}
EDGEJEV_VENV=${EDGEJEV_VENV:-/work/venvs/edgejev}
UPSTREAM_PYTHON=${UPSTREAM_PYTHON:-/work/venvs/laya-0.4.15/bin/python}
THREADS=${THREADS:-2}
PAIRS=${PAIRS:-10}
SECONDS_PER_LEVEL=${SECONDS_PER_LEVEL:-10}
CONCURRENCY=${CONCURRENCY:-8}
SHAPES=${SHAPES:-short,long,three}
OUT=${OUT:-target/bench/peers}
LOCK=${LOCK-/work/cpu.lock}
STEPS=${STEPS:-served-int8,served-f32,forward}
mkdir -p "$OUT"
locked() { if [ -n "$LOCK" ]; then flock -x "$LOCK" "$@"; else "$@"; fi; }

if [ ! -f "$CHECKPOINT/model.safetensors" ]; then
    locked target/release/layad-bench --out-dir "$(dirname "$CHECKPOINT")" --models modernbert-large --lengths 8 \
        --rows 1 --precisions f32 --python none --min-runs 1 --max-runs 1 --json "$OUT/checkpoint-write.json"
fi
for precision in int8 fp32; do
    if [ ! -f "$MODELS/edgejev-$precision/edgejev.json" ]; then
        EDGEJEV_VENV=$EDGEJEV_VENV TORCH_PYTHON=$UPSTREAM_PYTHON nice -n 19 \
            tools/bench/edgejev-build.sh "$CHECKPOINT" "$MODELS/edgejev-$precision" "$precision"
    fi
done
if [ ! -f "$MODELS/onnx/model-int8.onnx" ]; then
    TORCH_SITE=$("$UPSTREAM_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    nice -n 19 "$EDGEJEV_VENV/bin/python" tools/bench/onnx_forward.py export --checkpoint "$CHECKPOINT" \
        --out-dir "$MODELS/onnx" --torch-site "$TORCH_SITE" --threads "$THREADS"
fi

measure() {
    grep -m1 "model name" /proc/cpuinfo
    grep -m1 flags /proc/cpuinfo | tr ' ' '\n' \
        | grep -E '^(avx2|fma|avx512f|avx512bw|avx512vl|avx512_vnni|avx512_bf16|avx_vnni|amx_int8|amx_bf16)$' | tr '\n' ' '
    echo; uptime
    for step in ${STEPS//,/ }; do
        case $step in
            served-int8 | served-f32)
                dtype=${step#served-}
                peer=$([ "$dtype" = int8 ] && echo int8 || echo fp32)
                date -u +"%H:%M:%S $step"
                target/release/layad-http-bench --checkpoint "$CHECKPOINT" --upstream-python "$UPSTREAM_PYTHON" \
                    --edgejev-python "$EDGEJEV_VENV/bin/python" --edgejev-model "$MODELS/edgejev-$peer" \
                    --dtype "$dtype" --threads "$THREADS" --pairs "$PAIRS" --seconds "$SECONDS_PER_LEVEL" \
                    --concurrency "$CONCURRENCY" --shapes "$SHAPES" --out "$OUT/$step.json"
                ;;
            served-bf16)
                # layad bf16 against upstream's own bf16 (torch autocast, LAYA_CPU_AMP=bf16): on CPUs
                # with native bf16 (AVX512_BF16, AMX) the peer a bf16 user would otherwise run.
                date -u +"%H:%M:%S $step"
                target/release/layad-http-bench --checkpoint "$CHECKPOINT" --upstream-python "$UPSTREAM_PYTHON" \
                    --upstream-amp bf16 --dtype bf16 --threads "$THREADS" --pairs "$PAIRS" \
                    --seconds "$SECONDS_PER_LEVEL" --concurrency "$CONCURRENCY" --shapes "$SHAPES" \
                    --out "$OUT/$step.json"
                ;;
            forward)
                date -u +"%H:%M:%S $step"
                target/release/layad-bench --out-dir "$(dirname "$CHECKPOINT")" --models modernbert-large \
                    --lengths 64 --rows 1 --precisions f32,int8 --threads "$THREADS" --python "$UPSTREAM_PYTHON" \
                    --onnx-python "$EDGEJEV_VENV/bin/python" --onnx-dir "$MODELS/onnx" --rounds 2 \
                    --min-runs 3 --max-runs 8 --budget-s 6 --json "$OUT/forward.json"
                ;;
            *) echo "unknown step $step" >&2; exit 2 ;;
        esac
    done
    uptime
}
export -f measure
export CHECKPOINT MODELS EDGEJEV_VENV UPSTREAM_PYTHON THREADS PAIRS SECONDS_PER_LEVEL CONCURRENCY SHAPES OUT STEPS
locked bash -c measure 2>&1 | tee "$OUT/run.log"
python3 tools/bench/peers_table.py "$OUT"
