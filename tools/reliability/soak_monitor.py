#!/usr/bin/env python3
"""The soak's two halves beside `layad-load run` (tools/reliability/soak.sh drives them).

`monitor`: for --seconds, samples the supervisor's RSS and its workers' total RSS
(/proc/<pid>/status VmRSS) every --sample-every seconds into a CSV, and every --kill-every seconds
SIGKILLs one worker: the worker slots of /health taken in turn (general/0, general/1, ...), the
slot's pid killed only when it is a direct child of the supervisor running layad-worker-gpu. Each
kill is logged (time, slot, pid) to stderr and a CSV.

`report`: reads layad-load's result, the samples, the kills, /metrics before and after and the
server log, prints a summary and writes it as JSON: requests, failures (any status but 200, any
transport error or timeout, any answer shaped unlike its reference), kills, restarts, RSS at start,
after the warm-up and at the end, and the least-squares slope of the supervisor's RSS after the
warm-up. Exits 1 when a request failed or the slope reaches --slope-limit.

MB here is 2^20 bytes (VmRSS kB / 1024), as in long_text_rss.py.

    soak_monitor.py monitor --addr 127.0.0.1:PORT --pid PID --seconds 600 --kill-every 30 \\
        --samples rss.csv --kills kills.csv
    soak_monitor.py report --load run.json --samples rss.csv --kills kills.csv ... --out soak.json
"""

import argparse
import csv
import ipaddress
import json
import os
import signal
import sys
import time
import urllib.request

WORKER_BINARY = "layad-worker-gpu"


def loopback(addr):
    host, _, port = addr.rpartition(":")
    if not ipaddress.ip_address(host.strip("[]")).is_loopback:
        raise SystemExit(f"{addr}: only loopback addresses are used")
    return addr


def rss_kb(pid):
    """VmRSS of `pid` in kB, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The command name (field 2) may hold spaces and parentheses: fields after the last ')'.
            return int(stat.read().rpartition(")")[2].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def program_of(pid):
    """Base name of the executable (/proc/<pid>/exe), else of argv[0]."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return os.path.basename(cmdline.read().split(b"\0")[0].decode(errors="replace"))
    except OSError:
        return None


def worker_children(supervisor):
    """Pids of the supervisor's direct children running the worker binary."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and parent_of(int(entry)) == supervisor and program_of(int(entry)) == WORKER_BINARY:
            pids.append(int(entry))
    return sorted(pids)


def get(addr, path, timeout=5.0):
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=timeout) as response:
        return response.read().decode()


def worker_slots(addr):
    """[(slot id, pid or None, state)] from /health, in the server's order; [] when unreachable."""
    try:
        health = json.loads(get(addr, "/health"))
    except (OSError, ValueError):
        return []
    slots = []
    for pool in health.get("pools", []):
        for worker in pool.get("workers", []):
            slots.append((worker.get("id"), worker.get("pid"), worker.get("state")))
    return slots


def kill_one(addr, supervisor, turn):
    """SIGKILLs the worker of slot `turn` (mod the slot count), or the next ready one when that
    slot's worker is not ready or not the supervisor's own worker child. Returns (slot, pid, note)."""
    slots = worker_slots(addr)
    children = set(worker_children(supervisor))
    for offset in range(len(slots)):
        slot, pid, state = slots[(turn + offset) % len(slots)]
        if state == "ready" and pid in children:
            os.kill(pid, signal.SIGKILL)
            note = "" if offset == 0 else f"slot {slots[turn % len(slots)][0]} not ready"
            return slot, pid, note
    if not slots and children:
        # /health did not answer: the children themselves, in turn.
        ordered = sorted(children)
        pid = ordered[turn % len(ordered)]
        os.kill(pid, signal.SIGKILL)
        return "?", pid, "/health unreachable; killed a worker child"
    return None, None, f"no ready worker to kill (health: {slots}, children: {sorted(children)})"


