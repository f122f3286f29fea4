#!/usr/bin/env python3
"""Differential checker: send one deterministic request set to upstream laya-serve and to layad,
compare the answers, report what differs.

  python3 tools/differential/run.py --upstream-venv /work/venvs/laya-0.4.15 --layad-bin-dir target/release
  python3 tools/differential/run.py --upstream-url http://127.0.0.1:8000 --layad-url http://127.0.0.1:8642

Exit status 0 only when nothing differs (deliberate differences excepted). See README.md.
"""
import argparse
import collections
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare as cmp  # noqa: E402
import deliberate  # noqa: E402
import requests_gen  # noqa: E402

REPO = requests_gen.REPO
FIXTURE_CACHE = os.path.join(REPO, "tests", "fixtures", "hf-cache")
CLEAN_ENV_DROP = ("LAYA_API_KEY", "LAYA_MODELS", "LAYA_AUTO_TASK", "LAYA_CPU_AMP", "LAYA_PRELOAD", "LAYA_HOST",
                  "LAYA_PORT", "LAYA_DEVICE", "LAYA_THREADS", "LAYA_DEFAULT_MODEL", "LAYA_MAX_LOADED",
                  "LAYA_EXTRA_MODELS", "LAYA_JEV_STRICT", "LAYA_TOURNAMENT_GROUP", "LAYA_MAX_TOKEN_BUDGET",
                  "LAYA_MAX_BATCH_TOKENS", "LAYA_MAX_CONCURRENT", "LAYA_IDLE_UNLOAD_SECONDS", "LAYA_LOG_LEVEL",
                  "LAYA_ROOT_PATH", "LAYA_BODY_READ_TIMEOUT", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV_DROP and not k.startswith("LAYAD_")}
    env.update(extra)
    return env


class Client:
    """Sequential HTTP/1.1 client for one 127.0.0.1 server, reconnecting after errors."""

    def __init__(self, url, timeout):
        u = urllib.parse.urlsplit(url)
        if u.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit("refusing non-loopback URL %s (the checker only talks to 127.0.0.1)" % url)
        self.host, self.port, self.timeout = u.hostname, u.port or 80, timeout
        self.conn = None

    def _conn(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return self.conn

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def send(self, method, path, body=b"", headers=None):
        hdrs = {"content-type": "application/json"}
        hdrs.update(headers or {})
        for attempt in (0, 1):
            conn = self._conn()
            try:
                try:
                    conn.request(method, path, body=body if (body or method in ("POST", "PUT")) else None,
                                 headers=hdrs)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the server answered before reading the whole body (413): read that answer
                resp = conn.getresponse()
                data = resp.read()
                headers_out = {k.lower(): v for k, v in resp.getheaders()}
                if resp.getheader("connection", "").lower() == "close":
                    self.close()
                return cmp.Resp(resp.status, headers_out, data)
            except (http.client.HTTPException, OSError) as e:
                self.close()
                if attempt == 1 or isinstance(e, socket.timeout):
                    return cmp.Resp(error="%s: %s" % (type(e).__name__, e))
        return cmp.Resp(error="unreachable")


def wait_ready(url, path, proc, timeout, logfile):
    deadline = time.time() + timeout
    c = Client(url, 5)
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        r = c.send("GET", path)
        c.close()
        if r.status == 200:
            return True
        time.sleep(0.5)
    log("timed out waiting for %s%s (log: %s)" % (url, path, logfile))
    return False


def tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def upstream_version(venv):
    out = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                          "from importlib.metadata import version; print(version('laya'))"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def extra_models(tmp, cache):
    """LAYA_EXTRA_MODELS for `--extra`, for a side whose HF_HOME is `cache`: a local directory (a copy
    of the fixture english checkpoint, made once) and `[repo, subfolder]` of a Hub repo id that this
    side's cache holds (a copy of the fixture bundle under another id)."""
    local = os.path.join(tmp, "extra-" + requests_gen.EXTRA_DIR_NAME)
    if not os.path.exists(local):
        snaps = os.path.join(FIXTURE_CACHE, "hub", "models--convaiinnovations--laya", "snapshots")
        snap = os.path.join(snaps, sorted(os.listdir(snaps))[0])
        os.makedirs(local)
        for part in ("rl_agent_config.json", "model.safetensors", "encoder", "tokenizer"):
            src = os.path.join(snap, part)
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(local, part))
            else:
                shutil.copy(src, os.path.join(local, part))
    repo_dir = os.path.join(cache, "hub", "models--" + requests_gen.EXTRA_REPO_ID.replace("/", "--"))
    if not os.path.exists(repo_dir):
        shutil.copytree(os.path.join(cache, "hub", "models--convaiinnovations--laya"), repo_dir, symlinks=True)
    return json.dumps({"Mine": local, "Bundle.ML": [requests_gen.EXTRA_REPO_ID, "multilingual"]})


