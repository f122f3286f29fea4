"""The floor of issue 40's slow-device lines for an ideal scheduler: a queueing model of the benchmark.

Two devices with a fixed service time S per request (a short single question), Poisson arrivals
at RATE a second; each request goes where it would finish first, knowing every device's backlog
exactly (no detection delay, no probes). Normal: both devices at speed. Slow: one at SLOWDOWN times
S (tools/bench/slow-device.sh runs pool a at 25% of its speed: 4×). Prints P50 and P99 of each and
their ratios, the quantities of issue 40's "median P50 ≤ 1.3×" and "worst P99 ≤ 2×" lines (here
over the whole run rather than per 3-s window: the floor, not a window's luck).

    python3 tools/bench/slow_device_floor.py [RATE] [SLOWDOWN] [S_MS ...]

Defaults: 20 requests a second, 4×, S = 17, 20, 23, 35 ms (this VM's 64-token row of layad-bench's
modernbert-mini is 17–23 ms on one thread; the issue's checkpoint took ~35 ms).
"""
import random
import sys


def latencies(service, rate, speeds, requests=200_000, seed=1):
    """Sorted latencies (s) of `requests` Poisson arrivals placed where they finish first."""
    rng = random.Random(seed)
    now, free, out = 0.0, [0.0] * len(speeds), []
    for _ in range(requests):
        now += rng.expovariate(rate)
        finish = [max(now, f) + service * s for f, s in zip(free, speeds)]
        device = min(range(len(speeds)), key=finish.__getitem__)
        free[device] = finish[device]
        out.append(finish[device] - now)
    return sorted(out)


def percentile_ms(sorted_latencies, q):
    """The `q` quantile of sorted latencies in seconds, in ms."""
    return sorted_latencies[int(len(sorted_latencies) * q)] * 1000


def main():
    rate = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    slowdown = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
    services = [float(v) / 1000 for v in sys.argv[3:]] or [0.017, 0.020, 0.023, 0.035]
    print(f"{rate:g} requests/s, one device slowed {slowdown:g}×, placement by expected finish")
    print("| request | normal P50 / P99 ms | slow P50 / P99 ms | P50 slow/normal | P99 slow/normal |")
    print("|---|---|---|---|---|")
    for service in services:
        normal = latencies(service, rate, [1.0, 1.0])
        slow = latencies(service, rate, [1.0, slowdown])
        p = percentile_ms
        print(
            f"| {service * 1000:g} ms | {p(normal, 0.5):.0f} / {p(normal, 0.99):.0f} | "
            f"{p(slow, 0.5):.0f} / {p(slow, 0.99):.0f} | {p(slow, 0.5) / p(normal, 0.5):.2f}× | "
            f"{p(slow, 0.99) / p(normal, 0.99):.2f}× |"
        )


if __name__ == "__main__":
    main()
