#!/usr/bin/env bash
# The one check for a CUDA machine (the H200: 16 cores, CUDA 13.0 driver, torch with CUDA, no
# network), run from the repository root with binaries built elsewhere and carried; everything goes
# as JSON plus one markdown table into OUTDIR. With --cpu a CPU pool stands in for the GPU, so the
# script's logic runs on any machine (and in CI).
#
#   tools/device/cuda-check.sh [--cpu] OUTDIR
#
# On the GPU machine it runs through tools/device/gpu-run.sh, which hands OUTDIR back under $OUT.
# On the GPU machine everything comes from one carried directory, CARRY (default
# target/device-carry), made here by tools/device/build-cuda.sh and tools/device/fetch-wheels.sh:
#   CARRY/layad-bins.tar.xz  every binary (built with CUDA; the CUDA worker serves the CPU pool too),
#                            unpacked by this script into target/device-bin, then BIN
#   CARRY/wheels/            laya[serve] 0.4.15 and laya-cuda 0.1.1 with what the image lacks;
#                            installed into a venv over python3's own packages (torch, transformers,
#                            CuPy) in step 0b, which becomes UPSTREAM_PYTHON
#
# Steps (each writes OUTDIR/<step>.json and its log OUTDIR/<step>.log):
#   0 binaries: every binary starts (`--help`), missing shared libraries are named; on a GPU,
#     CUDA libraries missing from the system are taken from torch's nvidia/* wheels.
#   1 goldens: layad-device-check — upstream's golden rows on the device in f32 (within 1e-4), then
#     bf16 and f16 loaded behind the parity gate (|Δp| <= 0.02, no hard mismatch) and judged
#     against upstream with the same rule.
#   2 forward: layad-bench — in-process forward latency by length and rows on the device, on the
#     full-size random ModernBERT-large checkpoint it writes (--cpu: the small modernbert-mini).
#   3 served: layad-http-bench — latency per request shape and answers/s by clients, paired with
#     upstream laya-serve on the same device when UPSTREAM_PYTHON names a Python with laya 0.4.15
#     (answers compared first); skipped with a note otherwise.
#     served-laya-cuda: the same against laya-cuda 0.1.1 behind tools/device/laya_cuda_http.py
#     (upstream's HTTP surface; a `laya-serve` launcher in OUTDIR/laya-cuda-peer stands in for
#     upstream's), when UPSTREAM_PYTHON can import laya_cuda's GPU runtime; skipped with a note
#     otherwise. --cpu runs the wrapper's own self-test (a fake backend over real HTTP) instead.
#   4 spill: the device pool alone, then beside a CPU pool with spill on, under the same bursty
#     open-loop load (layad-load) at LOAD_FRACTION of the device pool's closed-loop capacity:
#     0 errors, P99 of short and long requests for both.
#   5 slow: issue 40's slowed device with the device as the device that slows: pool `a` (short
#     single questions only) on the device, pool `b` on the CPU, spill on; open-loop short requests
#     while `a`'s worker runs only a quarter of every 20 ms for a while (SIGSTOP/SIGCONT: on a GPU
#     its host thread stalls, so the device idles), then per 3-second window P50, P99 and where the
#     requests went, and the verdicts over the slow windows (tools/bench/slow-device.sh, CASES=slow;
#     OUTDIR/slow-device/). Reported, not judged: the ratios depend on the machine; errors fail it.
#   6 report: OUTDIR/summary.json and OUTDIR/table.md (tools/device/cuda_report.py).
#
# Environment: BIN (every binary: layad, layad-http-bench, layad-load, layad-worker-gpu, layad-bench,
# layad-device-check; default target/device-bin, unpacked from CARRY/layad-bins.tar.xz, when that is
# there, else target/release),
# DEV_BIN (the device's layad-worker-gpu, layad-bench, layad-device-check, when they live elsewhere;
# default BIN), DEVICE (default cuda:0), UPSTREAM_PYTHON (default: the venv made from CARRY/wheels on
# a GPU, none with --cpu), CPU_THREADS (the CPU pool beside the GPU; default 14), PORT (default
# 18760), LOAD_FRACTION (0.7).
# Exits 1 when any step failed; the report still lists what ran.
set -euo pipefail
cd "$(dirname "$0")/../.."

cpu=0
if [[ "${1:-}" == "--cpu" ]]; then
    cpu=1
    shift
