#!/usr/bin/env python3
"""laya-cuda 0.1.1 (CuPy + cuBLAS + CUDA graphs, fp16; PyPI) behind upstream laya-serve's HTTP
surface, so tools/device/cuda-check.sh's served step can time it beside layad with the same client
(layad-http-bench) and compare its answers first. laya-cuda is a library with no server of its own.

What it serves: `POST /v1/systemone` for the one checkpoint it loads, answering as upstream 0.4.15's
body does as far as laya-cuda's output allows (see `upstream_body`), and `GET /health`. What it does
not: routing between checkpoints, language detection, `/v1/systemone/batch`, API keys, calibration;
`option_order` is refused (laya-cuda does not permute options, so its answers would be silently
wrong).

Concurrent requests share one `laya_cuda.BatchEngine` (its cross-request batching, as laya-cuda's
README recommends for concurrent callers); each HTTP connection has its own thread.

Configuration is the environment layad-http-bench gives upstream's `laya-serve` (`LAYA_HOST`,
`LAYA_PORT`, `LAYA_DEVICE`, `HF_HOME` with a `convaiinnovations/laya` snapshot), so a `laya-serve`
launcher that runs this file stands in for upstream (tools/device/cuda-check.sh makes one):

    python3 tools/device/laya_cuda_http.py              serve (needs laya_cuda, CuPy, a GPU)
    python3 tools/device/laya_cuda_http.py --self-test  the request/response translation with a
                                                        fake backend, over real HTTP (any machine)
Standard library only, apart from laya_cuda itself.
"""

import json
import math
import os
import queue
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MODEL = "laya-rl-agent"
ROUTING = {
    "model": "english",
    "repo": "convaiinnovations/laya",
    "reason": "laya-cuda wrapper: one checkpoint, no routing",
    "detection": None,
    "workflow": None,
}


class RequestError(Exception):
    """A request the wrapper refuses, with the HTTP status upstream would use for its kind."""

    def __init__(self, status, detail):
        super().__init__(detail)
        self.status = status
        self.detail = detail


def snapshot(hf_home):
    """The `convaiinnovations/laya` snapshot `refs/main` names in an HF cache (as laya-serve finds it
    offline)."""
    repo = Path(hf_home) / "hub" / "models--convaiinnovations--laya"
    revision = (repo / "refs" / "main").read_text().strip()
    return repo / "snapshots" / revision


def round4(x):
    return float(round(float(x), 4))


def legend_text(value):
    # 0.4.15 renders each score level as a string; laya-cuda hands back the criteria as sent.
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def upstream_answer(answer):
    """One laya-cuda answer in upstream 0.4.15's key order, with `answer_confidence` (the largest
    probability, clipped to [0, 1]; rounding is monotonic, so the largest rounded probability is the
    rounded largest one)."""
    kind = answer["type"]
    out = {"type": kind}
    if kind == "choice":
        probabilities = answer["probabilities"]
        out["choice"] = answer["choice"]
        out["probabilities"] = probabilities
        out["confidence"] = answer["confidence"]
        top = max(probabilities.values())
    elif kind == "score":
        probabilities = answer["probabilities"]
        out["score"] = answer["score"]
        out["legend"] = {k: legend_text(v) for k, v in answer["legend"].items()}
        out["probabilities"] = probabilities
        out["confidence"] = answer["confidence"]
        top = max(probabilities.values())
    elif kind == "noul":
        out["noul"] = answer["noul"]
        out["confidence"] = answer["confidence"]
        top = max(answer["noul"], 1.0 - answer["noul"])
    else:
        raise ValueError(f"laya-cuda answered an unknown question type {kind!r}")
    out["answer_confidence"] = round4(min(max(top, 0.0), 1.0))
    out["action"] = {"act_probability": answer["action"]["act_probability"]}
    return out


def upstream_body(result):
    """laya-cuda's `predict` result as upstream's `/v1/systemone` body: model, answers (question
    order kept), usage, routing."""
    return {
        "model": MODEL,
        "answers": {qid: upstream_answer(a) for qid, a in result["answers"].items()},
        "usage": {"input_tokens": int(result["usage"]["input_tokens"]), "output_tokens": 0},
        "routing": ROUTING,
    }


