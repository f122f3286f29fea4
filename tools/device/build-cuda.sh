#!/usr/bin/env bash
# Builds here a linked release `layad-worker-gpu --features cuda` for compute capability 9.0 (the
# H200), with `layad-bench` and `layad-device-check` on the same CUDA engine (what
# tools/device/cuda-check.sh runs in-process) and the supervisor, `layad-http-bench` and `layad-load`
# beside them, packs all seven into target/device-carry/layad-bins.tar.xz (what is carried to the GPU
# machine), prints the worker's path on the last line of stdout,
# and checks with `readelf -d` that it needs only shared libraries an H200 machine with a CUDA 13.0
# driver and CUDA 13 libraries (torch's nvidia/* wheels) provides. Nothing here runs it: no GPU, no
# driver.
#
# Why build here rather than on the H200 from carried, vendored sources: the H200 machine has nvcc
# 13.0 but no network and a 15-minute window; vendored crates plus a cold release build there would
# spend most of that window compiling. The binary built here is carried instead (with
# `libs/` beside it only if the H200 lacks a library; see tools/device/cuda-check.sh).
#
# Linking: candle turns on cudarc's `dynamic-linking`, so the linker wants libcuda, libcudart,
# libnvrtc, libcurand, libcublas and libcublasLt:
# - libcudart, libnvrtc, libcurand, libcublas, libcublasLt: the real CUDA 13.0 libraries from PyPI
#   wheels (tools/device/cuda-toolkit.sh --libs), linked through unversioned symlinks, so the
#   binary records their sonames (libcublas.so.13, ...).
# - libcuda (the driver, in no wheel): a stub made here with soname libcuda.so.1 that defines every
#   driver function cudarc 0.19.10 declares (the toolkit's own stubs/libcuda.so is the same kind of
#   thing). The H200's driver provides the real one; the stub is never carried.
# Every kernel is compiled for real (no stand-ins; see tools/device/nvcc-cache), cached across builds.
#
#   tools/device/build-cuda.sh            build, check, print the binary's path
#   BUILD_CUDA_TARGET_DIR=...             target directory (default target/build-cuda)
#   LAYADDEV_DEVICE_CARRY=...                the carried directory (default target/device-carry)
set -euo pipefail
cd "$(dirname "$0")/../.."

cuda_home="$(tools/device/cuda-toolkit.sh)"
lib_dirs="$(tools/device/cuda-toolkit.sh --libs)"
cache="${LAYADDEV_CUDA_CACHE:-$HOME/.cache/layad-cuda}"
cudarc_sys="$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -path '*/cudarc-0.19.10/src/driver/sys/mod.rs' | head -n 1)"
if [[ -z "$cudarc_sys" ]]; then
    cargo fetch --locked >/dev/null
    cudarc_sys="$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -path '*/cudarc-0.19.10/src/driver/sys/mod.rs' | head -n 1)"
fi
[[ -n "$cudarc_sys" ]] || { echo "build-cuda: cudarc 0.19.10's sources are not in the cargo registry" >&2; exit 1; }

# The link directory: unversioned names for the linker, the libcuda stub.
link="$cache/link-13.0"
rm -rf "$link"
mkdir -p "$link/lib"
for dir in "$cuda_home/lib" $lib_dirs; do
    for so in "$dir"/lib*.so.*; do
        base="$(basename "$so")"
        case "$base" in
            libcudart.so.13 | libcublas.so.13 | libcublasLt.so.13 | libcurand.so.10 | libnvrtc.so.13)
                ln -sf "$so" "$link/lib/${base%%.so.*}.so"
                ;;
        esac
    done
done
stub_c="$link/libcuda-stub.c"
{
    echo '/* Link-time stand-in for the CUDA driver (libcuda.so.1): every driver function cudarc 0.19.10'
    echo '   declares, each answering CUDA_ERROR_UNKNOWN (999). Never loaded: the real driver is. */'
    grep -oP '^\s+fn \Kcu\w+(?=\()' "$cudarc_sys" | sort -u | sed 's/.*/int &(void) { return 999; }/'
} >"$stub_c"
cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$link/lib/libcuda.so" "$stub_c"
for name in cuda cudart cublas cublasLt curand nvrtc; do
    [[ -e "$link/lib/lib$name.so" ]] || { echo "build-cuda: no lib$name.so to link against in $link/lib" >&2; exit 1; }
done

export CUDA_HOME="$cuda_home"
# cudarc adds <root>/lib of every CUDA_* root it is given to the linker's search path.
export CUDA_ROOT="$link"
export CUDA_COMPUTE_CAP=90
export CUDARC_CUDA_VERSION=13000
export LAYADDEV_NVCC_REAL="$cuda_home/bin/nvcc"
export NVCC="$PWD/tools/device/nvcc-cache"
unset LAYADDEV_NVCC_STANDIN
export CARGO_TARGET_DIR="${BUILD_CUDA_TARGET_DIR:-$PWD/target/build-cuda}"
started=$(date +%s)
# candle at the release default (opt-level 3), not the workspace's 1: on the CPU the forward's time
# is in layad's own kernels, but on a GPU every op's host side (shape checks, kernel launch) is
# candle's and cudarc's, several hundred ops per forward, and short requests wait on it.
cargo build --release --locked -p layad-worker-gpu -p layad-engine-bench -p layad -p layad-system-tests -p layad-worker-ane \
    --features layad-worker-gpu/cuda,layad-engine-bench/cuda --bins \
    --config 'profile.release.package.candle-core.opt-level = 3' \
    --config 'profile.release.package.candle-nn.opt-level = 3' >&2
