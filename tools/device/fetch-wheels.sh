#!/usr/bin/env bash
# Downloads here, from PyPI, the wheels the GPU machine (no network) lacks for the two peers of
# tools/device/cuda-check.sh's served step, into the directory it carries (default
# target/device-carry/wheels), and prints their sizes:
# - upstream `laya[serve]==0.4.15`: laya itself, fastapi, starlette, uvicorn, python-multipart and
#   pydantic with its own needs. The rest of its closure (torch, transformers 5.17.0, tokenizers,
#   safetensors, huggingface_hub, numpy, anyio, h11, click, pyyaml, regex, ...) is in the H200 image
#   already: /work/.library/device/KINDS.md, "Python packages already there" (read 2026-11-17;
#   its python3 is CPython 3.12.3 with torch 2.11.0+cu130 and cupy-cuda13x 14.2.0). Pins: the
#   versions pip resolved for /work/venvs/laya-0.4.15, the environment of the CPU comparisons.
# - `laya-cuda==0.1.1` (pure Python; CuPy, cuda-pathfinder and the CUDA libraries are the image's).
# Every wheel is downloaded with --no-deps, so nothing unpinned comes along; the binary one
# (pydantic_core) for CPython 3.12, the image's. FULL=1 fetches the whole closure beyond torch's own
# instead (46 wheels, 39.7 MiB, CPython 3.11-3.14), for a machine whose image lacks transformers and
# the rest; it does not fit the device tool's 64 MiB beside the working tree and the binaries.
# On the machine, cuda-check.sh installs them with
#   python3 -m venv --system-site-packages V && V/bin/pip install --no-index --find-links DIR ...
# so torch, CuPy and the rest come from the system and pip takes from DIR only what it lacks.
#
#   tools/device/fetch-wheels.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
dir="${1:-target/device-carry/wheels}"
mkdir -p "$dir"

# What the H200 image lacks (KINDS.md's list), with pydantic's own needs.
pure=(
    laya==0.4.15
    fastapi==0.165.0
    starlette==1.10.0
    uvicorn==0.54.0
    python-multipart==0.0.34
    pydantic==2.14.4
    typing-inspection==0.4.5
    annotated-types==0.8.0
    opentelemetry-api==1.45.2
)
per_version=(pydantic_core==2.50.5)
versions=(3.12)
if [[ "${FULL:-0}" == 1 ]]; then
    pure+=(
        transformers==5.17.0 huggingface_hub==1.33.0 annotated-doc==0.0.7 typing_extensions==4.16.0
        anyio==4.16.0 h11==0.16.0 httpx==0.28.1 httpcore==1.0.9 idna==3.20 certifi==2026.10.19.post1
        click==8.5.1 packaging==26.4 tqdm==4.70.1 typer==0.29.2 rich==15.0.0 markdown-it-py==4.3.0
        mdurl==0.1.2 Pygments==2.21.0 shellingham==1.5.4 filelock==4.3.1 fsspec==2026.9.0
        tokenizers==0.23.3 safetensors==0.8.0 hf-xet==1.8.0
    )
    per_version+=(PyYAML==6.0.4 regex==2026.11.19)
    versions=(3.11 3.12 3.13 3.14)
fi

get() { # pip download arguments...
    PIP_ROOT_USER_ACTION=ignore python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 -d "$dir" "$@"
}
# laya-cuda requires Python >= 3.12; the download names a version so pip here (any version) fetches it.
get --python-version 3.12 "${pure[@]}" laya-cuda==0.1.1
for version in "${versions[@]}"; do
    get --python-version "$version" "${per_version[@]}"
done
du -b "$dir"/*.whl | sort -n | awk '{printf "%8.2f MiB  %s\n", $1 / 1048576, $2}'
echo "fetch-wheels: $(ls "$dir"/*.whl | wc -l) wheels, $(du -cb "$dir"/*.whl | tail -n 1 | awk '{printf "%.1f", $1 / 1048576}') MiB in $dir" >&2
