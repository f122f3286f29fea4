#!/usr/bin/env python3
"""One `POST /v1/systemone/batch` of 64 states on a pool of one CPU worker vs two (issue 25).

Each state of a batch is its own scheduler job, so a pool of two workers should answer a batch in
about half the time of one. This measures it: two layad servers up at once on the same checkpoint
(pool `general`: `workers = 1` on one port, `workers = 2` on the other, `threads = 1` each), the
same 64-state body (English states of 5 to 120 words, three shared questions: choice, score,
noul) sent to them in alternating order A B B A ..., ROUNDS times each, one request in flight at a
time. Every answer is compared with the first one byte for byte after dropping `x_layad` (which
names the worker); the ratio is the median of one worker's times over two workers'.

The checkpoint: layad-bench's random `modernbert-mini` (8 layers x 384, as tools/bench/scheduling.sh
uses, whose 64-token row takes tens of milliseconds on one core) behind a fake Hugging Face cache,
or `--checkpoint DIR`. Run it on a quiet machine under the benchmark lock:

    cargo build --release -p layad -p layad-worker-gpu -p layad-engine-bench --bins
    flock -x /work/cpu.lock python3 tools/bench/batch_workers.py --bin target/release

Prints a table and writes `<out>/batch_workers.json`. Needs only the Python standard library.
"""

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REVISION = "00000000000000000000000000000000005c4ed0"
WORDS = (
    "the order invoice refund payment card charged twice account login password reset shipment "
    "arrived late damaged package support ticket please today urgent customer service delivery "
    "address changed subscription cancel upgrade plan error page app crashes when I open settings"
).split()
QUESTIONS = {
    "a": {
        "type": "choice",
        "instructions": "Which queue should handle this?",
        "criteria": {"billing": "payment problems", "tech": "technical issue", "other": "anything else"},
    },
    "b": {
        "type": "score",
        "instructions": "How urgent is this?",
        "criteria": ["not urgent", "somewhat urgent", "urgent", "critical"],
    },
    "c": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
}


def batch_body(seed: int, states: int) -> bytes:
    r = random.Random(seed)
    texts = []
    for _ in range(states):
        words = [r.choice(WORDS) for _ in range(r.randint(5, 120))]
        texts.append(" ".join(words).capitalize() + ".")
    return json.dumps({"states": texts, "questions": QUESTIONS, "model": "en"}).encode()


def fake_hf_home(checkpoint: Path, home: Path) -> None:
    """A Hugging Face cache whose `english` bundle is `checkpoint` (as scheduling.sh makes)."""
    repo = home / "hub" / "models--convaiinnovations--laya"
    snapshot = repo / "snapshots" / REVISION
    for sub in ("encoder", "tokenizer"):
        (snapshot / sub).mkdir(parents=True, exist_ok=True)
    for name in ("rl_agent_config.json", "model.safetensors", "encoder/config.json",
                 "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"):
        link = snapshot / name
        if not link.exists():
            link.symlink_to(checkpoint / name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)


def config_text(workers: int) -> str:
    return f"""[server]
request_timeout = "300s"

[checkpoints]
multilingual = "off"
typed-decisions = "off"

[[pool]]
name = "general"
device = "cpu"
workers = {workers}
threads = 1
batch_wait = "0ms"
checkpoints = ["english"]
"""