binary="$CARGO_TARGET_DIR/release/layad-worker-gpu"
echo "build-cuda: built in $(($(date +%s) - started)) s" >&2

# What an H200 machine with a CUDA 13.0 driver and torch's CUDA 13 wheels provides (libcuda.so.1
# from the driver; the others from nvidia/cu13/lib), plus the C and C++ runtimes every Linux has.
allowed='^(libcuda\.so\.1|libcudart\.so\.13|libcublas\.so\.13|libcublasLt\.so\.13|libcurand\.so\.10|libnvrtc\.so\.13|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libc\.so\.6|libm\.so\.6|ld-linux-x86-64\.so\.2)$'
for tool in layad-bench layad-device-check; do
    [[ -x "$CARGO_TARGET_DIR/release/$tool" ]] || { echo "build-cuda: no $tool built" >&2; exit 1; }
done
needed="$(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')"
echo "build-cuda: NEEDED: $(echo "$needed" | tr '\n' ' ')" >&2
unexpected="$(echo "$needed" | grep -Ev "$allowed" || true)"
if [[ -n "$unexpected" ]]; then
    echo "build-cuda: the binary needs libraries an H200 machine may not have: $unexpected" >&2
    exit 1
fi
# Libraries nothing references are dropped (--as-needed); these two every CUDA forward calls.
for soname in libcuda.so.1 libcublas.so.13; do
    echo "$needed" | grep -qx "${soname//./\\.}" || {
        echo "build-cuda: the binary does not need $soname: did it link CUDA at all?" >&2
        exit 1
    }
done
# The C library the H200 machine must have at least (its distribution's glibc).
echo "build-cuda: needs glibc >= $(objdump -T "$binary" | grep -o 'GLIBC_[0-9.]*' | sort -V | tail -n 1 | cut -d_ -f2) (this machine: $(ldd --version | head -n 1 | grep -o '[0-9.]*$'))" >&2
# The driver functions the binary binds at start (full RELRO binds them all before main).
echo "build-cuda: driver functions bound at start: $(nm -D --undefined-only "$binary" | grep -c ' cu[A-Z]')" >&2
# What travels to the GPU machine: every binary tools/device/cuda-check.sh runs, in one .tar.xz in
# the carried directory (the device tool carries at most 64 MiB in all, wheels included). The seven
# binaries are about 350 MB unpacked; the CUDA ones each hold candle's PTX, which xz finds again in
# the next binary with a dictionary larger than one binary (gzip's 32 KiB window does not). Measured
# on the three CUDA binaries (165 MB), 2 busy cores: gzip 41 MiB; `xz -6 -T2` 20.9 MiB in 360 s
# (8 MiB dictionary: no dedupe); `xz -9` 8.5 MiB in 656 s; `--lzma2=preset=3,dict=128MiB` 9.6 MiB
# in 56 s; `--lzma2=preset=1,dict=128MiB` 9.8 MiB in 23 s, decompressed in 1 s. The last it is.
# The supervisor, layad-http-bench, layad-load and layad-worker-ane are built with the same features in the same
# command, so the CUDA worker also serves cuda-check's CPU pool and one directory holds everything.
# cuda-check.sh unpacks it into target/device-bin (outside the carried directory) on the machine.
carry="${LAYADDEV_DEVICE_CARRY:-$PWD/target/device-carry}"
mkdir -p "$carry"
# layad-worker-ane too: layad-http-bench (through layad-system-tests' bin_dir) wants every worker
# binary beside itself and runs `cargo build` when one is missing, which the GPU machine cannot.
bins=(layad layad-http-bench layad-load layad-worker-gpu layad-worker-ane layad-bench layad-device-check)
for b in "${bins[@]}"; do
    [[ -x "$CARGO_TARGET_DIR/release/$b" ]] || { echo "build-cuda: no $b built" >&2; exit 1; }
done
packed=$(date +%s)
# One xz thread: with more, xz cuts the input into blocks and the PTX repeats across blocks.
tar -C "$CARGO_TARGET_DIR/release" -cf - "${bins[@]}" | xz --lzma2=preset=1,dict=128MiB -T1 >"$carry/layad-bins.tar.xz.part"
mv "$carry/layad-bins.tar.xz.part" "$carry/layad-bins.tar.xz"
echo "build-cuda: $carry/layad-bins.tar.xz: $(du -b "$carry/layad-bins.tar.xz" | awk '{printf "%.1f", $1 / 1048576}') MiB ($(du -cb "${bins[@]/#/$CARGO_TARGET_DIR/release/}" | tail -n 1 | awk '{printf "%.0f", $1 / 1048576}') MiB unpacked), packed in $(($(date +%s) - packed)) s" >&2
if [[ -d "$carry/wheels" ]]; then
    # The device tool's 64 MiB count the working tree (tracked files) too.
    tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
    echo "build-cuda: the carry, $carry: $(du -sb "$carry" | awk '{printf "%.1f", $1 / 1048576}') MiB, with the working tree's $(awk -v t="$tree" 'BEGIN {printf "%.1f", t / 1048576}') MiB: $(du -sb "$carry" | awk -v t="$tree" '{printf "%.1f", ($1 + t) / 1048576}') MiB (the device tool's limit: 64 MiB)" >&2
else
    echo "build-cuda: no $carry/wheels yet: tools/device/fetch-wheels.sh fetches the peers' wheels" >&2
fi
echo "$binary"
