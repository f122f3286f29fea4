#!/usr/bin/env python3
"""Tests of tools/bench/report's refusal and --check logic, on small raw files written here.

    python3 tools/bench/test_report.py      # .ci/run runs it beside `report --check`

Standard library only.
"""

import copy
import importlib.machinery
import importlib.util
import io
import json
import os
import shutil
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
_loader = importlib.machinery.SourceFileLoader("bench_report", os.path.join(HERE, "report"))
_spec = importlib.util.spec_from_loader("bench_report", _loader)
report = importlib.util.module_from_spec(_spec)
_loader.exec_module(report)

ENVIRONMENT = {
    "cpu_model": "Test CPU", "cpu_vendor": "GenuineIntel", "cpu_family": 6, "cpu_model_number": 143,
    "cpu_stepping": "8", "flags": ["avx2", "fma", "avx512f", "amx_int8"], "logical_cpus": 2, "memory_gib": 8.0,
    "kernel": "6.1", "hypervisor": True, "threads": 2, "layad_commit": "0123456789abcdef0123456789abcdef01234567",
    "layad_dirty": False, "rustc": "rustc 1.90.0",
    "peers": {"upstream": {"laya": "0.4.15", "torch": "2.7.0"}, "edgejev": {"edgejev": "0.3.2", "onnxruntime": "1.31.1"}},
    "checkpoint": {"path": "/ck", "sha256": "d0686e352e121e2422352867e0a3f9f38b2c83452fd5875ad45bed7c05044ffe"},
    "suite_command": "tools/bench/suite --quick", "quick": True,
}


def served(dtype, peer, amp=None):
    """A served step as layad-http-bench writes it, two shapes and one client level."""
    latency = [
        {"shape": shape, "label": f"1 question, {tokens} tokens", "input_tokens": tokens,
         "layad_ms": [ms, ms * 1.1], "peer_ms": [2 * ms, 2 * ms], "ratios": [0.5, 0.55],
         "layad_p50_ms": ms, "layad_p90_ms": ms * 1.1, "peer_p50_ms": 2 * ms, "peer_p90_ms": 2 * ms, "median_ratio": 0.525}
        for shape, tokens, ms in (("short", 66, 70.0), ("long", 512, 480.0))
    ]
    throughput = [{"clients": c, "layad_answers_per_s": 10.0 * c, "peer_answers_per_s": 5.0 * c, "ratio": 2.0,
                   "layad_errors": 0, "peer_errors": 0,
                   "layad_runs": [{"answers": 30 * c, "seconds": 3.0, "errors": 0}, {"answers": 30 * c, "seconds": 3.0, "errors": 0}],
                   "peer_runs": [{"answers": 15 * c, "seconds": 3.0, "errors": 0}, {"answers": 16 * c, "seconds": 3.0, "errors": 0}]}
                  for c in (1, 8)]
    parity = [{"shape": "short", "input_tokens": 66, "probabilities": [
        {"server": "layad", "against": "upstream", "max_abs_probability_diff": 0.001, "hard_mismatches": 0},
        {"server": "edgejev", "against": "upstream", "max_abs_probability_diff": 0.004, "hard_mismatches": 0}]}]
    return {"machine": {"cpu": "Test CPU", "flags": ["avx2"]}, "layad": {"dtype": dtype},
            "upstream": {"amp": amp}, "peer": peer, "answer_parity": parity, "latency": latency,
            "throughput": throughput, "resident_memory": {"layad": {"peak_rss_mib": 900.0}, "upstream": {"peak_rss_mib": 2000.0}}}


