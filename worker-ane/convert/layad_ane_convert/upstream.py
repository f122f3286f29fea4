# Upstream laya[serve]==0.3.20 as the FP32 reference: offline loading of a checkpoint directory,
# its revision and weights hash, upstream's own forward on one row, and rows rebuilt from requests.
"""Offline access to upstream laya (same environment as tools/fixtures/make_fixtures.py)."""
import hashlib
import os
import re

# HF_HUB_OFFLINE=1, no LAYA_CPU_AMP etc. are set by the package __init__ before any import here.
_HEX40 = re.compile(r"^[0-9a-f]{40}$")


def load_agent(checkpoint_dir: str):
    """upstream `laya.load(dir, device="cpu")`: FP32 on the CPU, eval mode, no Hub access."""
    import laya

    path = os.path.abspath(checkpoint_dir)
    if not os.path.isfile(os.path.join(path, "model.safetensors")):
        raise SystemExit("not a Laya checkpoint directory (no model.safetensors): %s" % path)
    agent = laya.load(path, device="cpu")
    agent.model.float().eval()
    return agent


def revision(checkpoint_dir: str):
    """The 40-hex snapshot commit when the directory is `.../snapshots/<rev>[/sub]`, else None."""
    for p in (os.path.abspath(checkpoint_dir), os.path.realpath(checkpoint_dir)):
        parts = p.split(os.sep)
        for i in range(len(parts) - 1):
            if parts[i] == "snapshots" and _HEX40.match(parts[i + 1]) and len(parts) - i - 2 <= 1:
                return parts[i + 1]
    return None


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def weights_sha256(checkpoint_dir: str) -> str:
    return sha256_file(os.path.join(checkpoint_dir, "model.safetensors"))


def forward_row(agent, ids, markers, qtype: int):
    """Upstream DecisionModel.forward on one row (batch of 1), FP32.
    Returns (logits[k] float32, act_logits float32, act_probabilities float32) numpy arrays."""
    import torch
    from laya.common import collate_items

    b = collate_items([[{"ids": list(ids), "markers": list(markers), "qtype": int(qtype)}]],
                      agent.tok.pad_token_id)
    with torch.no_grad():
        logits, act = agent.model(b["input_ids"], b["attention_mask"], b["marker_pos"], b["marker_mask"],
                                  b["qtype"])
    act = act.float()
    return (logits.float()[0].numpy(), act[0].numpy(), torch.softmax(act, -1)[0].numpy())


def rows_from_request(agent, state, questions):
    """The rows upstream's own prompt builder makes for one request (state, questions) on this
    agent's tokenizer (Agent.system_one, with the forward intercepted). None when upstream refuses it."""
    if state is None or not isinstance(questions, dict):
        return None
    rows = []
    real_infer = agent._infer

    def recording_infer(b):
        ids, att = b["input_ids"].tolist(), b["attention_mask"].tolist()
        mpos, mmask, qt = b["marker_pos"].tolist(), b["marker_mask"].tolist(), b["qtype"].tolist()
        for r in range(len(ids)):
            n, k = sum(att[r]), sum(1 for m in mmask[r] if m)
            rows.append({"ids": ids[r][:n], "markers": mpos[r][:k], "qtype": int(qt[r])})
        return real_infer(b)

    agent._infer = recording_infer
    try:
        agent.system_one(state, questions)
    except Exception:  # upstream answers these with an error status: no rows
        return None
    finally:
        del agent._infer
    return rows


def versions():
    import platform

    import coremltools
    import laya
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__.split("+")[0],
            "coremltools": coremltools.__version__, "laya": _dist_version("laya", laya),
            "transformers": transformers.__version__}


def _dist_version(dist: str, module) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return getattr(module, "__version__", "unknown")