def parse_request(raw):
    """(state, questions) from a request body, or RequestError with upstream's status for the kind."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise RequestError(400, f"invalid JSON: {error}") from error
    if not isinstance(body, dict):
        raise RequestError(422, "body must be a JSON object")
    if "state" not in body or "questions" not in body:
        raise RequestError(422, "body needs state and questions")
    questions = body["questions"]
    if not isinstance(questions, dict):
        raise RequestError(422, "questions must be an object")
    for qid, definition in questions.items():
        if not isinstance(definition, dict):
            raise RequestError(422, f"question {qid!r} must be an object")
        if definition.get("option_order") is not None:
            raise RequestError(422, f"question {qid!r}: option_order is not supported by laya-cuda")
    return body["state"], questions


def answer(predict, raw):
    """(status, body) for one `/v1/systemone` request body, given laya-cuda's predict."""
    try:
        state, questions = parse_request(raw)
    except RequestError as error:
        return error.status, {"detail": error.detail}
    if not questions:
        # As upstream: no forward, no tokens, routing still present.
        return 200, {"model": MODEL, "answers": {}, "usage": {"input_tokens": 0, "output_tokens": 0}, "routing": ROUTING}
    try:
        result = predict(state, questions)
    except queue.Full:
        return 503, {"detail": "laya-cuda's pending request limit reached"}
    except (ValueError, KeyError, TypeError) as error:
        return 422, {"detail": str(error)}
    return 200, upstream_body(result)


def make_handler(predict, health):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the client reuses its connections

        def send(self, status, body):
            data = json.dumps(body, ensure_ascii=False).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self.send(200, health)
            else:
                self.send(404, {"detail": "Not Found"})

        def do_POST(self):
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            if self.path != "/v1/systemone":
                self.send(404, {"detail": "Not Found"})
                return
            try:
                status, body = answer(predict, raw)
            except Exception as error:  # the server must answer, whatever the engine raised
                status, body = 500, {"detail": f"{type(error).__name__}: {error}"}
            self.send(status, body)

        def log_message(self, *args):
            pass  # one line per request would swamp the bench's log

    return Handler


def serve(predict, health, host, port):
    server = ThreadingHTTPServer((host, port), make_handler(predict, health))
    server.daemon_threads = True
    return server


