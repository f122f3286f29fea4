#!/usr/bin/env bash
# Creates (or completes) a Python venv holding upstream laya[serve] that the benchmarks run side by
# side with layad, from the pins the fixtures were generated with: VERSION 0.3.20 (the default:
# tools/fixtures/requirements.txt, the venv layad-http-bench and peers.sh default to) or 0.4.15
# (tools/fixtures/requirements-0.4.15.txt, the venv tools/bench/suite defaults to).
#   tools/bench/upstream-venv.sh                 # 0.3.20 at /work/upstream-venv
#   VERSION=0.4.15 tools/bench/upstream-venv.sh  # 0.4.15 at /work/venvs/laya-0.4.15 (the suite's)
#   VENV=/some/dir tools/bench/upstream-venv.sh  # elsewhere; pass its python to the benchmarks
# Needs PyPI only (torch 2.7.0 from PyPI is several GB with its CUDA libraries, which the CPU runs
# never load); the benchmarks themselves run offline.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VERSION="${VERSION:-0.3.20}"
case "$VERSION" in
    0.3.20) REQUIREMENTS="$HERE/../fixtures/requirements.txt"; DEFAULT_VENV=/work/upstream-venv ;;
    0.4.15) REQUIREMENTS="$HERE/../fixtures/requirements-0.4.15.txt"; DEFAULT_VENV=/work/venvs/laya-0.4.15 ;;
    *) echo "upstream-venv.sh: VERSION must be 0.3.20 or 0.4.15 (the pinned sets), not '$VERSION'" >&2; exit 2 ;;
esac
VENV="${VENV:-$DEFAULT_VENV}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
elif held=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("laya"))' 2>/dev/null) \
        && [ "$held" != "$VERSION" ]; then
    # pip would move it to the other release in place, under every script that expects this one.
    echo "upstream-venv.sh: $VENV holds laya $held, not $VERSION: name another VENV" >&2
    exit 2
fi
"$VENV/bin/pip" install --disable-pip-version-check -q -r "$REQUIREMENTS"
"$VENV/bin/python" - "$VERSION" <<'PY'
import importlib.metadata, sys, torch, laya.serve
laya_version = importlib.metadata.version("laya")
if laya_version != sys.argv[1]:
    sys.exit(f"upstream-venv.sh: this venv holds laya {laya_version}, not {sys.argv[1]}: use another VENV")
print("upstream venv ready: laya", laya_version, "torch", torch.__version__, torch.backends.cpu.get_cpu_capability())
PY
test -x "$VENV/bin/laya-serve"
echo "laya-serve at $VENV/bin/laya-serve"