class Server:
    def __init__(self, bin_dir: Path, out: Path, hf_home: Path, workers: int, port: int):
        self.port, self.workers = port, workers
        config = out / f"layad-{workers}w.toml"
        config.write_text(config_text(workers))
        sockets = out / f"sockets-{workers}w"
        sockets.mkdir(exist_ok=True)
        env = dict(os.environ, HF_HOME=str(hf_home), HF_HUB_OFFLINE="1",
                   LAYAD_WORKERS__SOCKET_DIR=str(sockets))
        self.log = open(out / f"layad-{workers}w.log", "wb")
        self.proc = subprocess.Popen(
            [str(bin_dir / "layad"), "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            headers = {"content-type": "application/json"} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def wait_ready(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"layad ({self.workers} workers) exited; see {self.log.name}")
            try:
                status, body = self.request("GET", "/health")
                # Every worker of the pool warmed and ready, not only the first.
                if status == 200 and json.loads(body).get("status") == "ok":
                    return
            except OSError:
                pass
            time.sleep(0.5)
        sys.exit(f"layad ({self.workers} workers) not ready after {seconds} s; see {self.log.name}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
        self.log.close()


def without_diagnostics(body: bytes) -> str:
    answer = json.loads(body)
    for result in answer.get("results", []):
        if isinstance(result, dict):
            result.pop("x_layad", None)
    return json.dumps(answer, sort_keys=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", type=Path, default=ROOT / "target/release", help="layad, workers, layad-bench")
    parser.add_argument("--out", type=Path, default=ROOT / "target/bench/batch-workers")
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint directory instead of layad-bench's")
    parser.add_argument("--rounds", type=int, default=6, help="timed batches per server (even: A B B A ...)")
    parser.add_argument("--states", type=int, default=64)
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--port", type=int, default=18725, help="one worker's port; two workers' is the next")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    checkpoint = args.checkpoint
    if checkpoint is None:
        checkpoint = args.out / "modernbert-mini-v1024"
        if not (checkpoint / "model.safetensors").exists():
            subprocess.run([str(args.bin / "layad-bench"), "--out-dir", str(args.out), "--models", "modernbert-mini",
                            "--lengths", "64", "--rows", "1", "--precisions", "f32", "--threads", "1",
                            "--python", "none", "--min-runs", "2", "--max-runs", "5",
                            "--json", str(args.out / "checkpoint-forward.json")], check=True)
    hf_home = Path(tempfile.mkdtemp(prefix="hf-", dir=args.out))
    fake_hf_home(checkpoint.resolve(), hf_home)

    body = batch_body(args.seed, args.states)
    servers = [Server(args.bin, args.out, hf_home, 1, args.port), Server(args.bin, args.out, hf_home, 2, args.port + 1)]
    times: dict[int, list[float]] = {1: [], 2: []}
    try:
        for server in servers:
            server.wait_ready(900)
        reference = None
        # One untimed batch each: first-request costs stay out of the timings.
        for server in servers:
            status, answer = server.request("POST", "/v1/systemone/batch", body)
            if status != 200:
                sys.exit(f"{server.workers} workers answered {status}: {answer[:400]!r}")
            reference = reference or without_diagnostics(answer)
        for round_ in range(args.rounds):
            order = servers if round_ % 2 == 0 else servers[::-1]
            for server in order:
                started = time.perf_counter()
                status, answer = server.request("POST", "/v1/systemone/batch", body)
                elapsed = time.perf_counter() - started
                if status != 200:
                    sys.exit(f"{server.workers} workers answered {status}: {answer[:400]!r}")
                if without_diagnostics(answer) != reference:
                    sys.exit(f"{server.workers} workers answered differently in round {round_}")
                times[server.workers].append(elapsed)
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(hf_home, ignore_errors=True)

    one, two = statistics.median(times[1]), statistics.median(times[2])
    paired = [b / a for a, b in zip(times[1], times[2])]
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    result = {
        "states": args.states, "rounds": args.rounds, "seed": args.seed, "checkpoint": str(checkpoint),
        "cpu": cpu, "cores": os.cpu_count(), "loadavg": open("/proc/loadavg").read().split()[:3],
        "seconds_one_worker": times[1], "seconds_two_workers": times[2],
        "median_one": one, "median_two": two, "ratio_of_medians": two / one,
        "paired_ratios": paired, "answers_identical": True,
    }
    (args.out / "batch_workers.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"CPU: {cpu}, {os.cpu_count()} cores; load average {' '.join(result['loadavg'])}")
    print(f"| pool | batch of {args.states} states, median of {args.rounds} (s) | runs (s) |")
    print("|---|---|---|")
    print(f"| 1 worker | {one:.3f} | {', '.join(f'{t:.3f}' for t in times[1])} |")
    print(f"| 2 workers | {two:.3f} | {', '.join(f'{t:.3f}' for t in times[2])} |")
    print(f"two / one: {two / one:.3f} (paired: {', '.join(f'{p:.2f}' for p in paired)}); answers identical")
    print(f"JSON: {args.out / 'batch_workers.json'}")


if __name__ == "__main__":
    main()
