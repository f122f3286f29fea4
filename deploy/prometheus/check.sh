#!/usr/bin/env bash
# Checks deploy/prometheus and deploy/grafana against what layad really exports:
#   1. promtool check rules + promtool test rules (layad.rules.yml, layad.rules.test.yml);
#   2. a real scrape of a running layad (the fixture checkpoints, one CPU worker, after one answered
#      and one refused request) passes `promtool check metrics`;
#   3. every layad_* metric named in the rules and in the dashboard (deploy/grafana/layad.json) is
#      in that scrape, and every recording rule an expression names is defined;
#   4. where the `prometheus` server is installed: it scrapes that layad (OpenMetrics), loads the
#      rules (all healthy), and evaluates every dashboard expression without error, each metric it
#      names having series.
# Needs promtool (Debian: apt install prometheus; stop and disable its service) and a built layad
# (BIN_DIR, default target/debug: `cargo build -p layad -p layad-worker-gpu`).
#
#   deploy/prometheus/check.sh                          # starts its own layad
#   METRICS_URL=http://10.0.0.5:8642 deploy/prometheus/check.sh   # scrapes one already running
#
# Exits 0 when everything passes, 1 on a failed check, 2 when a tool or binary is missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here=$root/deploy/prometheus
dashboard=$root/deploy/grafana/layad.json
BIN_DIR=${BIN_DIR:-$root/target/debug}
METRICS_URL=${METRICS_URL:-}

command -v promtool >/dev/null || { echo "check.sh: promtool is not installed (Debian: apt install prometheus)" >&2; exit 2; }
cd "$here"
promtool check rules layad.rules.yml
promtool test rules layad.rules.test.yml

work=$(mktemp -d "${TMPDIR:-/tmp}/layad-promcheck.XXXXXX")
server_pid=
prometheus_pid=
cleanup() {
    local status=$?
    for pid in "$prometheus_pid" "$server_pid"; do
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    [ "$status" = 0 ] && rm -rf "$work" || echo "check.sh: kept $work (logs)" >&2
    exit "$status"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

if [ -z "$METRICS_URL" ]; then
    for binary in layad layad-worker-gpu; do
        [ -x "$BIN_DIR/$binary" ] || {
            echo "check.sh: no $BIN_DIR/$binary: build it (cargo build -p layad -p layad-worker-gpu) or set BIN_DIR or METRICS_URL" >&2
            exit 2
        }
    done
    port=$(free_port)
    METRICS_URL=http://127.0.0.1:$port
    printf '[[pool]]\nname = "cpu"\ndevice = "cpu"\nworkers = 1\nthreads = 1\n' > "$work/layad.toml"
    HF_HOME="$root/tests/fixtures/hf-cache" HF_HUB_OFFLINE=1 LAYAD_WORKERS__SOCKET_DIR="$work/sockets" \
        "$BIN_DIR/layad" serve --config "$work/layad.toml" --listen "127.0.0.1:$port" > "$work/layad.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 120); do
        kill -0 "$server_pid" 2>/dev/null || { tail -20 "$work/layad.log" >&2; exit 1; }
        curl -sf "$METRICS_URL/readyz" >/dev/null && break
        sleep 0.5
    done
    curl -sf "$METRICS_URL/readyz" >/dev/null || { echo "check.sh: layad not ready after 60 s" >&2; exit 1; }
    # One answered and one refused request, so the histograms and status labels have samples.
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["cases"][0]["body"])' \
        "$root/tests/fixtures/goldens/cases.json" > "$work/body.json"
    curl -sf -o /dev/null -H 'content-type: application/json' --data-binary @"$work/body.json" "$METRICS_URL/v1/systemone"
    curl -s -o /dev/null -H 'content-type: application/json' --data-binary 'not json' "$METRICS_URL/v1/systemone"
fi

curl -sf "$METRICS_URL/metrics" > "$work/scrape.txt"
echo "promtool check metrics on $METRICS_URL/metrics ($(grep -c '^# TYPE' "$work/scrape.txt") families):"
promtool check metrics < "$work/scrape.txt"
echo "  SUCCESS"

