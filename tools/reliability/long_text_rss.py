#!/usr/bin/env python3
"""Memory of the supervisor under requests with one huge text field, measured: samples the layad
process's RSS (/proc/<pid>/status) before, during and for a while after N concurrent requests whose
question `instructions` is a text of the given size, and prints baseline, peak and settled RSS and
the answers' statuses as JSON. Also checks that the answers to the long requests are all the same.

Bounded on purpose: loopback addresses only, at most 64 requests of at most 2 MiB, at most 5 minutes
of settling.

    tools/reliability/long_text_rss.py --addr 127.0.0.1:8642 --pid "$(pgrep -o -x layad)" \
        --requests 8 --text-bytes 1500000 --settle 30
"""

import argparse
import asyncio
import ipaddress
import json
import time


def loopback(addr):
    host, _, port = addr.rpartition(":")
    if not ipaddress.ip_address(host.strip("[]")).is_loopback:
        raise SystemExit(f"{addr}: only loopback addresses are used")
    return host.strip("[]"), int(port)


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise SystemExit(f"no VmRSS for pid {pid}")


def body(text_bytes):
    # Words and spaces, like a pasted document; the same text for every request.
    words = "the customer asked again about the refund for invoice 4411 and was told to wait "
    text = (words * (text_bytes // len(words) + 1))[:text_bytes]
    return json.dumps(
        {
            "state": "I was charged twice for invoice 4411, please refund it today.",
            "questions": {"refund": {"type": "noul", "instructions": text}},
        }
    ).encode()


async def post(host, port, payload, headers):
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
    writer.write(
        b"POST /v1/systemone HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\nConnection: close\r\n{extra}\r\n".encode()
        + payload
    )
    await writer.drain()
    response = await reader.read()
    writer.close()
    head, _, answer = response.partition(b"\r\n\r\n")
    return int(head[9:12]), time.monotonic() - started, answer


async def sample(pid, samples, stop):
    while not stop.is_set():
        samples.append(rss_mb(pid))
        await asyncio.sleep(0.02)


async def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--addr", required=True, help="layad's address (loopback only)")
    parser.add_argument("--pid", type=int, required=True, help="the supervisor's pid")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--text-bytes", type=int, default=1_500_000)
    parser.add_argument("--settle", type=float, default=30.0, help="seconds to watch RSS afterwards")
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args()
    host, port = loopback(args.addr)
    requests = min(args.requests, 64)
    payload = body(min(args.text_bytes, 2 * 1024 * 1024 - 1024))
    settle = min(args.settle, 300.0)
    headers = [("Authorization", f"Bearer {args.api_key}")] if args.api_key else []

    baseline = rss_mb(args.pid)
    samples, stop = [], asyncio.Event()
    sampler = asyncio.create_task(sample(args.pid, samples, stop))
    started = time.monotonic()
    answers = await asyncio.gather(*(post(host, port, payload, headers) for _ in range(requests)))
    wall = time.monotonic() - started
    await asyncio.sleep(settle)
    stop.set()
    await sampler
    settled = rss_mb(args.pid)
    statuses = {}
    for status, _, _ in answers:
        statuses[status] = statuses.get(status, 0) + 1
    # The x_layad block holds timings; compare the rest.
    bodies = set()
    for _, _, answer in answers:
        try:
            parsed = json.loads(answer)
            parsed.pop("x_layad", None)
            bodies.add(json.dumps(parsed, sort_keys=True))
        except ValueError:
            bodies.add(answer.decode(errors="replace")[:200])
    print(
        json.dumps(
            {
                "requests": requests,
                "body_bytes": len(payload),
                "statuses": statuses,
                "distinct_answers": len(bodies),
                "answer": next(iter(bodies))[:300] if bodies else None,
                "wall_s": round(wall, 2),
                "slowest_s": round(max(t for _, t, _ in answers), 2),
                "rss_baseline_mb": round(baseline, 1),
                "rss_peak_mb": round(max(samples + [baseline]), 1),
                "rss_settled_mb": round(settled, 1),
                "settle_s": settle,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
