#!/usr/bin/env python3
"""Runs TypeSafe Jev SDK (`typesafe-sdk==0.7.5`, unmodified, from PyPI) scenarios against layad.

For every profile (`[compat] upstream = "0.4.15"` and `"0.3.20"`, and `output = "jev-strict"` and
`"jev"` on 0.4.15, by default; `--profiles` takes `0.4.15`, `0.3.20`, `jev-strict`, `jev`) it starts the release
`layad serve` on a free 127.0.0.1 port with the fixture checkpoints and `LAYA_API_KEY` set, waits for
`GET /readyz` = 200, points the SDK at it the way an application would (`TYPESAFE_BASE_URL`,
`TYPESAFE_API_KEY`, `TypeSafeClient()` with its defaults), runs the scenarios and prints one line
per scenario:

    PASS      the SDK call succeeded and the typed result checks out
    EXPECTED  the SDK raised what it must raise against this profile (documented outcome, not a failure)
    FAIL      anything else

Exit status 0 only when no scenario FAILs (and every server started). See tools/sdk/README.md.

The SDK lives in a venv (default /work/venvs/typesafe). When this interpreter cannot import
typesafe_sdk 0.7.5, the script creates the venv if it is missing
(`python3 -m venv VENV && VENV/bin/pip install "typesafe-sdk[zstd]==0.7.5"`) and re-runs itself with
the venv's python. Each server run holds a shared flock on /work/cpu.lock (benchmarks take it
exclusively). Everything is bounded in time; traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

SDK_REQUIREMENT = "typesafe-sdk[zstd]==0.7.5"
SDK_VERSION = "0.7.5"
REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = "/work/venvs/typesafe"
DEFAULT_BIN_DIR = str(REPO / "target" / "release")  # `cargo build --release --bins`
DEFAULT_HF_HOME = REPO / "tests" / "fixtures" / "hf-cache"
SERVER_KEY = "layad-sdk-scenarios-key"
REEXEC_MARK = "LAYADDEV_SDK_SCENARIOS_REEXEC"


# ------------------------------------------------------------------------------------------------
# bootstrap: find or build the SDK venv, then run inside it


def sdk_importable() -> bool:
    try:
        import typesafe_sdk  # noqa: F401
        from typesafe_sdk._core.compression import COMPRESSORS
    except ImportError:
        return False
    return typesafe_sdk.__version__ == SDK_VERSION and "zstd" in COMPRESSORS


def ensure_venv(venv: Path, install: bool) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        if not install:
            sys.exit(f"no venv at {venv}; create it: python3 -m venv {venv} && {venv}/bin/pip install '{SDK_REQUIREMENT}'")
        print(f"creating {venv} (python3 -m venv; pip install '{SDK_REQUIREMENT}')", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    probe = "import typesafe_sdk, sys; from typesafe_sdk._core.compression import COMPRESSORS; " \
            f"sys.exit(0 if typesafe_sdk.__version__ == '{SDK_VERSION}' and 'zstd' in COMPRESSORS else 1)"
    if subprocess.run([str(python), "-c", probe], capture_output=True, timeout=120).returncode != 0:
        if not install:
            sys.exit(f"{venv} lacks {SDK_REQUIREMENT}; run {venv}/bin/pip install '{SDK_REQUIREMENT}'")
        print(f"installing '{SDK_REQUIREMENT}' into {venv}", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", SDK_REQUIREMENT], check=True, timeout=900)
    return python


# ------------------------------------------------------------------------------------------------
# layad


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


class SharedLock:
    """`flock -s` on a file, waiting at most `wait` seconds."""

    def __init__(self, path: str | None, wait: float):
        self.path, self.wait, self.fd = path, wait, None

    def __enter__(self):
        if not self.path:
            return self
        self.fd = os.open(self.path, os.O_RDONLY | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.wait
        announced = False
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise SystemExit(f"could not take a shared lock on {self.path} within {self.wait:.0f}s (a benchmark holds it)")
                if not announced:
                    print(f"waiting for a shared lock on {self.path} (a benchmark holds it)", flush=True)
                    announced = True
                time.sleep(1)

    def __exit__(self, *exc):
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


class Layad:
    def __init__(self, bin_dir: Path, profile: str, tmp: Path, hf_home: Path, startup_timeout: float):
        self.profile, self.tmp = profile, tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (tmp / "layad-sockets").mkdir(parents=True)
        self.hf_home = tmp / "hf-cache"
        shutil.copytree(hf_home, self.hf_home, symlinks=True)
        self.toml = tmp / "layad.toml"
        self.toml.write_text(
            f'[compat]\nupstream = "{upstream_of(profile)}"\noutput = "{output_of(profile)}"\n'
            f'[server]\nlisten = "127.0.0.1:{self.port}"\ndiagnostics = false\nrequest_timeout = "60s"\n'
            f'[workers]\nsocket_dir = "{tmp / "layad-sockets"}"\nstartup_timeout = "3m"\n'
            '[logging]\nfilter = "info"\n'
            '[[pool]]\nname = "cpu"\ndevice = "cpu"\nworkers = 1\nthreads = 1\n'
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LAYA_", "LAYAD_", "TYPESAFE_"))}
        env.update(HF_HOME=str(self.hf_home), HF_HUB_OFFLINE="1", LAYA_API_KEY=SERVER_KEY, NO_COLOR="1")
        self.log_path = tmp / "layad.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(bin_dir / "layad"), "serve", "--config", str(self.toml)],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=tmp, start_new_session=True,
        )
        deadline = time.monotonic() + startup_timeout
        while http_status(self.url + "/readyz") != 200:
            if self.proc.poll() is not None:
                raise RuntimeError(f"layad exited with {self.proc.returncode} at start-up:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"layad not ready within {startup_timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.25)

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def metrics(self) -> str:
        try:
            with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
                return r.read().decode()
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # layad and the workers it started
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()


# ------------------------------------------------------------------------------------------------
# scenarios (run inside the SDK venv)

STATE = "I was charged twice for invoice 4411, please refund it today."
QUEUE = {"billing": "payment problems", "tech": "technical issue"}
URGENCY = ["can wait", "needs attention this week", "needs attention today"]


def upstream_of(profile: str) -> str:
    """The `[compat] upstream` of a profile name: `0.4.15`/`0.3.20` themselves, else 0.4.15."""
    return profile if profile in ("0.4.15", "0.3.20") else "0.4.15"


def output_of(profile: str) -> str:
    """The `[compat] output` of a profile name: `jev-strict`/`jev` themselves, else `laya`."""
    return profile if profile in ("jev-strict", "jev") else "laya"


class Expected(Exception):
    """The scenario ended the way the SDK must end against this profile (not a failure)."""


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def is_prob(x) -> bool:
    return isinstance(x, float) and 0.0 <= x <= 1.0


class WireLog(logging.Handler):
    """Collects the SDK's own debug record of each request it puts on the wire ("->")."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.sent: list[dict] = []

    def emit(self, record):
        if isinstance(record.args, dict) and record.args.get("arrow") == "->":
            headers = {k.lower(): v for k, v in record.args["headers"].items()}
            self.sent.append({"headers": headers, "body": record.args.get("body")})