def start_upstream(venv, tmp, name, strict=False, tournament=0, extra=False):
    cache = os.path.join(tmp, name + "-hf-home")
    shutil.copytree(FIXTURE_CACHE, cache, symlinks=True)
    port = free_port()
    logfile = os.path.join(tmp, name + ".log")
    env = clean_env(HF_HOME=cache, HF_HUB_OFFLINE="1", LAYA_DEVICE="cpu", LAYA_THREADS="1",
                    LAYA_HOST="127.0.0.1", LAYA_PORT=str(port), LAYA_LOG_LEVEL="warning",
                    OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                    TRANSFORMERS_VERBOSITY="error", PYTHONHASHSEED="0")
    if strict:
        env["LAYA_JEV_STRICT"] = "1"
    if tournament:
        env["LAYA_TOURNAMENT_GROUP"] = str(tournament)
    if extra:
        env["LAYA_EXTRA_MODELS"] = extra_models(tmp, cache)
    proc = subprocess.Popen([os.path.join(venv, "bin", "laya-serve")], env=env, stdout=open(logfile, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = "http://127.0.0.1:%d" % port
    if not wait_ready(url, "/health", proc, 300, logfile):
        stop(proc)
        raise SystemExit("upstream %s did not start:\n%s" % (venv, tail(logfile)))
    return proc, url


def layad_toml(port, socket_dir, compat, with_compat_key, strict=False, tournament=0):
    lines = []
    if with_compat_key or strict or tournament:
        lines += ["[compat]"]
        if with_compat_key:
            lines += ['upstream = "%s"' % compat]
        if strict:
            lines += ['output = "jev-strict"']
        if tournament:
            lines += ["tournament_group = %d" % tournament]
        lines += [""]
    lines += ["[server]", 'listen = "127.0.0.1:%d"' % port, "diagnostics = false", 'request_timeout = "300s"', "",
              "[workers]", 'socket_dir = "%s"' % socket_dir, 'startup_timeout = "5m"', "",
              "[logging]", 'filter = "warn"', "",
              "[[pool]]", 'name = "cpu"', 'device = "cpu"', "workers = 1", "threads = 1", ""]
    return "\n".join(lines)


def start_layad(bin_dir, tmp, compat, with_compat_key, strict=False, tournament=0, extra=False):
    cache = os.path.join(tmp, "layad-hf-home")
    if not os.path.exists(cache):
        shutil.copytree(FIXTURE_CACHE, cache, symlinks=True)
    sock = os.path.join(tmp, "layad-sockets")
    os.makedirs(sock, mode=0o700, exist_ok=True)
    port = free_port()
    cfg = os.path.join(tmp, "layad.toml")
    with open(cfg, "w") as f:
        f.write(layad_toml(port, sock, compat, with_compat_key, strict, tournament))
    logfile = os.path.join(tmp, "layad.log")
    env = clean_env(HF_HOME=cache, HF_HUB_OFFLINE="1")
    if extra:
        # The same variable as upstream's: layad reads LAYA_EXTRA_MODELS in upstream's syntax.
        env["LAYA_EXTRA_MODELS"] = extra_models(tmp, cache)
    proc = subprocess.Popen([os.path.join(bin_dir, "layad"), "serve", "--config", cfg], env=env,
                            stdout=open(logfile, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = "http://127.0.0.1:%d" % port
    ok = wait_ready(url, "/readyz", proc, 600, logfile)
    if not ok:
        stop(proc)
        return None, url, tail(logfile)
    return proc, url, None


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def body_for_report(body, limit=3000):
    text = body.decode("utf-8", "replace")
    if len(text) > limit:
        return {"text": text[:limit] + "...", "bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    return {"text": text, "bytes": len(body)}


def kinds_of(diffs):
    return sorted({d["kind"] for d in diffs})


def primary_kind(diffs):
    order = ["transport", "status", "detail", "body", "content_type", "routing", "keys", "type", "length",
             "choice", "number", "value", "header_missing", "header_format"]
    ks = kinds_of(diffs)
    return min(ks, key=lambda k: order.index(k) if k in order else 99)


def run(args):
    reqs = requests_gen.generate(args.seed, include_goldens=not args.no_goldens, include_batch=not args.no_batch,
                                 include_tournament=not args.no_tournament, include_extra=args.extra)
    if args.categories:
        want = set(args.categories.split(","))
        reqs = [r for r in reqs if r["category"] in want]
    if args.limit:
        reqs = reqs[: args.limit]
    tmp = tempfile.mkdtemp(prefix="laya-diff-")
    procs = []
    notes = []
    try:
        if args.upstream_url:
            up_url, up_version = args.upstream_url, args.upstream_version or "?"
        else:
            up_version = upstream_version(args.upstream_venv)
            log("starting upstream laya %s from %s" % (up_version, args.upstream_venv))
            p, up_url = start_upstream(args.upstream_venv, tmp, "upstream", args.strict, args.tournament, args.extra)
            procs.append(p)
        compat = args.compat or (up_version if up_version != "?" else "0.4.15")
        if args.layad_url:
            ld_url, ld_what = args.layad_url, "url " + args.layad_url
        elif args.layad_venv:
            log("starting upstream laya %s from %s as the 'layad' side" % (upstream_version(args.layad_venv),
                                                                          args.layad_venv))
            p, ld_url = start_upstream(args.layad_venv, tmp, "other-upstream", args.strict, args.tournament,
                                       args.extra)
            procs.append(p)
            ld_what = "upstream laya %s (%s)" % (upstream_version(args.layad_venv), args.layad_venv)
        else:
            with_key = not args.no_compat_key
            log("starting layad from %s (compat %s%s)" % (args.layad_bin_dir, compat,
                                                         "" if with_key else ", no [compat] key"))
            p, ld_url, err = start_layad(args.layad_bin_dir, tmp, compat, with_key, args.strict, args.tournament,
                                         args.extra)
            if p is None and with_key and "compat" in (err or ""):
                notes.append("layad refused the [compat] key; rerun without it (it then behaves as built)")
                log(notes[-1] + ":\n" + err)
                p, ld_url, err = start_layad(args.layad_bin_dir, tmp, compat, False)
                with_key = False
            if p is None:
                raise SystemExit("layad did not start:\n%s" % err)
            procs.append(p)
            ld_what = "layad %s (compat key %s)" % (args.layad_bin_dir, "upstream = %r" % compat if with_key else "absent")
        up, ld = Client(up_url, args.timeout), Client(ld_url, args.timeout)
        results = []
        t0 = time.time()
        for i, req in enumerate(reqs):
            ra = up.send(req["method"], req["path"], req["body"], req["headers"])
            rb = ld.send(req["method"], req["path"], req["body"], req["headers"])
            diffs = cmp.compare(ra, rb)
            results.append((req, ra, rb, diffs))
            if (i + 1) % 100 == 0:
                log("  %d/%d sent (%.0fs)" % (i + 1, len(reqs), time.time() - t0))
            if args.max_seconds and time.time() - t0 > args.max_seconds:
                notes.append("stopped after %d of %d requests (--max-seconds %d)" % (i + 1, len(reqs), args.max_seconds))
                log(notes[-1])
                break
        up.close()
        ld.close()
    finally:
        for p in procs:
            stop(p)
        if args.keep_tmp:
            log("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return summarize(args, results, up_url if args.upstream_url else "upstream laya %s (%s)" % (up_version, args.upstream_venv),
                     ld_what, notes, len(reqs))


def signature(d):
    """A difference without its request-specific parts, for grouping: question ids become `*`,
    array indices `[]`, and a `keys` difference names the keys only one side has."""
    import re

    path = re.sub(r"^answers\.[^.]*", "answers.*", d["path"])
    path = re.sub(r"\[[0-9]+\]", "[]", path)
    path = re.sub(r"\.(probabilities|legend)\..*$", r".\1.*", path)
    if d["kind"] == "keys":
        a, b = d["upstream"], d["layad"]
        extra = [k for k in b if k not in a]
        missing = [k for k in a if k not in b]
        what = ("+%s" % ",".join(extra) if extra else "") + (" -%s" % ",".join(missing) if missing else "")
        return "keys %s %s" % (path, what.strip() or "(order)")
    if d["kind"] == "status":
        return "status %s -> %s" % (d["upstream"], d["layad"])
    if d["kind"] == "detail":
        return "detail"
    if d["kind"] == "routing":
        return "routing"
    return "%s %s" % (d["kind"], path)


def summarize(args, results, up_what, ld_what, notes, planned):
    by_cat = collections.OrderedDict()
    by_kind = collections.Counter()
    by_primary = collections.Counter()
    by_detail = collections.Counter()
    by_signature = collections.Counter()
    failures, delib = [], []
    for req, ra, rb, diffs in results:
        c = by_cat.setdefault(req["category"], {"total": 0, "same": 0, "differ": 0, "deliberate": 0})
        c["total"] += 1
        if not diffs:
            c["same"] += 1
            continue
        rule = None if args.no_deliberate else deliberate.explain(req, ra, rb)
        entry = {"id": req["id"], "category": req["category"], "method": req["method"], "path": req["path"],
                 "headers": req["headers"], "body": body_for_report(req["body"]), "diffs": diffs,
                 "upstream": ra.to_json(), "layad": rb.to_json()}
        if rule is not None:
            c["deliberate"] += 1
            entry["rule"] = {"name": rule["name"], "readme_row": rule["readme_row"]}
            delib.append(entry)
            continue
        c["differ"] += 1
        for k in kinds_of(diffs):
            by_kind[k] += 1
        by_primary[primary_kind(diffs)] += 1
        for sig in sorted({signature(d) for d in diffs}):
            by_signature[sig] += 1
        for d in diffs:
            if d["kind"] in ("detail", "status") and ra.status is not None:
                key = "%s %s -> %s" % (d["kind"], d["upstream"] if d["kind"] == "status" else ra.status,
                                      d["layad"] if d["kind"] == "status" else rb.status)
                by_detail[key] += 1
        failures.append(entry)
    report = {
        "upstream": up_what, "layad": ld_what, "seed": args.seed, "planned": planned, "sent": len(results),
        "notes": notes,
        "counts": {"same": sum(c["same"] for c in by_cat.values()),
                   "differ": len(failures), "deliberate": len(delib)},
        "by_category": by_cat, "by_kind": dict(by_kind.most_common()),
        "by_primary_kind": dict(by_primary.most_common()), "status_pairs": dict(by_detail.most_common()),
        "by_signature": dict(by_signature.most_common()),
        "deliberate_rules": collections.Counter(e["rule"]["name"] for e in delib),
        "differences": failures, "deliberate": delib,
    }
    if args.report:
        with open(args.report, "w", encoding="utf-8") as f:
            json.dump(report, f, ensure_ascii=False, indent=1)
            f.write("\n")
    p = print
    p("upstream: %s" % up_what)
    p("layad:    %s" % ld_what)
    for n in notes:
        p("note: " + n)
    p("requests: %d sent; same %d, differ %d, deliberate %d" % (len(results), report["counts"]["same"],
                                                               len(failures), len(delib)))
    p("\n%-18s %6s %6s %6s %6s" % ("category", "total", "same", "differ", "delib"))
    for cat, c in by_cat.items():
        p("%-18s %6d %6d %6d %6d" % (cat, c["total"], c["same"], c["differ"], c["deliberate"]))
    if by_kind:
        p("\nrequests by difference kind (a request may count under several): %s" % json.dumps(dict(by_kind.most_common())))
        p("requests by first difference kind: %s" % json.dumps(dict(by_primary.most_common())))
    if by_detail:
        p("status pairs (upstream -> layad): %s" % json.dumps(dict(by_detail.most_common(15))))
    if by_signature:
        p("\nmost common differences (requests):")
        for sig, n in by_signature.most_common(args.signatures):
            p("  %5d  %s" % (n, sig[:150]))
    if delib:
        p("deliberate: %s" % json.dumps(dict(report["deliberate_rules"])))
    for e in failures[: args.show]:
        p("\n--- %s  [%s]" % (e["id"], ", ".join(kinds_of(e["diffs"]))))
        p("body:     %s" % e["body"]["text"][:600])
        for d in e["diffs"][:6]:
            p("  %-14s %-40s upstream=%s layad=%s" % (d["kind"], d["path"][:40], str(d["upstream"])[:200],
                                                      str(d["layad"])[:200]))
        p("upstream: %s %s" % (e["upstream"]["status"], (e["upstream"]["body"] or "")[:600]))
        p("layad:    %s %s" % (e["layad"]["status"], (e["layad"]["body"] or "")[:600]))
    if args.report:
        p("\nreport: %s" % args.report)
    return 0 if not failures else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    side_a = ap.add_mutually_exclusive_group(required=True)
    side_a.add_argument("--upstream-venv", help="venv with laya[serve] installed; its laya-serve is started")
    side_a.add_argument("--upstream-url", help="an already running upstream laya-serve (127.0.0.1 only)")
    ap.add_argument("--upstream-version", help="with --upstream-url: the version it runs (sets the compat key)")
    side_b = ap.add_mutually_exclusive_group(required=True)
    side_b.add_argument("--layad-bin-dir", help="directory holding layad and its workers; layad serve is started")
    side_b.add_argument("--layad-url", help="an already running layad (or, for self-tests, another upstream)")
    side_b.add_argument("--layad-venv", help="self-test: start a second upstream from this venv as the 'layad' side")
    ap.add_argument("--compat", help='value of [compat] upstream in the generated TOML (default: upstream version)')
    ap.add_argument("--no-compat-key", action="store_true", help="leave the [compat] section out of the TOML")
    ap.add_argument("--no-deliberate", action="store_true",
                    help="count every difference (implied by --layad-venv: upstream-vs-upstream self-test)")
    ap.add_argument("--seed", type=int, default=requests_gen.DEFAULT_SEED)
    ap.add_argument("--no-goldens", action="store_true", help="only the generated families, not the golden bodies")
    ap.add_argument("--no-batch", action="store_true", help="leave out the /v1/systemone/batch requests")
    ap.add_argument("--tournament", type=int, default=0, metavar="N",
                    help="both sides answer wide choices by elimination in groups of N: upstream "
                         "LAYA_TOURNAMENT_GROUP=N, layad [compat] tournament_group = N")
    ap.add_argument("--no-tournament", action="store_true", help="leave out the tournament requests")
    ap.add_argument("--extra", action="store_true",
                    help="both sides serve two extra checkpoints through LAYA_EXTRA_MODELS (a local directory and a "
                         "[repo, subfolder] from the HF cache), and the requests naming them are sent")
    ap.add_argument("--strict", action="store_true",
                    help="both sides in the strict Jev projection: upstream LAYA_JEV_STRICT=1, layad output = jev-strict")
    ap.add_argument("--categories", help="comma list of categories to send")
    ap.add_argument("--limit", type=int, help="send only the first N requests")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per request (default 120)")
    ap.add_argument("--max-seconds", type=int, default=3600, help="stop sending after this long (default 3600)")
    ap.add_argument("--show", type=int, default=15, help="print the first N differences (default 15)")
    ap.add_argument("--signatures", type=int, default=25, help="print the N most common difference signatures")
    ap.add_argument("--report", default="differential-report.json", help="JSON report path ('' = none)")
    ap.add_argument("--keep-tmp", action="store_true")
    args = ap.parse_args(argv)
    if args.layad_venv:
        args.no_deliberate = True
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