# 3: names in the rules and the dashboard against the scrape.
python3 - "$work/scrape.txt" "$here/layad.rules.yml" "$dashboard" <<'EOF'
import json, re, sys
scrape, rules_path, dashboard_path = sys.argv[1:]
text = open(scrape).read()
samples = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
families = dict(line[len("# TYPE "):].split(" ", 1) for line in text.splitlines() if line.startswith("# TYPE "))
exported = set(samples) | set(families)
for name, kind in families.items():
    if kind == "histogram":
        exported |= {name + "_bucket", name + "_sum", name + "_count"}
rules = open(rules_path).read()
recorded = set(re.findall(r"^\s*- record:\s*(\S+)", rules, re.M))
def rule_exprs(lines):
    """The `expr:` values of a rules file: inline, or a `|` block (the more indented lines after it)."""
    exprs, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)expr:\s*(.*)$", lines[i])
        i += 1
        if not m:
            continue
        if m.group(2) not in ("|", ">"):
            exprs.append(m.group(2))
            continue
        block = []
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > len(m.group(1))):
            block.append(lines[i])
            i += 1
        exprs.append("\n".join(block))
    return exprs
dashboard = json.load(open(dashboard_path))
exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)]
token = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
problems = []
def check(where, source):
    for name in token.findall(source):
        if ":" in name and name not in recorded and not name.startswith("$"):
            problems.append(f"{where}: recording rule {name} is not defined")
        elif name.startswith("layad_") and name not in exported:
            problems.append(f"{where}: {name} is not in the scrape")
for expr in rule_exprs(rules.splitlines()):
    check("layad.rules.yml", expr)
for expr in exprs:
    check("layad.json", expr)
named = {n for e in exprs for n in token.findall(e) if n.startswith("layad_")}
print(f"{len(exprs)} dashboard expressions name {len(named)} metrics; rules define {len(recorded)} recordings")
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
unused = sorted(f for f in families if not any(n == f or n.startswith(f + "_") for n in named))
print("every named metric is exported" + (f"; not charted: {', '.join(unused)}" if unused else ""))
EOF

# 4: a real Prometheus scrapes layad, loads the rules and evaluates the dashboard.
if ! command -v prometheus >/dev/null; then
    echo "check.sh: the prometheus server is not installed: skipped the scrape-and-evaluate check"
    exit 0
fi
prom_port=$(free_port)
target=${METRICS_URL#*://}
cat > "$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["$here/layad.rules.yml"]
scrape_configs:
  - job_name: layad
    static_configs: [{targets: ["$target"]}]
EOF
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$prom_port" > "$work/prometheus.log" 2>&1 &
prometheus_pid=$!
python3 - "http://127.0.0.1:$prom_port" "$dashboard" <<'EOF'
import json, re, sys, time, urllib.parse, urllib.request
base, dashboard_path = sys.argv[1:]
def api(path, **params):
    url = f"{base}/api/v1/{path}?" + urllib.parse.urlencode(params, doseq=True)
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)
deadline = time.time() + 60
while True:
    try:
        up = api("query", query='up{job="layad"}')["data"]["result"]
        if up and up[0]["value"][1] == "1":
            break
    except OSError:
        pass
    if time.time() > deadline:
        sys.exit("prometheus did not scrape layad within 60 s")
    time.sleep(1)
time.sleep(6)  # several scrapes, so rates over a few seconds have two points
targets = api("targets")["data"]["activeTargets"]
print(f"prometheus scraped {targets[0]['scrapeUrl']}: health {targets[0]['health']}")
problems = []
# The recording group evaluates every 30 s: a rule not evaluated yet is "unknown", not broken.
healthy = 0
for group in api("rules")["data"]["groups"]:
    for rule in group["rules"]:
        if rule["health"] == "err":
            problems.append(f"rule {rule['name']}: {rule.get('lastError', '')}")
        healthy += rule["health"] == "ok"
dashboard = json.load(open(dashboard_path))
exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
for expr in exprs:
    query = expr.replace("$__rate_interval", "5s").replace("$instance", ".*")
    answer = api("query", query=query)
    if answer["status"] != "success":
        problems.append(f"{expr}: {answer}")
    for name in set(re.findall(r"\blayad_[a-z0-9_]+", expr)):
        if not api("series", **{"match[]": name})["data"]:
            problems.append(f"{expr}: no series of {name}")
print(f"prometheus evaluated {len(exprs)} dashboard expressions; rules evaluated without error: {healthy}, none failed: {not any(p.startswith('rule') for p in problems)}")
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
EOF
echo "check.sh: all passed"
