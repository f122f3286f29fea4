#!/usr/bin/env python3
"""Runs the 14 Jev client libraries from PyPI, unmodified, against layad in the `jev` profile.

It starts `layad serve` (`[compat] output = "jev"`, a bearer key, the fixture checkpoints, a free
127.0.0.1 port, its own `workers.socket_dir`), waits for `GET /readyz` = 200, then, for each
library, makes sure its own virtual environment exists (one per library: their pins conflict —
jevantic wants typesafe-sdk < 0.7, jevfilter >= 0.7.1), points the library at layad the way its
documentation says (each one's base-URL and key settings are in CLIENTS below) and makes one real
call. A library passes when the call returns without an exception, the answer checks out, and
layad's `/metrics` counted one more 200 answer (so the call really reached layad).

    python3 tools/jev-clients/run.py                      # all 14, target/debug or target/release
    python3 tools/jev-clients/run.py --only jevantic jev  # some of them
    python3 tools/jev-clients/run.py --output laya         # the same calls in another profile
    python3 tools/jev-clients/run.py --weights-seed 7      # on a fixture cache of other random weights

Python: the libraries need 3.10 to 3.14 (jevclient >= 3.12, jev-cli >= 3.13, jev 0.3.0 declares
>= 3.14). The venvs are made with --python (default: the newest python3.1x found on PATH or under
~/.pyenv/versions, at least 3.13); on an interpreter older than a library declares, that library is
installed with pip's --ignore-requires-python (its code is unchanged) and the table says so.

The fixture checkpoints' random weights decide every answer, so a library that checks more than
the shape (jevantic: probabilities summing to one within 1e-6) can pass on one set of weights by
luck; `--weights-seed N` runs everything on a cache like the committed one whose weights come from
seed N (`tools/fixtures/make_fixtures.py --weights-seed N --cache-out DIR`, run with
`--fixture-python`, a Python with torch, transformers and laya: tools/fixtures/README.md), and
`--hf-home DIR` on any cache.

Exit status 0 only when every library passes. Traffic goes to 127.0.0.1 only; pip goes to PyPI.
See tools/jev-clients/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENVS = Path("/work/venvs/jev-clients")
SERVER_KEY = "layad-jev-clients-key"

# What every call asks: a two-option choice about a support ticket (the client's own question type
# where it has no choice: a noul).
PRELUDE = r'''
import json, os, sys
URL = os.environ["LAYADDEV_URL"]
KEY = os.environ["LAYADDEV_KEY"]
STATE = "I was charged twice for invoice 4411, please refund it today."
QUEUE = {"billing": "payment problems, invoices, refunds", "tech": "bugs and outages"}
def done(detail):
    print(json.dumps({"ok": True, "detail": detail}))
'''


@dataclass(frozen=True)
class Client:
    """One library: its pip requirement, the Python it declares, how it is pointed at layad (the
    environment its documentation names) and the call, as Python run in its venv."""

    name: str
    requirement: str
    requires_python: tuple[int, int]
    env: dict[str, str]
    code: str


# {url} and {key} in env values are replaced by layad's base URL and key.
CLIENTS: list[Client] = [
    Client("typesafe-sdk", "typesafe-sdk[zstd]==0.7.5", (3, 10),
           {"TYPESAFE_BASE_URL": "{url}", "TYPESAFE_API_KEY": "{key}"}, r'''
from typesafe_sdk import Choice, TypeSafeClient
with TypeSafeClient() as client:
    r = client.system_one(state=STATE, questions={"queue": Choice(instructions="Which queue?", criteria=QUEUE)})
a = r.choices["queue"]
assert a.choice in QUEUE and 0 <= a.confidence <= 1, a
assert r.request_id, "no x-typesafe-request-id"
done(f"choice={a.choice} confidence={a.confidence:.4f} request_id={r.request_id}")
'''),
    Client("jevclient", "jevclient==1.3.1", (3, 12), {}, r'''
import asyncio
from jevclient import Choice, JevClient
async def main():
    async with JevClient(KEY, base_url=URL) as client:
        return await client.ask(STATE, {"queue": Choice(instructions="Which queue?", criteria=QUEUE)})
r = asyncio.run(main())
a = r.answers["queue"]
assert a.choice in QUEUE, a
done(f"choice={a.choice} confidence={a.confidence:.4f}")
'''),
    Client("jev-lite", "jev-lite==0.0.6", (3, 11),
           {"TYPESAFE_BASE_URL": "{url}", "TYPESAFE_API_KEY": "{key}"}, r'''
from jev_lite import Choice, TypeSafe
with TypeSafe() as client:
    r = client.system_one.create(state=STATE, questions={"queue": Choice(instructions="Which queue?", criteria=QUEUE)})
a = r.answers["queue"]
assert a.choice in QUEUE, a
done(f"choice={a.choice} confidence={a.confidence:.4f} request_id={r.request_id}")
'''),
    # The CLI's official provider posts to TYPESAFE_API_URL (the full route) with TYPESAFE_API_KEY.
    Client("jev-cli", "jev-cli==0.7.0", (3, 13),
           {"TYPESAFE_API_URL": "{url}/v1/systemone", "TYPESAFE_API_KEY": "{key}"}, r'''
import subprocess
cli = os.path.join(os.path.dirname(sys.executable), "jev")
args = [cli, "choice", "-q", "Which queue?", "-s", STATE] + [x for k, v in QUEUE.items() for x in ("-o", f"{k}={v}")]
out = subprocess.run(args, capture_output=True, text=True, timeout=60)
assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
answer = json.loads(out.stdout)
done("jev choice → " + json.dumps(answer, ensure_ascii=False)[:160])
'''),
    Client("pydecide", "pydecide==0.2.19", (3, 10),
           {"DECIDE_BACKENDS": "typesafe", "TYPESAFE_BASE_URL": "{url}", "TYPESAFE_API_KEY": "{key}"}, r'''
from decide import Choice, Client
with Client.from_env(dict(os.environ)) as client:
    r = client.decide(STATE, {"queue": Choice(instructions="Which queue?", criteria=QUEUE)})
a = r.answers["queue"]
assert a.choice in QUEUE, r
done(f"choice={a.choice} route={getattr(r, 'route', None)}")
'''),
    Client("jev-fn", "jev-fn==0.1.1", (3, 10),
           {"TYPESAFE_BASE_URL": "{url}", "TYPESAFE_API_KEY": "{key}"}, r'''
from jev_fn import jev
p = jev("Does the customer want money back?", STATE)
assert 0 <= p <= 1, p
done(f"noul={p:.4f}")
'''),
    Client("hunch-jev", "hunch-jev==0.10.0", (3, 10),
           {"TYPESAFE_BASE_URL": "{url}", "TYPESAFE_API_KEY": "{key}"}, r'''
import hunch
labels = hunch.classify([STATE], list(QUEUE))
assert len(labels) == 1 and labels[0] in QUEUE, labels
done(f"classify → {labels}")
'''),
    Client("jevfilter", "jevfilter==0.5.0", (3, 10),
           {"TYPESAFE_BASE_URL": "{url}", "TYPESAFE_API_KEY": "{key}"}, r'''
import jevfilter as jf
c = jf.choose(STATE, QUEUE)
assert c.value in QUEUE and 0 <= c.confidence <= 1, c
done(f"choose → {c.value} confidence={c.confidence:.4f}")
'''),
    # jevkit-runtime underneath: JEV_API picks the provider; its `laya` provider (a local Laya server,
    # "laya-mlx") reads its endpoint (the full route) from JEV_LAYA_URL, its key from JEV_LAYA_API_KEY,
    # and sends model `laya-421m`, laya-mlx's id of the English checkpoint.
    Client("jev-grep", "jev-grep==0.6.0", (3, 10),
           {"JEV_API": "laya", "JEV_LAYA_URL": "{url}/v1/systemone", "JEV_LAYA_API_KEY": "{key}"}, r'''
import subprocess, tempfile
cli = os.path.join(os.path.dirname(sys.executable), "jgrep")
with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
    f.write(STATE + "\nThe app crashes when I open settings.\n")
out = subprocess.run([cli, "--no-cache", "-o", "a billing or payment problem", f.name], capture_output=True, text=True, timeout=120)
assert out.returncode in (0, 1), (out.returncode, out.stdout, out.stderr)
done(f"jgrep exit {out.returncode}: " + out.stdout.strip().replace(chr(10), " | ")[:160])
'''),
    Client("jev-sort", "jev-sort==0.5.1", (3, 10),
           {"JEV_API": "laya", "JEV_LAYA_URL": "{url}/v1/systemone", "JEV_LAYA_API_KEY": "{key}"}, r'''
import subprocess
cli = os.path.join(os.path.dirname(sys.executable), "jsort")
lines = "The server is down for everyone.\nA typo on the pricing page.\nI was charged twice.\n"
out = subprocess.run([cli, "--no-cache", "how urgent"], input=lines, capture_output=True, text=True, timeout=180)
assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
got = out.stdout.strip().splitlines()
assert sorted(got) == sorted(lines.strip().splitlines()), got
done("jsort → " + " | ".join(got))
'''),
    # Defaults to OpenRouter's decisions route and `typesafe/jev-1.13`; the route is configurable.
    Client("jev-runner", "jev-runner==0.1.0", (3, 11),
           {"JEV_BASE_URL": "{url}", "JEV_ENDPOINT_PATH": "/v1/systemone", "JEV_API_KEY": "{key}"}, r'''
from jev_runner import ChoiceQuestion, JevRunner, JevRunRequest
result = JevRunner().run(JevRunRequest(states=[STATE], questions={"queue": ChoiceQuestion("Which queue?", QUEUE)}))
a = result.results[0].answers["queue"]
assert a.choice in QUEUE, a
done(f"choice={a.choice} confidence={a.confidence}")
'''),
    # Imported as `jev`; defaults to OpenRouter's decisions URL and `~typesafe/jev-latest`.
    Client("fuzzy-jev", "fuzzy-jev==0.6.0", (3, 10), {}, r'''
import jev
client = jev.Client(KEY, url=URL + "/v1/systemone")
reply = client.decide(STATE, {"queue": jev.Question.choice("Which queue?", QUEUE)})
a = reply.choice("queue")
assert a.choice in QUEUE, a
done(f"model={client.model} choice={a.choice} confidence={a.confidence:.4f}")
'''),
    # Reads the request id from `x-typesafe-request-id` (typesafe-sdk 0.6.x underneath), and refuses
    # probabilities whose sum is more than 1e-6 from one: three options, so that 4-decimal rounding
    # (0.3632 + 0.2826 + 0.3543 = 1.0001) would show.
    Client("jevantic", "jevantic==0.1.0a0", (3, 12),
           {"TYPESAFE_BASE_URL": "{url}", "TYPESAFE_API_KEY": "{key}"}, r'''
import asyncio
from jevantic import Jevaluator, Question
THREE = dict(QUEUE, sales="pricing, plans and upgrades")
async def main():
    async with Jevaluator() as evaluator:
        return await evaluator.evaluate(STATE, Question.choice(THREE, instructions="Which queue?"))
e = asyncio.run(main())
assert e.value.selected in THREE, e.value
assert e.info.request_id, "no x-typesafe-request-id"
done(f"selected={e.value.selected} confidence={e.value.confidence:.4f} request_id={e.info.request_id}")
'''),
    Client("jev", "jev==0.3.0", (3, 14),
           {"TYPESAFE_BASE_URL": "{url}", "TYPESAFE_API_KEY": "{key}"}, r'''
from typing import Literal
from pydantic import BaseModel, Field
import jev
class Route(BaseModel):
    queue: Literal["billing", "tech"] = Field(description="Which queue should handle this ticket?")
    refund: bool = Field(description="Does the customer want money back?")
r = jev.decide(STATE, Route)
done(f"decide → {r!r}")
'''),
]


# ------------------------------------------------------------------------------------------------
# python and venvs


def python_version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
                             capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    parts = out.stdout.split()
    return (int(parts[0]), int(parts[1])) if out.returncode == 0 and len(parts) == 2 else None


def find_python() -> str:
    """The newest CPython 3.13+ on PATH or under ~/.pyenv/versions."""
    candidates = [shutil.which(f"python3.{minor}") for minor in range(20, 12, -1)]
    pyenv = Path.home() / ".pyenv" / "versions"
    if pyenv.is_dir():
        for d in sorted(pyenv.iterdir(), reverse=True):
            m = re.fullmatch(r"3\.(\d+)\.\d+", d.name)
            if m and int(m.group(1)) >= 13:
                candidates.append(str(d / "bin" / f"python3.{m.group(1)}"))
    found = [(python_version(c), c) for c in candidates if c and Path(c).exists()]
    found = [(v, c) for v, c in found if v and v >= (3, 13)]
    if not found:
        sys.exit("no Python 3.13 or newer found (jev-cli needs it); pass --python")
    return max(found)[1]


def ensure_venv(client: Client, venvs: Path, python: str, py: tuple[int, int], install: bool) -> tuple[Path, str]:
    """The venv's interpreter and a note (empty, or how the install deviated)."""
    venv = venvs / client.name
    interpreter = venv / "bin" / "python"
    note = ""
    if py < client.requires_python:
        note = f"installed with --ignore-requires-python (declares >= {'.'.join(map(str, client.requires_python))}, run on {py[0]}.{py[1]})"
    dist = re.split(r"[\[=<>]", client.requirement)[0]
    version = client.requirement.split("==")[1]
    probe = f"import importlib.metadata as m, sys; sys.exit(0 if m.version({dist!r}) == {version!r} else 1)"
    if interpreter.exists() and subprocess.run([str(interpreter), "-c", probe], capture_output=True, timeout=60).returncode == 0:
        return interpreter, note
    if not install:
        raise RuntimeError(f"{venv} lacks {client.requirement} (run without --no-install)")
    if not interpreter.exists():
        subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
    cmd = [str(interpreter), "-m", "pip", "install", "-q", client.requirement]
    if py < client.requires_python:
        cmd.insert(4, "--ignore-requires-python")
    print(f"  installing {client.requirement} into {venv}", flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if out.returncode != 0:
        raise RuntimeError(f"pip install {client.requirement} failed:\n{out.stderr[-2000:]}")
    return interpreter, note


# ------------------------------------------------------------------------------------------------
# layad


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return 0, ""


class Layad:
    """`layad serve` on its own port and socket dir, with the fixture checkpoints and a key."""

    def __init__(self, bin_dir: Path, output: str, tmp: Path, hf_home: Path, startup_timeout: float):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        sockets = tmp / "sockets"
        sockets.mkdir(parents=True)
        toml = tmp / "layad.toml"
        toml.write_text(
            f'[compat]\noutput = "{output}"\n'
            f'[server]\nlisten = "127.0.0.1:{self.port}"\nrequest_timeout = "120s"\n'
            f'[workers]\nsocket_dir = "{sockets}"\nstartup_timeout = "3m"\n'
            '[logging]\nfilter = "info"\n'
            '[[pool]]\nname = "cpu"\ndevice = "cpu"\nworkers = 1\nthreads = 1\n'
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LAYA_", "LAYAD_", "TYPESAFE_"))}
        env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", LAYA_API_KEY=SERVER_KEY, NO_COLOR="1")
        self.log_path = tmp / "layad.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([str(bin_dir / "layad"), "serve", "--config", str(toml)],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=tmp,
                                     start_new_session=True)
        deadline = time.monotonic() + startup_timeout
        while http_get(self.url + "/readyz")[0] != 200:
            if self.proc.poll() is not None:
                raise RuntimeError(f"layad exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"layad not ready within {startup_timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.25)

    def answered(self) -> int:
        """layad's count of 200 answers on the decision routes so far."""
        status, text = http_get(self.url + "/metrics")
        if status != 200:
            return -1
        total = 0
        for line in text.splitlines():
            if line.startswith("layad_requests_total{") and 'status="200"' in line:
                total += int(float(line.rsplit(" ", 1)[1]))
        return total

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # layad and its workers
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()


# ------------------------------------------------------------------------------------------------


def run_client(client: Client, interpreter: Path, layad: Layad, timeout: float) -> tuple[bool, str, int]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LAYA_", "LAYAD_", "TYPESAFE_", "JEV_", "OPENROUTER_", "DECIDE_", "XDG_"))}
    before = layad.answered()
    started = time.monotonic()
    # A fresh directory as cwd, home of config and caches: no stray .env, stored key or cached answer.
    with tempfile.TemporaryDirectory(prefix=f"jev-client-{client.name}-") as cwd:
        env.update(LAYADDEV_URL=layad.url, LAYADDEV_KEY=SERVER_KEY, NO_COLOR="1",
                   XDG_CONFIG_HOME=cwd, XDG_CACHE_HOME=cwd)
        env.update({k: v.format(url=layad.url, key=SERVER_KEY) for k, v in client.env.items()})
        try:
            out = subprocess.run([str(interpreter), "-c", PRELUDE + client.code], capture_output=True, text=True,
                                 env=env, cwd=cwd, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False, f"no result within {timeout:.0f}s", 0
    ms = int((time.monotonic() - started) * 1000)
    calls = layad.answered() - before
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    try:
        result = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        result = {}
    if out.returncode != 0 or not result.get("ok"):
        tail = (out.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return False, f"exit {out.returncode}: {tail[:300]}", calls
    if calls < 1:
        return False, f"no 200 answer counted by layad ({result.get('detail')})", calls
    return True, f"{result.get('detail')} ({ms} ms)", calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", type=Path, help="directory with layad and layad-worker-gpu "
                    "(default: target/release if built, else target/debug)")
    ap.add_argument("--output", default="jev", help='[compat] output of the server (default "jev")')
    ap.add_argument("--venvs", type=Path, default=DEFAULT_VENVS, help=f"one venv per library under here (default {DEFAULT_VENVS})")
    ap.add_argument("--python", help="interpreter for new venvs (default: the newest python3.13+ found)")
    ap.add_argument("--only", nargs="+", metavar="LIB", help="run only these libraries")
    ap.add_argument("--no-install", action="store_true", help="fail instead of creating a missing venv")
    ap.add_argument("--timeout", type=float, default=180, help="seconds per library call (default 180)")
    ap.add_argument("--startup-timeout", type=float, default=240)
    ap.add_argument("--markdown", action="store_true", help="print the result table as Markdown too")
    ap.add_argument("--hf-home", type=Path, default=REPO / "tests" / "fixtures" / "hf-cache",
                    help="the Hugging Face cache layad serves (default: the committed fixture cache)")
    ap.add_argument("--weights-seed", type=int, metavar="N",
                    help="serve a fixture cache like the committed one with other random weights, from seed N "
                         "(made with tools/fixtures/make_fixtures.py; overrides --hf-home)")
    ap.add_argument("--fixture-python", default=os.environ.get("LAYAD_FIXTURE_PYTHON")
                    or str(REPO / "tools" / "fixtures" / ".venv" / "bin" / "python"),
                    help="Python with torch, transformers and laya for --weights-seed (default: "
                         "$LAYAD_FIXTURE_PYTHON, else tools/fixtures/.venv, which tools/fixtures/regenerate.sh makes)")
    args = ap.parse_args()

    clients = [c for c in CLIENTS if not args.only or c.name in args.only]
    unknown = set(args.only or ()) - {c.name for c in CLIENTS}
    if unknown:
        sys.exit(f"unknown libraries: {', '.join(sorted(unknown))}; known: {', '.join(c.name for c in CLIENTS)}")
    bin_dir = args.bin_dir.resolve() if args.bin_dir else next((REPO / "target" / p for p in ("release", "debug")
                                    if (REPO / "target" / p / "layad").exists()), REPO / "target" / "debug")
    python = args.python or find_python()
    py = python_version(python)
    if py is None:
        sys.exit(f"{python} does not run")
    print(f"python {py[0]}.{py[1]} ({python}); layad from {bin_dir}; output = \"{args.output}\"", flush=True)

    prepared = []
    for client in clients:
        try:
            prepared.append((client, *ensure_venv(client, args.venvs, python, py, not args.no_install)))
        except (RuntimeError, subprocess.SubprocessError, OSError) as e:
            prepared.append((client, None, str(e)))

    rows = []
    with tempfile.TemporaryDirectory(prefix="layad-jev-clients-") as tmp:
        hf_home = args.hf_home.resolve()
        if args.weights_seed is not None:
            hf_home = Path(tmp) / "hf-home"
            print(f"making a fixture cache with weights from seed {args.weights_seed} ({args.fixture_python})", flush=True)
            made = subprocess.run([args.fixture_python, str(REPO / "tools" / "fixtures" / "make_fixtures.py"),
                                   "--weights-seed", str(args.weights_seed), "--cache-out", str(hf_home)],
                                  capture_output=True, text=True, timeout=600,
                                  env=dict(os.environ, HF_HUB_OFFLINE="1", PYTHONHASHSEED="0"))
            if made.returncode != 0:
                sys.exit(f"make_fixtures.py --weights-seed failed (pass --fixture-python):\n{made.stderr[-2000:]}")
        print(f"checkpoints from {hf_home}", flush=True)
        layad = Layad(bin_dir, args.output, Path(tmp), hf_home, args.startup_timeout)
        try:
            for client, interpreter, note in prepared:
                if interpreter is None:
                    rows.append((client.name, False, f"not installed: {note}", 0, ""))
                    continue
                ok, detail, calls = run_client(client, interpreter, layad, args.timeout)
                rows.append((client.name, ok, detail, calls, note))
                print(f"{'PASS' if ok else 'FAIL':<5} {client.name:<13} {calls:>3} answered  {detail}"
                      + (f"  [{note}]" if note else ""), flush=True)
        finally:
            layad.stop()
    passed = sum(ok for _, ok, *_ in rows)
    weights = f"weights from seed {args.weights_seed}" if args.weights_seed is not None else f"checkpoints {args.hf_home}"
    print(f"\n{passed}/{len(rows)} libraries pass against layad (output = \"{args.output}\", {weights})")
    if args.markdown:
        print("\n| library | result | layad answers | what the call returned |\n|---|---|---|---|")
        for name, ok, detail, calls, note in rows:
            cell = f"{detail}{f' ({note})' if note else ''}".replace("|", "\\|").replace("\t", " ")
            print(f"| {name} | {'pass' if ok else 'FAIL'} | {calls} | {cell} |")
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
