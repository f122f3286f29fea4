# The "bc1s-masked" graph: upstream's DecisionModel (minus embedding gather and act head) rewritten
# channel-first (B, C, 1, L) for the Neural Engine, built from the loaded upstream weights.
"""BC1S rewrite of laya 0.3.20's DecisionModel.

Layout rules (laya-apple §2.3): activations are (B, C, 1, L); every Linear is a 1x1 Conv2d carrying
the original weights; LayerNorm is written out over the channel axis; attention runs per head with
einsums, scores laid out (B, key, 1, query), softmax over the key axis, additive masks supplied as
graph inputs; RoPE cos/sin are constants baked for one bucket length. The module is built and
checked in FP32; coremltools casts it to FP16.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

GRAPH = "bc1s-masked"
GRAPH_VERSION = 1
MAX_OPTIONS = 32
INPUT_NAMES = ("embeddings", "full_mask", "local_mask", "type_vectors", "marker_map")
OUTPUT_NAMES = ("logits", "cls")


def conv1x1(linear: nn.Linear = None, weight=None, bias=None) -> nn.Conv2d:
    """A 1x1 Conv2d with exactly the weights of a Linear (or of a raw weight/bias pair)."""
    if linear is not None:
        weight, bias = linear.weight, linear.bias
    out_ch, in_ch = weight.shape
    conv = nn.Conv2d(in_ch, out_ch, 1, bias=bias is not None)
    with torch.no_grad():
        conv.weight.copy_(weight.detach().float().reshape(out_ch, in_ch, 1, 1))
        if bias is not None:
            conv.bias.copy_(bias.detach().float())
    return conv


class ChannelLayerNorm(nn.Module):
    """LayerNorm over axis 1 of (B, C, 1, L), optional bias; same formula as torch's LayerNorm."""

    def __init__(self, ln: nn.LayerNorm):
        super().__init__()
        c = ln.weight.shape[0]
        self.eps = float(ln.eps)
        self.weight = nn.Parameter(ln.weight.detach().float().reshape(1, c, 1, 1).clone())
        self.bias = None
        if ln.bias is not None:
            self.bias = nn.Parameter(ln.bias.detach().float().reshape(1, c, 1, 1).clone())

    def forward(self, x):
        mean = x.mean(dim=1, keepdim=True)
        xc = x - mean
        var = (xc * xc).mean(dim=1, keepdim=True)
        y = xc * torch.rsqrt(var + self.eps) * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y


def attention(q, k, v, heads: int, head_dim: int, mask, scale: float, cos=None, sin=None):
    """Per-head attention on (B, C, 1, L) tensors. Scores are (B, key, 1, query) and `mask` is an
    additive (B, key, 1, query) tensor; softmax runs over the key axis (dim 1). RoPE (rotate half,
    non-interleaved) is applied per head when cos/sin (1, head_dim, 1, L) are given."""
    d = head_dim   # a Python int, not q.shape: the traced graph must have static shapes only
    half = d // 2
    outs = []
    for h in range(heads):
        qh = q[:, h * d:(h + 1) * d]
        kh = k[:, h * d:(h + 1) * d]
        vh = v[:, h * d:(h + 1) * d]
        if cos is not None:
            qh = qh * cos + torch.cat([-qh[:, half:], qh[:, :half]], dim=1) * sin
            kh = kh * cos + torch.cat([-kh[:, half:], kh[:, :half]], dim=1) * sin
        scores = torch.einsum("bcsq,bcsk->bksq", qh * scale, kh) + mask
        weights = torch.softmax(scores, dim=1)
        outs.append(torch.einsum("bksq,bcsk->bcsq", weights, vh))
    return torch.cat(outs, dim=1) if heads > 1 else outs[0]


class EncoderLayer(nn.Module):
    """One ModernBERT layer: pre-norm RoPE attention (full or sliding) + GeGLU MLP, no biases."""

    def __init__(self, layer, heads: int, sliding: bool, cos, sin):
        super().__init__()
        self.attn_norm = None if isinstance(layer.attn_norm, nn.Identity) else ChannelLayerNorm(layer.attn_norm)
        self.wqkv = conv1x1(layer.attn.Wqkv)
        self.wo = conv1x1(layer.attn.Wo)
        self.mlp_norm = ChannelLayerNorm(layer.mlp_norm)
        self.wi = conv1x1(layer.mlp.Wi)
        self.mlp_wo = conv1x1(layer.mlp.Wo)
        self.heads = heads
        self.hidden = layer.attn.Wo.weight.shape[0]
        self.sliding = sliding
        self.intermediate = layer.mlp.Wo.weight.shape[1]
        self.scale = float(layer.attn.head_dim) ** -0.5
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, x, full_mask, local_mask):
        a = x if self.attn_norm is None else self.attn_norm(x)
        qkv = self.wqkv(a)
        c = self.hidden
        q, k, v = qkv[:, :c], qkv[:, c:2 * c], qkv[:, 2 * c:]
        mask = local_mask if self.sliding else full_mask
        x = x + self.wo(attention(q, k, v, self.heads, self.hidden // self.heads, mask, self.scale,
                                   self.cos, self.sin))
        h = self.wi(self.mlp_norm(x))
        u, g = h[:, :self.intermediate], h[:, self.intermediate:]
        return x + self.mlp_wo(F.gelu(u) * g)


