#!/usr/bin/env bash
# The venv holding edgejev 0.3.2 (ONNX Runtime served peer of docs/benchmarks.md, issue 26), and the
# ONNX Runtime side of tools/bench/onnx_forward.py.
#   tools/bench/edgejev-venv.sh                  # venv at /work/venvs/edgejev
#   VENV=/some/dir tools/bench/edgejev-venv.sh
#
# edgejev serves without torch (onnxruntime, tokenizers, numpy); its `build` step exports the model
# with torch and laya once. That step is not given a torch of its own here (several GB): the
# benchmarks run it with the upstream venv's torch 2.7.0 and laya appended to sys.path
# (tools/bench/edgejev-build.sh), so this venv adds only what the export needs beyond them: onnx and
# onnxscript (torch's dynamo exporter), with huggingface-hub and tokenizers at the upstream venv's
# versions (its transformers refuses another hub; UPSTREAM_PYTHON names that venv's python). Needs PyPI only; the benchmarks themselves run offline.
set -euo pipefail
VENV="${VENV:-/work/venvs/edgejev}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
# The hub at the upstream venv's version where one is there (laya 0.4.15 leaves it unpinned, so a
# venv built on another day may hold a newer one, and transformers checks the range), else 1.33.0.
UPSTREAM_PYTHON="${UPSTREAM_PYTHON:-/work/venvs/laya-0.4.15/bin/python}"
HUB=$("$UPSTREAM_PYTHON" -c 'import huggingface_hub; print(huggingface_hub.__version__)' 2>/dev/null || echo 1.33.0)
"$VENV/bin/pip" install --disable-pip-version-check -q \
    edgejev==0.3.2 onnxruntime==1.31.1 onnx==1.23.2 onnxscript==0.7.2 onnx-ir==1.1.0 \
    "huggingface-hub==$HUB" tokenizers==0.23.3
"$VENV/bin/python" -c 'import onnxruntime, edgejev; print("edgejev venv ready: edgejev", edgejev.__version__, "onnxruntime", onnxruntime.__version__)'
test -x "$VENV/bin/edgejev"
if "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    echo "note: this venv has torch of its own (not needed to serve)" >&2
fi
echo "edgejev at $VENV/bin/edgejev"
