# Python reference of the host side around the graph (what the Rust worker does): embedding gather,
# masks, type vector, marker map in; act features + FP32 act head out. Used only for checks.
"""Host-side reference for the bc1s-masked contract (spec §4.2-4.3, laya-apple §2.2)."""
import numpy as np
import torch

from .bc1s import MAX_OPTIONS

MASKED = -1e4


def graph_inputs(model, ids, markers, qtype: int, length: int):
    """The five graph inputs (float32 torch tensors) for one row padded to `length`."""
    n, c = len(ids), model.encoder.config.hidden_size
    if n > length or len(markers) > MAX_OPTIONS:
        raise ValueError("row does not fit bucket %d / %d option slots" % (length, MAX_OPTIONS))
    table = model.encoder.embeddings.tok_embeddings.weight.detach().float()
    emb = torch.zeros(1, c, 1, length)
    emb[0, :, 0, :n] = table[torch.tensor(ids, dtype=torch.long)].t()
    key = torch.arange(length)[:, None]      # axis 1 of (1, key, 1, query)
    query = torch.arange(length)[None, :]
    full = torch.where(key < n, 0.0, MASKED).expand(length, length)
    window = model.encoder.config.local_attention // 2
    local = torch.where((key < n) & ((query - key).abs() <= window), 0.0, MASKED)
    type_vec = model.type_emb.weight.detach().float()[qtype].reshape(1, c, 1, 1).clone()
    marker_map = torch.zeros(1, length, 1, MAX_OPTIONS)
    for s, pos in enumerate(markers):
        marker_map[0, pos, 0, s] = 1.0
    return (emb, full.reshape(1, length, 1, length).clone(), local.reshape(1, length, 1, length).clone(),
            type_vec, marker_map)


def act_head_fp32(model, logits_k, cls):
    """Spec §4.3 steps 5-6 in FP32: act features from the k real logits, then the act head on
    [cls ‖ feats]. Returns (act_logits, act_probabilities) as float32 numpy arrays."""
    lg = torch.as_tensor(np.asarray(logits_k, dtype=np.float32))
    k = lg.shape[0]
    p = torch.softmax(lg, -1)
    kf = torch.tensor(float(max(2, k)))
    ent = -(p * torch.log(p.clamp_min(1e-9))).sum() / torch.log(kf)
    top = torch.topk(p, min(2, k)).values
    top1, top2 = top[0], (top[1] if k >= 2 else torch.tensor(0.0))
    feats = torch.stack([top1, top1 - top2, ent, kf / 255.0])
    x = torch.cat([torch.as_tensor(np.asarray(cls, dtype=np.float32)).reshape(-1), feats])
    head = model.act_head
    with torch.no_grad():
        act = head[2](torch.nn.functional.gelu(head[0](x.float())))
    act = act.float()
    return act.numpy(), torch.softmax(act, -1).numpy()


def run_row(bc1s, model, ids, markers, qtype: int):
    """BC1S graph (in whatever dtype the module is) + host: (logits[:k], act_probabilities)."""
    inputs = graph_inputs(model, ids, markers, qtype, bc1s.length)
    with torch.no_grad():
        logits, cls = bc1s(*inputs)
    k = len(markers)
    lg = logits.float().reshape(-1)[:k].numpy()
    _, act_p = act_head_fp32(model, lg, cls.float().reshape(-1).numpy())
    return lg, act_p
