#!/usr/bin/env python3
"""Writes the fuzz targets' starting corpora (fuzz/corpus/<target>/) from the committed goldens
(tests/fixtures/goldens*/): request bodies and rows upstream produced, heads and encodings of those
bodies, and the bad requests upstream refused. Generated, not committed: rerun it any time.

Each target's input layout (its first bytes pick options) is described in fuzz_targets/<target>.rs.
"""

import base64
import gzip
import hashlib
import json
import os
import struct
import sys
import zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def load(rel):
    with open(os.path.join(FIXTURES, rel), encoding="utf-8") as f:
        return json.load(f)


def write(target, data):
    directory = os.path.join(CORPUS, target)
    os.makedirs(directory, exist_ok=True)
    name = hashlib.sha1(data).hexdigest()
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number, wire_type, payload):
    return varint(number << 3 | wire_type) + payload


def length_delimited(number, data):
    return field(number, 2, varint(len(data)) + data)


def packed(number, values):
    return length_delimited(number, b"".join(varint(v) for v in values))


def forward_request(checkpoint, rows):
    """worker.proto's ForwardRequest { string checkpoint = 1; repeated Row rows = 2; }."""
    out = length_delimited(1, checkpoint.encode())
    for row in rows:
        encoded = packed(1, row["ids"]) + packed(2, row["markers"])
        if row["qtype"]:
            encoded += field(3, 0, varint(row["qtype"]))
        out += length_delimited(2, encoded)
    return out


def main():
    cases = load("goldens/cases.json")["cases"] + load("goldens-0.4.15/cases.json")["cases"]
    bad = load("goldens/bad_requests.json")["requests"] + load("goldens-0.4.15/bad_requests.json")["requests"]
    bodies = [c["body"].encode() for c in cases]
    bodies += [base64.b64decode(r["body_base64"]) for r in bad if r["body_base64"]]
    counts = {}
    for index, body in enumerate(bodies):
        # request_json: selector bit 0 = 0.4.15, bit 1 = auto_task.
        write("request_json", bytes([index % 4]) + body)
        # body_decode: selector % 3 picks gzip/deflate/zstd; 0x80 round trip, 0x40 raw deflate.
        cap = struct.pack(">H", min(len(body) + 16, 0xFFFF))
        write("body_decode", bytes([0]) + cap + gzip.compress(body))
        write("body_decode", bytes([1]) + cap + zlib.compress(body))
        raw = zlib.compressobj(wbits=-15)
        write("body_decode", bytes([4]) + cap + raw.compress(body) + raw.flush())
        write("body_decode", bytes([0x80 | index % 2, *cap]) + body)
        # request_head: the heads a client sends with it.
        head = (
            f"POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        write("request_head", head + body[:64])
    for request in bad:
        headers = request["headers"]
        lines = [f"{request['method']} {request['path']} HTTP/1.1", "Host: localhost"]
        for name, value in (headers or {}).items():
            lines.append(f"{name}: {value}")
        if request["chunked"]:
            lines.append("Transfer-Encoding: chunked")
        write("request_head", ("\r\n".join(lines) + "\r\n\r\n").encode())
    for extra in (
        b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET /metrics HTTP/1.0\r\n\r\n",
        b"POST /v1/systemone HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"POST /v1/systemone HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
        b"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    ):
        write("request_head", extra)
    # zstd frames: the goldens have none and Python has no zstd in its standard library; one
    # hand-made frame (raw block, "{}") and an empty skippable frame start the decoder's paths.
    zstd_frame = bytes.fromhex("28b52ffd" "2002" "1100" "00") + b"{}"
    write("body_decode", bytes([2, 0, 64]) + zstd_frame)
    write("body_decode", bytes([2, 0, 64]) + bytes.fromhex("50 2a 4d 18 00 00 00 00") + zstd_frame)
    for index, case in enumerate(cases):
        if not case.get("rows"):
            continue
        checkpoint = case["checkpoint"] or "english"
        # worker_rows: byte 0 picks max rows (and the token budget), byte 1 the length buckets.
        write("worker_rows", bytes([0xFF, index % 3]) + forward_request(checkpoint, case["rows"]))
    for target in sorted(os.listdir(CORPUS)):
        counts[target] = len(os.listdir(os.path.join(CORPUS, target)))
    print(" ".join(f"{t}={n}" for t, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
