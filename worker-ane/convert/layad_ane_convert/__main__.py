# Command line: `check` (layout check only, exit 1 on failure) and `convert` (layout check, then
# one Core ML package + manifest per bucket, then parity.json). Run as `python -m layad_ane_convert`.
"""python -m layad_ane_convert {check,convert} --checkpoint DIR --name NAME ..."""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_GOLDENS = os.path.normpath(os.path.join(HERE, "..", "..", "..", "tests", "fixtures", "goldens", "cases.json"))


def _buckets(text: str):
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError("buckets must be comma-separated integers, e.g. 64,96,128")
    if not out or out[0] < 1:
        raise argparse.ArgumentTypeError("need at least one positive bucket length")
    return out


def _parser():
    p = argparse.ArgumentParser(prog="python -m layad_ane_convert",
                                description="Laya checkpoint -> Core ML bc1s-masked ML Programs (layad-worker-ane).")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, text in (("check", "layout check only: FP32 BC1S graph vs upstream FP32 on the golden rows"),
                       ("convert", "layout check, then convert every bucket and write manifests + parity.json")):
        s = sub.add_parser(name, help=text, description=text)
        s.add_argument("--checkpoint", required=True, help="Laya checkpoint directory (rl_agent_config.json, ...)")
        s.add_argument("--name", required=True, help="checkpoint name: english | multilingual | typed-decisions")
        s.add_argument("--goldens", default=REPO_GOLDENS, help="cases.json for the layout check (default: %(default)s)")
        s.add_argument("--buckets", type=_buckets, default=[64, 96, 128], help="comma-separated lengths (default 64,96,128)")
        s.add_argument("--json", action="store_true", help="also print the layout-check report as JSON")
        if name == "convert":
            s.add_argument("--out", required=True, help="output directory (OUT/<name>/L<bucket>/...)")
            s.add_argument("--parity-cases", default=None,
                           help="cases.json whose rows become parity.json (default: --goldens)")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from . import check, upstream

    import torch

    torch.manual_seed(0)
    agent = upstream.load_agent(args.checkpoint)
    rows = check.golden_rows(args.goldens, args.name)
    if not rows:
        print("no golden rows for checkpoint %r in %s" % (args.name, args.goldens), file=sys.stderr)
        return 1
    report = check.layout_check(agent, rows, args.buckets)
    print(check.format_report(args.name, report))
    if args.json:
        print(json.dumps(report, indent=1))
    if not report["rows"]:
        print("no golden row fits (length <= %d, <= 32 options, ids inside the vocabulary)" % max(args.buckets),
              file=sys.stderr)
    elif not report["goldens_match_checkpoint"]:
        print("the rows in %s were not recorded on these weights (upstream's own forward differs from "
              "the recorded logits by %.3g): pass --goldens recorded for this checkpoint, e.g. "
              "tests/fixtures/laya-apple/laya.json for the published english weights"
              % (args.goldens, report["max_abs_logit_diff_vs_recorded"]), file=sys.stderr)
    if not report["passed"]:
        print("layout check FAILED (gate: max |dlogit| < %g, max |dact_p| < %g); nothing converted"
              % (check.LOGIT_TOL, check.ACT_PROB_TOL), file=sys.stderr)
        return 1
    if args.cmd == "check":
        return 0

    from . import artifact

    versions = upstream.versions()
    meta = {"checkpoint": args.name, "revision": upstream.revision(args.checkpoint),
            "weights_sha256": upstream.weights_sha256(args.checkpoint)}
    for length in args.buckets:
        final, man = artifact.write_bucket(args.out, agent.model, length, meta, report["buckets"][str(length)],
                                           versions)
        print("wrote %s (tree_sha256 %s)" % (final, man["tree_sha256"]))
    path, doc = artifact.write_parity(args.out, agent, args.parity_cases or args.goldens, meta, versions)
    print("wrote %s (%d rows: %d with recorded ids, %d rebuilt with upstream's prompt builder)"
          % (path, doc["rows"], doc["rows_recorded_ids"], doc["rows_rebuilt_ids"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
