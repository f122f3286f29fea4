#!/usr/bin/env bash
# Rebuild tests/fixtures/ane-artifacts/ (english and multilingual, buckets 64,96,128) from the tiny
# fixture checkpoints with layad-ane-convert.
#   VENV=/path/to/venv worker-ane/convert/regenerate.sh      (default VENV: worker-ane/convert/.venv)
# Needs PyPI only for the venv install; the conversion itself runs offline (HF_HUB_OFFLINE=1).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${VENV:-$HERE/.venv}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/pip" install --disable-pip-version-check -q -r "$HERE/requirements.txt"

cd "$ROOT"
export HF_HUB_OFFLINE=1 PYTHONHASHSEED=0 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
unset LAYA_API_KEY LAYA_MODELS LAYA_AUTO_TASK LAYA_CPU_AMP LAYA_PRELOAD HF_TOKEN HF_HUB_CACHE HUGGINGFACE_HUB_CACHE || true
REPO=tests/fixtures/hf-cache/hub/models--convaiinnovations--laya
SNAP="$REPO/snapshots/$(cat "$REPO/refs/main")"
OUT=tests/fixtures/ane-artifacts
GOLDENS=tests/fixtures/goldens/cases.json

for name in english multilingual; do
  sub=""; [ "$name" = english ] || sub="$name"
  rm -rf "${OUT:?}/$name"
  (cd "$HERE" && "$VENV/bin/python" -m layad_ane_convert convert --checkpoint "$ROOT/$SNAP/$sub" \
      --name "$name" --out "$ROOT/$OUT" --buckets 64,96,128 --goldens "$ROOT/$GOLDENS")
done
# typed-decisions is not kept (same weights as english, only its local RoPE theta differs; size).
du -sh "$OUT"