def main_serve():
    import laya_cuda  # only here: the self-test runs without it

    path = snapshot(os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")))
    device = os.environ.get("LAYA_DEVICE", "cuda")
    device = "cuda:0" if device == "cuda" else device
    engine = laya_cuda.BatchEngine(str(path), device=device)

    def predict(state, questions):
        return engine.submit(state, questions).result()

    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    health = {
        "status": "ok",
        "engine": "laya-cuda",
        "version": laya_cuda.__version__,
        "device": device,
        "gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
        "precision": "float16",
        "checkpoint": str(path),
    }
    host, port = os.environ.get("LAYA_HOST", "127.0.0.1"), int(os.environ.get("LAYA_PORT", "8000"))
    server = serve(predict, health, host, port)
    print(f"laya-cuda {laya_cuda.__version__} on {health['gpu']} serving {path} at http://{host}:{port}", file=sys.stderr)
    try:
        server.serve_forever()
    finally:
        engine.close()


def fake_predict(state, questions):
    """A stand-in with laya-cuda 0.1.1's output shape (laya_cuda/laya.py `Laya.decode`): fixed
    probabilities, one token per character of the state per question."""
    if not isinstance(state, str):
        state = json.dumps(state)
    answers = {}
    for qid, q in questions.items():
        kind = q["type"]
        if kind not in ("choice", "score", "noul"):
            raise ValueError(f"Unsupported question type: {kind}")
        base = {"type": kind, "confidence": 0.25, "action": {"act_probability": 0.75}}
        if kind == "noul":
            base.update(noul=0.3, confidence=0.7)
        elif kind == "choice":
            labels = list(q["criteria"])
            p = [0.5] + [round(0.5 / (len(labels) - 1), 4)] * (len(labels) - 1) if len(labels) > 1 else [1.0]
            base["probabilities"] = dict(zip(labels, p))
            base["choice"] = labels[0]
        else:
            levels = q["criteria"]
            base["probabilities"] = {str(i): round(1 / len(levels), 4) for i in range(len(levels))}
            base.update(score=round((len(levels) - 1) / 2, 4), legend=dict(zip(map(str, range(len(levels))), levels)))
        answers[qid] = base
    return {"model": MODEL, "answers": answers, "usage": {"input_tokens": len(state) * len(questions), "output_tokens": 0}}


def self_test():
    """The translation and the HTTP surface over a real socket, with `fake_predict`."""
    server = serve(fake_predict, {"status": "ok", "engine": "fake"}, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    failures = []

    def check(what, condition):
        if not condition:
            failures.append(what)

    def post(body):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(url + "/v1/systemone", data=data, headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    try:
        with urllib.request.urlopen(url + "/health") as response:
            check("GET /health answers status ok", json.loads(response.read()).get("status") == "ok")
        questions = {
            "z_team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "money", "tech": "bugs"}},
            "a_urgent": {"type": "noul", "instructions": "Urgent?"},
            "m_level": {"type": "score", "instructions": "How angry?", "criteria": ["calm", {"level": 2}]},
        }
        status, body = post({"state": "refund", "questions": questions})
        check("a valid request answers 200", status == 200)
        check("top-level keys in upstream's order", list(body) == ["model", "answers", "usage", "routing"])
        check("question order kept", list(body["answers"]) == ["z_team", "a_urgent", "m_level"])
        check("usage passed through", body["usage"] == {"input_tokens": 18, "output_tokens": 0})
        team, urgent, level = body["answers"]["z_team"], body["answers"]["a_urgent"], body["answers"]["m_level"]
        check("choice keys in upstream's order",
              list(team) == ["type", "choice", "probabilities", "confidence", "answer_confidence", "action"])
        check("choice answer_confidence is the top probability", team["answer_confidence"] == 0.5)
        check("noul keys in upstream's order", list(urgent) == ["type", "noul", "confidence", "answer_confidence", "action"])
        check("noul answer_confidence is max(p, 1-p)", urgent["answer_confidence"] == 0.7)
        check("score keys in upstream's order",
              list(level) == ["type", "score", "legend", "probabilities", "confidence", "answer_confidence", "action"])
        check("score legend rendered as strings", level["legend"] == {"0": "calm", "1": '{"level": 2}'})
        check("action passed through", level["action"] == {"act_probability": 0.75})
        status, body = post({"state": "x", "questions": {}})
        check("no questions: 200, no tokens", status == 200 and body["answers"] == {} and body["usage"]["input_tokens"] == 0)
        status, body = post(b"{not json")
        check("invalid JSON: 400 with detail", status == 400 and "detail" in body)
        status, body = post({"state": "x"})
        check("no questions field: 422", status == 422)
        status, body = post({"state": "x", "questions": {"q": {"type": "bogus", "instructions": "?"}}})
        check("the engine's ValueError: 422 with its text", status == 422 and "bogus" in body["detail"])
        status, body = post({"state": "x", "questions": {"q": {"type": "noul", "instructions": "?", "option_order": [1, 0]}}})
        check("option_order refused: 422", status == 422 and "option_order" in body["detail"])
        # Concurrent clients on kept-alive connections, as layad-http-bench drives it.
        results = []

        def client():
            for _ in range(5):
                results.append(post({"state": "ab", "questions": {"q": {"type": "noul", "instructions": "?"}}})[0])

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        check("40 concurrent requests all answer 200", results.count(200) == 40)
        check("round4 of a non-finite stays non-finite", math.isnan(round4(float("nan"))))
    finally:
        server.shutdown()
    for failure in failures:
        print(f"laya_cuda_http self-test FAILED: {failure}", file=sys.stderr)
    if not failures:
        print("laya_cuda_http self-test: ok (translation, errors, 40 concurrent requests)", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    if sys.argv[1:]:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main_serve()