def monitor(args):
    addr = loopback(args.addr)
    start = time.monotonic()
    samples = [i * args.sample_every for i in range(int(args.seconds / args.sample_every) + 1)]
    kills = [i * args.kill_every for i in range(1, int(args.seconds / args.kill_every) + 1) if i * args.kill_every < args.seconds] if args.kill_every > 0 else []
    events = sorted([(t, "kill") for t in kills] + [(t, "sample") for t in samples])
    turn = 0
    with open(args.samples, "w", newline="") as sample_file, open(args.kills, "w", newline="") as kill_file:
        sample_csv, kill_csv = csv.writer(sample_file), csv.writer(kill_file)
        sample_csv.writerow(["unix_s", "t_s", "supervisor_rss_kb", "workers_rss_kb", "workers", "worker_pids"])
        kill_csv.writerow(["unix_s", "utc", "t_s", "slot", "pid", "note"])
        for at, what in events:
            delay = start + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            t = time.monotonic() - start
            if what == "sample":
                supervisor = rss_kb(args.pid)
                if supervisor is None:
                    print(f"soak: t={t:.1f} s: the supervisor (pid {args.pid}) is gone", file=sys.stderr)
                    return 1
                workers = worker_children(args.pid)
                worker_rss = [r for r in (rss_kb(p) for p in workers) if r is not None]
                sample_csv.writerow(
                    [f"{time.time():.3f}", f"{t:.3f}", supervisor, sum(worker_rss), len(worker_rss), " ".join(map(str, workers))]
                )
                sample_file.flush()
            else:
                slot, pid, note = kill_one(addr, args.pid, turn)
                turn += 1
                utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                kill_csv.writerow([f"{time.time():.3f}", utc, f"{t:.3f}", slot or "", pid or "", note])
                kill_file.flush()
                if pid:
                    print(f"soak: {utc} t={t:.1f} s: SIGKILL worker {slot} (pid {pid}){'; ' + note if note else ''}", file=sys.stderr)
                else:
                    print(f"soak: {utc} t={t:.1f} s: no kill: {note}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------
# Report.


def restarts_in_metrics(text):
    """Sum of layad_worker_restarts_total over every worker, or None without the metric."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("layad_worker_restarts_total"):
            try:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
            except (IndexError, ValueError):
                pass
    return total if seen else None


def least_squares_slope(points):
    """Slope of y over x by least squares, or None with fewer than two distinct x."""
    n = len(points)
    if n < 2:
        return None
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def report(args):
    with open(args.load) as f:
        load = json.load(f)
    capacity = None
    if args.capacity:
        with open(args.capacity) as f:
            capacity = json.load(f)
    with open(args.samples, newline="") as f:
        samples = [
            {"t_s": float(r["t_s"]), "supervisor_mb": int(r["supervisor_rss_kb"]) / 1024, "workers_mb": int(r["workers_rss_kb"]) / 1024, "workers": int(r["workers"])}
            for r in csv.DictReader(f)
        ]
    with open(args.kills, newline="") as f:
        kills = list(csv.DictReader(f))
    done = [k for k in kills if k["pid"]]

    records = load.get("records", [])
    failed = [r for r in records if r.get("status") != 200 or r.get("shape_mismatch") or "error" in r]
    overall = load.get("overall", {})
    before = restarts_in_metrics(read_text(args.metrics_before)) if args.metrics_before else None
    after = restarts_in_metrics(read_text(args.metrics_after)) if args.metrics_after else None
    restarts_metrics = after - before if before is not None and after is not None else after
    restarts_logged = read_text(args.log).count("worker stopped; restarting it") if args.log else None
    health_after = None
    if args.health_after:
        try:
            health_after = json.loads(read_text(args.health_after)).get("status")
        except ValueError:
            health_after = "unreadable"

    after_warmup = [s for s in samples if s["t_s"] >= args.warmup]
    slope = least_squares_slope([(s["t_s"] / 60.0, s["supervisor_mb"]) for s in after_warmup])
    r1 = lambda x: None if x is None else round(x, 1)  # noqa: E731
    summary = {
        "tool": "tools/reliability/soak.sh",
        "command": args.command,
        "cpu_model": args.cpu_model,
        "started_utc": args.started_utc,
        "cpu_lock": args.cpu_lock,
        "config": args.config_text,
        "binaries": args.binaries,
        "soak_seconds": load.get("seconds"),
        "wall_s": r1(load.get("wall_s")),
        "arrivals": load.get("arrivals"),
        "capacity_rps": None if capacity is None else round(capacity["capacity_rps"], 3),
        "capacity_errors": None if capacity is None else capacity.get("errors"),
        "offered_rps": load.get("rate"),
        "load_average": load.get("load_average"),
        "requests": load.get("sent", len(records)),
        "failed": len(failed),
        "failed_by_status": overall.get("errors_by_status"),
        "failed_examples": failed[: args.examples],
        "latency_ms": {k: r1(overall.get(k)) for k in ("p50_ms", "p99_ms", "max_ms")},
        "max_answer_drift": load.get("drift", {}).get("max_abs"),
        "kill_every_s": args.kill_every,
        "kills": len(done),
        "kills_skipped": len(kills) - len(done),
        "kill_log": [{"utc": k["utc"], "t_s": float(k["t_s"]), "slot": k["slot"], "pid": int(k["pid"])} for k in done],
        "restarts_metrics": None if restarts_metrics is None else int(restarts_metrics),
        "restarts_logged": restarts_logged,
        "health_after": health_after,
        "warmup_s": args.warmup,
        "rss_samples": len(samples),
        "sample_every_s": args.sample_every,
        "supervisor_rss_mb": {
            "start": r1(samples[0]["supervisor_mb"]) if samples else None,
            "after_warmup": r1(after_warmup[0]["supervisor_mb"]) if after_warmup else None,
            "end": r1(samples[-1]["supervisor_mb"]) if samples else None,
            "max": r1(max(s["supervisor_mb"] for s in samples)) if samples else None,
        },
        "supervisor_rss_slope_mb_per_min": None if slope is None else round(slope, 3),
        "slope_limit_mb_per_min": args.slope_limit,
        "workers_rss_mb": {
            "start": r1(samples[0]["workers_mb"]) if samples else None,
            "end": r1(samples[-1]["workers_mb"]) if samples else None,
            "max": r1(max(s["workers_mb"] for s in samples)) if samples else None,
        },
    }
    problems = []
    if failed:
        problems.append(f"{len(failed)} of {summary['requests']} requests failed")
    if slope is None:
        problems.append(f"fewer than two RSS samples after the {args.warmup:g} s warm-up: no slope")
    elif slope >= args.slope_limit:
        problems.append(f"supervisor RSS grows {slope:.3f} MB/min after the warm-up (limit {args.slope_limit:g})")
    if args.kill_every > 0 and not done:
        problems.append("no worker was killed")
    if restarts_metrics is not None and restarts_metrics < len(done):
        problems.append(f"/metrics counts {int(restarts_metrics)} restarts for {len(done)} kills")
    if health_after is not None and health_after != "ok":
        problems.append(f"/health after the soak says {health_after!r}, not 'ok'")
    summary["passed"] = not problems
    summary["problems"] = problems
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")

    rss, workers = summary["supervisor_rss_mb"], summary["workers_rss_mb"]
    lines = [
        f"soak: {summary['soak_seconds']} s of {summary['arrivals']} arrivals at {summary['offered_rps']} req/s"
        f" ({args.fraction:g} of capacity {summary['capacity_rps']} req/s)",
        f"requests {summary['requests']}, failed {summary['failed']} {summary['failed_by_status'] or ''}".rstrip(),
        f"latency p50 {summary['latency_ms']['p50_ms']} ms, p99 {summary['latency_ms']['p99_ms']} ms, max {summary['latency_ms']['max_ms']} ms;"
        f" max answer drift {summary['max_answer_drift']}",
        f"kills {summary['kills']} (every {args.kill_every:g} s, {summary['kills_skipped']} skipped);"
        f" restarts {summary['restarts_metrics']} (/metrics), {summary['restarts_logged']} (log); /health after: {health_after}",
        f"supervisor RSS MB: start {rss['start']}, after {args.warmup:g} s warm-up {rss['after_warmup']}, end {rss['end']},"
        f" max {rss['max']}; slope after warm-up {summary['supervisor_rss_slope_mb_per_min']} MB/min (limit {args.slope_limit:g})",
        f"workers' RSS MB (total): start {workers['start']}, end {workers['end']}, max {workers['max']}",
    ]
    for r in summary["failed_examples"]:
        lines.append(f"  failed: {json.dumps(r)}")
    lines.append("PASSED" if not problems else "FAILED: " + "; ".join(problems))
    print("\n".join(lines))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if not problems else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command_name", required=True)
    m = commands.add_parser("monitor", help="sample RSS and kill workers while the load runs")
    m.add_argument("--addr", required=True, help="layad's address (loopback only)")
    m.add_argument("--pid", type=int, required=True, help="the supervisor's pid")
    m.add_argument("--seconds", type=float, required=True)
    m.add_argument("--kill-every", type=float, default=30.0, help="0: never kill")
    m.add_argument("--sample-every", type=float, default=5.0)
    m.add_argument("--samples", required=True, help="CSV of RSS samples")
    m.add_argument("--kills", required=True, help="CSV of kills")
    r = commands.add_parser("report", help="summarise a soak run")
    r.add_argument("--load", required=True, help="layad-load run's result JSON")
    r.add_argument("--capacity", help="layad-load capacity's result JSON")
    r.add_argument("--fraction", type=float, default=0.7, help="the offered load's share of capacity")
    r.add_argument("--samples", required=True)
    r.add_argument("--kills", required=True)
    r.add_argument("--kill-every", type=float, default=30.0)
    r.add_argument("--sample-every", type=float, default=5.0)
    r.add_argument("--metrics-before", help="/metrics before the soak")
    r.add_argument("--metrics-after", help="/metrics after the soak")
    r.add_argument("--log", help="the server's log")
    r.add_argument("--health-after", help="/health once the load is over (all workers back: 'ok')")
    r.add_argument("--warmup", type=float, default=120.0, help="seconds left out of the RSS slope")
    r.add_argument("--slope-limit", type=float, default=1.0, help="MB/min")
    r.add_argument("--examples", type=int, default=10, help="failed requests shown")
    r.add_argument("--command", default="", help="the soak's command, recorded")
    r.add_argument("--cpu-model", default="")
    r.add_argument("--started-utc", default="")
    r.add_argument("--cpu-lock", default="", help="which CPU lock the run held, recorded")
    r.add_argument("--config-text", default="", help="the server's configuration, recorded")
    r.add_argument("--binaries", default="", help="which binaries ran, recorded")
    r.add_argument("--out", required=True)
    args = parser.parse_args()
    sys.exit(monitor(args) if args.command_name == "monitor" else report(args))


if __name__ == "__main__":
    main()