fi
if [[ $# -ne 1 ]]; then
    echo "usage: tools/device/cuda-check.sh [--cpu] OUTDIR" >&2
    exit 2
fi
mkdir -p "$1"
out="$(cd "$1" && pwd)"
started=$(date +%s)

CARRY="${CARRY:-target/device-carry}"
# The carried binaries, unpacked once (a rerun on the same machine reuses them), outside the carried
# directory so that it stays the size that was carried.
if [[ -z "${BIN:-}" && -f "$CARRY/layad-bins.tar.xz" ]]; then
    unpacked=target/device-bin
    if [[ ! -x "$unpacked/layad" || "$CARRY/layad-bins.tar.xz" -nt "$unpacked/layad" ]]; then
        t0=$(date +%s)
        rm -rf "$unpacked"
        mkdir -p "$unpacked"
        xz -dc -T0 "$CARRY/layad-bins.tar.xz" | tar -x -C "$unpacked"
        touch "$unpacked/layad"
        echo "cuda-check: unpacked $CARRY/layad-bins.tar.xz into $unpacked in $(($(date +%s) - t0)) s" >&2
    fi
    BIN="$unpacked"
fi
BIN="$(cd "${BIN:-target/release}" && pwd)"
DEV_BIN="$(cd "${DEV_BIN:-$BIN}" && pwd)"
PORT=${PORT:-18760}
LOAD_FRACTION=${LOAD_FRACTION:-0.7}
if [[ $cpu == 1 ]]; then
    device=cpu
    dev_threads=1
    cpu_threads=${CPU_THREADS:-1}
    model=modernbert-mini
    lengths=64,128
    rows=1,4
    precisions=f32,bf16
    served_dtype=f32
    clients=1,4
    served_seconds=2
    pairs=5
    capacity_seconds=5
    run_seconds=12
    slow_rate=8
    slow_seconds=15
    slow_from=5
    slow_for=5
    upstream_device=cpu
else
    device=${DEVICE:-cuda:0}
    dev_threads=2
    cpu_threads=${CPU_THREADS:-14}
    model=modernbert-large
    lengths=64,128,256,512
    rows=1,4,16,64
    precisions=f32,bf16,f16
    served_dtype=bf16
    clients=1,4,16,64
    served_seconds=5
    pairs=20
    capacity_seconds=10
    run_seconds=30
    slow_rate=20
    slow_seconds=36
    slow_from=12
    slow_for=12
    upstream_device=cuda
fi

notes="$out/notes.txt"
: >"$notes"
note() { echo "$*" | tee -a "$notes" >&2; }
failed=()
step() { # name command...: runs one step, its output in $out/<name>.log; a failure is recorded
    local name="$1"
    shift
    local t0
    t0=$(date +%s)
    echo "== $name" >&2
    if "$@" >"$out/$name.log" 2>&1; then
        echo "$name: ok ($(($(date +%s) - t0)) s)" | tee -a "$out/steps.txt" >&2
    else
        echo "$name: FAILED ($(($(date +%s) - t0)) s); last lines of $out/$name.log:" | tee -a "$out/steps.txt" >&2
        tail -n 15 "$out/$name.log" >&2
        failed+=("$name")
    fi
}
: >"$out/steps.txt"
note "mode: $([[ $cpu == 1 ]] && echo "--cpu (a CPU pool stands in for the GPU)" || echo "GPU $device")"

# 0: binaries. On a GPU, CUDA libraries the system lacks come from torch's wheels (nvidia/*/lib).
binaries() {
    if [[ $cpu == 0 ]] && ldd "$DEV_BIN/layad-worker-gpu" | grep -q 'not found'; then
        local py=${TORCH_PYTHON:-python3}
        local extra
        extra=$("$py" -c 'import glob, os, nvidia; print(":".join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "**", "lib*.so*"), recursive=True)})))' || true)
        # The toolkit's own libraries, where nvcc 13.0 is installed the usual way.
        for dir in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64; do
            [[ -d "$dir" ]] && extra="${extra:+$extra:}$dir"
        done
        export LD_LIBRARY_PATH="$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "LD_LIBRARY_PATH from torch's nvidia wheels: $extra"
    fi
    local missing=0
    for b in "$BIN/layad" "$BIN/layad-http-bench" "$BIN/layad-load" "$BIN/layad-worker-ane" "$DEV_BIN/layad-worker-gpu" \
        "$DEV_BIN/layad-bench" "$DEV_BIN/layad-device-check"; do
        if ! "$b" --help >/dev/null; then
            echo "$b does not start:"
            ldd "$b" | grep 'not found' || true
            missing=1
        fi
    done
    [[ $cpu == 1 ]] || nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv || true
    return $missing
}
step binaries binaries

# 0b (GPU): the peers' Python environment, from the carried wheels, with torch and CuPy from the
# system. The image's python3 is itself a venv (/opt/torch/.venv), whose packages a venv made from it
# with --system-site-packages would not see (that flag means the base interpreter's); a .pth file
# adds python3's own site directories after the new venv's, so pip sees torch, transformers and
# CuPy as installed and takes from the wheels only what is missing. laya-cuda goes in with
# --no-deps: its pins (cupy-cuda12x, nvidia-*-cu12) name CUDA 12 wheels, and the machine's CuPy is
# what it will run on. PEERS_PYTHON (default python3) is the Python with torch.
venv="$PWD/target/device-venv"
peers() {
    # (set -e does not reach inside a step: each command says itself that it failed.)
    local py=${PEERS_PYTHON:-python3} site
    rm -rf "$venv"
    "$py" -m venv "$venv" || return 1
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 1
    "$py" -c 'import site; [print(f"import site; site.addsitedir({d!r})") for d in site.getsitepackages()]' \
        >"$site/zz-peers-system.pth" || return 1
    "$venv/bin/python" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' || return 1
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-index --find-links "$CARRY/wheels" 'laya[serve]==0.4.15' || return 1
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-index --no-deps --find-links "$CARRY/wheels" laya-cuda==0.1.1 ||
        echo "laya-cuda 0.1.1 did not install (it needs Python >= 3.12)"
    "$venv/bin/python" -c 'import laya, fastapi, uvicorn' || return 1
    # Where python3 had laya already, pip installed no launcher: the bench starts <venv>/bin/laya-serve.
    if [[ ! -x "$venv/bin/laya-serve" ]]; then
        printf '#!/bin/sh\nexec %q -c "import sys; from laya.serve import main; sys.exit(main())"\n' "$venv/bin/python" >"$venv/bin/laya-serve"
        chmod +x "$venv/bin/laya-serve"
    fi
    "$venv/bin/pip" list --disable-pip-version-check 2>/dev/null | grep -Ei '^(laya|laya-cuda|torch|cupy.*|transformers|numpy) '
}
if [[ -z "${UPSTREAM_PYTHON:-}" ]]; then
    UPSTREAM_PYTHON=none
    # --cpu with PEERS_PYTHON: the same environment built here (tested with /work/venvs/laya-0.4.15).
    if [[ -d "$CARRY/wheels" && ( $cpu == 0 || -n "${PEERS_PYTHON:-}" ) ]]; then
        step peers peers
        [[ -x "$venv/bin/laya-serve" ]] && UPSTREAM_PYTHON="$venv/bin/python"
    fi
fi
# The library path found in step 0 must reach the later steps too.
if [[ $cpu == 0 ]] && grep -q '^LD_LIBRARY_PATH from' "$out/binaries.log"; then
    export LD_LIBRARY_PATH="$(sed -n 's/^LD_LIBRARY_PATH from torch.s nvidia wheels: //p' "$out/binaries.log")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# 1: goldens on the device, f32 and the half-precision gates.
step goldens "$DEV_BIN/layad-device-check" --device "$device" --fixtures tests/fixtures \
    --threads "$dev_threads" --out "$out/goldens.json"

# 2: in-process forward latency; also writes the random checkpoint the later steps serve.
step forward "$DEV_BIN/layad-bench" --device "$device" --out-dir "$out/bench" --models "$model" \
    --lengths "$lengths" --rows "$rows" --precisions "$precisions" --threads "$dev_threads" \
    --python none --min-runs 3 --max-runs 20 --budget-s 1 --gap-ms 50 --json "$out/forward.json" \
    --fixture-cache "$PWD/tests/fixtures/hf-cache/hub"
checkpoint=$(find "$out/bench" -maxdepth 1 -type d -name "$model-v*" 2>/dev/null | head -n 1)

# 3: served latency and answers/s, paired with upstream where it is given.
if [[ "$UPSTREAM_PYTHON" == none ]]; then
    note "served: upstream laya-serve 0.4.15 skipped (UPSTREAM_PYTHON not given)"
fi
served() { # peer python, output: layad-http-bench against the peer whose `laya-serve` sits beside python
    "$BIN/layad-http-bench" --checkpoint "$checkpoint" --device "$device" \
        --worker-dir "$DEV_BIN" --dtype "$served_dtype" --threads "$dev_threads" --shapes short,long \
        --pairs "$pairs" --seconds "$served_seconds" --concurrency "$clients" \
        --upstream-python "$1" --upstream-device "$upstream_device" --out "$2"
}
# laya-cuda's peer: a `laya-serve` launcher running the wrapper, beside a `python` link the bench
# is pointed at (it starts `<dir of python>/laya-serve` with upstream's environment).
laya_cuda=none
if [[ $cpu == 1 ]]; then
    step laya-cuda-wrapper python3 tools/device/laya_cuda_http.py --self-test
    note "served: laya-cuda skipped (no GPU); its HTTP wrapper's self-test ran instead"
elif [[ "$UPSTREAM_PYTHON" == none ]]; then
    note "served: laya-cuda skipped (no Python environment for the peers)"
elif ! "$UPSTREAM_PYTHON" -c 'import laya_cuda.runtime' >"$out/laya-cuda-import.log" 2>&1; then
    note "served: laya-cuda skipped, its GPU runtime does not import: $(tail -n 1 "$out/laya-cuda-import.log")"
else
    mkdir -p "$out/laya-cuda-peer"
    ln -sf "$UPSTREAM_PYTHON" "$out/laya-cuda-peer/python"
    printf '#!/bin/sh\nexec %q %q\n' "$UPSTREAM_PYTHON" "$PWD/tools/device/laya_cuda_http.py" >"$out/laya-cuda-peer/laya-serve"
    chmod +x "$out/laya-cuda-peer/laya-serve"
    laya_cuda="$out/laya-cuda-peer/python"
fi
if [[ -n "$checkpoint" ]]; then
    step served served "$UPSTREAM_PYTHON" "$out/served.json"
    [[ "$laya_cuda" == none ]] || step served-laya-cuda served "$laya_cuda" "$out/served-laya-cuda.json"
else
    note "served: skipped, step forward wrote no checkpoint"
    failed+=(served)
fi

# 4: the device pool alone, then beside a CPU pool with spill on, under the same bursty load.
spill() {
    local hf="$out/hf-home" revision=0000000000000000000000000000000000c0da00
    local snapshot="$hf/hub/models--convaiinnovations--laya/snapshots/$revision"
    rm -rf "$hf"
    mkdir -p "$snapshot/encoder" "$snapshot/tokenizer" "$hf/hub/models--convaiinnovations--laya/refs"
    for file in rl_agent_config.json model.safetensors encoder/config.json tokenizer/tokenizer.json \
        tokenizer/tokenizer_config.json; do
        ln -s "$checkpoint/$file" "$snapshot/$file"
    done
    printf %s "$revision" >"$hf/hub/models--convaiinnovations--laya/refs/main"
    local device_pool cpu_pool
    device_pool=$(printf '[[pool]]\nname = "device"\ndevice = "%s"\nworkers = 1\nthreads = %s\ndtype = "%s"\ncheckpoints = ["english"]\n' \
        "$device" "$dev_threads" "$served_dtype")
    cpu_pool=$(printf '[[pool]]\nname = "cpu"\ndevice = "cpu"\nworkers = 1\nthreads = %s\ndtype = "f32"\ncheckpoints = ["english"]\n' \
        "$cpu_threads")
    local common
    common=$(printf '[server]\nrequest_timeout = "120s"\ndiagnostics = true\n\n[compat]\ndefault_checkpoint = "english"\n\n[checkpoints]\nmultilingual = "off"\ntyped-decisions = "off"\n\n[workers]\nbinary_dir = "%s"\nstartup_timeout = "900s"\n' "$DEV_BIN")
    printf '%s\n\n%s\n' "$common" "$device_pool" >"$out/spill-alone.toml"
    printf '%s\n\n%s\n\n%s\n\n[scheduling]\nspill = true\n' "$common" "$device_pool" "$cpu_pool" >"$out/spill-with-cpu.toml"
    # Only `english` is served: upstream 0.4.15's default checkpoint (multilingual), where a few-word
    # body is not detected as English, is set to it (`[compat] default_checkpoint` above).
    local url="http://127.0.0.1:$PORT" rate=""
    for config in alone with-cpu; do
        HF_HOME=$hf HF_HUB_OFFLINE=1 LAYAD_WORKERS__SOCKET_DIR="$out/sockets-$config" \
            "$BIN/layad" serve --config "$out/spill-$config.toml" --listen "127.0.0.1:$PORT" \
            >"$out/layad-spill-$config.log" 2>&1 &
        local pid=$!
        local ready=0
        for _ in $(seq 900); do
            kill -0 "$pid" 2>/dev/null || break
            if curl -sf "$url/health" | grep -q '"status":"ok"'; then
                ready=1
                break
            fi
            sleep 1
        done
        if [[ $ready == 0 ]]; then
            echo "layad ($config) not ready; see $out/layad-spill-$config.log"
            tail -n 20 "$out/layad-spill-$config.log"
            kill -TERM "$pid" 2>/dev/null || true
            wait "$pid" || true
            return 1
        fi
        curl -sf "$url/health" >"$out/health-spill-$config.json"
        if [[ -z "$rate" ]]; then
            local capacity
            capacity=$("$BIN/layad-load" capacity --url "$url" --seconds "$capacity_seconds" --clients 4 \
                --seed 1 --reference "$out/spill-reference.json" --out "$out/spill-capacity.json" |
                awk '/^capacity_rps/ {print $2}')
            [[ -n "$capacity" ]] || { echo "layad-load capacity printed no capacity_rps"; kill -TERM "$pid"; wait "$pid" || true; return 1; }
            rate=$(awk -v c="$capacity" -v f="$LOAD_FRACTION" 'BEGIN {printf "%.3f", c * f}')
            echo "device pool alone: capacity $capacity req/s; offered load $rate req/s, bursty"
        fi
        "$BIN/layad-load" run --url "$url" --rate "$rate" --seconds "$run_seconds" --arrivals bursty --seed 1 \
            --reference "$out/spill-reference.json" --label "$config" --out "$out/spill-$config.json" || {
            kill -TERM "$pid"
            wait "$pid" || true
            return 1
        }
        kill -TERM "$pid"
        wait "$pid" || true
    done
}
if [[ -n "$checkpoint" ]]; then
    step spill spill
else
    failed+=(spill)
fi

# 5: pool `a` on the device slowed to a quarter of its speed for a while, pool `b` on the CPU beside it.
slow_device() {
    local pools
    pools=$(printf '[[pool]]\nname = "a"\ndevice = "%s"\nworkers = 1\nthreads = %s\ndtype = "%s"\nmax_questions = 1\nmax_tokens = 128\nbuckets = []\nbatch_wait = "0ms"\ncheckpoints = ["english"]\n\n[[pool]]\nname = "b"\ndevice = "cpu"\nworkers = 1\nthreads = %s\ndtype = "f32"\nbatch_wait = "0ms"\ncheckpoints = ["english"]\n' \
        "$device" "$dev_threads" "$served_dtype" "$cpu_threads")
    printf '[server]\nrequest_timeout = "60s"\ndiagnostics = true\n\n[compat]\ndefault_checkpoint = "english"\n\n[checkpoints]\nmultilingual = "off"\ntyped-decisions = "off"\n\n[workers]\nstartup_timeout = "900s"\n\n%s\n[scheduling]\nspill = true\n' \
        "$pools" >"$out/slow-device.toml"
    CASES=slow SEEDS=1 SKIP_BUILD=1 BIN="$BIN" WORKER_BIN="$DEV_BIN" CHECKPOINT="$checkpoint" \
        SLOW_CONFIG="$out/slow-device.toml" OUT="$out/slow-device" PORT=$((PORT + 1)) RATE=$slow_rate \
        RUN_SECONDS=$slow_seconds SLOW_FROM=$slow_from SLOW_FOR=$slow_for tools/bench/slow-device.sh
}
if [[ -n "$checkpoint" ]]; then
    step slow slow_device
else
    failed+=(slow)
fi

# 6: one summary and one table.
step report python3 tools/device/cuda_report.py "$out" "$([[ $cpu == 1 ]] && echo cpu || echo gpu)" "$device"
cat "$out/table.md" 2>/dev/null || true
echo "cuda-check: $(($(date +%s) - started)) s; results in $out" >&2
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "cuda-check: FAILED steps: ${failed[*]}" >&2
    exit 1
fi
echo "cuda-check: every step passed" >&2
