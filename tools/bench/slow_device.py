#!/usr/bin/env python3
"""The slow-device benchmark's helpers (tools/bench/slow-device.sh); standard library only.

  throttle  makes one process a device at a fraction of its speed: from --after seconds on, for
            --for seconds, it runs only --duty of every --period-ms (SIGCONT, then SIGSTOP for the
            rest of the period), then runs freely again. Waits first for --marker to appear in
            --marker-file (the load generator's line just before its first arrival) when given.
            Writes what it did (times relative to the marker, the duty it achieved) as JSON.
  windows   per window of a `layad-load run` result: requests, errors, P50, P99, how many each
            pool answered, and the verdicts of issue 40 over the slow windows.
  hog       per `layad-load run` result of the competing-process case: short P50, P99 and pools.
"""

import argparse
import json
import math
import os
import signal
import sys
import time


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def wait_for_marker(path, marker, writer=None, timeout_s=600.0):
    """Monotonic time at which `marker` appeared in the file at `path` (written by process `writer`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if writer is not None and not alive(writer):
            sys.exit(f"slow_device.py: process {writer} ended before '{marker}' appeared in {path}")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                if marker in f.read():
                    return time.monotonic()
        except FileNotFoundError:
            pass
        time.sleep(0.005)
    sys.exit(f"slow_device.py: '{marker}' never appeared in {path}")


def throttle(args):
    zero = time.monotonic()
    if args.marker_file:
        # The first arrival is due `lead` after the marker line.
        zero = wait_for_marker(args.marker_file, args.marker, args.writer) + args.lead
    period = args.period_ms / 1000.0
    run_for = period * args.duty
    start = zero + args.after
    end = start + getattr(args, "for")
    time.sleep(max(0.0, start - time.monotonic()))
    began = time.monotonic()
    stopped_s = 0.0
    periods = 0
    try:
        while time.monotonic() < end:
            cycle = time.monotonic()
            os.kill(args.pid, signal.SIGCONT)
            time.sleep(max(0.0, cycle + run_for - time.monotonic()))
            os.kill(args.pid, signal.SIGSTOP)
            stop = time.monotonic()
            time.sleep(max(0.0, cycle + period - time.monotonic()))
            stopped_s += time.monotonic() - stop
            periods += 1
    finally:
        os.kill(args.pid, signal.SIGCONT)
    ended = time.monotonic()
    report = {
        "pid": args.pid,
        "from_s": round(began - zero, 4),
        "to_s": round(ended - zero, 4),
        "period_ms": args.period_ms,
        "duty_asked": args.duty,
        "duty_achieved": round(1.0 - stopped_s / max(ended - began, 1e-9), 4),
        "periods": periods,
    }
    print(json.dumps(report))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)


def nearest_rank(sorted_values, q):
    """Nearest-rank percentile (as layad-load computes them)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def diag(record):
    return record.get("x_layad") or {}


