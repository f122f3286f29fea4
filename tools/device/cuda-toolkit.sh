#!/usr/bin/env bash
# Installs the pinned CUDA 13.0 compiler wheels from PyPI once into a cache directory and prints the
# CUDA_HOME they form. The wheels lay themselves out as a CUDA tree under nvidia/cu13 (bin/nvcc,
# nvvm/bin/cicc, include/ with cccl/, lib/), which nvcc's own nvcc.profile finds by relative path,
# so no symlink tree is needed.
#
# Why 13.0 and not the newest (13.5): the H200 this is for has a CUDA 13.0 driver, and a driver
# refuses PTX of a newer ISA than it knows; cudarc 0.19.10's build script also knows no 13.5. The
# -cu12 nvcc wheel ships no nvcc binary at all.
#
#   tools/device/cuda-toolkit.sh         the compiler (nvcc, cicc, headers, cudart); prints CUDA_HOME
#   tools/device/cuda-toolkit.sh --libs  cuBLAS, cuRAND and NVRTC shared libraries, for linking;
#                                        prints the directories that hold them
#
# Cache: $LAYADDEV_CUDA_CACHE (default ~/.cache/layad-cuda)/toolkit-13.0 and libs-13.0. Exits 1 (and
# says why on stderr) when pip cannot fetch them, e.g. without network.
set -euo pipefail

cache="${LAYADDEV_CUDA_CACHE:-$HOME/.cache/layad-cuda}"
root="$cache/toolkit-13.0"
home="$root/nvidia/cu13"

compiler=(
    nvidia-cuda-nvcc==13.0.88
    nvidia-nvvm==13.0.88
    nvidia-cuda-runtime==13.0.96
    nvidia-cuda-cccl==13.0.85
    nvidia-cuda-crt==13.0.88
)
# The CUDA 13.0 release's libraries, whose sonames (libcublas.so.13, libcublasLt.so.13,
# libcurand.so.10, libnvrtc.so.13) are the ones torch's CUDA 13 wheels bring to the H200.
libraries=(
    nvidia-cublas==13.0.2.14
    nvidia-curand==10.4.0.35
    nvidia-cuda-nvrtc==13.0.88
)

# pip --target --upgrade replaces whole top-level directories (both sets live under nvidia/), so
# each set has its own directory and one never pulls the other out from under a running build.
install() { # <directory> <packages...>
    local dir="$1"
    shift
    [[ -e "$dir/.installed" ]] && return 0
    mkdir -p "$dir"
    # --no-deps: the wheels' own dependency metadata would pull other CUDA versions beside them.
    if ! PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps \
        --upgrade --target "$dir" "$@" >&2; then
        echo "cuda-toolkit: pip could not install $* (no network?)" >&2
        return 1
    fi
    touch "$dir/.installed"
}

if [[ "${1:-}" == "--libs" ]]; then
    dir="$cache/libs-13.0"
    install "$dir" "${libraries[@]}"
    # The wheels keep their shared libraries under nvidia/cu13/lib (or nvidia/<name>/lib in older
    # layouts): print every directory that holds one.
    find "$dir/nvidia" -name 'lib*.so.*' -printf '%h\n' | sort -u
    exit 0
fi

install "$root" "${compiler[@]}"
[[ -x "$home/bin/nvcc" && -x "$home/nvvm/bin/cicc" ]] || {
    echo "cuda-toolkit: $home has no bin/nvcc or nvvm/bin/cicc after installing" >&2
    exit 1
}
echo "$home"
