#!/usr/bin/env python3
"""Each busy phase of one worker from layad's debug log: how many forwards, of how many rows each,
their median device time and the rows answered per second.

    python3 tools/bench/forward_phases.py LOG [--gap SECONDS] [--min-forwards N]

LOG is what `layad-http-bench --layad-log LOG` copies, run with `RUST_LOG=info,layad_proto=debug`
(the worker's `forward answered` lines, which the supervisor re-tags) and
`LAYAD_LOGGING__FILTER=debug,h2=info,hyper=info,tower=info` (so the supervisor keeps them). A phase
ends where no forward was answered for --gap seconds (1: the bench's pauses between shapes and
servers; 0.2 also splits the latency pairs, each after a 300 ms idle gap, from a throughput phase
that follows them).
"""
import argparse
import re
import statistics
from collections import Counter

ANSWERED = re.compile(r'^(\S+)Z .*forward answered.*device_us\\":\\"(\d+)\\".*rows\\":(\d+)')


def seconds(stamp):
    _, clock = stamp.split("T")
    hours, minutes, secs = clock.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(secs)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log")
    parser.add_argument("--gap", type=float, default=1.0, help="idle seconds that end a phase")
    parser.add_argument("--min-forwards", type=int, default=20, help="shorter phases are left out")
    args = parser.parse_args()
    forwards = []
    with open(args.log, errors="replace") as log:
        for line in log:
            match = ANSWERED.match(re.sub(r"\x1b\[[0-9;]*m", "", line))
            if match:
                forwards.append((seconds(match[1]), int(match[2]) / 1000, int(match[3])))
    if not forwards:
        raise SystemExit(f"{args.log}: no 'forward answered' lines (see --help for the log filters)")
    phases = [[forwards[0]]]
    for previous, forward in zip(forwards, forwards[1:]):
        if forward[0] - previous[0] > args.gap:
            phases.append([])
        phases[-1].append(forward)
    print("| forwards | rows per forward (count) | device p50 ms | rows/s | busy |")
    print("|---:|---|---:|---:|---:|")
    for phase in phases:
        if len(phase) < args.min_forwards:
            continue
        span = phase[-1][0] - phase[0][0]
        # The first forward's answer opens the span: count what came after it.
        rows_after = sum(rows for _, _, rows in phase[1:])
        busy = sum(device for _, device, _ in phase[1:]) / 1000
        sizes = ", ".join(f"{rows}: {n}" for rows, n in sorted(Counter(r for _, _, r in phase).items()))
        print(
            f"| {len(phase)} | {sizes} | {statistics.median(d for _, d, _ in phase):.1f} | "
            f"{rows_after / span:.2f} | {busy / span:.0%} |"
        )


if __name__ == "__main__":
    main()
