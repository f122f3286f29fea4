#!/usr/bin/env python3
"""Slow clients against a running layad, measured: N connections trickle a request head one byte at
a time (reopened when the server closes them) while one client, in a process of its own, sends
normal requests one after another and times each. Prints the probes' latency percentiles as JSON.

Bounded on purpose: loopback addresses only, at most 5,000 slow connections, at most 10 minutes.

    tools/reliability/slowloris_probe.py --addr 127.0.0.1:8642 --connections 1500 --duration 60
"""

import argparse
import asyncio
import ipaddress
import json
import multiprocessing
import resource
import socket
import time

MAX_CONNECTIONS = 5000
MAX_DURATION = 600.0

# A small, valid decision request: what a normal client sends.
PROBE_BODY = json.dumps(
    {
        "state": "I was charged twice for invoice 4411, please refund it today.",
        "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"}},
    }
).encode()

# What the slow clients send, one byte per tick; never finished.
SLOW_HEAD = b"POST /v1/systemone HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nX-Slow: " + b"a" * 4000


def loopback(addr):
    host, _, port = addr.rpartition(":")
    if not ipaddress.ip_address(host.strip("[]")).is_loopback:
        raise SystemExit(f"{addr}: only loopback addresses are probed")
    return host.strip("[]"), int(port)


class Counters:
    def __init__(self):
        self.open = 0
        self.opened = 0
        self.closed_by_server = 0
        self.connect_failures = 0


async def slow_client(host, port, source, tick, stop, counters):
    while not stop.is_set():
        try:
            local = (source, 0) if source else None
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, local_addr=local), 5)
        except (OSError, asyncio.TimeoutError):
            counters.connect_failures += 1
            await asyncio.sleep(tick)
            continue
        counters.open += 1
        counters.opened += 1
        try:
            for byte in SLOW_HEAD:
                if stop.is_set():
                    break
                writer.write(bytes([byte]))
                await writer.drain()
                # The server closing the connection shows up as end of file here.
                try:
                    data = await asyncio.wait_for(reader.read(1024), tick)
                    if not data:
                        counters.closed_by_server += 1
                        break
                except asyncio.TimeoutError:
                    pass
        except OSError:
            counters.closed_by_server += 1
        finally:
            counters.open -= 1
            writer.close()


def probe(host, port):
    """One normal request on a new connection; (status, seconds)."""
    started = time.monotonic()
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.settimeout(30)
        sock.sendall(
            b"POST /v1/systemone HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(PROBE_BODY)}\r\nConnection: close\r\n\r\n".encode()
            + PROBE_BODY
        )
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    status = int(response[9:12]) if len(response) >= 12 else 0
    return status, time.monotonic() - started


def probe_loop(host, port, duration, every, results):
    """The normal client: its own process, as a real client is, so the slow clients' event loop
    cannot delay its writes. Sends the probes one after another and reports them through `results`."""
    latencies, statuses, failures = [], {}, 0
    end = time.monotonic() + duration
    while time.monotonic() < end:
        try:
            status, took = probe(host, port)
            statuses[status] = statuses.get(status, 0) + 1
            latencies.append(took)
            if status != 200:
                failures += 1
        except OSError:
            failures += 1
            latencies.append(30.0)
        time.sleep(every)
    results.send({"latencies": latencies, "statuses": statuses, "failures": failures})
    results.close()


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--addr", required=True, help="layad's address, e.g. 127.0.0.1:8642 (loopback only)")
    parser.add_argument("--connections", type=int, default=1500)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of probing")
    parser.add_argument("--tick", type=float, default=1.0, help="seconds between a slow client's bytes")
    parser.add_argument("--probe-every", type=float, default=0.2, help="pause between probes, seconds")
    parser.add_argument("--slow-source", default=None, help="loopback address the slow clients connect from (e.g. 127.0.0.2; default: the same as the probes)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds the slow clients connect before probing")
    args = parser.parse_args()
    host, port = loopback(args.addr)
    if args.slow_source and not ipaddress.ip_address(args.slow_source).is_loopback:
        raise SystemExit("--slow-source must be a loopback address")
    connections = min(args.connections, MAX_CONNECTIONS)
    duration = min(args.duration, MAX_DURATION)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + 256
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))

    stop = asyncio.Event()
    counters = Counters()
    slow = []
    for _ in range(connections):
        slow.append(asyncio.create_task(slow_client(host, port, args.slow_source, args.tick, stop, counters)))
        await asyncio.sleep(0.002)
    await asyncio.sleep(args.warmup)

    # The probes run in a separate process; this loop keeps the slow clients going meanwhile.
    receiving, sending = multiprocessing.Pipe(duplex=False)
    prober = multiprocessing.get_context("spawn").Process(
        target=probe_loop, args=(host, port, duration, args.probe_every, sending)
    )
    prober.start()
    open_during = []
    while prober.is_alive() and not receiving.poll():
        open_during.append(counters.open)
        await asyncio.sleep(0.5)
    result = receiving.recv() if receiving.poll(60) else {"latencies": [], "statuses": {}, "failures": 1}
    prober.join(10)
    latencies, statuses, failures = result["latencies"], result["statuses"], result["failures"]
    if not latencies:
        raise SystemExit("the probe process returned no measurement")
    stop.set()
    await asyncio.gather(*slow, return_exceptions=True)
    print(
        json.dumps(
            {
                "slow_connections": connections,
                "slow_open_mean": round(sum(open_during) / max(1, len(open_during))),
                "slow_opened": counters.opened,
                "slow_closed_by_server": counters.closed_by_server,
                "slow_connect_failures": counters.connect_failures,
                "probes": len(latencies),
                "probe_failures": failures,
                "statuses": statuses,
                "p50_ms": round(percentile(latencies, 50) * 1000, 1),
                "p99_ms": round(percentile(latencies, 99) * 1000, 1),
                "max_ms": round(max(latencies) * 1000, 1),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