def windows(args):
    result = load(args.result)
    records = result["records"]
    slow_from, slow_to = args.slow_from, args.slow_to
    if args.throttle:
        # The slow phase as the throttle actually ran it.
        t = load(args.throttle)
        slow_from, slow_to = t["from_s"], t["to_s"]
    width = args.window
    count = math.ceil(result["seconds"] / width)
    rows = []
    for k in range(count):
        lo, hi = k * width, (k + 1) * width
        inside = [r for r in records if lo <= r["at_ms"] / 1000.0 < hi]
        ok = sorted(r["latency_ms"] for r in inside if r["status"] == 200)
        pools = {}
        probes = 0
        for r in inside:
            d = diag(r)
            pools[d.get("pool", "?")] = pools.get(d.get("pool", "?"), 0) + 1
            reason = d.get("reason") or ""
            probes += reason.startswith("probe of") or "a copy probes" in reason
        # A window is slow when it lies wholly inside the slow phase, normal when before it.
        phase = "slow" if lo >= math.floor(slow_from) and hi <= math.ceil(slow_to) else (
            "before" if hi <= slow_from else "after")
        if phase == "after" and lo < slow_to:
            phase = "slow/after"
        rows.append({
            "window": f"{lo}-{hi} s", "phase": phase, "sent": len(inside),
            "errors": len(inside) - len(ok), "p50_ms": nearest_rank(ok, 0.5),
            "p99_ms": nearest_rank(ok, 0.99), "pools": pools, "probes": probes,
        })
    before = [r for r in rows if r["phase"] == "before"]
    slow = [r for r in rows if r["phase"] == "slow"]
    normal_p50 = median(r["p50_ms"] for r in before)
    normal_p99 = median(r["p99_ms"] for r in before)
    slow_p50 = median(r["p50_ms"] for r in slow)
    worst_p99 = max((r["p99_ms"] for r in slow if r["p99_ms"] is not None), default=None)
    # Back on pool a: the first request after the slow phase that pool a answered (a probe's copy
    # answers nobody; a build that sent probes themselves there says "probe of").
    back = [r for r in records if r["at_ms"] / 1000.0 >= slow_to and diag(r).get("pool") == args.pool
            and not (diag(r).get("reason") or "").startswith("probe of")]
    back_after = (back[0]["at_ms"] / 1000.0 - slow_to) if back else None
    errors = sum(r["errors"] for r in rows)
    verdict = {
        "normal_p50_ms": normal_p50, "slow_median_p50_ms": slow_p50,
        "p50_ratio": slow_p50 / normal_p50 if slow_p50 and normal_p50 else None,
        "normal_median_p99_ms": normal_p99, "slow_worst_p99_ms": worst_p99,
        "p99_ratio": worst_p99 / normal_p99 if worst_p99 and normal_p99 else None,
        "errors": errors, "back_on_a_after_s": back_after,
        "slow_phase_s": [slow_from, slow_to],
    }
    verdict["done"] = {
        "p50 <= 1.3x": verdict["p50_ratio"] is not None and verdict["p50_ratio"] <= 1.3,
        "p99 <= 2x": verdict["p99_ratio"] is not None and verdict["p99_ratio"] <= 2.0,
        "no errors": errors == 0,
        "back within 1 s": back_after is not None and back_after <= 1.0,
    }
    label = result.get("label", args.result)
    lines = [f"### {label}", "",
             f"| window | phase | sent | P50 ms | P99 ms | to {args.pool} / others | probes | errors |",
             "|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: "-" if v is None else f"{v:.0f}"
    for r in rows:
        a = r["pools"].get(args.pool, 0)
        lines.append(f"| {r['window']} | {r['phase']} | {r['sent']} | {fmt(r['p50_ms'])} | {fmt(r['p99_ms'])} | "
                     f"{a} / {r['sent'] - a} | {r['probes']} | {r['errors']} |")
    ratio = lambda v: "-" if v is None else f"{v:.2f}×"
    lines += ["",
              f"slow phase {slow_from:.2f}–{slow_to:.2f} s; slow/normal: median P50 {ratio(verdict['p50_ratio'])} "
              f"({fmt(slow_p50)} / {fmt(normal_p50)} ms), worst P99 over normal median P99 "
              f"{ratio(verdict['p99_ratio'])} ({fmt(worst_p99)} / {fmt(normal_p99)} ms); errors {errors}; "
              f"back on '{args.pool}' {'-' if back_after is None else f'{back_after:.2f} s'} after the slow phase", ""]
    text = "\n".join(lines)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"label": label, "windows": rows, "verdict": verdict}, f, indent=2)


def hog(args):
    lines = ["| case | sent | P50 ms | P99 ms | max ms | pools | errors |", "|---|---|---|---|---|---|---|"]
    for path in args.results:
        result = load(path)
        ok = sorted(r["latency_ms"] for r in result["records"] if r["status"] == 200)
        pools = {}
        for r in result["records"]:
            pool = diag(r).get("pool", "?")
            pools[pool] = pools.get(pool, 0) + 1
        fmt = lambda v: "-" if v is None else f"{v:.0f}"
        lines.append(f"| {result.get('label')} | {len(result['records'])} | {fmt(nearest_rank(ok, 0.5))} | "
                     f"{fmt(nearest_rank(ok, 0.99))} | {fmt(nearest_rank(ok, 1.0))} | "
                     f"{' '.join(f'{k}:{v}' for k, v in sorted(pools.items()))} | {len(result['records']) - len(ok)} |")
    print("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("throttle")
    t.add_argument("--pid", type=int, required=True)
    t.add_argument("--after", type=float, required=True, help="seconds after the marker (or now)")
    t.add_argument("--for", type=float, required=True, help="seconds of throttling")
    t.add_argument("--duty", type=float, default=0.25)
    t.add_argument("--period-ms", type=float, default=20.0)
    t.add_argument("--marker-file")
    t.add_argument("--marker", default="arrivals over")
    t.add_argument("--writer", type=int, help="the marker file's writer: give up when it ends")
    t.add_argument("--lead", type=float, default=0.2, help="seconds from the marker to the first arrival")
    t.add_argument("--out")
    w = sub.add_parser("windows")
    w.add_argument("result")
    w.add_argument("--window", type=float, default=3.0)
    w.add_argument("--slow-from", type=float, default=12.0)
    w.add_argument("--slow-to", type=float, default=24.0)
    w.add_argument("--throttle", help="the throttle's JSON: the slow phase as it ran")
    w.add_argument("--pool", default="a")
    w.add_argument("--json")
    h = sub.add_parser("hog")
    h.add_argument("results", nargs="+")
    args = parser.parse_args()
    {"throttle": throttle, "windows": windows, "hog": hog}[args.command](args)


if __name__ == "__main__":
    main()
