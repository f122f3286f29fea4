#!/usr/bin/env bash
# The one command for the GPU machine, through the device tool (carry: ["target/device-carry"]):
# runs tools/device/cuda-check.sh into target/gpu-run and hands the results back under $OUT, which
# returns at most 8 files: table.md, summary.json, the steps and notes, and everything else as one
# gpu-run.tar.gz — without the random checkpoints the bench wrote (ModernBERT-large is about 1.6 GB),
# the fake HF home that links to them, the workers' sockets and the peers' venv.
#
#   tools/device/gpu-run.sh            (needs $OUT, as the device tool sets it; exits as cuda-check.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?gpu-run: OUT is not set (the device tool sets it)}"
started=$(date +%s)
tools/device/cuda-check.sh target/gpu-run
rc=$?
for file in table.md summary.json steps.txt notes.txt; do
    [[ -f "target/gpu-run/$file" ]] && cp "target/gpu-run/$file" "$OUT/"
done
tar -C target -czf "$OUT/gpu-run.tar.gz" --exclude='*.safetensors' --exclude='gpu-run/hf-home' \
    --exclude='gpu-run/sockets-*' --exclude='gpu-run/laya-cuda-peer' gpu-run
echo "gpu-run: cuda-check.sh exited $rc after $(($(date +%s) - started)) s; $OUT/gpu-run.tar.gz: $(du -b "$OUT/gpu-run.tar.gz" | cut -f1) bytes" >&2
exit $rc
