# The layout check: FP32 BC1S graph + Python host vs upstream's FP32 forward (and the recorded
# golden logits) on every golden row of one checkpoint, per bucket; gate max |Δlogit| < 1e-3.
"""Layout check (laya-apple §2.3 item 5), run before any conversion."""
import json

import numpy as np

from . import bc1s, host, upstream

LOGIT_TOL = 1e-3
ACT_PROB_TOL = 1e-3


LAYA_APPLE_MODELS = {"laya": "english", "laya-multilingual": "multilingual",
                     "laya-typed-decisions": "typed-decisions"}


def golden_cases(goldens_path: str, name: str):
    """The recorded cases of checkpoint `name`, normalised to {name, state, questions, rows}, rows
    = [{ids, markers, qtype, logits, action_logits}]. Reads layad's tests/fixtures/goldens/cases.json
    (`cases[].checkpoint`, `rows`, request in `body`) and laya-apple's per-model goldens
    (tests/fixtures/laya-apple/<model>.json: top-level `model`, `cases[].items` + `logits` +
    `action_logits`, request in `state`/`questions`; recorded on the real published checkpoints)."""
    with open(goldens_path, encoding="utf-8") as f:
        doc = json.load(f)
    out = []
    if "model" in doc:   # laya-apple layout: one file per model
        if LAYA_APPLE_MODELS.get(doc["model"], doc["model"]) != name:
            return []
        for c in doc["cases"]:
            rows = [dict(it, logits=lg, action_logits=al)
                    for it, lg, al in zip(c["items"], c["logits"], c["action_logits"])]
            out.append({"name": c.get("name"), "state": c.get("state"), "questions": c.get("questions"),
                        "rows": rows})
        return out
    for c in doc["cases"]:
        if c.get("checkpoint") != name or not c.get("rows"):
            continue
        try:
            body = json.loads(c["body"])
            state, questions = body["state"], body["questions"]
        except (ValueError, KeyError, TypeError):
            state = questions = None
        out.append({"name": c.get("name"), "state": state, "questions": questions, "rows": c["rows"]})
    return out


def golden_rows(goldens_path: str, name: str):
    """Every forward row recorded for checkpoint `name`, in file order."""
    return [r for c in golden_cases(goldens_path, name) for r in c["rows"]]


def _maxdiff(a, b) -> float:
    """max |a - b| in float64; inf when the shapes differ (goldens from another checkpoint)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max()) if a.shape == b.shape and a.size else float("inf")


def _softmax(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def layout_check(agent, rows, buckets):
    """Runs each row on every bucket that holds it. Returns a report dict with overall and
    per-bucket maxima; `passed` is the gate."""
    model = agent.model
    vocab = model.encoder.embeddings.tok_embeddings.weight.shape[0]
    top = max(buckets)
    per_bucket = {b: {"rows": 0, "skipped_rows": 0, "max_abs_logit_diff": 0.0,
                      "max_abs_act_probability_diff": 0.0} for b in buckets}
    total = {"rows": 0, "skipped_rows": 0, "max_abs_logit_diff": 0.0, "max_abs_act_probability_diff": 0.0,
             "max_abs_logit_diff_vs_recorded": 0.0, "max_abs_act_probability_diff_vs_recorded": 0.0}
    modules = {b: bc1s.build(model, b) for b in buckets}
    fits = []
    for row in rows:
        ok = (len(row["ids"]) <= top and len(row["markers"]) <= bc1s.MAX_OPTIONS
              and max(row["ids"]) < vocab)
        total["rows" if ok else "skipped_rows"] += 1
        if ok:
            fits.append(row)
        for b in buckets:
            if not ok or len(row["ids"]) > b:
                per_bucket[b]["skipped_rows"] += 1
    for row in fits:
        ref_logits, _, ref_p = upstream.forward_row(agent, row["ids"], row["markers"], row["qtype"])
        # upstream's single-row forward vs the batched run recorded in the goldens
        total["max_abs_logit_diff_vs_recorded"] = max(total["max_abs_logit_diff_vs_recorded"],
                                                      _maxdiff(ref_logits, row["logits"]))
        total["max_abs_act_probability_diff_vs_recorded"] = max(
            total["max_abs_act_probability_diff_vs_recorded"], _maxdiff(ref_p, _softmax(row["action_logits"])))
        for b in buckets:
            if len(row["ids"]) > b:
                continue
            lg, p = host.run_row(modules[b], model, row["ids"], row["markers"], row["qtype"])
            # against upstream's forward on this row and against the logits recorded in the goldens
            dl = max(_maxdiff(lg, ref_logits), _maxdiff(lg, row["logits"]))
            dp = _maxdiff(p, ref_p)
            if not (np.isfinite(dl) and np.isfinite(dp)):
                dl = dp = float("inf")
            pb = per_bucket[b]
            pb["rows"] += 1
            for key, val in (("max_abs_logit_diff", dl), ("max_abs_act_probability_diff", dp)):
                pb[key] = max(pb[key], val)
                total[key] = max(total[key], val)
    # The goldens must have been recorded on these weights, or the comparison means nothing.
    total["goldens_match_checkpoint"] = bool(total["rows"] > 0
                                             and total["max_abs_logit_diff_vs_recorded"] < LOGIT_TOL)
    total["passed"] = bool(total["goldens_match_checkpoint"] and total["max_abs_logit_diff"] < LOGIT_TOL
                           and total["max_abs_act_probability_diff"] < ACT_PROB_TOL)
    total["buckets"] = {str(b): per_bucket[b] for b in buckets}
    return total


def format_report(name: str, rep) -> str:
    lines = ["layout check %s: %s  rows=%d skipped_rows=%d  max|dlogit|=%.3g  max|dact_p|=%.3g  "
             "(upstream single-row vs recorded goldens: max|dlogit|=%.3g max|dact_p|=%.3g)"
             % (name, "PASS" if rep["passed"] else "FAIL", rep["rows"], rep["skipped_rows"],
                rep["max_abs_logit_diff"], rep["max_abs_act_probability_diff"],
                rep["max_abs_logit_diff_vs_recorded"], rep["max_abs_act_probability_diff_vs_recorded"])]
    for b, pb in rep["buckets"].items():
        lines.append("  L%s: rows=%d skipped_rows=%d max|dlogit|=%.3g max|dact_p|=%.3g"
                     % (b, pb["rows"], pb["skipped_rows"], pb["max_abs_logit_diff"],
                        pb["max_abs_act_probability_diff"]))
    return "\n".join(lines)