class HeadLayer(nn.Module):
    """nn.TransformerEncoderLayer(norm_first=True, ReLU): packed in_proj with bias, key padding."""

    def __init__(self, layer: nn.TransformerEncoderLayer):
        super().__init__()
        if not layer.norm_first:
            raise ValueError("decision head layer is not pre-norm")
        sa = layer.self_attn
        self.heads = sa.num_heads
        self.scale = float(sa.head_dim) ** -0.5
        self.hidden = sa.embed_dim
        self.norm1 = ChannelLayerNorm(layer.norm1)
        self.norm2 = ChannelLayerNorm(layer.norm2)
        self.in_proj = conv1x1(weight=sa.in_proj_weight, bias=sa.in_proj_bias)
        self.out_proj = conv1x1(sa.out_proj)
        self.linear1 = conv1x1(layer.linear1)
        self.linear2 = conv1x1(layer.linear2)

    def forward(self, h, full_mask):
        c = self.hidden
        qkv = self.in_proj(self.norm1(h))
        q, k, v = qkv[:, :c], qkv[:, c:2 * c], qkv[:, 2 * c:]
        h = h + self.out_proj(attention(q, k, v, self.heads, c // self.heads, full_mask, self.scale))
        return h + self.linear2(F.relu(self.linear1(self.norm2(h))))


def rope_tables(encoder, layer_type: str, length: int):
    """cos/sin (1, head_dim, 1, L) for positions 0..L-1, from upstream's own rotary module (fp32)."""
    x = torch.zeros(1, length, encoder.config.hidden_size, dtype=torch.float32)
    pos = torch.arange(length).unsqueeze(0)
    cos, sin = encoder.rotary_emb(x, pos, layer_type)
    return (cos[0].float().t().reshape(1, -1, 1, length).contiguous(),
            sin[0].float().t().reshape(1, -1, 1, length).contiguous())


class BC1SDecisionModel(nn.Module):
    """Inputs/outputs exactly as the graph contract (see worker-ane/convert/README.md)."""

    def __init__(self, model, length: int):
        super().__init__()
        enc = model.encoder
        cfg = enc.config
        self.length = length
        self.hidden = cfg.hidden_size
        self.emb_norm = ChannelLayerNorm(enc.embeddings.norm)
        tables = {t: rope_tables(enc, t, length) for t in sorted(set(cfg.layer_types))}
        layers = []
        for i, layer in enumerate(enc.layers):
            t = cfg.layer_types[i]
            if t not in ("full_attention", "sliding_attention"):
                raise ValueError("unsupported layer type %r" % t)
            layers.append(EncoderLayer(layer, cfg.num_attention_heads, t == "sliding_attention", *tables[t]))
        self.layers = nn.ModuleList(layers)
        self.final_norm = ChannelLayerNorm(enc.final_norm)
        self.head = nn.ModuleList([HeadLayer(l) for l in model.head.layers] if model.head is not None else [])
        sc = model.scorer
        self.scorer_norm = ChannelLayerNorm(sc[0])
        self.scorer_fc = conv1x1(sc[1])
        self.scorer_out = conv1x1(sc[3])

    def forward(self, embeddings, full_mask, local_mask, type_vectors, marker_map):
        x = self.emb_norm(embeddings)
        for layer in self.layers:
            x = layer(x, full_mask, local_mask)
        h = self.final_norm(x) + type_vectors
        for layer in self.head:
            h = layer(h, full_mask)
        m = torch.einsum("bcsl,blso->bcso", h, marker_map)          # (B, C, 1, S) marker gather
        logits = self.scorer_out(F.gelu(self.scorer_fc(self.scorer_norm(m))))   # (B, 1, 1, S)
        return logits, h[:, :, :, 0:1]


def build(model, length: int) -> BC1SDecisionModel:
    """The FP32 BC1S module for one bucket length, in eval mode."""
    return BC1SDecisionModel(model, length).eval().float()
