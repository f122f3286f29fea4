"""Comparison rules of the differential checker (stdlib only; unit-tested by test_compare.py).

`compare(up, ld)` takes two responses (`Resp`: status, headers with lower-case names, body bytes,
error) and returns a list of differences, each `{"kind", "path", "upstream", "layad"}`.

Rules:
* same status; same content-type (media type, parameters ignored); for JSON bodies (parsed with
  key order kept) the same keys in the same order at every level, the same value types, strings and
  bools equal, numbers within `NUM_TOL` (1e-4) -- an int and a float are different types;
* `answers.<qid>.choice` may differ only where upstream's two largest `probabilities` are within
  `TIE_TOL` (2e-4);
* `detail` is compared exactly (kind `detail`);
* the top-level `routing` value is compared as raw bytes of the response (kind `routing`); a batch
  result's `routing` (`results[i].routing`) is compared by value like the rest;
* non-JSON bodies are compared byte for byte (kind `body`);
* where upstream sends `Server-Timing` / `X-Inference-Time-Ms`, layad must send them too
  (`header_missing`) in upstream's format (`header_format`: `inference;dur=<ms>` among the
  Server-Timing metrics, X-Inference-Time-Ms `<digits>.<2 digits>`).
"""
import json
import re

NUM_TOL = 1e-4
TIE_TOL = 2e-4
TIMING_HEADERS = ("server-timing", "x-inference-time-ms")
_X_INFER = re.compile(r"^[0-9]+\.[0-9]{2}$")
_ST_INFER = re.compile(r"(^|,)\s*inference;dur=[0-9]+\.[0-9]{2}\s*(,|;|$)")


class Resp:
    def __init__(self, status=None, headers=None, body=b"", error=None):
        self.status = status
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        self.body = body
        self.error = error

    def to_json(self, limit=4000):
        text = self.body.decode("utf-8", "replace")
        return {"status": self.status, "error": self.error,
                "headers": {k: v for k, v in self.headers.items()
                            if k in TIMING_HEADERS + ("content-type",)},
                "body": text if len(text) <= limit else text[:limit] + "...(%d chars)" % len(text)}


class Obj(list):
    """A JSON object as its (key, value) pairs, in document order."""

    def keylist(self):
        return [k for k, _ in self]

    def get(self, key, default=None):
        for k, v in reversed(self):
            if k == key:
                return v
        return default


def parse_json(data):
    """Parsed JSON with key order kept (objects become `Obj`), or raises ValueError."""
    if isinstance(data, bytes):
        data = data.decode("utf-8")
    return json.loads(data, object_pairs_hook=Obj)


def media_type(ct):
    return (ct or "").split(";")[0].strip().lower() or None


def top_level_spans(text):
    """{key: raw text of its value} for a top-level JSON object, taken from the document itself."""
    dec = json.JSONDecoder()
    i, n, out = 0, len(text), {}

    def ws(j):
        while j < n and text[j] in " \t\r\n":
            j += 1
        return j

    i = ws(i)
    if i >= n or text[i] != "{":
        return out
    i = ws(i + 1)
    if i < n and text[i] == "}":
        return out
    while i < n:
        key, i = dec.raw_decode(text, i)
        i = ws(i)
        if text[i] != ":":
            return out
        i = ws(i + 1)
        start = i
        _, i = dec.raw_decode(text, i)
        out[key] = text[start:i]
        i = ws(i)
        if i < n and text[i] == ",":
            i = ws(i + 1)
            continue
        break
    return out


def _kind_of(v):
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "string"
    if v is None:
        return "null"
    if isinstance(v, Obj):
        return "object"
    return "array"


def _short(v, limit=300):
    try:
        s = json.dumps(_plain(v), ensure_ascii=False)
    except (TypeError, ValueError):
        s = repr(v)
    return s if len(s) <= limit else s[:limit] + "..."


def _plain(v):
    if isinstance(v, Obj):
        return {k: _plain(x) for k, x in v}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _top_two_close(answer):
    probs = answer.get("probabilities") if isinstance(answer, Obj) else None
    if not isinstance(probs, Obj):
        return False
    vals = sorted((v for _, v in probs if isinstance(v, (int, float)) and not isinstance(v, bool)), reverse=True)
    return len(vals) >= 2 and vals[0] - vals[1] <= TIE_TOL


def _jev(answer):
    """`x_jev_confidence` from an answer's own rounded probabilities (TypeSafe's formula, spec §5.5)."""
    probs = answer.get("probabilities") if isinstance(answer, Obj) else None
    if not isinstance(probs, Obj):
        return None
    p = [v for _, v in probs]
    n = len(p)
    if n == 1:
        return 1.0
    total = sum(p)
    p = [v / total for v in p] if total else [1.0 / n] * n
    if answer.get("type") == "choice":
        return round((max(p) - 1.0 / n) / (1.0 - 1.0 / n), 4)
    mode = max(range(n), key=p.__getitem__)
    spread = sum(v * abs(i - mode) for i, v in enumerate(p))
    uniform = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return round(max(0.0, 1.0 - spread / uniform), 4)


