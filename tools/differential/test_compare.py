"""Self-check of the comparator rules; runs without any server:  python3 tools/differential/test_compare.py"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare as cmp  # noqa: E402
import deliberate  # noqa: E402
import requests_gen  # noqa: E402

JSON = {"content-type": "application/json"}


def R(body, status=200, headers=None):
    h = dict(JSON)
    h.update(headers or {})
    return cmp.Resp(status, h, body.encode() if isinstance(body, str) else body)


def kinds(a, b):
    return sorted({d["kind"] for d in cmp.compare(a, b)})


class CompareTest(unittest.TestCase):
    def test_identical(self):
        self.assertEqual(kinds(R('{"a":1,"b":[1,2]}'), R('{"a":1,"b":[1,2]}')), [])

    def test_key_order_matters(self):
        self.assertEqual(kinds(R('{"a":1,"b":2}'), R('{"b":2,"a":1}')), ["keys"])

    def test_nested_key_order_and_missing_key(self):
        d = cmp.compare(R('{"x":{"a":1,"b":2}}'), R('{"x":{"a":1}}'))
        self.assertEqual([(e["kind"], e["path"]) for e in d], [("keys", "x")])

    def test_number_tolerance(self):
        self.assertEqual(kinds(R('{"p":0.5000}'), R('{"p":0.50009}')), [])
        self.assertEqual(kinds(R('{"p":0.5}'), R('{"p":0.5002}')), ["number"])

    def test_jev_confidence_may_differ_as_far_as_its_probabilities_do(self):
        up = '{"answers":{"q":{"type":"score","probabilities":{"0":0.6155,"1":0.3845},"x_jev_confidence":0.231}}}'
        ld = '{"answers":{"q":{"type":"score","probabilities":{"0":0.6154,"1":0.3846},"x_jev_confidence":0.2308}}}'
        self.assertEqual(kinds(R(up), R(ld)), [])
        wrong = ld.replace("0.2308", "0.2306")  # not what layad's own probabilities give
        self.assertEqual(kinds(R(up), R(wrong)), ["number"])

    def test_int_vs_float_is_a_type_difference(self):
        self.assertEqual(kinds(R('{"choice":1}'), R('{"choice":1.0}')), ["type"])

    def test_bool_is_not_a_number(self):
        self.assertEqual(kinds(R('{"v":true}'), R('{"v":1}')), ["type"])

    def test_choice_flip_allowed_only_on_near_tie(self):
        up = '{"answers":{"q":{"type":"choice","choice":"a","probabilities":{"a":0.5001,"b":0.4999}}}}'
        ld = '{"answers":{"q":{"type":"choice","choice":"b","probabilities":{"a":0.5,"b":0.5}}}}'
        self.assertEqual(kinds(R(up), R(ld)), [])
        up2 = '{"answers":{"q":{"type":"choice","choice":"a","probabilities":{"a":0.6,"b":0.4}}}}'
        ld2 = '{"answers":{"q":{"type":"choice","choice":"b","probabilities":{"a":0.6,"b":0.4}}}}'
        self.assertEqual(kinds(R(up2), R(ld2)), ["choice"])

    def test_choice_tie_rule_with_dotted_question_id(self):
        up = '{"answers":{"q.1":{"choice":"a","probabilities":{"a":0.50005,"b":0.49995}}}}'
        ld = '{"answers":{"q.1":{"choice":"b","probabilities":{"a":0.50005,"b":0.49995}}}}'
        self.assertEqual(kinds(R(up), R(ld)), [])

    def test_detail_exact(self):
        self.assertEqual(kinds(R('{"detail":"x"}', 422), R('{"detail":"x "}', 422)), ["detail"])

    def test_status(self):
        self.assertEqual(kinds(R('{"detail":"x"}', 422), R('{"detail":"x"}', 400)), ["status"])

    def test_routing_byte_for_byte(self):
        # 0.5 and 0.50 parse equal but are different bytes: the routing block is compared raw
        up = '{"answers":{},"routing":{"model":"english","diacritic_rate":0.5}}'
        ld = '{"answers":{},"routing":{"model":"english","diacritic_rate":0.50}}'
        d = cmp.compare(R(up), R(ld))
        self.assertEqual([e["kind"] for e in d], ["routing"])
        self.assertEqual(kinds(R(up), R(up)), [])

    def test_routing_difference_reported_once(self):
        up = '{"routing":{"model":"english","reason":"a","detection":{"x":1}}}'
        ld = '{"routing":{"model":"multilingual","reason":"b","detection":{"x":2}}}'
        self.assertEqual([e["kind"] for e in cmp.compare(R(up), R(ld))], ["routing"])

    def test_top_level_spans(self):
        s = '{ "a" : [1, {"b": "}"}] , "routing":{"m":"x"} }'
        self.assertEqual(cmp.top_level_spans(s), {"a": '[1, {"b": "}"}]', "routing": '{"m":"x"}'})

    def test_non_json_bodies_byte_exact(self):
        a = cmp.Resp(500, {"content-type": "text/plain; charset=utf-8"}, b"Internal Server Error")
        b = cmp.Resp(500, {"content-type": "text/plain; charset=utf-8"}, b"Internal Server Error")
        self.assertEqual(kinds(a, b), [])
        c = cmp.Resp(500, {"content-type": "application/json"}, b'{"detail":"inference failed"}')
        self.assertEqual(kinds(a, c), ["body", "content_type"])

    def test_content_type_parameters_ignored(self):
        a = cmp.Resp(200, {"content-type": "application/json"}, b"{}")
        b = cmp.Resp(200, {"content-type": "application/json; charset=utf-8"}, b"{}")
        self.assertEqual(kinds(a, b), [])

    def test_timing_headers(self):
        up = R("{}", headers={"server-timing": "inference;dur=12.34", "x-inference-time-ms": "12.34"})
        self.assertEqual(kinds(up, R("{}")), ["header_missing"])
        ok = R("{}", headers={"server-timing": "queue;dur=0.10, inference;dur=3.00", "x-inference-time-ms": "3.00"})
        self.assertEqual(kinds(up, ok), [])
        bad = R("{}", headers={"server-timing": "inference;dur=3", "x-inference-time-ms": "3"})
        self.assertEqual(kinds(up, bad), ["header_format"])
        # layad may send them where upstream does not
        self.assertEqual(kinds(R("{}"), ok), [])

    def test_transport_error(self):
        self.assertEqual(kinds(cmp.Resp(error="timeout"), R("{}")), ["transport"])

    def test_deliberate_rule_requires_the_promised_answer(self):
        req = {"tags": ["nan_literal"]}
        up = R('{"answers":{}}')
        good = R('{"detail":"request body must be valid JSON"}', 400)
        bad = R('{"detail":"something else"}', 400)
        self.assertEqual(deliberate.explain(req, up, good)["name"], "nan_infinity_literals")
        self.assertIsNone(deliberate.explain(req, up, bad))
        self.assertIsNone(deliberate.explain({"tags": []}, up, good))


    def test_nesting_depth(self):
        self.assertEqual(deliberate.nesting_depth(b'{"a": [1, {"b": "[[[{"}]]}'), 3)
        self.assertEqual(deliberate.nesting_depth(b'{"s": "\\"[["}'), 1)
        deep = b'{"q": {}, "s": ' + b"[" * 128 + b"]" * 128 + b"}"
        self.assertEqual(deliberate.nesting_depth(deep), 129)


class RequestSetTest(unittest.TestCase):
    def test_deterministic_and_large_enough(self):
        a = requests_gen.generate(include_goldens=False)
        b = requests_gen.generate(include_goldens=False)
        self.assertEqual([(x["id"], x["body"]) for x in a], [(x["id"], x["body"]) for x in b])
        self.assertGreaterEqual(len(a), 1000)
        c = requests_gen.generate(seed=1, include_goldens=False)
        self.assertNotEqual([x["body"] for x in a], [x["body"] for x in c])


if __name__ == "__main__":
    unittest.main()
