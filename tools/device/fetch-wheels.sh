#!/usr/bin/env bash
# Downloads here, from PyPI, the wheels the GPU machine (no network) needs for the two peers of
# tools/device/cuda-check.sh's served step, into the directory it carries (default
# target/device-carry/wheels), and prints their sizes:
# - upstream `laya[serve]==0.4.15` and what it needs beyond torch's own environment (transformers,
#   tokenizers, safetensors, huggingface_hub, fastapi, uvicorn, pydantic, ...): the pins are the
#   versions pip resolved for /work/venvs/laya-0.4.15 (the environment the CPU comparisons used).
#   torch, triton, the nvidia-* libraries, numpy, sympy, networkx and jinja2 are not carried: they
#   come with torch (and CuPy), which the machine has. filelock and fsspec come with torch too, but
#   huggingface_hub has floors for them and they are small. Checked here: these wheels installed
#   --no-deps into a bare venv leave `pip check` missing only torch and numpy.
# - `laya-cuda==0.1.1` (pure Python; its CuPy and CUDA libraries are the machine's).
# Every wheel is downloaded with --no-deps, so nothing unpinned is pulled in. The machine's Python
# version is not known here, so the three packages with per-version binaries (pydantic_core,
# PyYAML, regex) are fetched for CPython 3.10 to 3.14 (3.10 has no complete set: pip says so);
# tokenizers, safetensors and hf-xet are abi3.
# On the machine, cuda-check.sh installs them with
#   python3 -m venv --system-site-packages V && V/bin/pip install --no-index --find-links DIR ...
# so torch and CuPy come from the system and pip takes from DIR only what the system lacks.
#
#   tools/device/fetch-wheels.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
dir="${1:-target/device-carry/wheels}"
mkdir -p "$dir"

pure=(
    laya==0.4.15
    transformers==5.17.0
    huggingface_hub==1.33.0
    fastapi==0.165.0
    starlette==1.10.0
    uvicorn==0.54.0
    python-multipart==0.0.34
    pydantic==2.14.4
    typing-inspection==0.4.5
    annotated-types==0.8.0
    annotated-doc==0.0.7
    typing_extensions==4.16.0
    anyio==4.16.0
    h11==0.16.0
    httpx==0.28.1
    httpcore==1.0.9
    idna==3.20
    certifi==2026.10.19.post1
    click==8.5.1
    packaging==26.4
    tqdm==4.70.1
    typer==0.29.2
    rich==15.0.0
    markdown-it-py==4.3.0
    mdurl==0.1.2
    Pygments==2.21.0
    shellingham==1.5.4
    opentelemetry-api==1.45.2
    filelock==4.3.1
    fsspec==2026.9.0
)
abi3=(tokenizers==0.23.3 safetensors==0.8.0 hf-xet==1.8.0)
per_version=(pydantic_core==2.50.5 PyYAML==6.0.4 regex==2026.11.19)

get() { # pip download arguments...
    PIP_ROOT_USER_ACTION=ignore python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 -d "$dir" "$@"
}
# laya-cuda requires Python >= 3.12; the download names a version so pip here (any version) fetches it.
get --python-version 3.12 "${pure[@]}" "${abi3[@]}" laya-cuda==0.1.1
for version in 3.10 3.11 3.12 3.13 3.14; do
    if ! get --python-version "$version" "${per_version[@]}" 2>/dev/null; then
        echo "fetch-wheels: no complete set of ${per_version[*]} for CPython $version" >&2
    fi
done
du -b "$dir"/*.whl | sort -n | awk '{printf "%8.2f MiB  %s\n", $1 / 1048576, $2}'
echo "fetch-wheels: $(ls "$dir"/*.whl | wc -l) wheels, $(du -cb "$dir"/*.whl | tail -n 1 | awk '{printf "%.1f", $1 / 1048576}') MiB in $dir" >&2
