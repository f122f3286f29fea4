#!/usr/bin/env bash
# `edgejev build` of one checkpoint directory in upstream's layout (rl_agent_config.json,
# model.safetensors, encoder/, tokenizer/; e.g. the full-size random one layad-bench writes), at one
# precision, into OUT_DIR (an edgejev model directory: model.onnx, tokenizer.json, edgejev.json).
#
#   tools/bench/edgejev-build.sh CHECKPOINT_DIR OUT_DIR [int8|fp32|int8-pc|mixed]
#
# The edgejev venv (tools/bench/edgejev-venv.sh) has no torch: the export borrows torch and laya
# from the upstream venv (TORCH_PYTHON, default /work/venvs/laya-0.4.15/bin/python) by appending its
# site-packages to sys.path *after* the edgejev venv's own, so onnxruntime, onnx and numpy stay the
# edgejev venv's. edgejev runs its own self-check at the end (three shapes, batch independence).
# Knobs (environment): EDGEJEV_VENV (/work/venvs/edgejev), TORCH_PYTHON.
set -euo pipefail
CHECKPOINT=$(realpath "$1")
OUT_DIR=$2
PRECISION=${3:-int8}
EDGEJEV_VENV=${EDGEJEV_VENV:-/work/venvs/edgejev}
TORCH_PYTHON=${TORCH_PYTHON:-/work/venvs/laya-0.4.15/bin/python}
TORCH_SITE=$("$TORCH_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$OUT_DIR"
# laya.load takes a local directory when the argument looks like a path (it has a separator).
HF_HUB_OFFLINE=1 "$EDGEJEV_VENV/bin/python" - "$TORCH_SITE" build --backend laya --model "$CHECKPOINT" \
    --out "$OUT_DIR" --precision "$PRECISION" <<'EOF'
import site
import sys

site.addsitedir(sys.argv[1])
from edgejev.cli import main

sys.exit(main(sys.argv[2:]))
EOF
