#!/usr/bin/env python3
"""Several hosts behind the shipped balancers, under faults (issue 24).

Three hosts are network namespaces with their own addresses (10.224.{1,2,3}.2/24, each joined to
this namespace by a veth pair whose near end is 10.224.N.1), made and removed by this script; each
runs `layad serve` on the fixture checkpoints (one CPU pool of two single-threaded workers) on
10.224.N.2:8642. In front of them, in this namespace on 127.0.0.1, runs the balancer from Debian's
package with the shipped file: HAProxy with deploy/haproxy/layad.cfg, nginx with
deploy/nginx/layad.conf, only the addresses substituted (the instances', and the listening address
becomes 127.0.0.1:<free port>). nginx's file is included in an `http {}` block that adds only an
access log (which upstream answered), as deploy/README.md says to include it; HAProxy logs every
request to stdout as the shipped file says.

Load through the balancer for the whole run: CLIENTS threads, each a keep-alive HTTP/1.1 connection
(as the SDKs hold one) sending golden request bodies one after another, and, when the binary exists,
`layad-load run` (a new connection per request, open loop at LOAD_RATE), and, when --sdk-python can
import `typesafe-sdk`, SDK_CLIENTS threads of the TypeSafe SDK (tools/reliability/sdk_load.py: each
its own `TypeSafeClient`, the SDK's retries off, so a failure is one the balancer let through). All
are bounded: by --seconds, and every request by a 60 s client timeout (the SDK's: its default).

One fault per run, on host 2, FAULT_AT seconds in:
  kill-supervisor  SIGKILL its layad (the workers exit with it); started again OUTAGE s later
  kill-workers     SIGKILL its worker processes; its supervisor restarts them
  cut-link         the host's end of its link down (`ip link set ... down` in its namespace), up
                   again OUTAGE s later: packets to it are dropped silently
  cut-link-in-flight  the same, but host 2's pool holds each request 3 s (`batch_wait`) so that
                   requests are on it when the link goes: their answers are lost, and the balancer
                   must find that out and send them elsewhere within the clients' timeouts
  drain            SIGTERM (layad drains and exits); started again once it has exited
  rolling-upgrade  each host in turn: SIGTERM, wait for the exit, start new binaries (fresh copies of
                   layad and its worker in another directory: the same code, other files), wait
                   until /readyz is 200
  rolling-reload   each host in turn: its config gains a second pool (`extra`, one worker), then
                   `layad reload`; the next host once /health reports the reload applied

Reported per run (JSON in --out, and one markdown table row on stdout): requests sent, failed by
status and by transport error, latency (p50/p99/max, all and during the fault), and from the
balancer's log the seconds until it stopped sending to host 2 and until it sent to it again.

Needs root (namespaces, veth), iproute2, haproxy and/or nginx (Debian: apt install haproxy
nginx-light; stop and disable their services), curl, and built binaries (--bin-dir, default
target/debug: cargo build -p layad -p layad-worker-gpu -p layad-system-tests --bins). Without root
or a balancer it says so and exits 2. Traffic goes only to 127.0.0.1 and the 10.224.N.0/24 pairs
(an `unreachable 10.224.0.0/16` route, for the run's length, keeps a down link from sending it out
by the default route).

  sudo tools/reliability/balancers.py                           # every fault, both balancers
  sudo tools/reliability/balancers.py --balancer haproxy --fault cut-link
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAULTS = ["kill-supervisor", "kill-workers", "cut-link", "cut-link-in-flight", "drain", "rolling-upgrade", "rolling-reload"]
BALANCERS = ["haproxy", "nginx"]
SHIPPED_ADDRESSES = ["192.0.2.11:8642", "192.0.2.12:8642", "192.0.2.13:8642"]
PORT = 8642
SANDBOX_NET = "10.224.0.0/16"
CLIENT_TIMEOUT = 60.0

POOL_CONFIG = """# tools/reliability/balancers.py: one CPU pool of two single-threaded workers.
[[pool]]
name = "cpu"
device = "cpu"
workers = 2
threads = 1
"""
# cut-link-in-flight: host 2 holds each request this long before it runs it (waiting for company in
# a batch), so that requests are in flight on it when its link is cut.
HOLD_ON_HOST2 = 'batch_wait = "3s"\n'
EXTRA_POOL = """
# Added by the rolling reload.
[[pool]]
name = "extra"
device = "cpu"
workers = 1
threads = 1
"""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, http.client.HTTPException):
        return 0


class Host:
    """One network namespace with a veth pair and a layad in it."""

    def __init__(self, index: int, tag: str, work: Path, bin_dir: Path):
        self.index = index
        self.ns = f"l24{tag}h{index}"
        self.veth = f"l24{tag}v{index}"
        self.peer = f"l24{tag}p{index}"
        self.addr = f"10.224.{index}.2"
        self.work = work / f"host{index}"
        self.work.mkdir(parents=True)
        self.config = self.work / "layad.toml"
        self.config.write_text(POOL_CONFIG)
        self.binary = bin_dir / "layad"
        self.bin_dir = bin_dir
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{PORT}"

    def create(self) -> None:
        run("ip", "netns", "add", self.ns)
        run("ip", "link", "add", self.veth, "type", "veth", "peer", "name", self.peer)
        run("ip", "link", "set", self.peer, "netns", self.ns)
        run("ip", "addr", "add", f"10.224.{self.index}.1/24", "dev", self.veth)
        run("ip", "link", "set", self.veth, "up")
        run("ip", "netns", "exec", self.ns, "ip", "addr", "add", f"{self.addr}/24", "dev", self.peer)
        run("ip", "netns", "exec", self.ns, "ip", "link", "set", self.peer, "up")
        run("ip", "netns", "exec", self.ns, "ip", "link", "set", "lo", "up")

    def destroy(self) -> None:
        self.stop()
        run("ip", "link", "del", self.veth, check=False)
        run("ip", "netns", "del", self.ns, check=False)

    def start(self, binary: Path | None = None) -> None:
        if binary is not None:
            self.binary = binary
        self.starts += 1
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HF_HOME": str(REPO / "tests" / "fixtures" / "hf-cache"),
            "HF_HUB_OFFLINE": "1",
            "LAYAD_WORKERS__SOCKET_DIR": str(self.work / "sockets"),
        }
        logfile = open(self.work / f"layad-{self.starts}.log", "w")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, str(self.binary), "serve", "--config", str(self.config),
             "--listen", f"{self.addr}:{PORT}"],
            env=env, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True,
        )
        logfile.close()

    def wait_ready(self, timeout: float = 120.0) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.ns}: layad exited with {self.proc.returncode}; see {self.work}")
            if http_status(f"{self.url}/readyz") == 200:
                return time.monotonic() - started
            time.sleep(0.2)
        raise RuntimeError(f"{self.ns}: layad not ready after {timeout} s")

    def supervisor_pid(self) -> int:
        # `ip netns exec` execs the program: the Popen pid is layad's.
        assert self.proc is not None
        return self.proc.pid

    def worker_pids(self) -> list[int]:
        out = run("pgrep", "-P", str(self.supervisor_pid()), check=False).stdout
        return [int(p) for p in out.split()]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class Balancer:
    def __init__(self, kind: str, work: Path, hosts: list[Host]):
        self.kind = kind
        self.work = work / kind
        self.work.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.hosts = hosts
        self.proc: subprocess.Popen | None = None
        self.saved_sysctls: dict[Path, str] = {}
        self.log_path = self.work / ("haproxy.log" if kind == "haproxy" else "access.log")

    def substituted(self, text: str) -> str:
        for shipped, host in zip(SHIPPED_ADDRESSES, self.hosts):
            text = text.replace(shipped, f"{host.addr}:{PORT}")
        if self.kind == "haproxy":
            text, n = re.subn(r"^(\s*bind\s+):80\b", rf"\g<1>127.0.0.1:{self.port}", text, flags=re.M)
        else:
            text, n = re.subn(r"^(\s*listen\s+)80;", rf"\g<1>127.0.0.1:{self.port};", text, flags=re.M)
        assert n == 1, "the shipped file's listening line moved: update balancers.py"
        return text

    def start(self) -> None:
        if self.kind == "haproxy":
            shipped = (REPO / "deploy" / "haproxy" / "layad.cfg").read_text()
            cfg = self.work / "layad.cfg"
            cfg.write_text(self.substituted(shipped))
            run("haproxy", "-c", "-f", str(cfg))
            self.proc = subprocess.Popen(
                ["haproxy", "-db", "-f", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            # Each line stamped with when it came: the check's "is DOWN"/"is UP" lines carry no time.
            self.reader = threading.Thread(target=self.stamp, daemon=True)
            self.reader.start()
        else:
            shipped = (REPO / "deploy" / "nginx" / "layad.conf").read_text()
            (self.work / "layad.conf").write_text(self.substituted(shipped))
            for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
                (self.work / d).mkdir()
            w = self.work
            (w / "nginx.conf").write_text(
                f"""# tools/reliability/balancers.py: deploy/nginx/layad.conf included as its comment says,
