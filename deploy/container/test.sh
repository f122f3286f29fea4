#!/usr/bin/env bash
# Builds the image (build.sh) and runs it under podman as a user would: the fixture Hugging Face
# cache mounted read-only at /data, the image's own entry point and default command (`serve` on
# 0.0.0.0:8642; the config comes through LAYAD_CONFIG), a CPU limit of 2 shared by 2 workers. It
# checks that
#   - /livez answers, serve becomes ready (/readyz 200, the image's HEALTHCHECK healthy), both
#     workers start, and the supervisor sized them from the CPU quota (1 thread each);
#   - a decision is answered (the README's request) with a choice among its options;
#   - SIGTERM drains: a request held in the queue when `podman stop` sends it is still answered
#     200, and layad exits 0.
#
#   deploy/container/test.sh                      # release build (cargo build --release) first
#   BIN_DIR=target/debug deploy/container/test.sh  # binaries already built (.ci/run)
#
# Where podman is missing, or cannot build or run containers here, it says SKIPPED and exits 0.
# podman runs with runc (cgroup v1 hosts need it; crun is Debian's default) and without default
# ulimits (a container here may not raise them): through its own containers.conf, CONTAINERS_CONF,
# for this script's podman only.
set -euo pipefail
cd "$(dirname "$0")/../.."

skip() {
    echo "container test: SKIPPED: $1"
    exit 0
}
fail() {
    echo "container test: FAILED: $1" >&2
    [ -n "${name:-}" ] && podman logs --tail 60 "$name" >&2 2>&1
    exit 1
}
command -v podman >/dev/null || skip "podman is not installed (apt install podman runc)"
command -v runc >/dev/null || skip "runc is not installed (apt install runc)"
command -v curl >/dev/null || skip "curl is not installed"
[ "$(nproc)" -ge 2 ] || skip "the test gives the container 2 CPUs, and this machine has $(nproc)"

work=$(mktemp -d)
name=
own_image=
cleanup() {
    [ -n "$name" ] && podman rm -f -t 0 "$name" >/dev/null 2>&1
    # The test's own image goes too (each run would leave the last one's layers behind); one named
    # by IMAGE stays.
    [ -n "$own_image" ] && podman rmi -f "$IMAGE" >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT
printf '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n' >"$work/containers.conf"
export CONTAINERS_CONF="$work/containers.conf"
podman info >/dev/null 2>&1 || skip "podman cannot start here ($(podman info 2>&1 | tail -1))"

started=$(date +%s)
own_image=
[ -z "${IMAGE:-}" ] && own_image=1
export IMAGE=${IMAGE:-localhost/layad:test}
set +e
built=$(deploy/container/build.sh 2>"$work/build.log")
status=$?
set -e
[ "$status" = 2 ] && skip "the image cannot be built here: $(tail -1 "$work/build.log")"
[ "$status" = 0 ] || { tail -30 "$work/build.log" >&2; fail "build.sh exited $status"; }
[ "$(echo "$built" | tail -1)" = "$IMAGE" ] || fail "build.sh's last line is '$(echo "$built" | tail -1)', not $IMAGE"
build_s=$(($(date +%s) - started))

# The entry point is layad.
version=$(podman run --rm --no-healthcheck "$IMAGE" --version 2>"$work/version.err") ||
    skip "podman cannot run containers here: $(tail -1 "$work/version.err")"
[[ $version == layad* ]] || fail "the entry point answered '$version' to --version, not layad"

# Two workers under a 2-CPU limit; batch_wait holds a lone request 3 s in the queue, so one is
# certainly in flight when SIGTERM comes (it waits for company that never arrives, then runs).
mkdir "$work/etc"
cat >"$work/etc/layad.toml" <<'EOF'
[server]
shutdown_grace = "20s"

[[pool]]
name = "cpu"
device = "cpu"
workers = 2
batch_wait = "3s"

[logging]
format = "json"
EOF
chmod -R a+rX "$work/etc"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
name="layad-test-$$"
# The HEALTHCHECK is kept but not scheduled (podman schedules it with systemd timers, which a
# machine without systemd lacks); it is run by hand below.
podman run -d --name "$name" --health-interval disable --cpus 2 -p "127.0.0.1:$port:8642" \
    -v "$PWD/tests/fixtures/hf-cache:/data:ro" -v "$work/etc:/etc/layad:ro" \
    -e LAYAD_CONFIG=/etc/layad/layad.toml -e HF_HUB_OFFLINE=1 "$IMAGE" >/dev/null 2>"$work/run.err" ||
    fail "podman run: $(grep -v 'level=error' "$work/run.err" | tail -1)"
url="http://127.0.0.1:$port"

# Ready within 120 s (a debug build on two busy cores loads the fixtures in seconds).
ready=
for _ in $(seq 240); do
    [ "$(podman inspect --format '{{.State.Running}}' "$name")" = true ] || fail "the container stopped"
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/readyz")" = 200 ]; then
        ready=$(($(date +%s) - started - build_s))
        break
    fi
    sleep 0.5