def step(name, data):
    return {"suite_step": name, "started_utc": "2026-12-05T03:00:00+00:00", "wall_s": 1.0,
            "load_before": [1.0, 1.0, 1.0], "load_after": [2.0, 2.0, 2.0],
            "environment": copy.deepcopy(ENVIRONMENT), "data": data}


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="report-test-")
        os.makedirs(os.path.join(self.root, "docs"))
        with open(os.path.join(self.root, "README.md"), "w") as f:
            f.write(f"# x\n\n{report.README_BEGIN}\nold\n{report.README_END}\n\nrest\n")
        with open(os.path.join(self.root, "docs", "benchmarks.md"), "w") as f:
            f.write(f"# B\n\n{report.RESULTS_BEGIN}\n{report.RESULTS_END}\n")
        self.run_dir = os.path.join(self.root, "benchmarks", "test-cpu-amx", "2026-12-05-0123456-quick")
        os.makedirs(self.run_dir)
        self.write("served-f32", step("served-f32", served("f32", "upstream")))
        self.write("served-int8-edgejev", step("served-int8-edgejev", served("int8", "edgejev int8")))
        self.write("startup", step("startup", {"runs": [
            {"server": "layad f32", "round": 1, "first_answer_s": 4.0},
            {"server": "upstream f32", "round": 1, "health_s": 9.0, "first_answer_s": 10.0}]}))
        run = {"label": "short 1x1 + general 1x1, spill", "seed": 1, "arrivals": "bursty", "rate": 12.0,
               "classes": [{"class": "short-1q", "p50_ms": 40.0, "p99_ms": 250.0}], "overall": {"p99_ms": 900.0, "errors": 0, "spill_share": 0.25}}
        self.write("scheduling", step("scheduling", {"load_fraction": 0.7, "capacity": {"capacity_rps": 17.1},
                                                     "checkpoint": {"sha256": "ab" * 32},
                                                     "runs": [{"config": "spill", "result": run}]}))

    def tearDown(self):
        shutil.rmtree(self.root)

    def write(self, name, doc):
        with open(os.path.join(self.run_dir, f"{name}.json"), "w") as f:
            json.dump(doc, f)

    def main(self, *argv):
        err = io.StringIO()
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            code = report.main(["--root", self.root, *argv])
        return code, err.getvalue()

    def test_check_fails_before_rendering_and_passes_after(self):
        self.assertEqual(self.main("--check")[0], 1)
        self.assertEqual(self.main()[0], 0)
        self.assertEqual(self.main("--check"), (0, ""))
        with open(os.path.join(self.root, "README.md")) as f:
            readme = f.read()
        self.assertIn("int8 answered a 66-token question in 0.53×", readme)
        self.assertIn("max |Δp| against upstream's f32 answers: 0.0010, edgejev's 0.0040", readme)
        self.assertIn("with 2.00× its answers/s at 8 clients", readme)
        self.assertTrue(readme.endswith("\n\nrest\n"), "text outside the markers is kept")
        self.assertIn("started to its first answer in 4.0 s (f32) against upstream's 10.0 s", readme)
        with open(os.path.join(self.root, "docs", "benchmarks.md")) as f:
            page = f.read()
        self.assertIn("| short 1x1 + general 1x1, spill | 1 | bursty | 12.00 | 40.0 | 250 | 900 | 25% | 0 |", page)
        self.assertIn("70% of the closed-loop capacity measured first (17.10 req/s)", page)
        self.assertTrue(os.path.exists(os.path.join(self.root, "docs", "benchmarks", "test-cpu-amx-latency.svg")))

    def test_check_fails_when_a_committed_figure_is_edited(self):
        self.main()
        path = os.path.join(self.root, "docs", "benchmarks.md")
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(text.replace("**0.53** (0.50–0.55)", "**0.45** (0.50–0.55)", 1))
        code, err = self.main("--check")
        self.assertEqual(code, 1)
        self.assertIn("docs/benchmarks.md", err)

    def test_check_fails_when_a_raw_file_changes(self):
        self.main()
        doc = step("served-f32", served("f32", "upstream"))
        doc["data"]["latency"][0]["median_ratio"] = 0.9
        self.write("served-f32", doc)
        code, err = self.main("--check")
        self.assertEqual(code, 1)
        self.assertIn("README.md", err)

    def test_refuses_a_raw_file_without_its_environment(self):
        doc = step("served-f32", served("f32", "upstream"))
        del doc["environment"]
        self.write("served-f32", doc)
        code, err = self.main("--check")
        self.assertEqual(code, 2)
        self.assertIn("served-f32.json: no environment", err)

    def test_refuses_an_environment_without_a_field_a_figure_needs(self):
        for field in ("flags", "layad_commit", "peers", "cpu_family"):
            doc = step("served-f32", served("f32", "upstream"))
            doc["environment"][field] = [] if field == "flags" else None
            self.write("served-f32", doc)
            code, err = self.main()
            self.assertEqual(code, 2, field)
            self.assertIn(f"environment lacks {field}", err)

    def test_refuses_a_file_whose_cpu_disagrees_with_the_tools_record(self):
        doc = step("served-f32", served("f32", "upstream"))
        doc["data"]["machine"]["cpu"] = "Other CPU"
        self.write("served-f32", doc)
        code, err = self.main("--check")
        self.assertEqual(code, 2)
        self.assertIn("the tool recorded CPU 'Other CPU'", err)

    def test_refuses_a_run_mixing_commits(self):
        doc = step("served-f32", served("f32", "upstream"))
        doc["environment"]["layad_commit"] = "f" * 40
        self.write("served-f32", doc)
        code, err = self.main("--check")
        self.assertEqual(code, 2)
        self.assertIn("several commits", err)

    def test_refuses_a_json_that_is_not_a_suite_step(self):
        self.write("notes", {"cpu": "Test CPU"})
        self.assertEqual(self.main("--check")[0], 2)


if __name__ == "__main__":
    unittest.main()
