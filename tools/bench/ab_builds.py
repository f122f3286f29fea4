#!/usr/bin/env python3
"""Two layad builds side by side on one checkpoint: paired, interleaved requests (A/B, then B/A),
then answers/s at each client count run A/B/B/A. Used to check that a change does not slow the
served path (docs/benchmarks.md, "Served path before and after"). Stdlib only; 127.0.0.1 only.

  flock -x /work/cpu.lock python3 tools/bench/ab_builds.py --a /work/bin-before --b target/release \
      --checkpoint target/bench/modernbert-large-v50368 --out target/bench/ab.json

Each build runs with one CPU pool of `--threads` threads on the checkpoint as `english` (the other
checkpoints off) and `diagnostics = false`; the body is one choice question on a 64-token-ish English
state, the "short" shape of layad-http-bench.
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

BODY = json.dumps({
    "state": "I was charged twice for invoice 4411 last week and the second charge is still on my card; "
             "please refund it today and tell me when the money will be back on my account.",
    "questions": {"queue": {"type": "choice", "instructions": "Which queue should handle this?",
                            "criteria": {"billing": "payment problems", "tech": "technical issue",
                                         "other": "anything else"}}},
}).encode()
FILES = ["rl_agent_config.json", "model.safetensors", "encoder/config.json",
         "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_hf_home(checkpoint, root):
    """An HF cache whose bundle root is `checkpoint` (symlinks, nothing copied)."""
    repo = os.path.join(root, "hub", "models--convaiinnovations--laya")
    rev = "0" * 37 + "bec"
    for f in FILES:
        target = os.path.join(repo, "snapshots", rev, f)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(os.path.realpath(os.path.join(checkpoint, f)), target)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as out:
        out.write(rev)


class Layad:
    def __init__(self, name, bin_dir, home, threads, tmp):
        self.name, self.port = name, free_port()
        sockets = os.path.join(tmp, name + "-sockets")
        config = os.path.join(tmp, name + ".toml")
        with open(config, "w") as out:
            out.write(f"""[server]
listen = "127.0.0.1:{self.port}"
diagnostics = false
request_timeout = "300s"
[checkpoints]
multilingual = "off"
typed-decisions = "off"
[workers]
socket_dir = "{sockets}"
startup_timeout = "900s"
[logging]
filter = "warn"
[[pool]]
name = "cpu"
device = "cpu"
workers = 1
threads = {threads}
""")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LAYA_", "LAYAD_"))}
        env["HF_HOME"] = home
        self.log = open(os.path.join(tmp, name + ".log"), "w")
        self.proc = subprocess.Popen([os.path.join(bin_dir, "layad"), "serve", "--config", config],
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_ready(self, seconds):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"{self.name} exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(self.url("/readyz"), timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        sys.exit(f"{self.name} not ready after {seconds} s")

    def decide(self):
        request = urllib.request.Request(self.url("/v1/systemone"), data=BODY,
                                         headers={"content-type": "application/json"})
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=300) as r:
            body = r.read()
            if r.status != 200:
                raise RuntimeError(f"{self.name}: {r.status} {body[:200]!r}")
        return (time.perf_counter() - started) * 1000.0, json.loads(body)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def throughput(server, clients, seconds):
    """Answers in `seconds` from `clients` closed-loop clients, and errors."""
    done, errors, stop = [0], [0], time.time() + seconds
    lock = threading.Lock()

    def client():
        while time.time() < stop:
            try:
                server.decide()
                with lock:
                    done[0] += 1
            except Exception:  # noqa: BLE001 -- counted, reported
                with lock:
                    errors[0] += 1
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0], errors[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="bin dir of build A (the baseline)")
    ap.add_argument("--b", required=True, help="bin dir of build B")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--out", default="ab.json")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="layad-ab-")
    home = os.path.join(tmp, "hf")
    fake_hf_home(args.checkpoint, home)
    servers = [Layad("A", args.a, home, args.threads, tmp), Layad("B", args.b, home, args.threads, tmp)]
    try:
        for s in servers:
            s.wait_ready(900)
        a, b = servers
        for s in servers:  # warm: first requests after warm-up
            for _ in range(3):
                s.decide()
        # The probabilities (profiles may add keys such as 0.4.15's x_jev_confidence).
        answers = [{q: a["probabilities"] for q, a in s.decide()[1]["answers"].items()} for s in servers]
        same = answers[0] == answers[1]
        lat = {"A": [], "B": []}
        for i in range(args.pairs):
            for s in (servers if i % 2 == 0 else servers[::-1]):
                lat[s.name].append(s.decide()[0])
        ratios = [y / x for x, y in zip(lat["A"], lat["B"])]
        result = {"cpu": cpu(), "pairs": args.pairs, "probabilities_identical": same,
                  "latency_ms": {k: {"p50": statistics.median(v), "p90": sorted(v)[int(0.9 * (len(v) - 1))]}
                                 for k, v in lat.items()},
                  "b_over_a_latency_median_of_pairs": statistics.median(ratios), "throughput": []}
        print(f"cpu: {result['cpu']}; probabilities identical: {same}")
        print("| request | A p50 / p90 ms | B p50 / p90 ms | B / A (median of pairs) |")
        print("|---|---|---|---|")
        la, lb = result["latency_ms"]["A"], result["latency_ms"]["B"]
        print(f"| short | {la['p50']:.1f} / {la['p90']:.1f} | {lb['p50']:.1f} / {lb['p90']:.1f} | "
              f"**{result['b_over_a_latency_median_of_pairs']:.3f}** |")
        print("\n| clients | A answers/s | B answers/s | B / A | errors (A, B) |\n|---|---|---|---|---|")
        for clients in [int(c) for c in args.clients.split(",") if c]:
            totals = {"A": [0, 0.0, 0], "B": [0, 0.0, 0]}
            for s in (a, b, b, a):  # A/B/B/A
                n, err = throughput(s, clients, args.seconds / 2)
                t = totals[s.name]
                t[0] += n
                t[1] += args.seconds / 2
                t[2] += err
            ra, rb = totals["A"][0] / totals["A"][1], totals["B"][0] / totals["B"][1]
            result["throughput"].append({"clients": clients, "a": ra, "b": rb, "b_over_a": rb / ra,
                                         "errors": [totals["A"][2], totals["B"][2]]})
            print(f"| {clients} | {ra:.2f} | {rb:.2f} | **{rb / ra:.3f}×** | {totals['A'][2]}, {totals['B'][2]} |")
        with open(args.out, "w") as out:
            json.dump(result, out, indent=1)
        print(f"wrote {args.out}")
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def cpu():
    with open("/proc/cpuinfo") as f:
        info = f.read()
    field = lambda k: next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith(k)), "?")
    return f"{field('model name')} (family {field('cpu family')} model {field('model')})"


if __name__ == "__main__":
    main()
