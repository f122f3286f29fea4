"""Deliberate differences: layad answers differently from upstream on purpose.

Each rule names the row of the table "Deliberate differences from upstream" in the repository's
README.md (the `input` cell) it implements. A request whose differences a rule explains is reported
under `deliberate` and not counted as a failure. A rule matches only when layad gives exactly the
answer the README promises, so a wrong answer on the same input is still a failure.
"""
import json

INVALID_JSON = "request body must be valid JSON"


def _detail(resp):
    try:
        d = json.loads(resp.body)
    except (ValueError, UnicodeDecodeError):
        return None
    return d.get("detail") if isinstance(d, dict) else None


def _questions(req):
    try:
        body = json.loads(req.get("body") or b"null")
    except (ValueError, UnicodeDecodeError, RecursionError):
        return []
    qs = body.get("questions") if isinstance(body, dict) else None
    return list(qs.values()) if isinstance(qs, dict) else []


def _has_non_string_list_labels(req):
    return any(isinstance(q, dict) and q.get("type") == "choice" and isinstance(q.get("criteria"), list)
               and not all(isinstance(x, str) for x in q["criteria"]) for q in _questions(req))


def _json_key(label):
    """The text json.dumps writes for a dict key (str as is, True -> "true", 1.0 -> "1.0")."""
    return label if isinstance(label, str) else json.dumps(label)


def _has_colliding_label_keys(req):
    """A list-form choice whose labels are distinct Python keys but one JSON key (`[0, "0"]`)."""
    for q in _questions(req):
        crit = q.get("criteria") if isinstance(q, dict) and q.get("type") == "choice" else None
        if isinstance(crit, list) and all(isinstance(x, (str, int, float)) for x in crit):
            keys = [_json_key(x) for x in crit]
            if len(set(keys)) < len(keys):
                return True
    return False


def _has_container_type(req):
    return any(isinstance(q, dict) and isinstance(q.get("type"), (list, dict)) for q in _questions(req))


def nesting_depth(data):
    """Deepest array/object nesting of a JSON text (the top-level object counts as 1)."""
    depth = best = 0
    in_str = esc = False
    for ch in data.decode("utf-8", "replace") if isinstance(data, bytes) else data:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


def _refused_as_invalid_json(req, up, ld):
    return ld.status == 400 and _detail(ld) == INVALID_JSON


RULES = [
    {
        "name": "nan_infinity_literals",
        "readme_row": "`NaN`, `Infinity`, lone `\\udXXX` escapes (0.3.20), nesting of 128 levels or more",
        "applies": lambda req, up, ld: "nan_literal" in req["tags"] and _refused_as_invalid_json(req, up, ld),
    },
    {
        "name": "lone_surrogate_escapes",
        "readme_row": "`NaN`, `Infinity`, lone `\\udXXX` escapes (0.3.20), nesting of 128 levels or more",
        "applies": lambda req, up, ld: "lone_surrogate" in req["tags"] and _refused_as_invalid_json(req, up, ld),
    },
    {
        "name": "nesting_of_128_or_more",
        "readme_row": "`NaN`, `Infinity`, lone `\\udXXX` escapes (0.3.20), nesting of 128 levels or more",
        "applies": lambda req, up, ld: (nesting_depth(req.get("body") or b"") >= 128
                                        and _refused_as_invalid_json(req, up, ld)),
    },
    {
        "name": "labels_with_one_json_key",
        "readme_row": "list-form choice labels that JSON writes as one key (`[0, \"0\"]`)",
        "applies": lambda req, up, ld: (_has_colliding_label_keys(req) and up.status == 200
                                        and ld.status == 422 and "same answer key" in (_detail(ld) or "")),
    },
    {
        "name": "non_string_list_labels",
        "readme_row": "list-form choice labels that are not strings (`[\"a\", 1]`, `null`, objects)",
        "applies": lambda req, up, ld: (_has_non_string_list_labels(req) and up.status == 500
                                        and ld.status == 422 and "label" in (_detail(ld) or "")),
    },
    {
        "name": "list_or_object_question_type",
        "readme_row": "a list or object as a question `type`",
        "applies": lambda req, up, ld: (_has_container_type(req) and up.status == 500
                                        and ld.status == 422 and (_detail(ld) or "").find("unknown type") >= 0),
    },
    {
        "name": "content_encoding_decoded",
        "readme_row": "`Content-Encoding: zstd`, `gzip`, `deflate` (the Jev SDK sends zstd)",
        "applies": lambda req, up, ld: ("content_encoding" in req["tags"] and up.status == 400
                                        and ld.status != 400),
    },
]


def explain(req, up, ld):
    """The rule that explains this request's differences, or None."""
    for rule in RULES:
        if rule["applies"](req, up, ld):
            return rule
    return None