def sdk_error(fn, cls):
    """Runs `fn`; returns the SDK error of class `cls` it raised, else fails."""
    try:
        result = fn()
    except cls as e:
        return e
    raise AssertionError(f"expected {cls.__name__}, got a result: {result!r}"[:300])


def scenarios(ts, profile: str):
    """[(name, what it checks, fn)] where fn(client) returns a note or raises Expected(note)."""
    new = profile != "0.3.20"  # 0.4.x contract
    jev = output_of(profile) == "jev"  # the Jev wire contract: optional instructions, 422 detail[]

    def detail_shown(e) -> bool:
        """The server's message is in the SDK's error text (a string `detail`, or Jev's list)."""
        detail = e.body["detail"]
        if isinstance(detail, list):
            return all(d["msg"] in str(e) for d in detail)
        return detail in str(e)

    def choice(c):
        r = c.system_one(state=STATE, questions={"queue": ts.Choice(instructions="Which queue?", criteria=QUEUE)})
        a = r.choices["queue"]
        check(isinstance(r.model, str) and isinstance(r.usage.input_tokens, int), "model str, usage ints")
        check(a.choice in QUEUE and set(a.probabilities) == set(QUEUE), f"choice {a.choice!r} among labels")
        check(is_prob(a.confidence) and all(is_prob(p) for p in a.probabilities.values()), "confidence/probabilities in [0,1]")
        return f"choice={a.choice!r} confidence={a.confidence} model={r.model!r} input_tokens={r.usage.input_tokens}"

    def score(c):
        r = c.system_one(state=STATE, questions={"urgency": ts.Score(instructions="How urgent is this?", criteria=URGENCY)})
        a = r.scores["urgency"]
        check(0 <= a.score <= len(URGENCY) - 1, f"score {a.score} in range")
        check(a.legend == dict(enumerate(URGENCY)), f"legend {a.legend}")
        check(set(a.probabilities) == {0, 1, 2} and is_prob(a.confidence), "int-keyed probabilities, confidence")
        return f"score={a.score} legend keys={sorted(a.legend)}"

    def noul(c):
        r = c.system_one(state=STATE, questions={"billing": ts.Noul(instructions="Is this about billing?")})
        a = r.nouls["billing"]
        check(is_prob(float(a.noul)), f"noul {a.noul}")
        return f"noul={a.noul}"

    def several(c):
        qs = {
            "billing": ts.Noul(instructions="Is this about billing?", criteria={"true": "money matters", "false": "anything else"}),
            "queue": ts.Choice(instructions="Which queue?", criteria={"billing": None, "tech": None, "sales": "buying more"}),
            "urgency": ts.Score(instructions="How urgent?", criteria=URGENCY),
            "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
        }
        r = c.system_one(state={"subject": "Duplicate charge", "message": STATE}, questions=qs)
        check(list(r.answers) == list(qs), f"answers {list(r.answers)}")
        check(set(r.nouls) == {"billing", "refund"} and set(r.choices) == {"queue"} and set(r.scores) == {"urgency"}, "types")
        return f"{len(r.answers)} answers: " + ", ".join(f"{k}:{v.type}" for k, v in r.answers.items())

    def zstd_body(c):
        from typesafe_sdk._core.compression import MIN_COMPRESSED_BODY_LENGTH
        check(c._config.compression == "zstd", f"SDK compression setting {c._config.compression!r}")
        long_state = " ".join([STATE] * 30)  # ~1.9 KB of JSON
        wire = WireLog()
        log = logging.getLogger("typesafe_sdk")
        level = log.level
        log.addHandler(wire)
        log.setLevel(logging.DEBUG)
        try:
            r = c.system_one(state=long_state, questions={"queue": ts.Choice(instructions="Which queue?", criteria=QUEUE)})
        finally:
            log.removeHandler(wire)
            log.setLevel(level)
        check(len(json.dumps(long_state)) >= MIN_COMPRESSED_BODY_LENGTH, "body >= 1 KiB")
        check(len(wire.sent) == 1, f"one request on the wire, saw {len(wire.sent)}")
        sent = wire.sent[0]
        check(sent["headers"].get("content-encoding") == "zstd", f"Content-Encoding {sent['headers'].get('content-encoding')!r}")
        body = json.loads(sent["body"])  # the SDK logs the body before compressing it
        check(body["model"] == "jev-latest" and "instructions" in body["questions"]["queue"], "model jev-latest")
        check(r.choices["queue"].choice in QUEUE, "answered")
        return (f"sent Content-Encoding: zstd, model {body['model']!r} ({len(sent['body'])} B of JSON), "
                f"choice={r.choices['queue'].choice!r}")

    def models(c):
        m = c.models.list()
        names = [x.name for x in m.models]
        check({"english", "multilingual", "typed-decisions", "jev-latest"} <= set(names), f"names {names}")
        return f"{len(names)} models incl. jev-latest, english, multilingual, typed-decisions"

    def wrong_key(c):
        bad = ts.TypeSafeClient(api_key="not-the-key")
        try:
            e = sdk_error(lambda: bad.system_one(state=STATE, questions={"b": ts.Noul(instructions="Billing?")}),
                          ts.TypeSafeAuthenticationError)
            e2 = sdk_error(bad.models.list, ts.TypeSafeAuthenticationError)
        finally:
            bad.close()
        check(e.status == 401 and e2.status == 401, "401")
        check("bearer" in str(e), f"message {e}")
        return f"TypeSafeAuthenticationError: {e}"

    def null_level(c):
        q = {"urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", None]}}
        if new:
            e = sdk_error(lambda: c.system_one(state=STATE, questions=q), ts.TypeSafeUnprocessableEntityError)
            check(e.status == 422 and "null level" in str(e) and detail_shown(e), f"message {e}")
            return f"TypeSafeUnprocessableEntityError: {e}"
        # 0.3.20 accepts a null level and echoes it in `legend`; the SDK's legend values must be
        # string/object/array, so it refuses the 200.
        e = sdk_error(lambda: c.system_one(state=STATE, questions=q), ts.TypeSafeAPIResponseValidationError)
        check(e.status == 200 and e.field_path.startswith("answers.urgency.legend"), f"{e.field_path}")
        raise Expected(f"200 with legend null -> TypeSafeAPIResponseValidationError at {e.field_path!r} (0.3.20 contract)")

    def empty_instructions(c):
        q = {"queue": ts.Choice(instructions="", criteria=QUEUE)}
        if jev:  # Jev's instructions are optional
            r = c.system_one(state=STATE, questions=q)
            check(r.choices["queue"].choice in QUEUE, "answered")
            return f"jev accepts instructions=\"\": choice={r.choices['queue'].choice!r}"
        if new:
            e = sdk_error(lambda: c.system_one(state=STATE, questions=q), ts.TypeSafeUnprocessableEntityError)
            check("must not be empty" in str(e) and detail_shown(e), f"message {e}")
            return f"TypeSafeUnprocessableEntityError: {e}"
        r = c.system_one(state=STATE, questions=q)  # 0.3.20 does not check the value of instructions
        check(r.choices["queue"].choice in QUEUE, "answered")
        return f"0.3.20 accepts instructions=\"\": choice={r.choices['queue'].choice!r}"

    def noul_bad_criteria(c):
        q = {"billing": {"type": "noul", "instructions": "Billing?", "criteria": {"yes": "money", "no": "other"}}}
        e = sdk_error(lambda: c.system_one(state=STATE, questions=q), ts.TypeSafeUnprocessableEntityError)
        check("keyed only 'true'/'false'" in str(e) and detail_shown(e), f"message {e}")
        return f"TypeSafeUnprocessableEntityError: {str(e)[:110]}..."

    def numeric_labels(c):
        q = {"pick": {"type": "choice", "instructions": "Which one?", "criteria": [1, 2]}}
        if jev:  # Jev's option names are strings: the choice is its probabilities key
            r = c.system_one(state=STATE, questions=q)
            check(r.choices["pick"].choice in {"1", "2"}, f"choice {r.choices['pick'].choice!r}")
            return f"list labels [1, 2] -> choice={r.choices['pick'].choice!r} (a string)"
        if new:
            # upstream 0.4.15 answers "choice": 1 (a number); the SDK's ChoiceAnswer.choice is a str.
            e = sdk_error(lambda: c.system_one(state=STATE, questions=q), ts.TypeSafeAPIResponseValidationError)
            check(e.status == 200 and e.field_path == "answers.pick.choice", e.field_path)
            check(isinstance(e.body["answers"]["pick"]["choice"], int), "numeric choice on the wire")
            raise Expected(f"200 with choice={e.body['answers']['pick']['choice']!r} -> "
                           f"TypeSafeAPIResponseValidationError at {e.field_path!r}")
        # upstream 0.3.20 answers 500 (the SDK would retry it twice); layad answers 422 (deliberate).
        e = sdk_error(lambda: c.system_one(state=STATE, questions=q), ts.TypeSafeUnprocessableEntityError)
        check("must be strings" in str(e), f"message {e}")
        raise Expected(f"TypeSafeUnprocessableEntityError: {e}")

    def numeric_string_keys(c):
        r = c.system_one(state=STATE, questions={"pick": ts.Choice(instructions="Which one?", criteria={"1": "one", "2": "two"})})
        check(r.choices["pick"].choice in {"1", "2"}, "string choice")
        return f"dict labels '1','2' -> choice={r.choices['pick'].choice!r} (a string)"

    def numeric_levels(c):
        q = {"size": {"type": "score", "instructions": "How big?", "criteria": [1, 2, 3]}}
        if new:
            r = c.system_one(state=STATE, questions=q)
            check(r.scores["size"].legend == {0: "1", 1: "2", 2: "3"}, f"legend {r.scores['size'].legend}")
            return f"legend stringified {r.scores['size'].legend}"
        e = sdk_error(lambda: c.system_one(state=STATE, questions=q), ts.TypeSafeAPIResponseValidationError)
        check(e.field_path.startswith("answers.size.legend"), e.field_path)
        raise Expected(f"200 with legend {e.body['answers']['size']['legend']} -> "
                       f"TypeSafeAPIResponseValidationError at {e.field_path!r} (0.3.20 echoes raw levels)")

    def no_instructions(c):
        notes = []
        if jev:  # Jev's instructions are optional: answered
            for qid, q in (("billing", ts.Noul(criteria={"true": "The customer wants money back"})),
                           ("queue", ts.Choice(criteria=QUEUE))):
                r = c.system_one(state=STATE, questions={qid: q})
                check(list(r.answers) == [qid], f"answers {list(r.answers)}")
                notes.append(f"{type(q).__name__} answered")
            return ", ".join(notes) + " without instructions"
        for qid, q in (("billing", ts.Noul(criteria={"true": "The customer wants money back"})),
                       ("queue", ts.Choice(criteria=QUEUE))):
            e = sdk_error(lambda: c.system_one(state=STATE, questions={qid: q}), ts.TypeSafeUnprocessableEntityError)
            check(e.status == 422 and "no 'instructions'" in str(e), f"message {e}")
            notes.append(type(q).__name__)
        raise Expected(f"{'/'.join(notes)} without instructions -> TypeSafeUnprocessableEntityError: {e}")

    return [
        ("choice", choice), ("score", score), ("noul", noul), ("several", several), ("zstd-body", zstd_body),
        ("models", models), ("wrong-key", wrong_key), ("score-null-level", null_level),
        ("empty-instructions", empty_instructions), ("noul-bad-criteria", noul_bad_criteria),
        ("numeric-labels", numeric_labels), ("numeric-string-keys", numeric_string_keys),
        ("score-numeric-levels", numeric_levels), ("no-instructions", no_instructions),
    ]