def _jev_follows_probabilities(a, b, answer, theirs):
    """Whether two `x_jev_confidence` values differ only because the probabilities they are computed
    from do (each side's value is the formula of its own probabilities, which are compared on
    their own): the formula amplifies a 1e-4 rounding step by up to n."""
    return answer is not None and theirs is not None and _jev(answer) == a and _jev(theirs) == b


def diff_values(a, b, path, out, answer=None, theirs=None):
    """Append the differences between upstream value `a` and layad value `b` at `path`."""
    ka, kb = _kind_of(a), _kind_of(b)
    if path.endswith(".choice") and answer is not None and a != b and _top_two_close(answer):
        return  # an exact tie region: either label is upstream-compatible
    if path.endswith(".x_jev_confidence") and a != b and _jev_follows_probabilities(a, b, answer, theirs):
        return
    if ka != kb:
        out.append({"kind": "type", "path": path, "upstream": _short(a), "layad": _short(b)})
        return
    if ka == "object":
        keys_a, keys_b = a.keylist(), b.keylist()
        if keys_a != keys_b:
            out.append({"kind": "keys", "path": path or "$", "upstream": keys_a, "layad": keys_b})
        bmap = dict(list(b))
        for k, v in a:
            if k in bmap:
                sub = path + "." + k if path else k
                if path == "answers" or path.endswith(".answers"):  # a batch's results[i].answers too
                    diff_values(v, bmap[k], sub, out, v, bmap[k])
                else:
                    diff_values(v, bmap[k], sub, out, answer, theirs)
    elif ka == "array":
        if len(a) != len(b):
            out.append({"kind": "length", "path": path, "upstream": _short(a), "layad": _short(b)})
        for i, (x, y) in enumerate(zip(a, b)):
            diff_values(x, y, "%s[%d]" % (path, i), out, answer, theirs)
    elif ka in ("int", "float"):
        # + 1e-9: values rounded to 4 decimals one unit apart (0.2704 / 0.2705) are within 1e-4
        if a != b and not abs(a - b) <= NUM_TOL + 1e-9:
            kind = "choice" if path.endswith(".choice") else "number"
            out.append({"kind": kind, "path": path, "upstream": a, "layad": b})
    elif a != b:
        kind = "choice" if path.endswith(".choice") else ("detail" if path == "detail" else "value")
        out.append({"kind": kind, "path": path, "upstream": _short(a), "layad": _short(b)})


def compare(up, ld):
    out = []
    if up.error or ld.error:
        if (up.error is None) != (ld.error is None) or up.error != ld.error:
            out.append({"kind": "transport", "path": "", "upstream": up.error, "layad": ld.error})
        return out
    if up.status != ld.status:
        out.append({"kind": "status", "path": "", "upstream": up.status, "layad": ld.status})
    mt_a, mt_b = media_type(up.headers.get("content-type")), media_type(ld.headers.get("content-type"))
    if mt_a != mt_b:
        out.append({"kind": "content_type", "path": "", "upstream": mt_a, "layad": mt_b})
    for name in TIMING_HEADERS:
        if name in up.headers:
            if name not in ld.headers:
                out.append({"kind": "header_missing", "path": name, "upstream": up.headers[name], "layad": None})
            else:
                v = ld.headers[name]
                ok = _X_INFER.match(v) if name == "x-inference-time-ms" else _ST_INFER.search(v)
                if not ok:
                    out.append({"kind": "header_format", "path": name, "upstream": up.headers[name], "layad": v})
    try:
        ja = parse_json(up.body)
    except (ValueError, UnicodeDecodeError):
        ja = None
    try:
        jb = parse_json(ld.body)
    except (ValueError, UnicodeDecodeError):
        jb = None
    if ja is None or jb is None:
        if up.body != ld.body:
            out.append({"kind": "body", "path": "", "upstream": up.body[:300].decode("utf-8", "replace"),
                        "layad": ld.body[:300].decode("utf-8", "replace")})
        return out
    body_diffs = []
    diff_values(ja, jb, "", body_diffs)
    # routing: raw bytes, reported once (its value-level differences are folded into it)
    if isinstance(ja, Obj) and isinstance(jb, Obj):
        ra = top_level_spans(up.body.decode("utf-8")).get("routing")
        rb = top_level_spans(ld.body.decode("utf-8")).get("routing")
        if ra != rb and not (ra is None and rb is None):
            body_diffs = [d for d in body_diffs if not d["path"].startswith("routing")]
            body_diffs.append({"kind": "routing", "path": "routing", "upstream": ra, "layad": rb})
    out.extend(body_diffs)
    return out
