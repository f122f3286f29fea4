#!/usr/bin/env bash
# Runs the reliability probes of docs/reliability.md against a fresh layad: starts target/$PROFILE/layad
# on the fixture checkpoints with default settings (an empty configuration file) on a loopback port,
# with its own socket directory, then the long-text memory probe and the slow-client probe, then
# stops it. Prints each probe's JSON and the CPU model.
#
#   PROFILE=debug tools/reliability/measure.sh          # or release (build it first)
#   SLOW_CONNECTIONS=1500 SLOW_DURATION=60 SLOW_SOURCE=127.0.0.2 tools/reliability/measure.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
profile=${PROFILE:-release}
bin="$root/target/$profile/layad"
[ -x "$bin" ] || { echo "no $bin: build it first (cargo build --$profile -p layad -p layad-worker-gpu)" >&2; exit 1; }
port=${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
work=$(mktemp -d)
: > "$work/layad.toml"
HF_HOME="$root/tests/fixtures/hf-cache" HF_HUB_OFFLINE=1 LAYAD_WORKERS__SOCKET_DIR="$work/sockets" \
  "$bin" serve --config "$work/layad.toml" --listen "127.0.0.1:$port" >"$work/layad.log" 2>&1 &
pid=$!
cleanup() { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
python3 - "$port" <<'PY'
import sys, time, urllib.request
deadline = time.time() + 120
while time.time() < deadline:
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/readyz", timeout=2).status == 200:
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.2)
sys.exit("layad not ready within 120 s")
PY
grep -m1 "model name" /proc/cpuinfo
echo "layad $profile, pid $pid, 127.0.0.1:$port"
sleep 2
echo "== long_text_rss"
python3 "$root/tools/reliability/long_text_rss.py" --addr "127.0.0.1:$port" --pid "$pid" \
  --requests "${RSS_REQUESTS:-8}" --text-bytes "${RSS_TEXT_BYTES:-1500000}" --settle "${RSS_SETTLE:-30}"
echo "== slowloris_probe"
python3 "$root/tools/reliability/slowloris_probe.py" --addr "127.0.0.1:$port" \
  --connections "${SLOW_CONNECTIONS:-1500}" --duration "${SLOW_DURATION:-60}" ${SLOW_SOURCE:+--slow-source "$SLOW_SOURCE"}
echo "== supervisor log: warnings"
grep -c "WARN" "$work/layad.log" || true
grep "connection limit reached" "$work/layad.log" | tail -1 | cut -c1-400 || true