done
[ -n "$ready" ] || fail "/readyz did not answer 200 within 120 s"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/livez")" = 200 ] || fail "/livez did not answer 200"
# The image's HEALTHCHECK, run by hand.
podman healthcheck run "$name" >/dev/null 2>&1 || fail "the HEALTHCHECK (layad-probe /readyz) is not healthy"

health=$(curl -s "$url/health")
ready_workers=$(echo "$health" | python3 -c '
import json, sys
health = json.load(sys.stdin)
print(sum(w["state"] == "ready" for p in health["pools"] for w in p["workers"]))')
[ "$ready_workers" = 2 ] || fail "$ready_workers workers ready, not 2: $health"
# (The log is read whole first: `grep -q` on a pipe would end it early, and pipefail fail.)
log=$(podman logs "$name" 2>&1)
grep -q '"threads_per_worker":1' <<<"$log" ||
    fail "the supervisor did not size the workers from the CPU quota (no threads_per_worker 1 in its log)"
[ "$(grep -c 'threads: Some(1)' <<<"$log")" = 2 ] || fail "the two workers were not started with --threads 1"

request='{"state": "I was charged twice for invoice 4411, please refund it today.",
  "questions": {"queue": {"type": "choice", "instructions": "Which queue?",
                          "criteria": {"billing": "payment problems", "tech": "technical issue"}}}}'
answer=$(curl -s -w '\n%{http_code}' "$url/v1/systemone" -H 'content-type: application/json' -d "$request")
[ "$(echo "$answer" | tail -1)" = 200 ] || fail "the decision was answered $(echo "$answer" | tail -1): $answer"
choice=$(echo "$answer" | head -n -1 | python3 -c '
import json, sys
print(json.load(sys.stdin)["answers"]["queue"]["choice"])')
[[ $choice == billing || $choice == tech ]] || fail "the answer's choice is '$choice'"

# Drain: a request in the queue when SIGTERM arrives is answered, then layad exits 0.
curl -s -o "$work/inflight.json" -w '%{http_code}' "$url/v1/systemone" -H 'content-type: application/json' \
    -d "$request" >"$work/inflight.code" &
inflight=$!
sleep 1
podman stop -t 45 "$name" >/dev/null 2>"$work/stop.err" || fail "podman stop: $(tail -1 "$work/stop.err")"
wait "$inflight" || true
[ "$(cat "$work/inflight.code")" = 200 ] || fail "the request in flight at SIGTERM got $(cat "$work/inflight.code"), not 200"
exit_code=$(podman inspect --format '{{.State.ExitCode}}' "$name")
[ "$exit_code" = 0 ] || fail "layad exited $exit_code after SIGTERM, not 0"
log=$(podman logs "$name" 2>&1)
grep -q 'SIGTERM received' <<<"$log" || fail "layad's log does not say it received SIGTERM"
grep -q '"drained":true' <<<"$log" || fail "layad's log does not say it drained"

size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "container test: $IMAGE ($((size / 1000000)) MB) built in $build_s s; ready $ready s after start, 2 workers at 1 thread (--cpus 2), answered '$choice', drained on SIGTERM with a request in flight, exit 0 ($(($(date +%s) - started)) s in all)"
