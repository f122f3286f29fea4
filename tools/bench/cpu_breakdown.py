"""CPU ms per timed forward by function, from a tools/bench/cpu-per-forward.sh run's perf samples.

    python3 tools/bench/cpu_breakdown.py <OUT dir> <name> [top N] [rate] [pool threads]

Closures and generic SIMD entry points keep their generic names (`call_mut`, `V4::vectorize`): a
release build has no frame pointers, so what calls them is not recorded.
"""
import collections
import json
import re
import subprocess
import sys

out_dir, name = sys.argv[1], sys.argv[2]
top = int(sys.argv[3]) if len(sys.argv) > 3 else 12
rate = int(sys.argv[4]) if len(sys.argv) > 4 else 999
threads = int(sys.argv[5]) if len(sys.argv) > 5 else 2
cell = json.load(open(f"{out_dir}/{name}.json"))["cells"][0]
script = subprocess.run(
    ["perf", "script", "-i", f"{out_dir}/{name}.perf.data", "-F", "tid,time,ip,sym"],
    capture_output=True, text=True, check=True,
).stdout
rows = []
for line in script.splitlines():
    m = re.match(r"\s*(\d+)\s+([\d.]+):\s+[0-9a-f]+\s+(.*)", line)
    if m:
        rows.append((m.group(1), float(m.group(2)), m.group(3).strip()))
# The timed forwards end at the pool threads' last sample (cpu-per-forward.sh says why): the
# `threads` busiest threads of the recording's last seconds.
timed = sum(cell["times_ms"]) / 1000
tail = [r for r in rows if r[1] >= rows[-1][1] - timed - 1]
pool = {tid for tid, _ in collections.Counter(r[0] for r in tail).most_common(threads)}
end = max(t for tid, t, _ in rows if tid in pool)
start = end - timed
window = [s for _, t, s in rows if start <= t <= end]
runs = len(cell["times_ms"])
counts = collections.Counter(re.sub(r"::\{\{closure\}\}|<.*?>", "", s)[:80] for s in window)
print(f"{name}: {cell['engine']}: {len(window) / rate * 1000 / runs:.1f} CPU ms per forward")
for symbol, k in counts.most_common(top):
    print(f"  {k / rate * 1000 / runs:7.1f} ms  {100 * k / len(window):5.1f}%  {symbol}")
