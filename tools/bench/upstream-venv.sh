#!/usr/bin/env bash
# Creates (or completes) the Python venv holding upstream laya[serve]==0.3.20 that the benchmarks run
# side by side with layad: tools/fixtures/requirements.txt, the pins the fixtures were generated with.
#   tools/bench/upstream-venv.sh                 # venv at /work/upstream-venv (the benchmarks' default)
#   VENV=/some/dir tools/bench/upstream-venv.sh  # elsewhere; pass its python to the benchmarks
# Needs PyPI only (torch 2.7.0 from PyPI is several GB with its CUDA libraries, which the CPU runs
# never load); the benchmarks themselves run offline.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VENV:-/work/upstream-venv}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/pip" install --disable-pip-version-check -q -r "$HERE/../fixtures/requirements.txt"
"$VENV/bin/python" -c 'import torch, laya.serve; print("upstream venv ready:", torch.__version__, torch.backends.cpu.get_cpu_capability())'
test -x "$VENV/bin/laya-serve"
echo "laya-serve at $VENV/bin/laya-serve"