# plus an access log of which upstream answered each request.
daemon off;
pid {w}/nginx.pid;
error_log {w}/error.log notice;
events {{}}
http {{
    log_format upstreams '$msec $request_time "$upstream_addr" "$upstream_status" $status';
    access_log {self.log_path} upstreams;
    client_body_temp_path {w}/client_body;
    proxy_temp_path {w}/proxy;
    fastcgi_temp_path {w}/fastcgi;
    uwsgi_temp_path {w}/uwsgi;
    scgi_temp_path {w}/scgi;
    include {w}/layad.conf;
}}
"""
            )
            run("nginx", "-t", "-c", str(w / "nginx.conf"))
            self.apply_sysctls(REPO / "deploy" / "nginx" / "60-layad-upstream-keepalive.conf")
            out = open(w / "nginx.out", "w")
            self.proc = subprocess.Popen(["nginx", "-c", str(w / "nginx.conf")], stdout=out, stderr=subprocess.STDOUT)
            out.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if http_status(f"{self.url}/readyz") == 200:
                return
            time.sleep(0.2)
        raise RuntimeError(f"{self.kind} does not pass /readyz to the hosts; see {self.work}")

    def apply_sysctls(self, shipped: Path) -> None:
        """Sets the shipped sysctl file's values on this host, as its comment says to install it; stop()
        puts the earlier values back (this namespace is the machine's own)."""
        for line in shipped.read_text().splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            key, value = (part.strip() for part in line.split("=", 1))
            path = Path("/proc/sys") / key.replace(".", "/")
            self.saved_sysctls[path] = path.read_text()
            path.write_text(value)

    def stamp(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.log_path, "w") as out:
            for line in self.proc.stdout:
                out.write(f"{time.time():.3f} {line}")
                out.flush()

    def check_changes(self, server: str) -> list[tuple[float, str]]:
        """(epoch seconds, "DOWN" or "UP") of HAProxy's health check on `server`."""
        if self.kind != "haproxy":
            return []
        changes = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            m = re.match(rf"(\d+\.\d+) .*Server layad/{server} is (DOWN|UP)", line)
            if m and "[WARNING]" not in line:
                changes.append((float(m.group(1)), m.group(2)))
        return changes

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM if self.kind == "haproxy" else signal.SIGQUIT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for path, value in self.saved_sysctls.items():
            path.write_text(value)
        self.saved_sysctls.clear()

    def dispatches(self) -> list[tuple[float, list[str], int]]:
        """(epoch seconds the request arrived, hosts tried in order, final status) per POST."""
        out = []
        text = self.log_path.read_text(errors="replace")
        if self.kind == "haproxy":
            # httplog: ... [03/Dec/2026:07:50:01.123] decisions layad/layad2 TR/Tw/Tc/Tr/Ta status ...
            # ... ac/fc/bc/sc/rc ... "POST /v1/systemone HTTP/1.1"; rc > 0 (a "+" before it after
            # a redispatch) counts retries, whose earlier servers the log does not name.
            pattern = re.compile(
                r"\[(\d+/\w+/\d+:\d+:\d+:\d+\.\d+)\] \S+ \S+/(\S+) \S+ (\d+) .* \d+/\d+/\d+/\d+/(\+?\d+) .*\"POST "
            )
            for line in text.splitlines():
                m = pattern.search(line)
                if not m:
                    continue
                when = datetime.strptime(m.group(1), "%d/%b/%Y:%H:%M:%S.%f").timestamp()
                server = m.group(2)
                # A retry means an attempt on another server failed first: only host 2 fails here.
                retried = m.group(4).lstrip("+").strip("0") != ""
                tried = ["retried", server] if retried else [server]
                out.append((when, tried, int(m.group(3))))
        else:
            for line in text.splitlines():
                m = re.match(r'(\d+\.\d+) (\d+\.\d+) "([^"]*)" "([^"]*)" (\d+)', line)
                if not m:
                    continue
                start = float(m.group(1)) - float(m.group(2))
                # "10.224.2.2:8642, 10.224.1.2:8642" when the request went to a second upstream.
                tried = re.findall(r"(\d+\.\d+\.\d+\.\d+):\d+", m.group(3))
                out.append((start, tried, int(m.group(5))))
        return out


class Load:
    """Keep-alive clients sending golden bodies through the balancer until stopped."""

    def __init__(self, url: str, clients: int, bodies: list[bytes], seed: int):
        self.url = url
        self.clients = clients
        self.bodies = bodies
        self.seed = seed
        self.records: list[dict] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []

    def client(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        host, port = self.url.removeprefix("http://").split(":")
        conn: http.client.HTTPConnection | None = None
        while not self.stopping.is_set():
            body = rng.choice(self.bodies)
            start = time.time()
            status, error = 0, None
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(host, int(port), timeout=CLIENT_TIMEOUT)
                conn.request("POST", "/v1/systemone", body=body, headers={"content-type": "application/json"})
                response = conn.getresponse()
                response.read()
                status = response.status
                if response.getheader("connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                error = type(e).__name__ + (f": {e}" if str(e) else "")
                if conn is not None:
                    conn.close()
                conn = None
            end = time.time()
            with self.lock:
                self.records.append({"client": index, "start": start, "end": end, "status": status, "error": error})
            # About 4 requests a second per client: load, not saturation (2 cores run everything here).
            time.sleep(rng.uniform(0.15, 0.35))
        if conn is not None:
            conn.close()

    def start(self) -> None:
        for i in range(self.clients):
            t = threading.Thread(target=self.client, args=(i,), daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=CLIENT_TIMEOUT + 5)


def sdk_importable(python: str) -> bool:
    """Whether `python` can run tools/reliability/sdk_load.py (typesafe-sdk installed)."""
    try:
        return subprocess.run([python, "-c", "import typesafe_sdk"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def summarize(records: list[dict]) -> dict:
    failed = [r for r in records if r["status"] != 200]
    by_status: dict[str, int] = {}
    by_error: dict[str, int] = {}
    for r in failed:
        if r["status"]:
            by_status[str(r["status"])] = by_status.get(str(r["status"]), 0) + 1
        else:
            key = (r["error"] or "no response").split(":")[0]
            by_error[key] = by_error.get(key, 0) + 1
    latencies = [1000 * (r["end"] - r["start"]) for r in records]
    return {
        "sent": len(records),
        "failed": len(failed),
        "failed_by_status": by_status,
        "failed_by_transport_error": by_error,
        "latency_ms": {
            "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99),
            "max": max(latencies) if latencies else None,
        },
    }


def run_fault(args, kind: str, fault: str, bodies: list[bytes]) -> dict:
    tag = f"{os.getpid() % 1000:03d}"
    work = Path(tempfile.mkdtemp(prefix=f"lb-{kind}-{fault}-"))
    hosts = [Host(i, tag, work, Path(args.bin_dir)) for i in (1, 2, 3)]
    if fault == "cut-link-in-flight":
        hosts[1].config.write_text(POOL_CONFIG + HOLD_ON_HOST2)
    balancer = Balancer(kind, work, hosts)
    load = Load("", args.clients, bodies, args.seed)
    layad_load: subprocess.Popen | None = None
    sdk_load: subprocess.Popen | None = None
    events: dict[str, float] = {}
    result: dict = {"balancer": kind, "fault": fault}
    try:
        # Nothing for the hosts' addresses may leave by the default route (a down link once sent
        # the checks to whatever answers there): the /24 of each pair is more specific than this.
        run("ip", "route", "replace", "unreachable", SANDBOX_NET)
        for h in hosts:
            h.create()
        for h in hosts:
            h.start()
        for h in hosts:
            h.wait_ready()
        balancer.start()
        load = Load(balancer.url, args.clients, bodies, args.seed)
        run_started = time.time()
        load.start()
        layad_load_bin = Path(args.bin_dir) / "layad-load"
        if args.load_rate > 0 and layad_load_bin.exists():
            layad_load = subprocess.Popen(
                [str(layad_load_bin), "run", "--url", balancer.url, "--rate", str(args.load_rate),
                 "--seconds", str(args.seconds - 5), "--variants", "2", "--request-timeout-s", str(int(CLIENT_TIMEOUT)),
                 "--reference", str(work / "reference.json"), "--out", str(work / "layad-load.json")],
                stdout=open(work / "layad-load.out", "w"), stderr=subprocess.STDOUT,
            )
        if args.sdk_clients > 0 and sdk_importable(args.sdk_python):
            sdk_load = subprocess.Popen(
                [args.sdk_python, str(REPO / "tools" / "reliability" / "sdk_load.py"), "--url", balancer.url,
                 "--seconds", str(args.seconds - 5), "--clients", str(args.sdk_clients),
                 "--out", str(work / "sdk-load.json")],
                stdout=open(work / "sdk-load.out", "w"), stderr=subprocess.STDOUT,
            )
        time.sleep(args.fault_at)
        target = hosts[1]
        events["fault"] = time.time()
        log(f"{kind} {fault}: fault on {target.ns} ({target.addr})")
        if fault == "kill-supervisor":
            os.kill(target.supervisor_pid(), signal.SIGKILL)
            target.proc.wait()
            time.sleep(args.outage)
            events["restore"] = time.time()
            target.start()
            target.wait_ready()
            events["ready"] = time.time()
        elif fault == "kill-workers":
            pids = target.worker_pids()
            result["workers_killed"] = len(pids)
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            events["restore"] = time.time()
            time.sleep(1)
            target.wait_ready()
            events["ready"] = time.time()
        elif fault in ("cut-link", "cut-link-in-flight"):
            # The host's end goes down: this end loses its carrier and its packets to the host are
            # dropped silently, as across a cut cable (a down near end would remove the route, and
            # the safety route would refuse at once instead).
            run("ip", "netns", "exec", target.ns, "ip", "link", "set", target.peer, "down")
            time.sleep(args.outage)
            run("ip", "netns", "exec", target.ns, "ip", "link", "set", target.peer, "up")
            events["restore"] = events["ready"] = time.time()
        elif fault == "drain":
            target.proc.send_signal(signal.SIGTERM)
            target.proc.wait(timeout=120)
            events["restore"] = time.time()
            target.start()
            target.wait_ready()
            events["ready"] = time.time()
        elif fault == "rolling-upgrade":
            new_dir = work / "new-bin"
            new_dir.mkdir()
            # The supervisor and its worker, as an upgrade installs them side by side.
            for binary in ("layad", "layad-worker-gpu"):
                shutil.copy2(Path(args.bin_dir) / binary, new_dir / binary)
            for h in hosts:
                h.proc.send_signal(signal.SIGTERM)
                h.proc.wait(timeout=120)
                h.start(new_dir / "layad")
                h.wait_ready()
                events[f"host{h.index}_ready"] = time.time()
                time.sleep(args.settle)
            events["restore"] = events["ready"] = time.time()
        elif fault == "rolling-reload":
            for h in hosts:
                h.config.write_text(POOL_CONFIG + EXTRA_POOL)
                env = dict(os.environ, LAYAD_WORKERS__SOCKET_DIR=str(h.work / "sockets"))
                out = subprocess.run(
                    ["ip", "netns", "exec", h.ns, str(h.binary), "reload", "--config", str(h.config),
                     "--listen", f"{h.addr}:{PORT}"],
                    env=env, capture_output=True, text=True, timeout=120,
                )
                result.setdefault("reloads", []).append((out.stdout + out.stderr).strip()[-300:])
                if out.returncode != 0:
                    raise RuntimeError(f"layad reload on {h.ns} failed: {out.stdout}{out.stderr}")
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    try:
                        with urllib.request.urlopen(f"{h.url}/health", timeout=2) as r:
                            health = json.load(r)
                        pools = [p.get("name") for p in health.get("pools", [])]
                        ready = all(w.get("state") == "ready" for p in health.get("pools", []) for w in p.get("workers", []))
                        if "extra" in pools and ready:
                            break
                    except (OSError, ValueError):
                        pass
                    time.sleep(0.5)
                else:
                    raise RuntimeError(f"{h.ns}: the reload did not bring pool extra up")
                events[f"host{h.index}_reloaded"] = time.time()
                time.sleep(args.settle)
            events["restore"] = events["ready"] = time.time()
        remaining = run_started + args.seconds - time.time()
        if remaining > 0:
            time.sleep(remaining)
    finally:
        load.stop()
        for process in (layad_load, sdk_load):
            if process is not None:
                try:
                    process.wait(timeout=CLIENT_TIMEOUT + 30)
                except subprocess.TimeoutExpired:
                    process.kill()
        balancer.stop()
        for h in hosts:
            h.destroy()
        run("ip", "route", "del", "unreachable", SANDBOX_NET, check=False)
    records = load.records
    result.update(summarize(records))
    if "fault" in events:
        window_end = events.get("ready", events["fault"]) + 5
        during = [r for r in records if r["end"] >= events["fault"] and r["start"] <= window_end]
        result["during_fault"] = summarize(during)
        result["failures"] = [
            {"at_s": round(r["start"] - events["fault"], 2), "status": r["status"], "error": r["error"],
             "took_s": round(r["end"] - r["start"], 2)}
            for r in records if r["status"] != 200
        ][:50]
    # Requests open when the fault began (keep-alive and SDK clients): in cut-link-in-flight, those on
    # host 2 lost their answers and had to be sent again.
    sdk_path = work / "sdk-load.json"
    sdk_data = json.loads(sdk_path.read_text()) if sdk_path.exists() else None
    sdk_records = sdk_data["records"] if sdk_data else []
    if "fault" in events:
        t0 = events["fault"]
        spans = [(r["start"], r["end"]) for r in records + sdk_records]
        open_at_fault = [end - start for start, end in spans if start <= t0 <= end]
        result["open_at_fault"] = {"count": len(open_at_fault),
                                   "longest_s": round(max(open_at_fault), 2) if open_at_fault else None}
    # layad-load's own records (new connection per request).
    ll = work / "layad-load.json"
    if ll.exists():
        data = json.loads(ll.read_text())
        recs = data.get("records") or data.get("requests") or []
        result["layad_load"] = {
            "sent": len(recs),
            "failed": sum(1 for r in recs if r.get("status") != 200),
            "failed_detail": [{"status": r.get("status"), "error": r.get("error")} for r in recs if r.get("status") != 200][:10],
        }
    # The SDK's calls (its own pooled connection per client, no SDK retries).
    if sdk_data:
        failures = [r for r in sdk_records if not r["ok"]]
        result["sdk_load"] = {
            "sdk": sdk_data["sdk"],
            "sent": len(sdk_records),
            "failed": len(failures),
            "failed_detail": [
                {"at_s": round(r["start"] - events.get("fault", r["start"]), 2),
                 **{k: r.get(k) for k in ("error", "status", "message")}}
                for r in failures
            ][:10],
        }
    elif sdk_load is not None:
        result["sdk_load"] = {"sent": 0, "failed": 1, "failed_detail": [{"error": "sdk_load.py wrote no results"}]}
    # What the balancer did with host 2.
    target_names = {"haproxy": "layad2", "nginx": "10.224.2.2"}
    dispatches = balancer.dispatches()
    result["balancer_log_requests"] = len(dispatches)
    if "fault" in events and fault not in ("rolling-upgrade", "rolling-reload"):
        t0, t1 = events["fault"], events.get("ready", events["fault"])
        to_target = [d for d in dispatches if target_names[kind] in d[1] or "retried" in d[1]]
        result["retried_requests"] = sum(1 for d in dispatches if "retried" in d[1] or len(d[1]) > 1)
        changes = balancer.check_changes("layad2")
        downs = [t for t, what in changes if what == "DOWN" and t >= t0]
        ups = [t for t, what in changes if what == "UP" and t >= t0]
        if downs:
            result["host2_check_down_after_fault_s"] = round(downs[0] - t0, 2)
        if ups:
            result["host2_check_up_after_ready_s"] = round(ups[-1] - t1, 2)
        during = [d for d in to_target if t0 <= d[0] < t1]
        after = [d for d in to_target if d[0] >= t1]
        result["sent_to_host2_during_fault"] = len(during)
        result["host2_last_sent_after_fault_s"] = round(max(d[0] for d in during) - t0, 2) if during else 0.0
        result["host2_resumed_after_ready_s"] = round(after[0][0] - t1, 2) if after else None
        result["fault_to_ready_s"] = round(t1 - t0, 2)
    result["events"] = {k: round(v - events.get("fault", v), 2) for k, v in events.items()}
    result["work"] = str(work)
    return result


def print_table(directory: Path) -> None:
    """deploy/README.md's table, from the JSON results of a run."""
    print("| balancer | fault | requests (keep-alive + layad-load + SDK) | failed | latency in the fault window p50 / p99 / max | host 2 after the fault: requests that reached it (retried), last one | check marked it down | traffic again after it was ready |")
    print("|---|---|---|---|---|---|---|---|")
    order = {f: i for i, f in enumerate(FAULTS)}
    results = [json.loads(p.read_text()) for p in directory.glob("*.json")]
    for r in sorted(results, key=lambda r: (BALANCERS.index(r["balancer"]), order[r["fault"]])):
        ll, sdk = r.get("layad_load", {}), r.get("sdk_load", {})
        failed = r["failed"] + ll.get("failed", 0) + sdk.get("failed", 0)
        detail = {**r["failed_by_status"], **r["failed_by_transport_error"]}
        lat = r.get("during_fault", {}).get("latency_ms", {})
        fmt = lambda v: "-" if v is None else f"{v:.0f}"
        host2 = "-"
        if "sent_to_host2_during_fault" in r:
            host2 = f"{r['sent_to_host2_during_fault']} ({r.get('retried_requests', 0)}), +{r['host2_last_sent_after_fault_s']} s"
        down = r.get("host2_check_down_after_fault_s")
        resumed = r.get("host2_resumed_after_ready_s")
        print(
            f"| {r['balancer']} | {r['fault']} | {r['sent']} + {ll.get('sent', 0)} + {sdk.get('sent', '-')} | {failed}"
            f"{' ' + json.dumps(detail) if detail else ''} | {fmt(lat.get('p50'))} / {fmt(lat.get('p99'))} / {fmt(lat.get('max'))} ms | "
            f"{host2} | {'-' if down is None else f'+{down} s'} | {'-' if resumed is None else f'{resumed} s'} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--balancer", default=",".join(BALANCERS))
    parser.add_argument("--fault", default=",".join(FAULTS))
    parser.add_argument("--bin-dir", default=str(REPO / "target" / "debug"))
    parser.add_argument("--out", default=str(REPO / "target" / "reliability" / "balancers"))
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--load-rate", type=float, default=2.0, help="layad-load's arrivals per second (0: none)")
    parser.add_argument("--sdk-python", default="/work/venvs/typesafe/bin/python3",
                        help="a Python with typesafe-sdk (tools/sdk/README.md); the SDK load is left out without it")
    parser.add_argument("--sdk-clients", type=int, default=2, help="TypeSafe SDK clients (0: none)")
    parser.add_argument("--seconds", type=float, default=60.0, help="load per run (longer when the fault takes longer)")
    parser.add_argument("--fault-at", type=float, default=10.0)
    parser.add_argument("--outage", type=float, default=15.0)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between hosts in rolling faults")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--table", metavar="DIR", help="print the markdown table of the results in DIR and exit")
    args = parser.parse_args()
    if args.table:
        print_table(Path(args.table))
        return 0

    kinds = args.balancer.split(",")
    faults = args.fault.split(",")
    unknown = [k for k in kinds if k not in BALANCERS] + [f for f in faults if f not in FAULTS]
    if unknown:
        parser.error(f"unknown: {unknown}")
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces)")
    for tool in ["ip", "curl", *kinds]:
        if shutil.which(tool) is None:
            missing.append(tool)
    for binary in ("layad", "layad-worker-gpu"):
        if not (Path(args.bin_dir) / binary).exists():
            missing.append(f"{args.bin_dir}/{binary}")
    if missing:
        print(f"balancers.py: skipped, missing: {', '.join(missing)}", file=sys.stderr)
        return 2
    # The servers run the default contract (0.4.15): its goldens answered 200.
    cases = json.loads((REPO / "tests" / "fixtures" / "goldens-0.4.15" / "cases.json").read_text())["cases"]
    bodies = [c["body"].encode() for c in cases if c.get("status") == 200][:40]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    log(f"cpu: {cpu} ({os.cpu_count()} cpus); haproxy {run('haproxy', '-v', check=False).stdout.split()[2] if 'haproxy' in kinds else '-'}")
    results = []
    for kind in kinds:
        for fault in faults:
            result = run_fault(args, kind, fault, bodies)
            result["command"] = f"sudo tools/reliability/balancers.py --balancer {kind} --fault {fault}"
            result["cpu"] = cpu
            result["utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            results.append(result)
            (out / f"{kind}-{fault}.json").write_text(json.dumps(result, indent=2))
            ll, sdk = result.get("layad_load", {}), result.get("sdk_load", {})
            print(
                f"| {kind} | {fault} | {result['sent']} + {ll.get('sent', 0)} + {sdk.get('sent', '-')} | "
                f"{result['failed']} + {ll.get('failed', 0)} + {sdk.get('failed', '-')} "
                f"{result['failed_by_status'] or ''}{result['failed_by_transport_error'] or ''} | "
                f"{result.get('during_fault', {}).get('latency_ms', {})} | "
                f"{result.get('sent_to_host2_during_fault', '-')} / {result.get('host2_last_sent_after_fault_s', '-')} s | "
                f"{result.get('host2_resumed_after_ready_s', '-')} s |",
                flush=True,
            )
            if result["failed"] == 0 and not ll.get("failed") and not sdk.get("failed"):
                shutil.rmtree(result["work"], ignore_errors=True)
    failed = sum(
        r["failed"] + r.get("layad_load", {}).get("failed", 0) + r.get("sdk_load", {}).get("failed", 0)
        for r in results
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