def run_scenarios(url: str, key: str, profile: str, only: set[str] | None) -> list[dict]:
    import typesafe_sdk as ts

    os.environ["TYPESAFE_BASE_URL"] = url  # how an unmodified program is pointed at layad
    os.environ["TYPESAFE_API_KEY"] = key
    os.environ.pop("TYPESAFE_DEFAULT_MODEL", None)
    rows = []
    with ts.TypeSafeClient() as client:
        for name, fn in scenarios(ts, profile):
            if only and name not in only:
                continue
            t0 = time.monotonic()
            try:
                outcome, note = "PASS", fn(client)
            except Expected as e:
                outcome, note = "EXPECTED", str(e)
            except Exception as e:  # noqa: BLE001 - every other outcome is a failure, reported
                outcome, note = "FAIL", f"{type(e).__name__}: {e}"
            ms = (time.monotonic() - t0) * 1000
            rows.append({"profile": profile, "scenario": name, "outcome": outcome, "note": note, "ms": round(ms)})
            print(f"[{profile}] {outcome:<8} {name:<21} {note}"[:400], flush=True)
    return rows


# ------------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", default="0.4.15,0.3.20,jev-strict,jev",
                    help="comma list of [compat] upstream values, or jev-strict / jev (output profiles on 0.4.15)")
    ap.add_argument("--bin-dir", default=DEFAULT_BIN_DIR, help="where the release layad binaries are")
    ap.add_argument("--hf-home", default=str(DEFAULT_HF_HOME), help="checkpoints (copied to the temp dir)")
    ap.add_argument("--venv", default=DEFAULT_VENV, help="the SDK venv (created when missing)")
    ap.add_argument("--no-install", action="store_true", help="never create the venv or pip install")
    ap.add_argument("--lock", default="/work/cpu.lock", help="file to flock shared around each server run ('' = none)")
    ap.add_argument("--lock-wait", type=float, default=1200, help="seconds to wait for the lock")
    ap.add_argument("--startup-timeout", type=float, default=180)
    ap.add_argument("--max-seconds", type=float, default=1800, help="whole run, lock waits included (SIGALRM)")
    ap.add_argument("--only", default="", help="comma list of scenario names")
    ap.add_argument("--url", help="use a running layad (127.0.0.1) instead; needs --profiles with one value")
    ap.add_argument("--key", default=SERVER_KEY, help="bearer key with --url")
    ap.add_argument("--report", help="write the rows as JSON here")
    ap.add_argument("--keep-tmp", action="store_true")
    args = ap.parse_args()

    if not sdk_importable():
        if os.environ.get(REEXEC_MARK):
            sys.exit("typesafe_sdk 0.7.5 with zstd still not importable in the venv")
        python = ensure_venv(Path(args.venv), not args.no_install)
        os.environ[REEXEC_MARK] = "1"
        os.execv(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:]])

    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError(f"run exceeded {args.max_seconds:.0f}s")))
    signal.alarm(int(args.max_seconds))
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    only = {s for s in args.only.split(",") if s} or None
    import typesafe_sdk

    print(f"typesafe-sdk {typesafe_sdk.__version__} ({sys.executable}); layad {args.bin_dir}; profiles {profiles}", flush=True)
    rows, broken = [], []
    if args.url:
        if not args.url.startswith(("http://127.0.0.1:", "http://localhost:")) or len(profiles) != 1:
            sys.exit("--url must be a 127.0.0.1 URL and --profiles a single value")
        rows += run_scenarios(args.url, args.key, profiles[0], only)
    for profile in [] if args.url else profiles:
        tmp = Path(tempfile.mkdtemp(prefix=f"layad-sdk-{profile}-"))
        try:
            with SharedLock(args.lock, args.lock_wait):
                server = None
                try:
                    server = Layad(Path(args.bin_dir), profile, tmp, Path(args.hf_home), args.startup_timeout)
                    rows += run_scenarios(server.url, SERVER_KEY, profile, only)
                    m = [l for l in server.metrics().splitlines() if l.startswith("layad_requests_total")]
                    print(f"[{profile}] layad /metrics: " + "; ".join(x.split("{", 1)[1] for x in m), flush=True)
                except Exception as e:  # noqa: BLE001
                    broken.append(profile)
                    print(f"[{profile}] SERVER   {type(e).__name__}: {e}", flush=True)
                finally:
                    if server is not None:
                        server.stop()
        finally:
            if args.keep_tmp:
                print(f"[{profile}] kept {tmp}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)

    print("\nsummary")
    for profile in profiles:
        mine = [r for r in rows if r["profile"] == profile]
        counts = {k: sum(r["outcome"] == k for r in mine) for k in ("PASS", "EXPECTED", "FAIL")}
        state = "server did not start" if profile in broken else ", ".join(f"{v} {k}" for k, v in counts.items())
        print(f"  {profile}: {len(mine)} scenarios: {state}")
    if args.report:
        Path(args.report).write_text(json.dumps(rows, indent=2) + "\n")
    failed = broken or any(r["outcome"] == "FAIL" for r in rows)
    print("result:", "FAIL" if failed else "OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
